//! `railscope capture` and `railscope report` as an operator runs them, on a copy of the rxe
//! fixture tree whose port state the test flips on a known schedule (this host has no RDMA
//! and no kprobes, so there are no port events here: transitions come from the snapshots; the
//! guest scenario `capture-flap` has the probes' events). Also: a node without RDMA devices
//! says so in one line and fails, and a capture killed with SIGKILL still reports.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use monitor_testkit::{
    KEY_HEX, copy_tree, free_udp_port, json_output, key_file, scratch_dir, spawn_json_listener,
    sysfs_fixture,
};

const RAILSCOPE: &str = env!("CARGO_BIN_EXE_railscope");

/// A copy of the rxe fixture (rxe0/1 and rxe1/1, both ACTIVE).
fn rxe_tree(dir: &Path) -> PathBuf {
    let tree = dir.join("sys");
    copy_tree(&sysfs_fixture("rxe"), &tree);
    tree
}

fn set_port(tree: &Path, up: bool) {
    let port = tree.join("class/infiniband/rxe0/ports/1");
    let (state, phys) = if up {
        ("4: ACTIVE", "5: LinkUp")
    } else {
        ("1: DOWN", "3: Disabled")
    };
    std::fs::write(port.join("state"), format!("{state}\n")).unwrap();
    std::fs::write(port.join("phys_state"), format!("{phys}\n")).unwrap();
}

/// Down periods of rxe0/1 as (ms after the previous up, ms down).
const PATTERN: [(u64, u64); 3] = [(1500, 400), (700, 250), (1200, 600)];

fn capture_command(tree: &Path, out: &Path) -> Command {
    let mut cmd = Command::new(RAILSCOPE);
    cmd.args([
        "capture",
        "--interval",
        "10ms",
        "--pre",
        "1s",
        "--post",
        "1s",
    ])
    .arg("--sysfs")
    .arg(tree)
    .arg("--out")
    .arg(out)
    .env_remove("RUST_BACKTRACE")
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    cmd
}

/// Flips rxe0/1 on `PATTERN`; returns the time it was down in all.
fn flap(tree: &Path) -> Duration {
    let mut down = Duration::ZERO;
    for (up_ms, down_ms) in PATTERN {
        thread::sleep(Duration::from_millis(up_ms));
        let t = Instant::now();
        set_port(tree, false);
        thread::sleep(Duration::from_millis(down_ms));
        set_port(tree, true);
        down += t.elapsed();
    }
    down
}

fn report_json(file: &Path) -> serde_json::Value {
    json_output(
        RAILSCOPE,
        ["report".as_ref(), "--json".as_ref(), file.as_os_str()],
    )
}

fn port<'a>(report: &'a serde_json::Value, device: &str) -> &'a serde_json::Value {
    report["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["port"]["device"] == device)
        .unwrap_or_else(|| panic!("no {device} in {report}"))
}

