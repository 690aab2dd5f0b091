//! The samples section: a time table, time patterns and one block of values per series
//! (docs/wire-format.md, "Samples section").

use std::collections::HashMap;

use crate::{
    budget::Budget,
    error::WireError,
    frame::{CounterSample, GaugeSample, MAX_FRAME_SAMPLES, SeriesData, SeriesSamples},
    prim::{self, Order, Reader, put_varint, unzigzag, zigzag},
};

/// Rounds `t` to the nearest multiple of `q` that still fits in a u64.
pub(crate) fn quantize(t: u64, q: u64) -> u64 {
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

/// One series' block coded once: its header bits (without the id and pattern bits), its
/// time pattern (an entry of [`TimePatterns`]) and its body (from the extension byte on). The
/// encoder tries several cuts of a flush into frames; only the time table, the patterns and
/// the block headers depend on the cut, so the values are coded once per flush.
pub(crate) struct PreparedBlock {
    pub(crate) id: u32,
    header: u8,
    pattern: u32,
    body: Vec<u8>,
}

impl PreparedBlock {
    /// Codes `s`'s values; its quantized sample times go to `patterns`.
    pub(crate) fn new(
        s: &SeriesSamples,
        q: u64,
        patterns: &mut TimePatterns,
    ) -> Result<Self, WireError> {
        let mut times = Vec::with_capacity(s.data.len());
        let (header, body) = match &s.data {
            SeriesData::Counter(v) => {
                times.extend(v.iter().map(|c| quantize(c.unix_ns, q)));
                encode_counter_block(v)
            }
            SeriesData::Gauge(v) => {
                times.extend(v.iter().map(|g| quantize(g.end_unix_ns, q)));
                encode_gauge_block(s.id, v, q)?
            }
        };
        Ok(Self {
            id: s.id,
            header,
            pattern: patterns.intern(times),
            body,
        })
    }
}

/// The distinct sample-time sequences of a batch of blocks (quantized times, not yet indices
/// into a frame's time table): the series of one source read together share one.
#[derive(Default)]
pub(crate) struct TimePatterns {
    times: Vec<Vec<u64>>,
    index: HashMap<Vec<u64>, u32, foldhash::fast::FixedState>,
    // Scratch of `encode_prepared`, kept between frames.
    in_frame: Vec<u32>,
    used: Vec<u32>,
    table: Vec<u64>,
    indices: Vec<u32>,
}

impl TimePatterns {
    fn intern(&mut self, times: Vec<u64>) -> u32 {
        if let Some(&i) = self.index.get(&times) {
            return i;
        }
        let i = self.times.len() as u32;
        self.times.push(times.clone());
        self.index.insert(times, i);
        self.in_frame.push(u32::MAX);
        i
    }
}

/// Writes the samples section of `blocks` (prepared with `patterns`) to `out`.
pub(crate) fn encode_prepared(
    blocks: &[&PreparedBlock],
    patterns: &mut TimePatterns,
    send_ns: u64,
    q: u64,
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    let count: usize = blocks
        .iter()
        .map(|b| patterns.times[b.pattern as usize].len())
        .sum();
    if count > MAX_FRAME_SAMPLES {
        return Err(WireError::TooMany {
            what: "samples",
            count,
        });
    }
    let TimePatterns {
        times,
        in_frame,
        used,
        table,
        indices,
        ..
    } = patterns;
    // The frame's patterns, numbered in order of first use.
    used.clear();
    for b in blocks {
        let slot = &mut in_frame[b.pattern as usize];
        if *slot == u32::MAX {
            *slot = used.len() as u32;
            used.push(b.pattern);
        }
    }
    // Times table: every distinct (quantized) sample time of the frame, ascending.
    table.clear();
    for &p in used.iter() {
        table.extend_from_slice(&times[p as usize]);
    }
    table.sort_unstable();
    table.dedup();

    put_time_table(out, table, send_ns / q);
    put_varint(out, used.len() as u64);
    for &p in used.iter() {
        indices.clear();
        indices.extend(
            times[p as usize]
                .iter()
                .map(|t| table.binary_search(t).expect("time in table") as u32),
        );
        put_pattern(out, indices);
    }
    put_varint(out, blocks.len() as u64);
    let mut expected = 0i64;
    let mut prev_pattern = None;
    for block in blocks {
        let pattern = in_frame[block.pattern as usize];
        let gap = id_gap(block.id, expected);
        let new_pattern = prev_pattern != Some(pattern);
        let mut header = block.header;
        header |= if gap.is_some() { EXPLICIT_ID } else { 0 };
        header |= if new_pattern { NEW_PATTERN } else { 0 };
        out.push(header);
        if let Some(gap) = gap {
            put_varint(out, gap);
        }
        if new_pattern {
            put_varint(out, u64::from(pattern));
        }
        out.extend_from_slice(&block.body);
        expected = i64::from(block.id) + 1;
        prev_pattern = Some(pattern);
    }
    for &p in used.iter() {
        in_frame[p as usize] = u32::MAX;
    }
    Ok(())
}

fn encode_counter_block(samples: &[CounterSample]) -> (u8, Vec<u8>) {
    let values: Vec<u64> = samples.iter().map(|c| c.value).collect();
    let (order, size) = prim::best_int_order(&values, false);
    let mut body = Vec::with_capacity(size);
    prim::put_ints(&mut body, &values, false, order);
    ((order as u8) << ORDER_SHIFT, body)
}

fn encode_gauge_block(
    id: u32,
    samples: &[GaugeSample],
    q: u64,
) -> Result<(u8, Vec<u8>), WireError> {
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
    Ok((header, body))
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
    // Sizes of both codings, then the smaller written (no allocation: the table is scanned
    // twice).
    let delta = |i: usize| table[i + 1] - table[i];
    let dod_code = |i: usize| {
        if i == 0 {
            delta(0) - 1
        } else {
            zigzag(delta(i).wrapping_sub(delta(i - 1)) as i64)
        }
    };
    let n = table.len() - 1;
    let delta_size: usize = (0..n).map(|i| prim::varint_len(delta(i) - 1)).sum();
    let dod_size: usize = (0..n).map(|i| prim::varint_len(dod_code(i))).sum();
    if dod_size < delta_size {
        out.push(1);
        (0..n).for_each(|i| put_varint(out, dod_code(i)));
    } else {
        out.push(0);
        (0..n).for_each(|i| put_varint(out, delta(i) - 1));
    }
}

fn parse_time_table(
    r: &mut Reader<'_>,
    send_q: u64,
    q: u64,
    budget: &mut Budget,
) -> Result<Vec<u64>, WireError> {
    const WHAT: &str = "time table";
    let m = r.count("time table length")?;
    budget.charge_items::<u64>(m, WHAT)?;
    let mut table = Vec::with_capacity(m);
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
    let delta = |w: &[u32]| i64::from(w[1]) - i64::from(w[0]);
    let first = delta(times);
    if times.windows(2).all(|w| delta(w) == first) {
        put_varint(out, zigzag(first) + 1);
    } else {
        put_varint(out, 0);
        for w in times.windows(2) {
            put_varint(out, zigzag(delta(w)));
        }
    }
}

fn parse_pattern(
    r: &mut Reader<'_>,
    m: usize,
    samples_left: &mut usize,
) -> Result<Vec<u32>, WireError> {
    const WHAT: &str = "time pattern";
    let offset = r.offset();
    let n = r.varint(WHAT)?;
    if n > *samples_left as u64 {
        return Err(WireError::Malformed { what: WHAT, offset });
    }
    let n = n as usize;
    *samples_left -= n;
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

/// Parses the samples section, keeping the series `keep` accepts (the others are read past
/// without being decoded). The time table, patterns and blocks are charged to `budget`; the
/// samples themselves are bounded by [`MAX_FRAME_SAMPLES`] (see [`crate::budget`]).
pub(crate) fn parse_samples(
    r: &mut Reader<'_>,
    send_ns: u64,
    q: u64,
    budget: &mut Budget,
    keep: &mut dyn FnMut(u32) -> bool,
) -> Result<Vec<SeriesSamples>, WireError> {
    let table = parse_time_table(r, send_ns / q, q, budget)?;
    let n_patterns = r.count("pattern count")?;
    budget.charge_items::<Vec<u32>>(n_patterns, "time pattern")?;
    let mut samples_left = MAX_FRAME_SAMPLES;
    let mut patterns = Vec::with_capacity(n_patterns);
    for _ in 0..n_patterns {
        patterns.push(parse_pattern(r, table.len(), &mut samples_left)?);
    }
    let n_blocks = r.count("block count")?;
    budget.charge_items::<SeriesSamples>(n_blocks, "block")?;
    let mut samples_left = MAX_FRAME_SAMPLES;
    let mut out = Vec::with_capacity(n_blocks);
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
        if pattern.len() > samples_left {
            return Err(r.malformed("sample count"));
        }
        samples_left -= pattern.len();
        let order = Order::from_bits(header >> ORDER_SHIFT);
        let coder = (header >> CODER_SHIFT) & 3;
        expected = i64::from(id) + 1;
        if !keep(id) {
            skip_block(r, header, coder, order, pattern.len())?;
            continue;
        }
        let times = pattern.iter().map(|&i| table[i as usize]);
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
    }
    Ok(out)
}

/// Reads past one block of `n` samples that the caller does not keep.
fn skip_block(
    r: &mut Reader<'_>,
    header: u8,
    coder: u8,
    order: Order,
    n: usize,
) -> Result<(), WireError> {
    if header & GAUGE == 0 {
        if coder != CODER_INT {
            return Err(r.malformed("counter block header"));
        }
        return prim::skip_ints(r, n, order);
    }
    let ext = match coder {
        CODER_INT => 0,
        CODER_FLOAT => EXT_FLOAT,
        CODER_EXT => r.u8("block extension")?,
        _ => return Err(r.malformed("block coder")),
    };
    let mut n_values = n;
    if ext & EXT_ENVELOPES != 0 {
        for _ in 0..n {
            r.varint("gauge interval")?;
        }
        let spread = r.bytes(n.div_ceil(8), "gauge envelope flags")?;
        let spread_count: u32 = spread.iter().map(|b| b.count_ones()).sum();
        n_values += 2 * spread_count as usize;
    }
    if ext & EXT_FLOAT == 0 {
        prim::skip_ints(r, n_values, order)
    } else {
        match order {
            Order::Const if n_values > 0 => r.u64_le("gauge value").map(drop),
            Order::Const => Ok(()),
            Order::Raw => prim::skip_xor(r, n_values),
            _ => Err(r.malformed("float coder order")),
        }
    }
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
