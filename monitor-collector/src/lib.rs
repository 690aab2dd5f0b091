//! railscope's collector: where a fleet's frames land, stay and are read back. It runs
//! unprivileged on an ordinary server, one per few thousand nodes. It shares only the wire
//! format (`monitor_wire`) with the node agent: the agent never links what only the
//! collector needs, and the collector links no eBPF or NVML.
//!
//! The data's way through the crate:
//! - `udp`: sockets sharing one port (`SO_REUSEPORT`), batched receives (`recvmmsg`);
//! - `ingest`: a thread per socket: MAC check, decode and accounting by the [`nodes`]
//!   table, drops counted by reason ([`drops`]), schema requests to agents;
//! - `node_keys`: which key each node's frames must carry (its own, derived from the fleet
//!   secret) and why a frame was refused;
//! - [`nodes`]: per node, session, schema, sequence accounting, latest value of each series;
//!   `events`: the recent events; together the live view; `latest`: the latest values of
//!   chosen metrics across the fleet, from it;
//! - [`writer`]: the archive queue and its writer thread, which hands every accepted frame to
//!   the archive ([`monitor_archive::archive`]): every accepted frame, appended to segment
//!   files with a per-node time index; what queries and remote-write read back;
//! - `http` and [`metrics`]: `/metrics`, the live view's JSON and the query API ([`query`]);
//!   [`routes`]: every route in one table; `dashboard`: the web dashboard at `/`, its assets
//!   compiled in; [`web`]: who may use them (Prometheus' web config file: TLS, basic-auth
//!   users, railscope's roles);
//! - remote-write ([`monitor_remote_write`]): the archive's samples to Prometheus-compatible
//!   TSDBs (remote-write v1), each endpoint following the archive from its own persisted
//!   cursor;
//! - [`monitor_archive::liveness`]: the heartbeats of the receive threads, the archive writer
//!   and sealer, the HTTP server and the findings thread, for systemd's watchdog;
//! - `railscope select` (monitor-client) runs on what this collector answers, and never
//!   drops what railscope itself reads ([`reads`]: the finding rules, stragglers, dashboard;
//!   the tests of both together: `select`);
//! - `collector` ([`Collector`]): starts and stops all of it; [`config`]: its settings and
//!   memory bounds; [`settings`]: `railscope-collector run`'s flags and
//!   `/etc/railscope/collector.toml`;
//! - `findings`: the HTTP side of the health findings ([`monitor_findings`]: from what ingest
//!   received, events at once, the live view on a tick, kept in a log next to the archive);
//!   `actions`: that of the actions ([`monitor_actions`]: draining and resuming nodes in
//!   Slurm on findings, with a dry run, a brake and an audit log); `stragglers`: that of the
//!   straggler search ([`monitor_findings::stragglers`]: the GPUs and ports far from their
//!   job's median over a window, read from the archive).

mod acks;
mod actions;
mod collector;
pub mod config;
mod dashboard;
pub mod drops;
mod events;
mod findings;
mod http;
mod ingest;
mod latest;
pub mod metrics;
mod node_keys;
pub mod nodes;
pub mod query;
pub mod reads;

pub mod routes;
mod scrape_targets;
#[cfg(test)]
mod select;
pub mod settings;
mod shared;
mod stragglers;
mod udp;
pub mod web;
pub mod writer;

pub use collector::{Collector, Parts};
pub use config::{CollectorConfig, Limits};
