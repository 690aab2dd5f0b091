//! IB and RoCE link rules: a port down and flapping (from the kernel's port events, and for a
//! port down the state samples as they arrive), symbol errors, link error recovery,
//! `link_downed` increments, a port below its expected width or speed, phys state off LinkUp,
//! and RoCE congestion far above the fleet's norm. Thresholds and their
//! sources: [`Thresholds`](super::Thresholds), docs/findings.md.

use std::collections::HashMap;

use monitor_wire::names::metric;
use serde_json::json;

use super::{
    Observation, Severity, Subject, Thresholds,
    fabric::{self, Blame, Grouping},
    topology::PortKey,
    verdicts::Verdicts,
    view::{DownSince, DownSource, EventState, Place, Track, TrackKey, View},
};

pub(crate) const RULES: &[&str] = &[
    PORT_DOWN,
    "ib_link_flapping",
    "ib_symbol_errors",
    "ib_link_error_recovery",
    "ib_link_downed",
    "ib_port_degraded",
    "ib_phys_state",
    "roce_congestion",
];

/// A port that went down, found from its DOWN transition (or state sample) at once.
pub(crate) const PORT_DOWN: &str = "ib_port_down";

const SYMBOL_ERROR: &str = metric::IB_SYMBOL_ERROR_TOTAL;
const LINK_ERROR_RECOVERY: &str = metric::IB_LINK_ERROR_RECOVERY_TOTAL;
const LINK_DOWNED: &str = metric::IB_LINK_DOWNED_TOTAL;
const STATE: &str = metric::IB_PORT_STATE;
const PHYS_STATE: &str = metric::IB_PORT_PHYS_STATE;
const WIDTH: &str = metric::IB_PORT_WIDTH_LANES;
const RATE: &str = metric::IB_PORT_RATE_GBPS;
const CNP_SENT: &str = metric::IB_NP_CNP_SENT_TOTAL;

/// The series these rules read.
pub(crate) const SERIES: &[&str] = &[
    SYMBOL_ERROR,
    LINK_ERROR_RECOVERY,
    LINK_DOWNED,
    STATE,
    PHYS_STATE,
    WIDTH,
    RATE,
    CNP_SENT,
    // A port's class for ib_port_degraded.
    metric::IB_PORT_LINK_LAYER_INFO,
    metric::RDMA_DEVICE_INFO,
];

/// Rates are measured over the last minute of samples.
const RATE_WINDOW_NS: u64 = 60_000_000_000;
const S: u64 = 1_000_000_000;
/// `state` ACTIVE, `phys_state` LinkUp and Disabled.
const ACTIVE: f64 = 4.0;
const LINK_UP: f64 = 5.0;
const DISABLED: f64 = 3.0;

fn port_of(key: &TrackKey) -> Option<Subject> {
    let device = key.1.labels.get("device")?;
    let port = key.1.labels.get("port")?.parse().ok()?;
    Some(Subject::port(&key.0, device, port))
}

/// Maps of a tick's ports, by their [`Place`] (a [`Subject`] is made for a finding only: the
/// fleet has 100,000 ports at 12,500 nodes).
type PortMap<V> = HashMap<Place, V, foldhash::fast::RandomState>;

fn phys_name(v: f64) -> &'static str {
    match v as i64 {
        1 => "Sleep",
        2 => "Polling",
        3 => "Disabled",
        4 => "PortConfigurationTraining",
        5 => "LinkUp",
        6 => "LinkErrorRecovery",
        7 => "PhyTest",
        _ => "unknown",
    }
}

/// A port down now: from its DOWN transition (the kernel's port event) until its UP one, or
/// from a `railscope_ib_port_state` sample saying DOWN (a port already down when the agent
/// started) until one saying ACTIVE. Blamed like the other port findings on what its DOWN
/// transition is ([`fabric`]): pending until its burst is judged, then the node's or the
/// upstream finding's.
pub(crate) fn evaluate_port_down(
    events: &EventState,
    grouping: &Grouping,
    now_ns: u64,
    out: &mut Vec<Observation>,
) {
    for (key, port_now) in &events.ports {
        let Some(down) = &port_now.down else {
            continue;
        };
        out.push(port_down(events, grouping, key, down, now_ns));
    }
}

