//! From decoded frames to a verdict per port: the port's raw IB events, its link gauges and
//! its counters on one time axis ([`Timelines`]), then its down periods, flap episodes,
//! counter deltas, width and speed changes and a [`Verdict`] against [`Rules`].
//!
//! The input is the agent's own series (`railscope_ib_port_state`, `..._phys_state`,
//! `..._width_lanes`, `..._rate_gbps`, `railscope_ib_<file>_total`) and `ib_port` events, so a
//! capture file and a collector archive are read the same way.

use std::collections::BTreeMap;

use monitor_wire::{
    Frame, ReceiverState, SeriesData, WireEvent,
    names::{event_kind, metric},
};
use serde::Serialize;

const NS_PER_S: u64 = 1_000_000_000;
/// `state` ACTIVE.
const STATE_ACTIVE: f64 = 4.0;

/// A port of a node.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct PortId {
    pub node: String,
    pub device: String,
    pub port: u32,
}

impl std::fmt::Display for PortId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.device, self.port)
    }
}

/// Everything seen of one port, each list in time order once [`Timelines::finish`] ran.
#[derive(Clone, Debug, Default)]
pub struct PortTimeline {
    /// Raw IB events (`PORT_ERR`, `PORT_ACTIVE`, `LID_CHANGE`, ...), duplicates included.
    pub events: Vec<(u64, String)>,
    /// `state` codes (4 = ACTIVE).
    pub state: Vec<(u64, f64)>,
    /// `phys_state` codes (5 = LinkUp).
    pub phys_state: Vec<(u64, f64)>,
    pub width_lanes: Vec<(u64, f64)>,
    pub rate_gbps: Vec<(u64, f64)>,
    /// Counters by sysfs file name (`link_downed`, `symbol_error`, hw_counters' names).
    pub counters: BTreeMap<String, Vec<(u64, u64)>>,
}

/// The timelines of every port seen, and the time range covered.
#[derive(Clone, Debug, Default)]
pub struct Timelines {
    pub ports: BTreeMap<PortId, PortTimeline>,
    pub first_ns: Option<u64>,
    pub last_ns: Option<u64>,
}

impl Timelines {
    /// Adds a decoded frame's IB samples and events; `state` is the decoder's state after
    /// decoding it (it names the series of the frame's ids).
    pub fn add_frame(&mut self, frame: &Frame, state: &ReceiverState) {
        for event in &frame.events {
            self.add_event(&frame.node, event);
        }
        let Some(node) = state.node(&frame.node) else {
            return;
        };
        for samples in &frame.samples {
            let Some(series) = node.series(samples.id) else {
                continue;
            };
            let Some(name) = series.name.strip_prefix(metric::IB_PREFIX) else {
                continue;
            };
            let (Some(device), Some(port)) = (
                series.labels.get("device"),
                series.labels.get("port").and_then(|p| p.parse().ok()),
            ) else {
                continue;
            };
            let id = PortId {
                node: frame.node.clone(),
                device: device.to_owned(),
                port,
            };
            match &samples.data {
                SeriesData::Gauge(values) => {
                    let list = {
                        let t = self.ports.entry(id).or_default();
                        match name {
                            "port_state" => &mut t.state,
                            "port_phys_state" => &mut t.phys_state,
                            "port_width_lanes" => &mut t.width_lanes,
                            "port_rate_gbps" => &mut t.rate_gbps,
                            _ => continue,
                        }
                    };
                    list.extend(values.iter().map(|v| (v.end_unix_ns, v.mean)));
                    if let (Some(a), Some(b)) = (values.first(), values.last()) {
                        self.see(a.end_unix_ns);
                        self.see(b.end_unix_ns);
                    }
                }
                SeriesData::Counter(values) => {
                    let Some(file) = name.strip_suffix("_total") else {
                        continue;
                    };
                    let file = file.strip_prefix("hw_").unwrap_or(file);
                    let list = self
                        .ports
                        .entry(id)
                        .or_default()
                        .counters
                        .entry(file.to_owned())
                        .or_default();
                    for v in values {
                        list.push((v.unix_ns, v.value));
                    }
                    if let (Some(a), Some(b)) = (values.first(), values.last()) {
                        self.see(a.unix_ns);
                        self.see(b.unix_ns);
                    }
                }
            }
        }
    }

