//! The frame format between a node agent and a collector (docs/wire-format.md is its
//! byte-level spec): one UDP datagram is one frame, authenticated with a keyed BLAKE3 MAC,
//! decodable on its own given the schema entries the receiver has seen.
//!
//! - [`Frame`] is the decoded model: header, schema entries (compact id -> series), samples
//!   grouped by series, events.
//! - [`encode_frame`] writes one frame exactly as given; [`FrameEncoder`] is what the agent
//!   uses: it takes readings and events, assigns ids, decides when schema entries are due and
//!   cuts the batch into frames no larger than the MTU.
//! - [`decode`] checks the MAC before reading anything else, parses the frame and updates a
//!   [`ReceiverState`] (per-node schema, sequence gaps = lost frames).

mod encoder;
mod prim;

use std::{
    collections::{BTreeSet, HashMap},
    fmt,
    io::Read as _,
    path::{Path, PathBuf},
};

use crate::metrics::{Kind, Labels, Series};

pub use encoder::{EncoderConfig, EncoderStats, FrameEncoder, WireCost, measure, measure_with};
use prim::{Order, Reader, put_str, put_varint, unzigzag, zigzag};

/// First bytes of every frame.
pub const MAGIC: [u8; 4] = *b"RSWF";
/// The format version this module writes and reads.
pub const VERSION: u8 = 1;
/// Bytes of MAC at the end of every frame.
pub const MAC_LEN: usize = 16;
/// Default largest frame, MAC included: fits a 1500-byte Ethernet MTU with IPv6 and UDP headers.
pub const DEFAULT_MTU: usize = 1400;
/// Most samples one frame may carry (a bound for the decoder: a constant series costs a few
/// bytes for any number of samples).
pub const MAX_FRAME_SAMPLES: usize = 1 << 16;
/// Smallest possible frame: header with an empty node name and no sections, plus the MAC.
pub const MIN_FRAME_LEN: usize = 4 + 1 + 1 + 1 + 4 + 1 + 8 + 1 + MAC_LEN;

const FLAG_SCHEMA: u8 = 1;
const FLAG_SAMPLES: u8 = 2;
const FLAG_EVENTS: u8 = 4;

/// Errors of encoding or decoding a frame. Decoding errors name the byte offset in the frame.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum WireError {
    #[error("frame of {len} bytes is shorter than the smallest frame ({MIN_FRAME_LEN} bytes)")]
    TooShort { len: usize },
    #[error("frame of {len} bytes: MAC mismatch (wrong key, or corrupted in transit)")]
    BadMac { len: usize },
    #[error("frame does not start with the railscope magic \"RSWF\"")]
    BadMagic,
    #[error("frame has format version {0}, this build reads version {VERSION}")]
    UnsupportedVersion(u8),
    #[error("frame truncated in {what} at byte {offset}")]
    Truncated { what: &'static str, offset: usize },
    #[error("frame malformed: invalid {what} at byte {offset}")]
    Malformed { what: &'static str, offset: usize },
    #[error("frame from node {node:?} seq {seq} was already received (duplicate or replay)")]
    Duplicate { node: String, seq: u64 },
    #[error("frame from node {node:?} seq {seq} session {session:08x} is too old to be placed")]
    Stale {
        node: String,
        seq: u64,
        session: u32,
    },
    #[error("node name {node:?} is {len} bytes, the frame format allows 255")]
    NodeName { node: String, len: usize },
    #[error("time quantum must be at least 1 ns")]
    Quantum,
    #[error("MTU of {mtu} bytes is outside 256..=65507")]
    Mtu { mtu: usize },
    #[error("series {series}'s schema entry is {len} bytes, too large for a {mtu}-byte frame")]
    SeriesTooLarge {
        series: String,
        len: usize,
        mtu: usize,
    },
    #[error("series {series}: gauge interval starts at {start} ns, after its end at {end} ns")]
    Interval {
        series: String,
        start: u64,
        end: u64,
    },
    #[error("series {series} is a {kind:?} but was given a {given} sample")]
    KindMismatch {
        series: String,
        kind: Kind,
        given: &'static str,
    },
    #[error("counter {series} was given {value}, not a non-negative integer")]
    CounterValue { series: String, value: f64 },
    #[error("frame would carry {count} {what}, more than {MAX_FRAME_SAMPLES}")]
    TooMany { what: &'static str, count: usize },
}

/// Errors of loading the pre-shared key.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read key file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("key file {path}: expected 32 raw bytes or 64 hex characters, found {len} bytes")]
    Length { path: PathBuf, len: usize },
    #[error("key file {path}: 64 characters but not all hex digits")]
    Hex { path: PathBuf },
}

/// The pre-shared key of a cluster: 32 bytes, used as the BLAKE3 key of the frame MAC.
#[derive(Clone, PartialEq, Eq)]
pub struct Key([u8; 32]);

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(..)")
    }
}

impl Key {
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// Reads a key file: exactly 32 raw bytes, or 64 hex characters (a trailing newline or
    /// other trailing whitespace is fine). Errors name the file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, KeyError> {
        let path = path.as_ref();
        // A key file is tiny: read at most a little more than the longest valid one, so a
        // wrong path (a device, a log) is an error and not a hang.
        let mut contents = Vec::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(256).read_to_end(&mut contents))
            .map_err(|source| KeyError::Read {
                path: path.to_owned(),
                source,
            })?;
        let key = Self::parse(&contents, path)?;
        warn_if_readable_by_others(path);
        Ok(key)
    }

    fn parse(contents: &[u8], path: &Path) -> Result<Self, KeyError> {
        if let Ok(raw) = <[u8; 32]>::try_from(contents) {
            return Ok(Self(raw));
        }
        let text = contents.trim_ascii_end();
        if text.len() != 64 {
            return Err(KeyError::Length {
                path: path.to_owned(),
                len: contents.len(),
            });
        }
        let mut key = [0u8; 32];
        for (byte, pair) in key.iter_mut().zip(text.chunks_exact(2)) {
            let hex = |c: u8| (c as char).to_digit(16);
            match (hex(pair[0]), hex(pair[1])) {
                (Some(hi), Some(lo)) => *byte = (hi * 16 + lo) as u8,
                _ => {
                    return Err(KeyError::Hex {
                        path: path.to_owned(),
                    });
                }
            }
        }
        Ok(Self(key))
    }

    fn mac(&self, body: &[u8]) -> [u8; MAC_LEN] {
        let mut mac = [0u8; MAC_LEN];
        mac.copy_from_slice(&blake3::keyed_hash(&self.0, body).as_bytes()[..MAC_LEN]);
        mac
    }
}

fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(
            "key file {} is readable by group or others (mode {:o}); chmod 600 it",
            path.display(),
            meta.permissions().mode() & 0o777
        );
    }
}

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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
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
    pub events: Vec<Event>,
}

impl Frame {
    pub fn sample_count(&self) -> usize {
        self.samples.iter().map(|s| s.data.len()).sum()
    }
}

/// Writes `frame` as one datagram, MAC included. Sample times are rounded to the frame's
/// time quantum; everything else round-trips exactly (floats bit for bit). Size is not
/// limited here: [`FrameEncoder`] is what keeps frames within an MTU.
pub fn encode_frame(frame: &Frame, key: &Key) -> Result<Vec<u8>, WireError> {
    let view = FrameView {
        node: &frame.node,
        session: frame.session,
        seq: frame.seq,
        send_unix_ns: frame.send_unix_ns,
        time_quantum_ns: frame.time_quantum_ns,
        schema: frame.schema.iter().map(|e| (e.id, &e.series)).collect(),
        samples: frame.samples.iter().collect(),
        events: frame.events.iter().collect(),
    };
    Ok(view.encode(key)?.bytes)
}

/// A frame to encode, by reference (the encoder tries several cuts of one batch).
struct FrameView<'a> {
    node: &'a str,
    session: u32,
    seq: u64,
    send_unix_ns: u64,
    time_quantum_ns: u64,
    schema: Vec<(u32, &'a Series)>,
    samples: Vec<&'a SeriesSamples>,
    events: Vec<&'a Event>,
}

struct Encoded {
    bytes: Vec<u8>,
    /// Bytes of the schema section, its length prefix included.
    schema_bytes: usize,
}

impl FrameView<'_> {
    fn encode(&self, key: &Key) -> Result<Encoded, WireError> {
        if self.node.len() > 255 {
            return Err(WireError::NodeName {
                node: self.node.to_owned(),
                len: self.node.len(),
            });
        }
        if self.time_quantum_ns == 0 {
            return Err(WireError::Quantum);
        }
        if self.schema.len() > MAX_FRAME_SAMPLES {
            return Err(WireError::TooMany {
                what: "schema entries",
                count: self.schema.len(),
            });
        }
        let mut flags = 0;
        let schema = (!self.schema.is_empty()).then(|| encode_schema(&self.schema));
        let samples = (!self.samples.is_empty())
            .then(|| encode_samples(&self.samples, self.send_unix_ns, self.time_quantum_ns))
            .transpose()?;
        let events =
            (!self.events.is_empty()).then(|| encode_events(&self.events, self.send_unix_ns));
        flags |= if schema.is_some() { FLAG_SCHEMA } else { 0 };
        flags |= if samples.is_some() { FLAG_SAMPLES } else { 0 };
        flags |= if events.is_some() { FLAG_EVENTS } else { 0 };

        let mut out = Vec::with_capacity(DEFAULT_MTU);
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.push(flags);
        out.push(self.node.len() as u8);
        out.extend_from_slice(self.node.as_bytes());
        out.extend_from_slice(&self.session.to_le_bytes());
        put_varint(&mut out, self.seq);
        out.extend_from_slice(&self.send_unix_ns.to_le_bytes());
        put_varint(&mut out, self.time_quantum_ns);
        let mut schema_bytes = 0;
        for (i, section) in [schema, samples, events].into_iter().enumerate() {
            if let Some(body) = section {
                let start = out.len();
                put_varint(&mut out, body.len() as u64);
                out.extend_from_slice(&body);
                if i == 0 {
                    schema_bytes = out.len() - start;
                }
            }
        }
        let mac = key.mac(&out);
        out.extend_from_slice(&mac);
        Ok(Encoded {
            bytes: out,
            schema_bytes,
        })
    }
}

/// A block's id relative to the expected one (the previous block's plus one, 0 for the
/// first), zig-zag coded; `None` when it is the expected one and need not be written.
fn id_gap(id: u32, expected: i64) -> Option<u64> {
    let gap = i64::from(id) - expected;
    (gap != 0).then(|| zigzag(gap))
}

fn read_id(r: &mut Reader<'_>, explicit: bool, expected: i64) -> Result<u32, WireError> {
    if !explicit {
        return u32::try_from(expected).map_err(|_| r.malformed("series id"));
    }
    let offset = r.offset();
    let gap = unzigzag(r.varint("series id")?);
    expected
        .checked_add(gap)
        .and_then(|id| u32::try_from(id).ok())
        .ok_or(WireError::Malformed {
            what: "series id",
            offset,
        })
}

