//! `cargo xtask gpu-check`: railscope's GPU readings next to NVIDIA's own tools on a machine
//! with a real NVIDIA driver.
//!
//! The agent runs against the machine's `libnvidia-ml.so.1` (or `--nvml`) for `--seconds`,
//! sending to `railscope listen --json` on loopback, at a fixed interval (`--no-adaptive`:
//! every reading is sent). Alongside, `nvidia-smi --query-gpu ... -lms` samples the same GPUs
//! at the same pace, `dcgmi dmon` the DCGM profiling fields where DCGM is installed (SM,
//! tensor and DRAM activity, against railscope's GPM metrics), and the kernel log is read
//! before and after for `NVRM: Xid` lines. The first half of the run is whatever the machine
//! is doing (idle on a quiet node); with `--load CMD` the second half runs that command.
//! Every metric railscope sent is then compared, per GPU, with its nvidia-smi field: gauges
//! at the nearest nvidia-smi row in time, the energy counter as its increase over the run
//! against the mean of `power.draw`, the ECC and remapped-row counters value for value. The
//! report, `bench/results/gpu-check.md` (or `--out`), says what matched, what differed and by
//! how much, and what could not be compared and why.
//!
//! On a machine without a GPU (no nvidia-smi, no GPU listed by `nvidia-smi -L`, or no
//! loadable NVML library) it prints that there is nothing to check and exits 0, writing
//! nothing: a committed report from a GPU machine is not replaced by a note from a laptop.
//!
//! On the GPU machine it needs only the built binaries and the driver (no network, no cargo):
//! `target/release/xtask gpu-check --agent target/release/railscope` runs it from binaries
//! built elsewhere. `--nvml` and `--nvidia-smi` exist for the test, which points them at the
//! NVML stand-in (`tests/nvml-standin`, a scripted replay, not a GPU) and a script printing
//! what the stand-in's GPU would show; the report then says it checked the stand-in.

use std::{
    collections::{BTreeMap, BTreeSet},
    ffi::{CString, OsStr},
    fmt::Write as _,
    fs,
    io::{BufRead as _, BufReader},
    os::unix::{ffi::OsStrExt as _, process::CommandExt as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::{
    build, cargo,
    scratch::{free_udp_port, write_key},
    setup,
};

/// What the check prints, and exits 0 with, where there is no GPU.
pub(crate) const NO_GPU: &str = "no NVIDIA GPU on this machine: nothing to check";

#[derive(Debug, clap::Args)]
pub(crate) struct Options {
    /// Seconds the agent runs: the first half as the machine is, the second under `--load`
    /// when given.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Seconds between the agent's reads and nvidia-smi's rows.
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
    /// The `railscope` binary to run (default: build it, release). With it nothing is built:
    /// `target/release/xtask gpu-check --agent target/release/railscope` on the GPU machine.
    #[arg(long, value_name = "PATH")]
    pub agent: Option<PathBuf>,
    /// The NVML library the agent loads and the check looks for (default: the system's
    /// libnvidia-ml.so.1). The test gives the NVML stand-in here.
    #[arg(long, value_name = "PATH")]
    pub nvml: Option<PathBuf>,
    /// The nvidia-smi to compare with.
    #[arg(long, value_name = "PATH", default_value = "nvidia-smi")]
    pub nvidia_smi: PathBuf,
    /// DCGM's dcgmi, for SM, tensor and DRAM activity against railscope's GPM metrics (left
    /// out when it cannot be run).
    #[arg(long, value_name = "PATH", default_value = "dcgmi")]
    pub dcgmi: PathBuf,
    /// A shell command run during the second half (a GPU load: a training step, gpu-burn,
    /// ...); killed at the end. Without it, the second half is whatever the machine does.
    #[arg(long, value_name = "CMD")]
    pub load: Option<String>,
    /// Where to write the report (default: bench/results/gpu-check.md in the workspace, or
    /// ./gpu-check.md when the workspace is not on this machine).
    #[arg(long, value_name = "PATH")]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub setup: setup::Options,
}

pub(crate) fn run(options: &Options) -> anyhow::Result<()> {
    let gpus = match detect(options) {
        Detected::None(why) => {
            println!("{NO_GPU} ({why})");
            return Ok(());
        }
        Detected::Gpus(gpus) => gpus,
    };
    setup::step(&format!("{} GPU(s): {}", gpus.len(), gpus.join("; ")));
    let agent = match &options.agent {
        Some(path) => path.clone(),
        None => build::railscope_binary(&setup::run(&options.setup)?, true)?,
    };
    let out_path = options.out.clone().unwrap_or_else(default_out);
    let collected = check(options, &agent)?;
    let interval_ns = (options.interval.max(0.1) * 1e9) as u64;
    let report = Report {
        rows: compare_all(&collected, interval_ns),
        collected,
    };
    if let Some(dir) = out_path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir)?;
    }
    fs::write(&out_path, report.markdown(options))?;
    let (matched, differed, other) = report.tally();
    setup::step(&format!(
        "{matched} matched, {differed} differed, {other} not comparable; wrote {}",
        out_path.display()
    ));
    Ok(())
}

fn default_out() -> PathBuf {
    let results = cargo::workspace_root().join("bench/results");
    if results.is_dir() {
        results.join("gpu-check.md")
    } else {
        PathBuf::from("gpu-check.md")
    }
}

enum Detected {
    None(String),
    /// `nvidia-smi -L`'s lines.
    Gpus(Vec<String>),
}

/// A GPU is there when nvidia-smi lists one and the NVML library loads.
fn detect(options: &Options) -> Detected {
    let listed = match Command::new(&options.nvidia_smi)
        .arg("-L")
        .stdin(Stdio::null())
        .output()
    {
        Err(e) => {
            return Detected::None(format!("{}: {e}", options.nvidia_smi.display()));
        }
        Ok(o) if !o.status.success() => {
            return Detected::None(format!(
                "`{} -L` failed ({}): {}{}",
                options.nvidia_smi.display(),
                o.status,
                String::from_utf8_lossy(&o.stdout).trim(),
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Ok(o) => String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.starts_with("GPU "))
            .map(str::to_owned)
            .collect::<Vec<_>>(),
    };
    if listed.is_empty() {
        return Detected::None(format!("`{} -L` lists none", options.nvidia_smi.display()));
    }
    let lib = options
        .nvml
        .clone()
        .unwrap_or_else(|| PathBuf::from("libnvidia-ml.so.1"));
    if let Err(e) = dlopen_check(&lib) {
        return Detected::None(format!("{} does not load: {e}", lib.display()));
    }
    Detected::Gpus(listed)
}

/// Whether the dynamic loader can load `lib` (unloaded again at once).
fn dlopen_check(lib: &Path) -> Result<(), String> {
    let name = CString::new(lib.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: a NUL-terminated path; the handle is closed before returning and nothing of the
    // library is called.
    unsafe {
        let handle = libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
        if handle.is_null() {
            let err = libc::dlerror();
            return Err(if err.is_null() {
                "dlopen failed".into()
            } else {
                std::ffi::CStr::from_ptr(err).to_string_lossy().into_owned()
            });
        }
        libc::dlclose(handle);
    }
    Ok(())
}

/// Whether `lib` is railscope's NVML stand-in (it names its script file).
fn is_standin(lib: &Path) -> bool {
    fs::read(lib).is_ok_and(|bytes| {
        bytes
            .windows(b"nvml-standin.json".len())
            .any(|w| w == b"nvml-standin.json")
    })
}

// ---------------------------------------------------------------------------------------------
// What is compared with what.

/// How a railscope series relates to an nvidia-smi field.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Compare {
    /// Gauge against the nearest row: |railscope − smi × scale| ≤ max(abs, rel × |smi × scale|).
    Gauge { scale: f64, abs: f64, rel: f64 },
    /// The same counter: railscope's value against the nearest row's, exactly.
    Counter,
    /// 0/1 against "Active"/"Not Active" or "Yes"/"No".
    Flag,
}

struct Mapping {
    metric: &'static str,
    /// Labels (besides `gpu`, `uuid` and job labels) that pick the series.
    labels: &'static [(&'static str, &'static str)],
    /// nvidia-smi's field; the first one this nvidia-smi knows is used.
    fields: &'static [&'static str],
    compare: Compare,
    why: &'static str,
}

const MIB: f64 = 1_048_576.0;

const fn gauge(scale: f64, abs: f64, rel: f64) -> Compare {
    Compare::Gauge { scale, abs, rel }
}

const fn map(
    metric: &'static str,
    labels: &'static [(&'static str, &'static str)],
    fields: &'static [&'static str],
    compare: Compare,
    why: &'static str,
) -> Mapping {
    Mapping {
        metric,
        labels,
        fields,
        compare,
        why,
    }
}

