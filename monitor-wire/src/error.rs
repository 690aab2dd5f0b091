//! What can go wrong encoding or decoding a frame or a schema request.

use crate::{
    limits::{MAX_FRAME_SAMPLES, MIN_FRAME_LEN, VERSION},
    series::Kind,
};

/// Errors of encoding or decoding a frame. Decoding errors name the byte offset in the frame.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum WireError {
    #[error("frame of {len} bytes is shorter than the smallest frame ({MIN_FRAME_LEN} bytes)")]
    TooShort { len: usize },
    #[error("frame of {len} bytes: MAC mismatch (wrong key, or corrupted in transit)")]
    BadMac { len: usize },
    #[error("frame does not start with the railscope magic \"RSWF\"")]
    BadMagic,
    #[error("frame has format version {0}, this build reads version {VERSION}")]
    UnsupportedVersion(u8),
    #[error("frame truncated in {what} at byte {offset}")]
    Truncated { what: &'static str, offset: usize },
    #[error("frame malformed: invalid {what} at byte {offset}")]
    Malformed { what: &'static str, offset: usize },
    #[error("frame from node {node:?} seq {seq} was already received (duplicate or replay)")]
    Duplicate { node: String, seq: u64 },
    #[error("frame from node {node:?} seq {seq} session {session:08x} is too old to be placed")]
    Stale {
        node: String,
        seq: u64,
        session: u32,
    },
    #[error("node name {node:?} is {len} bytes, the frame format allows 255")]
    NodeName { node: String, len: usize },
    #[error("time quantum must be at least 1 ns")]
    Quantum,
    #[error("MTU of {mtu} bytes is outside 256..=65507")]
    Mtu { mtu: usize },
    #[error("series {series}'s schema entry is {len} bytes, too large for a {mtu}-byte frame")]
    SeriesTooLarge {
        series: String,
        len: usize,
        mtu: usize,
    },
    #[error("series {series}: gauge interval starts at {start} ns, after its end at {end} ns")]
    Interval {
        series: String,
        start: u64,
        end: u64,
    },
    #[error("series {series} is a {kind:?} but was given a {given} sample")]
    KindMismatch {
        series: String,
        kind: Kind,
        given: &'static str,
    },
    #[error("counter {series} was given {value}, not a non-negative integer")]
    CounterValue { series: String, value: f64 },
    #[error("frame would carry {count} {what}, more than {MAX_FRAME_SAMPLES}")]
    TooMany { what: &'static str, count: usize },
    #[error(
        "frame of {len} bytes would take more than {limit} bytes of memory to decode (at its {what}): refused as hostile"
    )]
    OverBudget {
        len: usize,
        limit: usize,
        what: &'static str,
    },
}
