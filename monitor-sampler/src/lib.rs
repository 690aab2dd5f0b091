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
//! misses peaks that fall between reads (counters lose nothing). The workload traces of
//! the `sampler-traces` crate measure both.
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

mod config;
mod emit;
mod rng;
mod state;
#[cfg(test)]
mod tests;
mod window;

use std::{collections::HashMap, time::Duration};

pub use config::{SamplerConfig, SamplingSpecError};
pub use emit::{Emit, Emitted, Envelope, wire_sample};
pub use rng::SplitMix64;
pub use state::Mode;

use config::SamplingSpec;
use monitor_wire::{Series, Value};
use state::State;

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
    /// - `drop`: the series are neither read nor sent (`on` undoes it);
    /// - `max=SECONDS`: the longest collection interval of a stable series;
    /// - `ground-truth=N`: a stable series is read at least every N minimum intervals;
    /// - `window=N`, `tolerance=FRACTION`, `density=FRACTION`, `jitter=FRACTION`,
    ///   `floor=VALUE`: the stability test (see [`SamplerConfig`]).
    ///
    /// The group starts from the settings its series had so far (the longest prefix that
    /// matched before), so `railscope_ib_symbol_error_total:max=300` changes one metric and
    /// keeps the rest of the IB group's settings. A prefix given twice: the later wins.
    pub fn configure(&mut self, spec: &str) -> Result<(), SamplingSpecError> {
        let spec = SamplingSpec::parse(spec)?;
        let prefix = spec.prefix;
        let config = spec.apply(self.groups[group_index(&self.groups, prefix)].2.clone())?;
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
    #[cfg(test)]
    pub(crate) fn group_of(&self, series: &Series) -> (&str, &SamplerConfig) {
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
        match self.find(series, slot) {
            Some(i) => {
                let s = &self.states[i].1;
                let slack = self.groups[s.group].2.min_ns() / 16;
                now_ns.saturating_add(slack) >= s.next_read_ns
            }
            // A series with a state is never of a dropped group (`observe_at` keeps none).
            None => {
                !self.groups[group_index(&self.groups, &series.name)]
                    .2
                    .dropped
            }
        }
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
    #[cfg(test)]
    pub(crate) fn next_due_ns(&self, series: &Series) -> Option<u64> {
        self.state(series).map(|s| s.next_read_ns)
    }

    /// Whether the series is backing off or at the minimum interval.
    pub fn mode(&self, series: &Series) -> Option<Mode> {
        self.state(series).map(|s| s.mode)
    }

    /// Time from the series' last collection to its next one, jitter included.
    #[cfg(test)]
    pub(crate) fn collection_interval(&self, series: &Series) -> Option<Duration> {
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
                if self.groups[group].2.dropped {
                    return Emitted::default();
                }
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

    /// Forgets the series not read for longer than `max_age` (a device removed, a GPU lost)
    /// and returns what they still had to send. Slots handed out before are no longer used.
    pub fn remove_stale(&mut self, now_ns: u64, max_age: Duration) -> Vec<(Series, Emit)> {
        let max_age = max_age.as_nanos() as u64;
        self.remove_where(|_, last_read_ns| now_ns.saturating_sub(last_read_ns) > max_age)
    }

    /// Forgets every series for which `ended(series, last read ns)` holds (a job whose cgroup
    /// is gone) and returns what they still had to send: a counter's last value read, if it
    /// was not sent yet, so the receiver ends with the series' final value. Slots handed out
    /// before are no longer used.
    pub fn remove_where(
        &mut self,
        mut ended: impl FnMut(&Series, u64) -> bool,
    ) -> Vec<(Series, Emit)> {
        let mut out = Vec::new();
        let before = self.states.len();
        self.states.retain_mut(|(series, state)| {
            if !ended(series, state.last_read_ns.unwrap_or(0)) {
                return true;
            }
            if let Some(e) = state.take_pending(series.kind) {
                out.push((series.clone(), e));
            }
            false
        });
        if self.states.len() == before {
            return out;
        }
        self.index = self
            .states
            .iter()
            .enumerate()
            .map(|(i, (series, _))| (series.clone(), i as u32))
            .collect();
        // The index is built anew at its size; the states give back what they held at a peak.
        if self.states.capacity() > 4 * self.states.len().max(64) {
            self.states.shrink_to_fit();
        }
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
