//! How a group of series is sampled ([`SamplerConfig`]), and the operator's way to change it:
//! `railscope agent --sampling PREFIX:SETTING,...` ([`SamplingSpec`]).

use std::time::Duration;

/// How one group of series is sampled. The defaults (a window of 24 reads, half of it close
/// to the peak, a cap of 32 minimum intervals, every minimum interval read) are tuned on the
/// workload traces of the `sampler-traces` crate.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// Shortest interval: the fixed interval when disabled, the interval of an unstable series.
    pub min_interval: Duration,
    /// Longest collection interval of a stable series (before jitter is taken off).
    pub max_interval: Duration,
    /// Observations kept per series to judge stability. A periodic workload is stable only if
    /// a few of its periods fit (pipeline steps of 8 s: 24 at one read a second).
    pub window: usize,
    /// Relative difference (of the smaller value) below which two values count as the same.
    pub peak_tolerance: f64,
    /// Minimum share of the window close to its peak for the series to be stable.
    pub density_threshold: f64,
    /// Absolute difference below which two values count as the same, in the series' unit
    /// (its rate per second for counters). 0 compares relatively only.
    pub abs_floor: f64,
    /// Each backed-off interval is changed by a random fraction in `[-jitter, +jitter]` of
    /// itself, so series do not stay in step with each other or with a periodic workload.
    pub jitter: f64,
    /// A stable series is read at least every this many minimum intervals (>= 1); 1 reads
    /// every minimum interval.
    pub ground_truth_every: u32,
    /// `false`: fixed interval, read and sent every `min_interval`.
    pub enabled: bool,
    /// `true`: the series are neither read nor sent (`--sampling PREFIX:drop`, what
    /// `railscope select` prints for a constant or redundant metric).
    pub dropped: bool,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self {
            min_interval: Duration::from_secs(1),
            max_interval: Duration::from_secs(32),
            window: 24,
            peak_tolerance: 0.10,
            density_threshold: 0.5,
            abs_floor: 0.0,
            jitter: 0.1,
            ground_truth_every: 1,
            enabled: true,
            dropped: false,
        }
    }
}

impl SamplerConfig {
    /// The same group, sampled at a fixed `min_interval`.
    pub fn fixed(&self) -> Self {
        Self {
            enabled: false,
            ..self.clone()
        }
    }

    pub(crate) fn min_ns(&self) -> u64 {
        (self.min_interval.as_nanos() as u64).max(1)
    }

    pub(crate) fn max_ns(&self) -> u64 {
        (self.max_interval.as_nanos() as u64).max(self.min_ns())
    }

    pub(crate) fn window(&self) -> usize {
        self.window.max(1)
    }

    pub(crate) fn ground_truth_ns(&self) -> u64 {
        self.min_ns()
            .saturating_mul(u64::from(self.ground_truth_every.max(1)))
    }

    /// Whether `a` and `b` count as the same value.
    pub(crate) fn close(&self, a: f64, b: f64) -> bool {
        let smaller = a.abs().min(b.abs());
        (a - b).abs() <= (self.peak_tolerance * smaller).max(self.abs_floor)
    }
}

/// A `--sampling` setting that cannot be used; the message names it and says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--sampling {spec:?}: {why}")]
pub struct SamplingSpecError {
    pub spec: String,
    pub why: String,
}

/// One `--sampling PREFIX:SETTING,...` as an operator writes it: the metric-name prefix of
/// the group, and the settings to change (see [`AdaptiveSampler::configure`]).
///
/// [`AdaptiveSampler::configure`]: crate::AdaptiveSampler::configure
#[derive(Clone, Copy, Debug)]
pub(crate) struct SamplingSpec<'a> {
    /// The whole text, for error messages.
    spec: &'a str,
    /// The series whose name starts with this.
    pub(crate) prefix: &'a str,
    settings: &'a str,
}

impl<'a> SamplingSpec<'a> {
    /// Splits `PREFIX:SETTINGS`; the settings are checked by [`apply`](Self::apply).
    pub(crate) fn parse(spec: &'a str) -> Result<Self, SamplingSpecError> {
        let (prefix, settings) = spec.split_once(':').ok_or_else(|| SamplingSpecError {
            spec: spec.to_string(),
            why: "expected PREFIX:SETTING,...".into(),
        })?;
        Ok(Self {
            spec,
            prefix: prefix.trim(),
            settings,
        })
    }

    /// `config` with the settings applied, or the first one that cannot be used.
    pub(crate) fn apply(
        &self,
        mut config: SamplerConfig,
    ) -> Result<SamplerConfig, SamplingSpecError> {
        let bad = |why: String| SamplingSpecError {
            spec: self.spec.to_string(),
            why,
        };
        for setting in self
            .settings
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            let (name, value) = match setting.split_once('=') {
                Some((n, v)) => (n.trim(), Some(v.trim())),
                None => (setting, None),
            };
            let number = || -> Result<f64, SamplingSpecError> {
                let v = value.ok_or_else(|| bad(format!("{name} needs a value ({name}=...)")))?;
                v.parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && *x >= 0.0)
                    .ok_or_else(|| bad(format!("{name}={v}: not a non-negative number")))
            };
            let whole = |x: f64| -> Result<u32, SamplingSpecError> {
                if x >= 1.0 && x.fract() == 0.0 && x <= f64::from(u32::MAX) {
                    Ok(x as u32)
                } else {
                    Err(bad(format!("{name}={x}: not a whole number >= 1")))
                }
            };
            match name {
                "off" if value.is_none() => config.enabled = false,
                "on" if value.is_none() => {
                    config.enabled = true;
                    config.dropped = false;
                }
                "drop" if value.is_none() => config.dropped = true,
                "max" => config.max_interval = Duration::from_secs_f64(number()?),
                "ground-truth" => config.ground_truth_every = whole(number()?)?,
                "window" => config.window = whole(number()?)? as usize,
                "tolerance" => config.peak_tolerance = number()?,
                "density" => config.density_threshold = number()?.min(1.0),
                "jitter" => config.jitter = number()?.min(0.5),
                "floor" => config.abs_floor = number()?,
                _ => {
                    return Err(bad(format!(
                        "unknown setting {setting:?} (off, on, drop, max, ground-truth, \
                         window, tolerance, density, jitter, floor)"
                    )));
                }
            }
        }
        if config.max_interval < config.min_interval {
            return Err(bad(format!(
                "max={:?} is below the minimum interval {:?}",
                config.max_interval, config.min_interval
            )));
        }
        Ok(config)
    }
}
