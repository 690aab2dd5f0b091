//! Bit-packed integer columns of a re-coded block (frame of reference per chunk).
//!
//! A column's values, or their differences, or the differences of those, are cut into chunks
//! of [`CHUNK`] values; each chunk is written as its smallest value and the bits every value
//! needs above it, then each value minus that base in exactly that many bits. A varint
//! spends whole bytes and a continuation bit per 7 bits, and what zstd makes of them after
//! is shared with everything else in the block: noisy gauges and fast counters, whose low
//! bits are random, cost close to their entropy only packed. The first values of a column
//! under a difference order (its start value, its first difference) are far from the rest
//! and are written apart, as `svarint`s, so they do not widen the first chunk; any other
//! outlier (a counter reset, a gap) widens only its own chunk.

use super::{Cursor, put_varint, unzigzag, zigzag};

/// Values per chunk: each chunk pays its base and width (2 to 11 bytes).
const CHUNK: usize = 128;

/// What is packed: the values (0), their differences (1), or the differences of those (2);
/// all wrapping, as 64-bit two's complement.
pub(super) const ORDERS: [u8; 3] = [0, 1, 2];

/// The `order` differences of `values` (each minus the previous one, 0 before the first).
fn differences(values: &[u64], order: u8) -> Vec<u64> {
    let mut t = values.to_vec();
    for _ in 0..order {
        let mut prev = 0u64;
        for x in t.iter_mut() {
            (*x, prev) = (x.wrapping_sub(prev), *x);
        }
    }
    t
}

/// Undoes [`differences`] in place.
fn sums(t: &mut [u64], order: u8) {
    for _ in 0..order {
        let mut acc = 0u64;
        for x in t.iter_mut() {
            acc = acc.wrapping_add(*x);
            *x = acc;
        }
    }
}

/// Base (smallest, as signed) and bit width of a chunk.
fn frame_of(chunk: &[u64]) -> (i64, u32) {
    let (mut lo, mut hi) = (i64::MAX, i64::MIN);
    for &x in chunk {
        lo = lo.min(x as i64);
        hi = hi.max(x as i64);
    }
    (lo, 64 - (hi.wrapping_sub(lo) as u64).leading_zeros())
}

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// The column under `order`, and the bytes [`put`] would write for it.
pub(super) fn plan(values: &[u64], order: u8) -> (Vec<u64>, usize) {
    let t = differences(values, order);
    let head = usize::from(order).min(t.len());
    let mut size: usize = t[..head]
        .iter()
        .map(|&x| varint_len(zigzag(x as i64)))
        .sum();
    for chunk in t[head..].chunks(CHUNK) {
        let (base, width) = frame_of(chunk);
        size += varint_len(zigzag(base)) + 1 + (chunk.len() * width as usize).div_ceil(8);
    }
    (t, size)
}

/// Writes a column planned with `order` ([`plan`]'s first result).
pub(super) fn put(out: &mut Vec<u8>, t: &[u64], order: u8) {
    let head = usize::from(order).min(t.len());
    for &x in &t[..head] {
        put_varint(out, zigzag(x as i64));
    }
    for chunk in t[head..].chunks(CHUNK) {
        let (base, width) = frame_of(chunk);
        put_varint(out, zigzag(base));
        out.push(width as u8);
        let (mut acc, mut bits) = (0u128, 0u32);
        for &x in chunk {
            acc |= u128::from(x.wrapping_sub(base as u64)) << bits;
            bits += width;
            while bits >= 8 {
                out.push(acc as u8);
                acc >>= 8;
                bits -= 8;
            }
        }
        if bits > 0 {
            out.push(acc as u8);
        }
    }
}

