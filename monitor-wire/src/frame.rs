//! The frame model: what one datagram carries, as the encoder takes it and the decoder
//! returns it (the format's constants are in [`limits`](crate::limits)).

pub(crate) use crate::limits::DEFAULT_MTU;
pub use crate::limits::{MAGIC, MAX_FRAME_SAMPLES, MIN_FRAME_LEN, VERSION};
use crate::series::{Kind, Labels, Series};

// Header flags: which sections follow.
pub(crate) const FLAG_SCHEMA: u8 = 1;
pub(crate) const FLAG_SAMPLES: u8 = 2;
pub(crate) const FLAG_EVENTS: u8 = 4;

/// One counter sample: the cumulative value read at `unix_ns`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CounterSample {
    pub unix_ns: u64,
    pub value: u64,
}

/// One gauge sample: the envelope of the readings of `[start_unix_ns, end_unix_ns]`. A single
/// reading has `start == end` and `min == max == mean`, which the format sends as one value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GaugeSample {
    pub start_unix_ns: u64,
    pub end_unix_ns: u64,
    pub min: f64,
    pub max: f64,
    pub mean: f64,
}

impl GaugeSample {
    pub fn reading(unix_ns: u64, value: f64) -> Self {
        Self {
            start_unix_ns: unix_ns,
            end_unix_ns: unix_ns,
            min: value,
            max: value,
            mean: value,
        }
    }

    /// True when the envelope is one value (compared bit for bit).
    pub fn is_single_value(&self) -> bool {
        self.min.to_bits() == self.mean.to_bits() && self.max.to_bits() == self.mean.to_bits()
    }
}

/// A sample as the agent pushes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sample {
    Counter(CounterSample),
    Gauge(GaugeSample),
}

/// The samples of one series in a frame, in the order they were sent.
#[derive(Clone, Debug, PartialEq)]
pub enum SeriesData {
    Counter(Vec<CounterSample>),
    Gauge(Vec<GaugeSample>),
}

impl SeriesData {
    pub fn len(&self) -> usize {
        match self {
            SeriesData::Counter(v) => v.len(),
            SeriesData::Gauge(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn kind(&self) -> Kind {
        match self {
            SeriesData::Counter(_) => Kind::Counter,
            SeriesData::Gauge(_) => Kind::Gauge,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct SeriesSamples {
    pub id: u32,
    pub data: SeriesData,
}

/// Maps a compact id to its series, for the rest of the sender's session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchemaEntry {
    pub id: u32,
    pub series: Series,
}

/// Something that happened once (a port going down, an XID error, a QP error): never sampled.
///
/// The shape every source's event takes on the wire: a `kind`, string labels, a numeric
/// `code` and a `text`. What it adds over the sender's own types (the agent's decoded probe
/// events and port transitions, its GPU events) is one encoding for all of them, so the frame
/// format, the capture files and the collector need not know any source's type; it is what a
/// frame encodes and decodes (docs/wire-format.md, "Events section").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireEvent {
    pub unix_ns: u64,
    /// `ib_port`, `xid`, `gpu_lost`, `qp_error`, ...
    pub kind: String,
    pub labels: Labels,
    pub code: i64,
    pub text: String,
}

/// One frame, as encoded or decoded.
#[derive(Clone, Debug, PartialEq)]
pub struct Frame {
    /// The sending node's name, unique in the cluster.
    pub node: String,
    /// Random per sender start: ids and sequence numbers are only meaningful within a session.
    pub session: u32,
    /// Frame number in the session, from 0, +1 per frame.
    pub seq: u64,
    pub send_unix_ns: u64,
    /// Sample times are sent as multiples of this (the encoder rounds them to it).
    pub time_quantum_ns: u64,
    pub schema: Vec<SchemaEntry>,
    pub samples: Vec<SeriesSamples>,
    pub events: Vec<WireEvent>,
}

impl Frame {
    pub fn sample_count(&self) -> usize {
        self.samples.iter().map(|s| s.data.len()).sum()
    }
}
