//! What the rules read, kept by the engine between passes: each watched series' [`Track`]
//! (its latest value, and for counters their history by the samples' own times) and the
//! ports' [`EventState`]. Below both the engine and the rule modules, so a rule imports what
//! it reads without importing the engine that runs it.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::Arc,
};

use monitor_wire::{GaugeSample, Series, WireEvent, names::event_kind};

use super::{Thresholds, topology::PortKey};
use crate::live_table::{Latest, LatestValue};

/// A counter's history is kept at this spacing...
const CHECKPOINT_EVERY_NS: u64 = 30_000_000_000;

/// One watched series as the engine follows it.
#[derive(Clone, Debug)]
pub(crate) struct Track {
    pub latest: Latest,
    /// When a gauge's value (mean) last changed, by sample time.
    pub changed_ns: u64,
    /// Counters: (sample time, value), one per [`CHECKPOINT_EVERY_NS`], the newest last.
    pub(super) checkpoints: VecDeque<(u64, u64)>,
    /// Counters: the sample times at which the value rose (or reset), at most one per
    /// [`CHECKPOINT_EVERY_NS`], the newest last: when a rule's increase began.
    pub(super) rises: VecDeque<u64>,
    /// The engine pass that last saw it in the live view.
    pub(super) seen_pass: u64,
}

impl Track {
    pub(super) fn new(latest: Latest, pass: u64) -> Self {
        Self {
            latest,
            changed_ns: latest.unix_ns,
            checkpoints: VecDeque::new(),
            rises: VecDeque::new(),
            seen_pass: pass,
        }
    }

    /// Takes one counter sample, by its own time: a sample newer than the latest advances the
    /// counter (a checkpoint every [`CHECKPOINT_EVERY_NS`]); an older one only extends the
    /// history back, as a checkpoint before the first (a resent backlog, frames reordered).
    pub(super) fn take_counter(&mut self, unix_ns: u64, value: u64) {
        let newest = self.latest.unix_ns;
        let LatestValue::Counter { value: held, .. } = self.latest.value else {
            // A gauge of that name: the sender's bug, as the live view treats it.
            return;
        };
        if self.checkpoints.is_empty() {
            self.latest = Latest {
                unix_ns,
                value: LatestValue::Counter {
                    value,
                    per_second: None,
                },
            };
            self.checkpoints.push_back((unix_ns, value));
            return;
        }
        if unix_ns > newest {
            if value != held {
                let due = self
                    .rises
                    .back()
                    .is_none_or(|&t| unix_ns >= t + CHECKPOINT_EVERY_NS);
                if due {
                    self.rises.push_back(unix_ns);
                }
            }
            self.latest = Latest {
                unix_ns,
                value: LatestValue::Counter {
                    value,
                    per_second: None,
                },
            };
            let due = self
                .checkpoints
                .back()
                .is_none_or(|&(t, _)| unix_ns >= t + CHECKPOINT_EVERY_NS);
            if due {
                self.checkpoints.push_back((unix_ns, value));
            }
        } else if let Some(&(first_ns, first)) = self.checkpoints.front()
            && unix_ns + CHECKPOINT_EVERY_NS <= first_ns
        {
            if value != first {
                self.rises.push_front(first_ns);
            }
            self.checkpoints.push_front((unix_ns, value));
        }
    }

    /// When the counter first rose within the last `window_ns` of its samples (None: it did
    /// not, as far as its history shows).
    pub(crate) fn first_rise(&self, window_ns: u64) -> Option<u64> {
        let from = self.latest.unix_ns.saturating_sub(window_ns);
        self.rises.iter().copied().find(|&t| t >= from)
    }

    pub(crate) fn gauge(&self) -> Option<f64> {
        match self.latest.value {
            LatestValue::Gauge { mean, .. } => Some(mean),
            LatestValue::Counter { .. } => None,
        }
    }

