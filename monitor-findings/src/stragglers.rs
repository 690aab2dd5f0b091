//! Stragglers (Moneo's real-time abnormal resource usage; docs/findings.md, "Stragglers"):
//! within one job, the GPUs and ports whose activity stays far from the job's median over a
//! window. The window is read from the archive and cut into steps; at each step every device
//! of the job is scored against the job's median with the modified z-score
//! `|x - median| / (1.4826 MAD)` (`robust`), so one straggler cannot hide
//! itself by moving the norm; a device whose score is above the threshold in most steps is a
//! straggler, ranked by its median score, with the finding that explains it when there is one.
//!
//! Metrics: GPU SM activity, tensor activity and memory bandwidth (the agent's GPM ratios,
//! whose series carry the job's `job_id`), and each port's IB throughput (sent + received)
//! for the ports of the job's nodes (a node belongs to a job over the window if any of its
//! GPU series above carries the `job_id`: a job whose GPUs carry no job is not listed, as
//! verb series alone would cost a query of every verb counter of the fleet).
//!
//! # Spans
//!
//! The agent samples adaptively: a stable series is sent only every ~32 s, out of phase with
//! its peers, and the two directions of a port at different times. So a sample is not a value
//! at an instant but stands for the whole time it covers, its *span*, and a device's value at
//! a step is the time-weighted mean of the spans that overlap the step:
//!
//! - a gauge sample (an envelope of the reads since the series' previous sample) spans
//!   (previous sample, its time]; its mean holds over all of it. A series' first sample, or
//!   one whose first read is more than [`LOOKBACK_NS`] after the previous sample (the series
//!   paused), spans its own reads, `[start, t]`;
//! - a counter's rate between two of its samples holds over (first, second];
//! - a port's throughput at a step is its transmit rate plus its receive rate, each from its
//!   own counter's spans over the step, whenever each direction was sent; a step where one
//!   direction is not covered does not score the port.
//!
//! A device is scored at every step its spans cover, in part or whole. The window is read
//! from [`LOOKBACK_NS`] before it to as long after it, so the spans that reach into it from
//! either side are known.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    sync::Arc,
};

use monitor_wire::{Kind, names::metric};
use serde::Serialize;

pub mod recent;
mod spans;

use recent::RecentSteps;
use spans::{Covers, Grid, counter_covers, gauge_covers, values_of};

use crate::{
    Finding, FindingsStore,
    live_table::Schema,
    robust::{Norm, median},
    store::FindingFilter,
};
use monitor_archive::query::{
    engine::{Points, QueryEngine, QueryError, SeriesQuery},
    selector::Matcher,
};

/// What the search reads of the collector's live table: the straggler metrics' steps kept
/// at ingest ([`RecentSteps`]), and which nodes a job's search may skip. The collector's node
/// table implements it.
pub trait LiveSteps: Send + Sync {
    /// Shows `f` the recent steps ([`RecentSteps`]) of every node held whole since before
    /// `since_ns` whose steps reach back to epoch step `first_step`; returns those nodes.
    fn visit_recent_steps(
        &self,
        since_ns: u64,
        first_step: u64,
        f: &mut dyn FnMut(&Arc<str>, &Schema, &RecentSteps),
    ) -> HashSet<Arc<str>>;

    /// The nodes held whole since before `since_ns` none of whose series among `metrics`
    /// carries `label` = `value`: a job's search need not read them.
    fn ruled_out(
        &self,
        metrics: &[&str],
        label: &str,
        value: &str,
        since_ns: u64,
    ) -> HashSet<Arc<str>>;
}

/// The GPU metrics compared, and the smallest scale a score divides by (2 points of a ratio).
pub const GPU_METRICS: &[&str] = &[
    metric::GPU_SM_UTIL_RATIO,
    metric::GPU_TENSOR_UTIL_RATIO,
    metric::GPU_DRAM_BW_UTIL_RATIO,
];
const GPU_FLOOR: f64 = 0.02;
/// The port metric as reported, from the two counters whose rates it adds.
pub const PORT_METRIC: &str = "railscope_ib_port_bytes_per_second";
pub const PORT_COUNTERS: &[&str] = &[
    metric::IB_PORT_XMIT_BYTES_TOTAL,
    metric::IB_PORT_RCV_BYTES_TOTAL,
];

