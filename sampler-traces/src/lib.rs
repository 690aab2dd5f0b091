//! Workload-shaped traces, deterministic for a seed, and [`evaluate`]: railscope's adaptive
//! sampler against a fixed interval on one trace. Used by the agent bench
//! (`monitor-user/examples/agent_bench`, `cargo xtask bench agent`) and by this crate's tests,
//! which hold the sampler to its fidelity and detection goals; the agent itself never links it.
//!
//! A trace is what a reader polling every `dt` would see. It is rendered from a finer model
//! (100 points per `dt`) of what the hardware does: training steps with a compute phase and a
//! communication phase, data-loader stalls, evaluation and checkpoint pauses, idle gaps between
//! jobs, and sudden shifts (a throttled GPU, a link trained down from 4X to 1X). A gauge's value
//! at a tick is the mean of the model over that tick, as NVML averages utilization over its
//! sampling period; a counter's value is the cumulative count, as the hardware counts.
//!
//! # What [`evaluate`] measures
//!
//! Both runs read the trace at its ticks, the adaptive one only when [`AdaptiveSampler::due`]
//! says so; at the end both flush what they read but did not send. The *truth* is the trace
//! itself: the signal at full resolution, one value per minimum interval.
//!
//! - **samples**: records emitted ([`Emit`]s: a counter value or a gauge envelope);
//!   **reads**: values read. `reduction = 1 - samples_adaptive / samples_fixed`.
//! - **interval error**, over every interval the adaptive run emitted. For a gauge, each
//!   envelope *covers* the ticks from the one after the previous envelope's last read to its
//!   own last read (the first envelope, from its first read): all the time since the previous
//!   record, so a tick no read saw counts against the envelope after it. The error is that of
//!   the envelope's max against the true max of the trace over the ticks it covers (the
//!   peak-envelope promise). For a counter, the rate the receiver derives between two
//!   consecutive values sent against the true mean rate between their ticks; it is 0 by
//!   construction as long as every value sent is the value at its tick, which is checked too
//!   (`inconsistent_emits`, with records out of time order). Errors are `|sent - true| /
//!   max(|true|, noise_floor / 0.1)`: relative, except that on values so small that 10 % of
//!   them is below the trace's noise floor, a miss smaller than the noise floor counts as
//!   under 10 %.
//! - **window peak error** (the former figure, reported, not a goal): per window of one
//!   minimum interval, the true value against what the receiver reconstructs: for a gauge the
//!   largest max of the envelopes overlapping the window (a window none overlaps is counted in
//!   `unobserved_windows` and given the larger max of its neighbours); for a counter the rate
//!   between the values sent, linear between them. A gauge envelope over a spread signal
//!   reports its peak for the whole time it covers, so this figure is large by design.
//! - **step detection delay**: for each step the trace marks (first tick `s` at the new level,
//!   at a change of more than 20 %), the first read tick `t >= s` after which the sampler is
//!   at the minimum interval ([`Mode::Fast`]) and by which it has emitted a record showing
//!   the new level on its own: a gauge envelope whose first read is at or after `s`, or a
//!   counter value whose previous value sent was read no earlier than one minimum interval
//!   before `s` (so the rate between them is the new one, not a blend). The delay is
//!   `t + 1 - s` ticks in minimum intervals, counted from the last tick before the step: a
//!   fixed-interval reader scores 1. A step never caught scores infinity.

use std::time::Duration;

use railscope::sampler::{AdaptiveSampler, Emit, Mode, SamplerConfig, SplitMix64};
use railscope_wire::{Kind, Labels, Series, Value};

/// Points of the fine model per tick.
const SUB: usize = 100;

/// One workload-shaped series.
#[derive(Clone, Debug)]
pub struct Trace {
    pub name: String,
    pub kind: Kind,
    /// Time between two values: the fixed interval the trace is compared at.
    pub dt: Duration,
    /// Gauge: what a read at each tick returns. Counter: the cumulative count at each tick.
    pub values: Vec<f64>,
    /// Ticks where a step change is first visible.
    pub steps: Vec<usize>,
    /// Full scale (100 % utilization, the link's bytes per second, ...).
    pub scale: f64,
    /// Differences below this are measurement noise (a counter's: per second).
    pub noise_floor: f64,
}

