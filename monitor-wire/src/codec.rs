//! One frame as bytes: the header, the sections in order (each delegated to its codec:
//! [`schema`](crate::schema), [`samples`](crate::samples), [`events`](crate::events)) and the
//! MAC. [`decode`] is a receiver's entry point.

use crate::{
    budget::Budget,
    error::WireError,
    events::{encode_events, parse_events},
    frame::{
        DEFAULT_MTU, FLAG_EVENTS, FLAG_SAMPLES, FLAG_SCHEMA, Frame, MAGIC, MAX_FRAME_SAMPLES,
        MIN_FRAME_LEN, SchemaEntry, SeriesSamples, VERSION, WireEvent,
    },
    key::Key,
    mac,
    prim::{Reader, put_varint},
    receiver::ReceiverState,
    samples::{PreparedBlock, TimePatterns, encode_prepared, parse_samples},
    schema::{encode_schema, parse_schema, parse_schema_where},
    series::Series,
};

/// Writes `frame` as one datagram, MAC included. Sample times are rounded to the frame's
/// time quantum; everything else round-trips exactly (floats bit for bit). Size is not
/// limited here: [`FrameEncoder`](crate::FrameEncoder) is what keeps frames within an MTU.
pub fn encode_frame(frame: &Frame, key: &Key) -> Result<Vec<u8>, WireError> {
    if frame.time_quantum_ns == 0 {
        return Err(WireError::Quantum);
    }
    let mut patterns = TimePatterns::default();
    let blocks = frame
        .samples
        .iter()
        .map(|s| PreparedBlock::new(s, frame.time_quantum_ns, &mut patterns))
        .collect::<Result<Vec<_>, _>>()?;
    let view = FrameView {
        node: &frame.node,
        session: frame.session,
        seq: frame.seq,
        send_unix_ns: frame.send_unix_ns,
        time_quantum_ns: frame.time_quantum_ns,
        schema: frame.schema.iter().map(|e| (e.id, &e.series)).collect(),
        samples: blocks.iter().collect(),
        events: frame.events.iter().collect(),
    };
    let mut out = Vec::with_capacity(DEFAULT_MTU);
    view.encode_unsealed(&mut patterns, &mut out, &mut Vec::new())?;
    mac::seal(&mut out, key);
    Ok(out)
}

/// A frame to encode, by reference (the encoder tries several cuts of one batch), its
/// samples as blocks coded once for all cuts.
pub(crate) struct FrameView<'a> {
    pub node: &'a str,
    pub session: u32,
    pub seq: u64,
    pub send_unix_ns: u64,
    pub time_quantum_ns: u64,
    pub schema: Vec<(u32, &'a Series)>,
    pub samples: Vec<&'a PreparedBlock>,
    pub events: Vec<&'a WireEvent>,
}

impl FrameView<'_> {
    /// Writes the frame without its MAC ([`mac::seal`] adds it) to `out`, which is cleared
    /// first; `samples` must be the patterns its blocks were prepared with, `section` is
    /// scratch. Returns the bytes of the schema section, its length prefix included.
    pub(crate) fn encode_unsealed(
        &self,
        patterns: &mut TimePatterns,
        out: &mut Vec<u8>,
        section: &mut Vec<u8>,
    ) -> Result<usize, WireError> {
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
        flags |= if self.schema.is_empty() {
            0
        } else {
            FLAG_SCHEMA
        };
        flags |= if self.samples.is_empty() {
            0
        } else {
            FLAG_SAMPLES
        };
        flags |= if self.events.is_empty() {
            0
        } else {
            FLAG_EVENTS
        };

        out.clear();
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.push(flags);
        out.push(self.node.len() as u8);
        out.extend_from_slice(self.node.as_bytes());
        out.extend_from_slice(&self.session.to_le_bytes());
        put_varint(out, self.seq);
        out.extend_from_slice(&self.send_unix_ns.to_le_bytes());
        put_varint(out, self.time_quantum_ns);
        let mut schema_bytes = 0;
        if !self.schema.is_empty() {
            let body = encode_schema(&self.schema);
            let start = out.len();
            put_varint(out, body.len() as u64);
            out.extend_from_slice(&body);
            schema_bytes = out.len() - start;
        }
        if !self.samples.is_empty() {
            section.clear();
            encode_prepared(
                &self.samples,
                patterns,
                self.send_unix_ns,
                self.time_quantum_ns,
                section,
            )?;
            put_varint(out, section.len() as u64);
            out.extend_from_slice(section);
        }
        if !self.events.is_empty() {
            let body = encode_events(&self.events, self.send_unix_ns);
            put_varint(out, body.len() as u64);
            out.extend_from_slice(&body);
        }
        Ok(schema_bytes)
    }
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
pub(crate) fn read_header(r: &mut Reader<'_>, magic: [u8; 4]) -> Result<(), WireError> {
    if r.bytes(4, "magic")? != magic {
        return Err(WireError::BadMagic);
    }
    let version = r.u8("version")?;
    if version != VERSION {
        return Err(WireError::UnsupportedVersion(version));
    }
    Ok(())
}

