//! The durable archive: every accepted frame, as received, appended to segment files under
//! the data directory (docs/archive-format.md).
//!
//! - An **open segment** (`<id>.wal`) takes every record first, as a CRC-checked entry.
//!   Appends go to a buffer that [`Archive::tick`] (called at least every 100 ms) writes out,
//!   so a killed process loses at most what was appended since the last tick; the file is
//!   fsynced every [`ArchiveConfig::sync_interval`] (1 s), which bounds what a power loss
//!   takes. At start-up a torn tail is cut, with one log line.
//! - When it reaches [`ArchiveConfig::segment_bytes`] or spans
//!   [`ArchiveConfig::segment_span`], the writer **freezes** it (it stays readable as it is)
//!   and starts the next open segment at once; the **sealer** thread (`sealer.rs`) then
//!   writes its sealed form (`<id>.seg`): its records regrouped per node into zstd blocks,
//!   with a per-node index of time and sequence ranges and a trailer, so a query reads only
//!   the segments of its time range and in them only the blocks of its nodes. The sealed
//!   form is swapped in under the lock and the frozen file deleted.
//! - **Retention** deletes the oldest sealed segments by age and by total size.
//! - A write that fails (a full disk) makes `append` and `tick` return the error, keeps the
//!   unwritten records up to [`ArchiveConfig::max_unwritten_bytes`] and retries at each
//!   tick; beyond that records are dropped and counted. Nothing panics: the caller's live
//!   view goes on.
//!
//! Readers ([`ArchiveReader`]) see everything appended, written out or not.

mod open;
mod reader;
pub mod recent;
mod recode;
mod record;
mod sealed;
mod sealer;

#[doc(hidden)]
use std::{
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
    time::{Duration, Instant},
};

pub use reader::{ArchiveReader, NodeSelector, ScanFilter, ScanStats, SequentialReader};
pub use record::{Record, RecordKind, RecordView};
pub use sealed::SealedSegment;
pub use sealer::SealerStall;

use crate::clock::unix_now_ns;
use open::{OpenSegment, open_path};
use sealed::{BlockSettings, sealed_path};
use sealer::Sealer;

/// Where the archive lives and how it behaves. [`ArchiveConfig::new`] gives the defaults.
#[derive(Clone, Debug)]
pub struct ArchiveConfig {
    pub dir: PathBuf,
    /// The open segment is sealed once it holds this many bytes (default 64 MiB).
    pub segment_bytes: u64,
    /// ... or once its first record was received this long ago (default 1 h).
    pub segment_span: Duration,
    /// Frame bytes in a sealed block, one node's records (default 1 MiB): a block is the
    /// unit of re-coding per series and of reading, docs/archive-format.md.
    pub block_bytes: usize,
    /// zstd level of sealed blocks (default 3; bench/results/archive-size.md gives the sizes).
    pub compression_level: i32,
    /// Sealed segments whose newest record was received longer ago are deleted (default 30
    /// days; `None`: kept whatever their age).
    pub retention_age: Option<Duration>,
    /// The oldest sealed segments are deleted so that the archive, its open segment at its
    /// largest included, takes at most this many bytes (default `None`).
    pub retention_bytes: Option<u64>,
    /// The open segment is fsynced this often when it changed (default 1 s).
    pub sync_interval: Duration,
    /// Appends are written out once this many bytes wait, without waiting for a tick
    /// (default 1 MiB).
    pub write_out_bytes: usize,
    /// While writes fail, at most this many bytes of records wait for a retry (default 16
    /// MiB); beyond, records are dropped and counted.
    pub max_unwritten_bytes: usize,
}

impl ArchiveConfig {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            segment_bytes: 64 << 20,
            segment_span: Duration::from_secs(3600),
            block_bytes: 1 << 20,
            compression_level: 3,
            retention_age: Some(Duration::from_secs(30 * 86_400)),
            retention_bytes: None,
            sync_interval: Duration::from_secs(1),
            write_out_bytes: 1 << 20,
            max_unwritten_bytes: 16 << 20,
        }
    }
}

