//! The sampler on synthetic signals: back-off, changes caught, envelopes, groups.

use super::*;
use monitor_wire::{Kind, Labels};

const S: u64 = 1_000_000_000;

fn series(name: &str, kind: Kind) -> Series {
    Series {
        name: name.into(),
        labels: Labels::new([("gpu", "0")]),
        kind,
    }
}

fn config() -> SamplerConfig {
    SamplerConfig::default()
}

/// Reads `f(second)` once a second for `secs` seconds whenever the series is due, as an
/// agent ticking at the minimum interval does. Returns (reads, emits with their second).
fn drive(
    sampler: &mut AdaptiveSampler,
    s: &Series,
    secs: u64,
    f: impl Fn(u64) -> Value,
) -> (Vec<u64>, Vec<(u64, Emit)>) {
    drive_range(sampler, s, 1..=secs, f)
}

/// Like `drive`, over the seconds of `range`.
fn drive_range(
    sampler: &mut AdaptiveSampler,
    s: &Series,
    range: std::ops::RangeInclusive<u64>,
    f: impl Fn(u64) -> Value,
) -> (Vec<u64>, Vec<(u64, Emit)>) {
    let mut reads = Vec::new();
    let mut emits = Vec::new();
    for sec in range {
        let now = sec * S;
        if sampler.due(s, now) {
            reads.push(sec);
            for e in sampler.observe(s, f(sec), now) {
                emits.push((sec, e));
            }
        }
    }
    (reads, emits)
}

#[test]
fn operators_configure_groups_by_prefix() {
    let ib = SamplerConfig {
        ground_truth_every: 2,
        ..config()
    };
    let mut sampler =
        AdaptiveSampler::new(config()).with_group("railscope_ib_", "railscope_ib_", ib);
    sampler
        .configure("railscope_ib_symbol_error_total:max=300")
        .unwrap();
    sampler
        .configure("railscope_gpu_:off, window=12,tolerance=0.2")
        .unwrap();
    let errors = series("railscope_ib_symbol_error_total", Kind::Counter);
    let (group, c) = sampler.group_of(&errors);
    assert_eq!(group, "railscope_ib_symbol_error_total");
    // The IB group's ground truth is kept; only the cap changed.
    assert_eq!(
        (c.max_interval, c.ground_truth_every),
        (Duration::from_secs(300), 2)
    );
    let (_, c) = sampler.group_of(&series("railscope_gpu_power_watts", Kind::Gauge));
    assert_eq!((c.enabled, c.window, c.peak_tolerance), (false, 12, 0.2));
    let (_, c) = sampler.group_of(&series("railscope_ib_port_state", Kind::Gauge));
    assert_eq!(c.max_interval, Duration::from_secs(32));
    // A fixed-interval group reads and sends every interval.
    let power = series("railscope_gpu_power_watts", Kind::Gauge);
    let (reads, emits) = drive(&mut sampler, &power, 60, |_| Value::F64(300.0));
    assert_eq!((reads.len(), emits.len()), (60, 60));

    for (spec, why) in [
        ("railscope_gpu_", "expected PREFIX:SETTING"),
        ("railscope_gpu_:max", "needs a value"),
        ("railscope_gpu_:max=-1", "not a non-negative number"),
        ("railscope_gpu_:window=0.5", "not a whole number"),
        ("railscope_gpu_:fast", "unknown setting"),
        ("railscope_gpu_:max=0.5", "below the minimum interval"),
    ] {
        let e = sampler.configure(spec).unwrap_err();
        assert!(e.to_string().contains(why), "{spec}: {e}");
        assert!(
            e.to_string().starts_with(&format!("--sampling {spec:?}")),
            "{e}"
        );
    }
}

