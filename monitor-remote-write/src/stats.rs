//! Counters of one remote-write endpoint, for the collector's `/metrics`.

use std::{
    fmt::Write,
    sync::{
        Mutex,
        atomic::{AtomicI64, AtomicU64, Ordering::Relaxed},
    },
};

use super::client::Failure;

/// What one endpoint has done so far. Samples are Prometheus samples (a gauge envelope
/// counts three: mean, min and max).
#[derive(Debug, Default)]
pub(crate) struct EndpointStats {
    /// Samples the endpoint acknowledged.
    pub samples_sent: AtomicU64,
    /// Samples in requests the endpoint refused for good (4xx other than 401, 403, 429).
    pub samples_failed: AtomicU64,
    /// Samples sent again after a retryable failure (each retry counts them again).
    pub samples_retried: AtomicU64,
    /// Samples the archive could no longer give (removed by retention before they were sent).
    pub samples_skipped: AtomicU64,
    /// Samples read from the archive and not yet acknowledged or refused.
    pub samples_pending: AtomicU64,
    /// Requests acknowledged.
    pub requests_sent: AtomicU64,
    /// Newest sample time read from the archive, in ms (0: none yet).
    pub highest_read_ms: AtomicI64,
    /// Newest sample time acknowledged, in ms (0: none yet).
    pub highest_sent_ms: AtomicI64,
    /// Failed requests by [`Failure`] (its index).
    pub failures: [AtomicU64; Failure::ALL.len()],
    /// The current failure and its message while requests fail (the endpoint's state: a
    /// log line is written when it changes, not on every retry).
    pub state: Mutex<Option<(Failure, String)>>,
}

/// A copy of the counters at one time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub samples_sent: u64,
    pub samples_failed: u64,
    pub samples_retried: u64,
    pub samples_skipped: u64,
    pub samples_pending: u64,
    pub requests_sent: u64,
    pub highest_read_ms: i64,
    pub highest_sent_ms: i64,
    /// Failed requests by [`Failure`] (its index).
    pub failures: [u64; Failure::ALL.len()],
}

impl StatsSnapshot {
    /// Failed requests for one reason.
    pub fn failures(&self, failure: Failure) -> u64 {
        self.failures[failure.index()]
    }

    /// How far the endpoint is behind the archive, in seconds: newest sample read minus
    /// newest acknowledged (Prometheus' own remote-write reports the same difference).
    pub fn lag_seconds(&self) -> f64 {
        if self.samples_pending == 0 {
            return 0.0;
        }
        (self.highest_read_ms - self.highest_sent_ms).max(0) as f64 / 1000.0
    }
}

impl EndpointStats {
    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            samples_sent: self.samples_sent.load(Relaxed),
            samples_failed: self.samples_failed.load(Relaxed),
            samples_retried: self.samples_retried.load(Relaxed),
            samples_skipped: self.samples_skipped.load(Relaxed),
            samples_pending: self.samples_pending.load(Relaxed),
            requests_sent: self.requests_sent.load(Relaxed),
            highest_read_ms: self.highest_read_ms.load(Relaxed),
            highest_sent_ms: self.highest_sent_ms.load(Relaxed),
            failures: std::array::from_fn(|i| self.failures[i].load(Relaxed)),
        }
    }

    /// The current failure's message, None while requests succeed.
    pub(crate) fn last_error(&self) -> Option<String> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.as_ref().map(|(_, m)| m.clone())
    }

    /// Records the outcome of a request (None: acknowledged) and says whether the endpoint's
    /// state changed, i.e. whether it is worth a log line.
    pub(crate) fn record(&self, failure: Option<(Failure, String)>) -> bool {
        if let Some((f, _)) = &failure {
            self.failures[f.index()].fetch_add(1, Relaxed);
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let changed = state.as_ref().map(|s| s.0) != failure.as_ref().map(|f| f.0);
        *state = failure;
        changed
    }
}

