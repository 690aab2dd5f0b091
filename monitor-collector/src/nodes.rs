//! What the collector knows of each sending node: its session, schema and sequence
//! accounting (a `monitor_wire::ReceiverState` per node), the latest value of each series,
//! its frame, loss, duplicate and replay counts, last seen, address and agent version.
//!
//! Nodes are spread over shards, each behind its own lock, so receive threads rarely wait
//! for one another; a datagram is routed to its shard by the node name in its header (read
//! before the MAC is checked: routing only, nothing is created for an unauthenticated name).
//! A node's frames are accounted under its shard's lock in one `decode`, so replays are
//! refused whichever socket they come in on.

use std::{
    hash::BuildHasher as _,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use monitor_wire::{
    self as wire, CounterSample, Frame, Key, Keyring, Kind, ReceiverState, Series, SeriesData,
    names::metric,
};

use monitor_findings::{
    live_table::{Latest, LatestValue, LiveTable, NodeLatest, Schema, Stamps},
    stragglers::{LiveSteps, recent::RecentSteps},
};

use crate::{
    config::Limits,
    drops::DropReason,
    node_keys::{DecodeError, IngestKeys, NodeKeys, Refused},
};
use monitor_archive::lock::lock;

/// Maps keyed by series id or node name: foldhash (seeded per process) rather than SipHash,
/// which was a measurable part of ingest (bench collector).
type HashMap<K, V> = foldhash::HashMap<K, V>;

/// A counter's latest sample among a frame's `samples`, with its rate from the sample before
/// it: the frame's own, or the one the table `held` (when older).
fn counter_latest(samples: &[CounterSample], held: Option<Latest>) -> Option<Latest> {
    let newest = samples.iter().max_by_key(|c| c.unix_ns)?;
    let before_in_frame = samples
        .iter()
        .filter(|c| c.unix_ns < newest.unix_ns)
        .max_by_key(|c| c.unix_ns)
        .map(|c| (c.unix_ns, c.value));
    let before_held = held.and_then(|h| match h.value {
        LatestValue::Counter { value, .. } if h.unix_ns < newest.unix_ns => {
            Some((h.unix_ns, value))
        }
        _ => None,
    });
    let before = before_in_frame
        .into_iter()
        .chain(before_held)
        .max_by_key(|&(t, _)| t);
    let per_second = before.and_then(|(t, value)| {
        let seconds = (newest.unix_ns - t) as f64 / 1e9;
        (newest.value >= value).then(|| ((newest.value - value) as f64 / seconds) as f32)
    });
    Some(Latest {
        unix_ns: newest.unix_ns,
        value: LatestValue::Counter {
            value: newest.value,
            per_second,
        },
    })
}

/// How much earlier than asked the table must have held a node whole to answer for it
/// ([`NodeTable::ruled_out`], [`NodeTable::visit_recent_steps`]): the clocks of agent and
/// collector may differ, and a frame takes time to arrive.
const SLACK_NS: u64 = 60_000_000_000;

/// Name of the series an agent reports its version in (a Prometheus `_info` gauge, 1, with a
/// `version` label).
pub const AGENT_INFO: &str = metric::AGENT_INFO;

/// The agent's latest clock offset estimate as its own gauges say (docs/agent.md, "Clock
/// offset"): (sample time, seconds) of `railscope_agent_clock_offset_seconds` and of
/// `railscope_agent_clock_offset_error_seconds`. Kept beside the agent's version rather than
/// looked up among the node's series, which `/metrics` would do for every node at each scrape.
#[derive(Clone, Copy, Debug, Default)]
struct ClockGauges {
    offset: Option<(u64, f64)>,
    error: Option<(u64, f64)>,
}

impl ClockGauges {
    /// Takes a sample of `name` if it is one of the two and newer than the one held.
    fn take(&mut self, name: &str, latest: &Latest) {
        let held = match name {
            metric::AGENT_CLOCK_OFFSET_SECONDS => &mut self.offset,
            metric::AGENT_CLOCK_OFFSET_ERROR_SECONDS => &mut self.error,
            _ => return,
        };
        if let LatestValue::Gauge { mean, .. } = latest.value
            && held.is_none_or(|(t, _)| latest.unix_ns >= t)
        {
            *held = Some((latest.unix_ns, mean));
        }
    }

    /// (offset, error bound), seconds, once the agent sent both.
    fn estimate(&self) -> Option<(f64, f64)> {
        Some((self.offset?.1, self.error?.1))
    }
}

/// Counts of one node beyond the receiver state's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeCounts {
    pub frames: u64,
    pub samples: u64,
    pub events: u64,
    pub bytes: u64,
    /// Frames refused as already received (duplicates, replays within the window).
    pub duplicates: u64,
    /// Frames refused as too old to place (replays of old sequence numbers or sessions).
    pub replayed: u64,
    /// Frames dropped while the node's session was refused for holding too many series.
    pub refused: u64,
    pub schema_requests: u64,
}

struct Node {
    name: Arc<str>,
    receiver: ReceiverState,
    schema: Arc<Schema>,
    latest: HashMap<u32, Latest>,
    counts: NodeCounts,
    /// Series held by the receiver state, as counted in the table's total.
    footprint: usize,
    last_seen_unix_ns: u64,
    address: SocketAddr,
    agent_version: Option<String>,
    clock: ClockGauges,
    /// A session that went beyond the series bounds: its frames are dropped until the node
    /// starts another session.
    refused_session: Option<u32>,
    /// When this session was last asked for its schema.
    schema_asked: Option<(u32, Instant)>,
    /// Its keys, derived when it was first heard from.
    keys: NodeKeys,
    /// Stamps (from the table's `next_stamp`) of the last change to its schema or the set of
    /// its latest values, and to any latest value: a reader that saw the same
    /// stamps saw the same node (the findings tick skips nodes that sent nothing since).
    schema_stamp: u64,
    latest_stamp: u64,
    /// Changes when the schema gained ids (and nothing else about it changed).
    grown_stamp: u64,
    /// Since when (the collector's clock) `latest` holds every series the node sent: its
    /// session's first frame here, or the last time an id was given another series. Before
    /// it, the node may have sent series the table never saw (before the collector
    /// started, in an earlier session): see [`NodeTable::ruled_out`]. Zero (always) when
    /// the table took the node's first session from its first frame (sequence 0) and the
    /// archive held no session of the node: there is nothing it did not see.
    complete_since_ns: u64,
    /// The straggler metrics' recent steps, spread at ingest (what a job's straggler search
    /// reads instead of the archive once the node is held whole over its window).
    recent: RecentSteps,
}