    pub(crate) fn counter(&self) -> Option<u64> {
        match self.latest.value {
            LatestValue::Counter { value, .. } => Some(value),
            LatestValue::Gauge { .. } => None,
        }
    }

    /// The counter's increase over the last `window_ns` of its samples (from the oldest
    /// checkpoint within it), and the seconds that covers; a value below the previous one is
    /// a reset and counts from zero. None until two samples are a second apart.
    pub(crate) fn increase(&self, window_ns: u64) -> Option<(u64, f64)> {
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
    pub(crate) fn rate(&self, window_ns: u64) -> Option<f64> {
        self.increase(window_ns).map(|(n, s)| n as f64 / s)
    }
}

/// The node and series of a [`Track`].
pub(crate) type TrackKey = (Arc<str>, Series);

type FoldHashMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Where a track is held in [`Tracks`], and the generation of that place: a handle kept
/// across passes (the tick's per-node lists) finds its track again without hashing the
/// series, and a handle of a track since forgotten finds nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TrackHandle {
    slot: u32,
    generation: u32,
}

struct Held {
    key: TrackKey,
    track: Track,
    /// Its position in its name's list of `Tracks::by_name`.
    at: u32,
    places: Places,
}

/// A port or a GPU a track's series measures, as a number: the rules join a tick's series of
/// one port or GPU by it, where reading each series' labels again at every tick (millions of
/// series at 12,500 nodes) was most of the rules' time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Place(u32);

/// The places of a track's series, read from its labels once, when its track is made.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Places {
    /// (node, `device`, `port`), if it has both labels and the port is a number.
    pub port: Option<Place>,
    /// (node, `gpu`, `job_id`, `uuid`), each label if it has it (a series without them all
    /// shares its node's).
    pub gpu: Place,
}

#[derive(Clone, PartialEq, Eq, Hash)]
enum PlaceKey {
    Port(Arc<str>, String, u32),
    Gpu(Arc<str>, Option<String>, Option<String>, Option<String>),
}

/// The places tracks have, each with the number of tracks that have it (forgotten with the
/// last).
#[derive(Default)]
struct PlaceBook {
    ids: FoldHashMap<PlaceKey, u32>,
    /// By id: its key and how many tracks have it.
    held: Vec<Option<(PlaceKey, u32)>>,
    free: Vec<u32>,
}

impl PlaceBook {
    fn take(&mut self, key: PlaceKey) -> Place {
        if let Some(&id) = self.ids.get(&key) {
            self.held[id as usize].as_mut().expect("an id in use").1 += 1;
            return Place(id);
        }
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.held.push(None);
                (self.held.len() - 1) as u32
            }
        };
        self.held[id as usize] = Some((key.clone(), 1));
        self.ids.insert(key, id);
        Place(id)
    }

    fn release(&mut self, place: Place) {
        let slot = &mut self.held[place.0 as usize];
        let (_, refs) = slot.as_mut().expect("an id in use");
        *refs -= 1;
        if *refs == 0 {
            let (key, _) = slot.take().expect("checked");
            self.ids.remove(&key);
            self.free.push(place.0);
        }
    }

    fn places_of(&mut self, key: &TrackKey) -> Places {
        let labels = &key.1.labels;
        let port = labels.get("device").and_then(|device| {
            let port = labels.get("port")?.parse().ok()?;
            Some(self.take(PlaceKey::Port(key.0.clone(), device.to_owned(), port)))
        });
        let own = |name: &str| labels.get(name).map(str::to_owned);
        let gpu = self.take(PlaceKey::Gpu(
            key.0.clone(),
            own("gpu"),
            own("job_id"),
            own("uuid"),
        ));
        Places { port, gpu }
    }
}

struct Slot {
    generation: u32,
    held: Option<Held>,
}

/// A hasher for keys that are hashes already.
#[derive(Default)]
struct Prehashed(u64);

