//! Adaptive sampling, per series, after Moneo: while the peak of the recent values is stable
//! the collection interval doubles (plus a little jitter) up to a cap; as soon as it is not,
//! the series goes back to the minimum interval.
//!
//! # Reads, collections and what is sent
//!
//! The agent asks [`AdaptiveSampler::due`] before reading a series and hands every value it
//! read to [`AdaptiveSampler::observe`], which says what to send ([`Emit`]). A record is sent
//! at each *collection*, at the series' collection interval (`min_interval` while unstable,
//! doubling up to `max_interval` while stable), and at once when a read shows a change:
//!
//! - a counter sends its cumulative value as read. Rates are derived at the receiver: the
//!   rate between any two values sent is the exact mean rate between them, so nothing is
//!   lost but the detail inside an interval;
//! - a gauge sends an [`Envelope`] (max, min, mean, count) of every value read since its
//!   previous record, so a peak read between two collections is never lost.
//!
//! *Reads* are what `ground_truth_every` decides. An unstable series is read every
//! `min_interval`; a stable one at its collections and, between them, by *ground-truth reads*
//! every `ground_truth_every` minimum intervals, each folded into the envelope and judged
//! like any read (one that shows a change is sent at once). With the default of 1 every
//! minimum interval is read: each envelope's max is then the true max of the signal over the
//! time since the previous record, and a change is sent at the first read after it. A larger value reads less (for sources where a read is costly,
//! as mlx5 `hw_counters`, whose uncached reads are firmware commands) and pays for it: a
//! change is seen up to `ground_truth_every` minimum intervals late, and a gauge's envelope
//! misses peaks that fall between reads (counters lose nothing). See [`traces`] for both,
//! measured.
//!
//! Values read when the series was not due (a source that reads all its files at once) are
//! observed too: they are judged and go into the envelope.
//!
//! # Stability
//!
//! What is judged is, per read, a gauge's value or a counter's rate since its previous read;
//! each series keeps its last `window` of them. Two values are *close* when they differ by at
//! most `peak_tolerance` of the smaller one, or by at most `abs_floor` (so an idle series
//! with a little background noise counts as stable). The *density* of the window is the share
//! of it close to its peak (max).
//!
//! A series becomes stable once its window is full and its density is at least
//! `density_threshold`; the window's peak becomes the *historical peak*. A stable series turns
//! unstable when a read shows
//!
//! - a **shift**: the value is outside the window's range, above its peak or below its low
//!   edge, and close to neither. The low edge is the lowest value once the lowest
//!   `TRANSIENT_READS` (2) are left out (at most one in eight of the window), so that a recent
//!   short dip does not hide a drop. This catches a sustained step, up or down, at the first
//!   read after it, where the peak of a window would take a whole window to move down;
//! - a **peak change** (Moneo): the window's peak is no longer close to the historical peak,
//!   a level that drifted up or down;
//! - a **spread** (Moneo): the density falls under the threshold.
//!
//! Then what was pending is sent first, then the read that showed the change on its own, so
//! the receiver sees exactly when it was seen, and the series is read and sent every minimum
//! interval. After a shift the window restarts from the new value, unless one of the next
//! `TRANSIENT_READS` reads is back within the previous range: the shift was then a
//! transient (a data-loader stall) and the previous window comes back, the transient values
//! in it. After anything else the window is kept. Either way the series is stable again at
//! the first read where its window is full and dense, and backs off from the minimum interval
//! anew.
//!
//! A periodic signal whose period fits in the window (compute and communication phases,
//! pipeline bubbles) is stable when it is dense enough: its envelopes carry the peak of the
//! busy phases, their min and mean the rest.
//!
//! `enabled: false` gives the fixed-interval behaviour to compare with: read and sent every
//! `min_interval`.

pub mod traces;

use std::{
    collections::{HashMap, VecDeque},
    time::Duration,
};

use railscope_wire::{Kind, Series, Value};

/// Reads after a shift that decide whether it lasts: when one of them is back within the range
/// the series had before, the shift was a transient (a stall of a training step or two) and
/// the series resumes from its previous window. Also the number of lowest values the low edge
/// of a window leaves out.
const TRANSIENT_READS: u32 = 2;

/// How one group of series is sampled. The defaults (a window of 24 reads, half of it close
/// to the peak, a cap of 32 minimum intervals, every minimum interval read) are tuned on the
/// workload traces of [`traces`].
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// Shortest interval: the fixed interval when disabled, the interval of an unstable series.
    pub min_interval: Duration,
    /// Longest collection interval of a stable series (before jitter is taken off).
    pub max_interval: Duration,
    /// Observations kept per series to judge stability. A periodic workload is stable only if
    /// a few of its periods fit (pipeline steps of 8 s: 24 at one read a second).
    pub window: usize,
    /// Relative difference (of the smaller value) below which two values count as the same.
    pub peak_tolerance: f64,
    /// Minimum share of the window close to its peak for the series to be stable.
    pub density_threshold: f64,
    /// Absolute difference below which two values count as the same, in the series' unit
    /// (its rate per second for counters). 0 compares relatively only.
    pub abs_floor: f64,
    /// Each backed-off interval is changed by a random fraction in `[-jitter, +jitter]` of
    /// itself, so series do not stay in step with each other or with a periodic workload.
    pub jitter: f64,
    /// A stable series is read at least every this many minimum intervals (>= 1); 1 reads
    /// every minimum interval.
    pub ground_truth_every: u32,
    /// `false`: fixed interval, read and sent every `min_interval`.
    pub enabled: bool,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self {
            min_interval: Duration::from_secs(1),
            max_interval: Duration::from_secs(32),
            window: 24,
            peak_tolerance: 0.10,
            density_threshold: 0.5,
            abs_floor: 0.0,
            jitter: 0.1,
            ground_truth_every: 1,
            enabled: true,
        }
    }
}

impl SamplerConfig {
    /// The same group, sampled at a fixed `min_interval`.
    pub fn fixed(&self) -> Self {
        Self {
            enabled: false,
            ..self.clone()
        }
    }

    fn min_ns(&self) -> u64 {
        (self.min_interval.as_nanos() as u64).max(1)
    }

    fn max_ns(&self) -> u64 {
        (self.max_interval.as_nanos() as u64).max(self.min_ns())
    }

    fn window(&self) -> usize {
        self.window.max(1)
    }

    fn ground_truth_ns(&self) -> u64 {
        self.min_ns()
            .saturating_mul(u64::from(self.ground_truth_every.max(1)))
    }

    /// Whether `a` and `b` count as the same value.
    fn close(&self, a: f64, b: f64) -> bool {
        let smaller = a.abs().min(b.abs());
        (a - b).abs() <= (self.peak_tolerance * smaller).max(self.abs_floor)
    }
}

/// What to send for a gauge: every value read over `[start_ns, end_ns]` (the times of the
/// first and the last read it covers).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Envelope {
    pub start_ns: u64,
    pub end_ns: u64,
    pub min: f64,
    pub max: f64,
    pub mean: f64,
    pub count: u32,
}

