//! Per-node keys with real agents: each `railscope agent` holds only its own key, derived
//! from the fleet secret by `railscope-collector node-key` as an operator provisions it, and
//! the collector (`--fleet-secret`) accepts a node's frames only with that node's key.
//! Checked as an operator would, on `/metrics` and the live view: the nodes' series, the
//! drop reasons, which key each node is on, and the archive read back after a rotation.
//!
//! The agents read an mlx5-modelled sysfs tree (`--no-gpu`) and all send from 127.0.0.1, as
//! a tenant with root on one node sends from that node's address.

use std::{
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, SystemTime},
};

use monitor_testkit::{
    CollectorProcess, FixtureAgent, Running, agent_binary_next_to, key_file, scratch_dir,
    sysfs_fixture,
};
use serde_json::Value;

const COLLECTOR: &str = env!("CARGO_BIN_EXE_railscope-collector");

fn railscope() -> PathBuf {
    agent_binary_next_to(COLLECTOR)
}

/// A new random secret (or shared key) at `DIR/NAME.key`, 64 hex characters, mode 600, as
/// `railscope-gen-wire-key` writes one.
fn random_key(dir: &Path, name: &str) -> PathBuf {
    use std::{io::Read as _, os::unix::fs::PermissionsExt as _};
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .unwrap();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let path = dir.join(format!("{name}.key"));
    std::fs::write(&path, format!("{hex}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// Node `node`'s key file, derived from `secret` by the collector's own command.
fn node_key(dir: &Path, secret: &Path, node: &str) -> PathBuf {
    let out = Command::new(COLLECTOR)
        .args(["node-key", "--node", node, "--fleet-secret"])
        .arg(secret)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hex = String::from_utf8(out.stdout).unwrap();
    assert_eq!(hex.trim().len(), 64, "{hex:?}");
    let sub = dir.join(format!(
        "{node}-{}",
        secret.file_stem().unwrap().to_str().unwrap()
    ));
    std::fs::create_dir_all(&sub).unwrap();
    key_file(&sub, hex.trim())
}

/// A fast agent on the fixture tree as `node`, sealing with `key`.
fn agent(collector: &CollectorProcess, node: &str, key: &Path) -> Running {
    FixtureAgent::new(
        &collector.udp_addr().to_string(),
        key,
        &sysfs_fixture("mlx5"),
    )
    .node(node)
    .args(["--no-gpu"])
    .cadence("0.2", "0.5")
    .spawn(railscope())
}

/// The value of the exposition line `start VALUE` (0 when absent).
fn metric(text: &str, start: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(start) && l[start.len()..].starts_with(' '))
        .map_or(0, |l| {
            l[start.len() + 1..].trim().parse::<f64>().unwrap() as u64
        })
}

fn dropped(text: &str, reason: &str) -> u64 {
    metric(
        text,
        &format!("railscope_collector_frames_dropped_total{{reason=\"{reason}\"}}"),
    )
}

/// The live view's entry for `node`.
fn live(collector: &CollectorProcess, node: &str) -> Value {
    let nodes = collector.json("/api/v1/live/nodes");
    nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node"] == node)
        .cloned()
        .unwrap_or_else(|| panic!("no node {node} in {nodes}"))
}

/// Points of `railscope_ib_port_xmit_bytes_total` per node, as `railscope query` reads them
/// from the collector's archive.
fn archived_points(collector: &CollectorProcess) -> std::collections::BTreeMap<String, usize> {
    let out = Command::new(railscope())
        .args(["query", "--collector", &collector.url(), "--json", "series"])
        .args(["railscope_ib_port_xmit_bytes_total", "--start", "-1h"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut points = std::collections::BTreeMap::new();
    for s in json["series"].as_array().unwrap() {
        let node = s["labels"]["node"].as_str().unwrap().to_owned();
        *points.entry(node).or_default() += s["points"].as_array().unwrap().len();
    }
    points
}

fn stop(agent: Running) -> String {
    let (ok, _, err) = agent.signal(libc::SIGINT);
    assert!(ok, "{err}");
    err
}

#[test]
fn a_real_agent_with_root_on_one_node_cannot_speak_for_another() {
    let dir = scratch_dir("node-keys-forgery");
    let secret = random_key(&dir, "fleet");
    let key_a = node_key(&dir, &secret, "gpu-node-001");
    let key_b = node_key(&dir, &secret, "gpu-node-002");
    let collector = CollectorProcess::fleet_command(COLLECTOR, &secret, &dir.join("data")).start();
    let a = agent(&collector, "gpu-node-001", &key_a);
    let b = agent(&collector, "gpu-node-002", &key_b);
    thread::sleep(Duration::from_secs(2));
    // Root on gpu-node-001 runs an agent that names gpu-node-002, with the only key it has.
    let forger = agent(&collector, "gpu-node-002", &key_a);
    thread::sleep(Duration::from_secs(3));
    stop(forger);
    let text = collector.get("/metrics");
    let live_b = live(&collector, "gpu-node-002");
    stop(a);
    stop(b);
    let (_, _, collector_err) = collector.signal(libc::SIGTERM);

    let wrong = dropped(&text, "wrong_node_key");
    assert!(
        wrong >= 5,
        "{wrong} frames refused as wrong_node_key:\n{text}"
    );
    assert_eq!(dropped(&text, "bad_mac"), 0, "{text}");
    // gpu-node-002 is only its own agent: one session, on its own key, its ports shown.
    assert_eq!(live_b["sessions"], 1, "{live_b}");
    assert_eq!(live_b["key"], "node", "{live_b}");
    assert_eq!(live_b["duplicates"], 0, "{live_b}");
    assert!(
        text.contains("railscope_ib_port_xmit_bytes_total{node=\"gpu-node-002\""),
        "{text}"
    );
    assert_eq!(
        metric(&text, "railscope_collector_nodes_by_key{key=\"node\"}"),
        2
    );
    // The log names both nodes, once in a while (rate-limited).
    assert!(
        collector_err.contains("sealed with the key of node \\\"gpu-node-001\\\"")
            || collector_err.contains("sealed with the key of node \"gpu-node-001\""),
        "{collector_err}"
    );
}

#[test]
fn a_rotation_drops_nothing_and_the_previous_secret_is_refused_after_its_window() {
    let dir = scratch_dir("node-keys-rotation");
    let old = random_key(&dir, "old");
    let new = random_key(&dir, "new");
    let data = dir.join("data");
    let until = humantime::format_rfc3339_seconds(SystemTime::now() + Duration::from_secs(3600))
        .to_string();
    let rotating = |until: &str| {
        CollectorProcess::fleet_command(COLLECTOR, &new, &data)
            .args(["--previous-fleet-secret"])
            .args([&old])
            .args(["--previous-fleet-secret-until", until])
            .start()
    };
    let collector = rotating(&until);
    // Both nodes start on their old keys; n1 moves to its new key, n2 stays on its old one.
    let n1 = agent(&collector, "n1", &node_key(&dir, &old, "n1"));
    let n2 = agent(&collector, "n2", &node_key(&dir, &old, "n2"));
    thread::sleep(Duration::from_secs(2));
    assert_eq!(live(&collector, "n1")["key"], "previous_node");
    stop(n1);
    let n1 = agent(&collector, "n1", &node_key(&dir, &new, "n1"));
    thread::sleep(Duration::from_secs(2));
    let text = collector.get("/metrics");
    assert_eq!(live(&collector, "n1")["key"], "node");
    assert_eq!(live(&collector, "n2")["key"], "previous_node");
    let dropped_total: u64 = text
        .lines()
        .filter(|l| l.starts_with("railscope_collector_frames_dropped_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(dropped_total, 0, "nothing dropped during the move:\n{text}");
    stop(n1);
    stop(n2);
    thread::sleep(Duration::from_millis(500));
    let before = archived_points(&collector);
    collector.signal(libc::SIGTERM);
    assert!(before.get("n1").is_some_and(|&n| n > 0), "{before:?}");
    assert!(before.get("n2").is_some_and(|&n| n > 0), "{before:?}");

    // The window has ended: n2, still on its old key, is refused and told why; what the
    // archive holds from before (frames sealed with the old keys) is still read back.
    let collector = rotating("2000-01-01T00:00:00Z");
    let n2 = agent(&collector, "n2", &node_key(&dir, &old, "n2"));
    thread::sleep(Duration::from_secs(2));
    let text = collector.get("/metrics");
    let after = archived_points(&collector);
    stop(n2);
    let (_, _, collector_err) = collector.signal(libc::SIGTERM);
    assert!(dropped(&text, "retired_key") >= 2, "{text}");
    assert!(
        collector_err.contains("rotation window has ended"),
        "{collector_err}"
    );
    // Every point archived during the rotation, sealed with old and new keys, is read back.
    assert_eq!(
        after, before,
        "points per node before and after the window ended"
    );
}

#[test]
fn shared_key_nodes_and_per_node_nodes_mix_until_a_node_moves() {
    let dir = scratch_dir("node-keys-mixed");
    let secret = random_key(&dir, "fleet");
    let shared = random_key(&dir, "shared");
    let collector = CollectorProcess::fleet_command(COLLECTOR, &secret, &dir.join("data"))
        .args(["--key"])
        .args([&shared])
        .start();
    let legacy = agent(&collector, "legacy-node", &shared);
    let moved = agent(
        &collector,
        "moved-node",
        &node_key(&dir, &secret, "moved-node"),
    );
    thread::sleep(Duration::from_secs(2));
    // Whoever kept the shared key speaks for the node that moved off it.
    let forger = agent(&collector, "moved-node", &shared);
    thread::sleep(Duration::from_secs(2));
    stop(forger);
    let text = collector.get("/metrics");
    let (legacy_live, moved_live) = (
        live(&collector, "legacy-node"),
        live(&collector, "moved-node"),
    );
    stop(legacy);
    stop(moved);
    collector.signal(libc::SIGTERM);
    assert_eq!(legacy_live["key"], "shared", "{legacy_live}");
    assert_eq!(moved_live["key"], "node", "{moved_live}");
    assert_eq!(moved_live["sessions"], 1, "{moved_live}");
    assert!(dropped(&text, "wrong_node_key") >= 2, "{text}");
    assert_eq!(dropped(&text, "bad_mac"), 0, "{text}");
    assert!(
        text.contains("railscope_ib_port_xmit_bytes_total{node=\"legacy-node\""),
        "{text}"
    );
}