/// Schema section: a string table (sorted, front-coded), label sets, name groups (a list of
/// metric names with their kinds) and runs. A run gives consecutive ids to one label set
/// crossed with one group: the 40 series of a GPU are one run, and the other GPUs' runs
/// reuse the same group.
fn encode_schema(entries: &[(u32, &Series)]) -> Vec<u8> {
    let mut strings = BTreeSet::new();
    for (_, series) in entries {
        strings.insert(&*series.name);
        for (k, v) in series.labels.iter() {
            strings.insert(k);
            strings.insert(v);
        }
    }
    let mut out = Vec::new();
    put_varint(&mut out, strings.len() as u64);
    let mut prev: &[u8] = &[];
    for s in &strings {
        let s = s.as_bytes();
        let shared = prev.iter().zip(s).take_while(|(a, b)| a == b).count();
        put_varint(&mut out, shared as u64);
        put_varint(&mut out, (s.len() - shared) as u64);
        out.extend_from_slice(&s[shared..]);
        prev = s;
    }
    let index: HashMap<&str, u64> = strings
        .iter()
        .enumerate()
        .map(|(i, s)| (*s, i as u64))
        .collect();

    // Runs: maximal stretches of consecutive ids with one label set.
    let mut runs: Vec<&[(u32, &Series)]> = Vec::new();
    let mut start = 0;
    for i in 1..=entries.len() {
        let ends = i == entries.len()
            || entries[i - 1].0.checked_add(1) != Some(entries[i].0)
            || entries[i].1.labels != entries[i - 1].1.labels;
        if ends {
            runs.push(&entries[start..i]);
            start = i;
        }
    }
    let mut label_sets: Vec<&Labels> = Vec::new();
    let mut label_set_index: HashMap<&Labels, u64> = HashMap::new();
    let mut groups: Vec<Vec<u64>> = Vec::new();
    let mut group_index: HashMap<Vec<u64>, u64> = HashMap::new();
    let mut run_refs = Vec::with_capacity(runs.len());
    for run in &runs {
        let labels = &run[0].1.labels;
        let l = *label_set_index.entry(labels).or_insert_with(|| {
            label_sets.push(labels);
            label_sets.len() as u64 - 1
        });
        let group: Vec<u64> = run
            .iter()
            .map(|(_, s)| index[&*s.name] << 1 | u64::from(s.kind == Kind::Gauge))
            .collect();
        let g = *group_index.entry(group.clone()).or_insert_with(|| {
            groups.push(group);
            groups.len() as u64 - 1
        });
        run_refs.push((run[0].0, l, g));
    }
    put_varint(&mut out, label_sets.len() as u64);
    for labels in &label_sets {
        put_varint(&mut out, labels.iter().count() as u64);
        for (k, v) in labels.iter() {
            put_varint(&mut out, index[k]);
            put_varint(&mut out, index[v]);
        }
    }
    put_varint(&mut out, groups.len() as u64);
    for group in &groups {
        put_varint(&mut out, group.len() as u64);
        for &name in group {
            put_varint(&mut out, name);
        }
    }
    put_varint(&mut out, run_refs.len() as u64);
    let mut expected = 0i64;
    for ((first, l, g), run) in run_refs.into_iter().zip(&runs) {
        put_varint(&mut out, zigzag(i64::from(first) - expected));
        put_varint(&mut out, l);
        put_varint(&mut out, g);
        expected = i64::from(first) + run.len() as i64;
    }
    out
}

fn parse_schema(r: &mut Reader<'_>) -> Result<Vec<SchemaEntry>, WireError> {
    const STRING: &str = "schema string";
    let n = r.count("schema string count")?;
    let mut strings: Vec<String> = Vec::new();
    let mut prev: Vec<u8> = Vec::new();
    for _ in 0..n {
        let offset = r.offset();
        let shared = r.varint(STRING)?;
        if shared > prev.len() as u64 {
            return Err(r.malformed(STRING));
        }
        let len = r.count(STRING)?;
        let mut s = prev[..shared as usize].to_vec();
        s.extend_from_slice(r.bytes(len, STRING)?);
        let text = String::from_utf8(s.clone()).map_err(|_| WireError::Malformed {
            what: STRING,
            offset,
        })?;
        strings.push(text);
        prev = s;
    }
    let index = |r: &mut Reader<'_>, len: usize, what: &'static str| -> Result<usize, WireError> {
        let offset = r.offset();
        usize::try_from(r.varint(what)?)
            .ok()
            .filter(|&i| i < len)
            .ok_or(WireError::Malformed { what, offset })
    };
    let n = r.count("label set count")?;
    let mut label_sets = Vec::new();
    for _ in 0..n {
        let pairs = r.count("label count")?;
        let mut labels = Vec::new();
        for _ in 0..pairs {
            let k = index(r, strings.len(), "label string index")?;
            let v = index(r, strings.len(), "label string index")?;
            labels.push((strings[k].clone(), strings[v].clone()));
        }
        label_sets.push(Labels::new(labels));
    }
    let n = r.count("name group count")?;
    let mut groups = Vec::new();
    for _ in 0..n {
        let len = r.count("name group length")?;
        let mut group = Vec::new();
        for _ in 0..len {
            let offset = r.offset();
            let code = r.varint("name group entry")?;
            let name = usize::try_from(code >> 1)
                .ok()
                .filter(|&i| i < strings.len())
                .ok_or(WireError::Malformed {
                    what: "name group entry",
                    offset,
                })?;
            let kind = if code & 1 != 0 {
                Kind::Gauge
            } else {
                Kind::Counter
            };
            group.push((name, kind));
        }
        groups.push(group);
    }
    let n = r.count("schema run count")?;
    let mut entries: Vec<SchemaEntry> = Vec::new();
    let mut expected = 0i64;
    for _ in 0..n {
        let offset = r.offset();
        let first = expected.wrapping_add(unzigzag(r.varint("schema run id")?));
        let labels = &label_sets[index(r, label_sets.len(), "label set index")?];
        let group = &groups[index(r, groups.len(), "name group index")?];
        let last = first.checked_add(group.len() as i64 - 1);
        if first < 0 || last.is_none_or(|l| l > i64::from(u32::MAX)) {
            return Err(WireError::Malformed {
                what: "schema run id",
                offset,
            });
        }
        if entries.len() + group.len() > MAX_FRAME_SAMPLES {
            return Err(r.malformed("schema entry count"));
        }
        for (i, &(name, kind)) in group.iter().enumerate() {
            entries.push(SchemaEntry {
                id: (first + i as i64) as u32,
                series: Series {
                    name: strings[name].as_str().into(),
                    labels: labels.clone(),
                    kind,
                },
            });
        }
        expected = first + group.len() as i64;
    }
    r.finish("schema section length")?;
    Ok(entries)
}

