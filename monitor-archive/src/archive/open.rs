//! The open segment: the write-ahead file that every appended record goes to first, as a
//! CRC-checked entry, with its index in memory (node, position, sequence and time range of
//! each entry). Records are appended to a buffer and written out by `tick` (at least every
//! 100 ms) or once the buffer holds `write_out_bytes`; readers see the buffer too.

use std::{
    borrow::Cow,
    collections::HashMap,
    fs::{File, OpenOptions},
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
    sync::Arc,
};

use super::{
    ArchiveError,
    record::{EntryDefect, RecordView, read_entry},
    sealed::{FORMAT_VERSION, HEADER_LEN},
};

const OPEN_MAGIC: [u8; 4] = *b"RSAW";

/// Where one record of the open segment is.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Entry {
    pub node: u32,
    pub offset: u64,
    pub len: u32,
    pub seq: u64,
    pub first_ns: u64,
    pub last_ns: u64,
    pub received_ns: u64,
}

pub(crate) struct OpenSegment {
    pub id: u64,
    pub path: PathBuf,
    pub file: Arc<File>,
    /// Bytes in the file (header included).
    pub written: u64,
    /// Appended entries not yet written out; they follow `written`.
    pub buf: Vec<u8>,
    /// Entries in append (= sequence) order.
    pub entries: Vec<Entry>,
    pub nodes: Vec<Arc<str>>,
    pub node_ix: HashMap<Arc<str>, u32>,
    /// Written out but not yet fsynced.
    pub dirty: bool,
}

/// What recovery found at the end of an open segment.
pub(crate) struct TornTail {
    pub at: u64,
    pub cut_bytes: u64,
    pub why: &'static str,
}

pub(crate) fn open_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:020}.wal"))
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ArchiveError + '_ {
    move |source| ArchiveError::io(path, source)
}

fn header(id: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&OPEN_MAGIC);
    h[4] = FORMAT_VERSION;
    h[8..16].copy_from_slice(&id.to_le_bytes());
    h
}

impl OpenSegment {
    /// Creates a new, empty open segment (its header written and synced).
    pub(crate) fn create(dir: &Path, id: u64) -> Result<Self, ArchiveError> {
        let path = open_path(dir, id);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io(&path))?;
        let seg = Self::with_file(id, path, file);
        seg.file
            .write_all_at(&header(id), 0)
            .map_err(io(&seg.path))?;
        seg.file.sync_all().map_err(io(&seg.path))?;
        Ok(Self {
            written: HEADER_LEN as u64,
            ..seg
        })
    }

    fn with_file(id: u64, path: PathBuf, file: File) -> Self {
        Self {
            id,
            path,
            file: Arc::new(file),
            written: 0,
            buf: Vec::new(),
            entries: Vec::new(),
            nodes: Vec::new(),
            node_ix: HashMap::new(),
            dirty: false,
        }
    }

    /// Opens an existing open segment after a restart: reads its entries back and cuts the
    /// tail from the first entry that is cut short or fails its checksum.
    pub(crate) fn recover(path: &Path, id: u64) -> Result<(Self, Option<TornTail>), ArchiveError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(io(path))?;
        let bytes = std::fs::read(path).map_err(io(path))?;
        let mut seg = Self::with_file(id, path.to_owned(), file);
        if bytes.len() < HEADER_LEN {
            // Created but its header never reached the disk: start it again.
            seg.file.set_len(0).map_err(io(path))?;
            seg.file.write_all_at(&header(id), 0).map_err(io(path))?;
            seg.written = HEADER_LEN as u64;
            let torn = (!bytes.is_empty()).then_some(TornTail {
                at: 0,
                cut_bytes: bytes.len() as u64,
                why: "header cut short",
            });
            return Ok((seg, torn));
        }
        if bytes[0..4] != OPEN_MAGIC {
            return Err(ArchiveError::Corrupt {
                path: path.to_owned(),
                what: "no open-segment magic".into(),
            });
        }
        if bytes[4] != FORMAT_VERSION {
            return Err(ArchiveError::Version {
                path: path.to_owned(),
                version: bytes[4],
            });
        }
        let mut at = HEADER_LEN;
        let mut torn = None;
        while at < bytes.len() {
            match read_entry(&bytes[at..]) {
                Ok((r, len)) => {
                    seg.index(&r, at as u64, len as u32);
                    at += len;
                }
                Err(defect) => {
                    torn = Some(TornTail {
                        at: at as u64,
                        cut_bytes: (bytes.len() - at) as u64,
                        why: match defect {
                            EntryDefect::Short => "last entry cut short",
                            EntryDefect::Corrupt => "checksum or length mismatch",
                        },
                    });
                    seg.file.set_len(at as u64).map_err(io(path))?;
                    seg.file.sync_all().map_err(io(path))?;
                    break;
                }
            }
        }
        seg.written = at as u64;
        Ok((seg, torn))
    }

    fn index(&mut self, r: &RecordView<'_>, offset: u64, len: u32) {
        let node = match self.node_ix.get(r.node) {
            Some(&ix) => ix,
            None => {
                let name: Arc<str> = Arc::from(r.node);
                let ix = self.nodes.len() as u32;
                self.nodes.push(name.clone());
                self.node_ix.insert(name, ix);
                ix
            }
        };
        self.entries.push(Entry {
            node,
            offset,
            len,
            seq: r.seq,
            first_ns: r.first_ns,
            last_ns: r.last_ns,
            received_ns: r.received_ns,
        });
    }

    /// Appends one record to the buffer.
    pub(crate) fn append(&mut self, r: &RecordView<'_>) {
        let offset = self.written + self.buf.len() as u64;
        let before = self.buf.len();
        r.put_entry(&mut self.buf);
        let len = (self.buf.len() - before) as u32;
        self.index(r, offset, len);
    }

    /// Size the segment has once its buffer is written out.
    pub(crate) fn size(&self) -> u64 {
        self.written + self.buf.len() as u64
    }

    pub(crate) fn first_received_ns(&self) -> Option<u64> {
        self.entries.first().map(|e| e.received_ns)
    }

    /// Writes the buffer out at the end of the file. On failure the file is cut back to
    /// what it held, so no half entry stays behind, and the buffer is kept.
    pub(crate) fn write_out(&mut self) -> Result<(), ArchiveError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        match self.file.write_all_at(&self.buf, self.written) {
            Ok(()) => {
                self.written += self.buf.len() as u64;
                self.buf.clear();
                self.dirty = true;
                Ok(())
            }
            Err(e) => {
                let _ = self.file.set_len(self.written);
                Err(ArchiveError::io(&self.path, e))
            }
        }
    }

    /// The bytes of one entry, from the file or the buffer.
    pub(crate) fn entry_bytes(&self, e: &Entry) -> Result<Cow<'_, [u8]>, ArchiveError> {
        if e.offset >= self.written {
            let at = (e.offset - self.written) as usize;
            return Ok(Cow::Borrowed(&self.buf[at..at + e.len as usize]));
        }
        let mut b = vec![0u8; e.len as usize];
        self.file
            .read_exact_at(&mut b, e.offset)
            .map_err(io(&self.path))?;
        Ok(Cow::Owned(b))
    }

    /// Reads one entry back as a record.
    pub(crate) fn record(&self, e: &Entry) -> Result<super::Record, ArchiveError> {
        let bytes = self.entry_bytes(e)?;
        let (r, _) = read_entry(&bytes).map_err(|_| ArchiveError::Corrupt {
            path: self.path.clone(),
            what: format!("entry at byte {}", e.offset),
        })?;
        Ok(r.to_record(self.nodes[e.node as usize].clone()))
    }
}
