//! Selection on traces whose redundant and constant metrics are known, then end to end
//! through a collector's archive and query API.

use std::{collections::BTreeMap, time::Duration};

use railscope_wire::{EncoderConfig, FrameEncoder, Key, Kind, Labels, Series, Value};

use super::{
    MetricTrace, Reading, SelectConfig, SeriesTrace,
    cli::{SelectArgs, fetch},
    interval_cap::{percentile, stable_periods},
    select,
};
use crate::{
    archive::{AcceptedFrame, Archive, ArchiveConfig},
    query::test_server::serve_on_loopback,
};

const S: u64 = 1_000_000_000;
const T0: u64 = 1_790_000_000 * S;

/// The training step's phase pattern: the level held for `hold` seconds, in turn.
fn step_level(t: u64, hold: u64, gpu: u64) -> f64 {
    [10.0, 30.0, 60.0, 90.0][((t / hold + gpu) % 4) as usize]
}

/// A slower, smooth pattern unrelated to the steps.
fn wave(t: u64, gpu: u64) -> f64 {
    50.0 + 40.0 * (2.0 * std::f64::consts::PI * (t as f64 / 90.0 + gpu as f64 / 8.0)).sin()
}

/// A deterministic ±1 % wobble.
fn wobble(t: u64, gpu: u64) -> f64 {
    1.0 + 0.01 * (((t * 7919 + gpu * 104_729) % 201) as f64 / 100.0 - 1.0)
}