/// Rounds `t` to the nearest multiple of `q` that still fits in a u64.
fn quantize(t: u64, q: u64) -> u64 {
    let (d, rem) = (t / q, t % q);
    if rem >= q - rem && d < u64::MAX / q {
        d + 1
    } else {
        d
    }
}

// Block header bits.
const GAUGE: u8 = 0x01;
const EXPLICIT_ID: u8 = 0x02;
const NEW_PATTERN: u8 = 0x04;
const ORDER_SHIFT: u8 = 3;
const CODER_SHIFT: u8 = 5;
/// Integers (counters; gauges: decimals with k = 0, single readings).
const CODER_INT: u8 = 0;
/// Gauges: f64 bits (order Const: one 8-byte value, Raw: XOR), single readings.
const CODER_FLOAT: u8 = 1;
/// Gauges: an extension byte follows (decimal digits, float, envelopes).
const CODER_EXT: u8 = 2;
// Extension byte bits (low nibble: decimal digits k).
const EXT_FLOAT: u8 = 0x10;
const EXT_ENVELOPES: u8 = 0x20;

/// A block's bytes after its id: header bits (without the id and pattern bits), its time
/// indices and its body (from the extension byte on).
struct Block {
    header: u8,
    times: Vec<u32>,
    body: Vec<u8>,
}

fn encode_samples(samples: &[&SeriesSamples], send_ns: u64, q: u64) -> Result<Vec<u8>, WireError> {
    let count: usize = samples.iter().map(|s| s.data.len()).sum();
    if count > MAX_FRAME_SAMPLES {
        return Err(WireError::TooMany {
            what: "samples",
            count,
        });
    }
    // Times table: every distinct (quantized) sample time of the frame, ascending.
    let mut table: Vec<u64> = Vec::with_capacity(count);
    for s in samples {
        match &s.data {
            SeriesData::Counter(v) => table.extend(v.iter().map(|c| quantize(c.unix_ns, q))),
            SeriesData::Gauge(v) => table.extend(v.iter().map(|g| quantize(g.end_unix_ns, q))),
        }
    }
    table.sort_unstable();
    table.dedup();
    let index = |t: u64| table.binary_search(&t).expect("time in table") as u32;

    let mut blocks = Vec::with_capacity(samples.len());
    for s in samples {
        blocks.push(match &s.data {
            SeriesData::Counter(v) => encode_counter_block(v, q, index),
            SeriesData::Gauge(v) => encode_gauge_block(s.id, v, q, index)?,
        });
    }
    let mut patterns: Vec<&[u32]> = Vec::new();
    let mut pattern_index: HashMap<&[u32], u64> = HashMap::new();
    let block_patterns: Vec<u64> = blocks
        .iter()
        .map(|b| {
            *pattern_index.entry(&b.times).or_insert_with(|| {
                patterns.push(&b.times);
                patterns.len() as u64 - 1
            })
        })
        .collect();

    let mut out = Vec::new();
    put_time_table(&mut out, &table, send_ns / q);
    put_varint(&mut out, patterns.len() as u64);
    for p in &patterns {
        put_pattern(&mut out, p);
    }
    put_varint(&mut out, blocks.len() as u64);
    let mut expected = 0i64;
    let mut prev_pattern = None;
    for ((s, block), pattern) in samples.iter().zip(&blocks).zip(block_patterns) {
        let gap = id_gap(s.id, expected);
        let new_pattern = prev_pattern != Some(pattern);
        let mut header = block.header;
        header |= if gap.is_some() { EXPLICIT_ID } else { 0 };
        header |= if new_pattern { NEW_PATTERN } else { 0 };
        out.push(header);
        if let Some(gap) = gap {
            put_varint(&mut out, gap);
        }
        if new_pattern {
            put_varint(&mut out, pattern);
        }
        out.extend_from_slice(&block.body);
        expected = i64::from(s.id) + 1;
        prev_pattern = Some(pattern);
    }
    Ok(out)
}

fn encode_counter_block(samples: &[CounterSample], q: u64, index: impl Fn(u64) -> u32) -> Block {
    let times = samples
        .iter()
        .map(|c| index(quantize(c.unix_ns, q)))
        .collect();
    let values: Vec<u64> = samples.iter().map(|c| c.value).collect();
    let (order, _) = prim::best_int_order(&values, false);
    let mut body = Vec::new();
    prim::put_ints(&mut body, &values, false, order);
    Block {
        header: (order as u8) << ORDER_SHIFT,
        times,
        body,
    }
}

