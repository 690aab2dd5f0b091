//! Fabric faults blamed on the fabric: when a switch reboots or a spine link fails, ports of
//! many nodes go down within milliseconds of one another, which the agents' kernel
//! timestamps show. Such a burst is one upstream finding (`fabric_upstream_down`, naming
//! the lowest switch all its ports share where the topology is known), not a fault of each
//! node: its DOWN transitions do not count towards a port's flapping, and the port findings
//! they cause carry `upstream` in their evidence, which the actions never drain for
//! (docs/findings.md, docs/actions.md).
//!
//! Each pass groups every DOWN transition held from scratch: sorted by time, a burst is a run
//! in which each is within `fabric-window-ms` of the one before. The times are the kernels',
//! each on its node's clock, put on the collector's with the node's clock offset as its agent
//! estimated it when the transition arrived (see `clock_skew`), where that estimate is within
//! half the window; a node with none, or one more uncertain, is taken on its own clock, and
//! named in the finding's `clock_unknown`. A burst is judged once
//! `fabric-settle-s` passed since its last transition arrived (frames of other nodes may
//! still be on their way); until then its transitions are [`Blame::Pending`]. A judged burst
//! with ports of at least `fabric-min-nodes` nodes is upstream; bursts on the same switch
//! within `fabric-hold-s` of one another are one episode, one finding.

use std::collections::{BTreeSet, HashMap, VecDeque};

use monitor_wire::names::metric;
use serde_json::json;

use super::{
    Finding, Observation, PENDING, Severity, Subject, Thresholds, UPSTREAM,
    topology::{PortKey, Topology},
    view::{EventState, PortDown},
};

pub const RULE: &str = "fabric_upstream_down";
pub const RULES: &[&str] = &[RULE];
/// The series the grouping reads: the agents' LLDP neighbours, its topology where the
/// topology file does not cover a port, and their clock offsets, which put each node's DOWN
/// transitions on the collector's clock (the engine reads them at each tick).
pub const SERIES: &[&str] = &[
    metric::IB_PORT_NEIGHBOR_INFO,
    metric::AGENT_CLOCK_OFFSET_SECONDS,
    metric::AGENT_CLOCK_OFFSET_ERROR_SECONDS,
];
/// The node an upstream finding names where no topology names a switch.
pub const FABRIC_NODE: &str = "fabric";
/// Ports listed in an upstream finding's evidence at most (the count is always there).
const MAX_LISTED_PORTS: usize = 512;

const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

/// What one DOWN transition is blamed on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blame {
    /// Its burst is not judged yet.
    Pending,
    /// The port's own fault (its node, its cable).
    Own,
    /// An upstream fault: the index of its episode in [`Grouping::episodes`].
    Upstream(usize),
}

/// What a port finding is blamed on, as its evidence's `upstream` says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Upstream<'a> {
    /// Not upstream: the node's.
    No,
    /// Not judged yet: the actions wait (`"upstream": "pending"`).
    Pending,
    /// The id of the upstream finding it is part of.
    Blamed(&'a str),
}

/// Upstream bursts on one switch (or the fabric) within the hold of one another.
#[derive(Clone, Debug)]
pub struct Episode {
    /// The switch, or [`FABRIC_NODE`].
    pub switch: String,
    /// Whether the topology named the switch.
    pub named: bool,
    /// Its first and last DOWN transitions, on the collector's clock where the nodes' are
    /// known (`Placed`).
    pub first_ns: u64,
    pub last_ns: u64,
    pub ports: BTreeSet<PortKey>,
    pub bursts: usize,
    /// The widest spread of its bursts (first to last DOWN), ns.
    pub spread_ns: u64,
    /// Its nodes whose transitions were taken on their own clocks (no usable estimate).
    pub clock_unknown: BTreeSet<String>,
    /// The id its finding has.
    pub id: String,
}

/// Every DOWN transition held, judged.
#[derive(Debug, Default)]
pub struct Grouping {
    blame: HashMap<(PortKey, u64), Blame>,
    pub episodes: Vec<Episode>,
    /// When the first burst not judged yet will be (collector clock), if any.
    pub settles_at_ns: Option<u64>,
    settle_ns: u64,
    window_ms: u64,
    min_nodes: u32,
    hold_ns: u64,
}

