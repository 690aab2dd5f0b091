//! [`evaluate`]: the adaptive sampler and a fixed interval over one trace, against the trace
//! itself (see the crate documentation for what is measured).

use monitor_sampler::{AdaptiveSampler, Emit, Mode, SamplerConfig};
use monitor_wire::{Kind, Labels, Series, Value};

use crate::Trace;

/// The result of [`evaluate`]; see the module documentation for the definitions.
#[derive(Clone, Debug, PartialEq)]
pub struct Evaluation {
    pub trace: String,
    pub samples_adaptive: usize,
    pub samples_fixed: usize,
    pub reads_adaptive: usize,
    pub reads_fixed: usize,
    /// `1 - samples_adaptive / samples_fixed`.
    pub reduction: f64,
    /// Gauges: the worst envelope peak error; counters: the worst derived-rate error; over
    /// the intervals the adaptive run emitted.
    pub worst_interval_error: f64,
    /// Last tick of the interval where `worst_interval_error` was found.
    pub worst_interval_error_tick: usize,
    /// Emissions that break the receiver's contract: a counter value that is not the value
    /// at its time, or a record that is not after the previous one.
    pub inconsistent_emits: usize,
    /// The former figure, per window of one minimum interval (not a goal).
    pub worst_window_peak_error: f64,
    /// Windows of the former figure that no envelope covers.
    pub unobserved_windows: usize,
    pub steps: usize,
    pub max_step_detection_delay_in_min_intervals: f64,
}

impl Evaluation {
    /// Totals over several traces: samples and reads added, the worst errors and delay kept.
    pub fn combine(name: &str, all: &[Evaluation]) -> Evaluation {
        let sum = |f: fn(&Evaluation) -> usize| all.iter().map(f).sum::<usize>();
        let max = |f: fn(&Evaluation) -> f64| all.iter().map(f).fold(0.0, f64::max);
        let samples_adaptive = sum(|e| e.samples_adaptive);
        let samples_fixed = sum(|e| e.samples_fixed);
        let worst = all
            .iter()
            .max_by(|a, b| a.worst_interval_error.total_cmp(&b.worst_interval_error));
        Evaluation {
            trace: name.to_string(),
            samples_adaptive,
            samples_fixed,
            reads_adaptive: sum(|e| e.reads_adaptive),
            reads_fixed: sum(|e| e.reads_fixed),
            reduction: 1.0 - samples_adaptive as f64 / samples_fixed.max(1) as f64,
            worst_interval_error: worst.map_or(0.0, |e| e.worst_interval_error),
            worst_interval_error_tick: worst.map_or(0, |e| e.worst_interval_error_tick),
            inconsistent_emits: sum(|e| e.inconsistent_emits),
            worst_window_peak_error: max(|e| e.worst_window_peak_error),
            unobserved_windows: sum(|e| e.unobserved_windows),
            steps: sum(|e| e.steps),
            max_step_detection_delay_in_min_intervals: max(|e| {
                e.max_step_detection_delay_in_min_intervals
            }),
        }
    }
}