fn encode_gauge_block(
    id: u32,
    samples: &[GaugeSample],
    q: u64,
    index: impl Fn(u64) -> u32,
) -> Result<Block, WireError> {
    let mut times = Vec::with_capacity(samples.len());
    let mut durations = Vec::with_capacity(samples.len());
    let mut values = Vec::with_capacity(samples.len());
    let mut spread = vec![0u8; samples.len().div_ceil(8)];
    for (i, g) in samples.iter().enumerate() {
        let (start, end) = (quantize(g.start_unix_ns, q), quantize(g.end_unix_ns, q));
        if g.start_unix_ns > g.end_unix_ns {
            return Err(WireError::Interval {
                series: format!("id {id}"),
                start: g.start_unix_ns,
                end: g.end_unix_ns,
            });
        }
        times.push(index(end));
        durations.push(end - start);
        if g.is_single_value() {
            values.push(g.mean);
        } else {
            spread[i / 8] |= 1 << (i % 8);
            values.extend([g.min, g.max, g.mean]);
        }
    }
    let envelopes = durations.iter().any(|&d| d != 0) || spread.iter().any(|&b| b != 0);
    // Decimal integers or raw float bits, whichever is smaller (an extension byte counted
    // where one is needed).
    let decimal = prim::decimal_scale(&values).map(|(k, ints)| {
        let (order, size) = prim::best_int_order(&ints, true);
        (k, ints, order, size + usize::from(k > 0 || envelopes))
    });
    let float = if values.windows(2).all(|w| w[0].to_bits() == w[1].to_bits()) {
        (Order::Const, 8)
    } else {
        (Order::Raw, prim::xor_size(&values))
    };
    let float_size = float.1 + usize::from(envelopes);
    let decimal = decimal.filter(|d| d.3 <= float_size);

    let mut body = Vec::new();
    let order = decimal.as_ref().map_or(float.0, |d| d.2);
    let mut header = GAUGE | (order as u8) << ORDER_SHIFT;
    let ext = match &decimal {
        Some((k, ..)) => *k,
        None => EXT_FLOAT,
    } | if envelopes { EXT_ENVELOPES } else { 0 };
    header |= match ext {
        0 => CODER_INT,
        EXT_FLOAT => CODER_FLOAT,
        _ => {
            body.push(ext);
            CODER_EXT
        }
    } << CODER_SHIFT;
    if envelopes {
        for d in durations {
            put_varint(&mut body, d);
        }
        body.extend_from_slice(&spread);
    }
    match &decimal {
        Some((_, ints, order, _)) => prim::put_ints(&mut body, ints, true, *order),
        None if float.0 == Order::Const => {
            if let Some(v) = values.first() {
                body.extend_from_slice(&v.to_bits().to_le_bytes());
            }
        }
        None => prim::put_xor(&mut body, &values),
    }
    Ok(Block {
        header,
        times,
        body,
    })
}

/// Time table: count, first time relative to the send time, then either deltas or deltas of
/// deltas (whichever is smaller), all in quanta.
fn put_time_table(out: &mut Vec<u8>, table: &[u64], send_q: u64) {
    put_varint(out, table.len() as u64);
    let Some(&t0) = table.first() else {
        return;
    };
    put_varint(out, zigzag(send_q.wrapping_sub(t0) as i64));
    if table.len() < 2 {
        return;
    }
    let deltas: Vec<u64> = table.windows(2).map(|w| w[1] - w[0]).collect();
    let delta_codes: Vec<u64> = deltas.iter().map(|d| d - 1).collect();
    let mut dod_codes = vec![deltas[0] - 1];
    dod_codes.extend(
        deltas
            .windows(2)
            .map(|w| zigzag(w[1].wrapping_sub(w[0]) as i64)),
    );
    let size = |c: &[u64]| c.iter().map(|&v| prim::varint_len(v)).sum::<usize>();
    let (mode, codes) = if size(&dod_codes) < size(&delta_codes) {
        (1u8, dod_codes)
    } else {
        (0u8, delta_codes)
    };
    out.push(mode);
    for c in codes {
        put_varint(out, c);
    }
}

fn parse_time_table(r: &mut Reader<'_>, send_q: u64, q: u64) -> Result<Vec<u64>, WireError> {
    const WHAT: &str = "time table";
    let m = r.count("time table length")?;
    let mut table = Vec::new();
    if m == 0 {
        return Ok(table);
    }
    let max = u64::MAX / q;
    let t0 = send_q.wrapping_sub(unzigzag(r.varint(WHAT)?) as u64);
    if t0 > max {
        return Err(r.malformed(WHAT));
    }
    table.push(t0);
    if m == 1 {
        return Ok(table);
    }
    let mode = r.u8("time table mode")?;
    if mode > 1 {
        return Err(r.malformed("time table mode"));
    }
    let mut prev = t0;
    let mut delta = 0u64;
    for i in 1..m {
        let c = r.varint(WHAT)?;
        delta = if mode == 0 || i == 1 {
            c.checked_add(1).ok_or_else(|| r.malformed(WHAT))?
        } else {
            delta.wrapping_add(unzigzag(c) as u64)
        };
        let t = prev
            .checked_add(delta)
            .filter(|&t| delta >= 1 && t <= max)
            .ok_or_else(|| r.malformed(WHAT))?;
        table.push(t);
        prev = t;
    }
    Ok(table)
}

/// A pattern: the time indices of one block's samples. Regular ones (a fixed stride, such
/// as every sweep) cost 3 bytes whatever their length.
fn put_pattern(out: &mut Vec<u8>, times: &[u32]) {
    put_varint(out, times.len() as u64);
    let Some(&first) = times.first() else {
        return;
    };
    put_varint(out, u64::from(first));
    if times.len() < 2 {
        return;
    }
    let deltas: Vec<i64> = times
        .windows(2)
        .map(|w| i64::from(w[1]) - i64::from(w[0]))
        .collect();
    if deltas.iter().all(|&d| d == deltas[0]) {
        put_varint(out, zigzag(deltas[0]) + 1);
    } else {
        put_varint(out, 0);
        for d in deltas {
            put_varint(out, zigzag(d));
        }
    }
}

fn parse_pattern(r: &mut Reader<'_>, m: usize, budget: &mut usize) -> Result<Vec<u32>, WireError> {
    const WHAT: &str = "time pattern";
    let offset = r.offset();
    let n = r.varint(WHAT)?;
    if n > *budget as u64 {
        return Err(WireError::Malformed { what: WHAT, offset });
    }
    let n = n as usize;
    *budget -= n;
    let mut times = Vec::with_capacity(n);
    if n == 0 {
        return Ok(times);
    }
    let check = |r: &Reader<'_>, i: i64| -> Result<u32, WireError> {
        if (0..m as i64).contains(&i) {
            Ok(i as u32)
        } else {
            Err(r.malformed("time index"))
        }
    };
    let first = r.varint(WHAT)?;
    let mut prev = check(r, i64::try_from(first).unwrap_or(-1))?;
    times.push(prev);
    if n == 1 {
        return Ok(times);
    }
    let stride = r.varint(WHAT)?;
    for _ in 1..n {
        let d = if stride == 0 {
            unzigzag(r.varint(WHAT)?)
        } else {
            unzigzag(stride - 1)
        };
        prev = check(r, i64::from(prev).saturating_add(d))?;
        times.push(prev);
    }
    Ok(times)
}