/// Every metric the search reads (what `railscope select` never drops, [`crate::reads`]).
pub fn metrics_read() -> impl Iterator<Item = &'static str> {
    GPU_METRICS.iter().chain(PORT_COUNTERS).copied()
}
/// A port's floor: 2% of the job's median throughput.
const PORT_FLOOR_FRACTION: f64 = 0.02;
/// How far before and after the window the samples whose spans reach into it are read: a
/// stable series is sent at least every 32 s + 10% jitter (the agent's longest interval),
/// with a margin for a lost frame or two.
pub const LOOKBACK_NS: u64 = 120_000_000_000;

/// The default step of a window: also the step of the steps kept at ingest ([`recent`]),
/// which answer only windows of this step.
pub const STEP_NS: u64 = 10_000_000_000;

/// How stragglers are searched for.
#[derive(Clone, Debug, PartialEq)]
pub struct StragglerSettings {
    /// Step of the window, ns (default 10 s).
    pub step_ns: u64,
    /// Score above which a device is far from its job's median: Iglewicz & Hoaglin's 3.5.
    pub score: f64,
    /// Share of the window's steps in which it must be far (default 0.75: "stays").
    pub min_fraction: f64,
    /// A device far in each of its latest this many scored steps is flagged too, as an
    /// onset, although it was not far in most of the window (default 2: 20 s of 10 s steps).
    /// Without it a GPU that slows down is flagged once it filled 75% of the window, 225 s
    /// into a 5-minute one; with it within about 30 s (Holmes: 30.3 s). One far step alone
    /// (a 10 s hiccup) is not enough.
    pub onset_steps: usize,
    /// Devices a job needs for a median to mean something (default 4).
    pub min_devices: usize,
}

impl Default for StragglerSettings {
    fn default() -> Self {
        Self {
            step_ns: STEP_NS,
            score: 3.5,
            min_fraction: 0.75,
            onset_steps: 2,
            min_devices: 4,
        }
    }
}

/// One straggler (docs/http-api.md).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Straggler {
    pub node: String,
    pub gpu: Option<String>,
    pub device: Option<String>,
    pub port: Option<u32>,
    pub metric: String,
    /// The device's median over the window (over its latest far steps for an onset).
    pub value: f64,
    /// The job's median.
    pub median: f64,
    /// The device's median score over the steps (over its latest far steps for an onset).
    pub score: f64,
    /// The share of steps it was far in.
    pub fraction: f64,
    /// Flagged as an onset: far in each of its latest `onset_steps` steps, not (yet) in most
    /// of the window.
    pub onset: bool,
    /// The id of a finding on the same GPU or port that explains it.
    pub cause: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct JobStragglers {
    pub job_id: String,
    pub nodes: usize,
    pub gpus: usize,
    pub stragglers: Vec<Straggler>,
}

/// A device of a job: (node, gpu) or (node, device, port).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Device {
    Gpu(String, String),
    Port(String, String, u32),
}

/// A device's value at each step of the window, by index (NaN: not covered).
type StepValues = Vec<f64>;
/// Per job, metric and device: the values in each step of the window.
type Steps = BTreeMap<(String, &'static str), BTreeMap<Device, StepValues>>;

/// Whether no step is covered.
fn uncovered(values: &[f64]) -> bool {
    values.iter().all(|v| v.is_nan())
}

/// Takes the steps `new` covers into `into` (a device of several series, their labels
/// apart: step by step, the later series wins).
fn take_covered(into: &mut StepValues, new: &[f64]) {
    if into.is_empty() {
        into.extend_from_slice(new);
        return;
    }
    for (mine, &v) in into.iter_mut().zip(new) {
        if !v.is_nan() {
            *mine = v;
        }
    }
}
/// A job's nodes, GPUs and stragglers.
type JobFound = (BTreeSet<String>, BTreeSet<Device>, Vec<Straggler>);
/// A straggler's place: node, GPU, device, port.
type Place = (String, Option<String>, Option<String>, Option<u32>);

/// What a search found, and where it read each node from.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Search {
    pub jobs: Vec<JobStragglers>,
    pub read: NodesRead,
}

