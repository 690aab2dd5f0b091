//! The findings thread: events come from ingest through a bounded channel ([`FindingsInbox`])
//! and are evaluated at once; so do the samples of the counters the rules read, a frame's
//! worth at a time, which the thread folds into each counter's history by the samples' own
//! times; gauges are read from the live view (the node table's latest value of each series)
//! every `tick-s`. Nothing is evaluated per sample on the receive threads. Each pass runs the
//! rules and hands what they saw to the [`FindingsStore`], which opens, keeps and ends
//! findings.
//!
//! Why counters come as samples and gauges do not: a counter rule asks how much a counter rose
//! within a window, which needs the value before the rise. Read from the live view at each
//! tick, the rule saw only what the tick happened to see: a baseline and its rise arriving
//! between two ticks (a node's first frames, a backlog, history sent in one burst) left the
//! rise unseen, and the same data gave different findings at a different arrival pace. A gauge
//! rule asks only what a value is now, which the latest sample answers.

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

use monitor_wire::{CounterSample, Frame, Kind, Series, SeriesData, WireEvent};

use super::{
    FindingsStore, Observation, Thresholds, affinity, fabric, gpus,
    hardware::{self, HardwareReader},
    ib_links,
    live::LiveReader,
    pfc,
    profile::{self, GoldenProfile, ProfileBoard},
    topology::Topology,
    verbs,
    view::{EventState, Track, Tracks, View},
};
use crate::{
    clock::unix_now_ns,
    liveness::{BEAT_EVERY, Heartbeat},
    nodes::{Latest, LatestValue, NodeTable, Schema},
};

/// Messages waiting for the findings thread at most: events, and frames' counter samples
/// (beyond it they are counted and dropped: the receive threads never wait for it).
const INBOX_CAPACITY: usize = 65_536;

/// The samples of one frame of the counters the rules read, by series, in the frame's order.
pub type CounterSamples = Vec<(Series, Vec<CounterSample>)>;

/// What ingest hands the findings thread.
#[derive(Debug)]
pub enum FindingsInput {
    Event(Arc<str>, WireEvent),
    Counters(Arc<str>, CounterSamples),
}

/// Where ingest hands events and counter samples to the findings thread.
#[derive(Clone)]
pub struct FindingsInbox {
    tx: SyncSender<FindingsInput>,
    dropped: Arc<AtomicU64>,
}

impl FindingsInbox {
    /// An inbox and the receiving end the findings thread reads.
    pub fn new() -> (Self, Receiver<FindingsInput>) {
        let (tx, rx) = std::sync::mpsc::sync_channel(INBOX_CAPACITY);
        (
            Self {
                tx,
                dropped: Arc::new(AtomicU64::new(0)),
            },
            rx,
        )
    }

    pub fn push(&self, node: &Arc<str>, event: &WireEvent) {
        self.send(FindingsInput::Event(node.clone(), event.clone()));
    }

    /// Hands over the watched counters' samples of an accepted frame, if it has any.
    pub fn push_counters(&self, node: &Arc<str>, frame: &Frame, schema: &Schema) {
        let counters = watched_counters(frame, schema);
        if !counters.is_empty() {
            self.send(FindingsInput::Counters(node.clone(), counters));
        }
    }