/// Every railscope GPU metric that nvidia-smi's `--query-gpu` also reports.
const MAPPINGS: &[Mapping] = &[
    map(
        "railscope_gpu_utilization_ratio",
        &[],
        &["utilization.gpu"],
        gauge(0.01, 0.10, 0.0),
        "both are NVML's utilization over its own sample period; rows up to half an interval apart",
    ),
    map(
        "railscope_gpu_memory_utilization_ratio",
        &[],
        &["utilization.memory"],
        gauge(0.01, 0.10, 0.0),
        "as utilization",
    ),
    map(
        "railscope_gpu_memory_total_bytes",
        &[],
        &["memory.total"],
        gauge(MIB, MIB, 0.0),
        "nvidia-smi rounds to MiB",
    ),
    map(
        "railscope_gpu_memory_reserved_bytes",
        &[],
        &["memory.reserved"],
        gauge(MIB, MIB, 0.0),
        "nvidia-smi rounds to MiB",
    ),
    map(
        "railscope_gpu_memory_used_bytes",
        &[],
        &["memory.used"],
        gauge(MIB, 64.0 * MIB, 0.02),
        "nvidia-smi rounds to MiB; allocations move between the two reads",
    ),
    map(
        "railscope_gpu_memory_free_bytes",
        &[],
        &["memory.free"],
        gauge(MIB, 64.0 * MIB, 0.02),
        "as memory used",
    ),
    map(
        "railscope_gpu_sm_clock_hertz",
        &[],
        &["clocks.sm", "clocks.current.sm"],
        gauge(1e6, 15e6, 0.05),
        "the clock moves with load and power between the two reads",
    ),
    map(
        "railscope_gpu_memory_clock_hertz",
        &[],
        &["clocks.mem", "clocks.current.memory"],
        gauge(1e6, 1e6, 0.01),
        "nvidia-smi prints whole MHz",
    ),
    map(
        "railscope_gpu_temperature_celsius",
        &[],
        &["temperature.gpu"],
        gauge(1.0, 2.0, 0.0),
        "the die warms and cools between the two reads",
    ),
    map(
        "railscope_gpu_power_watts",
        &[],
        &["power.draw.instant", "power.draw"],
        gauge(1.0, 5.0, 0.05),
        "both read NVML's power usage; under load it moves within a second",
    ),
    map(
        "railscope_gpu_pcie_link_generation",
        &[],
        &["pcie.link.gen.gpucurrent", "pcie.link.gen.current"],
        gauge(1.0, 0.0, 0.0),
        "an idle GPU lowers its link generation; both read the same NVML value",
    ),
    map(
        "railscope_gpu_pcie_link_max_generation",
        &[],
        &["pcie.link.gen.gpumax", "pcie.link.gen.max"],
        gauge(1.0, 0.0, 0.0),
        "fixed",
    ),
    map(
        "railscope_gpu_pcie_link_width_lanes",
        &[],
        &["pcie.link.width.current"],
        gauge(1.0, 0.0, 0.0),
        "as trained",
    ),
    map(
        "railscope_gpu_pcie_link_max_width_lanes",
        &[],
        &["pcie.link.width.max"],
        gauge(1.0, 0.0, 0.0),
        "fixed",
    ),
    map(
        "railscope_gpu_ecc_errors_total",
        &[("type", "corrected"), ("scope", "volatile")],
        &["ecc.errors.corrected.volatile.total"],
        Compare::Counter,
        "the same counter since the driver loaded",
    ),
    map(
        "railscope_gpu_ecc_errors_total",
        &[("type", "uncorrected"), ("scope", "volatile")],
        &["ecc.errors.uncorrected.volatile.total"],
        Compare::Counter,
        "the same counter since the driver loaded",
    ),
    map(
        "railscope_gpu_ecc_errors_total",
        &[("type", "corrected"), ("scope", "aggregate")],
        &["ecc.errors.corrected.aggregate.total"],
        Compare::Counter,
        "the GPU's lifetime counter",
    ),
    map(
        "railscope_gpu_ecc_errors_total",
        &[("type", "uncorrected"), ("scope", "aggregate")],
        &["ecc.errors.uncorrected.aggregate.total"],
        Compare::Counter,
        "the GPU's lifetime counter",
    ),
    map(
        "railscope_gpu_remapped_rows_total",
        &[("type", "corrected")],
        &["remapped_rows.correctable"],
        Compare::Counter,
        "rows remapped for correctable errors",
    ),
    map(
        "railscope_gpu_remapped_rows_total",
        &[("type", "uncorrected")],
        &["remapped_rows.uncorrectable"],
        Compare::Counter,
        "rows remapped for uncorrectable errors",
    ),
    map(
        "railscope_gpu_row_remap_pending",
        &[],
        &["remapped_rows.pending"],
        Compare::Flag,
        "a remap waiting for a GPU reset",
    ),
    map(
        "railscope_gpu_row_remap_failed",
        &[],
        &["remapped_rows.failure"],
        Compare::Flag,
        "a remap that failed",
    ),
    throttle!("gpu_idle"),
    throttle!("applications_clocks_setting"),
    throttle!("sw_power_cap"),
    throttle!("hw_slowdown"),
    throttle!("sync_boost"),
    throttle!("sw_thermal_slowdown"),
    throttle!("hw_thermal_slowdown"),
    throttle!("hw_power_brake_slowdown"),
];

