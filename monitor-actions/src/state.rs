//! What railscope is doing to each node, rebuilt from the audit log's records: the collector
//! changes it only by writing a record and applying it ([`ActionState::apply`]), so the state
//! after a restart (the records replayed) is the state before it. It also knows every finding
//! already handled, so none is acted on twice, and the drains the brake counts.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use serde::Serialize;

use super::audit::{Action, Outcome, Record};

/// Where a node's action stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub(crate) enum Phase {
    /// A drain decided and not yet seen done (in flight, or failed and waiting to be tried
    /// again at `next_try`, Unix ns).
    Draining { attempts: u32, next_try: u64 },
    /// Drained by railscope (in a dry run: would have been), at this time.
    Drained { since: u64 },
    /// A drain held by the brake until a person releases it.
    Held { since: u64 },
    /// A resume decided and not yet seen done.
    Resuming { attempts: u32, next_try: u64 },
}

/// railscope's action on one node.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct NodeAction {
    pub node: String,
    #[serde(flatten)]
    pub phase: Phase,
    /// The findings it is drained for (the first one named in the reason).
    pub findings: BTreeSet<String>,
    pub rule: String,
    pub dry_run: bool,
    /// The `Reason` railscope sets.
    pub reason: String,
    /// The last failure, if the last try failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// A webhook or command for one finding, decided and not yet done.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Notice {
    pub finding: String,
    pub node: String,
    pub action: Action,
    /// The URL or the command line.
    pub target: String,
    /// Tries failed so far.
    pub attempts: u32,
    /// When to try next, Unix ns.
    pub next_try: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

#[derive(Debug, Default)]
pub(crate) struct ActionState {
    pub nodes: BTreeMap<String, NodeAction>,
    /// Webhooks and commands not done yet, by finding.
    pub notices: BTreeMap<String, Notice>,
    /// Every finding an action was decided for (or not, on purpose).
    pub handled: HashSet<String>,
    /// The latest start of a finding handled, Unix ns.
    pub watermark: u64,
    /// Drains the brake counts: (when, node), a dry run's included.
    pub drains: Vec<(u64, String)>,
    /// When the brake was last released, Unix ns.
    pub released_at: u64,
    /// The last record's number.
    pub seq: u64,
}

/// The wait before try `attempts + 1` after `attempts` failures: 1 s doubling up to `max_s`.
pub(crate) fn backoff_ns(attempts: u32, max_s: u64) -> u64 {
    let s = 1u64 << attempts.saturating_sub(1).min(16);
    s.min(max_s) * 1_000_000_000
}