/// Parses authenticated bytes (the frame without its MAC), within the memory budget of a
/// frame of their length.
pub(crate) fn parse(body: &[u8]) -> Result<Frame, WireError> {
    parse_within(body, &mut Budget::for_frame(body.len()))
}

pub(crate) fn parse_within(body: &[u8], budget: &mut Budget) -> Result<Frame, WireError> {
    let (head, mut r) = parse_head(body)?;
    let schema = match section(&mut r, head.flags & FLAG_SCHEMA, "schema section")? {
        Some(mut s) => parse_schema(&mut s, budget)?,
        None => Vec::new(),
    };
    let samples = match section(&mut r, head.flags & FLAG_SAMPLES, "samples section")? {
        Some(mut s) => {
            let samples = parse_samples(
                &mut s,
                head.send_unix_ns,
                head.time_quantum_ns,
                budget,
                &mut |_| true,
            )?;
            s.finish("samples section length")?;
            samples
        }
        None => Vec::new(),
    };
    let events = match section(&mut r, head.flags & FLAG_EVENTS, "events section")? {
        Some(mut s) => parse_events(&mut s, head.send_unix_ns, budget)?,
        None => Vec::new(),
    };
    r.finish("frame length")?;
    Ok(Frame {
        node: head.node.to_owned(),
        session: head.session,
        seq: head.seq,
        send_unix_ns: head.send_unix_ns,
        time_quantum_ns: head.time_quantum_ns,
        schema,
        samples,
        events,
    })
}

/// A frame's header fields, borrowed from its bytes.
struct Head<'a> {
    flags: u8,
    node: &'a str,
    session: u32,
    seq: u64,
    send_unix_ns: u64,
    time_quantum_ns: u64,
}

/// Parses the header; the reader is left at the first section.
fn parse_head(body: &[u8]) -> Result<(Head<'_>, Reader<'_>), WireError> {
    let mut r = Reader::new(body, 0);
    read_header(&mut r, MAGIC)?;
    let flags = r.u8("flags")?;
    if flags & !(FLAG_SCHEMA | FLAG_SAMPLES | FLAG_EVENTS) != 0 {
        return Err(r.malformed("flags"));
    }
    let node_len = usize::from(r.u8("node name")?);
    let offset = r.offset();
    let node =
        std::str::from_utf8(r.bytes(node_len, "node name")?).map_err(|_| WireError::Malformed {
            what: "node name",
            offset,
        })?;
    let session = r.u32_le("session")?;
    let seq = r.varint("sequence number")?;
    let send_unix_ns = r.u64_le("send time")?;
    let time_quantum_ns = r.varint("time quantum")?;
    if time_quantum_ns == 0 {
        return Err(r.malformed("time quantum"));
    }
    let head = Head {
        flags,
        node,
        session,
        seq,
        send_unix_ns,
        time_quantum_ns,
    };
    Ok((head, r))
}

