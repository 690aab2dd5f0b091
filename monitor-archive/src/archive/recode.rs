//! Re-coding a sealed block's frames per series (archive format 2, docs/archive-format.md).
//!
//! Every frame on the wire is self-contained (it must decode alone after UDP loss), so each
//! one starts every series' coding afresh: a counter's full value and first delta, a gauge's
//! first value. In a sealed block the frames of one node are kept together, so there the
//! value streams of the sample blocks are taken out of the frames and re-coded as one column
//! per series (session, id and value class) across the whole block; what is left of each
//! frame (header, schema, time table, patterns, block headers, events, MAC: the *skeleton*)
//! stays as it was. Reading rebuilds every frame bit for bit, MAC included, without the key.
//!
//! A frame is re-coded only if rebuilding it gives back its exact bytes (checked when the
//! block is made); any other frame (a non-canonical varint from a foreign encoder, bytes
//! after the MAC, ...) is kept whole. So the transformation is exact by construction.

use super::record::{RecordKind, RecordView};

mod packed;

/// Largest number of values a frame's sample blocks can hold (the wire's limit of 65,536
/// samples, each gauge sample at most three values).
const MAX_FRAME_VALUES: usize = 3 * 65_536;

// Block header bits of the wire's samples section (docs/wire-format.md, "Blocks").
const GAUGE: u8 = 0x01;
const EXPLICIT_ID: u8 = 0x02;
const NEW_PATTERN: u8 = 0x04;
const EXT_FLOAT: u8 = 0x10;
const EXT_ENVELOPES: u8 = 0x20;

/// What the values of a column are: they are coded differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Class {
    /// Counter values (unsigned integers).
    Counter = 0,
    /// Scaled decimal gauge values (signed integers).
    Decimal = 1,
    /// f64 bits.
    Float = 2,
}

impl Class {
    fn from_code(c: u8) -> Option<Self> {
        match c {
            0 => Some(Class::Counter),
            1 => Some(Class::Decimal),
            2 => Some(Class::Float),
            _ => None,
        }
    }
}

/// A column: one series' values of one class, in one session.
type ColumnKey = (u32, u32, Class);

/// Integer stream orders (header bits 3-4).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Order {
    Const,
    Raw,
    Delta,
    DeltaDelta,
}

impl Order {
    fn from_header(h: u8) -> Self {
        match (h >> 3) & 3 {
            0 => Order::Const,
            1 => Order::Raw,
            2 => Order::Delta,
            _ => Order::DeltaDelta,
        }
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    (v >> 1) as i64 ^ -((v & 1) as i64)
}

/// Reads bytes from the front of a slice.
struct Cursor<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf, at: 0 }
    }

    fn u8(&mut self) -> Option<u8> {
        let b = *self.buf.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.buf.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }

    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.u8()?;
            if i == 9 && b > 1 {
                return None;
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    fn rest(&self) -> usize {
        self.buf.len() - self.at
    }
}

/// The two directions a frame is walked in: taken apart ([`Split`]) or rebuilt ([`Join`]).
/// The walk ([`walk_frame`]) is the frame's structure, written once for both.
trait Side {
    /// Structure bytes: read (from the frame, or the skeleton) and written (to the skeleton,
    /// or the frame); returns them.
    fn meta(&mut self, n: usize) -> Option<&[u8]>;
    fn meta_u8(&mut self) -> Option<u8> {
        self.meta(1).map(|b| b[0])
    }
    fn meta_varint(&mut self) -> Option<u64>;
    /// An integer stream of `n` values (`Const`: one is coded).
    fn ints(&mut self, key: ColumnKey, n: usize, order: Order) -> Option<()>;
    /// A float stream of `n` values (`Const`: one `u64le`; `Raw`: XOR coded).
    fn floats(&mut self, key: ColumnKey, n: usize, order: Order) -> Option<()>;
}

fn walk_frame(s: &mut impl Side) -> Option<()> {
    if s.meta(4)? != b"RSWF" || s.meta_u8()? != 1 {
        return None;
    }
    let flags = s.meta_u8()?;
    if flags & !7 != 0 {
        return None;
    }
    let node_len = usize::from(s.meta_u8()?);
    s.meta(node_len)?;
    let session = u32::from_le_bytes(s.meta(4)?.try_into().ok()?);
    s.meta_varint()?; // seq
    s.meta(8)?; // send time
    s.meta_varint()?; // quantum
    if flags & 1 != 0 {
        let len = usize::try_from(s.meta_varint()?).ok()?;
        s.meta(len)?;
    }
    if flags & 2 != 0 {
        s.meta_varint()?; // length: the same once rebuilt (checked)
        walk_samples(s, session)?;
    }
    if flags & 4 != 0 {
        let len = usize::try_from(s.meta_varint()?).ok()?;
        s.meta(len)?;
    }
    s.meta(monitor_wire::MAC_LEN)?;
    Some(())
}

