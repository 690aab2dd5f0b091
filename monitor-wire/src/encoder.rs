//! The agent's side of the frame format: [`FrameEncoder`] collects samples and events between
//! flushes and cuts them into self-contained frames no larger than the MTU.

use std::{collections::HashMap, time::Duration};

use crate::{
    codec::FrameView,
    error::WireError,
    frame::{
        CounterSample, DEFAULT_MTU, GaugeSample, Sample, SeriesData, SeriesSamples, WireEvent,
    },
    key::Key,
    mac::{self, MAC_LEN},
    prim,
    samples::{PreparedBlock, TimePatterns},
    series::{Kind, Reading, Series, Value},
};

/// How an agent's frames are made.
#[derive(Clone, Debug, PartialEq)]
pub struct EncoderConfig {
    /// This node's name in every frame (at most 255 bytes; unique in the cluster).
    pub node: String,
    /// Largest frame in bytes, MAC included.
    pub mtu: usize,
    /// A series' schema entry is sent again with its samples once this long has passed since
    /// it was last sent (default 5 min), so a receiver that restarted learns every series
    /// within this time even if it cannot ask; one that sends a schema request gets them all
    /// with the next flush ([`FrameEncoder::resend_schema`]).
    pub schema_refresh: Duration,
    /// Sample times are rounded to this (1 ms: a rate over 1 s is then within 0.1%). Readings
    /// of one sweep that share a rounded time share one entry of the frame's time table.
    pub time_quantum_ns: u64,
    /// Gauge values that are not integers are rounded to this many significant digits before
    /// they are coded (`None`: sent bit for bit). Integers are never rounded.
    pub gauge_digits: Option<u32>,
    /// Most samples held between flushes; beyond it samples are dropped and counted.
    pub max_pending_samples: usize,
    /// A series with no sample for this long is forgotten, so series that come and go do
    /// not pile up (series known to have ended are forgotten at once:
    /// [`FrameEncoder::retire_where`]).
    pub forget_after: Duration,
    /// Most series known at once (default 65,536: what a receiver keeps per node); samples
    /// of a further series are dropped and counted until some are forgotten.
    pub max_series: usize,
}

impl EncoderConfig {
    pub fn new(node: impl Into<String>) -> Self {
        Self {
            node: node.into(),
            mtu: DEFAULT_MTU,
            schema_refresh: Duration::from_secs(300),
            time_quantum_ns: 1_000_000,
            gauge_digits: Some(6),
            max_pending_samples: 200_000,
            forget_after: Duration::from_secs(600),
            max_series: 65_536,
        }
    }
}

/// What an encoder has produced and dropped so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EncoderStats {
    pub frames: u64,
    /// Bytes of all frames, headers and MACs included.
    pub bytes: u64,
    /// Of those, the schema sections.
    pub schema_bytes: u64,
    /// Samples put into frames.
    pub samples: u64,
    pub events: u64,
    /// Samples dropped because `max_pending_samples` were waiting for a flush.
    pub dropped_samples: u64,
    /// Samples of new series dropped because `max_series` were known.
    pub refused_series_samples: u64,
    /// Series forgotten: idle for `forget_after`, or retired once their last samples went out.
    pub forgotten_series: u64,
    /// Events whose text was cut so that they fit in a frame.
    pub truncated_events: u64,
    /// Events that could not fit in a frame even without text.
    pub dropped_events: u64,
}

struct Slot {
    series: Series,
    id: Option<u32>,
    pending: SeriesData,
    /// Flushes that carried its schema entry, and when the last one was.
    schema_sends: u32,
    schema_sent_ns: u64,
    /// The last flush that carried samples of it.
    flushed_ns: u64,
    /// Ended ([`FrameEncoder::retire_where`]): forgotten once its pending samples are sent.
    retired: bool,
}

/// What goes into frames: an event, a schema entry, or (part of) one series' samples.
enum Unit {
    Event(WireEvent),
    Schema {
        id: u32,
        slot: usize,
    },
    Series {
        samples: SeriesSamples,
        block: PreparedBlock,
    },
}

