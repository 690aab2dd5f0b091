//! The archive's writer thread and the queue that feeds it: receive threads hand every
//! accepted frame over without waiting (a queue bounded in bytes; a frame that does not fit
//! is counted and stays only in the live view), and one thread appends them to the archive,
//! ticking it at least every 100 ms so buffered data reaches the disk. An archive error (a
//! full disk) is counted and logged when it starts and when it ends; ingest and the live view
//! go on.
//!
//! The archive is reached through [`FrameArchive`], the contract between ingest and archive
//! (`Archive::append`, `Archive::tick`, and the sequence numbers that say what is durable):
//! the writer calls nothing else. Once a frame's record is durable the writer acknowledges
//! it to its agent (`acks`); a frame it could not append is taken back out of the
//! node's receiver state, so the agent's next copy of it is taken.

use std::{
    collections::VecDeque,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        mpsc::{Receiver, RecvTimeoutError, Sender, SyncSender, channel, sync_channel},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use monitor_wire::{Frame, Key, Keyring, SchemaEntry};

use monitor_findings::live_table::Schema;

use crate::acks::{Acker, Copied, Delivered};
use monitor_archive::{liveness::Heartbeat, lock::lock};

pub use monitor_archive::archive::AcceptedFrame;

/// An archive error, as the writer logs and counts it.
pub type ArchiveError = Box<dyn std::error::Error + Send + Sync>;

/// What the writer thread needs of the archive.
pub trait FrameArchive: Send + 'static {
    /// Appends one accepted frame. `schema` returns, for the frame's node, its schema as a
    /// frame of schema entries only (for the start of a segment, so that every segment
    /// decodes on its own).
    fn append(
        &mut self,
        frame: &AcceptedFrame<'_>,
        schema: &dyn Fn(&str) -> Option<Vec<u8>>,
    ) -> Result<(), ArchiveError>;
    /// Writes out buffered data; called at least every 100 ms.
    fn tick(&mut self) -> Result<(), ArchiveError>;
    /// The sequence number the next appended record gets.
    fn next_seq(&self) -> u64;
    /// Every record below this sequence number is on disk, fsynced.
    fn durable_seq(&self) -> u64;
    /// The threads the archive runs itself, by name, for the watchdog.
    fn heartbeats(&self) -> Vec<(String, Heartbeat)> {
        Vec::new()
    }
}

impl FrameArchive for monitor_archive::archive::Archive {
    fn append(
        &mut self,
        frame: &AcceptedFrame<'_>,
        schema: &dyn Fn(&str) -> Option<Vec<u8>>,
    ) -> Result<(), ArchiveError> {
        monitor_archive::archive::Archive::append(self, frame, schema).map_err(Into::into)
    }

    fn tick(&mut self) -> Result<(), ArchiveError> {
        monitor_archive::archive::Archive::tick(self).map_err(Into::into)
    }

    fn next_seq(&self) -> u64 {
        monitor_archive::archive::Archive::next_seq(self)
    }

    fn durable_seq(&self) -> u64 {
        monitor_archive::archive::Archive::durable_seq(self)
    }

    fn heartbeats(&self) -> Vec<(String, Heartbeat)> {
        vec![("archive-sealer".to_owned(), self.sealer_heartbeat())]
    }
}

/// The archive with its [`ArchiveStats`](monitor_archive::archive::ArchiveStats) published after each
/// append and tick, for `/metrics` (the archive itself belongs to the writer thread).
pub struct PublishingArchive {
    archive: monitor_archive::archive::Archive,
    stats: Arc<Mutex<monitor_archive::archive::ArchiveStats>>,
}

impl PublishingArchive {
    pub fn new(archive: monitor_archive::archive::Archive) -> Self {
        let stats = Arc::new(Mutex::new(archive.stats()));
        Self { archive, stats }
    }

    /// The latest stats, shared with whoever renders them.
    pub fn stats(&self) -> Arc<Mutex<monitor_archive::archive::ArchiveStats>> {
        self.stats.clone()
    }

    fn publish(&self) {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner()) = self.archive.stats();
    }
}

impl FrameArchive for PublishingArchive {
    fn append(
        &mut self,
        frame: &AcceptedFrame<'_>,
        schema: &dyn Fn(&str) -> Option<Vec<u8>>,
    ) -> Result<(), ArchiveError> {
        FrameArchive::append(&mut self.archive, frame, schema)
    }

    fn tick(&mut self) -> Result<(), ArchiveError> {
        let result = FrameArchive::tick(&mut self.archive);
        self.publish();
        result
    }

    fn next_seq(&self) -> u64 {
        self.archive.next_seq()
    }

    fn durable_seq(&self) -> u64 {
        self.archive.durable_seq()
    }

    fn heartbeats(&self) -> Vec<(String, Heartbeat)> {
        FrameArchive::heartbeats(&self.archive)
    }
}

