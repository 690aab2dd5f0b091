//! The archive as remote-write's [`SampleSource`]: its records in sequence (= append) order
//! from a cursor, each frame decoded and its samples resolved to their series.
//!
//! The cursor is the archive's record sequence number (`Cursor { segment: 0, offset: seq }`,
//! the next record to read; [`Cursor::START`] is record 0, before the oldest). Series ids mean
//! something only within a node's session, and each segment starts a node's records with its
//! schema, so a source that resumes in the middle of a segment first reads that segment from
//! its start, learning the schemas without sending anything.

use std::{collections::HashMap, sync::Arc};

use railscope_wire::{Key, ReceiverState, Series, decode};

use super::source::{Batch, Cursor, SampleSource, SeriesChunk, SourceError};
use crate::archive::{ArchiveReader, Record, RecordKind, SequentialReader};

/// Records asked of the archive per read.
const READ_RECORDS: usize = 64;

/// One endpoint's reader of the archive.
pub struct ArchiveSource {
    archive: ArchiveReader,
    key: Key,
    reader: Option<SequentialReader>,
    /// Records read from the archive, not yet turned into a batch (last first).
    carry: Vec<Record>,
    /// The sequence number after the last record handed over (where `reader` + `carry` are).
    next: u64,
    /// Records retention deleted before `reader` got to them, as already reported.
    skipped_reported: u64,
    /// Per node: its current session and what that session's ids stand for.
    schemas: HashMap<Arc<str>, (u32, HashMap<u32, Series>)>,
    undecodable: u64,
}

impl ArchiveSource {
    pub fn new(archive: ArchiveReader, key: Key) -> Self {
        Self {
            archive,
            key,
            reader: None,
            carry: Vec::new(),
            next: 0,
            skipped_reported: 0,
            schemas: HashMap::new(),
            undecodable: 0,
        }
    }

    /// Positions the reader at `seq`, reading the segment from its start for the schemas.
    fn seek(&mut self, seq: u64) -> Result<(), SourceError> {
        self.schemas.clear();
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
                self.learn(r);
            }
        }
        // What retention deleted before `seq` was not this endpoint's loss.
        self.skipped_reported = reader.skipped();
        self.reader = Some(reader);
        self.next = seq;
        Ok(())
    }

    /// Decodes a record (a fresh receiver state each: archived frames are not checked for
    /// replays again) and learns its schema entries.
    fn learn(&mut self, r: &Record) -> Option<railscope_wire::Frame> {
        let frame = match decode(&r.bytes, &self.key, &mut ReceiverState::default()) {
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
                return None;
            }
        };
        let entry = self
            .schemas
            .entry(r.node.clone())
            .or_insert_with(|| (frame.session, HashMap::new()));
        if entry.0 != frame.session {
            *entry = (frame.session, HashMap::new());
        }
        for e in &frame.schema {
            entry.1.insert(e.id, e.series.clone());
        }
        Some(frame)
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
            let Some(frame) = self.learn(&r) else {
                continue;
            };
            if r.kind != RecordKind::Frame {
                continue;
            }
            let schema = &self.schemas[&r.node].1;
            for s in frame.samples {
                samples += s.data.len();
                match schema.get(&s.id) {
                    Some(series) => batch.chunks.push(SeriesChunk {
                        node: r.node.clone(),
                        series: series.clone(),
                        data: s.data,
                    }),
                    None => batch.skipped_samples += s.data.len() as u64,
                }
            }
        }
        batch.next = Cursor {
            segment: 0,
            offset: self.next,
        };
        Ok(batch)
    }
}