fn walk_samples(s: &mut impl Side, session: u32) -> Option<()> {
    let m = s.meta_varint()?;
    if m >= 1 {
        s.meta_varint()?;
    }
    if m >= 2 {
        s.meta_u8()?;
        for _ in 1..m {
            s.meta_varint()?;
        }
    }
    let n_patterns = s.meta_varint()?;
    let mut patterns = Vec::new();
    let mut samples = 0usize;
    for _ in 0..n_patterns {
        let n = usize::try_from(s.meta_varint()?).ok()?;
        samples = samples.checked_add(n).filter(|&t| t <= 65_536)?;
        if n >= 1 {
            s.meta_varint()?;
        }
        if n >= 2 && s.meta_varint()? == 0 {
            for _ in 1..n {
                s.meta_varint()?;
            }
        }
        patterns.push(n);
    }
    let n_blocks = s.meta_varint()?;
    let (mut expected, mut n, mut values) = (0i64, None, 0usize);
    for _ in 0..n_blocks {
        let h = s.meta_u8()?;
        if h & 0x80 != 0 {
            return None;
        }
        let id = if h & EXPLICIT_ID != 0 {
            expected.checked_add(unzigzag(s.meta_varint()?))?
        } else {
            expected
        };
        let id = u32::try_from(id).ok()?;
        expected = i64::from(id) + 1;
        if h & NEW_PATTERN != 0 {
            n = Some(*patterns.get(usize::try_from(s.meta_varint()?).ok()?)?);
        }
        let n = n?;
        let order = Order::from_header(h);
        let coder = (h >> 5) & 3;
        if h & GAUGE == 0 {
            if coder != 0 {
                return None;
            }
            values = values.checked_add(n).filter(|&v| v <= MAX_FRAME_VALUES)?;
            s.ints((session, id, Class::Counter), n, order)?;
            continue;
        }
        let ext = match coder {
            0 => 0,
            1 => EXT_FLOAT,
            2 => s.meta_u8()?,
            _ => return None,
        };
        let mut nv = n;
        if ext & EXT_ENVELOPES != 0 {
            for _ in 0..n {
                s.meta_varint()?;
            }
            let spread: u32 = s.meta(n.div_ceil(8))?.iter().map(|b| b.count_ones()).sum();
            nv += 2 * spread as usize;
        }
        values = values.checked_add(nv).filter(|&v| v <= MAX_FRAME_VALUES)?;
        if ext & EXT_FLOAT == 0 {
            s.ints((session, id, Class::Decimal), nv, order)?;
        } else {
            s.floats((session, id, Class::Float), nv, order)?;
        }
    }
    Some(())
}

/// Column keys: foldhash rather than SipHash (a block's every sample block looks its column up).
type HashMap<K, V> = foldhash::HashMap<K, V>;

/// The columns of a block being made or read: values per key, keys in first-use order.
#[derive(Default)]
struct Columns {
    index: HashMap<ColumnKey, usize>,
    keys: Vec<ColumnKey>,
    values: Vec<Vec<u64>>,
}

impl Columns {
    fn column(&mut self, key: ColumnKey) -> usize {
        *self.index.entry(key).or_insert_with(|| {
            self.keys.push(key);
            // When reading, the columns' values are there before their keys.
            if self.values.len() < self.keys.len() {
                self.values.push(Vec::new());
            }
            self.keys.len() - 1
        })
    }

    /// Undoes everything since `mark` (a frame that is kept whole after all).
    fn rollback(&mut self, mark: &[usize]) {
        for k in self.keys.drain(mark.len()..) {
            self.index.remove(&k);
        }
        self.values.truncate(mark.len());
        for (v, &len) in self.values.iter_mut().zip(mark) {
            v.truncate(len);
        }
    }

    fn mark(&self) -> Vec<usize> {
        self.values.iter().map(Vec::len).collect()
    }
}

/// Takes a frame apart: structure to `skeleton`, values to the columns.
struct Split<'a, 'c> {
    frame: Cursor<'a>,
    skeleton: &'c mut Vec<u8>,
    columns: &'c mut Columns,
}

impl Side for Split<'_, '_> {
    fn meta(&mut self, n: usize) -> Option<&[u8]> {
        let b = self.frame.bytes(n)?;
        self.skeleton.extend_from_slice(b);
        Some(b)
    }

    fn meta_varint(&mut self) -> Option<u64> {
        let start = self.frame.at;
        let v = self.frame.varint()?;
        self.skeleton
            .extend_from_slice(&self.frame.buf[start..self.frame.at]);
        Some(v)
    }

