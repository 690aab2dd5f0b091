//! Why an HTTP endpoint's settings cannot be used: one error naming the endpoint and, for a
//! file (CA, certificate, key, secret), the file and what it was for. Remote-write turns it
//! into its own error with the same words; the clients report it as it is.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// Settings that do not go together, or a trust store that cannot be used.
    #[error("{endpoint}: {reason}")]
    Config { endpoint: String, reason: String },
    /// A CA, certificate, key or secret file that cannot be used.
    #[error("{endpoint}: {what} {}: {reason}", path.display())]
    File {
        endpoint: String,
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
}