fn labels(pairs: &[(&str, String)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// A series' labels and its value at each second.
type Shape = (BTreeMap<String, String>, Box<dyn Fn(u64) -> f64>);

/// One reading a second for `seconds`, each standing for its own instant (gauges) or the
/// second before it (counter rates).
fn trace(name: &str, series: Vec<Shape>, seconds: u64, counter: bool) -> MetricTrace {
    MetricTrace {
        name: name.into(),
        series: series
            .into_iter()
            .map(|(labels, f)| SeriesTrace {
                labels,
                readings: (0..seconds)
                    .map(|s| Reading {
                        start_ns: if counter && s > 0 {
                            T0 + (s - 1) * S
                        } else {
                            T0 + s * S
                        },
                        t_ns: T0 + s * S,
                        value: f(s),
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// Two nodes x 2 GPUs x 1 port, 10 min: `sm_active` steps through the phases of a training
/// step (20 s each); `power` is it scaled, `xmit` (per port, per node) the node's sum of it
/// as a rate; `memory_utilization` is an unrelated wave and `dram_active` that wave in [0, 1]
/// with a 1 % wobble; the SM clock never moves and the symbol-error counter never ticks.
fn fleet() -> Vec<MetricTrace> {
    const SECONDS: u64 = 600;
    let gpus = |f: fn(u64, u64) -> f64| -> Vec<Shape> {
        let mut out: Vec<Shape> = Vec::new();
        for node in ["n1", "n2"] {
            for gpu in 0..2u64 {
                out.push((
                    labels(&[("node", node.into()), ("gpu", gpu.to_string())]),
                    Box::new(move |t| f(t, gpu)),
                ));
            }
        }
        out
    };
    let ports = |f: fn(u64) -> f64| -> Vec<Shape> {
        ["n1", "n2"]
            .into_iter()
            .map(|node| {
                let f: Box<dyn Fn(u64) -> f64> = Box::new(f);
                (
                    labels(&[
                        ("node", node.into()),
                        ("device", "mlx5_0".into()),
                        ("port", "1".into()),
                    ]),
                    f,
                )
            })
            .collect()
    };
    vec![
        trace(
            "railscope_gpu_sm_active_ratio",
            gpus(|t, g| step_level(t, 20, g) / 100.0),
            SECONDS,
            false,
        ),
        trace(
            "railscope_gpu_power_milliwatts",
            gpus(|t, g| step_level(t, 20, g) * 7000.0),
            SECONDS,
            false,
        ),
        trace(
            "railscope_ib_port_xmit_data_bytes_total",
            ports(|t| (step_level(t, 20, 0) + step_level(t, 20, 1)) * 1e8),
            SECONDS,
            true,
        ),
        trace(
            "railscope_gpu_memory_utilization_percent",
            gpus(wave),
            SECONDS,
            false,
        ),
        trace(
            "railscope_gpu_dram_active_ratio",
            gpus(|t, g| wave(t, g) / 100.0 * wobble(t, g)),
            SECONDS,
            false,
        ),
        trace(
            "railscope_gpu_sm_clock_hertz",
            gpus(|_, _| 1.98e9),
            SECONDS,
            false,
        ),
        trace(
            "railscope_ib_symbol_error_total",
            ports(|_| 0.0),
            SECONDS,
            true,
        ),
    ]
}

fn config() -> SelectConfig {
    SelectConfig::new(T0, T0 + 599 * S)
}

#[test]
fn constant_and_redundant_metrics_are_dropped_and_one_of_each_group_kept() {
    let selection = select(&fleet(), &config());
    assert_eq!(selection.metrics, 7);
    assert_eq!(
        selection.constant,
        [
            "railscope_gpu_sm_clock_hertz",
            "railscope_ib_symbol_error_total"
        ]
    );
    let groups: Vec<(Vec<&str>, Vec<&str>)> = selection
        .groups
        .iter()
        .map(|g| {
            (
                g.members.iter().map(String::as_str).collect(),
                g.kept.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    assert_eq!(
        groups,
        [
            (
                vec![
                    "railscope_gpu_dram_active_ratio",
                    "railscope_gpu_memory_utilization_percent"
                ],
                vec!["railscope_gpu_dram_active_ratio"]
            ),
            (
                vec![
                    "railscope_gpu_power_milliwatts",
                    "railscope_gpu_sm_active_ratio",
                    "railscope_ib_port_xmit_data_bytes_total"
                ],
                vec!["railscope_gpu_power_milliwatts"]
            ),
        ]
    );
    assert_eq!(
        selection.kept(),
        [
            "railscope_gpu_dram_active_ratio",
            "railscope_gpu_power_milliwatts"
        ]
    );
    // Scaled copies are at distance 0; the wobble keeps dram_active within about 1 %.
    let dram = &selection.groups[0].dropped[0];
    assert!(dram.distance > 0.0 && dram.distance < 0.02, "{dram:?}");
    assert!(
        selection.groups[1]
            .dropped
            .iter()
            .all(|d| d.distance < 1e-9)
    );
}

#[test]
fn the_settings_turn_off_what_is_dropped_and_cap_what_is_kept_at_its_stable_periods() {
    let selection = select(&fleet(), &config());
    let settings = selection.sampling_settings();
    // sm_active's levels are held 20 s: its copy's stable periods are 20 s (the first and
    // last of each series, cut by the range, are left out).
    assert!(
        settings.contains(&"railscope_gpu_power_milliwatts:on,max=20".to_string()),
        "{settings:?}"
    );
    for dropped in [
        "railscope_gpu_memory_utilization_percent",
        "railscope_gpu_sm_active_ratio",
        "railscope_gpu_sm_clock_hertz",
        "railscope_ib_port_xmit_data_bytes_total",
        "railscope_ib_symbol_error_total",
    ] {
        assert!(
            settings.contains(&format!("{dropped}:drop")),
            "{settings:?}"
        );
    }
    assert_eq!(settings.len(), 7);
    let text = selection.text();
    assert!(
        text.contains("  --sampling railscope_ib_symbol_error_total:drop\n"),
        "{text}"
    );
    assert!(
        text.contains("    drop railscope_gpu_sm_active_ratio (like railscope_gpu_power_milliwatts, distance 0.0000)"),
        "{text}"
    );
}

#[test]
fn metrics_the_operator_keeps_are_never_dropped_and_cover_their_group() {
    let selection = select(
        &fleet(),
        &SelectConfig {
            keep: vec!["railscope_ib_".into()],
            ..config()
        },
    );
    assert_eq!(selection.constant, ["railscope_gpu_sm_clock_hertz"]);
    assert_eq!(
        selection.kept(),
        [
            "railscope_gpu_dram_active_ratio",
            "railscope_ib_port_xmit_data_bytes_total",
            "railscope_ib_symbol_error_total"
        ]
    );
}

#[test]
fn a_looser_threshold_merges_groups_and_a_tighter_one_splits_them() {
    let loose = select(
        &fleet(),
        &SelectConfig {
            max_distance: 2.0,
            ..config()
        },
    );
    assert_eq!(loose.kept().len(), 1);
    let tight = select(
        &fleet(),
        &SelectConfig {
            max_distance: 0.001,
            ..config()
        },
    );
    assert_eq!(
        tight.kept(),
        [
            "railscope_gpu_dram_active_ratio",
            "railscope_gpu_memory_utilization_percent",
            "railscope_gpu_power_milliwatts"
        ]
    );
}

#[test]
fn stable_periods_run_until_a_value_leaves_the_tolerance() {
    let readings = [100.0, 105.0, 109.0, 120.0, 121.0, 50.0]
        .iter()
        .enumerate()
        .map(|(i, &v)| Reading {
            start_ns: i as u64 * S,
            t_ns: i as u64 * S,
            value: v,
        })
        .collect();
    let series = SeriesTrace {
        labels: BTreeMap::new(),
        readings,
    };
    // 100, 105, 109 (within 10 % of 100), cut by the start; 120, 121 (from 2 s); 50 alone
    // (from 4 s), cut by the end.
    let periods: Vec<(u64, bool)> = stable_periods(&series, 0.1)
        .iter()
        .map(|p| (p.len_ns, p.cut))
        .collect();
    assert_eq!(periods, [(2 * S, true), (2 * S, false), (S, true)]);
    let mut v = (1..=100).collect::<Vec<u64>>();
    assert_eq!(percentile(&mut v, 5.0), Some(5));
    assert_eq!(percentile(&mut [], 5.0), None);
}

/// A collector's archive of one node's 2 minutes, encoded by the agent's own frame encoder,
/// served by the query API on a loopback port. GPUs 0 and 2 step in phase, 1 and 3 a phase
/// later; the port sends the node's sum of the steps; the temperatures follow the wave.
fn serve() -> (String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let key = Key::from_bytes([9; 32]);
    let mut archive = Archive::open(ArchiveConfig {
        retention_age: None,
        segment_span: Duration::from_secs(1 << 30),
        ..ArchiveConfig::new(dir.path())
    })
    .unwrap();
    let mut encoder = FrameEncoder::new(EncoderConfig::new("gpu-node-001"), key.clone()).unwrap();
    let series = |name: &str, kind: Kind, labels: Labels| Series {
        name: name.into(),
        labels,
        kind,
    };
    let mut counters = [0u64; 2];
    let mut frames = Vec::new();
    for s in 0..120u64 {
        let now = T0 + s * S;
        for gpu in 0..4u64 {
            let l = Labels::new([("gpu", gpu.to_string())]);
            let level = step_level(s, 10, gpu % 2);
            for (name, value) in [
                ("railscope_gpu_sm_active_ratio", level / 100.0),
                ("railscope_gpu_power_milliwatts", level * 7000.0),
                ("railscope_gpu_temperature_celsius", wave(s, gpu)),
                ("railscope_gpu_sm_clock_hertz", 1.98e9),
            ] {
                encoder
                    .push_reading(&railscope_wire::Reading {
                        series: series(name, Kind::Gauge, l.clone()),
                        value: Value::F64(value),
                        unix_ns: now,
                    })
                    .unwrap();
            }
        }
        let port = Labels::new([("device", "mlx5_0"), ("port", "1")]);
        counters[0] += ((0..4).map(|g| step_level(s, 10, g % 2)).sum::<f64>() * 1e6) as u64;
        for (i, name) in [
            "railscope_ib_port_xmit_data_bytes_total",
            "railscope_ib_symbol_error_total",
        ]
        .into_iter()
        .enumerate()
        {
            encoder
                .push_reading(&railscope_wire::Reading {
                    series: series(name, Kind::Counter, port.clone()),
                    value: Value::U64(counters[i]),
                    unix_ns: now,
                })
                .unwrap();
        }
        if (s + 1) % 10 == 0 {
            frames.extend(
                encoder
                    .flush(now + S / 2)
                    .into_iter()
                    .map(|b| (b, now + S / 2)),
            );
        }
    }
    for (bytes, t) in &frames {
        archive
            .append(
                &AcceptedFrame {
                    node: "gpu-node-001",
                    received_ns: *t,
                    first_ns: t - 10 * S,
                    last_ns: *t,
                    bytes,
                },
                &|_| None,
            )
            .unwrap();
    }
    archive.tick().unwrap();
    let url = serve_on_loopback(archive, key);
    (url, dir)
}

#[test]
fn select_reads_a_collectors_range_through_the_api() {
    let (url, _dir) = serve();
    let args = SelectArgs {
        collector: url,
        start: "1790000000".into(),
        end: "1790000119".into(),
        matchers: Vec::new(),
        only: Vec::new(),
        step: Duration::from_secs(1).into(),
        min_variance: super::variance::DEFAULT_MIN_VARIANCE,
        max_distance: super::distance::DEFAULT_MAX_DISTANCE,
        keep: Vec::new(),
        json: false,
    };
    let metrics = fetch(&args, T0, T0 + 119 * S).unwrap();
    let names: Vec<&str> = metrics.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "railscope_gpu_power_milliwatts",
            "railscope_gpu_sm_active_ratio",
            "railscope_gpu_sm_clock_hertz",
            "railscope_gpu_temperature_celsius",
            "railscope_ib_port_xmit_data_bytes_total",
            "railscope_ib_symbol_error_total",
        ]
    );
    let selection = select(&metrics, &SelectConfig::new(T0, T0 + 119 * S));
    assert_eq!(
        selection.constant,
        [
            "railscope_gpu_sm_clock_hertz",
            "railscope_ib_symbol_error_total"
        ]
    );
    assert_eq!(
        selection.kept(),
        [
            "railscope_gpu_power_milliwatts",
            "railscope_gpu_temperature_celsius"
        ]
    );
    // Levels held 10 s: every period not cut by the range is 10 s; the temperatures' wave
    // (10 % steps of a 90 s period) stays within the tolerance for only a few seconds.
    let settings = selection.sampling_settings();
    assert!(
        settings.contains(&"railscope_gpu_power_milliwatts:on,max=10".to_string()),
        "{settings:?}"
    );
    assert!(settings.contains(&"railscope_ib_port_xmit_data_bytes_total:drop".to_string()));
}