impl Trace {
    /// The default sampler configuration for this trace's group: minimum interval `dt`, and
    /// the trace's noise floor as `abs_floor`, as a group config would set it for its unit.
    pub fn sampler_config(&self) -> SamplerConfig {
        SamplerConfig {
            min_interval: self.dt,
            abs_floor: self.noise_floor,
            ..SamplerConfig::default()
        }
    }
}

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

/// The standard set, one tick per second, about two hours each.
pub fn standard(seed: u64) -> Vec<Trace> {
    vec![
        gpu_util_llm(seed),
        gpu_util_pipeline(seed.wrapping_add(1)),
        gpu_temperature(seed.wrapping_add(2)),
        ib_xmit_bytes(seed.wrapping_add(3)),
        ib_symbol_errors(seed.wrapping_add(4)),
    ]
}

/// What the hardware does for a while.
#[derive(Clone, Copy, Debug)]
enum Activity {
    /// A level with a little noise (standard deviation).
    Flat { level: f64, noise: f64 },
    /// Training steps of about `period` seconds: `busy` of each at `high`, the rest at
    /// `low`; one step in `stall_every` then waits two periods more at `stalled` (data
    /// loader).
    Steps {
        period: f64,
        busy: f64,
        high: f64,
        low: f64,
        stalled: f64,
        stall_every: u32,
    },
    /// A new level drawn in `[lo, hi]` every `hold` seconds (loading, evaluation).
    Erratic { lo: f64, hi: f64, hold: f64 },
    /// Moves towards `target` with time constant `tau` seconds (temperature).
    Approach { target: f64, tau: f64, noise: f64 },
}

impl Activity {
    /// The level it settles around, for marking steps between segments.
    fn level(&self) -> Option<f64> {
        match *self {
            Activity::Flat { level, .. } => Some(level),
            Activity::Steps {
                busy, high, low, ..
            } => Some(busy * high + (1.0 - busy) * low),
            Activity::Erratic { lo, hi, .. } => Some((lo + hi) / 2.0),
            Activity::Approach { .. } => None,
        }
    }
}

/// Renders segments `(seconds, activity)` into per-tick values (gauge: mean of each tick;
/// counter: cumulative, the activity being a rate per second), marking a step at each segment
/// boundary where the level changes by more than 20 %.
fn render(
    name: &str,
    kind: Kind,
    seed: u64,
    segments: &[(u32, Activity)],
    scale: f64,
    noise_floor: f64,
) -> Trace {
    let mut rng = SplitMix64::new(seed);
    let sub_dt = 1.0 / SUB as f64;
    let mut values = Vec::new();
    let mut steps = Vec::new();
    let mut level = 0.0f64; // current output of the model
    let mut cumulative = 0.0f64;
    let mut prev_level: Option<f64> = None;
    // Step phase state, kept across segments so a job's steps continue.
    let mut step_pos = 0.0f64;
    let mut step_len = 1.0f64;
    let mut stall_len = 0.0f64;
    let mut step_count: u32 = 0;
    let mut hold_left: f64;
    for &(secs, activity) in segments {
        if let (Some(a), Some(b)) = (prev_level, activity.level()) {
            let (lo, hi) = (a.abs().min(b.abs()), a.abs().max(b.abs()));
            if hi - lo > (0.2 * lo).max(10.0 * noise_floor) {
                steps.push(values.len());
            }
        }
        prev_level = activity.level().or(prev_level);
        hold_left = 0.0;
        for _ in 0..secs {
            let mut acc = 0.0;
            for _ in 0..SUB {
                level = match activity {
                    Activity::Flat { level: l, noise } => l + noise * rng.normal(),
                    Activity::Steps {
                        period,
                        busy,
                        high,
                        low,
                        stalled,
                        stall_every,
                    } => {
                        if step_pos >= step_len {
                            step_pos -= step_len;
                            step_count += 1;
                            step_len = period * (1.0 + 0.03 * rng.normal()).max(0.5);
                            stall_len = 0.0;
                            if stall_every > 0 && step_count.is_multiple_of(stall_every) {
                                stall_len = 2.0 * period;
                                step_len += stall_len;
                            }
                        }
                        let v = if step_pos < stall_len {
                            stalled
                        } else if step_pos < stall_len + period * busy {
                            high
                        } else {
                            low
                        };
                        step_pos += sub_dt;
                        v
                    }
                    Activity::Erratic { lo, hi, hold } => {
                        if hold_left <= 0.0 {
                            hold_left = hold;
                            level = lo + (hi - lo) * rng.next_f64();
                        }
                        hold_left -= sub_dt;
                        level
                    }
                    Activity::Approach { target, tau, noise } => {
                        let base = level + (target - level) * (sub_dt / tau);
                        base + noise * rng.normal() * sub_dt.sqrt()
                    }
                };
                acc += level;
            }
            let mean = acc / SUB as f64;
            match kind {
                Kind::Gauge => values.push(mean.max(0.0)),
                Kind::Counter => {
                    cumulative += mean.max(0.0);
                    values.push(cumulative.round());
                }
            }
        }
    }
    Trace {
        name: name.to_string(),
        kind,
        dt: Duration::from_secs(1),
        values,
        steps,
        scale,
        noise_floor,
    }
}

