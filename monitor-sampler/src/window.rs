//! A series' window: the last values judged (gauge values, counter rates), with its peak and
//! how many values are close to that peak kept up to date as values come and go.
//!
//! Why: the agent judges every read of every series, hundreds a second, and judging asks for
//! the window's peak, its low edge and its density. Computed from scratch that is four passes
//! over the window a read, about half of the agent's user-space instructions (callgrind,
//! bench/results/agent.md). Kept as values are pushed and popped, a read of a stable series
//! costs one pass (its low edge) and an unstable one none, unless the value leaving the window
//! was its only peak. The answers are the same values, compared exactly.

use std::collections::VecDeque;

use crate::SamplerConfig;

/// Reads after a shift that decide whether it lasts: when one of them is back within the range
/// the series had before, the shift was a transient (a stall of a training step or two) and
/// the series resumes from its previous window (the series' state decides that). Also the
/// number of lowest values the low edge of a window leaves out.
pub(crate) const TRANSIENT_READS: u32 = 2;

/// The peak of the window, how many values equal it, and how many are close to it.
#[derive(Clone, Copy, Debug)]
struct PeakCount {
    peak: f64,
    at_peak: u32,
    near: u32,
}

/// The last values of a series that its stability is judged on. One series' config (its
/// group's) is used for every call: `near` counts closeness by that config's tolerance.
#[derive(Clone, Debug, Default)]
pub(crate) struct Window {
    values: VecDeque<f64>,
    /// `None` when it has to be counted again (a value above the peak came, or the only
    /// value at the peak left).
    count: Option<PeakCount>,
}

impl Window {
    pub(crate) fn len(&self) -> usize {
        self.values.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    pub(crate) fn clear(&mut self) {
        self.values.clear();
        self.count = None;
    }

    /// Adds `x`, first dropping the oldest values so that at most `cap` remain.
    pub(crate) fn push(&mut self, c: &SamplerConfig, x: f64, cap: usize) {
        while self.values.len() >= cap {
            let Some(old) = self.values.pop_front() else {
                break;
            };
            if let Some(n) = &mut self.count {
                if old == n.peak {
                    n.at_peak -= 1;
                    if n.at_peak == 0 {
                        self.count = None;
                        continue;
                    }
                }
                if c.close(old, n.peak) {
                    n.near -= 1;
                }
            }
        }
        self.values.push_back(x);
        if let Some(n) = &mut self.count {
            if x > n.peak {
                self.count = None;
            } else {
                n.at_peak += u32::from(x == n.peak);
                n.near += u32::from(c.close(x, n.peak));
            }
        }
    }

    /// Puts the values of `newer` after this window's own (a shift that did not last: the
    /// window from before it comes back, with the reads since).
    pub(crate) fn append(&mut self, newer: Window) {
        self.values.extend(newer.values);
        self.count = None;
    }

    fn counted(&mut self, c: &SamplerConfig) -> PeakCount {
        if let Some(n) = self.count {
            return n;
        }
        let peak = self
            .values
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        let (mut at_peak, mut near) = (0, 0);
        for &v in &self.values {
            at_peak += u32::from(v == peak);
            near += u32::from(c.close(v, peak));
        }
        let n = PeakCount {
            peak,
            at_peak,
            near,
        };
        // An empty window has no peak to keep (`push` needs a real one to compare against).
        if !self.values.is_empty() {
            self.count = Some(n);
        }
        n
    }

    /// The largest value (`-inf` when empty).
    pub(crate) fn peak(&mut self, c: &SamplerConfig) -> f64 {
        self.counted(c).peak
    }

    /// Share of the window close to its peak (0 when empty).
    pub(crate) fn density(&mut self, c: &SamplerConfig) -> f64 {
        if self.is_empty() {
            return 0.0;
        }
        f64::from(self.counted(c).near) / self.values.len() as f64
    }

    /// The low edge of the window's range: its lowest value once the lowest
    /// `TRANSIENT_READS` are left out (at most one in eight), so that a dip that came back (a
    /// data-loader stall) does not hide a drop while it is in the window.
    pub(crate) fn low_edge(&self) -> f64 {
        let skip = (TRANSIENT_READS as usize).min(self.values.len() / 8);
        // The `skip + 1` lowest values, in order; `skip` is small.
        let mut lowest = [f64::INFINITY; TRANSIENT_READS as usize + 1];
        for &v in &self.values {
            if v < lowest[skip] {
                let mut i = skip;
                while i > 0 && lowest[i - 1] > v {
                    lowest[i] = lowest[i - 1];
                    i -= 1;
                }
                lowest[i] = v;
            }
        }
        lowest[skip]
    }

    /// Whether `x` is outside the window's range by more than the tolerance.
    pub(crate) fn shifted(&mut self, c: &SamplerConfig, x: f64) -> bool {
        if self.is_empty() {
            return false;
        }
        let hi = self.peak(c);
        if x > hi {
            return !c.close(x, hi);
        }
        // Most reads of a stable series are close to its peak. Such a value, if not negative,
        // is close to anything between it and the peak, the low edge included: no pass needed.
        if x >= 0.0 && c.close(x, hi) {
            return false;
        }
        let lo = self.low_edge();
        x < lo && !c.close(x, lo)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The window's answers computed from scratch, as the sampler did before it kept counts.
    fn from_scratch(c: &SamplerConfig, w: &Window, x: f64) -> (f64, f64, bool) {
        let values = &w.values;
        let peak = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let near = values.iter().filter(|&&v| c.close(v, peak)).count();
        let density = if values.is_empty() {
            0.0
        } else {
            near as f64 / values.len() as f64
        };
        let lo = w.low_edge();
        let shifted =
            !values.is_empty() && ((x > peak && !c.close(x, peak)) || (x < lo && !c.close(x, lo)));
        (peak, density, shifted)
    }

    #[test]
    fn kept_counts_equal_counting_from_scratch() {
        let c = SamplerConfig::default();
        let mut rng = crate::SplitMix64::new(7);
        let mut w = Window::default();
        for step in 0..20_000 {
            // Values from a few levels with repeats (so equal peaks leave and come), steps
            // up and down, negative ones, and noise within and beyond the tolerance.
            let level = [100.0, 100.0, 95.0, 50.0, 120.0, -30.0, 0.5][(step / 500) % 7];
            let r = rng.next_f64();
            let x = if r < 0.3 {
                level
            } else if r < 0.9 {
                level * (1.0 + (rng.next_f64() - 0.5) * 0.3)
            } else {
                level * 2.0 * rng.next_f64()
            };
            if step % 3 == 0 {
                let _ = w.density(&c); // counts kept between pushes as the sampler uses them
            }
            let (_, _, shifted) = from_scratch(&c, &w, x);
            assert_eq!(w.shifted(&c, x), shifted, "step {step}");
            w.push(&c, x, c.window());
            let (peak, density, _) = from_scratch(&c, &w, x);
            assert_eq!(w.peak(&c), peak, "step {step}");
            assert_eq!(w.density(&c), density, "step {step}");
        }
        w.clear();
        assert_eq!((w.peak(&c), w.density(&c)), (f64::NEG_INFINITY, 0.0));
    }
}