    fn ints(&mut self, key: ColumnKey, n: usize, order: Order) -> Option<()> {
        if n == 0 {
            return Some(());
        }
        let signed = key.2 == Class::Decimal;
        let unfirst = |v: u64| if signed { unzigzag(v) as u64 } else { v };
        let col = self.columns.column(key);
        let out = &mut self.columns.values[col];
        let v0 = unfirst(self.frame.varint()?);
        out.push(v0);
        match order {
            Order::Const => {}
            Order::Raw => {
                for _ in 1..n {
                    out.push(unfirst(self.frame.varint()?));
                }
            }
            Order::Delta | Order::DeltaDelta => {
                let (mut prev, mut d) = (v0, 0u64);
                for i in 1..n {
                    let c = unzigzag(self.frame.varint()?) as u64;
                    d = if order == Order::Delta || i == 1 {
                        c
                    } else {
                        d.wrapping_add(c)
                    };
                    prev = prev.wrapping_add(d);
                    out.push(prev);
                }
            }
        }
        Some(())
    }

    fn floats(&mut self, key: ColumnKey, n: usize, order: Order) -> Option<()> {
        if n == 0 {
            return (order != Order::DeltaDelta && order != Order::Delta).then_some(());
        }
        let col = self.columns.column(key);
        let out = &mut self.columns.values[col];
        match order {
            Order::Const => {
                out.push(u64::from_le_bytes(self.frame.bytes(8)?.try_into().ok()?));
            }
            Order::Raw => {
                let mut prev = 0u64;
                for _ in 0..n {
                    let c = self.frame.u8()?;
                    let (lead, len) = (usize::from(c >> 4), usize::from(c & 0x0f));
                    if lead + len > 8 {
                        return None;
                    }
                    let mut le = [0u8; 8];
                    le[..len].copy_from_slice(self.frame.bytes(len)?);
                    let x = if len > 0 {
                        u64::from_le_bytes(le) << (8 * (8 - lead - len))
                    } else {
                        0
                    };
                    prev ^= x;
                    out.push(prev);
                }
            }
            _ => return None,
        }
        Some(())
    }
}

/// Rebuilds a frame from its skeleton and the columns (each read from its cursor on).
struct Join<'a, 'c> {
    skeleton: Cursor<'a>,
    frame: &'c mut Vec<u8>,
    columns: &'c mut Columns,
    cursors: &'c mut Vec<usize>,
}

impl Join<'_, '_> {
    fn take(&mut self, key: ColumnKey, n: usize) -> Option<&[u64]> {
        let col = self.columns.column(key);
        if col >= self.cursors.len() {
            self.cursors.resize(col + 1, 0);
        }
        let at = self.cursors[col];
        let vals = self.columns.values[col].get(at..at.checked_add(n)?)?;
        self.cursors[col] += n;
        Some(vals)
    }
}

impl Side for Join<'_, '_> {
    fn meta(&mut self, n: usize) -> Option<&[u8]> {
        let b = self.skeleton.bytes(n)?;
        self.frame.extend_from_slice(b);
        Some(b)
    }

    fn meta_varint(&mut self) -> Option<u64> {
        let start = self.skeleton.at;
        let v = self.skeleton.varint()?;
        self.frame
            .extend_from_slice(&self.skeleton.buf[start..self.skeleton.at]);
        Some(v)
    }

    fn ints(&mut self, key: ColumnKey, n: usize, order: Order) -> Option<()> {
        if n == 0 {
            return Some(());
        }
        let signed = key.2 == Class::Decimal;
        let first = |v: u64| if signed { zigzag(v as i64) } else { v };
        let coded = if order == Order::Const { 1 } else { n };
        let vals = self.take(key, coded)?.to_vec();
        let out = &mut *self.frame;
        put_varint(out, first(vals[0]));
        match order {
            Order::Const => {}
            Order::Raw => vals[1..].iter().for_each(|&v| put_varint(out, first(v))),
            Order::Delta | Order::DeltaDelta => {
                let mut prev_d = 0u64;
                for (i, w) in vals.windows(2).enumerate() {
                    let d = w[1].wrapping_sub(w[0]);
                    let c = if order == Order::Delta || i == 0 {
                        d
                    } else {
                        d.wrapping_sub(prev_d)
                    };
                    put_varint(out, zigzag(c as i64));
                    prev_d = d;
                }
            }
        }
        Some(())
    }

    fn floats(&mut self, key: ColumnKey, n: usize, order: Order) -> Option<()> {
        if n == 0 {
            return (order != Order::DeltaDelta && order != Order::Delta).then_some(());
        }
        match order {
            Order::Const => {
                let v = self.take(key, 1)?[0];
                self.frame.extend_from_slice(&v.to_le_bytes());
            }
            Order::Raw => {
                let vals = self.take(key, n)?.to_vec();
                let mut prev = 0u64;
                for v in vals {
                    let x = v ^ prev;
                    prev = v;
                    let (lead, len) = if x == 0 {
                        (0, 0)
                    } else {
                        let lead = x.leading_zeros() as usize / 8;
                        (lead, 8 - lead - x.trailing_zeros() as usize / 8)
                    };
                    self.frame.push(((lead as u8) << 4) | len as u8);
                    if len > 0 {
                        let trail = 8 - lead - len;
                        self.frame
                            .extend_from_slice(&(x >> (8 * trail)).to_le_bytes()[..len]);
                    }
                }
            }
            _ => return None,
        }
        Some(())
    }
}

