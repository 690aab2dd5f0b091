//! `cargo xtask gpu-check` against the NVML stand-in (tests/nvml-standin: a scripted replay,
//! **not a GPU**) and a script standing in for nvidia-smi and dcgmi that prints what the
//! stand-in's scripted GPU would show: the check runs the real agent and listener, pairs
//! their readings with the script's rows, and reports every field the stand-in scripts as
//! matched. And on a machine without a GPU it says so and exits 0, writing nothing.

use std::{
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
};

const XTASK: &str = env!("CARGO_BIN_EXE_xtask");
const UUID: &str = "GPU-3f1c9a52-7d04-4e8b-9a61-0c5b2d7e8f13";
/// Seconds the check runs in the test, at a 1 s interval.
const SECONDS: u64 = 8;
const POWER_MW: u64 = 250_000;
const ENERGY0_MJ: u64 = 4_812_000_000;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "railscope-xtask-gpu-check-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `railscope` and the stand-in, built into the profile directory the xtask binary lies in
/// (cargo cannot name another package's binary or cdylib as a test's dependency); or, under
/// `cargo xtask test`, the ones its workspace build made (`RAILSCOPE_AGENT_BINARY`, the
/// stand-in beside it), which a `-p` build would make again with other features.
fn built() -> (PathBuf, PathBuf) {
    if let Some(agent) = std::env::var_os(monitor_testkit::fixture_agent::AGENT_BINARY_ENV) {
        let agent = PathBuf::from(agent);
        let standin = agent.with_file_name("libnvml_standin.so");
        assert!(
            agent.is_file() && standin.is_file(),
            "{} or {} is missing",
            agent.display(),
            standin.display()
        );
        return (agent, standin);
    }
    let profile_dir = Path::new(XTASK).parent().unwrap();
    let target_dir = profile_dir.parent().unwrap();
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev".to_owned(),
        Some(p) => p.to_owned(),
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "--package",
            "monitor-user",
            "--bin",
            "railscope",
        ])
        .args(["--package", "nvml-standin", "--lib", "--profile", &profile])
        .arg("--target-dir")
        .arg(target_dir)
        .current_dir(workspace_root())
        .status()
        .unwrap();
    assert!(
        status.success(),
        "building railscope and nvml-standin: {status}"
    );
    (
        profile_dir.join("railscope"),
        profile_dir.join("libnvml_standin.so"),
    )
}

/// One GPU whose values hold still, its energy counter growing at 250 W (one step per sweep,
/// one sweep a second), one XID at step 2.
fn standin_script() -> String {
    let steps: Vec<String> = (0..SECONDS + 30)
        .map(|k| {
            let energy = ENERGY0_MJ + k * POWER_MW;
            if k == 0 {
                format!(
                    r#"{{"gpu_util_pct": 37, "mem_util_pct": 12, "memory_total_bytes": 85520809984,
                    "memory_reserved_bytes": 536870912, "memory_used_bytes": 4294967296,
                    "sm_clock_mhz": 1980, "mem_clock_mhz": 2619, "temperature_c": 45,
                    "power_mw": {POWER_MW}, "energy_mj": {energy}, "throttle_reasons": ["gpu_idle"],
                    "pcie_link_gen": 5, "pcie_link_max_gen": 5, "pcie_link_width": 16,
                    "pcie_link_max_width": 16,
                    "ecc_corrected_volatile": 3, "ecc_uncorrected_volatile": 0,
                    "ecc_corrected_aggregate": 17, "ecc_uncorrected_aggregate": 1,
                    "remapped_rows_corrected": 2, "remapped_rows_uncorrected": 1,
                    "remap_pending": false, "remap_failure": false,
                    "gpm": {{"sm_util": 40.0, "sm_occupancy": 25.0, "any_tensor_util": 20.0,
                             "dram_bw_util": 30.0}}}}"#
                )
            } else {
                format!(r#"{{"energy_mj": {energy}}}"#)
            }
        })
        .collect();
    format!(
        r#"{{"driver_version": "550.90.07", "gpus": [{{"name": "NVIDIA H100 80GB HBM3",
        "uuid": "{UUID}", "gpm_supported": true, "xids": [{{"step": 2, "xid": 31}}],
        "steps": [{}]}}]}}"#,
        steps.join(",\n")
    )
}

