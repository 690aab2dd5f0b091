//! The collection-interval cap learned from data (Moneo): a series is stable while its
//! readings stay within a tolerance of the value that began the period; the cap of a metric
//! is the 5th percentile of the lengths of all its series' stable periods, so that backing
//! off to the cap misses the start of a change in at most about 1 period in 20. Periods cut
//! by the range's ends are left out (their true length is unknown).

use serde::Serialize;

use super::{MetricTrace, SelectConfig, SeriesTrace};

/// The agent's default `tolerance`: values within 10 % of the smaller count as the same.
pub const DEFAULT_TOLERANCE: f64 = 0.10;

/// The percentile of stable-period lengths that becomes the cap.
pub const PERCENTILE: f64 = 5.0;

/// A kept metric's learned cap.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MetricCap {
    pub metric: String,
    /// The cap, whole seconds (at least the agent's minimum interval).
    pub max_s: u64,
    /// The 5th percentile of the stable-period lengths (or the longest cut period of a
    /// metric stable over the whole range), seconds.
    pub p5_s: f64,
    /// Stable periods measured (not cut by the range).
    pub periods: usize,
}

fn same(a: f64, b: f64, tolerance: f64) -> bool {
    (a - b).abs() <= tolerance * a.abs().min(b.abs())
}

/// A stable period of a series.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Period {
    pub len_ns: u64,
    /// Begins with the series' first reading or ends with its last: cut by the range, its
    /// true length unknown (at least `len_ns`).
    pub cut: bool,
}

/// The stable periods of one series, in order. A reading stands for the time since the
/// previous one (the first: since its own start).
pub fn stable_periods(series: &SeriesTrace, tolerance: f64) -> Vec<Period> {
    let mut out = Vec::new();
    let mut period: Option<(u64, f64, u64)> = None; // (start, reference value, end)
    let mut prev_t: Option<u64> = None;
    for r in series.readings.iter().filter(|r| r.value.is_finite()) {
        let from = prev_t.unwrap_or(r.start_ns.min(r.t_ns));
        prev_t = Some(r.t_ns);
        match &mut period {
            Some((_, reference, end)) if same(*reference, r.value, tolerance) => *end = r.t_ns,
            _ => {
                if let Some((start, _, end)) = period {
                    out.push(Period {
                        len_ns: end - start,
                        cut: out.is_empty(),
                    });
                }
                period = Some((from, r.value, r.t_ns));
            }
        }
    }
    if let Some((start, _, end)) = period {
        out.push(Period {
            len_ns: end - start,
            cut: true,
        });
    }
    out
}

/// The nearest-rank percentile `p` of `values` (sorted here); `None` when empty.
pub fn percentile(values: &mut [u64], p: f64) -> Option<u64> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    let rank = ((p / 100.0) * values.len() as f64).ceil().max(1.0) as usize;
    Some(values[rank.min(values.len()) - 1])
}

/// The cap of a metric from the stable periods of its series that the range does not cut;
/// a metric with none (stable over the whole range) gets its longest cut period, a lower
/// bound of how long it stays stable.
pub fn cap(metric: &MetricTrace, config: &SelectConfig) -> MetricCap {
    let all: Vec<Period> = metric
        .series
        .iter()
        .flat_map(|s| stable_periods(s, config.stable_tolerance))
        .collect();
    let mut whole: Vec<u64> = all.iter().filter(|p| !p.cut).map(|p| p.len_ns).collect();
    let (count, chosen_ns) = if whole.is_empty() {
        (all.len(), all.iter().map(|p| p.len_ns).max().unwrap_or(0))
    } else {
        (whole.len(), percentile(&mut whole, PERCENTILE).unwrap_or(0))
    };
    MetricCap {
        metric: metric.name.clone(),
        max_s: (chosen_ns / 1_000_000_000).max(config.min_cap_s),
        p5_s: chosen_ns as f64 / 1e9,
        periods: count,
    }
}
