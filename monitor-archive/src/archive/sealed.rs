//! Sealed segments: an open segment's records regrouped per node into zstd blocks, with a
//! per-node index of the blocks (time and sequence ranges) and a trailer that summarises the
//! segment, so opening the archive reads 64 bytes per segment and a query reads only the
//! blocks of the nodes it asks for (docs/archive-format.md).

use std::{
    fs::File,
    io::Write as _,
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
    sync::Arc,
};

use super::{
    ArchiveError,
    record::{RecordView, read_block_records},
};

pub(crate) const SEALED_MAGIC: [u8; 4] = *b"RSAS";
const TRAILER_MAGIC: [u8; 4] = *b"RSAX";
/// The version sealed segments are written in: 3, blocks re-coded per series with
/// bit-packed integer columns ([`super::recode`]). Versions 1 and 2 still read.
const SEALED_VERSION: u8 = 3;
/// Version 2: blocks re-coded per series, integer columns as varints only. Also the version
/// open segments' headers carry (their layout has not changed since).
pub(crate) const FORMAT_VERSION: u8 = 2;
/// The first version, whose blocks hold the records as they were received.
const FORMAT_VERSION_RECORDS: u8 = 1;
pub(crate) const HEADER_LEN: usize = 16;
const TRAILER_LEN: usize = 64;
/// Per block in the index: offset, compressed and raw length, records, seq range, time range.
const BLOCK_INDEX_LEN: usize = 8 + 4 + 4 + 4 + 8 * 4;

/// What the trailer says of a sealed segment: all the archive keeps in memory of it.
#[derive(Clone, Debug)]
pub struct SealedSegment {
    pub id: u64,
    pub path: PathBuf,
    /// Size of the file.
    pub bytes: u64,
    pub records: u32,
    pub first_seq: u64,
    pub last_seq: u64,
    /// Time range of the records' samples and events.
    pub min_ns: u64,
    pub max_ns: u64,
    /// When the newest record was received: what retention by age looks at.
    pub max_received_ns: u64,
    /// Format version (1: blocks of records as received; 2: re-coded blocks).
    pub version: u8,
    index_offset: u64,
    index_len: u32,
    index_crc: u32,
}

/// One zstd block of one node's records.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockRef {
    offset: u64,
    compressed_len: u32,
    raw_len: u32,
    pub records: u32,
    pub first_seq: u64,
    pub last_seq: u64,
    pub min_ns: u64,
    pub max_ns: u64,
}

/// A node's blocks in a sealed segment, in record order.
#[derive(Clone, Debug)]
pub(crate) struct NodeBlocks {
    pub node: Arc<str>,
    pub blocks: Vec<BlockRef>,
}

impl NodeBlocks {
    pub(crate) fn min_ns(&self) -> u64 {
        self.blocks
            .iter()
            .map(|b| b.min_ns)
            .min()
            .unwrap_or(u64::MAX)
    }

    pub(crate) fn max_ns(&self) -> u64 {
        self.blocks.iter().map(|b| b.max_ns).max().unwrap_or(0)
    }
}

pub(crate) fn sealed_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:020}.seg"))
}

fn corrupt(path: &Path, what: impl Into<String>) -> ArchiveError {
    ArchiveError::Corrupt {
        path: path.to_owned(),
        what: what.into(),
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ArchiveError + '_ {
    move |source| ArchiveError::io(path, source)
}

/// How blocks are made.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockSettings {
    pub block_bytes: usize,
    pub level: i32,
    /// Re-code blocks per series (format 2); without, format 1 (tests of old archives).
    pub recode: bool,
}

