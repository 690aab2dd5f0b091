use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::metrics::{Reading, Value};

fn key() -> Key {
    Key::from_bytes(*b"0123456789abcdef0123456789abcdef")
}

fn series(name: &str, labels: &[(&str, &str)], kind: Kind) -> Series {
    Series {
        name: name.into(),
        labels: Labels::new(labels.iter().copied()),
        kind,
    }
}

/// Frames compared bit for bit (NaN payloads and the sign of zero included).
fn same(a: &Frame, b: &Frame) -> bool {
    fn split(f: &Frame) -> (Frame, Vec<u64>) {
        let mut f = f.clone();
        let mut bits = Vec::new();
        for s in &mut f.samples {
            if let SeriesData::Gauge(v) = &mut s.data {
                for g in v {
                    for x in [&mut g.min, &mut g.max, &mut g.mean] {
                        bits.push(x.to_bits());
                        *x = 0.0;
                    }
                }
            }
        }
        (f, bits)
    }
    split(a) == split(b)
}

// ---------------------------------------------------------------------------------------------
// Key files

#[test]
fn key_file_accepts_raw_bytes_and_hex_with_newline() {
    let dir = std::env::temp_dir().join(format!("railscope-key-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let raw = dir.join("raw.key");
    let mut bytes = [7u8; 32];
    bytes[31] = b'\n'; // a raw key may end in a newline byte: 32 bytes are always raw
    std::fs::write(&raw, bytes).unwrap();
    assert_eq!(Key::from_file(&raw).unwrap(), Key::from_bytes(bytes));

    let hex = dir.join("hex.key");
    let text: String = (0u8..32).map(|b| format!("{b:02x}")).collect();
    std::fs::write(&hex, format!("{text}\n")).unwrap();
    let expected: Vec<u8> = (0u8..32).collect();
    assert_eq!(
        Key::from_file(&hex).unwrap(),
        Key::from_bytes(expected.try_into().unwrap())
    );
    std::fs::write(&hex, text.to_uppercase()).unwrap();
    assert_eq!(
        Key::from_file(&hex).unwrap(),
        Key::from_bytes((0u8..32).collect::<Vec<_>>().try_into().unwrap())
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn key_file_errors_name_the_file() {
    let dir = std::env::temp_dir().join(format!("railscope-badkey-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let short = dir.join("short.key");
    std::fs::write(&short, "abcd\n").unwrap();
    let e = Key::from_file(&short).unwrap_err().to_string();
    assert!(
        e.contains("short.key") && e.contains("found 5 bytes"),
        "{e}"
    );

    let not_hex = dir.join("nothex.key");
    std::fs::write(&not_hex, "g".repeat(64)).unwrap();
    let e = Key::from_file(&not_hex).unwrap_err().to_string();
    assert!(e.contains("nothex.key") && e.contains("hex"), "{e}");

    let missing = dir.join("missing.key");
    let e = Key::from_file(&missing).unwrap_err().to_string();
    assert!(
        e.contains("missing.key") && e.contains("cannot read"),
        "{e}"
    );
    assert!(!e.contains('\n'));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn key_debug_does_not_show_the_key() {
    assert_eq!(format!("{:?}", key()), "Key(..)");
}

// ---------------------------------------------------------------------------------------------
// One frame, by hand

fn sample_frame() -> Frame {
    let t = 1_760_000_000_000_000_000u64;
    Frame {
        node: "gpu-node-017".into(),
        session: 0xdead_beef,
        seq: 42,
        send_unix_ns: t + 10_000_000_000,
        time_quantum_ns: 1_000_000,
        schema: vec![
            SchemaEntry {
                id: 0,
                series: series(
                    "railscope_ib_port_xmit_data_total",
                    &[("device", "mlx5_0"), ("port", "1")],
                    Kind::Counter,
                ),
            },
            SchemaEntry {
                id: 1,
                series: series("railscope_gpu_power_watts", &[("gpu", "0")], Kind::Gauge),
            },
        ],
        samples: vec![
            SeriesSamples {
                id: 0,
                data: SeriesData::Counter(
                    (0..10)
                        .map(|i| CounterSample {
                            unix_ns: t + i * 1_000_000_000,
                            value: 1_000_000_000_000 + i * 5_000_000_000,
                        })
                        .collect(),
                ),
            },
            SeriesSamples {
                id: 1,
                data: SeriesData::Gauge(vec![
                    GaugeSample::reading(t, 312.456),
                    GaugeSample {
                        start_unix_ns: t,
                        end_unix_ns: t + 9_000_000_000,
                        min: 300.0,
                        max: 650.5,
                        mean: 512.25,
                    },
                ]),
            },
        ],
        events: vec![Event {
            unix_ns: t + 5_123_456_789,
            kind: "ib_port".into(),
            labels: Labels::new([("device", "mlx5_0"), ("port", "1")]),
            code: 10,
            text: "PORT_ERR".into(),
        }],
    }
}

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
        events: vec![Event {
            unix_ns: t0 + 1_500_000_000,
            kind: "xid".into(),
            labels: Labels::new([("gpu", "0")]),
            code: 79,
            text: "off the bus".into(),
        }],
    };
    assert_eq!(encode_frame(&frame, &key).unwrap(), expected);
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
    let mac = key().mac(&bytes);
    bytes.extend_from_slice(&mac);
    let e = decode(&bytes, &key(), &mut ReceiverState::default()).unwrap_err();
    assert_eq!(e, WireError::UnsupportedVersion(2));
    assert_eq!(
        decode(b"hello", &key(), &mut ReceiverState::default()).unwrap_err(),
        WireError::TooShort { len: 5 }
    );
}

#[test]
fn sequence_gaps_duplicates_and_restarts_are_tracked() {
    let key = key();
    let mut state = ReceiverState::default();
    let mut frame = sample_frame();
    let send =
        |f: &Frame, state: &mut ReceiverState| decode(&encode_frame(f, &key).unwrap(), &key, state);
    frame.seq = 10;
    send(&frame, &mut state).unwrap();
    frame.seq = 14; // 11, 12, 13 lost
    send(&frame, &mut state).unwrap();
    let node = state.node("gpu-node-017").unwrap();
    assert_eq!((node.lost, node.last.lost_before), (3, 3));
    frame.seq = 12; // late, no longer lost
    send(&frame, &mut state).unwrap();
    assert_eq!(state.node("gpu-node-017").unwrap().lost, 2);
    assert_eq!(
        send(&frame, &mut state).unwrap_err(),
        WireError::Duplicate {
            node: "gpu-node-017".into(),
            seq: 12
        }
    );
    // The agent restarted: new session, seq from 0, ids mean nothing until new entries.
    let old_session = frame.session;
    frame.session = 7;
    frame.seq = 0;
    frame.schema.clear();
    send(&frame, &mut state).unwrap();
    let node = state.node("gpu-node-017").unwrap();
    assert!(node.last.new_session);
    assert_eq!(node.known_series(), 0);
    assert_eq!(node.last.unknown_samples, 12);
    assert_eq!(node.sessions, 2);
    // A frame of the old session (a replay) cannot take the node back.
    frame.session = old_session;
    frame.seq = 99;
    assert!(matches!(
        send(&frame, &mut state).unwrap_err(),
        WireError::Stale { .. }
    ));
}

// ---------------------------------------------------------------------------------------------
// Property tests

fn arb_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<f64>(),
        (-2000i64..2000).prop_map(|i| i as f64),
        (any::<i32>(), 0i32..8).prop_map(|(i, k)| f64::from(i) / 10f64.powi(k)),
        Just(-0.0),
        Just(f64::NAN),
    ]
}

fn arb_labels() -> impl Strategy<Value = Labels> {
    prop::collection::vec(("[a-z_]{1,8}", "[a-zA-Z0-9_. é-]{0,12}"), 0..4).prop_map(Labels::new)
}

fn arb_series() -> impl Strategy<Value = Series> {
    (
        "railscope_[a-z_]{1,24}",
        arb_labels(),
        prop_oneof![Just(Kind::Counter), Just(Kind::Gauge)],
    )
        .prop_map(|(name, labels, kind)| Series {
            name: name.into(),
            labels,
            kind,
        })
}

fn arb_time(q: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        (0..=u64::MAX / q).prop_map(move |t| t * q),
        (0u64..20_000).prop_map(move |t| (1_760_000_000_000_000_000 / q + t) * q),
    ]
}

fn arb_samples(q: u64) -> impl Strategy<Value = SeriesData> {
    let counters = prop::collection::vec(
        (
            arb_time(q),
            prop_oneof![any::<u64>(), 0u64..1000, Just(123_456_789)],
        ),
        0..12,
    )
    .prop_map(|v| {
        SeriesData::Counter(
            v.into_iter()
                .map(|(unix_ns, value)| CounterSample { unix_ns, value })
                .collect(),
        )
    });
    let gauge = (
        arb_time(q),
        0u64..5000,
        arb_f64(),
        arb_f64(),
        arb_f64(),
        any::<bool>(),
    )
        .prop_map(move |(end, dur, a, b, c, single)| {
            let start = end.saturating_sub(dur * q);
            if single {
                GaugeSample {
                    start_unix_ns: start,
                    ..GaugeSample::reading(end, a)
                }
            } else {
                GaugeSample {
                    start_unix_ns: start,
                    end_unix_ns: end,
                    min: a,
                    max: b,
                    mean: c,
                }
            }
        });
    let gauges = prop::collection::vec(gauge, 0..12).prop_map(SeriesData::Gauge);
    prop_oneof![counters, gauges]
}

fn arb_event() -> impl Strategy<Value = Event> {
    (
        any::<u64>(),
        "[a-z_]{0,10}",
        arb_labels(),
        any::<i64>(),
        ".{0,40}",
    )
        .prop_map(|(unix_ns, kind, labels, code, text)| Event {
            unix_ns,
            kind,
            labels,
            code,
            text,
        })
}

fn arb_frame() -> impl Strategy<Value = Frame> {
    prop_oneof![Just(1u64), Just(1000), Just(1_000_000)].prop_flat_map(|q| {
        (
            "[a-z0-9-]{0,20}",
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            prop::collection::vec(
                (prop_oneof![0u32..40, any::<u32>()], arb_series())
                    .prop_map(|(id, series)| SchemaEntry { id, series }),
                0..5,
            ),
            prop::collection::vec(
                (prop_oneof![0u32..40, any::<u32>()], arb_samples(q))
                    .prop_map(|(id, data)| SeriesSamples { id, data }),
                0..6,
            ),
            prop::collection::vec(arb_event(), 0..3),
        )
            .prop_map(
                move |(node, session, seq, send_unix_ns, schema, samples, events)| Frame {
                    node,
                    session,
                    seq,
                    send_unix_ns,
                    time_quantum_ns: q,
                    schema,
                    samples,
                    events,
                },
            )
    })
}

proptest! {
    #[test]
    fn any_frame_round_trips(frame in arb_frame()) {
        let bytes = encode_frame(&frame, &key()).unwrap();
        let back = decode(&bytes, &key(), &mut ReceiverState::default()).unwrap();
        prop_assert!(same(&frame, &back), "{:#?}\n{:#?}", frame, back);
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

// ---------------------------------------------------------------------------------------------
// The encoder

const T0: u64 = 1_760_000_000_000_000_000;

/// What a pushed sample becomes after the trip (times rounded to the quantum).
fn quantized(s: &SeriesData, q: u64) -> Vec<(u64, u64, [u64; 3])> {
    let r = |t: u64| quantize(t, q) * q;
    match s {
        SeriesData::Counter(v) => v
            .iter()
            .map(|c| (r(c.unix_ns), r(c.unix_ns), [c.value; 3]))
            .collect(),
        SeriesData::Gauge(v) => v
            .iter()
            .map(|g| {
                (
                    r(g.start_unix_ns),
                    r(g.end_unix_ns),
                    [g.min.to_bits(), g.max.to_bits(), g.mean.to_bits()],
                )
            })
            .collect(),
    }
}

fn decode_all(frames: &[Vec<u8>], state: &mut ReceiverState) -> Vec<Frame> {
    frames
        .iter()
        .map(|f| decode(f, &key(), state).unwrap())
        .collect()
}

/// Everything the frames carry, per series, as (start, end, values) sorted.
fn received(frames: &[Frame], state: &ReceiverState) -> HashMap<Series, Vec<(u64, u64, [u64; 3])>> {
    let mut out: HashMap<Series, Vec<_>> = HashMap::new();
    for f in frames {
        let node = state.node(&f.node).unwrap();
        for s in &f.samples {
            let series = node.series(s.id).expect("every id has its entry").clone();
            out.entry(series)
                .or_default()
                .extend(quantized(&s.data, f.time_quantum_ns));
        }
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn encoder_frames_fit_the_mtu_and_carry_every_sample_once(
        pushes in prop::collection::vec(
            (0usize..12, arb_samples(1_000_000)),
            1..30,
        ),
        series in prop::collection::vec(arb_series(), 12),
        mtu in 256usize..1500,
        events in prop::collection::vec(arb_event(), 0..4),
    ) {
        let mut config = EncoderConfig::new("node-a");
        config.mtu = mtu;
        config.gauge_digits = None;
        let mut encoder = FrameEncoder::new(config, key()).unwrap();
        let mut expected: HashMap<Series, Vec<_>> = HashMap::new();
        for (which, data) in &pushes {
            // The generated data decides the kind of the series it is pushed to.
            let mut s = series[*which].clone();
            s.kind = data.kind();
            s.name = format!("{}{}", s.name, if s.kind == Kind::Gauge { "_g" } else { "_c" }).into();
            let samples: Vec<Sample> = match data {
                SeriesData::Counter(v) => v.iter().copied().map(Sample::Counter).collect(),
                SeriesData::Gauge(v) => v.iter().copied().map(Sample::Gauge).collect(),
            };
            for sample in samples {
                encoder.push_sample(&s, sample).unwrap();
            }
            expected.entry(s).or_default().extend(quantized(data, 1_000_000));
        }
        expected.retain(|_, v| !v.is_empty());
        for v in expected.values_mut() {
            v.sort();
        }
        for e in &events {
            encoder.push_event(e.clone());
        }
        let frames = encoder.flush(T0);
        for f in &frames {
            prop_assert!(f.len() <= mtu, "frame of {} bytes for MTU {}", f.len(), mtu);
        }
        let mut state = ReceiverState::default();
        let decoded = decode_all(&frames, &mut state);
        prop_assert_eq!(received(&decoded, &state), expected);
        let got_events: usize = decoded.iter().map(|f| f.events.len()).sum();
        prop_assert_eq!(got_events as u64 + encoder.stats().dropped_events, events.len() as u64);
        prop_assert_eq!(state.node("node-a").map_or(0, |n| n.lost), 0);
    }
}

#[test]
fn schema_is_sent_twice_for_new_series_then_every_refresh_period() {
    let mut config = EncoderConfig::new("node-a");
    config.schema_refresh = Duration::from_secs(30);
    let mut encoder = FrameEncoder::new(config, key()).unwrap();
    let temp = series("railscope_gpu_temp_celsius", &[("gpu", "0")], Kind::Gauge);
    // Pushes one reading at second `s` and flushes right after it.
    let mut flush_at = |s: u64, state: &mut ReceiverState| {
        let r = Reading {
            series: temp.clone(),
            value: Value::U64(60 + s),
            unix_ns: T0 + s * 1_000_000_000,
        };
        encoder.push_reading(&r).unwrap();
        let frames = encoder.flush(T0 + (s + 1) * 1_000_000_000);
        assert_eq!(frames.len(), 1);
        decode(&frames[0], &key(), state).unwrap()
    };
    let mut state = ReceiverState::default();
    assert_eq!(flush_at(0, &mut state).schema.len(), 1);
    assert_eq!(
        flush_at(10, &mut state).schema.len(),
        1,
        "new series: sent twice"
    );
    assert!(flush_at(20, &mut state).schema.is_empty());

    // A receiver that starts now cannot name the samples until the refresh, 30 s after the
    // entry was last sent (second 11).
    let mut late = ReceiverState::default();
    assert!(flush_at(30, &mut late).schema.is_empty());
    assert_eq!(late.node("node-a").unwrap().unknown_samples, 1);
    let refreshed = flush_at(41, &mut late);
    assert_eq!(refreshed.schema.len(), 1);
    let node = late.node("node-a").unwrap();
    assert_eq!(node.series(refreshed.samples[0].id), Some(&temp));
    assert_eq!(node.last.unknown_samples, 0);
}

#[test]
fn idle_series_are_forgotten_and_come_back_with_a_new_id() {
    let mut config = EncoderConfig::new("n");
    config.forget_after = Duration::from_secs(60);
    let mut encoder = FrameEncoder::new(config, key()).unwrap();
    let qp = series(
        "railscope_qp_retries_total",
        &[("qpn", "4242")],
        Kind::Counter,
    );
    let other = series("railscope_up", &[], Kind::Gauge);
    let mut state = ReceiverState::default();
    let mut flush = |encoder: &mut FrameEncoder, s: u64, with_qp: bool| {
        let t = T0 + s * 1_000_000_000;
        if with_qp {
            encoder
                .push_sample(
                    &qp,
                    Sample::Counter(CounterSample {
                        unix_ns: t,
                        value: s,
                    }),
                )
                .unwrap();
        }
        encoder
            .push_sample(&other, Sample::Gauge(GaugeSample::reading(t, 1.0)))
            .unwrap();
        decode_all(&encoder.flush(t), &mut state)
    };
    flush(&mut encoder, 0, true);
    assert_eq!(encoder.known_series(), 2);
    flush(&mut encoder, 59, false);
    assert_eq!(encoder.known_series(), 2);
    flush(&mut encoder, 61, false);
    assert_eq!(encoder.known_series(), 1, "the QP's series was forgotten");
    let back = flush(&mut encoder, 70, true);
    let ids: Vec<u32> = back[0].schema.iter().map(|e| e.id).collect();
    assert_eq!(ids, vec![2], "a new id, announced again");
    assert_eq!(back[0].schema[0].series, qp);
}

#[test]
fn kind_mismatch_and_fractional_counters_are_refused() {
    let mut encoder = FrameEncoder::new(EncoderConfig::new("n"), key()).unwrap();
    let counter = series("railscope_x_total", &[], Kind::Counter);
    let e = encoder
        .push_sample(&counter, Sample::Gauge(GaugeSample::reading(T0, 1.0)))
        .unwrap_err();
    assert!(e.to_string().contains("railscope_x_total{}"), "{e}");
    let e = encoder
        .push_reading(&Reading {
            series: counter,
            value: Value::F64(1.5),
            unix_ns: T0,
        })
        .unwrap_err();
    assert!(e.to_string().contains("1.5"), "{e}");
    assert_eq!(encoder.pending_samples(), 0);
}

#[test]
fn events_can_leave_at_once_while_samples_keep_batching() {
    let mut encoder = FrameEncoder::new(EncoderConfig::new("n"), key()).unwrap();
    let temp = series("railscope_gpu_temp_celsius", &[("gpu", "0")], Kind::Gauge);
    encoder
        .push_sample(&temp, Sample::Gauge(GaugeSample::reading(T0, 61.0)))
        .unwrap();
    encoder.push_event(Event {
        unix_ns: T0 + 5,
        kind: "xid".into(),
        labels: Labels::new([("gpu", "0")]),
        code: 79,
        text: "GPU has fallen off the bus".into(),
    });
    let frames = encoder.flush_events(T0 + 10);
    assert_eq!(frames.len(), 1);
    let mut state = ReceiverState::default();
    let f = decode(&frames[0], &key(), &mut state).unwrap();
    assert_eq!((f.events.len(), f.sample_count()), (1, 0));
    assert_eq!(f.events[0].unix_ns, T0 + 5, "event times are exact");
    assert_eq!(encoder.pending_samples(), 1);
    let f = decode(&encoder.flush(T0 + 20)[0], &key(), &mut state).unwrap();
    assert_eq!((f.events.len(), f.sample_count(), f.seq), (0, 1, 1));
}

#[test]
fn a_long_series_is_split_across_frames() {
    let mut config = EncoderConfig::new("n");
    config.mtu = 300;
    config.gauge_digits = None;
    let mut encoder = FrameEncoder::new(config, key()).unwrap();
    let ratio = series(
        "railscope_gpu_gpm_sm_active_ratio",
        &[("gpu", "0")],
        Kind::Gauge,
    );
    let mut noise = Noise(7);
    let values: Vec<f64> = (0..500).map(|_| noise.unit()).collect();
    for (i, v) in values.iter().enumerate() {
        let t = T0 + i as u64 * 10_000_000;
        encoder
            .push_sample(&ratio, Sample::Gauge(GaugeSample::reading(t, *v)))
            .unwrap();
    }
    let frames = encoder.flush(T0 + 5_000_000_000);
    assert!(frames.len() >= 15, "{} frames", frames.len());
    assert!(frames.iter().all(|f| f.len() <= 300));
    let mut state = ReceiverState::default();
    let mut back = Vec::new();
    for f in decode_all(&frames, &mut state) {
        for s in f.samples {
            let SeriesData::Gauge(v) = s.data else {
                panic!("a gauge")
            };
            back.extend(v.iter().map(|g| g.mean));
        }
    }
    assert_eq!(back, values);
}

#[test]
fn oversized_event_text_is_cut_to_fit() {
    let mut config = EncoderConfig::new("n");
    config.mtu = 300;
    let mut encoder = FrameEncoder::new(config, key()).unwrap();
    encoder.push_event(Event {
        unix_ns: T0,
        kind: "xid".into(),
        labels: Labels::new([("gpu", "3")]),
        code: 79,
        text: "GPU has fallen off the bus. ".repeat(40),
    });
    let frames = encoder.flush(T0);
    assert_eq!(frames.len(), 1);
    assert!(frames[0].len() <= 300);
    let f = decode(&frames[0], &key(), &mut ReceiverState::default()).unwrap();
    assert_eq!(f.events[0].code, 79);
    assert!(f.events[0].text.starts_with("GPU has fallen off the bus."));
    assert!(f.events[0].text.ends_with("..."));
    assert_eq!(encoder.stats().truncated_events, 1);
}

#[test]
fn a_lost_frame_costs_only_its_own_samples() {
    let readings = node_batch(10);
    let mut encoder = FrameEncoder::new(EncoderConfig::new("gpu-node-017"), key()).unwrap();
    for r in &readings {
        encoder.push_reading(r).unwrap();
    }
    let frames = encoder.flush(T0 + 10_000_000_000);
    let parsed: Vec<Frame> = frames
        .iter()
        .map(|f| decode(f, &key(), &mut ReceiverState::default()).unwrap())
        .collect();
    let sample_frames: Vec<usize> = (0..frames.len())
        .filter(|&i| parsed[i].schema.is_empty())
        .collect();
    assert!(sample_frames.len() >= 4, "{} frames", sample_frames.len());
    let lost = sample_frames[sample_frames.len() / 2];
    let mut state = ReceiverState::default();
    let mut samples = 0;
    for (i, f) in frames.iter().enumerate() {
        if i != lost {
            samples += decode(f, &key(), &mut state).unwrap().sample_count();
        }
    }
    let node = state.node("gpu-node-017").unwrap();
    assert_eq!(node.lost, 1);
    assert_eq!(
        node.unknown_samples, 0,
        "other frames need nothing from the lost one"
    );
    assert_eq!(samples + parsed[lost].sample_count(), readings.len());
}

#[test]
fn a_lost_schema_frame_is_made_good_by_the_next_flush() {
    let readings = node_batch(20);
    let (first, second) = readings.split_at(readings.len() / 2);
    let mut encoder = FrameEncoder::new(EncoderConfig::new("gpu-node-017"), key()).unwrap();
    let mut state = ReceiverState::default();
    for r in first {
        encoder.push_reading(r).unwrap();
    }
    // The frames with schema entries are lost.
    let mut received_first = 0;
    for f in encoder.flush(T0 + 10_000_000_000) {
        let mut probe = ReceiverState::default();
        if decode(&f, &key(), &mut probe).unwrap().schema.is_empty() {
            received_first += decode(&f, &key(), &mut state).unwrap().sample_count() as u64;
        }
    }
    let node = state.node("gpu-node-017").unwrap();
    assert_eq!(node.known_series(), 0);
    assert!(received_first > 0);
    assert_eq!(node.unknown_samples, received_first);
    for r in second {
        encoder.push_reading(r).unwrap();
    }
    let frames = decode_all(&encoder.flush(T0 + 20_000_000_000), &mut state);
    let node = state.node("gpu-node-017").unwrap();
    assert_eq!(node.known_series(), 720);
    assert_eq!(
        node.unknown_samples, received_first,
        "second flush fully named"
    );
    assert_eq!(
        received(&frames, &state)
            .values()
            .map(Vec::len)
            .sum::<usize>(),
        second.len()
    );
}

// ---------------------------------------------------------------------------------------------
// Size on a realistic node

/// xorshift64*: deterministic noise for the synthetic node.
struct Noise(u64);

impl Noise {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

const IB_COUNTERS: [&str; 50] = [
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_packets",
    "port_rcv_packets",
    "unicast_xmit_packets",
    "unicast_rcv_packets",
    "port_xmit_wait",
    "rx_write_requests",
    "np_ecn_marked_roce_packets",
    "rp_cnp_handled",
    "np_cnp_sent",
    "out_of_sequence",
    "local_ack_timeout_err",
    "multicast_rcv_packets",
    "excessive_buffer_overrun_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "multicast_xmit_packets",
    "port_rcv_constraint_errors",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_xmit_discards",
    "symbol_error",
    "vl15_dropped",
    "duplicate_request",
    "implied_nak_seq_err",
    "lifespan",
    "out_of_buffer",
    "packet_seq_err",
    "req_cqe_error",
    "req_cqe_flush_error",
    "req_remote_access_errors",
    "req_remote_invalid_request",
    "resp_cqe_error",
    "resp_cqe_flush_error",
    "resp_local_length_error",
    "resp_remote_access_errors",
    "rnr_nak_retry_err",
    "rp_cnp_ignored",
    "rx_atomic_requests",
    "rx_dct_connect",
    "rx_icrc_encapsulated",
    "rx_read_requests",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
];

/// How a synthetic GPU gauge moves from one second to the next.
#[derive(Clone, Copy)]
enum Gauge {
    Const(f64),
    /// Integer, uniform in [lo, hi).
    Int(u64, u64),
    /// Integer random walk of +-1 with probability 1/3.
    Walk(f64),
    /// Milliwatts as watts: 3 decimals.
    MilliWatts,
    /// Free-running double (GPM metrics): a ratio in percent or a bandwidth in bytes/s.
    Double(f64),
}

const GPU_GAUGES: [(&str, Gauge); 40] = [
    ("utilization_gpu_percent", Gauge::Int(95, 101)),
    ("utilization_memory_percent", Gauge::Int(30, 60)),
    ("utilization_encoder_percent", Gauge::Const(0.0)),
    ("utilization_decoder_percent", Gauge::Const(0.0)),
    ("clock_sm_mhz", Gauge::Const(1980.0)),
    ("clock_graphics_mhz", Gauge::Const(1980.0)),
    ("clock_memory_mhz", Gauge::Const(2619.0)),
    ("clock_video_mhz", Gauge::Const(1545.0)),
    ("clock_sm_max_mhz", Gauge::Const(1980.0)),
    ("temperature_gpu_celsius", Gauge::Walk(64.0)),
    ("temperature_memory_celsius", Gauge::Walk(71.0)),
    ("temperature_slowdown_celsius", Gauge::Const(90.0)),
    ("power_usage_watts", Gauge::MilliWatts),
    ("power_limit_watts", Gauge::Const(700.0)),
    ("memory_used_bytes", Gauge::Const(76_235_669_504.0)),
    ("memory_free_bytes", Gauge::Const(9_663_676_416.0)),
    ("memory_total_bytes", Gauge::Const(85_899_345_920.0)),
    ("bar1_used_bytes", Gauge::Const(16_777_216.0)),
    (
        "pcie_tx_kilobytes_per_second",
        Gauge::Int(900_000, 2_100_000),
    ),
    (
        "pcie_rx_kilobytes_per_second",
        Gauge::Int(900_000, 2_100_000),
    ),
    ("pcie_link_gen", Gauge::Const(5.0)),
    ("pcie_link_width", Gauge::Const(16.0)),
    (
        "nvlink_tx_kibibytes_per_second",
        Gauge::Int(100_000_000, 300_000_000),
    ),
    (
        "nvlink_rx_kibibytes_per_second",
        Gauge::Int(100_000_000, 300_000_000),
    ),
    ("fan_speed_percent", Gauge::Const(0.0)),
    ("performance_state", Gauge::Const(0.0)),
    ("clocks_event_reasons", Gauge::Const(0.0)),
    ("ecc_mode", Gauge::Const(1.0)),
    ("gpm_sm_active_percent", Gauge::Double(85.0)),
    ("gpm_sm_occupancy_percent", Gauge::Double(40.0)),
    ("gpm_tensor_active_percent", Gauge::Double(60.0)),
    ("gpm_dram_active_percent", Gauge::Double(45.0)),
    ("gpm_fp64_active_percent", Gauge::Double(0.5)),
    ("gpm_fp32_active_percent", Gauge::Double(12.0)),
    ("gpm_fp16_active_percent", Gauge::Double(35.0)),
    ("gpm_integer_active_percent", Gauge::Double(8.0)),
    ("gpm_pcie_tx_mebibytes_per_second", Gauge::Double(1430.0)),
    ("gpm_pcie_rx_mebibytes_per_second", Gauge::Double(1430.0)),
    (
        "gpm_nvlink_tx_mebibytes_per_second",
        Gauge::Double(190_000.0),
    ),
    (
        "gpm_nvlink_rx_mebibytes_per_second",
        Gauge::Double(190_000.0),
    ),
];

/// A node of 8 GPUs (40 gauges each) and 8 HCA ports (50 counters each), read every second
/// for `sweeps` seconds. Each GPU and each port is read at its own time within the sweep.
fn node_batch(sweeps: u64) -> Vec<Reading> {
    let mut noise = Noise(0x9e37_79b9_7f4a_7c15);
    let mut out = Vec::new();
    let mut walks = [[0f64; 40]; 8];
    let uuids: Vec<String> = (0..8)
        .map(|_| {
            let (a, b) = (noise.next(), noise.next());
            format!(
                "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
                a >> 32,
                (a >> 16) & 0xffff,
                a & 0xffff,
                b >> 48,
                b & 0xffff_ffff_ffff
            )
        })
        .collect();
    let mut counters = [[0u64; 50]; 8];
    for (p, port) in counters.iter_mut().enumerate() {
        port[0] = 4_000_000_000_000_000 + p as u64 * 1_000_000_007;
        port[1] = port[0] - 12_345_678;
        port[2] = 900_000_000_000_000;
        port[3] = 890_000_000_000_000;
        port[4] = port[2] - 77;
        port[5] = port[3] - 99;
        port[6] = 31_000_000_000_000;
        port[7] = 450_000_000_000;
        for (i, c) in port.iter_mut().enumerate().skip(8) {
            *c = match i {
                8..=13 => 10_000 + noise.below(100_000),
                15 => 1,
                16 => 3,
                25 => 12,
                29 => 10,
                _ => 0,
            };
        }
    }
    for s in 0..sweeps {
        let sweep = T0 + s * 1_000_000_000 + noise.below(3_000_000);
        for (g, walk) in walks.iter_mut().enumerate() {
            let t = sweep + g as u64 * 1_500_000 + noise.below(200_000);
            let labels = Labels::new([("gpu", g.to_string()), ("uuid", uuids[g].clone())]);
            for (i, (name, how)) in GPU_GAUGES.iter().enumerate() {
                let value = match *how {
                    Gauge::Const(v) => v,
                    Gauge::Int(lo, hi) => (lo + noise.below(hi - lo)) as f64,
                    Gauge::Walk(start) => {
                        if s == 0 {
                            walk[i] = start;
                        } else if noise.below(3) == 0 {
                            walk[i] += if noise.below(2) == 0 { 1.0 } else { -1.0 };
                        }
                        walk[i]
                    }
                    Gauge::MilliWatts => (550_000 + noise.below(150_000)) as f64 / 1000.0,
                    Gauge::Double(center) => center * (0.9 + 0.2 * noise.unit()),
                };
                out.push(Reading {
                    series: Series {
                        name: format!("railscope_gpu_{name}").into(),
                        labels: labels.clone(),
                        kind: Kind::Gauge,
                    },
                    value: Value::F64(value),
                    unix_ns: t,
                });
            }
        }
        for (p, port) in counters.iter_mut().enumerate() {
            let t = sweep + 12_000_000 + p as u64 * 400_000 + noise.below(100_000);
            let labels = Labels::new([("device", format!("mlx5_{p}")), ("port", "1".into())]);
            for (i, name) in IB_COUNTERS.iter().enumerate() {
                if s > 0 {
                    port[i] += match i {
                        0 | 1 => 4_500_000_000 + noise.below(1_000_000_000),
                        2..=5 => 1_100_000 + noise.below(250_000),
                        6 => noise.below(2_000_000),
                        7 => 550_000 + noise.below(100_000),
                        8..=10 | 13 => noise.below(3) * noise.below(50),
                        11 | 12 => u64::from(noise.below(20) == 0),
                        _ => 0,
                    };
                }
                out.push(Reading {
                    series: Series {
                        name: format!("railscope_ib_port_{name}_total").into(),
                        labels: labels.clone(),
                        kind: Kind::Counter,
                    },
                    value: Value::U64(port[i]),
                    unix_ns: t,
                });
            }
        }
    }
    out
}

#[test]
fn realistic_node_costs_at_most_two_bytes_per_sample() {
    // 10 one-second sweeps of 8 GPUs x 40 gauges and 8 ports x 50 counters, flushed once:
    // everything counted, headers, MACs and the first schema included.
    let readings = node_batch(10);
    assert_eq!(readings.len(), 7200);
    let config = EncoderConfig::new("gpu-node-017");
    let cost = measure(&readings, config, Duration::from_secs(10)).unwrap();
    assert_eq!(cost.samples, 7200);
    assert!(cost.largest_frame <= DEFAULT_MTU);
    assert!(cost.schema_bytes > 0);
    assert!(
        cost.bytes_per_sample() <= 2.0,
        "{cost:?}: {:.3} bytes/sample",
        cost.bytes_per_sample()
    );
    // Once the collector knows the series, samples alone cost well under that.
    assert!(
        cost.bytes_per_sample_without_schema() <= 1.6,
        "{cost:?}: {:.3} bytes/sample without schema",
        cost.bytes_per_sample_without_schema()
    );
}

#[test]
fn schema_requests_round_trip_and_refuse_anything_else() {
    let request = SchemaRequest {
        node: "gpu-node-017".into(),
        session: 0xdead_beef,
    };
    let bytes = encode_schema_request(&request, &key()).unwrap();
    assert_eq!(bytes.len(), MIN_REQUEST_LEN + request.node.len());
    assert_eq!(decode_schema_request(&bytes, &key()), Ok(request.clone()));

    let other_key = Key::from_bytes([7; 32]);
    assert!(matches!(
        decode_schema_request(&bytes, &other_key),
        Err(WireError::BadMac { .. })
    ));
    // Every truncation and every single bit flip is refused, never a panic.
    for len in 0..bytes.len() {
        assert!(
            decode_schema_request(&bytes[..len], &key()).is_err(),
            "{len}"
        );
    }
    for bit in 0..bytes.len() * 8 {
        let mut flipped = bytes.clone();
        flipped[bit / 8] ^= 1 << (bit % 8);
        assert!(
            decode_schema_request(&flipped, &key()).is_err(),
            "bit {bit}"
        );
    }
    // A frame is not a request, and a request is not a frame.
    let frame = encode_frame(
        &Frame {
            node: "n".into(),
            session: 1,
            seq: 0,
            send_unix_ns: 1,
            time_quantum_ns: 1,
            schema: Vec::new(),
            samples: Vec::new(),
            events: Vec::new(),
        },
        &key(),
    )
    .unwrap();
    assert_eq!(
        decode_schema_request(&frame, &key()),
        Err(WireError::BadMagic)
    );
    assert!(decode(&bytes, &key(), &mut ReceiverState::default()).is_err());
}