/// One accepted frame, as ingest hands it to the archive.
#[derive(Clone, Copy, Debug)]
pub struct AcceptedFrame<'a> {
    pub node: &'a str,
    /// When the collector received it (Unix ns).
    pub received_ns: u64,
    /// Time range of its samples and events (Unix ns), for the index.
    pub first_ns: u64,
    pub last_ns: u64,
    /// The datagram as received, MAC included.
    pub bytes: &'a [u8],
}

/// What went wrong in the archive. Each names the file.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error(
        "archive {path}: disk full: archiving is stopped until space is freed (the live view goes on)"
    )]
    DiskFull { path: PathBuf },
    #[error("archive {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("archive {path}: corrupt: {what}")]
    Corrupt { path: PathBuf, what: String },
    #[error("archive {path}: format version {version}, this build reads versions 1 and 2")]
    Version { path: PathBuf, version: u8 },
    #[error("archive {dir}: sealing failed: {why}")]
    SealFailed { dir: PathBuf, why: String },
    #[error("archive {dir}: record of node {node:?} dropped: {why}")]
    Dropped {
        dir: PathBuf,
        node: String,
        why: String,
    },
}

impl ArchiveError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        if source.kind() == std::io::ErrorKind::StorageFull {
            ArchiveError::DiskFull {
                path: path.to_owned(),
            }
        } else {
            ArchiveError::Io {
                path: path.to_owned(),
                source,
            }
        }
    }

    /// True for a full disk (the archive stops; the caller's live view goes on).
    pub fn is_disk_full(&self) -> bool {
        matches!(self, ArchiveError::DiskFull { .. })
    }
}

/// The archive's own health, for `/metrics` and logs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ArchiveStats {
    /// Bytes of all segment files.
    pub bytes_on_disk: u64,
    /// Sealed segments, frozen ones plus the open one.
    pub segments: u64,
    /// Records in the archive (frames and schema records).
    pub records: u64,
    /// Frames appended since the archive was opened.
    pub frames_appended: u64,
    /// Frame bytes appended since the archive was opened (the datagrams, as received).
    pub frame_bytes_appended: u64,
    /// Torn tails cut when the archive was opened.
    pub torn_tails_cut: u64,
    /// Failed writes, syncs and seals.
    pub write_errors: u64,
    /// Segments the sealer sealed since the archive was opened.
    pub segments_sealed: u64,
    /// Frozen segments waiting for the sealer (readable meanwhile in their open form).
    pub segments_waiting_seal: u64,
    /// Records dropped because writes kept failing.
    pub dropped_records: u64,
    /// Segments deleted by retention.
    pub segments_deleted: u64,
    /// Appended, not yet written out.
    pub unwritten_bytes: u64,
    /// The error writes are failing with, while they fail.
    pub failing: Option<String>,
}

/// What the writer, the sealer and the readers share.
pub(crate) struct State {
    pub sealed: Vec<Arc<SealedSegment>>,
    /// Full open segments the writer handed to the sealer, oldest first: read as open
    /// segments (their `.wal` and index, unchanged) until their sealed form replaces them.
    pub frozen: Vec<Arc<OpenSegment>>,
    pub open: OpenSegment,
}

impl State {
    /// The segments still in their open form, in sequence order: the frozen ones, then the
    /// open one.
    pub(crate) fn wal_segments(&self) -> impl Iterator<Item = &OpenSegment> {
        self.frozen
            .iter()
            .map(|s| &**s)
            .chain(std::iter::once(&self.open))
    }
}

