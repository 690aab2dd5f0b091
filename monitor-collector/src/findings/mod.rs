//! The findings over HTTP (docs/http-api.md): the rules, their engine and store are
//! `monitor_findings`'; the collector serves what they found.
//!
//! - [`api`]: `/api/v1/findings` and the findings' `/metrics` families;
//! - [`hardware_api`]: `/api/v1/nodes/{node}/hardware`, a node's hardware path and its class.

pub(crate) mod api;
pub(crate) mod hardware_api;

#[cfg(test)]
mod tests;
