//! Each node's clock against the collector's, as its agent estimates it from the
//! acknowledgements' round trips (`railscope_agent_clock_offset_seconds`, the node's clock
//! minus the collector's, and `railscope_agent_clock_offset_error_seconds`, the bound of its
//! error; docs/agent.md, "Clock offset"), and `clock_skew`: a node whose clock is certainly
//! further than `clock-skew-ms` from the collector's.
//!
//! Why it matters: the kernel timestamps of different nodes' events are compared (a switch's
//! burst of port DOWN transitions, `fabric_upstream_down`), and findings start at their
//! data's own times. The fabric grouping puts each node's transitions on the collector's
//! clock with these estimates ([`NodeClock::on_collector_clock`]); a node whose estimate is
//! unknown or too uncertain is compared on its own clock, which only a synchronised clock
//! makes right. A node found skewed has a broken time service (NTP, chrony, PTP).

use std::{collections::HashMap, sync::Arc};

use monitor_wire::names::metric;
use serde_json::json;

use super::{
    Observation, Severity, Subject,
    verdicts::Verdicts,
    view::{NodeClock, Track, TrackKey, View},
};

pub(crate) const RULE: &str = "clock_skew";
pub(crate) const RULES: &[&str] = &[RULE];
/// The agent's estimate and its error bound (one series each per node, no labels).
pub(crate) const SERIES: &[&str] = &[
    metric::AGENT_CLOCK_OFFSET_SECONDS,
    metric::AGENT_CLOCK_OFFSET_ERROR_SECONDS,
];

const MS: f64 = 1e6;

/// Each node's clock, from the tracks of the agent's two gauges (`offsets` and `errors`: the
/// tracks named [`SERIES`]). A node with one of the two, or a value that is not a finite
/// number, has none.
pub(crate) fn clocks<'a>(
    offsets: impl Iterator<Item = (&'a TrackKey, &'a Track)>,
    errors: impl Iterator<Item = (&'a TrackKey, &'a Track)>,
) -> HashMap<Arc<str>, NodeClock> {
    let seconds = |t: &Track| t.gauge().filter(|v| v.is_finite());
    let errors: HashMap<&Arc<str>, f64> = errors
        .filter_map(|(k, t)| Some((&k.0, seconds(t)?)))
        .collect();
    offsets
        .filter_map(|(k, t)| {
            let offset = seconds(t)?;
            let error = *errors.get(&k.0)?;
            Some((
                k.0.clone(),
                NodeClock {
                    offset_ns: (offset * 1e9).round() as i64,
                    error_ns: (error.max(0.0) * 1e9).round() as u64,
                    at_ns: t.latest.unix_ns,
                },
            ))
        })
        .collect()
}

/// What the rule makes of one node's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Further from the collector's than the threshold, even at the near end of the bound.
    Skewed,
    /// Within the threshold, even at the far end of the bound.
    NotSkewed,
    /// No estimate, or one too uncertain to say either.
    CannotTell,
}

/// The rule's one decision, per node: `clock` against `threshold_ns`.
pub(crate) fn judge(clock: Option<&NodeClock>, threshold_ns: u64) -> Verdict {
    let Some(c) = clock else {
        return Verdict::CannotTell;
    };
    let off = c.offset_ns.unsigned_abs();
    if off.saturating_sub(c.error_ns) > threshold_ns {
        Verdict::Skewed
    } else if off.saturating_add(c.error_ns) <= threshold_ns {
        Verdict::NotSkewed
    } else {
        Verdict::CannotTell
    }
}

pub(crate) fn evaluate(view: &View, out: &mut Verdicts) {
    let threshold_ms = view.th.clock_skew_ms;
    let clocks = clocks(view.named(SERIES[0]), view.named(SERIES[1]));
    let mut nodes: Vec<(&Arc<str>, &NodeClock)> = clocks.iter().collect();
    nodes.sort_by_key(|(n, _)| *n);
    for (node, clock) in nodes {
        match judge(Some(clock), threshold_ms * 1_000_000) {
            Verdict::CannotTell => continue,
            Verdict::NotSkewed => {
                out.judged_node(RULE, node);
                continue;
            }
            Verdict::Skewed => out.judged_node(RULE, node),
        }
        let (offset_ms, error_ms) = (clock.offset_ns as f64 / MS, clock.error_ns as f64 / MS);
        let way = if clock.offset_ns > 0 {
            "ahead of"
        } else {
            "behind"
        };
        out.push(Observation {
            rule: RULE,
            severity: Severity::Warning,
            subject: Subject::node(node),
            job_id: None,
            at_ns: clock.on_collector_clock(clock.at_ns),
            summary: format!(
                "clock {:.1} ms {way} the collector's (within {error_ms:.3} ms; threshold {threshold_ms} ms): check its time service",
                offset_ms.abs()
            ),
            evidence: json!({
                "offset_ms": offset_ms,
                "error_ms": error_ms,
                "threshold_ms": threshold_ms,
            }),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn clock(offset_ms: i64, error_ms: u64) -> NodeClock {
        NodeClock {
            offset_ns: offset_ms * MS as i64,
            error_ns: error_ms * MS,
            at_ns: 0,
        }
    }

    #[test]
    fn skewed_only_when_certainly_beyond_the_threshold_either_way() {
        let th = 25 * MS;
        assert_eq!(judge(Some(&clock(3000, 1)), th), Verdict::Skewed);
        assert_eq!(judge(Some(&clock(-3000, 1)), th), Verdict::Skewed);
        assert_eq!(judge(Some(&clock(30, 4)), th), Verdict::Skewed);
        // 30 ms within 10: it may be 20.
        assert_eq!(judge(Some(&clock(30, 10)), th), Verdict::CannotTell);
        assert_eq!(judge(Some(&clock(-2, 1)), th), Verdict::NotSkewed);
        assert_eq!(judge(Some(&clock(20, 5)), th), Verdict::NotSkewed);
        assert_eq!(judge(Some(&clock(20, 6)), th), Verdict::CannotTell);
        assert_eq!(judge(None, th), Verdict::CannotTell);
    }

    #[test]
    fn a_node_time_on_the_collector_clock_takes_the_offset_off() {
        let c = clock(3000, 1);
        assert_eq!(c.on_collector_clock(10_000 * MS), 7_000 * MS);
        assert_eq!(clock(-5, 1).on_collector_clock(10 * MS), 15 * MS);
        assert_eq!(c.on_collector_clock(0), 0);
    }
}
