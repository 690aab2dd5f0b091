//! The archive as remote-write's [`SampleSource`]: its records in sequence (= append) order
//! from a cursor, each frame decoded and its samples resolved to their series.
//!
//! The cursor is the archive's record sequence number (`Cursor { segment: 0, offset: seq }`,
//! the next record to read; [`Cursor::START`] is record 0, before the oldest). Series ids mean
//! something only within a node's session, and each segment starts a node's records with its
//! schema, so a source that resumes in the middle of a segment first reads that segment from
//! its start, learning the schemas without sending anything. Frames are archived in the order
//! they came, so samples can come before the entry defining their id: they wait for it
//! ([`SessionIds`]) and go out with the record that defines it; those still waiting at a
//! resume were never sent, and the warm-up's read keeps them waiting too.

use monitor_wire::{Keyring, ReceiverState, Series};

use super::source::{Batch, Cursor, SampleSource, SeriesChunk, SourceError};
use monitor_archive::archive::{ArchiveReader, Record, RecordKind, SequentialReader};
use monitor_archive::query::session_ids::{MAX_WAITING, SessionIds};

/// Records asked of the archive per read.
const READ_RECORDS: usize = 64;

/// One endpoint's reader of the archive.
pub struct ArchiveSource {
    archive: ArchiveReader,
    keys: Keyring,
    reader: Option<SequentialReader>,
    /// Records read from the archive, not yet turned into a batch (last first).
    carry: Vec<Record>,
    /// The sequence number after the last record handed over (where `reader` + `carry` are).
    next: u64,
    /// Records retention deleted before `reader` got to them, as already reported.
    skipped_reported: u64,
    /// What each node session's ids stand for, and the samples waiting for their entry.
    ids: SessionIds<Series>,
    /// Samples `ids` could not place, as already reported.
    unplaced_reported: u64,
    undecodable: u64,
}

impl ArchiveSource {
    pub fn new(archive: ArchiveReader, keys: impl Into<Keyring>) -> Self {
        Self {
            archive,
            keys: keys.into(),
            reader: None,
            carry: Vec::new(),
            next: 0,
            skipped_reported: 0,
            ids: SessionIds::new(MAX_WAITING),
            unplaced_reported: 0,
            undecodable: 0,
        }
    }

    /// Positions the reader at `seq`, reading the segment from its start for the schemas.
    fn seek(&mut self, seq: u64) -> Result<(), SourceError> {
        self.ids = SessionIds::new(MAX_WAITING);
        self.unplaced_reported = 0;
        self.carry.clear();
        let start = self.archive.segment_start(seq);
        let mut reader = self.archive.sequential(start);
        'warm: while reader.position() < seq {
            let records = reader.next_batch(READ_RECORDS)?;
            if records.is_empty() {
                break;
            }
            for (i, r) in records.iter().enumerate() {
                if r.seq >= seq {
                    self.carry = records[i..].iter().rev().cloned().collect();
                    break 'warm;
                }
                // Sent before the cursor; what still waits after it never was.
                drop(self.take(r));
            }
        }
        // What retention deleted before `seq` was not this endpoint's loss.
        self.skipped_reported = reader.skipped();
        self.reader = Some(reader);
        self.next = seq;
        Ok(())
    }

    /// Decodes a record (a fresh receiver state each: archived frames are not checked for
    /// replays again), learns its schema entries and returns the samples it places: a
    /// frame's samples of ids defined so far, and those that waited for an entry it has.
    fn take(&mut self, r: &Record) -> Vec<SeriesChunk> {
        let frame = match self.keys.decode(&r.bytes, &mut ReceiverState::default()) {
            Ok(f) => f,
            Err(e) => {
                self.undecodable += 1;
                if self.undecodable.is_power_of_two() {
                    tracing::warn!(
                        "archive record {} of node {:?} not decodable ({e}); {} so far",
                        r.seq,
                        r.node,
                        self.undecodable
                    );
                }
                return Vec::new();
            }
        };
        let mut ids = self.ids.session(&r.node, frame.session);
        let mut chunks = Vec::new();
        for e in frame.schema {
            let waited = ids.define(e.id, e.series.clone());
            chunks.extend(waited.into_iter().map(|data| SeriesChunk {
                node: r.node.clone(),
                series: e.series.clone(),
                data,
            }));
        }
        if r.kind == RecordKind::Frame {
            for s in frame.samples {
                match ids.get(s.id) {
                    Some(series) => chunks.push(SeriesChunk {
                        node: r.node.clone(),
                        series: series.clone(),
                        data: s.data,
                    }),
                    None => ids.wait(s.id, s.data),
                }
            }
        }
        chunks
    }
}