#[test]
fn slots_find_the_same_state_as_the_series() {
    let (a, b) = (
        series("railscope_a_total", Kind::Counter),
        series("railscope_b_total", Kind::Counter),
    );
    let mut sampler = AdaptiveSampler::new(config());
    let (mut slot_a, mut slot_b) = (Slot::default(), Slot::default());
    for sec in 1..=100 {
        let now = sec * S;
        // `a` through its slot, `b` by name: both must behave like the slot-less sampler.
        if sampler.due_at(&a, &mut slot_a, now) {
            sampler.observe_at(&a, &mut slot_a, Value::U64(sec * 10), now);
        }
        if sampler.due(&b, now) {
            sampler.observe(&b, Value::U64(sec * 10), now);
        }
    }
    assert_ne!(slot_a, Slot::default());
    assert_eq!(sampler.next_due_ns(&a), sampler.next_due_ns(&b));
    assert_eq!(sampler.mode(&a), Some(Mode::Stable));
    // A slot that points at `a` says nothing about `b` in another sampler: it is not used.
    let mut other = AdaptiveSampler::new(config());
    other.observe(&b, Value::U64(1), S);
    other.observe_at(&a, &mut slot_b, Value::U64(1), S);
    assert!(other.due_at(&a, &mut slot_a, 2 * S));
    assert_eq!(other.len(), 2);
    // After series are forgotten, old slots are not trusted either.
    sampler.remove_stale(1000 * S, std::time::Duration::from_secs(1));
    assert!(sampler.is_empty());
    assert!(sampler.due_at(&a, &mut slot_a, 1001 * S));
    sampler.observe_at(&b, &mut slot_a, Value::U64(5), 1001 * S);
    assert_eq!(sampler.len(), 1);
    assert_eq!(sampler.mode(&a), None);
}

fn gauge(e: &Emit) -> Envelope {
    match e {
        Emit::Gauge(env) => *env,
        Emit::Counter { .. } => panic!("counter emit for a gauge"),
    }
}

/// The peak-envelope promise: envelopes in time order, each one's max the true max of the
/// signal `f` (every second) over the time since the previous envelope (from its own
/// first read for the first one).
fn assert_peak_envelopes(emits: &[(u64, Emit)], f: impl Fn(u64) -> f64) {
    let mut covered_to: Option<u64> = None;
    for (_, e) in emits {
        let env = gauge(e);
        let (start, end) = (env.start_ns / S, env.end_ns / S);
        let from = covered_to.map_or(start, |t| t + 1);
        assert!(
            start >= from && end >= start,
            "{env:?} after {covered_to:?}"
        );
        let truth = (from..=end).map(&f).fold(f64::NEG_INFINITY, f64::max);
        assert_eq!(env.max, truth, "{env:?} covers {from}..={end}");
        covered_to = Some(end);
    }
}

/// Busy training as a reader a second sees it: the share of each second spent in the
/// all-reduce varies, so the values spread over 80-92 % (with the 10 % tolerance, most
/// are close to the peak, not all).
fn aliased(sec: u64) -> f64 {
    [
        86.0, 81.0, 91.0, 84.0, 89.0, 82.0, 88.0, 92.0, 85.0, 80.0, 90.0,
    ][(sec % 11) as usize]
}

#[test]
fn stable_signal_backs_off_exponentially_to_the_cap_with_bounded_jitter() {
    let c = config();
    let mut sampler = AdaptiveSampler::new(c.clone()).with_seed(7);
    let s = series("railscope_gpu_power_watts", Kind::Gauge);
    let mut intervals = Vec::new();
    for sec in 1..=600 {
        let now = sec * S;
        if sampler.due(&s, now)
            && !sampler.observe(&s, Value::F64(300.0), now).is_empty()
            && sampler.mode(&s) == Some(Mode::Stable)
        {
            intervals.push(sampler.collection_interval(&s).unwrap().as_secs_f64());
        }
    }
    // 2, 4, 8, 16, then the 32 s cap, each within +-10 % and never above the cap.
    let mut base = 2.0f64;
    for (i, &got) in intervals.iter().enumerate() {
        assert!(
            got >= base * 0.9 - 1e-9 && got <= (base * 1.1).min(32.0) + 1e-9,
            "interval {i}: {got} s for a base of {base} s ({intervals:?})"
        );
        base = (base * 2.0).min(32.0);
    }
    let at_cap = &intervals[4..];
    assert!(at_cap.len() >= 10, "{intervals:?}");
    // Jitter: the intervals at the cap are not all the same.
    assert!(
        at_cap.iter().any(|&v| (v - at_cap[0]).abs() > 0.01),
        "{intervals:?}"
    );
    // Another seed gives other intervals.
    let mut other = AdaptiveSampler::new(c).with_seed(8);
    let mut other_intervals = Vec::new();
    for sec in 1..=600 {
        let now = sec * S;
        if other.due(&s, now)
            && !other.observe(&s, Value::F64(300.0), now).is_empty()
            && other.mode(&s) == Some(Mode::Stable)
        {
            other_intervals.push(other.collection_interval(&s).unwrap().as_secs_f64());
        }
    }
    assert_ne!(intervals, other_intervals);
}