/// One node as the live view and `/metrics` show it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct NodeSummary {
    pub node: String,
    pub address: String,
    pub agent_version: Option<String>,
    /// The node's clock minus the collector's, seconds, as its agent last estimated it
    /// (`railscope_agent_clock_offset_seconds`); None until the agent sent one.
    pub clock_offset_seconds: Option<f64>,
    /// The bound of that estimate's error, seconds.
    pub clock_offset_error_seconds: Option<f64>,
    pub session: u32,
    pub last_seen_unix_ns: u64,
    pub series: usize,
    pub frames: u64,
    pub samples: u64,
    pub events: u64,
    pub bytes: u64,
    pub lost: u64,
    /// Frames of the session the collector stopped waiting for (its record of received
    /// frames at its bound): a copy arriving later is refused.
    pub given_up: u64,
    pub reordered: u64,
    pub duplicates: u64,
    pub replayed: u64,
    pub unknown_samples: u64,
    pub sessions: u64,
    pub refused: u64,
    pub schema_requests: u64,
    pub series_refused: bool,
    /// What sealed its last frame: `node` (its own key), `previous_node` (its key from the
    /// previous fleet secret, during a rotation) or `shared` (the cluster's shared key).
    pub key: &'static str,
}

/// One series' latest value, for `/metrics` and the live view.
#[derive(Clone, Debug)]
pub struct LiveSeries {
    pub node: Arc<str>,
    pub series: Series,
    pub latest: Latest,
}

/// A frame the table accepted.
#[derive(Debug)]
pub struct Accepted {
    pub node: Arc<str>,
    pub frame: Frame,
    /// The node's schema as of this frame (its own entries merged).
    pub schema: Arc<Schema>,
    /// Ask the sender for its schema: samples of unknown ids came, and this session was not
    /// asked in the last 5 s.
    pub ask_schema: bool,
    /// The key to seal the schema request with (the one the frame carried), when asked.
    pub reply_key: Option<Key>,
    /// The key the frame carried: acknowledgements are sealed with it.
    pub key: Key,
}

/// A sender is asked for its schema at most this often per session (its answer comes with its
/// next flush).
pub const SCHEMA_REQUEST_EVERY: Duration = Duration::from_secs(5);

const SHARDS: usize = 64;

/// The nodes whose names hash to one shard.
type Shard = Mutex<HashMap<Arc<str>, Node>>;

/// Which nodes a read of the live table covers: all, one, or one of `of` scrape shards (what
/// `/metrics?node=` and `/metrics?shard=&shards=` serve, so that a fleet of 12,500 nodes can be
/// scraped as many small targets rather than one answer of hundreds of megabytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeSet {
    All,
    One(String),
    /// The nodes whose name's [`shard_of`] is `index`.
    Shard {
        index: u64,
        of: u64,
    },
}

impl NodeSet {
    pub fn holds(&self, node: &str) -> bool {
        match self {
            NodeSet::All => true,
            NodeSet::One(name) => name == node,
            NodeSet::Shard { index, of } => shard_of(node, *of) == *index,
        }
    }
}

/// The scrape shard of `node` among `of`: FNV-1a of its name, so that a node stays in its
/// shard across collector restarts (a process-seeded hash would move every node's series to
/// another target at each restart).
pub fn shard_of(node: &str, of: u64) -> u64 {
    let hash = node.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    hash % of.max(1)
}

/// Every node, sharded by name.
pub struct NodeTable {
    shards: Box<[Shard]>,
    /// Sessions read back from the archive at start-up, per node not heard from yet: the
    /// node's receiver state starts from them (copies refused, the rest taken).
    resumed: Mutex<HashMap<Arc<str>, (u32, wire::SeqSet)>>,
    hasher: std::collections::hash_map::RandomState,
    nodes: AtomicUsize,
    series: AtomicUsize,
    /// The next node stamp (see `Node::schema_stamp`): unique over the table's life, so a
    /// node forgotten and heard from again never repeats one.
    stamps: AtomicU64,
    limits: Limits,
    keys: IngestKeys,
}

