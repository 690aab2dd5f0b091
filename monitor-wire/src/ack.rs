//! Acknowledgements: what a collector tells an agent it holds durably of one session
//! (docs/wire-format.md, "Acknowledgements"). Cumulative — every frame below the floor is
//! settled — with the gaps above it, so one lost acknowledgement costs nothing: the next one
//! says it all again.

use crate::{
    error::WireError,
    key::Key,
    mac::{self, MAC_LEN},
    prim::{Reader, put_varint, varint_len},
    request::{read_reply_head, reply_head},
    seqset::{self, SeqSet},
};

/// Magic of an acknowledgement.
pub const ACK_MAGIC: [u8; 4] = *b"RSWA";
/// The smallest acknowledgement: magic, version, an empty node name, session, floor 0, no
/// ranges, MAC.
pub(crate) const MIN_ACK_LEN: usize = 4 + 1 + 1 + 4 + 1 + 1 + MAC_LEN;

/// What a collector holds of one agent session: every frame below `floor`, and the `held`
/// ranges above it; the numbers between are the gaps it lacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ack {
    pub node: String,
    pub session: u32,
    /// Every frame below this is settled (archived, or given up by the collector).
    pub floor: u64,
    /// Held ranges `[start, end)` above the floor, in order, with a gap before each.
    pub held: Vec<(u64, u64)>,
}

impl Ack {
    /// What `set` holds, as an acknowledgement.
    pub fn of(node: &str, session: u32, set: &SeqSet) -> Self {
        Self {
            node: node.to_owned(),
            session,
            floor: set.floor(),
            held: set.ranges().to_vec(),
        }
    }

    /// Whether the collector holds (or has settled) frame `seq`.
    pub fn holds(&self, seq: u64) -> bool {
        seqset::holds(self.floor, &self.held, seq)
    }

    /// One more than the highest frame it holds.
    pub fn end(&self) -> u64 {
        seqset::end(self.floor, &self.held)
    }
}

/// Encodes an acknowledgement, authenticated like a frame, in at most `max_len` bytes (at
/// least `MIN_ACK_LEN` plus the node name): held ranges that do not fit are left out,
/// highest first (the agent sends those frames again later, and the collector acknowledges
/// them then), so an acknowledgement is never larger than what it answers.
pub fn encode_ack(ack: &Ack, key: &Key, max_len: usize) -> Result<Vec<u8>, WireError> {
    let mut head = reply_head(ACK_MAGIC, &ack.node, ack.session)?;
    put_varint(&mut head, ack.floor);
    let mut pairs = Vec::new();
    let mut count = 0u64;
    let mut from = ack.floor;
    for &(start, end) in &ack.held {
        if start <= from || end <= start {
            return Err(WireError::Malformed {
                what: "acknowledged ranges (not above the floor, in order and apart)",
                offset: 0,
            });
        }
        let before = pairs.len();
        put_varint(&mut pairs, start - from);
        put_varint(&mut pairs, end - start);
        let len = head.len() + varint_len(count + 1) + pairs.len() + MAC_LEN;
        if len > max_len {
            pairs.truncate(before);
            break;
        }
        count += 1;
        from = end;
    }
    let mut out = head;
    put_varint(&mut out, count);
    out.extend_from_slice(&pairs);
    mac::seal(&mut out, key);
    Ok(out)
}