impl std::hash::Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// The tracks' slots by their key's hash: a key is hashed once when looked up or added, and
/// never again as the index grows (rehashing millions of keys' strings made the tick that
/// grew it the slowest).
#[derive(Default)]
struct KeyIndex {
    hasher: foldhash::fast::RandomState,
    first: HashMap<u64, u32, std::hash::BuildHasherDefault<Prehashed>>,
    /// Slots of keys whose hash another key in `first` has.
    more: HashMap<u64, Vec<u32>, std::hash::BuildHasherDefault<Prehashed>>,
}

impl KeyIndex {
    fn hash(&self, key: &TrackKey) -> u64 {
        use std::hash::BuildHasher as _;
        self.hasher.hash_one(key)
    }

    fn get(&self, key: &TrackKey, slots: &[Slot]) -> Option<u32> {
        let is = |slot: u32| {
            slots[slot as usize]
                .held
                .as_ref()
                .is_some_and(|h| h.key == *key)
        };
        let hash = self.hash(key);
        let &first = self.first.get(&hash)?;
        if is(first) {
            return Some(first);
        }
        self.more.get(&hash)?.iter().copied().find(|&s| is(s))
    }

    fn insert(&mut self, key: &TrackKey, slot: u32) {
        let hash = self.hash(key);
        match self.first.entry(hash) {
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(slot);
            }
            std::collections::hash_map::Entry::Occupied(_) => {
                self.more.entry(hash).or_default().push(slot);
            }
        }
    }

    fn remove(&mut self, key: &TrackKey, slot: u32) {
        let hash = self.hash(key);
        if self.first.get(&hash) == Some(&slot) {
            match self.more.get_mut(&hash) {
                Some(more) => {
                    let next = more.pop().expect("no empty list is kept");
                    if more.is_empty() {
                        self.more.remove(&hash);
                    }
                    self.first.insert(hash, next);
                }
                None => {
                    self.first.remove(&hash);
                }
            }
        } else if let Some(more) = self.more.get_mut(&hash) {
            more.retain(|&s| s != slot);
            if more.is_empty() {
                self.more.remove(&hash);
            }
        }
    }
}

/// Every watched series' track, by (node, series), and by series name (what the rules read:
/// each reads a few names). Tracks sit in slots that handles point to; the index by key is
/// asked only for a series new to the tick and for counter samples. Hashed with foldhash
/// rather than std's SipHash: the keys are the collector's own.
#[derive(Default)]
pub(crate) struct Tracks {
    slots: Vec<Slot>,
    free: Vec<u32>,
    index: KeyIndex,
    by_name: FoldHashMap<Arc<str>, Vec<u32>>,
    places: PlaceBook,
}

impl Tracks {
    /// The handle of `key`'s track, if it has one.
    pub(crate) fn handle(&self, key: &TrackKey) -> Option<TrackHandle> {
        let slot = self.index.get(key, &self.slots)?;
        Some(TrackHandle {
            slot,
            generation: self.slots[slot as usize].generation,
        })
    }

    /// The key of the track `handle` points to, if it is still held.
    pub(crate) fn key(&self, handle: TrackHandle) -> Option<&TrackKey> {
        let slot = self.slots.get(handle.slot as usize)?;
        if slot.generation != handle.generation {
            return None;
        }
        slot.held.as_ref().map(|h| &h.key)
    }

    /// The track `handle` points to, if it is still held.
    pub(crate) fn get(&self, handle: TrackHandle) -> Option<&Track> {
        let slot = self.slots.get(handle.slot as usize)?;
        if slot.generation != handle.generation {
            return None;
        }
        slot.held.as_ref().map(|h| &h.track)
    }

    /// The track `handle` points to, if it is still held.
    pub(crate) fn get_mut(&mut self, handle: TrackHandle) -> Option<&mut Track> {
        let slot = self.slots.get_mut(handle.slot as usize)?;
        if slot.generation != handle.generation {
            return None;
        }
        slot.held.as_mut().map(|h| &mut h.track)
    }

