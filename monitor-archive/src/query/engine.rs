//! The query engine: reads the archive (which includes what was appended and not yet written
//! out) for a node set and time range, decodes the frames with the keyring (each node's keys), and answers
//! series by metric name and label matchers (counters as rates, gauges as their min/max/mean
//! envelopes) and events by kind, node, device and time.

use std::{
    cell::RefCell,
    collections::{BTreeMap, BTreeSet, HashSet},
    ops::ControlFlow,
    sync::Arc,
};

use monitor_wire::{Keyring, Kind, Series, SeriesData, StoredFrame, peek_has_schema};
use serde::Serialize;

use super::selector::Matcher;
use super::session_ids::{MAX_WAITING, SessionIds};
use crate::archive::{ArchiveError, ArchiveReader, NodeSelector, RecordKind, ScanFilter};

/// The series and slots of an answer being gathered, looked up for every frame: foldhash
/// rather than SipHash.
type HashMap<K, V> = foldhash::HashMap<K, V>;

/// Series of one metric, selected by label matchers (the node is the `node` label), over a
/// time range (Unix ns, inclusive).
#[derive(Clone, Debug)]
pub struct SeriesQuery {
    pub metric: String,
    pub matchers: Vec<Matcher>,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// Events over a time range, optionally of one kind, one node, one device (the event's
/// `device` or `gpu` label).
#[derive(Clone, Debug, Default)]
pub struct EventQuery {
    pub kind: Option<String>,
    pub node: Option<String>,
    pub device: Option<String>,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// One counter sample: its cumulative value and the rate since the previous sample (per
/// second; `None` for the first sample the archive has of the series). A value below the
/// previous one is a reset: the rate counts from zero, as Prometheus' `rate` does.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CounterPoint {
    /// Unix time, ns.
    pub t: u64,
    pub value: u64,
    pub rate: Option<f64>,
}

/// One gauge sample: the envelope of the readings of `[start, t]` (one reading: start = t,
/// min = max = mean).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GaugePoint {
    pub start: u64,
    pub t: u64,
    pub min: f64,
    pub max: f64,
    pub mean: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", content = "points", rename_all = "lowercase")]
pub enum Points {
    Counter(Vec<CounterPoint>),
    Gauge(Vec<GaugePoint>),
}

/// One series of an answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SeriesAnswer {
    pub metric: String,
    /// The series' labels and its `node`.
    pub labels: BTreeMap<String, String>,
    #[serde(flatten)]
    pub points: Points,
}

/// One event of an answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EventAnswer {
    /// Unix time, ns.
    pub t: u64,
    pub node: String,
    pub kind: String,
    pub labels: BTreeMap<String, String>,
    pub code: i64,
    pub text: String,
}

/// What a query read, to judge its cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct QueryCost {
    pub segments: usize,
    pub blocks: usize,
    /// Frames opened (MAC checked, header and schema parsed).
    pub frames: usize,
    /// Frames outside the range that define no series, passed over unopened.
    pub passed: usize,
    /// Frames that did not decode (a key that changed, a corrupt record).
    pub undecodable: usize,
    /// Samples read whose series id no schema entry of their node's session defined, in
    /// whatever order (see [`super::session_ids`]): an error, counted and logged.
    pub unplaced: u64,
}

impl QueryCost {
    /// Counts what another read cost too.
    fn add(&mut self, other: &QueryCost) {
        self.segments += other.segments;
        self.blocks += other.blocks;
        self.frames += other.frames;
        self.passed += other.passed;
        self.undecodable += other.undecodable;
        self.unplaced += other.unplaced;
    }
}

#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    #[error("time range: start {start} is after end {end}")]
    Range { start: u64, end: u64 },
    #[error(
        "the answer would hold more than {limit} points: narrow the time range or the matchers \
         (the collector's --query-max-points)"
    )]
    TooManyPoints { limit: usize },
}

/// Points one answer may hold by default: an answer is built in memory (about 40 B a point)
/// and written as JSON (about 100 B a point), so this bounds a query's memory.
pub const DEFAULT_MAX_POINTS: usize = 1_000_000;

/// Answers queries from the archive. Cheap to share (`Arc`); every query reads on the
/// caller's thread.
pub struct QueryEngine {
    reader: ArchiveReader,
    keys: Keyring,
    max_points: usize,
}

