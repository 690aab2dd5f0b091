//! The writer, the reader and the analysis together on synthetic captures whose truth is
//! known: one port flapping on a scripted pattern, one stable.

use monitor_wire::{
    EncoderConfig, FrameEncoder, Key, Kind, Labels, Reading, Series, Value, WireEvent,
};

use crate::{
    CaptureError, CaptureHeader, CaptureWriter, PortInfo, Rules, Timelines, Trailer, Verdict,
    analyse, format::key_hex, read_capture,
};

const MS: u64 = 1_000_000;
const T0: u64 = 1_763_164_800_000_000_000;
const KEY: [u8; 32] = [7; 32];

fn header() -> CaptureHeader {
    CaptureHeader {
        railscope_version: "0.1.0".into(),
        host: "node1".into(),
        kernel: "6.1.0-test".into(),
        started_unix_ns: T0,
        interval_ns: 10 * MS,
        pre_trigger_ns: 1000 * MS,
        post_trigger_ns: 1000 * MS,
        baseline_ns: 1000 * MS,
        devices: vec!["rxe0".into(), "rxe2".into()],
        ports: vec![
            PortInfo {
                device: "rxe0".into(),
                port: 1,
                link_layer: "Ethernet".into(),
            },
            PortInfo {
                device: "rxe2".into(),
                port: 1,
                link_layer: "Ethernet".into(),
            },
        ],
        counters: vec!["link_downed".into(), "symbol_error".into()],
        frame_key: key_hex(&KEY),
    }
}

fn series(name: &str, device: &str, kind: Kind) -> Series {
    Series {
        name: name.into(),
        labels: Labels::new([("device", device), ("port", "1")]),
        kind,
    }
}

fn port_event(at: u64, device: &str, name: &str) -> WireEvent {
    WireEvent {
        unix_ns: at,
        kind: "ib_port".into(),
        labels: Labels::new([("device", device), ("port", "1"), ("cgroup", "/")]),
        code: 0,
        text: name.into(),
    }
}

/// Down periods of rxe0 (start, length in ms from T0): 4 downs, two under a second.
const DOWNS: [(u64, u64); 4] = [(500, 300), (1500, 1200), (3300, 150), (4000, 700)];

/// A capture of 6 s: rxe0 flaps per `DOWNS` (PORT_ERR once, PORT_ACTIVE twice per cycle, as
/// rxe does), rxe2 stays up; snapshots every 10 ms; frames flushed every 500 ms.
fn synthetic_capture(with_trailer: bool) -> Vec<u8> {
    let mut enc = FrameEncoder::new(EncoderConfig::new("node1"), Key::from_bytes(KEY)).unwrap();
    let mut w = CaptureWriter::new(Vec::new(), &header(), 1 << 30).unwrap();
    let down_at = |t: u64| {
        DOWNS
            .iter()
            .any(|&(s, l)| t >= T0 + s * MS && t < T0 + (s + l) * MS)
    };
    let mut link_downed = 0;
    for step in 0..=600u64 {
        let t = T0 + step * 10 * MS;
        for &(s, l) in &DOWNS {
            if t == T0 + s * MS {
                enc.push_event(port_event(t, "rxe0", "PORT_ERR"));
                link_downed += 1;
            }
            if t == T0 + (s + l) * MS {
                enc.push_event(port_event(t, "rxe0", "PORT_ACTIVE"));
                enc.push_event(port_event(t + MS, "rxe0", "PORT_ACTIVE"));
            }
        }
        for f in enc.flush_events(t + 2 * MS) {
            w.write_frame(&f).unwrap();
        }
        for (device, down) in [("rxe0", down_at(t)), ("rxe2", false)] {
            let state = if down { 1.0 } else { 4.0 };
            for (name, kind, value) in [
                ("railscope_ib_port_state", Kind::Gauge, Value::F64(state)),
                (
                    "railscope_ib_port_width_lanes",
                    Kind::Gauge,
                    Value::F64(4.0),
                ),
                (
                    "railscope_ib_link_downed_total",
                    Kind::Counter,
                    Value::U64(if device == "rxe0" { link_downed } else { 0 }),
                ),
            ] {
                enc.push_reading(&Reading {
                    series: series(name, device, kind),
                    value,
                    unix_ns: t,
                })
                .unwrap();
            }
        }
        if step % 50 == 49 {
            for f in enc.flush(t + 3 * MS) {
                w.write_frame(&f).unwrap();
            }
        }
    }
    for f in enc.flush(T0 + 6100 * MS) {
        w.write_frame(&f).unwrap();
    }
    let trailer = Trailer {
        reason: "duration".into(),
        ended_unix_ns: T0 + 6100 * MS,
        events: 12,
        snapshots_written: 601,
        triggers: 4,
    };
    let bytes = w.finish(&trailer).unwrap();
    if with_trailer {
        bytes
    } else {
        // What a capture killed before its end leaves: everything but the trailer.
        let last = *record_offsets(&bytes).last().unwrap();
        bytes[..last].to_vec()
    }
}