/// The archive's writer: owned by one thread, which calls [`append`](Self::append) for each
/// accepted frame and [`tick`](Self::tick) at least every 100 ms. Full open segments are
/// sealed by a thread of the archive's own (the sealer), which dropping the archive stops.
pub struct Archive {
    config: ArchiveConfig,
    shared: Arc<RwLock<State>>,
    next_seq: u64,
    /// Every record below this sequence number is on disk, fsynced: what a collector may
    /// acknowledge to the agents (docs/wire-format.md, "Acknowledgements").
    durable_seq: u64,
    stats: ArchiveStats,
    last_sync: Instant,
    last_retention: Instant,
    /// After a failed freeze (a full disk), when to try again.
    freeze_retry_at: Option<Instant>,
    /// Segments the sealer had sealed when retention last ran.
    sealed_seen: u64,
    sealer: Sealer,
}

const FREEZE_RETRY: Duration = Duration::from_secs(10);
const RETENTION_EVERY: Duration = Duration::from_secs(10);
/// Frozen segments waiting for the sealer at most: beyond, the open segment is not frozen
/// and grows past `segment_bytes` until the sealer takes one (docs/archive-format.md,
/// "Sealing").
pub const MAX_FROZEN: usize = 2;

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn parse_name(name: &str) -> Option<(u64, &str)> {
    let (id, ext) = name.split_once('.')?;
    (id.len() == 20).then_some(())?;
    Some((id.parse().ok()?, ext))
}

fn write_lock(shared: &RwLock<State>) -> std::sync::RwLockWriteGuard<'_, State> {
    shared.write().unwrap_or_else(|p| p.into_inner())
}

fn read_lock(shared: &RwLock<State>) -> std::sync::RwLockReadGuard<'_, State> {
    shared.read().unwrap_or_else(|p| p.into_inner())
}

fn sync_dir(dir: &Path) -> Result<(), ArchiveError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| ArchiveError::io(dir, e))
}

impl Archive {
    /// Opens or creates the archive under `config.dir` and starts its sealer. Recovers what a
    /// crash left: an open segment's torn tail is cut (one log line), a seal that finished
    /// but did not delete its open segment is completed, open segments older than the newest
    /// (frozen ones, or left by a failed seal) are handed to the sealer again.
    pub fn open(config: ArchiveConfig) -> Result<Archive, ArchiveError> {
        let dir = config.dir.clone();
        std::fs::create_dir_all(&dir).map_err(|e| ArchiveError::io(&dir, e))?;
        let mut sealed_ids = Vec::new();
        let mut open_ids = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(|e| ArchiveError::io(&dir, e))? {
            let entry = entry.map_err(|e| ArchiveError::io(&dir, e))?;
            let name = entry.file_name();
            let Some((id, ext)) = name.to_str().and_then(parse_name) else {
                continue;
            };
            match ext {
                "seg" => sealed_ids.push(id),
                "wal" => open_ids.push(id),
                "seg.tmp" => {
                    // A seal cut short: its open segment is still there.
                    let _ = std::fs::remove_file(entry.path());
                }
                _ => {}
            }
        }
        sealed_ids.sort_unstable();
        open_ids.sort_unstable();
        let mut stats = ArchiveStats::default();
        let mut sealed = Vec::new();
        for &id in &sealed_ids {
            let path = sealed_path(&dir, id);
            match SealedSegment::open(&path) {
                Ok(seg) => sealed.push(Arc::new(seg)),
                Err(e) if open_ids.binary_search(&id).is_ok() => {
                    // Its open form is still there: sealed again, which replaces it.
                    tracing::warn!("{e}: sealing its open segment again");
                }
                Err(e) => {
                    tracing::error!("{e}: segment left out of the archive");
                    stats.write_errors += 1;
                }
            }
        }
        let mut frozen = Vec::new();
        let mut open: Option<OpenSegment> = None;
        for &id in &open_ids {
            let path = open_path(&dir, id);
            if sealed.iter().any(|s| s.id == id) {
                // Sealed, but the crash came before its open segment was deleted.
                std::fs::remove_file(&path).map_err(|e| ArchiveError::io(&path, e))?;
                continue;
            }
            let (seg, torn) = OpenSegment::recover(&path, id)?;
            if let Some(t) = torn {
                tracing::warn!(
                    "archive {}: cut a torn tail of {} bytes at byte {} ({}): the records before it are kept",
                    path.display(),
                    t.cut_bytes,
                    t.at,
                    t.why
                );
                stats.torn_tails_cut += 1;
            }
            if let Some(previous) = open.replace(seg) {
                // Not the newest: frozen (or left by a failed seal) before the restart.
                if previous.entries.is_empty() {
                    std::fs::remove_file(&previous.path)
                        .map_err(|e| ArchiveError::io(&previous.path, e))?;
                } else if sealed.iter().any(|s| s.id > previous.id) {
                    // Older than a sealed segment (its own `.seg` was damaged): sealed now,
                    // so that the frozen segments stay newer than every sealed one.
                    let seg = seal_snapshot(&dir, &previous, block_settings(&config), &|| {})?;
                    sync_dir(&dir)?;
                    std::fs::remove_file(&previous.path)
                        .map_err(|e| ArchiveError::io(&previous.path, e))?;
                    sealed.push(Arc::new(seg));
                } else {
                    frozen.push(Arc::new(previous));
                }
            }
        }
        let next_id = sealed
            .iter()
            .map(|s| s.id)
            .chain(open.iter().map(|o| o.id))
            .max()
            .map_or(1, |id| id + 1);
        let open = match open {
            Some(o) => o,
            None => OpenSegment::create(&dir, next_id)?,
        };
        sealed.sort_by_key(|s| s.id);
        let next_seq = sealed
            .iter()
            .map(|s| s.last_seq + 1)
            .chain(
                frozen
                    .iter()
                    .map(|f| &**f)
                    .chain(std::iter::once(&open))
                    .filter_map(|o| o.entries.last().map(|e| e.seq + 1)),
            )
            .max()
            .unwrap_or(0);
        sync_dir(&dir)?;
        let shared = Arc::new(RwLock::new(State {
            sealed,
            frozen,
            open,
        }));
        let sealer = Sealer::spawn(shared.clone(), dir, block_settings(&config))?;
        Ok(Archive {
            config,
            shared,
            next_seq,
            // Read back from the files: as durable as they are.
            durable_seq: next_seq,
            stats,
            last_sync: Instant::now(),
            last_retention: Instant::now() - RETENTION_EVERY,
            freeze_retry_at: None,
            sealed_seen: 0,
            sealer,
        })
    }

