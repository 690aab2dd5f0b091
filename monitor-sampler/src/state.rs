//! The state machine of one series: its window, whether it is stable, when it is next read
//! and collected, and what it has read but not yet sent (see [the crate's
//! documentation](crate)).

use crate::{
    Emit, Emitted, Envelope, SamplerConfig, SplitMix64,
    window::{TRANSIENT_READS, Window},
};
use monitor_wire::{Kind, Value};

/// Whether a series is being read and sent at the minimum interval (`Fast`: unstable, new, or
/// sampling disabled) or backing off (`Stable`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Fast,
    Stable,
}

/// Running min/max/sum of what was observed since the last emission.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Acc {
    pub(crate) start_ns: u64,
    pub(crate) end_ns: u64,
    pub(crate) min: f64,
    pub(crate) max: f64,
    pub(crate) sum: f64,
    pub(crate) count: u32,
}

impl Acc {
    pub(crate) fn new(ns: u64, v: f64) -> Self {
        Self {
            start_ns: ns,
            end_ns: ns,
            min: v,
            max: v,
            sum: v,
            count: 1,
        }
    }

    pub(crate) fn add(&mut self, ns: u64, v: f64) {
        self.end_ns = ns;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        self.sum += v;
        self.count += 1;
    }

    pub(crate) fn envelope(&self) -> Envelope {
        Envelope {
            start_ns: self.start_ns,
            end_ns: self.end_ns,
            min: self.min,
            max: self.max,
            mean: self.sum / f64::from(self.count),
            count: self.count,
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct State {
    pub(crate) group: usize,
    pub(crate) mode: Mode,
    /// What is judged (gauge values, counter rates), the last `window` of them.
    pub(crate) window: Window,
    /// After a shift, the window before it and how many reads may still bring it back.
    pub(crate) before_shift: Option<(Window, u32)>,
    /// The window's peak when the series last became stable.
    pub(crate) hist_peak: f64,
    /// Current collection interval, before jitter.
    pub(crate) interval_ns: u64,
    pub(crate) last_collect_ns: u64,
    pub(crate) next_collect_ns: u64,
    pub(crate) next_read_ns: u64,
    pub(crate) last_read_ns: Option<u64>,
    /// Gauges: the values read since the last emission.
    pub(crate) pending: Option<Acc>,
    /// Counters: the last value read, and whether it was sent.
    pub(crate) last_counter: Option<(Value, bool)>,
    pub(crate) rng: SplitMix64,
}

impl State {
    pub(crate) fn new(group: usize, seed: u64, now_ns: u64) -> Self {
        Self {
            group,
            mode: Mode::Fast,
            window: Window::default(),
            before_shift: None,
            hist_peak: 0.0,
            interval_ns: 0,
            last_collect_ns: now_ns,
            next_collect_ns: now_ns,
            next_read_ns: now_ns,
            last_read_ns: None,
            pending: None,
            last_counter: None,
            rng: SplitMix64::new(seed),
        }
    }

    pub(crate) fn observe(
        &mut self,
        c: &SamplerConfig,
        kind: Kind,
        value: Value,
        now: u64,
    ) -> Emitted {
        let mut out = Emitted::default();
        if self.last_read_ns.is_some_and(|t| now <= t) {
            return out;
        }
        // What stability is judged on: a gauge's value, a counter's rate since the last read.
        let mut reset = false;
        let x = match kind {
            Kind::Gauge => {
                let v = value.as_f64();
                if !v.is_finite() {
                    return out;
                }
                Some(v)
            }
            Kind::Counter => match (self.last_counter, self.last_read_ns) {
                (Some((prev, _)), Some(t0)) => match increase(prev, value) {
                    Some(d) => Some(d / ((now - t0) as f64 / 1e9)),
                    None => {
                        reset = true;
                        None
                    }
                },
                _ => None,
            },
        };
        let prev_read = self.last_read_ns.replace(now);
        let min = c.min_ns();
        let on_time = now.saturating_add(min / 16) >= self.next_collect_ns;

        if !c.enabled {
            self.mode = Mode::Fast;
            self.fold(kind, value, x, now);
            if on_time {
                out.push(self.take_pending(kind).expect("a value was just folded in"));
                self.collected(now, min);
            }
            self.next_read_ns = self.next_collect_ns;
            return out;
        }

        if reset {
            // A counter that went backwards (driver reload): what came before says nothing.
            self.window.clear();
            self.before_shift = None;
        }
        let changed = match x {
            Some(x) => self.judge(c, x),
            None => reset,
        };

        if changed {
            // Send what came before the change, then the value that showed it, alone.
            if let Some(before) = self.take_pending_before(kind, prev_read) {
                out.push(before);
            }
            self.mode = Mode::Fast;
            self.interval_ns = min;
            self.fold(kind, value, x, now);
            out.push(self.take_pending(kind).expect("a value was just folded in"));
            self.collected(now, min);
        } else {
            self.fold(kind, value, x, now);
            if self.mode == Mode::Fast
                && self.window.len() >= c.window()
                && self.window.density(c) >= c.density_threshold
            {
                self.mode = Mode::Stable;
                self.hist_peak = self.window.peak(c);
                self.interval_ns = min;
            }
            if on_time {
                out.push(self.take_pending(kind).expect("a value was just folded in"));
                let next = match self.mode {
                    Mode::Fast => min,
                    Mode::Stable => {
                        self.interval_ns = self.interval_ns.saturating_mul(2).min(c.max_ns());
                        self.jittered(c, self.interval_ns)
                    }
                };
                self.collected(now, next);
            }
        }

        // An unstable series is read every minimum interval; a stable one at its collections
        // and, between them, every `ground_truth_every` minimum intervals.
        let read_every = match self.mode {
            Mode::Fast => min,
            Mode::Stable => c.ground_truth_ns(),
        };
        self.next_read_ns = self.next_collect_ns.min(now.saturating_add(read_every));
        out
    }

    /// Adds `x` (a gauge's value, a counter's rate) to the window and says whether it shows a
    /// change. See the module documentation.
    pub(crate) fn judge(&mut self, c: &SamplerConfig, x: f64) -> bool {
        if let Some((mut before, left)) = self.before_shift.take() {
            if !before.shifted(c, x) {
                // What looked like a shift did not last: the series is back where it was.
                before.append(std::mem::take(&mut self.window));
                self.window = before;
            } else if left > 1 {
                self.before_shift = Some((before, left - 1));
            }
        }
        if self.mode == Mode::Stable && self.window.shifted(c, x) {
            self.before_shift = Some((std::mem::take(&mut self.window), TRANSIENT_READS));
            self.window.push(c, x, c.window());
            return true;
        }
        self.window.push(c, x, c.window());
        if self.mode != Mode::Stable {
            return false;
        }
        let p = self.window.peak(c);
        !c.close(p, self.hist_peak) || self.window.density(c) < c.density_threshold
    }

    pub(crate) fn collected(&mut self, now: u64, next_in: u64) {
        self.last_collect_ns = now;
        self.next_collect_ns = now.saturating_add(next_in);
    }

    pub(crate) fn jittered(&mut self, c: &SamplerConfig, interval: u64) -> u64 {
        let u = self.rng.next_f64() * 2.0 - 1.0;
        let j = interval as f64 * (1.0 + c.jitter.clamp(0.0, 1.0) * u);
        (j as u64).clamp(c.min_ns(), c.max_ns())
    }

    /// Adds one read to what the next emission covers.
    pub(crate) fn fold(&mut self, kind: Kind, value: Value, x: Option<f64>, now: u64) {
        match (kind, x) {
            (Kind::Counter, _) => self.last_counter = Some((value, false)),
            (Kind::Gauge, Some(x)) => match &mut self.pending {
                Some(acc) => acc.add(now, x),
                None => self.pending = Some(Acc::new(now, x)),
            },
            (Kind::Gauge, None) => {}
        }
    }

    /// What the next emission would send now, marking it sent.
    pub(crate) fn take_pending(&mut self, kind: Kind) -> Option<Emit> {
        let acc = self.pending.take();
        match kind {
            Kind::Gauge => acc.map(|a| Emit::Gauge(a.envelope())),
            Kind::Counter => {
                let (value, sent) = self.last_counter.as_mut()?;
                if *sent {
                    return None;
                }
                *sent = true;
                Some(Emit::Counter {
                    unix_ns: self.last_read_ns?,
                    value: *value,
                })
            }
        }
    }

    /// Like `take_pending`, for the reads before the current one (read at `prev_read`).
    pub(crate) fn take_pending_before(
        &mut self,
        kind: Kind,
        prev_read: Option<u64>,
    ) -> Option<Emit> {
        match kind {
            Kind::Gauge => self.pending.take().map(|a| Emit::Gauge(a.envelope())),
            Kind::Counter => {
                let (value, sent) = self.last_counter.as_mut()?;
                if *sent {
                    return None;
                }
                *sent = true;
                Some(Emit::Counter {
                    unix_ns: prev_read?,
                    value: *value,
                })
            }
        }
    }
}

/// How much a counter grew, as f64; `None` when it went backwards (reset).
pub(crate) fn increase(prev: Value, now: Value) -> Option<f64> {
    match (prev, now) {
        (Value::U64(a), Value::U64(b)) => b.checked_sub(a).map(|d| d as f64),
        (a, b) => {
            let d = b.as_f64() - a.as_f64();
            (d >= 0.0).then_some(d)
        }
    }
}