/// The session of a frame's header, read before the MAC is checked.
fn peek_session(bytes: &[u8]) -> Option<u32> {
    let at = 7 + usize::from(*bytes.get(6)?);
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// The time range a frame's samples and events cover (its send time if it has none).
pub fn time_range(frame: &Frame) -> (u64, u64) {
    let mut range: Option<(u64, u64)> = None;
    let mut add = |t0: u64, t1: u64| {
        range = Some(match range {
            None => (t0, t1),
            Some((a, b)) => (a.min(t0), b.max(t1)),
        });
    };
    for s in &frame.samples {
        match &s.data {
            SeriesData::Counter(v) => v.iter().for_each(|c| add(c.unix_ns, c.unix_ns)),
            SeriesData::Gauge(v) => v
                .iter()
                .for_each(|g| add(g.start_unix_ns.min(g.end_unix_ns), g.end_unix_ns)),
        }
    }
    for e in &frame.events {
        add(e.unix_ns, e.unix_ns);
    }
    range.unwrap_or((frame.send_unix_ns, frame.send_unix_ns))
}

impl NodeTable {
    pub fn new(keys: impl Into<Keyring>, limits: Limits) -> Self {
        Self {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(HashMap::default()))
                .collect(),
            resumed: Mutex::new(HashMap::default()),
            hasher: Default::default(),
            nodes: AtomicUsize::new(0),
            series: AtomicUsize::new(0),
            stamps: AtomicU64::new(1),
            limits,
            keys: IngestKeys::new(keys.into()),
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// What the archive holds of each node's newest session (read at start-up): a node's
    /// receiver state resumes from it when the node is first heard from.
    pub fn resume_from_archive(
        &self,
        held: impl IntoIterator<Item = (Arc<str>, (u32, wire::SeqSet))>,
    ) {
        *lock(&self.resumed) = held.into_iter().collect();
    }

    /// Takes a frame back out of its node's receiver state: it was accepted but not stored
    /// (the archive's queue was full, an append failed), so the agent's next copy is taken.
    pub fn forget_frame(&self, node: &str, session: u32, seq: u64) {
        let mut shard = lock(self.shard(node));
        if let Some(held) = shard.get_mut(node) {
            held.receiver.forget_frame(node, session, seq);
        }
    }

    /// Nodes held.
    pub fn node_count(&self) -> usize {
        self.nodes.load(Ordering::Relaxed)
    }

    /// Series held over all nodes (schema entries of their current sessions).
    pub fn series_count(&self) -> usize {
        self.series.load(Ordering::Relaxed)
    }

    fn next_stamp(&self) -> u64 {
        self.stamps.fetch_add(1, Ordering::Relaxed)
    }

    fn shard(&self, name: &str) -> &Shard {
        &self.shards[self.hasher.hash_one(name) as usize % SHARDS]
    }

    /// The lock shards that may hold nodes of `set`: one node's own, or all.
    fn shards_of<'a>(&'a self, set: &NodeSet) -> impl Iterator<Item = &'a Shard> + 'a {
        let only = match set {
            NodeSet::One(name) => Some(self.hasher.hash_one(&**name) as usize % SHARDS),
            _ => None,
        };
        self.shards
            .iter()
            .enumerate()
            .filter(move |(i, _)| only.is_none_or(|o| o == *i))
            .map(|(_, s)| s)
    }

    /// Verifies, decodes and accounts one datagram received at `now_unix_ns` from `from`.
    pub fn ingest(
        &self,
        bytes: &[u8],
        from: SocketAddr,
        now_unix_ns: u64,
    ) -> Result<Accepted, Refused> {
        let Some(name) = wire::peek_node(bytes) else {
            // Too short, or a name that is not UTF-8: the decoder says which (MAC first).
            let any_key = self.keys.unnamed_key();
            return Err(
                match wire::decode(bytes, any_key, &mut ReceiverState::default()) {
                    Err(e) => Refused::wire(&e),
                    Ok(_) => Refused {
                        reason: DropReason::Malformed,
                        detail: "unreadable header".into(),
                    },
                },
            );
        };
        let mut shard = lock(self.shard(name));
        if let Some(node) = shard.get_mut(name) {
            if node.refused_session.is_some() && node.refused_session == peek_session(bytes) {
                // Authenticate it all the same, so forgeries are counted as such.
                let mut scratch = ReceiverState::default();
                self.keys
                    .decode(
                        bytes,
                        name,
                        true,
                        &mut node.keys,
                        &mut scratch,
                        from,
                        now_unix_ns,
                    )
                    .map_err(Refused::decode)?;
                node.counts.refused += 1;
                return Err(Refused {
                    reason: DropReason::SeriesLimit,
                    detail: format!(
                        "node {name:?}'s session holds more series than the bounds allow"
                    ),
                });
            }
            let decoded = self.keys.decode(
                bytes,
                name,
                true,
                &mut node.keys,
                &mut node.receiver,
                from,
                now_unix_ns,
            );
            let frame = match decoded {
                Ok(frame) => frame,
                Err(DecodeError::Refused(refused)) => return Err(refused),
                Err(DecodeError::Wire(e)) => {
                    match e {
                        wire::WireError::Duplicate { .. } => node.counts.duplicates += 1,
                        wire::WireError::Stale { .. } => node.counts.replayed += 1,
                        _ => {}
                    }
                    return Err(Refused::wire(&e));
                }
            };
            self.check_time(&frame, now_unix_ns)?;
            return self.absorb(node, frame, bytes.len(), from, now_unix_ns);
        }
        let mut receiver = ReceiverState::default();
        let resumed = lock(&self.resumed).get(name).cloned();
        if let Some((session, held)) = resumed {
            receiver.resume(name, session, held);
        }
        let mut keys = self.keys.node_keys(name);
        let frame = self
            .keys
            .decode(
                bytes,
                name,
                false,
                &mut keys,
                &mut receiver,
                from,
                now_unix_ns,
            )
            .map_err(Refused::decode)?;
        self.check_time(&frame, now_unix_ns)?;
        if self.nodes.load(Ordering::Relaxed) >= self.limits.max_nodes {
            return Err(Refused {
                reason: DropReason::TooManyNodes,
                detail: format!(
                    "new node {name:?}, but {} nodes are held already",
                    self.limits.max_nodes
                ),
            });
        }
        self.nodes.fetch_add(1, Ordering::Relaxed);
        let archived = lock(&self.resumed).remove(name).is_some();
        // The first frame of the node's first session, with no session of it in the archive:
        // the table holds all the node ever sent here (nothing older to read anywhere).
        let complete_since_ns = if frame.seq == 0 && !archived {
            0
        } else {
            now_unix_ns
        };
        let name: Arc<str> = Arc::from(name);
        tracing::info!("new node {name:?} from {from}");
        let node = shard.entry(name.clone()).or_insert(Node {
            name: name.clone(),
            receiver,
            schema: Arc::new(Schema {
                node: name,
                session: frame.session,
                entries: HashMap::default(),
            }),
            latest: HashMap::default(),
            counts: NodeCounts::default(),
            footprint: 0,
            last_seen_unix_ns: now_unix_ns,
            address: from,
            agent_version: None,
            clock: ClockGauges::default(),
            refused_session: None,
            schema_asked: None,
            keys,
            schema_stamp: self.next_stamp(),
            latest_stamp: 0,
            grown_stamp: 0,
            complete_since_ns,
            recent: RecentSteps::default(),
        });
        self.absorb(node, frame, bytes.len(), from, now_unix_ns)
    }

    fn check_time(&self, frame: &Frame, now_unix_ns: u64) -> Result<(), Refused> {
        let oldest = now_unix_ns.saturating_sub(self.limits.max_frame_age.as_nanos() as u64);
        let newest = now_unix_ns.saturating_add(self.limits.max_frame_ahead.as_nanos() as u64);
        if frame.send_unix_ns < oldest || frame.send_unix_ns > newest {
            let ahead = frame.send_unix_ns as i128 - now_unix_ns as i128;
            return Err(Refused {
                reason: DropReason::OutOfTimeRange,
                detail: format!(
                    "frame of node {:?} seq {} was sent {:.0} s {} the collector's clock",
                    frame.node,
                    frame.seq,
                    (ahead.unsigned_abs() as f64) / 1e9,
                    if ahead < 0 { "before" } else { "ahead of" }
                ),
            });
        }
        Ok(())
    }

    /// Takes an accepted frame into its node's state.
    fn absorb(
        &self,
        node: &mut Node,
        frame: Frame,
        len: usize,
        from: SocketAddr,
        now_unix_ns: u64,
    ) -> Result<Accepted, Refused> {
        if frame.session != node.schema.session {
            // The sender restarted: ids start over (the receiver state cleared its schema).
            node.schema = Arc::new(Schema {
                node: node.name.clone(),
                session: frame.session,
                entries: HashMap::default(),
            });
            node.latest.clear();
            // The new session sends its own estimate after its first exchange.
            node.clock = ClockGauges::default();
            node.refused_session = None;
            node.schema_asked = None;
            node.schema_stamp = self.next_stamp();
            node.complete_since_ns = now_unix_ns;
            node.recent.clear();
        }
        for e in &frame.schema {
            let held = node.schema.entries.get(&e.id);
            if held != Some(&e.series) {
                node.recent.define(
                    e.id,
                    RecentSteps::keeps(&e.series.name).then_some(e.series.kind),
                );
                if held.is_none() {
                    node.grown_stamp = self.next_stamp();
                } else {
                    node.schema_stamp = self.next_stamp();
                    node.complete_since_ns = now_unix_ns;
                }
                Arc::make_mut(&mut node.schema)
                    .entries
                    .insert(e.id, e.series.clone());
            }
        }
        // Every accepted frame may move a latest value (cheaper than asking which did).
        node.latest_stamp = self.next_stamp();
        let received = node.receiver.node(&node.name).expect("the frame's node");
        let footprint = received.known_series();
        let last = received.last;
        if footprint >= node.footprint {
            self.series
                .fetch_add(footprint - node.footprint, Ordering::Relaxed);
        } else {
            self.series
                .fetch_sub(node.footprint - footprint, Ordering::Relaxed);
        }
        node.footprint = footprint;
        node.last_seen_unix_ns = now_unix_ns;
        node.address = from;
        if footprint > self.limits.max_series_per_node
            || self.series.load(Ordering::Relaxed) > self.limits.max_series
        {
            tracing::warn!(
                "node {:?} ({from}) session {:08x} holds {footprint} series (bounds: {} per node, {} in all, {} held): its frames are dropped until it restarts",
                node.name,
                frame.session,
                self.limits.max_series_per_node,
                self.limits.max_series,
                self.series.load(Ordering::Relaxed),
            );
            node.refused_session = Some(frame.session);
            node.schema = Arc::new(Schema {
                node: node.name.clone(),
                session: frame.session,
                entries: HashMap::default(),
            });
            node.latest = HashMap::default();
            node.recent.clear();
            node.schema_stamp = self.next_stamp();
            node.counts.refused += 1;
            return Err(Refused {
                reason: DropReason::SeriesLimit,
                detail: format!("node {:?} went beyond the series bounds", node.name),
            });
        }

        node.counts.frames += 1;
        node.counts.bytes += len as u64;
        node.counts.events += frame.events.len() as u64;
        for s in &frame.samples {
            node.counts.samples += s.data.len() as u64;
            let Some(series) = node.schema.entries.get(&s.id) else {
                continue;
            };
            node.recent.add(s.id, &s.data);
            let newest = match &s.data {
                SeriesData::Counter(v) => counter_latest(v, node.latest.get(&s.id).copied()),
                SeriesData::Gauge(v) => v.iter().max_by_key(|g| g.end_unix_ns).map(|g| Latest {
                    unix_ns: g.end_unix_ns,
                    value: LatestValue::Gauge {
                        min: g.min,
                        max: g.max,
                        mean: g.mean,
                    },
                }),
            };
            // A kind that does not match the schema entry is the sender's bug: not shown.
            if newest.is_none() || s.data.kind() != series.kind {
                continue;
            }
            let newest = newest.expect("checked");
            if &*series.name == AGENT_INFO
                && let Some(version) = series.labels.get("version")
                && node.agent_version.as_deref() != Some(version)
            {
                node.agent_version = Some(version.to_owned());
            }
            node.clock.take(&series.name, &newest);
            match node.latest.get_mut(&s.id) {
                Some(held) if held.unix_ns >= newest.unix_ns => {}
                Some(held) => *held = newest,
                None => {
                    node.latest.insert(s.id, newest);
                }
            }
        }
        let now = Instant::now();
        let ask_schema = last.unknown_samples > 0
            && !node.schema_asked.is_some_and(|(session, at)| {
                session == frame.session && now.duration_since(at) < SCHEMA_REQUEST_EVERY
            });
        if ask_schema {
            node.schema_asked = Some((frame.session, now));
            node.counts.schema_requests += 1;
        }
        Ok(Accepted {
            node: node.name.clone(),
            frame,
            schema: node.schema.clone(),
            ask_schema,
            reply_key: ask_schema.then(|| node.keys.reply_key().clone()),
            key: node.keys.reply_key().clone(),
        })
    }

    /// Forgets nodes not heard from for the node ttl; returns how many.
    pub fn forget_silent(&self, now_unix_ns: u64) -> usize {
        let oldest = now_unix_ns.saturating_sub(self.limits.node_ttl.as_nanos() as u64);
        let mut forgotten = 0;
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            shard.retain(|name, node| {
                if node.last_seen_unix_ns >= oldest {
                    return true;
                }
                tracing::info!(
                    "forgot node {name:?}: silent for {:?}",
                    self.limits.node_ttl
                );
                self.series.fetch_sub(node.footprint, Ordering::Relaxed);
                self.keys.forget(name);
                forgotten += 1;
                false
            });
        }
        self.nodes.fetch_sub(forgotten, Ordering::Relaxed);
        forgotten
    }

    /// Every node, sorted by name.
    pub fn summaries(&self) -> Vec<NodeSummary> {
        self.summaries_of(&NodeSet::All)
    }

    /// The nodes of `set`, sorted by name.
    pub fn summaries_of(&self, set: &NodeSet) -> Vec<NodeSummary> {
        let mut out = Vec::new();
        for shard in self.shards_of(set) {
            let shard = lock(shard);
            for node in shard.values().filter(|n| set.holds(&n.name)) {
                let received = node.receiver.node(&node.name);
                out.push(NodeSummary {
                    node: node.name.to_string(),
                    address: node.address.to_string(),
                    agent_version: node.agent_version.clone(),
                    clock_offset_seconds: node.clock.estimate().map(|c| c.0),
                    clock_offset_error_seconds: node.clock.estimate().map(|c| c.1),
                    session: node.schema.session,
                    last_seen_unix_ns: node.last_seen_unix_ns,
                    series: node.schema.entries.len(),
                    frames: node.counts.frames,
                    samples: node.counts.samples,
                    events: node.counts.events,
                    bytes: node.counts.bytes,
                    lost: received.map_or(0, |r| r.lost),
                    given_up: received.map_or(0, |r| r.received().given_up()),
                    reordered: received.map_or(0, |r| r.late),
                    duplicates: node.counts.duplicates,
                    replayed: node.counts.replayed,
                    unknown_samples: received.map_or(0, |r| r.unknown_samples),
                    sessions: received.map_or(0, |r| r.sessions),
                    refused: node.counts.refused,
                    schema_requests: node.counts.schema_requests,
                    series_refused: node.refused_session.is_some(),
                    key: node.keys.sealer().label(),
                });
            }
        }
        out.sort_by(|a, b| a.node.cmp(&b.node));
        out
    }

    /// Calls `f` with the latest value of every series of every node that `wants` (by its
    /// name), under each shard's lock in turn (nothing is copied). A node not wanted costs one
    /// call: a view of a job's 200 nodes reads 200 nodes' series, not the fleet's.
    pub fn visit_latest(
        &self,
        wants: &dyn Fn(&str) -> bool,
        f: &mut dyn FnMut(&Arc<str>, &Series, &Latest),
    ) {
        for shard in self.shards.iter() {
            let shard = lock(shard);
            for node in shard.values().filter(|node| wants(&node.name)) {
                for (id, latest) in &node.latest {
                    if let Some(series) = node.schema.entries.get(id) {
                        f(&node.name, series, latest);
                    }
                }
            }
        }
    }

    /// Calls `f` with each node's schema and latest values, under each shard's lock in turn,
    /// with the stamps that say whether they changed since a previous visit.
    pub fn visit_nodes(&self, f: &mut dyn FnMut(&NodeLatest)) {
        for shard in self.shards.iter() {
            let shard = lock(shard);
            for node in shard.values() {
                f(&NodeLatest::new(
                    &node.name,
                    &node.schema,
                    Stamps {
                        schema: node.schema_stamp,
                        grown: node.grown_stamp,
                        latest: node.latest_stamp,
                    },
                    node.last_seen_unix_ns,
                    &node.latest,
                ));
            }
        }
    }

    /// Calls `f` with the latest value of every series of `node` (under its shard's lock);
    /// false if no such node is held.
    pub fn visit_node_latest(&self, node: &str, f: &mut dyn FnMut(&Series, &Latest)) -> bool {
        let shard = lock(self.shard(node));
        let Some(held) = shard.get(node) else {
            return false;
        };
        for (id, latest) in &held.latest {
            if let Some(series) = held.schema.entries.get(id) {
                f(series, latest);
            }
        }
        true
    }

    /// The nodes the table rules out of having sent a sample at or after `since_ns` (sample
    /// time) of a series of one of `metrics` whose label `label` is `value`: nodes whose
    /// latest values hold every series they sent since before `since_ns` (less a minute for
    /// clocks and transit), and none of those series that recent. A node not held, or held
    /// completely only since later, may have: the caller asks the archive about it. The
    /// straggler search of one job reads only the nodes not ruled out, rather than the fleet.
    pub fn ruled_out(
        &self,
        metrics: &[&str],
        label: &str,
        value: &str,
        since_ns: u64,
    ) -> std::collections::HashSet<Arc<str>> {
        let mut out = std::collections::HashSet::new();
        for shard in self.shards.iter() {
            let shard = lock(shard);
            for node in shard.values() {
                if node.complete_since_ns.saturating_add(SLACK_NS) > since_ns {
                    continue;
                }
                let carries = node.latest.iter().any(|(id, latest)| {
                    latest.unix_ns >= since_ns
                        && node.schema.entries.get(id).is_some_and(|series| {
                            metrics.contains(&&*series.name)
                                && series.labels.get(label) == Some(value)
                        })
                });
                if !carries {
                    out.insert(node.name.clone());
                }
            }
        }
        out
    }

    /// Shows `f` the recent steps ([`RecentSteps`]) of every node held whole since before
    /// `since_ns` (less a minute for clocks and transit, as [`Self::ruled_out`]) whose steps
    /// still reach back to epoch step `first_step`, with the schema they are kept under;
    /// returns those nodes. Any other node's steps may be missing spans: the caller reads
    /// it from the archive.
    pub fn visit_recent_steps(
        &self,
        since_ns: u64,
        first_step: u64,
        f: &mut dyn FnMut(&Arc<str>, &Schema, &RecentSteps),
    ) -> std::collections::HashSet<Arc<str>> {
        let mut out = std::collections::HashSet::new();
        for shard in self.shards.iter() {
            let shard = lock(shard);
            for node in shard.values() {
                if node.complete_since_ns.saturating_add(SLACK_NS) > since_ns
                    || !node.recent.series().all(|(_, s)| s.holds(first_step))
                {
                    continue;
                }
                f(&node.name, &node.schema, &node.recent);
                out.insert(node.name.clone());
            }
        }
        out
    }

    /// How old a series' latest sample may be and still count as live.
    pub fn live_ttl_ns(&self) -> u64 {
        self.limits.live_ttl.as_nanos() as u64
    }

    /// The latest value of every series whose latest sample is at most the live ttl old.
    pub fn live_series(&self, now_unix_ns: u64) -> Vec<LiveSeries> {
        self.live_series_of(&NodeSet::All, now_unix_ns)
    }

    /// [`live_series`](Self::live_series) of the nodes of `set` only.
    pub fn live_series_of(&self, set: &NodeSet, now_unix_ns: u64) -> Vec<LiveSeries> {
        let oldest = now_unix_ns.saturating_sub(self.limits.live_ttl.as_nanos() as u64);
        let mut out = Vec::new();
        for shard in self.shards_of(set) {
            let shard = lock(shard);
            for node in shard.values().filter(|n| set.holds(&n.name)) {
                for (id, latest) in &node.latest {
                    if latest.unix_ns < oldest {
                        continue;
                    }
                    if let Some(series) = node.schema.entries.get(id) {
                        out.push(LiveSeries {
                            node: node.name.clone(),
                            series: series.clone(),
                            latest: *latest,
                        });
                    }
                }
            }
        }
        out
    }
}

