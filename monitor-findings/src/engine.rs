//! The findings threads: the event rules on one ("findings"), the series rules on another
//! ("findings-tick"), so an event is never held back by a tick over the whole fleet.
//!
//! Events come from ingest through a bounded channel ([`FindingsInbox`]) to the events thread
//! with each frame's port state samples, and are evaluated within `EVENT_PASS_EVERY` (an
//! event pass: the event rules only). The counters the rules read come through a channel of
//! their own to the tick thread, a frame's worth at a time, which it folds into each
//! counter's history by the samples' own times; gauges are read from the live view (the node
//! table's latest value of each series) every `tick-s`. Nothing is evaluated per sample on
//! the receive threads.
//!
//! The two threads share no state but the [`FindingsStore`]: each pass hands the store what
//! its rules saw and the list of the rules it judged, and the two lists are disjoint. At each
//! tick the tick thread reads the live view, hands the events thread what the event rules
//! need of it (the agents' LLDP neighbours, the GPUs' jobs, the nodes' clock offsets) and asks for what the series rules
//! need of the events (the DOWN transitions as the fabric grouping judged them, the lost
//! GPUs); the events thread answers with an event pass of its own (which also ends the event
//! findings whose hold ran out) and a copy, and goes on taking events while the tick's series
//! pass runs.
//!
//! Why counters come as samples and gauges do not: a counter rule asks how much a counter rose
//! within a window, which needs the value before the rise. Read from the live view at each
//! tick, the rule saw only what the tick happened to see: a baseline and its rise arriving
//! between two ticks (a node's first frames, a backlog, history sent in one burst) left the
//! rise unseen, and the same data gave different findings at a different arrival pace. A gauge
//! rule asks only what a value is now, which the latest sample answers. Port state samples are
//! the exception, taken as they arrive: `ib_port_down` finds a port already down when its agent
//! starts from its first frame, not at the next tick.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, LazyLock,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use monitor_wire::{CounterSample, Frame, Kind, Series, SeriesData, WireEvent, names::metric};

use super::{
    FindingsStore, Observation, Thresholds, affinity, clock_skew, fabric, gpus, hardware, ib_links,
    learner::{FleetHardware, ProfileLearner},
    live::LiveReader,
    pfc,
    profile::{self, ProfileBoard},
    silence,
    topology::{PortKey, Topology},
    verbs,
    verdicts::Verdicts,
    view::{EventState, GpuJobs, NodeClock, PortStateSamples, Track, Tracks, View},
};
use crate::live_table::{Latest, LatestValue, LiveTable, Schema};
use monitor_archive::{
    clock::unix_now_ns,
    liveness::{BEAT_EVERY, Heartbeat},
};

/// Messages waiting for each findings thread at most: events and port states, and frames'
/// counter samples (beyond it they are counted and dropped: the receive threads never wait).
const INBOX_CAPACITY: usize = 65_536;

/// The samples of one frame of the counters the rules read, by series, in the frame's order.
pub type CounterSamples = Vec<(Series, Vec<CounterSample>)>;

/// What the events thread takes.
#[derive(Debug)]
pub enum FindingsInput {
    Event(Arc<str>, WireEvent),
    PortStates(Arc<str>, PortStateSamples),
    /// The tick thread's: what it read of the live view, and where to answer.
    Tick(Box<TickRequest>),
}

/// A tick's request to the events thread.
pub struct TickRequest {
    refreshed: Refreshed,
    reply: SyncSender<Judged>,
}

impl std::fmt::Debug for TickRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TickRequest")
    }
}

/// A frame's counter samples, for the tick thread.
pub type CounterInput = (Arc<str>, CounterSamples);

/// Where ingest hands events, port states and counter samples to the findings threads.
#[derive(Clone)]
pub struct FindingsInbox {
    events: SyncSender<FindingsInput>,
    counters: SyncSender<CounterInput>,
    dropped: Arc<AtomicU64>,
}

/// The receiving ends of a [`FindingsInbox`], and the tick thread's way to the events thread.
pub struct InboxReceivers {
    events: Receiver<FindingsInput>,
    counters: Receiver<CounterInput>,
    to_events: SyncSender<FindingsInput>,
}

