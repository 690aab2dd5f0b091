//! `railscope select` (monitor-client's selection) against what this collector reads
//! ([`crate::reads`], which `/api/v1/reads` answers): selection on traces whose redundant and
//! constant metrics are known, then end to end through a collector's archive and query API.

use std::{collections::BTreeMap, time::Duration};

use monitor_wire::{EncoderConfig, FrameEncoder, Key, Kind, Labels, Series, Value};

use monitor_client::select::{
    MetricTrace, Reading, SelectConfig, SeriesTrace,
    cli::{SelectArgs, fetch, read_by},
    distance,
    interval_cap::{percentile, stable_periods},
    keep::reason,
    select, variance,
};

use crate::query::test_server::serve_on_loopback;

/// What this collector reads, as `/api/v1/reads` answers it.
fn reads() -> BTreeMap<String, Vec<String>> {
    crate::reads::readers()
        .into_iter()
        .map(|(m, r)| (m.to_owned(), r))
        .collect()
}
use monitor_archive::archive::{AcceptedFrame, Archive, ArchiveConfig};

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

/// Two nodes x 2 GPUs x 1 port, 10 min, under names the agent sends that railscope itself does
/// not read (so only the data decides): `pcie_tx` steps through the phases of a training step
/// (20 s each); `pcie_rx` is it scaled, `unicast_xmit` (per port, per node) the node's sum of
/// it as a rate; `memory_utilization` is an unrelated wave and `fp16_util` that wave in [0, 1]
/// with a 1 % wobble; the SM clock never moves and a multicast packet counter never ticks.
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
            "railscope_gpu_pcie_tx_bytes_per_second",
            gpus(|t, g| step_level(t, 20, g) / 100.0),
            SECONDS,
            false,
        ),
        trace(
            "railscope_gpu_pcie_rx_bytes_per_second",
            gpus(|t, g| step_level(t, 20, g) * 7000.0),
            SECONDS,
            false,
        ),
        trace(
            "railscope_ib_unicast_xmit_packets_total",
            ports(|t| (step_level(t, 20, 0) + step_level(t, 20, 1)) * 1e8),
            SECONDS,
            true,
        ),
        trace(
            "railscope_gpu_memory_utilization_ratio",
            gpus(wave),
            SECONDS,
            false,
        ),
        trace(
            "railscope_gpu_fp16_util_ratio",
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
            "railscope_ib_multicast_xmit_packets_total",
            ports(|_| 0.0),
            SECONDS,
            true,
        ),
    ]
}

fn config() -> SelectConfig {
    SelectConfig::new(T0, T0 + 599 * S, reads())
}