/// The nodes a search read: from the steps kept at ingest, and from the archive (the
/// nodes the live table could neither answer for nor rule out).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NodesRead {
    pub steps: usize,
    pub archive: usize,
}

/// Searches the window `[start_ns, end_ns]` (`job`: only this job): from the steps kept at
/// ingest for the nodes `live` answers for, from the archive for the others.
pub fn find(
    engine: &QueryEngine,
    findings: Option<&FindingsStore>,
    live: Option<&dyn LiveSteps>,
    job: Option<&str>,
    start_ns: u64,
    end_ns: u64,
    settings: &StragglerSettings,
) -> Result<Search, QueryError> {
    let step = settings.step_ns.max(1);
    let job_matcher = match job {
        Some(j) => Matcher::parse(&format!("job_id={j:?}")),
        None => Matcher::parse("job_id=~.+"),
    }
    .expect("a fixed matcher parses");
    let grid = Grid {
        start: start_ns,
        end: end_ns.max(start_ns),
        step,
    };
    // The spans that reach into the window from before or after it.
    let (read_from, read_to) = (
        start_ns.saturating_sub(LOOKBACK_NS),
        end_ns.saturating_add(LOOKBACK_NS),
    );
    let mut steps: Steps = BTreeMap::new();
    let mut all_nodes: Vec<String> = engine.nodes(read_from, read_to)?.into_iter().collect();
    let mut read = NodesRead::default();
    if let Some(live) = live {
        // A window ending within a step of the present (the API's default, `end` = now when
        // asked) ends with the step under way, as far as samples have come.
        let open = end_ns.saturating_add(step) >= monitor_archive::clock::unix_now_ns();
        if grid.is_aligned(open) && step == STEP_NS {
            // The nodes the live table has held whole over the window and its look-back:
            // their recent steps, spread at ingest, are the window's (it is aligned to them).
            let mut covers = WindowCovers::default();
            let first_step = grid.start / step;
            let answered =
                live.visit_recent_steps(read_from, first_step, &mut |node, schema, recent| {
                    covers.add_recent(
                        node,
                        schema,
                        recent,
                        job,
                        first_step,
                        first_step + grid.steps(),
                    );
                });
            covers.into_steps(&mut steps);
            read.steps = answered.len();
            all_nodes.retain(|n| !answered.contains(n.as_str()));
        }
        if let Some(job) = job
            && !all_nodes.is_empty()
        {
            // One job: of the others, only the nodes the live table cannot rule out of it (a
            // 1,024-node job of a 12,500-node fleet reads its own nodes, not the fleet's).
            let ruled_out = live.ruled_out(GPU_METRICS, "job_id", job, read_from);
            all_nodes.retain(|n| !ruled_out.contains(n.as_str()));
        }
    }
    read.archive = all_nodes.len();
    // The others from the archive, a chunk of nodes at a time, so no answer grows with the
    // fleet (a 1,000-node fleet read every second holds about 4,300 points per node and
    // metric over the read range).
    for chunk in all_nodes.chunks(NODES_PER_QUERY) {
        let chunk: BTreeSet<String> = chunk.iter().cloned().collect();
        read_chunk(
            engine,
            &chunk,
            &job_matcher,
            &grid,
            (read_from, read_to),
            &mut steps,
        )?;
    }

    let active: Vec<Finding> = findings
        .map(|f| {
            f.list(&FindingFilter {
                start_ns,
                end_ns,
                ..FindingFilter::default()
            })
        })
        .unwrap_or_default();
    let mut jobs: BTreeMap<String, JobFound> = BTreeMap::new();
    for ((job, metric), devices) in &steps {
        let entry = jobs.entry(job.clone()).or_default();
        for d in devices.keys() {
            match d {
                Device::Gpu(n, _) => {
                    entry.0.insert(n.clone());
                    entry.1.insert(d.clone());
                }
                Device::Port(n, ..) => {
                    entry.0.insert(n.clone());
                }
            }
        }
        entry
            .2
            .extend(score_metric(metric, devices, settings, &active));
    }
    let jobs = jobs
        .into_iter()
        .map(|(job_id, (nodes, gpus, found))| {
            // One entry per device: its worst metric.
            let mut best: BTreeMap<Place, Straggler> = BTreeMap::new();
            for s in found {
                let key = (s.node.clone(), s.gpu.clone(), s.device.clone(), s.port);
                match best.get(&key) {
                    Some(b) if b.score >= s.score => {}
                    _ => {
                        best.insert(key, s);
                    }
                }
            }
            let mut stragglers: Vec<Straggler> = best.into_values().collect();
            stragglers.sort_by(|a, b| b.score.total_cmp(&a.score));
            JobStragglers {
                job_id,
                nodes: nodes.len(),
                gpus: gpus.len(),
                stragglers,
            }
        })
        .collect();
    Ok(Search { jobs, read })
}

