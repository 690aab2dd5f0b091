//! The decoder's memory budget. Parts of a frame refer to other parts (a front-coded string
//! repeats the previous one's prefix, a label set copies strings of the string table, a name
//! group is used by many schema runs), so a few bytes can describe a lot of memory: without
//! a bound, one 64 KB frame with a valid MAC (from a compromised node) could expand into
//! gigabytes of names. The decoder charges each of these allocations (rebuilt strings, label
//! sets, name groups, runs, time table, patterns, blocks, events) to a [`Budget`] of
//! [`DECODE_BYTES_PER_FRAME_BYTE`] bytes per byte of frame before it makes it, and refuses
//! the frame with [`WireError::OverBudget`] when the next one would not fit.
//!
//! Schema entries and samples are bounded by their count instead: the format allows at most
//! [`MAX_FRAME_SAMPLES`] of each per frame, whatever its length. A constant series costs a
//! few bytes for any number of samples, and one run of 3 bytes names a whole group of
//! series, so holding them to a multiple of the frame's length would refuse frames the
//! encoder makes. An entry's name is allocated once per frame and shared.
//!
//! [`MAX_FRAME_SAMPLES`]: crate::MAX_FRAME_SAMPLES

use crate::error::WireError;

/// Bytes the decoder may allocate per byte of frame for what the frame describes by
/// reference: 8 times what the encoder's frames of the reference node need (7.6), and
/// 4 MiB for the largest datagram.
pub(crate) const DECODE_BYTES_PER_FRAME_BYTE: usize = 64;

/// What one frame may still allocate.
#[derive(Debug)]
pub(crate) struct Budget {
    frame_len: usize,
    limit: usize,
    used: usize,
}

impl Budget {
    /// The budget of a frame of `frame_len` bytes.
    pub(crate) fn for_frame(frame_len: usize) -> Self {
        Self {
            frame_len,
            limit: frame_len.saturating_mul(DECODE_BYTES_PER_FRAME_BYTE),
            used: 0,
        }
    }

    /// Takes `bytes` from the budget, before they are allocated for `what`.
    pub(crate) fn charge(&mut self, bytes: usize, what: &'static str) -> Result<(), WireError> {
        match self.used.checked_add(bytes) {
            Some(used) if used <= self.limit => {
                self.used = used;
                Ok(())
            }
            _ => Err(WireError::OverBudget {
                len: self.frame_len,
                limit: self.limit,
                what,
            }),
        }
    }

    /// [`charge`](Budget::charge) for `n` items of `T`.
    pub(crate) fn charge_items<T>(
        &mut self,
        n: usize,
        what: &'static str,
    ) -> Result<(), WireError> {
        self.charge(n.saturating_mul(size_of::<T>()), what)
    }