/// Writes a sealed segment of `nodes` (each node's records in order) to `<id>.seg.tmp`,
/// fsyncs it and renames it to `<id>.seg`. The caller fsyncs the directory.
/// `beat` is called after each block and each MiB written (the sealer's heartbeat).
pub(crate) fn write(
    dir: &Path,
    id: u64,
    nodes: &[(&str, Vec<RecordView<'_>>)],
    settings: BlockSettings,
    beat: &dyn Fn(),
) -> Result<SealedSegment, ArchiveError> {
    let path = sealed_path(dir, id);
    let tmp = path.with_extension("seg.tmp");
    let result = write_tmp(&tmp, id, nodes, settings, beat).and_then(|mut seg| {
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
        seg.path = path.clone();
        Ok(seg)
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn write_tmp(
    tmp: &Path,
    id: u64,
    nodes: &[(&str, Vec<RecordView<'_>>)],
    settings: BlockSettings,
    beat: &dyn Fn(),
) -> Result<SealedSegment, ArchiveError> {
    let mut compressor = zstd::bulk::Compressor::new(settings.level).map_err(io(tmp))?;
    compressor
        .include_checksum(true)
        .and_then(|_| compressor.include_contentsize(true))
        .map_err(io(tmp))?;
    let mut out = Vec::with_capacity(1 << 20);
    out.extend_from_slice(&SEALED_MAGIC);
    let version = if settings.recode {
        SEALED_VERSION
    } else {
        FORMAT_VERSION_RECORDS
    };
    out.extend_from_slice(&[version, 0, 0, 0]);
    out.extend_from_slice(&id.to_le_bytes());
    let mut index = Vec::new();
    index.extend_from_slice(&(nodes.len() as u32).to_le_bytes());
    let mut seg = SealedSegment {
        id,
        path: tmp.to_owned(),
        bytes: 0,
        records: 0,
        first_seq: u64::MAX,
        last_seq: 0,
        min_ns: u64::MAX,
        max_ns: 0,
        max_received_ns: 0,
        version,
        index_offset: 0,
        index_len: 0,
        index_crc: 0,
    };
    for (node, records) in nodes {
        index.push(node.len() as u8);
        index.extend_from_slice(node.as_bytes());
        let blocks_at = index.len();
        index.extend_from_slice(&0u32.to_le_bytes());
        let mut blocks = 0u32;
        let mut rest = &records[..];
        while !rest.is_empty() {
            let mut block = BlockRef {
                offset: out.len() as u64,
                compressed_len: 0,
                raw_len: 0,
                records: 0,
                first_seq: u64::MAX,
                last_seq: 0,
                min_ns: u64::MAX,
                max_ns: 0,
            };
            let (mut taken, mut raw_len) = (0, 0);
            // What is left of the node: a rest under half a block joins this block (so a
            // block holds at most 1.5 `block_bytes`): a short block restarts every series'
            // column for few samples.
            let mut left: usize = rest.iter().map(|r| r.bytes.len() + 37).sum();
            for r in rest {
                if taken > 0
                    && raw_len + r.bytes.len() > settings.block_bytes
                    && left > settings.block_bytes / 2
                {
                    break;
                }
                raw_len += r.bytes.len() + 37;
                left -= r.bytes.len() + 37;
                taken += 1;
                block.first_seq = block.first_seq.min(r.seq);
                block.last_seq = block.last_seq.max(r.seq);
                block.min_ns = block.min_ns.min(r.first_ns);
                block.max_ns = block.max_ns.max(r.last_ns);
                seg.max_received_ns = seg.max_received_ns.max(r.received_ns);
            }
            let raw = if settings.recode {
                super::recode::encode_block(&rest[..taken])
            } else {
                let mut raw = Vec::with_capacity(raw_len);
                rest[..taken]
                    .iter()
                    .for_each(|r| r.put_block_record(&mut raw));
                raw
            };
            rest = &rest[taken..];
            let compressed = compressor.compress(&raw).map_err(io(tmp))?;
            out.extend_from_slice(&compressed);
            block.compressed_len = compressed.len() as u32;
            block.raw_len = raw.len() as u32;
            block.records = taken as u32;
            put_block_index(&mut index, &block);
            seg.records += block.records;
            seg.first_seq = seg.first_seq.min(block.first_seq);
            seg.last_seq = seg.last_seq.max(block.last_seq);
            seg.min_ns = seg.min_ns.min(block.min_ns);
            seg.max_ns = seg.max_ns.max(block.max_ns);
            blocks += 1;
            beat();
        }
        index[blocks_at..blocks_at + 4].copy_from_slice(&blocks.to_le_bytes());
    }
    seg.index_offset = out.len() as u64;
    seg.index_len = index.len() as u32;
    seg.index_crc = crc32fast::hash(&index);
    out.extend_from_slice(&index);
    put_trailer(&mut out, &seg);
    seg.bytes = out.len() as u64;
    let mut file = File::create(tmp).map_err(io(tmp))?;
    for chunk in out.chunks(1 << 20) {
        file.write_all(chunk).map_err(io(tmp))?;
        beat();
    }
    file.sync_all().map_err(io(tmp))?;
    Ok(seg)
}

fn put_block_index(out: &mut Vec<u8>, b: &BlockRef) {
    out.extend_from_slice(&b.offset.to_le_bytes());
    out.extend_from_slice(&b.compressed_len.to_le_bytes());
    out.extend_from_slice(&b.raw_len.to_le_bytes());
    out.extend_from_slice(&b.records.to_le_bytes());
    for v in [b.first_seq, b.last_seq, b.min_ns, b.max_ns] {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

fn put_trailer(out: &mut Vec<u8>, s: &SealedSegment) {
    out.extend_from_slice(&s.index_offset.to_le_bytes());
    out.extend_from_slice(&s.index_len.to_le_bytes());
    out.extend_from_slice(&s.index_crc.to_le_bytes());
    for v in [
        s.first_seq,
        s.last_seq,
        s.min_ns,
        s.max_ns,
        s.max_received_ns,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&s.records.to_le_bytes());
    out.extend_from_slice(&TRAILER_MAGIC);
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl SealedSegment {
    /// Reads a sealed segment's header and trailer.
    pub(crate) fn open(path: &Path) -> Result<Self, ArchiveError> {
        let file = File::open(path).map_err(io(path))?;
        let bytes = file.metadata().map_err(io(path))?.len();
        if bytes < (HEADER_LEN + TRAILER_LEN) as u64 {
            return Err(corrupt(
                path,
                format!("{bytes} bytes, shorter than a segment"),
            ));
        }
        let mut header = [0u8; HEADER_LEN];
        file.read_exact_at(&mut header, 0).map_err(io(path))?;
        if header[0..4] != SEALED_MAGIC {
            return Err(corrupt(path, "no sealed-segment magic"));
        }
        if ![FORMAT_VERSION_RECORDS, FORMAT_VERSION, SEALED_VERSION].contains(&header[4]) {
            return Err(ArchiveError::Version {
                path: path.to_owned(),
                version: header[4],
            });
        }
        let mut t = [0u8; TRAILER_LEN];
        file.read_exact_at(&mut t, bytes - TRAILER_LEN as u64)
            .map_err(io(path))?;
        if t[60..64] != TRAILER_MAGIC {
            return Err(corrupt(path, "no trailer (the file was cut)"));
        }
        let seg = SealedSegment {
            id: u64_at(&header, 8),
            path: path.to_owned(),
            bytes,
            index_offset: u64_at(&t, 0),
            index_len: u32_at(&t, 8),
            index_crc: u32_at(&t, 12),
            first_seq: u64_at(&t, 16),
            last_seq: u64_at(&t, 24),
            min_ns: u64_at(&t, 32),
            max_ns: u64_at(&t, 40),
            max_received_ns: u64_at(&t, 48),
            records: u32_at(&t, 56),
            version: header[4],
        };
        if seg.index_offset + u64::from(seg.index_len) + TRAILER_LEN as u64 != bytes {
            return Err(corrupt(path, "index position"));
        }
        Ok(seg)
    }

    /// Reads the per-node index (checked against its CRC).
    pub(crate) fn index(&self, file: &File) -> Result<Vec<NodeBlocks>, ArchiveError> {
        self.index_of(file, &|_| true)
    }

    /// The index entries of the nodes `wants` accepts; the others' are checked and passed
    /// over (a question about one node of a large fleet makes one entry, not one a node).
    pub(crate) fn index_of(
        &self,
        file: &File,
        wants: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<NodeBlocks>, ArchiveError> {
        let path = &self.path;
        let mut b = vec![0u8; self.index_len as usize];
        file.read_exact_at(&mut b, self.index_offset)
            .map_err(io(path))?;
        if crc32fast::hash(&b) != self.index_crc {
            return Err(corrupt(path, "index checksum"));
        }
        let bad = || corrupt(path, "index entries");
        let mut at = 0;
        let take = |at: &mut usize, n: usize| -> Result<&[u8], ArchiveError> {
            let s = b.get(*at..*at + n).ok_or_else(bad)?;
            *at += n;
            Ok(s)
        };
        let count = u32_at(take(&mut at, 4)?, 0);
        let mut nodes = Vec::with_capacity(count.min(1 << 16) as usize);
        for _ in 0..count {
            let len = usize::from(take(&mut at, 1)?[0]);
            let node = std::str::from_utf8(take(&mut at, len)?).map_err(|_| bad())?;
            let blocks = u32_at(take(&mut at, 4)?, 0);
            if !wants(node) {
                let len = (blocks as usize)
                    .checked_mul(BLOCK_INDEX_LEN)
                    .ok_or_else(bad)?;
                take(&mut at, len)?;
                continue;
            }
            let mut list = Vec::with_capacity(blocks.min(1 << 16) as usize);
            for _ in 0..blocks {
                let e = take(&mut at, BLOCK_INDEX_LEN)?;
                list.push(BlockRef {
                    offset: u64_at(e, 0),
                    compressed_len: u32_at(e, 8),
                    raw_len: u32_at(e, 12),
                    records: u32_at(e, 16),
                    first_seq: u64_at(e, 20),
                    last_seq: u64_at(e, 28),
                    min_ns: u64_at(e, 36),
                    max_ns: u64_at(e, 44),
                });
            }
            nodes.push(NodeBlocks {
                node: Arc::from(node),
                blocks: list,
            });
        }
        Ok(nodes)
    }

    /// Reads and decompresses one block, checking it holds the records the index says.
    pub(crate) fn read_block(
        &self,
        file: &File,
        block: &BlockRef,
    ) -> Result<Vec<u8>, ArchiveError> {
        let path = &self.path;
        let mut compressed = vec![0u8; block.compressed_len as usize];
        file.read_exact_at(&mut compressed, block.offset)
            .map_err(io(path))?;
        let mut raw = zstd::bulk::decompress(&compressed, block.raw_len as usize)
            .map_err(|e| corrupt(path, format!("block at byte {}: {e}", block.offset)))?;
        if raw.len() != block.raw_len as usize {
            return Err(corrupt(path, format!("block at byte {}", block.offset)));
        }
        if self.version != FORMAT_VERSION_RECORDS {
            let packed = self.version >= SEALED_VERSION;
            raw = super::recode::decode_block(&raw, packed).ok_or_else(|| {
                corrupt(
                    path,
                    format!("re-coded block at byte {} does not rebuild", block.offset),
                )
            })?;
        }
        let records = read_block_records(&raw, "");
        let mut n = 0u32;
        for r in records {
            if r.is_none() {
                return Err(corrupt(
                    path,
                    format!("records of block at {}", block.offset),
                ));
            }
            n += 1;
        }
        if n != block.records {
            return Err(corrupt(path, format!("block at byte {}", block.offset)));
        }
        Ok(raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use monitor_testkit::NodeSender;

    /// A frame and its received, first and last times.
    type Timed = (Vec<u8>, u64, u64, u64);

    /// Three nodes' frames over 5 minutes, per node, as a seal groups them.
    fn nodes() -> Vec<(String, Vec<Timed>)> {
        (0..3)
            .map(|n| {
                let name = format!("gpu-node-{n}");
                let mut s = NodeSender::new(&name, n + 1, monitor_wire::Key::from_bytes([7; 32]));
                let frames = s
                    .run(1_790_000_000_000_000_000, 300, 10)
                    .into_iter()
                    .map(|f| (f.bytes, f.received_ns, f.first_ns, f.last_ns))
                    .collect();
                (name, frames)
            })
            .collect()
    }

    fn views<'a>(nodes: &'a [(String, Vec<Timed>)]) -> Vec<(&'a str, Vec<RecordView<'a>>)> {
        let mut seq = 0;
        nodes
            .iter()
            .map(|(name, frames)| {
                let records = frames
                    .iter()
                    .map(|(bytes, received_ns, first_ns, last_ns)| {
                        seq += 1;
                        RecordView {
                            seq,
                            kind: super::super::RecordKind::Frame,
                            node: name,
                            received_ns: *received_ns,
                            first_ns: *first_ns,
                            last_ns: *last_ns,
                            bytes,
                        }
                    })
                    .collect();
                (name.as_str(), records)
            })
            .collect()
    }

    /// Every block of every node, as the readers get it (format 1 layout).
    fn read_all(seg: &SealedSegment) -> Result<Vec<(String, Vec<u8>)>, ArchiveError> {
        let file = File::open(&seg.path).unwrap();
        let mut out = Vec::new();
        for nb in seg.index(&file)? {
            for b in &nb.blocks {
                out.push((nb.node.to_string(), seg.read_block(&file, b)?));
            }
        }
        Ok(out)
    }

    fn settings(recode: bool) -> BlockSettings {
        BlockSettings {
            block_bytes: 256 << 10,
            level: 3,
            recode,
        }
    }

    #[test]
    fn a_format_1_segment_reads_as_it_did_and_format_2_gives_the_same_records_in_less_space() {
        let dir = tempfile::tempdir().unwrap();
        let nodes = nodes();
        let views = views(&nodes);
        let v1 = write(dir.path(), 1, &views, settings(false), &|| {}).unwrap();
        // The sealer's heartbeat is beaten at least once per block, so a long seal is not
        // taken for a hang.
        let beats = std::cell::Cell::new(0usize);
        let v2 = write(dir.path(), 2, &views, settings(true), &|| {
            beats.set(beats.get() + 1)
        })
        .unwrap();
        let (v1, v2) = (
            SealedSegment::open(&v1.path).unwrap(),
            SealedSegment::open(&v2.path).unwrap(),
        );
        assert_eq!((v1.version, v2.version), (1, 3));
        let (a, b) = (read_all(&v1).unwrap(), read_all(&v2).unwrap());
        assert!(
            b.len() > 1 && beats.get() >= b.len(),
            "{} beats",
            beats.get()
        );
        assert!(a == b, "format 1 and 2 read back differently");
        let mut a_nodes: Vec<(String, Vec<u8>)> = Vec::new();
        for (node, raw) in a {
            match a_nodes.last_mut() {
                Some((n, all)) if *n == node => all.extend_from_slice(&raw),
                _ => a_nodes.push((node, raw)),
            }
        }
        let mut expected = Vec::new();
        for (node, records) in &views {
            let mut raw = Vec::new();
            records.iter().for_each(|r| r.put_block_record(&mut raw));
            expected.push((node.to_string(), raw));
        }
        assert!(
            a_nodes == expected,
            "the records read back are not those sealed"
        );
        assert!(
            v2.bytes * 100 < v1.bytes * 92,
            "format 2 takes {} bytes, format 1 {}",
            v2.bytes,
            v1.bytes
        );
    }

    /// A version 2 segment as the writer made it before columns were bit-packed
    /// (`archive_size --nodes 2 --seconds 10`, 2026-11-24): it still reads, its frames
    /// authenticate and hold every sample sent, and sealed again in the current version it
    /// reads back the same records.
    #[test]
    fn a_format_2_segment_written_before_packed_columns_still_reads() {
        let dir = tempfile::tempdir().unwrap();
        let path = sealed_path(dir.path(), 1);
        std::fs::write(&path, include_bytes!("testdata/format-2-two-nodes-10s.seg")).unwrap();
        let old = SealedSegment::open(&path).unwrap();
        assert_eq!(old.version, FORMAT_VERSION);
        let blocks = read_all(&old).unwrap();
        let key = monitor_wire::Key::from_bytes([7; 32]);
        let mut samples = 0;
        let mut views: Vec<(&str, Vec<RecordView<'_>>)> = Vec::new();
        for (node, raw) in &blocks {
            let mut receiver = monitor_wire::ReceiverState::default();
            let mut records = Vec::new();
            for r in read_block_records(raw, node) {
                let r = r.expect("a whole record");
                // A schema record is the receiver's schema as a frame of its own, seq 0.
                let mut fresh = monitor_wire::ReceiverState::default();
                let state = match r.kind {
                    super::super::RecordKind::Schema => &mut fresh,
                    super::super::RecordKind::Frame => &mut receiver,
                };
                let frame = monitor_wire::decode(r.bytes, &key, state)
                    .expect("the frame authenticates and decodes");
                samples += frame.sample_count();
                records.push(r);
            }
            views.push((node, records));
        }
        // Two nodes of 640 series (archive_size's fixture node of then), read every second
        // for 10 s.
        assert_eq!(samples, 2 * 640 * 10);
        let again = write(dir.path(), 2, &views, settings(true), &|| {}).unwrap();
        let again = SealedSegment::open(&again.path).unwrap();
        assert_eq!(again.version, SEALED_VERSION);
        assert!(
            read_all(&again).unwrap() == blocks,
            "re-sealed records differ"
        );
    }

    #[test]
    fn a_damaged_or_cut_sealed_segment_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let nodes = nodes();
        let seg = write(dir.path(), 7, &views(&nodes), settings(true), &|| {}).unwrap();
        let good = std::fs::read(&seg.path).unwrap();
        let name = seg.path.display().to_string();
        // A byte changed in the middle of the first block: zstd's checksum or the rebuild
        // refuses it, with the file and the block's offset.
        let mut bad = good.clone();
        bad[HEADER_LEN + 200] ^= 0x10;
        std::fs::write(&seg.path, &bad).unwrap();
        let e = read_all(&SealedSegment::open(&seg.path).unwrap()).unwrap_err();
        assert!(e.to_string().contains(&name), "{e}");
        assert!(e.to_string().contains("block at byte 16"), "{e}");
        // Cut short (a torn copy): opening it says so, naming the file.
        std::fs::write(&seg.path, &good[..good.len() - 10]).unwrap();
        let e = SealedSegment::open(&seg.path).unwrap_err();
        assert!(e.to_string().contains(&name), "{e}");
        assert!(e.to_string().contains("no trailer"), "{e}");
    }
}