impl ActionState {
    /// Takes one record into the state (its number into `seq`). `retry_max_s` sets the
    /// back-off of a failed try.
    pub(crate) fn apply(&mut self, r: &Record, retry_max_s: u64) {
        self.seq = self.seq.max(r.seq);
        if let Some(f) = &r.finding {
            self.handled.insert(f.clone());
            self.watermark = self.watermark.max(r.finding_start.unwrap_or(0));
        }
        if matches!(r.action, Action::Webhook | Action::Command) {
            self.apply_notice(r, retry_max_s);
            return;
        }
        let entry = self.nodes.get_mut(&r.node);
        match (r.action, r.outcome) {
            (Action::Drain, Outcome::Tried | Outcome::Would | Outcome::Held) => {
                let phase = match r.outcome {
                    Outcome::Tried => Phase::Draining {
                        attempts: 0,
                        next_try: r.at,
                    },
                    Outcome::Would => Phase::Drained { since: r.at },
                    _ => Phase::Held { since: r.at },
                };
                if r.outcome != Outcome::Held {
                    self.drains.push((r.at, r.node.clone()));
                }
                let mut findings: BTreeSet<String> = r.finding.iter().cloned().collect();
                if let Some(old) = entry {
                    // A node released from the brake, or drained again after its resume was
                    // decided: the same action goes on with the new phase.
                    findings.extend(old.findings.iter().cloned());
                }
                self.nodes.insert(
                    r.node.clone(),
                    NodeAction {
                        node: r.node.clone(),
                        phase,
                        findings,
                        rule: r.rule.clone().unwrap_or_default(),
                        dry_run: r.dry_run,
                        reason: r.reason.clone().unwrap_or_default(),
                        last_error: None,
                    },
                );
            }
            (Action::Drain, Outcome::Done) => {
                if let Some(e) = entry {
                    e.phase = Phase::Drained { since: r.at };
                    e.last_error = None;
                }
            }
            (Action::Drain | Action::Resume, Outcome::Failed) => {
                if let Some(e) = entry {
                    let attempts = match e.phase {
                        Phase::Draining { attempts, .. } | Phase::Resuming { attempts, .. } => {
                            attempts + 1
                        }
                        _ => 1,
                    };
                    let next_try = r.at + backoff_ns(attempts, retry_max_s);
                    e.phase = match r.action {
                        Action::Drain => Phase::Draining { attempts, next_try },
                        _ => Phase::Resuming { attempts, next_try },
                    };
                    e.last_error = Some(r.detail.clone());
                }
            }
            (Action::Drain, Outcome::Joined) => {
                if let Some(e) = entry {
                    e.findings.extend(r.finding.iter().cloned());
                    if matches!(e.phase, Phase::Resuming { .. }) {
                        // The resume may have happened: drain again (a drain finds a node
                        // still drained with railscope's reason and leaves it).
                        e.phase = Phase::Draining {
                            attempts: 0,
                            next_try: r.at,
                        };
                    }
                }
            }
            // Only a pending drain ends (a finding skipped on a node railscope drains for
            // another leaves that action alone); no drain was made, so the brake does not
            // count it.
            (Action::Drain, Outcome::GaveUp | Outcome::Skipped)
                if entry
                    .as_ref()
                    .is_some_and(|e| matches!(e.phase, Phase::Draining { .. })) =>
            {
                self.nodes.remove(&r.node);
                if let Some(i) = self.drains.iter().rposition(|(_, n)| *n == r.node) {
                    self.drains.remove(i);
                }
            }
            (Action::Resume, Outcome::Tried) => {
                if let Some(e) = entry {
                    e.phase = Phase::Resuming {
                        attempts: 0,
                        next_try: r.at,
                    };
                }
            }
            (Action::Resume, Outcome::Done | Outcome::Would | Outcome::Left | Outcome::GaveUp) => {
                self.nodes.remove(&r.node);
            }
            (Action::Release, _) => {
                // The brake counts from the release, the drains it lets go included.
                self.released_at = r.at;
                for e in self.nodes.values_mut() {
                    if matches!(e.phase, Phase::Held { .. }) {
                        self.drains.push((r.at, e.node.clone()));
                        e.phase = Phase::Draining {
                            attempts: 0,
                            next_try: r.at,
                        };
                    }
                }
            }
            _ => {}
        }
    }

    /// A webhook's or command's record: once per finding, tried until done or given up.
    fn apply_notice(&mut self, r: &Record, retry_max_s: u64) {
        let Some(finding) = &r.finding else { return };
        match r.outcome {
            Outcome::Tried => {
                self.notices.insert(
                    finding.clone(),
                    Notice {
                        finding: finding.clone(),
                        node: r.node.clone(),
                        action: r.action,
                        target: r.target.clone().unwrap_or_default(),
                        attempts: 0,
                        next_try: r.at,
                        last_error: None,
                    },
                );
            }
            Outcome::Failed => {
                if let Some(n) = self.notices.get_mut(finding) {
                    n.attempts += 1;
                    n.next_try = r.at + backoff_ns(n.attempts, retry_max_s);
                    n.last_error = Some(r.detail.clone());
                }
            }
            _ => {
                self.notices.remove(finding);
            }
        }
    }

    /// Nodes drained by railscope that the brake counts at `now`: since the window's start
    /// and the last release.
    pub(crate) fn drained_in_window(&self, now: u64, window_ns: u64) -> usize {
        let from = now.saturating_sub(window_ns).max(self.released_at);
        self.drains
            .iter()
            .filter(|(at, _)| *at >= from)
            .map(|(_, node)| node.as_str())
            .collect::<BTreeSet<_>>()
            .len()
    }