    /// Bytes charged so far.
    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.used
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        codec::{decode, parse, parse_within},
        encoder::{EncoderConfig, FrameEncoder},
        frame::{FLAG_SCHEMA, MAGIC, SchemaEntry, VERSION},
        mac::{self, MAC_LEN},
        prim::put_varint,
        receiver::{ReceiverLimits, ReceiverState},
        testing::{T0, key, node_batch, peak_allocation},
    };

    /// The largest UDP payload: the largest frame a receiver can be sent.
    const MAX_DATAGRAM: usize = 65_507;

    /// A frame of node `evil` with this schema section, sealed with the cluster's key: what a
    /// compromised node can send.
    fn sealed_schema_frame(schema: &[u8]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&[VERSION, FLAG_SCHEMA, 4]);
        out.extend_from_slice(b"evil");
        out.extend_from_slice(&1u32.to_le_bytes());
        put_varint(&mut out, 0);
        out.extend_from_slice(&T0.to_le_bytes());
        put_varint(&mut out, 1_000_000);
        put_varint(&mut out, schema.len() as u64);
        out.extend_from_slice(schema);
        mac::seal(&mut out, &key());
        out
    }

    /// The header and MAC around a schema section of up to 3 length bytes.
    const OVERHEAD: usize = 4 + 3 + 4 + 4 + 1 + 8 + 3 + 3 + MAC_LEN;

    /// One string of `len` bytes `a` first in the string table.
    fn long_string(len: usize) -> Vec<u8> {
        let mut s = Vec::new();
        put_varint(&mut s, 0);
        put_varint(&mut s, len as u64);
        s.resize(s.len() + len, b'a');
        s
    }

    /// Front coding: a long string, then as many strings as fit that each repeat all of the
    /// previous one and add a byte (ascending, as the spec wants). Returns the frame and the
    /// bytes its strings would take rebuilt.
    fn hostile_strings() -> (Vec<u8>, usize) {
        let first = 30_000;
        let n = (MAX_DATAGRAM - OVERHEAD - first - 10) / 5;
        let mut schema = Vec::new();
        put_varint(&mut schema, n as u64 + 1);
        schema.extend(long_string(first));
        for i in 0..n {
            put_varint(&mut schema, (first + i) as u64);
            put_varint(&mut schema, 1);
            schema.push(b'b');
        }
        schema.extend([0, 0, 0]); // no label sets, groups or runs
        let described = (0..=n).map(|i| first + i).sum();
        (sealed_schema_frame(&schema), described)
    }

    /// Label sets: a long string, then as many label sets as fit whose one pair has it as
    /// both key and value (3 bytes a set, each one copying the string twice).
    fn hostile_label_sets() -> (Vec<u8>, usize) {
        let first = 30_000;
        let n = (MAX_DATAGRAM - OVERHEAD - first - 10) / 3;
        let mut schema = Vec::new();
        put_varint(&mut schema, 1);
        schema.extend(long_string(first));
        put_varint(&mut schema, n as u64);
        for _ in 0..n {
            schema.extend([1, 0, 0]);
        }
        schema.extend([0, 0]); // no groups or runs
        (sealed_schema_frame(&schema), 2 * first * n)
    }

    #[test]
    fn a_hostile_frame_with_a_valid_mac_is_refused_within_its_budget() {
        for (what, (frame, described)) in [
            ("schema string", hostile_strings()),
            ("label set", hostile_label_sets()),
        ] {
            assert!(frame.len() <= MAX_DATAGRAM, "{what}: {} bytes", frame.len());
            // What the frame asks for: hundreds of megabytes from one datagram.
            assert!(described > 100 << 20, "{what}: {described} bytes described");
            let mut state = ReceiverState::default();
            let (result, peak) = peak_allocation(|| decode(&frame, &key(), &mut state));
            let limit = (frame.len() - MAC_LEN) * DECODE_BYTES_PER_FRAME_BYTE;
            eprintln!(
                "{what}: a {}-byte frame describes {described} bytes; decoding allocated at most {peak} (budget {limit})",
                frame.len()
            );
            assert_eq!(
                result.unwrap_err(),
                WireError::OverBudget {
                    len: frame.len() - MAC_LEN,
                    limit,
                    what,
                }
            );
            assert!(
                peak <= limit,
                "{what}: {peak} bytes allocated, budget {limit}"
            );
            assert!(state.node("evil").is_none(), "nothing of it is kept");
        }
    }

    #[test]
    fn a_name_shared_by_many_entries_is_allocated_once() {
        // One long name, one group of it 64 times, runs of that group up to the 65,536
        // entries a frame may describe: once a copy per entry (2 GB), now one copy in all.
        let first = 30_000;
        let mut schema = Vec::new();
        put_varint(&mut schema, 1);
        schema.extend(long_string(first));
        schema.extend([1, 0]); // one label set, empty
        schema.push(1); // one group
        put_varint(&mut schema, 64);
        schema.extend([0; 64]); // name 0, counter
        put_varint(&mut schema, 1024);
        for _ in 0..1024 {
            schema.extend([0, 0, 0]); // the expected id, label set 0, group 0
        }
        let frame = sealed_schema_frame(&schema);
        let body = &frame[..frame.len() - MAC_LEN];
        let (decoded, peak) = peak_allocation(|| parse(body).unwrap());
        assert_eq!(decoded.schema.len(), 65_536);
        let (first, last) = (&decoded.schema[0].series, &decoded.schema[65_535].series);
        assert!(Arc::ptr_eq(&first.name, &last.name), "one copy of the name");
        // The budget, and the entries themselves (bounded by their count, as samples are).
        let limit = body.len() * DECODE_BYTES_PER_FRAME_BYTE;
        let entries = 65_536 * size_of::<SchemaEntry>();
        assert!(
            peak <= limit + entries,
            "{peak} bytes allocated, budget {limit} + {entries} for the entries"
        );
        let mut state = ReceiverState::default();
        decode(&frame, &key(), &mut state).unwrap();
        // The receiver keeps what its per-node limit allows and counts the rest.
        let node = state.node("evil").unwrap();
        let limits = ReceiverLimits::default();
        assert!(node.schema_bytes() <= limits.max_schema_bytes_per_node);
        assert!(node.known_series() > 0);
        assert_eq!(
            node.known_series() as u64 + node.schema_refused,
            65_536,
            "every entry is either kept or counted as refused"
        );
        assert_eq!(node.last.schema_refused, node.schema_refused);
    }

    #[test]
    fn the_encoders_frames_use_a_small_part_of_the_budget() {
        // The reference node (8 GPUs x 40 gauges, 8 ports x 50 counters, 10 sweeps): its
        // first flush carries every schema entry, with long random GPU UUIDs.
        let mut encoder = FrameEncoder::new(EncoderConfig::new("gpu-node-017"), key()).unwrap();
        for r in &node_batch(10) {
            encoder.push_reading(r).unwrap();
        }
        let mut most = 0.0f64;
        for frame in encoder.flush(T0 + 10_000_000_000) {
            let body = &frame[..frame.len() - MAC_LEN];
            let mut budget = Budget::for_frame(body.len());
            parse_within(body, &mut budget).unwrap();
            most = most.max(budget.used() as f64 / body.len() as f64);
        }
        // Bytes decoded per frame byte, at most: well under the budget.
        eprintln!("at most {most:.1} bytes charged per frame byte");
        assert!(
            most * 4.0 <= DECODE_BYTES_PER_FRAME_BYTE as f64,
            "{most:.1} bytes per frame byte"
        );
    }
}
