//! The variance filter: a metric whose every series stays (nearly) at one value over the
//! range tells nothing a single reading would not, so it is dropped. Each series' values are
//! divided by their largest magnitude first, so the test does not depend on the unit (a
//! power in mW and a ratio in [0, 1] are judged alike); a series of zeros is constant.
//!
//! The same test tells [`distance`](super::distance) which sums are flat: a flat line has no
//! shape, so it is like nothing (two flat lines are at distance 0 whatever they measure).

use super::{MetricTrace, SeriesTrace};

/// Below this max-normalised variance a series counts as constant: a value that moves by
/// about ±1 % of its peak (a fixed clock, a steady limit, a counter that never ticks).
pub const DEFAULT_MIN_VARIANCE: f64 = 1e-4;

/// The variance of `values` (the finite ones) divided by their largest magnitude (0 for
/// zeros or fewer than two values).
pub fn normalised_variance_of(values: impl Iterator<Item = f64>) -> f64 {
    let values: Vec<f64> = values.filter(|v| v.is_finite()).collect();
    let peak = values.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    if values.len() < 2 || peak == 0.0 {
        return 0.0;
    }
    let n = values.len() as f64;
    let mean = values.iter().map(|v| v / peak).sum::<f64>() / n;
    values
        .iter()
        .map(|v| (v / peak - mean).powi(2))
        .sum::<f64>()
        / n
}

/// The variance of the series' values divided by their largest magnitude (0 for a series of
/// zeros or with fewer than two readings).
pub fn normalised_variance(series: &SeriesTrace) -> f64 {
    normalised_variance_of(series.readings.iter().map(|r| r.value))
}

/// Whether `values` have no shape: they never move (variance 0, zeros included) or move less
/// than `min_variance`.
pub fn is_flat(values: impl Iterator<Item = f64>, min_variance: f64) -> bool {
    let v = normalised_variance_of(values);
    v == 0.0 || v < min_variance
}

/// Whether every series of the metric has a normalised variance below `min_variance`.
pub fn is_constant(metric: &MetricTrace, min_variance: f64) -> bool {
    metric
        .series
        .iter()
        .all(|s| normalised_variance(s) < min_variance)
}
