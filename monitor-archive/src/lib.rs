//! railscope's archive: where a collector keeps every frame it accepted, and how questions
//! are answered from it. It knows frames (`monitor_wire`) and files, nothing of sockets,
//! HTTP, rules or actions: the collector's ingest appends to it, and its findings, actions,
//! remote-write and HTTP API read it.
//!
//! - [`archive`]: segments (open, frozen, sealed), their per-node index, sealing and
//!   re-coding, retention, the readers, and what a restarted collector reads back
//!   ([`archive::recent`]);
//! - [`query`]: the query engine over the archive (series, events, label matchers, ids per
//!   node session) and a node's range as a capture file;
//! - [`framed_log`]: append-only logs of JSON records (the findings log, the audit log);
//! - the base the collector's threads share: [`clock`] (one wall clock), [`lock`] (one
//!   policy for a poisoned lock), [`liveness`] (heartbeats for systemd's watchdog).

pub mod archive;
pub mod clock;
pub mod framed_log;
pub mod liveness;
pub mod lock;
#[cfg(any(test, feature = "test-frames"))]
pub mod node_archive;
pub mod query;