/// How often the writer ticks the archive at least.
pub const TICK_EVERY: Duration = Duration::from_millis(100);

/// A frame waiting for the writer.
#[derive(Debug)]
pub struct QueuedFrame {
    pub node: Arc<str>,
    pub received_ns: u64,
    pub first_ns: u64,
    pub last_ns: u64,
    pub seq: u64,
    pub bytes: Vec<u8>,
    /// The node's schema when the frame was accepted.
    pub schema: Arc<Schema>,
    /// The frame's session, where its agent's socket is and the key it carried: to
    /// acknowledge it once durable.
    pub session: u32,
    pub from: SocketAddr,
    pub key: Key,
}

impl QueuedFrame {
    fn delivered(&self) -> Delivered {
        Delivered {
            node: self.node.clone(),
            session: self.session,
            seq: self.seq,
            received_ns: self.received_ns,
            len: self.bytes.len(),
            from: self.from,
            key: self.key.clone(),
        }
    }
}

/// Counters of the queue and the writer, read by `/metrics`.
#[derive(Debug, Default)]
pub struct WriterStats {
    pub queued_frames: AtomicUsize,
    pub queued_bytes: AtomicUsize,
    pub appended: AtomicU64,
    pub dropped_queue_full: AtomicU64,
    pub append_errors: AtomicU64,
    pub tick_errors: AtomicU64,
    /// The last append or tick failed (a full disk, for one).
    pub failing: AtomicBool,
    pub last_error: Mutex<Option<String>>,
}

/// The receive threads' end of the queue.
#[derive(Debug, Clone)]
pub struct ArchiveQueue {
    /// Unbounded as a channel: [`Self::push`] bounds it in bytes and in frames, and its
    /// memory is what is in flight (a bounded channel would allocate every slot at start:
    /// about 100 MB for the default 64 MiB, with nothing queued).
    tx: Sender<QueuedFrame>,
    /// Copies of frames ingest had already: to acknowledge again.
    duplicates: SyncSender<Copied>,
    stats: Arc<WriterStats>,
    capacity_bytes: usize,
}

