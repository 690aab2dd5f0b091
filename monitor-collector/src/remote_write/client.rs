//! One POST of a remote-write body, and what its answer means for the sender: accepted,
//! worth retrying (5xx, 429, no connection, timeout) or rejected for good (any other 4xx).

use std::{io::Read, time::Duration};

use super::prompb::HEADERS;

/// What became of one request.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// 2xx: the receiver has the samples.
    Accepted,
    /// Send again later; `after` is the receiver's Retry-After when it gave one.
    Retry {
        reason: String,
        after: Option<Duration>,
    },
    /// The receiver refused the request and would refuse it again (400: a malformed or
    /// out-of-bounds sample, 401/403, 404, 413 ...): counted and logged, not retried.
    Rejected { status: u16, reason: String },
}

/// An HTTP client for one endpoint. Plain HTTP only: the collector links no TLS stack (an
/// `https://` endpoint is refused at start-up; put a TLS-terminating proxy in between).
pub struct Client {
    agent: ureq::Agent,
    url: String,
    headers: Vec<(String, String)>,
}

/// At most this much of a refusal's body goes into the log line.
const REASON_BYTES: u64 = 256;

impl Client {
    pub fn new(url: &str, timeout: Duration, headers: Vec<(String, String)>) -> Self {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            .user_agent(concat!("railscope-collector/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Self {
            agent,
            url: url.to_owned(),
            headers,
        }
    }

    pub fn send(&self, body: &[u8]) -> Outcome {
        let mut request = self.agent.post(&self.url);
        for (k, v) in HEADERS {
            request = request.header(k, v);
        }
        for (k, v) in &self.headers {
            request = request.header(k, v);
        }
        let response = match request.send(body) {
            Ok(r) => r,
            Err(e) => {
                return Outcome::Retry {
                    reason: e.to_string(),
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
        if status >= 500 || status == 429 {
            Outcome::Retry {
                reason,
                after: retry_after,
            }
        } else {
            Outcome::Rejected { status, reason }
        }
    }
}