/// Builds frames from readings and events. Push between flushes; each [`flush`] returns the
/// frames (each at most `mtu` bytes) to hand to the sender.
///
/// Series get compact ids at the flush after they first appear, ordered by labels then name
/// (so the series of one GPU or port have consecutive ids); a series with no sample for
/// `forget_after` is forgotten (it gets a new id if it comes back). Within a flush, samples
/// are grouped per series and coded against the series' previous sample in the same frame:
/// batching several sweeps per flush is what makes samples small (docs/wire-format.md).
///
/// [`flush`]: FrameEncoder::flush
pub struct FrameEncoder {
    config: EncoderConfig,
    key: Key,
    session: u32,
    next_seq: u64,
    next_id: u32,
    slots: Vec<Slot>,
    index: HashMap<Series, usize, foldhash::fast::RandomState>,
    events: Vec<WireEvent>,
    pending: usize,
    backlog_warned: bool,
    series_limit_warned: bool,
    last_frame_units: usize,
    stats: EncoderStats,
}

impl FrameEncoder {
    pub fn new(config: EncoderConfig, key: Key) -> Result<Self, WireError> {
        Self::resume(config, key, random_session(), 0, 0)
    }

    /// An encoder that continues `session` after the agent restarted with frames of it still
    /// to deliver (its spool file): frames go on from sequence number `next_seq`, and series
    /// get ids from `next_series_id` on, defined afresh with their schema entries. A receiver
    /// reads a late frame of the session with the session's id table, so an id never changes
    /// meaning within a session: `next_series_id` must be above every id the session used.
    pub fn resume(
        config: EncoderConfig,
        key: Key,
        session: u32,
        next_seq: u64,
        next_series_id: u32,
    ) -> Result<Self, WireError> {
        if config.node.len() > 255 {
            return Err(WireError::NodeName {
                len: config.node.len(),
                node: config.node,
            });
        }
        if config.time_quantum_ns == 0 {
            return Err(WireError::Quantum);
        }
        if !(256..=65_507).contains(&config.mtu) {
            return Err(WireError::Mtu { mtu: config.mtu });
        }
        Ok(Self {
            config,
            key,
            session,
            next_seq,
            next_id: next_series_id,
            slots: Vec::new(),
            index: HashMap::default(),
            events: Vec::new(),
            pending: 0,
            backlog_warned: false,
            series_limit_warned: false,
            last_frame_units: 16,
            stats: EncoderStats::default(),
        })
    }

    pub fn session(&self) -> u32 {
        self.session
    }

    /// The sequence number of the next frame.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The id the next new series gets: above every id this session used so far.
    pub fn next_series_id(&self) -> u32 {
        self.next_id
    }

    pub fn config(&self) -> &EncoderConfig {
        &self.config
    }

    pub fn stats(&self) -> EncoderStats {
        self.stats
    }

    /// Samples waiting for the next flush.
    pub fn pending_samples(&self) -> usize {
        self.pending
    }

    /// Adds one reading: a counter's cumulative value, or a gauge's single value.
    pub fn push_reading(&mut self, reading: &Reading) -> Result<(), WireError> {
        let sample = match (reading.series.kind, reading.value) {
            (Kind::Counter, Value::U64(value)) => Sample::Counter(CounterSample {
                unix_ns: reading.unix_ns,
                value,
            }),
            (Kind::Counter, Value::F64(value)) => {
                if !((0.0..18_446_744_073_709_551_616.0).contains(&value) && value.fract() == 0.0) {
                    return Err(WireError::CounterValue {
                        series: reading.series.to_string(),
                        value,
                    });
                }
                Sample::Counter(CounterSample {
                    unix_ns: reading.unix_ns,
                    value: value as u64,
                })
            }
            (Kind::Gauge, value) => {
                Sample::Gauge(GaugeSample::reading(reading.unix_ns, value.as_f64()))
            }
        };
        self.push_sample(&reading.series, sample)
    }