    /// Adds an event if it is an IB port event (`ib_port`, labels `device` and `port`).
    pub fn add_event(&mut self, node: &str, event: &WireEvent) {
        if event.kind != event_kind::IB_PORT {
            return;
        }
        let (Some(device), Some(port)) = (
            event.labels.get("device"),
            event.labels.get("port").and_then(|p| p.parse().ok()),
        ) else {
            return;
        };
        let id = PortId {
            node: node.to_owned(),
            device: device.to_owned(),
            port,
        };
        self.ports
            .entry(id)
            .or_default()
            .events
            .push((event.unix_ns, event.text.clone()));
        self.see(event.unix_ns);
    }

    /// Extends the covered range to `unix_ns` (a capture's start and end).
    pub fn see(&mut self, unix_ns: u64) {
        self.first_ns = Some(self.first_ns.map_or(unix_ns, |f| f.min(unix_ns)));
        self.last_ns = Some(self.last_ns.map_or(unix_ns, |l| l.max(unix_ns)));
    }

    /// Sorts every list by time (frames may hold a series' samples out of order across
    /// sessions) and drops repeated samples of one instant; events keep their duplicates.
    pub fn finish(&mut self) {
        for t in self.ports.values_mut() {
            t.events.sort_by_key(|e| e.0);
            for list in [
                &mut t.state,
                &mut t.phys_state,
                &mut t.width_lanes,
                &mut t.rate_gbps,
            ] {
                list.sort_by_key(|s| s.0);
                list.dedup_by_key(|s| s.0);
            }
            for list in t.counters.values_mut() {
                list.sort_by_key(|s| s.0);
                list.dedup_by_key(|s| s.0);
            }
        }
    }
}

/// The thresholds of the verdicts (docs/capture-format.md, "Report", says where each comes
/// from).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Rules {
    /// Flapping: at least this many down transitions ...
    pub flap_downs: u32,
    /// ... within this window (NVIDIA's IB bring-up rule: 2 link-downs within 24 h).
    pub flap_window_ns: u64,
    /// Down periods separated by less than this time up are one episode (OpenSM's default
    /// sweep interval, the time unit of UFM's flapping rule).
    pub episode_gap_ns: u64,
    /// Degraded: `symbol_error` rising by more than this within 1 s (NVSentinel) ...
    pub symbol_error_per_s: u64,
    /// ... or within 1 h (NVSentinel's fatal rule).
    pub symbol_error_per_h: u64,
    /// Flapping ("micro-flapping"): `link_error_recovery` rising by more than this within
    /// 1 min (NVSentinel).
    pub link_error_recovery_per_min: u64,
    /// Degraded: `port_rcv_errors` rising by more than this within 1 s (NVSentinel).
    pub port_rcv_errors_per_s: u64,
}

impl Default for Rules {
    fn default() -> Self {
        Self {
            flap_downs: 2,
            flap_window_ns: 24 * 3600 * NS_PER_S,
            episode_gap_ns: 10 * NS_PER_S,
            symbol_error_per_s: 10,
            symbol_error_per_h: 120,
            link_error_recovery_per_min: 5,
            port_rcv_errors_per_s: 10,
        }
    }
}

/// Counters any increase of which degrades a port (NVSentinel's fatal ones besides
/// `link_downed`, which the down transitions account for).
const ANY_INCREASE_DEGRADES: [&str; 2] = [
    "excessive_buffer_overrun_errors",
    "local_link_integrity_errors",
];

/// A port's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Stable,
    Flapping,
    /// Errors, a narrower or slower link, a single down that recovered, or a port down at the
    /// start of the range that came up.
    Degraded,
    /// Down at the end of the range.
    Down,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Stable => "stable",
            Verdict::Flapping => "flapping",
            Verdict::Degraded => "degraded",
            Verdict::Down => "down",
        }
    }
}

/// A period the port was down: from a down transition, or from the start of the range for a
/// port already down then, to the next up one (`None`: still down at the end).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DownPeriod {
    pub down_unix_ns: u64,
    pub up_unix_ns: Option<u64>,
    pub duration_ns: u64,
    /// The port was down when the range began: the period starts there, and no down
    /// transition was seen (it is no down transition for the flapping rule; its time down and
    /// its episode count all the same).
    pub from_start: bool,
}

