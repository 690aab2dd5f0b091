//! Queries against what the simulated nodes sent, sample by sample.

use std::time::Duration;

use monitor_wire::{Key, Labels, Reading, Value, WireEvent};

use super::*;
use crate::{
    archive::{Archive, ArchiveConfig},
    node_archive::{NodeSender, append_frames_as_they_came, append_node_frames},
};

const T0: u64 = 1_790_000_000_000_000_000;
const S: u64 = 1_000_000_000;

fn key() -> Key {
    Key::from_bytes([7; 32])
}

struct Setup {
    _dir: tempfile::TempDir,
    archive: Archive,
    engine: QueryEngine,
    readings: Vec<(String, Reading)>,
}

/// Two nodes, 300 s each, in small segments (several sealed, the rest open); events on the
/// second node.
fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let mut archive = Archive::open(ArchiveConfig {
        segment_bytes: 32 << 10,
        segment_span: Duration::from_secs(1 << 30),
        retention_age: None,
        ..ArchiveConfig::new(dir.path())
    })
    .unwrap();
    let mut readings = Vec::new();
    for n in 0..2 {
        let name = format!("gpu-node-{n:03}");
        let mut sender = NodeSender::new(&name, n + 1, key());
        let frames = sender.run_observed(T0, 300, 10, &mut |r| {
            readings.push((name.clone(), r.clone()));
        });
        append_node_frames(&mut archive, &sender, &frames).unwrap();
        if n == 1 {
            for (i, (kind, labels)) in [
                ("xid", Labels::new([("gpu", "3")])),
                (
                    "ib_port",
                    Labels::new([("device", "mlx5_2"), ("port", "1")]),
                ),
                ("xid", Labels::new([("gpu", "5")])),
            ]
            .into_iter()
            .enumerate()
            {
                let at = T0 + (100 + 50 * i as u64) * S;
                let event = WireEvent {
                    unix_ns: at,
                    kind: kind.into(),
                    labels,
                    code: 79,
                    text: format!("event {i}"),
                };
                let f = sender.event(event, at + 1_000_000);
                append_node_frames(&mut archive, &sender, &[f]).unwrap();
            }
        }
        archive.tick().unwrap();
    }
    let engine = QueryEngine::new(archive.reader(), key());
    Setup {
        _dir: dir,
        archive,
        engine,
        readings,
    }
}

fn matchers(list: &[&str]) -> Vec<Matcher> {
    list.iter().map(|m| Matcher::parse(m).unwrap()).collect()
}

fn sent<'a>(
    s: &'a Setup,
    node: &'a str,
    metric: &'a str,
    label: (&'a str, &'a str),
) -> impl Iterator<Item = &'a Reading> + 'a {
    s.readings.iter().filter_map(move |(n, r)| {
        (n == node && &*r.series.name == metric && r.series.labels.get(label.0) == Some(label.1))
            .then_some(r)
    })
}

#[test]
fn a_counter_comes_back_with_every_value_and_its_rate() {
    let s = setup();
    assert!(
        s.archive.stats().segments > 3,
        "the test needs sealed segments"
    );
    let metric = "railscope_ib_port_xmit_bytes_total";
    let q = SeriesQuery {
        metric: metric.into(),
        matchers: matchers(&["node=gpu-node-001", "device=mlx5_4"]),
        start_ns: T0 + 100 * S,
        end_ns: T0 + 160 * S,
    };
    let (answers, _) = s.engine.series(&q).unwrap();
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0].labels["node"], "gpu-node-001");
    assert_eq!(answers[0].labels["device"], "mlx5_4");
    let Points::Counter(points) = &answers[0].points else {
        panic!("a counter")
    };
    let want: Vec<(u64, u64)> = sent(&s, "gpu-node-001", metric, ("device", "mlx5_4"))
        .map(|r| match r.value {
            Value::U64(v) => (r.unix_ns, v),
            Value::F64(_) => panic!("counters are integers"),
        })
        .collect();
    let in_range: Vec<(u64, u64)> = want
        .iter()
        .copied()
        .filter(|&(t, _)| t >= q.start_ns && t <= q.end_ns)
        .collect();
    let got: Vec<(u64, u64)> = points.iter().map(|p| (p.t, p.value)).collect();
    assert_eq!(got, in_range);
    // Rates from consecutive sent values, the first one from the sample before the range.
    for p in points {
        let i = want.iter().position(|&(t, _)| t == p.t).unwrap();
        let (pt, pv) = want[i - 1];
        let rate = (p.value - pv) as f64 / ((p.t - pt) as f64 / 1e9);
        assert_eq!(p.rate, Some(rate));
    }
}