/// A DOWN transition placed in time for the grouping.
#[derive(Clone, Copy, Debug)]
struct Placed<'a> {
    /// Its time on the collector's clock, or on its node's where `corrected` is false.
    at_ns: u64,
    down: PortDown,
    port: &'a PortKey,
    /// Its node's clock estimate (when it arrived) was within half the window.
    corrected: bool,
}

impl<'a> Placed<'a> {
    fn of(events: &EventState, port: &'a PortKey, down: PortDown, window_ns: u64) -> Self {
        let clock = events
            .down_clocks
            .get(port)
            .and_then(|c| c.get(&down.at_ns))
            .filter(|c| c.error_ns <= window_ns / 2);
        Placed {
            at_ns: clock.map_or(down.at_ns, |c| c.on_collector_clock(down.at_ns)),
            down,
            port,
            corrected: clock.is_some(),
        }
    }
}

/// A burst of DOWN transitions, sorted by time.
type Burst<'a> = Vec<Placed<'a>>;

impl Grouping {
    pub fn of(
        events: &EventState,
        now_ns: u64,
        th: &Thresholds,
        topology: Option<&Topology>,
    ) -> Self {
        let mut g = Grouping {
            settle_ns: th.fabric_settle_s * S,
            window_ms: th.fabric_window_ms,
            min_nodes: th.fabric_min_nodes,
            hold_ns: th.fabric_hold_s * S,
            ..Grouping::default()
        };
        let window_ns = th.fabric_window_ms * MS;
        let mut all: Vec<Placed> = events
            .downs
            .iter()
            .flat_map(|(port, downs)| {
                downs
                    .iter()
                    .map(move |d| Placed::of(events, port, *d, window_ns))
            })
            .collect();
        all.sort_by(|a, b| (a.at_ns, a.port, a.down.at_ns).cmp(&(b.at_ns, b.port, b.down.at_ns)));
        let mut upstream: Vec<(String, bool, Burst)> = Vec::new();
        let mut start = 0;
        while start < all.len() {
            let mut end = start + 1;
            while end < all.len() && all[end].at_ns - all[end - 1].at_ns <= window_ns {
                end += 1;
            }
            let burst = &all[start..end];
            start = end;
            let arrived = burst.iter().map(|d| d.down.arrived_ns).max().unwrap_or(0);
            let judged_at = arrived + g.settle_ns;
            let blame = if now_ns < judged_at {
                g.settles_at_ns = Some(g.settles_at_ns.map_or(judged_at, |t| t.min(judged_at)));
                Blame::Pending
            } else {
                let nodes: BTreeSet<&str> = burst.iter().map(|d| d.port.0.as_str()).collect();
                if nodes.len() >= th.fabric_min_nodes as usize {
                    let switch =
                        topology.and_then(|t| t.lowest_common_switch(burst.iter().map(|d| d.port)));
                    let named = switch.is_some();
                    upstream.push((
                        switch.unwrap_or_else(|| FABRIC_NODE.into()),
                        named,
                        burst.to_vec(),
                    ));
                    continue;
                }
                Blame::Own
            };
            for d in burst {
                g.blame.insert((d.port.clone(), d.down.at_ns), blame);
            }
        }
        // Episodes: a switch's bursts within the hold of the one before.
        upstream.sort_by(|a, b| (&a.0, a.2[0].at_ns).cmp(&(&b.0, b.2[0].at_ns)));
        for (switch, named, burst) in upstream {
            let first = burst[0].at_ns;
            let last = burst[burst.len() - 1].at_ns;
            let joins = g
                .episodes
                .last()
                .is_some_and(|e| e.switch == switch && first <= e.last_ns + g.hold_ns);
            if !joins {
                g.episodes.push(Episode {
                    switch,
                    named,
                    first_ns: first,
                    last_ns: last,
                    ports: BTreeSet::new(),
                    bursts: 0,
                    spread_ns: 0,
                    clock_unknown: BTreeSet::new(),
                    id: String::new(),
                });
            }
            let i = g.episodes.len() - 1;
            let e = &mut g.episodes[i];
            e.last_ns = e.last_ns.max(last);
            e.bursts += 1;
            e.spread_ns = e.spread_ns.max(last - first);
            for d in burst {
                e.ports.insert(d.port.clone());
                if !d.corrected {
                    e.clock_unknown.insert(d.port.0.clone());
                }
                g.blame
                    .insert((d.port.clone(), d.down.at_ns), Blame::Upstream(i));
            }
        }
        for i in 0..g.episodes.len() {
            let id = Finding::open(&g.observation(&g.episodes[i])).id;
            g.episodes[i].id = id;
        }
        g
    }

