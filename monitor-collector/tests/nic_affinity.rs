//! GPU–NIC affinity per job (`nic_affinity`, docs/findings.md) from a real `railscope agent`
//! on an HGX H100 node's tree (`monitor_testkit::hgx`) with the NVML stand-in: job 77's
//! process (a real process in a Slurm job's cgroup) uses GPU 0, which sits under the PCIe
//! switch of `mlx5_0` and `mlx5_1`; its QPs are on `mlx5_7`, across the sockets. Job 78 on GPU 2
//! drives `mlx5_2`, under its own switch. The QPs come from a recorded verb-count snapshot
//! (`railscope agent --verb-counts-from`, the JSON lines the agent prints with `--counters
//! --json`), sent through the agent's own pipeline: this host's kernel has no RDMA for the
//! probes to count. The collector finds exactly one `nic_affinity`: job 77, GPU 0, the NIC it
//! uses and one it should.

use std::{ffi::OsStr, fs, path::Path, time::Duration};

mod browser;

use monitor_testkit::{
    CollectorProcess, FixtureAgent, JobProcesses, KEY_HEX, agent_binary_next_to, hgx::HgxNode,
    key_file, scratch_dir, wait_for,
};
use serde_json::{Value, json};

const COLLECTOR: &str = env!("CARGO_BIN_EXE_railscope-collector");
const NODE: &str = "hgx-7";

/// A snapshot as `railscope agent --counters 1 --json` prints it: `create_qp` counts of a job
/// on a device.
fn verb_counts(lines: &[(&str, &str, &str, u64)], cgroups: &[(&str, String)]) -> String {
    let mut out = String::new();
    for (device, job, step, value) in lines {
        let cgroup = &cgroups.iter().find(|(j, _)| j == job).unwrap().1;
        let line = json!({
            "kind": "verb_count", "snapshot": 1_800_000_000_000_000_000u64,
            "device": device, "verb": "create_qp", "detail": "user", "cgroup": cgroup,
            "job_id": format!("slurm:{job}"), "job_step": step, "value": value,
        });
        out.push_str(&format!("{line}\n"));
    }
    out
}