impl FindingsInbox {
    /// An inbox and the receiving ends the findings threads read.
    pub fn new() -> (Self, InboxReceivers) {
        let (events, events_rx) = std::sync::mpsc::sync_channel(INBOX_CAPACITY);
        let (counters, counters_rx) = std::sync::mpsc::sync_channel(INBOX_CAPACITY);
        (
            Self {
                events: events.clone(),
                counters,
                dropped: Arc::new(AtomicU64::new(0)),
            },
            InboxReceivers {
                events: events_rx,
                counters: counters_rx,
                to_events: events,
            },
        )
    }

    pub fn push(&self, node: &Arc<str>, event: &WireEvent) {
        self.count(
            self.events
                .try_send(FindingsInput::Event(node.clone(), event.clone())),
        );
    }

    /// Hands over an accepted frame's port state samples and the watched counters' samples,
    /// if it has any.
    pub fn push_samples(&self, node: &Arc<str>, frame: &Frame, schema: &Schema) {
        let states = port_states(frame, schema);
        if !states.is_empty() {
            self.count(
                self.events
                    .try_send(FindingsInput::PortStates(node.clone(), states)),
            );
        }
        let counters = watched_counters(frame, schema);
        if !counters.is_empty() {
            self.count(self.counters.try_send((node.clone(), counters)));
        }
    }

    fn count<T>(&self, sent: Result<(), TrySendError<T>>) {
        if sent.is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Messages the findings threads could not take (an inbox was full).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// The series the rules read; every other series of the live view is skipped. A set, not a
/// scan of the rules' lists: it is asked for every series of the fleet each tick and for
/// every counter of every frame.
fn watched(name: &str) -> bool {
    static WATCHED: LazyLock<HashSet<&'static str, foldhash::fast::RandomState>> =
        LazyLock::new(|| super::reads::metrics_read().into_iter().collect());
    WATCHED.contains(name)
}

/// A frame's samples of the counters the rules read (see the module documentation).
pub fn watched_counters(frame: &Frame, schema: &Schema) -> CounterSamples {
    frame
        .samples
        .iter()
        .filter_map(|s| {
            let SeriesData::Counter(samples) = &s.data else {
                return None;
            };
            let series = schema.entries.get(&s.id)?;
            (series.kind == Kind::Counter && watched(&series.name))
                .then(|| (series.clone(), samples.clone()))
        })
        .collect()
}

/// A frame's samples of `railscope_ib_port_state` and `railscope_ib_port_phys_state`, which
/// `ib_port_down` takes as they arrive.
pub fn port_states(frame: &Frame, schema: &Schema) -> PortStateSamples {
    frame
        .samples
        .iter()
        .filter_map(|s| {
            let SeriesData::Gauge(samples) = &s.data else {
                return None;
            };
            let series = schema.entries.get(&s.id)?;
            (&*series.name == metric::IB_PORT_STATE || &*series.name == metric::IB_PORT_PHYS_STATE)
                .then(|| (series.clone(), samples.clone()))
        })
        .collect()
}

/// Which rules a pass evaluated: a finding of a rule a pass did not evaluate is left alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// The event rules only (an event came in).
    Events,
    /// Every rule (the tick): the event rules, then the series rules.
    All,
}

pub const EVENT_RULES: &[&str] = &[
    ib_links::PORT_DOWN,
    "ib_link_flapping",
    fabric::RULE,
    "gpu_xid",
    "gpu_lost",
];

/// Every rule but the event rules: those the tick's series pass judges.
fn series_rules() -> Vec<&'static str> {
    all_rules()
        .into_iter()
        .filter(|r| !EVENT_RULES.contains(r))
        .collect()
}

/// What the tick's read of the live view hands the event rules, each when it may have changed:
/// the agents' LLDP neighbours (the fabric grouping's topology), the job each GPU's series
/// carry and the nodes' clock offsets (the fabric grouping's times).
pub struct Refreshed {
    /// None if no node's neighbours can have changed since the last tick.
    neighbours: Option<HashMap<PortKey, (String, String)>>,
    gpu_jobs: Option<GpuJobs>,
    /// The nodes whose clock estimate changed since the last tick: the new one, or None for
    /// a node that has none any more.
    clocks: Vec<(Arc<str>, Option<NodeClock>)>,
}

