//! The collector's judgement on data shaped by **real agents** (issue 28): seven
//! `railscope agent` processes (`node-001`..`node-007`) with their defaults — 1 s interval,
//! 10 s flush, adaptive sampling on, so a stable series is sent about every 30 s, out of phase
//! with the others, and the two directions of a port at different times — each on its own
//! copy of the mlx5 fixture sysfs tree (4 IB ports, 4X NDR 400 Gb/s, all built from the
//! fixture's `mlx5_0`) and its own NVML stand-in with a generated 8-GPU script, send to one
//! `railscope-collector run`.
//!
//! A thread of the test rewrites the ports' counter files in place as time passes: every port
//! of the fleet carries 20 GB/s each way (`port_xmit_data`/`port_rcv_data`, ±0.5% per port),
//! every port sends 50 CNP/s (`hw_counters/np_cnp_sent`), and the faults below count up.
//!
//! Two jobs, through both documented routes (docs/agent.md, "Jobs"): job A,
//! `slurm:4242`, a real process in a Slurm-shaped cgroup (`.../slurmstepd.scope/job_4242/
//! step_0`) listed by the stand-in on every GPU of nodes 1-4; job B, `trainer:7`, a real
//! process in `.../trainer/run-7/rank-0`, named by a `[[jobs.patterns]]` rule of the agent.toml
//! every agent gets with `--config`, on nodes 5-7 (all GPUs but node 7's GPU 7, which is idle
//! and in no job).
//!
//! Known faults, one or more per rule the fixture path can produce:
//!
//! | node | device | fault | expected |
//! |---|---|---|---|
//! | 2 | GPU 3 | SM activity 0.54 (peers ~0.93), tensor and DRAM low, `hw_thermal_slowdown` | `gpu_thermal_throttle`; a GPU straggler of job A caused by it |
//! | 2 | mlx5_1/1 | trained down to 2X 200 Gb/s, half its peers' traffic, 20 symbol errors/s | `ib_port_degraded`, `ib_symbol_errors` (critical: over 120 an hour); a port straggler of job A caused by the most severe, the symbol errors |
//! | 3 | GPU 7 | XID 79 at step 19, lost (`GPU_IS_LOST`) from step 20 | `gpu_xid` critical, `gpu_lost` dated within the run; `device_missing` (NVML counts 7 GPUs where the class has 8: the golden profile) |
//! | 3 | mlx5_3/1 | `link_downed` rises by one 10 s in | `ib_link_downed` |
//! | 4 | GPU 0 | XID 43 | `gpu_xid`, info (the table's IGNORE bucket: still recorded, no code is dropped) |
//! | 4 | GPU 6 | PCIe Gen4 of Gen5 while busy | `gpu_pcie_degraded` |
//! | 5 | GPU 0 | `hw_power_brake_slowdown` (activity normal) | `gpu_power_throttle` |
//! | 5 | mlx5_2/1 | DOWN / Polling before the agent starts | `ib_port_down` (from the agent's first frames); `ib_phys_state` (after its 25 s grace); `device_missing` (3 active ports where the fleet's class has 4: the golden profile); a port straggler of job B caused by the first |
//! | 6 | GPU 1 | XID 94 | `gpu_xid` critical |
//! | 6 | GPU 4 | one uncorrected volatile ECC error from step 6 | `gpu_ecc_uncorrected` |
//! | 6 | mlx5_0/1 | 30 link error recoveries/min | `ib_link_error_recovery` |
//! | 7 | GPU 5, 6 | row remapping pending; failed | `gpu_row_remap_pending`, `gpu_row_remap_failed` |
//! | 7 | mlx5_0/1 | 20,000 CNP/s sent, the fleet's 50 | `roce_congestion` |
//!
//! Decoys, which docs/findings.md says are not findings: node 1 GPU 2 at its power cap
//! (`sw_power_cap`, 700 W); node 1 GPU 5 with corrected remapped rows and no remapping
//! pending; node 2 GPU 0 counting corrected ECC errors; node 5 GPU 5 hot (84 °C) without a
//! throttle flag; node 7 GPU 7 idle at PCIe Gen3 (an idle GPU lowers its link); the fixture's
//! constant non-zero `symbol_error` (3) and `link_downed` (1) on every port; node 6 mlx5_1
//! counting a symbol error every 10 s (0.1/s, under 120/h); node 4 mlx5_2 a link error
//! recovery every 30 s (2/min, under 5); node 7 mlx5_3 idle (no traffic) but ACTIVE at full
//! width — no finding, but a straggler of job B with no cause (`null`), as the docs define a
//! straggler by activity alone.
//!
//! Asserted over repeated refreshes (every 5 s for 60 s, once every finding has opened): the
//! findings are exactly the expected ones (rule, node, port or GPU, severity), each active with
//! one stable id, none other ever opened, every start within the run; the stragglers of each
//! job over the last 60 s are exactly the expected ones, with their metric, value near the
//! device's true activity, and cause. Then `railscope-collector select` on the fleet's data
//! advises dropping nothing a finding rule, the straggler search or a dashboard view reads,
//! and the dashboard in headless Chromium marks exactly the active findings' cells, draws the
//! lost GPU lost and the trained-down port degraded, and lists job A's findings in its view.
//!
//! Not covered here: `ib_link_flapping` (from the kernel's port events, which the eBPF probes
//! report: a fixture tree has none) and the verb rules (`verbs_qp_error`, `verbs_cm_reject`,
//! which need the probes on real RDMA traffic); both are proven by the QEMU guest scenarios
//! (`cargo xtask vm-test`) and by `findings_stragglers.rs` on simulated frames.
//!
//! Needs real processes in real cgroups (root and a cgroup2 mount, as `cargo xtask test`
//! runs): without them the agent has no job to see, and the test is skipped when not root.

