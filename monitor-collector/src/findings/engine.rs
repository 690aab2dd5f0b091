//! The findings thread: events come from ingest through a bounded channel ([`FindingsInbox`])
//! and are evaluated at once; counters and gauges are read from the live view (the node
//! table's latest value of each series) every `tick-s`, never per sample on the receive
//! threads. Each pass runs the rules and hands what they saw to the [`FindingsStore`], which
//! opens, keeps and ends findings.

use std::{
    collections::{HashMap, VecDeque},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use railscope_wire::{Event, Kind, Series};

use super::{FindingsStore, Thresholds, gpus, ib_links, verbs};
use crate::{
    collector::Shared,
    ingest::unix_now_ns,
    liveness::{BEAT_EVERY, Heartbeat},
    nodes::{Latest, LatestValue, NodeTable},
};

/// Events waiting for the findings thread at most (beyond it they are counted and dropped:
/// the receive threads never wait for it).
const INBOX_CAPACITY: usize = 65_536;

/// Where ingest hands events to the findings thread.
#[derive(Clone)]
pub struct FindingsInbox {
    tx: SyncSender<(Arc<str>, Event)>,
    dropped: Arc<AtomicU64>,
}

impl FindingsInbox {
    /// An inbox and the receiving end the findings thread reads.
    pub fn new() -> (Self, Receiver<(Arc<str>, Event)>) {
        let (tx, rx) = std::sync::mpsc::sync_channel(INBOX_CAPACITY);
        (
            Self {
                tx,
                dropped: Arc::new(AtomicU64::new(0)),
            },
            rx,
        )
    }

    pub fn push(&self, node: &Arc<str>, event: &Event) {
        match self.tx.try_send((node.clone(), event.clone())) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Events the findings thread could not take (its inbox was full).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// The series the rules read; every other series of the live view is skipped.
fn watched(name: &str) -> bool {
    ib_links::SERIES.contains(&name) || gpus::SERIES.contains(&name) || name == verbs::SERIES
}

/// A counter's history is kept at this spacing...
const CHECKPOINT_EVERY_NS: u64 = 30_000_000_000;

/// One watched series as the engine follows it.
#[derive(Clone, Debug)]
pub struct Track {
    pub latest: Latest,
    /// When a gauge's value (mean) last changed, by sample time.
    pub changed_ns: u64,
    /// Counters: (sample time, value), one per [`CHECKPOINT_EVERY_NS`], the newest last.
    checkpoints: VecDeque<(u64, u64)>,
    /// The engine pass that last saw it in the live view.
    seen_pass: u64,
}

impl Track {
    pub fn gauge(&self) -> Option<f64> {
        match self.latest.value {
            LatestValue::Gauge { mean, .. } => Some(mean),
            LatestValue::Counter(_) => None,
        }
    }

    pub fn counter(&self) -> Option<u64> {
        match self.latest.value {
            LatestValue::Counter(v) => Some(v),
            LatestValue::Gauge { .. } => None,
        }
    }

    /// The counter's increase over the last `window_ns` of its samples (from the oldest
    /// checkpoint within it), and the seconds that covers; a value below the previous one is
    /// a reset and counts from zero. None until two samples are a second apart.
    pub fn increase(&self, window_ns: u64) -> Option<(u64, f64)> {
        let now = self.counter()?;
        let t = self.latest.unix_ns;
        let from = t.saturating_sub(window_ns);
        let &(t0, v0) = self.checkpoints.iter().find(|(ct, _)| *ct >= from)?;
        let span = (t.saturating_sub(t0)) as f64 / 1e9;
        if span < 1.0 {
            return None;
        }
        Some((if now >= v0 { now - v0 } else { now }, span))
    }

    /// Increase per second over the window.
    pub fn rate(&self, window_ns: u64) -> Option<f64> {
        self.increase(window_ns).map(|(n, s)| n as f64 / s)
    }
}

/// The node and series of a [`Track`].
pub type TrackKey = (Arc<str>, Series);

/// What the rules read in one pass.
pub struct View<'a> {
    pub tracks: &'a HashMap<TrackKey, Track>,
    pub now_ns: u64,
    pub th: &'a Thresholds,
}

impl View<'_> {
    pub fn named<'b>(&'b self, name: &'b str) -> impl Iterator<Item = (&'b TrackKey, &'b Track)> {
        self.tracks.iter().filter(move |(k, _)| &*k.1.name == name)
    }
}

