//! A long NVML stand-in script (docs/nvml-standin.md): 8 H100-like GPUs in steady training,
//! one step per sweep of the agent, so a run of many sweeps does not end on a frozen last
//! step. Each step lists only what changes (utilization, power, energy, PCIe and NVLink
//! traffic, GPM, and temperature or memory when they move); counters grow by their rate times
//! the interval. About every five minutes a GPU waits a second or so for its data loader.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use crate::Rng;

/// Writes `dir/nvml-standin.json` and copies the stand-in library into `dir`; returns the
/// library's path there (the stand-in reads the script next to itself).
pub(crate) fn write(
    dir: &Path,
    standin: &Path,
    gpus: usize,
    steps: usize,
    interval_s: f64,
    seed: u64,
) -> std::io::Result<(PathBuf, u64)> {
    std::fs::create_dir_all(dir)?;
    let lib = dir.join("libnvml_standin.so");
    std::fs::copy(standin, &lib)?;
    let script = script(gpus, steps, interval_s, seed);
    let text = serde_json::to_string(&script).map_err(std::io::Error::other)?;
    std::fs::write(dir.join("nvml-standin.json"), &text)?;
    Ok((lib, text.len() as u64))
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

fn script(gpus: usize, steps: usize, interval_s: f64, seed: u64) -> Value {
    let mut rng = Rng::new(seed);
    let gpus: Vec<Value> = (0..gpus)
        .map(|g| {
            let uuid = format!(
                "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
                rng.below(1 << 32),
                rng.below(1 << 16),
                0x4000 | rng.below(1 << 12),
                0x8000 | rng.below(1 << 14),
                rng.below(1 << 48)
            );
            json!({
                "name": "NVIDIA H100 80GB HBM3",
                "uuid": uuid,
                "gpm_supported": true,
                "nvlink_links": 18,
                "steps": gpu_steps(&mut Rng::new(seed ^ ((g as u64 + 1) * 0x5851)), steps, interval_s),
            })
        })
        .collect();
    json!({
        "driver_version": "550.90.07",
        "defaults": {
            "mem_util_pct": 0, "memory_total_bytes": 85_520_809_984u64,
            "memory_reserved_bytes": 553_648_128u64, "mem_clock_mhz": 2619,
            "ecc_corrected_volatile": 0, "ecc_uncorrected_volatile": 0,
            "ecc_corrected_aggregate": 0, "ecc_uncorrected_aggregate": 0,
            "remapped_rows_corrected": 0, "remapped_rows_uncorrected": 0,
            "remap_pending": false, "remap_failure": false,
            "nvlink_crc_flit_errors": 0, "nvlink_crc_data_errors": 0,
            "nvlink_replay_errors": 0, "nvlink_recovery_errors": 0,
            "sm_clock_mhz": 1980, "throttle_reasons": [], "pcie_replays": 0,
        },
        "gpus": gpus,
    })
}

fn gpu_steps(rng: &mut Rng, steps: usize, dt: f64) -> Vec<Value> {
    let mut energy_mj: u64 = 4_812_000_000 + rng.below(1_000_000_000);
    let mut nvl_tx: u64 = 9_800_000_000 + rng.below(1_000_000_000);
    let mut nvl_rx: u64 = nvl_tx - rng.below(50_000_000);
    let mut temp: u32 = 60 + rng.below(6) as u32;
    // Data-loader stalls: about every 300 s, about 1.2 s long, at a phase of this GPU's own.
    let stall_every = 300.0;
    let stall_phase = rng.next_f64() * stall_every;
    let mut out = Vec::with_capacity(steps);
    for k in 0..steps {
        let t = k as f64 * dt;
        let stalled = (t + stall_phase) % stall_every < 1.2;
        let util: u32 = if stalled {
            rng.below(10) as u32
        } else {
            94 + rng.below(7) as u32
        };
        let busy = f64::from(util) / 100.0;
        let power_mw = (180_000.0 + 470_000.0 * busy + 40_000.0 * rng.next_f64()) as u32;
        energy_mj += (f64::from(power_mw) * dt) as u64;
        let nvl_rate = 1.22e8 * busy * (0.9 + 0.2 * rng.next_f64()); // KiB/s
        nvl_tx += (nvl_rate * dt) as u64;
        nvl_rx += (nvl_rate * dt * (0.98 + 0.04 * rng.next_f64())) as u64;
        let mut step = Map::new();
        let mut put = |k: &str, v: Value| {
            step.insert(k.to_owned(), v);
        };
        put("gpu_util_pct", util.into());
        put(
            "mem_util_pct",
            ((f64::from(util) * (0.45 + 0.12 * rng.next_f64())) as u32).into(),
        );
        put("power_mw", power_mw.into());
        put("energy_mj", energy_mj.into());
        put(
            "pcie_tx_kbps",
            ((1.1e6 * (0.75 + 0.5 * rng.next_f64())) as u32).into(),
        );
        put(
            "pcie_rx_kbps",
            ((0.95e6 * (0.75 + 0.5 * rng.next_f64())) as u32).into(),
        );
        put("nvlink_tx_kib", nvl_tx.into());
        put("nvlink_rx_kib", nvl_rx.into());
        // Temperature drifts by a degree now and then; memory moves with the allocator.
        if k == 0 || rng.next_f64() < 0.1 * dt {
            temp = (temp as i64 + rng.below(3) as i64 - 1).clamp(55, 78) as u32;
            put("temperature_c", temp.into());
        }
        if k == 0 || rng.next_f64() < 0.03 * dt {
            let mem_used = 77_800_000_000 + rng.below(200_000_000);
            put("memory_used_bytes", mem_used.into());
        }
        let sm = round2(if stalled {
            f64::from(util)
        } else {
            90.0 + 8.0 * rng.next_f64()
        });
        let tensor = round2(sm * (0.66 + 0.06 * rng.next_f64()));
        put(
            "gpm",
            json!({
                "sm_util": sm,
                "sm_occupancy": round2(sm * (0.48 + 0.04 * rng.next_f64())),
                "integer_util": round2(4.0 + 3.0 * rng.next_f64()),
                "any_tensor_util": tensor,
                "hmma_tensor_util": round2(tensor * 0.99),
                "dfma_tensor_util": 0.0,
                "imma_tensor_util": 0.0,
                "dram_bw_util": round2(busy * (55.0 + 13.0 * rng.next_f64())),
                "fp64_util": round2(0.2 * rng.next_f64()),
                "fp32_util": round2(busy * (12.0 + 2.0 * rng.next_f64())),
                "fp16_util": round2(busy * (23.0 + 3.0 * rng.next_f64())),
                "pcie_tx_per_sec": round2(1100.0 * (0.75 + 0.5 * rng.next_f64())),
                "pcie_rx_per_sec": round2(950.0 * (0.75 + 0.5 * rng.next_f64())),
                "nvlink_total_tx_per_sec": round2(nvl_rate / 1024.0),
                "nvlink_total_rx_per_sec": round2(nvl_rate / 1024.0 * 0.99),
            }),
        );
        out.push(Value::Object(step));
    }
    out
}