use std::{
    collections::{BTreeMap, BTreeSet},
    ffi::OsStr,
    fs,
    io::Write as _,
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use monitor_testkit::{
    CollectorProcess, FixtureAgent, JobProcesses, KEY_HEX, Running, agent_binary_next_to,
    copy_tree, key_file, scratch_dir, standin_with_script, sysfs_fixture,
};
use serde_json::{Value, json};

mod browser;

const COLLECTOR: &str = env!("CARGO_BIN_EXE_railscope-collector");
const NODES: usize = 7;
const PORTS: usize = 4;
const GPUS: usize = 8;
const JOB_A: &str = "slurm:4242";
const JOB_B: &str = "trainer:7";
/// Nodes (1-based) of each job.
const JOB_A_NODES: std::ops::RangeInclusive<usize> = 1..=4;
/// Bytes per second each way on a busy port, and on the degraded one.
const PORT_BYTES_PER_S: f64 = 20.0e9;
const DEGRADED_BYTES_PER_S: f64 = 10.0e9;
/// The window the stragglers are asked over, and how long the findings and stragglers are
/// watched once every finding has opened.
const WINDOW_S: u64 = 60;
const WATCH: Duration = Duration::from_secs(60);
const REFRESH: Duration = Duration::from_secs(5);
/// How long every expected finding may take to open (the phys-state grace is 25 s, and a
/// stable series reaches the collector about every 30 s).
const SETTLE_WITHIN: Duration = Duration::from_secs(100);

fn node_name(n: usize) -> String {
    format!("node-{n:03}")
}

fn job_of(n: usize) -> &'static str {
    if JOB_A_NODES.contains(&n) {
        JOB_A
    } else {
        JOB_B
    }
}

// ----- The fleet's IB side: fixture trees and the counters that move -----

fn port_dir(sysfs: &Path, p: usize) -> PathBuf {
    sysfs.join(format!("class/infiniband/mlx5_{p}/ports/1"))
}

/// Node `n`'s sysfs tree under `dir`: the fixture's `mlx5_0` as `mlx5_0`..`mlx5_3`, with the
/// static faults written before the agent starts.
fn node_sysfs(dir: &Path, n: usize) -> PathBuf {
    let root = dir.join("sys");
    let device = sysfs_fixture("mlx5").join("class/infiniband/mlx5_0");
    for p in 0..PORTS {
        copy_tree(&device, &root.join(format!("class/infiniband/mlx5_{p}")));
        let port = port_dir(&root, p);
        fs::write(port.join("hw_counters/np_cnp_sent"), "0\n").unwrap();
        fs::write(port.join("hw_counters/np_ecn_marked_roce_packets"), "0\n").unwrap();
    }
    if n == 2 {
        fs::write(port_dir(&root, 1).join("rate"), "200 Gb/sec (2X NDR)\n").unwrap();
    }
    if n == 5 {
        fs::write(port_dir(&root, 2).join("state"), "1: DOWN\n").unwrap();
        fs::write(port_dir(&root, 2).join("phys_state"), "2: Polling\n").unwrap();
    }
    root
}

/// A counter file and its value as a function of the seconds since the fleet started.
struct Feed {
    file: fs::File,
    value: Box<dyn Fn(f64) -> u64 + Send>,
    written: u64,
}

impl Feed {
    fn new(path: &Path, value: impl Fn(u64, f64) -> u64 + Send + 'static) -> Feed {
        let start: u64 = fs::read_to_string(path)
            .unwrap()
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Feed {
            file: fs::OpenOptions::new().write(true).open(path).unwrap(),
            value: Box::new(move |t| value(start, t)),
            written: start,
        }
    }

