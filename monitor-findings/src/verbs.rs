//! Verb rules, per job on each node: QPs moving to ERR and rdma_cm rejects, from the probes'
//! verb counters (`railscope_rdma_verbs_total`, per cgroup, with the job's `job_id`).
//!
//! A connection closed the ordinary way moves its QPs to ERR too: `rdma_disconnect` does it on
//! each side, and each side gets a `DISCONNECTED` rdma_cm event. So the QPs counted are those
//! moved to ERR less the job's `DISCONNECTED` events in the window: what a teardown does not
//! explain (a transport error, a retry exhausted, a link that went away under the QP).

use std::collections::BTreeMap;

use monitor_wire::names::metric;
use serde_json::json;

use super::{Observation, Severity, Subject, verdicts::Verdicts, view::View};

pub(crate) const RULES: &[&str] = &["verbs_qp_error", "verbs_cm_reject"];

pub(crate) const SERIES: &str = metric::RDMA_VERBS_TOTAL;

const S: u64 = 1_000_000_000;

/// The job's closed rdma_cm connections, summed beside the rules to discount QPs moved to ERR.
const DISCONNECTS: &str = "cm_disconnects";

/// Per (rule, node, job or cgroup): the increase, when it began, the `job_id`, the cgroups.
type Sum = (u64, u64, Option<String>, Vec<String>);

pub(crate) fn evaluate(view: &View, out: &mut Verdicts) {
    let th = view.th;
    let window = th.verbs_window_s * S;
    // (rule, node, job or cgroup) → (increase, when it began, job_id, cgroups)
    let mut sums: BTreeMap<(&'static str, String, String), Sum> = BTreeMap::new();
    for (key, track) in view.named(SERIES) {
        let labels = &key.1.labels;
        let rule = match (labels.get("verb"), labels.get("detail")) {
            (Some("modify_qp"), Some("ERR")) => "verbs_qp_error",
            (Some("cm_reject"), _) => "verbs_cm_reject",
            (Some("cm_event"), Some("DISCONNECTED")) => DISCONNECTS,
            _ => continue,
        };
        let Some((n, _)) = track.increase(window) else {
            continue;
        };
        let who = || {
            labels.get("job_id").map_or_else(
                || format!("cgroup:{}", labels.get("cgroup").unwrap_or("")),
                str::to_owned,
            )
        };
        if rule != DISCONNECTS {
            out.judged(rule, &key.0, || Some(Subject::job(&key.0, &who())));
        }
        if n == 0 {
            continue;
        }
        let job = labels.get("job_id").map(str::to_owned);
        let cgroup = labels.get("cgroup").unwrap_or("").to_owned();
        let who = who();
        let e = sums
            .entry((rule, key.0.to_string(), who))
            .or_insert((0, 0, job, Vec::new()));
        e.0 += n;
        // Dated at the first rise of any of its series in the window.
        let at = track.first_rise(window).unwrap_or(track.latest.unix_ns);
        e.1 = if e.1 == 0 { at } else { e.1.min(at) };
        if !e.3.contains(&cgroup) {
            e.3.push(cgroup);
        }
    }
    for ((rule, node, who), (n, at, job, cgroups)) in &sums {
        let (rule, node, who, at) = (*rule, node.clone(), who.clone(), *at);
        let (threshold, what) = match rule {
            DISCONNECTS => continue,
            "verbs_qp_error" => (th.qp_errors, "QPs moved to ERR"),
            _ => (th.cm_rejects, "rdma_cm rejects"),
        };
        let disconnects = (rule == "verbs_qp_error")
            .then(|| sums.get(&(DISCONNECTS, node.clone(), who.clone())))
            .flatten()
            .map_or(0, |d| d.0);
        let n = n.saturating_sub(disconnects);
        if n < threshold {
            continue;
        }
        out.push(Observation {
            rule,
            severity: Severity::Warning,
            subject: Subject::job(&node, &who),
            job_id: job.clone(),
            at_ns: at,
            summary: format!("{n} {what} for {who} in the last {} s", th.verbs_window_s),
            evidence: json!({"count": n, "window_s": th.verbs_window_s, "threshold": threshold,
                             "disconnects": disconnects, "cgroups": cgroups}),
        });
    }
}