/// Nodes asked about in one query.
pub const NODES_PER_QUERY: usize = 100;

/// What the spans of some nodes' series give the window's steps, before they are made into
/// devices' values: read from the archive ([`read_chunk`]) or from the live table's recent
/// steps ([`WindowCovers::add_recent`]).
#[derive(Default)]
struct WindowCovers {
    /// GPU series with a job: metric, node, GPU, job, and their covers.
    gpus: Vec<(&'static str, String, String, String, Covers)>,
    /// Per port, per direction (transmit, receive): the covers of its counters, added (series
    /// of one port that differ in other labels: their spans add up).
    ports: HashMap<(String, String, u32), [Covers; 2]>,
}

impl WindowCovers {
    /// A series of a GPU metric of `node` (`label`: its labels), if it carries a job (and the
    /// job asked for, if any).
    fn add_gpu<'a>(
        &mut self,
        metric: &str,
        node: &str,
        label: impl Fn(&str) -> Option<&'a str>,
        job: Option<&str>,
        covers: Covers,
    ) {
        let Some(metric) = GPU_METRICS.iter().copied().find(|m| *m == metric) else {
            return;
        };
        let (Some(gpu), Some(job_id)) = (label("gpu"), label("job_id").filter(|j| !j.is_empty()))
        else {
            return;
        };
        if job.is_some_and(|j| j != job_id) {
            return;
        }
        self.gpus
            .push((metric, node.into(), gpu.into(), job_id.into(), covers));
    }