/// One clock event reason: railscope's `railscope_gpu_throttle_active{reason}` against
/// nvidia-smi's field of the same name, under either of its two prefixes.
macro_rules! throttle {
    ($reason:literal) => {
        Mapping {
            metric: "railscope_gpu_throttle_active",
            labels: &[("reason", $reason)],
            fields: &[
                concat!("clocks_event_reasons.", $reason),
                concat!("clocks_throttle_reasons.", $reason),
            ],
            compare: Compare::Flag,
            why: "the clock event reason bit, read by both",
        }
    };
}
use throttle;

/// The energy counter, checked against the mean of `power.draw` over the same span.
const ENERGY: &str = "railscope_gpu_energy_millijoules_total";

/// GPM metrics against DCGM's profiling fields (`dcgmi dmon -e`): the field id, dcgmi's
/// column name, railscope's metric. DCGM reads the same hardware counters NVML's GPM does.
const DCGM: [(u32, &str, &str); 4] = [
    (1002, "SMACT", "railscope_gpu_sm_util_ratio"),
    (1003, "SMOCC", "railscope_gpu_sm_occupancy_ratio"),
    (1004, "TENSO", "railscope_gpu_tensor_util_ratio"),
    (1005, "DRAMA", "railscope_gpu_dram_bw_util_ratio"),
];
/// DCGM and GPM average over different windows: a ratio within this is a match.
const DCGM_TOLERANCE: f64 = 0.05;

/// Identity fields asked for besides the compared ones (the report's GPU table).
const IDENTITY: [&str; 7] = [
    "index",
    "uuid",
    "pci.bus_id",
    "name",
    "serial",
    "vbios_version",
    "driver_version",
];

/// Why nvidia-smi has no counterpart, for the metrics railscope sends that no row compares.
fn no_counterpart(metric: &str) -> &'static str {
    match metric {
        m if m.starts_with("railscope_gpu_pcie_tx") || m.starts_with("railscope_gpu_pcie_rx") => {
            "NVML's 20 ms PCIe throughput; only `nvidia-smi dmon -s t` shows it, not --query-gpu"
        }
        "railscope_gpu_pcie_replays_total" => {
            "no --query-gpu field (`nvidia-smi -q` shows it under PCIe replays)"
        }
        m if m.starts_with("railscope_gpu_nvlink") => {
            "NVLink counters: `nvidia-smi nvlink`, not --query-gpu"
        }
        m if m.starts_with("railscope_gpu_gpm_") => "GPM bandwidths: DCGM (dmon) only",
        m if DCGM.iter().any(|d| d.2 == m) => "GPM: compared with dcgmi where DCGM runs (not here)",
        _ => "GPM metric with no nvidia-smi field (DCGM profiling fields only)",
    }
}

// ---------------------------------------------------------------------------------------------
// Running.

/// One nvidia-smi row: when it arrived and its fields by name.
#[derive(Debug, Clone)]
struct SmiRow {
    unix_ns: u64,
    fields: BTreeMap<String, String>,
}

/// One dcgmi dmon row: when it arrived, the GPU index, and values by column name.
#[derive(Debug, Clone)]
struct DcgmRow {
    unix_ns: u64,
    gpu: String,
    values: BTreeMap<String, f64>,
}

/// One series railscope sent for one GPU.
#[derive(Debug, Clone, Default)]
struct Series {
    points: Vec<(u64, f64)>,
}

#[derive(Debug, Clone)]
struct Event {
    unix_ns: u64,
    kind: String,
    gpu: String,
    code: Option<i64>,
}

/// A series of one GPU: (uuid, metric, the picking labels, sorted).
type SeriesKey = (String, String, Vec<(String, String)>);

/// What a run collected.
struct Collected {
    series: BTreeMap<SeriesKey, Series>,
    /// uuid -> GPU index label.
    gpu_index: BTreeMap<String, String>,
    events: Vec<Event>,
    smi: Vec<SmiRow>,
    smi_fields: Vec<String>,
    smi_unknown: Vec<String>,
    smi_error: Option<String>,
    dcgm: Vec<DcgmRow>,
    dcgm_error: Option<String>,
    kernel_xids: Result<Vec<String>, String>,
    start_ns: u64,
    half_ns: u64,
    end_ns: u64,
    load: Option<String>,
    load_outcome: Option<String>,
    nvml: String,
    standin: bool,
    agent_log_tail: String,
    frames: usize,
}

fn unix_now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// A process in its own process group, so that it and its children can be signalled.
fn spawn_group(cmd: &mut Command) -> anyhow::Result<Child> {
    cmd.process_group(0)
        .spawn()
        .with_context(|| format!("failed to start {}", cargo::render(cmd)))
}

fn signal_group(child: &Child, signal: i32) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: kill has no memory preconditions; the group is the child's own.
        unsafe {
            libc::kill(-pid, signal);
        }
    }
}

/// Signals the child's group and waits up to `grace`, then kills it.
fn stop(child: &mut Child, signal: i32, grace: Duration) -> Option<std::process::ExitStatus> {
    signal_group(child, signal);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        thread::sleep(Duration::from_millis(50));
    }
    signal_group(child, libc::SIGKILL);
    child.wait().ok()
}

/// The fields this nvidia-smi knows (`--help-query-gpu` lists them quoted); `None` when it
/// does not say.
fn smi_known_fields(smi: &Path) -> Option<BTreeSet<String>> {
    let out = Command::new(smi)
        .arg("--help-query-gpu")
        .stdin(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // `"clocks.current.sm" or "clocks.sm"`: every quoted name of a line that starts with one.
    let known: BTreeSet<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with('"'))
        .flat_map(|l| l.split('"').skip(1).step_by(2).map(str::to_owned))
        .collect();
    (!known.is_empty()).then_some(known)
}

/// The fields to ask for, and those wanted that this nvidia-smi does not know.
fn smi_fields(known: Option<&BTreeSet<String>>) -> (Vec<String>, Vec<String>) {
    let mut wanted: Vec<&str> = IDENTITY.to_vec();
    let mut unknown = Vec::new();
    for m in MAPPINGS {
        match known {
            None => wanted.push(m.fields[m.fields.len() - 1]),
            Some(k) => match m.fields.iter().find(|f| k.contains(**f)) {
                Some(f) => wanted.push(f),
                None => unknown.push(m.fields.join(" / ")),
            },
        }
    }
    if known.is_none_or(|k| k.contains("power.draw")) {
        wanted.push("power.draw");
    }
    let mut seen = BTreeSet::new();
    wanted.retain(|f| seen.insert(*f));
    (wanted.into_iter().map(str::to_owned).collect(), unknown)
}

/// Splits one `--format=csv,noheader,nounits` line into the asked fields.
fn parse_smi_line(line: &str, fields: &[String], unix_ns: u64) -> Option<SmiRow> {
    let values: Vec<&str> = line.split(',').map(str::trim).collect();
    if values.len() != fields.len() {
        return None;
    }
    Some(SmiRow {
        unix_ns,
        fields: fields
            .iter()
            .cloned()
            .zip(values.into_iter().map(str::to_owned))
            .collect(),
    })
}