/// The down periods that closed since the rules last took them (`events.closed`, drained),
/// each the finding it is with when it ended (the UP's time): the same findings whatever
/// pace the events came at.
pub(crate) fn closed_port_downs(
    events: &mut EventState,
    grouping: &Grouping,
    now_ns: u64,
) -> Vec<(Observation, u64)> {
    let closed = std::mem::take(&mut events.closed);
    closed
        .into_iter()
        .map(|(key, down, up_ns)| {
            let o = port_down(events, grouping, &key, &down, now_ns);
            (o, up_ns.max(down.at_ns))
        })
        .collect()
}

/// The `ib_port_down` observation of `key` down since `down`.
fn port_down(
    events: &EventState,
    grouping: &Grouping,
    key: &PortKey,
    down: &DownSince,
    now_ns: u64,
) -> Observation {
    let (node, device, port) = key;
    let port_now = events.ports.get(key);
    let phys = port_now.and_then(|p| p.phys_state).map(|(_, v)| v);
    let disabled = phys == Some(DISABLED);
    let (how, source, from) = match &down.source {
        DownSource::Event { from } => ("went DOWN (port event)", "port_transition", Some(from)),
        DownSource::Sample => ("is DOWN (port state)", STATE, None),
    };
    let mut evidence = json!({
        "state": "DOWN",
        "down_at": down.at_ns,
        "source": source,
        "from": from,
        "phys_state": phys,
        "phys_state_name": phys.map(phys_name),
    });
    let blamed = grouping.upstream_of(events.downs.get(key), key, down.at_ns, down.at_ns, now_ns);
    fabric::mark(&mut evidence, blamed, down.at_ns);
    Observation {
        rule: PORT_DOWN,
        // A port an operator disabled is no fault, as for `ib_phys_state`.
        severity: if disabled {
            Severity::Info
        } else {
            Severity::Critical
        },
        subject: Subject::port(node, device, *port),
        job_id: None,
        at_ns: down.at_ns,
        summary: format!(
            "{device}/{port} {how}{}",
            if disabled {
                ", phys state Disabled"
            } else {
                ""
            }
        ),
        evidence,
    }
}

/// Flapping: the port's own DOWN transitions (the kernel's port events) within the window;
/// those of an upstream burst or a burst not judged yet do not count ([`fabric`]).
pub(crate) fn evaluate_events(
    events: &EventState,
    grouping: &Grouping,
    now_ns: u64,
    th: &Thresholds,
    out: &mut Vec<Observation>,
) {
    let from = now_ns.saturating_sub(th.flap_window_s * S);
    for (key, downs) in &events.downs {
        let (node, device, port) = key;
        let mut recent: Vec<u64> = Vec::new();
        let mut upstream = 0;
        for d in downs.iter().filter(|d| d.at_ns >= from) {
            match grouping.blame(key, d.at_ns) {
                Blame::Own => recent.push(d.at_ns),
                Blame::Upstream(_) => upstream += 1,
                Blame::Pending => {}
            }
        }
        if recent.len() < th.flap_downs as usize {
            continue;
        }
        recent.sort_unstable();
        // The episode starts at the first down of the window.
        let at = recent[0];
        out.push(Observation {
            rule: "ib_link_flapping",
            severity: Severity::Critical,
            subject: Subject::port(node, device, *port),
            job_id: None,
            at_ns: at,
            summary: format!(
                "{device}/{port} went down {} times in the last {} s (threshold {})",
                recent.len(),
                th.flap_window_s,
                th.flap_downs
            ),
            evidence: json!({
                "downs": recent.len(),
                "window_s": th.flap_window_s,
                "threshold": th.flap_downs,
                "first_down": recent[0],
                "last_down": recent[recent.len() - 1],
                "upstream_downs": upstream,
            }),
        });
    }
}