/// What the series rules read of the event rules' state, as one event pass left it: the DOWN
/// transitions and lost GPUs (a copy), and how the transitions are blamed.
pub struct Judged {
    events: EventState,
    grouping: fabric::Grouping,
}

/// The event rules and their state: the events thread's own. An event pass reads nothing the
/// tick writes but what the tick hands it ([`Refreshed`]), so it never waits for a tick.
pub struct EventEngine {
    th: Thresholds,
    events: EventState,
    store: Arc<FindingsStore>,
    /// Which switch each port hangs off: `[findings] topology` if given, and the agents'
    /// LLDP neighbours (read from the live view at each tick) for ports it does not cover.
    topology: Topology,
    /// When the first burst of DOWN transitions not judged yet will be (collector clock).
    settles_at_ns: Option<u64>,
}

impl EventEngine {
    /// Takes an event the collector took at `arrived_ns` (its own clock).
    pub fn take_event(&mut self, node: &str, event: &WireEvent, arrived_ns: u64) {
        self.events.take(node, event, arrived_ns);
    }

    /// Takes a frame's port state samples; true if a port went down or came back (the event
    /// rules are due).
    pub fn take_port_states(&mut self, node: &str, samples: PortStateSamples) -> bool {
        self.events.take_port_states(node, samples)
    }

    /// Whether a burst of DOWN transitions waiting to be judged is due at `now_ns`.
    pub fn burst_due(&self, now_ns: u64) -> bool {
        self.settles_at_ns.is_some_and(|t| now_ns >= t)
    }

    /// Takes what the tick read of the live view.
    pub fn refreshed(&mut self, r: Refreshed) {
        if let Some(neighbours) = r.neighbours {
            self.topology.set_neighbours(neighbours);
        }
        if let Some(jobs) = r.gpu_jobs {
            self.events.gpu_jobs = jobs;
        }
        for (node, clock) in r.clocks {
            match clock {
                Some(clock) => {
                    self.events.clocks.insert(node, clock);
                }
                None => {
                    self.events.clocks.remove(&node);
                }
            }
        }
    }

    /// Runs the event rules and hands what they saw to the store; returns the grouping of
    /// the DOWN transitions, for the series rules of a tick.
    pub fn evaluate(&mut self, now_ns: u64) -> fabric::Grouping {
        self.events.prune(now_ns, &self.th);
        let grouping = fabric::Grouping::of(&self.events, now_ns, &self.th, Some(&self.topology));
        self.settles_at_ns = grouping.settles_at_ns;
        let mut seen = Vec::new();
        // Down periods that closed since the last pass first: a finding the last pass opened
        // ends at its UP, one no pass saw is recorded whole.
        let closed = ib_links::closed_port_downs(&mut self.events, &grouping, now_ns);
        self.store.record_closed(&closed);
        ib_links::evaluate_port_down(&self.events, &grouping, now_ns, &mut seen);
        ib_links::evaluate_events(&self.events, &grouping, now_ns, &self.th, &mut seen);
        grouping.evaluate(now_ns, &mut seen);
        gpus::evaluate_events(&self.events, now_ns, &self.th, &mut seen);
        self.store.apply(&seen, EVENT_RULES, now_ns);
        // Port findings that ended before their burst was judged get the verdict now.
        for f in self.store.ended_pending_upstream() {
            if let Some(evidence) = fabric::rejudge(&f, &grouping, &self.events.downs, now_ns) {
                self.store.revise_ended(&f.id, evidence);
            }
        }
        grouping
    }

    /// What the series rules read of this pass (`grouping`: its grouping).
    pub fn judged(&self, grouping: fabric::Grouping) -> Judged {
        Judged {
            events: self.events.for_series(),
            grouping,
        }
    }
}