#[test]
fn a_job_driving_the_far_nic_from_its_gpu_is_a_nic_affinity_finding() {
    // SAFETY: a plain query.
    let root = unsafe { libc::geteuid() } == 0;
    let paths = [
        "system.slice/slurmstepd.scope/job_77/step_0".to_owned(),
        "system.slice/slurmstepd.scope/job_78/step_0".to_owned(),
    ];
    let Some(procs) = JobProcesses::in_cgroups("affinity", &paths) else {
        assert!(
            !root,
            "running as root, but no cgroup2 mount lets this test create cgroups"
        );
        eprintln!("skipped: not root, so no process can be put in a job's cgroup");
        return;
    };
    let dir = scratch_dir("nic-affinity");
    let key = key_file(&dir, KEY_HEX);
    let collector = CollectorProcess::command(COLLECTOR, &key, &dir.join("data"))
        .env("RAILSCOPE_LOG", "warn")
        .start();

    let hgx = HgxNode::new(7);
    let sysfs = dir.join("sysfs");
    hgx.write(&sysfs);
    let nvml = dir.join("nvml");
    fs::create_dir_all(&nvml).unwrap();
    let lib = hgx.standin(&nvml);
    // GPU 0 runs job 77's process, GPU 2 job 78's.
    let script_path = nvml.join("nvml-standin.json");
    let mut script: Value =
        serde_json::from_str(&fs::read_to_string(&script_path).unwrap()).unwrap();
    for (gpu, pid) in [(0, procs.pids[0]), (2, procs.pids[1])] {
        script["gpus"][gpu]["steps"][0]["processes"] =
            json!([{"pid": pid, "memory_bytes": 40_000_000_000u64}]);
    }
    fs::write(&script_path, serde_json::to_string_pretty(&script).unwrap()).unwrap();

    let cgroup_of = |pid: u32| -> String {
        let text = fs::read_to_string(procs.proc_root.join(format!("{pid}/cgroup"))).unwrap();
        text.trim().trim_start_matches("0::").to_owned()
    };
    let cgroups = [
        ("77", cgroup_of(procs.pids[0])),
        ("78", cgroup_of(procs.pids[1])),
    ];
    let counts = dir.join("verb-counts.jsonl");
    fs::write(
        &counts,
        verb_counts(
            &[("mlx5_7", "77", "0", 4), ("mlx5_2", "78", "0", 4)],
            &cgroups,
        ),
    )
    .unwrap();

    let _agent = FixtureAgent::new(&collector.udp_addr().to_string(), &key, &sysfs)
        .node(NODE)
        .nvml_lib(&lib)
        .args([OsStr::new("--verb-counts-from"), counts.as_os_str()])
        .spawn(agent_binary_next_to(COLLECTOR));

    let finding = wait_for("the nic_affinity finding", Duration::from_secs(60), || {
        collector.active_finding("nic_affinity", NODE)
    });
    eprintln!("{finding:#}");
    assert_eq!(finding["gpu"], "0");
    assert_eq!(finding["job_id"], "slurm:77");
    let evidence = &finding["evidence"];
    assert_eq!(evidence["uses"], "mlx5_7");
    assert_eq!(evidence["uses_distance"], "SYS");
    assert!(
        ["mlx5_0", "mlx5_1"].contains(&evidence["should_use"].as_str().unwrap()),
        "{evidence}"
    );
    assert_eq!(evidence["should_use_distance"], "PIX");

    // Job 78 on GPU 2 uses the NIC under its own switch: no finding of its own, and no other
    // finding on a healthy node, over two more findings ticks.
    std::thread::sleep(Duration::from_secs(12));
    let all = collector.json("/api/v1/findings?active=true");
    let rules: Vec<(String, String, String)> = all["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["rule"].as_str().unwrap_or("").to_owned(),
                f["gpu"].as_str().unwrap_or("").to_owned(),
                f["job_id"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        rules,
        vec![(
            "nic_affinity".to_owned(),
            "0".to_owned(),
            "slurm:77".to_owned()
        )],
        "{all:#}"
    );
    job_view_shows_it(&collector);
    drop(procs);
    let _ = fs::remove_dir_all(Path::new(&dir));
}

/// The dashboard's job view of job 77, as an operator opens it: the finding listed with its
/// summary (the NIC used, the one to use) and marked on GPU 0's cell; no error shown.
fn job_view_shows_it(collector: &CollectorProcess) {
    let Some(chromium) = browser::chromium() else {
        return;
    };
    let page = browser::Page::open(
        chromium,
        &format!("{}/?refresh=2#/job/slurm:77", collector.url()),
    );
    let tab = &page.tab;
    browser::wait_until(
        tab,
        "job 77's finding listed",
        "return !!document.querySelector('#job-findings tr[data-finding-rule=\"nic_affinity\"]')",
    );
    let listed = browser::eval(
        tab,
        "const r = document.querySelector('#job-findings tr[data-finding-rule=\"nic_affinity\"]'); \
         return [r.dataset.node, r.dataset.gpu, r.textContent]",
    );
    assert_eq!(listed[0], NODE, "{listed}");
    assert_eq!(listed[1], "0", "{listed}");
    let text = listed[2].as_str().unwrap();
    assert!(text.contains("mlx5_7") && text.contains("idle"), "{text}");
    let marked = browser::eval(
        tab,
        "return [...document.querySelectorAll('#job-grid .cell.gpu[data-finding-rule]')].map(c => \
           [c.dataset.gpu, c.dataset.findingRule])",
    );
    assert_eq!(marked, json!([["0", "nic_affinity"]]), "GPU cells marked");
    browser::screenshot(tab, "job-nic-affinity");
    browser::assert_no_problem(tab, &page.problems, "job 77's view");
}