/// GPU SM utilization (%) of a data-parallel LLM job: queued (idle), loading, training with
/// 0.62 s steps (80 % compute at 98 %, all-reduce at 35 %) and data-loader stalls, an
/// evaluation pass, a checkpoint, a thermal throttle that slows compute, a crash, a restart.
///
/// Averaged over one-second ticks, the steps alias: how much all-reduce falls in a given
/// second varies, so training reads 79-92 %, a spread wider than 10 % but with most reads
/// close to the peak, dense enough to back off; each stall (two reads far under the rest) is
/// sent at once. The throttle lowers the level by about 20 % while the reads still spread.
pub fn gpu_util_llm(seed: u64) -> Trace {
    let train = Activity::Steps {
        period: 0.62,
        busy: 0.8,
        high: 98.0,
        low: 35.0,
        stalled: 0.0,
        stall_every: 400,
    };
    let throttled = Activity::Steps {
        period: 0.9,
        busy: 0.6,
        high: 90.0,
        low: 30.0,
        stalled: 0.0,
        stall_every: 400,
    };
    render(
        "gpu_util_llm",
        Kind::Gauge,
        seed,
        &[
            (
                300,
                Activity::Flat {
                    level: 0.0,
                    noise: 0.0,
                },
            ),
            (
                120,
                Activity::Erratic {
                    lo: 5.0,
                    hi: 40.0,
                    hold: 3.0,
                },
            ),
            (1800, train),
            (
                60,
                Activity::Erratic {
                    lo: 40.0,
                    hi: 70.0,
                    hold: 4.0,
                },
            ),
            (1500, train),
            (
                40,
                Activity::Flat {
                    level: 2.0,
                    noise: 0.5,
                },
            ),
            (900, train),
            (900, throttled),
            (
                600,
                Activity::Flat {
                    level: 0.0,
                    noise: 0.0,
                },
            ),
            (
                90,
                Activity::Erratic {
                    lo: 5.0,
                    hi: 40.0,
                    hold: 3.0,
                },
            ),
            (1000, train),
        ],
        100.0,
        0.5,
    )
}

