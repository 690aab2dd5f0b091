//! The traces have the shapes they claim, and the sampler meets its goals on them.

use super::*;

fn hand_made(values: Vec<f64>, steps: Vec<usize>) -> Trace {
    Trace {
        name: "hand_made".into(),
        kind: Kind::Gauge,
        dt: Duration::from_secs(1),
        values,
        steps,
        scale: 100.0,
        noise_floor: 0.5,
    }
}

#[test]
fn traces_are_deterministic_per_seed() {
    let a = standard(42);
    let b = standard(42);
    let c = standard(43);
    for ((a, b), c) in a.iter().zip(&b).zip(&c) {
        assert_eq!(a.values, b.values, "{}", a.name);
        assert_ne!(a.values, c.values, "{}", a.name);
        assert!(a.values.len() >= 7200, "{}", a.name);
    }
}

#[test]
fn traces_have_the_shapes_they_claim() {
    let llm = gpu_util_llm(1);
    let mean = |t: &Trace, r: std::ops::Range<usize>| {
        t.values[r.clone()].iter().sum::<f64>() / r.len() as f64
    };
    assert_eq!(mean(&llm, 0..300), 0.0);
    assert!((80.0..90.0).contains(&mean(&llm, 500..2200)));
    // The throttled part is lower, the crash is idle.
    assert!(mean(&llm, 4800..5600) < 0.85 * mean(&llm, 3900..4700));
    assert_eq!(mean(&llm, 5650..6200), 0.0);
    assert_eq!(llm.steps.len(), 10);

    let ib = ib_xmit_bytes(1);
    let rate = |r: std::ops::Range<usize>| (ib.values[r.end] - ib.values[r.start]) / r.len() as f64;
    assert!((8.5e9..9.5e9).contains(&rate(700..2900)));
    assert!((5.2e9..6.0e9).contains(&rate(3100..4100)));
    assert!(rate(4300..4700) < 1e4);
    assert!(ib.values.windows(2).all(|w| w[1] >= w[0]));
}

#[test]
fn evaluate_on_clean_steps() {
    let mut values = vec![50.0; 600];
    values.extend(vec![80.0; 600]);
    values.extend(vec![50.0; 600]);
    let t = hand_made(values, vec![600, 1200]);
    let e = evaluate(&t, &t.sampler_config());
    assert_eq!((e.samples_fixed, e.reads_fixed), (1800, 1800));
    assert!(e.reduction > 0.9, "{e:?}");
    assert_eq!(e.worst_interval_error, 0.0, "{e:?}");
    assert_eq!(e.inconsistent_emits, 0, "{e:?}");
    assert_eq!(e.max_step_detection_delay_in_min_intervals, 1.0, "{e:?}");
    assert_eq!((e.worst_window_peak_error, e.unobserved_windows), (0.0, 0));
}

#[test]
fn evaluate_sees_peaks_missed_between_reads() {
    // 85 with a one-tick spike to 100 every 10 ticks. A tolerance of 20 % makes it dense,
    // so it backs off; read every 5 ticks, an envelope whose reads all fall beside the
    // spikes reports 85 for a stretch whose true max is 100.
    let values: Vec<f64> = (0..1200)
        .map(|i| if i % 10 == 0 { 100.0 } else { 85.0 })
        .collect();
    let t = hand_made(values, vec![]);
    let loose = SamplerConfig {
        peak_tolerance: 0.2,
        ..t.sampler_config()
    };
    let sparse = SamplerConfig {
        ground_truth_every: 5,
        ..loose.clone()
    };
    let e = evaluate(&t, &sparse);
    assert!(e.reads_adaptive < e.reads_fixed / 3, "{e:?}");
    assert!((e.worst_interval_error - 0.15).abs() < 1e-9, "{e:?}");
    // Read every tick, each envelope has its spike.
    let e = evaluate(&t, &loose);
    assert_eq!(e.reads_adaptive, e.reads_fixed);
    assert_eq!(e.worst_interval_error, 0.0, "{e:?}");
    assert!(e.reduction > 0.8, "{e:?}");
}