#[test]
fn a_20_percent_jump_drops_to_the_minimum_interval_at_once() {
    let mut sampler = AdaptiveSampler::new(config());
    let s = series("railscope_gpu_sm_util_ratio", Kind::Gauge);
    drive(&mut sampler, &s, 120, |_| Value::F64(0.5));
    assert_eq!(sampler.mode(&s), Some(Mode::Stable));
    assert!(sampler.collection_interval(&s).unwrap() > Duration::from_secs(8));

    let emitted: Vec<Emit> = sampler
        .observe(&s, Value::F64(0.6), 121 * S)
        .into_iter()
        .collect();
    assert_eq!(sampler.mode(&s), Some(Mode::Fast));
    assert_eq!(
        sampler.collection_interval(&s),
        Some(Duration::from_secs(1))
    );
    assert!(sampler.due(&s, 122 * S));
    // What was pending goes first, then the jump on its own.
    assert_eq!(emitted.len(), 2, "{emitted:?}");
    let (before, jump) = (gauge(&emitted[0]), gauge(&emitted[1]));
    assert_eq!((before.max, before.end_ns), (0.5, 120 * S));
    assert_eq!(
        jump,
        Envelope {
            start_ns: 121 * S,
            end_ns: 121 * S,
            min: 0.6,
            max: 0.6,
            mean: 0.6,
            count: 1
        }
    );
    // And the next reads are sent every second.
    let (_, emits) = drive(&mut sampler, &s, 0, |_| Value::F64(0.6));
    assert!(emits.is_empty());
    for sec in 122..=124 {
        assert_eq!(sampler.observe(&s, Value::F64(0.6), sec * S).len(), 1);
    }
}

#[test]
fn a_drop_is_caught_at_the_next_read() {
    let mut sampler = AdaptiveSampler::new(config());
    let s = series("railscope_gpu_sm_util_ratio", Kind::Gauge);
    drive(&mut sampler, &s, 120, |_| Value::F64(0.9));
    assert_eq!(sampler.mode(&s), Some(Mode::Stable));
    let emitted = sampler.observe(&s, Value::F64(0.7), 121 * S);
    assert_eq!(sampler.mode(&s), Some(Mode::Fast));
    assert_eq!(emitted.iter().last().map(|e| gauge(e).max), Some(0.7));
}