/// The offset of every record (the first follows the header).
fn record_offsets(bytes: &[u8]) -> Vec<usize> {
    let header_len = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
    let mut at = 16 + header_len;
    let mut out = Vec::new();
    while at < bytes.len() {
        out.push(at);
        at += 8 + u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    }
    out
}

fn report(bytes: &[u8]) -> (crate::ReadCapture, Vec<crate::PortReport>) {
    let mut timelines = Timelines::default();
    let read = read_capture(bytes, |_, frame, state| timelines.add_frame(frame, state)).unwrap();
    timelines.finish();
    (read, analyse(&timelines, &Rules::default()))
}

#[test]
fn a_clean_capture_reads_whole_and_names_the_flapping_port() {
    let bytes = synthetic_capture(true);
    let (read, ports) = report(&bytes);
    assert_eq!(read.header, header());
    assert!(read.stopped.is_none(), "{:?}", read.stopped);
    assert_eq!(read.trailer.unwrap().reason, "duration");
    assert_eq!(read.complete_bytes, bytes.len() as u64);
    assert_eq!(ports.len(), 2);
    let flapped = &ports[0];
    assert_eq!(flapped.port.device, "rxe0");
    assert_eq!(flapped.verdict, Verdict::Flapping);
    assert_eq!(flapped.down_transitions, 4);
    assert_eq!(flapped.up_transitions, 4);
    assert_eq!(flapped.transitions_from, "events");
    let truth: u64 = DOWNS.iter().map(|d| d.1 * MS).sum();
    assert_eq!(flapped.time_down_ns, truth);
    assert_eq!(flapped.events["PORT_ERR"], 4);
    assert_eq!(flapped.events["PORT_ACTIVE"], 8, "duplicates are kept raw");
    // All four downs are less than 10 s apart: one episode, link_downed moved by 4 across it.
    assert_eq!(flapped.episodes.len(), 1);
    assert_eq!(flapped.episodes[0].downs, 4);
    assert_eq!(flapped.episodes[0].counter_deltas["link_downed"], 4);
    let stable = &ports[1];
    assert_eq!(stable.port.device, "rxe2");
    assert_eq!(stable.verdict, Verdict::Stable);
    assert_eq!(stable.down_transitions, 0);
    assert_eq!(stable.time_down_ns, 0);
}

#[test]
fn without_events_the_state_snapshots_give_the_transitions_within_an_interval() {
    let bytes = synthetic_capture(true);
    let mut timelines = Timelines::default();
    read_capture(&bytes, |_, frame, state| timelines.add_frame(frame, state)).unwrap();
    timelines.finish();
    for t in timelines.ports.values_mut() {
        t.events.clear();
    }
    let ports = analyse(&timelines, &Rules::default());
    assert_eq!(ports[0].transitions_from, "snapshots");
    assert_eq!(ports[0].down_transitions, 4);
    let truth: u64 = DOWNS.iter().map(|d| d.1 * MS).sum();
    assert!(ports[0].time_down_ns.abs_diff(truth) <= 4 * 10 * MS);
    assert_eq!(ports[0].verdict, Verdict::Flapping);
}

