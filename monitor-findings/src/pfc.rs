//! PFC pause storms on RoCE ports, from their netdevs' per-priority pause counters (mlx5's
//! ethtool statistics `rx_prio<N>_pause`, `tx_prio<N>_pause` and their `_pause_duration`,
//! which count microseconds). A port is in a storm when, on one priority and direction,
//!
//! - it sends or receives pause frames far faster than the fleet's ports do: more than
//!   `pfc-storm-factor` times the median rate of every port reporting that counter (at least
//!   three of them), and at least `pfc-storm-min-pps`; or
//! - it was paused for most of the last minute: the pause duration rose by more than
//!   `pfc-storm-paused-fraction` of the time its samples cover.
//!
//! `rx` pauses are the switch pausing this port (it cannot send: a congested or sick switch
//! port, or a storm from elsewhere spreading); `tx` pauses are this port pausing the switch
//! (its receive buffers are full: a NIC or host that cannot keep up). Thresholds:
//! [`Thresholds`](super::Thresholds), docs/findings.md.

use std::collections::{HashMap, HashSet};

use monitor_wire::names::metric;
use serde_json::json;

use super::{
    Observation, Severity, Subject,
    verdicts::Verdicts,
    view::{Track, TrackKey, View},
};

pub(crate) const RULE: &str = "pfc_pause_storm";
pub(crate) const RULES: &[&str] = &[RULE];

/// The series the rule reads: per priority (0-7) and direction, the pause frames and the
/// time paused.
pub(crate) const SERIES: &[&str] = &[
    metric::ETHTOOL_RX_PRIO0_PAUSE_TOTAL,
    metric::ETHTOOL_RX_PRIO0_PAUSE_DURATION_TOTAL,
    metric::ETHTOOL_TX_PRIO0_PAUSE_TOTAL,
    metric::ETHTOOL_TX_PRIO0_PAUSE_DURATION_TOTAL,
    metric::ETHTOOL_RX_PRIO1_PAUSE_TOTAL,
    metric::ETHTOOL_RX_PRIO1_PAUSE_DURATION_TOTAL,
    metric::ETHTOOL_TX_PRIO1_PAUSE_TOTAL,
    metric::ETHTOOL_TX_PRIO1_PAUSE_DURATION_TOTAL,
    metric::ETHTOOL_RX_PRIO2_PAUSE_TOTAL,
    metric::ETHTOOL_RX_PRIO2_PAUSE_DURATION_TOTAL,
    metric::ETHTOOL_TX_PRIO2_PAUSE_TOTAL,
    metric::ETHTOOL_TX_PRIO2_PAUSE_DURATION_TOTAL,
    metric::ETHTOOL_RX_PRIO3_PAUSE_TOTAL,
    metric::ETHTOOL_RX_PRIO3_PAUSE_DURATION_TOTAL,
    metric::ETHTOOL_TX_PRIO3_PAUSE_TOTAL,
    metric::ETHTOOL_TX_PRIO3_PAUSE_DURATION_TOTAL,
    metric::ETHTOOL_RX_PRIO4_PAUSE_TOTAL,
    metric::ETHTOOL_RX_PRIO4_PAUSE_DURATION_TOTAL,
    metric::ETHTOOL_TX_PRIO4_PAUSE_TOTAL,
    metric::ETHTOOL_TX_PRIO4_PAUSE_DURATION_TOTAL,
    metric::ETHTOOL_RX_PRIO5_PAUSE_TOTAL,
    metric::ETHTOOL_RX_PRIO5_PAUSE_DURATION_TOTAL,
    metric::ETHTOOL_TX_PRIO5_PAUSE_TOTAL,
    metric::ETHTOOL_TX_PRIO5_PAUSE_DURATION_TOTAL,
    metric::ETHTOOL_RX_PRIO6_PAUSE_TOTAL,
    metric::ETHTOOL_RX_PRIO6_PAUSE_DURATION_TOTAL,
    metric::ETHTOOL_TX_PRIO6_PAUSE_TOTAL,
    metric::ETHTOOL_TX_PRIO6_PAUSE_DURATION_TOTAL,
    metric::ETHTOOL_RX_PRIO7_PAUSE_TOTAL,
    metric::ETHTOOL_RX_PRIO7_PAUSE_DURATION_TOTAL,
    metric::ETHTOOL_TX_PRIO7_PAUSE_TOTAL,
    metric::ETHTOOL_TX_PRIO7_PAUSE_DURATION_TOTAL,
];

/// Rates and paused time are measured over the last minute of samples.
const WINDOW_NS: u64 = 60_000_000_000;
/// Ports a fleet's median is taken over at least.
const MIN_PORTS: usize = 3;

/// What a pause counter's name says: `<direction>_prio<priority>_pause[_duration]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct PauseCounter {
    direction: &'static str,
    priority: u8,
    duration: bool,
}

fn parse(name: &'static str) -> Option<PauseCounter> {
    let stat = name
        .strip_prefix(metric::ETHTOOL_PREFIX)?
        .strip_suffix("_total")?;
    let (direction, rest) = stat.split_once("_prio")?;
    let direction = match direction {
        "rx" => "rx",
        "tx" => "tx",
        _ => return None,
    };
    let (priority, kind) = rest.split_once('_')?;
    Some(PauseCounter {
        direction,
        priority: priority.parse().ok()?,
        duration: match kind {
            "pause" => false,
            "pause_duration" => true,
            _ => return None,
        },
    })
}