/// The kind's name as `/metrics` and the live view write it.
pub fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Counter => "counter",
        Kind::Gauge => "gauge",
    }
}

/// The findings read the table through [`LiveTable`].
impl LiveTable for NodeTable {
    fn visit_nodes(&self, f: &mut dyn FnMut(&NodeLatest)) {
        NodeTable::visit_nodes(self, f)
    }
}

/// The straggler search reads the table through [`LiveSteps`].
impl LiveSteps for NodeTable {
    fn visit_recent_steps(
        &self,
        since_ns: u64,
        first_step: u64,
        f: &mut dyn FnMut(&Arc<str>, &Schema, &RecentSteps),
    ) -> std::collections::HashSet<Arc<str>> {
        NodeTable::visit_recent_steps(self, since_ns, first_step, f)
    }

    fn ruled_out(
        &self,
        metrics: &[&str],
        label: &str,
        value: &str,
        since_ns: u64,
    ) -> std::collections::HashSet<Arc<str>> {
        NodeTable::ruled_out(self, metrics, label, value, since_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use monitor_wire::{EncoderConfig, FrameEncoder, Labels, Reading, Value};

    const T0: u64 = 1_763_164_800_000_000_000;
    const FROM: &str = "192.0.2.1:5000";

    fn key() -> Key {
        Key::from_bytes([9; 32])
    }

    fn series(name: &str, i: usize, kind: Kind) -> Series {
        Series {
            name: name.into(),
            labels: Labels::new([("port", i.to_string())]),
            kind,
        }
    }

    /// One flush of `n` counters and a gauge per counter, at `t`.
    fn flush(enc: &mut FrameEncoder, n: usize, t: u64, value: u64) -> Vec<Vec<u8>> {
        for i in 0..n {
            enc.push_reading(&Reading {
                series: series("railscope_ib_port_xmit_bytes_total", i, Kind::Counter),
                value: Value::U64(value + i as u64),
                unix_ns: t,
            })
            .unwrap();
            enc.push_reading(&Reading {
                series: series("railscope_gpu_power_watts", i, Kind::Gauge),
                value: Value::F64(300.5),
                unix_ns: t,
            })
            .unwrap();
        }
        enc.flush(t + 1_000_000)
    }

    fn table(limits: Limits) -> NodeTable {
        NodeTable::new(key(), limits)
    }

    #[test]
    fn a_counters_rate_comes_from_the_sample_before_and_a_reset_has_none() {
        let sample = |unix_ns, value| CounterSample { unix_ns, value };
        let held = Latest {
            unix_ns: T0,
            value: LatestValue::Counter {
                value: 1_000,
                per_second: None,
            },
        };
        let rate =
            |samples: &[CounterSample], held| match counter_latest(samples, held).unwrap().value {
                LatestValue::Counter { per_second, .. } => per_second,
                LatestValue::Gauge { .. } => unreachable!(),
            };
        // Two samples in the frame: their own rate, not the held one's.
        let two = [
            sample(T0 + 2_000_000_000, 1_400),
            sample(T0 + 4_000_000_000, 2_400),
        ];
        assert_eq!(rate(&two, Some(held)), Some(500.0));
        // One sample: against the held one, 2 s before.
        assert_eq!(rate(&two[..1], Some(held)), Some(200.0));
        assert_eq!(rate(&two[..1], None), None);
        // A counter that went back (the agent's device reset): no rate rather than a huge one.
        assert_eq!(rate(&[sample(T0 + 1_000_000_000, 3)], Some(held)), None);
    }

    #[test]
    fn the_agent_s_clock_offset_is_shown_once_both_gauges_came_and_forgotten_with_its_session() {
        let table = table(Limits::default());
        let clock = |table: &NodeTable| {
            let s = &table.summaries()[0];
            (s.clock_offset_seconds, s.clock_offset_error_seconds)
        };
        let gauge = |enc: &mut FrameEncoder, name: &str, t: u64, v: f64| {
            enc.push_reading(&Reading {
                series: Series {
                    name: name.into(),
                    labels: Labels::default(),
                    kind: Kind::Gauge,
                },
                value: Value::F64(v),
                unix_ns: t,
            })
            .unwrap();
        };
        let mut enc = FrameEncoder::new(EncoderConfig::new("n1"), key()).unwrap();
        let send = |enc: &mut FrameEncoder, t: u64| {
            for frame in enc.flush(t) {
                table.ingest(&frame, FROM.parse().unwrap(), T0).unwrap();
            }
        };
        gauge(&mut enc, metric::AGENT_CLOCK_OFFSET_SECONDS, T0, 3.0);
        send(&mut enc, T0);
        assert_eq!(clock(&table), (None, None), "the offset without its bound");
        gauge(&mut enc, metric::AGENT_CLOCK_OFFSET_SECONDS, T0 + 1, -0.25);
        gauge(
            &mut enc,
            metric::AGENT_CLOCK_OFFSET_ERROR_SECONDS,
            T0 + 1,
            0.001,
        );
        send(&mut enc, T0 + 1);
        assert_eq!(clock(&table), (Some(-0.25), Some(0.001)));
        // The agent restarted: a new session, no estimate until it sends one.
        let mut restarted = FrameEncoder::new(EncoderConfig::new("n1"), key()).unwrap();
        gauge(&mut restarted, metric::GPU_POWER_WATTS, T0 + 2, 300.0);
        send(&mut restarted, T0 + 2);
        assert_eq!(clock(&table), (None, None));
    }

    #[test]
    fn accepted_frames_update_latest_values_and_counts() {
        let table = table(Limits::default());
        let mut enc = FrameEncoder::new(EncoderConfig::new("n1"), key()).unwrap();
        for (s, frame) in flush(&mut enc, 3, T0, 100).iter().enumerate() {
            let a = table.ingest(frame, FROM.parse().unwrap(), T0).unwrap();
            assert_eq!(&*a.node, "n1");
            assert!(!a.ask_schema, "frame {s}");
        }
        for frame in flush(&mut enc, 3, T0 + 1_000_000_000, 200) {
            table.ingest(&frame, FROM.parse().unwrap(), T0).unwrap();
        }
        let mut live = table.live_series(T0);
        live.sort_by(|a, b| a.series.cmp(&b.series));
        assert_eq!(live.len(), 6);
        let xmit0 = live
            .iter()
            .find(|l| {
                &*l.series.name == "railscope_ib_port_xmit_bytes_total"
                    && l.series.labels.get("port") == Some("0")
            })
            .unwrap();
        assert_eq!(
            xmit0.latest,
            Latest {
                unix_ns: T0 + 1_000_000_000,
                value: LatestValue::Counter {
                    value: 200,
                    // From the frame before: 100 more over 1 s.
                    per_second: Some(100.0)
                }
            }
        );
        let summary = &table.summaries()[0];
        assert_eq!(summary.samples, 12);
        assert_eq!(summary.series, 6);
        assert_eq!(table.series_count(), 6);
        assert_eq!(summary.lost, 0);
    }

    /// A node whose session lacks more frames than the collector keeps gaps for: the oldest
    /// gaps are given up, and that is counted per node (`/api/v1/live/nodes`, `/metrics`),
    /// not silent.
    #[test]
    fn gaps_given_up_at_the_bound_are_counted() {
        let table = table(Limits::default());
        let mut enc = FrameEncoder::new(EncoderConfig::new("n1"), key()).unwrap();
        // Every other frame lost: one gap per frame received.
        let frames = monitor_wire::MAX_RANGES + 10;
        for i in 0..2 * frames as u64 {
            let t = T0 + i * 1_000_000;
            for frame in flush(&mut enc, 1, t, i) {
                if i % 2 == 0 {
                    table.ingest(&frame, FROM.parse().unwrap(), t).unwrap();
                }
            }
        }
        let summary = &table.summaries()[0];
        assert!(summary.given_up > 0, "{summary:?}");
        assert!(summary.given_up <= 11, "{summary:?}");
    }

    /// A receive thread that panics while it holds a node shard (a bug met on a crafted
    /// datagram) poisons the shard's lock: the other receive threads go on ingesting that
    /// shard's nodes, and readers (the live view, `/metrics`) go on reading.
    #[test]
    fn a_receive_thread_that_panics_in_a_shard_does_not_stop_the_others() {
        let table = Arc::new(table(Limits::default()));
        let mut enc = FrameEncoder::new(EncoderConfig::new("n1"), key()).unwrap();
        for frame in flush(&mut enc, 2, T0, 100) {
            table.ingest(&frame, FROM.parse().unwrap(), T0).unwrap();
        }
        let crashing = table.clone();
        let panicked = std::thread::spawn(move || {
            let _held = lock(crashing.shard("n1"));
            panic!("a receive thread's bug on a crafted datagram");
        })
        .join();
        assert!(panicked.is_err());
        assert!(table.shard("n1").is_poisoned());
        for frame in flush(&mut enc, 2, T0 + 1_000_000_000, 200) {
            table
                .ingest(&frame, FROM.parse().unwrap(), T0 + 1_000_000_000)
                .expect("ingest goes on in the poisoned shard");
        }
        assert_eq!(table.summaries()[0].samples, 8);
        assert_eq!(table.live_series(T0 + 1_000_000_000).len(), 4);
    }

    #[test]
    fn replays_from_any_address_are_refused_and_counted_per_node() {
        let table = table(Limits::default());
        let mut enc = FrameEncoder::new(EncoderConfig::new("n1"), key()).unwrap();
        let frames = flush(&mut enc, 2, T0, 1);
        table.ingest(&frames[0], FROM.parse().unwrap(), T0).unwrap();
        let other: SocketAddr = "198.51.100.9:7".parse().unwrap();
        let e = table.ingest(&frames[0], other, T0).unwrap_err();
        assert_eq!(e.reason, DropReason::Duplicate);
        assert_eq!(table.summaries()[0].duplicates, 1);
        // A frame sealed with another key never reaches the node's state.
        let mut stranger =
            FrameEncoder::new(EncoderConfig::new("n1"), Key::from_bytes([1; 32])).unwrap();
        let forged = flush(&mut stranger, 2, T0, 1);
        assert_eq!(
            table.ingest(&forged[0], other, T0).unwrap_err().reason,
            DropReason::BadMac
        );
        assert_eq!(table.summaries()[0].frames, 1);
    }

    #[test]
    fn frames_out_of_the_time_window_are_dropped() {
        let table = table(Limits::default());
        let mut enc = FrameEncoder::new(EncoderConfig::new("n1"), key()).unwrap();
        let old = flush(&mut enc, 1, T0, 1);
        let now = T0 + 2 * 3600 * 1_000_000_000;
        let e = table
            .ingest(&old[0], FROM.parse().unwrap(), now)
            .unwrap_err();
        assert_eq!(e.reason, DropReason::OutOfTimeRange);
        assert!(e.detail.contains("7200 s before"), "{}", e.detail);
        assert_eq!(table.node_count(), 0);
    }

    #[test]
    fn node_and_series_bounds_hold() {
        let limits = Limits {
            max_nodes: 2,
            max_series_per_node: 10,
            ..Limits::default()
        };
        let table = table(limits);
        for name in ["a", "b", "c"] {
            let mut enc = FrameEncoder::new(EncoderConfig::new(name), key()).unwrap();
            let r = table.ingest(&flush(&mut enc, 2, T0, 1)[0], FROM.parse().unwrap(), T0);
            if name == "c" {
                assert_eq!(r.unwrap_err().reason, DropReason::TooManyNodes);
            } else {
                r.unwrap();
            }
        }
        assert_eq!(table.node_count(), 2);

        // Node a grows to 12 series: refused until it restarts.
        let mut enc = FrameEncoder::new(EncoderConfig::new("a"), key()).unwrap();
        let frames = flush(&mut enc, 6, T0, 1);
        let results: Vec<_> = frames
            .iter()
            .map(|f| table.ingest(f, FROM.parse().unwrap(), T0))
            .collect();
        assert_eq!(
            results.last().unwrap().as_ref().unwrap_err().reason,
            DropReason::SeriesLimit
        );
        let more = flush(&mut enc, 6, T0 + 1_000_000_000, 2);
        assert_eq!(
            table
                .ingest(&more[0], FROM.parse().unwrap(), T0)
                .unwrap_err()
                .reason,
            DropReason::SeriesLimit
        );
        let a = table
            .summaries()
            .into_iter()
            .find(|s| s.node == "a")
            .unwrap();
        assert!(a.series_refused);
        assert_eq!(a.series, 0);
        // Restarted with fewer series: accepted again.
        let mut enc = FrameEncoder::new(EncoderConfig::new("a"), key()).unwrap();
        table
            .ingest(&flush(&mut enc, 2, T0, 1)[0], FROM.parse().unwrap(), T0)
            .unwrap();
        let a = table
            .summaries()
            .into_iter()
            .find(|s| s.node == "a")
            .unwrap();
        assert!(!a.series_refused);
        assert_eq!(a.series, 4);
        assert_eq!(table.series_count(), 8);
    }

    #[test]
    fn unknown_ids_ask_for_the_schema_at_most_every_5_s() {
        let table = table(Limits::default());
        let mut enc = FrameEncoder::new(EncoderConfig::new("n1"), key()).unwrap();
        // The first two flushes carry the schema: this collector "missed" them.
        let _ = flush(&mut enc, 2, T0, 1);
        let _ = flush(&mut enc, 2, T0 + 1_000_000_000, 2);
        let frames = flush(&mut enc, 2, T0 + 2_000_000_000, 3);
        let a = table.ingest(&frames[0], FROM.parse().unwrap(), T0).unwrap();
        assert!(a.ask_schema);
        let frames = flush(&mut enc, 2, T0 + 3_000_000_000, 4);
        let a = table.ingest(&frames[0], FROM.parse().unwrap(), T0).unwrap();
        assert!(!a.ask_schema);
        assert!(table.live_series(T0).is_empty());
        enc.resend_schema();
        let frames = flush(&mut enc, 2, T0 + 4_000_000_000, 5);
        for f in &frames {
            table.ingest(f, FROM.parse().unwrap(), T0).unwrap();
        }
        assert_eq!(table.live_series(T0).len(), 4);
    }

    #[test]
    fn silent_nodes_are_forgotten() {
        let table = table(Limits::default());
        let mut enc = FrameEncoder::new(EncoderConfig::new("n1"), key()).unwrap();
        table
            .ingest(&flush(&mut enc, 2, T0, 1)[0], FROM.parse().unwrap(), T0)
            .unwrap();
        assert_eq!(table.forget_silent(T0 + 1_000_000_000), 0);
        assert_eq!(table.forget_silent(T0 + 25 * 3600 * 1_000_000_000), 1);
        assert_eq!((table.node_count(), table.series_count()), (0, 0));
    }
}
