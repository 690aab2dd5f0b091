//! One archived record (an accepted frame, or a node's schema written at a segment's start)
//! and its two encodings: a write-ahead entry of an open segment (length and CRC-32 first, so
//! a torn tail is found) and a record inside a sealed block (no node name: a block holds one
//! node's records; no CRC: the block's zstd frame carries a checksum).

use std::sync::Arc;

/// What a record holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    /// A frame as the collector accepted it (the datagram, MAC included).
    Frame,
    /// A frame of schema entries only, written before a node's first frame in a segment so
    /// the segment decodes on its own.
    Schema,
}

impl RecordKind {
    fn code(self) -> u8 {
        match self {
            RecordKind::Frame => 0,
            RecordKind::Schema => 1,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(RecordKind::Frame),
            1 => Some(RecordKind::Schema),
            _ => None,
        }
    }
}

/// A record as readers get it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Position in the archive: +1 per record appended, never reused.
    pub seq: u64,
    pub kind: RecordKind,
    pub node: Arc<str>,
    /// When the collector received the frame (Unix ns).
    pub received_ns: u64,
    /// Time range of the frame's samples and events (Unix ns).
    pub first_ns: u64,
    pub last_ns: u64,
    /// The datagram as received, MAC included.
    pub bytes: Vec<u8>,
}

/// Fixed part of a record: seq, received, first, last (u64le each), kind (u8).
const FIXED: usize = 8 * 4 + 1;
/// Write-ahead entry head: payload length and CRC-32 of the payload (u32le each).
pub(crate) const ENTRY_HEAD: usize = 8;
/// Largest entry payload accepted when scanning (a frame is at most 64 KiB; anything larger
/// is a torn or corrupt length).
const MAX_PAYLOAD: usize = FIXED + 1 + 255 + 65_536;

/// A record, borrowed (what [`ArchiveReader::scan`](super::ArchiveReader::scan) hands over).
#[derive(Clone, Copy, Debug)]
pub struct RecordView<'a> {
    pub seq: u64,
    pub kind: RecordKind,
    pub node: &'a str,
    pub received_ns: u64,
    pub first_ns: u64,
    pub last_ns: u64,
    pub bytes: &'a [u8],
}