/// A field's value as a number: `[N/A]`, `[Not Supported]` and other words give `None`;
/// "Active"/"Yes" 1, "Not Active"/"No" 0.
fn smi_number(value: &str) -> Option<f64> {
    match value {
        "Active" | "Yes" | "Enabled" => Some(1.0),
        "Not Active" | "No" | "Disabled" => Some(0.0),
        v => v.parse().ok(),
    }
}

/// A dcgmi dmon data line: `GPU 0  0.123  0.456 ...` under a header naming the columns.
fn parse_dcgm_line(line: &str, columns: &[String], unix_ns: u64) -> Option<DcgmRow> {
    let mut words = line.split_whitespace();
    if words.next()? != "GPU" {
        return None;
    }
    let gpu = words.next()?.to_owned();
    let values = columns
        .iter()
        .zip(words)
        .filter_map(|(c, w)| w.parse::<f64>().ok().map(|v| (c.clone(), v)))
        .collect();
    Some(DcgmRow {
        unix_ns,
        gpu,
        values,
    })
}

/// `NVRM: Xid` lines of the kernel log.
fn kernel_xids() -> Result<Vec<String>, String> {
    let out = Command::new("dmesg")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("dmesg: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "dmesg failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("NVRM: Xid"))
        .map(str::to_owned)
        .collect())
}

/// Lines of a child's stdout, each stamped when it arrived, collected by a thread.
fn stamped_lines(child: &mut Child) -> Arc<Mutex<Vec<(u64, String)>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    if let Some(stdout) = child.stdout.take() {
        let sink = Arc::clone(&lines);
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let now = unix_now_ns();
                if let Ok(mut v) = sink.lock() {
                    v.push((now, line));
                }
            }
        });
    }
    lines
}

fn taken(lines: &Arc<Mutex<Vec<(u64, String)>>>) -> Vec<(u64, String)> {
    lines.lock().map(|v| v.clone()).unwrap_or_default()
}

fn check(options: &Options, agent: &Path) -> anyhow::Result<Collected> {
    let work = std::env::temp_dir().join(format!("railscope-gpu-check-{}", std::process::id()));
    if work.exists() {
        fs::remove_dir_all(&work)?;
    }
    let empty_sysfs = work.join("sys");
    fs::create_dir_all(&empty_sysfs)?;
    let key = write_key(&work)?;
    let interval = options.interval.max(0.1);
    let seconds = options.seconds.max(4);

    let known = smi_known_fields(&options.nvidia_smi);
    let (fields, smi_unknown) = smi_fields(known.as_ref());
    let xids_before = kernel_xids();

    let port = free_udp_port()?;
    let frames_path = work.join("frames.jsonl");
    let mut listener = spawn_group(
        Command::new(agent)
            .args(["listen", "--bind", "127.0.0.1", "--json", "--port"])
            .arg(port.to_string())
            .arg("--key")
            .arg(&key)
            .stdin(Stdio::null())
            .stdout(fs::File::create(&frames_path)?)
            .stderr(fs::File::create(work.join("listen.err"))?),
    )?;
    thread::sleep(Duration::from_millis(300));
    let mut agent_cmd = Command::new(agent);
    agent_cmd
        .args([
            "agent",
            "--node",
            "gpu-check",
            "--no-adaptive",
            "--collector",
        ])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--key")
        .arg(&key)
        .arg("--spool-dir")
        .arg(work.join("agent-spool"))
        // No IB: this checks the GPU source.
        .arg("--sysfs")
        .arg(&empty_sysfs)
        .args(["--interval", &interval.to_string(), "--flush", "1"])
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(work.join("agent.err"))?);
    if let Some(lib) = &options.nvml {
        agent_cmd.arg("--nvml-lib").arg(lib);
    }
    let start_ns = unix_now_ns();
    let mut agent_proc = spawn_group(&mut agent_cmd)?;

    let mut smi = spawn_group(
        Command::new(&options.nvidia_smi)
            .arg(format!("--query-gpu={}", fields.join(",")))
            .args(["--format=csv,noheader,nounits"])
            .arg(format!("-lms={}", (interval * 1000.0).round() as u64))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(fs::File::create(work.join("nvidia-smi.err"))?),
    )?;
    let smi_lines = stamped_lines(&mut smi);
    let ids: Vec<String> = DCGM.iter().map(|d| d.0.to_string()).collect();
    let mut dcgm = spawn_group(
        Command::new(&options.dcgmi)
            .args(["dmon", "-e", &ids.join(","), "-d"])
            .arg(((interval * 1000.0).round() as u64).to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
    .ok();
    let dcgm_lines = dcgm.as_mut().map(stamped_lines);

    setup::step(&format!(
        "the agent and nvidia-smi for {seconds} s ({})",
        match &options.load {
            Some(l) => format!("the second half under `{l}`"),
            None => "no --load: the second half as the first".into(),
        }
    ));
    let half = Duration::from_secs_f64(seconds as f64 / 2.0);
    thread::sleep(half);
    let half_ns = unix_now_ns();
    let mut load = match &options.load {
        Some(l) => Some(spawn_group(
            Command::new("sh")
                .args(["-c", l])
                .stdin(Stdio::null())
                .stdout(fs::File::create(work.join("load.out"))?)
                .stderr(fs::File::create(work.join("load.err"))?),
        )?),
        None => None,
    };
    thread::sleep(half);
    let end_ns = unix_now_ns();
    let load_outcome = load.as_mut().map(|l| match l.try_wait() {
        Ok(Some(status)) => format!("ended before the run did ({status})"),
        _ => {
            stop(l, libc::SIGTERM, Duration::from_secs(5));
            "ran to the end of the run (then stopped)".into()
        }
    });
    let agent_status = stop(&mut agent_proc, libc::SIGINT, Duration::from_secs(15));
    stop(&mut smi, libc::SIGTERM, Duration::from_secs(3));
    let dcgm_status = dcgm
        .as_mut()
        .map(|d| stop(d, libc::SIGTERM, Duration::from_secs(3)));
    thread::sleep(Duration::from_millis(500));
    stop(&mut listener, libc::SIGINT, Duration::from_secs(5));
    let xids_after = kernel_xids();

    let agent_log = fs::read_to_string(work.join("agent.err")).unwrap_or_default();
    // Its log lines (timestamped), not the table of probes it prints at start.
    let agent_log_tail = agent_log
        .lines()
        .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()))
        .rev()
        .take(15)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n");
    if !agent_status.is_some_and(|s| s.success()) {
        bail!("the agent exited with {agent_status:?}:\n{agent_log_tail}");
    }

    let smi_rows: Vec<SmiRow> = taken(&smi_lines)
        .into_iter()
        .filter_map(|(t, l)| parse_smi_line(&l, &fields, t))
        .collect();
    let smi_error = smi_rows.is_empty().then(|| {
        format!(
            "nvidia-smi printed no row it could parse: {}",
            fs::read_to_string(work.join("nvidia-smi.err"))
                .unwrap_or_default()
                .trim()
        )
    });
    let (dcgm_rows, dcgm_error) = match dcgm_lines {
        None => (
            Vec::new(),
            Some(format!("{} could not be run", options.dcgmi.display())),
        ),
        Some(lines) => {
            let lines = taken(&lines);
            let mut columns: Vec<String> = Vec::new();
            let mut rows = Vec::new();
            for (t, line) in &lines {
                if let Some(header) = line.strip_prefix('#') {
                    columns = header
                        .split_whitespace()
                        .skip(1)
                        .map(str::to_owned)
                        .collect();
                } else if let Some(row) = parse_dcgm_line(line, &columns, *t) {
                    rows.push(row);
                }
            }
            let error = rows.is_empty().then(|| {
                let said: String = lines
                    .iter()
                    .map(|(_, l)| l.as_str())
                    .take(3)
                    .collect::<Vec<_>>()
                    .join(" / ");
                format!(
                    "dcgmi dmon gave no rows ({}){}",
                    dcgm_status
                        .flatten()
                        .map_or("killed".into(), |s| s.to_string()),
                    if said.is_empty() {
                        String::new()
                    } else {
                        format!(": {said}")
                    }
                )
            });
            (rows, error)
        }
    };
    let kernel_xids = match (xids_before, xids_after) {
        (Ok(before), Ok(after)) => {
            let before: BTreeSet<String> = before.into_iter().collect();
            Ok(after.into_iter().filter(|l| !before.contains(l)).collect())
        }
        (Err(e), _) | (_, Err(e)) => Err(e),
    };

    let frames = fs::read_to_string(&frames_path)?;
    let mut collected = Collected {
        series: BTreeMap::new(),
        gpu_index: BTreeMap::new(),
        events: Vec::new(),
        smi: smi_rows,
        smi_fields: fields,
        smi_unknown,
        smi_error,
        dcgm: dcgm_rows,
        dcgm_error,
        kernel_xids,
        start_ns,
        half_ns,
        end_ns,
        load: options.load.clone(),
        load_outcome,
        nvml: options.nvml.as_ref().map_or_else(
            || "the system's libnvidia-ml.so.1".into(),
            |p| p.display().to_string(),
        ),
        standin: options.nvml.as_deref().is_some_and(is_standin),
        agent_log_tail,
        frames: 0,
    };
    collected.add_frames(&frames);
    let _ = fs::remove_dir_all(&work);
    Ok(collected)
}