    /// What the DOWN transition of `port` at `at_ns` is blamed on (a transition not held:
    /// the port's own).
    pub fn blame(&self, port: &PortKey, at_ns: u64) -> Blame {
        self.blame
            .get(&(port.clone(), at_ns))
            .copied()
            .unwrap_or(Blame::Own)
    }

    /// What a finding of `port` is blamed on, from the port's DOWN transitions since
    /// `from_ns`: any of its own makes it the node's; else one still pending waits; else an
    /// upstream one names its finding. With no transition at all, a finding that began
    /// (`at_ns`) less than the settle time ago waits for its event to arrive.
    pub fn upstream_of(
        &self,
        downs: Option<&VecDeque<PortDown>>,
        port: &PortKey,
        from_ns: u64,
        at_ns: u64,
        now_ns: u64,
    ) -> Upstream<'_> {
        let blames: Vec<Blame> = downs
            .into_iter()
            .flatten()
            .filter(|d| d.at_ns >= from_ns)
            .map(|d| self.blame(port, d.at_ns))
            .collect();
        if blames.is_empty() {
            return if now_ns < at_ns.saturating_add(self.settle_ns) {
                Upstream::Pending
            } else {
                Upstream::No
            };
        }
        if blames.contains(&Blame::Own) {
            return Upstream::No;
        }
        match blames.iter().find(|b| matches!(b, Blame::Upstream(_))) {
            Some(Blame::Upstream(i)) if !blames.contains(&Blame::Pending) => {
                Upstream::Blamed(&self.episodes[*i].id)
            }
            _ => Upstream::Pending,
        }
    }

    /// The upstream findings of the episodes still within their hold at `now_ns`.
    pub fn evaluate(&self, now_ns: u64, out: &mut Vec<Observation>) {
        for e in &self.episodes {
            if now_ns <= e.last_ns + self.hold_ns {
                out.push(self.observation(e));
            }
        }
    }

    fn observation(&self, e: &Episode) -> Observation {
        let nodes: BTreeSet<&str> = e.ports.iter().map(|p| p.0.as_str()).collect();
        let ports: Vec<String> = e
            .ports
            .iter()
            .take(MAX_LISTED_PORTS)
            .map(|(n, d, p)| format!("{n} {d}/{p}"))
            .collect();
        let spread_ms = e.spread_ns as f64 / 1e6;
        let place = if e.named {
            format!("switch {}", e.switch)
        } else {
            "upstream in the fabric (no topology names a switch they share)".into()
        };
        Observation {
            rule: RULE,
            severity: Severity::Critical,
            subject: Subject {
                node: e.switch.clone(),
                device: None,
                port: None,
                gpu: None,
                job: None,
            },
            job_id: None,
            at_ns: e.first_ns,
            summary: format!(
                "{} ports on {} nodes went down within {spread_ms:.1} ms of one another: {place}",
                e.ports.len(),
                nodes.len(),
            ),
            evidence: json!({
                "switch": e.named.then_some(&e.switch),
                "nodes": nodes,
                "ports": ports,
                "port_count": e.ports.len(),
                "bursts": e.bursts,
                "first_down": e.first_ns,
                "last_down": e.last_ns,
                "spread_ms": spread_ms,
                "clock_unknown": e.clock_unknown,
                "window_ms": self.window_ms,
                "min_nodes": self.min_nodes,
            }),
        }
    }
}