/// The series rules and their state: the tick thread's own.
pub struct SeriesEngine {
    th: Thresholds,
    tracks: Tracks,
    pass: u64,
    store: Arc<FindingsStore>,
    /// The job each GPU's series last carried (the affinity rule's; the event rules get a copy
    /// when it changes).
    gpu_jobs: GpuJobs,
    gpu_jobs_changed: bool,
    /// The nodes of which a hardware-path series appeared, changed value or went since their
    /// hardware was last handed to the profile's learner.
    hardware_changed: HashSet<Arc<str>, foldhash::fast::RandomState>,
    /// The pass that last handed hardware to the learner.
    profile_pass: u64,
    /// Learns the golden profile off this thread (see the `learner` module).
    learner: ProfileLearner,
    /// What the golden profile's rules saw when it was last learnt (handed to the store at
    /// every full pass).
    profile_seen: Vec<Observation>,
    /// Each node's hardware path as the profile last read it (the affinity rule's map of
    /// GPUs and NICs).
    hardware: FleetHardware,
    /// How the tick reads the live view, kept between ticks.
    live: LiveReader,
    /// Nodes the archive heard before this collector started, not heard since, with when
    /// their last frame came (Unix ns): silent since then, once `silent-after-s` has passed.
    heard_before: HashMap<Arc<str>, u64>,
    /// The nodes' clock estimates as last handed to the events thread.
    clocks: HashMap<Arc<str>, NodeClock>,
}

/// The golden profile is learnt again at most once every this many passes (30 s at the
/// default tick), and only when a node's hardware series changed: a GPU's link gauges change
/// with its load and its job, and the profile reads the whole fleet's hardware path.
const PROFILE_EVERY_PASSES: u64 = 6;

impl SeriesEngine {
    /// Reads the latest value of every watched series from the live view (see the `live`
    /// module); returns what the event rules need of it.
    pub fn refresh(&mut self, table: &dyn LiveTable) -> Refreshed {
        self.pass += 1;
        let pass = self.pass;
        let read = self
            .live
            .read(table, &mut self.tracks, &mut self.gpu_jobs, pass, watched);
        self.hardware_changed.extend(read.hardware_nodes);
        self.gpu_jobs_changed |= read.gpu_jobs_changed;
        let keep_ns = self.history_ns();
        let hardware_changed = &mut self.hardware_changed;
        // Series gone from the live view (its ttl) are forgotten; a counter's samples taken
        // since the last pass count as seen.
        self.tracks.retain(|k, t| {
            if t.seen_pass < pass && hardware::is_hardware_series(&k.1.name) {
                hardware_changed.insert(k.0.clone());
            }
            while t.checkpoints.len() > 1 && t.checkpoints[1].0 + keep_ns <= t.latest.unix_ns {
                t.checkpoints.pop_front();
            }
            while t
                .rises
                .front()
                .is_some_and(|&r| r + keep_ns <= t.latest.unix_ns)
            {
                t.rises.pop_front();
            }
            t.seen_pass >= pass
        });
        Refreshed {
            neighbours: read.neighbours,
            gpu_jobs: std::mem::take(&mut self.gpu_jobs_changed).then(|| self.gpu_jobs.clone()),
            clocks: self.clocks_changed(),
        }
    }

    /// The nodes' clock estimates that changed (or went) since the last call.
    fn clocks_changed(&mut self) -> Vec<(Arc<str>, Option<NodeClock>)> {
        let now = clock_skew::clocks(
            self.tracks.named(clock_skew::SERIES[0]),
            self.tracks.named(clock_skew::SERIES[1]),
        );
        let mut changed: Vec<(Arc<str>, Option<NodeClock>)> = now
            .iter()
            .filter(|(node, clock)| self.clocks.get(*node) != Some(clock))
            .map(|(node, clock)| (node.clone(), Some(*clock)))
            .collect();
        changed.extend(
            self.clocks
                .keys()
                .filter(|node| !now.contains_key(*node))
                .map(|node| (node.clone(), None)),
        );
        self.clocks = now;
        changed
    }

