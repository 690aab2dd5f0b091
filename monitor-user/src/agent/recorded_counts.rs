//! Verb counters from a recording instead of the probes (`railscope agent --verb-counts-from
//! FILE`): the JSON lines the agent itself prints with `--counters S --json` (`kind:
//! verb_count`, one line per counter, `snapshot` shared by a snapshot's lines). Each sweep
//! reads the file again and sends its latest snapshot as the probes' counters would be sent.
//!
//! Why: what the collector makes of a job's verbs (which RDMA devices its QPs sit on, the
//! `nic_affinity` finding) can then be checked on a recorded node, and tested on a machine
//! whose kernel has no RDMA, with the agent's own pipeline rather than frames a test shaped.
//! A bad line is skipped with one warning naming the file and line; the file's other lines
//! and every other source go on.

use std::{collections::HashSet, path::PathBuf};

use monitor_common::verbs::Verb;
use serde::Deserialize;

use crate::{jobs::Job, probes::decode::VerbCount};

/// One line as the agent prints it (`agent::output::write_counts`).
#[derive(Deserialize)]
struct Line {
    kind: String,
    snapshot: u64,
    device: String,
    verb: String,
    #[serde(default)]
    detail: String,
    #[serde(default)]
    cgroup: String,
    job_id: Option<String>,
    job_step: Option<String>,
    value: u64,
}

/// A recording read at each sweep.
pub(super) struct RecordedCounts {
    path: PathBuf,
    /// What was warned about already (file-level or `line N`), so a bad line is told once.
    warned: HashSet<String>,
}

impl RecordedCounts {
    pub(super) fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            warned: HashSet::new(),
        }
    }

    /// The latest snapshot of the file (none while the file is absent or unreadable).
    pub(super) fn read(&mut self) -> Vec<VerbCount> {
        match std::fs::read_to_string(&self.path) {
            Ok(text) => self.parse(&text),
            Err(e) => {
                let message = format!(
                    "{}: cannot read the recorded verb counts: {e}",
                    self.path.display()
                );
                self.warn_once("file".into(), message);
                Vec::new()
            }
        }
    }

    fn parse(&mut self, text: &str) -> Vec<VerbCount> {
        let mut latest: Option<u64> = None;
        let mut counts: Vec<(u64, VerbCount)> = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            if raw.trim().is_empty() {
                continue;
            }
            match parse_line(raw) {
                Ok(None) => {}
                Ok(Some((snapshot, count))) => {
                    latest = latest.max(Some(snapshot));
                    counts.push((snapshot, count));
                }
                Err(why) => {
                    let message = format!("{}:{}: {why}", self.path.display(), index + 1);
                    self.warn_once(format!("line {}", index + 1), message);
                }
            }
        }
        counts
            .into_iter()
            .filter(|(snapshot, _)| Some(*snapshot) == latest)
            .map(|(_, count)| count)
            .collect()
    }

    fn warn_once(&mut self, what: String, message: String) {
        if self.warned.insert(what) {
            tracing::warn!("{message}");
        }
    }
}

/// A line's snapshot and counter; `None` for a line of another kind (events, transitions).
fn parse_line(raw: &str) -> Result<Option<(u64, VerbCount)>, String> {
    let line: Line = match serde_json::from_str(raw) {
        Ok(line) => line,
        Err(e) => {
            // Lines of other kinds lack the counter's fields: skip them quietly.
            return match serde_json::from_str::<serde_json::Value>(raw) {
                Ok(v) if v.get("kind").is_some_and(|k| k != "verb_count") => Ok(None),
                _ => Err(format!("not a verb_count line: {e}")),
            };
        }
    };
    if line.kind != "verb_count" {
        return Ok(None);
    }
    let verb = Verb::ALL
        .iter()
        .find(|v| v.name() == line.verb)
        .ok_or_else(|| format!("unknown verb {:?}", line.verb))?;
    Ok(Some((
        line.snapshot,
        VerbCount {
            device: line.device,
            verb: verb.name(),
            detail: line.detail,
            cgroup: line.cgroup,
            job: line.job_id.map(|id| Job {
                id,
                step: line.job_step,
            }),
            value: line.value,
        },
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{OutputFormat, write_counts};

    fn count(device: &str, job: &str, value: u64) -> VerbCount {
        VerbCount {
            device: device.into(),
            verb: Verb::ALL
                .iter()
                .find(|v| v.name() == "create_qp")
                .unwrap()
                .name(),
            detail: "user".into(),
            cgroup: format!("/system.slice/slurmstepd.scope/job_{job}/step_0"),
            job: Some(Job {
                id: format!("slurm:{job}"),
                step: Some("0".into()),
            }),
            value,
        }
    }

    #[test]
    fn reads_back_the_latest_snapshot_the_agent_printed() {
        let mut text = Vec::new();
        write_counts(
            &mut text,
            &[count("mlx5_0", "7", 2)],
            1_000,
            OutputFormat::Json,
        )
        .unwrap();
        let later = [count("mlx5_0", "7", 4), count("mlx5_7", "7", 8)];
        write_counts(&mut text, &later, 2_000, OutputFormat::Json).unwrap();
        let path = std::env::temp_dir().join(format!("railscope-verbs-{}", std::process::id()));
        std::fs::write(&path, &text).unwrap();
        let read = RecordedCounts::new(&path).read();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(read, later.to_vec());
    }

    #[test]
    fn bad_lines_are_skipped_and_the_rest_kept() {
        let mut text = b"{\"kind\":\"verb_count\",\"snapshot\":5}\nnot json\n".to_vec();
        text.extend(br#"{"kind":"ib_port","device":"mlx5_0"}"#);
        text.push(b'\n');
        write_counts(&mut text, &[count("mlx5_1", "9", 3)], 5, OutputFormat::Json).unwrap();
        let mut recorded = RecordedCounts::new("/nonexistent");
        assert_eq!(
            recorded.parse(std::str::from_utf8(&text).unwrap()),
            vec![count("mlx5_1", "9", 3)]
        );
        assert!(recorded.warned.contains("line 1") && recorded.warned.contains("line 2"));
        assert!(!recorded.warned.contains("line 3"));
        assert!(recorded.read().is_empty());
    }
}
