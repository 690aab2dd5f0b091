//! The actions over HTTP (docs/http-api.md): what `monitor_actions` did and decided, and the
//! release of its brake.
//!
//! - [`api`]: `/api/v1/actions`, `/api/v1/actions/finding` and `/api/v1/actions/release`.

pub(crate) mod api;