/// Down periods close together, as one incident, with the counters' deltas around it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Episode {
    pub start_unix_ns: u64,
    pub end_unix_ns: u64,
    pub downs: usize,
    pub time_down_ns: u64,
    /// Counters that moved between the last snapshot before the episode and the first after
    /// it (both kept by the pre-trigger ring in a capture).
    pub counter_deltas: BTreeMap<String, u64>,
}

/// A width or speed change.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LinkChange {
    pub unix_ns: u64,
    pub from: f64,
    pub to: f64,
}

/// What the report says about one port.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PortReport {
    pub port: PortId,
    pub verdict: Verdict,
    /// Why, one sentence each (empty when stable).
    pub reasons: Vec<String>,
    /// Where the transitions come from: `events` (kernel timestamps) or `snapshots` (the
    /// state gauge; a snapshot interval's resolution).
    pub transitions_from: &'static str,
    pub down_transitions: usize,
    pub up_transitions: usize,
    pub time_down_ns: u64,
    pub downs: Vec<DownPeriod>,
    pub episodes: Vec<Episode>,
    /// Raw events by name, duplicates counted.
    pub events: BTreeMap<String, usize>,
    pub width_changes: Vec<LinkChange>,
    pub rate_changes: Vec<LinkChange>,
    /// Counters that moved over the whole range, by how much.
    pub counter_deltas: BTreeMap<String, u64>,
    pub first_unix_ns: u64,
    pub last_unix_ns: u64,
}

/// One report per port, in port order.
pub fn analyse(timelines: &Timelines, rules: &Rules) -> Vec<PortReport> {
    let first = timelines.first_ns.unwrap_or(0);
    let last = timelines.last_ns.unwrap_or(first);
    timelines
        .ports
        .iter()
        .map(|(id, t)| analyse_port(id, t, rules, first, last))
        .collect()
}

fn analyse_port(id: &PortId, t: &PortTimeline, rules: &Rules, first: u64, last: u64) -> PortReport {
    let (downs, transitions_from) = down_periods(t, first, last);
    // A port down from the start went down before the range: no down transition was seen.
    let down_transitions = downs.iter().filter(|d| !d.from_start).count();
    let up_transitions = downs.iter().filter(|d| d.up_unix_ns.is_some()).count();
    let time_down_ns = downs.iter().map(|d| d.duration_ns).sum();
    let episodes = episodes(&downs, t, rules);
    let mut events = BTreeMap::new();
    for (_, name) in &t.events {
        *events.entry(name.clone()).or_insert(0) += 1;
    }
    let width_changes = changes(&t.width_lanes);
    let rate_changes = changes(&t.rate_gbps);
    let counter_deltas: BTreeMap<String, u64> = t
        .counters
        .iter()
        .filter_map(|(name, s)| {
            let d = rise(s);
            (d > 0).then(|| (name.clone(), d))
        })
        .collect();

    let mut reasons = Vec::new();
    let mut verdict = Verdict::Stable;
    let still_down = downs.last().is_some_and(|d| d.up_unix_ns.is_none())
        || (downs.is_empty() && t.state.last().is_some_and(|s| s.1 != STATE_ACTIVE));
    if still_down {
        verdict = Verdict::Down;
        reasons.push("down at the end of the range".to_owned());
    }
    let most = most_downs_within(
        &downs.iter().filter(|d| !d.from_start).collect::<Vec<_>>(),
        rules.flap_window_ns,
    );
    if most >= rules.flap_downs as usize {
        reasons.push(format!(
            "{most} down transitions within {} (rule: {} or more)",
            duration_text(rules.flap_window_ns),
            rules.flap_downs
        ));
        if verdict == Verdict::Stable {
            verdict = Verdict::Flapping;
        }
    }
    let mut flap_reason = |reasons: &mut Vec<String>, text: String, v: Verdict| {
        reasons.push(text);
        verdict = match (verdict, v) {
            (Verdict::Stable, v) => v,
            (Verdict::Degraded, Verdict::Flapping) => Verdict::Flapping,
            (current, _) => current,
        };
    };
    if let Some(s) = t.counters.get("link_error_recovery") {
        let d = max_rise_within(s, 60 * NS_PER_S);
        if d > rules.link_error_recovery_per_min {
            flap_reason(
                &mut reasons,
                format!(
                    "link_error_recovery +{d} within 1 min (rule: more than {})",
                    rules.link_error_recovery_per_min
                ),
                Verdict::Flapping,
            );
        }
    }
    if most > 0 && most < rules.flap_downs as usize && !still_down {
        flap_reason(
            &mut reasons,
            format!("{most} down transition(s), recovered (below the flapping rule)"),
            Verdict::Degraded,
        );
    }
    // Down when the capture began and up since: as much a down that recovered as one seen
    // going down (starting a capture on a misbehaving port is the common case).
    if let Some(d) = downs
        .first()
        .filter(|d| d.from_start && d.up_unix_ns.is_some())
        && !still_down
    {
        flap_reason(
            &mut reasons,
            format!(
                "down at the start of the range, up after {} (no down transition seen)",
                duration_text(d.duration_ns)
            ),
            Verdict::Degraded,
        );
    }
    let rate_rules: [(&str, u64, u64); 3] = [
        ("symbol_error", NS_PER_S, rules.symbol_error_per_s),
        ("symbol_error", 3600 * NS_PER_S, rules.symbol_error_per_h),
        ("port_rcv_errors", NS_PER_S, rules.port_rcv_errors_per_s),
    ];
    for (name, window, limit) in rate_rules {
        if let Some(s) = t.counters.get(name) {
            let d = max_rise_within(s, window);
            if d > limit {
                flap_reason(
                    &mut reasons,
                    format!(
                        "{name} +{d} within {} (rule: more than {limit})",
                        duration_text(window)
                    ),
                    Verdict::Degraded,
                );
            }
        }
    }
    for name in ANY_INCREASE_DEGRADES {
        if let Some(d) = counter_deltas.get(name) {
            flap_reason(
                &mut reasons,
                format!("{name} +{d} (rule: any increase)"),
                Verdict::Degraded,
            );
        }
    }
    for (what, list) in [("width", &t.width_lanes), ("rate", &t.rate_gbps)] {
        let max = list.iter().map(|s| s.1).fold(f64::NAN, f64::max);
        if let Some(&(_, now)) = list.last()
            && now < max
        {
            flap_reason(
                &mut reasons,
                format!("{what} {now} below the {max} seen earlier"),
                Verdict::Degraded,
            );
        }
    }
    PortReport {
        port: id.clone(),
        verdict,
        reasons,
        transitions_from,
        down_transitions,
        up_transitions,
        time_down_ns,
        downs,
        episodes,
        events,
        width_changes,
        rate_changes,
        counter_deltas,
        first_unix_ns: first,
        last_unix_ns: last,
    }
}

