//! A sample's span spread over the steps of a window (see the module above, "Spans"): what
//! each step gets of a series' samples, whether the window's spans are read from the archive
//! or were spread at ingest into the live table's recent steps ([`super::recent`]).

use monitor_archive::query::engine::{CounterPoint, GaugePoint};

use super::LOOKBACK_NS;

/// What a series' spans give one step: the time covered, the value × time, and spans of no
/// length (a single read with no previous sample) in it, their values' sum and number.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Cover {
    pub(crate) ns: f64,
    pub(crate) sum: f64,
    pub(crate) instants: u32,
    pub(crate) instant_sum: f64,
}

impl Cover {
    /// The time-weighted mean of the spans over the step (instants only when no span of any
    /// length covers it).
    pub(crate) fn value(&self) -> Option<f64> {
        if self.ns > 0.0 {
            Some(self.sum / self.ns)
        } else if self.instants > 0 {
            Some(self.instant_sum / f64::from(self.instants))
        } else {
            None
        }
    }

    pub(crate) fn add(&mut self, other: &Cover) {
        self.ns += other.ns;
        self.sum += other.sum;
        self.instants += other.instants;
        self.instant_sum += other.instant_sum;
    }
}

/// What covers each step of a window, by its index (a step nothing covers: the default,
/// whose [`Cover::value`] is None). Dense, not a map: a 1,024-node job's search holds 40,960
/// series of 30 steps, and a map per series made the search's bookkeeping cost more than its
/// reading.
pub(crate) type Covers = Vec<Cover>;

/// Each step's value (NaN: not covered), by index.
pub(crate) fn values_of(covers: &[Cover]) -> Vec<f64> {
    covers
        .iter()
        .map(|c| c.value().unwrap_or(f64::NAN))
        .collect()
}

/// The window `[start, end]` cut into steps `[start + k step, start + (k + 1) step)`, the last
/// one ending at `end`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Grid {
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) step: u64,
}

impl Grid {
    /// The steps of all time, aligned to the epoch: step `k` is `[k step, (k + 1) step)`.
    /// A window whose start and end are multiples of `step` has the same steps, numbered
    /// from its own start.
    pub(crate) fn epoch(step: u64) -> Self {
        Self {
            start: 0,
            end: u64::MAX,
            step,
        }
    }

    pub(crate) fn steps(&self) -> u64 {
        (self.end - self.start).div_ceil(self.step).max(1)
    }

    /// Covers of every step of the window, nothing covering any yet.
    pub(crate) fn no_covers(&self) -> Covers {
        vec![Cover::default(); self.steps() as usize]
    }

    /// Whether the window's steps are the epoch's: its start on a step, and its end on one
    /// or, `open`, at the present (its last step is then the epoch's step under way, covered
    /// as far as samples have come, which may be a little past `end`).
    pub(crate) fn is_aligned(&self, open: bool) -> bool {
        self.start.is_multiple_of(self.step) && (open || self.end.is_multiple_of(self.step))
    }

    /// Spreads `v` over the span `(a, b]` (the instant `b` when `a == b`): gives `to` each
    /// step it overlaps with what it gets, by the time it covers of the step.
    pub(crate) fn spread_with(&self, a: u64, b: u64, v: f64, mut to: impl FnMut(u64, Cover)) {
        if !v.is_finite() || b < a {
            return;
        }
        let last = self.steps() - 1;
        if a == b {
            if (self.start..=self.end).contains(&b) {
                let k = ((b - self.start) / self.step).min(last);
                let instant = Cover {
                    instants: 1,
                    instant_sum: v,
                    ..Cover::default()
                };
                to(k, instant);
            }
            return;
        }
        let (lo, hi) = (a.max(self.start), b.min(self.end));
        if hi <= lo {
            return;
        }
        let first = (lo - self.start) / self.step;
        let final_k = ((hi - 1 - self.start) / self.step).min(last);
        for k in first..=final_k {
            let s0 = self.start + k * self.step;
            let s1 = if k == last { self.end } else { s0 + self.step };
            let overlap = hi.min(s1).saturating_sub(lo.max(s0));
            if overlap > 0 {
                to(
                    k,
                    Cover {
                        ns: overlap as f64,
                        sum: v * overlap as f64,
                        ..Cover::default()
                    },
                );
            }
        }
    }

    /// [`Self::spread_with`] into `covers` (the window's, from [`Self::no_covers`]).
    pub(crate) fn spread(&self, covers: &mut Covers, a: u64, b: u64, v: f64) {
        self.spread_with(a, b, v, |k, c| covers[k as usize].add(&c));
    }
}

/// Where a gauge sample's span starts: at the series' previous sample, unless there is none
/// or the series paused (its first read more than [`LOOKBACK_NS`] after it): then at its own
/// first read.
pub(crate) fn gauge_span_start(previous: Option<u64>, start: u64, t: u64) -> u64 {
    match previous {
        Some(p) if start <= p.saturating_add(LOOKBACK_NS) => p,
        _ => start.min(t),
    }
}

/// The spans of a gauge's samples over the grid: each mean over (previous sample, its time].
pub(crate) fn gauge_covers(grid: &Grid, points: &[GaugePoint]) -> Covers {
    let mut covers = grid.no_covers();
    let mut prev: Option<u64> = None;
    for p in points {
        let from = gauge_span_start(prev, p.start, p.t);
        grid.spread(&mut covers, from, p.t, p.mean);
        prev = Some(p.t);
    }
    covers
}

/// The spans of a counter's samples over the grid: each rate over (previous sample, its time].
pub(crate) fn counter_covers(grid: &Grid, points: &[CounterPoint]) -> Covers {
    let mut covers = grid.no_covers();
    for w in points.windows(2) {
        if let Some(rate) = w[1].rate {
            grid.spread(&mut covers, w[0].t, w[1].t, rate);
        }
    }
    covers
}