#[test]
fn periodic_phases_that_fit_the_window_are_stable_with_their_peak_in_every_envelope() {
    let mut sampler = AdaptiveSampler::new(config());
    let s = series("railscope_gpu_sm_util_ratio", Kind::Gauge);
    // Pipeline steps of 8 s: compute at 0.97, then the bubble.
    let step = |sec: u64| [0.97, 0.97, 0.97, 0.97, 0.97, 0.4, 0.2, 0.7][(sec % 8) as usize];
    let (reads, emits) = drive(&mut sampler, &s, 600, |sec| Value::F64(step(sec)));
    assert_eq!(reads.len(), 600);
    assert_eq!(sampler.mode(&s), Some(Mode::Stable));
    assert!(emits.len() < 60, "{} emits", emits.len());
    assert_peak_envelopes(&emits, step);
    // Once backed off, each envelope spans whole steps: the busy peak and the bubble.
    let last = gauge(&emits.last().unwrap().1);
    assert_eq!((last.max, last.min), (0.97, 0.2));
    // Idle, under the bubbles: sent at the first read, at the minimum interval.
    let emitted: Vec<Emit> = sampler
        .observe(&s, Value::F64(0.0), 601 * S)
        .into_iter()
        .collect();
    assert_eq!(sampler.mode(&s), Some(Mode::Fast));
    assert_eq!(gauge(emitted.last().unwrap()).max, 0.0);
    assert!(sampler.due(&s, 602 * S));
}

#[test]
fn spread_values_are_unstable() {
    // Values spread within a window, few close to the peak: every one read and sent.
    let mut sampler = AdaptiveSampler::new(config());
    let s = series("railscope_gpu_sm_util_ratio", Kind::Gauge);
    let (reads, emits) = drive(&mut sampler, &s, 300, |sec| {
        Value::F64([0.5, 0.6, 0.7, 0.8][(sec % 4) as usize])
    });
    assert_eq!(reads.len(), 300);
    assert_eq!(emits.len(), 300);
    assert_eq!(sampler.mode(&s), Some(Mode::Fast));
    // A stable series whose values start to spread (density under the threshold, though
    // none leaves the range of the window) drops to the minimum interval.
    let mut sampler = AdaptiveSampler::new(config());
    drive(&mut sampler, &s, 100, |_| Value::F64(0.8));
    assert_eq!(sampler.mode(&s), Some(Mode::Stable));
    let spread = |sec: u64| if sec.is_multiple_of(2) { 0.8 } else { 0.6 };
    let mut fast_at = None;
    for sec in 101..=130 {
        sampler.observe(&s, Value::F64(spread(sec)), sec * S);
        if sampler.mode(&s) == Some(Mode::Fast) {
            fast_at = Some(sec);
            break;
        }
    }
    // 0.6 is below the low edge (0.8) at once: a shift.
    assert_eq!(fast_at, Some(101));
    let (_, emits) = drive_range(&mut sampler, &s, 102..=200, |sec| Value::F64(spread(sec)));
    // Half the window at the peak is enough to be stable: alternating 0.8/0.6 is dense.
    assert_eq!(sampler.mode(&s), Some(Mode::Stable));
    assert!(emits.len() < 40, "{} emits", emits.len());

    // Stable with a quarter of the reads low, then three quarters: no read leaves the
    // range of the window and the peak stays, but the density falls under one half.
    let mut sampler = AdaptiveSampler::new(config());
    let mostly_high = |sec: u64| if sec.is_multiple_of(4) { 0.5 } else { 0.8 };
    drive(&mut sampler, &s, 200, |sec| Value::F64(mostly_high(sec)));
    assert_eq!(sampler.mode(&s), Some(Mode::Stable));
    let mostly_low = |sec: u64| if sec.is_multiple_of(4) { 0.8 } else { 0.5 };
    let mut fast_at = None;
    for sec in 201..=260 {
        sampler.observe(&s, Value::F64(mostly_low(sec)), sec * S);
        if fast_at.is_none() && sampler.mode(&s) == Some(Mode::Fast) {
            fast_at = Some(sec);
        }
    }
    let fast_at = fast_at.expect("the spread was not seen");
    assert!((205..=225).contains(&fast_at), "{fast_at}");
    // Not dense: read and sent every second from then on.
    let (reads, emits) = drive_range(&mut sampler, &s, 261..=300, |sec| {
        Value::F64(mostly_low(sec))
    });
    assert_eq!((reads.len(), emits.len()), (40, 40));
}