impl RecordView<'_> {
    fn put_fixed(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&self.received_ns.to_le_bytes());
        out.extend_from_slice(&self.first_ns.to_le_bytes());
        out.extend_from_slice(&self.last_ns.to_le_bytes());
        out.push(self.kind.code());
    }

    /// Appends the write-ahead entry: `u32le len, u32le crc32(payload), payload` where the
    /// payload is the fixed part, `u8` node length, node, frame bytes.
    pub(crate) fn put_entry(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; ENTRY_HEAD]);
        self.put_fixed(out);
        out.push(self.node.len() as u8);
        out.extend_from_slice(self.node.as_bytes());
        out.extend_from_slice(self.bytes);
        let payload = &out[start + ENTRY_HEAD..];
        let len = payload.len() as u32;
        let crc = crc32fast::hash(payload);
        out[start..start + 4].copy_from_slice(&len.to_le_bytes());
        out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    }

    /// Appends the record as it sits in a sealed block: the fixed part, `u32le` length, bytes.
    pub(crate) fn put_block_record(&self, out: &mut Vec<u8>) {
        self.put_fixed(out);
        out.extend_from_slice(&(self.bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(self.bytes);
    }

    pub(crate) fn to_record(self, node: Arc<str>) -> Record {
        Record {
            seq: self.seq,
            kind: self.kind,
            node,
            received_ns: self.received_ns,
            first_ns: self.first_ns,
            last_ns: self.last_ns,
            bytes: self.bytes.to_vec(),
        }
    }
}

/// Why an entry could not be read: the tail from here on is cut at recovery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EntryDefect {
    /// Fewer bytes than the head or the payload announce (a write cut short).
    Short,
    /// A length beyond any frame, a CRC mismatch or a field out of range.
    Corrupt,
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn fixed(b: &[u8]) -> Option<(u64, u64, u64, u64, RecordKind)> {
    let kind = RecordKind::from_code(b[32])?;
    Some((
        u64_at(b, 0),
        u64_at(b, 8),
        u64_at(b, 16),
        u64_at(b, 24),
        kind,
    ))
}

/// Reads the write-ahead entry at the start of `buf`; returns it and its total length.
pub(crate) fn read_entry(buf: &[u8]) -> Result<(RecordView<'_>, usize), EntryDefect> {
    if buf.len() < ENTRY_HEAD {
        return Err(EntryDefect::Short);
    }
    let len = u32::from_le_bytes(buf[0..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes"));
    if !(FIXED + 1..=MAX_PAYLOAD).contains(&len) {
        return Err(EntryDefect::Corrupt);
    }
    let Some(payload) = buf.get(ENTRY_HEAD..ENTRY_HEAD + len) else {
        return Err(EntryDefect::Short);
    };
    if crc32fast::hash(payload) != crc {
        return Err(EntryDefect::Corrupt);
    }
    let (seq, received_ns, first_ns, last_ns, kind) = fixed(payload).ok_or(EntryDefect::Corrupt)?;
    let node_len = usize::from(payload[FIXED]);
    let node_end = FIXED + 1 + node_len;
    let node = payload
        .get(FIXED + 1..node_end)
        .and_then(|n| std::str::from_utf8(n).ok())
        .ok_or(EntryDefect::Corrupt)?;
    Ok((
        RecordView {
            seq,
            kind,
            node,
            received_ns,
            first_ns,
            last_ns,
            bytes: &payload[node_end..],
        },
        ENTRY_HEAD + len,
    ))
}

/// Reads the block records of `buf` (a decompressed block), all of node `node`.
pub(crate) fn read_block_records<'a>(
    buf: &'a [u8],
    node: &'a str,
) -> impl Iterator<Item = Option<RecordView<'a>>> + 'a {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at == buf.len() {
            return None;
        }
        let parsed = (|| {
            let head = buf.get(at..at + FIXED + 4)?;
            let (seq, received_ns, first_ns, last_ns, kind) = fixed(head)?;
            let len = u32::from_le_bytes(head[FIXED..].try_into().ok()?) as usize;
            let bytes = buf.get(at + FIXED + 4..at + FIXED + 4 + len)?;
            at += FIXED + 4 + len;
            Some(RecordView {
                seq,
                kind,
                node,
                received_ns,
                first_ns,
                last_ns,
                bytes,
            })
        })();
        if parsed.is_none() {
            at = buf.len(); // stop after reporting the defect once
        }
        Some(parsed)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(bytes: &[u8]) -> RecordView<'_> {
        RecordView {
            seq: 7,
            kind: RecordKind::Frame,
            node: "gpu-node-001",
            received_ns: 10,
            first_ns: 1,
            last_ns: 9,
            bytes,
        }
    }

    #[test]
    fn an_entry_reads_back_and_any_cut_or_flipped_byte_is_a_defect() {
        let frame = b"RSWF frame bytes".to_vec();
        let mut buf = Vec::new();
        rec(&frame).put_entry(&mut buf);
        let (back, len) = read_entry(&buf).unwrap();
        assert_eq!(len, buf.len());
        assert_eq!(
            (back.seq, back.node, back.bytes, back.first_ns, back.last_ns),
            (7, "gpu-node-001", &frame[..], 1, 9)
        );
        for cut in 0..buf.len() {
            assert_eq!(read_entry(&buf[..cut]).unwrap_err(), EntryDefect::Short);
        }
        for i in 0..buf.len() {
            let mut bad = buf.clone();
            bad[i] ^= 0x40;
            assert!(read_entry(&bad).is_err(), "flipped byte {i} went unnoticed");
        }
    }

    #[test]
    fn block_records_read_back_in_order() {
        let (a, b) = (b"first".to_vec(), b"second frame".to_vec());
        let mut buf = Vec::new();
        rec(&a).put_block_record(&mut buf);
        let mut second = rec(&b);
        second.seq = 8;
        second.kind = RecordKind::Schema;
        second.put_block_record(&mut buf);
        let back: Vec<_> = read_block_records(&buf, "n").map(Option::unwrap).collect();
        assert_eq!(back.len(), 2);
        assert_eq!((back[0].seq, back[0].bytes), (7, &a[..]));
        assert_eq!(
            (back[1].seq, back[1].kind, back[1].bytes),
            (8, RecordKind::Schema, &b[..])
        );
        let cut: Vec<_> = read_block_records(&buf[..buf.len() - 1], "n").collect();
        assert_eq!(cut.len(), 2);
        assert!(cut[1].is_none());
    }
}