    /// `key`'s track, made by `new` if it has none; and whether it was made.
    pub(crate) fn get_or_insert(
        &mut self,
        key: &TrackKey,
        new: impl FnOnce() -> Track,
    ) -> (TrackHandle, &mut Track, bool) {
        let (slot, made) = match self.index.get(key, &self.slots) {
            Some(slot) => (slot, false),
            None => (self.insert(key.clone(), new()), true),
        };
        let held = &mut self.slots[slot as usize];
        let handle = TrackHandle {
            slot,
            generation: held.generation,
        };
        let track = &mut held
            .held
            .as_mut()
            .expect("an indexed slot holds a track")
            .track;
        (handle, track, made)
    }

    fn insert(&mut self, key: TrackKey, track: Track) -> u32 {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.slots.push(Slot {
                    generation: 0,
                    held: None,
                });
                (self.slots.len() - 1) as u32
            }
        };
        let named = match self.by_name.get_mut(&*key.1.name) {
            Some(named) => named,
            None => self.by_name.entry(key.1.name.clone()).or_default(),
        };
        named.push(slot);
        let at = (named.len() - 1) as u32;
        self.index.insert(&key, slot);
        let places = self.places.places_of(&key);
        self.slots[slot as usize].held = Some(Held {
            key,
            track,
            at,
            places,
        });
        slot
    }

    /// Keeps the tracks `keep` says to keep.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&TrackKey, &mut Track) -> bool) {
        for slot in 0..self.slots.len() {
            let Some(held) = self.slots[slot].held.as_mut() else {
                continue;
            };
            if keep(&held.key, &mut held.track) {
                continue;
            }
            let held = self.slots[slot].held.take().expect("checked");
            self.slots[slot].generation = self.slots[slot].generation.wrapping_add(1);
            self.free.push(slot as u32);
            self.index.remove(&held.key, slot as u32);
            if let Some(port) = held.places.port {
                self.places.release(port);
            }
            self.places.release(held.places.gpu);
            let named = self
                .by_name
                .get_mut(&*held.key.1.name)
                .expect("a held track is listed by name");
            named.swap_remove(held.at as usize);
            if let Some(&moved) = named.get(held.at as usize) {
                self.slots[moved as usize]
                    .held
                    .as_mut()
                    .expect("a listed slot holds a track")
                    .at = held.at;
            }
            if named.is_empty() {
                self.by_name.remove(&*held.key.1.name);
            }
        }
    }

    /// The tracks of the series named `name`.
    pub(crate) fn named<'b>(
        &'b self,
        name: &str,
    ) -> impl Iterator<Item = (&'b TrackKey, &'b Track)> {
        self.placed(name).map(|(k, t, _)| (k, t))
    }

    /// The tracks of the series named `name`, with their places.
    pub(crate) fn placed<'b>(
        &'b self,
        name: &str,
    ) -> impl Iterator<Item = (&'b TrackKey, &'b Track, Places)> {
        self.by_name.get(name).into_iter().flat_map(|slots| {
            slots.iter().map(|&slot| {
                let held = self.slots[slot as usize]
                    .held
                    .as_ref()
                    .expect("a listed slot holds a track");
                (&held.key, &held.track, held.places)
            })
        })
    }
}

/// What the rules read in one pass.
pub(crate) struct View<'a> {
    tracks: &'a Tracks,
    pub now_ns: u64,
    pub th: &'a Thresholds,
}

impl<'a> View<'a> {
    pub(crate) fn new(tracks: &'a Tracks, now_ns: u64, th: &'a Thresholds) -> Self {
        Self { tracks, now_ns, th }
    }

