//! Every metrics route of a collector as an operator runs it passes Prometheus' own linter,
//! `promtool check metrics`: each family has `# HELP` and `# TYPE`, counters end in `_total`,
//! names carry base units; the one complaint left is [`KNOWN_COMPLAINTS`]. The collector is fed by two
//! real `railscope agent` processes (the mlx5 fixture tree with the NVML stand-in's 8 GPUs,
//! and the rxe fixture tree without GPUs), so `/metrics` holds the agent's real series; it
//! names a remote-write endpoint and an Alertmanager (nothing listens on either) so that
//! their families are there too.
//!
//! Skipped with a message where promtool (Debian package `prometheus`) is missing, unless
//! `RAILSCOPE_REQUIRE_PROMTOOL=1` (`cargo xtask test` sets it).

use std::{
    ffi::OsStr,
    io::Write as _,
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use monitor_testkit::{
    CollectorProcess, FixtureAgent, KEY_HEX, agent_binary_next_to, key_file, scratch_dir,
    standin_with_script, sysfs_fixture,
};
use monitor_wire::names::metric;

const COLLECTOR: &str = env!("CARGO_BIN_EXE_railscope-collector");
const PROMTOOL: &str = "/usr/bin/promtool";

fn promtool_installed(test: &str) -> bool {
    if Path::new(PROMTOOL).is_file() {
        return true;
    }
    assert!(
        !std::env::var("RAILSCOPE_REQUIRE_PROMTOOL").is_ok_and(|v| v == "1"),
        "{test}: {PROMTOOL} is missing, and RAILSCOPE_REQUIRE_PROMTOOL=1"
    );
    eprintln!(
        "SKIPPED {test}: {PROMTOOL} is missing (Debian package prometheus; \
         `cargo xtask setup` installs it)"
    );
    false
}

/// What `promtool check metrics` prints about `text` (stdout and stderr), and whether it
/// exited successfully.
fn promtool_check(text: &str) -> (bool, String) {
    let mut child = Command::new(PROMTOOL)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {PROMTOOL}: {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

/// Whether `text` has a sample line of family `name` for node `node`.
fn has_series(text: &str, name: &str, node: &str) -> bool {
    let start = format!("{name}{{node=\"{node}\"");
    text.lines().any(|l| l.starts_with(&start))
}

/// What promtool may say, and why it stays: the agent's GPU energy counter is in NVML's own
/// unit, millijoules, an integer counter; promtool wants the base unit (joules), which would
/// make it a float counter under a new name (the agent, the archive's history and every
/// query that reads it). Nothing else may appear.
const KNOWN_COMPLAINTS: &[&str] =
    &["railscope_gpu_energy_millijoules_total use base unit \"joules\" instead of \"millijoules\""];

#[test]
fn every_metrics_route_passes_promtool_check_metrics() {
    const TEST: &str = "every_metrics_route_passes_promtool_check_metrics";
    if !promtool_installed(TEST) {
        return;
    }
    let dir = scratch_dir("metrics-promtool");
    let key = key_file(&dir, KEY_HEX);
    let config = dir.join("collector.toml");
    // Nothing listens on port 9: the Alertmanager's and the writer's families are there all
    // the same.
    std::fs::write(
        &config,
        "[actions]\ndry-run = false\n\n[actions.alertmanager]\n\
         urls = [\"http://127.0.0.1:9/\"]\n",
    )
    .unwrap();
    let collector = CollectorProcess::command(COLLECTOR, &key, &dir.join("data"))
        .args([OsStr::new("--config"), config.as_os_str()])
        .args(["--remote-write", "vm=http://127.0.0.1:9/api/v1/write"])
        .start();
    let to = collector.udp_addr().to_string();
    let railscope = agent_binary_next_to(COLLECTOR);
    let gpus = FixtureAgent::new(&to, &key, &sysfs_fixture("mlx5"))
        .node("gpu-node")
        .nvml_lib(&standin_with_script(&dir))
        .cadence("0.3", "1")
        .spawn(&railscope);
    let soft_roce = FixtureAgent::new(&to, &key, &sysfs_fixture("rxe"))
        .node("rxe-node")
        .args(["--no-gpu"])
        .cadence("0.3", "1")
        .spawn(&railscope);

    // Until both agents' series are on /metrics: the GPUs', the mlx5 ports' and rxe's.
    let wanted = [
        (metric::GPU_UTILIZATION_RATIO, "gpu-node"),
        (metric::IB_PORT_XMIT_BYTES_TOTAL, "gpu-node"),
        (metric::IB_OUT_OF_BUFFER_TOTAL, "gpu-node"),
        (metric::AGENT_RSS_BYTES, "gpu-node"),
        (metric::IB_SENT_PKTS_TOTAL, "rxe-node"),
        // The agent's clock offset and the collector's per-node family of it.
        (metric::AGENT_CLOCK_OFFSET_SECONDS, "rxe-node"),
        (
            "railscope_collector_node_clock_offset_error_seconds",
            "rxe-node",
        ),
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    let fleet = loop {
        let text = collector.get("/metrics");
        if wanted
            .iter()
            .all(|(name, node)| has_series(&text, name, node))
        {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "the agents' series did not reach /metrics in 30 s:\n{text}"
        );
        thread::sleep(Duration::from_millis(300));
    };
    let own = collector.get("/metrics/collector");
    // The routes a large fleet is scraped through (docs/deployment.md): one node, one shard
    // of two (whichever holds gpu-node), the fleet-level families.
    let one_node = collector.get("/metrics?node=gpu-node");
    let shard = (0..2)
        .map(|k| collector.get(&format!("/metrics?shard={k}&shards=2")))
        .find(|text| has_series(text, metric::AGENT_RSS_BYTES, "gpu-node"))
        .expect("no shard of two holds gpu-node");
    let fleet_level = collector.get("/metrics/fleet");
    for agent in [gpus, soft_roce] {
        let (ok, _, err) = agent.signal(libc::SIGINT);
        assert!(ok, "agent failed: {err}");
    }
    let (stopped, _, stderr) = collector.stop();
    assert!(stopped, "{stderr}");

    for (route, text) in [
        ("/metrics", &fleet),
        ("/metrics/collector", &own),
        ("/metrics?node=gpu-node", &one_node),
        ("/metrics?shard=K&shards=2", &shard),
        ("/metrics/fleet", &fleet_level),
    ] {
        let (ok, said) = promtool_check(text);
        let unexpected: Vec<&str> = said
            .lines()
            .filter(|l| !l.trim().is_empty() && !KNOWN_COMPLAINTS.contains(l))
            .collect();
        assert!(
            unexpected.is_empty(),
            "promtool check metrics on {route} (exit ok: {ok}):\n{}",
            unexpected.join("\n")
        );
        // A lint complaint alone is promtool's only reason to fail here.
        assert!(ok || !said.trim().is_empty(), "promtool failed on {route}");
    }
    // promtool reads what it was given: the agents' families, with their help text.
    for (name, _) in wanted {
        let help = format!("# HELP {name} ");
        assert!(fleet.contains(&help), "/metrics lacks {help}");
    }
    // One node's target holds that node only; the fleet target no node's series.
    assert!(has_series(&one_node, metric::AGENT_RSS_BYTES, "gpu-node"));
    assert!(!has_series(&one_node, metric::AGENT_RSS_BYTES, "rxe-node"));
    assert!(!fleet_level.contains(&format!("{}{{", metric::AGENT_RSS_BYTES)));
    assert!(fleet_level.contains("# HELP railscope_findings_total "));
    assert!(own.contains("# HELP railscope_collector_alerts_sent_total "));
    assert!(own.contains("# HELP railscope_collector_remote_write_samples_sent_total "));
}