/// A port's identity borrowed from a series key (a [`Subject`] is made for a finding only).
fn port_id(key: &TrackKey) -> (&str, Option<&str>, Option<&str>) {
    let labels = &key.1.labels;
    (&key.0, labels.get("device"), labels.get("port"))
}

fn port_of(key: &TrackKey) -> Option<Subject> {
    let device = key.1.labels.get("device")?;
    let port = key.1.labels.get("port")?.parse().ok()?;
    Some(Subject::port(&key.0, device, port))
}

/// What made a port's storm, one priority and direction.
struct Storm<'a> {
    subject: Subject,
    track: &'a Track,
    summary: String,
    evidence: serde_json::Value,
    /// How far past its threshold (to pick a port's strongest).
    excess: f64,
}

pub(crate) fn evaluate(view: &View, out: &mut Verdicts) {
    let th = view.th;
    let mut storms: Vec<Storm> = Vec::new();
    // A port is judged when every pause counter it reports could be: a storm seen on one
    // counter is not gone because another says nothing.
    let mut judged: Vec<&TrackKey> = Vec::new();
    let mut undecided: HashSet<(&str, Option<&str>, Option<&str>)> = HashSet::new();

    for &name in SERIES {
        let Some(counter) = parse(name) else { continue };
        let PauseCounter {
            direction,
            priority,
            duration,
        } = counter;
        if duration {
            for (key, track) in view.named(name) {
                let open = out.is_open(RULE, &key.0);
                let Some((us, span)) = track.increase(WINDOW_NS) else {
                    if open {
                        undecided.insert(port_id(key));
                    }
                    continue;
                };
                if open {
                    judged.push(key);
                }
                let Some(subject) = port_of(key) else {
                    continue;
                };
                let fraction = us as f64 / 1e6 / span;
                if fraction > th.pfc_storm_paused_fraction {
                    storms.push(Storm {
                        subject,
                        track,
                        summary: format!(
                            "paused {:.0} % of the last {span:.0} s on priority {priority} ({direction}; threshold {:.0} %)",
                            fraction * 100.0,
                            th.pfc_storm_paused_fraction * 100.0
                        ),
                        evidence: json!({
                            "priority": priority, "direction": direction,
                            "paused_fraction": fraction, "window_s": span,
                            "threshold": th.pfc_storm_paused_fraction,
                        }),
                        excess: fraction / th.pfc_storm_paused_fraction,
                    });
                }
            }
            continue;
        }
        let mut rates: Vec<(&TrackKey, &Track, f64)> = Vec::new();
        for (k, t) in view.named(name) {
            match t.rate(WINDOW_NS) {
                Some(rate) => rates.push((k, t, rate)),
                None if out.is_open(RULE, &k.0) => {
                    undecided.insert(port_id(k));
                }
                None => {}
            }
        }
        if rates.len() < MIN_PORTS {
            undecided.extend(
                rates
                    .iter()
                    .filter(|r| out.is_open(RULE, &r.0.0))
                    .map(|r| port_id(r.0)),
            );
            continue;
        }
        let values: Vec<f64> = rates.iter().map(|r| r.2).collect();
        let Some(median) = crate::robust::median(&values) else {
            continue;
        };
        let bar = (median * th.pfc_storm_factor).max(th.pfc_storm_min_pps);
        for (key, track, rate) in rates {
            if out.is_open(RULE, &key.0) {
                judged.push(key);
            }
            if rate > bar
                && let Some(subject) = port_of(key)
            {
                storms.push(Storm {
                    subject,
                    track,
                    summary: format!(
                        "{rate:.0} pause frames/s on priority {priority} ({direction}), the fleet's median {median:.0}/s (threshold {}× and {}/s)",
                        th.pfc_storm_factor, th.pfc_storm_min_pps
                    ),
                    evidence: json!({
                        "priority": priority, "direction": direction,
                        "pause_per_s": rate, "fleet_median": median, "ports": values.len(),
                        "factor": th.pfc_storm_factor, "min_pps": th.pfc_storm_min_pps,
                    }),
                    excess: rate / bar,
                });
            }
        }
    }
    for key in judged {
        if !undecided.contains(&port_id(key)) {
            out.judged(RULE, &key.0, || port_of(key));
        }
    }
    // One finding per port: its strongest storm, with every priority and direction found.
    let mut by_port: HashMap<Subject, Vec<Storm>> = HashMap::new();
    for storm in storms {
        by_port
            .entry(storm.subject.clone())
            .or_default()
            .push(storm);
    }
    for (subject, mut found) in by_port {
        found.sort_by(|a, b| b.excess.total_cmp(&a.excess));
        let all: Vec<serde_json::Value> = found.iter().map(|s| s.evidence.clone()).collect();
        let strongest = &found[0];
        let mut evidence = strongest.evidence.clone();
        evidence["storms"] = serde_json::Value::Array(all);
        out.push(Observation {
            rule: RULE,
            severity: Severity::Warning,
            subject,
            job_id: None,
            at_ns: strongest.track.latest.unix_ns,
            summary: strongest.summary.clone(),
            evidence,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_series_is_a_pause_counter_of_a_priority_and_direction() {
        let parsed: Vec<PauseCounter> = SERIES.iter().filter_map(|n| parse(n)).collect();
        assert_eq!(parsed.len(), 32);
        assert_eq!(
            parse(metric::ETHTOOL_TX_PRIO3_PAUSE_DURATION_TOTAL),
            Some(PauseCounter {
                direction: "tx",
                priority: 3,
                duration: true
            })
        );
        assert_eq!(parse(metric::ETHTOOL_RX_PRIO3_MARKED_TOTAL), None);
    }
}