/// Rebuilds one frame from its whole `skeleton` into `frame` (cleared first).
fn join_frame(
    skeleton: &[u8],
    frame: &mut Vec<u8>,
    columns: &mut Columns,
    cursors: &mut Vec<usize>,
) -> Option<()> {
    frame.clear();
    let mut join = Join {
        skeleton: Cursor::new(skeleton),
        frame,
        columns,
        cursors,
    };
    walk_frame(&mut join)?;
    (join.skeleton.rest() == 0).then_some(())
}

/// How a record's bytes are kept in a re-coded block.
const FORM_WHOLE: u8 = 0;
const FORM_SPLIT: u8 = 2;

/// Makes a re-coded block of `records` (one node's, in order): see docs/archive-format.md,
/// "Re-coded block".
pub(crate) fn encode_block(records: &[RecordView<'_>]) -> Vec<u8> {
    encode_block_counting(records).0
}

/// [`encode_block`], and how many of the records were re-coded (the others are kept whole).
fn encode_block_counting(records: &[RecordView<'_>]) -> (Vec<u8>, usize) {
    let mut split_records = 0;
    let mut columns = Columns::default();
    let mut meta = Vec::with_capacity(records.len() * 16);
    let mut skeletons = Vec::new();
    let mut rebuilt = Vec::new();
    put_varint(&mut meta, records.len() as u64);
    let (mut prev_seq, mut prev_received) = (0u64, 0u64);
    for r in records {
        put_varint(&mut meta, r.seq.wrapping_sub(prev_seq));
        put_varint(
            &mut meta,
            zigzag(r.received_ns.wrapping_sub(prev_received) as i64),
        );
        put_varint(
            &mut meta,
            zigzag(r.first_ns.wrapping_sub(r.received_ns) as i64),
        );
        put_varint(&mut meta, zigzag(r.last_ns.wrapping_sub(r.first_ns) as i64));
        (prev_seq, prev_received) = (r.seq, r.received_ns);
        let kind = match r.kind {
            RecordKind::Frame => 0,
            RecordKind::Schema => 1,
        };
        // Split the frame, then check it rebuilds exactly; if not, keep it whole.
        let mark = columns.mark();
        let skeleton_at = skeletons.len();
        let split = walk_frame(&mut Split {
            frame: Cursor::new(r.bytes),
            skeleton: &mut skeletons,
            columns: &mut columns,
        })
        .is_some()
            && skeletons.len() - skeleton_at <= r.bytes.len();
        let exact = split && {
            let mut cursors = mark.clone();
            join_frame(
                &skeletons[skeleton_at..],
                &mut rebuilt,
                &mut columns,
                &mut cursors,
            )
            .is_some()
                && rebuilt == r.bytes
                && cursors.len() == columns.values.len()
                && cursors
                    .iter()
                    .zip(&columns.values)
                    .all(|(&c, v)| c == v.len())
        };
        if exact {
            split_records += 1;
            meta.push(kind | FORM_SPLIT);
            put_varint(&mut meta, (skeletons.len() - skeleton_at) as u64);
        } else {
            columns.rollback(&mark);
            skeletons.truncate(skeleton_at);
            skeletons.extend_from_slice(r.bytes);
            meta.push(kind | FORM_WHOLE);
            put_varint(&mut meta, r.bytes.len() as u64);
        }
    }
    let mut out = meta;
    out.extend_from_slice(&skeletons);
    put_varint(&mut out, columns.keys.len() as u64);
    for (key, values) in columns.keys.iter().zip(&columns.values) {
        put_column(&mut out, key.2, values);
    }
    #[cfg(test)]
    LAST_PARTS.with(|p| {
        *p.borrow_mut() = Some(Parts {
            skeletons: skeletons.clone(),
            columns: columns
                .keys
                .iter()
                .zip(&columns.values)
                .map(|(k, v)| (k.2, v.clone()))
                .collect(),
        })
    });
    (out, split_records)
}

/// The parts of the last block made on this thread (the size analysis test).
#[cfg(test)]
struct Parts {
    skeletons: Vec<u8>,
    columns: Vec<(Class, Vec<u64>)>,
}

#[cfg(test)]
thread_local! {
    static LAST_PARTS: std::cell::RefCell<Option<Parts>> = const { std::cell::RefCell::new(None) };
}

/// Column codings.
const COLUMN_DELTA: u8 = 0;
const COLUMN_DELTA_DELTA: u8 = 1;
const COLUMN_XOR: u8 = 2;
/// Bit-packed values (3), differences (4) or differences of differences (5): `packed`.
const COLUMN_PACKED: u8 = 3;
const COLUMN_PACKED_LAST: u8 = 5;

fn put_column(out: &mut Vec<u8>, class: Class, values: &[u64]) {
    out.push(class as u8);
    put_varint(out, values.len() as u64);
    if class == Class::Float {
        out.push(COLUMN_XOR);
        let mut prev = 0u64;
        for &v in values {
            let x = v ^ prev;
            prev = v;
            // Significant bytes, from the lowest non-zero one: a length byte then the bytes.
            let lead = if x == 0 {
                8
            } else {
                x.leading_zeros() as usize / 8
            };
            let trail = if x == 0 {
                0
            } else {
                x.trailing_zeros() as usize / 8
            };
            let len = 8 - lead - trail.min(8 - lead);
            out.push(((trail as u8) << 4) | len as u8);
            out.extend_from_slice(&(x >> (8 * trail)).to_le_bytes()[..len]);
        }
        return;
    }
    // Varint differences or differences of differences over the whole column (wrapping), or
    // the values, differences or differences of differences bit-packed: whichever is smaller.
    let deltas = |dd: bool| {
        let (mut prev, mut prev_d) = (0u64, 0u64);
        values.iter().map(move |&v| {
            let d = v.wrapping_sub(prev);
            let c = if dd { d.wrapping_sub(prev_d) } else { d };
            (prev, prev_d) = (v, d);
            zigzag(c as i64)
        })
    };
    let size = |dd: bool| {
        deltas(dd)
            .map(|c| (64 - (c | 1).leading_zeros() as usize).div_ceil(7))
            .sum::<usize>()
    };
    let (dd_size, d_size) = (size(true), size(false));
    let dd = dd_size < d_size;
    let varint_size = dd_size.min(d_size);
    let packed = packed::ORDERS
        .iter()
        .map(|&order| (order, packed::plan(values, order)))
        .min_by_key(|(_, (_, size))| *size)
        .filter(|(_, (_, size))| *size < varint_size);
    if let Some((order, (t, _))) = packed {
        out.push(COLUMN_PACKED + order);
        packed::put(out, &t, order);
        return;
    }
    out.push(if dd { COLUMN_DELTA_DELTA } else { COLUMN_DELTA });
    for c in deltas(dd) {
        put_varint(out, c);
    }
}

/// Reads a column; `packed`: its block may use the packed codings (sealed version 3 on).
fn get_column(c: &mut Cursor<'_>, class: Class, packed: bool) -> Option<Vec<u64>> {
    let n = usize::try_from(c.varint()?).ok()?;
    let coding = c.u8()?;
    let is_packed = (COLUMN_PACKED..=COLUMN_PACKED_LAST).contains(&coding);
    if is_packed && !packed {
        return None;
    }
    if is_packed {
        return match class {
            Class::Counter | Class::Decimal => packed::get(c, n, coding - COLUMN_PACKED),
            Class::Float => None,
        };
    }
    // Every value takes at least one byte: a count beyond that is corrupt, not allocated.
    if n > c.rest() {
        return None;
    }
    let mut values = Vec::with_capacity(n);
    match (class, coding) {
        (Class::Float, COLUMN_XOR) => {
            let mut prev = 0u64;
            for _ in 0..n {
                let h = c.u8()?;
                let (trail, len) = (usize::from(h >> 4), usize::from(h & 0x0f));
                if trail + len > 8 {
                    return None;
                }
                let mut le = [0u8; 8];
                le[..len].copy_from_slice(c.bytes(len)?);
                prev ^= u64::from_le_bytes(le).checked_shl(8 * trail as u32)?;
                values.push(prev);
            }
        }
        (Class::Counter | Class::Decimal, COLUMN_DELTA | COLUMN_DELTA_DELTA) => {
            let (mut prev, mut d) = (0u64, 0u64);
            for _ in 0..n {
                let code = unzigzag(c.varint()?) as u64;
                d = if coding == COLUMN_DELTA_DELTA {
                    d.wrapping_add(code)
                } else {
                    code
                };
                prev = prev.wrapping_add(d);
                values.push(prev);
            }
        }
        _ => return None,
    }
    Some(values)
}

/// Rebuilds the records of a re-coded block in the layout of a format 1 block (records one
/// after the other: `RecordView::put_block_record`). `None` when the block is inconsistent.
/// `packed`: the block is of sealed version 3 or later, whose columns may be bit-packed
/// (version 2 blocks have the varint and XOR codings only).
pub(crate) fn decode_block(block: &[u8], packed: bool) -> Option<Vec<u8>> {
    let mut c = Cursor::new(block);
    let count = usize::try_from(c.varint()?).ok()?;
    if count > block.len() {
        return None;
    }
    struct Meta {
        seq: u64,
        received: u64,
        first: u64,
        last: u64,
        kind: RecordKind,
        split: bool,
        len: usize,
    }
    let mut metas = Vec::with_capacity(count);
    let (mut seq, mut received) = (0u64, 0u64);
    for _ in 0..count {
        seq = seq.wrapping_add(c.varint()?);
        received = received.wrapping_add(unzigzag(c.varint()?) as u64);
        let first = received.wrapping_add(unzigzag(c.varint()?) as u64);
        let last = first.wrapping_add(unzigzag(c.varint()?) as u64);
        let form = c.u8()?;
        let kind = match form & 1 {
            0 => RecordKind::Frame,
            _ => RecordKind::Schema,
        };
        if form & !(1 | FORM_SPLIT) != 0 {
            return None;
        }
        let len = usize::try_from(c.varint()?).ok()?;
        metas.push(Meta {
            seq,
            received,
            first,
            last,
            kind,
            split: form & FORM_SPLIT != 0,
            len,
        });
    }
    let mut skeletons = Vec::with_capacity(count);
    for m in &metas {
        skeletons.push(c.bytes(m.len)?);
    }
    let n_columns = usize::try_from(c.varint()?).ok()?;
    if n_columns > c.rest() {
        return None;
    }
    let mut columns = Columns::default();
    let mut classes = Vec::with_capacity(n_columns);
    for _ in 0..n_columns {
        let class = Class::from_code(c.u8()?)?;
        classes.push(class);
        columns.values.push(get_column(&mut c, class, packed)?);
    }
    if c.rest() != 0 {
        return None;
    }
    // Columns are keyed in the order the frames first use them, as when they were made.
    let mut cursors = vec![0; n_columns];
    let mut out = Vec::with_capacity(block.len() * 2);
    let mut frame = Vec::new();
    for (m, skeleton) in metas.iter().zip(skeletons) {
        let bytes: &[u8] = if m.split {
            let known = columns.keys.len();
            join_frame(skeleton, &mut frame, &mut columns, &mut cursors)?;
            // A key first used here must be the next column, of its class.
            if columns.keys.len() > n_columns
                || columns.keys[known..]
                    .iter()
                    .zip(&classes[known..])
                    .any(|(k, &class)| k.2 != class)
            {
                return None;
            }
            &frame
        } else {
            skeleton
        };
        RecordView {
            seq: m.seq,
            kind: m.kind,
            node: "",
            received_ns: m.received,
            first_ns: m.first,
            last_ns: m.last,
            bytes,
        }
        .put_block_record(&mut out);
    }
    if cursors
        .iter()
        .zip(&columns.values)
        .any(|(&c, v)| c != v.len())
    {
        return None;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use monitor_wire::{
        CounterSample, EncoderConfig, FrameEncoder, GaugeSample, Key, Kind, Labels, ReceiverState,
        Sample, Series, WireEvent,
    };

    use super::*;

    const T0: u64 = 1_790_000_000_000_000_000;
    const S: u64 = 1_000_000_000;

    fn series(name: &str, kind: Kind, labels: &[(&str, &str)]) -> Series {
        Series {
            name: name.into(),
            labels: Labels::new(labels.iter().copied()),
            kind,
        }
    }

    /// Frames of two agents (two sessions in one block; one sends gauges bit for bit, so
    /// its non-decimal gauges take the float coding) over 95 s, flushed every 10 s: a
    /// counter that wraps, one read every third sweep only, one that stops for 30 s, two
    /// that jump by 2^40 every 10 s, integer
    /// and float gauges, gauge envelopes, NaN, infinities and -0.0, and events.
    fn frames(key: &Key) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for (agent, digits) in [("node-a", Some(6)), ("node-a", None)] {
            let mut config = EncoderConfig::new(agent);
            config.gauge_digits = digits;
            let mut enc = FrameEncoder::new(config, key.clone()).unwrap();
            let wraps = series("wrap_total", Kind::Counter, &[("port", "1")]);
            let sparse = series("sparse_total", Kind::Counter, &[("port", "1")]);
            let pausing = series("pause_total", Kind::Counter, &[("port", "2")]);
            // Jumps of 2^40 every 10 s widen every chunk: varints are smaller for these.
            let jumpy = series("jumpy_total", Kind::Counter, &[("port", "3")]);
            let steady_jumpy = series("steady_jumpy_total", Kind::Counter, &[("port", "3")]);
            let temp = series("temp", Kind::Gauge, &[("gpu", "0")]);
            let ratio = series("ratio", Kind::Gauge, &[("gpu", "0")]);
            let odd = series("odd", Kind::Gauge, &[("gpu", "1")]);
            let env = series("env", Kind::Gauge, &[("gpu", "1")]);
            let mut rng = 0x1234_5678u64;
            let mut next = || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            for sweep in 0..95u64 {
                let t = T0 + sweep * S + 137_000 * sweep;
                let counter = |enc: &mut FrameEncoder, s: &Series, v: u64| {
                    enc.push_sample(
                        s,
                        Sample::Counter(CounterSample {
                            unix_ns: t,
                            value: v,
                        }),
                    )
                    .unwrap()
                };
                let gauge = |enc: &mut FrameEncoder, s: &Series, v: f64| {
                    enc.push_sample(s, Sample::Gauge(GaugeSample::reading(t, v)))
                        .unwrap()
                };
                counter(
                    &mut enc,
                    &wraps,
                    (u64::MAX - 40_000_000).wrapping_add(sweep * 1_000_003),
                );
                if sweep % 3 == 0 {
                    counter(&mut enc, &sparse, sweep * sweep * 977);
                }
                if !(30..60).contains(&sweep) {
                    counter(&mut enc, &pausing, 5 + sweep / 7);
                }
                counter(&mut enc, &jumpy, sweep + ((sweep / 10) << 40));
                counter(
                    &mut enc,
                    &steady_jumpy,
                    sweep * 100_003 + ((sweep / 10) << 40),
                );
                gauge(&mut enc, &temp, 60.0 + (next() % 5) as f64);
                gauge(&mut enc, &ratio, (next() % 1_000_000) as f64 / 997.0);
                let special = [f64::NAN, f64::INFINITY, -0.0, f64::NEG_INFINITY, 1e-300];
                gauge(&mut enc, &odd, special[(sweep % 5) as usize]);
                let base = (next() % 100) as f64;
                enc.push_sample(
                    &env,
                    Sample::Gauge(GaugeSample {
                        start_unix_ns: t - S / 2,
                        end_unix_ns: t,
                        min: base,
                        max: base + 7.5,
                        mean: base + 2.25,
                    }),
                )
                .unwrap();
                if sweep % 17 == 3 {
                    enc.push_event(WireEvent {
                        unix_ns: t + 5,
                        kind: "xid".into(),
                        labels: Labels::new([("gpu", "0")]),
                        code: 79,
                        text: format!("fell off the bus at sweep {sweep}"),
                    });
                    out.extend(enc.flush_events(t + 10));
                }
                if sweep % 10 == 9 || sweep == 94 {
                    out.extend(enc.flush(t + S / 10));
                }
            }
        }
        out
    }

    fn record(seq: u64, bytes: &[u8]) -> RecordView<'_> {
        RecordView {
            seq,
            kind: if seq == 1 {
                RecordKind::Schema
            } else {
                RecordKind::Frame
            },
            node: "",
            received_ns: T0 + seq * 3 * S + (seq % 7) * 1_000,
            first_ns: T0 + seq * 2 * S,
            last_ns: T0 + seq * 2 * S + 9 * S,
            bytes,
        }
    }

    fn layout(records: &[RecordView<'_>]) -> Vec<u8> {
        let mut out = Vec::new();
        for r in records {
            r.put_block_record(&mut out);
        }
        out
    }

    #[test]
    fn every_frame_of_a_block_rebuilds_bit_for_bit_and_decodes_to_the_same_samples() {
        let key = Key::from_bytes([3; 32]);
        let frames = frames(&key);
        assert!(frames.len() > 20, "{} frames", frames.len());
        let records: Vec<RecordView<'_>> = frames
            .iter()
            .enumerate()
            .map(|(i, f)| record(1 + 2 * i as u64, f))
            .collect();
        let (block, split) = encode_block_counting(&records);
        // Every frame of the encoder is re-coded, none kept whole.
        assert_eq!(split, records.len());
        // The columns took every coding: varint, XOR and each bit-packed order.
        let parts = LAST_PARTS.with(|p| p.borrow_mut().take()).unwrap();
        let codings: std::collections::BTreeSet<u8> = parts
            .columns
            .iter()
            .map(|(class, values)| {
                let mut one = Vec::new();
                put_column(&mut one, *class, values);
                one[1 + varint_len(values.len() as u64)]
            })
            .collect();
        assert_eq!(codings.into_iter().collect::<Vec<_>>(), [0, 1, 2, 3, 4, 5]);
        let rebuilt = decode_block(&block, true).expect("the block rebuilds");
        assert_eq!(rebuilt, layout(&records));
        // And the frames decode to every sample and event the agents sent, in both receivers.
        let limits = monitor_wire::ReceiverLimits::default();
        let (mut a, mut b) = (
            ReceiverState::with_limits(limits),
            ReceiverState::with_limits(limits),
        );
        let back: Vec<_> = super::super::record::read_block_records(&rebuilt, "")
            .map(|r| r.unwrap().bytes.to_vec())
            .collect();
        let (mut samples, mut events) = (0usize, 0usize);
        for (orig, again) in frames.iter().zip(&back) {
            let x = monitor_wire::decode(orig, &key, &mut a).unwrap();
            let y = monitor_wire::decode(again, &key, &mut b).unwrap();
            assert_eq!(format!("{x:?}"), format!("{y:?}"));
            samples += y.sample_count();
            events += y.events.len();
        }
        assert_eq!(samples, 2 * (95 + 32 + 65 + 2 * 95 + 4 * 95));
        assert_eq!(events, 2 * 6);
    }

    #[test]
    fn datagrams_that_do_not_parse_or_rebuild_are_kept_whole() {
        let key = Key::from_bytes([3; 32]);
        let frames = frames(&key);
        let mut trailing = frames[3].clone();
        trailing.push(0);
        // A non-canonical varint in the structure (the seq, as 0x85 0x00 for 5) is copied as
        // it is, so that frame still rebuilds exactly and is re-coded.
        let mut odd_varint = frames[2].clone();
        let seq_at = 6 + 1 + usize::from(odd_varint[6]) + 4;
        let seq = odd_varint[seq_at];
        assert!(seq < 0x80);
        odd_varint.splice(seq_at..=seq_at, [seq | 0x80, 0]);
        let junk: Vec<u8> = (0..700u32).map(|i| (i * 31 % 251) as u8).collect();
        let kept = [
            &frames[0][..],
            &frames[1][..frames[1].len() / 2],
            &trailing,
            &junk,
            &odd_varint,
            &frames[4],
            b"",
        ];
        let records: Vec<RecordView<'_>> = kept
            .iter()
            .enumerate()
            .map(|(i, f)| record(10 + i as u64, f))
            .collect();
        let (block, split) = encode_block_counting(&records);
        // Cut, trailing byte, junk and empty are kept whole.
        assert_eq!(split, 3);
        assert_eq!(decode_block(&block, true).unwrap(), layout(&records));
    }

    /// Where a block's bytes go (run by hand: `cargo test --release -p monitor-collector
    /// recode::tests::where_the_bytes_go -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn where_the_bytes_go() {
        use monitor_testkit::NodeSender;
        let key = Key::from_bytes([7; 32]);
        let mut sender = NodeSender::new("gpu-node-0000", 1, key);
        let frames = sender.run(T0, 800, 10);
        let samples: usize = frames.iter().map(|f| f.samples).sum();
        let records: Vec<RecordView<'_>> = frames
            .iter()
            .enumerate()
            .map(|(i, f)| RecordView {
                seq: i as u64 + 1,
                kind: RecordKind::Frame,
                node: "",
                received_ns: f.received_ns,
                first_ns: f.first_ns,
                last_ns: f.last_ns,
                bytes: &f.bytes,
            })
            .collect();
        let block = encode_block(&records);
        assert_eq!(decode_block(&block, true).unwrap(), layout(&records));
        let z = |b: &[u8]| zstd::bulk::compress(b, 3).unwrap().len();
        let per = |b: usize| b as f64 / samples as f64;
        let parts = LAST_PARTS.with(|p| p.borrow_mut().take()).unwrap();
        println!(
            "samples {samples}, frames {}, block {} raw {:.3} zstd {:.3}",
            frames.len(),
            block.len(),
            per(block.len()),
            per(z(&block))
        );
        println!(
            "skeletons raw {:.3} zstd {:.3}",
            per(parts.skeletons.len()),
            per(z(&parts.skeletons))
        );
        // Columns grouped by class and by coding picked, raw and zstd alone.
        let mut groups: std::collections::BTreeMap<String, (Vec<u8>, usize, usize)> =
            Default::default();
        for (class, values) in &parts.columns {
            let mut one = Vec::new();
            put_column(&mut one, *class, values);
            let distinct = values
                .iter()
                .collect::<std::collections::HashSet<_>>()
                .len();
            let kind = if distinct == 1 { "const" } else { "moving" };
            let g = groups
                .entry(format!(
                    "{class:?} {kind} coding {}",
                    one[1 + varint_len(values.len() as u64)]
                ))
                .or_default();
            g.0.extend_from_slice(&one);
            g.1 += 1;
            g.2 += values.len();
        }
        for (name, (bytes, n, values)) in &groups {
            println!(
                "{name}: {n} columns, {values} values, raw {:.3} zstd {:.3} B/sample",
                per(bytes.len()),
                per(z(bytes))
            );
        }
    }

    fn varint_len(v: u64) -> usize {
        let mut out = Vec::new();
        put_varint(&mut out, v);
        out.len()
    }

    #[test]
    fn a_damaged_block_is_refused_not_misread() {
        let key = Key::from_bytes([3; 32]);
        let frames = frames(&key);
        let records: Vec<RecordView<'_>> = frames
            .iter()
            .enumerate()
            .map(|(i, f)| record(i as u64, f))
            .collect();
        let (block, _) = encode_block_counting(&records);
        for cut in [1, block.len() / 3, block.len() - 1] {
            assert_eq!(decode_block(&block[..cut], true), None, "cut at {cut}");
        }
        // Bytes changed anywhere (zstd's checksum would find them first): refused or read
        // as something else, never a panic or a huge allocation.
        let mut rng = 0x5eed_u64;
        for _ in 0..300 {
            rng = rng
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let mut bad = block.clone();
            bad[(rng >> 33) as usize % block.len()] ^= 1 << ((rng >> 60) & 7);
            let _ = decode_block(&bad, true);
        }
        // A column count or a value count beyond the block is refused without allocating it.
        let mut long = block.clone();
        long.extend_from_slice(&[0xff; 9]);
        assert_eq!(decode_block(&long, true), None);
    }
}