/// The port's down periods: from its events when it has any (PORT_ERR takes it down,
/// PORT_ACTIVE up; repeats change nothing), else from its `state` snapshots. The snapshots
/// before the first PORT_ERR/PORT_ACTIVE (all of them without one) say how the port stood
/// until then: a first one not ACTIVE means the port was down when the range began, so it is
/// down from `first` (the range's start, not that snapshot: the capture did not see it go
/// down, and dating it from a snapshot would drop the time before), a period `from_start`.
fn down_periods(t: &PortTimeline, first: u64, last: u64) -> (Vec<DownPeriod>, &'static str) {
    let mut periods = Vec::new();
    // Down since (when, from the start of the range).
    let mut down_since: Option<(u64, bool)> = None;
    let close =
        |periods: &mut Vec<DownPeriod>, (since, from_start): (u64, bool), up: Option<u64>| {
            let end = up.unwrap_or(last.max(since));
            periods.push(DownPeriod {
                down_unix_ns: since,
                up_unix_ns: up,
                duration_ns: end - since,
                from_start,
            });
        };
    let first_updown = t
        .events
        .iter()
        .find(|(_, e)| e == "PORT_ERR" || e == "PORT_ACTIVE")
        .map(|e| e.0);
    let snapshots = match first_updown {
        Some(at) => &t.state[..t.state.partition_point(|s| s.0 < at)],
        None => &t.state[..],
    };
    let mut was_active: Option<bool> = None;
    for &(at, s) in snapshots {
        let active = s == STATE_ACTIVE;
        match (was_active, active) {
            (None, false) => down_since = Some((first.min(at), true)),
            (Some(true), false) => down_since = Some((at, false)),
            (Some(false), true) => {
                if let Some(since) = down_since.take() {
                    close(&mut periods, since, Some(at));
                }
            }
            _ => {}
        }
        was_active = Some(active);
    }
    let transitions_from = if first_updown.is_some() {
        for (at, name) in &t.events {
            match (name.as_str(), down_since) {
                ("PORT_ERR", None) => down_since = Some((*at, false)),
                ("PORT_ACTIVE", Some(since)) => {
                    close(&mut periods, since, Some(*at));
                    down_since = None;
                }
                _ => {}
            }
        }
        "events"
    } else {
        "snapshots"
    };
    if let Some(since) = down_since {
        close(&mut periods, since, None);
    }
    (periods, transitions_from)
}

