//! railscope's capture files: the flight recorder of `railscope capture` (docs/capture-format.md
//! is the byte-level spec) and what reads them.
//!
//! A capture file is a self-describing header followed by records, each one frame of the wire
//! format (`monitor_wire`): the probes' IB port events exactly as the kernel raised them
//! (duplicates kept) and snapshots of each port's link and error counters. Because the
//! records are wire frames, the same decoder and the same analysis serve a capture file, a
//! replay to a collector and a range of the collector's archive.
//!
//! - [`format`](mod@format): the header, the trailer and the record framing;
//! - `writer`: [`CaptureWriter`], appending records with the size cap;
//! - `reader`: [`read_capture`], decoding up to the last complete record and saying where
//!   and why it stopped;
//! - `analysis` ([`analyse`]): per-port timelines from decoded frames, flap episodes and verdicts;
//! - [`report`]: the report as text and JSON;
//! - [`svg`]: the per-port timeline picture.

mod analysis;
mod error;
pub mod format;
mod reader;
pub mod report;
pub mod svg;
mod writer;

pub use analysis::{PortId, PortReport, Rules, Timelines, Verdict, analyse};
pub use error::CaptureError;
pub use format::{CaptureHeader, PortInfo, Trailer};
pub use reader::{ReadCapture, read_capture};
pub use writer::CaptureWriter;
#[cfg(test)]
mod tests;
