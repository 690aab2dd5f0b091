//! The findings log: `findings.log` in the collector's data directory, next to the archive's
//! segments, framed as [`monitor_archive::framed_log`] frames it (docs/archive-format.md, "Findings
//! log"): one JSON record per entry, a finding when it opens, its end when it ends. At
//! start-up the log is read up to its first incomplete or corrupt entry, cut there, and
//! rewritten without the findings that ended before the retention age.

use std::{
    io,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use super::Finding;
use monitor_archive::framed_log::FramedLog;

pub(crate) const FILE_NAME: &str = "findings.log";

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
pub(crate) enum Entry {
    Open(Finding),
    End {
        id: String,
        end: u64,
        summary: String,
        evidence: serde_json::Value,
    },
}

pub(crate) struct FindingsLog {
    log: FramedLog,
}

impl FindingsLog {
    /// Opens (or creates) the log in `dir`; returns it and the findings it holds, oldest
    /// first, those ended before `keep_after_ns` left out (and left out of the file).
    pub(crate) fn open(dir: &Path, keep_after_ns: u64) -> Result<(Self, Vec<Finding>), LogError> {
        let path = dir.join(FILE_NAME);
        let io_err = |source| LogError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io_err)?;
        let entries: Vec<Entry> = FramedLog::read(&path).map_err(io_err)?;
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
        // Rewritten whole: the torn tail and the expired findings go.
        let opens: Vec<Entry> = findings.iter().cloned().map(Entry::Open).collect();
        let log = FramedLog::rewrite(&path, &opens).map_err(io_err)?;
        Ok((Self { log }, findings))
    }

    /// Appends one entry and fsyncs it.
    pub(crate) fn append(&mut self, entry: &Entry) -> Result<(), LogError> {
        self.log.append(entry).map_err(|source| LogError::Io {
            path: self.log.path().to_owned(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Severity;

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
        monitor_archive::framed_log::encode(&Entry::Open(finding("c", None)), &mut torn);
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