pub(crate) fn evaluate_series(
    view: &View,
    events: &EventState,
    grouping: &Grouping,
    out: &mut Verdicts,
) {
    let th = view.th;
    let key_of = |s: &Subject| -> PortKey {
        (
            s.node.clone(),
            s.device.clone().unwrap_or_default(),
            s.port.unwrap_or(0),
        )
    };
    let port_gauge = |name: &'static str| -> PortMap<(&TrackKey, &Track)> {
        view.placed(name)
            .filter_map(|(k, t, p)| Some((p.port?, (k, t))))
            .collect()
    };
    let states = port_gauge(STATE);
    let active = |p: &Place| states.get(p).and_then(|(_, t)| t.gauge()) == Some(ACTIVE);

    // Each loop asks its track first and makes the port's subject only for a finding.
    for (key, track) in view.named(SYMBOL_ERROR) {
        let hour = track.increase(3600 * S);
        let rate = track.rate(RATE_WINDOW_NS);
        if hour.is_some() || rate.is_some() {
            out.judged("ib_symbol_errors", &key.0, || port_of(key));
        }
        let (severity, what) = match (hour, rate) {
            (Some((n, span)), _) if n > th.symbol_errors_per_hour => (
                Severity::Critical,
                format!(
                    "{n} symbol errors in the last {span:.0} s (threshold {} per hour)",
                    th.symbol_errors_per_hour
                ),
            ),
            (_, Some(r)) if r > th.symbol_errors_per_s => (
                Severity::Warning,
                format!(
                    "{r:.1} symbol errors/s (threshold {}/s)",
                    th.symbol_errors_per_s
                ),
            ),
            _ => continue,
        };
        let Some(subject) = port_of(key) else {
            continue;
        };
        let window = if matches!(severity, Severity::Critical) {
            3600 * S
        } else {
            RATE_WINDOW_NS
        };
        out.push(rise_observation(
            "ib_symbol_errors",
            severity,
            subject,
            track,
            window,
            what,
            json!({
                "per_s": rate,
                "last_hour": hour.map(|h| h.0),
                "threshold_per_s": th.symbol_errors_per_s,
                "threshold_per_hour": th.symbol_errors_per_hour,
            }),
        ));
    }

    for (key, track) in view.named(LINK_ERROR_RECOVERY) {
        let Some((n, span)) = track.increase(RATE_WINDOW_NS) else {
            continue;
        };
        out.judged("ib_link_error_recovery", &key.0, || port_of(key));
        let per_min = n as f64 * 60.0 / span.max(60.0);
        if per_min > th.link_error_recovery_per_min
            && let Some(subject) = port_of(key)
        {
            out.push(rise_observation(
                "ib_link_error_recovery",
                Severity::Warning,
                subject,
                track,
                RATE_WINDOW_NS,
                format!(
                    "{per_min:.1} link error recoveries/min (threshold {}/min)",
                    th.link_error_recovery_per_min
                ),
                json!({"per_min": per_min, "threshold_per_min": th.link_error_recovery_per_min}),
            ));
        }
    }

    for (key, track) in view.named(LINK_DOWNED) {
        let Some((n, span)) = track.increase(th.link_downed_hold_s * S) else {
            continue;
        };
        out.judged("ib_link_downed", &key.0, || port_of(key));
        if n > 0
            && let Some(subject) = port_of(key)
        {
            let port = key_of(&subject);
            let mut o = rise_observation(
                "ib_link_downed",
                Severity::Critical,
                subject,
                track,
                th.link_downed_hold_s * S,
                format!("link_downed rose by {n} in the last {span:.0} s"),
                json!({"increase": n, "window_s": span, "value": track.counter()}),
            );
            let from = view.now_ns.saturating_sub(th.link_downed_hold_s * S);
            let blamed =
                grouping.upstream_of(events.downs.get(&port), &port, from, o.at_ns, view.now_ns);
            fabric::mark(&mut o.evidence, blamed, from);
            out.push(o);
        }
    }

    let widths = port_gauge(WIDTH);
    let rates = port_gauge(RATE);
    // Each port is judged against its class: its link layer, its device's model and board,
    // and its number. A DGX A100's eight 200 Gb/s InfiniBand compute ports and its 100 GbE
    // storage ports are classes of their own; against the fleet's one most common rate every
    // node's storage ports were "degraded".
    let layers: PortMap<&str> = view
        .placed(metric::IB_PORT_LINK_LAYER_INFO)
        .filter_map(|(k, _, p)| Some((p.port?, k.1.labels.get("link_layer")?)))
        .collect();
    let boards: HashMap<(&str, &str), (&str, &str)> = view
        .named(metric::RDMA_DEVICE_INFO)
        .filter_map(|(k, _)| {
            let labels = &k.1.labels;
            let model = (
                labels.get("hca_type").unwrap_or_default(),
                labels.get("board_id").unwrap_or_default(),
            );
            Some(((&*k.0, labels.get("device")?), model))
        })
        .collect();
    let mut by_class: HashMap<_, (Vec<f64>, Vec<f64>)> = HashMap::new();
    for (place, &(key, track)) in widths.iter().filter(|(p, _)| active(p)) {
        let class = by_class
            .entry(port_class(place, key, &layers, &boards))
            .or_default();
        class.0.extend(track.gauge());
        class
            .1
            .extend(rates.get(place).and_then(|(_, t)| t.gauge()));
    }
    let expected: HashMap<_, (Option<f64>, Option<f64>)> = by_class
        .into_iter()
        .map(|(class, (w, r))| {
            let width = th.expected_width_lanes.or_else(|| mode(w.into_iter()));
            let rate = th.expected_rate_gbps.or_else(|| mode(r.into_iter()));
            (class, (width, rate))
        })
        .collect();
    for (place, &(key, track)) in &widths {
        if !active(place) {
            // Known not to run at all (ib_port_down's, ib_phys_state's): not degraded.
            if states.get(place).and_then(|(_, t)| t.gauge()).is_some() {
                out.judged("ib_port_degraded", &key.0, || port_of(key));
            }
            continue;
        }
        let (expected_width, expected_rate) = expected[&port_class(place, key, &layers, &boards)];
        let width = track.gauge();
        let rate = rates.get(place).and_then(|(_, t)| t.gauge());
        // Its class includes it: with its width and rate known, so are the class's.
        if width.is_some() && rate.is_some() {
            out.judged("ib_port_degraded", &key.0, || port_of(key));
        }
        let narrow = matches!((width, expected_width), (Some(w), Some(e)) if w < e);
        let slow = matches!((rate, expected_rate), (Some(r), Some(e)) if r < e);
        if narrow || slow {
            let Some(subject) = port_of(key) else {
                continue;
            };
            out.push(observation(
                "ib_port_degraded",
                Severity::Warning,
                subject.clone(),
                track,
                format!(
                    "{}/{} runs at {}x {} Gb/s, expected {}x {} Gb/s",
                    subject.device.as_deref().unwrap_or("?"),
                    subject.port.unwrap_or(0),
                    width.unwrap_or(f64::NAN),
                    rate.unwrap_or(f64::NAN),
                    expected_width.unwrap_or(f64::NAN),
                    expected_rate.unwrap_or(f64::NAN),
                ),
                json!({
                    "width_lanes": width, "rate_gbps": rate,
                    "expected_width_lanes": expected_width, "expected_rate_gbps": expected_rate,
                }),
            ));
        }
    }

    for (key, track) in view.named(PHYS_STATE) {
        let Some(phys) = track.gauge() else { continue };
        if phys == LINK_UP {
            out.judged("ib_phys_state", &key.0, || port_of(key));
            continue;
        }
        let Some(subject) = port_of(key) else {
            continue;
        };
        // Held since the value last changed as the engine saw it, or since the port's last
        // DOWN transition: the engine sees the latest sample only, so two down episodes with
        // an UP between them would otherwise look like one long one.
        let port = key_of(&subject);
        let downs = events.downs.get(&port);
        let last_down = downs
            .and_then(|d| d.iter().map(|d| d.at_ns).max())
            .unwrap_or(0);
        let since = track.changed_ns.max(last_down);
        let held = track.latest.unix_ns.saturating_sub(since);
        // Within its grace nothing can be told yet (a blip, or a state a restart saw anew).
        if held < th.phys_state_grace_s * S {
            continue;
        }
        out.judged("ib_phys_state", &key.0, || Some(subject.clone()));
        // Blamed on what its last DOWN transition is blamed on.
        let blamed = grouping.upstream_of(downs, &port, last_down.max(1), since, view.now_ns);
        let mut evidence = json!({"phys_state": phys, "name": phys_name(phys), "for_s": held as f64 / 1e9,
                                  "grace_s": th.phys_state_grace_s});
        fabric::mark(&mut evidence, blamed, last_down.max(1));
        out.push(Observation {
            rule: "ib_phys_state",
            severity: if phys == DISABLED {
                Severity::Info
            } else {
                Severity::Critical
            },
            summary: format!(
                "phys state {} ({phys}) for {:.0} s",
                phys_name(phys),
                held as f64 / 1e9
            ),
            evidence,
            subject,
            job_id: None,
            at_ns: since,
        });
    }

    congestion(view, out);
}