/// The labels that pick a series of one GPU: all but the GPU's and the job's.
fn picking_labels(labels: &serde_json::Map<String, Value>) -> Vec<(String, String)> {
    let mut picking: Vec<(String, String)> = labels
        .iter()
        .filter(|(k, _)| matches!(k.as_str(), "type" | "scope" | "reason"))
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
        .collect();
    picking.sort();
    picking
}

impl Collected {
    fn add_frames(&mut self, jsonl: &str) {
        for line in jsonl.lines() {
            let Ok(frame) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            self.frames += 1;
            for s in frame["samples"].as_array().into_iter().flatten() {
                let Some(name) = s["name"]
                    .as_str()
                    .filter(|n| n.starts_with("railscope_gpu_"))
                else {
                    continue;
                };
                let empty = serde_json::Map::new();
                let labels = s["labels"].as_object().unwrap_or(&empty);
                let uuid = labels
                    .get("uuid")
                    .and_then(Value::as_str)
                    .unwrap_or("?")
                    .to_owned();
                if let Some(gpu) = labels.get("gpu").and_then(Value::as_str) {
                    self.gpu_index.insert(uuid.clone(), gpu.to_owned());
                }
                let series = self
                    .series
                    .entry((uuid, name.to_owned(), picking_labels(labels)))
                    .or_default();
                for p in s["points"].as_array().into_iter().flatten() {
                    let t = p["unix_ns"].as_u64().or_else(|| p["end_unix_ns"].as_u64());
                    let v = p["value"].as_f64().or_else(|| p["mean"].as_f64());
                    if let (Some(t), Some(v)) = (t, v) {
                        series.points.push((t, v));
                    }
                }
            }
            for e in frame["events"].as_array().into_iter().flatten() {
                let kind = e["kind"].as_str().unwrap_or_default();
                if kind == "xid" || kind == "gpu_lost" {
                    self.events.push(Event {
                        unix_ns: e["unix_ns"].as_u64().unwrap_or(0),
                        kind: kind.to_owned(),
                        gpu: e["labels"]["gpu"].as_str().unwrap_or("?").to_owned(),
                        code: e["code"].as_i64(),
                    });
                }
            }
        }
        for s in self.series.values_mut() {
            s.points.sort_by_key(|p| p.0);
            s.points.dedup_by_key(|p| p.0);
        }
    }

    /// The GPUs nvidia-smi reported, by uuid, with their identity fields.
    fn smi_gpus(&self) -> BTreeMap<String, BTreeMap<String, String>> {
        let mut gpus = BTreeMap::new();
        for row in &self.smi {
            if let Some(uuid) = row.fields.get("uuid") {
                gpus.entry(uuid.clone())
                    .or_insert_with(|| row.fields.clone());
            }
        }
        gpus
    }

    fn has_load(&self) -> bool {
        self.load.is_some()
    }