fn parse_samples(
    r: &mut Reader<'_>,
    send_ns: u64,
    q: u64,
) -> Result<Vec<SeriesSamples>, WireError> {
    let table = parse_time_table(r, send_ns / q, q)?;
    let n_patterns = r.count("pattern count")?;
    let mut budget = MAX_FRAME_SAMPLES;
    let mut patterns = Vec::new();
    for _ in 0..n_patterns {
        patterns.push(parse_pattern(r, table.len(), &mut budget)?);
    }
    let n_blocks = r.count("block count")?;
    let mut budget = MAX_FRAME_SAMPLES;
    let mut out = Vec::new();
    let mut expected = 0i64;
    let mut pattern: Option<&Vec<u32>> = None;
    for _ in 0..n_blocks {
        let header = r.u8("block header")?;
        if header & 0x80 != 0 {
            return Err(r.malformed("block header"));
        }
        let id = read_id(r, header & EXPLICIT_ID != 0, expected)?;
        if header & NEW_PATTERN != 0 {
            let offset = r.offset();
            pattern = Some(
                usize::try_from(r.varint("pattern index")?)
                    .ok()
                    .and_then(|p| patterns.get(p))
                    .ok_or(WireError::Malformed {
                        what: "pattern index",
                        offset,
                    })?,
            );
        }
        let pattern = pattern.ok_or_else(|| r.malformed("block without a pattern"))?;
        if pattern.len() > budget {
            return Err(r.malformed("sample count"));
        }
        budget -= pattern.len();
        let times = pattern.iter().map(|&i| table[i as usize]);
        let order = Order::from_bits(header >> ORDER_SHIFT);
        let coder = (header >> CODER_SHIFT) & 3;
        let data = if header & GAUGE == 0 {
            if coder != CODER_INT {
                return Err(r.malformed("counter block header"));
            }
            let values = prim::get_ints(r, pattern.len(), false, order)?;
            SeriesData::Counter(
                times
                    .zip(values)
                    .map(|(t, value)| CounterSample {
                        unix_ns: t * q,
                        value,
                    })
                    .collect(),
            )
        } else {
            let ext = match coder {
                CODER_INT => 0,
                CODER_FLOAT => EXT_FLOAT,
                CODER_EXT => r.u8("block extension")?,
                _ => return Err(r.malformed("block coder")),
            };
            SeriesData::Gauge(parse_gauge_body(r, ext, order, times, q)?)
        };
        out.push(SeriesSamples { id, data });
        expected = i64::from(id) + 1;
    }
    Ok(out)
}

fn parse_gauge_body(
    r: &mut Reader<'_>,
    ext: u8,
    order: Order,
    times: impl ExactSizeIterator<Item = u64>,
    q: u64,
) -> Result<Vec<GaugeSample>, WireError> {
    let n = times.len();
    let k = ext & 0x0f;
    if ext & 0xc0 != 0 || (ext & EXT_FLOAT != 0 && k != 0) || k > prim::MAX_DECIMALS {
        return Err(r.malformed("block extension"));
    }
    let mut durations = vec![0u64; n];
    let mut spread = vec![0u8; n.div_ceil(8)];
    if ext & EXT_ENVELOPES != 0 {
        for d in &mut durations {
            *d = r.varint("gauge interval")?;
        }
        let len = spread.len();
        spread.copy_from_slice(r.bytes(len, "gauge envelope flags")?);
        if !n.is_multiple_of(8) && spread.last().is_some_and(|b| b >> (n % 8) != 0) {
            return Err(r.malformed("gauge envelope flags"));
        }
    }
    let is_spread = |i: usize| spread[i / 8] & (1 << (i % 8)) != 0;
    let n_values = n + 2 * (0..n).filter(|&i| is_spread(i)).count();
    let values: Vec<f64> = if ext & EXT_FLOAT == 0 {
        let p = prim::pow10(k);
        prim::get_ints(r, n_values, true, order)?
            .into_iter()
            .map(|i| i as i64 as f64 / p)
            .collect()
    } else {
        match order {
            Order::Const => {
                let v = if n_values > 0 {
                    f64::from_bits(r.u64_le("gauge value")?)
                } else {
                    0.0
                };
                vec![v; n_values]
            }
            Order::Raw => prim::get_xor(r, n_values)?,
            _ => return Err(r.malformed("float coder order")),
        }
    };
    let mut values = values.into_iter();
    let mut out = Vec::with_capacity(n);
    for (i, end) in times.enumerate() {
        let start = end
            .checked_sub(durations[i])
            .ok_or_else(|| r.malformed("gauge interval"))?;
        let mut next = || values.next().unwrap_or_default();
        let (min, max, mean) = if is_spread(i) {
            (next(), next(), next())
        } else {
            let v = next();
            (v, v, v)
        };
        out.push(GaugeSample {
            start_unix_ns: start * q,
            end_unix_ns: end * q,
            min,
            max,
            mean,
        });
    }
    Ok(out)
}

fn encode_events(events: &[&Event], send_ns: u64) -> Vec<u8> {
    let mut out = Vec::new();
    put_varint(&mut out, events.len() as u64);
    for e in events {
        put_event(&mut out, e, send_ns);
    }
    out
}

fn put_event(out: &mut Vec<u8>, e: &Event, send_ns: u64) {
    put_varint(out, send_ns.wrapping_sub(e.unix_ns));
    put_str(out, &e.kind);
    put_varint(out, e.labels.iter().count() as u64);
    for (k, v) in e.labels.iter() {
        put_str(out, k);
        put_str(out, v);
    }
    put_varint(out, zigzag(e.code));
    put_str(out, &e.text);
}