#[test]
fn aliased_training_is_stable_and_a_throttle_is_caught_at_the_first_read() {
    let mut sampler = AdaptiveSampler::new(config());
    let s = series("railscope_gpu_sm_util_ratio", Kind::Gauge);
    let (_, emits) = drive(&mut sampler, &s, 1200, |sec| Value::F64(aliased(sec)));
    assert_eq!(sampler.mode(&s), Some(Mode::Stable));
    assert!(emits.len() < 70, "{} emits", emits.len());
    assert_peak_envelopes(&emits, aliased);
    // A 20 % lower level whose values still spread: the first read is under the range.
    let throttled = |sec: u64| 0.8 * aliased(sec);
    let emitted: Vec<Emit> = sampler
        .observe(&s, Value::F64(throttled(1201)), 1201 * S)
        .into_iter()
        .collect();
    assert_eq!(sampler.mode(&s), Some(Mode::Fast), "{emitted:?}");
    assert_eq!(emitted.len(), 2);
    assert_eq!(gauge(&emitted[1]).max, throttled(1201));
    // It lasts: re-learnt at the minimum interval, then stable at the new level.
    let (reads, emits) = drive_range(&mut sampler, &s, 1202..=1800, |sec| {
        Value::F64(throttled(sec))
    });
    assert_eq!(reads.len(), 599);
    assert!(emits[..20].iter().all(|(sec, _)| *sec < 1222), "{emits:?}");
    assert_eq!(sampler.mode(&s), Some(Mode::Stable));
}

#[test]
fn a_short_stall_is_sent_at_once_and_the_series_resumes_where_it_was() {
    let mut sampler = AdaptiveSampler::new(config());
    let s = series("railscope_gpu_sm_util_ratio", Kind::Gauge);
    drive(&mut sampler, &s, 300, |sec| Value::F64(aliased(sec)));
    assert_eq!(sampler.mode(&s), Some(Mode::Stable));
    // A data-loader stall: two reads far under the range, each sent at once.
    let e = sampler.observe(&s, Value::F64(0.0), 301 * S);
    assert_eq!(e.iter().last().map(|e| gauge(e).max), Some(0.0));
    assert_eq!(sampler.mode(&s), Some(Mode::Fast));
    let e = sampler.observe(&s, Value::F64(40.0), 302 * S);
    assert_eq!(e.len(), 1);
    // Back in range: stable again at once, from the window it had (no re-learning).
    sampler.observe(&s, Value::F64(aliased(303)), 303 * S);
    assert_eq!(sampler.mode(&s), Some(Mode::Stable));
    let (_, emits) = drive_range(&mut sampler, &s, 304..=310, |sec| Value::F64(aliased(sec)));
    assert!(emits.len() <= 3, "{emits:?}");
    // The stall is still in the window, yet a real drop is caught at its first read.
    let e = sampler.observe(&s, Value::F64(55.0), 311 * S);
    assert_eq!(sampler.mode(&s), Some(Mode::Fast));
    assert_eq!(e.iter().last().map(|e| gauge(e).max), Some(55.0));
    // And this one lasts: no return to the old window.
    let (_, emits) = drive_range(&mut sampler, &s, 312..=320, |_| Value::F64(55.0));
    assert_eq!(sampler.mode(&s), Some(Mode::Fast));
    assert_eq!(emits.len(), 9);
}

#[test]
fn a_drift_beyond_the_tolerance_of_the_historical_peak_resets_the_interval() {
    let mut sampler = AdaptiveSampler::new(config());
    let s = series("railscope_gpu_temp_celsius", Kind::Gauge);
    // Warming up by 0.05 °C a second: no read leaves the range of the window.
    let temp = |sec: u64| 60.0 + 0.05 * sec as f64;
    let mut resets = Vec::new();
    let mut mode = None;
    let mut emits = Vec::new();
    for sec in 1..=600 {
        if sampler.due(&s, sec * S) {
            emits.extend(sampler.observe(&s, Value::F64(temp(sec)), sec * S));
        }
        let now = sampler.mode(&s);
        if mode == Some(Mode::Stable) && now == Some(Mode::Fast) {
            resets.push(sec);
        }
        mode = now;
    }
    // Stable from the 24th read, at 61.2 °C; every 10 % further, the peak of the window
    // is no longer close to the historical one: back to the minimum interval, once.
    assert!(resets.len() >= 3, "{resets:?}");
    assert!((temp(resets[0]) - 61.2 * 1.1).abs() < 0.1, "{resets:?}");
    assert!(emits.len() < 100, "{} emits", emits.len());
}