/// A frame read back from storage (a collector's archive), parsed in steps: the MAC is
/// checked and the header and schema entries are parsed by [`open_stored`]; the samples, of
/// only the series the reader wants, and the events on demand. A query over one metric so
/// decodes only that metric's samples; nothing is accounted in a [`ReceiverState`].
pub struct StoredFrame<'a> {
    pub node: &'a str,
    pub session: u32,
    pub seq: u64,
    pub send_unix_ns: u64,
    pub time_quantum_ns: u64,
    pub schema: Vec<SchemaEntry>,
    /// The series ids the schema section defines, those of entries not kept too (see
    /// [`open_stored_where`]).
    pub defined: Vec<std::ops::Range<u32>>,
    samples: Option<Reader<'a>>,
    events: Option<Reader<'a>>,
    budget_len: usize,
}

/// Checks a stored frame's MAC and parses its header and schema entries (within the memory
/// budget of [`decode`]).
pub fn open_stored<'a>(bytes: &'a [u8], key: &Key) -> Result<StoredFrame<'a>, WireError> {
    open_stored_where(bytes, key, &mut |_| true)
}

/// [`open_stored`] whose schema holds only the entries of series whose name `keep` accepts
/// (a reader that asks about some metrics: the others' entries are checked, not made).
pub fn open_stored_where<'a>(
    bytes: &'a [u8],
    key: &Key,
    keep: &mut dyn FnMut(&str) -> bool,
) -> Result<StoredFrame<'a>, WireError> {
    let body = mac::verify(bytes, key, MIN_FRAME_LEN)?;
    let mut budget = Budget::for_frame(body.len());
    let (head, mut r) = parse_head(body)?;
    let (schema, defined) = match section(&mut r, head.flags & FLAG_SCHEMA, "schema section")? {
        Some(mut s) => parse_schema_where(&mut s, &mut budget, keep)?,
        None => (Vec::new(), Vec::new()),
    };
    let samples = section(&mut r, head.flags & FLAG_SAMPLES, "samples section")?;
    let events = section(&mut r, head.flags & FLAG_EVENTS, "events section")?;
    r.finish("frame length")?;
    Ok(StoredFrame {
        node: head.node,
        session: head.session,
        seq: head.seq,
        send_unix_ns: head.send_unix_ns,
        time_quantum_ns: head.time_quantum_ns,
        schema,
        defined,
        samples,
        events,
        budget_len: body.len(),
    })
}

impl StoredFrame<'_> {
    /// The samples of the series ids `keep` accepts, in the frame's order; the other series'
    /// samples are read past without being decoded.
    pub fn samples(
        &self,
        mut keep: impl FnMut(u32) -> bool,
    ) -> Result<Vec<SeriesSamples>, WireError> {
        let Some(mut s) = self.samples.clone() else {
            return Ok(Vec::new());
        };
        let samples = parse_samples(
            &mut s,
            self.send_unix_ns,
            self.time_quantum_ns,
            &mut Budget::for_frame(self.budget_len),
            &mut keep,
        )?;
        s.finish("samples section length")?;
        Ok(samples)
    }

    /// Whether the frame has events.
    pub fn has_events(&self) -> bool {
        self.events.is_some()
    }

    /// The frame's events.
    pub fn events(&self) -> Result<Vec<WireEvent>, WireError> {
        match self.events.clone() {
            Some(mut s) => parse_events(
                &mut s,
                self.send_unix_ns,
                &mut Budget::for_frame(self.budget_len),
            ),
            None => Ok(Vec::new()),
        }
    }
}

/// The node name in a frame's header, read before the MAC is checked: for routing, and for
/// choosing the node's key (docs/wire-format.md, "Keys"). `None` when too short or not UTF-8.
pub fn peek_node(bytes: &[u8]) -> Option<&str> {
    let len = usize::from(*bytes.get(6)?);
    std::str::from_utf8(bytes.get(7..7 + len)?).ok()
}

/// Whether a frame carries schema entries, read from its header's flags without checking the
/// MAC: for frames already authenticated (the collector's archive), so a reader can pass
/// over a frame outside its time range whose ids it needs no definition from. `true` when
/// the header is cut short or is not a frame's (the reader then opens it and finds out).
pub fn peek_has_schema(bytes: &[u8]) -> bool {
    if bytes.get(..4) != Some(&MAGIC[..]) {
        return true;
    }
    bytes.get(5).is_none_or(|flags| flags & FLAG_SCHEMA != 0)
}