    fn phases(&self) -> Vec<(&'static str, u64, u64)> {
        if self.has_load() {
            vec![
                ("idle", self.start_ns, self.half_ns),
                ("load", self.half_ns, self.end_ns),
            ]
        } else {
            vec![("whole run", self.start_ns, self.end_ns)]
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Comparing.

#[derive(Debug, Clone, PartialEq)]
enum Verdict {
    Matched,
    Differed,
    NotComparable(String),
}

#[derive(Debug, Clone)]
struct Row {
    gpu: String,
    metric: String,
    labels: String,
    field: String,
    phase: &'static str,
    verdict: Verdict,
    pairs: usize,
    within: usize,
    median: f64,
    max: f64,
    tolerance: String,
    note: String,
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The nvidia-smi row of `uuid` nearest `t` within `max_ns`.
fn nearest<'a>(rows: &[&'a SmiRow], t: u64, max_ns: u64) -> Option<&'a SmiRow> {
    rows.iter()
        .min_by_key(|r| r.unix_ns.abs_diff(t))
        .filter(|r| r.unix_ns.abs_diff(t) <= max_ns)
        .copied()
}

/// Matched when at least 80 % of the pairs are within the tolerance.
fn judge(within: usize, pairs: usize) -> Verdict {
    if pairs == 0 {
        Verdict::NotComparable("no pair of readings close enough in time".into())
    } else if within * 5 >= pairs * 4 {
        Verdict::Matched
    } else {
        Verdict::Differed
    }
}

fn fmt_labels(labels: &[(String, String)]) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn compare_all(c: &Collected, interval_ns: u64) -> Vec<Row> {
    let smi_gpus = c.smi_gpus();
    let mut uuids: BTreeSet<String> = smi_gpus.keys().cloned().collect();
    uuids.extend(c.gpu_index.keys().cloned());
    let mut rows = Vec::new();
    for uuid in &uuids {
        let gpu = c
            .gpu_index
            .get(uuid)
            .cloned()
            .or_else(|| smi_gpus.get(uuid).and_then(|f| f.get("index").cloned()))
            .unwrap_or_else(|| "?".into());
        let gpu_rows: Vec<&SmiRow> = c
            .smi
            .iter()
            .filter(|r| r.fields.get("uuid") == Some(uuid))
            .collect();
        for m in MAPPINGS {
            let labels: Vec<(String, String)> = m
                .labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            let field = m
                .fields
                .iter()
                .find(|f| c.smi_fields.iter().any(|g| g == *f))
                .copied();
            // Sorted, as the frames' labels are.
            let mut key = labels.clone();
            key.sort();
            let series = c.series.get(&(uuid.clone(), m.metric.to_owned(), key));
            for (phase, from, to) in c.phases() {
                let mut row = Row {
                    gpu: gpu.clone(),
                    metric: m.metric.to_owned(),
                    labels: fmt_labels(&labels),
                    field: field.unwrap_or(m.fields[0]).to_owned(),
                    phase,
                    verdict: Verdict::Matched,
                    pairs: 0,
                    within: 0,
                    median: f64::NAN,
                    max: f64::NAN,
                    tolerance: tolerance_text(m.compare),
                    note: m.why.to_owned(),
                };
                row.verdict = match (field, series) {
                    (None, _) => Verdict::NotComparable("this nvidia-smi has no such field".into()),
                    (_, None) => Verdict::NotComparable(
                        "railscope sent no such series (NVML: not supported here)".into(),
                    ),
                    (Some(field), Some(series)) => {
                        let mut diffs = Vec::new();
                        let mut within = 0;
                        let mut unsupported = None;
                        for &(t, v) in series.points.iter().filter(|p| (from..to).contains(&p.0)) {
                            let Some(r) = nearest(&gpu_rows, t, interval_ns) else {
                                continue;
                            };
                            let raw = &r.fields[field];
                            let Some(smi) = smi_number(raw) else {
                                unsupported = Some(raw.clone());
                                continue;
                            };
                            let (d, ok) = match m.compare {
                                Compare::Gauge { scale, abs, rel } => {
                                    let want = smi * scale;
                                    let d = (v - want).abs();
                                    (d / scale, d <= abs.max(rel * want.abs()) + 1e-9)
                                }
                                Compare::Counter | Compare::Flag => {
                                    let d = (v - smi).abs();
                                    (d, d < 0.5)
                                }
                            };
                            diffs.push(d);
                            within += usize::from(ok);
                        }
                        row.pairs = diffs.len();
                        row.within = within;
                        row.max = diffs.iter().copied().fold(f64::NAN, f64::max);
                        row.median = median(diffs);
                        match (row.pairs, unsupported) {
                            (0, Some(raw)) => Verdict::NotComparable(format!(
                                "railscope reads it; nvidia-smi says {raw}"
                            )),
                            _ => judge(within, row.pairs),
                        }
                    }
                };
                rows.push(row);
            }
        }
        // The energy counter: its increase over each phase, as mean watts, against the mean of
        // power.draw over the same span.
        let power_field = ["power.draw", "power.draw.instant"]
            .into_iter()
            .find(|f| c.smi_fields.iter().any(|g| g == f));
        let series = c.series.get(&(uuid.clone(), ENERGY.to_owned(), Vec::new()));
        for (phase, from, to) in c.phases() {
            let mut row = Row {
                gpu: gpu.clone(),
                metric: ENERGY.into(),
                labels: String::new(),
                field: format!("mean {}", power_field.unwrap_or("power.draw")),
                phase,
                verdict: Verdict::Matched,
                pairs: 0,
                within: 0,
                median: f64::NAN,
                max: f64::NAN,
                tolerance: "10 % (or 5 W)".into(),
                note: "the counter's increase over the span, in W, against the mean power drawn"
                    .into(),
            };
            row.verdict = match (power_field, series) {
                (None, _) => Verdict::NotComparable("no power.draw field".into()),
                (_, None) => Verdict::NotComparable("railscope sent no energy counter".into()),
                (Some(field), Some(series)) => {
                    let pts: Vec<&(u64, f64)> = series
                        .points
                        .iter()
                        .filter(|p| (from..to).contains(&p.0))
                        .collect();
                    let watts: Vec<f64> = gpu_rows
                        .iter()
                        .filter(|r| (from..to).contains(&r.unix_ns))
                        .filter_map(|r| smi_number(&r.fields[field]))
                        .collect();
                    match (pts.first(), pts.last()) {
                        (Some(a), Some(b)) if b.0 > a.0 && !watts.is_empty() => {
                            let counted = (b.1 - a.1) / 1000.0 / ((b.0 - a.0) as f64 / 1e9);
                            let drawn = watts.iter().sum::<f64>() / watts.len() as f64;
                            let d = (counted - drawn).abs();
                            row.pairs = 1;
                            row.median = d;
                            row.max = d;
                            row.note = format!(
                                "counter: {counted:.1} W over {:.0} s; power.draw mean {drawn:.1} W over {} rows",
                                (b.0 - a.0) as f64 / 1e9,
                                watts.len()
                            );
                            let ok = d <= (0.10 * drawn.abs()).max(5.0);
                            row.within = usize::from(ok);
                            judge(row.within, 1)
                        }
                        _ => Verdict::NotComparable(
                            "too few readings in the span to take an increase".into(),
                        ),
                    }
                }
            };
            rows.push(row);
        }
        // GPM against DCGM.
        let index = smi_gpus
            .get(uuid)
            .and_then(|f| f.get("index").cloned())
            .unwrap_or_else(|| gpu.clone());
        let dcgm_rows: Vec<&DcgmRow> = c.dcgm.iter().filter(|r| r.gpu == index).collect();
        for (id, column, metric) in DCGM {
            let series = c.series.get(&(uuid.clone(), metric.to_owned(), Vec::new()));
            for (phase, from, to) in c.phases() {
                let mut row = Row {
                    gpu: gpu.clone(),
                    metric: metric.to_owned(),
                    labels: String::new(),
                    field: format!("dcgmi {id} ({column})"),
                    phase,
                    verdict: Verdict::Matched,
                    pairs: 0,
                    within: 0,
                    median: f64::NAN,
                    max: f64::NAN,
                    tolerance: format!("{DCGM_TOLERANCE} (ratio)"),
                    note: "DCGM and GPM read the same counters over different windows".into(),
                };
                row.verdict = match (&c.dcgm_error, series) {
                    (Some(e), _) => Verdict::NotComparable(e.clone()),
                    (None, None) => Verdict::NotComparable(
                        "railscope sent no such series (no GPM on this GPU)".into(),
                    ),
                    (None, Some(series)) => {
                        let mut diffs = Vec::new();
                        for &(t, v) in series.points.iter().filter(|p| (from..to).contains(&p.0)) {
                            let Some(r) = dcgm_rows
                                .iter()
                                .filter(|r| r.values.contains_key(column))
                                .min_by_key(|r| r.unix_ns.abs_diff(t))
                                .filter(|r| r.unix_ns.abs_diff(t) <= interval_ns)
                            else {
                                continue;
                            };
                            diffs.push((v - r.values[column]).abs());
                        }
                        row.pairs = diffs.len();
                        row.within = diffs.iter().filter(|d| **d <= DCGM_TOLERANCE).count();
                        row.max = diffs.iter().copied().fold(f64::NAN, f64::max);
                        row.median = median(diffs);
                        judge(row.within, row.pairs)
                    }
                };
                rows.push(row);
            }
        }
    }
    rows
}

fn tolerance_text(c: Compare) -> String {
    match c {
        Compare::Gauge { scale, abs, rel } => {
            let unit = |x: f64| {
                if (scale - MIB).abs() < 1.0 {
                    format!("{:.0} MiB", x / MIB)
                } else if (scale - 1e6).abs() < 1.0 {
                    format!("{:.0} MHz", x / 1e6)
                } else if (scale - 0.01).abs() < 1e-9 {
                    format!("{:.0} points", x / 0.01)
                } else {
                    format!("{x}")
                }
            };
            match (abs > 0.0, rel > 0.0) {
                (false, false) => "exact".into(),
                (true, false) => unit(abs),
                (false, true) => format!("{:.0} %", rel * 100.0),
                (true, true) => format!("{} or {:.0} %", unit(abs), rel * 100.0),
            }
        }
        Compare::Counter | Compare::Flag => "exact".into(),
    }
}

// ---------------------------------------------------------------------------------------------
// The report.

struct Report {
    collected: Collected,
    rows: Vec<Row>,
}

impl Report {
    fn tally(&self) -> (usize, usize, usize) {
        let count = |f: fn(&Verdict) -> bool| self.rows.iter().filter(|r| f(&r.verdict)).count();
        (
            count(|v| *v == Verdict::Matched),
            count(|v| *v == Verdict::Differed),
            count(|v| matches!(v, Verdict::NotComparable(_))),
        )
    }
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

fn num(x: f64) -> String {
    if x.is_nan() {
        "–".into()
    } else if x == x.trunc() && x.abs() < 1e12 {
        format!("{x:.0}")
    } else if x.abs() >= 100.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.3}")
    }
}