/// Reads `n` values of a column written by [`put`] with `order`.
pub(super) fn get(c: &mut Cursor<'_>, n: usize, order: u8) -> Option<Vec<u64>> {
    let head = usize::from(order).min(n);
    // A chunk takes at least 2 bytes: a count beyond what the bytes left can hold is corrupt,
    // and the values are allocated as their chunks are read, not ahead for the count.
    if n > head + c.rest().saturating_mul(CHUNK / 2) {
        return None;
    }
    let mut t = Vec::with_capacity(n.min(CHUNK));
    for _ in 0..head {
        t.push(unzigzag(c.varint()?) as u64);
    }
    let mut left = n - head;
    while left > 0 {
        let len = left.min(CHUNK);
        left -= len;
        let base = unzigzag(c.varint()?) as u64;
        let width = u32::from(c.u8()?);
        if width > 64 {
            return None;
        }
        let bytes = c.bytes((len * width as usize).div_ceil(8))?;
        t.reserve(len);
        let mask = (1u128 << width) - 1;
        let (mut acc, mut bits, mut at) = (0u128, 0u32, 0);
        for _ in 0..len {
            while bits < width {
                acc |= u128::from(bytes[at]) << bits;
                at += 1;
                bits += 8;
            }
            t.push(((acc & mask) as u64).wrapping_add(base));
            acc >>= width;
            bits -= width;
        }
        // Padding bits are zero: anything else is damage.
        if acc != 0 {
            return None;
        }
    }
    sums(&mut t, order);
    Some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(values: &[u64]) -> Vec<usize> {
        ORDERS
            .iter()
            .map(|&order| {
                let (t, size) = plan(values, order);
                let mut out = Vec::new();
                put(&mut out, &t, order);
                assert_eq!(out.len(), size, "planned size, order {order}");
                out.push(0xAA);
                let mut c = Cursor::new(&out);
                assert_eq!(
                    get(&mut c, values.len(), order).as_deref(),
                    Some(values),
                    "order {order}"
                );
                assert_eq!(c.rest(), 1, "order {order} reads exactly its bytes");
                size
            })
            .collect()
    }

    #[test]
    fn every_order_gives_back_the_values_bit_for_bit_edge_values_included() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let specials = [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -0.0,
            0.0,
            1e-300,
        ];
        let columns: Vec<Vec<u64>> = vec![
            vec![],
            vec![7],
            vec![u64::MAX, 0],
            // A huge counter that wraps, then resets to 0 and starts again.
            (0..300u64)
                .map(|i| {
                    if i < 200 {
                        (u64::MAX - 50_000).wrapping_add(i * 1_000)
                    } else {
                        i * 3
                    }
                })
                .collect(),
            // Signed decimals around 0 and the extremes of i64.
            (0..257)
                .map(|i: i64| [i - 128, i64::MIN, i64::MAX, -1][(i % 4) as usize] as u64)
                .collect(),
            // Random bits of every width, and float bits of NaN, infinities, -0.0.
            (0..1000).map(|i| next() >> (i % 65).min(63)).collect(),
            (0..129).map(|i| specials[i % 6].to_bits()).collect(),
            vec![i64::MIN as u64; 130],
        ];
        for values in &columns {
            round_trip(values);
        }
    }

    #[test]
    fn noise_around_a_level_costs_its_bits_not_whole_varint_bytes() {
        // A gauge moving by up to ±2^20 around 10^11 (an NVLink throughput): 21 bits a value
        // packed around the chunk's smallest one.
        let mut rng = 12345u64;
        let values: Vec<u64> = (0..1280)
            .map(|_| {
                rng = rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                100_000_000_000 + (rng >> 44)
            })
            .collect();
        let sizes = round_trip(&values);
        // Order 0: 1280 x 20 bits, and ten chunk headers of at most 8 bytes.
        assert!(sizes[0] <= 1280 * 20 / 8 + 80, "{sizes:?}");
        // Differences of i.i.d. noise take a bit more.
        assert!(sizes[1] > sizes[0], "{sizes:?}");
    }

    #[test]
    fn damaged_packed_columns_are_refused() {
        let values: Vec<u64> = (0..200).map(|i| i * i).collect();
        let (t, _) = plan(&values, 1);
        let mut out = Vec::new();
        put(&mut out, &t, 1);
        // Cut short.
        assert_eq!(get(&mut Cursor::new(&out[..out.len() - 1]), 200, 1), None);
        // A count the bytes cannot hold (a width-0 chunk of 128 values takes 2 bytes).
        assert_eq!(get(&mut Cursor::new(&out), 1 << 40, 1), None);
        // A width above 64. The first chunk's width byte follows the head (the first value,
        // 0) and the chunk's base (1, the smallest difference): the first chunk's differences go to 255.
        let mut wide = out.clone();
        assert_eq!(wide[..3], [0, 2, 8]);
        wide[2] = 65;
        assert_eq!(get(&mut Cursor::new(&wide), 200, 1), None);
    }
}
