//! `railscope select`: Moneo's data-driven metric selection (Moneo paper, §II.B) over a
//! stored time range. Metrics whose series barely move are dropped ([`variance`]); the
//! others are compared pairwise by the max-normalised Euclidean distance of their series
//! ([`distance`]); metrics closer than a threshold are grouped and the smallest set that
//! keeps a member of every group within the threshold of every other member is kept
//! (`grouping`); each kept metric gets the collection-interval cap its data supports, the
//! 5th percentile of its stable-period lengths ([`interval_cap`]). `report` prints the
//! result and the agent's `--sampling` settings; [`cli`] reads the range through the
//! collector's query API, and what railscope reads from the collector (`/api/v1/reads`).
//!
//! Some metrics are never dropped whatever the data ([`keep`]): those a finding rule, the
//! straggler search or a dashboard view reads, failure counters (constant until something
//! fails) and the operator's `--keep`. The result depends on the data alone: the metrics are
//! taken in name order and each one's series in label order, whatever order they came in.

pub mod cli;
pub mod distance;
mod grouping;
pub mod interval_cap;
pub mod keep;
mod report;
pub mod variance;

use std::collections::BTreeMap;

pub use keep::Protected;
pub use report::Selection;

/// One sample of a series as selection sees it: the value (a gauge's mean, a counter's rate
/// per second) over `(start_ns, t_ns]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reading {
    pub start_ns: u64,
    pub t_ns: u64,
    pub value: f64,
}

/// One series of a metric: its labels (the node included) and its readings, oldest first.
#[derive(Clone, Debug, PartialEq)]
pub struct SeriesTrace {
    pub labels: BTreeMap<String, String>,
    pub readings: Vec<Reading>,
}

/// Every series of one metric over the range.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricTrace {
    pub name: String,
    pub series: Vec<SeriesTrace>,
}

/// The knobs of a selection (the defaults are those of `railscope select`).
#[derive(Clone, Debug)]
pub struct SelectConfig {
    /// Start of the range (Unix ns): the first cell of the grid the series are compared on.
    pub start_ns: u64,
    pub end_ns: u64,
    /// The grid's step.
    pub step_ns: u64,
    /// A metric all of whose series have a max-normalised variance below this is constant.
    pub min_variance: f64,
    /// Two metrics at most this far apart (max-normalised RMS distance) are redundant.
    pub max_distance: f64,
    /// Metric-name prefixes that are always kept (never dropped as constant or redundant).
    pub keep: Vec<String>,
    /// Failure counters ([`keep::is_failure_counter`]) are always kept.
    pub keep_failures: bool,
    /// What railscope reads, and what reads it (the collector's `/api/v1/reads`): always
    /// kept.
    pub read_by: BTreeMap<String, Vec<String>>,
    /// Relative difference under which two readings count as the same value when measuring
    /// stable periods (the agent's default `tolerance`, 0.1).
    pub stable_tolerance: f64,
    /// The shortest cap printed (the agent's minimum interval).
    pub min_cap_s: u64,
}

impl SelectConfig {
    /// The defaults over `[start_ns, end_ns]`, keeping what `read_by` names.
    pub fn new(start_ns: u64, end_ns: u64, read_by: BTreeMap<String, Vec<String>>) -> Self {
        Self {
            start_ns,
            end_ns,
            step_ns: 1_000_000_000,
            min_variance: variance::DEFAULT_MIN_VARIANCE,
            max_distance: distance::DEFAULT_MAX_DISTANCE,
            keep: Vec::new(),
            keep_failures: true,
            read_by,
            stable_tolerance: interval_cap::DEFAULT_TOLERANCE,
            min_cap_s: 1,
        }
    }
}

/// `metrics` in a canonical order: by name (the series of a name given twice together), each
/// one's series by labels, then readings; metrics without readings left out. Selection on it
/// gives the same result whatever order the input came in, down to the last bit of the sums.
fn canonical(metrics: &[MetricTrace]) -> Vec<MetricTrace> {
    let mut by_name: BTreeMap<&str, Vec<SeriesTrace>> = BTreeMap::new();
    for m in metrics {
        by_name
            .entry(m.name.as_str())
            .or_default()
            .extend(m.series.iter().cloned());
    }
    by_name
        .into_iter()
        .filter(|(_, series)| series.iter().any(|s| !s.readings.is_empty()))
        .map(|(name, mut series)| {
            series.sort_by(|a, b| {
                a.labels.cmp(&b.labels).then_with(|| {
                    let key = |s: &SeriesTrace| {
                        s.readings
                            .iter()
                            .map(|r| (r.start_ns, r.t_ns, r.value.to_bits()))
                            .collect::<Vec<_>>()
                    };
                    key(a).cmp(&key(b))
                })
            });
            MetricTrace {
                name: name.to_owned(),
                series,
            }
        })
        .collect()
}

/// Runs the selection over `metrics` (metrics without readings are left out).
pub fn select(metrics: &[MetricTrace], config: &SelectConfig) -> Selection {
    let metrics = canonical(metrics);
    let protected: Vec<Protected> = metrics
        .iter()
        .filter_map(|m| {
            keep::reason(&m.name, config).map(|reason| Protected {
                metric: m.name.clone(),
                reason,
            })
        })
        .collect();
    let is_protected = |name: &str| protected.iter().any(|p| p.metric == name);
    let (constant, varying): (Vec<&MetricTrace>, Vec<&MetricTrace>) = metrics
        .iter()
        .partition(|m| variance::is_constant(m, config.min_variance));
    let (kept_constant, constant): (Vec<&MetricTrace>, Vec<&MetricTrace>) =
        constant.into_iter().partition(|m| is_protected(&m.name));
    let grids = distance::Grids::new(&varying, config);
    let distances = grids.distances();
    let names: Vec<&str> = varying.iter().map(|m| m.name.as_str()).collect();
    let forced: Vec<bool> = names.iter().map(|n| is_protected(n)).collect();
    let groups = grouping::group(&names, &distances, config.max_distance, &forced);
    // What railscope reads keeps the agent's default cap: its readers were written for it,
    // and a cap learned from a quiet range would leave them without recent samples (a fleet
    // view over the last minute, a port counter stable for ten).
    let (default_cap, learned): (Vec<&MetricTrace>, Vec<&MetricTrace>) = varying
        .iter()
        .filter(|m| groups.iter().any(|g| g.kept.contains(&m.name)))
        .partition(|m| config.read_by.contains_key(&m.name));
    let caps = learned
        .iter()
        .map(|m| interval_cap::cap(m, config))
        .collect();
    let mut default_cap: Vec<String> = default_cap
        .iter()
        .chain(&kept_constant)
        .map(|m| m.name.clone())
        .collect();
    default_cap.sort_unstable();
    Selection {
        start_ns: config.start_ns,
        end_ns: config.end_ns,
        step_ns: config.step_ns,
        min_variance: config.min_variance,
        max_distance: config.max_distance,
        metrics: metrics.len(),
        series: metrics.iter().map(|m| m.series.len()).sum(),
        protected,
        constant: constant.iter().map(|m| m.name.clone()).collect(),
        kept_constant: kept_constant.iter().map(|m| m.name.clone()).collect(),
        groups,
        caps,
        default_cap,
    }
}