    /// Adds one sample of `series` (a counter sample for a counter, a gauge envelope for a
    /// gauge).
    pub fn push_sample(&mut self, series: &Series, sample: Sample) -> Result<(), WireError> {
        let given = match (&sample, series.kind) {
            (Sample::Counter(_), Kind::Counter) | (Sample::Gauge(_), Kind::Gauge) => None,
            (Sample::Counter(_), Kind::Gauge) => Some("counter"),
            (Sample::Gauge(_), Kind::Counter) => Some("gauge"),
        };
        if let Some(given) = given {
            return Err(WireError::KindMismatch {
                series: series.to_string(),
                kind: series.kind,
                given,
            });
        }
        if let Sample::Gauge(g) = &sample
            && g.start_unix_ns > g.end_unix_ns
        {
            return Err(WireError::Interval {
                series: series.to_string(),
                start: g.start_unix_ns,
                end: g.end_unix_ns,
            });
        }
        let slot = match self.index.get(series) {
            Some(&slot) => slot,
            None if self.slots.len() >= self.config.max_series => {
                self.stats.refused_series_samples += 1;
                if !self.series_limit_warned {
                    self.series_limit_warned = true;
                    tracing::warn!(
                        "{} series known (the limit): samples of new series are dropped until \
                         some end or go idle",
                        self.slots.len()
                    );
                }
                return Ok(());
            }
            None => self.add_series(series)?,
        };
        self.slots[slot].retired = false;
        if self.pending >= self.config.max_pending_samples {
            self.stats.dropped_samples += 1;
            if !self.backlog_warned {
                self.backlog_warned = true;
                tracing::warn!(
                    "{} samples wait for a flush: dropping further samples until the next one",
                    self.pending
                );
            }
            return Ok(());
        }
        self.pending += 1;
        match (&mut self.slots[slot].pending, sample) {
            (SeriesData::Counter(v), Sample::Counter(c)) => v.push(c),
            (SeriesData::Gauge(v), Sample::Gauge(mut g)) => {
                if let Some(digits) = self.config.gauge_digits {
                    g.min = prim::round_significant(g.min, digits);
                    g.max = prim::round_significant(g.max, digits);
                    g.mean = prim::round_significant(g.mean, digits);
                }
                v.push(g);
            }
            _ => unreachable!("kind checked above"),
        }
        Ok(())
    }

    fn add_series(&mut self, series: &Series) -> Result<usize, WireError> {
        let labels = series.labels.iter().count();
        // An entry on its own (strings unshared, indices of 3 bytes) must leave room in a
        // frame for a sample of it and the header.
        let len = series.name.len()
            + series
                .labels
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>()
            + 8 * (labels + 1)
            + 16;
        if len > self.config.mtu / 2 {
            return Err(WireError::SeriesTooLarge {
                series: series.to_string(),
                len,
                mtu: self.config.mtu,
            });
        }
        let pending = match series.kind {
            Kind::Counter => SeriesData::Counter(Vec::new()),
            Kind::Gauge => SeriesData::Gauge(Vec::new()),
        };
        self.slots.push(Slot {
            series: series.clone(),
            id: None,
            pending,
            schema_sends: 0,
            schema_sent_ns: 0,
            flushed_ns: 0,
            retired: false,
        });
        self.index.insert(series.clone(), self.slots.len() - 1);
        Ok(self.slots.len() - 1)
    }

    /// Adds an event; it goes out with the next [`flush`](FrameEncoder::flush) or
    /// [`flush_events`](FrameEncoder::flush_events).
    pub fn push_event(&mut self, event: WireEvent) {
        self.events.push(event);
    }

    /// Sends the pending events only, at once, leaving samples to batch until the next
    /// [`flush`](FrameEncoder::flush): events want low latency, samples compress better in
    /// larger batches.
    pub fn flush_events(&mut self, now_unix_ns: u64) -> Vec<Vec<u8>> {
        let units = self.events.drain(..).map(Unit::Event).collect();
        self.pack(units, &mut TimePatterns::default(), now_unix_ns)
    }

