//! The audit log: `actions.log` in the collector's data directory, one record per step of
//! every action (tried, done, would do, failed, gave up, held, joined, skipped, left,
//! released; for alerts only an endpoint's changes), framed as the findings log is ([`monitor_archive::framed_log`]). It is the actions'
//! memory: at start-up the records are read back and replayed (`state`), so a restart
//! acts on no finding twice. It is kept whole (a record is a few hundred bytes, and actions
//! are rare).

use std::{
    io,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use monitor_archive::framed_log::FramedLog;

pub const FILE_NAME: &str = "actions.log";

/// What was acted on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Drain the node in Slurm.
    Drain,
    /// Undo railscope's drain.
    Resume,
    /// A person released the brake (`railscope actions release`).
    Release,
    /// POST the finding to a webhook.
    Webhook,
    /// Run a command with the finding on its stdin.
    Command,
    /// Alerts to an Alertmanager: only its changes (failing, sending again) are recorded,
    /// not every send.
    Alert,
}

/// One step of an action.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Decided, and about to be done (written before Slurm is asked).
    Tried,
    /// Slurm did it (or had it done already, with railscope's reason).
    Done,
    /// A dry run: what railscope would have done.
    Would,
    /// Slurm refused or could not be reached: tried again after a back-off.
    Failed,
    /// Not retried: the node is unknown to Slurm, or its name cannot be a Slurm node's.
    GaveUp,
    /// The brake holds the drain until a person releases it.
    Held,
    /// A finding on a node railscope already acts on: it keeps the node drained.
    Joined,
    /// Not acted on: the node was drained by someone else, or the finding is older than those
    /// already handled.
    Skipped,
    /// Not resumed: someone resumed the node, or drained it again for their own reason.
    Left,
    /// The brake was released.
    Released,
}

/// One line of the audit log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Numbered from 1, in the order written.
    pub seq: u64,
    /// Unix ns.
    pub at: u64,
    pub node: String,
    pub action: Action,
    pub outcome: Outcome,
    /// The finding acted on (none for a release or a resume).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finding: Option<String>,
    /// That finding's start, Unix ns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finding_start: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    pub dry_run: bool,
    /// The Slurm `Reason` railscope sets (drains).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Why, in words: Slurm's error, whose reason the node carries, ...
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
    /// Where a webhook, command or alert went: the URL, or the program.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

#[derive(Debug, thiserror::Error)]
#[error("actions audit log {path}: {source}")]
pub struct AuditError {
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

pub struct AuditLog {
    log: FramedLog,
}

impl AuditLog {
    /// Opens (or creates) the log in `dir` and returns the records it holds, oldest first
    /// (a torn last record, as a crash mid-write leaves it, is cut off).
    pub fn open(dir: &Path) -> Result<(Self, Vec<Record>), AuditError> {
        let path = dir.join(FILE_NAME);
        let err = |source| AuditError {
            path: path.clone(),
            source,
        };
        let records: Vec<Record> = FramedLog::read(&path).map_err(err)?;
        let log = FramedLog::rewrite(&path, &records).map_err(err)?;
        Ok((Self { log }, records))
    }

    /// Every record the log holds, oldest first, read back from the file.
    pub fn records(&self) -> Result<Vec<Record>, AuditError> {
        FramedLog::read(self.log.path()).map_err(|source| AuditError {
            path: self.log.path().to_owned(),
            source,
        })
    }