#[test]
fn evaluate_sees_late_and_missed_steps() {
    // Levels 50 and 80 for 97 ticks each: steps land at every phase of a 3-tick read.
    let values: Vec<f64> = (0..97 * 16)
        .map(|i| if (i / 97) % 2 == 0 { 50.0 } else { 80.0 })
        .collect();
    let steps: Vec<usize> = (1..16).map(|i| i * 97).collect();
    let t = hand_made(values, steps);
    let sparse = SamplerConfig {
        ground_truth_every: 3,
        ..t.sampler_config()
    };
    let e = evaluate(&t, &sparse);
    let delay = e.max_step_detection_delay_in_min_intervals;
    assert!(delay > 1.0 && delay <= 3.0, "{e:?}");
    assert_eq!(
        evaluate(&t, &t.sampler_config()).max_step_detection_delay_in_min_intervals,
        1.0
    );
    // A tolerance of 70 % takes 80 for the same as 50: the steps are never caught, though
    // every envelope keeps its peak. The former per-window figure shows the 80 reported
    // for seconds at 50.
    let loose = SamplerConfig {
        peak_tolerance: 0.7,
        ..t.sampler_config()
    };
    let e = evaluate(&t, &loose);
    assert_eq!(
        e.max_step_detection_delay_in_min_intervals,
        f64::INFINITY,
        "{e:?}"
    );
    assert_eq!(e.worst_interval_error, 0.0, "{e:?}");
    assert!((e.worst_window_peak_error - 0.6).abs() < 1e-9, "{e:?}");
}

fn print(e: &Evaluation) {
    eprintln!(
        "{:18} samples {:5}/{:5} ({:4.1} % fewer) interval error {:.3} steps {:2} \
         max delay {} reads {:5}/{:5} (window peak error {:.2})",
        e.trace,
        e.samples_adaptive,
        e.samples_fixed,
        100.0 * e.reduction,
        e.worst_interval_error,
        e.steps,
        e.max_step_detection_delay_in_min_intervals,
        e.reads_adaptive,
        e.reads_fixed,
        e.worst_window_peak_error,
    );
}

/// The goals on one trace: every emitted interval within 10 % of the truth, counter values
/// exact, every step caught within 2 minimum intervals.
fn assert_goals(e: &Evaluation) {
    assert!(e.worst_interval_error <= 0.1, "{e:?}");
    assert_eq!(e.inconsistent_emits, 0, "{e:?}");
    assert!(e.max_step_detection_delay_in_min_intervals <= 2.0, "{e:?}");
}

/// The benchmark's goals on the standard traces with the default config: at least 70 %
/// fewer samples overall, every emitted interval within 10 %, every step caught within 2
/// minimum intervals. (`ib_xmit_bytes` alone saves little: its per-second rate while
/// training is too spread for the density rule.)
#[test]
fn standard_traces_meet_the_fidelity_and_detection_goals() {
    let mut all = Vec::new();
    for t in standard(1) {
        let e = evaluate(&t, &t.sampler_config());
        print(&e);
        assert_goals(&e);
        assert!(e.reduction > 0.2, "{e:?}");
        all.push(e);
    }
    let total = Evaluation::combine("standard", &all);
    print(&total);
    assert_eq!(total.steps, 21);
    assert!(total.reduction >= 0.7, "{total:?}");
}

#[test]
fn the_goals_hold_on_other_seeds() {
    let mut all = Vec::new();
    for seed in 2..=6 {
        for t in standard(seed) {
            let e = evaluate(&t, &t.sampler_config());
            assert_goals(&e);
            all.push(e);
        }
    }
    let total = Evaluation::combine("seeds 2-6", &all);
    print(&total);
    assert!(total.reduction >= 0.7, "{total:?}");
}

/// Reading a stable series every other minimum interval keeps the goals where a read
/// cannot miss a peak (counters, whose values are exact whatever is read, and a slow
/// temperature), and halves their reads. On busy gauges it does not: what falls between
/// two reads is missing from the envelope (printed, for the record).
#[test]
fn sparse_reads_suit_counters_and_slow_gauges() {
    for t in standard(1) {
        let c = SamplerConfig {
            ground_truth_every: 2,
            ..t.sampler_config()
        };
        let e = evaluate(&t, &c);
        print(&e);
        if t.kind == Kind::Counter || t.name == "gpu_temperature" {
            assert_goals(&e);
            assert!(e.reads_adaptive * 10 < e.reads_fixed * 9, "{e:?}");
        }
    }
}