    pub fn config(&self) -> &ArchiveConfig {
        &self.config
    }

    /// The sequence number the next appended record gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Every record below this sequence number is written and fsynced (at most
    /// `sync_interval` behind the appends).
    pub fn durable_seq(&self) -> u64 {
        self.durable_seq
    }

    /// Appends one accepted frame. `schema` is called when the node's first record goes into
    /// a new segment: it returns the node's current schema as a frame of schema entries only,
    /// written before the frame so every segment decodes on its own.
    pub fn append(
        &mut self,
        frame: &AcceptedFrame<'_>,
        schema: &dyn Fn(&str) -> Option<Vec<u8>>,
    ) -> Result<(), ArchiveError> {
        if frame.node.len() > 255 || frame.bytes.len() > 65_536 {
            return Err(self.dropped(frame.node, "node name or frame longer than a frame allows"));
        }
        if self.open_full(frame.received_ns) {
            self.freeze();
        }
        let unwritten = read_lock(&self.shared).open.buf.len();
        if self.stats.failing.is_some() && unwritten >= self.config.max_unwritten_bytes {
            let why = format!(
                "writes are failing ({}) and {} bytes already wait",
                self.stats.failing.as_deref().unwrap_or_default(),
                unwritten
            );
            return Err(self.dropped(frame.node, &why));
        }
        let known = read_lock(&self.shared)
            .open
            .node_ix
            .contains_key(frame.node);
        let schema_bytes = if known { None } else { schema(frame.node) };
        let mut view = RecordView {
            seq: 0,
            kind: RecordKind::Schema,
            node: frame.node,
            received_ns: frame.received_ns,
            first_ns: frame.first_ns,
            last_ns: frame.first_ns,
            bytes: &[],
        };
        let buffered = {
            let mut st = write_lock(&self.shared);
            if let Some(bytes) = &schema_bytes {
                view.seq = self.next_seq;
                view.bytes = bytes;
                st.open.append(&view);
                self.next_seq += 1;
            }
            view.seq = self.next_seq;
            view.kind = RecordKind::Frame;
            view.last_ns = frame.last_ns;
            view.bytes = frame.bytes;
            st.open.append(&view);
            self.next_seq += 1;
            st.open.buf.len()
        };
        self.stats.frames_appended += 1;
        self.stats.frame_bytes_appended += frame.bytes.len() as u64;
        if buffered >= self.config.write_out_bytes && self.stats.failing.is_none() {
            // A failure is counted and logged there, and reported by the next tick: this
            // record is kept in the buffer either way.
            let _ = self.write_out();
        }
        Ok(())
    }

