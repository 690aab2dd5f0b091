//! One shard of an endpoint: a thread that takes pieces of batches from its bounded queue,
//! packs them into requests of about `max_samples_per_send` samples and sends each until the
//! endpoint acknowledges it (backing off exponentially on retryable failures) or refuses it
//! for good. A series always goes to the same shard, so its samples arrive in order.
//!
//! The endpoint's state (delivering, or failing for one [`Failure`] reason) is shared by its
//! shards: a change is logged once, naming the endpoint (an error for TLS and credentials,
//! which need the operator; a warning otherwise), and the endpoint's recovery likewise;
//! repeats of the same failure are logged at debug level, at most every 10 s per shard.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering::Relaxed},
        mpsc::{Receiver, RecvTimeoutError},
    },
    time::{Duration, Instant},
};

use super::{
    EndpointConfig,
    client::{Client, Failure, Outcome},
    progress::Ticket,
    prompb::{TimeSeries, WriteRequest, encode_body},
    stats::EndpointStats,
};

/// A piece of one batch for one shard.
pub(crate) struct Work {
    pub series: Vec<TimeSeries>,
    pub samples: usize,
    pub newest_ms: i64,
    pub ticket: Arc<Ticket>,
}

/// Log lines about failures of one shard: at most one per this interval.
const LOG_EVERY: Duration = Duration::from_secs(10);

pub(crate) struct Shard {
    pub index: usize,
    pub endpoint: String,
    pub client: Client,
    pub config: EndpointConfig,
    pub stats: Arc<EndpointStats>,
    /// Set when the endpoint stops for good: a request being retried is abandoned (not
    /// acknowledged, so it is sent again after a restart).
    pub abort: Arc<AtomicBool>,
}

impl Shard {
    pub(crate) fn run(self, queue: Receiver<Work>) {
        let mut carry: Option<Work> = None;
        let mut last_log: Option<Instant> = None;
        let mut quiet = 0u64;
        loop {
            let first = match carry.take() {
                Some(w) => w,
                None => match queue.recv_timeout(Duration::from_millis(100)) {
                    Ok(w) => w,
                    Err(RecvTimeoutError::Timeout) if !self.abort.load(Relaxed) => continue,
                    Err(_) => return,
                },
            };
            let deadline = Instant::now() + self.config.batch_send_deadline;
            let mut samples = first.samples;
            let mut works = vec![first];
            while samples < self.config.max_samples_per_send {
                let left = deadline.saturating_duration_since(Instant::now());
                match queue.recv_timeout(left) {
                    Ok(w) if samples + w.samples > self.config.max_samples_per_send => {
                        carry = Some(w);
                        break;
                    }
                    Ok(w) => {
                        samples += w.samples;
                        works.push(w);
                    }
                    Err(_) => break,
                }
            }
            let request = WriteRequest {
                timeseries: works
                    .iter_mut()
                    .flat_map(|w| std::mem::take(&mut w.series))
                    .collect(),
            };
            let body = encode_body(&request);
            drop(request);
            if !self.deliver(&body, samples, &mut last_log, &mut quiet) {
                return;
            }
            let newest = works.iter().map(|w| w.newest_ms).max().unwrap_or(0);
            self.stats.highest_sent_ms.fetch_max(newest, Relaxed);
            self.stats
                .samples_pending
                .fetch_sub(samples as u64, Relaxed);
            for w in works {
                w.ticket.finish_one();
            }
        }
    }

    /// Sends until acknowledged or refused for good (true), or until aborted (false).
    fn deliver(
        &self,
        body: &[u8],
        samples: usize,
        last_log: &mut Option<Instant>,
        quiet: &mut u64,
    ) -> bool {
        let mut backoff = self.config.min_backoff;
        let endpoint = &self.endpoint;
        let mut log = |failure: Failure, msg: String| {
            let state = format!("remote-write endpoint {endpoint}: {msg}");
            if self.stats.record(Some((failure, state.clone()))) {
                match failure {
                    Failure::Tls | Failure::Auth => tracing::error!(endpoint, "{state}"),
                    _ => tracing::warn!(endpoint, "{state}"),
                }
            } else if last_log.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
                let more = std::mem::take(quiet);
                tracing::debug!(
                    endpoint,
                    shard = self.index,
                    "{state}{}",
                    if more > 0 {
                        format!(" ({more} similar lines not shown)")
                    } else {
                        String::new()
                    }
                );
                *last_log = Some(Instant::now());
            } else {
                *quiet += 1;
            }
        };
        loop {
            match self.client.send(body) {
                Outcome::Accepted => {
                    self.stats.samples_sent.fetch_add(samples as u64, Relaxed);
                    self.stats.requests_sent.fetch_add(1, Relaxed);
                    if self.stats.record(None) {
                        tracing::info!(endpoint, "remote-write endpoint {endpoint}: delivering");
                    }
                    return true;
                }
                Outcome::Rejected { status, reason } => {
                    self.stats.samples_failed.fetch_add(samples as u64, Relaxed);
                    log(
                        Failure::Rejected,
                        format!(
                            "refused {samples} samples ({reason}); not retried (status {status})"
                        ),
                    );
                    return true;
                }
                Outcome::Retry {
                    failure,
                    reason,
                    after,
                } => {
                    let wait = after.unwrap_or(backoff).min(self.config.max_backoff);
                    log(
                        failure,
                        format!(
                            "{reason}; retrying {samples} samples (next in {wait:.1?}, backing off up to {:.1?}; nothing is dropped)",
                            self.config.max_backoff
                        ),
                    );
                    if !self.sleep(wait) {
                        return false;
                    }
                    self.stats
                        .samples_retried
                        .fetch_add(samples as u64, Relaxed);
                    backoff = (backoff * 2).min(self.config.max_backoff);
                }
            }
        }
    }

    /// Sleeps `d` unless aborted first (false).
    fn sleep(&self, d: Duration) -> bool {
        let end = Instant::now() + d;
        loop {
            if self.abort.load(Relaxed) {
                return false;
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return true;
            }
            std::thread::sleep(left.min(Duration::from_millis(50)));
        }
    }
}