#[test]
fn constant_and_redundant_metrics_are_dropped_and_one_of_each_group_kept() {
    let selection = select(&fleet(), &config());
    assert_eq!(selection.metrics, 7);
    assert_eq!(
        selection.constant,
        [
            "railscope_gpu_sm_clock_hertz",
            "railscope_ib_multicast_xmit_packets_total"
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
                    "railscope_gpu_fp16_util_ratio",
                    "railscope_gpu_memory_utilization_ratio"
                ],
                vec!["railscope_gpu_fp16_util_ratio"]
            ),
            (
                vec![
                    "railscope_gpu_pcie_rx_bytes_per_second",
                    "railscope_gpu_pcie_tx_bytes_per_second",
                    "railscope_ib_unicast_xmit_packets_total"
                ],
                vec!["railscope_gpu_pcie_rx_bytes_per_second"]
            ),
        ]
    );
    assert_eq!(
        selection.kept(),
        [
            "railscope_gpu_fp16_util_ratio",
            "railscope_gpu_pcie_rx_bytes_per_second"
        ]
    );
    // Scaled copies are at distance 0; the wobble keeps fp16_util within about 1 %.
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
    // pcie_tx's levels are held 20 s: its copy's stable periods are 20 s (the first and
    // last of each series, cut by the range, are left out).
    assert!(
        settings.contains(&"railscope_gpu_pcie_rx_bytes_per_second:on,max=20".to_string()),
        "{settings:?}"
    );
    for dropped in [
        "railscope_gpu_memory_utilization_ratio",
        "railscope_gpu_pcie_tx_bytes_per_second",
        "railscope_gpu_sm_clock_hertz",
        "railscope_ib_unicast_xmit_packets_total",
        "railscope_ib_multicast_xmit_packets_total",
    ] {
        assert!(
            settings.contains(&format!("{dropped}:drop")),
            "{settings:?}"
        );
    }
    assert_eq!(settings.len(), 7);
    let text = selection.text();
    assert!(
        text.contains("  --sampling railscope_ib_multicast_xmit_packets_total:drop\n"),
        "{text}"
    );
    assert!(
        text.contains("    drop railscope_gpu_pcie_tx_bytes_per_second (like railscope_gpu_pcie_rx_bytes_per_second, distance 0.0000)"),
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
            "railscope_gpu_fp16_util_ratio",
            "railscope_ib_multicast_xmit_packets_total",
            "railscope_ib_unicast_xmit_packets_total"
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
            "railscope_gpu_fp16_util_ratio",
            "railscope_gpu_memory_utilization_ratio",
            "railscope_gpu_pcie_rx_bytes_per_second"
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
                ("railscope_gpu_pcie_tx_bytes_per_second", level / 100.0),
                ("railscope_gpu_pcie_rx_bytes_per_second", level * 7000.0),
                ("railscope_gpu_temperature_celsius", wave(s, gpu)),
                ("railscope_gpu_sm_clock_hertz", 1.98e9),
            ] {
                encoder
                    .push_reading(&monitor_wire::Reading {
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
            "railscope_ib_unicast_xmit_packets_total",
            "railscope_ib_symbol_error_total",
        ]
        .into_iter()
        .enumerate()
        {
            encoder
                .push_reading(&monitor_wire::Reading {
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
        min_variance: variance::DEFAULT_MIN_VARIANCE,
        max_distance: distance::DEFAULT_MAX_DISTANCE,
        keep: Vec::new(),
        no_keep_failures: false,
        json: false,
    };
    let metrics = fetch(&args, T0, T0 + 119 * S).unwrap();
    // What the collector reads comes from the collector.
    assert_eq!(read_by(&args.collector).unwrap(), reads());
    let names: Vec<&str> = metrics.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "railscope_gpu_pcie_rx_bytes_per_second",
            "railscope_gpu_pcie_tx_bytes_per_second",
            "railscope_gpu_sm_clock_hertz",
            "railscope_gpu_temperature_celsius",
            "railscope_ib_symbol_error_total",
            "railscope_ib_unicast_xmit_packets_total",
        ]
    );
    let selection = select(
        &metrics,
        &SelectConfig::new(T0, T0 + 119 * S, read_by(&args.collector).unwrap()),
    );
    assert_eq!(selection.constant, ["railscope_gpu_sm_clock_hertz"]);
    // The symbol-error counter never ticked, but a rule reads it: kept, at the agent's
    // default cap.
    assert_eq!(selection.kept_constant, ["railscope_ib_symbol_error_total"]);
    assert_eq!(
        selection.protected_reason("railscope_ib_symbol_error_total"),
        Some("read by finding ib_symbol_errors; failure counter")
    );
    assert_eq!(
        selection.kept(),
        [
            "railscope_gpu_pcie_rx_bytes_per_second",
            "railscope_gpu_temperature_celsius",
            "railscope_ib_symbol_error_total"
        ]
    );
    // Levels held 10 s: every period not cut by the range is 10 s; the temperatures' wave
    // (10 % steps of a 90 s period) stays within the tolerance for only a few seconds.
    let settings = selection.sampling_settings();
    assert!(
        settings.contains(&"railscope_gpu_pcie_rx_bytes_per_second:on,max=10".to_string()),
        "{settings:?}"
    );
    assert!(settings.contains(&"railscope_ib_unicast_xmit_packets_total:drop".to_string()));
    assert!(settings.contains(&"railscope_ib_symbol_error_total:on".to_string()));
}

/// A deterministic wobble of ±`amplitude` (a fraction), its phase set by `seed`.
fn jitter(t: u64, seed: u64, amplitude: f64) -> f64 {
    1.0 + amplitude * (((t * 7919 + seed * 104_729) % 201) as f64 / 100.0 - 1.0)
}

/// Two nodes x 2 GPUs x 2 ports, 10 min, named as the agent names its series: the GPUs step
/// (SM activity, power in step, the energy counter's rate the power), the SM clock never
/// moves; the links run at 4x 400 Gb/s except n2's mlx5_1, retrained to 2x 200 for a minute
/// (width and rate the same shape); the ports carry steady traffic with a ±3 % wobble
/// (sent and received alike to the threshold, nearly flat); the error counters never tick,
/// the ports stay ACTIVE and LinkUp, no row remapping is pending or failed.
fn agent_fleet() -> Vec<MetricTrace> {
    const SECONDS: u64 = 600;
    let gpus = |f: Box<dyn Fn(u64, u64) -> f64>| -> Vec<Shape> {
        let f = std::rc::Rc::new(f);
        let mut out: Vec<Shape> = Vec::new();
        for node in ["n1", "n2"] {
            for gpu in 0..2u64 {
                let f = f.clone();
                out.push((
                    labels(&[("node", node.into()), ("gpu", gpu.to_string())]),
                    Box::new(move |t| f(t, gpu)),
                ));
            }
        }
        out
    };
    // f(t, port index 0..4, retrained port?)
    let ports = |f: Box<dyn Fn(u64, u64, bool) -> f64>| -> Vec<Shape> {
        let f = std::rc::Rc::new(f);
        let mut out: Vec<Shape> = Vec::new();
        for (n, node) in ["n1", "n2"].into_iter().enumerate() {
            for (d, device) in ["mlx5_0", "mlx5_1"].into_iter().enumerate() {
                let f = f.clone();
                let index = (n * 2 + d) as u64;
                let retrained = node == "n2" && device == "mlx5_1";
                out.push((
                    labels(&[
                        ("node", node.into()),
                        ("device", device.into()),
                        ("port", "1".into()),
                    ]),
                    Box::new(move |t| f(t, index, retrained)),
                ));
            }
        }
        out
    };
    let down = |t: u64, retrained: bool| retrained && (300..360).contains(&t);
    let gauge = |name: &str, series| trace(name, series, SECONDS, false);
    let counter = |name: &str, series| trace(name, series, SECONDS, true);
    vec![
        gauge(
            "railscope_gpu_sm_util_ratio",
            gpus(Box::new(|t, g| step_level(t, 20, g) / 100.0)),
        ),
        gauge(
            "railscope_gpu_power_watts",
            gpus(Box::new(|t, g| step_level(t, 20, g) * 7.0)),
        ),
        counter(
            "railscope_gpu_energy_millijoules_total",
            gpus(Box::new(|t, g| step_level(t, 20, g) * 7000.0)),
        ),
        gauge(
            "railscope_gpu_sm_clock_hertz",
            gpus(Box::new(|_, _| 1.98e9)),
        ),
        gauge(
            "railscope_gpu_row_remap_pending",
            gpus(Box::new(|_, _| 0.0)),
        ),
        gauge("railscope_gpu_row_remap_failed", gpus(Box::new(|_, _| 0.0))),
        gauge(
            "railscope_ib_port_rate_gbps",
            ports(Box::new(
                move |t, _, r| if down(t, r) { 200.0 } else { 400.0 },
            )),
        ),
        gauge(
            "railscope_ib_port_width_lanes",
            ports(Box::new(move |t, _, r| if down(t, r) { 2.0 } else { 4.0 })),
        ),
        gauge("railscope_ib_port_state", ports(Box::new(|_, _, _| 4.0))),
        gauge(
            "railscope_ib_port_phys_state",
            ports(Box::new(|_, _, _| 5.0)),
        ),
        counter(
            "railscope_ib_port_xmit_bytes_total",
            ports(Box::new(|t, p, _| 5e9 * jitter(t, p, 0.03))),
        ),
        counter(
            "railscope_ib_port_rcv_bytes_total",
            ports(Box::new(|t, p, _| 5e9 * jitter(t, p + 17, 0.03))),
        ),
        counter(
            "railscope_ib_link_downed_total",
            ports(Box::new(|_, _, _| 0.0)),
        ),
        counter(
            "railscope_ib_symbol_error_total",
            ports(Box::new(|_, _, _| 0.0)),
        ),
    ]
}

#[test]
fn nothing_a_rule_a_straggler_measure_or_a_dashboard_view_reads_is_dropped() {
    let metrics = agent_fleet();
    let selection = select(&metrics, &config());
    let read = crate::reads::metrics_railscope_reads();
    let dropped: Vec<&str> = selection
        .dropped()
        .into_iter()
        .filter(|m| read.contains(m))
        .collect();
    assert!(
        dropped.is_empty(),
        "dropped what railscope reads: {dropped:?}"
    );
    let kept = selection.kept();
    for m in &metrics {
        if read.contains(m.name.as_str()) {
            assert!(kept.contains(&m.name.as_str()), "{} not kept", m.name);
        }
    }
    // What nothing reads is still dropped: the flat clock, the energy counter (the power's
    // shape).
    assert_eq!(
        selection.dropped(),
        [
            "railscope_gpu_energy_millijoules_total",
            "railscope_gpu_sm_clock_hertz"
        ]
    );
    let settings = selection.sampling_settings();
    for m in &read {
        assert!(!settings.contains(&format!("{m}:drop")), "{settings:?}");
    }
    // The report says why; width and rate share a shape (the retrained port) but both stay,
    // and neither the port bytes nor the width are advised as "like" anything.
    let text = selection.text();
    for line in [
        "  keep railscope_ib_port_width_lanes (kept: read by finding ib_port_degraded)\n",
        "  keep railscope_ib_port_rate_gbps (kept: read by finding ib_port_degraded, dashboard fleet view, dashboard job view)\n",
        "  keep railscope_ib_port_xmit_bytes_total (kept: read by stragglers, dashboard fleet view, dashboard job view, dashboard node view)\n",
        "  keep railscope_ib_link_downed_total (kept: read by finding ib_link_downed; failure counter)\n",
    ] {
        assert!(text.contains(line), "{line}{text}");
    }
    assert!(!text.contains("drop railscope_ib_"), "{text}");
    // What railscope reads keeps the agent's default cap: the port bytes, stable within
    // the tolerance all along, would otherwise be capped at 599 s.
    for m in [
        "railscope_ib_port_xmit_bytes_total",
        "railscope_ib_port_rate_gbps",
        "railscope_ib_link_downed_total",
    ] {
        assert!(settings.contains(&format!("{m}:on")), "{settings:?}");
    }
    assert!(
        settings
            .iter()
            .filter(|s| s.contains(":on,max="))
            .all(|s| !read.contains(s.split(':').next().unwrap())),
        "{settings:?}"
    );
}

/// Counters that stay at zero until something fails, none of them read by a rule.
const FAILURE_COUNTERS: &[&str] = &[
    "railscope_ib_port_rcv_errors_total",
    "railscope_ib_local_link_integrity_errors_total",
    "railscope_ib_excessive_buffer_overrun_errors_total",
    "railscope_ib_vl15_dropped_total",
    "railscope_ib_port_xmit_discards_total",
    "railscope_ib_out_of_sequence_total",
    "railscope_ib_packet_seq_err_total",
    "railscope_ib_local_ack_timeout_err_total",
    "railscope_ib_req_transport_retries_exceeded_total",
    "railscope_gpu_nvlink_errors_total",
    "railscope_gpu_pcie_replays_total",
    "railscope_gpu_remapped_rows_total",
];

#[test]
fn constant_error_counters_are_kept_without_keep() {
    let mut metrics = fleet();
    let zero = |_: u64| 0.0;
    for name in FAILURE_COUNTERS {
        metrics.push(trace(
            name,
            vec![(
                labels(&[("node", "n1".into()), ("device", "mlx5_0".into())]),
                Box::new(zero),
            )],
            600,
            true,
        ));
    }
    let selection = select(&metrics, &config());
    let dropped = selection.dropped();
    let kept = selection.kept();
    for name in FAILURE_COUNTERS {
        assert!(!dropped.contains(name), "{name} dropped: {dropped:?}");
        assert!(kept.contains(name), "{name} not kept: {kept:?}");
        assert_eq!(selection.protected_reason(name), Some("failure counter"));
    }
    // A counter that merely never ticked here, and a fixed clock, are still dropped.
    assert_eq!(
        selection.constant,
        [
            "railscope_gpu_sm_clock_hertz",
            "railscope_ib_multicast_xmit_packets_total"
        ]
    );
    // `--no-keep-failures`: the data decides again.
    let selection = select(
        &metrics,
        &SelectConfig {
            keep_failures: false,
            ..config()
        },
    );
    for name in FAILURE_COUNTERS {
        assert!(selection.constant.iter().any(|c| c == name), "{name}");
    }
}

/// A small deterministic shuffle (xorshift).
fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut x = seed.max(1);
    for i in (1..items.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        items.swap(i, (x % (i as u64 + 1)) as usize);
    }
}