    /// Takes a frame's samples of the counters the rules read (from
    /// [`watched_counters`]), each by its own time.
    pub fn take_counters(&mut self, node: &Arc<str>, counters: CounterSamples) {
        // Seen in this pass-to-be: a series whose samples came is still there.
        let pass = self.pass + 1;
        for (series, samples) in counters {
            let Some(first) = samples.first() else {
                continue;
            };
            let first = Latest {
                unix_ns: first.unix_ns,
                value: LatestValue::Counter {
                    value: first.value,
                    per_second: None,
                },
            };
            let (_, track, _) = self
                .tracks
                .get_or_insert(&(node.clone(), series), || Track::new(first, pass));
            track.seen_pass = pass;
            for sample in samples {
                track.take_counter(sample.unix_ns, sample.value);
            }
        }
    }

    /// How far back counters are kept: the longest window a rule looks at.
    fn history_ns(&self) -> u64 {
        [3600, self.th.link_downed_hold_s, self.th.verbs_window_s, 60]
            .into_iter()
            .max()
            .unwrap_or(3600)
            * 1_000_000_000
    }

    /// Takes what the profile's learner learnt since the last pass (waiting for it: see the
    /// `learner` module), then, if it is time, hands it the hardware of the nodes whose
    /// hardware changed.
    fn learn_profile(&mut self) {
        if let Some(learnt) = self.learner.take() {
            if learnt.forgot {
                self.hardware_changed
                    .extend(self.live.node_names().cloned());
            }
            self.profile_seen = learnt.seen;
            self.hardware = learnt.hardware;
        }
        if self.hardware_changed.is_empty()
            || (self.profile_pass != 0 && self.pass < self.profile_pass + PROFILE_EVERY_PASSES)
        {
            return;
        }
        self.profile_pass = self.pass;
        let update = self
            .hardware_changed
            .drain()
            .map(|node| {
                let series = self.live.hardware_series(&node, &self.tracks);
                (node, series)
            })
            .collect();
        self.learner.hand(update);
    }

    /// Runs the series rules over the tracks and what the event rules `judged`, and hands
    /// what they saw to the store.
    pub fn evaluate(&mut self, judged: &Judged, now_ns: u64) {
        let (events, grouping) = (&judged.events, &judged.grouping);
        self.learn_profile();
        let rules = series_rules();
        let mut out = Verdicts::new(self.store.open_nodes(&rules));
        let view = View::new(&self.tracks, now_ns, &self.th);
        ib_links::evaluate_series(&view, events, grouping, &mut out);
        gpus::evaluate_series(&view, events, &mut out);
        verbs::evaluate(&view, &mut out);
        // The golden profile judged every node whose hardware path it read.
        out.seen.extend(self.profile_seen.iter().cloned());
        for node in self.hardware.keys() {
            for rule in profile::RULES {
                out.judged_node(rule, node);
            }
        }
        affinity::evaluate(&view, &self.gpu_jobs, &self.hardware, &mut out);
        pfc::evaluate(&view, &mut out);
        clock_skew::evaluate(&view, &mut out);
        // The nodes the table holds that sent nothing for `silent-after-s`: read before the
        // store ends anything, so their findings are kept.
        let after = self.th.silent_after_s;
        let before = now_ns.saturating_sub(after.saturating_mul(1_000_000_000));
        let mut silent = self.live.silent_since(self.pass, before);
        if !self.heard_before.is_empty() {
            let live = &self.live;
            self.heard_before.retain(|node, _| !live.knows(node));
            silent.extend(
                self.heard_before
                    .iter()
                    .filter(|(_, heard)| **heard < before)
                    .map(|(n, heard)| (n.clone(), *heard)),
            );
        }
        self.store.set_silent(
            silent
                .iter()
                .map(|(n, heard)| (n.to_string(), *heard))
                .collect(),
        );
        for node in self.live.node_names() {
            out.judged_node(silence::RULE, node);
        }
        silence::evaluate(&silent, after, now_ns, &mut out);
        self.store.apply_judged(&out, &rules, now_ns);
    }
}

/// The rules' state between passes, both halves: the findings thread splits it between its
/// events thread and its tick thread; tests drive it in one.
pub struct FindingsEngine {
    events: EventEngine,
    series: SeriesEngine,
}