#[test]
fn a_file_cut_anywhere_reads_up_to_its_last_complete_record() {
    let bytes = synthetic_capture(true);
    let records = record_offsets(&bytes);
    let header_end = records[0];
    for cut in 0..bytes.len() {
        let prefix = &bytes[..cut];
        let mut frames = 0;
        let result = read_capture(prefix, |_, _, _| frames += 1);
        if cut < header_end {
            let err = result.unwrap_err();
            assert!(
                matches!(err, CaptureError::BadHeader { .. }),
                "cut {cut}: {err}"
            );
            continue;
        }
        let read = result.unwrap();
        let last_start = records.iter().copied().filter(|&r| r <= cut).max().unwrap();
        if records.contains(&cut) || cut == header_end {
            assert!(read.stopped.is_none(), "cut {cut} at a record boundary");
            assert_eq!(read.complete_bytes, cut as u64);
        } else {
            let err = read.stopped.expect("a torn record");
            assert!(
                matches!(err, CaptureError::Torn { offset, .. } if offset == last_start as u64),
                "cut {cut}: {err}"
            );
            assert_eq!(read.complete_bytes, last_start as u64);
            assert!(err.to_string().contains(&format!("offset {last_start}")));
        }
        // Every complete frame record before the cut was read (the last record is the
        // trailer).
        let trailer = *records.last().unwrap();
        let expected = records
            .iter()
            .filter(|&&r| r != trailer && record_end(&bytes, r) <= cut)
            .count();
        assert_eq!(frames, expected as u64, "cut {cut}");
    }
}

fn record_end(bytes: &[u8], at: usize) -> usize {
    at + 8 + u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize
}

#[test]
fn a_corrupt_byte_stops_reading_at_its_record_with_what_precedes_it() {
    let bytes = synthetic_capture(true);
    let records = record_offsets(&bytes);
    for &flip in records
        .iter()
        .flat_map(|&r| [r, r + 3, r + 5, r + 8, r + 20])
        .collect::<Vec<_>>()
        .iter()
    {
        if flip >= bytes.len() {
            continue;
        }
        let mut bad = bytes.clone();
        bad[flip] ^= 0x40;
        let record = records
            .iter()
            .copied()
            .filter(|&r| r <= flip)
            .max()
            .unwrap();
        let index = records.iter().position(|&r| r == record).unwrap();
        let mut frames = 0;
        let read = read_capture(&bad, |_, _, _| frames += 1).unwrap();
        let err = read.stopped.expect("corruption is found");
        assert_eq!(err.offset(), Some(record as u64), "flip at {flip}: {err}");
        assert_eq!(
            frames, index as u64,
            "flip at {flip}: the records before it are read"
        );
    }
    // A corrupt header is refused as such, naming where.
    let mut bad = bytes.clone();
    bad[30] ^= 1;
    let err = read_capture(&bad, |_, _, _| {}).unwrap_err();
    assert_eq!(
        err.to_string(),
        "not a readable capture file: header checksum mismatch (at offset 16)"
    );
}

#[test]
fn a_capture_without_trailer_still_reports() {
    let bytes = synthetic_capture(false);
    let (read, ports) = report(&bytes);
    assert!(read.trailer.is_none());
    assert!(read.stopped.is_none());
    assert_eq!(ports[0].down_transitions, 4);
}