/// RoCE congestion: CNPs sent per second by each port, scored against all ports of the fleet
/// with a robust z-score (median and MAD), so the congested ports cannot pull the norm.
fn congestion(view: &View, out: &mut Verdicts) {
    let th = view.th;
    let rates: Vec<(&TrackKey, &Track, f64)> = view
        .placed(CNP_SENT)
        .filter(|(_, _, p)| p.port.is_some())
        .filter_map(|(k, t, _)| Some((k, t, t.rate(RATE_WINDOW_NS)?)))
        .collect();
    if rates.len() < 3 {
        return;
    }
    let values: Vec<f64> = rates.iter().map(|r| r.2).collect();
    let Some(norm) = crate::robust::Norm::of(&values, 1.0) else {
        return;
    };
    for (key, track, rate) in rates {
        out.judged("roce_congestion", &key.0, || port_of(key));
        let score = norm.score(rate);
        if score > th.congestion_score
            && rate >= th.congestion_min_cnp_per_s
            && let Some(subject) = port_of(key)
        {
            out.push(observation(
                "roce_congestion",
                Severity::Warning,
                subject,
                track,
                format!(
                    "{rate:.0} CNPs/s sent, the fleet's median {:.0}/s (score {score:.1}, threshold {})",
                    norm.median, th.congestion_score
                ),
                json!({"cnp_per_s": rate, "fleet_median": norm.median, "fleet_mad": norm.mad,
                       "score": score, "threshold": th.congestion_score,
                       "min_cnp_per_s": th.congestion_min_cnp_per_s, "ports": values.len()}),
            ));
        }
    }
}

