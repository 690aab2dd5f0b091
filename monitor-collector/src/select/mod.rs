//! `railscope select`: Moneo's data-driven metric selection (Moneo paper, §II.B) over a
//! stored time range. Metrics whose series barely move are dropped ([`variance`]); the
//! others are compared pairwise by the max-normalised Euclidean distance of their series
//! ([`distance`]); metrics closer than a threshold are grouped and the smallest set that
//! keeps a member of every group within the threshold of every other member is kept
//! ([`grouping`]); each kept metric gets the collection-interval cap its data supports, the
//! 5th percentile of its stable-period lengths ([`interval_cap`]). [`report`] prints the
//! result and the agent's `--sampling` settings; [`cli`] reads the range through the
//! collector's query API.

pub mod cli;
pub mod distance;
pub mod grouping;
pub mod interval_cap;
pub mod report;
pub mod variance;

use std::collections::BTreeMap;

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
    /// Relative difference under which two readings count as the same value when measuring
    /// stable periods (the agent's default `tolerance`, 0.1).
    pub stable_tolerance: f64,
    /// The shortest cap printed (the agent's minimum interval).
    pub min_cap_s: u64,
}

impl SelectConfig {
    pub fn new(start_ns: u64, end_ns: u64) -> Self {
        Self {
            start_ns,
            end_ns,
            step_ns: 1_000_000_000,
            min_variance: variance::DEFAULT_MIN_VARIANCE,
            max_distance: distance::DEFAULT_MAX_DISTANCE,
            keep: Vec::new(),
            stable_tolerance: interval_cap::DEFAULT_TOLERANCE,
            min_cap_s: 1,
        }
    }

    fn kept_always(&self, name: &str) -> bool {
        self.keep.iter().any(|p| name.starts_with(p.as_str()))
    }
}

/// Runs the selection over `metrics` (metrics without readings are left out).
pub fn select(metrics: &[MetricTrace], config: &SelectConfig) -> Selection {
    let metrics: Vec<&MetricTrace> = metrics
        .iter()
        .filter(|m| m.series.iter().any(|s| !s.readings.is_empty()))
        .collect();
    let (constant, varying): (Vec<&MetricTrace>, Vec<&MetricTrace>) =
        metrics.iter().partition(|m| {
            !config.kept_always(&m.name) && variance::is_constant(m, config.min_variance)
        });
    let grids = distance::Grids::new(&varying, config);
    let distances = grids.distances();
    let names: Vec<&str> = varying.iter().map(|m| m.name.as_str()).collect();
    let forced: Vec<bool> = names.iter().map(|n| config.kept_always(n)).collect();
    let groups = grouping::group(&names, &distances, config.max_distance, &forced);
    let caps = varying
        .iter()
        .filter(|m| groups.iter().any(|g| g.kept.contains(&m.name)))
        .map(|m| interval_cap::cap(m, config))
        .collect();
    Selection {
        start_ns: config.start_ns,
        end_ns: config.end_ns,
        step_ns: config.step_ns,
        min_variance: config.min_variance,
        max_distance: config.max_distance,
        metrics: metrics.len(),
        series: metrics.iter().map(|m| m.series.len()).sum(),
        constant: constant.iter().map(|m| m.name.clone()).collect(),
        groups,
        caps,
    }
}

#[cfg(test)]
mod tests;