#[test]
fn a_flapping_port_is_named_with_its_downs_and_time_down() {
    let dir = scratch_dir("capture-flap");
    let tree = rxe_tree(&dir);
    let file = dir.join("flap.rscap");
    let child = capture_command(&tree, &file)
        .args(["--duration", "6s"])
        .spawn()
        .unwrap();
    // The capture reads the tree at start; give it a moment before the first flip.
    thread::sleep(Duration::from_millis(300));
    let truth = flap(&tree);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("capture: recording 2 port(s) (rxe0/1, rxe1/1)"),
        "{stderr}"
    );
    assert!(stderr.contains("capture: ended (duration)"), "{stderr}");

    let report = report_json(&file);
    assert_eq!(report["sources"][0]["ended"], "duration");
    let flapped = port(&report, "rxe0");
    assert_eq!(flapped["verdict"], "flapping", "{flapped}");
    assert_eq!(flapped["transitions_from"], "snapshots");
    assert_eq!(flapped["down_transitions"], PATTERN.len());
    assert_eq!(flapped["up_transitions"], PATTERN.len());
    // From snapshots, each edge is seen within one interval (10 ms) plus scheduling: allow
    // 20 ms per edge.
    let down_ns = flapped["time_down_ns"].as_u64().unwrap();
    let slack = 2 * PATTERN.len() as u64 * 20_000_000;
    assert!(
        down_ns.abs_diff(truth.as_nanos() as u64) <= slack,
        "down {down_ns} ns, truth {truth:?}"
    );
    let stable = port(&report, "rxe1");
    assert_eq!(stable["verdict"], "stable", "{stable}");
    assert_eq!(stable["down_transitions"], 0);

    // The text report and the pictures.
    let text = Command::new(RAILSCOPE)
        .args(["report", "--svg"])
        .arg(dir.join("svg"))
        .arg(&file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("rxe0/1: FLAPPING"), "{text}");
    assert!(text.contains("rxe1/1: STABLE"), "{text}");
    let svg = std::fs::read_dir(dir.join("svg"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().contains("rxe0-1"))
        .expect("rxe0's picture");
    let svg = std::fs::read_to_string(svg).unwrap();
    assert!(svg.starts_with("<svg"), "{svg}");
    // One red rectangle per down period.
    assert_eq!(svg.matches("<title>down ").count(), PATTERN.len());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_capture_killed_with_sigkill_reports_up_to_its_last_record() {
    let dir = scratch_dir("capture-kill");
    let tree = rxe_tree(&dir);
    let file = dir.join("killed.rscap");
    let mut child = capture_command(&tree, &file).spawn().unwrap();
    thread::sleep(Duration::from_millis(300));
    let (up_ms, down_ms) = PATTERN[0];
    thread::sleep(Duration::from_millis(up_ms));
    set_port(&tree, false);
    thread::sleep(Duration::from_millis(down_ms));
    set_port(&tree, true);
    // The post-trigger window's snapshots are flushed each second: wait for one flush.
    thread::sleep(Duration::from_millis(1500));
    child.kill().unwrap();
    child.wait().unwrap();
    let report = report_json(&file);
    assert_eq!(report["sources"][0]["ended"], "cut (no trailer)");
    let flapped = port(&report, "rxe0");
    assert_eq!(flapped["down_transitions"], 1, "{flapped}");
    assert_eq!(flapped["up_transitions"], 1, "{flapped}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_node_without_rdma_says_so_in_one_line() {
    let dir = scratch_dir("capture-none");
    let out = capture_command(&dir, &dir.join("none.rscap"))
        .args(["--duration", "1s"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.trim(),
        format!(
            "Error: no InfiniBand/RoCE port under {}: nothing to capture on this node",
            dir.join("class/infiniband").display()
        )
    );
    assert!(!dir.join("none.rscap").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_truncated_or_corrupt_file_is_reported_up_to_the_bad_offset() {
    let dir = scratch_dir("capture-cut");
    let tree = rxe_tree(&dir);
    let file = dir.join("whole.rscap");
    let out = capture_command(&tree, &file)
        .args(["--duration", "2s"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let bytes = std::fs::read(&file).unwrap();
    let cut = dir.join("cut.rscap");
    std::fs::write(&cut, &bytes[..bytes.len() - 5]).unwrap();
    let report = report_json(&cut);
    let stopped = report["sources"][0]["stopped"].as_str().unwrap();
    assert!(stopped.starts_with("torn record at offset "), "{stopped}");
    assert!(report["sources"][0]["frames"].as_u64().unwrap() >= 1);
    // Not a capture at all: one line naming the file and the offset.
    let bad = dir.join("bad.rscap");
    std::fs::write(&bad, b"not a capture file").unwrap();
    let out = Command::new(RAILSCOPE)
        .arg("report")
        .arg(&bad)
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("not a readable capture file: no RSCF magic (at offset 0)")
            && stderr.contains("bad.rscap"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The capture from the test bed shipped with the docs (`capture-flap`, Debian 6.1: rxe0/rxe1
/// flapped five times, rxe2/rxe3 under ib_write_bw).
fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples/capture-flap.rscap")
}

#[test]
fn the_shipped_example_reports_its_flapping_pair_and_draws_it() {
    let dir = scratch_dir("capture-example");
    let out = Command::new(RAILSCOPE)
        .args(["report", "--svg"])
        .arg(&dir)
        .arg(example())
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for (device, verdict) in [
        ("rxe0", "FLAPPING"),
        ("rxe1", "FLAPPING"),
        ("rxe2", "STABLE"),
        ("rxe3", "STABLE"),
    ] {
        assert!(
            text.contains(&format!("{device}/1: {verdict}")),
            "{device}: {text}"
        );
    }
    let report = report_json(&example());
    for device in ["rxe0", "rxe1"] {
        let p = port(&report, device);
        assert_eq!(p["down_transitions"], 5, "{p}");
        assert_eq!(p["transitions_from"], "events", "{p}");
    }
    let pictures = std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(pictures, 4, "one picture per port");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every (series, time, value) and (event, time) of a capture file, read with the library.
type Truth = (
    std::collections::BTreeSet<String>,
    std::collections::BTreeSet<String>,
    u64,
);

fn truth(bytes: &[u8]) -> Truth {
    let mut samples = std::collections::BTreeSet::new();
    let mut events = std::collections::BTreeSet::new();
    let read = monitor_capture::read_capture(bytes, |_, frame, state| {
        let node = state.node(&frame.node).unwrap();
        for s in &frame.samples {
            let series = node.series(s.id).unwrap();
            let labels: std::collections::BTreeMap<&str, &str> = series.labels.iter().collect();
            match &s.data {
                monitor_wire::SeriesData::Counter(v) => {
                    for p in v {
                        samples.insert(format!(
                            "{} {labels:?} {} {}",
                            series.name, p.unix_ns, p.value
                        ));
                    }
                }
                monitor_wire::SeriesData::Gauge(v) => {
                    for p in v {
                        samples.insert(format!(
                            "{} {labels:?} {} {}",
                            series.name, p.end_unix_ns, p.mean
                        ));
                    }
                }
            }
        }
        for e in &frame.events {
            events.insert(format!(
                "{} {} {}",
                e.unix_ns,
                e.labels.get("device").unwrap_or(""),
                e.text
            ));
        }
    })
    .unwrap();
    (samples, events, read.frames)
}

#[test]
fn replay_sends_every_sample_and_event_at_its_capture_time() {
    let dir = scratch_dir("capture-replay");
    let key = key_file(&dir, KEY_HEX);
    let bytes = std::fs::read(example()).unwrap();
    let (samples, events, frames) = truth(&bytes);
    assert!(!events.is_empty() && !samples.is_empty());

    let port = free_udp_port();
    let listen = spawn_json_listener(RAILSCOPE, port, &key);
    // Listening once the port is taken.
    let start = Instant::now();
    while std::net::UdpSocket::bind(format!("127.0.0.1:{port}")).is_ok() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "listen never bound"
        );
        thread::sleep(Duration::from_millis(20));
    }
    let out = Command::new(RAILSCOPE)
        .arg("replay")
        .arg(example())
        .args([
            "--collector",
            &format!("127.0.0.1:{port}"),
            "--node",
            "replayed",
            "--key",
        ])
        .arg(&key)
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with(&format!("replayed {frames} frames")),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // Every frame was sent; the listener prints them as it decodes them.
    listen.wait_for_stdout_lines(frames as usize, Duration::from_secs(60));
    thread::sleep(Duration::from_millis(200));
    let (_, stdout, _) = listen.interrupt();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len() as u64, frames, "every frame arrives");
    let mut got_samples = std::collections::BTreeSet::new();
    let mut got_events = std::collections::BTreeSet::new();
    for line in &lines {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["node"], "replayed");
        for s in v["samples"].as_array().unwrap() {
            let labels: std::collections::BTreeMap<String, String> = s["labels"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                .collect();
            let labels: std::collections::BTreeMap<&str, &str> = labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            for p in s["points"].as_array().unwrap() {
                let value = if s["kind"] == "counter" {
                    p["value"].as_u64().unwrap().to_string()
                } else {
                    p["value"].as_f64().unwrap().to_string()
                };
                got_samples.insert(format!(
                    "{} {labels:?} {} {value}",
                    s["name"].as_str().unwrap(),
                    p["unix_ns"]
                ));
            }
        }
        for e in v["events"].as_array().unwrap() {
            got_events.insert(format!(
                "{} {} {}",
                e["unix_ns"],
                e["labels"]["device"].as_str().unwrap_or(""),
                e["text"].as_str().unwrap()
            ));
        }
    }
    assert_eq!(got_events, events);
    assert_eq!(got_samples, samples);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_full_disk_is_one_clear_error() {
    let dir = scratch_dir("capture-full");
    let tree = rxe_tree(&dir);
    // /dev/full refuses every write with ENOSPC.
    let out = capture_command(&tree, Path::new("/dev/full"))
        .args(["--duration", "1s"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("Error: writing /dev/full") && last.contains("No space left on device"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