/// What nvidia-smi would print for the scripted GPU (`-L`, `--help-query-gpu`, and
/// `--query-gpu=... --loop-ms=N` rows). It knows the newer `clocks_event_reasons.*` names and
/// not `pcie.link.gen.gpucurrent`, so the check's choice among field names is exercised.
fn fake_nvidia_smi() -> String {
    format!(
        r#"#!/bin/sh
# Stands in for nvidia-smi in xtask/tests/gpu_check.rs: the NVML stand-in's scripted GPU.
case "$1" in
  -L) echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: {UUID})"; exit 0 ;;
  --help-query-gpu)
    for f in index uuid pci.bus_id name serial vbios_version driver_version \
        utilization.gpu utilization.memory memory.total memory.reserved memory.used \
        memory.free clocks.sm clocks.mem temperature.gpu power.draw pcie.link.gen.current \
        pcie.link.gen.max pcie.link.width.current pcie.link.width.max \
        ecc.errors.corrected.volatile.total ecc.errors.uncorrected.volatile.total \
        ecc.errors.corrected.aggregate.total ecc.errors.uncorrected.aggregate.total \
        remapped_rows.correctable remapped_rows.uncorrectable remapped_rows.pending \
        remapped_rows.failure clocks_event_reasons.gpu_idle \
        clocks_event_reasons.applications_clocks_setting clocks_event_reasons.sw_power_cap \
        clocks_event_reasons.hw_slowdown clocks_event_reasons.sync_boost \
        clocks_event_reasons.sw_thermal_slowdown clocks_event_reasons.hw_thermal_slowdown \
        clocks_event_reasons.hw_power_brake_slowdown; do
      echo "\"$f\""
      echo "Description of $f."
    done
    exit 0 ;;
esac
q=""; ms=1000
for a in "$@"; do
  case "$a" in
    --query-gpu=*) q="${{a#--query-gpu=}}" ;;
    --loop-ms=*) ms="${{a#--loop-ms=}}" ;;
  esac
done
while :; do
  line=""
  IFS=,
  for f in $q; do
    case "$f" in
      index) v=0 ;;
      uuid) v={UUID} ;;
      pci.bus_id) v=00000000:18:00.0 ;;
      name) v="NVIDIA H100 80GB HBM3" ;;
      serial) v="[N/A]" ;;
      vbios_version) v=96.00.99.00.01 ;;
      driver_version) v=550.90.07 ;;
      utilization.gpu) v=37 ;;
      utilization.memory) v=12 ;;
      memory.total) v=81559 ;;
      memory.reserved) v=512 ;;
      memory.used) v=4096 ;;
      memory.free) v=76951 ;;
      clocks.sm) v=1980 ;;
      clocks.mem) v=2619 ;;
      temperature.gpu) v=45 ;;
      power.draw) v=250.00 ;;
      pcie.link.gen.current|pcie.link.gen.max) v=5 ;;
      pcie.link.width.current|pcie.link.width.max) v=16 ;;
      ecc.errors.corrected.volatile.total) v=3 ;;
      ecc.errors.uncorrected.volatile.total) v=0 ;;
      ecc.errors.corrected.aggregate.total) v=17 ;;
      ecc.errors.uncorrected.aggregate.total) v=1 ;;
      remapped_rows.correctable) v=2 ;;
      remapped_rows.uncorrectable) v=1 ;;
      remapped_rows.pending|remapped_rows.failure) v=No ;;
      clocks_event_reasons.gpu_idle) v=Active ;;
      clocks_event_reasons.*) v="Not Active" ;;
      *) v="[N/A]" ;;
    esac
    line="${{line:+$line, }}$v"
  done
  unset IFS
  echo "$line"
  sleep "$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))"
done
"#
    )
}

/// What `dcgmi dmon -e 1002,1003,1004,1005 -d MS` would print for the scripted GPM values.
const FAKE_DCGMI: &str = r##"#!/bin/sh
# Stands in for dcgmi in xtask/tests/gpu_check.rs: the NVML stand-in's scripted GPM values.
echo "#Entity   SMACT         SMOCC         TENSO         DRAMA"
echo "ID"
while :; do
  echo "GPU 0     0.400         0.250         0.200         0.300"
  sleep 1
done
"##;

fn executable(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The report's row of a metric (with its labels, as written) for GPU 0.
fn row<'a>(report: &'a str, metric: &str) -> &'a str {
    report
        .lines()
        .find(|l| l.starts_with(&format!("| 0 | `{metric}` |")))
        .unwrap_or_else(|| panic!("no row for {metric} in:\n{report}"))
}