#[test]
fn a_gauge_comes_back_with_its_envelopes_and_matchers_select_series() {
    let s = setup();
    let metric = "railscope_gpu_power_watts";
    let q = SeriesQuery {
        metric: metric.into(),
        matchers: matchers(&["node=~gpu-node-00[01]", "gpu!~[1-7]"]),
        start_ns: T0,
        end_ns: T0 + 300 * S,
    };
    let (answers, cost) = s.engine.series(&q).unwrap();
    let who: Vec<(&str, &str)> = answers
        .iter()
        .map(|a| (a.labels["node"].as_str(), a.labels["gpu"].as_str()))
        .collect();
    assert_eq!(who, [("gpu-node-000", "0"), ("gpu-node-001", "0")]);
    assert_eq!(cost.undecodable, 0);
    let Points::Gauge(points) = &answers[1].points else {
        panic!("a gauge")
    };
    let want: Vec<GaugePoint> = sent(&s, "gpu-node-001", metric, ("gpu", "0"))
        .map(|r| GaugePoint {
            start: r.unix_ns,
            t: r.unix_ns,
            min: r.value.as_f64(),
            max: r.value.as_f64(),
            mean: r.value.as_f64(),
        })
        .collect();
    assert_eq!(points, &want);
    assert_eq!(points.len(), 300);
}

#[test]
fn events_by_kind_node_device_and_time() {
    let s = setup();
    let all = EventQuery {
        start_ns: T0,
        end_ns: T0 + 300 * S,
        ..EventQuery::default()
    };
    let (events, _) = s.engine.events(&all).unwrap();
    let texts: Vec<&str> = events.iter().map(|e| e.text.as_str()).collect();
    assert_eq!(texts, ["event 0", "event 1", "event 2"]);
    assert_eq!(events[0].t, T0 + 100 * S);
    assert_eq!(events[0].node, "gpu-node-001");
    let xid = EventQuery {
        kind: Some("xid".into()),
        ..all.clone()
    };
    assert_eq!(s.engine.events(&xid).unwrap().0.len(), 2);
    let device = EventQuery {
        device: Some("mlx5_2".into()),
        ..all.clone()
    };
    let (events, _) = s.engine.events(&device).unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, "ib_port");
    let gpu5 = EventQuery {
        device: Some("5".into()),
        ..all.clone()
    };
    assert_eq!(s.engine.events(&gpu5).unwrap().0[0].text, "event 2");
    let other_node = EventQuery {
        node: Some("gpu-node-000".into()),
        ..all.clone()
    };
    assert!(s.engine.events(&other_node).unwrap().0.is_empty());
    let window = EventQuery {
        start_ns: T0 + 120 * S,
        end_ns: T0 + 150 * S,
        ..all
    };
    let (events, _) = s.engine.events(&window).unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].text, "event 1");
}

#[test]
fn answers_include_what_was_appended_and_not_yet_written_out() {
    let mut s = setup();
    let name = "gpu-node-009";
    let mut sender = NodeSender::new(name, 9, key());
    let frames = sender.run(T0 + 300 * S, 10, 10);
    append_node_frames(&mut s.archive, &sender, &frames).unwrap(); // no tick
    assert!(s.archive.stats().unwritten_bytes > 0);
    let q = SeriesQuery {
        metric: "railscope_gpu_temperature_celsius".into(),
        matchers: matchers(&["node=gpu-node-009"]),
        start_ns: T0 + 300 * S,
        end_ns: T0 + 310 * S,
    };
    let (answers, _) = s.engine.series(&q).unwrap();
    assert_eq!(answers.len(), 8);
    assert!(
        answers
            .iter()
            .all(|a| matches!(&a.points, Points::Gauge(p) if p.len() == 10))
    );
    let nodes = s.engine.nodes(T0 + 300 * S, T0 + 310 * S).unwrap();
    assert!(nodes.contains(name));
}