    pub(crate) fn named<'b>(
        &'b self,
        name: &'b str,
    ) -> impl Iterator<Item = (&'b TrackKey, &'b Track)> {
        self.tracks.named(name)
    }

    /// [`named`](Self::named), with each series' places.
    pub(crate) fn placed<'b>(
        &'b self,
        name: &'b str,
    ) -> impl Iterator<Item = (&'b TrackKey, &'b Track, Places)> {
        self.tracks.placed(name)
    }
}

/// A node's clock as its agent last estimated it (`clock_skew` reads it from the agent's
/// gauges; the fabric grouping puts DOWN transitions on the collector's clock with it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeClock {
    /// The node's clock minus the collector's, ns (positive: the node runs ahead).
    pub offset_ns: i64,
    /// The true offset is within this of `offset_ns`, ns.
    pub error_ns: u64,
    /// When the estimate was sent (the sample's time, on the node's clock).
    pub at_ns: u64,
}

impl NodeClock {
    /// A time of the node's clock on the collector's.
    pub fn on_collector_clock(&self, node_ns: u64) -> u64 {
        node_ns.saturating_add_signed(self.offset_ns.saturating_neg())
    }
}

/// One DOWN transition of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortDown {
    /// When the port went down (the event's kernel timestamp, as Unix ns).
    pub at_ns: u64,
    /// When the collector took the event (its own clock): a burst across nodes is judged
    /// once every node's frames have had time to arrive (`fabric-settle-s`).
    pub arrived_ns: u64,
}

/// `railscope_ib_port_state`: DOWN, and ACTIVE and above (ACTIVE_DEFER).
const STATE_DOWN: f64 = 1.0;
const STATE_ACTIVE: f64 = 4.0;

/// What said a port went down.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DownSource {
    /// Its DOWN transition (the kernel's port event), with the state it left.
    Event { from: String },
    /// A `railscope_ib_port_state` sample (a port down before the agent started, or whose
    /// event was lost).
    Sample,
}

/// A port down: since when (the DOWN transition's kernel timestamp, or the start of the first
/// state sample that saw it DOWN) and what said so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DownSince {
    pub at_ns: u64,
    pub source: DownSource,
}

/// A port as its transitions and its state samples say it is now.
#[derive(Clone, Debug, Default)]
pub struct PortNow {
    /// Down since; None while up (or not known down).
    pub down: Option<DownSince>,
    /// The time of the newest transition or state sample taken: an older one that arrives
    /// later (a frame resent, a flush after the event) is stale and changes nothing.
    pub seen_ns: u64,
    /// The latest `railscope_ib_port_phys_state` sample's value (Disabled: an operator's
    /// choice, not a fault).
    pub phys_state: Option<(u64, f64)>,
}

/// The port state samples of one frame (`railscope_ib_port_state` and `_phys_state`), by
/// series: the events thread takes them as they arrive, not at the tick.
pub(crate) type PortStateSamples = Vec<(Series, Vec<GaugeSample>)>;

/// A port's DOWN transitions and when they happened (event time).
#[derive(Debug, Default)]
pub struct EventState {
    /// (node, device, port) → DOWN transitions, oldest first.
    pub downs: HashMap<PortKey, VecDeque<PortDown>>,
    /// (node, device, port) → whether it is down now (`ib_port_down`).
    pub ports: HashMap<PortKey, PortNow>,
    /// Ports that went down and came back up since the rules last took them: (port, since
    /// when it was down, when it came up). A backlog of events taken at once (as after an
    /// outage) holds whole down periods no pass saw; they are findings all the same.
    pub closed: Vec<(PortKey, DownSince, u64)>,
    /// (node, gpu) → XIDs seen: (time, code).
    pub xids: HashMap<(String, String), VecDeque<(u64, u64)>>,
    /// (node, gpu) → when it was lost.
    pub lost: HashMap<(String, String), u64>,
    /// The job each GPU's series last carried, as the tick last handed it over.
    pub gpu_jobs: GpuJobs,
    /// Each node's clock as its agent last estimated it, as the tick last handed it over.
    pub clocks: HashMap<Arc<str>, NodeClock>,
    /// (node, device, port) → kernel time → the node's clock as estimated when that DOWN
    /// transition arrived: the fabric grouping puts it on the collector's clock with this,
    /// never with a later estimate (the node's clock may have been stepped since, and the
    /// transition's time was taken before). Absent where the node had no estimate then.
    pub down_clocks: HashMap<PortKey, HashMap<u64, NodeClock>>,
}