    fn send(&self, input: FindingsInput) {
        match self.tx.try_send(input) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Messages the findings thread could not take (its inbox was full).
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

/// Which rules a pass evaluated: a finding of a rule a pass did not evaluate is left alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// The event rules only (an event came in).
    Events,
    /// Every rule (the tick).
    All,
}

pub const EVENT_RULES: &[&str] = &["ib_link_flapping", fabric::RULE, "gpu_xid", "gpu_lost"];

/// The rules' state between passes.
pub struct FindingsEngine {
    th: Thresholds,
    tracks: Tracks,
    pub events: EventState,
    pass: u64,
    store: Arc<FindingsStore>,
    /// Which switch each port hangs off: `[findings] topology` if given, and the agents'
    /// LLDP neighbours (read from the live view at each tick) for ports it does not cover.
    topology: Topology,
    /// When the first burst of DOWN transitions not judged yet will be (collector clock).
    settles_at_ns: Option<u64>,
    /// A hardware-path series appeared, changed value or went since the profile was learnt.
    hardware_changed: bool,
    /// The pass that last learnt the golden profile.
    profile_pass: u64,
    /// What the golden profile's rules saw when it was last learnt (handed to the store at
    /// every full pass).
    profile_seen: Vec<Observation>,
    /// Where the profile is published for `GET /api/v1/nodes/{node}/hardware`.
    board: Arc<ProfileBoard>,
    /// Each node's hardware path as the profile last read it (the affinity rule's map of
    /// GPUs and NICs).
    hardware: HashMap<Arc<str>, hardware::NodeHardware>,
    /// How the tick reads the live view, kept between ticks.
    live: LiveReader,
}

/// The golden profile is learnt again at most once every this many passes (30 s at the
/// default tick), and only when a node's hardware series changed: a GPU's link gauges change
/// with its load and its job, and the profile reads the whole fleet's hardware path.
const PROFILE_EVERY_PASSES: u64 = 6;

impl FindingsEngine {
    /// The engine; `th.topology` is read here (the settings checked it at start: a file
    /// unreadable since is logged and the engine runs without it).
    pub fn new(th: Thresholds, store: Arc<FindingsStore>) -> Self {
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
            th,
            tracks: Tracks::default(),
            events: EventState::default(),
            pass: 0,
            store,
            topology,
            settles_at_ns: None,
            hardware_changed: true,
            profile_pass: 0,
            profile_seen: Vec::new(),
            board: Arc::new(ProfileBoard::default()),
            hardware: HashMap::new(),
            live: LiveReader::default(),
        }
    }

    /// Publishes the golden profile on `board` (the HTTP routes read it there).
    pub fn with_board(mut self, board: Arc<ProfileBoard>) -> Self {
        self.board = board;
        self
    }

    /// Takes an event the collector took at `arrived_ns` (its own clock).
    pub fn take_event(&mut self, node: &str, event: &WireEvent, arrived_ns: u64) {
        self.events.take(node, event, arrived_ns);
    }

    /// Whether a burst of DOWN transitions waiting to be judged is due at `now_ns`.
    pub fn burst_due(&self, now_ns: u64) -> bool {
        self.settles_at_ns.is_some_and(|t| now_ns >= t)
    }

    /// Takes one message of the inbox; true if it was an event (the event rules are due).
    pub fn take(&mut self, input: FindingsInput) -> bool {
        match input {
            FindingsInput::Event(node, event) => {
                self.take_event(&node, &event, unix_now_ns());
                true
            }
            FindingsInput::Counters(node, counters) => {
                self.take_counters(&node, counters);
                false
            }
        }
    }