#[test]
fn a_reversed_time_range_is_refused() {
    let s = setup();
    let q = SeriesQuery {
        metric: "x".into(),
        matchers: vec![],
        start_ns: 2,
        end_ns: 1,
    };
    assert!(matches!(
        s.engine.series(&q).unwrap_err(),
        QueryError::Range { start: 2, end: 1 }
    ));
}

#[test]
fn the_points_limit_counts_the_points_answered_not_the_look_back() {
    let s = setup();
    let metric = "railscope_ib_port_xmit_bytes_total";
    let q = SeriesQuery {
        metric: metric.into(),
        matchers: matchers(&["node=gpu-node-001"]),
        start_ns: T0 + 280 * S,
        end_ns: T0 + 290 * S,
    };
    let (answers, _) = s.engine.series(&q).unwrap();
    let answered: usize = answers
        .iter()
        .map(|a| match &a.points {
            Points::Counter(p) => p.len(),
            Points::Gauge(p) => p.len(),
        })
        .sum();
    // The 5-minute look-back before the range holds many times the answer's points.
    let gathered_before: usize = sent(&s, "gpu-node-001", metric, ("port", "1"))
        .filter(|r| r.unix_ns >= q.start_ns - 300 * S && r.unix_ns < q.start_ns)
        .count();
    assert!(
        gathered_before > 5 * answered,
        "{gathered_before} vs {answered}"
    );
    let at_limit = QueryEngine::new(s.archive.reader(), key()).with_max_points(answered);
    let (limited, _) = at_limit.series(&q).unwrap();
    assert_eq!(
        limited, answers,
        "an answer of exactly the limit is given, rates included"
    );
    let below = QueryEngine::new(s.archive.reader(), key()).with_max_points(answered - 1);
    assert!(matches!(
        below.series(&q).unwrap_err(),
        QueryError::TooManyPoints { .. }
    ));
}

/// A question about the last minute passes over, unopened, the earlier frames of the
/// segments it reads that define no series, and its answer holds every sample of the minute
/// as sent.
#[test]
fn a_last_minute_question_passes_over_earlier_frames_and_answers_in_full() {
    let s = setup();
    let metric = "railscope_gpu_power_watts";
    let q = SeriesQuery {
        metric: metric.into(),
        matchers: matchers(&["node=gpu-node-001", "gpu=2"]),
        start_ns: T0 + 240 * S,
        end_ns: T0 + 299 * S,
    };
    let (answers, cost) = s.engine.series(&q).unwrap();
    assert!(cost.passed > 0, "{cost:?}");
    assert_eq!(answers.len(), 1);
    let Points::Gauge(points) = &answers[0].points else {
        panic!("a gauge")
    };
    let want: Vec<u64> = sent(&s, "gpu-node-001", metric, ("gpu", "2"))
        .map(|r| r.unix_ns)
        .filter(|&t| (q.start_ns..=q.end_ns).contains(&t))
        .collect();
    assert_eq!(points.iter().map(|p| p.t).collect::<Vec<_>>(), want);
    assert_eq!(want.len(), 60);
}