/// A port's DOWN transitions and when they happened (event time).
#[derive(Debug, Default)]
pub struct EventState {
    /// (node, device, port) → DOWN transition times, oldest first.
    pub downs: HashMap<(String, String, u32), VecDeque<u64>>,
    /// (node, gpu) → XIDs seen: (time, code).
    pub xids: HashMap<(String, String), VecDeque<(u64, u64)>>,
    /// (node, gpu) → when it was lost.
    pub lost: HashMap<(String, String), u64>,
    /// (node, gpu) → the job its series last carried.
    pub gpu_jobs: HashMap<(String, String), String>,
}

impl EventState {
    fn take(&mut self, node: &str, e: &Event) {
        match e.kind.as_str() {
            // The kernel's port events as the probes see them, UP/DOWN folded by the agent.
            "port_transition" if e.code == 0 => {
                let (Some(device), Some(port)) = (
                    e.labels.get("device"),
                    e.labels.get("port").and_then(|p| p.parse().ok()),
                ) else {
                    return;
                };
                self.downs
                    .entry((node.into(), device.into(), port))
                    .or_default()
                    .push_back(e.unix_ns);
            }
            "xid" => {
                if let Some(gpu) = e.labels.get("gpu") {
                    self.xids
                        .entry((node.into(), gpu.into()))
                        .or_default()
                        .push_back((e.unix_ns, e.code.max(0) as u64));
                }
            }
            "gpu_lost" => {
                if let Some(gpu) = e.labels.get("gpu") {
                    self.lost.insert((node.into(), gpu.into()), e.unix_ns);
                }
            }
            _ => {}
        }
    }

    /// Forgets what is older than every window.
    fn prune(&mut self, now_ns: u64, th: &Thresholds) {
        let flap_from = now_ns.saturating_sub(th.flap_window_s * 1_000_000_000);
        self.downs.retain(|_, d| {
            while d.front().is_some_and(|&t| t < flap_from) {
                d.pop_front();
            }
            // Bounded whatever a port does.
            while d.len() > 10_000 {
                d.pop_front();
            }
            !d.is_empty()
        });
        let xid_from = now_ns.saturating_sub(th.xid_hold_s * 1_000_000_000);
        self.xids.retain(|_, x| {
            while x.front().is_some_and(|&(t, _)| t < xid_from) || x.len() > 1000 {
                x.pop_front();
            }
            !x.is_empty()
        });
        self.lost.retain(|_, &mut t| t >= xid_from);
    }

    pub fn job_of(&self, node: &str, gpu: &str) -> Option<String> {
        self.gpu_jobs.get(&(node.into(), gpu.into())).cloned()
    }
}

/// Which rules a pass evaluated: a finding of a rule a pass did not evaluate is left alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// The event rules only (an event came in).
    Events,
    /// Every rule (the tick).
    All,
}

pub const EVENT_RULES: &[&str] = &["ib_link_flapping", "gpu_xid", "gpu_lost"];

/// The rules' state between passes.
pub struct FindingsEngine {
    th: Thresholds,
    tracks: HashMap<TrackKey, Track>,
    pub events: EventState,
    pass: u64,
    store: Arc<FindingsStore>,
}

impl FindingsEngine {
    pub fn new(th: Thresholds, store: Arc<FindingsStore>) -> Self {
        Self {
            th,
            tracks: HashMap::new(),
            events: EventState::default(),
            pass: 0,
            store,
        }
    }

    pub fn take_event(&mut self, node: &str, event: &Event) {
        self.events.take(node, event);
    }