    /// The nodes held by the brake.
    pub(crate) fn held(&self) -> Vec<&NodeAction> {
        self.nodes
            .values()
            .filter(|e| matches!(e.phase, Phase::Held { .. }))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(
        seq: u64,
        node: &str,
        action: Action,
        outcome: Outcome,
        finding: Option<&str>,
    ) -> Record {
        Record {
            seq,
            at: seq * 1_000_000_000,
            node: node.into(),
            action,
            outcome,
            finding: finding.map(Into::into),
            finding_start: finding.map(|_| seq),
            rule: Some("gpu_xid".into()),
            dry_run: false,
            reason: Some("railscope: r".into()),
            detail: "d".into(),
            target: None,
        }
    }

    #[test]
    fn failures_back_off_and_a_drain_done_is_drained() {
        let mut s = ActionState::default();
        s.apply(&rec(1, "n1", Action::Drain, Outcome::Tried, Some("f1")), 60);
        s.apply(&rec(2, "n1", Action::Drain, Outcome::Failed, None), 60);
        s.apply(&rec(3, "n1", Action::Drain, Outcome::Failed, None), 60);
        assert_eq!(
            s.nodes["n1"].phase,
            Phase::Draining {
                attempts: 2,
                next_try: 3_000_000_000 + 2_000_000_000
            }
        );
        assert_eq!(s.nodes["n1"].last_error.as_deref(), Some("d"));
        s.apply(&rec(4, "n1", Action::Drain, Outcome::Done, None), 60);
        assert_eq!(
            s.nodes["n1"].phase,
            Phase::Drained {
                since: 4_000_000_000
            }
        );
        assert!(s.handled.contains("f1"));
        assert_eq!(s.watermark, 1);
        assert_eq!(s.seq, 4);
        assert_eq!(backoff_ns(10, 60), 60_000_000_000);
    }

    #[test]
    fn the_brake_counts_nodes_in_its_window_since_the_last_release() {
        let mut s = ActionState::default();
        s.apply(&rec(1, "n1", Action::Drain, Outcome::Tried, Some("f1")), 60);
        s.apply(&rec(2, "n2", Action::Drain, Outcome::Would, Some("f2")), 60);
        s.apply(&rec(3, "n3", Action::Drain, Outcome::Held, Some("f3")), 60);
        assert_eq!(s.drained_in_window(3_000_000_000, 10_000_000_000), 2);
        assert_eq!(s.drained_in_window(3_000_000_000, 1_500_000_000), 1);
        assert_eq!(s.held().len(), 1);
        s.apply(&rec(4, "-", Action::Release, Outcome::Released, None), 60);
        assert!(s.held().is_empty());
        assert!(matches!(s.nodes["n3"].phase, Phase::Draining { .. }));
        assert_eq!(s.drained_in_window(4_000_000_000, 10_000_000_000), 1);
    }

    #[test]
    fn a_resume_left_or_done_forgets_the_node_and_a_skip_leaves_another_action_alone() {
        let mut s = ActionState::default();
        s.apply(&rec(1, "n1", Action::Drain, Outcome::Tried, Some("f1")), 60);
        s.apply(&rec(2, "n1", Action::Drain, Outcome::Done, None), 60);
        s.apply(
            &rec(3, "n1", Action::Drain, Outcome::Skipped, Some("f0")),
            60,
        );
        assert!(s.nodes.contains_key("n1"));
        s.apply(&rec(4, "n1", Action::Resume, Outcome::Tried, None), 60);
        s.apply(
            &rec(5, "n1", Action::Drain, Outcome::Joined, Some("f2")),
            60,
        );
        assert!(matches!(s.nodes["n1"].phase, Phase::Draining { .. }));
        assert_eq!(s.nodes["n1"].findings.len(), 2);
        s.apply(&rec(6, "n1", Action::Resume, Outcome::Left, None), 60);
        assert!(s.nodes.is_empty());
        assert!(s.handled.contains("f0") && s.handled.contains("f2"));
    }
}
