//! The timing of an acknowledgement (docs/wire-format.md, "Acknowledgement timing"): with each
//! acknowledgement a collector says when it received the newest frame the acknowledgement
//! answers for and when it answered, on its own clock. With the agent's own times of sending
//! that frame and of receiving this, that is one NTP-style exchange, from which the agent
//! estimates how far its clock is from the collector's ([`crate::clock_offset`]).
//!
//! Why a datagram of its own and not fields of the acknowledgement: an agent of before it reads
//! every field of an acknowledgement exactly and refuses one with a byte more, so a collector
//! that added fields would have every acknowledgement of an older agent refused (its spool
//! would never drain), and agents may be upgraded after their collector (docs/deployment.md).
//! An older agent ignores a datagram of a magic it does not know.

use crate::{
    error::WireError,
    key::Key,
    mac::{self, MAC_LEN},
    prim::{Reader, put_varint},
    request::{read_reply_head, reply_head},
};

/// Magic of an acknowledgement's timing.
pub const TIMING_MAGIC: [u8; 4] = *b"RSWT";
/// The smallest timing: magic, version, an empty node name, session, seq 0, two times, MAC.
pub(crate) const MIN_TIMING_LEN: usize = 4 + 1 + 1 + 4 + 1 + 8 + 8 + MAC_LEN;

/// One exchange as the collector saw it: frame `seq` of the session arrived at `received_ns`
/// and the acknowledgement that answers for it left at `sent_ns` (Unix ns, the collector's
/// clock: NTP's t2 and t3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AckTiming {
    pub node: String,
    pub session: u32,
    pub seq: u64,
    pub received_ns: u64,
    pub sent_ns: u64,
}

impl AckTiming {
    /// Its length encoded (no larger than an acknowledgement's budget allows, the collector
    /// leaves it out).
    pub fn encoded_len(&self) -> usize {
        MIN_TIMING_LEN - 1 + self.node.len() + crate::prim::varint_len(self.seq)
    }
}

/// Encodes a timing, authenticated like a frame (with the key the node's frames carry).
pub fn encode_timing(timing: &AckTiming, key: &Key) -> Result<Vec<u8>, WireError> {
    let mut out = reply_head(TIMING_MAGIC, &timing.node, timing.session)?;
    put_varint(&mut out, timing.seq);
    out.extend_from_slice(&timing.received_ns.to_le_bytes());
    out.extend_from_slice(&timing.sent_ns.to_le_bytes());
    mac::seal(&mut out, key);
    Ok(out)
}

/// Decodes a timing: the MAC first, then every field exactly. A timing that answers before
/// it received is malformed: no clock makes that.
pub fn decode_timing(bytes: &[u8], key: &Key) -> Result<AckTiming, WireError> {
    let body = mac::verify(bytes, key, MIN_TIMING_LEN)?;
    let mut r = Reader::new(body, 0);
    let (node, session) = read_reply_head(&mut r, TIMING_MAGIC)?;
    let seq = r.varint("seq")?;
    let offset = r.offset();
    let received_ns = r.u64_le("receive time")?;
    let sent_ns = r.u64_le("send time")?;
    if sent_ns < received_ns {
        return Err(WireError::Malformed {
            what: "timing (answered before received)",
            offset,
        });
    }
    r.finish("acknowledgement timing")?;
    Ok(AckTiming {
        node,
        session,
        seq,
        received_ns,
        sent_ns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ack::decode_ack, request::decode_schema_request, testing::key};

    fn timing() -> AckTiming {
        AckTiming {
            node: "gpu-node-017".into(),
            session: 0xdead_beef,
            seq: 1012,
            received_ns: 1_790_000_000_123_456_789,
            sent_ns: 1_790_000_001_000_000_000,
        }
    }

    #[test]
    fn timings_round_trip_and_refuse_anything_else() {
        let t = timing();
        let bytes = encode_timing(&t, &key()).unwrap();
        assert_eq!(bytes.len(), t.encoded_len());
        assert_eq!(decode_timing(&bytes, &key()), Ok(t.clone()));
        assert!(matches!(
            decode_timing(&bytes, &Key::from_bytes([7; 32])),
            Err(WireError::BadMac { .. })
        ));
        for len in 0..bytes.len() {
            assert!(decode_timing(&bytes[..len], &key()).is_err(), "{len}");
        }
        for bit in 0..bytes.len() * 8 {
            let mut flipped = bytes.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(decode_timing(&flipped, &key()).is_err(), "bit {bit}");
        }
        // Neither an acknowledgement nor a schema request, nor taken for one.
        assert_eq!(decode_ack(&bytes, &key()), Err(WireError::BadMagic));
        assert_eq!(
            decode_schema_request(&bytes, &key()),
            Err(WireError::BadMagic)
        );
    }

    #[test]
    fn a_timing_that_answers_before_it_received_is_refused_by_name() {
        let t = AckTiming {
            sent_ns: timing().received_ns - 1,
            ..timing()
        };
        let bytes = encode_timing(&t, &key()).unwrap();
        let e = decode_timing(&bytes, &key()).unwrap_err();
        assert!(
            matches!(e, WireError::Malformed { what, .. } if what.contains("answered before")),
            "{e}"
        );
    }

    #[test]
    fn a_byte_more_or_another_version_is_refused() {
        let t = timing();
        let mut body = encode_timing(&t, &key()).unwrap();
        body.truncate(body.len() - MAC_LEN);
        let mut longer = body.clone();
        longer.push(0);
        mac::seal(&mut longer, &key());
        assert!(matches!(
            decode_timing(&longer, &key()),
            Err(WireError::Malformed { .. })
        ));
        let mut newer = body;
        newer[4] = 2;
        mac::seal(&mut newer, &key());
        assert_eq!(
            decode_timing(&newer, &key()),
            Err(WireError::UnsupportedVersion(2))
        );
    }

    /// docs/wire-format.md, "Acknowledgement timing": the worked example, byte for byte.
    #[test]
    fn worked_example_of_the_spec() {
        let key = Key::from_bytes(std::array::from_fn(|i| i as u8));
        let t = AckTiming {
            node: "n1".into(),
            session: 0x0102_0304,
            seq: 12,
            received_ns: 0x1800_0000_0000_0001,
            sent_ns: 0x1800_0000_3b9a_ca01,
        };
        let bytes = encode_timing(&t, &key).unwrap();
        let spec = "52 53 57 54 01 02 6e 31 04 03 02 01 0c 01 00 00 00 00 00 00 18 \
                    01 ca 9a 3b 00 00 00 18 f2 d4 c2 71 cb aa bb e2 03 d5 67 17 a4 2d f1 50";
        let spec: Vec<u8> = spec
            .split_whitespace()
            .map(|b| u8::from_str_radix(b, 16).unwrap())
            .collect();
        let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(bytes, spec, "{}", hex.join(" "));
        assert_eq!(decode_timing(&spec, &key), Ok(t));
    }
}