    /// Turns everything pushed since the last flush into frames stamped `now_unix_ns`:
    /// events first, then the schema entries that are due, then samples, series by series in
    /// id order. Every frame is at most `mtu` bytes and decodes on its own given the schema
    /// entries the receiver has seen. A series' entry is due in the first two flushes that
    /// carry its samples (so one lost frame does not hide a new series until the refresh),
    /// then once every `schema_refresh`.
    pub fn flush(&mut self, now_unix_ns: u64) -> Vec<Vec<u8>> {
        self.forget_idle(now_unix_ns);
        let mut new: Vec<usize> = (0..self.slots.len())
            .filter(|&i| self.slots[i].id.is_none() && !self.slots[i].pending.is_empty())
            .collect();
        // Source-major: the series of one GPU or port get consecutive ids, so a frame holds
        // few sources, whose samples share read times (one time pattern per source).
        new.sort_by(|&a, &b| {
            let (a, b) = (&self.slots[a].series, &self.slots[b].series);
            (&a.labels, &a.name, a.kind).cmp(&(&b.labels, &b.name, b.kind))
        });
        for i in new {
            self.slots[i].id = Some(self.next_id);
            self.next_id = self.next_id.wrapping_add(1);
        }
        let mut order: Vec<(u32, usize)> = (0..self.slots.len())
            .filter(|&i| !self.slots[i].pending.is_empty())
            .filter_map(|i| self.slots[i].id.map(|id| (id, i)))
            .collect();
        order.sort_unstable();

        let refresh = u64::try_from(self.config.schema_refresh.as_nanos()).unwrap_or(u64::MAX);
        let mut units: Vec<Unit> = self.events.drain(..).map(Unit::Event).collect();
        for &(id, i) in &order {
            let slot = &mut self.slots[i];
            if slot.schema_sends < 2 || now_unix_ns.saturating_sub(slot.schema_sent_ns) >= refresh {
                slot.schema_sends = slot.schema_sends.saturating_add(1);
                slot.schema_sent_ns = now_unix_ns;
                units.push(Unit::Schema { id, slot: i });
            }
        }
        let q = self.config.time_quantum_ns;
        let mut patterns = TimePatterns::default();
        for (id, i) in order {
            let slot = &mut self.slots[i];
            // The next flush's batch is likely as large as this one's.
            let empty = match &slot.pending {
                SeriesData::Counter(v) => SeriesData::Counter(Vec::with_capacity(v.len())),
                SeriesData::Gauge(v) => SeriesData::Gauge(Vec::with_capacity(v.len())),
            };
            slot.flushed_ns = now_unix_ns;
            let mut data = std::mem::replace(&mut slot.pending, empty);
            match &mut data {
                SeriesData::Counter(v) => v.sort_by_key(|c| c.unix_ns),
                SeriesData::Gauge(v) => v.sort_by_key(|g| g.end_unix_ns),
            }
            let samples = SeriesSamples { id, data };
            match PreparedBlock::new(&samples, q, &mut patterns) {
                Ok(block) => units.push(Unit::Series { samples, block }),
                Err(e) => {
                    tracing::warn!("samples of series id {id} cannot be coded ({e}): dropped");
                    self.stats.dropped_samples += samples.data.len() as u64;
                }
            }
        }
        self.pending = 0;
        self.backlog_warned = false;
        let frames = self.pack(units, &mut patterns, now_unix_ns);
        self.forget_where(|s| s.retired);
        frames
    }

    /// Sends every series' schema entry again, with its next samples: what a collector that
    /// lost them (it restarted) asks for with a schema request.
    pub fn resend_schema(&mut self) {
        for slot in &mut self.slots {
            slot.schema_sent_ns = 0;
        }
    }

    /// Marks the series for which `ended` holds as ended (a job whose cgroup is gone): each is
    /// forgotten after the next [`flush`](FrameEncoder::flush) has sent what it still holds,
    /// so its last value goes out and its id is not kept. A retired series that gets a sample
    /// again is kept.
    ///
    /// Receivers are not told: a series that ended simply has no further samples (its id may
    /// come back with the next session only; ids are never reused within one).
    pub fn retire_where(&mut self, mut ended: impl FnMut(&Series) -> bool) {
        for slot in &mut self.slots {
            if ended(&slot.series) {
                slot.retired = true;
            }
        }
    }