    fn dropped(&mut self, node: &str, why: &str) -> ArchiveError {
        self.stats.dropped_records += 1;
        ArchiveError::Dropped {
            dir: self.config.dir.clone(),
            node: node.to_owned(),
            why: why.to_owned(),
        }
    }

    /// The open segment is due to be frozen: full or old enough, a retry after a failed
    /// freeze is due, and the sealer is not [`MAX_FROZEN`] segments behind.
    fn open_full(&self, now_ns: u64) -> bool {
        if self.freeze_retry_at.is_some_and(|t| Instant::now() < t) {
            return false;
        }
        let st = read_lock(&self.shared);
        let span = nanos(self.config.segment_span);
        st.frozen.len() < MAX_FROZEN
            && (st.open.size() >= self.config.segment_bytes
                || st
                    .open
                    .first_received_ns()
                    .is_some_and(|first| now_ns.saturating_sub(first) >= span))
    }

    /// Writes out what is buffered; on failure keeps it for the next try (appends refuse new
    /// records once `max_unwritten_bytes` wait).
    fn write_out(&mut self) -> Result<(), ArchiveError> {
        let mut st = write_lock(&self.shared);
        let result = st.open.write_out();
        match &result {
            Ok(()) => {
                if self.stats.failing.take().is_some() {
                    tracing::info!("archive {}: writing again", self.config.dir.display());
                }
            }
            Err(e) => {
                self.stats.write_errors += 1;
                if self.stats.failing.is_none() {
                    tracing::error!("{e}: records wait in memory and are retried every tick");
                }
                self.stats.failing = Some(e.to_string());
            }
        }
        result
    }

    /// Called by the writer at least every 100 ms: writes out what was appended (a process
    /// kill then loses at most the records of the last tick), fsyncs the open segment every
    /// `sync_interval`, freezes it for the sealer when its span has passed, and applies
    /// retention after each seal and every 10 s.
    pub fn tick(&mut self) -> Result<(), ArchiveError> {
        self.write_out()?;
        if self.last_sync.elapsed() >= self.config.sync_interval {
            let mut st = write_lock(&self.shared);
            if st.open.dirty {
                let synced = st.open.file.sync_data();
                match synced {
                    Ok(()) => st.open.dirty = false,
                    Err(e) => {
                        let e = ArchiveError::io(&st.open.path, e);
                        drop(st);
                        self.stats.write_errors += 1;
                        return Err(e);
                    }
                }
            }
            drop(st);
            // Everything appended was written out above (or this returned its error).
            self.durable_seq = self.next_seq;
            self.last_sync = Instant::now();
        }
        let now = unix_now_ns();
        if self.open_full(now) {
            self.freeze();
        }
        let sealed = self.sealer.status().sealed;
        if sealed != self.sealed_seen || self.last_retention.elapsed() >= RETENTION_EVERY {
            self.sealed_seen = sealed;
            self.last_retention = Instant::now();
            self.apply_retention(now);
        }
        Ok(())
    }

