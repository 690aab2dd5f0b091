//! The Grafana dashboard in the repository (dist/grafana/railscope.json) against a real
//! Prometheus fed by the collector's remote-write: a simulated fleet (monitor-testkit: two
//! jobs, a slow GPU, a degraded, a flapping and a congested port, an XID, QP errors) sends
//! its frames to a `railscope-collector run --remote-write`, which also remote-writes its
//! findings' series; every template variable's query
//! must list values, and every panel's every query, with the variables substituted as
//! Grafana does, must run without error and return data.

mod tsdb;

use std::{
    net::{SocketAddr, TcpStream},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use monitor_testkit::{SimulatedFleet, free_tcp_port, free_udp_port};
use monitor_wire::Key;
use serde_json::Value as Json;
use tsdb::{Server, Tsdb, now_ms, tsdb_binary};

const KEY: [u8; 32] = [0x42; 32];
const TICKS: u64 = 180;

fn dashboard() -> Json {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../dist/grafana/railscope.json");
    let text = std::fs::read_to_string(&path).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

struct Collector(Child);

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn prometheus_get(base: &str, path: &str, query: &[(&str, &str)]) -> Json {
    let mut request = ureq::get(&format!("{base}{path}"));
    for (k, v) in query {
        request = request.query(k, v);
    }
    let text = request
        .config()
        .http_status_as_error(false)
        .build()
        .call()
        .unwrap()
        .into_body()
        .read_to_string()
        .unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Every `expr` of the dashboard's panels (rows' nested panels too), with its panel's title.
fn panel_queries(dashboard: &Json) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack: Vec<&Json> = dashboard["panels"].as_array().unwrap().iter().collect();
    while let Some(p) = stack.pop() {
        if let Some(nested) = p["panels"].as_array() {
            stack.extend(nested);
        }
        for t in p["targets"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
            out.push((
                p["title"].as_str().unwrap().to_owned(),
                t["expr"].as_str().unwrap().to_owned(),
            ));
        }
    }
    out
}

#[test]
fn every_panel_of_the_grafana_dashboard_gets_data_from_prometheus() {
    let Some(binary) = tsdb_binary(Tsdb::Prometheus) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (udp, http) = (free_udp_port(), free_tcp_port());
    // As docs/deployment.md says: the node series and the findings' series both come by
    // remote-write; Prometheus scrapes nothing.
    let prometheus = Server::start(Tsdb::Prometheus, &binary, free_tcp_port(), dir.path());

    let key_file = dir.path().join("wire.key");
    std::fs::write(&key_file, KEY).unwrap();
    let data = dir.path().join("data");
    let _collector = Collector(
        Command::new(env!("CARGO_BIN_EXE_railscope-collector"))
            .args(["run", "--listen", &format!("127.0.0.1:{udp}")])
            .args(["--http", &format!("127.0.0.1:{http}")])
            .args(["--key", key_file.to_str().unwrap()])
            .args(["--data", data.to_str().unwrap()])
            .args([
                "--remote-write",
                &format!("prom={}/api/v1/write", prometheus.base()),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(dir.path().join("collector.log")).unwrap(),
            ))
            .spawn()
            .unwrap(),
    );
    let started = Instant::now();
    while TcpStream::connect(("127.0.0.1", http)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "collector not up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let mut fleet = SimulatedFleet::builder(8)
        .job("slurm:42", 0..4)
        .job("slurm:43", 4..8)
        .slow_gpu(2, 3)
        .degraded_port(5, 1)
        .flapping_port(6, 2)
        .congested_port(7, 0)
        .roce()
        .xid(1, 4, 79, 30)
        .qp_errors(3, "slurm:42")
        .cm_rejects(5, "slurm:43")
        .ticks_before_now(TICKS)
        .build(Key::from_bytes(KEY));
    let collector: SocketAddr = format!("127.0.0.1:{udp}").parse().unwrap();
    fleet.send_ticks(collector, TICKS).unwrap();

    // Remote-write follows the archive: wait until Prometheus has every node's GPUs.
    let base = prometheus.base();
    let started = Instant::now();
    loop {
        let body = prometheus_get(
            &base,
            "/api/v1/query",
            &[("query", "count(railscope_gpu_sm_util_ratio)")],
        );
        if body["data"]["result"][0]["value"][1] == "64" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "Prometheus never held the fleet's 64 GPUs: {body}; collector log in {}",
            dir.path().display()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // And the findings, which the collector remote-writes every `tick-s`.
    let started = Instant::now();
    loop {
        let body = prometheus_get(
            &base,
            "/api/v1/query",
            &[("query", "count(railscope_finding_active)")],
        );
        if body["data"]["result"][0]["value"][1]
            .as_str()
            .is_some_and(|n| n != "0")
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "Prometheus never received a finding by remote-write: {body}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    let dashboard = dashboard();
    // The template variables: each query lists values; the job's is substituted with the
    // first job, the node's with Grafana's "All" (its allValue).
    let mut substitutions: Vec<(String, String)> = vec![
        ("$__rate_interval".into(), "1m".into()),
        ("$__interval".into(), "15s".into()),
    ];
    for v in dashboard["templating"]["list"].as_array().unwrap() {
        if v["type"] != "query" {
            continue;
        }
        let name = v["name"].as_str().unwrap();
        let definition = v["definition"].as_str().unwrap();
        let inner = definition
            .strip_prefix("label_values(")
            .and_then(|s| s.strip_suffix(')'))
            .unwrap_or_else(|| panic!("variable {name}: {definition} is not label_values(...)"));
        let (metric, label) = inner.split_once(',').unwrap();
        let body = prometheus_get(
            &base,
            &format!("/api/v1/label/{}/values", label.trim()),
            &[("match[]", metric.trim())],
        );
        let values: Vec<&str> = body["data"]
            .as_array()
            .unwrap_or_else(|| panic!("variable {name}: {body}"))
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert!(
            !values.is_empty(),
            "variable {name} ({definition}) lists no value"
        );
        if name == "job_id" {
            assert_eq!(values, ["slurm:42", "slurm:43"]);
            substitutions.push(("$job_id".into(), values[0].into()));
        } else {
            substitutions.push((format!("${name}"), v["allValue"].as_str().unwrap().into()));
        }
    }

    let end = now_ms() / 1000 + 30;
    let start = end - 3600;
    let (start, end) = (start.to_string(), end.to_string());
    let queries = panel_queries(&dashboard);
    assert!(queries.len() >= 18, "{} queries", queries.len());
    let mut failures = Vec::new();
    for (title, expr) in &queries {
        let mut q = expr.clone();
        for (var, value) in &substitutions {
            q = q.replace(var.as_str(), value);
        }
        assert!(!q.contains('$'), "{title}: a variable left in {q}");
        let body = prometheus_get(
            &base,
            "/api/v1/query_range",
            &[
                ("query", &q),
                ("start", &start),
                ("end", &end),
                ("step", "15"),
            ],
        );
        if body["status"] != "success" {
            failures.push(format!("{title}: {q}: {}", body["error"]));
        } else if body["data"]["result"].as_array().is_none_or(Vec::is_empty) {
            failures.push(format!("{title}: {q}: no data"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} panel queries failed:\n{}",
        failures.len(),
        queries.len(),
        failures.join("\n")
    );
}