/// One thing to send for a series.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Emit {
    /// A counter's cumulative value as read at `unix_ns`.
    Counter {
        unix_ns: u64,
        value: Value,
    },
    Gauge(Envelope),
}

impl Emit {
    /// Time of the last read this covers.
    pub fn end_ns(&self) -> u64 {
        match self {
            Emit::Counter { unix_ns, .. } => *unix_ns,
            Emit::Gauge(e) => e.end_ns,
        }
    }
}

/// What one observation gives to send: nothing, one emit, or two when a change flushes what
/// was pending before the value that changed. Iterate it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Emitted([Option<Emit>; 2]);

impl Emitted {
    fn push(&mut self, e: Emit) {
        let slot = if self.0[0].is_none() { 0 } else { 1 };
        self.0[slot] = Some(e);
    }

    pub fn is_empty(&self) -> bool {
        self.0[0].is_none()
    }

    pub fn len(&self) -> usize {
        self.0.iter().flatten().count()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Emit> {
        self.0.iter().flatten()
    }
}

impl IntoIterator for Emitted {
    type Item = Emit;
    type IntoIter = std::iter::Flatten<std::array::IntoIter<Option<Emit>, 2>>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter().flatten()
    }
}

/// Whether a series is being read and sent at the minimum interval (`Fast`: unstable, new, or
/// sampling disabled) or backing off (`Stable`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Fast,
    Stable,
}

/// Running min/max/sum of what was observed since the last emission.
#[derive(Clone, Copy, Debug)]
struct Acc {
    start_ns: u64,
    end_ns: u64,
    min: f64,
    max: f64,
    sum: f64,
    count: u32,
}

impl Acc {
    fn new(ns: u64, v: f64) -> Self {
        Self {
            start_ns: ns,
            end_ns: ns,
            min: v,
            max: v,
            sum: v,
            count: 1,
        }
    }

    fn add(&mut self, ns: u64, v: f64) {
        self.end_ns = ns;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        self.sum += v;
        self.count += 1;
    }