/// node → gpu → the job its series last carried (by node first, so a tick's walk looks it up
/// without making a key).
pub(crate) type GpuJobs = HashMap<Arc<str>, HashMap<String, String>>;

/// Notes that `node`'s GPU `gpu` carries `job` (allocating only when it changed); true if it
/// changed.
pub(super) fn note_gpu_job(jobs: &mut GpuJobs, node: &Arc<str>, gpu: &str, job: &str) -> bool {
    let gpus = match jobs.get_mut(node) {
        Some(gpus) => gpus,
        None => jobs.entry(node.clone()).or_default(),
    };
    if gpus.get(gpu).is_none_or(|known| known != job) {
        gpus.insert(gpu.to_owned(), job.to_owned());
        return true;
    }
    false
}

impl EventState {
    /// Takes one event, which the collector took at `arrived_ns`.
    pub(super) fn take(&mut self, node: &str, e: &WireEvent, arrived_ns: u64) {
        match e.kind.as_str() {
            // The kernel's port events as the probes see them, UP/DOWN folded by the agent.
            event_kind::PORT_TRANSITION => {
                let (Some(device), Some(port)) = (
                    e.labels.get("device"),
                    e.labels.get("port").and_then(|p| p.parse().ok()),
                ) else {
                    return;
                };
                let key: PortKey = (node.into(), device.into(), port);
                let down = e.code == 0;
                if down {
                    self.downs
                        .entry(key.clone())
                        .or_default()
                        .push_back(PortDown {
                            at_ns: e.unix_ns,
                            arrived_ns,
                        });
                    if let Some(clock) = self.clocks.get(node) {
                        self.down_clocks
                            .entry(key.clone())
                            .or_default()
                            .insert(e.unix_ns, *clock);
                    }
                }
                let from = e.labels.get("from").unwrap_or("UNKNOWN").to_owned();
                self.observe_port(
                    key,
                    (e.unix_ns, e.unix_ns),
                    down,
                    DownSource::Event { from },
                );
            }
            event_kind::XID => {
                if let Some(gpu) = e.labels.get("gpu") {
                    self.xids
                        .entry((node.into(), gpu.into()))
                        .or_default()
                        .push_back((e.unix_ns, e.code.max(0) as u64));
                }
            }
            event_kind::GPU_LOST => {
                if let Some(gpu) = e.labels.get("gpu") {
                    self.lost.insert((node.into(), gpu.into()), e.unix_ns);
                }
            }
            _ => {}
        }
    }

    /// Takes a frame's port state samples of `node`; true if a port went down or came back.
    pub(super) fn take_port_states(&mut self, node: &str, samples: PortStateSamples) -> bool {
        let mut changed = false;
        for (series, samples) in samples {
            let l = &series.labels;
            let (Some(device), Some(port)) =
                (l.get("device"), l.get("port").and_then(|p| p.parse().ok()))
            else {
                continue;
            };
            let key: PortKey = (node.into(), device.into(), port);
            let phys = &*series.name == monitor_wire::names::metric::IB_PORT_PHYS_STATE;
            for s in samples {
                if phys {
                    let p = self.ports.entry(key.clone()).or_default();
                    if p.phys_state.is_none_or(|(t, _)| s.end_unix_ns >= t) {
                        p.phys_state = Some((s.end_unix_ns, s.mean));
                    }
                    continue;
                }
                // A sample whose state changed within it says neither: the next one will.
                let down = if s.min == STATE_DOWN && s.max == STATE_DOWN {
                    true
                } else if s.min >= STATE_ACTIVE {
                    false
                } else {
                    continue;
                };
                changed |= self.observe_port(
                    key.clone(),
                    (s.start_unix_ns, s.end_unix_ns),
                    down,
                    DownSource::Sample,
                );
            }
        }
        changed
    }

