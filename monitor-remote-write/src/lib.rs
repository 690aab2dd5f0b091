//! Remote-write v1 (protobuf + snappy) from the archive to Prometheus-compatible endpoints
//! (Prometheus with `--web.enable-remote-write-receiver`, VictoriaMetrics, Mimir, Thanos
//! receive, ...): each sample with its own timestamp, driven from the archive the way
//! Prometheus' remote-write follows its WAL.
//!
//! One [`RemoteWriter`] per endpoint: a reader thread takes batches of whole frames from the
//! archive ([`SampleSource`]) after the endpoint's cursor, turns them into time series
//! ([`naming`]), hashes each series to one of `shards` shard threads (so a series' samples
//! stay in order) through bounded queues, and the shards send (`shard`). While an endpoint
//! is down its shards retry with exponential backoff, their queues fill, the reader stops
//! reading, and the archive keeps everything: nothing is dropped, and when the endpoint is
//! back the writer goes on from where it stopped. The cursor, in `<state_dir>/<name>.cursor`,
//! moves only past batches the endpoint acknowledged (or refused for good: 4xx other than
//! 401, 403 and 429, counted and logged) and survives a collector restart (`progress`).
//!
//! An `https://` endpoint is verified against the system's roots or a CA file, and may be
//! shown a client certificate (`monitor_client::tls`); basic auth or a bearer token, read
//! from files, authenticate the collector (`monitor_client::auth`). A certificate that does not verify and a 401/403
//! are retried like an outage (counted by reason, logged when the state changes), never
//! accepted or dropped: once the operator fixes the configuration, every sample arrives.

mod archive_source;
pub mod client;
pub mod naming;
mod progress;
pub mod prompb;
mod shard;
mod source;
mod stats;
mod table;

use std::{
    hash::{DefaultHasher, Hash, Hasher},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering::Relaxed},
        mpsc::{SyncSender, TrySendError, sync_channel},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

pub use archive_source::ArchiveSource;
pub use client::Failure;
pub use monitor_client::auth::Auth;
pub use monitor_client::tls::TlsFiles;
pub(crate) use progress::Progress;
pub use source::{Batch, Cursor, SampleSource, SeriesChunk, SourceError};
pub(crate) use stats::EndpointStats;
pub use stats::{StatsSnapshot, write_metrics};
pub use table::EndpointTable;

use self::{progress::Ticket, prompb::TimeSeries, shard::Work};

#[derive(Debug, thiserror::Error)]
pub enum RemoteWriteError {
    #[error("remote-write endpoint {spec:?}: {reason}")]
    Config { spec: String, reason: String },
    /// A CA, certificate, key or secret file of an endpoint that cannot be used.
    #[error("remote-write endpoint {endpoint}: {what} {}: {reason}", path.display())]
    File {
        endpoint: String,
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("remote-write cursor file {}: {source}", path.display())]
    CursorFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("remote-write cursor file {}: expected \"SEGMENT OFFSET\", found {text:?}", path.display())]
    BadCursorFile { path: PathBuf, text: String },
}

impl From<monitor_client::endpoint::EndpointError> for RemoteWriteError {
    /// An endpoint's TLS or secret file, in remote-write's words.
    fn from(e: monitor_client::endpoint::EndpointError) -> Self {
        use monitor_client::endpoint::EndpointError;
        match e {
            EndpointError::Config { endpoint, reason } => Self::Config {
                spec: endpoint,
                reason,
            },
            EndpointError::File {
                endpoint,
                what,
                path,
                reason,
            } => Self::File {
                endpoint,
                what,
                path,
                reason,
            },
        }
    }
}

/// One endpoint and how to write to it.
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointConfig {
    /// Names the cursor file and the `endpoint` label of the metrics (`[A-Za-z0-9_.-]+`).
    pub name: String,
    /// `http(s)://host:port/path` (Prometheus: `/api/v1/write`; VictoriaMetrics:
    /// `/api/v1/write`; Mimir: `/api/v1/push`). No user or password in it: see `auth`.
    pub url: String,
    /// Extra request headers (e.g. `X-Scope-OrgID` for a Mimir tenant).
    pub headers: Vec<(String, String)>,
    /// CA, client certificate: for an `https://` URL only.
    pub tls: TlsFiles,
    /// Basic auth or a bearer token, from files.
    pub auth: Auth,
    /// Parallel senders; a series always goes to the same one.
    pub shards: usize,
    /// Samples per request, about (a request is closed once it holds this many).
    pub max_samples_per_send: usize,
    /// A request holding fewer samples is sent after waiting this long for more.
    pub batch_send_deadline: Duration,
    /// Pieces of at most `max_samples_per_send` samples waiting per shard; when full, the
    /// reader waits (the archive holds the rest).
    pub queue_capacity: usize,
    /// Samples asked of the archive per read.
    pub read_batch_samples: usize,
    /// Wait between reads when the archive has nothing new.
    pub poll_interval: Duration,
    /// First wait after a retryable failure, doubled up to `max_backoff`.
    pub min_backoff: Duration,
    pub max_backoff: Duration,
    /// Whole-request timeout (connect, send, answer).
    pub timeout: Duration,
    /// The cursor file is rewritten at most this often (and at shutdown).
    pub cursor_sync_interval: Duration,
    /// At shutdown, how long the shards may go on sending what they hold.
    pub drain_timeout: Duration,
}

