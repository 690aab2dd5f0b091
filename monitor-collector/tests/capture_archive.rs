//! A capture taken on one node studied on a collector: `railscope replay` sends the shipped
//! example capture (docs/examples/capture-flap.rscap, from the test bed) to `railscope
//! collector run`; `railscope report --collector ... --node ...` then reads that node's range
//! back from the archive (through `/api/v1/export`) and must say exactly what `railscope
//! report` says of the file: the same ports, verdicts, down periods and time down.
//!
//! The agent's binary is built next to the collector's before the first use
//! (`monitor_testkit::agent_binary_next_to`), so `cargo test -p monitor-collector` alone runs it.

use std::{
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::Duration,
};

use monitor_testkit::{
    CollectorProcess, KEY_HEX, agent_binary_next_to, json_output, key_file, scratch_dir,
};

const COLLECTOR: &str = env!("CARGO_BIN_EXE_railscope-collector");

fn railscope() -> PathBuf {
    agent_binary_next_to(COLLECTOR)
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples/capture-flap.rscap")
}

fn report_json(args: &[&str]) -> serde_json::Value {
    json_output(
        railscope(),
        ["report", "--json", "--no-svg"].iter().chain(args),
    )
}

/// What must agree between the two reports, per port.
fn facts(report: &serde_json::Value) -> Vec<String> {
    report["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            format!(
                "{}/{} {} downs={} ups={} down_ns={} from={} periods={}",
                p["port"]["device"],
                p["port"]["port"],
                p["verdict"],
                p["down_transitions"],
                p["up_transitions"],
                p["time_down_ns"],
                p["transitions_from"],
                p["downs"]
            )
        })
        .collect()
}

#[test]
fn a_replayed_capture_reports_the_same_from_the_collectors_archive() {
    let dir = scratch_dir("capture-archive");
    let key = key_file(&dir, KEY_HEX);
    let collector = CollectorProcess::command(COLLECTOR, &key, &dir.join("data"))
        .args(["--retention-age", "0"])
        .start();
    let (udp, http) = (collector.udp, collector.http);

    let out = Command::new(railscope())
        .arg("replay")
        .arg(example())
        .args([
            "--collector",
            &format!("127.0.0.1:{udp}"),
            "--node",
            "air-gapped-7",
        ])
        .arg("--key")
        .arg(&key)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The archive writer ticks every 100 ms.
    thread::sleep(Duration::from_millis(500));

    let from_file = report_json(&[example().to_str().unwrap()]);
    let first = from_file["ports"][0]["first_unix_ns"].as_u64().unwrap();
    let last = from_file["ports"][0]["last_unix_ns"].as_u64().unwrap();
    // The range in Unix seconds, a second wider on each side.
    let (from, to) = (
        (first / 1_000_000_000 - 1).to_string(),
        (last / 1_000_000_000 + 1).to_string(),
    );
    let from_archive = report_json(&[
        "--collector",
        &format!("http://127.0.0.1:{http}"),
        "--node",
        "air-gapped-7",
        "--start",
        &from,
        "--end",
        &to,
    ]);
    let _ = collector.stop();
    let _ = std::fs::remove_dir_all(&dir);

    let (file, archive) = (facts(&from_file), facts(&from_archive));
    assert_eq!(file.len(), 4, "{file:?}");
    assert_eq!(archive, file);
    assert_eq!(from_archive["ports"][0]["port"]["node"], "air-gapped-7");
}