/// GPU SM utilization (%) of a pipeline-parallel job with 8 s steps: 6 s of compute at 97 %,
/// 2 s of pipeline bubble at 20 %, visible at one read a second. Three steps fit in the
/// sampler's window, so it is stable: each envelope carries the compute peak and the bubble as
/// its min, and the end of the job (idle, under the bubbles) is a drop out of the range.
pub fn gpu_util_pipeline(seed: u64) -> Trace {
    let train = Activity::Steps {
        period: 8.0,
        busy: 0.75,
        high: 97.0,
        low: 20.0,
        stalled: 0.0,
        stall_every: 0,
    };
    render(
        "gpu_util_pipeline",
        Kind::Gauge,
        seed,
        &[
            (
                600,
                Activity::Flat {
                    level: 0.0,
                    noise: 0.0,
                },
            ),
            (3000, train),
            (
                900,
                Activity::Flat {
                    level: 0.0,
                    noise: 0.0,
                },
            ),
            (2700, train),
        ],
        100.0,
        0.5,
    )
}

/// GPU temperature (°C): warms up under load and cools in idle gaps, with sensor noise. No
/// steps: it drifts.
pub fn gpu_temperature(seed: u64) -> Trace {
    let warm = |target| Activity::Approach {
        target,
        tau: 90.0,
        noise: 0.3,
    };
    let mut t = render(
        "gpu_temperature",
        Kind::Gauge,
        seed,
        &[
            (
                300,
                Activity::Flat {
                    level: 34.0,
                    noise: 0.2,
                },
            ),
            (3000, warm(74.0)),
            (900, warm(36.0)),
            (3000, warm(76.0)),
        ],
        100.0,
        0.5,
    );
    t.steps.clear();
    t
}

/// Bytes sent on an NDR port (counter): all-reduce bursts at 45 GB/s in each 0.62 s step,
/// background management traffic when idle, and the link training down from 4X to 1X midway,
/// which stretches the communication phase and lowers the rate. As with
/// [`gpu_util_llm`], the per-second rate aliases, here over about 4-14 GB/s during training:
/// few reads are close to the peak, so the density rule keeps training at the minimum
/// interval (the degraded link, steadier, backs off part of the time).
pub fn ib_xmit_bytes(seed: u64) -> Trace {
    let gb = 1e9;
    let train = Activity::Steps {
        period: 0.62,
        busy: 0.8,
        high: 0.0,
        low: 45.0 * gb,
        stalled: 0.0,
        stall_every: 400,
    };
    let degraded = Activity::Steps {
        period: 0.62 + 0.124 * 3.0,
        busy: 0.5,
        high: 0.0,
        low: 11.25 * gb,
        stalled: 0.0,
        stall_every: 400,
    };
    render(
        "ib_xmit_bytes",
        Kind::Counter,
        seed,
        &[
            (
                600,
                Activity::Flat {
                    level: 2e3,
                    noise: 5e2,
                },
            ),
            (2400, train),
            (1200, degraded),
            (
                600,
                Activity::Flat {
                    level: 2e3,
                    noise: 5e2,
                },
            ),
            (2400, train),
        ],
        50.0 * gb,
        0.005 * 50.0 * gb,
    )
}

/// Symbol errors on a port (counter): none for a long time, a cable going bad (about 40 a
/// second for two minutes), quiet again after a reseat, a short burst later.
pub fn ib_symbol_errors(seed: u64) -> Trace {
    render(
        "ib_symbol_errors",
        Kind::Counter,
        seed,
        &[
            (
                2400,
                Activity::Flat {
                    level: 0.0,
                    noise: 0.0,
                },
            ),
            (
                120,
                Activity::Flat {
                    level: 40.0,
                    noise: 4.0,
                },
            ),
            (
                3000,
                Activity::Flat {
                    level: 0.0,
                    noise: 0.0,
                },
            ),
            (
                20,
                Activity::Flat {
                    level: 200.0,
                    noise: 20.0,
                },
            ),
            (
                1660,
                Activity::Flat {
                    level: 0.0,
                    noise: 0.0,
                },
            ),
        ],
        1000.0,
        0.5,
    )
}

#[cfg(test)]
mod tests {
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
        let rate =
            |r: std::ops::Range<usize>| (ib.values[r.end] - ib.values[r.start]) / r.len() as f64;
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
}