    /// Reads the latest value of every watched series from the live view.
    pub fn refresh(&mut self, table: &NodeTable) {
        self.pass += 1;
        let pass = self.pass;
        let tracks = &mut self.tracks;
        let gpu_jobs = &mut self.events.gpu_jobs;
        table.visit_latest(&mut |node, series, latest| {
            if !watched(&series.name) {
                return;
            }
            if series.name.starts_with("railscope_gpu_")
                && let (Some(gpu), Some(job)) =
                    (series.labels.get("gpu"), series.labels.get("job_id"))
            {
                gpu_jobs.insert((node.to_string(), gpu.into()), job.into());
            }
            let key = (node.clone(), series.clone());
            let track = tracks.entry(key).or_insert_with(|| Track {
                latest: *latest,
                changed_ns: latest.unix_ns,
                checkpoints: VecDeque::new(),
                seen_pass: pass,
            });
            track.seen_pass = pass;
            if latest.unix_ns < track.latest.unix_ns {
                return;
            }
            if let (LatestValue::Gauge { mean: a, .. }, LatestValue::Gauge { mean: b, .. }) =
                (track.latest.value, latest.value)
                && a.to_bits() != b.to_bits()
            {
                track.changed_ns = latest.unix_ns;
            }
            track.latest = *latest;
            if series.kind == Kind::Counter
                && let LatestValue::Counter(v) = latest.value
            {
                let due = track
                    .checkpoints
                    .back()
                    .is_none_or(|&(t, _)| latest.unix_ns >= t + CHECKPOINT_EVERY_NS);
                if due {
                    track.checkpoints.push_back((latest.unix_ns, v));
                }
            }
        });
        let keep_ns = self.history_ns();
        // Series gone from the live view (its ttl) are forgotten.
        self.tracks.retain(|_, t| {
            while t.checkpoints.len() > 1 && t.checkpoints[1].0 + keep_ns <= t.latest.unix_ns {
                t.checkpoints.pop_front();
            }
            t.seen_pass == pass
        });
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
        let mut seen = Vec::new();
        ib_links::evaluate_events(&self.events, now_ns, &self.th, &mut seen);
        gpus::evaluate_events(&self.events, now_ns, &self.th, &mut seen);
        let rules: Vec<&str> = match pass {
            Pass::Events => EVENT_RULES.to_vec(),
            Pass::All => {
                let view = View {
                    tracks: &self.tracks,
                    now_ns,
                    th: &self.th,
                };
                ib_links::evaluate_series(&view, &self.events, &mut seen);
                gpus::evaluate_series(&view, &self.events, &mut seen);
                verbs::evaluate(&view, &mut seen);
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

/// Every rule's name.
pub fn all_rules() -> Vec<&'static str> {
    ib_links::RULES
        .iter()
        .chain(gpus::RULES)
        .chain(verbs::RULES)
        .copied()
        .collect()
}

/// The running findings thread.
pub struct FindingsThread {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl FindingsThread {
    /// Starts the thread: events from `rx`, the live view from `shared`'s node table.
    pub fn spawn(
        engine: FindingsEngine,
        rx: Receiver<(Arc<str>, Event)>,
        shared: Arc<Shared>,
        heartbeat: Heartbeat,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let handle = std::thread::Builder::new().name("findings".into()).spawn({
            let stop = stop.clone();
            move || run(engine, rx, shared, stop, heartbeat)
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

fn run(
    mut engine: FindingsEngine,
    rx: Receiver<(Arc<str>, Event)>,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    heartbeat: Heartbeat,
) {
    let tick = Duration::from_secs(engine.th.tick_s);
    let mut next_tick = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        heartbeat.beat();
        let now = Instant::now();
        if now >= next_tick {
            engine.refresh(&shared.table);
            engine.evaluate(Pass::All, unix_now_ns());
            next_tick = now + tick;
        }
        let wait = next_tick
            .saturating_duration_since(Instant::now())
            .min(BEAT_EVERY);
        match rx.recv_timeout(wait) {
            Ok((node, event)) => {
                engine.take_event(&node, &event);
                let until = Instant::now() + EVENT_PASS_EVERY;
                while let Ok((node, event)) =
                    rx.recv_timeout(until.saturating_duration_since(Instant::now()))
                {
                    engine.take_event(&node, &event);
                }
                engine.evaluate(Pass::Events, unix_now_ns());
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
}