    /// Rewritten in place (the agent keeps the file open and reads it at offset 0); a counter
    /// only grows, so the new text is never shorter than the old.
    fn write(&mut self, t: f64) {
        let v = (self.value)(t).max(self.written);
        if v != self.written {
            self.file
                .write_all_at(format!("{v}\n").as_bytes(), 0)
                .unwrap();
            self.written = v;
        }
    }
}

/// Every counter that moves on node `n`.
fn node_feeds(sysfs: &Path, n: usize) -> Vec<Feed> {
    let rate = |per_s: f64| move |start: u64, t: f64| start + (per_s * t) as u64;
    let mut feeds = Vec::new();
    for p in 0..PORTS {
        let dir = port_dir(sysfs, p);
        let bytes_per_s = match (n, p) {
            // Down from the start, and the idle decoy: no traffic.
            (5, 2) | (7, 3) => 0.0,
            (2, 1) => DEGRADED_BYTES_PER_S,
            _ => PORT_BYTES_PER_S * (1.0 + 0.005 * (((n * PORTS + p) % 5) as f64 - 2.0) / 2.0),
        };
        // The files count 4-byte words.
        for file in ["port_xmit_data", "port_rcv_data"] {
            feeds.push(Feed::new(
                &dir.join("counters").join(file),
                rate(bytes_per_s / 4.0),
            ));
        }
        let cnp_per_s = if (n, p) == (7, 0) { 20_000.0 } else { 50.0 };
        for file in ["np_cnp_sent", "np_ecn_marked_roce_packets"] {
            feeds.push(Feed::new(
                &dir.join("hw_counters").join(file),
                rate(cnp_per_s),
            ));
        }
        let symbol_per_s = match (n, p) {
            (2, 1) => Some(20.0),
            (6, 1) => Some(0.1),
            _ => None,
        };
        if let Some(r) = symbol_per_s {
            feeds.push(Feed::new(&dir.join("counters/symbol_error"), rate(r)));
        }
        let recoveries_per_s = match (n, p) {
            (6, 0) => Some(0.5),
            (4, 2) => Some(1.0 / 30.0),
            _ => None,
        };
        if let Some(r) = recoveries_per_s {
            feeds.push(Feed::new(
                &dir.join("counters/link_error_recovery"),
                rate(r),
            ));
        }
        if (n, p) == (3, 3) {
            feeds.push(Feed::new(&dir.join("counters/link_downed"), |start, t| {
                start + u64::from(t >= 10.0)
            }));
        }
    }
    feeds
}