/// Runs the adaptive sampler (`config`) and the fixed interval (`config.fixed()`) over a trace.
/// `config.min_interval` must be a whole number of the trace's ticks.
pub fn evaluate(trace: &Trace, config: &SamplerConfig) -> Evaluation {
    let dt = trace.dt.as_nanos() as u64;
    let k = (config.min_interval.as_nanos() as u64 / dt).max(1) as usize;
    let adaptive = run(trace, config);
    let fixed = run(trace, &config.fixed());
    let floor = trace.noise_floor / 0.1;
    let rel = |recon: f64, truth: f64| (recon - truth).abs() / truth.abs().max(floor);

    let mut worst = (0.0f64, 0usize);
    let mut inconsistent = 0;
    match trace.kind {
        Kind::Gauge => {
            let mut covered_to: Option<usize> = None;
            for (start, end, max) in envelopes(&adaptive, dt) {
                let from = covered_to.map_or(start, |t| t + 1);
                if start < from || end < start {
                    inconsistent += 1;
                    continue;
                }
                let truth = max_of(&trace.values[from..=end]);
                let e = rel(max, truth);
                if e > worst.0 {
                    worst = (e, end);
                }
                covered_to = Some(end);
            }
        }
        Kind::Counter => {
            let points = counter_points(&adaptive, dt);
            let secs = trace.dt.as_secs_f64();
            for &(tick, v) in &points {
                if v != trace.values[tick].max(0.0).round() {
                    inconsistent += 1;
                }
            }
            for w in points.windows(2) {
                let ((a, va), (b, vb)) = (w[0], w[1]);
                if b <= a {
                    inconsistent += 1;
                    continue;
                }
                let span = (b - a) as f64 * secs;
                let truth = (trace.values[b] - trace.values[a]) / span;
                let e = rel((vb - va) / span, truth);
                if e > worst.0 {
                    worst = (e, b);
                }
            }
        }
    }

    let (worst_window, unobserved) = window_peak_error(trace, &adaptive, dt, k);

    let mut max_delay = 0.0f64;
    for &s in &trace.steps {
        // The first emission that shows the new level on its own, by the tick it was sent at.
        let shown = match trace.kind {
            Kind::Gauge => adaptive
                .emits
                .iter()
                .filter(|(e, _)| matches!(e, Emit::Gauge(env) if tick_of(env.start_ns, dt) >= s))
                .map(|&(_, sent)| sent)
                .min(),
            Kind::Counter => {
                let sent: Vec<(usize, usize)> = adaptive
                    .emits
                    .iter()
                    .filter_map(|(e, sent)| match e {
                        Emit::Counter { unix_ns, .. } => Some((tick_of(*unix_ns, dt), *sent)),
                        Emit::Gauge(_) => None,
                    })
                    .collect();
                sent.windows(2)
                    .filter(|w| w[0].0 + k >= s && w[1].0 >= s && w[1].0 > w[0].0)
                    .map(|w| w[1].1)
                    .min()
            }
        };
        let caught = shown.and_then(|shown| {
            adaptive
                .modes
                .iter()
                .find(|&&(tick, mode)| tick >= s.max(shown) && mode == Mode::Fast)
        });
        let delay = caught.map_or(f64::INFINITY, |(tick, _)| (tick + 1 - s) as f64 / k as f64);
        max_delay = max_delay.max(delay);
    }

    Evaluation {
        trace: trace.name.clone(),
        samples_adaptive: adaptive.emits.len(),
        samples_fixed: fixed.emits.len(),
        reads_adaptive: adaptive.reads,
        reads_fixed: fixed.reads,
        reduction: 1.0 - adaptive.emits.len() as f64 / fixed.emits.len().max(1) as f64,
        worst_interval_error: worst.0,
        worst_interval_error_tick: worst.1,
        inconsistent_emits: inconsistent,
        worst_window_peak_error: worst_window.0,
        unobserved_windows: unobserved,
        steps: trace.steps.len(),
        max_step_detection_delay_in_min_intervals: max_delay,
    }
}

