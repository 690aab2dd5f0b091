//! The GPU source against the NVML stand-in (crate `nvml-standin`): a shared library that
//! exports the NVML functions the source calls and replays a scripted multi-GPU trace. It is
//! loaded through nvml-wrapper's real dynamic loading, as NVIDIA's library would be. No GPU is
//! involved anywhere.
//!
//! Finding the stand-in: it is a dev-dependency of this crate, so cargo builds its cdylib into
//! the same `target/<profile>/deps` directory as this test binary (`cargo build -p
//! nvml-standin` puts one in `target/<profile>` too, also looked at). Each test copies it into
//! a directory of its own as `libnvidia-ml.so.1`, with its script beside it as
//! `nvml-standin.json`: every copy is a separately loaded library with its own replay, so the
//! tests run in parallel.
//!
//! The stand-in's clock is the source's sweep: sweep n reads step n of the script.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    sync::mpsc::{self, Receiver},
    thread,
    time::Duration,
};

use monitor_testkit::JobProcesses;
use monitor_user::{
    sources::gpu::{
        GPM_MIN_INTERVAL, GpuEvent, GpuSource, LOST_AFTER_FAILED_SWEEPS, LOST_RETRY_EVERY_SWEEPS,
    },
    time_base::{MonoNs, TimeBase, monotonic_ns, realtime_ns},
};
use monitor_wire::{Kind, Reading, Value};
use serde_json::{Value as Json, json};

const STANDIN: &str = "libnvml_standin.so";
/// The stand-in's report of breaches of NVML's documented usage, next to the library
/// (`nvml_standin::state::REPORT_FILE`; the crate is not linked into this test).
const STANDIN_REPORT: &str = "nvml-standin.report";

fn standin_library() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps directory");
    let candidates = [deps.join(STANDIN), deps.join("..").join(STANDIN)];
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "the NVML stand-in is not built (looked for {candidates:?}): it is a \
                 dev-dependency of monitor-user, or run `cargo build -p nvml-standin`"
            )
        })
}

/// A private copy of the stand-in replaying `script`.
struct StandIn {
    dir: PathBuf,
}

