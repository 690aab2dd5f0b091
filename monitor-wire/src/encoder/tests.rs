//! The encoder's tests: frames within the MTU that carry every sample once, schema entries
//! when due, idle series forgotten, splitting and cutting what does not fit, and losses that
//! cost only what was lost.

use std::{collections::HashMap, time::Duration};

use proptest::prelude::*;

use super::*;
use crate::{
    codec::decode,
    frame::{Frame, GaugeSample},
    receiver::ReceiverState,
    series::Labels,
    testing::{
        Noise, T0, arb_event, arb_samples, arb_series, decode_all, key, node_batch, quantized,
        received, series,
    },
};

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
            // A series whose schema entry would take more than half the MTU is refused, its
            // samples with it (a small MTU and long generated names): none of them may arrive.
            let mut refused = false;
            for sample in samples {
                match encoder.push_sample(&s, sample) {
                    Ok(()) => {}
                    Err(WireError::SeriesTooLarge { len, mtu: m, .. }) => {
                        prop_assert!(len > m / 2 && m == mtu, "refused {len} bytes at MTU {m}");
                        refused = true;
                    }
                    Err(e) => prop_assert!(false, "push_sample: {e}"),
                }
            }
            let entry = expected.entry(s).or_default();
            if !refused {
                entry.extend(quantized(data, 1_000_000));
            }
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
fn a_retired_series_sends_its_last_sample_then_is_forgotten() {
    let mut encoder = FrameEncoder::new(EncoderConfig::new("n"), key()).unwrap();
    let job = |j: u64| {
        series(
            "railscope_rdma_verbs_total",
            &[("cgroup", &format!("/job_{j}"))],
            Kind::Counter,
        )
    };
    let mut state = ReceiverState::default();
    let counter = |t: u64, value: u64| Sample::Counter(CounterSample { unix_ns: t, value });
    encoder.push_sample(&job(1), counter(T0, 1)).unwrap();
    encoder.push_sample(&job(2), counter(T0, 1)).unwrap();
    decode_all(&encoder.flush(T0), &mut state);
    // Job 1 ends: its final value is pushed, then it is retired.
    encoder.push_sample(&job(1), counter(T0 + 1, 7)).unwrap();
    encoder.retire_where(|s| s.labels.get("cgroup") == Some("/job_1"));
    assert_eq!(
        encoder.known_series(),
        2,
        "kept until its last sample is sent"
    );
    let last = decode_all(&encoder.flush(T0 + 2), &mut state);
    let values: Vec<u64> = last
        .iter()
        .flat_map(|f| f.samples.iter())
        .flat_map(|s| match &s.data {
            SeriesData::Counter(v) => v.iter().map(|c| c.value).collect::<Vec<_>>(),
            SeriesData::Gauge(_) => Vec::new(),
        })
        .collect();
    assert_eq!(values, vec![7], "the final value reached the receiver");
    assert_eq!(encoder.known_series(), 1, "then the series is forgotten");
    assert_eq!(encoder.stats().forgotten_series, 1);
}

#[test]
fn series_beyond_the_limit_are_counted_not_kept() {
    let mut config = EncoderConfig::new("n");
    config.max_series = 3;
    let mut encoder = FrameEncoder::new(config, key()).unwrap();
    for i in 0..5 {
        let s = series("railscope_x_total", &[("i", &i.to_string())], Kind::Counter);
        let sample = Sample::Counter(CounterSample {
            unix_ns: T0,
            value: 1,
        });
        encoder.push_sample(&s, sample).unwrap();
    }
    assert_eq!(encoder.known_series(), 3);
    assert_eq!(encoder.stats().refused_series_samples, 2);
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
    encoder.push_event(WireEvent {
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
    encoder.push_event(WireEvent {
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

#[test]
fn a_resumed_session_goes_on_after_the_last_frame_with_ids_never_used() {
    let temp = series("railscope_gpu_temp_celsius", &[("gpu", "0")], Kind::Gauge);
    let power = series("railscope_gpu_power_watts", &[("gpu", "0")], Kind::Gauge);
    let reading = |encoder: &mut FrameEncoder, series: &Series, s: u64| {
        let t = T0 + s * 1_000_000_000;
        encoder
            .push_sample(series, Sample::Gauge(GaugeSample::reading(t, s as f64)))
            .unwrap();
        encoder.flush(t)
    };
    let mut first = FrameEncoder::new(EncoderConfig::new("n"), key()).unwrap();
    let mut state = ReceiverState::default();
    decode_all(&reading(&mut first, &temp, 0), &mut state);
    // The agent's last frame never arrived before it restarted: it is in its spool file.
    let spooled = reading(&mut first, &temp, 1);
    let old_id = decode_all(&spooled, &mut ReceiverState::default())[0].samples[0].id;

    let mut resumed = FrameEncoder::resume(
        EncoderConfig::new("n"),
        key(),
        first.session(),
        first.next_seq(),
        first.next_series_id(),
    )
    .unwrap();
    let mut after = reading(&mut resumed, &power, 2);
    after.extend(reading(&mut resumed, &temp, 3));
    let frames = decode_all(&after, &mut state);
    assert_eq!(frames[0].session, first.session());
    assert_eq!(frames[0].seq, first.next_seq(), "after the spooled frame");
    let node = state.node("n").unwrap();
    assert!(!node.last.new_session);
    // Both series defined afresh, with ids the session never used.
    let new_ids: Vec<u32> = frames
        .iter()
        .flat_map(|f| f.schema.iter().map(|e| e.id))
        .collect();
    assert_eq!(new_ids.len(), 2, "{new_ids:?}");
    assert!(
        new_ids
            .iter()
            .all(|&id| id >= first.next_series_id() && id != old_id)
    );
    // The spooled frame, sent again late, still reads as what it was.
    let late = decode(&spooled[0], &key(), &mut state).unwrap();
    let node = state.node("n").unwrap();
    assert_eq!(node.series(late.samples[0].id), Some(&temp));
    assert_eq!((node.last.unknown_samples, node.sessions), (0, 1));
}