#[test]
fn the_size_cap_holds() {
    let mut w = CaptureWriter::new(Vec::new(), &header(), 4096).unwrap();
    let frame = vec![0u8; 1000];
    let mut written = 0;
    loop {
        match w.write_frame(&frame) {
            Ok(()) => written += 1,
            Err(CaptureError::SizeCap { cap }) => {
                assert_eq!(cap, 4096);
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(written >= 1);
    let out = w
        .finish(&Trailer {
            reason: "size cap".into(),
            ended_unix_ns: 0,
            events: 0,
            snapshots_written: 0,
            triggers: 0,
        })
        .unwrap();
    assert!(out.len() <= 4096, "{} bytes", out.len());
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config::with_cases(512))]

    /// Any byte of any record changed to any other value: reading stops at that record,
    /// naming its offset, with every record before it read; it never panics.
    #[test]
    fn any_corruption_stops_at_its_record(at in 0usize..1_000_000, xor in 1u8..=255) {
        let bytes = corrupt_fixture();
        let records = record_offsets(&bytes);
        let at = records[0] + at % (bytes.len() - records[0]);
        let mut bad = bytes.clone();
        bad[at] ^= xor;
        let record = records.iter().copied().filter(|&r| r <= at).max().unwrap();
        let index = records.iter().position(|&r| r == record).unwrap();
        let mut frames = 0u64;
        let read = read_capture(&bad, |_, _, _| frames += 1).unwrap();
        let err = read.stopped.expect("the change is found");
        proptest::prop_assert_eq!(err.offset(), Some(record as u64), "{}", err);
        // The trailer (last record) is no frame.
        proptest::prop_assert_eq!(frames, index.min(records.len() - 1) as u64);
    }
}

/// The synthetic capture, made once for the property test.
fn corrupt_fixture() -> Vec<u8> {
    static BYTES: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BYTES.get_or_init(|| synthetic_capture(true)).clone()
}

/// Found by the `capture_file` fuzz target: a counter whose samples jump between values near
/// 2^64 and small ones (each drop counts as a reset) rose by more than a u64 holds in all.
/// The report must still come out, the rise saturating rather than overflowing.
#[test]
fn a_counter_rising_beyond_u64_saturates_in_the_report() {
    let bytes = include_bytes!("../tests/fixtures/fuzz-counter-overflow.rscap");
    let mut timelines = Timelines::default();
    let source = crate::report::load_capture("fuzz.rscap", bytes, &mut timelines).unwrap();
    timelines.finish();
    let ports = analyse(&timelines, &Rules::default());
    let saturated: Vec<&String> = ports
        .iter()
        .flat_map(|p| &p.counter_deltas)
        .filter(|(_, d)| **d == u64::MAX)
        .map(|(name, _)| name)
        .collect();
    assert!(!saturated.is_empty(), "{ports:#?}");
    let report = crate::report::Report {
        sources: vec![source],
        rules: Rules::default(),
        ports,
    };
    assert!(report.to_text().contains(&format!("+{}", u64::MAX)));
    assert!(report.to_json().contains(&u64::MAX.to_string()));
    for port in &report.ports {
        let svg = crate::svg::port_timeline(port, &timelines.ports[&port.port]);
        assert!(svg.ends_with("</svg>\n"));
    }
}

/// A capture of 6 s (`started_unix_ns` T0, trailer at T0 + 6 s) begun while rxe0 was
/// already down (state DOWN, phys_state Disabled), as the agent writes it: snapshots every
/// 100 ms from T0 + 30 ms, rxe0 coming up at `up_ms` (never for `None`) with rxe's double
/// `PORT_ACTIVE` when `with_events`; rxe2 up throughout.
fn capture_started_down(up_ms: Option<u64>, with_events: bool) -> Vec<u8> {
    let mut enc = FrameEncoder::new(EncoderConfig::new("node1"), Key::from_bytes(KEY)).unwrap();
    let header = CaptureHeader {
        interval_ns: 100 * MS,
        ..header()
    };
    let mut w = CaptureWriter::new(Vec::new(), &header, 1 << 30).unwrap();
    let up_at = up_ms.map(|ms| T0 + ms * MS);
    let mut events_out = false;
    for step in 0..60u64 {
        let t = T0 + 30 * MS + step * 100 * MS;
        if with_events
            && !events_out
            && let Some(up) = up_at.filter(|&up| up <= t)
        {
            enc.push_event(port_event(up, "rxe0", "PORT_ACTIVE"));
            enc.push_event(port_event(up + MS, "rxe0", "PORT_ACTIVE"));
            for f in enc.flush_events(up + 2 * MS) {
                w.write_frame(&f).unwrap();
            }
            events_out = true;
        }
        let rxe0_up = up_at.is_some_and(|up| t >= up);
        for (device, up) in [("rxe0", rxe0_up), ("rxe2", true)] {
            let (state, phys) = if up { (4.0, 5.0) } else { (1.0, 3.0) };
            for (name, kind, value) in [
                ("railscope_ib_port_state", Kind::Gauge, Value::F64(state)),
                (
                    "railscope_ib_port_phys_state",
                    Kind::Gauge,
                    Value::F64(phys),
                ),
                (
                    "railscope_ib_port_width_lanes",
                    Kind::Gauge,
                    Value::F64(4.0),
                ),
                (
                    "railscope_ib_link_downed_total",
                    Kind::Counter,
                    Value::U64(0),
                ),
            ] {
                enc.push_reading(&Reading {
                    series: series(name, device, kind),
                    value,
                    unix_ns: t,
                })
                .unwrap();
            }
        }
        if step % 10 == 9 {
            for f in enc.flush(t + 3 * MS) {
                w.write_frame(&f).unwrap();
            }
        }
    }
    for f in enc.flush(T0 + 6000 * MS) {
        w.write_frame(&f).unwrap();
    }
    w.finish(&Trailer {
        reason: "duration".into(),
        ended_unix_ns: T0 + 6000 * MS,
        events: if with_events && up_ms.is_some() { 2 } else { 0 },
        snapshots_written: 60,
        triggers: 0,
    })
    .unwrap()
}

/// What `railscope report` makes of a capture file (its range from the header's start to
/// the trailer's end).
fn report_as_railscope_does(bytes: &[u8]) -> crate::report::Report {
    let mut timelines = Timelines::default();
    let source = crate::report::load_capture("down.rscap", bytes, &mut timelines).unwrap();
    timelines.finish();
    crate::report::Report {
        sources: vec![source],
        rules: Rules::default(),
        ports: analyse(&timelines, &Rules::default()),
    }
}

/// Issue 28, defect 4: a port down when the capture starts is down from the start of the
/// range (not from the last snapshot before its `PORT_ACTIVE`); no down transition was seen,
/// the up one was.
#[test]
fn a_port_down_at_the_start_is_down_from_the_start_of_the_range_until_its_port_active() {
    let report = report_as_railscope_does(&capture_started_down(Some(3400), true));
    let p = &report.ports[0];
    assert_eq!(p.port.device, "rxe0");
    assert_eq!(p.first_unix_ns, T0);
    assert_eq!(p.transitions_from, "events");
    // Exact: from the range's start to the kernel's PORT_ACTIVE.
    assert_eq!(p.time_down_ns, 3400 * MS, "{p:#?}");
    assert_eq!(p.down_transitions, 0, "{p:#?}");
    assert_eq!(p.up_transitions, 1, "{p:#?}");
    assert_eq!(p.downs.len(), 1);
    assert!(p.downs[0].from_start);
    assert_eq!(p.downs[0].down_unix_ns, T0);
    assert_eq!(p.downs[0].up_unix_ns, Some(T0 + 3400 * MS));
    assert_eq!(p.episodes.len(), 1);
    assert_eq!(p.verdict, Verdict::Degraded, "{p:#?}");
    let text = report.to_text();
    assert!(
        text.contains(
            "node1 rxe0/1: DEGRADED  (0 down, 1 up, 3.400 s down in all, 1 episode(s); \
             transitions from events)"
        ),
        "{text}"
    );
    assert!(
        text.contains("because down at the start of the range, up after 3.400 s"),
        "{text}"
    );
    assert!(text.contains("  down at the start +0.000 s"), "{text}");
    let stable = &report.ports[1];
    assert_eq!(stable.verdict, Verdict::Stable);
    assert_eq!(stable.time_down_ns, 0);
}

/// The same from the snapshots alone: down from the start of the range to the first ACTIVE
/// snapshot, within one snapshot interval of the truth.
#[test]
fn a_port_down_at_the_start_without_events_is_down_from_the_start_within_an_interval() {
    let report = report_as_railscope_does(&capture_started_down(Some(3400), false));
    let p = &report.ports[0];
    assert_eq!(p.transitions_from, "snapshots");
    assert!(
        p.time_down_ns.abs_diff(3400 * MS) <= 100 * MS,
        "{} ms down",
        p.time_down_ns / MS
    );
    assert_eq!(p.down_transitions, 0, "{p:#?}");
    assert_eq!(p.up_transitions, 1, "{p:#?}");
    assert_eq!(p.downs.len(), 1);
    assert!(p.downs[0].from_start);
    assert_eq!(p.downs[0].down_unix_ns, T0);
    assert_eq!(p.episodes.len(), 1);
    assert_eq!(p.verdict, Verdict::Degraded, "{p:#?}");
}

/// A port down for the whole capture, without a single event: one period open from the
/// start of the range to its end, the whole range down.
#[test]
fn a_port_down_throughout_is_down_for_the_whole_range() {
    let report = report_as_railscope_does(&capture_started_down(None, false));
    let p = &report.ports[0];
    assert_eq!(p.transitions_from, "snapshots");
    assert_eq!(p.verdict, Verdict::Down, "{p:#?}");
    assert_eq!(p.down_transitions, 0);
    assert_eq!(p.up_transitions, 0);
    assert_eq!(p.time_down_ns, 6000 * MS, "{p:#?}");
    assert_eq!(p.downs.len(), 1);
    assert!(p.downs[0].from_start);
    assert_eq!(p.downs[0].down_unix_ns, T0);
    assert_eq!(p.downs[0].up_unix_ns, None);
    assert_eq!(p.episodes.len(), 1);
    assert_eq!(p.episodes[0].time_down_ns, 6000 * MS);
    let text = report.to_text();
    assert!(
        text.contains(
            "node1 rxe0/1: DOWN  (0 down, 0 up, 6.000 s down in all, 1 episode(s); \
             transitions from snapshots)"
        ),
        "{text}"
    );
    assert!(
        text.contains("because down at the end of the range"),
        "{text}"
    );
}