/// A thread writing every feed every 250 ms until dropped.
struct Writer {
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Writer {
    fn start(mut feeds: Vec<Feed>) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let start = Instant::now();
        let thread = thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                let t = start.elapsed().as_secs_f64();
                for f in &mut feeds {
                    f.write(t);
                }
                thread::sleep(Duration::from_millis(250));
            }
        });
        Writer {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

// ----- The fleet's GPU side: a stand-in script per node -----

/// GPU `g` of node `n`: a warm-up step, then training, constant from step 1 on but for the
/// scripted faults.
fn gpu_script(n: usize, g: usize, pid: Option<u32>) -> Value {
    let busy = pid.is_some();
    let slow = (n, g) == (2, 3);
    // ±0.4 points of activity between GPUs, so the job's devices are not identical.
    let jitter = ((n * GPUS + g) % 5) as f64 * 0.2 - 0.4;
    let (sm, tensor, dram) = match (busy, slow) {
        (false, _) => (2.0, 0.0, 1.0),
        (true, false) => (93.0 + jitter, 70.0 + jitter, 60.0 + jitter),
        (true, true) => (54.0, 38.0, 35.0),
    };
    let throttle: Vec<&str> = match (n, g) {
        (2, 3) => vec!["hw_thermal_slowdown"],
        (1, 2) => vec!["sw_power_cap"],
        (5, 0) => vec!["hw_power_brake_slowdown"],
        _ => vec![],
    };
    let processes = match pid {
        Some(pid) => json!([{"pid": pid, "memory_bytes": 60_000_000_000_u64}]),
        None => json!([]),
    };
    let mut steps = vec![
        json!({
            "gpu_util_pct": if busy { 40 } else { 3 }, "mem_util_pct": 10,
            "memory_used_bytes": 20_000_000_000_u64, "sm_clock_mhz": 1980,
            "temperature_c": 45, "power_mw": 300_000, "throttle_reasons": [],
            "gpm": {"sm_util": sm / 2.0, "any_tensor_util": tensor / 2.0, "dram_bw_util": dram / 2.0},
            "processes": processes,
        }),
        json!({
            "gpu_util_pct": if busy { 100 } else { 3 }, "mem_util_pct": if busy { 55 } else { 1 },
            "memory_used_bytes": if busy { 70_000_000_000_u64 } else { 1_000_000_000 },
            "sm_clock_mhz": if slow { 1410 } else { 1980 },
            "temperature_c": match (n, g) { (2, 3) => 88, (5, 5) => 84, _ if busy => 63, _ => 35 },
            "power_mw": match (n, g) { (1, 2) => 700_000, _ if busy => 640_000, _ => 80_000 },
            "throttle_reasons": throttle,
            "gpm": {"sm_util": sm, "any_tensor_util": tensor, "dram_bw_util": dram},
        }),
    ];
    let mut at = |step: usize, fields: Value| {
        while steps.len() <= step {
            steps.push(json!({}));
        }
        let s = steps[step].as_object_mut().unwrap();
        for (k, v) in fields.as_object().unwrap() {
            s.insert(k.clone(), v.clone());
        }
    };
    match (n, g) {
        (1, 5) => at(1, json!({"remapped_rows_corrected": 2})),
        (2, 0) => {
            at(3, json!({"ecc_corrected_volatile": 5}));
            at(6, json!({"ecc_corrected_volatile": 9}));
        }
        (4, 6) => at(1, json!({"pcie_link_gen": 4})),
        (6, 4) => at(6, json!({"ecc_uncorrected_volatile": 1})),
        (7, 5) => at(4, json!({"remap_pending": true})),
        (7, 6) => at(
            4,
            json!({"remap_failure": true, "remapped_rows_uncorrected": 1}),
        ),
        (7, 7) => at(1, json!({"pcie_link_gen": 3})),
        _ => {}
    }
    let xids = match (n, g) {
        (3, 7) => json!([{"step": 19, "xid": 79}]),
        (4, 0) => json!([{"step": 6, "xid": 43}]),
        (6, 1) => json!([{"step": 8, "xid": 94}]),
        _ => json!([]),
    };
    let mut gpu = json!({
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": format!("GPU-{n:08x}-{g:04x}-4e8b-9a61-0c5b2d7e8f13"),
        "gpm_supported": true,
        "xids": xids,
        "steps": steps,
    });
    if (n, g) == (3, 7) {
        gpu["lost_at_step"] = json!(20);
    }
    gpu
}

fn node_script(n: usize, pids: &BTreeMap<&str, u32>) -> Value {
    let gpus: Vec<Value> = (0..GPUS)
        .map(|g| {
            let pid = ((n, g) != (7, 7)).then(|| pids[job_of(n)]);
            gpu_script(n, g, pid)
        })
        .collect();
    json!({
        "driver_version": "550.90.07",
        "defaults": {
            "memory_total_bytes": 85_520_809_984_u64, "memory_reserved_bytes": 553_648_128,
            "mem_clock_mhz": 2619,
            "ecc_corrected_volatile": 0, "ecc_uncorrected_volatile": 0,
            "ecc_corrected_aggregate": 0, "ecc_uncorrected_aggregate": 0,
            "remapped_rows_corrected": 0, "remapped_rows_uncorrected": 0,
            "remap_pending": false, "remap_failure": false,
            "pcie_link_gen": 5, "pcie_link_max_gen": 5, "pcie_link_width": 16, "pcie_link_max_width": 16,
        },
        "gpus": gpus,
    })
}

// ----- What is expected -----

/// (rule, node, place, severity): place `mlx5_N/1` or `gpu G`.
type Expected = BTreeSet<(String, String, String, String)>;

fn expected_findings() -> Expected {
    [
        ("gpu_thermal_throttle", 2, "gpu 3", "warning"),
        ("ib_port_degraded", 2, "mlx5_1/1", "warning"),
        ("ib_symbol_errors", 2, "mlx5_1/1", "critical"),
        ("gpu_xid", 3, "gpu 7", "critical"),
        ("gpu_lost", 3, "gpu 7", "critical"),
        ("ib_link_downed", 3, "mlx5_3/1", "critical"),
        ("device_missing", 3, "", "warning"),
        ("gpu_xid", 4, "gpu 0", "info"),
        ("gpu_pcie_degraded", 4, "gpu 6", "warning"),
        ("gpu_power_throttle", 5, "gpu 0", "warning"),
        ("ib_port_down", 5, "mlx5_2/1", "critical"),
        ("ib_phys_state", 5, "mlx5_2/1", "critical"),
        ("device_missing", 5, "", "warning"),
        ("gpu_xid", 6, "gpu 1", "critical"),
        ("gpu_ecc_uncorrected", 6, "gpu 4", "critical"),
        ("ib_link_error_recovery", 6, "mlx5_0/1", "warning"),
        ("gpu_row_remap_pending", 7, "gpu 5", "warning"),
        ("gpu_row_remap_failed", 7, "gpu 6", "critical"),
        ("roce_congestion", 7, "mlx5_0/1", "warning"),
    ]
    .into_iter()
    .map(|(rule, n, place, severity)| {
        (
            rule.to_owned(),
            node_name(n),
            place.to_owned(),
            severity.to_owned(),
        )
    })
    .collect()
}

fn place(f: &Value) -> String {
    match (f["device"].as_str(), f["gpu"].as_str()) {
        (Some(d), _) => format!("{d}/{}", f["port"]),
        (None, Some(g)) => format!("gpu {g}"),
        _ => String::new(),
    }
}

fn key_of(f: &Value) -> (String, String, String, String) {
    (
        f["rule"].as_str().unwrap().to_owned(),
        f["node"].as_str().unwrap().to_owned(),
        place(f),
        f["severity"].as_str().unwrap().to_owned(),
    )
}

/// (rule, node, place) -> id of the findings in `answer`.
fn ids(answer: &Value) -> BTreeMap<(String, String, String), Vec<String>> {
    let mut out: BTreeMap<_, Vec<String>> = BTreeMap::new();
    for f in answer["findings"].as_array().unwrap() {
        let (rule, node, place, _) = key_of(f);
        out.entry((rule, node, place))
            .or_default()
            .push(f["id"].as_str().unwrap().to_owned());
    }
    out
}

fn summary(answer: &Value) -> String {
    answer["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            format!(
                "  {} {} end={} {}\n",
                f["id"], f["severity"], f["end"], f["summary"]
            )
        })
        .collect()
}