#[test]
fn small_noise_is_stable() {
    let mut sampler = AdaptiveSampler::new(config());
    let s = series("railscope_gpu_power_watts", Kind::Gauge);
    let mut rng = SplitMix64::new(3);
    let values: Vec<f64> = (0..=900).map(|_| 300.0 + 12.0 * rng.next_f64()).collect();
    let value = |sec: u64| values[sec as usize];
    let (reads, emits) = drive(&mut sampler, &s, 900, |sec| Value::F64(value(sec)));
    assert_eq!(reads.len(), 900);
    assert!(emits.len() < 90, "{} emits", emits.len());
    assert_peak_envelopes(&emits, value);
}

#[test]
fn envelopes_summarise_every_value_read() {
    let mut sampler = AdaptiveSampler::new(config());
    let s = series("railscope_gpu_temp_celsius", Kind::Gauge);
    let value = |sec: u64| 60.0 + (sec % 5) as f64 * 0.5;
    let (reads, mut emits) = drive(&mut sampler, &s, 400, |sec| Value::F64(value(sec)));
    emits.extend(sampler.flush().into_iter().map(|(_, e)| (0, e)));
    let mut covered = 0;
    let mut last_end = 0;
    for (_, e) in &emits {
        let env = gauge(e);
        assert!(env.start_ns > last_end, "overlap at {env:?}");
        last_end = env.end_ns;
        let inside: Vec<f64> = reads
            .iter()
            .filter(|&&r| r * S >= env.start_ns && r * S <= env.end_ns)
            .map(|&r| value(r))
            .collect();
        assert_eq!(env.count as usize, inside.len(), "{env:?}");
        assert_eq!(
            env.min,
            inside.iter().copied().fold(f64::INFINITY, f64::min)
        );
        assert_eq!(
            env.max,
            inside.iter().copied().fold(f64::NEG_INFINITY, f64::max)
        );
        let mean = inside.iter().sum::<f64>() / inside.len() as f64;
        assert!((env.mean - mean).abs() < 1e-9, "{env:?} vs {mean}");
        covered += inside.len();
    }
    // Nothing read is left out, nothing counted twice.
    assert_eq!(covered, reads.len());
    assert!(emits.len() < reads.len() / 4);
}

#[test]
fn ground_truth_reads_continue_while_backed_off() {
    let c = SamplerConfig {
        ground_truth_every: 4,
        ..config()
    };
    let mut sampler = AdaptiveSampler::new(c);
    let s = series("railscope_ib_port_rcv_bytes_total", Kind::Counter);
    let (reads, _) = drive(&mut sampler, &s, 300, |sec| Value::U64(sec * 1_000_000));
    assert_eq!(sampler.mode(&s), Some(Mode::Stable));
    assert!(sampler.collection_interval(&s).unwrap() >= Duration::from_secs(16));
    // Fewer reads than seconds, but never more than 4 s apart.
    assert!(reads.len() < 150, "{} reads", reads.len());
    assert!(reads.windows(2).all(|w| w[1] - w[0] <= 4), "{reads:?}");
    // A read between collections that sees a change sends at once.
    let last = *reads.last().unwrap();
    let next = last + 4;
    assert!(sampler.due(&s, next * S));
    let emitted: Vec<Emit> = sampler
        .observe(&s, Value::U64(last * 1_000_000 + 4 * 3_000_000), next * S)
        .into_iter()
        .collect();
    assert_eq!(sampler.mode(&s), Some(Mode::Fast));
    assert_eq!(
        emitted.last(),
        Some(&Emit::Counter {
            unix_ns: next * S,
            value: Value::U64(last * 1_000_000 + 12_000_000)
        })
    );
}

