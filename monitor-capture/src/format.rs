//! The capture file's layout (docs/capture-format.md):
//!
//! ```text
//! "RSCF" | version u8 = 1 | 3 zero bytes | header length u32le | crc32 u32le | header (JSON)
//! record*: length u32le | crc32 u32le | payload
//! ```
//!
//! A payload is a wire frame (starts with `RSWF`, sealed with the header's key) or the
//! trailer (starts with `RSCE`, then JSON), written once when a capture ends cleanly.

use serde::{Deserialize, Serialize};

/// The file's first four bytes.
pub const FILE_MAGIC: [u8; 4] = *b"RSCF";
/// The format version this code writes and reads.
pub const FILE_VERSION: u8 = 1;
/// Bytes before the header's JSON: magic, version, 3 reserved, length, crc32.
pub const PREAMBLE_LEN: usize = 16;
/// Bytes before a record's payload: length, crc32.
pub const RECORD_HEADER_LEN: usize = 8;
/// The largest payload a record may hold (a UDP datagram's largest payload, so any record can
/// be replayed as one frame).
pub const MAX_RECORD_LEN: usize = 65_507;
/// The largest header accepted (a header describes at most a few thousand ports).
pub const MAX_HEADER_LEN: usize = 16 << 20;
/// The trailer payload's first four bytes.
pub const TRAILER_MAGIC: [u8; 4] = *b"RSCE";

/// What a capture describes about itself, written before any record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CaptureHeader {
    /// The railscope version that wrote it.
    pub railscope_version: String,
    /// The node's host name; also the node name of every frame.
    pub host: String,
    /// The kernel release (`uname -r`).
    pub kernel: String,
    /// When the capture started, Unix time in ns.
    pub started_unix_ns: u64,
    /// Interval between snapshots of the ports, ns.
    pub interval_ns: u64,
    /// How much of the time before a trigger is kept at the full interval, ns.
    pub pre_trigger_ns: u64,
    /// How long after a trigger every snapshot is kept, ns.
    pub post_trigger_ns: u64,
    /// Outside triggered windows, one snapshot in this long is kept, ns.
    pub baseline_ns: u64,
    /// The RDMA devices present at the start.
    pub devices: Vec<String>,
    /// The ports captured.
    pub ports: Vec<PortInfo>,
    /// The counter files read on those ports (sysfs names, `hw_counters/` ones included).
    pub counters: Vec<String>,
    /// The key the frames are sealed with, 64 hex digits. It authenticates nothing (it is
    /// in the file): the frames' MAC works as a second checksum and lets the wire decoder
    /// read them unchanged; `replay` seals them again with the collector's key.
    pub frame_key: String,
}

/// One captured port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortInfo {
    pub device: String,
    pub port: u32,
    /// `InfiniBand` or `Ethernet` (RoCE), as sysfs says.
    pub link_layer: String,
}

/// Written last when a capture ends cleanly: why it ended and what it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trailer {
    /// `interrupted` (Ctrl-C, SIGTERM), `duration`, `size cap`, ...
    pub reason: String,
    pub ended_unix_ns: u64,
    pub events: u64,
    pub snapshots_written: u64,
    pub triggers: u64,
}

/// The preamble and header bytes of a file.
pub fn encode_header(header: &CaptureHeader) -> Vec<u8> {
    let json = serde_json::to_vec(header).expect("a header always serialises");
    let mut out = Vec::with_capacity(PREAMBLE_LEN + json.len());
    out.extend_from_slice(&FILE_MAGIC);
    out.push(FILE_VERSION);
    out.extend_from_slice(&[0, 0, 0]);
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&json).to_le_bytes());
    out.extend_from_slice(&json);
    out
}

/// One record: length, checksum, payload.
pub fn encode_record(payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() <= MAX_RECORD_LEN, "record payload too large");
    let mut out = Vec::with_capacity(RECORD_HEADER_LEN + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// The trailer's payload.
pub fn encode_trailer(trailer: &Trailer) -> Vec<u8> {
    let mut out = TRAILER_MAGIC.to_vec();
    out.extend(serde_json::to_vec(trailer).expect("a trailer always serialises"));
    out
}

/// Parses a 64-hex-digit key.
pub fn parse_key_hex(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let mut key = [0u8; 32];
    for (i, pair) in hex.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        key[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(key)
}

/// A key as 64 hex digits.
pub fn key_hex(key: &[u8; 32]) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}
