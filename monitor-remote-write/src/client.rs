//! One POST of a remote-write body, and what its answer means for the sender: accepted,
//! worth retrying (5xx, 429, 401/403, no connection, timeout, a certificate that does not
//! verify) or rejected for good (any other 4xx).
//!
//! 401/403 and TLS failures are retried, unlike Prometheus' remote-write (which drops a
//! request refused with 401): both are configuration errors (a wrong password file, a
//! missing CA) that an operator fixes, and the archive holds the samples meanwhile, so once
//! fixed every sample arrives. Dropping them would turn a typo into lost data.

use std::{io::Read, time::Duration};

use monitor_client::{auth::Secret, tls};

use super::{EndpointConfig, RemoteWriteError, prompb::HEADERS};

/// Why a request did not succeed: the `reason` label of
/// `railscope_collector_remote_write_failures_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The TLS handshake failed: the endpoint's certificate did not verify (unknown CA,
    /// wrong name, expired), or it refused ours.
    Tls,
    /// 401 or 403: wrong or missing credentials.
    Auth,
    /// 5xx or 429: the endpoint is overloaded or failing.
    Http,
    /// No connection, a name that does not resolve, a timeout.
    Connection,
    /// Any other 4xx: the request itself is refused (not retried).
    Rejected,
}

impl Failure {
    pub const ALL: [Failure; 5] = [
        Failure::Tls,
        Failure::Auth,
        Failure::Http,
        Failure::Connection,
        Failure::Rejected,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Failure::Tls => "tls",
            Failure::Auth => "auth",
            Failure::Http => "http",
            Failure::Connection => "connection",
            Failure::Rejected => "rejected",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// What became of one request.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// 2xx: the receiver has the samples.
    Accepted,
    /// Send again later; `after` is the receiver's Retry-After when it gave one.
    Retry {
        failure: Failure,
        reason: String,
        after: Option<Duration>,
    },
    /// The receiver refused the request and would refuse it again (400: a malformed or
    /// out-of-bounds sample, 404, 413 ...): counted and logged, not retried.
    Rejected { status: u16, reason: String },
}

/// An HTTP(S) client for one endpoint; clones share its connections.
#[derive(Clone)]
pub struct Client {
    agent: ureq::Agent,
    url: String,
    headers: Vec<(String, String)>,
    authorization: Option<Secret>,
}

/// At most this much of a refusal's body goes into the log line.
const REASON_BYTES: u64 = 256;

impl Client {
    /// The client of `config`'s endpoint: its CA, client certificate and secret files are
    /// read now (an error names the file).
    pub fn new(config: &EndpointConfig) -> Result<Self, RemoteWriteError> {
        let mut builder = ureq::Agent::config_builder()
            .timeout_global(Some(config.timeout))
            .http_status_as_error(false)
            .user_agent(concat!("railscope-collector/", env!("CARGO_PKG_VERSION")));
        if config.url.starts_with("https://") {
            builder = builder.tls_config(tls::load(&config.name, &config.tls)?);
        }
        Ok(Self {
            agent: builder.build().into(),
            url: config.url.clone(),
            headers: config.headers.clone(),
            authorization: config.auth.header(&config.name)?,
        })
    }

    pub fn send(&self, body: &[u8]) -> Outcome {
        let mut request = self.agent.post(&self.url);
        for (k, v) in HEADERS {
            request = request.header(k, v);
        }
        for (k, v) in &self.headers {
            request = request.header(k, v);
        }
        if let Some(secret) = &self.authorization {
            request = request.header("Authorization", secret.expose());
        }
        let response = match request.send(body) {
            Ok(r) => r,
            Err(e) => {
                let (failure, reason) = classify(e);
                return Outcome::Retry {
                    failure,
                    reason,
                    after: None,
                };
            }
        };
        let status = response.status().as_u16();
        if (200..300).contains(&status) {
            return Outcome::Accepted;
        }
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let mut text = String::new();
        let _ = response
            .into_body()
            .into_reader()
            .take(REASON_BYTES)
            .read_to_string(&mut text);
        let reason = format!("HTTP {status}: {}", text.trim());
        match status {
            401 | 403 => Outcome::Retry {
                failure: Failure::Auth,
                reason: format!(
                    "{reason} (the credentials were refused: check the endpoint's \
                     basic-auth or bearer-token file)"
                ),
                after: retry_after,
            },
            429 | 500.. => Outcome::Retry {
                failure: Failure::Http,
                reason,
                after: retry_after,
            },
            _ => Outcome::Rejected { status, reason },
        }
    }
}

/// A transport error as a failure and a reason: a TLS failure is told apart (rustls reports
/// it as an I/O error of the handshake) so that a certificate problem reads as one.
fn classify(e: ureq::Error) -> (Failure, String) {
    let tls_error = match &e {
        ureq::Error::Rustls(r) => Some(r.to_string()),
        ureq::Error::Tls(r) => Some((*r).to_owned()),
        ureq::Error::Io(io) => io
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .map(ToString::to_string),
        _ => None,
    };
    match tls_error {
        Some(r) => (
            Failure::Tls,
            format!(
                "TLS handshake failed: {r} (check the endpoint's ca-file, cert-file and key-file)"
            ),
        ),
        None => (Failure::Connection, e.to_string()),
    }
}