/// The session and sequence number in a frame's header, read without checking the MAC: for
/// frames already authenticated (an agent's own spool, the collector's archive). `None` when
/// the header is cut short.
pub fn peek_sequence(bytes: &[u8]) -> Option<(u32, u64)> {
    let at = 7 + usize::from(*bytes.get(6)?);
    let session = u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?);
    let mut r = Reader::new(bytes.get(at + 4..)?, 0);
    let seq = r.varint("seq").ok()?;
    Some((session, seq))
}

/// Verifies, parses and accounts one received datagram: the MAC is checked before anything
/// else is read; then the frame's schema entries are merged into `state`, and its sequence
/// number is checked against the node's (gaps are counted as lost frames, a frame seen
/// before is refused).
pub fn decode(bytes: &[u8], key: &Key, state: &mut ReceiverState) -> Result<Frame, WireError> {
    let body = mac::verify(bytes, key, MIN_FRAME_LEN)?;
    let frame = parse(body)?;
    state.accept(&frame)?;
    Ok(frame)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::{
        budget::DECODE_BYTES_PER_FRAME_BYTE,
        frame::{CounterSample, GaugeSample, SchemaEntry, SeriesData, SeriesSamples},
        mac::MAC_LEN,
        series::{Kind, Labels},
        testing::{arb_frame, key, peak_allocation, same, sample_frame, series},
    };

    #[test]
    fn hand_made_frame_round_trips() {
        let frame = sample_frame();
        let bytes = encode_frame(&frame, &key()).unwrap();
        let mut state = ReceiverState::default();
        let back = decode(&bytes, &key(), &mut state).unwrap();
        assert!(same(&frame, &back), "{frame:#?}\n{back:#?}");
        let node = state.node("gpu-node-017").unwrap();
        assert_eq!(&*node.series(1).unwrap().name, "railscope_gpu_power_watts");
        assert_eq!(node.frames, 1);
    }

    #[test]
    fn peek_has_schema_reads_the_flags_of_the_header() {
        let mut frame = sample_frame();
        assert!(!frame.schema.is_empty());
        let with = encode_frame(&frame, &key()).unwrap();
        assert!(peek_has_schema(&with));
        frame.schema.clear();
        let without = encode_frame(&frame, &key()).unwrap();
        assert!(!peek_has_schema(&without));
        // Too short or not a frame: the reader must open it to know.
        assert!(peek_has_schema(&without[..5]));
        assert!(peek_has_schema(b"not a frame at all"));
    }

    /// The worked example at the end of docs/wire-format.md, byte for byte.
    #[test]
    fn worked_example_of_the_spec() {
        const HEX: &str = "
            52 53 57 46 01 07 02 6e 31 04 03 02 01 05 00 94 ae b7 0b 05 78 18 c0 84 3d 57 06 00 01 30
            00 01 31 00 03 67 70 75 00 04 70 6f 72 74 00 1a 72 61 69 6c 73 63 6f 70 65 5f 67 70 75 5f
            74 65 6d 70 5f 63 65 6c 73 69 75 73 0a 14 69 62 5f 6c 69 6e 6b 5f 64 6f 77 6e 65 64 5f 74
            6f 74 61 6c 02 01 02 00 01 03 01 02 01 09 01 0a 02 00 00 00 00 01 01 13 02 a0 1f 00 e7 07
            01 02 00 03 02 55 00 01 c4 09 1e 00 03 1f 01 80 ca b5 ee 01 03 78 69 64 01 03 67 70 75 01
            30 9e 01 0b 6f 66 66 20 74 68 65 20 62 75 73 e4 98 2a 61 ad 98 4b 1f 7d a3 bf 33 91 86 74
            22";
        let expected: Vec<u8> = HEX
            .split_whitespace()
            .map(|b| u8::from_str_radix(b, 16).unwrap())
            .collect();
        let key = Key::from_bytes(std::array::from_fn(|i| i as u8));
        let t0 = 1_763_164_800_000_000_000; // 2025-11-15T00:00:00Z
        let frame = Frame {
            node: "n1".into(),
            session: 0x0102_0304,
            seq: 5,
            send_unix_ns: t0 + 2_000_000_000,
            time_quantum_ns: 1_000_000,
            schema: vec![
                SchemaEntry {
                    id: 0,
                    series: series("railscope_gpu_temp_celsius", &[("gpu", "0")], Kind::Gauge),
                },
                SchemaEntry {
                    id: 1,
                    series: series(
                        "railscope_ib_link_downed_total",
                        &[("port", "1")],
                        Kind::Counter,
                    ),
                },
            ],
            samples: vec![
                SeriesSamples {
                    id: 0,
                    data: SeriesData::Gauge(vec![
                        GaugeSample::reading(t0, 61.0),
                        GaugeSample::reading(t0 + 1_000_000_000, 62.5),
                    ]),
                },
                SeriesSamples {
                    id: 1,
                    data: SeriesData::Counter(vec![
                        CounterSample {
                            unix_ns: t0,
                            value: 3,
                        },
                        CounterSample {
                            unix_ns: t0 + 1_000_000_000,
                            value: 3,
                        },
                    ]),
                },
            ],
            events: vec![WireEvent {
                unix_ns: t0 + 1_500_000_000,
                kind: "xid".into(),
                labels: Labels::new([("gpu", "0")]),
                code: 79,
                text: "off the bus".into(),
            }],
        };
        assert_eq!(encode_frame(&frame, &key).unwrap(), expected);
        // Sealed with node n1's own key, derived from the fleet secret `00 01 ... 1f`: the
        // same bytes up to the MAC ("Keys" in the spec).
        let secret = crate::FleetSecret::from_bytes(std::array::from_fn(|i| i as u8));
        let node_key = secret.node_key("n1");
        assert_eq!(
            node_key.to_hex(),
            "ca8c7ab9d33dabf36ce2f4320cd5edb3abad752f43e027d2ee82d33d70e81509"
        );
        let sealed = encode_frame(&frame, &node_key).unwrap();
        let mac: String = sealed[sealed.len() - MAC_LEN..]
            .iter()
            .map(|b| format!("{b:02x} "))
            .collect();
        assert_eq!(
            mac.trim_end(),
            "d7 89 e2 fa a9 53 01 31 1a 4c 12 23 6d 26 95 4e"
        );
        assert_eq!(
            sealed[..sealed.len() - MAC_LEN],
            expected[..expected.len() - MAC_LEN]
        );
        assert_eq!(
            decode(&expected, &key, &mut ReceiverState::default()).unwrap(),
            frame
        );
    }

    #[test]
    fn wrong_key_is_a_mac_error_before_anything_is_parsed() {
        let bytes = encode_frame(&sample_frame(), &key()).unwrap();
        let other = Key::from_bytes([1; 32]);
        let mut state = ReceiverState::default();
        let e = decode(&bytes, &other, &mut state).unwrap_err();
        assert_eq!(e, WireError::BadMac { len: bytes.len() });
        assert!(e.to_string().contains("MAC mismatch"));
        assert!(state.node("gpu-node-017").is_none());
    }

    #[test]
    fn other_versions_and_garbage_are_refused_by_name() {
        // A body with the right MAC but another version: the key holder speaks a newer format.
        let mut bytes = encode_frame(&sample_frame(), &key()).unwrap();
        bytes.truncate(bytes.len() - MAC_LEN);
        bytes[4] = 2;
        mac::seal(&mut bytes, &key());
        let e = decode(&bytes, &key(), &mut ReceiverState::default()).unwrap_err();
        assert_eq!(e, WireError::UnsupportedVersion(2));
        assert_eq!(
            decode(b"hello", &key(), &mut ReceiverState::default()).unwrap_err(),
            WireError::TooShort { len: 5 }
        );
    }

    proptest! {
        #[test]
        fn any_frame_round_trips(frame in arb_frame()) {
            let bytes = encode_frame(&frame, &key()).unwrap();
            let back = decode(&bytes, &key(), &mut ReceiverState::default()).unwrap();
            prop_assert!(same(&frame, &back), "{:#?}\n{:#?}", frame, back);
        }

        /// A stored frame read in steps, keeping some series, gives what decoding it whole
        /// gives for those series (the others read past exactly: the section ends where it
        /// should) and the same schema entries and events.
        #[test]
        fn a_stored_frame_keeps_exactly_the_series_asked_for(
            frame in arb_frame(),
            modulus in 1u32..4,
        ) {
            let bytes = encode_frame(&frame, &key()).unwrap();
            let whole = decode(&bytes, &key(), &mut ReceiverState::default()).unwrap();
            let stored = open_stored(&bytes, &key()).unwrap();
            prop_assert_eq!(stored.node, whole.node.as_str());
            prop_assert_eq!((stored.session, stored.seq), (whole.session, whole.seq));
            prop_assert_eq!(&stored.schema, &whole.schema);
            let kept = stored.samples(|id| id % modulus == 0).unwrap();
            let mut expected = whole.clone();
            expected.samples.retain(|s| s.id % modulus == 0);
            let mut got = whole.clone();
            got.samples = kept;
            prop_assert!(same(&expected, &got), "{:#?}\n{:#?}", expected, got);
            prop_assert_eq!(stored.events().unwrap(), whole.events);
        }

        /// A stored frame opened for some metric names holds exactly the schema entries of
        /// those names, as opening it whole gives them (ids, labels, kinds).
        #[test]
        fn a_stored_frame_opened_for_some_names_holds_their_entries_only(
            frame in arb_frame(),
            modulus in 1usize..4,
        ) {
            let bytes = encode_frame(&frame, &key()).unwrap();
            let whole = open_stored(&bytes, &key()).unwrap();
            let mut names: Vec<&str> = whole.schema.iter().map(|e| &*e.series.name).collect();
            names.sort_unstable();
            names.dedup();
            let wanted: Vec<&str> = names.into_iter().step_by(modulus).collect();
            let some = open_stored_where(&bytes, &key(), &mut |n| wanted.contains(&n)).unwrap();
            let expected: Vec<&SchemaEntry> = whole
                .schema
                .iter()
                .filter(|e| wanted.contains(&&*e.series.name))
                .collect();
            prop_assert_eq!(some.schema.iter().collect::<Vec<_>>(), expected);
            prop_assert_eq!(some.seq, whole.seq);
        }

        #[test]
        fn parser_never_panics_on_mutated_frames(
            frame in arb_frame(),
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
            cut in any::<prop::sample::Index>(),
        ) {
            // MAC checking bypassed: the parser alone must turn any bytes into Ok or Err.
            let bytes = encode_frame(&frame, &key()).unwrap();
            let mut body = bytes[..bytes.len() - MAC_LEN].to_vec();
            for (at, byte) in edits {
                let i = at.index(body.len());
                body[i] ^= byte;
            }
            let _ = parse(&body);
            let _ = parse(&body[..cut.index(body.len() + 1)]);
        }

        #[test]
        fn parser_never_panics_on_garbage(tail in prop::collection::vec(any::<u8>(), 0..300)) {
            let _ = parse(&tail);
            let mut body = MAGIC.to_vec();
            body.push(VERSION);
            body.extend_from_slice(&tail);
            let _ = parse(&body);
        }
    }

    /// What decoding a frame of `len` bytes may allocate: its budget, plus the schema entries
    /// and samples (at most 65,536 of each, with the decoder's temporaries), plus what a
    /// receiver keeps of one frame's entries.
    fn decode_bound(len: usize) -> usize {
        let counted = MAX_FRAME_SAMPLES * (2 * size_of::<SchemaEntry>() + 128);
        len * DECODE_BYTES_PER_FRAME_BYTE + counted
    }

    /// A header with these flags, then each present section from `sections` with its length:
    /// random section bodies that reach the section parsers.
    fn structured_garbage(flags: u8, node: &str, sections: &[Vec<u8>]) -> Vec<u8> {
        let mut body = MAGIC.to_vec();
        body.extend_from_slice(&[VERSION, flags, node.len() as u8]);
        body.extend_from_slice(node.as_bytes());
        body.extend_from_slice(&7u32.to_le_bytes());
        put_varint(&mut body, 3);
        body.extend_from_slice(&1_760_000_000_000_000_000u64.to_le_bytes());
        put_varint(&mut body, 1_000_000);
        for (bit, section) in sections.iter().enumerate() {
            if flags & (1 << bit) != 0 {
                put_varint(&mut body, section.len() as u64);
                body.extend_from_slice(section);
            }
        }
        body
    }

    proptest! {
        /// Any datagram, forged (no key): refused by its MAC or length, never a panic.
        #[test]
        fn forged_datagrams_are_refused(bytes in prop::collection::vec(any::<u8>(), 0..2000)) {
            let mut state = ReceiverState::default();
            let e = decode(&bytes, &key(), &mut state).unwrap_err();
            prop_assert!(
                matches!(e, WireError::BadMac { .. } | WireError::TooShort { .. }),
                "{}", e
            );
            prop_assert_eq!(state.nodes().count(), 0);
        }

        /// Any bytes sealed with the right key (a compromised node), raw or behind a valid
        /// header: decoded or refused, never a panic, within the memory bound.
        #[test]
        fn sealed_garbage_decodes_or_is_refused_within_the_bound(
            flags in 0u8..8,
            node in "[a-z]{0,8}",
            sections in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..600), 3),
            raw in prop::collection::vec(any::<u8>(), 0..600),
        ) {
            for mut body in [structured_garbage(flags, &node, &sections), raw.clone()] {
                let (_, peak) = peak_allocation(|| parse(&body));
                prop_assert!(peak <= decode_bound(body.len()), "{} bytes for {}", peak, body.len());
                mac::seal(&mut body, &key());
                let mut state = ReceiverState::default();
                let _ = decode(&body, &key(), &mut state);
            }
        }

        /// Valid frames with bytes changed and cut, resealed (a compromised node) or not (a
        /// forgery or corruption), received after the original: never a panic; without a new
        /// MAC every change is refused; with one, decoded or refused within the memory bound.
        #[test]
        fn mutated_frames_are_refused_or_decoded_within_the_bound(
            frame in arb_frame(),
            edits in prop::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..8),
            cut in any::<prop::sample::Index>(),
            reseal in any::<bool>(),
        ) {
            let original = encode_frame(&frame, &key()).unwrap();
            let mut body = original[..original.len() - MAC_LEN].to_vec();
            for (at, byte) in edits {
                let i = at.index(body.len());
                body[i] ^= byte;
            }
            body.truncate(cut.index(body.len() + 1).max(1));
            let (_, peak) = peak_allocation(|| parse(&body));
            prop_assert!(peak <= decode_bound(body.len()), "{} bytes for {}", peak, body.len());
            let mut state = ReceiverState::default();
            decode(&original, &key(), &mut state).unwrap();
            let mutated = if reseal {
                let mut sealed = body.clone();
                mac::seal(&mut sealed, &key());
                sealed
            } else {
                let mut unsealed = body.clone();
                unsealed.extend_from_slice(&original[original.len() - MAC_LEN..]);
                unsealed
            };
            let result = decode(&mutated, &key(), &mut state);
            if !reseal {
                prop_assert!(
                    matches!(result, Err(WireError::BadMac { .. } | WireError::TooShort { .. })),
                    "{:?}", result
                );
            }
            // Every frame taken is counted once, under the node it names (an edit of the
            // header may rename the node: then it is another node's first frame).
            let frames: u64 = state.nodes().map(|(_, n)| n.frames).sum();
            prop_assert_eq!(frames, 1 + u64::from(result.is_ok()));
            prop_assert_eq!(state.node(&frame.node).map(|n| n.frames >= 1), Some(true));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn every_truncation_and_bit_flip_is_rejected(frame in arb_frame()) {
            let bytes = encode_frame(&frame, &key()).unwrap();
            for len in 0..bytes.len() {
                let r = decode(&bytes[..len], &key(), &mut ReceiverState::default());
                prop_assert!(r.is_err(), "truncated to {} of {} bytes", len, bytes.len());
            }
            let mut flipped = bytes.clone();
            for bit in 0..bytes.len() * 8 {
                flipped[bit / 8] ^= 1 << (bit % 8);
                let r = decode(&flipped, &key(), &mut ReceiverState::default());
                prop_assert!(r.is_err(), "bit {} flipped", bit);
                flipped[bit / 8] ^= 1 << (bit % 8);
            }
        }
    }
}
