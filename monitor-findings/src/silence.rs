//! `node_silent`: a node whose agent stopped sending. Its other findings are not seen again
//! because nothing comes, not because their condition is gone, so the store keeps them open,
//! marked stale ([`super::FindingsStore::set_silent`]), and no action resumes the node on
//! silence; this finding says the node is silent, since when, and ends when a frame comes.

use std::sync::Arc;

use serde_json::json;

use super::{Observation, Severity, Subject, verdicts::Verdicts};

pub(crate) const RULE: &str = "node_silent";
pub(crate) const RULES: &[&str] = &[RULE];

/// One finding per node in `silent` (node, when a frame last came, Unix ns), dated by that
/// last frame: the same id whenever the silence is judged.
pub(crate) fn evaluate(
    silent: &[(Arc<str>, u64)],
    silent_after_s: u64,
    now_ns: u64,
    out: &mut Verdicts,
) {
    for (node, heard) in silent {
        let for_s = now_ns.saturating_sub(*heard) as f64 / 1e9;
        out.push(Observation {
            rule: RULE,
            severity: Severity::Warning,
            subject: Subject::node(node),
            job_id: None,
            at_ns: *heard,
            summary: format!(
                "no frame from the node's agent for {for_s:.0} s (more than {silent_after_s} s): \
                 its other findings are kept as they were, marked stale"
            ),
            evidence: json!({
                "last_heard": heard,
                "silent_for_s": for_s,
                "silent_after_s": silent_after_s,
            }),
        });
    }
}