impl FindingsEngine {
    /// The engine; `th.topology` is read here (the settings checked it at start: a file
    /// unreadable since is logged and the engine runs without it).
    pub fn new(th: Thresholds, store: Arc<FindingsStore>) -> Self {
        let min_nodes = th.profile_min_nodes;
        let topology = th
            .topology
            .as_deref()
            .and_then(|path| match Topology::load(path) {
                Ok(t) => Some(t),
                Err(e) => {
                    tracing::error!("{e}: upstream findings name no switch");
                    None
                }
            })
            .unwrap_or_default();
        Self {
            events: EventEngine {
                th: th.clone(),
                events: EventState::default(),
                store: store.clone(),
                topology,
                settles_at_ns: None,
            },
            series: SeriesEngine {
                th,
                tracks: Tracks::default(),
                pass: 0,
                store,
                gpu_jobs: GpuJobs::default(),
                gpu_jobs_changed: false,
                hardware_changed: HashSet::default(),
                profile_pass: 0,
                learner: ProfileLearner::new(min_nodes, Arc::new(ProfileBoard::default())),
                profile_seen: Vec::new(),
                hardware: FleetHardware::new(),
                live: LiveReader::default(),
                heard_before: HashMap::new(),
                clocks: HashMap::new(),
            },
        }
    }

    /// Publishes the golden profile on `board` (the HTTP routes read it there).
    pub fn with_board(mut self, board: Arc<ProfileBoard>) -> Self {
        self.series.learner.set_board(board);
        self
    }

    /// The nodes the archive heard before this collector started, each with when its last
    /// frame came: one not heard again is `node_silent` since then (a restarted collector
    /// knows the fleet it had, not only the nodes heard since).
    pub fn heard_before(mut self, heard: HashMap<Arc<str>, u64>) -> Self {
        self.series.heard_before = heard;
        self
    }

    /// Takes an event the collector took at `arrived_ns` (its own clock).
    pub fn take_event(&mut self, node: &str, event: &WireEvent, arrived_ns: u64) {
        self.events.take_event(node, event, arrived_ns);
    }

    /// Takes a frame's port state samples (from [`port_states`]).
    pub fn take_port_states(&mut self, node: &str, samples: PortStateSamples) -> bool {
        self.events.take_port_states(node, samples)
    }

    /// Takes a frame's counter samples (from [`watched_counters`]).
    pub fn take_counters(&mut self, node: &Arc<str>, counters: CounterSamples) {
        self.series.take_counters(node, counters);
    }

    /// Takes all the findings threads get of one frame accepted at `arrived_ns`, as ingest
    /// hands it over: its events, its port states and its watched counters' samples. True
    /// if the event rules are due. (For a caller that drives the engine itself: the tests,
    /// the tick's example.)
    pub fn take_frame(
        &mut self,
        node: &Arc<str>,
        frame: &Frame,
        schema: &Schema,
        arrived_ns: u64,
    ) -> bool {
        let mut due = false;
        for e in &frame.events {
            self.take_event(node, e, arrived_ns);
            due = true;
        }
        self.take_counters(node, watched_counters(frame, schema));
        due | self.take_port_states(node, port_states(frame, schema))
    }

    /// Reads the live view (the tick's first step).
    pub fn refresh(&mut self, table: &dyn LiveTable) {
        let r = self.series.refresh(table);
        self.events.refreshed(r);
    }

    /// Runs the rules of `pass` and hands what they saw to the store.
    pub fn evaluate(&mut self, pass: Pass, now_ns: u64) {
        let grouping = self.events.evaluate(now_ns);
        if pass == Pass::All {
            let judged = self.events.judged(grouping);
            self.series.evaluate(&judged, now_ns);
        }
    }

    pub fn store(&self) -> &Arc<FindingsStore> {
        &self.events.store
    }

    pub fn thresholds(&self) -> &Thresholds {
        &self.events.th
    }
}

/// Every rule's name.
pub fn all_rules() -> Vec<&'static str> {
    ib_links::RULES
        .iter()
        .chain(fabric::RULES)
        .chain(gpus::RULES)
        .chain(verbs::RULES)
        .chain(profile::RULES)
        .chain(pfc::RULES)
        .chain(affinity::RULES)
        .chain(silence::RULES)
        .chain(clock_skew::RULES)
        .copied()
        .collect()
}

