//! railscope's clients of a collector's HTTP API (docs/http-api.md) and their command lines:
//! `query`, `export`, `findings`, `stragglers`, `actions` (with `actions show`) and `health`.
//! They run wherever an operator or Slurm asks — a compute node, a laptop — so they live
//! apart from the collector: `railscope` links this crate and nothing of the server, and a
//! node's package carries no collector for `railscope health`. They read the API's JSON, not
//! the server's types; what they share with the collector is below them (the wire format,
//! the capture format) or here (how times are written, how an endpoint is reached).
//!
//! - `client`: the HTTP client every command uses (`RAILSCOPE_HTTP_CONFIG_FILE`: TLS and
//!   credentials, as Prometheus' tools take them), with [`auth`], [`tls`] and [`endpoint`]'s
//!   error, which the collector's remote-write shares;
//! - [`time`]: times as the API takes and writes them;
//! - one module per command: [`query`], [`export`], [`findings`], [`stragglers`],
//!   [`actions`] and `actions_show`, [`health`] (Slurm's health hook), [`select`] (Moneo's
//!   metric selection, run here on what the collector answers).

pub mod actions;
mod actions_show;
pub mod auth;
mod client;
pub mod endpoint;
pub mod export;
pub mod findings;
pub mod health;
pub mod query;
pub mod select;
pub mod stragglers;
pub mod time;
pub mod tls;
