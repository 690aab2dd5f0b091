//! Slurm through its own command, `scontrol`: read a node's state and reason
//! (`scontrol show node NAME`), drain it (`State=DRAIN Reason=...`) and undo that drain
//! (`State=UNDRAIN`). Each call runs with a timeout and is killed past it; a node Slurm does
//! not know is its own error, so it is reported rather than retried.
//!
//! The state is read from `scontrol show node`'s multi-line form: Slurm 22.05 (Debian
//! bookworm) has no `--json` for `scontrol`, and the one-line form (`-o`) gives `Reason=`
//! among other `key=value` words although a reason holds spaces; in the multi-line form it
//! has a line of its own.
//!
//! Resuming uses `UNDRAIN` rather than `RESUME`: it clears the drain flag railscope set and
//! leaves the node's base state alone, so a node that is also DOWN for another reason stays
//! down (Slurm's scontrol(1), `UNDRAIN`; a plain drained idle node becomes IDLE either way).

use std::{
    io::Read as _,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

/// What Slurm says of a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeState {
    /// `State=`, e.g. `IDLE+DRAIN`.
    pub state: String,
    /// Whether the drain flag is set.
    pub drained: bool,
    /// `Reason=` without the `[user@time]` Slurm appends; None when there is none.
    pub reason: Option<String>,
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum SlurmError {
    #[error("node {0:?} is unknown to Slurm")]
    UnknownNode(String),
    #[error("{0:?} is not a Slurm node name (letters, digits, '.', '_' and '-' only)")]
    BadNodeName(String),
    #[error("{0}")]
    Failed(String),
}

impl SlurmError {
    /// Whether trying again can help (Slurm down, a timeout, a permission an operator may
    /// grant); a node Slurm does not know, or a name it cannot be, is reported once.
    pub fn retryable(&self) -> bool {
        matches!(self, SlurmError::Failed(_))
    }
}

/// The scheduler the actions drive; [`Scontrol`] in the collector, a fake in unit tests.
pub trait Scheduler: Send {
    fn show(&self, node: &str) -> Result<NodeState, SlurmError>;
    fn drain(&self, node: &str, reason: &str) -> Result<(), SlurmError>;
    fn undrain(&self, node: &str) -> Result<(), SlurmError>;
}

/// `scontrol`, run as a child process.
pub(crate) struct Scontrol {
    pub program: String,
    pub timeout: Duration,
}

/// The longest reason railscope sets (Slurm keeps longer ones, but `sinfo -R` shows about
/// this much and operators read it there).
pub(crate) const MAX_REASON: usize = 160;

/// A `Reason` Slurm takes as one value: printable ASCII without quotes, `=`, `;`, `$`, `\`
/// or backquotes (replaced by `_`), at most [`MAX_REASON`] bytes.
pub(crate) fn sanitize_reason(text: &str) -> String {
    let mut out: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || " _./:@,+-#()[]".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    out.truncate(MAX_REASON);
    out.trim_end().to_owned()
}

/// Whether `name` can only name one Slurm node (no list or range syntax, no spaces, not
/// `ALL`).
pub(crate) fn is_node_name(name: &str) -> bool {
    !name.is_empty()
        && !name.eq_ignore_ascii_case("all")
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

impl Scontrol {
    fn run(&self, args: &[&str]) -> Result<(bool, String), SlurmError> {
        let mut child = Command::new(&self.program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| SlurmError::Failed(format!("cannot run {}: {e}", self.program)))?;
        let started = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if started.elapsed() >= self.timeout => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(SlurmError::Failed(format!(
                        "{} {} took more than {:?} and was killed",
                        self.program,
                        args.join(" "),
                        self.timeout
                    )));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => return Err(SlurmError::Failed(format!("{}: {e}", self.program))),
            }
        };
        let mut text = String::new();
        if let Some(mut out) = child.stdout.take() {
            let _ = out.read_to_string(&mut text);
        }
        if let Some(mut err) = child.stderr.take() {
            let _ = err.read_to_string(&mut text);
        }
        Ok((status.success(), text))
    }

    fn update(&self, node: &str, args: &[&str]) -> Result<(), SlurmError> {
        if !is_node_name(node) {
            return Err(SlurmError::BadNodeName(node.into()));
        }
        let name = format!("NodeName={node}");
        let mut all = vec!["update", name.as_str()];
        all.extend_from_slice(args);
        let (ok, text) = self.run(&all)?;
        if ok {
            return Ok(());
        }
        if text.contains("Invalid node name") {
            return Err(SlurmError::UnknownNode(node.into()));
        }
        Err(SlurmError::Failed(format!(
            "scontrol {}: {}",
            all.join(" "),
            one_line(&text)
        )))
    }
}