impl EndpointConfig {
    pub fn new(name: impl Into<String>, url: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            url: url.into(),
            headers: Vec::new(),
            tls: TlsFiles::default(),
            auth: Auth::None,
            shards: 4,
            max_samples_per_send: 2000,
            batch_send_deadline: Duration::from_secs(1),
            queue_capacity: 16,
            read_batch_samples: 10_000,
            poll_interval: Duration::from_millis(200),
            min_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
            timeout: Duration::from_secs(30),
            cursor_sync_interval: Duration::from_secs(1),
            drain_timeout: Duration::from_secs(5),
        }
    }

    /// `NAME=URL`, as the command line gives it, with the default settings.
    pub fn parse(spec: &str) -> Result<Self, RemoteWriteError> {
        let (name, url) = spec
            .split_once('=')
            .ok_or_else(|| RemoteWriteError::Config {
                spec: spec.to_owned(),
                reason: "expected NAME=URL, e.g. vm=http://127.0.0.1:8428/api/v1/write".into(),
            })?;
        let config = Self::new(name, url);
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), RemoteWriteError> {
        let fail = |reason: &str| {
            Err(RemoteWriteError::Config {
                spec: format!("{}={}", self.name, self.url),
                reason: reason.to_owned(),
            })
        };
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
        {
            return fail("the name must be letters, digits, '_', '.' or '-'");
        }
        let Some(rest) = ["http://", "https://"]
            .iter()
            .find_map(|scheme| self.url.strip_prefix(scheme))
            .filter(|rest| !rest.is_empty())
        else {
            return fail("the URL must start with http:// or https://");
        };
        if rest
            .split(['/', '?', '#'])
            .next()
            .is_some_and(|a| a.contains('@'))
        {
            return fail(
                "no user or password in the URL (it is logged): use basic-auth-user and \
                 basic-auth-password-file",
            );
        }
        if self.tls.is_set() && !self.url.starts_with("https://") {
            return fail(
                "ca-file, cert-file, key-file and insecure-skip-verify need an https:// URL",
            );
        }
        if self.tls.cert_file.is_some() != self.tls.key_file.is_some() {
            return fail("cert-file and key-file go together");
        }
        for (name, value) in &self.headers {
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
            {
                return fail(&format!(
                    "header name {name:?} is not a valid HTTP header name"
                ));
            }
            if value.chars().any(|c| c.is_control() && c != '\t') {
                return fail(&format!("header {name}: control characters in its value"));
            }
            let lower = name.to_ascii_lowercase();
            if lower == "authorization" {
                return fail(
                    "header Authorization: the secret would sit in the configuration; use \
                     bearer-token-file or basic-auth-password-file",
                );
            }
            if [
                "content-type",
                "content-encoding",
                "content-length",
                "host",
                "user-agent",
                "x-prometheus-remote-write-version",
            ]
            .contains(&lower.as_str())
            {
                return fail(&format!("header {name} is set by the collector"));
            }
        }
        if self.shards == 0 || self.max_samples_per_send == 0 || self.queue_capacity == 0 {
            return fail("shards, max_samples_per_send and queue_capacity must be at least 1");
        }
        Ok(())
    }
}

/// A running endpoint. Dropping it stops it like [`RemoteWriter::shutdown`].
pub struct RemoteWriter {
    name: String,
    stats: Arc<EndpointStats>,
    committed: Arc<Mutex<Cursor>>,
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
}