/// Several metrics asked at once give each the answer it gets asked alone, each within the
/// points limit on its own.
#[test]
fn metrics_asked_at_once_answer_as_each_asked_alone() {
    let s = setup();
    let nodes: BTreeSet<String> = ["gpu-node-000".to_owned(), "gpu-node-001".to_owned()].into();
    let queries: Vec<SeriesQuery> = [
        ("railscope_gpu_power_watts", vec!["gpu=~[0-3]"]),
        ("railscope_ib_port_xmit_bytes_total", vec![]),
        (
            "railscope_gpu_temperature_celsius",
            vec!["node=gpu-node-000"],
        ),
    ]
    .into_iter()
    .map(|(metric, m)| SeriesQuery {
        metric: metric.into(),
        matchers: matchers(&m),
        start_ns: T0 + 100 * S,
        end_ns: T0 + 200 * S,
    })
    .collect();
    let (together, _) = s.engine.series_many_of_nodes(&queries, &nodes).unwrap();
    assert_eq!(together.len(), 3);
    for (q, answers) in queries.iter().zip(&together) {
        let (alone, _) = s.engine.series_of_nodes(q, &nodes).unwrap();
        assert!(!alone.is_empty(), "{}", q.metric);
        assert_eq!(answers, &alone, "{}", q.metric);
    }
    // The limit holds per question: one that fits alone fits asked with others.
    let per_question = together.iter().map(|a| points_of(a)).max().unwrap();
    let limited = QueryEngine::new(s.archive.reader(), key()).with_max_points(per_question);
    assert!(limited.series_many_of_nodes(&queries, &nodes).is_ok());
    let below = QueryEngine::new(s.archive.reader(), key()).with_max_points(per_question - 1);
    assert!(matches!(
        below.series_many_of_nodes(&queries, &nodes),
        Err(QueryError::TooManyPoints { .. })
    ));
}

fn points_of(answers: &[SeriesAnswer]) -> usize {
    answers
        .iter()
        .map(|a| match &a.points {
            Points::Counter(p) => p.len(),
            Points::Gauge(p) => p.len(),
        })
        .sum()
}

/// A counter's first point takes its rate from the sample before the range even when that
/// sample is in a segment that ends before the range (read in a second step, for that node
/// only); a question of gauges over the same range never reads that segment.
#[test]
fn the_look_back_reads_older_segments_only_for_counters_without_a_base() {
    let dir = tempfile::tempdir().unwrap();
    let mut archive = Archive::open(ArchiveConfig {
        segment_span: Duration::from_secs(1 << 30),
        retention_age: None,
        ..ArchiveConfig::new(dir.path())
    })
    .unwrap();
    let mut readings = Vec::new();
    let name = "gpu-node-000";
    let mut sender = NodeSender::new(name, 1, key());
    let mut observe = |r: &Reading| readings.push(r.clone());
    // 150 s, sealed; then 60 s more in the open segment.
    let frames = sender.run_observed(T0, 150, 10, &mut observe);
    append_node_frames(&mut archive, &sender, &frames).unwrap();
    archive.seal().unwrap();
    let frames = sender.run_observed(T0 + 150 * S, 60, 10, &mut observe);
    append_node_frames(&mut archive, &sender, &frames).unwrap();
    archive.tick().unwrap();
    let engine = QueryEngine::new(archive.reader(), key());
    let (start_ns, end_ns) = (T0 + 150 * S, T0 + 209 * S);

    let counter = "railscope_ib_port_xmit_bytes_total";
    let q = SeriesQuery {
        metric: counter.into(),
        matchers: matchers(&["device=mlx5_1"]),
        start_ns,
        end_ns,
    };
    let (answers, cost) = engine.series(&q).unwrap();
    assert_eq!(
        cost.segments, 1,
        "the sealed segment is read for the base: {cost:?}"
    );
    let Points::Counter(points) = &answers[0].points else {
        panic!("a counter")
    };
    let sent: Vec<(u64, u64)> = readings
        .iter()
        .filter(|r| &*r.series.name == counter && r.series.labels.get("device") == Some("mlx5_1"))
        .map(|r| match r.value {
            Value::U64(v) => (r.unix_ns, v),
            Value::F64(_) => panic!("counters are integers"),
        })
        .collect();
    let first = sent.iter().position(|&(t, _)| t == start_ns).unwrap();
    let ((t0, v0), (t1, v1)) = (sent[first - 1], sent[first]);
    assert!(t0 < T0 + 150 * S, "the base is in the sealed segment");
    assert_eq!(points[0].t, t1);
    assert_eq!(
        points[0].rate,
        Some((v1 - v0) as f64 / ((t1 - t0) as f64 / 1e9))
    );
    assert_eq!(points.len(), 60);

    let gauge = SeriesQuery {
        metric: "railscope_gpu_power_watts".into(),
        matchers: matchers(&["gpu=2"]),
        start_ns,
        end_ns,
    };
    let (answers, cost) = engine.series(&gauge).unwrap();
    assert_eq!(cost.segments, 0, "no sealed segment is read: {cost:?}");
    let Points::Gauge(points) = &answers[0].points else {
        panic!("a gauge")
    };
    assert_eq!(points.len(), 60);
}