/// The families [`write_metrics`] writes, with their help text.
const FAMILIES: [(&str, &str, &str); 6] = [
    (
        "railscope_collector_remote_write_samples_sent_total",
        "counter",
        "Samples the remote-write endpoint acknowledged.",
    ),
    (
        "railscope_collector_remote_write_samples_failed_total",
        "counter",
        "Samples in requests the endpoint refused for good (4xx other than 401, 403, 429), not retried.",
    ),
    (
        "railscope_collector_remote_write_samples_retried_total",
        "counter",
        "Samples sent again after a retryable failure (5xx, 429, 401/403, TLS, connection).",
    ),
    (
        "railscope_collector_remote_write_samples_skipped_total",
        "counter",
        "Samples removed from the archive by retention before they could be sent.",
    ),
    (
        "railscope_collector_remote_write_samples_pending",
        "gauge",
        "Samples read from the archive, not yet acknowledged.",
    ),
    (
        "railscope_collector_remote_write_lag_seconds",
        "gauge",
        "Newest sample time read from the archive minus newest acknowledged.",
    ),
];

const FAILURES: &str = "railscope_collector_remote_write_failures_total";

/// Appends the remote-write families in the text exposition format, one series per
/// endpoint (label `endpoint`, the endpoint's name), and per reason for the failures.
pub fn write_metrics(out: &mut String, endpoints: &[(&str, StatsSnapshot)]) {
    let _ = writeln!(
        out,
        "# HELP {FAILURES} Requests that failed, by reason: tls (the certificate did not \
         verify, or the handshake failed), auth (401/403), http (5xx, 429), connection (no \
         connection, timeout): all retried; rejected (other 4xx): not retried.\n\
         # TYPE {FAILURES} counter"
    );
    for (endpoint, s) in endpoints {
        let endpoint = endpoint.replace('\\', r"\\").replace('"', "\\\"");
        for failure in Failure::ALL {
            let _ = writeln!(
                out,
                "{FAILURES}{{endpoint=\"{endpoint}\",reason=\"{}\"}} {}",
                failure.as_str(),
                s.failures(failure)
            );
        }
    }
    for (name, kind, help) in FAMILIES {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (endpoint, s) in endpoints {
            let value = match name {
                "railscope_collector_remote_write_samples_sent_total" => s.samples_sent as f64,
                "railscope_collector_remote_write_samples_failed_total" => s.samples_failed as f64,
                "railscope_collector_remote_write_samples_retried_total" => {
                    s.samples_retried as f64
                }
                "railscope_collector_remote_write_samples_skipped_total" => {
                    s.samples_skipped as f64
                }
                "railscope_collector_remote_write_samples_pending" => s.samples_pending as f64,
                _ => s.lag_seconds(),
            };
            let endpoint = endpoint.replace('\\', r"\\").replace('"', "\\\"");
            let _ = writeln!(out, "{name}{{endpoint=\"{endpoint}\"}} {value}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_text_has_one_line_per_endpoint_and_lag_only_when_behind() {
        let behind = StatsSnapshot {
            samples_sent: 10,
            samples_pending: 5,
            highest_read_ms: 12_500,
            highest_sent_ms: 10_000,
            ..StatsSnapshot::default()
        };
        let caught_up = StatsSnapshot {
            samples_sent: 7,
            highest_read_ms: 12_500,
            highest_sent_ms: 10_000,
            ..StatsSnapshot::default()
        };
        let mut out = String::new();
        write_metrics(&mut out, &[("vm", behind), ("prom", caught_up)]);
        assert!(
            out.contains(
                "railscope_collector_remote_write_samples_sent_total{endpoint=\"vm\"} 10\n"
            )
        );
        assert!(
            out.contains("railscope_collector_remote_write_lag_seconds{endpoint=\"vm\"} 2.5\n")
        );
        assert!(
            out.contains("railscope_collector_remote_write_lag_seconds{endpoint=\"prom\"} 0\n")
        );
        assert_eq!(out.matches("# TYPE").count(), FAMILIES.len() + 1);
        assert!(out.contains(
            "railscope_collector_remote_write_failures_total{endpoint=\"vm\",reason=\"tls\"} 0\n"
        ));
    }
}