/// Decodes an acknowledgement: the MAC first, then every field exactly. Ranges that overflow,
/// are empty or touch each other are malformed.
pub fn decode_ack(bytes: &[u8], key: &Key) -> Result<Ack, WireError> {
    let body = mac::verify(bytes, key, MIN_ACK_LEN)?;
    let mut r = Reader::new(body, 0);
    let (node, session) = read_reply_head(&mut r, ACK_MAGIC)?;
    let floor = r.varint("floor")?;
    let offset = r.offset();
    let count = r.varint("range count")?;
    // Each range takes at least two bytes: a count beyond that is a lie, not an allocation.
    if count > (body.len() / 2) as u64 {
        return Err(WireError::Malformed {
            what: "range count",
            offset,
        });
    }
    let mut held = Vec::with_capacity(count as usize);
    let mut from = floor;
    for _ in 0..count {
        let offset = r.offset();
        let gap = r.varint("gap")?;
        let len = r.varint("held")?;
        let bad = || WireError::Malformed {
            what: "acknowledged range",
            offset,
        };
        if gap == 0 || len == 0 {
            return Err(bad());
        }
        let start = from.checked_add(gap).ok_or_else(bad)?;
        let end = start.checked_add(len).ok_or_else(bad)?;
        held.push((start, end));
        from = end;
    }
    r.finish("acknowledgement")?;
    Ok(Ack {
        node,
        session,
        floor,
        held,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{request::decode_schema_request, testing::key};

    fn ack() -> Ack {
        Ack {
            node: "gpu-node-017".into(),
            session: 0xdead_beef,
            floor: 1000,
            held: vec![(1003, 1010), (1012, 1013)],
        }
    }

    #[test]
    fn acknowledgements_round_trip_and_refuse_anything_else() {
        let ack = ack();
        let bytes = encode_ack(&ack, &key(), 1400).unwrap();
        assert_eq!(decode_ack(&bytes, &key()), Ok(ack.clone()));
        assert!(ack.holds(999) && !ack.holds(1000) && ack.holds(1009) && !ack.holds(1010));
        let gaps: Vec<u64> = (1000..1013).filter(|&s| !ack.holds(s)).collect();
        assert_eq!(gaps, [1000, 1001, 1002, 1010, 1011], "the gaps it names");
        assert_eq!(ack.end(), 1013);
        assert!(matches!(
            decode_ack(&bytes, &Key::from_bytes([7; 32])),
            Err(WireError::BadMac { .. })
        ));
        for len in 0..bytes.len() {
            assert!(decode_ack(&bytes[..len], &key()).is_err(), "{len}");
        }
        for bit in 0..bytes.len() * 8 {
            let mut flipped = bytes.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(decode_ack(&flipped, &key()).is_err(), "bit {bit}");
        }
        assert_eq!(
            decode_schema_request(&bytes, &key()),
            Err(WireError::BadMagic),
            "an acknowledgement is not a schema request"
        );
    }

    #[test]
    fn ranges_that_do_not_fit_are_left_out_highest_first() {
        let ack = Ack {
            held: (0..100).map(|i| (1001 + 3 * i, 1002 + 3 * i)).collect(),
            ..ack()
        };
        let whole = encode_ack(&ack, &key(), usize::MAX).unwrap();
        let short = encode_ack(&ack, &key(), 60).unwrap();
        assert!(short.len() <= 60 && whole.len() > 60);
        let decoded = decode_ack(&short, &key()).unwrap();
        assert!(!decoded.held.is_empty());
        assert_eq!(decoded.held[..], ack.held[..decoded.held.len()]);
    }

    /// docs/wire-format.md, "Acknowledgements": the worked example, byte for byte.
    #[test]
    fn worked_example_of_the_spec() {
        let key = Key::from_bytes(std::array::from_fn(|i| i as u8));
        let ack = Ack {
            node: "n1".into(),
            session: 0x0102_0304,
            floor: 5,
            held: vec![(7, 9), (12, 13)],
        };
        let bytes = encode_ack(&ack, &key, 1400).unwrap();
        let spec = "52 53 57 41 01 02 6e 31 04 03 02 01 05 02 02 02 03 01 \
                    5a f3 b1 96 20 bb 54 ff 3d 1e fd e5 73 70 47 90";
        let spec: Vec<u8> = spec
            .split_whitespace()
            .map(|b| u8::from_str_radix(b, 16).unwrap())
            .collect();
        assert_eq!(bytes, spec);
        assert_eq!(decode_ack(&spec, &key), Ok(ack));
    }

    #[test]
    fn an_acknowledgement_of_a_set_says_what_the_set_holds() {
        let mut set = SeqSet::default();
        for seq in [0, 1, 2, 5, 6, 9] {
            set.insert(seq);
        }
        let ack = Ack::of("n", 1, &set);
        for seq in 0..12 {
            assert_eq!(ack.holds(seq), set.contains(seq), "{seq}");
        }
        let bytes = encode_ack(&ack, &key(), 1400).unwrap();
        assert_eq!(
            bytes.len(),
            MIN_ACK_LEN + 1 + 4,
            "floor 3, two ranges of 2 bytes"
        );
    }
}