impl Scheduler for Scontrol {
    fn show(&self, node: &str) -> Result<NodeState, SlurmError> {
        if !is_node_name(node) {
            return Err(SlurmError::BadNodeName(node.into()));
        }
        let (ok, text) = self.run(&["show", "node", node])?;
        if !ok {
            if text.contains("not found") {
                return Err(SlurmError::UnknownNode(node.into()));
            }
            return Err(SlurmError::Failed(format!(
                "scontrol show node {node}: {}",
                one_line(&text)
            )));
        }
        parse_show(&text).ok_or_else(|| {
            SlurmError::Failed(format!(
                "scontrol show node {node}: no State= in {:?}",
                one_line(&text)
            ))
        })
    }

    fn drain(&self, node: &str, reason: &str) -> Result<(), SlurmError> {
        let reason = format!("Reason={}", sanitize_reason(reason));
        self.update(node, &["State=DRAIN", &reason])
    }

    fn undrain(&self, node: &str) -> Result<(), SlurmError> {
        self.update(node, &["State=UNDRAIN"])
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `scontrol show node NAME`'s multi-line answer: `State=` is one word; `Reason=` runs to the
/// end of its line (it may hold spaces), ending in `[user@time]`.
pub(crate) fn parse_show(text: &str) -> Option<NodeState> {
    let state = text
        .split_whitespace()
        .find_map(|w| w.strip_prefix("State="))?
        .to_owned();
    let drained = state
        .split('+')
        .any(|f| matches!(f, "DRAIN" | "DRAINED" | "DRAINING"));
    let reason = text
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("Reason="))
        .map(|r| {
            let r = r.trim_end();
            match r.rfind(" [") {
                Some(i) if r.ends_with(']') => r[..i].to_owned(),
                _ => r.to_owned(),
            }
        })
        .filter(|r| !r.is_empty() && r != "(null)");
    Some(NodeState {
        state,
        drained,
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `scontrol show node` of Slurm 22.05 (Debian bookworm), a node railscope drained.
    const DRAINED: &str = "NodeName=node01 Arch=x86_64 CoresPerSocket=1 \n   CPUAlloc=0 CPUEfctv=1 CPUTot=1 CPULoad=0.50\n   State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A\n   Partitions=all \n   Reason=railscope: ib_link_flapping ib_link_flapping/node01/mlx5_2/1/17 [root@2026-11-27T07:35:32]\n";
    const IDLE: &str = "NodeName=node02 Arch=x86_64\n   State=IDLE ThreadsPerCore=1 TmpDisk=0\n   Partitions=all \n";

    #[test]
    fn state_and_reason_are_read_back() {
        let s = parse_show(DRAINED).unwrap();
        assert_eq!(s.state, "IDLE+DRAIN");
        assert!(s.drained);
        assert_eq!(
            s.reason.as_deref(),
            Some("railscope: ib_link_flapping ib_link_flapping/node01/mlx5_2/1/17")
        );
        let s = parse_show(IDLE).unwrap();
        assert!(!s.drained);
        assert_eq!(s.reason, None);
        assert!(parse_show("garbage").is_none());
    }

    #[test]
    fn a_reason_keeps_what_slurm_takes_and_is_short() {
        assert_eq!(
            sanitize_reason("railscope: gpu_xid gpu_xid/n1/3/5"),
            "railscope: gpu_xid gpu_xid/n1/3/5"
        );
        assert_eq!(sanitize_reason("a \"b\"=c;$(d)`e`\n"), "a _b__c__(d)_e__");
        assert_eq!(sanitize_reason(&"x".repeat(400)).len(), MAX_REASON);
    }

    #[test]
    fn only_single_node_names_are_passed_to_scontrol() {
        assert!(is_node_name("node-017.cluster"));
        for bad in ["", "node[1-4]", "a,b", "a b", "ALL", "all", "n\n"] {
            assert!(!is_node_name(bad), "{bad:?}");
        }
        let s = Scontrol {
            program: "/nonexistent/scontrol".into(),
            timeout: Duration::from_secs(1),
        };
        assert_eq!(
            s.drain("node[1-4]", "r"),
            Err(SlurmError::BadNodeName("node[1-4]".into()))
        );
        let e = s.show("node1").unwrap_err();
        assert!(
            e.retryable() && e.to_string().contains("/nonexistent/scontrol"),
            "{e}"
        );
    }
}
