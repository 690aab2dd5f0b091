//! From railscope's series to Prometheus time series: names and labels as Prometheus expects
//! them, the node as a label, and gauge envelopes as three series.
//!
//! - A counter sample is one sample of `name` (the agent's counters already end in `_total`)
//!   at its read time, the cumulative value as a float (exact below 2^53).
//! - A gauge sample is `name` = its mean at the end of its period. A sample that covers a
//!   period (more than one reading: start before end, or min and max apart) also writes
//!   `name_min` and `name_max` at the same time, so peaks survive the sampler's envelopes;
//!   a single reading writes `name` only (its min and max are its value).
//! - Labels: the series' own, plus `node` (the frame's sender, which wins over a series label
//!   of that name), sorted by name with `__name__` among them.
//! - Times in milliseconds (the agent's default time quantum is 1 ms, so nothing is lost).
//! - Characters Prometheus does not allow in names (`[a-zA-Z_:][a-zA-Z0-9_:]*`, no `:` in
//!   label names) become `_`; label values are any UTF-8 and pass unchanged.

use std::borrow::Cow;

use monitor_wire::{Series, SeriesData};

use super::prompb::{Label, Sample, TimeSeries};

/// The label every series gets: the node that sent it.
pub const NODE_LABEL: &str = "node";
pub const MIN_SUFFIX: &str = "_min";
pub const MAX_SUFFIX: &str = "_max";

/// Appends the time series for `data` of `series` from `node` to `out`: one for a counter
/// or a gauge of single readings, three for a gauge with envelopes. Returns the number of
/// Prometheus samples written.
pub fn to_time_series(
    node: &str,
    series: &Series,
    data: &SeriesData,
    out: &mut Vec<TimeSeries>,
) -> usize {
    if data.is_empty() {
        return 0;
    }
    let name = sanitize_name(&series.name, true);
    let labels = |suffix: &str| {
        let mut labels: Vec<Label> = series
            .labels
            .iter()
            .filter(|(k, _)| *k != NODE_LABEL)
            .map(|(k, v)| Label {
                name: sanitize_name(k, false).into_owned(),
                value: v.to_owned(),
            })
            .chain([
                Label {
                    name: "__name__".into(),
                    value: format!("{name}{suffix}"),
                },
                Label {
                    name: NODE_LABEL.into(),
                    value: node.to_owned(),
                },
            ])
            .collect();
        labels.sort_by(|a, b| a.name.cmp(&b.name));
        labels
    };
    match data {
        SeriesData::Counter(v) => {
            out.push(TimeSeries {
                labels: labels(""),
                samples: v
                    .iter()
                    .map(|c| Sample {
                        value: c.value as f64,
                        timestamp: millis(c.unix_ns),
                    })
                    .collect(),
            });
            v.len()
        }
        SeriesData::Gauge(v) => {
            let mean = v
                .iter()
                .map(|g| Sample {
                    value: g.mean,
                    timestamp: millis(g.end_unix_ns),
                })
                .collect();
            out.push(TimeSeries {
                labels: labels(""),
                samples: mean,
            });
            let periods: Vec<_> = v
                .iter()
                .filter(|g| g.start_unix_ns < g.end_unix_ns || !g.is_single_value())
                .collect();
            if periods.is_empty() {
                return v.len();
            }
            for (suffix, pick) in [
                (
                    MIN_SUFFIX,
                    (|g| g.min) as fn(&&monitor_wire::GaugeSample) -> f64,
                ),
                (MAX_SUFFIX, |g| g.max),
            ] {
                out.push(TimeSeries {
                    labels: labels(suffix),
                    samples: periods
                        .iter()
                        .map(|g| Sample {
                            value: pick(g),
                            timestamp: millis(g.end_unix_ns),
                        })
                        .collect(),
                });
            }
            v.len() + 2 * periods.len()
        }
    }
}

/// Nanoseconds since the epoch to the milliseconds remote-write carries (rounded down).
pub fn millis(unix_ns: u64) -> i64 {
    (unix_ns / 1_000_000) as i64
}