fn parse_events(r: &mut Reader<'_>, send_ns: u64) -> Result<Vec<Event>, WireError> {
    let n = r.count("event count")?;
    let mut events = Vec::new();
    for _ in 0..n {
        let unix_ns = send_ns.wrapping_sub(r.varint("event time")?);
        let kind = r.str("event kind")?;
        let n_labels = r.count("event label count")?;
        let mut pairs = Vec::new();
        for _ in 0..n_labels {
            pairs.push((r.str("event label")?, r.str("event label")?));
        }
        let code = unzigzag(r.varint("event code")?);
        let text = r.str("event text")?;
        events.push(Event {
            unix_ns,
            kind,
            labels: Labels::new(pairs),
            code,
            text,
        });
    }
    r.finish("events section length")?;
    Ok(events)
}

/// Checks the MAC and returns the authenticated bytes (everything before it).
fn verify<'a>(bytes: &'a [u8], key: &Key) -> Result<&'a [u8], WireError> {
    verify_at_least(bytes, key, MIN_FRAME_LEN)
}

fn verify_at_least<'a>(bytes: &'a [u8], key: &Key, min: usize) -> Result<&'a [u8], WireError> {
    let len = bytes.len();
    if len < min {
        return Err(WireError::TooShort { len });
    }
    let (body, tag) = bytes.split_at(len - MAC_LEN);
    let expected = key.mac(body);
    // Constant time: the comparison does not stop at the first differing byte.
    let diff = expected
        .iter()
        .zip(tag)
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    if diff != 0 {
        return Err(WireError::BadMac { len });
    }
    Ok(body)
}

/// The next section (length-prefixed) if its flag is set.
fn section<'a>(
    r: &mut Reader<'a>,
    present: u8,
    what: &'static str,
) -> Result<Option<Reader<'a>>, WireError> {
    if present == 0 {
        return Ok(None);
    }
    let len = r.count(what)?;
    r.sub(len, what).map(Some)
}

/// The magic and version every datagram starts with (frames and schema requests differ only
/// in their magic).
fn read_header(r: &mut Reader<'_>, magic: [u8; 4]) -> Result<(), WireError> {
    if r.bytes(4, "magic")? != magic {
        return Err(WireError::BadMagic);
    }
    let version = r.u8("version")?;
    if version != VERSION {
        return Err(WireError::UnsupportedVersion(version));
    }
    Ok(())
}

/// Parses authenticated bytes (the frame without its MAC).
fn parse(body: &[u8]) -> Result<Frame, WireError> {
    let mut r = Reader::new(body, 0);
    read_header(&mut r, MAGIC)?;
    let flags = r.u8("flags")?;
    if flags & !(FLAG_SCHEMA | FLAG_SAMPLES | FLAG_EVENTS) != 0 {
        return Err(r.malformed("flags"));
    }
    let node_len = usize::from(r.u8("node name")?);
    let offset = r.offset();
    let node = String::from_utf8(r.bytes(node_len, "node name")?.to_vec()).map_err(|_| {
        WireError::Malformed {
            what: "node name",
            offset,
        }
    })?;
    let session = r.u32_le("session")?;
    let seq = r.varint("sequence number")?;
    let send_unix_ns = r.u64_le("send time")?;
    let time_quantum_ns = r.varint("time quantum")?;
    if time_quantum_ns == 0 {
        return Err(r.malformed("time quantum"));
    }
    let schema = match section(&mut r, flags & FLAG_SCHEMA, "schema section")? {
        Some(mut s) => parse_schema(&mut s)?,
        None => Vec::new(),
    };
    let samples = match section(&mut r, flags & FLAG_SAMPLES, "samples section")? {
        Some(mut s) => {
            let samples = parse_samples(&mut s, send_unix_ns, time_quantum_ns)?;
            s.finish("samples section length")?;
            samples
        }
        None => Vec::new(),
    };
    let events = match section(&mut r, flags & FLAG_EVENTS, "events section")? {
        Some(mut s) => parse_events(&mut s, send_unix_ns)?,
        None => Vec::new(),
    };
    r.finish("frame length")?;
    Ok(Frame {
        node,
        session,
        seq,
        send_unix_ns,
        time_quantum_ns,
        schema,
        samples,
        events,
    })
}

/// Verifies, parses and accounts one received datagram: the MAC is checked before anything
/// else is read; then the frame's schema entries are merged into `state`, and its sequence
/// number is checked against the node's (gaps are counted as lost frames, a frame seen
/// before is refused).
/// Magic of a schema request, the only message a collector sends back to an agent.
pub const REQUEST_MAGIC: [u8; 4] = *b"RSWQ";
/// The smallest schema request: magic, version, an empty node name, session, MAC.
pub const MIN_REQUEST_LEN: usize = 4 + 1 + 1 + 4 + MAC_LEN;

/// A collector's request to one agent session: "send every schema entry again". A collector
/// that restarted receives samples of ids it has no entry for; it asks, and the agent sends
/// the entries with its next flush, so schema refreshes can be rare (see
/// docs/wire-format.md, "Schema requests").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchemaRequest {
    pub node: String,
    pub session: u32,
}

/// Encodes a schema request, authenticated like a frame.
pub fn encode_schema_request(request: &SchemaRequest, key: &Key) -> Result<Vec<u8>, WireError> {
    let node = request.node.as_bytes();
    let Ok(node_len) = u8::try_from(node.len()) else {
        return Err(WireError::NodeName {
            node: request.node.clone(),
            len: node.len(),
        });
    };
    let mut out = Vec::with_capacity(MIN_REQUEST_LEN + node.len());
    out.extend_from_slice(&REQUEST_MAGIC);
    out.push(VERSION);
    out.push(node_len);
    out.extend_from_slice(node);
    out.extend_from_slice(&request.session.to_le_bytes());
    let mac = key.mac(&out);
    out.extend_from_slice(&mac);
    Ok(out)
}