/// Marks a port finding's evidence with what it is blamed on (nothing where it is the
/// node's), as [`Grouping::upstream_of`] judged it from the port's DOWN transitions since
/// `from_ns`. A pending verdict keeps `from_ns` (`upstream_from`), so that a finding that ends
/// before its burst is judged is judged later all the same ([`rejudge`]).
pub fn mark(evidence: &mut serde_json::Value, upstream: Upstream<'_>, from_ns: u64) {
    let Some(map) = evidence.as_object_mut() else {
        return;
    };
    map.remove(UPSTREAM);
    map.remove(UPSTREAM_FROM);
    match upstream {
        Upstream::No => {}
        Upstream::Pending => {
            map.insert(UPSTREAM.into(), PENDING.into());
            map.insert(UPSTREAM_FROM.into(), from_ns.into());
        }
        Upstream::Blamed(id) => {
            map.insert(UPSTREAM.into(), id.into());
        }
    }
}

const UPSTREAM_FROM: &str = "upstream_from";

/// The verdict on an ended finding still marked pending (a port that came back within the
/// settle time, as every short flap does), from the same transitions it was marked from:
/// the evidence as it is to be once the burst is judged, or `None` while it still waits.
pub fn rejudge(
    finding: &Finding,
    grouping: &Grouping,
    downs: &HashMap<PortKey, VecDeque<PortDown>>,
    now_ns: u64,
) -> Option<serde_json::Value> {
    let port: PortKey = (finding.node.clone(), finding.device.clone()?, finding.port?);
    let from = finding.evidence[UPSTREAM_FROM]
        .as_u64()
        .unwrap_or(finding.start);
    let verdict = grouping.upstream_of(downs.get(&port), &port, from, finding.start, now_ns);
    if verdict == Upstream::Pending {
        return None;
    }
    let mut evidence = finding.evidence.clone();
    mark(&mut evidence, verdict, from);
    Some(evidence)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::{NodeClock, PortDown};
    use monitor_wire::WireEvent;

    const T0: u64 = 1_790_000_000_000_000_000;

    fn th() -> Thresholds {
        Thresholds::default()
    }

    /// Downs of port mlx5_0/1 on `nodes`, the n-th at `T0 + offset + n * step_ms`, arrived
    /// at T0.
    fn downs(events: &mut EventState, nodes: &[&str], offset_ns: u64, step_ms: u64) {
        for (n, node) in nodes.iter().enumerate() {
            events
                .downs
                .entry(((*node).into(), "mlx5_0".into(), 1))
                .or_default()
                .push_back(PortDown {
                    at_ns: T0 + offset_ns + n as u64 * step_ms * MS,
                    arrived_ns: T0,
                });
        }
    }

    fn port(node: &str) -> PortKey {
        (node.into(), "mlx5_0".into(), 1)
    }

    #[test]
    fn a_burst_across_enough_nodes_is_one_upstream_episode_once_settled() {
        let mut events = EventState::default();
        let nodes = ["n1", "n2", "n3", "n4", "n5"];
        downs(&mut events, &nodes, 0, 10);
        downs(&mut events, &["n9"], 30 * S, 0);
        // Before the settle time: pending, nothing raised.
        let g = Grouping::of(&events, T0 + 1, &th(), None);
        assert_eq!(g.blame(&port("n3"), T0 + 20 * MS), Blame::Pending);
        assert_eq!(g.settles_at_ns, Some(T0 + 5 * S));
        assert!(g.episodes.is_empty());
        let g = Grouping::of(&events, T0 + 5 * S, &th(), None);
        assert_eq!(g.blame(&port("n3"), T0 + 20 * MS), Blame::Upstream(0));
        assert_eq!(g.blame(&port("n9"), T0 + 30 * S), Blame::Own);
        assert_eq!(g.episodes.len(), 1);
        let e = &g.episodes[0];
        assert_eq!((e.switch.as_str(), e.named), (FABRIC_NODE, false));
        assert_eq!(e.spread_ns, 40 * MS);
        assert_eq!(e.id, format!("{RULE}/fabric/-/{T0}"));
        let mut out = Vec::new();
        g.evaluate(T0 + 5 * S, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].evidence["nodes"].as_array().unwrap().len(), 5);
        assert!(
            out[0]
                .summary
                .starts_with("5 ports on 5 nodes went down within 40.0 ms")
        );
    }

    #[test]
    fn too_few_nodes_or_too_slow_a_burst_is_each_node_s_own() {
        let mut events = EventState::default();
        downs(&mut events, &["n1", "n2", "n3"], 0, 1);
        // Four nodes, but 60 ms apart: four bursts of one.
        downs(&mut events, &["m1", "m2", "m3", "m4"], 60 * S, 60);
        let g = Grouping::of(&events, T0 + 600 * S, &th(), None);
        assert!(g.episodes.is_empty());
        assert_eq!(g.blame(&port("n2"), T0 + MS), Blame::Own);
        assert_eq!(g.blame(&port("m4"), T0 + 60 * S + 180 * MS), Blame::Own);
        // Eight ports of one node at once are that node's.
        let mut events = EventState::default();
        for d in 0..8 {
            events
                .downs
                .entry(("n1".into(), format!("mlx5_{d}"), 1))
                .or_default()
                .push_back(PortDown {
                    at_ns: T0,
                    arrived_ns: T0,
                });
        }
        let g = Grouping::of(&events, T0 + 600 * S, &th(), None);
        assert!(g.episodes.is_empty());
    }

    #[test]
    fn the_topology_names_the_switch_and_bursts_within_the_hold_are_one_episode() {
        let topology = Topology::parse(
            "SwitchName=s1 Nodes=n[1-4]\nSwitchName=s2 Nodes=n[5-8]\nSwitchName=top Switches=s[1-2]\n",
            "t",
        )
        .unwrap();
        let mut events = EventState::default();
        downs(&mut events, &["n1", "n2", "n3", "n4"], 0, 2);
        downs(&mut events, &["n1", "n2", "n3", "n4"], 60 * S, 2);
        downs(&mut events, &["n3", "n4", "n5", "n6"], 120 * S, 2);
        let g = Grouping::of(&events, T0 + 600 * S, &th(), Some(&topology));
        let named: Vec<(&str, usize, usize)> = g
            .episodes
            .iter()
            .map(|e| (e.switch.as_str(), e.bursts, e.ports.len()))
            .collect();
        assert_eq!(named, [("s1", 2, 4), ("top", 1, 4)]);
        let mut out = Vec::new();
        g.evaluate(T0 + 600 * S, &mut out);
        assert_eq!(out[0].evidence["switch"], "s1");
        assert!(out[0].summary.ends_with("switch s1"), "{}", out[0].summary);
        // After the hold, no finding.
        let mut out = Vec::new();
        g.evaluate(T0 + 121 * S + th().fabric_hold_s * S, &mut out);
        assert!(out.is_empty());
    }

    /// A DOWN transition of `node`'s port mlx5_0/1, taken as the events thread takes it: at
    /// `at_ns` on the node's clock, with the clocks it knows then.
    fn take_down(events: &mut EventState, node: &str, at_ns: u64) {
        let down = WireEvent {
            unix_ns: at_ns,
            kind: monitor_wire::names::event_kind::PORT_TRANSITION.into(),
            labels: monitor_wire::Labels::new([
                ("device", "mlx5_0"),
                ("port", "1"),
                ("from", "ACTIVE"),
            ]),
            code: 0,
            text: "DOWN".into(),
        };
        events.take(node, &down, T0);
    }

    fn clock(offset_ns: i64, error_ns: u64) -> NodeClock {
        NodeClock {
            offset_ns,
            error_ns,
            at_ns: T0,
        }
    }

    #[test]
    fn a_node_s_clock_offset_puts_its_downs_on_the_collector_s_clock() {
        let mut events = EventState::default();
        // n4's clock runs 3 s ahead, known within 1 ms; n5's 2 s behind, but known only
        // within 40 ms, more than half the 50 ms window.
        events.clocks.insert("n4".into(), clock(3 * S as i64, MS));
        events
            .clocks
            .insert("n5".into(), clock(-2 * (S as i64), 40 * MS));
        for (n, node) in ["n1", "n2", "n3"].iter().enumerate() {
            take_down(&mut events, node, T0 + n as u64 * 2 * MS);
        }
        take_down(&mut events, "n4", T0 + 3 * S + 6 * MS);
        take_down(&mut events, "n5", T0 - 2 * S + 8 * MS);
        let g = Grouping::of(&events, T0 + 600 * S, &th(), None);
        assert_eq!(g.episodes.len(), 1, "{:?}", g.episodes);
        let e = &g.episodes[0];
        let nodes: Vec<&str> = e.ports.iter().map(|p| p.0.as_str()).collect();
        assert_eq!(nodes, ["n1", "n2", "n3", "n4"]);
        assert_eq!((e.first_ns, e.last_ns), (T0, T0 + 6 * MS));
        assert_eq!(
            e.clock_unknown,
            BTreeSet::from(["n1".into(), "n2".into(), "n3".into()])
        );
        // Blamed by their own (kernel) times, as the port findings look them up.
        assert_eq!(
            g.blame(&port("n4"), T0 + 3 * S + 6 * MS),
            Blame::Upstream(0)
        );
        assert_eq!(g.blame(&port("n5"), T0 - 2 * S + 8 * MS), Blame::Own);
        let mut out = Vec::new();
        g.evaluate(T0 + 600 * S, &mut out);
        assert_eq!(out[0].evidence["clock_unknown"], json!(["n1", "n2", "n3"]));
        assert_eq!(out[0].evidence["spread_ms"], 6.0);
    }

    #[test]
    fn a_down_keeps_the_clock_known_when_it_arrived() {
        let mut events = EventState::default();
        // n4's DOWN arrives before its clock is known: it stays on its own clock, 3 s off,
        // even once the estimate comes.
        take_down(&mut events, "n4", T0 + 3 * S);
        events.clocks.insert("n4".into(), clock(3 * S as i64, MS));
        for node in ["n1", "n2", "n3"] {
            take_down(&mut events, node, T0);
        }
        let g = Grouping::of(&events, T0 + 600 * S, &th(), None);
        assert!(g.episodes.is_empty(), "{:?}", g.episodes);
        // Its next DOWN is placed with the clock; a later step of its clock changes nothing
        // for it.
        take_down(&mut events, "n4", T0 + 3 * S + 60 * S);
        events.clocks.insert("n4".into(), clock(0, MS));
        for node in ["n1", "n2", "n3"] {
            take_down(&mut events, node, T0 + 60 * S);
        }
        let g = Grouping::of(&events, T0 + 600 * S, &th(), None);
        assert_eq!(g.episodes.len(), 1, "{:?}", g.episodes);
        assert_eq!(g.episodes[0].ports.len(), 4);
        assert_eq!(g.episodes[0].first_ns, T0 + 60 * S);
        // Pruned with the transitions they place.
        events.prune(T0 + 3 * S + 60 * S + th().fabric_hold_s * S + S, &th());
        assert!(events.downs.is_empty() && events.down_clocks.is_empty());
    }

    #[test]
    fn a_port_finding_is_blamed_upstream_only_when_all_its_downs_are() {
        let mut events = EventState::default();
        downs(&mut events, &["n1", "n2", "n3", "n4"], 0, 2);
        let now = T0 + 600 * S;
        let g = Grouping::of(&events, now, &th(), None);
        let id = g.episodes[0].id.clone();
        let p = port("n1");
        assert_eq!(
            g.upstream_of(events.downs.get(&p), &p, 0, T0, now),
            Upstream::Blamed(&id)
        );
        // A down of its own as well: the node's.
        downs(&mut events, &["n1"], 300 * S, 0);
        let g = Grouping::of(&events, now, &th(), None);
        assert_eq!(
            g.upstream_of(events.downs.get(&p), &p, 0, T0, now),
            Upstream::No
        );
        // No down seen: waits the settle time for it, then is the node's.
        let q = port("n7");
        assert_eq!(g.upstream_of(None, &q, 0, now - S, now), Upstream::Pending);
        assert_eq!(g.upstream_of(None, &q, 0, now - 10 * S, now), Upstream::No);
        let mut evidence = json!({"increase": 1});
        mark(&mut evidence, Upstream::Pending, T0);
        assert!(crate::is_pending(&evidence));
        assert_eq!(evidence["upstream_from"], T0);
        mark(&mut evidence, Upstream::Blamed(&id), T0);
        assert_eq!(evidence, json!({"increase": 1, "upstream": id.as_str()}));
        mark(&mut evidence, Upstream::No, T0);
        assert_eq!(evidence, json!({"increase": 1}));
    }
}