impl StandIn {
    fn new(test: &str, script: &Json) -> StandIn {
        let dir = std::env::temp_dir().join(format!(
            "railscope-nvml-standin-{}-{test}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        fs::copy(standin_library(), dir.join("libnvidia-ml.so.1")).unwrap();
        fs::write(dir.join("nvml-standin.json"), script.to_string()).unwrap();
        StandIn { dir }
    }

    fn open(&self) -> GpuSource {
        GpuSource::open(Some(&self.dir.join("libnvidia-ml.so.1"))).expect("the stand-in loads")
    }

    /// What the stand-in reported of the caller breaching NVML's documented usage (e.g. GPM
    /// samples too close together), one line each.
    fn breaches(&self) -> Vec<String> {
        fs::read_to_string(self.dir.join(STANDIN_REPORT))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn uuid(i: usize) -> String {
    format!("GPU-5eed{i:04}-0000-4000-8000-00000000000{i}")
}

/// The readings of GPU `gpu`, keyed by series name plus its labels other than gpu and uuid,
/// checking on the way that each carries the GPU's uuid.
fn of_gpu(readings: &[Reading], gpu: usize, uuid: &str) -> BTreeMap<String, (Kind, Value)> {
    let mut out = BTreeMap::new();
    for r in readings {
        let labels = &r.series.labels;
        let index: usize = labels.get("gpu").expect("gpu label").parse().unwrap();
        if index != gpu {
            continue;
        }
        assert_eq!(labels.get("uuid"), Some(uuid), "{}", r.series.name);
        let extra: Vec<String> = labels
            .iter()
            .filter(|(k, _)| *k != "gpu" && *k != "uuid")
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let key = if extra.is_empty() {
            r.series.name.to_string()
        } else {
            format!("{}{{{}}}", r.series.name, extra.join(","))
        };
        let previous = out.insert(key.clone(), (r.series.kind, r.value));
        assert!(previous.is_none(), "{key} read twice in one sweep");
    }
    out
}

fn gpus_in(readings: &[Reading]) -> Vec<String> {
    let mut gpus: Vec<String> = readings
        .iter()
        .map(|r| r.series.labels.get("gpu").unwrap().to_string())
        .collect();
    gpus.sort();
    gpus.dedup();
    gpus
}

/// Events until `n` have arrived, then make sure no more come.
fn events(rx: &Receiver<GpuEvent>, n: usize) -> Vec<GpuEvent> {
    let mut got = Vec::new();
    while got.len() < n {
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(e) => got.push(e),
            Err(_) => panic!("expected {n} events, got {got:?}"),
        }
    }
    if let Ok(extra) = rx.recv_timeout(Duration::from_millis(600)) {
        panic!("one event too many: {extra:?} after {got:?}");
    }
    got
}

fn full_step(temperature: u32, energy_mj: u64) -> Json {
    json!({
        "gpu_util_pct": 97, "mem_util_pct": 55,
        "memory_total_bytes": 85_520_809_984_u64, "memory_reserved_bytes": 553_648_128,
        "memory_used_bytes": 77_846_282_240_u64,
        "sm_clock_mhz": 1980, "mem_clock_mhz": 2619,
        "temperature_c": temperature, "power_mw": 612_345, "energy_mj": energy_mj,
        "ecc_corrected_volatile": 3, "ecc_uncorrected_volatile": 1,
        "ecc_corrected_aggregate": 17, "ecc_uncorrected_aggregate": 2,
        "remapped_rows_corrected": 4, "remapped_rows_uncorrected": 1,
        "remap_pending": true, "remap_failure": false,
        "throttle_reasons": ["sw_power_cap"],
        "pcie_tx_kbps": 1_500_000, "pcie_rx_kbps": 1_200_000, "pcie_replays": 6,
        "pcie_link_gen": 4, "pcie_link_max_gen": 5, "pcie_link_width": 16,
        "pcie_link_max_width": 16,
        "nvlink_tx_kib": 1_000_003, "nvlink_rx_kib": 2_000_001,
        "nvlink_crc_flit_errors": 11, "nvlink_crc_data_errors": 12,
        "nvlink_replay_errors": 13, "nvlink_recovery_errors": 14
    })
}

#[test]
fn scripted_values_come_back_under_their_names_and_gpu_labels() {
    let script = json!({"gpus": [
        {"name": "stand-in A", "uuid": uuid(0), "nvlink_links": 4,
         "steps": [full_step(61, 5_000_000), {"temperature_c": 64, "energy_mj": 5_612_345}]},
        {"name": "stand-in B", "uuid": uuid(1),
         "steps": [{"gpu_util_pct": 12, "temperature_c": 40}]}
    ]});
    let standin = StandIn::new("values", &script);
    let mut source = standin.open();
    let names: Vec<(u32, &str, &str)> = source
        .gpus()
        .map(|g| (g.index, g.uuid.as_str(), g.name.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            (0, uuid(0).as_str(), "stand-in A"),
            (1, uuid(1).as_str(), "stand-in B")
        ]
    );

    let first = source.read(MonoNs(1_000));
    assert!(first.iter().all(|r| r.unix_ns == 1_000));
    let gauge = |v| (Kind::Gauge, v);
    let counter = |v| (Kind::Counter, v);
    let mut expected: BTreeMap<String, (Kind, Value)> = [
        ("railscope_gpu_utilization_ratio", gauge(Value::F64(0.97))),
        (
            "railscope_gpu_memory_utilization_ratio",
            gauge(Value::F64(0.55)),
        ),
        (
            "railscope_gpu_memory_total_bytes",
            gauge(Value::U64(85_520_809_984)),
        ),
        (
            "railscope_gpu_memory_reserved_bytes",
            gauge(Value::U64(553_648_128)),
        ),
        (
            "railscope_gpu_memory_used_bytes",
            gauge(Value::U64(77_846_282_240)),
        ),
        (
            "railscope_gpu_memory_free_bytes",
            gauge(Value::U64(7_120_879_616)),
        ),
        (
            "railscope_gpu_sm_clock_hertz",
            gauge(Value::U64(1_980_000_000)),
        ),
        (
            "railscope_gpu_memory_clock_hertz",
            gauge(Value::U64(2_619_000_000)),
        ),
        ("railscope_gpu_temperature_celsius", gauge(Value::U64(61))),
        ("railscope_gpu_power_watts", gauge(Value::F64(612.345))),
        (
            "railscope_gpu_energy_millijoules_total",
            counter(Value::U64(5_000_000)),
        ),
        (
            "railscope_gpu_pcie_tx_bytes_per_second",
            gauge(Value::U64(1_536_000_000)),
        ),
        (
            "railscope_gpu_pcie_rx_bytes_per_second",
            gauge(Value::U64(1_228_800_000)),
        ),
        ("railscope_gpu_pcie_replays_total", counter(Value::U64(6))),
        // A Gen5 link trained at Gen4.
        ("railscope_gpu_pcie_link_generation", gauge(Value::U64(4))),
        (
            "railscope_gpu_pcie_link_max_generation",
            gauge(Value::U64(5)),
        ),
        ("railscope_gpu_pcie_link_width_lanes", gauge(Value::U64(16))),
        (
            "railscope_gpu_pcie_link_max_width_lanes",
            gauge(Value::U64(16)),
        ),
        (
            "railscope_gpu_ecc_errors_total{scope=volatile,type=corrected}",
            counter(Value::U64(3)),
        ),
        (
            "railscope_gpu_ecc_errors_total{scope=volatile,type=uncorrected}",
            counter(Value::U64(1)),
        ),
        (
            "railscope_gpu_ecc_errors_total{scope=aggregate,type=corrected}",
            counter(Value::U64(17)),
        ),
        (
            "railscope_gpu_ecc_errors_total{scope=aggregate,type=uncorrected}",
            counter(Value::U64(2)),
        ),
        (
            "railscope_gpu_remapped_rows_total{type=corrected}",
            counter(Value::U64(4)),
        ),
        (
            "railscope_gpu_remapped_rows_total{type=uncorrected}",
            counter(Value::U64(1)),
        ),
        ("railscope_gpu_row_remap_pending", gauge(Value::U64(1))),
        ("railscope_gpu_row_remap_failed", gauge(Value::U64(0))),
        (
            "railscope_gpu_nvlink_errors_total{type=crc_flit}",
            counter(Value::U64(11)),
        ),
        (
            "railscope_gpu_nvlink_errors_total{type=crc_data}",
            counter(Value::U64(12)),
        ),
        (
            "railscope_gpu_nvlink_errors_total{type=replay}",
            counter(Value::U64(13)),
        ),
        (
            "railscope_gpu_nvlink_errors_total{type=recovery}",
            counter(Value::U64(14)),
        ),
        // Summed over the 4 links the stand-in splits the total across.
        (
            "railscope_gpu_nvlink_tx_bytes_total",
            counter(Value::U64(1_000_003 * 1024)),
        ),
        (
            "railscope_gpu_nvlink_rx_bytes_total",
            counter(Value::U64(2_000_001 * 1024)),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    for reason in [
        "gpu_idle",
        "applications_clocks_setting",
        "sw_power_cap",
        "hw_slowdown",
        "sync_boost",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
        "display_clock_setting",
    ] {
        let active = u64::from(reason == "sw_power_cap");
        expected.insert(
            format!("railscope_gpu_throttle_active{{reason={reason}}}"),
            gauge(Value::U64(active)),
        );
    }
    assert_eq!(of_gpu(&first, 0, &uuid(0)), expected);

    // GPU 1's script gives only utilization and temperature: the rest is not supported
    // there and absent, not zero.
    let b: Vec<String> = of_gpu(&first, 1, &uuid(1)).into_keys().collect();
    assert_eq!(
        b,
        [
            "railscope_gpu_memory_utilization_ratio",
            "railscope_gpu_temperature_celsius",
            "railscope_gpu_utilization_ratio"
        ]
    );

    // Step 1 changes two values; the others carry over.
    let second = of_gpu(&source.read(MonoNs(2_000)), 0, &uuid(0));
    expected.insert(
        "railscope_gpu_temperature_celsius".into(),
        gauge(Value::U64(64)),
    );
    expected.insert(
        "railscope_gpu_energy_millijoules_total".into(),
        counter(Value::U64(5_612_345)),
    );
    assert_eq!(second, expected);
}

#[test]
fn gpm_ratios_match_the_script_and_need_two_samples_100_ms_apart() {
    let gpm = |sm: f64, nvlink_mib: f64| {
        json!({"sm_util": sm, "sm_occupancy": 51.5, "integer_util": 6.25, "any_tensor_util": 70.5,
               "dfma_tensor_util": 0.0, "hmma_tensor_util": 69.75, "imma_tensor_util": 0.0,
               "fp64_util": 0.125, "fp32_util": 12.5, "fp16_util": 27.0, "dram_bw_util": 61.0,
               "pcie_tx_per_sec": 1400.5, "pcie_rx_per_sec": 1100.25,
               "nvlink_total_tx_per_sec": nvlink_mib, "nvlink_total_rx_per_sec": nvlink_mib - 1.0})
    };
    let script = json!({"gpus": [
        {"name": "stand-in GPM", "uuid": uuid(0), "gpm_supported": true,
         "steps": [{"gpu_util_pct": 40, "gpm": gpm(35.0, 9000.0)},
                   {"gpu_util_pct": 97, "gpm": gpm(94.5, 133_000.0)},
                   {"gpm": gpm(93.0, 134_000.0)},
                   {"gpm": gpm(92.25, 135_000.0)}]},
        {"name": "stand-in without GPM", "uuid": uuid(1), "gpm_supported": false,
         "steps": [{"gpu_util_pct": 50, "gpm": gpm(1.0, 1.0)}]}
    ]});
    let standin = StandIn::new("gpm", &script);
    let mut source = standin.open();
    let support: Vec<bool> = source.gpus().map(|g| g.gpm).collect();
    assert_eq!(support, [true, false]);
    let gpm_of = |readings: &[Reading], gpu| -> BTreeMap<String, Value> {
        of_gpu(readings, gpu, &uuid(gpu))
            .into_iter()
            .filter(|(name, (kind, _))| {
                *kind == Kind::Gauge
                    && (name.ends_with("_util_ratio")
                        || name.ends_with("_occupancy_ratio")
                        || name.starts_with("railscope_gpu_gpm_"))
            })
            .map(|(name, (_, v))| (name, v))
            .collect()
    };
    let expect = |sm: f64, nvlink_mib: f64| -> BTreeMap<String, Value> {
        let mib = 1_048_576.0;
        [
            ("railscope_gpu_sm_util_ratio", sm / 100.0),
            ("railscope_gpu_sm_occupancy_ratio", 51.5 / 100.0),
            ("railscope_gpu_integer_util_ratio", 6.25 / 100.0),
            ("railscope_gpu_tensor_util_ratio", 70.5 / 100.0),
            ("railscope_gpu_tensor_dfma_util_ratio", 0.0),
            ("railscope_gpu_tensor_hmma_util_ratio", 69.75 / 100.0),
            ("railscope_gpu_tensor_imma_util_ratio", 0.0),
            ("railscope_gpu_fp64_util_ratio", 0.125 / 100.0),
            ("railscope_gpu_fp32_util_ratio", 12.5 / 100.0),
            ("railscope_gpu_fp16_util_ratio", 27.0 / 100.0),
            ("railscope_gpu_dram_bw_util_ratio", 61.0 / 100.0),
            ("railscope_gpu_gpm_pcie_tx_bytes_per_second", 1400.5 * mib),
            ("railscope_gpu_gpm_pcie_rx_bytes_per_second", 1100.25 * mib),
            (
                "railscope_gpu_gpm_nvlink_tx_bytes_per_second",
                nvlink_mib * mib,
            ),
            (
                "railscope_gpu_gpm_nvlink_rx_bytes_per_second",
                (nvlink_mib - 1.0) * mib,
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), Value::F64(v)))
        .collect()
    };

    // Sweep 0: one sample, nothing to compare it with yet.
    let sweep0 = source.read(MonoNs(1));
    assert!(gpm_of(&sweep0, 0).is_empty());
    assert!(!of_gpu(&sweep0, 0, &uuid(0)).is_empty());
    thread::sleep(GPM_MIN_INTERVAL + Duration::from_millis(20));
    // Sweep 1: the interval ending at step 1.
    let sweep1 = source.read(MonoNs(2));
    assert_eq!(gpm_of(&sweep1, 0), expect(94.5, 133_000.0));
    assert!(gpm_of(&sweep1, 1).is_empty(), "GPU 1 has no GPM");
    assert_eq!(
        of_gpu(&sweep1, 1, &uuid(1)).get("railscope_gpu_utilization_ratio"),
        Some(&(Kind::Gauge, Value::F64(0.5)))
    );
    // Sweep 2 comes too soon after sweep 1: no GPM this time.
    let sweep2 = source.read(MonoNs(3));
    assert!(gpm_of(&sweep2, 0).is_empty());
    thread::sleep(GPM_MIN_INTERVAL + Duration::from_millis(20));
    // Sweep 3: the interval from sweep 1's sample to this one, ending at step 3.
    assert_eq!(gpm_of(&source.read(MonoNs(4)), 0), expect(92.25, 135_000.0));
    assert_eq!(standin.breaches(), Vec::<String>::new());
}

/// A GPM script of `steps` steps whose SM utilization is the step number.
fn gpm_counting_script(steps: usize) -> Json {
    let steps: Vec<Json> = (0..steps)
        .map(|i| json!({"gpu_util_pct": 50, "gpm": {"sm_util": i as f64}}))
        .collect();
    json!({"gpus": [{"name": "stand-in GPM", "uuid": uuid(0), "gpm_supported": true,
                     "steps": steps}]})
}

/// At `--interval 0.1` the poller sweeps every 100 ms: the source takes GPM samples only
/// when NVML's documented spacing (more than 100 ms) is kept, which the stand-in checks on
/// every `nvmlGpmMetricsGet`, and still reports GPM at least every other sweep.
#[test]
fn gpm_at_a_100_ms_interval_keeps_nvml_s_spacing() {
    const SWEEPS: u32 = 30;
    let standin = StandIn::new("gpm-100ms", &gpm_counting_script(SWEEPS as usize));
    let mut source = standin.open();
    let start = std::time::Instant::now();
    let mut with_gpm = Vec::new();
    for sweep in 0..SWEEPS {
        // As the poller's ticker does: sweep n at start + n x 100 ms.
        let due = start + GPM_MIN_INTERVAL * sweep;
        thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
        let readings = source.read(MonoNs(u64::from(sweep)));
        let sm = readings.iter().find_map(|r| {
            (r.series.name.as_ref() == "railscope_gpu_sm_util_ratio").then_some(r.value)
        });
        if let Some(sm) = sm {
            // The interval ending at this sweep's step.
            assert_eq!(sm, Value::F64(f64::from(sweep) / 100.0), "sweep {sweep}");
            with_gpm.push(sweep);
        }
    }
    assert_eq!(standin.breaches(), Vec::<String>::new());
    // Every sweep after the first that is more than 100 ms after the last sample: at a
    // 100 ms ticker, at least every other one.
    assert!(
        with_gpm.len() as u32 >= SWEEPS / 2 - 1,
        "GPM in sweeps {with_gpm:?} only"
    );
    assert!(
        with_gpm.windows(2).all(|w| w[1] - w[0] <= 2),
        "{with_gpm:?}"
    );
}

/// The stand-in's check itself: GPM samples taken back to back are refused and reported, as
/// a source that ignored NVML's spacing would be.
#[test]
fn the_stand_in_reports_gpm_samples_closer_than_nvml_documents() {
    use nvml_wrapper::{Nvml, enums::gpm::GpmMetricId, gpm::gpm_metrics_get};
    let standin = StandIn::new("gpm-breach", &gpm_counting_script(4));
    let nvml = Nvml::builder()
        .lib_path(standin.dir.join("libnvidia-ml.so.1").as_os_str())
        .init()
        .expect("the stand-in loads");
    let device = nvml.device_by_index(0).unwrap();
    let first = device.gpm_sample().unwrap();
    let second = device.gpm_sample().unwrap();
    assert!(gpm_metrics_get(&nvml, &first, &second, &[GpmMetricId::SmUtil]).is_err());
    let breaches = standin.breaches();
    assert_eq!(breaches.len(), 1, "{breaches:?}");
    assert!(
        breaches[0].starts_with("nvmlGpmMetricsGet: GPU 0 samples ")
            && breaches[0].ends_with("ms apart; NVML documents more than 100 ms"),
        "{}",
        breaches[0]
    );
    thread::sleep(GPM_MIN_INTERVAL + Duration::from_millis(10));
    let third = device.gpm_sample().unwrap();
    assert!(gpm_metrics_get(&nvml, &first, &third, &[GpmMetricId::SmUtil]).is_ok());
    assert_eq!(standin.breaches().len(), 1);
}

#[test]
fn every_scripted_xid_arrives_as_its_own_event() {
    let script = json!({"gpus": [
        {"name": "stand-in A", "uuid": uuid(0),
         "xids": [{"step": 1, "xid": 13}, {"step": 2, "xid": 48}, {"step": 2, "xid": 48}],
         "steps": [{"gpu_util_pct": 90}]},
        {"name": "stand-in B", "uuid": uuid(1),
         "xids": [{"step": 3, "xid": 31}],
         "steps": [{"gpu_util_pct": 91}]}
    ]});
    let standin = StandIn::new("xid", &script);
    let mut source = standin.open();
    let (tx, rx) = mpsc::channel();
    let thread = source.spawn_event_thread(tx).expect("XID events register");
    for sweep in 0..5 {
        let readings = source.read(MonoNs(sweep));
        assert!(
            readings.iter().all(|r| !r.series.name.contains("xid")),
            "an XID is an event, not a series"
        );
        assert_eq!(gpus_in(&readings), ["0", "1"]);
    }
    let got: Vec<(String, Option<u64>, String)> = events(&rx, 4)
        .iter()
        .map(|e| {
            assert!(
                e.unix_ns().0.abs_diff(realtime_ns().0) < 60_000_000_000,
                "{e:?}"
            );
            let labels = e.labels();
            (
                e.kind().to_string(),
                e.code(),
                labels.get("uuid").unwrap().to_string(),
            )
        })
        .collect();
    let xid = |code, gpu| ("xid".to_string(), Some(code), uuid(gpu));
    assert_eq!(got, [xid(13, 0), xid(48, 0), xid(48, 0), xid(31, 1)]);
    thread.stop();
}

#[test]
fn a_lost_gpu_sends_one_event_and_its_metrics_stop_while_the_others_go_on() {
    let temps = |base: u32| -> Vec<Json> {
        (0..6)
            .map(|s| json!({"gpu_util_pct": 95, "temperature_c": base + s}))
            .collect()
    };
    let script = json!({"gpus": [
        {"name": "stand-in A", "uuid": uuid(0), "steps": temps(50)},
        {"name": "stand-in B", "uuid": uuid(1), "lost_at_step": 2,
         "xids": [{"step": 2, "xid": 79}], "steps": temps(60)},
        {"name": "stand-in C", "uuid": uuid(2), "steps": temps(70)}
    ]});
    let standin = StandIn::new("lost", &script);
    let mut source = standin.open();
    let (tx, rx) = mpsc::channel();
    let _thread = source.spawn_event_thread(tx).expect("XID events register");
    let temperature = |readings: &[Reading], gpu| {
        of_gpu(readings, gpu, &uuid(gpu))
            .get("railscope_gpu_temperature_celsius")
            .map(|(_, v)| *v)
    };
    // Sweeps at the agent's real instants (CLOCK_MONOTONIC, as its poller passes them).
    let mut sweep_2_on_the_wall_clock = None;
    for sweep in 0..6_u32 {
        let now = monotonic_ns();
        if sweep == 2 {
            sweep_2_on_the_wall_clock = Some(TimeBase::global().unix_ns(now));
        }
        let readings = source.read(now);
        if sweep < 2 {
            assert_eq!(gpus_in(&readings), ["0", "1", "2"], "sweep {sweep}");
            assert_eq!(
                temperature(&readings, 1),
                Some(Value::U64((60 + sweep).into()))
            );
        } else {
            assert_eq!(gpus_in(&readings), ["0", "2"], "sweep {sweep}");
        }
        assert_eq!(
            temperature(&readings, 0),
            Some(Value::U64((50 + sweep).into()))
        );
        assert_eq!(
            temperature(&readings, 2),
            Some(Value::U64((70 + sweep).into()))
        );
    }
    // The XID from the event thread and the loss from the sweep, in either order; exactly
    // one loss however many sweeps follow.
    let mut got = events(&rx, 2);
    got.sort_by_key(|e| e.kind());
    assert!(
        matches!(&got[0], GpuEvent::Lost { gpu: 1, uuid: u, reason, .. }
            if *u == uuid(1) && reason.contains("lost")),
        "{got:?}"
    );
    // Stamped on the wall clock, at the sweep that found it (not the monotonic instant: a
    // GPU lost in 1970 opens no finding).
    let lost_at = got[0].unix_ns();
    assert_eq!(Some(lost_at), sweep_2_on_the_wall_clock, "{got:?}");
    assert!(
        lost_at.0.abs_diff(realtime_ns().0) < 60_000_000_000,
        "GPU lost at {lost_at:?}, now {:?}",
        realtime_ns()
    );
    let xid_at = got[1].unix_ns();
    assert!(
        xid_at.0.abs_diff(realtime_ns().0) < 60_000_000_000,
        "XID at {xid_at:?}, now {:?}",
        realtime_ns()
    );
    assert!(
        matches!(&got[1], GpuEvent::Xid { gpu: 1, xid: 79, uuid: u, .. } if *u == uuid(1)),
        "{got:?}"
    );
}

#[test]
fn a_gpu_failing_sweep_after_sweep_is_declared_lost_once() {
    let script = json!({"gpus": [
        {"name": "stand-in A", "uuid": uuid(0), "error_from_step": 1,
         "steps": [{"gpu_util_pct": 95}]},
        {"name": "stand-in B", "uuid": uuid(1), "steps": [{"gpu_util_pct": 96}]}
    ]});
    let standin = StandIn::new("failing", &script);
    let mut source = standin.open();
    let (tx, rx) = mpsc::channel();
    // Sweep 0 answers; sweeps 1.. fail. The loss comes with the LOST_AFTER_FAILED_SWEEPS-th
    // failure, before the event channel exists: it is held and sent when it is given.
    let failing = u64::from(LOST_AFTER_FAILED_SWEEPS);
    for sweep in 0..=failing + 2 {
        let readings = source.read(MonoNs(sweep));
        let expected: &[&str] = if sweep == 0 { &["0", "1"] } else { &["1"] };
        assert_eq!(gpus_in(&readings), expected, "sweep {sweep}");
        if sweep == failing + 1 {
            let _thread = source.spawn_event_thread(tx.clone()).unwrap();
        }
    }
    let got = events(&rx, 1);
    assert!(
        matches!(&got[0], GpuEvent::Lost { unix_ns, gpu: 0, reason, .. }
            if *unix_ns == TimeBase::global().unix_ns(MonoNs(failing))
                && reason.contains(&format!("{failing} sweeps in a row"))),
        "{got:?}"
    );
}

/// NVML failing for a GPU mid-run and coming back: the GPU is declared lost once, its
/// metrics stop while the other GPU's go on, and it is read again, from the step it is at,
/// once it answers a retry (one every `LOST_RETRY_EVERY_SWEEPS` sweeps).
#[test]
fn a_gpu_failing_mid_run_and_coming_back_is_read_again() {
    let first_error = 2u64;
    // Failures at steps first_error.. declare it lost at the LOST_AFTER_FAILED_SWEEPS-th;
    // the first retry meets one more failing step, the second an answer.
    let until = first_error + u64::from(LOST_AFTER_FAILED_SWEEPS) + 1;
    let steps: Vec<Json> = (0..=until + 2)
        .map(|step| json!({"gpu_util_pct": 10 + step}))
        .collect();
    let script = json!({"gpus": [
        {"name": "stand-in A", "uuid": uuid(0), "error_from_step": first_error,
         "error_until_step": until, "steps": steps},
        {"name": "stand-in B", "uuid": uuid(1), "steps": [{"gpu_util_pct": 96}]}
    ]});
    let standin = StandIn::new("comes-back", &script);
    let mut source = standin.open();
    let (tx, rx) = mpsc::channel();
    let _thread = source.spawn_event_thread(tx).unwrap();
    // Sweep n (from 0) is the source's (n+1)-th: retries happen at sweeps EVERY-1, 2*EVERY-1.
    let back_at = 2 * LOST_RETRY_EVERY_SWEEPS - 1;
    for sweep in 0..back_at + 3 {
        let readings = source.read(MonoNs(sweep));
        let expected: &[&str] = if sweep < first_error || sweep >= back_at {
            &["0", "1"]
        } else {
            &["1"]
        };
        assert_eq!(gpus_in(&readings), expected, "sweep {sweep}");
        if sweep == back_at {
            let util = readings
                .iter()
                .find(|r| {
                    &*r.series.name == "railscope_gpu_utilization_ratio"
                        && r.series.labels.get("gpu") == Some("0")
                })
                .map(|r| r.value);
            // The step it answered at: the one after the last failing one.
            assert_eq!(util, Some(Value::F64((10 + until) as f64 / 100.0)));
        }
    }
    let got = events(&rx, 1);
    assert!(
        matches!(&got[0], GpuEvent::Lost { gpu: 0, .. }),
        "expected one loss of GPU 0: {got:?}"
    );
}

#[test]
fn the_shipped_8_gpu_script_replays_as_an_8_gpu_node() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/nvml-standin/scripts/h100x8.json");
    let script: Json = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    let gpus = script["gpus"].as_array().unwrap();
    let standin = StandIn::new("h100x8", &script);
    let mut source = standin.open();
    assert_eq!(source.gpus().count(), 8);
    assert!(
        source
            .gpus()
            .all(|g| g.gpm && g.nvlink_links == 18 && g.name.contains("H100"))
    );
    let (tx, rx) = mpsc::channel();
    let _thread = source.spawn_event_thread(tx).expect("XID events register");

    let steps = gpus[0]["steps"].as_array().unwrap().len();
    let mut expected_events = Vec::new();
    for (i, gpu) in gpus.iter().enumerate() {
        for x in gpu["xids"].as_array().into_iter().flatten() {
            expected_events.push(("xid", i, x["xid"].as_u64()));
        }
        if gpu["lost_at_step"].is_u64() {
            expected_events.push(("gpu_lost", i, None));
        }
    }
    for sweep in 0..steps {
        let readings = source.read(MonoNs(sweep as u64));
        for (i, gpu) in gpus.iter().enumerate() {
            let lost = gpu["lost_at_step"]
                .as_u64()
                .is_some_and(|s| sweep as u64 >= s);
            let got = of_gpu(&readings, i, gpu["uuid"].as_str().unwrap());
            assert_eq!(got.is_empty(), lost, "GPU {i} sweep {sweep}");
            if lost {
                continue;
            }
            let step = &gpu["steps"][sweep];
            let util = step["gpu_util_pct"].as_u64().unwrap() as f64 / 100.0;
            assert_eq!(
                got["railscope_gpu_utilization_ratio"],
                (Kind::Gauge, Value::F64(util))
            );
            if sweep > 0 {
                let sm = step["gpm"]["sm_util"].as_f64().unwrap() / 100.0;
                assert_eq!(
                    got["railscope_gpu_sm_util_ratio"],
                    (Kind::Gauge, Value::F64(sm))
                );
            }
        }
        thread::sleep(GPM_MIN_INTERVAL + Duration::from_millis(10));
    }
    let mut got: Vec<(&str, usize, Option<u64>)> = events(&rx, expected_events.len())
        .iter()
        .map(|e| {
            let gpu = e.labels().get("gpu").unwrap().parse().unwrap();
            (e.kind(), gpu, e.code())
        })
        .collect();
    got.sort();
    expected_events.sort();
    assert_eq!(got, expected_events);
}

const POD_UID: &str = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";

/// A Slurm step's process and a Kubernetes pod's (monitor-testkit's [`JobProcesses`]: real
/// processes in cgroups where this host allows, else a `/proc`-like fixture).
fn job_processes(test: &str) -> JobProcesses {
    let paths = [
        "system.slice/slurmstepd.scope/job_42/step_0".to_owned(),
        format!(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-c1.scope",
            POD_UID.replace('-', "_")
        ),
    ];
    JobProcesses::new(test, &paths)
}

/// The `job_id` and `job_step` labels of GPU `gpu`'s readings: all the same, or a panic.
fn job_of_gpu(readings: &[Reading], gpu: &str) -> (Option<String>, Option<String>) {
    let jobs: std::collections::BTreeSet<(Option<String>, Option<String>)> = readings
        .iter()
        .filter(|r| r.series.labels.get("gpu") == Some(gpu))
        .map(|r| {
            let label = |k| r.series.labels.get(k).map(str::to_owned);
            (label("job_id"), label("job_step"))
        })
        .collect();
    assert_eq!(
        jobs.len(),
        1,
        "GPU {gpu}'s series disagree on the job: {jobs:?}"
    );
    jobs.into_iter().next().unwrap()
}

#[test]
fn gpu_series_carry_the_job_of_the_processes_using_the_gpu() {
    let procs = job_processes("gpu-jobs");
    let (slurm, pod) = (procs.pids[0], procs.pids[1]);
    let step =
        |processes: Json| json!({"gpu_util_pct": 90, "temperature_c": 60, "processes": processes});
    let script = json!({"gpus": [
        {"name": "NVIDIA H100", "uuid": uuid(0), "steps": [
            step(json!([{"pid": slurm, "memory_bytes": 10_000_000_000_u64}])),
            {"gpu_util_pct": 91},
            step(json!([{"pid": pod, "memory_bytes": 1_000}])),
            step(json!([])),
        ]},
        {"name": "NVIDIA H100", "uuid": uuid(1), "steps": [
            {"gpu_util_pct": 10, "temperature_c": 40},
            // Two jobs: the pod's process holds more memory (a graphics context, listed
            // by the other call).
            step(json!([
                {"pid": slurm, "memory_bytes": 1_000},
                {"pid": pod, "memory_bytes": 5_000, "graphics": true},
            ])),
        ]},
    ]});
    let standin = StandIn::new("gpu-jobs", &script);
    let mut source = standin
        .open()
        .with_jobs(monitor_user::sources::gpu::ProcessJobs::new(
            &procs.proc_root,
            Default::default(),
        ));
    let slurm_job = (Some("slurm:42".to_owned()), Some("0".to_owned()));
    let pod_job = (Some(format!("k8s:{POD_UID}")), None);
    let no_job = (None, None);
    let series_of = |readings: &[Reading], gpu: &str| -> std::collections::BTreeSet<String> {
        readings
            .iter()
            .filter(|r| r.series.labels.get("gpu") == Some(gpu))
            .map(|r| format!("{}{}", r.series.name, r.series.labels))
            .collect()
    };
    let ended = |source: &mut GpuSource| -> std::collections::BTreeSet<String> {
        source
            .take_ended_series()
            .iter()
            .map(|s| format!("{}{}", s.name, s.labels))
            .collect()
    };

    // Sweep 0: GPU 0 runs the Slurm step; GPU 1 lists no processes (not scripted: NVML
    // says not supported), so no job.
    let s0 = source.read(MonoNs(1));
    assert_eq!(job_of_gpu(&s0, "0"), slurm_job);
    assert_eq!(job_of_gpu(&s0, "1"), no_job);
    assert!(ended(&mut source).is_empty());
    // Sweep 1: GPU 0 unchanged, same series; GPU 1 taken by the pod: its unlabelled series
    // end, every one of them.
    let s1 = source.read(MonoNs(2));
    assert_eq!(job_of_gpu(&s1, "0"), slurm_job);
    assert_eq!(series_of(&s1, "0"), series_of(&s0, "0"));
    assert_eq!(job_of_gpu(&s1, "1"), pod_job);
    assert_eq!(ended(&mut source), series_of(&s0, "1"));
    // Sweep 2: GPU 0 moves to the pod: the Slurm step's series end.
    let s2 = source.read(MonoNs(3));
    assert_eq!(job_of_gpu(&s2, "0"), pod_job);
    assert_eq!(job_of_gpu(&s2, "1"), pod_job);
    assert_eq!(ended(&mut source), series_of(&s1, "0"));
    // Sweep 3: no process on GPU 0 any more: back to no job.
    let s3 = source.read(MonoNs(4));
    assert_eq!(job_of_gpu(&s3, "0"), no_job);
    assert_eq!(ended(&mut source), series_of(&s2, "0"));
    assert_eq!(standin.breaches(), Vec::<String>::new());
}

/// The agent end to end: a GPU whose scripted process belongs to a Slurm step and then goes
/// away. Its series carry the step's `job_id` while the process runs, the labelled series'
/// last sample is the last value read under the job, and new unlabelled series take over.
#[test]
fn the_agent_ends_a_gpu_s_job_series_when_the_job_leaves_the_gpu() {
    use monitor_wire::{Key, ReceiverState, SeriesData};
    let procs = job_processes("agent-gpu-jobs");
    if procs.proc_root != Path::new("/proc") {
        // The agent reads the real /proc: without cgroups of our own there is nothing to see
        // (GpuSource-level attribution is tested above with a /proc-like tree).
        eprintln!("skipped: no cgroup2 mount to put processes in");
        return;
    }
    // Steps 0-4: the Slurm step's process on GPU 0, utilization 10..50 %; from step 5 none,
    // 60 %, 70 %, ...
    let steps: Vec<Json> = (0..12)
        .map(|i| {
            let mut step = json!({"gpu_util_pct": 10 * (i + 1)});
            if i == 0 {
                step["processes"] = json!([{"pid": procs.pids[0], "memory_bytes": 1_000}]);
            }
            if i == 5 {
                step["processes"] = json!([]);
            }
            step
        })
        .collect();
    let script = json!({"gpus": [{"name": "NVIDIA H100", "uuid": uuid(0), "steps": steps}]});
    let standin = StandIn::new("agent-gpu-jobs", &script);
    let key_hex = "77".repeat(32);
    let key_path = standin.dir.join("wire.key");
    fs::write(&key_path, &key_hex).unwrap();
    fs::set_permissions(
        &key_path,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let collector = socket.local_addr().unwrap().to_string();
    let library = standin.dir.join("libnvidia-ml.so.1");
    let mut agent = std::process::Command::new(env!("CARGO_BIN_EXE_railscope"))
        .args(["agent", "--collector", &collector, "--node", "n1"])
        .args(["--interval", "0.2", "--flush", "0.4", "--no-adaptive"])
        .arg("--key")
        .arg(&key_path)
        .arg("--nvml-lib")
        .arg(&library)
        .arg("--sysfs")
        .arg(standin.dir.join("no-sysfs"))
        .arg("--spool-dir")
        .arg(standin.dir.join("spool"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut datagrams = Vec::new();
    let start = std::time::Instant::now();
    let mut buf = vec![0; 65_536];
    // 6 s at 0.2 s: ~30 sweeps; 8 are enough even on a loaded machine.
    while start.elapsed() < Duration::from_secs(6) {
        if let Ok(n) = socket.recv(&mut buf) {
            datagrams.push(buf[..n].to_vec());
        }
    }
    // SAFETY: a pid we own.
    unsafe { libc::kill(agent.id() as libc::pid_t, libc::SIGTERM) };
    agent.wait().unwrap();
    while let Ok(n) = socket.recv(&mut buf) {
        datagrams.push(buf[..n].to_vec());
    }

    // Utilization samples of GPU 0, by job label, in time order.
    let key = Key::from_bytes([0x77; 32]);
    let mut state = ReceiverState::default();
    let mut by_job: BTreeMap<String, Vec<(u64, f64)>> = BTreeMap::new();
    for d in &datagrams {
        let frame = monitor_wire::decode(d, &key, &mut state).expect("decodes");
        let node = state.node(&frame.node).unwrap();
        for s in &frame.samples {
            let series = node.series(s.id).expect("named");
            if &*series.name != "railscope_gpu_utilization_ratio" {
                continue;
            }
            let job = format!(
                "{}/{}",
                series.labels.get("job_id").unwrap_or("-"),
                series.labels.get("job_step").unwrap_or("-")
            );
            if let SeriesData::Gauge(points) = &s.data {
                by_job
                    .entry(job)
                    .or_default()
                    .extend(points.iter().map(|g| (g.end_unix_ns, g.mean)));
            }
        }
    }
    for points in by_job.values_mut() {
        points.sort_by_key(|p| p.0);
    }
    let values = |job: &str| -> Vec<f64> {
        by_job
            .get(job)
            .map(|p| p.iter().map(|(_, v)| (v * 100.0).round()).collect())
            .unwrap_or_default()
    };
    assert_eq!(
        by_job.keys().collect::<Vec<_>>(),
        ["-/-", "slurm:42/0"],
        "{by_job:?}"
    );
    assert_eq!(
        values("slurm:42/0"),
        [10.0, 20.0, 30.0, 40.0, 50.0],
        "every sweep under the job, the last one included"
    );
    let after = values("-/-");
    assert!(
        after.len() >= 3 && after[..3] == [60.0, 70.0, 80.0],
        "then unlabelled series from the next sweep on: {after:?}"
    );
    let last_labelled = by_job["slurm:42/0"].last().unwrap().0;
    assert!(by_job["-/-"].iter().all(|(t, _)| *t > last_labelled));
}

/// Every series name a real `railscope agent` sends in a few seconds on an HGX H100 node's
/// tree with the NVML stand-in answering the same GPUs.
fn names_a_real_agent_sends_on_an_hgx_node() -> std::collections::BTreeSet<String> {
    use monitor_testkit::{
        FixtureAgent, HgxNode, KEY_HEX, free_udp_port, key_file, scratch_dir, spawn_json_listener,
    };
    const RAILSCOPE: &str = env!("CARGO_BIN_EXE_railscope");
    let node = HgxNode::new(9);
    let dir = scratch_dir("agent-metrics-hgx");
    node.write(&dir.join("sys"));
    let lib = node.standin(&dir);
    let key = key_file(&dir, KEY_HEX);
    let port = free_udp_port();
    let listener = spawn_json_listener(RAILSCOPE, port, &key);
    thread::sleep(Duration::from_millis(300));
    let agent = FixtureAgent::new(&format!("127.0.0.1:{port}"), &key, &dir.join("sys"))
        .nvml_lib(&lib)
        .cadence("0.3", "1")
        .spawn(RAILSCOPE);
    thread::sleep(Duration::from_secs(3));
    let (agent_ok, _, agent_err) = agent.interrupt();
    thread::sleep(Duration::from_millis(300));
    let (_, frames, _) = listener.interrupt();
    assert!(agent_ok, "{agent_err}");
    let _ = fs::remove_dir_all(&dir);
    frames
        .lines()
        .map(|l| serde_json::from_str::<Json>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .flat_map(|f| f["samples"].as_array().cloned().unwrap_or_default())
        .filter_map(|s| s["name"].as_str().map(str::to_owned))
        .collect()
}

/// `monitor_wire::names::AGENT_METRICS` is exactly what the agent's sources send: every name
/// the GPU source (on the stand-in, GPM included), the IB source (on the fixture trees, taken
/// from real mlx5 and rxe adapters), the ethtool source's naming of mlx5's statistics, the
/// pipeline (version, verb counters) and a real agent on an HGX node's tree (the hardware
/// path) emit is in the list, and every name in the list is emitted by one of them (the state
/// report's own three
/// by its unit test). The one exception is the fixture's stand-in for a counter file new
/// firmware adds: passed through under the IB scheme, and in no list.
#[test]
fn every_name_the_agent_sends_is_in_agent_metrics_and_nothing_else_is() {
    use monitor_user::{
        pipeline::{VERB_SERIES, agent_info_series},
        sources::{ib_sysfs::IbSysfs, lldp},
    };
    use monitor_wire::names::{AGENT_METRICS, metric};
    use std::collections::BTreeSet;

    let script = json!({"gpus": [
        {"name": "stand-in A", "uuid": uuid(0), "nvlink_links": 4, "gpm_supported": true,
         "steps": [full_step(61, 5_000_000),
                   {"gpm": {"sm_util": 1.0, "sm_occupancy": 1.0, "integer_util": 1.0,
                            "any_tensor_util": 1.0, "dfma_tensor_util": 1.0,
                            "hmma_tensor_util": 1.0, "imma_tensor_util": 1.0, "fp64_util": 1.0,
                            "fp32_util": 1.0, "fp16_util": 1.0, "dram_bw_util": 1.0,
                            "pcie_tx_per_sec": 1.0, "pcie_rx_per_sec": 1.0,
                            "nvlink_total_tx_per_sec": 1.0, "nvlink_total_rx_per_sec": 1.0}}]}
    ]});
    let standin = StandIn::new("agent-metrics", &script);
    let mut source = standin.open();
    let mut sent: BTreeSet<String> = BTreeSet::new();
    let mut add = |readings: Vec<Reading>| {
        sent.extend(readings.into_iter().map(|r| r.series.name.to_string()));
    };
    add(source.read(MonoNs(1)));
    thread::sleep(GPM_MIN_INTERVAL + Duration::from_millis(20));
    add(source.read(MonoNs(2)));
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs");
    for tree in ["mlx5", "rxe", "broken"] {
        add(IbSysfs::new(fixtures.join(tree)).read(1));
    }
    // A 32-bit counter stuck at its maximum: its saturation flag.
    let saturated = std::env::temp_dir().join(format!(
        "railscope-agent-metrics-saturated-{}",
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&saturated);
    monitor_testkit::copy_tree(&fixtures.join("mlx5"), &saturated);
    fs::write(
        saturated.join("class/infiniband/mlx5_0/ports/1/counters/port_xmit_data"),
        "4294967295\n",
    )
    .unwrap();
    add(IbSysfs::new(saturated.clone()).read(1));
    let _ = fs::remove_dir_all(&saturated);
    // A RoCE port's LLDP neighbour, from lldpd's real output (tests/fixtures/lldp).
    let lldp = fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lldp/host-two-ports.json"),
    )
    .unwrap();
    let neighbours = lldp::parse_neighbours(&lldp, "host-two-ports.json").unwrap();
    let ports: Vec<lldp::PortNetdev> = neighbours
        .iter()
        .map(|n| lldp::PortNetdev {
            device: "rxe0".into(),
            port: 1,
            netdev: n.interface.clone(),
        })
        .collect();
    sent.extend(
        lldp::neighbour_series(&ports, &neighbours)
            .into_iter()
            .map(|s| s.name.to_string()),
    );
    // The mlx5 ethtool statistics the collector reads, as the ethtool source names and keeps
    // them among the many a ConnectX netdev prints (per-channel ones it leaves out); the
    // source itself reads a real veth's in tests/ethtool_netns.rs.
    let mut mlx5_stats: Vec<String> = metric::ETHTOOL_STATS
        .iter()
        .map(|s| s.to_string())
        .collect();
    for ch in 0..64 {
        mlx5_stats.extend([
            format!("rx{ch}_packets"),
            format!("tx{ch}_bytes"),
            format!("ch{ch}_events"),
        ]);
    }
    sent.extend(
        monitor_user::sources::ethtool::stat_names::kept(&mlx5_stats)
            .into_iter()
            .map(|(_, name)| name),
    );
    sent.insert(agent_info_series().name.to_string());
    sent.insert(VERB_SERIES.to_owned());
    // The hardware path, from a real agent on an HGX H100 node's tree with the stand-in
    // answering the same GPUs (monitor_testkit::hgx), as `railscope listen` decodes it.
    sent.extend(names_a_real_agent_sends_on_an_hgx_node());

    let unknown_firmware_counter = format!("{}roce_cc_future_event_total", metric::IB_PREFIX);
    assert!(sent.contains(&unknown_firmware_counter));
    let unlisted: Vec<&String> = sent
        .iter()
        .filter(|n| **n != unknown_firmware_counter && !AGENT_METRICS.contains(&n.as_str()))
        .collect();
    assert!(
        unlisted.is_empty(),
        "sent, but not in AGENT_METRICS: {unlisted:?}"
    );
    // Sent by the agent's own state report, and (the clock offset) only once a collector
    // answered with acknowledgement timings, which `railscope listen` does not: a real agent
    // publishing it is monitor-collector/tests/clock_offset.rs.
    let state_report = [
        metric::AGENT_ENTRIES,
        metric::AGENT_RSS_BYTES,
        metric::AGENT_BOUND_HITS_TOTAL,
        metric::AGENT_CLOCK_OFFSET_SECONDS,
        metric::AGENT_CLOCK_OFFSET_ERROR_SECONDS,
    ];
    let never_sent: Vec<&str> = AGENT_METRICS
        .iter()
        .copied()
        .filter(|n| !sent.contains(*n) && !state_report.contains(n))
        .collect();
    assert!(
        never_sent.is_empty(),
        "in AGENT_METRICS, but no source sends it: {never_sent:?}"
    );
}
