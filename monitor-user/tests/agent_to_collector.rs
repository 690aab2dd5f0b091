//! The node agent as an operator runs it with a collector: `railscope agent --collector` reads
//! an mlx5-modelled sysfs tree and the NVML stand-in (a scripted 8-GPU replay, not a GPU),
//! samples, and sends authenticated frames that `railscope listen` decodes. Also: a node with
//! neither RDMA devices nor NVML says so and keeps running.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::Duration,
};

const RAILSCOPE: &str = env!("CARGO_BIN_EXE_railscope");
const STANDIN: &str = "libnvidia_ml_standin.so";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/sysfs")
        .join(name)
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("railscope-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The stand-in library (built as a dev-dependency next to this test) copied with the shipped
/// 8-GPU script, so this test has its own replay.
fn standin_with_script(dir: &Path) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let built = [deps.join(STANDIN), deps.join("..").join(STANDIN)]
        .into_iter()
        .find(|p| p.exists())
        .expect(
            "the NVML stand-in is built as a dev-dependency; run `cargo build -p nvml-standin`",
        );
    let lib = dir.join(STANDIN);
    std::fs::copy(built, &lib).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../nvml-standin/scripts/h100x8.json");
    std::fs::copy(script, dir.join("nvml-standin.json")).unwrap();
    lib
}

fn key_file(dir: &Path) -> PathBuf {
    let key = dir.join("wire.key");
    std::fs::write(
        &key,
        "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n",
    )
    .unwrap();
    // Private, as a key file should be (others-readable ones are warned about).
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    key
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child whose stdout and stderr are drained by threads as it runs (a full pipe would
/// otherwise block it).
struct Running {
    child: Child,
    out: thread::JoinHandle<String>,
    err: thread::JoinHandle<String>,
}

fn drain(mut pipe: impl std::io::Read + Send + 'static) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    })
}

fn spawn(args: &[&str]) -> Running {
    let mut child = Command::new(RAILSCOPE)
        .args(args)
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = drain(child.stdout.take().unwrap());
    let err = drain(child.stderr.take().unwrap());
    Running { child, out, err }
}

/// `railscope listen` on loopback, printing JSON lines.
fn spawn_listener(port: &str, key: &str) -> Running {
    spawn(&[
        "listen",
        "--port",
        port,
        "--bind",
        "127.0.0.1",
        "--key",
        key,
        "--json",
    ])
}

/// Stops the child with SIGINT: (exited successfully, stdout, stderr).
fn interrupt(mut running: Running) -> (bool, String, String) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(running.child.id() as libc::pid_t, libc::SIGINT) };
    let status = running.child.wait().unwrap();
    (
        status.success(),
        running.out.join().unwrap(),
        running.err.join().unwrap(),
    )
}

#[test]
fn agent_sends_ib_gpu_counters_and_gpu_events_to_a_collector() {
    let dir = scratch_dir("collector");
    let key = key_file(&dir);
    let lib = standin_with_script(&dir);
    let port = free_udp_port().to_string();
    let key_s = key.to_str().unwrap();
    let listener = spawn_listener(&port, key_s);
    thread::sleep(Duration::from_millis(300));
    let collector = format!("127.0.0.1:{port}");
    let sysfs = fixture("mlx5");
    let agent = spawn(&[
        "agent",
        "--collector",
        &collector,
        "--key",
        key_s,
        "--node",
        "gpu-node-001",
        "--sysfs",
        sysfs.to_str().unwrap(),
        "--nvml-lib",
        lib.to_str().unwrap(),
        "--interval",
        "0.3",
        "--flush",
        "1",
    ]);
    // Long enough for the stand-in's 10 scripted steps (one per read) and a few flushes.
    thread::sleep(Duration::from_secs(6));
    let (agent_ok, agent_out, agent_err) = interrupt(agent);
    thread::sleep(Duration::from_millis(300));
    let (_, frames, listen_err) = interrupt(listener);
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
    // The agent also printed them locally.
    assert_eq!(agent_out.matches("XID 31").count(), 2, "{agent_out}");
    assert!(agent_err.contains("sent "), "{agent_err}");
}

#[test]
fn agent_without_rdma_or_nvml_says_so_and_keeps_sending() {
    let dir = scratch_dir("bare");
    let key = key_file(&dir);
    let empty_sys = dir.join("sys");
    std::fs::create_dir_all(&empty_sys).unwrap();
    let port = free_udp_port().to_string();
    let collector = format!("127.0.0.1:{port}");
    let mut agent = spawn(&[
        "agent",
        "--collector",
        &collector,
        "--key",
        key.to_str().unwrap(),
        "--sysfs",
        empty_sys.to_str().unwrap(),
        "--nvml-lib",
        dir.join("no-such-libnvidia-ml.so").to_str().unwrap(),
        "--interval",
        "0.2",
        "--flush",
        "0.5",
    ]);
    thread::sleep(Duration::from_secs(2));
    assert!(
        agent.child.try_wait().unwrap().is_none(),
        "the agent exited"
    );
    let (ok, _, err) = interrupt(agent);
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
    let key = key_file(&dir);
    let key_s = key.to_str().unwrap();
    let port = free_udp_port().to_string();
    let collector = format!("127.0.0.1:{port}");
    let sysfs = fixture("mlx5");
    let agent = spawn(&[
        "agent",
        "--collector",
        &collector,
        "--key",
        key_s,
        "--sysfs",
        sysfs.to_str().unwrap(),
        "--no-gpu",
        "--interval",
        "0.2",
        "--flush",
        "0.5",
    ]);
    // The first flushes, which carry the schema, go to a port nobody listens on.
    thread::sleep(Duration::from_secs(3));
    let listener = spawn_listener(&port, key_s);
    thread::sleep(Duration::from_secs(4));
    let (agent_ok, _, agent_err) = interrupt(agent);
    thread::sleep(Duration::from_millis(300));
    let (_, frames, listen_err) = interrupt(listener);
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
