//! Acting on findings (docs/actions.md): rules of collector.toml's `[actions]` map findings
//! (by rule, severity, device kind) to draining the node in Slurm (and resuming it once
//! clear), a webhook or a command; `[actions.alertmanager]` sends every active finding as an
//! alert.
//! Safety first: a new install only logs what it would do (dry run); a brake holds drains
//! past a share of the fleet until a person releases them; every step goes to an audit log
//! that a restart replays, so nothing is acted on twice.
//!
//! - `config` ([`ActionsConfig`]): the `[actions]` table and how a rule matches a finding;
//! - `slurm`: `scontrol` (show, drain, undrain), the reason sanitised;
//! - `notify`: webhook POSTs and commands, each try bounded by a timeout;
//! - `alertmanager`: the alerts, one sender thread per Alertmanager; [`alert_stats`]: their
//!   counts;
//! - [`audit`]: the audit log's records, framed as the findings log is;
//! - `state`: each node's action, rebuilt from the records; the brake's count;
//! - `decisions` ([`Actions`]): the decisions of each pass, and Slurm's answers recorded;
//! - `worker` ([`ActionsThread`]): the thread that runs the passes, apart from ingest and findings;
//!
//! It sees the findings store and the fleet's node count, nothing else of the collector; the
//! collector serves its audit over HTTP (`/api/v1/actions`) and `railscope actions`
//! (monitor-client) asks for it.

pub mod alert_stats;
mod alertmanager;
pub mod audit;
mod config;
mod decisions;
mod notify;
mod slurm;
mod state;
mod worker;

#[cfg(test)]
mod tests;

pub use config::ActionsConfig;
pub use decisions::Actions;
pub use worker::ActionsThread;