/// `name` with every character Prometheus does not allow replaced by `_` (metric names may
/// hold `:`, label names may not; neither may start with a digit).
pub fn sanitize_name(name: &str, metric: bool) -> Cow<'_, str> {
    let ok = |i: usize, c: char| {
        c.is_ascii_alphabetic() || c == '_' || (metric && c == ':') || (i > 0 && c.is_ascii_digit())
    };
    if !name.is_empty() && name.chars().enumerate().all(|(i, c)| ok(i, c)) {
        return Cow::Borrowed(name);
    }
    let mut out: String = name
        .chars()
        .enumerate()
        .map(|(i, c)| {
            if ok(i, c) || c.is_ascii_digit() {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use monitor_wire::{CounterSample, GaugeSample, Kind, Labels};

    use super::*;

    fn series(name: &str, labels: &[(&str, &str)], kind: Kind) -> Series {
        Series {
            name: name.into(),
            labels: Labels::new(labels.iter().copied()),
            kind,
        }
    }

    fn label_text(ts: &TimeSeries) -> String {
        ts.labels
            .iter()
            .map(|l| format!("{}={}", l.name, l.value))
            .collect::<Vec<_>>()
            .join(",")
    }

    #[test]
    fn counter_is_one_series_with_node_label_and_millisecond_times() {
        let s = series(
            "railscope_ib_port_xmit_data_total",
            &[("device", "mlx5_0"), ("port", "1")],
            Kind::Counter,
        );
        let data = SeriesData::Counter(vec![
            CounterSample {
                unix_ns: 1_700_000_000_123_000_000,
                value: 10,
            },
            CounterSample {
                unix_ns: 1_700_000_001_123_999_999,
                value: (1 << 53) + 2,
            },
        ]);
        let mut out = Vec::new();
        assert_eq!(to_time_series("n1", &s, &data, &mut out), 2);
        assert_eq!(out.len(), 1);
        assert_eq!(
            label_text(&out[0]),
            "__name__=railscope_ib_port_xmit_data_total,device=mlx5_0,node=n1,port=1"
        );
        let samples: Vec<(i64, f64)> = out[0]
            .samples
            .iter()
            .map(|s| (s.timestamp, s.value))
            .collect();
        assert_eq!(
            samples,
            [
                (1_700_000_000_123, 10.0),
                (1_700_000_001_123, 9007199254740994.0)
            ]
        );
    }

    #[test]
    fn gauge_envelopes_add_min_and_max_series_only_for_periods() {
        let s = series(
            "railscope_gpu_temperature_celsius",
            &[("gpu", "3")],
            Kind::Gauge,
        );
        let t = 1_700_000_000_000_000_000u64;
        let data = SeriesData::Gauge(vec![
            GaugeSample::reading(t, 40.0),
            GaugeSample {
                start_unix_ns: t + 1_000_000_000,
                end_unix_ns: t + 10_000_000_000,
                min: 39.0,
                max: 45.5,
                mean: 41.25,
            },
        ]);
        let mut out = Vec::new();
        assert_eq!(to_time_series("gpu-node-1", &s, &data, &mut out), 4);
        let view: Vec<(String, Vec<(i64, f64)>)> = out
            .iter()
            .map(|ts| {
                (
                    label_text(ts),
                    ts.samples.iter().map(|s| (s.timestamp, s.value)).collect(),
                )
            })
            .collect();
        let ms = 1_700_000_000_000i64;
        assert_eq!(
            view,
            [
                (
                    "__name__=railscope_gpu_temperature_celsius,gpu=3,node=gpu-node-1".into(),
                    vec![(ms, 40.0), (ms + 10_000, 41.25)]
                ),
                (
                    "__name__=railscope_gpu_temperature_celsius_min,gpu=3,node=gpu-node-1".into(),
                    vec![(ms + 10_000, 39.0)]
                ),
                (
                    "__name__=railscope_gpu_temperature_celsius_max,gpu=3,node=gpu-node-1".into(),
                    vec![(ms + 10_000, 45.5)]
                ),
            ]
        );
    }

    #[test]
    fn frame_node_wins_over_a_node_label_and_bad_characters_become_underscores() {
        let s = series(
            "railscope_ib_hw.np-cnp/sent_total",
            &[("node", "forged"), ("2bad-key", "v a\"l")],
            Kind::Counter,
        );
        let data = SeriesData::Counter(vec![CounterSample {
            unix_ns: 5_000_000,
            value: 1,
        }]);
        let mut out = Vec::new();
        to_time_series("real", &s, &data, &mut out);
        assert_eq!(
            label_text(&out[0]),
            "_2bad_key=v a\"l,__name__=railscope_ib_hw_np_cnp_sent_total,node=real"
        );
        assert_eq!(sanitize_name("a:b", true), "a:b");
        assert_eq!(sanitize_name("a:b", false), "a_b");
        assert_eq!(sanitize_name("", false), "_");
    }
}