/// Down periods merged into episodes when the port was up less than the rule's gap between
/// them, with the counter deltas around each.
fn episodes(downs: &[DownPeriod], t: &PortTimeline, rules: &Rules) -> Vec<Episode> {
    let mut out: Vec<Episode> = Vec::new();
    for d in downs {
        let end = d.down_unix_ns + d.duration_ns;
        match out.last_mut() {
            Some(e) if d.down_unix_ns.saturating_sub(e.end_unix_ns) < rules.episode_gap_ns => {
                e.end_unix_ns = end;
                e.downs += 1;
                e.time_down_ns += d.duration_ns;
            }
            _ => out.push(Episode {
                start_unix_ns: d.down_unix_ns,
                end_unix_ns: end,
                downs: 1,
                time_down_ns: d.duration_ns,
                counter_deltas: BTreeMap::new(),
            }),
        }
    }
    for e in &mut out {
        for (name, samples) in &t.counters {
            let from = samples.partition_point(|s| s.0 < e.start_unix_ns);
            let to = samples.partition_point(|s| s.0 < e.end_unix_ns);
            // From the last sample before the episode to the first at or after its end.
            if from > 0 && to < samples.len() {
                let d = rise(&samples[from - 1..=to]);
                if d > 0 {
                    e.counter_deltas.insert(name.clone(), d);
                }
            }
        }
    }
    out
}

/// The most down transitions within any window of the given length.
fn most_downs_within(downs: &[&DownPeriod], window: u64) -> usize {
    let mut most = 0;
    let mut start = 0;
    for (i, d) in downs.iter().enumerate() {
        while d.down_unix_ns - downs[start].down_unix_ns >= window {
            start += 1;
        }
        most = most.max(i - start + 1);
    }
    most
}

/// How much a counter rose over its samples; a value lower than the one before is a reset
/// (the driver reloaded, counters cleared), after which it counts from 0. Saturates at
/// `u64::MAX` (rises near 2^64 between resets, as only a broken file has, would overflow).
fn rise(samples: &[(u64, u64)]) -> u64 {
    samples
        .windows(2)
        .map(|w| {
            if w[1].1 >= w[0].1 {
                w[1].1 - w[0].1
            } else {
                w[1].1
            }
        })
        .fold(0, u64::saturating_add)
}

/// The largest rise of a counter between two of its samples at most `window` apart.
fn max_rise_within(samples: &[(u64, u64)], window: u64) -> u64 {
    let mut most = 0;
    let mut start = 0;
    for (i, &(at, v)) in samples.iter().enumerate() {
        while at - samples[start].0 > window {
            start += 1;
        }
        if start < i {
            most = most.max(v.saturating_sub(samples[start].1));
        }
    }
    most
}

/// Each change of a gauge's value.
fn changes(list: &[(u64, f64)]) -> Vec<LinkChange> {
    list.windows(2)
        .filter(|w| w[0].1 != w[1].1)
        .map(|w| LinkChange {
            unix_ns: w[1].0,
            from: w[0].1,
            to: w[1].1,
        })
        .collect()
}

/// "24 h", "1 min", "1 s", "250 ms".
pub(crate) fn duration_text(ns: u64) -> String {
    if ns >= 3600 * NS_PER_S && ns.is_multiple_of(3600 * NS_PER_S) {
        format!("{} h", ns / (3600 * NS_PER_S))
    } else if ns >= 60 * NS_PER_S && ns.is_multiple_of(60 * NS_PER_S) {
        format!("{} min", ns / (60 * NS_PER_S))
    } else if ns >= NS_PER_S {
        format!("{:.3} s", ns as f64 / 1e9)
    } else {
        format!("{:.1} ms", ns as f64 / 1e6)
    }
}