fn verdict_text(row: &Row) -> String {
    match &row.verdict {
        Verdict::Matched => "matched".into(),
        Verdict::Differed => format!(
            "**differed**: {} of {} pairs outside the tolerance",
            row.pairs - row.within,
            row.pairs
        ),
        Verdict::NotComparable(why) => format!("not comparable: {why}"),
    }
}

/// The command that reproduces a run, as given.
fn command_line(options: &Options) -> String {
    let mut cmd = String::from(if options.agent.is_some() {
        "xtask gpu-check"
    } else {
        "cargo xtask gpu-check"
    });
    let path = |p: &Path| p.display().to_string();
    if options.seconds != 60 {
        let _ = write!(cmd, " --seconds {}", options.seconds);
    }
    if (options.interval - 1.0).abs() > f64::EPSILON {
        let _ = write!(cmd, " --interval {}", options.interval);
    }
    for (flag, value) in [
        ("--agent", options.agent.as_deref().map(path)),
        ("--nvml", options.nvml.as_deref().map(path)),
        (
            "--nvidia-smi",
            (options.nvidia_smi != OsStr::new("nvidia-smi")).then(|| path(&options.nvidia_smi)),
        ),
        (
            "--dcgmi",
            (options.dcgmi != OsStr::new("dcgmi")).then(|| path(&options.dcgmi)),
        ),
        ("--load", options.load.as_ref().map(|l| format!("'{l}'"))),
    ] {
        if let Some(v) = value {
            let _ = write!(cmd, " {flag} {v}");
        }
    }
    cmd
}

