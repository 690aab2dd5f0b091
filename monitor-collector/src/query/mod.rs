//! The archive's queries over HTTP (docs/http-api.md): the query engine
//! (`monitor_archive::query`) behind the JSON API that the collector's routes mount. Times
//! are read as the clients write them (`monitor_client::time`).
//!
//! - [`api`]: the handlers of `/api/v1/series`, `/api/v1/events`, `/api/v1/nodes`,
//!   `/api/v1/export` and their errors.

pub mod api;

#[cfg(test)]
pub(crate) mod test_server;
#[cfg(test)]
mod tests;