#[test]
fn counters_are_sent_losslessly() {
    let mut sampler = AdaptiveSampler::new(config());
    let s = series("railscope_ib_port_xmit_bytes_total", Kind::Counter);
    // 1 MB/s, then 5 MB/s from second 200, then a reset (driver reload) at 300.
    let count = |sec: u64| -> u64 {
        match sec {
            0..200 => sec * 1_000_000,
            200..300 => 200_000_000 + (sec - 200) * 5_000_000,
            _ => (sec - 300) * 1_000,
        }
    };
    let (reads, mut emits) = drive(&mut sampler, &s, 400, |sec| Value::U64(count(sec)));
    emits.extend(sampler.flush().into_iter().map(|(_, e)| (0, e)));
    assert_eq!(reads.len(), 400);
    assert!(emits.len() < 100, "{} emits", emits.len());
    let sent: Vec<(u64, u64)> = emits
        .iter()
        .map(|(_, e)| match e {
            Emit::Counter {
                unix_ns,
                value: Value::U64(v),
            } => (unix_ns / S, *v),
            other => panic!("{other:?}"),
        })
        .collect();
    // Every value sent is a value read, unchanged, in time order; the last read is sent.
    for (sec, v) in &sent {
        assert_eq!(*v, count(*sec));
    }
    assert!(sent.windows(2).all(|w| w[0].0 < w[1].0));
    assert_eq!(sent.last(), Some(&(400, count(400))));
    // The change of rate is pinned to the second it happened, the reset too.
    // (The count at 200 still grew at 1 MB/s since 199; 201 is the first at 5 MB/s.)
    for sec in [200, 201, 299, 300] {
        assert!(
            sent.iter().any(|&(t, _)| t == sec),
            "{sec} not sent: {sent:?}"
        );
    }
}

#[test]
fn disabled_is_a_fixed_interval() {
    let c = SamplerConfig {
        min_interval: Duration::from_secs(2),
        ..config()
    }
    .fixed();
    let mut sampler = AdaptiveSampler::new(c);
    let s = series("railscope_gpu_power_watts", Kind::Gauge);
    let (reads, emits) = drive(&mut sampler, &s, 100, |_| Value::F64(300.0));
    assert_eq!(reads, (1..=99).step_by(2).collect::<Vec<_>>());
    assert_eq!(emits.len(), reads.len());
    assert_eq!(sampler.mode(&s), Some(Mode::Fast));
    // Reads between collections are not lost: they go into the next envelope.
    let e = sampler.observe(&s, Value::F64(500.0), 100 * S);
    assert!(e.is_empty());
    let e: Vec<Emit> = sampler
        .observe(&s, Value::F64(300.0), 101 * S)
        .into_iter()
        .collect();
    assert_eq!(gauge(&e[0]).max, 500.0);
    assert_eq!(gauge(&e[0]).count, 2);
}

#[test]
fn groups_by_longest_prefix() {
    let ib = SamplerConfig {
        min_interval: Duration::from_secs(5),
        ..config()
    };
    let fixed_errors = config().fixed();
    let mut sampler = AdaptiveSampler::new(config())
        .with_group("ib", "railscope_ib_", ib)
        .with_group("ib-errors", "railscope_ib_symbol_error", fixed_errors);
    let bytes = series("railscope_ib_port_rcv_bytes_total", Kind::Counter);
    let errors = series("railscope_ib_symbol_error_total", Kind::Counter);
    let gpu = series("railscope_gpu_power_watts", Kind::Gauge);
    assert_eq!(sampler.group_of(&bytes).0, "ib");
    assert_eq!(sampler.group_of(&errors).0, "ib-errors");
    assert_eq!(sampler.group_of(&gpu).0, "default");

    // The ib group's minimum interval is 5 s: read every 5 s while new, and at least every
    // 5 s once backing off (a jittered collection may fall between two of those reads).
    let (reads, _) = drive(&mut sampler, &bytes, 60, Value::U64);
    assert_eq!(reads[..4], [1, 6, 11, 16]);
    assert!(reads.windows(2).all(|w| w[1] - w[0] <= 5), "{reads:?}");
    assert!(reads.len() <= 14, "{reads:?}");
    let (reads, emits) = drive(&mut sampler, &errors, 60, |_| Value::U64(0));
    assert_eq!((reads.len(), emits.len()), (60, 60));
}