/// Decodes a schema request: the MAC first, then the fields, all of them exactly.
pub fn decode_schema_request(bytes: &[u8], key: &Key) -> Result<SchemaRequest, WireError> {
    let body = verify_at_least(bytes, key, MIN_REQUEST_LEN)?;
    let mut r = Reader::new(body, 0);
    read_header(&mut r, REQUEST_MAGIC)?;
    let node_len = usize::from(r.u8("node name length")?);
    let offset = r.offset();
    let node = std::str::from_utf8(r.bytes(node_len, "node name")?)
        .map_err(|_| WireError::Malformed {
            what: "node name",
            offset,
        })?
        .to_owned();
    let session = u32::from_le_bytes(
        r.bytes(4, "session")?
            .try_into()
            .expect("4 bytes were read"),
    );
    r.finish("schema request")?;
    Ok(SchemaRequest { node, session })
}

pub fn decode(bytes: &[u8], key: &Key, state: &mut ReceiverState) -> Result<Frame, WireError> {
    let body = verify(bytes, key)?;
    let frame = parse(body)?;
    state.accept(&frame)?;
    Ok(frame)
}

/// What a receiver knows of each sending node.
#[derive(Debug, Default)]
pub struct ReceiverState {
    nodes: HashMap<String, NodeState>,
}

/// Sessions remembered per node after they end, so a replayed old frame cannot reset a node.
const RETIRED_SESSIONS: usize = 8;
/// How far back (in sequence numbers) a late frame is still placed.
const SEQ_WINDOW: u64 = 64;

#[derive(Debug)]
pub struct NodeState {
    session: u32,
    retired: Vec<u32>,
    schema: HashMap<u32, Series>,
    highest_seq: u64,
    /// Bit i: frame `highest_seq - i` was received.
    seen: u64,
    /// Frames accepted from this node (all sessions).
    pub frames: u64,
    /// Frames missing from the sequence (a late arrival is taken back off).
    pub lost: u64,
    /// Frames that arrived after a later one.
    pub late: u64,
    /// Samples whose series id had no schema entry yet: received but not attributable.
    pub unknown_samples: u64,
    /// Sessions seen (1 + sender restarts).
    pub sessions: u64,
    /// About the last accepted frame.
    pub last: LastFrame,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LastFrame {
    /// Frames missing just before it.
    pub lost_before: u64,
    /// Its samples with no schema entry known.
    pub unknown_samples: u64,
    /// It started a new session (the sender restarted).
    pub new_session: bool,
}

impl NodeState {
    fn new(frame: &Frame) -> Self {
        Self {
            session: frame.session,
            retired: Vec::new(),
            schema: HashMap::new(),
            highest_seq: frame.seq,
            seen: 1,
            frames: 0,
            lost: 0,
            late: 0,
            unknown_samples: 0,
            sessions: 1,
            last: LastFrame {
                new_session: true,
                ..LastFrame::default()
            },
        }
    }

    pub fn session(&self) -> u32 {
        self.session
    }

    /// The series an id stands for in the current session, once its entry was received.
    pub fn series(&self, id: u32) -> Option<&Series> {
        self.schema.get(&id)
    }

    pub fn known_series(&self) -> usize {
        self.schema.len()
    }
}

impl ReceiverState {
    pub fn node(&self, name: &str) -> Option<&NodeState> {
        self.nodes.get(name)
    }

    pub fn nodes(&self) -> impl Iterator<Item = (&str, &NodeState)> {
        self.nodes.iter().map(|(k, v)| (k.as_str(), v))
    }

    fn accept(&mut self, frame: &Frame) -> Result<(), WireError> {
        let node = match self.nodes.get_mut(&frame.node) {
            Some(node) => node,
            None => self
                .nodes
                .entry(frame.node.clone())
                .or_insert_with(|| NodeState::new(frame)),
        };
        let mut last = LastFrame::default();
        if node.session != frame.session {
            if node.retired.contains(&frame.session) {
                return Err(WireError::Stale {
                    node: frame.node.clone(),
                    seq: frame.seq,
                    session: frame.session,
                });
            }
            tracing::info!(
                "node {:?} started session {:08x} (was {:08x}): its series ids start over",
                frame.node,
                frame.session,
                node.session
            );
            if node.retired.len() == RETIRED_SESSIONS {
                node.retired.remove(0);
            }
            node.retired.push(node.session);
            node.session = frame.session;
            node.schema.clear();
            node.highest_seq = frame.seq;
            node.seen = 1;
            node.sessions += 1;
            last.new_session = true;
        } else if node.frames == 0 {
            last.new_session = true;
        } else if frame.seq > node.highest_seq {
            let ahead = frame.seq - node.highest_seq;
            last.lost_before = ahead - 1;
            node.lost += ahead - 1;
            node.seen = if ahead >= SEQ_WINDOW {
                1
            } else {
                (node.seen << ahead) | 1
            };
            node.highest_seq = frame.seq;
        } else {
            let behind = node.highest_seq - frame.seq;
            if behind >= SEQ_WINDOW {
                return Err(WireError::Stale {
                    node: frame.node.clone(),
                    seq: frame.seq,
                    session: frame.session,
                });
            }
            if node.seen & (1 << behind) != 0 {
                return Err(WireError::Duplicate {
                    node: frame.node.clone(),
                    seq: frame.seq,
                });
            }
            node.seen |= 1 << behind;
            node.lost = node.lost.saturating_sub(1);
            node.late += 1;
        }
        node.frames += 1;
        for entry in &frame.schema {
            node.schema.insert(entry.id, entry.series.clone());
        }
        for s in &frame.samples {
            if !node.schema.contains_key(&s.id) {
                last.unknown_samples += s.data.len() as u64;
            }
        }
        node.unknown_samples += last.unknown_samples;
        node.last = last;
        Ok(())
    }
}

/// `name{labels}` as Prometheus writes a series.
pub fn series_display(series: &Series) -> String {
    format!("{}{}", series.name, series.labels)
}

#[cfg(test)]
mod tests;
