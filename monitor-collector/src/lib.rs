//! railscope's collector: where a fleet's frames land, stay and are read back. It runs
//! unprivileged on an ordinary server, one per few thousand nodes. It shares only the wire
//! format (`monitor_wire`) with the node agent: the agent never links what only the
//! collector needs, and the collector links no eBPF or NVML.
//!
//! The data's way through the crate:
//! - [`udp`]: sockets sharing one port (`SO_REUSEPORT`), batched receives (`recvmmsg`);
//! - [`ingest`]: a thread per socket: MAC check, decode and accounting by the [`nodes`]
//!   table, drops counted by reason ([`drops`]), schema requests to agents;
//! - [`node_keys`]: which key each node's frames must carry (its own, derived from the fleet
//!   secret) and why a frame was refused;
//! - [`nodes`]: per node, session, schema, sequence accounting, latest value of each series;
//!   [`events`]: the recent events; together the live view; [`latest`]: the latest values of
//!   chosen metrics across the fleet, from it;
//! - [`writer`]: the archive queue and its writer thread, which hands every accepted frame to
//!   [`archive`];
//! - [`archive`]: every accepted frame, appended to segment files with a per-node time
//!   index; what queries and remote-write read back;
//! - [`http`] and [`metrics`]: `/metrics`, the live view's JSON and the query API;
//!   [`dashboard`]: the web dashboard at `/`, its assets compiled in; [`web`]: who may use
//!   them (Prometheus' web config file: TLS, basic-auth users, railscope's roles);
//! - [`remote_write`]: the archive's samples to Prometheus-compatible TSDBs (remote-write
//!   v1), each endpoint following the archive from its own persisted cursor;
//! - [`liveness`]: the heartbeats of the receive threads, the archive writer and sealer, the
//!   HTTP server and the findings thread, for systemd's watchdog;
//! - [`select`]: `railscope select`, Moneo's metric selection over a stored range; it never
//!   drops what railscope itself reads ([`reads`]: the finding rules, stragglers, dashboard);
//! - [`collector`]: starts and stops all of it; [`config`]: its settings and memory bounds;
//!   [`settings`]: `railscope-collector run`'s flags and `/etc/railscope/collector.toml`;
//! - [`findings`]: health findings from what ingest received (events at once, the live view
//!   on a tick), kept in a log next to the archive ([`framed_log`]'s framing); [`actions`]:
//!   draining and resuming nodes in Slurm on findings, with a dry run, a brake and an audit
//!   log; [`stragglers`]: the GPUs and ports far
//!   from their job's median over a window, read from the archive ([`robust`] statistics).

pub mod acks;
pub mod actions;
pub mod collector;
pub mod config;
pub mod dashboard;
pub mod drops;
pub mod events;
pub mod findings;
pub mod http;
pub mod ingest;
pub mod latest;
pub mod metrics;
pub mod node_keys;
pub mod nodes;
pub mod query;
pub mod reads;

pub mod routes;
pub mod scrape_targets;
#[cfg(test)]
mod select;
pub mod settings;
pub mod shared;
pub mod stragglers;
pub mod udp;
pub mod web;
pub mod writer;

pub use collector::{Collector, Parts};
pub use config::{CollectorConfig, Limits};