/// A series an answer holds, and its samples gathered from all the frames read.
struct Selected {
    /// The question (of those asked at once) it answers.
    query: usize,
    node: Arc<str>,
    series: Series,
    gathered: Gathered,
}

enum Gathered {
    Counter(CounterGathered),
    Gauge(Vec<GaugePoint>),
}

/// A counter's samples in the range, and the newest one before it (the first rate's base).
/// Only those in the range are answer points and count against `max_points`; of the
/// look-back only one sample is kept, so a look-back costs no memory per sample either.
#[derive(Default)]
struct CounterGathered {
    before: Option<(u64, u64)>,
    inside: Vec<(u64, u64)>,
}

/// How a scan's frames are judged: in the range when they meet `[start_ns, end_ns]`, or
/// `[from_ns, start_ns)` (the look-back a counter's first rate needs) for the nodes
/// `looks_back` names (those with a counter asked for); other frames are passed over unopened
/// unless they define series. Of the series a frame defines, only those whose name
/// `keeps_name` accepts are made.
#[derive(Clone, Copy)]
struct FrameFilter<'a> {
    from_ns: u64,
    start_ns: u64,
    end_ns: u64,
    looks_back: &'a dyn Fn(&str) -> bool,
    keeps_name: &'a dyn Fn(&str) -> bool,
}

/// For each node and session: what each series id stands for in the answer (the index of
/// its [`Selected`]), `None` for a series the query does not want; samples of ids not yet
/// defined wait for their entry.
type Slots = SessionIds<Option<usize>>;

/// How far before a query's start the sample that gives a counter's first point its rate is
/// looked for (the agent reads a stable series at least every 2 x its interval cap).
const COUNTER_LOOKBACK_NS: u64 = 300_000_000_000;

impl QueryEngine {
    pub fn new(reader: ArchiveReader, keys: impl Into<Keyring>) -> Self {
        Self {
            reader,
            keys: keys.into(),
            max_points: DEFAULT_MAX_POINTS,
        }
    }

    /// Sets the most points one answer may hold ([`QueryError::TooManyPoints`] beyond).
    pub fn with_max_points(mut self, max_points: usize) -> Self {
        self.max_points = max_points.max(1);
        self
    }

    /// The most points one answer may hold.
    pub fn max_points(&self) -> usize {
        self.max_points
    }

