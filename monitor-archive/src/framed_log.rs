//! Append-only logs of JSON records with crash-safe framing, shared by the findings log
//! (the collector's `findings::log`) and the actions' audit log (`actions::audit`)
//! (docs/archive-format.md, "Findings log"): each entry is a `u32` length, a `u32` CRC-32 of
//! the payload, and the payload, one JSON record. Entries are appended and fsynced one at a
//! time (these records are rare). A log is read up to its first incomplete or corrupt entry
//! (what a crash mid-write leaves) and rewritten whole through a renamed temporary file, so a
//! crash at any point leaves either the old log or the new one.

use std::{
    fs::{File, OpenOptions},
    io::{self, Read as _, Write as _},
    path::{Path, PathBuf},
};

use serde::{Serialize, de::DeserializeOwned};

/// The largest entry read back; a longer length field is corruption.
const MAX_ENTRY: usize = 1 << 20;

/// An open log, appended to.
pub struct FramedLog {
    path: PathBuf,
    file: File,
}

impl FramedLog {
    /// The entries of the log at `path` (none if it does not exist), up to the first
    /// incomplete or corrupt one; a dropped tail is logged with the path.
    pub fn read<T: DeserializeOwned>(path: &Path) -> io::Result<Vec<T>> {
        let mut bytes = Vec::new();
        match File::open(path) {
            Ok(mut f) => {
                f.read_to_end(&mut bytes)?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        }
        let (entries, good) = read_entries(&bytes);
        if good < bytes.len() {
            tracing::warn!(
                "{}: {} bytes after offset {good} are incomplete or corrupt and are dropped",
                path.display(),
                bytes.len() - good
            );
        }
        Ok(entries)
    }

    /// Writes `entries` as the whole log at `path` (a temporary file renamed into place, its
    /// directory made first) and opens it for appending.
    pub fn rewrite<T: Serialize>(path: &Path, entries: &[T]) -> io::Result<Self> {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        {
            let mut out = File::create(&tmp)?;
            let mut buf = Vec::new();
            for entry in entries {
                encode(entry, &mut buf);
            }
            out.write_all(&buf)?;
            out.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
        let file = OpenOptions::new().append(true).open(path)?;
        Ok(Self {
            path: path.to_owned(),
            file,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one entry and fsyncs it; on an error no partial entry stays behind.
    pub fn append<T: Serialize>(&mut self, entry: &T) -> io::Result<()> {
        let mut buf = Vec::new();
        encode(entry, &mut buf);
        let len = self.file.metadata().map(|m| m.len()).ok();
        let written = self
            .file
            .write_all(&buf)
            .and_then(|()| self.file.sync_data());
        if let Err(e) = written {
            // A full disk: cut back to where it was.
            if let Some(len) = len {
                let _ = self.file.set_len(len);
            }
            return Err(e);
        }
        Ok(())
    }
}

/// One entry's frame: length, CRC-32, JSON payload.
pub fn encode<T: Serialize>(entry: &T, out: &mut Vec<u8>) {
    let payload = serde_json::to_vec(entry).expect("a log record serializes");
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
}

/// The entries up to the first incomplete or corrupt one, and the offset where they end.
fn read_entries<T: DeserializeOwned>(bytes: &[u8]) -> (Vec<T>, usize) {
    let mut out = Vec::new();
    let mut at = 0;
    while bytes.len() - at >= 8 {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().expect("4 bytes"));
        if len > MAX_ENTRY || bytes.len() - at - 8 < len {
            break;
        }
        let payload = &bytes[at + 8..at + 8 + len];
        if crc32fast::hash(payload) != crc {
            break;
        }
        let Ok(entry) = serde_json::from_slice(payload) else {
            break;
        };
        out.push(entry);
        at += 8 + len;
    }
    (out, at)
}