    /// Seals the open segment now, starts a new one and waits until the sealer has sealed
    /// every frozen segment (a planned shutdown, a measurement): the sealer's error if a seal
    /// fails.
    pub fn seal(&mut self) -> Result<(), ArchiveError> {
        self.wait_for_sealer()?;
        self.try_freeze()?;
        self.wait_for_sealer()
    }

    /// Waits until the sealer has caught up (trying a failed seal again at once): every
    /// frozen segment sealed, and an open segment that is due frozen and sealed too; then
    /// applies retention. The sealer's error if a seal fails. For measurements and tests:
    /// the writer never waits for the sealer.
    pub fn wait_for_sealer(&mut self) -> Result<(), ArchiveError> {
        let result = loop {
            if let Err(why) = self.sealer.wait_idle(&self.shared) {
                break Err(ArchiveError::SealFailed {
                    dir: self.config.dir.clone(),
                    why,
                });
            }
            if !self.open_full(unix_now_ns()) {
                break Ok(());
            }
            if let Err(e) = self.try_freeze() {
                break Err(e);
            }
        };
        self.sealed_seen = self.sealer.status().sealed;
        self.apply_retention(unix_now_ns());
        result
    }

    /// The sealer thread's heartbeat (for the watchdog: it beats per block and when idle).
    pub fn sealer_heartbeat(&self) -> crate::liveness::Heartbeat {
        self.sealer.heartbeat()
    }

    /// Test hook: the sealer stands still, without beating, until the guard is dropped.
    #[doc(hidden)]
    pub fn stall_sealer(&self) -> SealerStall {
        self.sealer.stall()
    }

    /// Freezes the open segment for the sealer and starts a new one. A failure (a full
    /// disk) is logged and counted; appends go on into the same open segment and the freeze
    /// is retried later.
    fn freeze(&mut self) {
        match self.try_freeze() {
            Ok(()) => self.freeze_retry_at = None,
            Err(e) => {
                self.stats.write_errors += 1;
                tracing::error!(
                    "{e}: starting a new open segment failed, appends go on into the full one; retrying in {} s",
                    FREEZE_RETRY.as_secs()
                );
                self.freeze_retry_at = Some(Instant::now() + FREEZE_RETRY);
            }
        }
    }

    /// The open segment, all of it written out, becomes frozen (read as it is until the
    /// sealer swaps its sealed form in) and a new open segment takes the appends.
    fn try_freeze(&mut self) -> Result<(), ArchiveError> {
        self.write_out()?;
        let dir = self.config.dir.clone();
        let (id, empty) = {
            let st = read_lock(&self.shared);
            (st.open.id, st.open.entries.is_empty())
        };
        if empty {
            return Ok(());
        }
        // Fsynced before the sealer gets it, so that what it holds may be acknowledged now
        // (one fsync per segment).
        {
            let st = read_lock(&self.shared);
            st.open
                .file
                .sync_data()
                .map_err(|e| ArchiveError::io(&st.open.path, e))?;
        }
        self.durable_seq = self.next_seq;
        let fresh = match OpenSegment::create(&dir, id + 1) {
            Ok(fresh) => fresh,
            Err(e) => {
                // Nothing of it is used: a retry creates it again.
                let _ = std::fs::remove_file(open_path(&dir, id + 1));
                return Err(e);
            }
        };
        {
            let mut st = write_lock(&self.shared);
            let full = std::mem::replace(&mut st.open, fresh);
            st.frozen.push(Arc::new(full));
        }
        self.sealer.wake();
        // The new segment's name reaches the disk (its data is fsynced every sync_interval).
        if let Err(e) = sync_dir(&dir) {
            self.stats.write_errors += 1;
            tracing::warn!("{e}");
        }
        Ok(())
    }