/// One expected straggler: node, gpu or port, metric, roughly its value and its job's
/// median, and the finding (rule, place) that is its cause, if any.
struct ExpectedStraggler {
    node: usize,
    gpu: Option<&'static str>,
    device: Option<&'static str>,
    metric: &'static str,
    value: f64,
    median: f64,
    /// Relative tolerance on value and median (absolute for a value of 0).
    tolerance: f64,
    cause: Option<(&'static str, &'static str)>,
}

fn expected_stragglers(job: &str) -> Vec<ExpectedStraggler> {
    let port = |node, device, value, cause| ExpectedStraggler {
        node,
        gpu: None,
        device: Some(device),
        metric: "railscope_ib_port_bytes_per_second",
        value,
        median: 2.0 * PORT_BYTES_PER_S,
        tolerance: 0.1,
        cause,
    };
    if job == JOB_A {
        vec![
            ExpectedStraggler {
                node: 2,
                gpu: Some("3"),
                device: None,
                metric: "railscope_gpu_sm_util_ratio",
                value: 0.54,
                median: 0.93,
                tolerance: 0.03,
                cause: Some(("gpu_thermal_throttle", "gpu 3")),
            },
            // The most severe finding of the port: symbol errors (critical) over degraded.
            port(
                2,
                "mlx5_1",
                2.0 * DEGRADED_BYTES_PER_S,
                Some(("ib_symbol_errors", "mlx5_1/1")),
            ),
        ]
    } else {
        vec![
            // Two critical findings of the port: the earlier, `ib_port_down` (from the agent's
            // first frames; `ib_phys_state` waits out its grace).
            port(5, "mlx5_2", 0.0, Some(("ib_port_down", "mlx5_2/1"))),
            port(7, "mlx5_3", 0.0, None),
        ]
    }
}

fn near(got: f64, want: f64, tolerance: f64) -> bool {
    if want == 0.0 {
        got.abs() < 1.0e6
    } else {
        (got - want).abs() <= tolerance * want.abs()
    }
}

