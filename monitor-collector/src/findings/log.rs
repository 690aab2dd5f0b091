//! The findings log: `findings.log` in the collector's data directory, next to the archive's
//! segments, with the same entry framing and torn-tail rule (docs/archive-format.md,
//! "Findings log"): each entry is `u32` length, `u32` CRC-32 of the payload, and the payload,
//! one JSON record: a finding when it opens, its end when it ends. Entries are written and
//! fsynced one at a time (findings are rare). At start-up the log is read up to its first
//! incomplete or corrupt entry, cut there, and rewritten without the findings that ended
//! before the retention age.

use std::{
    fs::{File, OpenOptions},
    io::{self, Read as _, Write as _},
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use super::Finding;

pub const FILE_NAME: &str = "findings.log";
const MAX_ENTRY: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("findings log {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// One entry of the log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Entry {
    Open(Finding),
    End {
        id: String,
        end: u64,
        summary: String,
        evidence: serde_json::Value,
    },
}

pub struct FindingsLog {
    path: PathBuf,
    file: File,
}

impl FindingsLog {
    /// Opens (or creates) the log in `dir`; returns it and the findings it holds, oldest
    /// first, those ended before `keep_after_ns` left out (and left out of the file).
    pub fn open(dir: &Path, keep_after_ns: u64) -> Result<(Self, Vec<Finding>), LogError> {
        let path = dir.join(FILE_NAME);
        let io_err = |source| LogError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io_err)?;
        let mut bytes = Vec::new();
        match File::open(&path) {
            Ok(mut f) => {
                f.read_to_end(&mut bytes).map_err(io_err)?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(e)),
        }
        let (entries, good) = read_entries(&bytes);
        if good < bytes.len() {
            tracing::warn!(
                "findings log {}: {} bytes after offset {good} are incomplete or corrupt and are dropped",
                path.display(),
                bytes.len() - good
            );
        }
        let mut findings: Vec<Finding> = Vec::new();
        let mut index = std::collections::HashMap::new();
        for entry in entries {
            match entry {
                Entry::Open(f) => {
                    index.insert(f.id.clone(), findings.len());
                    findings.push(f);
                }
                Entry::End {
                    id,
                    end,
                    summary,
                    evidence,
                } => {
                    if let Some(&i) = index.get(&id) {
                        let f: &mut Finding = &mut findings[i];
                        f.end = Some(end);
                        f.summary = summary;
                        f.evidence = evidence;
                    }
                }
            }
        }
        findings.retain(|f| f.end.is_none_or(|e| e >= keep_after_ns));
        // Rewritten whole: the torn tail and the expired findings go; renamed into place so a
        // crash leaves either log whole.
        let tmp = dir.join(format!("{FILE_NAME}.tmp"));
        {
            let mut out = File::create(&tmp).map_err(io_err)?;
            let mut buf = Vec::new();
            for f in &findings {
                encode(&Entry::Open(f.clone()), &mut buf);
            }
            out.write_all(&buf).map_err(io_err)?;
            out.sync_all().map_err(io_err)?;
        }
        std::fs::rename(&tmp, &path).map_err(io_err)?;
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
        let file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(io_err)?;
        Ok((Self { path, file }, findings))
    }

    /// Appends one entry and fsyncs it.
    pub fn append(&mut self, entry: &Entry) -> Result<(), LogError> {
        let mut buf = Vec::new();
        encode(entry, &mut buf);
        let len = self.file.metadata().map(|m| m.len()).ok();
        let written = self
            .file
            .write_all(&buf)
            .and_then(|()| self.file.sync_data());
        if let Err(source) = written {
            // No partial entry stays behind (a full disk): cut back to where it was.
            if let Some(len) = len {
                let _ = self.file.set_len(len);
            }
            return Err(LogError::Io {
                path: self.path.clone(),
                source,
            });
        }
        Ok(())
    }
}

fn encode(entry: &Entry, out: &mut Vec<u8>) {
    let payload = serde_json::to_vec(entry).expect("a finding serializes");
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
}

/// The entries up to the first incomplete or corrupt one, and the offset where they end.
fn read_entries(bytes: &[u8]) -> (Vec<Entry>, usize) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::findings::Severity;

    fn finding(id: &str, end: Option<u64>) -> Finding {
        Finding {
            id: id.into(),
            rule: "ib_link_downed".into(),
            severity: Severity::Critical,
            node: "n1".into(),
            device: Some("mlx5_0".into()),
            port: Some(1),
            gpu: None,
            job_id: None,
            start: 100,
            end,
            summary: "s".into(),
            evidence: serde_json::json!({"increase": 1}),
        }
    }

    #[test]
    fn findings_come_back_and_a_torn_tail_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut log, found) = FindingsLog::open(dir.path(), 0).unwrap();
            assert!(found.is_empty());
            log.append(&Entry::Open(finding("a", None))).unwrap();
            log.append(&Entry::Open(finding("b", None))).unwrap();
            log.append(&Entry::End {
                id: "a".into(),
                end: 500,
                summary: "ended".into(),
                evidence: serde_json::json!({}),
            })
            .unwrap();
        }
        // A torn last entry, as a crash mid-write leaves it.
        let path = dir.path().join(FILE_NAME);
        let mut bytes = std::fs::read(&path).unwrap();
        let whole = bytes.len();
        let mut torn = Vec::new();
        encode(&Entry::Open(finding("c", None)), &mut torn);
        bytes.extend_from_slice(&torn[..torn.len() - 3]);
        std::fs::write(&path, &bytes).unwrap();

        let (_, found) = FindingsLog::open(dir.path(), 0).unwrap();
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].id, "a");
        assert_eq!(found[0].end, Some(500));
        assert_eq!(found[0].summary, "ended");
        assert_eq!(found[1].end, None);
        assert!(std::fs::metadata(&path).unwrap().len() < whole as u64 + 8);

        // Retention: "a" ended at 500, before 600.
        let (_, found) = FindingsLog::open(dir.path(), 600).unwrap();
        assert_eq!(
            found.iter().map(|f| f.id.as_str()).collect::<Vec<_>>(),
            ["b"]
        );
    }

    #[test]
    fn a_corrupt_entry_ends_the_log() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut log, _) = FindingsLog::open(dir.path(), 0).unwrap();
            log.append(&Entry::Open(finding("a", None))).unwrap();
            log.append(&Entry::Open(finding("b", None))).unwrap();
        }
        let path = dir.path().join(FILE_NAME);
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 2;
        bytes[last] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let (_, found) = FindingsLog::open(dir.path(), 0).unwrap();
        assert_eq!(found.len(), 1);
    }
}