#[test]
fn stale_series_are_forgotten_with_what_they_had_to_send() {
    let mut sampler = AdaptiveSampler::new(config());
    let gone = series("railscope_gpu_power_watts", Kind::Gauge);
    let kept = series("railscope_gpu_temp_celsius", Kind::Gauge);
    // Read until a collection while stable; the read a second later is still pending.
    let mut sec = 0;
    loop {
        sec += 1;
        let sent = !sampler
            .observe(&gone, Value::F64(300.0), sec * S)
            .is_empty();
        if sent && sampler.mode(&gone) == Some(Mode::Stable) && sec > 20 {
            break;
        }
    }
    assert!(
        sampler
            .observe(&gone, Value::F64(305.0), (sec + 1) * S)
            .is_empty()
    );
    sampler.observe(&kept, Value::F64(50.0), (sec + 100) * S);

    let flushed = sampler.remove_stale((sec + 100) * S, Duration::from_secs(60));
    assert_eq!(flushed.len(), 1);
    assert_eq!(flushed[0].0, gone);
    let env = gauge(&flushed[0].1);
    assert_eq!(
        (env.start_ns, env.max, env.count),
        ((sec + 1) * S, 305.0, 1)
    );
    assert_eq!(sampler.len(), 1);
    assert!(sampler.due(&gone, (sec + 101) * S));
    assert!(!sampler.due(&kept, (sec + 100) * S));
}

#[test]
fn out_of_order_and_non_finite_values_are_ignored() {
    let mut sampler = AdaptiveSampler::new(config());
    let s = series("railscope_gpu_power_watts", Kind::Gauge);
    assert_eq!(sampler.observe(&s, Value::F64(300.0), 10 * S).len(), 1);
    assert!(sampler.observe(&s, Value::F64(900.0), 10 * S).is_empty());
    assert!(sampler.observe(&s, Value::F64(900.0), 9 * S).is_empty());
    assert!(sampler.observe(&s, Value::F64(f64::NAN), 11 * S).is_empty());
    let e: Vec<Emit> = sampler
        .observe(&s, Value::F64(301.0), 12 * S)
        .into_iter()
        .collect();
    assert_eq!(gauge(&e[0]).count, 1);
    assert_eq!(gauge(&e[0]).max, 301.0);
}

#[test]
fn a_dropped_metric_is_never_due_nor_sent_and_a_longer_prefix_can_keep_one() {
    let mut sampler = AdaptiveSampler::new(config());
    // What `railscope select` prints: a dropped metric whose name is a prefix of a kept one.
    sampler.configure("railscope_gpu_power:drop").unwrap();
    sampler
        .configure("railscope_gpu_power_limit_watts:on,max=20")
        .unwrap();
    let dropped = series("railscope_gpu_power_watts", Kind::Gauge);
    let kept = series("railscope_gpu_power_limit_watts", Kind::Gauge);
    for sec in 0..5 {
        assert!(!sampler.due(&dropped, sec * S));
        assert!(
            sampler
                .observe(&dropped, Value::F64(300.0), sec * S)
                .is_empty()
        );
    }
    assert!(sampler.due(&kept, 0));
    assert_eq!(sampler.observe(&kept, Value::F64(700.0), 0).len(), 1);
    assert_eq!(sampler.len(), 1);
    assert_eq!(
        sampler.group_of(&kept).1.max_interval,
        Duration::from_secs(20)
    );
    assert!(sampler.configure("railscope_gpu_:drop=1").is_err());
}