#[test]
fn check_against_the_standin_matches_every_scripted_field() {
    let (railscope, standin) = built();
    let dir = scratch("standin");
    let lib = dir.join("libnvidia-ml.so.1");
    std::fs::copy(&standin, &lib).unwrap();
    std::fs::write(dir.join("nvml-standin.json"), standin_script()).unwrap();
    let smi = dir.join("nvidia-smi");
    executable(&smi, &fake_nvidia_smi());
    let dcgmi = dir.join("dcgmi");
    executable(&dcgmi, FAKE_DCGMI);
    let report_path = dir.join("gpu-check.md");
    let out = Command::new(XTASK)
        .args(["gpu-check", "--no-apt", "--seconds", &SECONDS.to_string()])
        .arg("--agent")
        .arg(&railscope)
        .arg("--nvml")
        .arg(&lib)
        .arg("--nvidia-smi")
        .arg(&smi)
        .arg("--dcgmi")
        .arg(&dcgmi)
        .arg("--out")
        .arg(&report_path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "gpu-check failed: {stderr}");
    let report = std::fs::read_to_string(&report_path).unwrap();
    assert!(
        report.contains("**This run checked railscope's NVML stand-in**"),
        "{report}"
    );
    assert!(report.contains(UUID), "{report}");
    for metric in [
        "railscope_gpu_utilization_ratio",
        "railscope_gpu_memory_utilization_ratio",
        "railscope_gpu_memory_total_bytes",
        "railscope_gpu_memory_reserved_bytes",
        "railscope_gpu_memory_used_bytes",
        "railscope_gpu_memory_free_bytes",
        "railscope_gpu_sm_clock_hertz",
        "railscope_gpu_memory_clock_hertz",
        "railscope_gpu_temperature_celsius",
        "railscope_gpu_power_watts",
        "railscope_gpu_energy_millijoules_total",
        "railscope_gpu_pcie_link_generation",
        "railscope_gpu_pcie_link_max_generation",
        "railscope_gpu_pcie_link_width_lanes",
        "railscope_gpu_pcie_link_max_width_lanes",
        "railscope_gpu_ecc_errors_total{type=corrected,scope=volatile}",
        "railscope_gpu_ecc_errors_total{type=uncorrected,scope=volatile}",
        "railscope_gpu_ecc_errors_total{type=corrected,scope=aggregate}",
        "railscope_gpu_ecc_errors_total{type=uncorrected,scope=aggregate}",
        "railscope_gpu_remapped_rows_total{type=corrected}",
        "railscope_gpu_remapped_rows_total{type=uncorrected}",
        "railscope_gpu_row_remap_pending",
        "railscope_gpu_row_remap_failed",
        "railscope_gpu_throttle_active{reason=gpu_idle}",
        "railscope_gpu_throttle_active{reason=sw_power_cap}",
        "railscope_gpu_sm_util_ratio",
        "railscope_gpu_sm_occupancy_ratio",
        "railscope_gpu_tensor_util_ratio",
        "railscope_gpu_dram_bw_util_ratio",
    ] {
        let line = row(&report, metric);
        assert!(line.contains("| matched |"), "{metric}: {line}");
    }
    // The newer throttle field name was chosen, the older one not asked.
    assert!(
        row(&report, "railscope_gpu_throttle_active{reason=gpu_idle}")
            .contains("`clocks_event_reasons.gpu_idle`")
    );
    // The XID the stand-in raised is reported; the kernel never saw it.
    assert!(report.contains("XID 31 on GPU 0"), "{report}");
    assert!(report.contains("0 differed"), "{report}");
}

#[test]
fn without_a_gpu_it_says_so_and_writes_nothing() {
    let dir = scratch("none");
    let report_path = dir.join("gpu-check.md");
    // An nvidia-smi that lists no GPU, as on a machine whose driver finds none.
    let smi = dir.join("nvidia-smi");
    executable(&smi, "#!/bin/sh\necho 'No devices were found'\nexit 6\n");
    for nvidia_smi in [smi.as_path(), Path::new("/nonexistent/nvidia-smi")] {
        let out = Command::new(XTASK)
            .args(["gpu-check", "--no-apt", "--agent", "/nonexistent/railscope"])
            .arg("--nvidia-smi")
            .arg(nvidia_smi)
            .arg("--out")
            .arg(&report_path)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{out:?}");
        assert!(
            stdout.starts_with("no NVIDIA GPU on this machine: nothing to check"),
            "{stdout}"
        );
        assert!(!report_path.exists());
    }
}