    /// Reads the latest value of every watched series from the live view (see the `live` module).
    pub fn refresh(&mut self, table: &NodeTable) {
        self.pass += 1;
        let pass = self.pass;
        let read = self
            .live
            .read(table, &mut self.tracks, &mut self.events, pass, watched);
        self.hardware_changed |= read.hardware_changed;
        if let Some(neighbours) = read.neighbours {
            self.topology.set_neighbours(neighbours);
        }
        let keep_ns = self.history_ns();
        let hardware_changed = &mut self.hardware_changed;
        // Series gone from the live view (its ttl) are forgotten; a counter's samples taken
        // since the last pass count as seen.
        self.tracks.retain(|k, t| {
            if t.seen_pass < pass && hardware::is_hardware_series(&k.1.name) {
                *hardware_changed = true;
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

    /// Runs the rules of `pass` and hands what they saw to the store.
    pub fn evaluate(&mut self, pass: Pass, now_ns: u64) {
        self.events.prune(now_ns, &self.th);
        let grouping = fabric::Grouping::of(&self.events, now_ns, &self.th, Some(&self.topology));
        self.settles_at_ns = grouping.settles_at_ns;
        let mut seen = Vec::new();
        ib_links::evaluate_events(&self.events, &grouping, now_ns, &self.th, &mut seen);
        grouping.evaluate(now_ns, &mut seen);
        gpus::evaluate_events(&self.events, now_ns, &self.th, &mut seen);
        let rules: Vec<&str> = match pass {
            Pass::Events => EVENT_RULES.to_vec(),
            Pass::All => {
                let view = View::new(&self.tracks, now_ns, &self.th);
                ib_links::evaluate_series(&view, &self.events, &grouping, &mut seen);
                gpus::evaluate_series(&view, &self.events, &mut seen);
                verbs::evaluate(&view, &mut seen);
                if self.hardware_changed
                    && (self.profile_pass == 0
                        || self.pass >= self.profile_pass + PROFILE_EVERY_PASSES)
                {
                    self.hardware_changed = false;
                    self.profile_pass = self.pass;
                    let (profile_seen, hardware) = learn_profile(&view, &self.th, &self.board);
                    self.profile_seen = profile_seen;
                    self.hardware = hardware;
                }
                seen.extend(self.profile_seen.iter().cloned());
                affinity::evaluate(&view, &self.events, &self.hardware, &mut seen);
                pfc::evaluate(&view, &mut seen);
                all_rules()
            }
        };
        self.store.apply(&seen, &rules, now_ns);
    }

    pub fn store(&self) -> &Arc<FindingsStore> {
        &self.store
    }

    pub fn thresholds(&self) -> &Thresholds {
        &self.th
    }
}

/// Reads every node's hardware path from the view, learns the golden profile, publishes it on
/// `board` and returns what its rules see, and each node's hardware path.
fn learn_profile(
    view: &View,
    th: &Thresholds,
    board: &ProfileBoard,
) -> (Vec<Observation>, HashMap<Arc<str>, hardware::NodeHardware>) {
    let mut readers: HashMap<&Arc<str>, HardwareReader, foldhash::fast::RandomState> =
        HashMap::default();
    for name in hardware::SERIES {
        for ((node, series), track) in view.named(name) {
            readers.entry(node).or_default().take(series, &track.latest);
        }
    }
    let nodes: HashMap<Arc<str>, hardware::NodeHardware> = readers
        .into_iter()
        .map(|(node, r)| (node.clone(), r.finish()))
        .collect();
    let golden = GoldenProfile::learn(nodes.iter().map(|(n, hw)| (&**n, hw)), th.profile_min_nodes);
    let mut seen = Vec::new();
    for (node, hw) in &nodes {
        golden.evaluate(node, hw, &mut seen);
    }
    board.publish(golden);
    (seen, nodes)
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
        .copied()
        .collect()
}

/// The running findings thread.
pub struct FindingsThread {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl FindingsThread {
    /// Starts the thread: events and counter samples from `rx`, gauges from the live node
    /// table `live` (all the thread reads of what the collector shares).
    pub fn spawn<L: AsRef<NodeTable> + Send + Sync + 'static>(
        engine: FindingsEngine,
        rx: Receiver<FindingsInput>,
        live: Arc<L>,
        heartbeat: Heartbeat,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let handle = std::thread::Builder::new().name("findings".into()).spawn({
            let stop = stop.clone();
            move || run(engine, rx, live, stop, heartbeat)
        })?;
        Ok(Self {
            stop,
            handle: Some(handle),
        })
    }

    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Events are evaluated at most this often (a burst is taken as one pass).
const EVENT_PASS_EVERY: Duration = Duration::from_millis(100);

fn run<L: AsRef<NodeTable>>(
    mut engine: FindingsEngine,
    rx: Receiver<FindingsInput>,
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
            // (Events among them are evaluated by the full pass.)
            while let Ok(input) = rx.try_recv() {
                engine.take(input);
            }
            engine.refresh((*live).as_ref());
            engine.evaluate(Pass::All, unix_now_ns());
            engine.store.ticks().record(now.elapsed());
            next_tick = now + tick;
        } else if engine.burst_due(unix_now_ns()) {
            // A burst of port DOWN transitions has settled: judged now rather than at the
            // tick, so a node's own port finding is not held back longer than it must be.
            engine.evaluate(Pass::Events, unix_now_ns());
        }
        let wait = next_tick
            .saturating_duration_since(Instant::now())
            .min(BEAT_EVERY);
        match rx.recv_timeout(wait) {
            Ok(input) => {
                let mut events = engine.take(input);
                let until = Instant::now() + EVENT_PASS_EVERY;
                while let Ok(input) =
                    rx.recv_timeout(until.saturating_duration_since(Instant::now()))
                {
                    events |= engine.take(input);
                }
                if events {
                    engine.evaluate(Pass::Events, unix_now_ns());
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
}
