//! What the sampler says to send for a series: a counter's value or a gauge's envelope.

use monitor_wire::{CounterSample, GaugeSample, Sample, Value};

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
    pub(crate) fn push(&mut self, e: Emit) {
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

/// What the sampler emits, as a wire sample. Counters travel as whole numbers (every source
/// counts in whole units: GPU energy in millijoules, NVML's own unit); a fractional value
/// would be truncated.
pub fn wire_sample(emit: &Emit) -> Sample {
    match *emit {
        Emit::Counter { unix_ns, value } => Sample::Counter(CounterSample {
            unix_ns,
            value: match value {
                Value::U64(v) => v,
                Value::F64(v) => v.max(0.0) as u64,
            },
        }),
        Emit::Gauge(e) => Sample::Gauge(GaugeSample {
            start_unix_ns: e.start_ns,
            end_unix_ns: e.end_ns,
            min: e.min,
            max: e.max,
            mean: e.mean,
        }),
    }
}