/// What is wrong with the stragglers answer of `job`, given the findings' ids by place; empty
/// when it is exactly as expected.
fn straggler_problems(
    job: &str,
    answer: &Value,
    finding_ids: &BTreeMap<(String, String, String), Vec<String>>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let jobs = answer["jobs"].as_array().unwrap();
    let Some(entry) = jobs.iter().find(|j| j["job_id"] == job) else {
        return vec![format!("job {job} missing from {answer}")];
    };
    let want_nodes = if job == JOB_A { 4 } else { 3 };
    if entry["nodes"] != want_nodes {
        problems.push(format!(
            "{job}: nodes {} (want {want_nodes})",
            entry["nodes"]
        ));
    }
    let got = entry["stragglers"].as_array().unwrap();
    let expected = expected_stragglers(job);
    let is = |s: &Value, e: &ExpectedStraggler| {
        s["node"] == node_name(e.node).as_str()
            && s["gpu"].as_str() == e.gpu
            && s["device"].as_str() == e.device
    };
    for s in got {
        if !expected.iter().any(|e| is(s, e)) {
            problems.push(format!("{job}: unexpected straggler {s}"));
        }
    }
    for e in &expected {
        let what = format!(
            "{job}: {} {}",
            node_name(e.node),
            e.gpu
                .map(|g| format!("gpu {g}"))
                .unwrap_or_else(|| format!("{}/1", e.device.unwrap()))
        );
        let Some(s) = got.iter().find(|s| is(s, e)) else {
            problems.push(format!("{what}: not a straggler"));
            continue;
        };
        if s["metric"] != e.metric {
            problems.push(format!(
                "{what}: metric {} (want {})",
                s["metric"], e.metric
            ));
        }
        let value = s["value"].as_f64().unwrap_or(f64::NAN);
        let median = s["median"].as_f64().unwrap_or(f64::NAN);
        if !near(value, e.value, e.tolerance) || !near(median, e.median, e.tolerance) {
            problems.push(format!(
                "{what}: value {value:.4e} median {median:.4e} (want about {:.4e} and {:.4e})",
                e.value, e.median
            ));
        }
        let want_cause: Option<String> = e.cause.map(|(rule, place)| {
            let key = (rule.to_owned(), node_name(e.node), place.to_owned());
            finding_ids
                .get(&key)
                .and_then(|v| v.first().cloned())
                .unwrap_or_else(|| format!("<no {key:?} finding>"))
        });
        if s["cause"].as_str().map(str::to_owned) != want_cause {
            problems.push(format!(
                "{what}: cause {} (want {want_cause:?})",
                s["cause"]
            ));
        }
    }
    problems
}

