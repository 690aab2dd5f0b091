//! Verdicts and actions through the churn real fleets have (issue 45): four real
//! `railscope agent` processes (`node-001`..`node-004`, 1 s samples, 2 s flushes, each on its
//! own copy of the mlx5 fixture tree with 4 IB ports and its own 8-GPU NVML stand-in), a
//! collector that drains through a **real Slurm** (monitor-testkit's `slurm`), and two busy
//! loops beside them all the while (the machine loaded). While it runs:
//!
//! | when | what happens | what must follow |
//! |---|---|---|
//! | from the start | node-003's `mlx5_1/1` DOWN / Polling before its agent starts | `ib_port_down`, `ib_phys_state` (after its grace), `device_missing`; node-003 drained once |
//! | step 6 | node-004 GPU 4 counts an uncorrected ECC error | `gpu_ecc_uncorrected`; node-004 drained once |
//! | step 45 | node-002 GPU 3 raises XID 79 | `gpu_xid`, critical; its drain is on its way to Slurm when the collector is killed with SIGKILL (and the `scontrol` it started with it); node-001's agent is killed too and restarted while the collector is away; the collector restarted on its data drains node-002 once |
//! | then | node-004's agent stops (SIGSTOP) for twice `silent-after-s` | `node_silent` opens; node-004's ECC finding stays open, marked stale; nothing resumes node-004; once its agent runs again `node_silent` ends |
//!
//! Asserted at the end, as an operator reads it back: the findings are exactly the expected
//! ones, each opened once (one id), none ended but `node_silent` (the only condition that went);
//! each faulty node drained exactly once (Slurm's own log, the audit records), node-001 never,
//! and no node resumed.
//!
//! Needs Slurm's packages (`cargo xtask setup`): skipped, saying so, without them, unless
//! `RAILSCOPE_REQUIRE_SLURM=1` (set by `cargo xtask test`).

use std::{
    collections::{BTreeMap, BTreeSet},
    ffi::OsStr,
    fs,
    hint::black_box,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use monitor_testkit::{
    CollectorCommand, CollectorProcess, FixtureAgent, Running, agent_binary_next_to, copy_tree,
    key_file, scratch_dir,
    slurm::{self, SlurmCluster},
    standin_with_script, sysfs_fixture, wait_for,
};
use serde_json::{Value, json};

const COLLECTOR: &str = env!("CARGO_BIN_EXE_railscope-collector");
const KEY_HEX: &str = "8899aabbccddeeff00112233445566778899aabbccddeeff0011223344556677";
const NODES: [&str; 4] = ["node-001", "node-002", "node-003", "node-004"];
const PORTS: usize = 4;
const GPUS: usize = 8;
/// The step (agent samples, 1 s apart) at which node-002's GPU 3 raises XID 79.
const XID_STEP: u64 = 45;
const SILENT_AFTER_S: u64 = 10;

/// Two threads spinning until dropped: the machine loaded beside the collector and agents.
struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Load {
    fn start() -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..2)
            .map(|_| {
                let stop = stop.clone();
                thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
                    }
                })
            })
            .collect();
        Load { stop, threads }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// `scontrol` as the collector runs it, through a script that, while `DIR/hold` exists and