impl RemoteWriter {
    /// Starts writing to `config`'s endpoint from its cursor in `state_dir` (created if
    /// missing; no cursor yet: from the oldest frame the archive holds).
    pub fn start<S: SampleSource + 'static>(
        config: EndpointConfig,
        source: S,
        state_dir: &Path,
    ) -> Result<Self, RemoteWriteError> {
        config.validate()?;
        std::fs::create_dir_all(state_dir).map_err(|source| RemoteWriteError::CursorFile {
            path: state_dir.to_owned(),
            source,
        })?;
        // The CA, certificate and secret files are read before anything starts.
        let client = client::Client::new(&config)?;
        let file = state_dir.join(format!("{}.cursor", config.name));
        let progress = Progress::load(file, config.cursor_sync_interval)?;
        let stats = Arc::new(EndpointStats::default());
        let committed = Arc::new(Mutex::new(progress.committed()));
        let stop = Arc::new(AtomicBool::new(false));
        tracing::info!(
            endpoint = %config.name,
            "remote-write to {} from archive cursor {}",
            config.url,
            progress.committed()
        );
        let name = config.name.clone();
        let reader = Reader {
            name: name.clone(),
            config,
            client,
            stats: stats.clone(),
            committed: committed.clone(),
            stop: stop.clone(),
            progress,
        };
        let handle = std::thread::Builder::new()
            .name(format!("rw-{}", reader.name))
            .spawn(move || reader.run(source))
            .expect("spawning a thread");
        Ok(Self {
            name,
            stats,
            committed,
            stop,
            reader: Some(handle),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// The endpoint's current failure, as logged (naming the endpoint), while requests fail;
    /// None once they succeed again.
    pub fn last_error(&self) -> Option<String> {
        self.stats.last_error()
    }

    /// The cursor after everything the endpoint has acknowledged (written to the cursor file
    /// within `cursor_sync_interval`).
    pub fn committed(&self) -> Cursor {
        *self.committed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stops reading, lets the shards send what they hold for up to `drain_timeout`, writes
    /// the cursor and returns.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(h) = self.reader.take() {
            let _ = h.join();
        }
    }
}

impl Drop for RemoteWriter {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// The reader thread of one endpoint: reads, converts, dispatches, commits.
struct Reader {
    name: String,
    config: EndpointConfig,
    client: client::Client,
    stats: Arc<EndpointStats>,
    committed: Arc<Mutex<Cursor>>,
    stop: Arc<AtomicBool>,
    progress: Progress,
}

impl Reader {
    fn run<S: SampleSource>(mut self, mut source: S) {
        let abort = Arc::new(AtomicBool::new(false));
        let mut queues = Vec::with_capacity(self.config.shards);
        let mut shards = Vec::with_capacity(self.config.shards);
        for index in 0..self.config.shards {
            let (tx, rx) = sync_channel::<Work>(self.config.queue_capacity);
            let shard = shard::Shard {
                index,
                endpoint: self.name.clone(),
                client: self.client.clone(),
                config: self.config.clone(),
                stats: self.stats.clone(),
                abort: abort.clone(),
            };
            queues.push(tx);
            shards.push(
                std::thread::Builder::new()
                    .name(format!("rw-{}-{index}", self.name))
                    .spawn(move || shard.run(rx))
                    .expect("spawning a thread"),
            );
        }

        self.follow(&mut source, &queues);

        // Drain: no more reads; the shards finish what they hold while the endpoint answers.
        drop(queues);
        let until = Instant::now() + self.config.drain_timeout;
        while self.progress.batches_in_flight() > 0 && Instant::now() < until {
            self.commit(false);
            std::thread::sleep(Duration::from_millis(20));
        }
        abort.store(true, Relaxed);
        for s in shards {
            let _ = s.join();
        }
        self.commit(true);
        tracing::info!(
            endpoint = %self.name,
            "remote-write stopped at archive cursor {}",
            self.progress.committed()
        );
    }

    /// Reads and dispatches until stopped.
    fn follow<S: SampleSource>(&mut self, source: &mut S, queues: &[SyncSender<Work>]) {
        let mut cursor = self.progress.committed();
        let mut source_backoff = self.config.min_backoff;
        while !self.stop.load(Relaxed) {
            self.commit(false);
            let batch = match source.read_after(cursor, self.config.read_batch_samples) {
                Ok(b) => {
                    source_backoff = self.config.min_backoff;
                    b
                }
                Err(e) => {
                    tracing::warn!(
                        endpoint = %self.name,
                        "reading the archive after {cursor} failed: {e}; trying again in {source_backoff:.1?}"
                    );
                    self.sleep(source_backoff);
                    source_backoff = (source_backoff * 2).min(self.config.max_backoff);
                    continue;
                }
            };
            if batch.skipped_samples > 0 {
                self.stats
                    .samples_skipped
                    .fetch_add(batch.skipped_samples, Relaxed);
                tracing::warn!(
                    endpoint = %self.name,
                    "{} samples were removed from the archive before they could be sent",
                    batch.skipped_samples
                );
            }
            if batch.chunks.is_empty() && batch.next == cursor {
                self.sleep(self.config.poll_interval);
                continue;
            }
            let pieces = self.split(&batch);
            let ticket = Ticket::new(pieces.iter().map(Vec::len).sum());
            self.progress.dispatched(ticket.clone(), batch.next);
            for (shard, works) in pieces.into_iter().enumerate() {
                for (series, samples, newest_ms) in works {
                    let mut work = Work {
                        series,
                        samples,
                        newest_ms,
                        ticket: ticket.clone(),
                    };
                    // A full queue: the endpoint is slow or down. Wait (committing what
                    // finishes meanwhile); the archive holds what is not read yet.
                    loop {
                        match queues[shard].try_send(work) {
                            Ok(()) => break,
                            Err(TrySendError::Full(w)) => {
                                if self.stop.load(Relaxed) {
                                    return;
                                }
                                work = w;
                                self.commit(false);
                                std::thread::sleep(Duration::from_millis(10));
                            }
                            Err(TrySendError::Disconnected(_)) => return,
                        }
                    }
                }
            }
            cursor = batch.next;
        }
    }

    /// A batch as pieces per shard, each of at most about `max_samples_per_send` samples:
    /// (time series, Prometheus samples, newest time in ms).
    #[allow(clippy::type_complexity)]
    fn split(&self, batch: &Batch) -> Vec<Vec<(Vec<TimeSeries>, usize, i64)>> {
        let shards = self.config.shards;
        let mut pieces: Vec<Vec<(Vec<TimeSeries>, usize, i64)>> = vec![Vec::new(); shards];
        let mut total = 0u64;
        let mut newest_read = 0i64;
        for chunk in &batch.chunks {
            let mut h = DefaultHasher::new();
            (&*chunk.node, &chunk.series.name, &chunk.series.labels).hash(&mut h);
            let shard = (h.finish() % shards as u64) as usize;
            let list = &mut pieces[shard];
            if list
                .last()
                .is_none_or(|p| p.1 >= self.config.max_samples_per_send)
            {
                list.push((Vec::new(), 0, 0));
            }
            let piece = list.last_mut().expect("pushed above");
            let before = piece.0.len();
            let n = naming::to_time_series(&chunk.node, &chunk.series, &chunk.data, &mut piece.0);
            let newest = piece.0[before..]
                .iter()
                .filter_map(|ts| ts.samples.last())
                .map(|s| s.timestamp)
                .max()
                .unwrap_or(0);
            piece.1 += n;
            piece.2 = piece.2.max(newest);
            total += n as u64;
            newest_read = newest_read.max(newest);
        }
        self.stats.samples_pending.fetch_add(total, Relaxed);
        self.stats.highest_read_ms.fetch_max(newest_read, Relaxed);
        pieces
    }

    fn commit(&mut self, force: bool) {
        match self.progress.commit(force) {
            Ok(c) => *self.committed.lock().unwrap_or_else(|e| e.into_inner()) = c,
            // The cursor stays where it was on disk: after a restart more is sent again,
            // nothing is lost.
            Err(e) => tracing::warn!(endpoint = %self.name, "{e}"),
        }
    }

    fn sleep(&self, d: Duration) {
        let end = Instant::now() + d;
        while !self.stop.load(Relaxed) {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            std::thread::sleep(left.min(Duration::from_millis(50)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_specs_are_checked_with_the_spec_in_the_error() {
        let ok = EndpointConfig::parse("vm=http://127.0.0.1:8428/api/v1/write").unwrap();
        assert_eq!(ok.name, "vm");
        assert_eq!(ok.url, "http://127.0.0.1:8428/api/v1/write");
        let tls = EndpointConfig::parse("mimir=https://mimir.example:443/api/v1/push").unwrap();
        assert_eq!(tls.tls, TlsFiles::default());
        for (spec, needle) in [
            ("http://127.0.0.1:8428/api/v1/write", "NAME=URL"),
            ("v m=http://x/api/v1/write", "name"),
            ("vm=https://u:p@x/api/v1/write", "no user or password"),
            ("vm=ftp://x", "http://"),
            ("vm=https://", "https://"),
        ] {
            let err = EndpointConfig::parse(spec).unwrap_err().to_string();
            assert!(
                err.contains(needle) && err.contains("remote-write endpoint"),
                "{spec}: {err}"
            );
        }
    }
}