impl Report {
    fn markdown(&self, options: &Options) -> String {
        let c = &self.collected;
        let mut md = String::new();
        let _ = writeln!(md, "# railscope's GPU readings against nvidia-smi\n");
        if c.standin {
            let _ = writeln!(
                md,
                "**This run checked railscope's NVML stand-in** (`tests/nvml-standin`, a scripted \
                 replay; docs/nvml-standin.md) against a script printing what its scripted GPU \
                 would show: it shows the check works, **not how any GPU or driver behaves**. \
                 On a GPU machine, run it without `--nvml` and `--nvidia-smi`.\n"
            );
        }
        let (matched, differed, other) = self.tally();
        let host = fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let _ = writeln!(md, "- Command: `{}`", command_line(options));
        let _ = writeln!(
            md,
            "- Date: {}; host `{}`, {}",
            crate::bench::utc_now(),
            host.trim(),
            crate::bench::host_cpu()
        );
        let _ = writeln!(md, "- NVML library: {}", c.nvml);
        let _ = writeln!(
            md,
            "- Run: {:.0} s, the agent at a {} s interval with adaptive sampling off (every \
             reading sent), nvidia-smi every {} ms; {} frames received",
            (c.end_ns - c.start_ns) as f64 / 1e9,
            options.interval,
            (options.interval * 1000.0).round(),
            c.frames
        );
        let _ = writeln!(
            md,
            "- Load: {}",
            match (&c.load, &c.load_outcome) {
                (Some(l), outcome) => format!(
                    "first half as the machine was (idle unless something else ran), second half \
                     under `{}` ({})",
                    cell(l),
                    outcome.as_deref().unwrap_or("?")
                ),
                (None, _) => "none given (`--load`): the whole run is whatever the machine was \
                     doing; on a quiet node that is idle only"
                    .into(),
            }
        );
        let _ = writeln!(
            md,
            "- Result: **{matched} matched, {differed} differed, {other} not comparable**\n"
        );

        let _ = writeln!(md, "## GPUs (nvidia-smi)\n");
        let _ = writeln!(
            md,
            "| index | name | uuid | PCI bus | serial | VBIOS | driver | railscope `gpu` label |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
        for (uuid, f) in c.smi_gpus() {
            let get = |k: &str| cell(f.get(k).map_or("–", String::as_str));
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                get("index"),
                get("name"),
                cell(&uuid),
                get("pci.bus_id"),
                get("serial"),
                get("vbios_version"),
                get("driver_version"),
                c.gpu_index
                    .get(&uuid)
                    .map_or("**not sent by railscope**".into(), ToString::to_string)
            );
        }
        for (uuid, gpu) in &c.gpu_index {
            if !c.smi_gpus().contains_key(uuid) {
                let _ = writeln!(
                    md,
                    "| – | **railscope only** | {} | – | – | – | – | {gpu} |",
                    cell(uuid)
                );
            }
        }
        if let Some(e) = &c.smi_error {
            let _ = writeln!(md, "\n{}", cell(e));
        }
        if !c.smi_unknown.is_empty() {
            let _ = writeln!(
                md,
                "\nFields this nvidia-smi does not know (`--help-query-gpu`): {}.",
                c.smi_unknown
                    .iter()
                    .map(|f| format!("`{f}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }

        if c.gpu_index.is_empty() {
            let _ = writeln!(
                md,
                "\n**railscope sent no GPU metric at all**: NVML did not start in the agent, or \
                 found no GPU; its log is at the end."
            );
        }
        let _ = writeln!(md, "\n## Every compared metric\n");
        let _ = writeln!(
            md,
            "Gauges are paired with the same GPU's nearest nvidia-smi row (at most one interval \
             away); a metric matched when at least 80 % of its pairs are within the tolerance. \
             |Δ| is in nvidia-smi's unit (%, MiB, MHz, °C, W, count). Counters (ECC, remapped \
             rows) are the same counters and must be equal; the energy counter's increase is \
             checked against the mean `power.draw`.\n"
        );
        let _ = writeln!(
            md,
            "| GPU | railscope metric | compared with | span | verdict | pairs | median \\|Δ\\| | max \\|Δ\\| | tolerance | note |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
        for r in &self.rows {
            let metric = if r.labels.is_empty() {
                format!("`{}`", r.metric)
            } else {
                format!("`{}{{{}}}`", r.metric, r.labels)
            };
            let _ = writeln!(
                md,
                "| {} | {metric} | `{}` | {} | {} | {} | {} | {} | {} | {} |",
                r.gpu,
                r.field,
                r.phase,
                cell(&verdict_text(r)),
                r.pairs,
                num(r.median),
                num(r.max),
                r.tolerance,
                cell(&r.note)
            );
        }

        let _ = writeln!(md, "\n## Events: XID and GPU lost\n");
        let xids: Vec<&Event> = c.events.iter().filter(|e| e.kind == "xid").collect();
        let lost: Vec<&Event> = c.events.iter().filter(|e| e.kind == "gpu_lost").collect();
        let listed = |events: &[&Event]| {
            if events.is_empty() {
                "none".to_owned()
            } else {
                events
                    .iter()
                    .map(|e| match e.code {
                        Some(code) if e.kind == "xid" => {
                            format!("XID {code} on GPU {} at {}", e.gpu, e.unix_ns)
                        }
                        _ => format!("GPU {} at {}", e.gpu, e.unix_ns),
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            }
        };
        let _ = writeln!(md, "- railscope's `xid` events: {}", listed(&xids));
        match &c.kernel_xids {
            Ok(lines) => {
                let _ = writeln!(
                    md,
                    "- The kernel log's new `NVRM: Xid` lines during the run: {}",
                    if lines.is_empty() {
                        "none".into()
                    } else {
                        lines
                            .iter()
                            .map(|l| format!("`{}`", cell(l.trim())))
                            .collect::<Vec<_>>()
                            .join("; ")
                    }
                );
                let verdict = if lines.len() == xids.len() {
                    if xids.is_empty() {
                        "matched (none raised: the XID path was not exercised; an XID cannot be \
                         raised on purpose without harming the GPU)"
                            .to_owned()
                    } else {
                        "matched: as many XIDs as the kernel logged".to_owned()
                    }
                } else if c.standin {
                    "differed, as expected: the stand-in's XIDs are scripted, the kernel never \
                     sees them"
                        .to_owned()
                } else {
                    format!(
                        "**differed**: railscope {}, the kernel log {} (NVML may report several \
                         XIDs before a wait as one, or XIDs of GPUs railscope does not watch)",
                        xids.len(),
                        lines.len()
                    )
                };
                let _ = writeln!(md, "- XID verdict: {verdict}");
            }
            Err(e) => {
                let _ = writeln!(
                    md,
                    "- The kernel log could not be read ({}): XIDs not comparable",
                    cell(e)
                );
            }
        }
        let _ = writeln!(
            md,
            "- railscope's `gpu_lost` events: {} (nvidia-smi listed {} GPU(s) throughout)",
            listed(&lost),
            c.smi_gpus().len()
        );

        let _ = writeln!(
            md,
            "\n## Sent by railscope with no nvidia-smi counterpart\n"
        );
        let compared: BTreeSet<&str> = MAPPINGS
            .iter()
            .map(|m| m.metric)
            .chain(DCGM.iter().map(|d| d.2).filter(|_| c.dcgm_error.is_none()))
            .chain([ENERGY])
            .collect();
        let mut others: BTreeMap<&str, usize> = BTreeMap::new();
        for (_, metric, _) in c.series.keys() {
            if !compared.contains(metric.as_str()) {
                *others.entry(metric.as_str()).or_default() += 1;
            }
        }
        if others.is_empty() {
            let _ = writeln!(md, "None.");
        } else {
            let _ = writeln!(md, "| metric | series | why |\n|---|---|---|");
            for (metric, n) in others {
                let _ = writeln!(md, "| `{metric}` | {n} | {} |", no_counterpart(metric));
            }
        }
        if let Some(e) = &c.dcgm_error {
            let _ = writeln!(
                md,
                "\nDCGM: {} — the GPM metrics were not compared with DCGM's profiling fields.",
                cell(e)
            );
        }
        let _ = writeln!(
            md,
            "\n## The agent's last log lines\n\n```\n{}\n```",
            c.agent_log_tail
        );
        md
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_smi_values() {
        assert_eq!(smi_number("41"), Some(41.0));
        assert_eq!(smi_number("123.45"), Some(123.45));
        assert_eq!(smi_number("[N/A]"), None);
        assert_eq!(smi_number("[Not Supported]"), None);
        assert_eq!(smi_number("Active"), Some(1.0));
        assert_eq!(smi_number("Not Active"), Some(0.0));
        assert_eq!(smi_number("No"), Some(0.0));
    }

    #[test]
    fn csv_rows_and_dcgm_rows() {
        let fields: Vec<String> = ["index", "uuid", "power.draw"].map(str::to_owned).to_vec();
        let row = parse_smi_line("0, GPU-abc, 123.45", &fields, 7).unwrap();
        assert_eq!(row.fields["uuid"], "GPU-abc");
        assert_eq!(row.fields["power.draw"], "123.45");
        assert!(parse_smi_line("0, GPU-abc", &fields, 7).is_none());
        let columns: Vec<String> = ["SMACT", "TENSO"].map(str::to_owned).to_vec();
        let row = parse_dcgm_line("GPU 1     0.400  N/A", &columns, 9).unwrap();
        assert_eq!(row.gpu, "1");
        assert_eq!(row.values.get("SMACT"), Some(&0.4));
        assert!(!row.values.contains_key("TENSO"));
        assert!(parse_dcgm_line("ID", &columns, 9).is_none());
    }

    #[test]
    fn fields_asked_follow_what_nvidia_smi_knows() {
        let known: BTreeSet<String> = IDENTITY
            .iter()
            .chain(&[
                "power.draw",
                "clocks_throttle_reasons.gpu_idle",
                "clocks.sm",
            ])
            .map(|s| (*s).to_owned())
            .collect();
        let (asked, unknown) = smi_fields(Some(&known));
        assert!(asked.contains(&"clocks_throttle_reasons.gpu_idle".to_owned()));
        assert!(!asked.iter().any(|f| f.starts_with("clocks_event_reasons")));
        assert!(unknown.iter().any(|f| f.contains("memory.used")));
        assert_eq!(asked.iter().filter(|f| *f == "power.draw").count(), 1);
    }

    #[test]
    fn no_gpu_when_nvidia_smi_is_missing() {
        let options = Options {
            seconds: 1,
            interval: 1.0,
            agent: None,
            nvml: None,
            nvidia_smi: "/nonexistent/nvidia-smi".into(),
            dcgmi: "dcgmi".into(),
            load: None,
            out: None,
            setup: setup::Options { no_apt: true },
        };
        assert!(matches!(detect(&options), Detected::None(_)));
    }
}