    /// Reads the records of the selected nodes over the range, in order, each opened as a
    /// stored frame (MAC checked, header and schema parsed; samples and events are for
    /// `visit` to decode, as much as it needs). `visit` gets whether the record is a frame
    /// (not a schema record) and whether its time range meets the range; it may stop the scan.
    ///
    /// A frame outside the range that defines no series is passed over unopened: what a
    /// visitor takes from such a frame is only its schema entries (the ids later frames
    /// use). A node's records are read from its segment's start, so for a question about the
    /// last minute most frames are of that kind, and opening them (the MAC, the header) was
    /// most of what the question cost.
    pub(crate) fn each_frame(
        &self,
        nodes: NodeSelector,
        start_ns: u64,
        end_ns: u64,
        visit: impl FnMut(&Arc<str>, &StoredFrame<'_>, bool) -> ControlFlow<()>,
    ) -> Result<QueryCost, QueryError> {
        if start_ns > end_ns {
            return Err(QueryError::Range {
                start: start_ns,
                end: end_ns,
            });
        }
        let filter = ScanFilter::new(nodes, start_ns, end_ns);
        let frames = FrameFilter {
            from_ns: start_ns,
            start_ns,
            end_ns,
            looks_back: &|_| false,
            keeps_name: &|_| true,
        };
        self.each_frame_of(&filter, &frames, visit)
    }

    /// [`each_frame`](Self::each_frame) of what `filter` reads, each frame judged and opened
    /// as `frames` says.
    fn each_frame_of(
        &self,
        filter: &ScanFilter,
        frames: &FrameFilter<'_>,
        mut visit: impl FnMut(&Arc<str>, &StoredFrame<'_>, bool) -> ControlFlow<()>,
    ) -> Result<QueryCost, QueryError> {
        let FrameFilter {
            from_ns,
            start_ns,
            end_ns,
            looks_back,
            keeps_name,
        } = *frames;
        let mut names: HashMap<String, Arc<str>> = HashMap::default();
        let mut cost = QueryCost::default();
        let stats = self.reader.scan(filter, &mut |r| {
            let in_range = r.kind == RecordKind::Frame
                && r.first_ns <= end_ns
                && (r.last_ns >= start_ns || (r.last_ns >= from_ns && looks_back(r.node)));
            if !in_range && r.kind == RecordKind::Frame && !peek_has_schema(r.bytes) {
                cost.passed += 1;
                return ControlFlow::Continue(());
            }
            cost.frames += 1;
            let Ok(frame) = self.keys.open_stored_where(r.bytes, &mut |n| keeps_name(n)) else {
                cost.undecodable += 1;
                return ControlFlow::Continue(());
            };
            let node = match names.get(r.node) {
                Some(n) => n.clone(),
                None => names
                    .entry(r.node.to_owned())
                    .or_insert_with(|| Arc::from(r.node))
                    .clone(),
            };
            visit(&node, &frame, in_range)
        })?;
        cost.segments = stats.segments;
        cost.blocks = stats.blocks;
        Ok(cost)
    }

    /// Series of `q.metric` whose labels (and node) match `q.matchers`, with their samples
    /// in the range: counters with their rates, gauges with their envelopes. Only the
    /// matching nodes' blocks are read, and of each frame only the matching series' samples
    /// are decoded; an answer of more than [`max_points`](Self::max_points) points is
    /// refused.
    pub fn series(&self, q: &SeriesQuery) -> Result<(Vec<SeriesAnswer>, QueryCost), QueryError> {
        self.series_in(q, node_selector(&q.matchers, "node"))
    }

    /// [`series`](Self::series) of `nodes` only: a caller that walks a large fleet asks a
    /// chunk of nodes at a time, so no answer grows with the fleet.
    pub fn series_of_nodes(
        &self,
        q: &SeriesQuery,
        nodes: &BTreeSet<String>,
    ) -> Result<(Vec<SeriesAnswer>, QueryCost), QueryError> {
        self.series_in(q, NodeSelector::Only(nodes.clone()))
    }

    /// Several [`series_of_nodes`](Self::series_of_nodes) questions about `nodes`, answered
    /// from one read of the archive: a caller that needs several metrics of the same nodes
    /// (the straggler search: three GPU metrics and two port counters) opens each frame once
    /// rather than once per metric. Answers come in the order of `queries`; each is limited
    /// to [`max_points`](Self::max_points) on its own, as if asked alone. The cost is that
    /// of every read made for them.
    pub fn series_many_of_nodes(
        &self,
        queries: &[SeriesQuery],
        nodes: &BTreeSet<String>,
    ) -> Result<(Vec<Vec<SeriesAnswer>>, QueryCost), QueryError> {
        let distinct: BTreeSet<&str> = queries.iter().map(|q| q.metric.as_str()).collect();
        if distinct.len() < queries.len() {
            // One series then answers two questions: asked one by one.
            let mut total = QueryCost::default();
            let mut answers = Vec::with_capacity(queries.len());
            for q in queries {
                let (a, cost) = self.series_of_nodes(q, nodes)?;
                total.add(&cost);
                answers.push(a);
            }
            return Ok((answers, total));
        }
        self.series_in_many(queries, NodeSelector::Only(nodes.clone()))
    }

    fn series_in(
        &self,
        q: &SeriesQuery,
        nodes: NodeSelector,
    ) -> Result<(Vec<SeriesAnswer>, QueryCost), QueryError> {
        let (mut answers, cost) = self.series_in_many(std::slice::from_ref(q), nodes)?;
        Ok((answers.pop().unwrap_or_default(), cost))
    }

    /// The answers to `queries` (of distinct metrics) from one scan of `nodes` over the
    /// union of their ranges.
    fn series_in_many(
        &self,
        queries: &[SeriesQuery],
        nodes: NodeSelector,
    ) -> Result<(Vec<Vec<SeriesAnswer>>, QueryCost), QueryError> {
        for q in queries {
            if q.start_ns > q.end_ns {
                return Err(QueryError::Range {
                    start: q.start_ns,
                    end: q.end_ns,
                });
            }
        }
        let (Some(first), Some(last)) = (
            queries.iter().map(|q| q.start_ns).min(),
            queries.iter().map(|q| q.end_ns).max(),
        ) else {
            return Ok((Vec::new(), QueryCost::default()));
        };
        let selected: RefCell<Vec<Selected>> = RefCell::default();
        let mut by_series: HashMap<(Arc<str>, Series), usize> = HashMap::default();
        let mut slots: Slots = SessionIds::new(MAX_WAITING);
        let mut points = vec![0usize; queries.len()];
        let failed: RefCell<Option<QueryError>> = RefCell::default();
        let from = first.saturating_sub(COUNTER_LOOKBACK_NS);
        // The question a series answers, if any.
        let wants = |node: &Arc<str>, series: &Series| {
            queries.iter().position(|q| {
                *series.name == *q.metric
                    && q.matchers.iter().all(|m| {
                        m.matches(if m.label == "node" {
                            Some(node)
                        } else {
                            series.labels.get(&m.label)
                        })
                    })
            })
        };
        // The nodes with a counter asked for: only their frames before the range are read
        // (for the sample that gives the first point its rate).
        let with_counters: RefCell<HashSet<Arc<str>>> = RefCell::default();
        let looks_back = |node: &str| with_counters.borrow().contains(node);
        // Adds the samples `data` of the answer's series `ix`; breaks past the point limit.
        let mut gather = |ix: usize, data: SeriesData| {
            let mut selected = selected.borrow_mut();
            let sel = &mut selected[ix];
            let q = &queries[sel.query];
            let counted = &mut points[sel.query];
            match (data, &mut sel.gathered) {
                (SeriesData::Counter(v), Gathered::Counter(out)) => {
                    for c in v.iter() {
                        if c.unix_ns < q.start_ns {
                            if out.before.is_none_or(|(t, _)| t < c.unix_ns) {
                                out.before = Some((c.unix_ns, c.value));
                            }
                        } else if c.unix_ns <= q.end_ns {
                            *counted += 1;
                            out.inside.push((c.unix_ns, c.value));
                        }
                    }
                }
                (SeriesData::Gauge(v), Gathered::Gauge(out)) => {
                    let before = out.len();
                    out.extend(
                        v.iter()
                            .filter(|g| g.end_unix_ns >= q.start_ns && g.end_unix_ns <= q.end_ns)
                            .map(|g| GaugePoint {
                                start: g.start_unix_ns,
                                t: g.end_unix_ns,
                                min: g.min,
                                max: g.max,
                                mean: g.mean,
                            }),
                    );
                    *counted += out.len() - before;
                }
                _ => {} // a kind that disagrees with the schema: the block is ignored
            }
            if *counted > self.max_points {
                *failed.borrow_mut() = Some(QueryError::TooManyPoints {
                    limit: self.max_points,
                });
                return ControlFlow::Break(());
            }
            ControlFlow::Continue(())
        };
        let visit = |node: &Arc<str>, frame: &StoredFrame<'_>, in_range: bool| {
            let mut ids = slots.session(node, frame.session);
            // Samples that came before the entries defining their ids, now placed.
            let mut released = Vec::new();
            for e in &frame.schema {
                let slot = wants(node, &e.series).map(|query| {
                    if e.series.kind == Kind::Counter && !with_counters.borrow().contains(node) {
                        with_counters.borrow_mut().insert(node.clone());
                    }
                    let key = (node.clone(), e.series.clone());
                    *by_series.entry(key).or_insert_with(|| {
                        let mut selected = selected.borrow_mut();
                        selected.push(Selected {
                            query,
                            node: node.clone(),
                            series: e.series.clone(),
                            gathered: match e.series.kind {
                                Kind::Counter => Gathered::Counter(CounterGathered::default()),
                                Kind::Gauge => Gathered::Gauge(Vec::new()),
                            },
                        });
                        selected.len() - 1
                    })
                });
                let waited = ids.define(e.id, slot);
                if let Some(ix) = slot {
                    released.extend(waited.into_iter().map(|d| (ix, d)));
                }
            }
            // The entries of series no question asks about (not made): their ids are
            // known, and what waited for them is not wanted.
            for id in frame.defined.iter().flat_map(Clone::clone) {
                ids.define_if_new(id, None);
            }
            for (ix, data) in released {
                gather(ix, data)?;
            }
            if !in_range {
                return ControlFlow::Continue(());
            }
            // The wanted series' samples, and those of ids not defined yet (they wait).
            let Ok(samples) = frame.samples(|id| ids.get(id).is_none_or(Option::is_some)) else {
                return ControlFlow::Continue(());
            };
            for s in samples {
                match ids.get(s.id) {
                    Some(&Some(ix)) => gather(ix, s.data)?,
                    Some(None) => {}
                    None => ids.wait(s.id, s.data),
                }
            }
            ControlFlow::Continue(())
        };
        // The range first: each node's records of every segment it meets, from the
        // segment's start (a counter's look-back too, where it is in those segments).
        let mut visit = visit;
        let metrics: HashSet<&str> = queries.iter().map(|q| q.metric.as_str()).collect();
        let frames = FrameFilter {
            from_ns: from,
            start_ns: first,
            end_ns: last,
            looks_back: &looks_back,
            keeps_name: &|name| metrics.contains(name),
        };
        let in_range = ScanFilter::new(nodes, first, last);
        let mut cost = self.each_frame_of(&in_range, &frames, &mut visit)?;
        // Then the look-back where that did not go (segments that end before the range), of
        // the nodes with a counter that has points in the range and no sample before them
        // yet: a question of gauges never reads it, nor one whose counters were all sent in
        // the segments already read (the agent sends a stable series at least every minute).
        let lacking: BTreeSet<String> = selected
            .borrow()
            .iter()
            .filter(|s| match &s.gathered {
                Gathered::Counter(c) => c.before.is_none() && !c.inside.is_empty(),
                Gathered::Gauge(_) => false,
            })
            .map(|s| s.node.to_string())
            .collect();
        if failed.borrow().is_none() && !lacking.is_empty() && from < first {
            let look_back = ScanFilter {
                read_before: Some((first, last)),
                ..ScanFilter::new(NodeSelector::Only(lacking), from, first - 1)
            };
            cost.add(&self.each_frame_of(&look_back, &frames, &mut visit)?);
        }
        if let Some(e) = failed.into_inner() {
            return Err(e);
        }
        cost.unplaced = slots.finish();
        if cost.unplaced > 0 {
            tracing::warn!(
                "query of {}: {} samples of series ids that no schema entry of their node's \
                 session defines (frames whose schema was lost, or outside what was read)",
                queries
                    .iter()
                    .map(|q| q.metric.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                cost.unplaced
            );
        }
        drop(slots);
        drop(by_series);
        let mut answers: Vec<Vec<SeriesAnswer>> = queries.iter().map(|_| Vec::new()).collect();
        for Selected {
            query,
            node,
            series,
            gathered,
        } in selected.into_inner()
        {
            let q = &queries[query];
            let points = match gathered {
                Gathered::Counter(CounterGathered { before, mut inside }) => {
                    inside.extend(before);
                    let points = counter_points(inside, q.start_ns, q.end_ns);
                    if points.is_empty() {
                        continue;
                    }
                    Points::Counter(points)
                }
                Gathered::Gauge(mut points) => {
                    points.sort_by_key(|p| p.t);
                    points.dedup_by_key(|p| p.t);
                    if points.is_empty() {
                        continue;
                    }
                    Points::Gauge(points)
                }
            };
            let mut labels: BTreeMap<String, String> = series
                .labels
                .iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            labels.insert("node".into(), node.to_string());
            answers[query].push(SeriesAnswer {
                metric: series.name.to_string(),
                labels,
                points,
            });
        }
        for a in &mut answers {
            a.sort_by(|a, b| a.labels.cmp(&b.labels));
        }
        Ok((answers, cost))
    }

    /// Events in the range, oldest first.
    pub fn events(&self, q: &EventQuery) -> Result<(Vec<EventAnswer>, QueryCost), QueryError> {
        let nodes = match &q.node {
            Some(n) => NodeSelector::Only([n.clone()].into()),
            None => NodeSelector::All,
        };
        let mut out = Vec::new();
        let cost = self.each_frame(nodes, q.start_ns, q.end_ns, |node, frame, in_range| {
            if !in_range || !frame.has_events() {
                return ControlFlow::Continue(());
            }
            let Ok(events) = frame.events() else {
                return ControlFlow::Continue(());
            };
            for e in events {
                if e.unix_ns < q.start_ns || e.unix_ns > q.end_ns {
                    continue;
                }
                if q.kind.as_deref().is_some_and(|k| k != e.kind) {
                    continue;
                }
                if let Some(d) = &q.device
                    && e.labels.get("device") != Some(d)
                    && e.labels.get("gpu") != Some(d)
                {
                    continue;
                }
                out.push(EventAnswer {
                    t: e.unix_ns,
                    node: node.to_string(),
                    kind: e.kind,
                    labels: e
                        .labels
                        .iter()
                        .map(|(k, v)| (k.to_owned(), v.to_owned()))
                        .collect(),
                    code: e.code,
                    text: e.text,
                });
            }
            ControlFlow::Continue(())
        })?;
        out.sort_by(|a, b| (a.t, &a.node).cmp(&(b.t, &b.node)));
        Ok((out, cost))
    }

    /// The metric names (and kinds) of the series the archive holds over the range: those
    /// of the schema entries of the frames from 5 min before `start` (agents repeat their
    /// schema at least every 5 min) to `end`, with `node` matchers choosing the nodes read.
    /// Frames' samples are not decoded.
    pub fn metric_names(
        &self,
        matchers: &[Matcher],
        start_ns: u64,
        end_ns: u64,
    ) -> Result<(BTreeMap<String, Kind>, QueryCost), QueryError> {
        let mut names: BTreeMap<String, Kind> = BTreeMap::new();
        let from = start_ns.saturating_sub(COUNTER_LOOKBACK_NS);
        let cost = self.each_frame(
            node_selector(matchers, "node"),
            from,
            end_ns,
            |_, frame, _| {
                for e in &frame.schema {
                    if !names.contains_key(&*e.series.name) {
                        names.insert(e.series.name.to_string(), e.series.kind);
                    }
                }
                ControlFlow::Continue(())
            },
        )?;
        Ok((names, cost))
    }

    /// The nodes with data in the range.
    pub fn nodes(&self, start_ns: u64, end_ns: u64) -> Result<BTreeSet<String>, QueryError> {
        Ok(self.reader.nodes(start_ns, end_ns)?)
    }
}

/// Reads only the nodes the matchers on `node` accept (every node without such a matcher):
/// the archive decides on its indexes, so other nodes' blocks are never read.
fn node_selector(matchers: &[Matcher], label: &str) -> NodeSelector {
    let on_node: Vec<Matcher> = matchers
        .iter()
        .filter(|m| m.label == label)
        .cloned()
        .collect();
    if on_node.is_empty() {
        return NodeSelector::All;
    }
    NodeSelector::Matching(Arc::new(move |node: &str| {
        on_node.iter().all(|m| m.matches(Some(node)))
    }))
}

/// A counter's rate per second from `(t0, v0)` to `(t1, v1)`, `t0 < t1`: a value below the
/// previous one is a reset, counted from zero (as Prometheus' `rate`).
pub fn counter_rate((t0, v0): (u64, u64), (t1, v1): (u64, u64)) -> f64 {
    let increase = if v1 >= v0 { v1 - v0 } else { v1 };
    increase as f64 / ((t1 - t0) as f64 / 1e9)
}

/// A counter's samples in `[start, end]` with their rates; the sample just before `start`,
/// if the archive has it, gives the first one its rate.
fn counter_points(mut samples: Vec<(u64, u64)>, start: u64, end: u64) -> Vec<CounterPoint> {
    samples.sort_by_key(|&(t, _)| t);
    samples.dedup_by_key(|&mut (t, _)| t);
    let mut out = Vec::new();
    let mut prev: Option<(u64, u64)> = None;
    for (t, v) in samples {
        if t > end {
            break;
        }
        if t >= start {
            let rate = prev.map(|p| counter_rate(p, (t, v)));
            out.push(CounterPoint { t, value: v, rate });
        }
        prev = Some((t, v));
    }
    out
}

#[cfg(test)]
mod tests;
