//! What remote-write reads: the archive's samples in archive order, from a cursor on. The
//! archive implements [`SampleSource`]; remote-write only stores cursors and hands them back.

use std::{fmt, sync::Arc};

use monitor_wire::{Series, SeriesData};

/// A position in the archive: "everything up to here". The archive decides what the two
/// numbers mean (e.g. segment number and byte offset after a frame); remote-write compares
/// nothing but equality, persists the pair per endpoint and passes it back to
/// [`SampleSource::read_after`]. [`Cursor::START`] is before the oldest frame kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Cursor {
    pub segment: u64,
    pub offset: u64,
}

impl Cursor {
    pub const START: Cursor = Cursor {
        segment: 0,
        offset: 0,
    };
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.segment, self.offset)
    }
}

/// The samples of one series from one frame, with the series resolved (the archive keeps
/// what a frame's ids meant in its node's session).
#[derive(Clone, Debug, PartialEq)]
pub struct SeriesChunk {
    /// The sending node's name (the frame header's).
    pub node: Arc<str>,
    pub series: Series,
    /// In the order the agent sent them (ascending time within a series).
    pub data: SeriesData,
}

/// What one read returns: the samples of whole frames, in archive order, and the cursor just
/// after the last frame read. An empty batch with `next` equal to the cursor asked for
/// means nothing new yet.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    pub chunks: Vec<SeriesChunk>,
    pub next: Cursor,
    /// Samples between the cursor asked for and `next` that can no longer be read (removed
    /// by retention while the backend was behind, or unreadable): counted as lost, never
    /// retried.
    pub skipped_samples: u64,
}

impl Batch {
    pub fn sample_count(&self) -> usize {
        self.chunks.iter().map(|c| c.data.len()).sum()
    }
}

/// An error of the source, logged with its text; the read is tried again after a backoff.
pub type SourceError = Box<dyn std::error::Error + Send + Sync>;

/// The archive's sequential reader, as remote-write sees it. One instance per endpoint
/// (each endpoint reads at its own pace).
pub trait SampleSource: Send {
    /// Frames after `after`, whole, until about `max_samples` samples (a frame is never
    /// split: the batch may exceed it by one frame's samples). Must not block for long when
    /// there is nothing new: return an empty batch, the caller polls again.
    fn read_after(&mut self, after: Cursor, max_samples: usize) -> Result<Batch, SourceError>;
}