impl SampleSource for ArchiveSource {
    fn read_after(&mut self, after: Cursor, max_samples: usize) -> Result<Batch, SourceError> {
        if self.reader.is_none() || after.offset != self.next {
            self.seek(after.offset)?;
        }
        let mut batch = Batch {
            next: after,
            ..Batch::default()
        };
        let mut samples = 0;
        while samples < max_samples.max(1) {
            if self.carry.is_empty() {
                let reader = self.reader.as_mut().expect("positioned by seek");
                self.carry = reader.next_batch(READ_RECORDS)?;
                let skipped = reader.skipped();
                // Records deleted before they were read: at least one sample each is lost.
                batch.skipped_samples += skipped - self.skipped_reported;
                self.skipped_reported = skipped;
                if self.carry.is_empty() {
                    // Past what retention deleted, if anything.
                    self.next = self.next.max(reader.position());
                    break;
                }
                self.carry.reverse();
            }
            let Some(r) = self.carry.pop() else { break };
            self.next = r.seq + 1;
            let chunks = self.take(&r);
            samples += chunks.iter().map(|c| c.data.len()).sum::<usize>();
            batch.chunks.extend(chunks);
        }
        // Samples no entry placed (no room to wait, or their session forgotten): lost to the
        // endpoint, and said so.
        let unplaced = self.ids.unplaced();
        if unplaced > self.unplaced_reported {
            tracing::warn!(
                "remote-write: {} samples of series ids no schema entry of their node's session \
                 defined ({unplaced} in all)",
                unplaced - self.unplaced_reported
            );
            batch.skipped_samples += unplaced - self.unplaced_reported;
            self.unplaced_reported = unplaced;
        }
        batch.next = Cursor {
            segment: 0,
            offset: self.next,
        };
        Ok(batch)
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, sync::Arc};

    use super::*;
    use monitor_testkit::{NodeFrame, NodeSender};

    use monitor_archive::archive::{AcceptedFrame, Archive, ArchiveConfig};

    const T0: u64 = 1_790_000_000_000_000_000;

    /// Chunks as comparable text, counted: `node series data`.
    fn tally(chunks: &[SeriesChunk], into: &mut BTreeMap<String, usize>) {
        for c in chunks {
            *into
                .entry(format!("{} {} {:?}", c.node, c.series, c.data))
                .or_default() += 1;
        }
    }

    /// Reads to the end from `cursor`, `max` samples at a time: what it read and where it
    /// stopped.
    fn read_all(
        source: &mut ArchiveSource,
        mut cursor: Cursor,
        max: usize,
    ) -> (Vec<Batch>, Cursor) {
        let mut batches = Vec::new();
        loop {
            let batch = source.read_after(cursor, max).unwrap();
            if batch.chunks.is_empty() && batch.next == cursor {
                return (batches, cursor);
            }
            cursor = batch.next;
            batches.push(batch);
        }
    }