    /// A series of a port counter of `node` (`label`: its labels).
    fn add_port<'a>(
        &mut self,
        metric: &str,
        node: &str,
        label: impl Fn(&str) -> Option<&'a str>,
        covers: Covers,
    ) {
        let Some(direction) = PORT_COUNTERS.iter().position(|m| *m == metric) else {
            return;
        };
        let (Some(device), Some(port)) = (
            label("device"),
            label("port").and_then(|p| p.parse::<u32>().ok()),
        ) else {
            return;
        };
        let mine = &mut self
            .ports
            .entry((node.into(), device.into(), port))
            .or_default()[direction];
        if mine.is_empty() {
            *mine = covers;
        } else {
            for (m, c) in mine.iter_mut().zip(&covers) {
                m.add(c);
            }
        }
    }

    /// The kept series of one node the live table holds whole, over epoch steps
    /// `[first_step, end_step)`.
    fn add_recent(
        &mut self,
        node: &str,
        schema: &Schema,
        recent: &RecentSteps,
        job: Option<&str>,
        first_step: u64,
        end_step: u64,
    ) {
        // GPUs first: the ports of a node none of whose GPUs carry the job (most nodes of the
        // fleet, for one job) would only be dropped by `into_steps`, so they are not read.
        let gpus_before = self.gpus.len();
        for ports in [false, true] {
            if ports && self.gpus.len() == gpus_before {
                return;
            }
            for (id, steps) in recent.series() {
                let is_gpu = steps.kind() == Kind::Gauge;
                if is_gpu == ports {
                    continue;
                }
                let Some(series) = schema.entries.get(&id) else {
                    continue;
                };
                if is_gpu && job.is_some_and(|j| series.labels.get("job_id") != Some(j)) {
                    continue;
                }
                let Some(covers) = steps.covers(first_step, end_step) else {
                    continue;
                };
                let label = |k: &str| series.labels.get(k);
                if is_gpu {
                    self.add_gpu(&series.name, node, label, job, covers);
                } else {
                    self.add_port(&series.name, node, label, covers);
                }
            }
        }
    }

    /// Adds the GPUs' values at each step to `steps`, then the ports' of the nodes whose
    /// GPUs carry a job: each direction's rate over each step, the two added where both
    /// cover the step.
    fn into_steps(self, steps: &mut Steps) {
        let mut node_jobs: HashMap<String, BTreeSet<String>> = HashMap::new();
        for (metric, node, gpu, job, covers) in self.gpus {
            let values = values_of(&covers);
            if uncovered(&values) {
                continue;
            }
            node_jobs
                .entry(node.clone())
                .or_default()
                .insert(job.clone());
            let mine = steps
                .entry((job, metric))
                .or_default()
                .entry(Device::Gpu(node, gpu))
                .or_default();
            take_covered(mine, &values);
        }
        for ((node, device, port), [tx, rx]) in self.ports {
            let Some(jobs) = node_jobs.get(&node) else {
                continue;
            };
            // Both directions, where both cover a step (NaN where either does not).
            let values: StepValues = values_of(&tx)
                .iter()
                .zip(values_of(&rx))
                .map(|(t, r)| t + r)
                .collect();
            if uncovered(&values) {
                continue;
            }
            for job in jobs {
                steps.entry((job.clone(), PORT_METRIC)).or_default().insert(
                    Device::Port(node.clone(), device.clone(), port),
                    values.clone(),
                );
            }
        }
    }
}

/// Adds the steps of the GPUs and ports of `nodes` (one chunk of the fleet) to `steps`, read
/// from the archive. The GPU metrics and the port counters are read at once (each frame
/// opened once); the ports of a node whose GPUs carry no job are then left out.
fn read_chunk(
    engine: &QueryEngine,
    nodes: &BTreeSet<String>,
    job_matcher: &Matcher,
    grid: &Grid,
    (read_from, read_to): (u64, u64),
    steps: &mut Steps,
) -> Result<(), QueryError> {
    let query = |metric: &str, matchers: Vec<Matcher>| SeriesQuery {
        metric: metric.into(),
        matchers,
        start_ns: read_from,
        end_ns: read_to,
    };
    let queries: Vec<SeriesQuery> = GPU_METRICS
        .iter()
        .map(|m| query(m, vec![job_matcher.clone()]))
        .chain(PORT_COUNTERS.iter().map(|m| query(m, Vec::new())))
        .collect();
    let answers = engine.series_many_of_nodes(&queries, nodes)?.0;
    let mut covers = WindowCovers::default();
    for (q, answers) in queries.iter().zip(answers) {
        for a in answers {
            let Some(node) = a.labels.get("node") else {
                continue;
            };
            let label = |k: &str| a.labels.get(k).map(String::as_str);
            match &a.points {
                Points::Gauge(points) => {
                    covers.add_gpu(&q.metric, node, label, None, gauge_covers(grid, points))
                }
                Points::Counter(points) => {
                    covers.add_port(&q.metric, node, label, counter_covers(grid, points))
                }
            }
        }
    }
    covers.into_steps(steps);
    Ok(())
}