fn unix_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[test]
fn a_fleet_of_real_agents_gives_exactly_the_expected_findings_and_stragglers() {
    // SAFETY: a plain query.
    let root = unsafe { libc::geteuid() } == 0;
    let job_paths = [
        "system.slice/slurmstepd.scope/job_4242/step_0".to_owned(),
        "trainer/run-7/rank-0".to_owned(),
    ];
    let Some(procs) = JobProcesses::in_cgroups("fleet", &job_paths) else {
        assert!(
            !root,
            "running as root, but no cgroup2 mount lets this test create cgroups"
        );
        eprintln!("skipped: not root, so no process can be put in a job's cgroup");
        return;
    };
    let pids: BTreeMap<&str, u32> = [(JOB_A, procs.pids[0]), (JOB_B, procs.pids[1])].into();

    let dir = scratch_dir("fleet-real-agents");
    let key = key_file(&dir, KEY_HEX);
    let collector = CollectorProcess::command(COLLECTOR, &key, &dir.join("data"))
        .env("RAILSCOPE_LOG", "warn")
        .start();
    let agent_toml = dir.join("agent.toml");
    let mut toml = fs::File::create(&agent_toml).unwrap();
    writeln!(
        toml,
        "[[jobs.patterns]]\nregex = '/trainer/run-(\\d+)/rank-(\\d+)$'\nid = \"trainer:$1\"\nstep = \"rank$2\""
    )
    .unwrap();
    drop(toml);

    let mut feeds = Vec::new();
    let mut nodes = Vec::new();
    for n in 1..=NODES {
        let ndir = dir.join(node_name(n));
        fs::create_dir_all(&ndir).unwrap();
        let sysfs = node_sysfs(&ndir, n);
        feeds.extend(node_feeds(&sysfs, n));
        let lib_dir = ndir.join("nvml");
        fs::create_dir_all(&lib_dir).unwrap();
        let lib = standin_with_script(&lib_dir);
        fs::write(
            lib_dir.join("nvml-standin.json"),
            serde_json::to_string_pretty(&node_script(n, &pids)).unwrap(),
        )
        .unwrap();
        nodes.push((n, sysfs, lib));
    }
    let started_s = unix_s();
    let _writer = Writer::start(feeds);
    let agents: Vec<Running> = nodes
        .iter()
        .map(|(n, sysfs, lib)| {
            FixtureAgent::new(&collector.udp_addr().to_string(), &key, sysfs)
                .node(&node_name(*n))
                .nvml_lib(lib)
                .args([OsStr::new("--config"), agent_toml.as_os_str()])
                .spawn(agent_binary_next_to(COLLECTOR))
        })
        .collect();
    let started = Instant::now();

    // Until every expected finding has opened.
    let expected = expected_findings();
    let places_of = |answer: &Value| -> Expected {
        answer["findings"]
            .as_array()
            .unwrap()
            .iter()
            .map(key_of)
            .collect()
    };
    loop {
        let all = collector.json("/api/v1/findings");
        let got = places_of(&all);
        // A finding's severity may still rise (symbol errors: warning until the hour's count
        // passes 120), so only its place is checked until then.
        let unexpected: Vec<_> = got
            .iter()
            .filter(|(rule, node, place, _)| {
                !expected
                    .iter()
                    .any(|e| (&e.0, &e.1, &e.2) == (rule, node, place))
            })
            .collect();
        assert!(
            unexpected.is_empty(),
            "{:.0} s in: findings not expected {unexpected:#?}\nall:\n{}",
            started.elapsed().as_secs_f64(),
            summary(&all)
        );
        if got == expected {
            eprintln!(
                "every expected finding open {:.0} s after the agents started",
                started.elapsed().as_secs_f64()
            );
            break;
        }
        assert!(
            started.elapsed() < SETTLE_WITHIN,
            "{SETTLE_WITHIN:?} after the agents started, findings missing: {:#?}\nall:\n{}",
            expected.difference(&got).collect::<Vec<_>>(),
            summary(&all)
        );
        thread::sleep(Duration::from_secs(2));
    }
    // The window of the stragglers starts after the warm-up step.
    let wait_for_window = Duration::from_secs(WINDOW_S + 15).saturating_sub(started.elapsed());
    thread::sleep(wait_for_window);

    let first_ids = ids(&collector.json("/api/v1/findings"));
    let watch_from = Instant::now();
    let mut straggler_failures: Vec<String> = Vec::new();
    let mut refreshes = 0;
    while watch_from.elapsed() < WATCH {
        refreshes += 1;
        let now_s = unix_s();
        let all = collector.json("/api/v1/findings");
        let active = collector.json("/api/v1/findings?active=true");
        // Exactly the expected findings, all active, each with the id it had.
        assert_eq!(
            places_of(&all),
            expected,
            "refresh {refreshes}: the findings\n{}",
            summary(&all)
        );
        assert_eq!(
            places_of(&active),
            expected,
            "refresh {refreshes}: the active findings\n{}",
            summary(&all)
        );
        assert_eq!(
            ids(&all),
            first_ids,
            "refresh {refreshes}: a finding ended and opened again (ids changed)\n{}",
            summary(&all)
        );
        for f in all["findings"].as_array().unwrap() {
            let start_s = f["start"].as_u64().unwrap() as f64 / 1e9;
            assert!(
                start_s >= started_s - 5.0 && start_s <= now_s + 1.0,
                "{} starts at {start_s}, outside the run ({started_s}..{now_s})",
                f["id"]
            );
        }
        // Stragglers of each job over the last WINDOW_S seconds.
        for job in [JOB_A, JOB_B] {
            let path = format!(
                "/api/v1/stragglers?job_id={}&start={:.3}&end={now_s:.3}",
                job.replace(':', "%3A"),
                now_s - WINDOW_S as f64,
            );
            let answer = collector.json(&path);
            let problems = straggler_problems(job, &answer, &first_ids);
            if !problems.is_empty() {
                straggler_failures.push(format!(
                    "refresh {refreshes} ({:.0} s in): {}\n  answer: {answer}",
                    started.elapsed().as_secs_f64(),
                    problems.join("; ")
                ));
            }
        }
        thread::sleep(REFRESH);
    }
    eprintln!("{refreshes} refreshes over {WATCH:?}: findings exactly as expected");

    // `select` on this fleet's data advises dropping nothing a rule, the straggler search or
    // a dashboard view reads.
    let out = std::process::Command::new(COLLECTOR)
        .args([
            "select",
            "--collector",
            &collector.url(),
            "--start",
            "-2m",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "select: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let selection: Value = serde_json::from_slice(&out.stdout).unwrap();
    let read = monitor_collector::reads::metrics_railscope_reads();
    let dropped: Vec<String> = selection["sampling"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s.as_str()?.strip_suffix(":drop").map(str::to_owned))
        .collect();
    let wrongly: Vec<&String> = dropped
        .iter()
        .filter(|m| read.contains(m.as_str()))
        .collect();
    assert!(
        wrongly.is_empty(),
        "select advises dropping what railscope reads: {wrongly:?}"
    );
    assert!(
        selection["protected"]
            .as_array()
            .is_some_and(|p| !p.is_empty()),
        "{selection:#}"
    );
    eprintln!(
        "select on the fleet: {} dropped, none of them read by railscope",
        dropped.len()
    );
    dashboard_marks(&collector);
    for (n, mut agent) in (1..).zip(agents) {
        assert!(agent.is_running(), "the agent of {} exited", node_name(n));
        let _ = agent.signal(libc::SIGTERM);
    }
    let (ok, _, err) = collector.stop();
    assert!(ok, "the collector failed: {err}");
    drop(procs);
    assert!(
        straggler_failures.is_empty(),
        "stragglers not as expected in {} of {} answers:\n{}",
        straggler_failures.len(),
        2 * refreshes,
        straggler_failures.join("\n")
    );
    let _ = fs::remove_dir_all(&dir);
}

/// The dashboard in headless Chromium, as an operator opens it on this fleet: every active
/// finding marked on its cell in the fleet view and no cell marked without one; node 3's lost
/// GPU drawn lost; node 2's port trained down drawn degraded, its load below its peers'; job
/// A's view listing its degraded port's and throttled GPU's findings; no error shown.
fn dashboard_marks(collector: &CollectorProcess) {
    let Some(chromium) = browser::chromium() else {
        return;
    };
    let page = browser::Page::open(chromium, &format!("{}/?refresh=2#/fleet", collector.url()));
    let tab = &page.tab;
    browser::wait_until(
        tab,
        "the fleet grid of every node",
        &format!(
            "return window.railscope.updates >= 1 && \
             document.querySelectorAll('#fleet-grid .cell.gpu').length === {}",
            NODES * 8
        ),
    );
    let active = collector.json("/api/v1/findings?active=true");
    let mut expected: Vec<String> = active["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let node = f["node"].as_str().unwrap();
            match (f["gpu"].as_str(), f["device"].as_str()) {
                (Some(gpu), _) => format!("{node} gpu {gpu}"),
                (None, Some(device)) => format!("{node} port {device}/{}", f["port"]),
                _ => format!("{node} node"),
            }
        })
        .collect();
    expected.sort();
    expected.dedup();
    let marked = browser::eval(
        tab,
        "return [...document.querySelectorAll('#fleet-grid [data-finding-rule]')].map(c => \
           c.dataset.gpu !== undefined ? `${c.dataset.node} gpu ${c.dataset.gpu}` \
           : c.dataset.device !== undefined ? `${c.dataset.node} port ${c.dataset.device}/${c.dataset.port}` \
           : `${c.dataset.node} node`).sort()",
    );
    assert_eq!(
        marked,
        json!(expected),
        "cells marked by findings in the fleet view"
    );
    let lost = browser::eval(
        tab,
        "return [...document.querySelectorAll('#fleet-grid .cell.gpu[data-lost]')].map(c => \
           `${c.dataset.node} gpu ${c.dataset.gpu}`)",
    );
    assert_eq!(lost, json!(["node-003 gpu 7"]), "GPUs drawn lost");
    let ports = browser::eval(
        tab,
        "return [...document.querySelectorAll('#fleet-grid .cell.port[data-node=\"node-002\"]')].map(c => \
           [c.dataset.device, c.classList.contains('degraded'), Number(c.dataset.load)])",
    );
    let ports = ports.as_array().unwrap();
    let degraded = ports.iter().find(|p| p[0] == "mlx5_1").unwrap();
    assert_eq!(
        degraded[1],
        json!(true),
        "node-002 mlx5_1 drawn degraded: {ports:?}"
    );
    for peer in ports.iter().filter(|p| p[0] != "mlx5_1") {
        assert_eq!(peer[1], json!(false), "{ports:?}");
        assert!(
            degraded[2].as_f64().unwrap() < 0.7 * peer[2].as_f64().unwrap(),
            "the degraded port's load is not below its peer's: {ports:?}"
        );
    }
    browser::screenshot(tab, "fleet-real-agents");
    browser::assert_no_problem(tab, &page.problems, "the fleet view of real agents");

    browser::open(tab, &format!("#/job/{JOB_A}"), "job");
    let listed = browser::eval(
        tab,
        "return [...document.querySelectorAll('#job-findings tr[data-finding-rule]')].map(r => \
           [r.dataset.findingRule, r.dataset.node, r.dataset.device || r.dataset.gpu || null])",
    );
    let listed = listed.as_array().unwrap();
    for want in [
        json!(["ib_port_degraded", "node-002", "mlx5_1"]),
        json!(["gpu_thermal_throttle", "node-002", "3"]),
        json!(["gpu_lost", "node-003", "7"]),
    ] {
        assert!(
            listed.contains(&want),
            "job A's view lists {want}: {listed:?}"
        );
    }
    browser::screenshot(tab, "job-real-agents");
    browser::assert_no_problem(tab, &page.problems, "job A's view");
}