/// the call drains node-002, writes its pid and its `sleep`'s to `DIR/drain-started` and
/// waits (the window between a finding and its action, for the test to kill the collector
/// in); every other call goes straight to the real one.
fn slow_scontrol(dir: &Path) -> PathBuf {
    let real = slurm::scontrol_program().unwrap();
    let real = real.display();
    let path = dir.join("scontrol");
    fs::write(
        &path,
        format!(
            "#!/bin/sh\ncase \"$*\" in *NodeName=node-002\\ *State=DRAIN*)\n  \
             if [ -e {d}/hold ]; then sleep 60 & echo \"$$ $!\" > {d}/drain-started; wait $!; fi;;\n\
             esac\nexec {real} \"$@\"\n",
            d = dir.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn collector(dir: &Path, cluster: &SlurmCluster, scontrol: &Path) -> CollectorCommand {
    let key = key_file(dir, KEY_HEX);
    let config = dir.join("collector.toml");
    fs::write(
        &config,
        format!(
            "[findings]\ntick-s = 1\nsilent-after-s = {SILENT_AFTER_S}\n\n\
             [actions]\ndry-run = false\nresume-hold-s = 5\nbrake-max-percent = 100\n\
             scontrol = \"{}\"\nscontrol-timeout-s = 120\n\
             [[actions.rule]]\nrule = \"gpu_xid\"\ndevice = \"gpu\"\naction = \"slurm-drain\"\n\
             [[actions.rule]]\nrule = \"gpu_ecc_uncorrected\"\naction = \"slurm-drain\"\n\
             [[actions.rule]]\nrule = \"ib_port_down\"\naction = \"slurm-drain\"\n",
            scontrol.display()
        ),
    )
    .unwrap();
    CollectorProcess::command(COLLECTOR, &key, &dir.join("data"))
        .args([OsStr::new("--config"), config.as_os_str()])
        .env("SLURM_CONF", cluster.conf())
        .env("RAILSCOPE_LOG", "info")
}

/// Node `n`'s sysfs tree under `dir`: the fixture's `mlx5_0` as `mlx5_0`..`mlx5_3`; node 3's
/// `mlx5_1` down before its agent starts.
fn node_sysfs(dir: &Path, n: usize) -> PathBuf {
    let root = dir.join("sys");
    let device = sysfs_fixture("mlx5").join("class/infiniband/mlx5_0");
    for p in 0..PORTS {
        copy_tree(&device, &root.join(format!("class/infiniband/mlx5_{p}")));
    }
    if n == 3 {
        let port = root.join("class/infiniband/mlx5_1/ports/1");
        fs::write(port.join("state"), "1: DOWN\n").unwrap();
        fs::write(port.join("phys_state"), "2: Polling\n").unwrap();
    }
    root
}

/// Node `n`'s NVML stand-in script: 8 busy GPUs, and its fault.
fn node_script(n: usize) -> Value {
    let gpus: Vec<Value> = (0..GPUS)
        .map(|g| {
            let mut steps = vec![json!({
                "gpu_util_pct": 100, "mem_util_pct": 55, "memory_used_bytes": 70_000_000_000_u64,
                "sm_clock_mhz": 1980, "temperature_c": 63, "power_mw": 640_000,
                "throttle_reasons": [],
            })];
            if (n, g) == (4, 4) {
                while steps.len() < 6 {
                    steps.push(json!({}));
                }
                steps.push(json!({"ecc_uncorrected_volatile": 1}));
            }
            let xids = if (n, g) == (2, 3) {
                json!([{"step": XID_STEP, "xid": 79}])
            } else {
                json!([])
            };
            json!({
                "name": "NVIDIA H100 80GB HBM3",
                "uuid": format!("GPU-{n:08x}-{g:04x}-4e8b-9a61-0c5b2d7e8f13"),
                "xids": xids,
                "steps": steps,
            })
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

/// (rule, node, place): place `mlx5_N/1`, `gpu G` or "".
type Place = (String, String, String);

fn place_of(f: &Value) -> Place {
    let place = match (f["device"].as_str(), f["gpu"].as_str()) {
        (Some(d), _) if f["port"].is_u64() => format!("{d}/{}", f["port"]),
        (Some(d), _) => d.to_owned(),
        (None, Some(g)) => format!("gpu {g}"),
        _ => String::new(),
    };
    (
        f["rule"].as_str().unwrap().to_owned(),
        f["node"].as_str().unwrap().to_owned(),
        place,
    )
}

fn expected() -> BTreeSet<Place> {
    [
        ("gpu_xid", "node-002", "gpu 3"),
        ("ib_port_down", "node-003", "mlx5_1/1"),
        ("ib_phys_state", "node-003", "mlx5_1/1"),
        ("device_missing", "node-003", ""),
        ("gpu_ecc_uncorrected", "node-004", "gpu 4"),
        ("node_silent", "node-004", ""),
    ]
    .into_iter()
    .map(|(r, n, p)| (r.to_owned(), n.to_owned(), p.to_owned()))
    .collect()
}

/// Every finding, one line each, for a failing assertion.
fn summary(findings: &[Value]) -> String {
    findings
        .iter()
        .map(|f| {
            format!(
                "{} start {} end {} {}",
                f["id"], f["start"], f["end"], f["summary"]
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn findings(c: &CollectorProcess) -> Vec<Value> {
    c.json("/api/v1/findings")["findings"]
        .as_array()
        .unwrap()
        .clone()
}

/// Every id seen so far per place, and every (id, end) pair: a finding ended is remembered
/// even if a later answer no longer lists it.
#[derive(Default)]
struct Watched {
    ids: BTreeMap<Place, BTreeSet<String>>,
    ended: BTreeMap<String, u64>,
}

impl Watched {
    fn look(&mut self, c: &CollectorProcess) -> Vec<Value> {
        let all = findings(c);
        for f in &all {
            let id = f["id"].as_str().unwrap().to_owned();
            if let Some(end) = f["end"].as_u64() {
                self.ended.insert(id.clone(), end);
            }
            self.ids.entry(place_of(f)).or_default().insert(id);
        }
        all
    }
}

#[test]
fn through_restarts_silence_and_load_each_fault_is_found_once_and_each_node_drained_once() {
    const TEST: &str = "churn_real_agents";
    if !slurm::installed_for(TEST) {
        return;
    }
    let _load = Load::start();
    let dir = scratch_dir("churn");
    let cluster = SlurmCluster::start(&dir.join("slurm"), &NODES);
    let scontrol = slow_scontrol(&dir);
    fs::write(dir.join("hold"), "").unwrap();
    let c = collector(&dir, &cluster, &scontrol).start();
    let (udp, http) = (c.udp, c.http);
    let key = dir.join("wire.key");

    let agents: Vec<FixtureAgent> = (1..=NODES.len())
        .map(|n| {
            let ndir = dir.join(NODES[n - 1]);
            fs::create_dir_all(&ndir).unwrap();
            let sysfs = node_sysfs(&ndir, n);
            let lib_dir = ndir.join("nvml");
            fs::create_dir_all(&lib_dir).unwrap();
            let lib = standin_with_script(&lib_dir);
            fs::write(
                lib_dir.join("nvml-standin.json"),
                serde_json::to_string_pretty(&node_script(n)).unwrap(),
            )
            .unwrap();
            FixtureAgent::new(&c.udp_addr().to_string(), &key, &sysfs)
                .node(NODES[n - 1])
                .nvml_lib(&lib)
                .cadence("1", "2")
        })
        .collect();
    let program = agent_binary_next_to(COLLECTOR);
    let mut running: Vec<Option<Running>> =
        agents.iter().map(|a| Some(a.spawn(&program))).collect();
    let mut watched = Watched::default();

    // The faults of nodes 3 and 4 are found and drained before the XID comes (the phys
    // state past its grace: a stable gauge's second sample comes about 30 s after its first).
    for node in ["node-003", "node-004"] {
        wait_for(&format!("{node} drained"), Duration::from_secs(60), || {
            watched.look(&c);
            cluster.show(node).drained().then_some(())
        });
    }
    wait_for("node-003's ib_phys_state", Duration::from_secs(60), || {
        watched.look(&c);
        c.active_finding("ib_phys_state", "node-003")
    });

    // node-002's drain is on its way to Slurm: the collector dies with the scontrol it
    // started, and node-001's agent dies too.
    wait_for(
        "node-002's gpu_xid finding",
        Duration::from_secs(90),
        || {
            watched.look(&c);
            c.active_finding("gpu_xid", "node-002")
        },
    );
    let pids: Vec<i32> = wait_for("scontrol held", Duration::from_secs(30), || {
        let text = fs::read_to_string(dir.join("drain-started")).ok()?;
        let pids: Vec<i32> = text
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        (pids.len() == 2).then_some(pids)
    });
    watched.look(&c);
    let _ = c.signal(libc::SIGKILL);
    for pid in pids {
        // SAFETY: the script the collector started and its sleep, whose pids it wrote.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let _ = running[0].take().unwrap().signal(libc::SIGKILL);
    assert!(
        !cluster.show("node-002").drained(),
        "drained before the crash"
    );
    fs::remove_file(dir.join("hold")).unwrap();
    // node-001's agent restarted while its collector is away (its spool and session kept).
    thread::sleep(Duration::from_secs(2));
    running[0] = Some(agents[0].spawn(&program));
    thread::sleep(Duration::from_secs(3));

    let c = collector(&dir, &cluster, &scontrol)
        .ports(udp, http)
        .start();
    wait_for("node-002 drained", Duration::from_secs(60), || {
        watched.look(&c);
        cluster.show("node-002").drained().then_some(())
    });

    // node-004 falls silent: found, its other findings kept (stale), nothing resumes it.
    let node4 = running[3].as_ref().unwrap().id() as i32;
    // SAFETY: our own child.
    unsafe { libc::kill(node4, libc::SIGSTOP) };
    let stopped = Instant::now();
    let silent = wait_for("node-004 silent", Duration::from_secs(60), || {
        watched.look(&c);
        c.active_finding("node_silent", "node-004")
    });
    let ecc = c
        .active_finding("gpu_ecc_uncorrected", "node-004")
        .expect("node-004's ECC finding kept open while it is silent");
    assert!(ecc["evidence"]["stale"]["last_heard"].is_u64(), "{ecc}");
    assert_eq!(
        silent["evidence"]["last_heard"],
        ecc["evidence"]["stale"]["last_heard"]
    );
    // Silent past twice the threshold and the resume hold.
    while stopped.elapsed() < Duration::from_secs(2 * SILENT_AFTER_S + 5) {
        watched.look(&c);
        thread::sleep(Duration::from_secs(1));
    }
    assert!(cluster.show("node-004").drained(), "resumed on silence");
    // SAFETY: our own child.
    unsafe { libc::kill(node4, libc::SIGCONT) };
    wait_for("node-004 heard again", Duration::from_secs(60), || {
        watched.look(&c);
        c.active_finding("node_silent", "node-004")
            .is_none()
            .then_some(())
    });
    // A few more passes.
    for _ in 0..5 {
        watched.look(&c);
        thread::sleep(Duration::from_secs(1));
    }
    let all = watched.look(&c);

    // Exactly the expected findings, each one id.
    let places: BTreeSet<Place> = watched.ids.keys().cloned().collect();
    assert_eq!(places, expected(), "findings:\n{}", summary(&all));
    for (place, ids) in &watched.ids {
        assert_eq!(
            ids.len(),
            1,
            "{place:?} opened more than once: {ids:?}\n{}",
            summary(&all)
        );
    }
    // None ended but node-004's silence, which did.
    let ended: Vec<&String> = watched.ended.keys().collect();
    assert_eq!(ended.len(), 1, "ended: {ended:?}\n{}", summary(&all));
    assert!(ended[0].starts_with("node_silent/node-004/"), "{ended:?}");
    // Each faulty node drained once, by railscope, and none resumed.
    for node in ["node-002", "node-003", "node-004"] {
        let v = cluster.show(node);
        assert!(v.drained(), "{node}: {v:?}");
        assert!(
            v.reason
                .as_deref()
                .is_some_and(|r| r.starts_with("railscope: ")),
            "{node}: {v:?}"
        );
        assert_eq!(cluster.drains_logged(node), 1, "{node}\n{}", cluster.logs());
        let outcomes = c.action_outcomes(node);
        assert_eq!(
            outcomes.iter().filter(|o| *o == "drain done").count(),
            1,
            "{node}: {outcomes:?}"
        );
        assert!(
            !outcomes.iter().any(|o| o.starts_with("resume")),
            "{node}: {outcomes:?}"
        );
    }
    assert!(!cluster.show("node-001").drained());
    assert_eq!(cluster.drains_logged("node-001"), 0);
    assert!(c.action_outcomes("node-001").is_empty());

    for r in running.into_iter().flatten() {
        let _ = r.signal(libc::SIGKILL);
    }
    let (ok, _, err) = c.stop();
    assert!(ok, "{err}");
    drop(cluster);
    let _ = fs::remove_dir_all(&dir);
}