fn score_metric(
    metric: &'static str,
    devices: &BTreeMap<Device, StepValues>,
    settings: &StragglerSettings,
    findings: &[Finding],
) -> Vec<Straggler> {
    if devices.len() < settings.min_devices {
        return Vec::new();
    }
    // In device order, each with the steps it was scored at, in step order: its value and
    // score at each.
    let devices: Vec<(&Device, &StepValues)> = devices.iter().collect();
    let steps = devices.iter().map(|(_, v)| v.len()).max().unwrap_or(0);
    let mut scores: Vec<Vec<(f64, f64)>> = vec![Vec::new(); devices.len()];
    let mut step_medians = Vec::new();
    let (mut at, mut xs) = (Vec::new(), Vec::new());
    for k in 0..steps {
        at.clear();
        at.extend(devices.iter().enumerate().filter_map(|(i, (_, values))| {
            let v = *values.get(k)?;
            (!v.is_nan()).then_some((i, v))
        }));
        if at.len() < settings.min_devices {
            continue;
        }
        xs.clear();
        xs.extend(at.iter().map(|v| v.1));
        let Some(probe) = Norm::of(&xs, 0.0) else {
            continue;
        };
        let floor = if metric == PORT_METRIC {
            probe.median.abs() * PORT_FLOOR_FRACTION
        } else {
            GPU_FLOOR
        }
        .max(f64::MIN_POSITIVE);
        let norm = Norm { floor, ..probe };
        step_medians.push(norm.median);
        for &(i, v) in &at {
            scores[i].push((v, norm.score(v)));
        }
    }
    let job_median = median(&step_medians).unwrap_or(f64::NAN);
    let mut out = Vec::new();
    for ((d, values), steps) in devices.into_iter().zip(scores) {
        if steps.is_empty() {
            continue;
        }
        let is_far = |&&(_, score): &&(f64, f64)| score > settings.score;
        let far = steps.iter().filter(is_far).count();
        let fraction = far as f64 / steps.len() as f64;
        let latest = &steps[steps.len().saturating_sub(settings.onset_steps.max(1))..];
        let onset = settings.onset_steps > 0
            && latest.len() == settings.onset_steps
            && latest.iter().all(|step| is_far(&step));
        let (values, s): (Vec<f64>, Vec<f64>) = if fraction >= settings.min_fraction {
            (
                values.iter().copied().filter(|v| !v.is_nan()).collect(),
                steps.iter().map(|x| x.1).collect(),
            )
        } else if onset {
            latest.iter().copied().unzip()
        } else {
            continue;
        };
        let onset = fraction < settings.min_fraction;
        let (node, gpu, device, port) = match d {
            Device::Gpu(n, g) => (n.clone(), Some(g.clone()), None, None),
            Device::Port(n, dev, p) => (n.clone(), None, Some(dev.clone()), Some(*p)),
        };
        let cause = cause_of(findings, &node, gpu.as_deref(), device.as_deref(), port);
        out.push(Straggler {
            node,
            gpu,
            device,
            port,
            metric: metric.into(),
            value: median(&values).unwrap_or(f64::NAN),
            median: job_median,
            score: median(&s).unwrap_or(0.0),
            fraction,
            onset,
            cause,
        });
    }
    out
}

/// The finding on the same GPU or port that explains a straggler: the most severe, then the
/// earliest.
fn cause_of(
    findings: &[Finding],
    node: &str,
    gpu: Option<&str>,
    device: Option<&str>,
    port: Option<u32>,
) -> Option<String> {
    findings
        .iter()
        .filter(|f| f.node == node)
        .filter(|f| match gpu {
            Some(g) => f.gpu.as_deref() == Some(g),
            None => f.device.as_deref() == device && f.port == port,
        })
        .max_by(|a, b| a.severity.cmp(&b.severity).then(b.start.cmp(&a.start)))
        .map(|f| f.id.clone())
}

#[cfg(test)]
mod tests;