impl ArchiveQueue {
    /// Queues a frame for the archive; a full queue drops it (counted) and returns false.
    pub fn push(&self, frame: QueuedFrame) -> bool {
        let len = frame.bytes.len();
        let held = self.stats.queued_bytes.fetch_add(len, Ordering::Relaxed);
        if held + len > self.capacity_bytes {
            self.stats.queued_bytes.fetch_sub(len, Ordering::Relaxed);
            self.stats
                .dropped_queue_full
                .fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let frames = self.stats.queued_frames.fetch_add(1, Ordering::Relaxed);
        let fits = frames < self.capacity_frames();
        if fits && self.tx.send(frame).is_ok() {
            return true;
        }
        self.stats.queued_bytes.fetch_sub(len, Ordering::Relaxed);
        self.stats.queued_frames.fetch_sub(1, Ordering::Relaxed);
        self.stats
            .dropped_queue_full
            .fetch_add(1, Ordering::Relaxed);
        false
    }

    /// A copy of a frame already taken arrived: its acknowledgement was lost, or is not due
    /// yet. Dropped when the writer is that far behind (the agent sends it again).
    pub fn duplicate(&self, copy: Copied) {
        let _ = self.duplicates.try_send(copy);
    }

    pub fn stats(&self) -> &Arc<WriterStats> {
        &self.stats
    }

    pub fn capacity_bytes(&self) -> usize {
        self.capacity_bytes
    }

    /// The bound in frames, a second guard beside the bytes' (many small frames): a frame of
    /// 64 bytes on average.
    fn capacity_frames(&self) -> usize {
        self.capacity_bytes / 64 + 1
    }
}

/// How far below a frame's sequence number its schema frame is numbered: a reader that decodes
/// the schema frame and then the segment's frames with one receiver state sees no duplicate
/// (the collector refuses anything 64 or more behind its newest, so no archived frame after it
/// has the schema frame's number, frames 1 to 63 of a session aside).
pub const SCHEMA_SEQ_BEHIND: u64 = 64;

/// A node's schema as one frame of schema entries only, in the session of the frame it goes
/// before (`seq`), numbered [`SCHEMA_SEQ_BEHIND`] before it. None for a session's first frame
/// (seq 0): the schema then holds only that frame's own entries, which it carries.
pub fn schema_frame(schema: &Schema, seq: u64, send_unix_ns: u64, key: &Key) -> Option<Vec<u8>> {
    if schema.entries.is_empty() || seq == 0 {
        return None;
    }
    let mut entries: Vec<SchemaEntry> = schema
        .entries
        .iter()
        .map(|(id, series)| SchemaEntry {
            id: *id,
            series: series.clone(),
        })
        .collect();
    entries.sort_by_key(|e| e.id);
    let frame = Frame {
        node: schema.node.to_string(),
        session: schema.session,
        seq: seq.saturating_sub(SCHEMA_SEQ_BEHIND),
        send_unix_ns,
        time_quantum_ns: 1_000_000,
        schema: entries,
        samples: Vec::new(),
        events: Vec::new(),
    };
    match monitor_wire::encode_frame(&frame, key) {
        Ok(bytes) => Some(bytes),
        Err(e) => {
            tracing::warn!("schema frame of node {:?} not encoded: {e}", schema.node);
            None
        }
    }
}

/// The running writer thread.
pub struct Writer {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Writer {
    /// Appends what is queued, writes it out and stops.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

/// What the writer does for the rest of the collector besides appending: acknowledge durable
/// frames, and take a frame it could not append back out of ingest's receiver state.
pub struct Delivery {
    pub acker: Acker,
    pub not_stored: Box<dyn Fn(&Delivered) + Send>,
}

impl Delivery {
    /// Acknowledges nothing and forgets nothing (tests of the writer alone).
    pub fn none() -> Self {
        Self {
            acker: Acker::new(None, Arc::default()),
            not_stored: Box::new(|_| {}),
        }
    }
}

struct Inputs {
    frames: Receiver<QueuedFrame>,
    /// Copies of frames ingest had already.
    copies: Receiver<Copied>,
}

/// Starts the writer thread; it beats `heartbeat` at every turn (at least every tick).
pub fn spawn(
    mut archive: Box<dyn FrameArchive>,
    keys: Keyring,
    capacity_bytes: usize,
    heartbeat: Heartbeat,
    mut delivery: Delivery,
) -> std::io::Result<(ArchiveQueue, Writer)> {
    let (tx, frames) = channel();
    let (duplicates, copies) = sync_channel(4096);
    let stats = Arc::new(WriterStats::default());
    let queue = ArchiveQueue {
        tx,
        duplicates,
        stats: stats.clone(),
        capacity_bytes,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    let thread = std::thread::Builder::new()
        .name("archive-writer".into())
        .spawn(move || {
            let inputs = Inputs { frames, copies };
            write_loop(
                &mut *archive,
                &inputs,
                &stats,
                &keys,
                &stopping,
                &heartbeat,
                &mut delivery,
            )
        })?;
    Ok((queue, Writer { stop, thread }))
}

fn write_loop(
    archive: &mut dyn FrameArchive,
    inputs: &Inputs,
    stats: &WriterStats,
    keys: &Keyring,
    stop: &AtomicBool,
    heartbeat: &Heartbeat,
    delivery: &mut Delivery,
) {
    let rx = &inputs.frames;
    let mut last_tick = Instant::now();
    // Appended frames not durable yet, with the archive sequence number their record ends at.
    let mut pending: VecDeque<(u64, Delivered)> = VecDeque::new();
    loop {
        heartbeat.beat();
        let wait = TICK_EVERY.saturating_sub(last_tick.elapsed());
        // Once stopping, what is left in the queue is appended without waiting for more.
        let next = if stop.load(Ordering::Relaxed) {
            rx.try_recv().map_err(|_| RecvTimeoutError::Disconnected)
        } else {
            rx.recv_timeout(wait)
        };
        match next {
            Ok(item) => {
                stats
                    .queued_bytes
                    .fetch_sub(item.bytes.len(), Ordering::Relaxed);
                stats.queued_frames.fetch_sub(1, Ordering::Relaxed);
                let schema = |node: &str| {
                    (node == &*item.node)
                        .then(|| {
                            schema_frame(
                                &item.schema,
                                item.seq,
                                item.first_ns,
                                &keys.sealing_key(&item.node),
                            )
                        })
                        .flatten()
                };
                let frame = AcceptedFrame {
                    node: &item.node,
                    received_ns: item.received_ns,
                    first_ns: item.first_ns,
                    last_ns: item.last_ns,
                    bytes: &item.bytes,
                };
                let result = archive.append(&frame, &schema);
                match &result {
                    Ok(()) => {
                        stats.appended.fetch_add(1, Ordering::Relaxed);
                        pending.push_back((archive.next_seq(), item.delivered()));
                    }
                    Err(_) => {
                        stats.append_errors.fetch_add(1, Ordering::Relaxed);
                        (delivery.not_stored)(&item.delivered());
                    }
                }
                note(stats, "append", result);
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                let result = archive.tick();
                note(stats, "write-out", result);
                return;
            }
        }
        if last_tick.elapsed() >= TICK_EVERY {
            last_tick = Instant::now();
            let result = archive.tick();
            if result.is_err() {
                stats.tick_errors.fetch_add(1, Ordering::Relaxed);
            }
            note(stats, "write-out", result);
            acknowledge(archive, &mut pending, inputs, delivery);
        }
    }
}

/// Acknowledges what became durable since the last tick, and copies of durable frames.
fn acknowledge(
    archive: &dyn FrameArchive,
    pending: &mut VecDeque<(u64, Delivered)>,
    inputs: &Inputs,
    delivery: &mut Delivery,
) {
    let durable = archive.durable_seq();
    while pending.front().is_some_and(|(end, _)| *end <= durable) {
        let (_, frame) = pending.pop_front().expect("checked");
        delivery.acker.durable(&frame);
    }
    while let Ok(copy) = inputs.copies.try_recv() {
        delivery.acker.duplicate(&copy);
    }
    delivery.acker.send_due();
}

/// Logs when the archive starts failing and when it works again (not every failure).
fn note(stats: &WriterStats, what: &str, result: Result<(), ArchiveError>) {
    match result {
        Ok(()) => {
            if stats.failing.swap(false, Ordering::Relaxed) {
                tracing::info!("archive works again: frames are archived");
            }
        }
        Err(e) => {
            let text = e.to_string();
            if !stats.failing.swap(true, Ordering::Relaxed) {
                tracing::error!(
                    "archive {what} failed: {text}; frames are not archived until it works again (the live view goes on)"
                );
            }
            *lock(&stats.last_error) = Some(text);
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! A test double of the archive: it records what the writer hands it.

    use super::*;

    /// What one append received.
    #[derive(Clone, Debug)]
    pub(crate) struct Appended {
        pub node: String,
        pub received_ns: u64,
        pub first_ns: u64,
        pub last_ns: u64,
        pub bytes: Vec<u8>,
        pub schema: Option<Vec<u8>>,
    }

    #[derive(Clone, Default)]
    pub(crate) struct RecordingArchive {
        pub appended: Arc<Mutex<Vec<Appended>>>,
        pub ticks: Arc<AtomicU64>,
        /// Appends fail while set (a full disk).
        pub full: Arc<AtomicBool>,
        /// Ticks hang while set (a writer stuck in the archive).
        pub hang: Arc<AtomicBool>,
    }

    impl FrameArchive for RecordingArchive {
        fn append(
            &mut self,
            frame: &AcceptedFrame<'_>,
            schema: &dyn Fn(&str) -> Option<Vec<u8>>,
        ) -> Result<(), ArchiveError> {
            if self.full.load(Ordering::Relaxed) {
                return Err("no space left on device (os error 28)".into());
            }
            self.appended.lock().unwrap().push(Appended {
                node: frame.node.to_owned(),
                received_ns: frame.received_ns,
                first_ns: frame.first_ns,
                last_ns: frame.last_ns,
                bytes: frame.bytes.to_vec(),
                schema: schema(frame.node),
            });
            Ok(())
        }

        fn tick(&mut self) -> Result<(), ArchiveError> {
            while self.hang.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(10));
            }
            self.ticks.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }

        fn next_seq(&self) -> u64 {
            self.appended.lock().unwrap().len() as u64
        }

        fn durable_seq(&self) -> u64 {
            self.next_seq()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A queue whose frames nobody takes (a writer far behind).
    fn stalled_queue(capacity_bytes: usize) -> (ArchiveQueue, Receiver<QueuedFrame>) {
        let (tx, frames) = channel();
        let (duplicates, _) = sync_channel(1);
        let queue = ArchiveQueue {
            tx,
            duplicates,
            stats: Arc::default(),
            capacity_bytes,
        };
        (queue, frames)
    }

    fn frame(len: usize) -> QueuedFrame {
        QueuedFrame {
            node: "gpu-node-1".into(),
            received_ns: 1,
            first_ns: 1,
            last_ns: 1,
            seq: 1,
            bytes: vec![0; len],
            schema: Arc::default(),
            session: 1,
            from: "127.0.0.1:1".parse().unwrap(),
            key: Key::from_bytes([7; 32]),
        }
    }

    #[test]
    fn a_full_queue_drops_by_bytes_and_by_frames_and_counts_it() {
        let (queue, frames) = stalled_queue(1000);
        assert_eq!((0..12).filter(|_| queue.push(frame(100))).count(), 10);
        assert_eq!(frames.try_iter().count(), 10);
        let stats = queue.stats();
        assert_eq!(stats.dropped_queue_full.load(Ordering::Relaxed), 2);
        assert_eq!(stats.queued_frames.load(Ordering::Relaxed), 10);

        // Small frames: the bound in frames (1000 / 64 + 1) holds before the bytes'.
        let (queue, _frames) = stalled_queue(1000);
        assert_eq!((0..40).filter(|_| queue.push(frame(1))).count(), 16);
        assert_eq!(queue.stats().queued_bytes.load(Ordering::Relaxed), 16);
    }
}