    fn envelope(&self) -> Envelope {
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
struct State {
    group: usize,
    mode: Mode,
    /// What is judged (gauge values, counter rates), the last `window` of them.
    window: VecDeque<f64>,
    /// After a shift, the window before it and how many reads may still bring it back.
    before_shift: Option<(VecDeque<f64>, u32)>,
    /// The window's peak when the series last became stable.
    hist_peak: f64,
    /// Current collection interval, before jitter.
    interval_ns: u64,
    last_collect_ns: u64,
    next_collect_ns: u64,
    next_read_ns: u64,
    last_read_ns: Option<u64>,
    /// Gauges: the values read since the last emission.
    pending: Option<Acc>,
    /// Counters: the last value read, and whether it was sent.
    last_counter: Option<(Value, bool)>,
    rng: SplitMix64,
}

/// A `--sampling` setting that cannot be used; the message names it and says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--sampling {spec:?}: {why}")]
pub struct SamplingSpecError {
    pub spec: String,
    pub why: String,
}

/// The sampler of every series the agent reads. Cheap per call: one hash lookup (none with a
/// [`Slot`]) and a few passes over the series' window.
#[derive(Debug)]
pub struct AdaptiveSampler {
    /// `(group name, metric name prefix, config)`; index 0 is the default, prefix "".
    groups: Vec<(String, String, SamplerConfig)>,
    /// Where each series' state is in `states`.
    index: HashMap<Series, u32, foldhash::fast::RandomState>,
    states: Vec<(Series, State)>,
    /// Changes whenever `states` is reordered, so slots handed out before are not trusted.
    generation: u32,
    seed: u64,
}

/// Where a series' state is kept in one [`AdaptiveSampler`], remembered by the caller next to
/// the series (a source keeps one per file it reads), so the sampler finds it again without
/// hashing the series' name and labels: with hundreds of reads a second, hashing and
/// comparing strings was the agent's largest cost after the reads themselves. A slot given to
/// another sampler, or from before [`AdaptiveSampler::remove_stale`], is not used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slot(Option<(u32, u32)>);

/// Generations are unique across samplers, so a slot of one sampler is never valid in another.
static NEXT_GENERATION: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

fn next_generation() -> u32 {
    NEXT_GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl AdaptiveSampler {
    /// A sampler where every series uses `default` until groups are added.
    pub fn new(default: SamplerConfig) -> Self {
        Self {
            groups: vec![("default".into(), String::new(), default)],
            index: HashMap::default(),
            states: Vec::new(),
            generation: next_generation(),
            seed: 0x5eed_0f7a_115c_a1e5,
        }
    }

    /// Series whose name starts with `prefix` (`railscope_ib_`, `railscope_gpu_`, or one
    /// metric's full name) use `config`; the longest matching prefix wins. Add groups before
    /// the first observation: a series keeps the group it was first seen with.
    pub fn with_group(
        mut self,
        name: impl Into<String>,
        prefix: impl Into<String>,
        config: SamplerConfig,
    ) -> Self {
        self.groups.push((name.into(), prefix.into(), config));
        self
    }

    /// Changes the sampling of a metric group as an operator writes it (`railscope agent
    /// --sampling`): `PREFIX:SETTING,SETTING,...`, where the prefix selects series by name as
    /// in [`with_group`](Self::with_group) and each setting is one of
    ///
    /// - `off`: a fixed interval, every reading sent (`on` undoes it);
    /// - `max=SECONDS`: the longest collection interval of a stable series;
    /// - `ground-truth=N`: a stable series is read at least every N minimum intervals;
    /// - `window=N`, `tolerance=FRACTION`, `density=FRACTION`, `jitter=FRACTION`,
    ///   `floor=VALUE`: the stability test (see [`SamplerConfig`]).
    ///
    /// The group starts from the settings its series had so far (the longest prefix that
    /// matched before), so `railscope_ib_symbol_error_total:max=300` changes one metric and
    /// keeps the rest of the IB group's settings. A prefix given twice: the later wins.
    pub fn configure(&mut self, spec: &str) -> Result<(), SamplingSpecError> {
        let bad = |why: String| SamplingSpecError {
            spec: spec.to_string(),
            why,
        };
        let (prefix, settings) = spec
            .split_once(':')
            .ok_or_else(|| bad("expected PREFIX:SETTING,...".into()))?;
        let prefix = prefix.trim();
        let mut config = self.groups[group_index(&self.groups, prefix)].2.clone();
        for setting in settings.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (name, value) = match setting.split_once('=') {
                Some((n, v)) => (n.trim(), Some(v.trim())),
                None => (setting, None),
            };
            let number = || -> Result<f64, SamplingSpecError> {
                let v = value.ok_or_else(|| bad(format!("{name} needs a value ({name}=...)")))?;
                v.parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && *x >= 0.0)
                    .ok_or_else(|| bad(format!("{name}={v}: not a non-negative number")))
            };
            let whole = |x: f64| -> Result<u32, SamplingSpecError> {
                if x >= 1.0 && x.fract() == 0.0 && x <= f64::from(u32::MAX) {
                    Ok(x as u32)
                } else {
                    Err(bad(format!("{name}={x}: not a whole number >= 1")))
                }
            };
            match name {
                "off" if value.is_none() => config.enabled = false,
                "on" if value.is_none() => config.enabled = true,
                "max" => config.max_interval = Duration::from_secs_f64(number()?),
                "ground-truth" => config.ground_truth_every = whole(number()?)?,
                "window" => config.window = whole(number()?)? as usize,
                "tolerance" => config.peak_tolerance = number()?,
                "density" => config.density_threshold = number()?.min(1.0),
                "jitter" => config.jitter = number()?.min(0.5),
                "floor" => config.abs_floor = number()?,
                _ => {
                    return Err(bad(format!(
                        "unknown setting {setting:?} (off, on, max, ground-truth, window, \
                         tolerance, density, jitter, floor)"
                    )));
                }
            }
        }
        if config.max_interval < config.min_interval {
            return Err(bad(format!(
                "max={:?} is below the minimum interval {:?}",
                config.max_interval, config.min_interval
            )));
        }
        self.groups
            .retain(|(_, p, _)| p != prefix || prefix.is_empty());
        if prefix.is_empty() {
            self.groups[0].2 = config;
        } else {
            self.groups
                .push((prefix.to_string(), prefix.to_string(), config));
        }
        Ok(())
    }

    /// Seed of the jitter (each series mixes in a hash of itself), for reproducible runs.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Name and config of the group a series belongs to.
    pub fn group_of(&self, series: &Series) -> (&str, &SamplerConfig) {
        let (name, _, config) = &self.groups[group_index(&self.groups, &series.name)];
        (name, config)
    }

    /// Whether `series` should be read at `now_ns`. A series never observed is always due.
    ///
    /// A read up to a sixteenth of the minimum interval early counts as on time, so a timer
    /// that fires at exact multiples of the interval never skips a turn because the previous
    /// read was stamped a little late.
    pub fn due(&self, series: &Series, now_ns: u64) -> bool {
        self.due_at(series, &mut Slot::default(), now_ns)
    }

    /// [`due`](Self::due), finding the series through `slot` (and remembering it there).
    pub fn due_at(&self, series: &Series, slot: &mut Slot, now_ns: u64) -> bool {
        self.find(series, slot).is_none_or(|i| {
            let s = &self.states[i].1;
            let slack = self.groups[s.group].2.min_ns() / 16;
            now_ns.saturating_add(slack) >= s.next_read_ns
        })
    }

    /// The state of `series`: through a valid slot, else by hashing (and the slot is set).
    fn find(&self, series: &Series, slot: &mut Slot) -> Option<usize> {
        if let Slot(Some((generation, i))) = *slot
            && generation == self.generation
            && (i as usize) < self.states.len()
        {
            return Some(i as usize);
        }
        let i = *self.index.get(series)?;
        *slot = Slot(Some((self.generation, i)));
        Some(i as usize)
    }

    fn state(&self, series: &Series) -> Option<&State> {
        let i = self.find(series, &mut Slot::default())?;
        Some(&self.states[i].1)
    }

    /// When the series is next due, if it has been observed.
    pub fn next_due_ns(&self, series: &Series) -> Option<u64> {
        self.state(series).map(|s| s.next_read_ns)
    }

    /// The earliest time any series is due: what to sleep until.
    pub fn earliest_due_ns(&self) -> Option<u64> {
        self.states.iter().map(|(_, s)| s.next_read_ns).min()
    }

    /// Whether the series is backing off or at the minimum interval.
    pub fn mode(&self, series: &Series) -> Option<Mode> {
        self.state(series).map(|s| s.mode)
    }

    /// Time from the series' last collection to its next one, jitter included.
    pub fn collection_interval(&self, series: &Series) -> Option<Duration> {
        self.state(series)
            .map(|s| Duration::from_nanos(s.next_collect_ns - s.last_collect_ns))
    }

    /// Records a value read at `now_ns` and says what to send now. A value read no later than
    /// the series' previous one is ignored, and so is a gauge value that is not finite.
    pub fn observe(&mut self, series: &Series, value: Value, now_ns: u64) -> Emitted {
        self.observe_at(series, &mut Slot::default(), value, now_ns)
    }

    /// [`observe`](Self::observe), finding the series through `slot` (and remembering it
    /// there).
    pub fn observe_at(
        &mut self,
        series: &Series,
        slot: &mut Slot,
        value: Value,
        now_ns: u64,
    ) -> Emitted {
        let i = match self.find(series, slot) {
            Some(i) => i,
            None => {
                let group = group_index(&self.groups, &series.name);
                let seed = self.seed ^ series_hash(series);
                let i = self.states.len();
                self.states
                    .push((series.clone(), State::new(group, seed, now_ns)));
                self.index.insert(series.clone(), i as u32);
                *slot = Slot(Some((self.generation, i as u32)));
                i
            }
        };
        let state = &mut self.states[i].1;
        let config = &self.groups[state.group].2;
        state.observe(config, series.kind, value, now_ns)
    }

    /// Sends what was read but not yet sent, for every series (at shutdown, or to end a
    /// comparison run). Sorted by series.
    pub fn flush(&mut self) -> Vec<(Series, Emit)> {
        let mut out = Vec::new();
        for (series, state) in &mut self.states {
            if let Some(e) = state.take_pending(series.kind) {
                out.push((series.clone(), e));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Forgets the series not read for longer than `max_age` (a device removed, a process
    /// gone) and returns what they still had to send. Slots handed out before are no longer
    /// used.
    pub fn remove_stale(&mut self, now_ns: u64, max_age: Duration) -> Vec<(Series, Emit)> {
        let max_age = max_age.as_nanos() as u64;
        let mut out = Vec::new();
        self.states.retain_mut(|(series, state)| {
            let last = state.last_read_ns.unwrap_or(0);
            if now_ns.saturating_sub(last) <= max_age {
                return true;
            }
            if let Some(e) = state.take_pending(series.kind) {
                out.push((series.clone(), e));
            }
            false
        });
        self.index = self
            .states
            .iter()
            .enumerate()
            .map(|(i, (series, _))| (series.clone(), i as u32))
            .collect();
        self.generation = next_generation();
        out
    }

    /// Number of series tracked.
    pub fn len(&self) -> usize {
        self.states.len()
    }

    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }
}

impl State {
    fn new(group: usize, seed: u64, now_ns: u64) -> Self {
        Self {
            group,
            mode: Mode::Fast,
            window: VecDeque::new(),
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

    fn observe(&mut self, c: &SamplerConfig, kind: Kind, value: Value, now: u64) -> Emitted {
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
                && density(c, &self.window, peak(&self.window)) >= c.density_threshold
            {
                self.mode = Mode::Stable;
                self.hist_peak = peak(&self.window);
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
    fn judge(&mut self, c: &SamplerConfig, x: f64) -> bool {
        if let Some((mut before, left)) = self.before_shift.take() {
            if !shifted(c, &before, x) {
                // What looked like a shift did not last: the series is back where it was.
                before.extend(self.window.drain(..));
                self.window = before;
            } else if left > 1 {
                self.before_shift = Some((before, left - 1));
            }
        }
        if self.mode == Mode::Stable && shifted(c, &self.window, x) {
            self.before_shift = Some((std::mem::take(&mut self.window), TRANSIENT_READS));
            self.window.push_back(x);
            return true;
        }
        while self.window.len() >= c.window() {
            self.window.pop_front();
        }
        self.window.push_back(x);
        if self.mode != Mode::Stable {
            return false;
        }
        let p = peak(&self.window);
        !c.close(p, self.hist_peak) || density(c, &self.window, p) < c.density_threshold
    }

    fn collected(&mut self, now: u64, next_in: u64) {
        self.last_collect_ns = now;
        self.next_collect_ns = now.saturating_add(next_in);
    }

    fn jittered(&mut self, c: &SamplerConfig, interval: u64) -> u64 {
        let u = self.rng.next_f64() * 2.0 - 1.0;
        let j = interval as f64 * (1.0 + c.jitter.clamp(0.0, 1.0) * u);
        (j as u64).clamp(c.min_ns(), c.max_ns())
    }

    /// Adds one read to what the next emission covers.
    fn fold(&mut self, kind: Kind, value: Value, x: Option<f64>, now: u64) {
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
    fn take_pending(&mut self, kind: Kind) -> Option<Emit> {
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
    fn take_pending_before(&mut self, kind: Kind, prev_read: Option<u64>) -> Option<Emit> {
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

/// The group whose prefix is the longest that `name` starts with; the last added on a tie.
fn group_index(groups: &[(String, String, SamplerConfig)], name: &str) -> usize {
    let mut best = 0;
    for (i, (_, prefix, _)) in groups.iter().enumerate() {
        if name.starts_with(prefix.as_str()) && prefix.len() >= groups[best].1.len() {
            best = i;
        }
    }
    best
}

/// How much a counter grew, as f64; `None` when it went backwards (reset).
fn increase(prev: Value, now: Value) -> Option<f64> {
    match (prev, now) {
        (Value::U64(a), Value::U64(b)) => b.checked_sub(a).map(|d| d as f64),
        (a, b) => {
            let d = b.as_f64() - a.as_f64();
            (d >= 0.0).then_some(d)
        }
    }
}

fn peak(window: &VecDeque<f64>) -> f64 {
    window.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

/// Whether `x` is outside the range of `window` by more than the tolerance.
fn shifted(c: &SamplerConfig, window: &VecDeque<f64>, x: f64) -> bool {
    if window.is_empty() {
        return false;
    }
    let (hi, lo) = (peak(window), low_edge(window));
    (x > hi && !c.close(x, hi)) || (x < lo && !c.close(x, lo))
}

/// The low edge of the window's range: its lowest value once the lowest
/// `TRANSIENT_READS` are left out (at most one in eight), so that a dip that came back (a
/// data-loader stall) does not hide a drop while it is in the window.
fn low_edge(window: &VecDeque<f64>) -> f64 {
    let skip = (TRANSIENT_READS as usize).min(window.len() / 8);
    // The `skip + 1` lowest values, in order; `skip` is small.
    let mut lowest = [f64::INFINITY; TRANSIENT_READS as usize + 1];
    for &v in window {
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

/// Share of the window close to `peak`.
fn density(c: &SamplerConfig, window: &VecDeque<f64>, peak: f64) -> f64 {
    if window.is_empty() {
        return 0.0;
    }
    let near = window.iter().filter(|&&v| c.close(v, peak)).count();
    near as f64 / window.len() as f64
}

/// FNV-1a over the series' identity, to give each series its own jitter.
fn series_hash(series: &Series) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    };
    eat(series.name.as_bytes());
    for (k, v) in series.labels.iter() {
        eat(k.as_bytes());
        eat(v.as_bytes());
    }
    h
}

/// SplitMix64: a small, fast, seeded generator; plenty for jitter and synthetic traces.
#[derive(Clone, Debug)]
pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub(crate) fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    pub(crate) fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64();
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use railscope_wire::Labels;

    const S: u64 = 1_000_000_000;

    fn series(name: &str, kind: Kind) -> Series {
        Series {
            name: name.into(),
            labels: Labels::new([("gpu", "0")]),
            kind,
        }
    }

    fn config() -> SamplerConfig {
        SamplerConfig::default()
    }

    /// Reads `f(second)` once a second for `secs` seconds whenever the series is due, as an
    /// agent ticking at the minimum interval does. Returns (reads, emits with their second).
    fn drive(
        sampler: &mut AdaptiveSampler,
        s: &Series,
        secs: u64,
        f: impl Fn(u64) -> Value,
    ) -> (Vec<u64>, Vec<(u64, Emit)>) {
        drive_range(sampler, s, 1..=secs, f)
    }

    /// Like `drive`, over the seconds of `range`.
    fn drive_range(
        sampler: &mut AdaptiveSampler,
        s: &Series,
        range: std::ops::RangeInclusive<u64>,
        f: impl Fn(u64) -> Value,
    ) -> (Vec<u64>, Vec<(u64, Emit)>) {
        let mut reads = Vec::new();
        let mut emits = Vec::new();
        for sec in range {
            let now = sec * S;
            if sampler.due(s, now) {
                reads.push(sec);
                for e in sampler.observe(s, f(sec), now) {
                    emits.push((sec, e));
                }
            }
        }
        (reads, emits)
    }

    #[test]
    fn operators_configure_groups_by_prefix() {
        let ib = SamplerConfig {
            ground_truth_every: 2,
            ..config()
        };
        let mut sampler =
            AdaptiveSampler::new(config()).with_group("railscope_ib_", "railscope_ib_", ib);
        sampler
            .configure("railscope_ib_symbol_error_total:max=300")
            .unwrap();
        sampler
            .configure("railscope_gpu_:off, window=12,tolerance=0.2")
            .unwrap();
        let errors = series("railscope_ib_symbol_error_total", Kind::Counter);
        let (group, c) = sampler.group_of(&errors);
        assert_eq!(group, "railscope_ib_symbol_error_total");
        // The IB group's ground truth is kept; only the cap changed.
        assert_eq!(
            (c.max_interval, c.ground_truth_every),
            (Duration::from_secs(300), 2)
        );
        let (_, c) = sampler.group_of(&series("railscope_gpu_power_watts", Kind::Gauge));
        assert_eq!((c.enabled, c.window, c.peak_tolerance), (false, 12, 0.2));
        let (_, c) = sampler.group_of(&series("railscope_ib_port_state", Kind::Gauge));
        assert_eq!(c.max_interval, Duration::from_secs(32));
        // A fixed-interval group reads and sends every interval.
        let power = series("railscope_gpu_power_watts", Kind::Gauge);
        let (reads, emits) = drive(&mut sampler, &power, 60, |_| Value::F64(300.0));
        assert_eq!((reads.len(), emits.len()), (60, 60));

        for (spec, why) in [
            ("railscope_gpu_", "expected PREFIX:SETTING"),
            ("railscope_gpu_:max", "needs a value"),
            ("railscope_gpu_:max=-1", "not a non-negative number"),
            ("railscope_gpu_:window=0.5", "not a whole number"),
            ("railscope_gpu_:fast", "unknown setting"),
            ("railscope_gpu_:max=0.5", "below the minimum interval"),
        ] {
            let e = sampler.configure(spec).unwrap_err();
            assert!(e.to_string().contains(why), "{spec}: {e}");
            assert!(
                e.to_string().starts_with(&format!("--sampling {spec:?}")),
                "{e}"
            );
        }
    }

    #[test]
    fn slots_find_the_same_state_as_the_series() {
        let (a, b) = (
            series("railscope_a_total", Kind::Counter),
            series("railscope_b_total", Kind::Counter),
        );
        let mut sampler = AdaptiveSampler::new(config());
        let (mut slot_a, mut slot_b) = (Slot::default(), Slot::default());
        for sec in 1..=100 {
            let now = sec * S;
            // `a` through its slot, `b` by name: both must behave like the slot-less sampler.
            if sampler.due_at(&a, &mut slot_a, now) {
                sampler.observe_at(&a, &mut slot_a, Value::U64(sec * 10), now);
            }
            if sampler.due(&b, now) {
                sampler.observe(&b, Value::U64(sec * 10), now);
            }
        }
        assert_ne!(slot_a, Slot::default());
        assert_eq!(sampler.next_due_ns(&a), sampler.next_due_ns(&b));
        assert_eq!(sampler.mode(&a), Some(Mode::Stable));
        // A slot that points at `a` says nothing about `b` in another sampler: it is not used.
        let mut other = AdaptiveSampler::new(config());
        other.observe(&b, Value::U64(1), S);
        other.observe_at(&a, &mut slot_b, Value::U64(1), S);
        assert!(other.due_at(&a, &mut slot_a, 2 * S));
        assert_eq!(other.len(), 2);
        // After series are forgotten, old slots are not trusted either.
        sampler.remove_stale(1000 * S, std::time::Duration::from_secs(1));
        assert!(sampler.is_empty());
        assert!(sampler.due_at(&a, &mut slot_a, 1001 * S));
        sampler.observe_at(&b, &mut slot_a, Value::U64(5), 1001 * S);
        assert_eq!(sampler.len(), 1);
        assert_eq!(sampler.mode(&a), None);
    }

    fn gauge(e: &Emit) -> Envelope {
        match e {
            Emit::Gauge(env) => *env,
            Emit::Counter { .. } => panic!("counter emit for a gauge"),
        }
    }

    /// The peak-envelope promise: envelopes in time order, each one's max the true max of the
    /// signal `f` (every second) over the time since the previous envelope (from its own
    /// first read for the first one).
    fn assert_peak_envelopes(emits: &[(u64, Emit)], f: impl Fn(u64) -> f64) {
        let mut covered_to: Option<u64> = None;
        for (_, e) in emits {
            let env = gauge(e);
            let (start, end) = (env.start_ns / S, env.end_ns / S);
            let from = covered_to.map_or(start, |t| t + 1);
            assert!(
                start >= from && end >= start,
                "{env:?} after {covered_to:?}"
            );
            let truth = (from..=end).map(&f).fold(f64::NEG_INFINITY, f64::max);
            assert_eq!(env.max, truth, "{env:?} covers {from}..={end}");
            covered_to = Some(end);
        }
    }

    /// Busy training as a reader a second sees it: the share of each second spent in the
    /// all-reduce varies, so the values spread over 80-92 % (with the 10 % tolerance, most
    /// are close to the peak, not all).
    fn aliased(sec: u64) -> f64 {
        [
            86.0, 81.0, 91.0, 84.0, 89.0, 82.0, 88.0, 92.0, 85.0, 80.0, 90.0,
        ][(sec % 11) as usize]
    }

    #[test]
    fn stable_signal_backs_off_exponentially_to_the_cap_with_bounded_jitter() {
        let c = config();
        let mut sampler = AdaptiveSampler::new(c.clone()).with_seed(7);
        let s = series("railscope_gpu_power_watts", Kind::Gauge);
        let mut intervals = Vec::new();
        for sec in 1..=600 {
            let now = sec * S;
            if sampler.due(&s, now)
                && !sampler.observe(&s, Value::F64(300.0), now).is_empty()
                && sampler.mode(&s) == Some(Mode::Stable)
            {
                intervals.push(sampler.collection_interval(&s).unwrap().as_secs_f64());
            }
        }
        // 2, 4, 8, 16, then the 32 s cap, each within +-10 % and never above the cap.
        let mut base = 2.0f64;
        for (i, &got) in intervals.iter().enumerate() {
            assert!(
                got >= base * 0.9 - 1e-9 && got <= (base * 1.1).min(32.0) + 1e-9,
                "interval {i}: {got} s for a base of {base} s ({intervals:?})"
            );
            base = (base * 2.0).min(32.0);
        }
        let at_cap = &intervals[4..];
        assert!(at_cap.len() >= 10, "{intervals:?}");
        // Jitter: the intervals at the cap are not all the same.
        assert!(
            at_cap.iter().any(|&v| (v - at_cap[0]).abs() > 0.01),
            "{intervals:?}"
        );
        // Another seed gives other intervals.
        let mut other = AdaptiveSampler::new(c).with_seed(8);
        let mut other_intervals = Vec::new();
        for sec in 1..=600 {
            let now = sec * S;
            if other.due(&s, now)
                && !other.observe(&s, Value::F64(300.0), now).is_empty()
                && other.mode(&s) == Some(Mode::Stable)
            {
                other_intervals.push(other.collection_interval(&s).unwrap().as_secs_f64());
            }
        }
        assert_ne!(intervals, other_intervals);
    }

    #[test]
    fn a_20_percent_jump_drops_to_the_minimum_interval_at_once() {
        let mut sampler = AdaptiveSampler::new(config());
        let s = series("railscope_gpu_sm_util_ratio", Kind::Gauge);
        drive(&mut sampler, &s, 120, |_| Value::F64(0.5));
        assert_eq!(sampler.mode(&s), Some(Mode::Stable));
        assert!(sampler.collection_interval(&s).unwrap() > Duration::from_secs(8));

        let emitted: Vec<Emit> = sampler
            .observe(&s, Value::F64(0.6), 121 * S)
            .into_iter()
            .collect();
        assert_eq!(sampler.mode(&s), Some(Mode::Fast));
        assert_eq!(
            sampler.collection_interval(&s),
            Some(Duration::from_secs(1))
        );
        assert!(sampler.due(&s, 122 * S));
        // What was pending goes first, then the jump on its own.
        assert_eq!(emitted.len(), 2, "{emitted:?}");
        let (before, jump) = (gauge(&emitted[0]), gauge(&emitted[1]));
        assert_eq!((before.max, before.end_ns), (0.5, 120 * S));
        assert_eq!(
            jump,
            Envelope {
                start_ns: 121 * S,
                end_ns: 121 * S,
                min: 0.6,
                max: 0.6,
                mean: 0.6,
                count: 1
            }
        );
        // And the next reads are sent every second.
        let (_, emits) = drive(&mut sampler, &s, 0, |_| Value::F64(0.6));
        assert!(emits.is_empty());
        for sec in 122..=124 {
            assert_eq!(sampler.observe(&s, Value::F64(0.6), sec * S).len(), 1);
        }
    }

    #[test]
    fn a_drop_is_caught_at_the_next_read() {
        let mut sampler = AdaptiveSampler::new(config());
        let s = series("railscope_gpu_sm_util_ratio", Kind::Gauge);
        drive(&mut sampler, &s, 120, |_| Value::F64(0.9));
        assert_eq!(sampler.mode(&s), Some(Mode::Stable));
        let emitted = sampler.observe(&s, Value::F64(0.7), 121 * S);
        assert_eq!(sampler.mode(&s), Some(Mode::Fast));
        assert_eq!(emitted.iter().last().map(|e| gauge(e).max), Some(0.7));
    }

    #[test]
    fn periodic_phases_that_fit_the_window_are_stable_with_their_peak_in_every_envelope() {
        let mut sampler = AdaptiveSampler::new(config());
        let s = series("railscope_gpu_sm_util_ratio", Kind::Gauge);
        // Pipeline steps of 8 s: compute at 0.97, then the bubble.
        let step = |sec: u64| [0.97, 0.97, 0.97, 0.97, 0.97, 0.4, 0.2, 0.7][(sec % 8) as usize];
        let (reads, emits) = drive(&mut sampler, &s, 600, |sec| Value::F64(step(sec)));
        assert_eq!(reads.len(), 600);
        assert_eq!(sampler.mode(&s), Some(Mode::Stable));
        assert!(emits.len() < 60, "{} emits", emits.len());
        assert_peak_envelopes(&emits, step);
        // Once backed off, each envelope spans whole steps: the busy peak and the bubble.
        let last = gauge(&emits.last().unwrap().1);
        assert_eq!((last.max, last.min), (0.97, 0.2));
        // Idle, under the bubbles: sent at the first read, at the minimum interval.
        let emitted: Vec<Emit> = sampler
            .observe(&s, Value::F64(0.0), 601 * S)
            .into_iter()
            .collect();
        assert_eq!(sampler.mode(&s), Some(Mode::Fast));
        assert_eq!(gauge(emitted.last().unwrap()).max, 0.0);
        assert!(sampler.due(&s, 602 * S));
    }

    #[test]
    fn spread_values_are_unstable() {
        // Values spread within a window, few close to the peak: every one read and sent.
        let mut sampler = AdaptiveSampler::new(config());
        let s = series("railscope_gpu_sm_util_ratio", Kind::Gauge);
        let (reads, emits) = drive(&mut sampler, &s, 300, |sec| {
            Value::F64([0.5, 0.6, 0.7, 0.8][(sec % 4) as usize])
        });
        assert_eq!(reads.len(), 300);
        assert_eq!(emits.len(), 300);
        assert_eq!(sampler.mode(&s), Some(Mode::Fast));
        // A stable series whose values start to spread (density under the threshold, though
        // none leaves the range of the window) drops to the minimum interval.
        let mut sampler = AdaptiveSampler::new(config());
        drive(&mut sampler, &s, 100, |_| Value::F64(0.8));
        assert_eq!(sampler.mode(&s), Some(Mode::Stable));
        let spread = |sec: u64| if sec.is_multiple_of(2) { 0.8 } else { 0.6 };
        let mut fast_at = None;
        for sec in 101..=130 {
            sampler.observe(&s, Value::F64(spread(sec)), sec * S);
            if sampler.mode(&s) == Some(Mode::Fast) {
                fast_at = Some(sec);
                break;
            }
        }
        // 0.6 is below the low edge (0.8) at once: a shift.
        assert_eq!(fast_at, Some(101));
        let (_, emits) = drive_range(&mut sampler, &s, 102..=200, |sec| Value::F64(spread(sec)));
        // Half the window at the peak is enough to be stable: alternating 0.8/0.6 is dense.
        assert_eq!(sampler.mode(&s), Some(Mode::Stable));
        assert!(emits.len() < 40, "{} emits", emits.len());

        // Stable with a quarter of the reads low, then three quarters: no read leaves the
        // range of the window and the peak stays, but the density falls under one half.
        let mut sampler = AdaptiveSampler::new(config());
        let mostly_high = |sec: u64| if sec.is_multiple_of(4) { 0.5 } else { 0.8 };
        drive(&mut sampler, &s, 200, |sec| Value::F64(mostly_high(sec)));
        assert_eq!(sampler.mode(&s), Some(Mode::Stable));
        let mostly_low = |sec: u64| if sec.is_multiple_of(4) { 0.8 } else { 0.5 };
        let mut fast_at = None;
        for sec in 201..=260 {
            sampler.observe(&s, Value::F64(mostly_low(sec)), sec * S);
            if fast_at.is_none() && sampler.mode(&s) == Some(Mode::Fast) {
                fast_at = Some(sec);
            }
        }
        let fast_at = fast_at.expect("the spread was not seen");
        assert!((205..=225).contains(&fast_at), "{fast_at}");
        // Not dense: read and sent every second from then on.
        let (reads, emits) = drive_range(&mut sampler, &s, 261..=300, |sec| {
            Value::F64(mostly_low(sec))
        });
        assert_eq!((reads.len(), emits.len()), (40, 40));
    }

    #[test]
    fn aliased_training_is_stable_and_a_throttle_is_caught_at_the_first_read() {
        let mut sampler = AdaptiveSampler::new(config());
        let s = series("railscope_gpu_sm_util_ratio", Kind::Gauge);
        let (_, emits) = drive(&mut sampler, &s, 1200, |sec| Value::F64(aliased(sec)));
        assert_eq!(sampler.mode(&s), Some(Mode::Stable));
        assert!(emits.len() < 70, "{} emits", emits.len());
        assert_peak_envelopes(&emits, aliased);
        // A 20 % lower level whose values still spread: the first read is under the range.
        let throttled = |sec: u64| 0.8 * aliased(sec);
        let emitted: Vec<Emit> = sampler
            .observe(&s, Value::F64(throttled(1201)), 1201 * S)
            .into_iter()
            .collect();
        assert_eq!(sampler.mode(&s), Some(Mode::Fast), "{emitted:?}");
        assert_eq!(emitted.len(), 2);
        assert_eq!(gauge(&emitted[1]).max, throttled(1201));
        // It lasts: re-learnt at the minimum interval, then stable at the new level.
        let (reads, emits) = drive_range(&mut sampler, &s, 1202..=1800, |sec| {
            Value::F64(throttled(sec))
        });
        assert_eq!(reads.len(), 599);
        assert!(emits[..20].iter().all(|(sec, _)| *sec < 1222), "{emits:?}");
        assert_eq!(sampler.mode(&s), Some(Mode::Stable));
    }

    #[test]
    fn a_short_stall_is_sent_at_once_and_the_series_resumes_where_it_was() {
        let mut sampler = AdaptiveSampler::new(config());
        let s = series("railscope_gpu_sm_util_ratio", Kind::Gauge);
        drive(&mut sampler, &s, 300, |sec| Value::F64(aliased(sec)));
        assert_eq!(sampler.mode(&s), Some(Mode::Stable));
        // A data-loader stall: two reads far under the range, each sent at once.
        let e = sampler.observe(&s, Value::F64(0.0), 301 * S);
        assert_eq!(e.iter().last().map(|e| gauge(e).max), Some(0.0));
        assert_eq!(sampler.mode(&s), Some(Mode::Fast));
        let e = sampler.observe(&s, Value::F64(40.0), 302 * S);
        assert_eq!(e.len(), 1);
        // Back in range: stable again at once, from the window it had (no re-learning).
        sampler.observe(&s, Value::F64(aliased(303)), 303 * S);
        assert_eq!(sampler.mode(&s), Some(Mode::Stable));
        let (_, emits) = drive_range(&mut sampler, &s, 304..=310, |sec| Value::F64(aliased(sec)));
        assert!(emits.len() <= 3, "{emits:?}");
        // The stall is still in the window, yet a real drop is caught at its first read.
        let e = sampler.observe(&s, Value::F64(55.0), 311 * S);
        assert_eq!(sampler.mode(&s), Some(Mode::Fast));
        assert_eq!(e.iter().last().map(|e| gauge(e).max), Some(55.0));
        // And this one lasts: no return to the old window.
        let (_, emits) = drive_range(&mut sampler, &s, 312..=320, |_| Value::F64(55.0));
        assert_eq!(sampler.mode(&s), Some(Mode::Fast));
        assert_eq!(emits.len(), 9);
    }

    #[test]
    fn a_drift_beyond_the_tolerance_of_the_historical_peak_resets_the_interval() {
        let mut sampler = AdaptiveSampler::new(config());
        let s = series("railscope_gpu_temp_celsius", Kind::Gauge);
        // Warming up by 0.05 °C a second: no read leaves the range of the window.
        let temp = |sec: u64| 60.0 + 0.05 * sec as f64;
        let mut resets = Vec::new();
        let mut mode = None;
        let mut emits = Vec::new();
        for sec in 1..=600 {
            if sampler.due(&s, sec * S) {
                emits.extend(sampler.observe(&s, Value::F64(temp(sec)), sec * S));
            }
            let now = sampler.mode(&s);
            if mode == Some(Mode::Stable) && now == Some(Mode::Fast) {
                resets.push(sec);
            }
            mode = now;
        }
        // Stable from the 24th read, at 61.2 °C; every 10 % further, the peak of the window
        // is no longer close to the historical one: back to the minimum interval, once.
        assert!(resets.len() >= 3, "{resets:?}");
        assert!((temp(resets[0]) - 61.2 * 1.1).abs() < 0.1, "{resets:?}");
        assert!(emits.len() < 100, "{} emits", emits.len());
    }

    #[test]
    fn small_noise_is_stable() {
        let mut sampler = AdaptiveSampler::new(config());
        let s = series("railscope_gpu_power_watts", Kind::Gauge);
        let mut rng = SplitMix64::new(3);
        let values: Vec<f64> = (0..=900).map(|_| 300.0 + 12.0 * rng.next_f64()).collect();
        let value = |sec: u64| values[sec as usize];
        let (reads, emits) = drive(&mut sampler, &s, 900, |sec| Value::F64(value(sec)));
        assert_eq!(reads.len(), 900);
        assert!(emits.len() < 90, "{} emits", emits.len());
        assert_peak_envelopes(&emits, value);
    }

    #[test]
    fn envelopes_summarise_every_value_read() {
        let mut sampler = AdaptiveSampler::new(config());
        let s = series("railscope_gpu_temp_celsius", Kind::Gauge);
        let value = |sec: u64| 60.0 + (sec % 5) as f64 * 0.5;
        let (reads, mut emits) = drive(&mut sampler, &s, 400, |sec| Value::F64(value(sec)));
        emits.extend(sampler.flush().into_iter().map(|(_, e)| (0, e)));
        let mut covered = 0;
        let mut last_end = 0;
        for (_, e) in &emits {
            let env = gauge(e);
            assert!(env.start_ns > last_end, "overlap at {env:?}");
            last_end = env.end_ns;
            let inside: Vec<f64> = reads
                .iter()
                .filter(|&&r| r * S >= env.start_ns && r * S <= env.end_ns)
                .map(|&r| value(r))
                .collect();
            assert_eq!(env.count as usize, inside.len(), "{env:?}");
            assert_eq!(
                env.min,
                inside.iter().copied().fold(f64::INFINITY, f64::min)
            );
            assert_eq!(
                env.max,
                inside.iter().copied().fold(f64::NEG_INFINITY, f64::max)
            );
            let mean = inside.iter().sum::<f64>() / inside.len() as f64;
            assert!((env.mean - mean).abs() < 1e-9, "{env:?} vs {mean}");
            covered += inside.len();
        }
        // Nothing read is left out, nothing counted twice.
        assert_eq!(covered, reads.len());
        assert!(emits.len() < reads.len() / 4);
    }

    #[test]
    fn ground_truth_reads_continue_while_backed_off() {
        let c = SamplerConfig {
            ground_truth_every: 4,
            ..config()
        };
        let mut sampler = AdaptiveSampler::new(c);
        let s = series("railscope_ib_port_rcv_bytes_total", Kind::Counter);
        let (reads, _) = drive(&mut sampler, &s, 300, |sec| Value::U64(sec * 1_000_000));
        assert_eq!(sampler.mode(&s), Some(Mode::Stable));
        assert!(sampler.collection_interval(&s).unwrap() >= Duration::from_secs(16));
        // Fewer reads than seconds, but never more than 4 s apart.
        assert!(reads.len() < 150, "{} reads", reads.len());
        assert!(reads.windows(2).all(|w| w[1] - w[0] <= 4), "{reads:?}");
        // A read between collections that sees a change sends at once.
        let last = *reads.last().unwrap();
        let next = last + 4;
        assert!(sampler.due(&s, next * S));
        let emitted: Vec<Emit> = sampler
            .observe(&s, Value::U64(last * 1_000_000 + 4 * 3_000_000), next * S)
            .into_iter()
            .collect();
        assert_eq!(sampler.mode(&s), Some(Mode::Fast));
        assert_eq!(
            emitted.last(),
            Some(&Emit::Counter {
                unix_ns: next * S,
                value: Value::U64(last * 1_000_000 + 12_000_000)
            })
        );
    }

    #[test]
    fn counters_are_sent_losslessly() {
        let mut sampler = AdaptiveSampler::new(config());
        let s = series("railscope_ib_port_xmit_bytes_total", Kind::Counter);
        // 1 MB/s, then 5 MB/s from second 200, then a reset (driver reload) at 300.
        let count = |sec: u64| -> u64 {
            match sec {
                0..200 => sec * 1_000_000,
                200..300 => 200_000_000 + (sec - 200) * 5_000_000,
                _ => (sec - 300) * 1_000,
            }
        };
        let (reads, mut emits) = drive(&mut sampler, &s, 400, |sec| Value::U64(count(sec)));
        emits.extend(sampler.flush().into_iter().map(|(_, e)| (0, e)));
        assert_eq!(reads.len(), 400);
        assert!(emits.len() < 100, "{} emits", emits.len());
        let sent: Vec<(u64, u64)> = emits
            .iter()
            .map(|(_, e)| match e {
                Emit::Counter {
                    unix_ns,
                    value: Value::U64(v),
                } => (unix_ns / S, *v),
                other => panic!("{other:?}"),
            })
            .collect();
        // Every value sent is a value read, unchanged, in time order; the last read is sent.
        for (sec, v) in &sent {
            assert_eq!(*v, count(*sec));
        }
        assert!(sent.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(sent.last(), Some(&(400, count(400))));
        // The change of rate is pinned to the second it happened, the reset too.
        // (The count at 200 still grew at 1 MB/s since 199; 201 is the first at 5 MB/s.)
        for sec in [200, 201, 299, 300] {
            assert!(
                sent.iter().any(|&(t, _)| t == sec),
                "{sec} not sent: {sent:?}"
            );
        }
    }

    #[test]
    fn disabled_is_a_fixed_interval() {
        let c = SamplerConfig {
            min_interval: Duration::from_secs(2),
            ..config()
        }
        .fixed();
        let mut sampler = AdaptiveSampler::new(c);
        let s = series("railscope_gpu_power_watts", Kind::Gauge);
        let (reads, emits) = drive(&mut sampler, &s, 100, |_| Value::F64(300.0));
        assert_eq!(reads, (1..=99).step_by(2).collect::<Vec<_>>());
        assert_eq!(emits.len(), reads.len());
        assert_eq!(sampler.mode(&s), Some(Mode::Fast));
        // Reads between collections are not lost: they go into the next envelope.
        let e = sampler.observe(&s, Value::F64(500.0), 100 * S);
        assert!(e.is_empty());
        let e: Vec<Emit> = sampler
            .observe(&s, Value::F64(300.0), 101 * S)
            .into_iter()
            .collect();
        assert_eq!(gauge(&e[0]).max, 500.0);
        assert_eq!(gauge(&e[0]).count, 2);
    }

    #[test]
    fn groups_by_longest_prefix() {
        let ib = SamplerConfig {
            min_interval: Duration::from_secs(5),
            ..config()
        };
        let fixed_errors = config().fixed();
        let mut sampler = AdaptiveSampler::new(config())
            .with_group("ib", "railscope_ib_", ib)
            .with_group("ib-errors", "railscope_ib_symbol_error", fixed_errors);
        let bytes = series("railscope_ib_port_rcv_bytes_total", Kind::Counter);
        let errors = series("railscope_ib_symbol_error_total", Kind::Counter);
        let gpu = series("railscope_gpu_power_watts", Kind::Gauge);
        assert_eq!(sampler.group_of(&bytes).0, "ib");
        assert_eq!(sampler.group_of(&errors).0, "ib-errors");
        assert_eq!(sampler.group_of(&gpu).0, "default");

        // The ib group's minimum interval is 5 s: read every 5 s while new, and at least every
        // 5 s once backing off (a jittered collection may fall between two of those reads).
        let (reads, _) = drive(&mut sampler, &bytes, 60, Value::U64);
        assert_eq!(reads[..4], [1, 6, 11, 16]);
        assert!(reads.windows(2).all(|w| w[1] - w[0] <= 5), "{reads:?}");
        assert!(reads.len() <= 14, "{reads:?}");
        let (reads, emits) = drive(&mut sampler, &errors, 60, |_| Value::U64(0));
        assert_eq!((reads.len(), emits.len()), (60, 60));
    }

    #[test]
    fn stale_series_are_forgotten_with_what_they_had_to_send() {
        let mut sampler = AdaptiveSampler::new(config());
        let gone = series("railscope_gpu_power_watts", Kind::Gauge);
        let kept = series("railscope_gpu_temp_celsius", Kind::Gauge);
        // Read until a collection while stable; the read a second later is still pending.
        let mut sec = 0;
        loop {
            sec += 1;
            let sent = !sampler
                .observe(&gone, Value::F64(300.0), sec * S)
                .is_empty();
            if sent && sampler.mode(&gone) == Some(Mode::Stable) && sec > 20 {
                break;
            }
        }
        assert!(
            sampler
                .observe(&gone, Value::F64(305.0), (sec + 1) * S)
                .is_empty()
        );
        sampler.observe(&kept, Value::F64(50.0), (sec + 100) * S);

        let flushed = sampler.remove_stale((sec + 100) * S, Duration::from_secs(60));
        assert_eq!(flushed.len(), 1);
        assert_eq!(flushed[0].0, gone);
        let env = gauge(&flushed[0].1);
        assert_eq!(
            (env.start_ns, env.max, env.count),
            ((sec + 1) * S, 305.0, 1)
        );
        assert_eq!(sampler.len(), 1);
        assert!(sampler.due(&gone, (sec + 101) * S));
        assert!(!sampler.due(&kept, (sec + 100) * S));
    }

    #[test]
    fn out_of_order_and_non_finite_values_are_ignored() {
        let mut sampler = AdaptiveSampler::new(config());
        let s = series("railscope_gpu_power_watts", Kind::Gauge);
        assert_eq!(sampler.observe(&s, Value::F64(300.0), 10 * S).len(), 1);
        assert!(sampler.observe(&s, Value::F64(900.0), 10 * S).is_empty());
        assert!(sampler.observe(&s, Value::F64(900.0), 9 * S).is_empty());
        assert!(sampler.observe(&s, Value::F64(f64::NAN), 11 * S).is_empty());
        let e: Vec<Emit> = sampler
            .observe(&s, Value::F64(301.0), 12 * S)
            .into_iter()
            .collect();
        assert_eq!(gauge(&e[0]).count, 1);
        assert_eq!(gauge(&e[0]).max, 301.0);
    }
}
