//! The workload-shaped traces, rendered from a model of what the hardware does.

use std::time::Duration;

use monitor_sampler::SplitMix64;
use monitor_wire::Kind;

use crate::Trace;

/// Points of the fine model per tick.
const SUB: usize = 100;

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