/// A node's frames archived as they came: frames 1 to 3 (samples of ids frame 0 defines)
/// before frame 0, as when a session's first datagram is delayed behind the next ones. The archive
/// holds both and acknowledged both; every sample sent must come back, value by value.
fn archive_with_the_first_frame_late(without_schema: bool) -> (Setup, Vec<(String, Reading)>) {
    let dir = tempfile::tempdir().unwrap();
    let mut archive = Archive::open(ArchiveConfig {
        segment_bytes: 32 << 10,
        segment_span: Duration::from_secs(1 << 30),
        retention_age: None,
        ..ArchiveConfig::new(dir.path())
    })
    .unwrap();
    let name = "gpu-node-000";
    let mut sender = NodeSender::new(name, 1, key());
    let mut readings = Vec::new();
    let mut frames = sender.run_observed(T0, 300, 10, &mut |r| {
        readings.push((name.to_owned(), r.clone()));
    });
    // The agent's first frame is schema entries only; the first flush's samples follow in
    // the next three, most of them of ids the first defines. It comes after them.
    frames[..4].rotate_left(1);
    if without_schema {
        let mut state = monitor_wire::ReceiverState::default();
        frames.retain(|f| {
            let frame = monitor_wire::decode(&f.bytes, &key(), &mut state).unwrap();
            frame.schema.is_empty()
        });
    }
    // The collector's live table knows no schema of a session whose first frame has not
    // come: a new segment starts without one.
    append_frames_as_they_came(&mut archive, name, &frames).unwrap();
    archive.tick().unwrap();
    let engine = QueryEngine::new(archive.reader(), key());
    let setup = Setup {
        _dir: dir,
        archive,
        engine,
        readings: Vec::new(),
    };
    (setup, readings)
}

#[test]
fn samples_archived_before_the_frame_defining_their_ids_come_back() {
    let (s, readings) = archive_with_the_first_frame_late(false);
    assert!(
        s.archive.stats().segments > 1,
        "the test needs sealed segments"
    );
    for (metric, label) in [
        ("railscope_ib_port_xmit_bytes_total", ("device", "mlx5_4")),
        ("railscope_gpu_temperature_celsius", ("gpu", "2")),
    ] {
        let q = SeriesQuery {
            metric: metric.into(),
            matchers: matchers(&[&format!("{}={}", label.0, label.1)]),
            start_ns: T0,
            end_ns: T0 + 300 * S,
        };
        let (answers, cost) = s.engine.series(&q).unwrap();
        assert_eq!(cost.unplaced, 0, "{metric}");
        assert_eq!(answers.len(), 1, "{metric}");
        let got: Vec<(u64, f64)> = match &answers[0].points {
            Points::Counter(p) => p.iter().map(|p| (p.t, p.value as f64)).collect(),
            Points::Gauge(p) => p.iter().map(|p| (p.t, p.mean)).collect(),
        };
        let want: Vec<(u64, f64)> = readings
            .iter()
            .filter(|(_, r)| {
                &*r.series.name == metric && r.series.labels.get(label.0) == Some(label.1)
            })
            .map(|(_, r)| (r.unix_ns, r.value.as_f64()))
            .collect();
        assert_eq!(want.len(), 300, "{metric}");
        assert_eq!(got, want, "{metric}: what was sent, value by value");
    }
}

#[test]
fn samples_whose_ids_no_frame_defines_are_counted_unplaced() {
    let (s, _) = archive_with_the_first_frame_late(true);
    let q = SeriesQuery {
        metric: "railscope_gpu_temperature_celsius".into(),
        matchers: Vec::new(),
        start_ns: T0,
        end_ns: T0 + 300 * S,
    };
    let (answers, cost) = s.engine.series(&q).unwrap();
    // Every frame with schema entries left out: nothing of this node can be placed, and the
    // answer says how much.
    assert_eq!(answers.len(), 0);
    assert!(cost.unplaced > 1000, "{cost:?}");
}