fn observation(
    rule: &'static str,
    severity: Severity,
    subject: Subject,
    track: &Track,
    summary: String,
    evidence: serde_json::Value,
) -> Observation {
    Observation {
        rule,
        severity,
        subject,
        job_id: None,
        at_ns: track.latest.unix_ns,
        summary,
        evidence,
    }
}

/// [`observation`] of a counter rule, dated at the counter's first rise within `window_ns` of
/// its samples: the same samples give the same start, whenever they arrived.
fn rise_observation(
    rule: &'static str,
    severity: Severity,
    subject: Subject,
    track: &Track,
    window_ns: u64,
    summary: String,
    evidence: serde_json::Value,
) -> Observation {
    Observation {
        at_ns: track.first_rise(window_ns).unwrap_or(track.latest.unix_ns),
        ..observation(rule, severity, subject, track, summary, evidence)
    }
}

/// A port's class for `ib_port_degraded`: its link layer, its device's (model, board) and its
/// port number; "" where the node does not say.
type PortClass<'a> = (&'a str, (&'a str, &'a str), &'a str);

fn port_class<'a>(
    place: &Place,
    key: &'a TrackKey,
    layers: &PortMap<&'a str>,
    boards: &HashMap<(&'a str, &'a str), (&'a str, &'a str)>,
) -> PortClass<'a> {
    let labels = &key.1.labels;
    let device = labels.get("device").unwrap_or_default();
    (
        layers.get(place).copied().unwrap_or_default(),
        boards.get(&(&*key.0, device)).copied().unwrap_or_default(),
        labels.get("port").unwrap_or_default(),
    )
}

/// The most common value (ties: the largest).
fn mode(values: impl Iterator<Item = f64>) -> Option<f64> {
    let mut counts: Vec<(f64, usize)> = Vec::new();
    for v in values {
        match counts.iter_mut().find(|(x, _)| *x == v) {
            Some((_, n)) => *n += 1,
            None => counts.push((v, 1)),
        }
    }
    counts
        .into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then(a.0.total_cmp(&b.0)))
        .map(|(v, _)| v)
}