    #[test]
    fn every_archived_sample_is_read_once_with_its_series_also_when_resuming_mid_segment() {
        let tmp = tempfile::tempdir().unwrap();
        let key = monitor_wire::Key::from_bytes([7; 32]);
        let config = ArchiveConfig {
            segment_bytes: 256 << 10,
            retention_age: None,
            ..ArchiveConfig::new(tmp.path())
        };
        let mut archive = Archive::open(config).unwrap();
        let mut senders = BTreeMap::new();
        let mut frames: Vec<(String, NodeFrame)> = Vec::new();
        for n in 0..2u64 {
            let name = format!("gpu-node-{n:03}");
            let mut s = NodeSender::new(&name, n + 1, key.clone());
            frames.extend(s.run(T0, 300, 10).into_iter().map(|f| (name.clone(), f)));
            senders.insert(name, s);
        }
        frames.sort_by_key(|(_, f)| f.received_ns);

        // What a receiver of each node's frames decodes, in the form the source gives.
        let mut expected = BTreeMap::new();
        let mut states: BTreeMap<&str, ReceiverState> = BTreeMap::new();
        for (node, f) in &frames {
            let state = states.entry(node).or_default();
            let frame = monitor_wire::decode(&f.bytes, &key, state).unwrap();
            let schema = state.node(node).unwrap();
            let chunks: Vec<SeriesChunk> = frame
                .samples
                .into_iter()
                .map(|s| SeriesChunk {
                    node: Arc::from(node.as_str()),
                    series: schema.series(s.id).unwrap().clone(),
                    data: s.data,
                })
                .collect();
            tally(&chunks, &mut expected);
        }
        let sent: usize = frames.iter().map(|(_, f)| f.samples).sum();

        for (i, (node, f)) in frames.iter().enumerate() {
            let accepted = AcceptedFrame {
                node,
                received_ns: f.received_ns,
                first_ns: f.first_ns,
                last_ns: f.last_ns,
                bytes: &f.bytes,
            };
            archive
                .append(&accepted, &|n: &str| senders[n].schema_frame())
                .unwrap();
            if i % 10 == 9 {
                archive.tick().unwrap();
            }
        }
        archive.tick().unwrap();
        assert!(
            archive.stats().segments > 2,
            "sealed segments and the open one"
        );

        let mut source = ArchiveSource::new(archive.reader(), key.clone());
        let (batches, end) = read_all(&mut source, Cursor::START, 500);
        let mut got = BTreeMap::new();
        for b in &batches {
            assert_eq!(b.skipped_samples, 0);
            tally(&b.chunks, &mut got);
        }
        assert_eq!(
            got.values().sum::<usize>(),
            expected.values().sum::<usize>()
        );
        assert_eq!(got, expected, "every sample once, with its series");
        assert_eq!(batches.iter().map(Batch::sample_count).sum::<usize>(), sent);
        assert_eq!(end.offset, archive.reader().end_seq());

        // A new source (a restarted collector) from a cursor in the middle of a segment reads
        // exactly the rest, its series resolved from that segment's schema records.
        let middle = batches[batches.len() / 2].next;
        let mut resumed = ArchiveSource::new(archive.reader(), key);
        let (rest, _) = read_all(&mut resumed, middle, 500);
        let mut after_middle = BTreeMap::new();
        for b in &batches[batches.len() / 2 + 1..] {
            tally(&b.chunks, &mut after_middle);
        }
        let mut got_rest = BTreeMap::new();
        for b in &rest {
            assert_eq!(b.skipped_samples, 0, "no sample left unresolved");
            tally(&b.chunks, &mut got_rest);
        }
        assert!(!got_rest.is_empty());
        assert_eq!(got_rest, after_middle);
    }

    /// A node's first frame (schema entries only) archived after the three that carry the
    /// first flush's samples: every sample still goes out once, with its series, also from
    /// a cursor taken while some of them waited for that frame.
    #[test]
    fn samples_archived_before_their_schema_go_out_once_also_across_a_resume() {
        let tmp = tempfile::tempdir().unwrap();
        let key = monitor_wire::Key::from_bytes([7; 32]);
        let mut archive = Archive::open(ArchiveConfig {
            retention_age: None,
            ..ArchiveConfig::new(tmp.path())
        })
        .unwrap();
        let node = "gpu-node-000";
        let mut sender = NodeSender::new(node, 1, key.clone());
        let mut frames = sender.run(T0, 60, 10);
        let mut expected = BTreeMap::new();
        let mut state = ReceiverState::default();
        for f in &frames {
            let frame = monitor_wire::decode(&f.bytes, &key, &mut state).unwrap();
            let schema = state.node(node).unwrap();
            let chunks: Vec<SeriesChunk> = frame
                .samples
                .into_iter()
                .map(|s| SeriesChunk {
                    node: Arc::from(node),
                    series: schema.series(s.id).unwrap().clone(),
                    data: s.data,
                })
                .collect();
            tally(&chunks, &mut expected);
        }
        frames[..4].rotate_left(1);
        // No schema known yet for the session (the collector has not seen frame 0).
        monitor_archive::node_archive::append_frames_as_they_came(&mut archive, node, &frames)
            .unwrap();
        archive.tick().unwrap();

        let mut source = ArchiveSource::new(archive.reader(), key.clone());
        let (batches, _) = read_all(&mut source, Cursor::START, 1);
        let mut got = BTreeMap::new();
        for b in &batches {
            assert_eq!(b.skipped_samples, 0);
            tally(&b.chunks, &mut got);
        }
        assert_eq!(got, expected, "every sample once, with its series");

        // A source resumed at any batch's end, those taken while frames 2 and 3 waited for
        // frame 0 (the 4th frame archived) included, sends the rest once.
        let frame_0_at = archive.reader().end_seq() - frames.len() as u64 + 3;
        assert!(
            batches[0].next.offset <= frame_0_at,
            "a cursor lies where samples wait"
        );
        for (i, at) in batches.iter().enumerate() {
            let mut resumed = ArchiveSource::new(archive.reader(), key.clone());
            let (rest, _) = read_all(&mut resumed, at.next, 1);
            let mut before_and_after = BTreeMap::new();
            for b in batches[..=i].iter().chain(&rest) {
                assert_eq!(b.skipped_samples, 0);
                tally(&b.chunks, &mut before_and_after);
            }
            assert_eq!(before_and_after, expected, "resumed at {:?}", at.next);
        }
    }
}