fn max_of(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

/// A run's gauge envelopes as `(first tick read, last tick read, max)`, in the order sent.
fn envelopes(run: &Run, dt: u64) -> Vec<(usize, usize, f64)> {
    run.emits
        .iter()
        .filter_map(|(e, _)| match e {
            Emit::Gauge(env) => Some((tick_of(env.start_ns, dt), tick_of(env.end_ns, dt), env.max)),
            Emit::Counter { .. } => None,
        })
        .collect()
}

/// A run's counter values as `(tick read, value)`, in the order sent.
fn counter_points(run: &Run, dt: u64) -> Vec<(usize, f64)> {
    run.emits
        .iter()
        .filter_map(|(e, _)| match e {
            Emit::Counter { unix_ns, value } => Some((tick_of(*unix_ns, dt), value.as_f64())),
            Emit::Gauge(_) => None,
        })
        .collect()
}

/// The former figure: per window of `k` ticks (one minimum interval), the true value (a
/// gauge's max, a counter's rate) against what the receiver reconstructs (the largest max of
/// the envelopes overlapping the window; the rate between the counter values sent, linear
/// between them). Returns the worst error with its tick, and the windows no envelope covers.
fn window_peak_error(trace: &Trace, run: &Run, dt: u64, k: usize) -> ((f64, usize), usize) {
    let n = trace.values.len();
    let floor = trace.noise_floor / 0.1;
    let rel = |recon: f64, truth: f64| (recon - truth).abs() / truth.abs().max(floor);
    let mut worst = (0.0f64, 0usize);
    let mut unobserved = 0;
    match trace.kind {
        Kind::Gauge => {
            let envs = envelopes(run, dt);
            let mut first = 0;
            for a in (0..n).step_by(k) {
                let b = (a + k).min(n);
                let truth = max_of(&trace.values[a..b]);
                while first < envs.len() && envs[first].1 < a {
                    first += 1;
                }
                let overlapping = envs[first..].iter().take_while(|e| e.0 < b);
                let recon = overlapping.map(|e| e.2).fold(f64::NEG_INFINITY, f64::max);
                let recon = if recon.is_finite() {
                    recon
                } else {
                    unobserved += 1;
                    let before = first.checked_sub(1).map(|i| envs[i].2);
                    let after = envs.get(first).map(|e| e.2);
                    before
                        .into_iter()
                        .chain(after)
                        .fold(f64::NEG_INFINITY, f64::max)
                };
                let e = rel(recon, truth);
                if e > worst.0 {
                    worst = (e, a);
                }
            }
        }
        Kind::Counter => {
            let points = counter_points(run, dt);
            let secs = trace.dt.as_secs_f64();
            for a in (1..n).step_by(k) {
                let b = (a + k).min(n);
                let span = (b - a) as f64 * secs;
                let truth = (trace.values[b - 1] - trace.values[a - 1]) / span;
                let recon = (interpolate(&points, b - 1) - interpolate(&points, a - 1)) / span;
                let e = rel(recon, truth);
                if e > worst.0 {
                    worst = (e, a);
                }
            }
        }
    }
    (worst, unobserved)
}

/// Times in a run start here, so that no read is at time 0.
const BASE_NS: u64 = 1_000_000_000;

fn tick_of(ns: u64, dt: u64) -> usize {
    ((ns - BASE_NS) / dt) as usize
}

/// The cumulative count the receiver assumes at `tick`: linear between the points sent.
fn interpolate(points: &[(usize, f64)], tick: usize) -> f64 {
    let i = points.partition_point(|p| p.0 <= tick);
    match (i.checked_sub(1).map(|j| points[j]), points.get(i)) {
        (Some((t0, v0)), _) if t0 == tick => v0,
        (Some((t0, v0)), Some(&(t1, v1))) => v0 + (v1 - v0) * (tick - t0) as f64 / (t1 - t0) as f64,
        (Some((_, v0)), None) => v0,
        (None, Some(&(_, v1))) => v1,
        (None, None) => 0.0,
    }
}

struct Run {
    reads: usize,
    emits: Vec<(Emit, usize)>,
    /// Mode after each read, by tick.
    modes: Vec<(usize, Mode)>,
}

fn run(trace: &Trace, config: &SamplerConfig) -> Run {
    let dt = trace.dt.as_nanos() as u64;
    let series = Series {
        name: format!("railscope_trace_{}", trace.name).into(),
        labels: Labels::default(),
        kind: trace.kind,
    };
    let mut sampler = AdaptiveSampler::new(config.clone()).with_seed(0x7ace);
    let mut out = Run {
        reads: 0,
        emits: Vec::new(),
        modes: Vec::new(),
    };
    for (tick, &v) in trace.values.iter().enumerate() {
        let now = BASE_NS + tick as u64 * dt;
        if !sampler.due(&series, now) {
            continue;
        }
        out.reads += 1;
        let value = match trace.kind {
            Kind::Gauge => Value::F64(v),
            Kind::Counter => Value::U64(v.max(0.0).round() as u64),
        };
        for e in sampler.observe(&series, value, now) {
            out.emits.push((e, tick));
        }
        if let Some(mode) = sampler.mode(&series) {
            out.modes.push((tick, mode));
        }
    }
    for (_, e) in sampler.flush() {
        let tick = tick_of(e.end_ns(), dt);
        out.emits.push((e, tick));
    }
    out
}
