//! The distance between two metrics: their series are put on a common time grid (a reading
//! holds its value over the cells of `(start, t]`), summed over the labels the two metrics do
//! not share (a GPU metric and an IB port metric are compared per node, two GPU metrics per
//! GPU), each sum divided by its largest magnitude, and the root mean square of the
//! difference taken over the cells where both have data. Two metrics are as far apart as
//! their farthest pair of such sums: redundant only if redundant everywhere.
//!
//! A flat sum (max-normalised variance 0 or under `--min-variance`, zeros included) has no
//! shape: two flat sums give no verdict (both are 1 everywhere once divided by their peaks,
//! at distance 0 whatever they measure), and a flat sum against one that moves is a
//! difference (one moves where the other does not). So a metric flat wherever it is compared
//! is like nothing.

use std::collections::{BTreeMap, BTreeSet};

use super::{MetricTrace, SelectConfig, variance};

/// Two metrics at most this far apart are redundant: the shapes differ by about 5 % of their
/// peaks (one is the other scaled, or a sum of it, give or take noise).
pub const DEFAULT_MAX_DISTANCE: f64 = 0.05;

/// Fewer common cells than this and two sums are not compared (no verdict).
const MIN_OVERLAP: usize = 10;

/// The projection of a series' labels on a set of label names.
type Projection = Vec<(String, String)>;

/// The metrics' series on the grid, with the sums over label subsets computed on demand.
pub struct Grids<'a> {
    metrics: &'a [&'a MetricTrace],
    start_ns: u64,
    step_ns: u64,
    cells: usize,
    /// Per metric, the label names every one of its series has.
    keys: Vec<BTreeSet<String>>,
    /// Under this max-normalised variance a sum is flat.
    min_variance: f64,
    sums: BTreeMap<(usize, Vec<String>), BTreeMap<Projection, Vec<f64>>>,
}

impl<'a> Grids<'a> {
    pub fn new(metrics: &'a [&'a MetricTrace], config: &SelectConfig) -> Self {
        let step_ns = config.step_ns.max(1);
        let cells = (config.end_ns.saturating_sub(config.start_ns) / step_ns + 1) as usize;
        let keys = metrics
            .iter()
            .map(|m| {
                let mut sets = m
                    .series
                    .iter()
                    .map(|s| s.labels.keys().cloned().collect::<BTreeSet<_>>());
                let first = sets.next().unwrap_or_default();
                sets.fold(first, |acc, s| &acc & &s)
            })
            .collect();
        Self {
            metrics,
            start_ns: config.start_ns,
            step_ns,
            cells,
            keys,
            min_variance: config.min_variance,
            sums: BTreeMap::new(),
        }
    }

    /// The grid cell holding time `t` (clamped to the grid).
    fn cell(&self, t: u64) -> usize {
        ((t.saturating_sub(self.start_ns) / self.step_ns) as usize).min(self.cells - 1)
    }

    /// Metric `m`'s series summed per projection of their labels on `on`.
    fn sums(&mut self, m: usize, on: &[String]) -> &BTreeMap<Projection, Vec<f64>> {
        let key = (m, on.to_vec());
        if !self.sums.contains_key(&key) {
            let mut out: BTreeMap<Projection, Vec<f64>> = BTreeMap::new();
            for s in &self.metrics[m].series {
                let projection: Projection = on
                    .iter()
                    .map(|k| (k.clone(), s.labels.get(k).cloned().unwrap_or_default()))
                    .collect();
                let mut grid = vec![f64::NAN; self.cells];
                for r in &s.readings {
                    if !r.value.is_finite() || r.t_ns < self.start_ns {
                        continue;
                    }
                    let last = self.cell(r.t_ns);
                    let first = if r.start_ns < r.t_ns {
                        (self.cell(r.start_ns) + 1).min(last)
                    } else {
                        last
                    };
                    grid[first..=last].fill(r.value);
                }
                let sum = out
                    .entry(projection)
                    .or_insert_with(|| vec![f64::NAN; self.cells]);
                for (acc, v) in sum.iter_mut().zip(grid) {
                    if v.is_finite() {
                        *acc = if acc.is_finite() { *acc + v } else { v };
                    }
                }
            }
            self.sums.insert(key.clone(), out);
        }
        &self.sums[&key]
    }

    /// The distance of metrics `a` and `b`; `None` when they have no sums with enough cells
    /// in common to compare, or only flat ones; infinite where one sum is flat and the other
    /// moves.
    pub fn distance(&mut self, a: usize, b: usize) -> Option<f64> {
        let on: Vec<String> = self.keys[a].intersection(&self.keys[b]).cloned().collect();
        let min_variance = self.min_variance;
        let sums_a = self.sums(a, &on).clone();
        let sums_b = self.sums(b, &on);
        let mut farthest: Option<f64> = None;
        for (projection, xa) in &sums_a {
            let Some(xb) = sums_b.get(projection) else {
                continue;
            };
            if let Some(d) = normalised_rms(xa, xb, min_variance) {
                farthest = Some(farthest.map_or(d, |f: f64| f.max(d)));
            }
        }
        farthest
    }

    /// Every pair's distance (`[i][j]`, symmetric; `None` where not comparable).
    pub fn distances(mut self) -> Vec<Vec<Option<f64>>> {
        let n = self.metrics.len();
        let mut out = vec![vec![None; n]; n];
        let pairs: Vec<(usize, usize)> = (0..n).flat_map(|a| (a..n).map(move |b| (a, b))).collect();
        for (a, b) in pairs {
            let d = if a == b {
                Some(0.0)
            } else {
                self.distance(a, b)
            };
            out[a][b] = d;
            out[b][a] = d;
        }
        out
    }
}

/// The RMS difference of two series each divided by its largest magnitude, over the cells
/// where both have data; `None` below `MIN_OVERLAP` common cells or if both are flat over
/// them ([`variance::is_flat`] at `min_variance`: no shape to compare), infinite if one is
/// flat and the other is not.
pub fn normalised_rms(a: &[f64], b: &[f64], min_variance: f64) -> Option<f64> {
    let common: Vec<(f64, f64)> = a
        .iter()
        .zip(b)
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .map(|(x, y)| (*x, *y))
        .collect();
    if common.len() < MIN_OVERLAP {
        return None;
    }
    let flat_a = variance::is_flat(common.iter().map(|c| c.0), min_variance);
    let flat_b = variance::is_flat(common.iter().map(|c| c.1), min_variance);
    match (flat_a, flat_b) {
        (true, true) => return None,
        (true, false) | (false, true) => return Some(f64::INFINITY),
        (false, false) => {}
    }
    let peak_a = common.iter().fold(0.0f64, |m, (x, _)| m.max(x.abs()));
    let peak_b = common.iter().fold(0.0f64, |m, (_, y)| m.max(y.abs()));
    let sum: f64 = common
        .iter()
        .map(|(x, y)| (x / peak_a - y / peak_b).powi(2))
        .sum();
    Some((sum / common.len() as f64).sqrt())
}