    /// Drops the series that had ids but no samples since `forget_after`.
    fn forget_idle(&mut self, now: u64) {
        let after = u64::try_from(self.config.forget_after.as_nanos()).unwrap_or(u64::MAX);
        self.forget_where(|s| {
            s.id.is_some() && s.pending.is_empty() && now.saturating_sub(s.flushed_ns) >= after
        });
    }

    /// Drops the series with nothing pending for which `forget` holds.
    fn forget_where(&mut self, forget: impl Fn(&Slot) -> bool) {
        let before = self.slots.len();
        self.slots.retain(|s| !(s.pending.is_empty() && forget(s)));
        let forgotten = before - self.slots.len();
        if forgotten == 0 {
            return;
        }
        tracing::debug!("forgot {forgotten} series");
        self.stats.forgotten_series += forgotten as u64;
        self.series_limit_warned = false;
        if self.slots.capacity() > 4 * self.slots.len().max(64) {
            self.slots.shrink_to_fit();
        }
        self.index = (self.slots.iter().enumerate())
            .map(|(i, s)| (s.series.clone(), i))
            .collect();
    }

    /// Series the encoder knows (pending or sent within `forget_after`).
    pub fn known_series(&self) -> usize {
        self.slots.len()
    }

    fn pack(
        &mut self,
        mut units: Vec<Unit>,
        patterns: &mut TimePatterns,
        now: u64,
    ) -> Vec<Vec<u8>> {
        let mut frames = Vec::new();
        // The cut being tried, the largest that fitted so far, and scratch for a section.
        let mut tried = Vec::with_capacity(self.config.mtu);
        let mut fitted = Vec::with_capacity(self.config.mtu);
        let mut section = Vec::new();
        let mut pos = 0;
        while pos < units.len() {
            let remaining = units.len() - pos;
            // Largest n such that units[pos..pos + n] fit: gallop from the last frame's
            // count, then bisect.
            let (mut lo, mut best, mut hi) = (0, None, remaining + 1);
            let mut n = self.last_frame_units.clamp(1, remaining);
            loop {
                let units = &units[pos..pos + n];
                match self.try_frame(units, now, patterns, &mut tried, &mut section) {
                    Ok(schema_bytes) => {
                        lo = n;
                        best = Some(schema_bytes);
                        std::mem::swap(&mut tried, &mut fitted);
                    }
                    Err(_) => hi = n,
                }
                if hi - lo <= 1 {
                    break;
                }
                n = if hi == remaining + 1 {
                    (lo * 2).min(remaining)
                } else {
                    lo + (hi - lo) / 2
                };
            }
            let Some(schema_bytes) = best else {
                self.shrink(&mut units, patterns, pos, now);
                continue;
            };
            let mut bytes = Vec::with_capacity(fitted.len() + MAC_LEN);
            bytes.extend_from_slice(&fitted);
            mac::seal(&mut bytes, &self.key);
            self.last_frame_units = lo;
            self.stats.frames += 1;
            self.stats.bytes += bytes.len() as u64;
            self.stats.schema_bytes += schema_bytes as u64;
            for unit in &units[pos..pos + lo] {
                match unit {
                    Unit::Event(_) => self.stats.events += 1,
                    Unit::Schema { .. } => {}
                    Unit::Series { samples, .. } => self.stats.samples += samples.data.len() as u64,
                }
            }
            frames.push(bytes);
            self.next_seq += 1;
            pos += lo;
        }
        frames
    }