/// The running findings threads.
pub struct FindingsThread {
    stop: Arc<AtomicBool>,
    handles: Vec<JoinHandle<()>>,
}

impl FindingsThread {
    /// Starts the threads: the events thread ("findings", beating `heartbeat`) on the events
    /// and port states of `rx`, the tick thread ("findings-tick", beating `tick_heartbeat`) on
    /// its counter samples and the live node table `live` (all they read of what the
    /// collector shares).
    pub fn spawn<L: LiveTable + 'static>(
        engine: FindingsEngine,
        rx: InboxReceivers,
        live: Arc<L>,
        heartbeat: Heartbeat,
        tick_heartbeat: Heartbeat,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let FindingsEngine { events, series } = engine;
        let InboxReceivers {
            events: events_rx,
            counters,
            to_events,
        } = rx;
        let mut handles = Vec::new();
        handles.push(std::thread::Builder::new().name("findings".into()).spawn({
            let stop = stop.clone();
            move || run_events(events, events_rx, stop, heartbeat)
        })?);
        let tick = std::thread::Builder::new()
            .name("findings-tick".into())
            .spawn({
                let stop = stop.clone();
                move || run_ticks(series, counters, to_events, live, stop, tick_heartbeat)
            });
        match tick {
            Ok(h) => handles.push(h),
            Err(e) => {
                Self { stop, handles }.stop();
                return Err(e);
            }
        }
        Ok(Self { stop, handles })
    }

    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// Events are evaluated at most this often (a burst is taken as one pass).
const EVENT_PASS_EVERY: Duration = Duration::from_millis(100);

