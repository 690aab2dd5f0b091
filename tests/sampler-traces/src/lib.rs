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
//!
//! The traces themselves are in `workloads.rs`, the measure in `evaluate.rs`.
//!
//! [`AdaptiveSampler::due`]: monitor_sampler::AdaptiveSampler::due
//! [`Emit`]: monitor_sampler::Emit
//! [`Mode::Fast`]: monitor_sampler::Mode::Fast

mod evaluate;
#[cfg(test)]
mod tests;
mod workloads;

use std::time::Duration;

use monitor_sampler::SamplerConfig;
use monitor_wire::Kind;

pub use evaluate::{Evaluation, evaluate};
pub use workloads::{
    gpu_temperature, gpu_util_llm, gpu_util_pipeline, ib_symbol_errors, ib_xmit_bytes, standard,
};

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