    /// The unit at `pos` does not fit in a frame on its own: split a series' samples in two,
    /// cut an event's text, or drop what cannot be made to fit.
    fn shrink(&mut self, units: &mut Vec<Unit>, patterns: &mut TimePatterns, pos: usize, now: u64) {
        let (mut out, mut section) = (Vec::new(), Vec::new());
        let overshoot =
            match self.try_frame(&units[pos..=pos], now, patterns, &mut out, &mut section) {
                Err(Some(len)) => len.saturating_sub(self.config.mtu),
                _ => 0,
            };
        let q = self.config.time_quantum_ns;
        match &mut units[pos] {
            Unit::Series { samples, block } if samples.data.len() > 1 => {
                let half = samples.data.len() / 2;
                let rest = match &mut samples.data {
                    SeriesData::Counter(v) => SeriesData::Counter(v.split_off(half)),
                    SeriesData::Gauge(v) => SeriesData::Gauge(v.split_off(half)),
                };
                let rest = SeriesSamples {
                    id: samples.id,
                    data: rest,
                };
                match (
                    PreparedBlock::new(samples, q, patterns),
                    PreparedBlock::new(&rest, q, patterns),
                ) {
                    (Ok(first), Ok(second)) => {
                        *block = first;
                        let unit = Unit::Series {
                            samples: rest,
                            block: second,
                        };
                        units.insert(pos + 1, unit);
                    }
                    _ => {
                        tracing::warn!("samples of series id {} cannot be coded: dropped", rest.id);
                        self.stats.dropped_samples += (half + rest.data.len()) as u64;
                        units.remove(pos);
                    }
                }
            }
            Unit::Event(event) if !event.text.is_empty() && overshoot > 0 => {
                let mut keep = event.text.len().saturating_sub(overshoot + 3);
                while !event.text.is_char_boundary(keep) {
                    keep -= 1;
                }
                event.text.truncate(keep);
                event.text.push_str("...");
                if keep == 0 {
                    event.text.clear();
                }
                self.stats.truncated_events += 1;
            }
            unit => {
                match unit {
                    Unit::Event(e) => {
                        tracing::warn!(
                            "event {:?} {} too large for a frame: dropped",
                            e.kind,
                            e.labels
                        );
                        self.stats.dropped_events += 1;
                    }
                    Unit::Schema { id, .. } => {
                        tracing::warn!(
                            "the schema entry of series id {id} does not fit in a frame: dropped"
                        );
                    }
                    Unit::Series { samples, .. } => {
                        tracing::warn!(
                            "a sample of series id {} does not fit in a frame: dropped",
                            samples.id
                        );
                        self.stats.dropped_samples += samples.data.len() as u64;
                    }
                }
                units.remove(pos);
            }
        }
    }

    /// Encodes `units` as the next frame, without its MAC, into `out`: `Ok` with the bytes of
    /// its schema section if it fits in the MTU, `Err(Some(len))` if it is larger,
    /// `Err(None)` if it cannot be encoded at all.
    fn try_frame(
        &self,
        units: &[Unit],
        now: u64,
        patterns: &mut TimePatterns,
        out: &mut Vec<u8>,
        section: &mut Vec<u8>,
    ) -> Result<usize, Option<usize>> {
        let mut view = FrameView {
            node: &self.config.node,
            session: self.session,
            seq: self.next_seq,
            send_unix_ns: now,
            time_quantum_ns: self.config.time_quantum_ns,
            schema: Vec::new(),
            samples: Vec::new(),
            events: Vec::new(),
        };
        for unit in units {
            match unit {
                Unit::Event(e) => view.events.push(e),
                Unit::Schema { id, slot } => view.schema.push((*id, &self.slots[*slot].series)),
                Unit::Series { block, .. } => view.samples.push(block),
            }
        }
        match view.encode_unsealed(patterns, out, section) {
            Ok(schema_bytes) if out.len() + MAC_LEN <= self.config.mtu => Ok(schema_bytes),
            Ok(_) => Err(Some(out.len() + MAC_LEN)),
            Err(WireError::TooMany { .. }) => Err(None),
            Err(e) => {
                tracing::warn!("cannot encode a frame: {e}");
                Err(None)
            }
        }
    }
}

fn random_session() -> u32 {
    use std::hash::{BuildHasher as _, Hasher as _};
    // RandomState is seeded from the OS's random source once per process.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.write_u32(std::process::id());
    h.finish() as u32
}

#[cfg(test)]
mod tests;