/// The events thread: takes events and port states, and runs an event pass within
/// [`EVENT_PASS_EVERY`] of one that changed something; answers the tick thread's requests.
fn run_events(
    mut engine: EventEngine,
    rx: Receiver<FindingsInput>,
    stop: Arc<AtomicBool>,
    heartbeat: Heartbeat,
) {
    while !stop.load(Ordering::Relaxed) {
        heartbeat.beat();
        if engine.burst_due(unix_now_ns()) {
            // A burst of port DOWN transitions has settled: judged now rather than at the
            // tick, so a node's own port finding is not held back longer than it must be.
            engine.evaluate(unix_now_ns());
        }
        match rx.recv_timeout(BEAT_EVERY) {
            Ok(input) => {
                let mut due = take(&mut engine, input);
                let until = Instant::now() + EVENT_PASS_EVERY;
                while let Ok(input) =
                    rx.recv_timeout(until.saturating_duration_since(Instant::now()))
                {
                    due |= take(&mut engine, input);
                }
                if due {
                    engine.evaluate(unix_now_ns());
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
}

/// Takes one message of the events thread; true if the event rules are due.
fn take(engine: &mut EventEngine, input: FindingsInput) -> bool {
    match input {
        FindingsInput::Event(node, event) => {
            engine.take_event(&node, &event, unix_now_ns());
            true
        }
        FindingsInput::PortStates(node, samples) => engine.take_port_states(&node, samples),
        FindingsInput::Tick(request) => {
            let TickRequest { refreshed, reply } = *request;
            engine.refreshed(refreshed);
            // Every event taken so far is judged in this pass: nothing is left due.
            let grouping = engine.evaluate(unix_now_ns());
            let _ = reply.send(engine.judged(grouping));
            false
        }
    }
}

/// The tick thread: takes counter samples, and every `tick-s` reads the live view, has the
/// events thread judge the events so far, and runs the series rules.
fn run_ticks<L: LiveTable>(
    mut engine: SeriesEngine,
    counters: Receiver<CounterInput>,
    to_events: SyncSender<FindingsInput>,
    live: Arc<L>,
    stop: Arc<AtomicBool>,
    heartbeat: Heartbeat,
) {
    let tick = Duration::from_secs(engine.th.tick_s);
    let mut next_tick = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        heartbeat.beat();
        let now = Instant::now();
        if now >= next_tick {
            // What ingest handed over before the live view is read is taken first, so the
            // tick never sees a counter's latest value without the samples that led to it.
            while let Ok((node, samples)) = counters.try_recv() {
                engine.take_counters(&node, samples);
            }
            let refreshed = engine.refresh(&*live);
            let (reply, answer) = std::sync::mpsc::sync_channel(1);
            let request = Box::new(TickRequest { refreshed, reply });
            if to_events.send(FindingsInput::Tick(request)).is_err() {
                break;
            }
            let judged = loop {
                match answer.recv_timeout(BEAT_EVERY) {
                    Ok(judged) => break Some(judged),
                    Err(RecvTimeoutError::Timeout) if !stop.load(Ordering::Relaxed) => {}
                    Err(_) => break None,
                }
            };
            let Some(judged) = judged else { break };
            engine.evaluate(&judged, unix_now_ns());
            engine.store.ticks().record(now.elapsed());
            next_tick = now + tick;
        }
        let wait = next_tick
            .saturating_duration_since(Instant::now())
            .min(BEAT_EVERY);
        match counters.recv_timeout(wait) {
            Ok((node, samples)) => engine.take_counters(&node, samples),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Condvar, Mutex};

    use monitor_wire::{Labels, names::event_kind};

    use super::*;
    use crate::{Severity, live_table::NodeLatest};

    /// An empty live view whose reading blocks until the test opens it: a tick that takes as
    /// long as the test wants.
    struct Gated {
        state: Mutex<(bool, bool)>,
        changed: Condvar,
    }

    impl Gated {
        /// Waits until the tick thread is inside its read of the live view.
        fn wait_entered(&self) {
            let mut s = self.state.lock().unwrap();
            while !s.0 {
                s = self.changed.wait(s).unwrap();
            }
        }

        fn open(&self) {
            self.state.lock().unwrap().1 = true;
            self.changed.notify_all();
        }
    }

    impl LiveTable for Gated {
        fn visit_nodes(&self, _: &mut dyn FnMut(&NodeLatest)) {
            let mut s = self.state.lock().unwrap();
            s.0 = true;
            self.changed.notify_all();
            while !s.1 {
                s = self.changed.wait(s).unwrap();
            }
        }
    }

    #[test]
    fn an_event_is_judged_while_a_tick_is_still_running() {
        let store = Arc::new(FindingsStore::in_memory());
        let live = Arc::new(Gated {
            state: Mutex::new((false, false)),
            changed: Condvar::new(),
        });
        let (inbox, rx) = FindingsInbox::new();
        let engine = FindingsEngine::new(Thresholds::default(), store.clone());
        let threads =
            FindingsThread::spawn(engine, rx, live.clone(), Heartbeat::new(), Heartbeat::new())
                .unwrap();
        // The first tick starts at once and is held inside its read of the live view.
        live.wait_entered();
        let down = WireEvent {
            unix_ns: unix_now_ns(),
            kind: event_kind::PORT_TRANSITION.into(),
            labels: Labels::new([("device", "mlx5_0"), ("port", "1"), ("from", "UP")]),
            code: 0,
            text: "DOWN".into(),
        };
        inbox.push(&Arc::from("node-001"), &down);
        // However long that takes (the bound only keeps a broken engine from hanging the
        // test): the check is that it happens while the tick is held.
        let found = (0..6000)
            .find_map(|_| {
                let f = store
                    .active()
                    .into_iter()
                    .find(|f| f.rule == "ib_port_down");
                if f.is_none() {
                    std::thread::sleep(Duration::from_millis(10));
                }
                f
            })
            .expect("the port's finding, while the tick is held");
        assert_eq!(store.ticks().snapshot().0, 0, "the tick is still held");
        assert_eq!(found.node, "node-001");
        assert_eq!(found.severity, Severity::Critical);
        assert_eq!(found.evidence["down_at"], down.unix_ns);
        assert_eq!(found.evidence["upstream"], "pending");
        // Let go, the tick finishes (its event pass and its series pass).
        live.open();
        let ticked = (0..6000).any(|_| {
            let done = store.ticks().snapshot().0 == 1;
            if !done {
                std::thread::sleep(Duration::from_millis(10));
            }
            done
        });
        assert!(ticked, "the tick finished once let go");
        threads.stop();
    }
}
