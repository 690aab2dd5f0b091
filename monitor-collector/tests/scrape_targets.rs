//! A Prometheus scraping the fleet through one collector as many small targets, as an operator
//! of a large fleet runs it (docs/deployment.md, "Scraping a large fleet"): Prometheus' own
//! HTTP service discovery (`http_sd_configs`) reads `/api/v1/targets` and scrapes one target
//! per node (`/metrics?node=`), and in a second job the same fleet cut into two shards
//! (`/metrics?shard=&shards=2`), plus the fleet-level target (`/metrics/fleet`). The nodes are
//! real `railscope agent` processes, one of them started after Prometheus (discovery follows
//! the fleet as nodes come).
//!
//! Skipped with a message where Prometheus (Debian package `prometheus`) is missing, unless
//! `RAILSCOPE_REQUIRE_TSDB=1` (`cargo xtask test` sets it).

mod tsdb;

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use monitor_testkit::{
    CollectorProcess, FixtureAgent, KEY_HEX, agent_binary_next_to, free_tcp_port, key_file,
    scratch_dir, standin_with_script, sysfs_fixture, wait_for,
};
use monitor_wire::names::metric;
use serde_json::Value;
use tsdb::{Server, Tsdb, tsdb_binary};

const COLLECTOR: &str = env!("CARGO_BIN_EXE_railscope-collector");

/// `label` of each series of a query's answer, with the series' `instance`.
fn by_instance(result: &[Value], label: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for series in result {
        let m = &series["metric"];
        out.entry(m["instance"].as_str().unwrap_or("").to_owned())
            .or_default()
            .insert(m[label].as_str().unwrap_or("").to_owned());
    }
    out
}

#[test]
fn prometheus_scrapes_a_target_per_node_or_per_shard_found_through_http_sd() {
    let Some(prometheus) = tsdb_binary(Tsdb::Prometheus) else {
        return;
    };
    let dir = scratch_dir("scrape-targets");
    let key = key_file(&dir, KEY_HEX);
    let collector = CollectorProcess::command(COLLECTOR, &key, &dir.join("data")).start();
    let to = collector.udp_addr().to_string();
    let railscope = agent_binary_next_to(COLLECTOR);
    let agent = |node: &str, tree: &str| {
        let mut a = FixtureAgent::new(&to, &key, &sysfs_fixture(tree)).node(node);
        a = if tree == "mlx5" {
            a.nvml_lib(&standin_with_script(&dir))
        } else {
            a.args(["--no-gpu"])
        };
        a.cadence("0.3", "1").spawn(&railscope)
    };
    let mut agents = vec![agent("gpu-a", "mlx5"), agent("rxe-b", "rxe")];
    let targets = format!("http://127.0.0.1:{}/api/v1/targets", collector.http);
    let scrape = format!(
        "\n  - job_name: per-node\n    scrape_interval: 1s\n    http_sd_configs:\n      \
         - url: {targets}\n        refresh_interval: 1s\n\
         \n  - job_name: sharded\n    scrape_interval: 1s\n    http_sd_configs:\n      \
         - url: {targets}?shards=2\n        refresh_interval: 1s\n"
    );
    let mut server = Server::start_scraping(
        &prometheus,
        free_tcp_port(),
        &dir.join("prometheus"),
        &scrape,
    );
    // A node that comes after Prometheus started: discovery finds it.
    agents.push(agent("rxe-c", "rxe"));
    let nodes: BTreeSet<String> = ["gpu-a", "rxe-b", "rxe-c"].map(String::from).into();

    // Every node is its own target, up, and the fleet target too.
    let want_up: BTreeSet<String> = nodes.iter().cloned().chain(["fleet".into()]).collect();
    wait_for("every per-node target up", Duration::from_secs(60), || {
        let up = server.instant("up{job=\"per-node\"} == 1");
        let instances: BTreeSet<String> = by_instance(&up, "job").into_keys().collect();
        (instances == want_up).then_some(())
    });
    // The agent's own series of each node come from that node's target only.
    let rss = wait_for("every node's agent RSS", Duration::from_secs(30), || {
        let r = by_instance(
            &server.instant(&format!("{}{{job=\"per-node\"}}", metric::AGENT_RSS_BYTES)),
            "node",
        );
        (r.len() == nodes.len()).then_some(r)
    });
    for (instance, seen) in &rss {
        assert_eq!(
            seen,
            &BTreeSet::from([instance.clone()]),
            "target {instance} carried other nodes' series"
        );
    }
    // GPU series of the GPU node, under its target.
    let gpu = server.instant(&format!(
        "{}{{job=\"per-node\"}}",
        metric::GPU_UTILIZATION_RATIO
    ));
    assert_eq!(
        by_instance(&gpu, "node").into_keys().collect::<Vec<_>>(),
        ["gpu-a"]
    );
    // Each node's health (from the collector) under its own target as well.
    let frames = by_instance(
        &server.instant("railscope_collector_node_frames_total{job=\"per-node\"}"),
        "node",
    );
    assert_eq!(frames.keys().cloned().collect::<BTreeSet<_>>(), nodes);
    // The fleet-level families only on the fleet target, and no node's series there.
    let accepted = server.instant("railscope_collector_frames_accepted_total{job=\"per-node\"}");
    assert_eq!(
        by_instance(&accepted, "job")
            .into_keys()
            .collect::<Vec<_>>(),
        ["fleet"]
    );
    let on_fleet = server.instant(&format!(
        "{{job=\"per-node\",instance=\"fleet\",__name__=~\"{}|railscope_collector_node_frames_total\"}}",
        metric::AGENT_RSS_BYTES
    ));
    assert!(
        on_fleet.is_empty(),
        "node series on the fleet target: {on_fleet:?}"
    );

    // Two shards: both up, and every node's series in exactly one of them.
    wait_for("both shards' nodes", Duration::from_secs(60), || {
        let r = by_instance(
            &server.instant(&format!("{}{{job=\"sharded\"}}", metric::AGENT_RSS_BYTES)),
            "node",
        );
        let all: Vec<&String> = r.values().flatten().collect();
        (all.len() == nodes.len()).then_some(())
    });
    // Both shards and the fleet target up: each is scraped on its own schedule, so the
    // shards' series can be in while the fleet target's first scrape is not (a loaded machine).
    let want_up: BTreeSet<String> = ["fleet", "shard-0-of-2", "shard-1-of-2"]
        .map(String::from)
        .into();
    wait_for("every sharded target up", Duration::from_secs(60), || {
        let up = server.instant("up{job=\"sharded\"} == 1");
        (by_instance(&up, "job").into_keys().collect::<BTreeSet<_>>() == want_up).then_some(())
    });
    let rss = by_instance(
        &server.instant(&format!("{}{{job=\"sharded\"}}", metric::AGENT_RSS_BYTES)),
        "node",
    );
    let mut seen: Vec<&String> = rss.values().flatten().collect();
    seen.sort();
    assert_eq!(
        seen,
        nodes.iter().collect::<Vec<_>>(),
        "each node in exactly one shard: {rss:?}"
    );

    // What the collector says to a target it cannot serve.
    let refused = ureq::get(&format!("{}/metrics?node=no-such-node", collector.url()))
        .call()
        .unwrap_err();
    assert!(
        matches!(refused, ureq::Error::StatusCode(404)),
        "an unknown node: {refused}"
    );

    server.stop();
    for a in agents {
        let (ok, _, err) = a.signal(libc::SIGINT);
        assert!(ok, "agent failed: {err}");
    }
    let (stopped, _, stderr) = collector.stop();
    assert!(stopped, "{stderr}");
}