    /// Appends one record and fsyncs it.
    pub fn append(&mut self, record: &Record) -> Result<(), AuditError> {
        self.log.append(record).map_err(|source| AuditError {
            path: self.log.path().to_owned(),
            source,
        })
    }
}

/// The records about `id` (`railscope actions show ID`): a finding's id, or a record's `seq`
/// (standing for its finding, or for itself where it names none, as a release). Returns the
/// finding's id if there is one, and the records about it: those naming it, then the node's
/// resume that followed, up to its end (done, would, left or given up). `None` for a number
/// that is no record's.
pub fn about(records: &[Record], id: &str) -> Option<(Option<String>, Vec<Record>)> {
    let finding = match id.parse::<u64>() {
        Ok(seq) => {
            let r = records.iter().find(|r| r.seq == seq)?;
            match &r.finding {
                Some(f) => f.clone(),
                None => return Some((None, vec![r.clone()])),
            }
        }
        Err(_) => id.to_owned(),
    };
    let mut out: Vec<Record> = Vec::new();
    let mut resume_ended = false;
    for r in records {
        if r.finding.as_deref() == Some(finding.as_str()) {
            out.push(r.clone());
        } else if r.action == Action::Resume
            && !resume_ended
            && out.first().is_some_and(|first| first.node == r.node)
        {
            out.push(r.clone());
            resume_ended = matches!(
                r.outcome,
                Outcome::Done | Outcome::Would | Outcome::Left | Outcome::GaveUp
            );
        }
    }
    Some((Some(finding), out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(seq: u64) -> Record {
        Record {
            seq,
            at: 10 * seq,
            node: "node01".into(),
            action: Action::Drain,
            outcome: Outcome::Tried,
            finding: Some(format!("gpu_xid/node01/3/{seq}")),
            finding_start: Some(seq),
            rule: Some("gpu_xid".into()),
            dry_run: false,
            reason: Some("railscope: gpu_xid".into()),
            detail: String::new(),
            target: None,
        }
    }

    #[test]
    fn the_records_about_a_finding_are_its_own_and_the_resume_that_followed() {
        let mut records: Vec<Record> = (1..=2).map(record).collect();
        records[1].outcome = Outcome::Done;
        records[1].finding = records[0].finding.clone();
        let resume = |seq, outcome| Record {
            action: Action::Resume,
            outcome,
            finding: None,
            finding_start: None,
            rule: None,
            ..record(seq)
        };
        records.push(record(3)); // another finding's drain
        records.push(resume(4, Outcome::Tried));
        records.push(resume(5, Outcome::Done));
        records.push(resume(6, Outcome::Done)); // a later resume: not this finding's
        let id = records[0].finding.clone().unwrap();
        let seqs = |found: Option<(Option<String>, Vec<Record>)>| {
            let (finding, rs) = found.unwrap();
            (finding, rs.iter().map(|r| r.seq).collect::<Vec<_>>())
        };
        assert_eq!(
            seqs(about(&records, &id)),
            (Some(id.clone()), vec![1, 2, 4, 5])
        );
        // A record's seq stands for its finding.
        assert_eq!(seqs(about(&records, "2")), (Some(id), vec![1, 2, 4, 5]));
        assert_eq!(
            seqs(about(&records, "3")),
            (records[2].finding.clone(), vec![3, 4, 5])
        );
        // A record of no finding (a resume, a release) is shown alone.
        assert_eq!(seqs(about(&records, "6")), (None, vec![6]));
        assert!(about(&records, "99").is_none());
        assert_eq!(
            seqs(about(&records, "gpu_xid/node09/1/1")),
            (Some("gpu_xid/node09/1/1".into()), vec![])
        );
    }

    #[test]
    fn records_come_back_and_a_torn_one_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut log, found) = AuditLog::open(dir.path()).unwrap();
            assert!(found.is_empty());
            log.append(&record(1)).unwrap();
            log.append(&record(2)).unwrap();
        }
        let path = dir.path().join(FILE_NAME);
        let mut bytes = std::fs::read(&path).unwrap();
        let mut torn = Vec::new();
        monitor_archive::framed_log::encode(&record(3), &mut torn);
        bytes.extend_from_slice(&torn[..torn.len() - 5]);
        std::fs::write(&path, &bytes).unwrap();
        let (mut log, found) = AuditLog::open(dir.path()).unwrap();
        assert_eq!(found, vec![record(1), record(2)]);
        log.append(&record(3)).unwrap();
        drop(log);
        let (_, found) = AuditLog::open(dir.path()).unwrap();
        assert_eq!(found.len(), 3);
        assert_eq!(found[2], record(3));
    }
}