    /// Deletes the oldest sealed segments: those whose newest record was received before
    /// `now_ns - retention_age`, then more while the sealed ones, the frozen ones and the
    /// open one at its largest would take more than `retention_bytes`.
    /// Returns how many were deleted.
    pub(crate) fn apply_retention(&mut self, now_ns: u64) -> usize {
        let doomed: Vec<Arc<SealedSegment>> = {
            let mut st = write_lock(&self.shared);
            let cutoff = self
                .config
                .retention_age
                .map(|age| now_ns.saturating_sub(nanos(age)));
            // Sealed segments get what the open and frozen segments cannot take at their
            // largest, so the archive as a whole stays within `retention_bytes`.
            let open_max = self.config.segment_bytes.max(st.open.size()) + 65_536;
            let frozen: u64 = st.frozen.iter().map(|f| f.size()).sum();
            let budget = self
                .config
                .retention_bytes
                .map(|max| max.saturating_sub(open_max + frozen));
            let mut total: u64 = st.sealed.iter().map(|s| s.bytes).sum();
            let mut n = 0;
            for s in &st.sealed {
                let too_old = cutoff.is_some_and(|c| s.max_received_ns < c);
                let too_big = budget.is_some_and(|max| total > max);
                if !(too_old || too_big) {
                    break;
                }
                total -= s.bytes;
                n += 1;
            }
            st.sealed.drain(..n).collect()
        };
        for s in &doomed {
            if let Err(e) = std::fs::remove_file(&s.path) {
                tracing::warn!("archive: removing {} (retention): {e}", s.path.display());
            }
        }
        if !doomed.is_empty() {
            tracing::info!(
                "archive {}: retention deleted {} segment(s), up to record {}",
                self.config.dir.display(),
                doomed.len(),
                doomed.last().map_or(0, |s| s.last_seq)
            );
        }
        self.stats.segments_deleted += doomed.len() as u64;
        doomed.len()
    }

    /// A reader that sees everything appended (Clone + Send).
    pub fn reader(&self) -> ArchiveReader {
        ArchiveReader::new(self.shared.clone())
    }

    /// Bytes on disk, segments, records, torn tails cut, errors, seals.
    pub fn stats(&self) -> ArchiveStats {
        let sealer = self.sealer.status();
        let st = read_lock(&self.shared);
        ArchiveStats {
            bytes_on_disk: st.sealed.iter().map(|s| s.bytes).sum::<u64>()
                + st.wal_segments().map(|o| o.written).sum::<u64>(),
            segments: (st.sealed.len() + st.frozen.len()) as u64 + 1,
            records: st.sealed.iter().map(|s| u64::from(s.records)).sum::<u64>()
                + st.wal_segments()
                    .map(|o| o.entries.len() as u64)
                    .sum::<u64>(),
            unwritten_bytes: st.open.buf.len() as u64,
            segments_sealed: sealer.sealed,
            segments_waiting_seal: st.frozen.len() as u64,
            write_errors: self.stats.write_errors + sealer.failures,
            ..self.stats.clone()
        }
    }
}

fn block_settings(config: &ArchiveConfig) -> BlockSettings {
    BlockSettings {
        block_bytes: config.block_bytes,
        level: config.compression_level,
        recode: true,
    }
}

/// Writes the sealed form of an open segment (all its records written out); `beat` is
/// called per block.
fn seal_snapshot(
    dir: &Path,
    open: &OpenSegment,
    settings: BlockSettings,
    beat: &dyn Fn(),
) -> Result<SealedSegment, ArchiveError> {
    let bytes = std::fs::read(&open.path).map_err(|e| ArchiveError::io(&open.path, e))?;
    let mut per_node: Vec<(&str, Vec<RecordView<'_>>)> =
        open.nodes.iter().map(|n| (&**n, Vec::new())).collect();
    for e in &open.entries {
        let start = e.offset as usize;
        let entry = bytes
            .get(start..start + e.len as usize)
            .and_then(|b| record::read_entry(b).ok())
            .ok_or_else(|| ArchiveError::Corrupt {
                path: open.path.clone(),
                what: format!("entry at byte {} changed under the archive", e.offset),
            })?;
        per_node[e.node as usize].1.push(entry.0);
    }
    per_node.sort_by(|a, b| a.0.cmp(b.0));
    sealed::write(dir, open.id, &per_node, settings, beat)
}

#[cfg(test)]
mod tests;