    /// Takes that a port was seen down (or up) from `span.0` to `span.1`; true if that
    /// changed it.
    fn observe_port(
        &mut self,
        key: PortKey,
        span: (u64, u64),
        down: bool,
        source: DownSource,
    ) -> bool {
        let (at_ns, seen_ns) = span;
        let p = self.ports.entry(key.clone()).or_default();
        // A port a state sample saw down, whose DOWN transition comes after: the event's
        // kernel timestamp and the state it left are the finer account of the same going down.
        if let (Some(d), true, DownSource::Event { .. }) = (&p.down, down, &source)
            && d.source == DownSource::Sample
            && at_ns >= d.at_ns
        {
            p.down = Some(DownSince { at_ns, source });
            p.seen_ns = p.seen_ns.max(seen_ns);
            return true;
        }
        if seen_ns < p.seen_ns {
            return false;
        }
        p.seen_ns = seen_ns;
        match (&p.down, down) {
            (None, true) => {
                p.down = Some(DownSince { at_ns, source });
                true
            }
            (Some(_), false) => {
                if let Some(down) = p.down.take() {
                    self.closed.push((key, down, at_ns));
                }
                true
            }
            _ => false,
        }
    }

    /// Forgets what is older than every window.
    pub(super) fn prune(&mut self, now_ns: u64, th: &Thresholds) {
        // Kept as long as a rule looks back at them: the flap window, the upstream findings'
        // hold, and `link_downed`'s (whose findings are blamed on upstream by them).
        let keep_s = th
            .flap_window_s
            .max(th.fabric_hold_s)
            .max(th.link_downed_hold_s);
        let downs_from = now_ns.saturating_sub(keep_s * 1_000_000_000);
        self.downs.retain(|_, d| {
            while d.front().is_some_and(|d| d.at_ns < downs_from) {
                d.pop_front();
            }
            // Bounded whatever a port does.
            while d.len() > 10_000 {
                d.pop_front();
            }
            !d.is_empty()
        });
        // The clocks of the transitions kept: a port's, while it has more than transitions,
        // are cut down to those of its transitions (and to none with its last).
        let downs = &self.downs;
        self.down_clocks.retain(|port, clocks| {
            let Some(d) = downs.get(port) else {
                return false;
            };
            if clocks.len() > d.len() {
                let kept: HashSet<u64> = d.iter().map(|d| d.at_ns).collect();
                clocks.retain(|at, _| kept.contains(at));
            }
            !clocks.is_empty()
        });
        let xid_from = now_ns.saturating_sub(th.xid_hold_s * 1_000_000_000);
        self.xids.retain(|_, x| {
            while x.front().is_some_and(|&(t, _)| t < xid_from) || x.len() > 1000 {
                x.pop_front();
            }
            !x.is_empty()
        });
        self.lost.retain(|_, &mut t| t >= xid_from);
        // A port neither sampled nor transitioned for as long (its node gone) is forgotten.
        self.ports.retain(|_, p| p.seen_ns >= downs_from);
    }

    /// What the series rules read of the events (the tick's copy; see the engine): the DOWN
    /// transitions and the GPUs lost.
    pub(super) fn for_series(&self) -> EventState {
        EventState {
            downs: self.downs.clone(),
            lost: self.lost.clone(),
            ..EventState::default()
        }
    }

    pub fn job_of(&self, node: &str, gpu: &str) -> Option<String> {
        self.gpu_jobs.get(node)?.get(gpu).cloned()
    }
}
