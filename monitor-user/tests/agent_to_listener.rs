//! The node agent as an operator runs it, sending to `railscope listen` (no collector: the
//! collector side is monitor-collector/tests/agent_to_collector.rs): `railscope agent` reads
//! an mlx5-modelled sysfs tree and the NVML stand-in (a scripted 8-GPU replay, not a GPU),
//! samples, and sends authenticated frames that `railscope listen` decodes. Also: a node with
//! neither RDMA devices nor NVML says so and keeps running; a saturated PMA counter and a port
//! without a link ("0 GB/sec") as the listener sees them.

use std::{collections::BTreeSet, thread, time::Duration};

use monitor_testkit::{
    FixtureAgent, KEY_HEX, Running, copy_tree, free_udp_port, json_listener_command, key_file,
    scratch_dir, spawn_json_listener, standin_with_script, sysfs_fixture,
};

const RAILSCOPE: &str = env!("CARGO_BIN_EXE_railscope");

#[test]
fn agent_sends_ib_gpu_counters_and_gpu_events_to_a_collector() {
    let dir = scratch_dir("collector");
    let key = key_file(&dir, KEY_HEX);
    let lib = standin_with_script(&dir);
    let started_unix_ns = unix_now_ns();
    let port = free_udp_port();
    let listener = spawn_json_listener(RAILSCOPE, port, &key);
    thread::sleep(Duration::from_millis(300));
    let collector = format!("127.0.0.1:{port}");
    let sysfs = sysfs_fixture("mlx5");
    let agent = FixtureAgent::new(&collector, &key, &sysfs)
        .node("gpu-node-001")
        .nvml_lib(&lib)
        .cadence("0.3", "1")
        .spawn(RAILSCOPE);
    // Long enough for the stand-in's 10 scripted steps (one per read) and a few flushes.
    thread::sleep(Duration::from_secs(6));
    let (agent_ok, agent_out, agent_err) = agent.interrupt();
    thread::sleep(Duration::from_millis(300));
    let (_, frames, listen_err) = listener.interrupt();
    assert!(agent_ok, "agent failed: {agent_err}");
    assert!(
        !frames.is_empty(),
        "no frame arrived; agent: {agent_err}\nlisten: {listen_err}"
    );

    let frames: Vec<serde_json::Value> = frames
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(frames.iter().all(|f| f["node"] == "gpu-node-001"));
    assert!(
        !listen_err.contains("WARN"),
        "the collector warned (bad frames or key): {listen_err}"
    );

    // Every sample, by series name, with its labels and points.
    let samples: Vec<&serde_json::Value> = frames
        .iter()
        .flat_map(|f| f["samples"].as_array().into_iter().flatten())
        .collect();
    let names: BTreeSet<&str> = samples.iter().filter_map(|s| s["name"].as_str()).collect();
    for expected in [
        "railscope_ib_port_xmit_bytes_total",
        "railscope_ib_np_cnp_sent_total",
        "railscope_ib_port_width_lanes",
        "railscope_gpu_utilization_ratio",
        "railscope_gpu_power_watts",
        "railscope_gpu_sm_util_ratio",
        "railscope_gpu_nvlink_tx_bytes_total",
    ] {
        assert!(
            names.contains(expected),
            "{expected} never sent; sent: {names:?}; {} frames, {} samples; first: {}",
            frames.len(),
            samples.len(),
            frames[0]
        );
    }
    // port_xmit_data counts 4-byte words: the collector gets bytes.
    let words: u64 = std::fs::read_to_string(
        sysfs.join("class/infiniband/mlx5_0/ports/1/counters/port_xmit_data"),
    )
    .unwrap()
    .trim()
    .parse()
    .unwrap();
    let xmit = samples
        .iter()
        .find(|s| {
            s["name"] == "railscope_ib_port_xmit_bytes_total"
                && s["labels"]["device"] == "mlx5_0"
                && s["labels"]["port"] == "1"
        })
        .expect("mlx5_0 port 1 xmit bytes");
    assert!(
        xmit.to_string().contains(&(words * 4).to_string()),
        "expected {} bytes in {xmit}",
        words * 4
    );
    // All 8 GPUs report utilization.
    let gpus: BTreeSet<&str> = samples
        .iter()
        .filter(|s| s["name"] == "railscope_gpu_utilization_ratio")
        .filter_map(|s| s["labels"]["gpu"].as_str())
        .collect();
    assert_eq!(gpus.len(), 8, "{gpus:?}");

    // Every scripted XID arrives as its own event (GPU 3 has XID 31 twice), and the GPU
    // that falls off the bus is reported once.
    let events: Vec<&serde_json::Value> = frames
        .iter()
        .flat_map(|f| f["events"].as_array().into_iter().flatten())
        .collect();
    let xids: Vec<(String, i64)> = events
        .iter()
        .filter(|e| e["kind"] == "xid")
        .map(|e| {
            (
                e["labels"]["gpu"].as_str().unwrap_or("?").to_owned(),
                e["code"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    let count = |gpu: &str, xid: i64| xids.iter().filter(|(g, x)| g == gpu && *x == xid).count();
    assert_eq!(count("3", 31), 2, "{xids:?}");
    assert_eq!(count("5", 48), 1, "{xids:?}");
    assert_eq!(count("5", 63), 1, "{xids:?}");
    assert_eq!(count("7", 79), 1, "{xids:?}");
    let lost: Vec<_> = events.iter().filter(|e| e["kind"] == "gpu_lost").collect();
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(lost[0]["labels"]["gpu"], "7");
    // Every event and sample is stamped on the wall clock, within the agent's run (a GPU lost
    // was once stamped with the monotonic clock, in 1970, and never opened a finding).
    let ended_unix_ns = unix_now_ns();
    let within_run = |t: &serde_json::Value| {
        t.as_u64()
            .is_some_and(|t| (started_unix_ns..=ended_unix_ns).contains(&t))
    };
    for event in &events {
        assert!(
            within_run(&event["unix_ns"]),
            "event outside the run ({started_unix_ns}..{ended_unix_ns}): {event}"
        );
    }
    for sample in &samples {
        for point in sample["points"].as_array().into_iter().flatten() {
            let t = point.get("unix_ns").or_else(|| point.get("end_unix_ns"));
            assert!(
                t.is_some_and(within_run),
                "sample outside the run ({started_unix_ns}..{ended_unix_ns}): {sample}"
            );
        }
    }
    // The agent also printed them locally.
    assert_eq!(agent_out.matches("XID 31").count(), 2, "{agent_out}");
    assert!(agent_err.contains("sent "), "{agent_err}");
}

#[test]
fn agent_without_rdma_or_nvml_says_so_and_keeps_sending() {
    let dir = scratch_dir("bare");
    let key = key_file(&dir, KEY_HEX);
    let empty_sys = dir.join("sys");
    std::fs::create_dir_all(&empty_sys).unwrap();
    let port = free_udp_port();
    let collector = format!("127.0.0.1:{port}");
    let mut agent = FixtureAgent::new(&collector, &key, &empty_sys)
        .nvml_lib(&dir.join("no-such-libnvidia-ml.so"))
        .cadence("0.2", "0.5")
        .spawn(RAILSCOPE);
    thread::sleep(Duration::from_secs(2));
    assert!(agent.is_running(), "the agent exited");
    let (ok, _, err) = agent.interrupt();
    assert!(ok, "{err}");
    assert_eq!(
        err.lines()
            .filter(|l| l.contains("NVML not found: GPU metrics off"))
            .count(),
        1,
        "{err}"
    );
    assert!(err.contains("no RDMA devices"), "{err}");
}

#[test]
fn a_collector_started_after_the_agent_asks_for_the_schema_and_names_every_series() {
    let dir = scratch_dir("late-collector");
    let key = key_file(&dir, KEY_HEX);
    let port = free_udp_port();
    let collector = format!("127.0.0.1:{port}");
    let agent = FixtureAgent::new(&collector, &key, &sysfs_fixture("mlx5"))
        .args(["--no-gpu"])
        .cadence("0.2", "0.5")
        .spawn(RAILSCOPE);
    // The first flushes, which carry the schema, go to a port nobody listens on.
    thread::sleep(Duration::from_secs(3));
    let listener = spawn_json_listener(RAILSCOPE, port, &key);
    thread::sleep(Duration::from_secs(4));
    let (agent_ok, _, agent_err) = agent.interrupt();
    thread::sleep(Duration::from_millis(300));
    let (_, frames, listen_err) = listener.interrupt();
    assert!(agent_ok, "agent failed: {agent_err}");
    assert!(listen_err.contains("asked"), "{listen_err}");
    assert!(agent_err.contains("asked for the schema"), "{agent_err}");

    // The schema refresh is minutes away: the names come from the request's answer.
    let frames: Vec<serde_json::Value> = frames
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let last = frames.last().expect("frames arrived");
    let samples = last["samples"].as_array().unwrap();
    assert!(!samples.is_empty());
    assert!(
        samples.iter().all(|s| s["name"].is_string()),
        "unnamed series in the last frame: {last}"
    );
    assert!(
        frames
            .iter()
            .flat_map(|f| f["samples"].as_array().into_iter().flatten())
            .any(|s| s["name"] == "railscope_ib_port_xmit_bytes_total")
    );
}

/// `railscope listen &` in a script starts it with SIGINT ignored (a non-interactive shell
/// does that to its background jobs): it must still stop on SIGINT, exit 0 and keep what it
/// printed, rather than run until it is killed.
#[test]
fn a_listener_started_with_sigint_ignored_still_stops_on_it_with_its_frames() {
    use std::os::unix::process::CommandExt;

    let dir = scratch_dir("listen-sigint");
    let key = key_file(&dir, KEY_HEX);
    let port = free_udp_port();
    let mut command = json_listener_command(RAILSCOPE, port, &key);
    // SAFETY: `signal` is async-signal-safe, as pre_exec requires.
    unsafe {
        command.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            Ok(())
        });
    }
    let listener = Running::spawn_command(command);
    thread::sleep(Duration::from_millis(300));
    let agent = FixtureAgent::new(&format!("127.0.0.1:{port}"), &key, &sysfs_fixture("mlx5"))
        .node("gpu-node-001")
        .args(["--no-gpu"])
        .cadence("0.2", "0.5")
        .spawn(RAILSCOPE);
    assert!(
        listener.wait_for_stdout_lines(2, Duration::from_secs(30)),
        "no frames printed"
    );
    let (agent_ok, _, agent_err) = agent.interrupt();
    assert!(agent_ok, "agent failed: {agent_err}");
    let (listen_ok, frames, listen_err) = listener.interrupt();
    assert!(listen_ok, "listen did not exit 0 on SIGINT: {listen_err}");
    assert!(frames.lines().count() >= 2, "{frames}");
    for line in frames.lines() {
        let frame: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(frame["node"], "gpu-node-001", "{line}");
    }
}

/// An older HCA's 32-bit `port_xmit_data` stuck at 4294967295 and a port whose `rate` reads
/// "0 GB/sec" (an empty cage, MLNX_OFED): the listener gets
/// `railscope_ib_counter_saturated` = 1 for that counter beside the counter's own value, and a
/// rate of 0; the agent warns once, about the counter only.
#[test]
fn a_saturated_counter_and_an_empty_cage_reach_the_listener() {
    let dir = scratch_dir("saturated");
    let key = key_file(&dir, KEY_HEX);
    let sysfs = dir.join("sys");
    copy_tree(&sysfs_fixture("mlx5"), &sysfs);
    let counter = sysfs.join("class/infiniband/mlx5_0/ports/1/counters/port_xmit_data");
    std::fs::write(&counter, "4294967295\n").unwrap();
    std::fs::write(
        sysfs.join("class/infiniband/mlx5_1/ports/1/rate"),
        "0 GB/sec\n",
    )
    .unwrap();
    let port = free_udp_port();
    let listener = spawn_json_listener(RAILSCOPE, port, &key);
    thread::sleep(Duration::from_millis(300));
    let agent = FixtureAgent::new(&format!("127.0.0.1:{port}"), &key, &sysfs)
        .node("old-hca")
        .cadence("0.3", "1")
        .args(["--no-gpu"])
        .spawn(RAILSCOPE);
    thread::sleep(Duration::from_secs(4));
    let (agent_ok, _, agent_err) = agent.interrupt();
    thread::sleep(Duration::from_millis(300));
    let (_, frames, listen_err) = listener.interrupt();
    assert!(agent_ok, "agent failed: {agent_err}");
    let samples: Vec<serde_json::Value> = frames
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{e}: {l}"))
        })
        .flat_map(|f| f["samples"].as_array().cloned().unwrap_or_default())
        .collect();
    assert!(
        !samples.is_empty(),
        "no sample arrived; agent: {agent_err}\nlisten: {listen_err}"
    );
    let values = |name: &str, device: &str, counter: Option<&str>| -> Vec<f64> {
        samples
            .iter()
            .filter(|s| {
                s["name"] == name
                    && s["labels"]["device"] == device
                    && s["labels"]["port"] == "1"
                    && counter.is_none_or(|c| s["labels"]["counter"] == c)
            })
            .flat_map(|s| s["points"].as_array().cloned().unwrap_or_default())
            .filter_map(|p| p["value"].as_f64())
            .collect()
    };
    let flag = values(
        "railscope_ib_counter_saturated",
        "mlx5_0",
        Some("port_xmit_data"),
    );
    assert!(
        !flag.is_empty() && flag.iter().all(|&v| v == 1.0),
        "saturated flag: {flag:?}; agent: {agent_err}"
    );
    // Only the counter at its maximum is flagged.
    let flagged: BTreeSet<String> = samples
        .iter()
        .filter(|s| s["name"] == "railscope_ib_counter_saturated")
        .map(|s| s["labels"].to_string())
        .collect();
    assert_eq!(flagged.len(), 1, "{flagged:?}");
    // The counter itself is still sent, as read (bytes: words × 4).
    let bytes = values("railscope_ib_port_xmit_bytes_total", "mlx5_0", None);
    assert!(
        bytes.contains(&(4.0 * 4_294_967_295.0)),
        "xmit bytes: {bytes:?}"
    );
    let rate = values("railscope_ib_port_rate_gbps", "mlx5_1", None);
    assert!(
        !rate.is_empty() && rate.iter().all(|&v| v == 0.0),
        "rate: {rate:?}"
    );
    // The IB source's warnings (this host has no ib_core for the probes, which warn too).
    let warnings: Vec<&str> = agent_err
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("ib_sysfs"))
        .collect();
    let path = counter.display().to_string();
    assert!(
        warnings.len() == 1 && warnings[0].contains(&path) && warnings[0].contains("saturated"),
        "expected one warning, about {path}: {agent_err}"
    );
}

fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos() as u64
}