#[test]
fn the_same_data_gives_the_same_groups_whatever_the_order_and_however_often() {
    let mut metrics = fleet();
    metrics.extend(agent_fleet());
    // The first GPU metric under another name too: a tie every time.
    let mut twin = metrics[0].clone();
    twin.name = "railscope_gpu_gpm_pcie_tx_bytes_per_second".into();
    metrics.push(twin);
    let first = select(&metrics, &config());
    for seed in 1..=8u64 {
        let mut shuffled = metrics.clone();
        shuffle(&mut shuffled, seed);
        for (i, m) in shuffled.iter_mut().enumerate() {
            shuffle(&mut m.series, seed * 31 + i as u64);
        }
        let again = select(&shuffled, &config());
        assert_eq!(again, first, "seed {seed}");
        assert_eq!(again.text(), first.text(), "seed {seed}");
        assert_eq!(select(&metrics, &config()), first);
    }
}

#[test]
fn flat_series_are_not_alike() {
    // Per node, two GPUs step in anti-phase and two ports wave in anti-phase: each metric
    // moves on every device, but compared per node (their only common label) both sums are
    // flat, and two flat lines have no shape to compare.
    let anti = |f: fn(u64) -> f64, on: &'static [(&'static str, &'static str)]| -> Vec<Shape> {
        let mut out: Vec<Shape> = Vec::new();
        for node in ["n1", "n2"] {
            for (i, (k, v)) in on.iter().enumerate() {
                let sign = if i == 0 { 1.0 } else { -1.0 };
                out.push((
                    labels(&[("node", node.into()), (k, v.to_string())]),
                    Box::new(move |t| 100.0 + sign * f(t)),
                ));
            }
        }
        out
    };
    let metrics = vec![
        trace(
            "railscope_gpu_memory_clock_hertz",
            anti(
                |t| if (t / 20) % 2 == 0 { 50.0 } else { -50.0 },
                &[("gpu", "0"), ("gpu", "1")],
            ),
            600,
            false,
        ),
        trace(
            "railscope_ib_port_xmit_packets_total",
            anti(
                |t| 40.0 * (t as f64 / 15.0).sin(),
                &[("device", "mlx5_0"), ("device", "mlx5_1")],
            ),
            600,
            true,
        ),
    ];
    let selection = select(&metrics, &config());
    assert!(selection.constant.is_empty());
    assert_eq!(
        selection.kept(),
        [
            "railscope_gpu_memory_clock_hertz",
            "railscope_ib_port_xmit_packets_total"
        ]
    );
    assert!(selection.groups.iter().all(|g| g.members.len() == 1));
    assert!(!selection.text().contains("like"), "{}", selection.text());

    // Nothing constant (`--min-variance 0`): two metrics that never move stay apart too.
    let flat = |name: &str, v: f64| {
        trace(
            name,
            vec![(
                labels(&[("node", "n1".into()), ("gpu", "0".into())]),
                Box::new(move |_| v),
            )],
            600,
            false,
        )
    };
    let selection = select(
        &[
            flat("railscope_gpu_sm_clock_hertz", 1.98e9),
            flat("railscope_gpu_memory_clock_hertz", 1.6e9),
        ],
        &SelectConfig {
            min_variance: 0.0,
            ..config()
        },
    );
    assert!(selection.dropped().is_empty(), "{}", selection.text());
    assert_eq!(selection.groups.len(), 2);
}

#[test]
fn the_fixtures_name_only_metrics_the_agent_sends() {
    for metric in fleet().iter().chain(&agent_fleet()) {
        assert!(
            monitor_wire::names::is_agent_metric(&metric.name),
            "{} is no metric the agent sends",
            metric.name
        );
    }
}

#[test]
fn every_reason_that_applies_is_given() {
    let config = SelectConfig {
        keep: vec!["railscope_ib_".into()],
        ..SelectConfig::new(0, 1, reads())
    };
    assert_eq!(
        reason("railscope_ib_link_downed_total", &config).unwrap(),
        "read by finding ib_link_downed; failure counter; --keep railscope_ib_"
    );
    assert_eq!(
        reason("railscope_ib_port_width_lanes", &config).unwrap(),
        "read by finding ib_port_degraded; --keep railscope_ib_"
    );
    assert_eq!(reason("railscope_gpu_sm_clock_hertz", &config), None);
    let config = SelectConfig {
        keep_failures: false,
        ..SelectConfig::new(0, 1, reads())
    };
    assert_eq!(reason("railscope_ib_port_rcv_errors_total", &config), None);
}
