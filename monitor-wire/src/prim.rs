//! The frame format's building blocks: LEB128 varints, zig-zag, a bounds-checked reader, and
//! the three value coders (integer streams of orders 0-3, scaled decimals, XOR floats).
//!
//! Every decoding step here checks its bounds and uses wrapping arithmetic: bytes that passed
//! the MAC are trusted to come from a key holder, not to be well formed.

use crate::error::WireError;

pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

pub(crate) fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

pub(crate) fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

pub(crate) fn put_str(out: &mut Vec<u8>, s: &str) {
    put_varint(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// Reads a frame front to back; every error names what was being read and where.
#[derive(Clone)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Offset of `buf[0]` in the whole frame, for error messages.
    base: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], base: usize) -> Self {
        Self { buf, pos: 0, base }
    }

    pub(crate) fn offset(&self) -> usize {
        self.base + self.pos
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn truncated(&self, what: &'static str) -> WireError {
        WireError::Truncated {
            what,
            offset: self.offset(),
        }
    }

    pub(crate) fn malformed(&self, what: &'static str) -> WireError {
        WireError::Malformed {
            what,
            offset: self.offset(),
        }
    }

    pub(crate) fn bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], WireError> {
        if n > self.remaining() {
            return Err(self.truncated(what));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, WireError> {
        Ok(self.bytes(1, what)?[0])
    }

    pub(crate) fn u32_le(&mut self, what: &'static str) -> Result<u32, WireError> {
        let b = self.bytes(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn u64_le(&mut self, what: &'static str) -> Result<u64, WireError> {
        let b = self.bytes(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    pub(crate) fn varint(&mut self, what: &'static str) -> Result<u64, WireError> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.u8(what)?;
            if i == 9 && b > 1 {
                return Err(self.malformed(what));
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.malformed(what))
    }

    /// A count of items that each take at least one byte: never more than the bytes left, so
    /// no allocation is ever sized by a forged count.
    pub(crate) fn count(&mut self, what: &'static str) -> Result<usize, WireError> {
        let n = self.varint(what)?;
        if n > self.remaining() as u64 {
            return Err(self.malformed(what));
        }
        Ok(n as usize)
    }

    pub(crate) fn str(&mut self, what: &'static str) -> Result<String, WireError> {
        let len = self.count(what)?;
        let offset = self.offset();
        let b = self.bytes(len, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| WireError::Malformed { what, offset })
    }

    /// Splits off the next `len` bytes as a reader of their own (a section).
    pub(crate) fn sub(&mut self, len: usize, what: &'static str) -> Result<Reader<'a>, WireError> {
        let base = self.offset();
        let b = self.bytes(len, what)?;
        Ok(Reader::new(b, base))
    }

    pub(crate) fn finish(&self, what: &'static str) -> Result<(), WireError> {
        if self.remaining() == 0 {
            Ok(())
        } else {
            Err(self.malformed(what))
        }
    }
}

/// How an integer stream is coded (the two `order` bits of a block header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Order {
    /// All values equal: the first value only.
    Const = 0,
    /// Every value on its own.
    Raw = 1,
    /// The first value, then zig-zag differences from the previous value.
    Delta = 2,
    /// The first value, the first difference, then zig-zag differences of differences.
    DeltaDelta = 3,
}

impl Order {
    pub(crate) fn from_bits(bits: u8) -> Order {
        match bits & 3 {
            0 => Order::Const,
            1 => Order::Raw,
            2 => Order::Delta,
            _ => Order::DeltaDelta,
        }
    }
}

/// The first value of a stream: plain for counters, zig-zag for signed (scaled gauge) values.
fn first(v: u64, signed: bool) -> u64 {
    if signed { zigzag(v as i64) } else { v }
}

fn unfirst(v: u64, signed: bool) -> u64 {
    if signed { unzigzag(v) as u64 } else { v }
}

/// Calls `f` with each coded integer of `values` under `order` (wrapping arithmetic, so
/// counter resets and wraps code exactly). `None` when `Const` does not apply.
fn for_each_coded(values: &[u64], signed: bool, order: Order, mut f: impl FnMut(u64)) -> bool {
    let Some(&v0) = values.first() else {
        return true;
    };
    match order {
        Order::Const => {
            if values.iter().any(|&v| v != v0) {
                return false;
            }
            f(first(v0, signed));
        }
        Order::Raw => values.iter().for_each(|&v| f(first(v, signed))),
        Order::Delta => {
            f(first(v0, signed));
            for w in values.windows(2) {
                f(zigzag(w[1].wrapping_sub(w[0]) as i64));
            }
        }
        Order::DeltaDelta => {
            f(first(v0, signed));
            let mut prev_d = 0u64;
            for (i, w) in values.windows(2).enumerate() {
                let d = w[1].wrapping_sub(w[0]);
                f(zigzag(
                    if i == 0 { d } else { d.wrapping_sub(prev_d) } as i64
                ));
                prev_d = d;
            }
        }
    }
    true
}

/// The cheapest order for `values` and its size in bytes.
pub(crate) fn best_int_order(values: &[u64], signed: bool) -> (Order, usize) {
    let mut best = (Order::Raw, usize::MAX);
    for order in [Order::Const, Order::Delta, Order::DeltaDelta, Order::Raw] {
        let mut size = 0;
        if for_each_coded(values, signed, order, |c| size += varint_len(c)) && size < best.1 {
            best = (order, size);
        }
    }
    best
}

pub(crate) fn put_ints(out: &mut Vec<u8>, values: &[u64], signed: bool, order: Order) {
    let ok = for_each_coded(values, signed, order, |c| put_varint(out, c));
    debug_assert!(ok, "Const order chosen for unequal values");
}

pub(crate) fn get_ints(
    r: &mut Reader<'_>,
    n: usize,
    signed: bool,
    order: Order,
) -> Result<Vec<u64>, WireError> {
    const WHAT: &str = "sample value";
    let mut out = Vec::new();
    if n == 0 {
        return Ok(out);
    }
    let v0 = unfirst(r.varint(WHAT)?, signed);
    match order {
        Order::Const => out.resize(n, v0),
        Order::Raw => {
            out.push(v0);
            for _ in 1..n {
                out.push(unfirst(r.varint(WHAT)?, signed));
            }
        }
        Order::Delta | Order::DeltaDelta => {
            out.push(v0);
            let mut prev = v0;
            let mut d = 0u64;
            for i in 1..n {
                let c = unzigzag(r.varint(WHAT)?) as u64;
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
    Ok(out)
}

/// Largest power of ten a scaled decimal may use, and the integer range it may reach (where
/// every integer is an exact f64).
pub(crate) const MAX_DECIMALS: u8 = 15;
const MAX_SCALED: f64 = 9_007_199_254_740_992.0; // 2^53

/// Reads past `n` integers coded as [`get_ints`] reads them, without keeping them (a reader
/// that wants only some series of a frame).
pub(crate) fn skip_ints(r: &mut Reader<'_>, n: usize, order: Order) -> Result<(), WireError> {
    const WHAT: &str = "sample value";
    if n == 0 {
        return Ok(());
    }
    let coded = if order == Order::Const { 1 } else { n };
    for _ in 0..coded {
        r.varint(WHAT)?;
    }
    Ok(())
}

/// Reads past `n` floats coded as [`get_xor`] reads them, without keeping them.
pub(crate) fn skip_xor(r: &mut Reader<'_>, n: usize) -> Result<(), WireError> {
    const WHAT: &str = "XOR float";
    for _ in 0..n {
        let c = r.u8(WHAT)?;
        let (lead, len) = (usize::from(c >> 4), usize::from(c & 0x0f));
        if lead + len > 8 {
            return Err(r.malformed(WHAT));
        }
        r.bytes(len, WHAT)?;
    }
    Ok(())
}

pub(crate) fn pow10(k: u8) -> f64 {
    10f64.powi(i32::from(k))
}

/// The smallest `k` such that every value is exactly `i / 10^k` for an integer `i` below 2^53,
/// with those integers (as two's complement u64). `None` if there is none (NaN, -0.0, values
/// with more digits): those go to the XOR coder.
pub(crate) fn decimal_scale(values: &[f64]) -> Option<(u8, Vec<u64>)> {
    'k: for k in 0..=MAX_DECIMALS {
        let p = pow10(k);
        let mut ints = Vec::with_capacity(values.len());
        for &v in values {
            let i = (v * p).round();
            // Compared through the integer: -0.0 rounds to an i64 0, which is +0.0.
            if i.is_nan()
                || i.abs() >= MAX_SCALED
                || ((i as i64) as f64 / p).to_bits() != v.to_bits()
            {
                continue 'k;
            }
            ints.push(i as i64 as u64);
        }
        return Some((k, ints));
    }
    None
}

/// Rounds a gauge value to `digits` significant decimal digits, leaving integers (and
/// anything not finite) as they are, and never rounding coarser than an integer.
pub(crate) fn round_significant(v: f64, digits: u32) -> f64 {
    if !v.is_finite() || v == v.trunc() || digits == 0 {
        return v;
    }
    let magnitude = v.abs().log10().floor() as i32;
    let k = (digits as i32 - 1 - magnitude).clamp(0, i32::from(MAX_DECIMALS));
    let p = pow10(k as u8);
    let r = (v * p).round() / p;
    if r.is_finite() { r } else { v }
}

/// XOR float coding: each value's bits XOR the previous value's (0 before the first), sent as
/// one control byte (high nibble: leading zero bytes, low nibble: bytes that follow) and the
/// significant bytes, least significant first.
pub(crate) fn xor_size(values: &[f64]) -> usize {
    let mut prev = 0u64;
    let mut size = 0;
    for v in values {
        let x = v.to_bits() ^ prev;
        prev = v.to_bits();
        size += 1 + xor_window(x).1;
    }
    size
}

/// (leading zero bytes, significant bytes) of a XOR word.
fn xor_window(x: u64) -> (usize, usize) {
    if x == 0 {
        return (0, 0);
    }
    let lead = x.leading_zeros() as usize / 8;
    let trail = x.trailing_zeros() as usize / 8;
    (lead, 8 - lead - trail)
}

pub(crate) fn put_xor(out: &mut Vec<u8>, values: &[f64]) {
    let mut prev = 0u64;
    for v in values {
        let x = v.to_bits() ^ prev;
        prev = v.to_bits();
        let (lead, len) = xor_window(x);
        out.push(((lead as u8) << 4) | len as u8);
        let trail = 8 - lead - len;
        if len > 0 {
            out.extend_from_slice(&(x >> (8 * trail)).to_le_bytes()[..len]);
        }
    }
}

pub(crate) fn get_xor(r: &mut Reader<'_>, n: usize) -> Result<Vec<f64>, WireError> {
    const WHAT: &str = "XOR float";
    let mut out = Vec::new();
    let mut prev = 0u64;
    for _ in 0..n {
        let c = r.u8(WHAT)?;
        let (lead, len) = (usize::from(c >> 4), usize::from(c & 0x0f));
        if lead + len > 8 {
            return Err(r.malformed(WHAT));
        }
        let mut x = 0u64;
        if len > 0 {
            let mut le = [0u8; 8];
            le[..len].copy_from_slice(r.bytes(len, WHAT)?);
            x = u64::from_le_bytes(le) << (8 * (8 - lead - len));
        }
        prev ^= x;
        out.push(f64::from_bits(prev));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_sizes_match_the_bytes_written() {
        for v in [
            0,
            1,
            127,
            128,
            16_383,
            16_384,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out.len(), varint_len(v), "{v}");
            assert_eq!(Reader::new(&out, 0).varint("v").unwrap(), v);
        }
    }

    #[test]
    fn zigzag_maps_small_magnitudes_to_small_codes() {
        assert_eq!(zigzag(0), 0);
        assert_eq!(zigzag(-1), 1);
        assert_eq!(zigzag(1), 2);
        for v in [i64::MIN, -5, 0, 7, i64::MAX] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
    }

    #[test]
    fn overlong_varint_is_malformed() {
        let bytes = [0xff; 11];
        assert!(matches!(
            Reader::new(&bytes, 0).varint("v"),
            Err(WireError::Malformed { .. })
        ));
    }

    #[test]
    fn counter_stream_survives_a_reset() {
        let values = [u64::MAX - 2, u64::MAX, 3, 10, 10];
        for order in [Order::Raw, Order::Delta, Order::DeltaDelta] {
            let mut out = Vec::new();
            put_ints(&mut out, &values, false, order);
            let back = get_ints(&mut Reader::new(&out, 0), values.len(), false, order).unwrap();
            assert_eq!(back, values, "{order:?}");
        }
    }

    #[test]
    fn steady_rate_costs_one_byte_per_value_with_delta_of_delta() {
        let values: Vec<u64> = (0..10)
            .map(|i| 1_000_000_000_000 + i * 5_000_000_000)
            .collect();
        let (order, size) = best_int_order(&values, false);
        assert_eq!(order, Order::DeltaDelta);
        // 6 bytes of first value, 5 bytes of first difference, then 8 zeros.
        assert_eq!(size, 6 + 5 + 8);
    }

    #[test]
    fn decimal_scale_finds_the_fewest_digits() {
        assert_eq!(decimal_scale(&[1410.0, 1395.0]).unwrap().0, 0);
        assert_eq!(decimal_scale(&[312.456, 0.5]).unwrap().0, 3);
        assert_eq!(decimal_scale(&[0.1, 0.25]).unwrap().0, 2);
        assert!(decimal_scale(&[1.0 / 3.0]).is_none());
        assert!(decimal_scale(&[-0.0]).is_none());
        assert!(decimal_scale(&[f64::NAN]).is_none());
        assert!(decimal_scale(&[1e300]).is_none());
    }

    #[test]
    fn rounding_keeps_integers_and_the_requested_digits() {
        assert_eq!(round_significant(43.278_391_2, 6), 43.2784);
        assert_eq!(round_significant(0.000_123_456_78, 3), 0.000_123);
        assert_eq!(round_significant(85_899_345_920.0, 6), 85_899_345_920.0);
        assert_eq!(round_significant(123_456_789.25, 4), 123_456_789.0);
        assert!(round_significant(f64::NAN, 6).is_nan());
    }

    #[test]
    fn xor_coder_is_exact_for_every_bit_pattern() {
        let values = [
            0.0,
            -0.0,
            f64::NAN,
            f64::INFINITY,
            f64::MIN_POSITIVE / 2.0,
            0.437_812_9,
            0.437_812_9,
            0.441_1,
        ];
        let mut out = Vec::new();
        put_xor(&mut out, &values);
        assert_eq!(out.len(), xor_size(&values));
        let back = get_xor(&mut Reader::new(&out, 0), values.len()).unwrap();
        let bits = |v: &[f64]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back), bits(&values));
    }
}
