//! The collector as an operator runs it, fed by a simulated fleet (monitor-testkit: real
//! frames) of a 64-node job with one slow GPU (thermally throttled) and one degraded port,
//! plus two idle nodes, one with a flapping port: the findings name those three devices and
//! nothing else, the stragglers are exactly the slow GPU and the degraded port with their
//! causes, `railscope-collector findings --json` prints them, and they survive a restart.
//! And the same job sampled as agents sample (adaptively): the stragglers hold in every
//! window.

use std::{
    collections::BTreeSet,
    ffi::OsStr,
    path::Path,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use monitor_testkit::{
    CollectorCommand, CollectorProcess, SimulatedFleet, json_output, key_file, key_from_hex,
    scratch_dir,
};
use serde_json::Value;

const COLLECTOR: &str = env!("CARGO_BIN_EXE_railscope-collector");
const KEY_HEX: &str = "8899aabbccddeeff00112233445566778899aabbccddeeff0011223344556677";

/// The collector on `dir` (key, config, archive), with findings evaluated every second
/// (default 5 s), so the test is quick.
fn collector(dir: &Path) -> CollectorCommand {
    let key = key_file(dir, KEY_HEX);
    let config = dir.join("collector.toml");
    std::fs::write(&config, "[findings]\ntick-s = 1\n").unwrap();
    CollectorProcess::command(COLLECTOR, &key, &dir.join("data"))
        .args([OsStr::new("--config"), config.as_os_str()])
        .args(["--sockets", "1"])
        .env("RAILSCOPE_LOG", "warn")
}

/// SIGTERM, which must end it cleanly.
fn stop(collector: CollectorProcess) {
    let (ok, _, err) = collector.stop();
    assert!(ok, "the collector failed: {err}");
}

/// (rule, node, device or gpu) of each finding.
fn places(findings: &Value) -> BTreeSet<(String, String, String)> {
    findings["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let place = f["device"]
                .as_str()
                .map(|d| format!("{d}/{}", f["port"]))
                .or_else(|| f["gpu"].as_str().map(|g| format!("gpu {g}")))
                .unwrap_or_default();
            (
                f["rule"].as_str().unwrap().to_owned(),
                f["node"].as_str().unwrap().to_owned(),
                place,
            )
        })
        .collect()
}

fn expected() -> BTreeSet<(String, String, String)> {
    [
        ("gpu_thermal_throttle", "node-017", "gpu 3"),
        ("ib_port_degraded", "node-042", "mlx5_5/1"),
        ("ib_symbol_errors", "node-042", "mlx5_5/1"),
        ("ib_link_flapping", "node-065", "mlx5_2/1"),
        ("ib_link_downed", "node-065", "mlx5_2/1"),
        // Down at the fleet's last tick (and at every fourth before).
        ("ib_port_down", "node-065", "mlx5_2/1"),
    ]
    .into_iter()
    .map(|(a, b, c)| (a.into(), b.into(), c.into()))
    .collect()
}

#[test]
fn a_64_node_job_with_a_slow_gpu_and_a_degraded_port() {
    let dir = scratch_dir("findings-e2e");
    let collector = collector(&dir).start();
    let (udp, http) = (collector.udp, collector.http);

    // 5 minutes of a 66-node fleet read every 5 s, ending now: the job on nodes 0-63, nodes
    // 64-65 idle; node-065's port mlx5_2 goes down for 5 s every 20 s.
    let mut fleet = SimulatedFleet::builder(66)
        .job("slurm:4242", 0..64)
        .slow_gpu(17, 3)
        .degraded_port(42, 5)
        .flapping_port(65, 2)
        .flap_period(4, 1)
        .interval(Duration::from_secs(5))
        .flush_every(2)
        .ticks_before_now(60)
        .build(key_from_hex(KEY_HEX));
    let t = Instant::now();
    fleet
        .send_ticks(format!("127.0.0.1:{udp}").parse().unwrap(), 60)
        .unwrap();
    eprintln!("sent in {:?}", t.elapsed());

    // Findings: exactly the three devices' (the engine ticks every second), and the flapping
    // port's downs counted (each burst is judged `fabric-settle-s` after it arrived, so the
    // count grows for a few seconds after the finding opens).
    let start = Instant::now();
    let downs = |f: &Value| {
        f["findings"]
            .as_array()
            .and_then(|l| l.iter().find(|f| f["rule"] == "ib_link_flapping"))
            .and_then(|f| f["evidence"]["downs"].as_u64())
            .unwrap_or(0)
    };
    let findings = loop {
        let f = collector.json("/api/v1/findings?start=-10m");
        if (places(&f) == expected() && downs(&f) >= 10)
            || start.elapsed() > Duration::from_secs(30)
        {
            break f;
        }
        thread::sleep(Duration::from_millis(500));
    };
    eprintln!("findings after {:?}", start.elapsed());
    assert_eq!(places(&findings), expected(), "{findings:#}");
    let list = findings["findings"].as_array().unwrap();
    let id_of = |rule: &str| {
        list.iter()
            .find(|f| f["rule"] == rule)
            .map(|f| f["id"].as_str().unwrap().to_owned())
            .unwrap()
    };
    let flap = list
        .iter()
        .find(|f| f["rule"] == "ib_link_flapping")
        .unwrap();
    assert_eq!(flap["severity"], "critical");
    // 15 downs were sent (UDP: the first burst of 66 new nodes may lose a few on loopback).
    assert!(flap["evidence"]["downs"].as_u64().unwrap() >= 10, "{flap}");
    let throttle = list
        .iter()
        .find(|f| f["rule"] == "gpu_thermal_throttle")
        .unwrap();
    assert_eq!(throttle["job_id"], "slurm:4242");

    // Stragglers: the slow GPU and the degraded port, nothing else, with their causes.
    let t = Instant::now();
    let answer = collector.json("/api/v1/stragglers?job_id=slurm:4242&start=-5m");
    eprintln!("stragglers in {:?}", t.elapsed());
    let jobs = answer["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "{answer:#}");
    let job = &jobs[0];
    assert_eq!(job["job_id"], "slurm:4242");
    assert_eq!(job["nodes"], 64);
    assert_eq!(job["gpus"], 512);
    let stragglers = job["stragglers"].as_array().unwrap();
    assert_eq!(stragglers.len(), 2, "{answer:#}");
    let gpu = stragglers.iter().find(|s| s["gpu"] == "3").unwrap();
    assert_eq!(gpu["node"], "node-017");
    assert!(
        gpu["value"].as_f64().unwrap() < 0.6 && gpu["median"].as_f64().unwrap() > 0.85,
        "{gpu}"
    );
    assert!(gpu["score"].as_f64().unwrap() > 3.5);
    assert_eq!(
        gpu["cause"].as_str(),
        Some(id_of("gpu_thermal_throttle").as_str())
    );
    let port = stragglers.iter().find(|s| s["device"] == "mlx5_5").unwrap();
    assert_eq!(port["node"], "node-042");
    assert_eq!(port["port"], 1);
    assert_eq!(port["metric"], "railscope_ib_port_bytes_per_second");
    let cause = port["cause"].as_str().unwrap();
    assert!(
        cause == id_of("ib_port_degraded") || cause == id_of("ib_symbol_errors"),
        "{port}"
    );
    // Ranked by score.
    let scores: Vec<f64> = stragglers
        .iter()
        .map(|s| s["score"].as_f64().unwrap())
        .collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]));

    // /metrics: the active findings and the totals.
    let page = collector.get("/metrics");
    assert!(
        page.contains(
            "railscope_finding_active{device=\"mlx5_2\",node=\"node-065\",port=\"1\",rule=\"ib_link_flapping\",severity=\"critical\"} 1"
        ),
        "{page}"
    );
    assert!(
        page.contains(
            "railscope_findings_total{rule=\"ib_link_flapping\",severity=\"critical\"} 1"
        )
    );

    // The command line, as an operator asks.
    let printed = json_output(
        COLLECTOR,
        [
            "findings",
            "--json",
            "--collector",
            &format!("http://127.0.0.1:{http}"),
            "--start",
            "-10m",
        ],
    );
    assert_eq!(places(&printed), expected());
    let text = Command::new(COLLECTOR)
        .args([
            "findings",
            "--severity",
            "critical",
            "--collector",
            &format!("http://127.0.0.1:{http}"),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains("ib_link_flapping") && text.contains("node-065 mlx5_2/1"),
        "{text}"
    );
    assert!(!text.contains("ib_port_degraded"), "{text}");

    // A restart: the same findings, still active, from the log.
    let before: Vec<Value> = list.clone();
    stop(collector);
    let collector = self::collector(&dir).ports(udp, http).start();
    let after = collector.json("/api/v1/findings?start=-10m");
    let after = after["findings"].as_array().unwrap();
    let ids = |l: &[Value]| -> BTreeSet<String> {
        l.iter()
            .map(|f| f["id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(ids(after), ids(&before));
    // Those active still active (the flapping port's `ib_port_down` findings of the downs
    // before its last ended when it came back up).
    let active = |l: &[Value]| -> BTreeSet<String> {
        l.iter()
            .filter(|f| f["end"].is_null())
            .map(|f| f["id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(active(after), active(&before), "{after:#?}");
    assert_eq!(active(after).len(), expected().len(), "{after:#?}");
    stop(collector);
    let _ = std::fs::remove_dir_all(&dir);
}

/// (node, GPU or device/port) of each straggler of the only job of an answer.
fn straggler_places(answer: &Value) -> BTreeSet<(String, String)> {
    answer["jobs"][0]["stragglers"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|s| {
                    let place = s["gpu"]
                        .as_str()
                        .map(|g| format!("gpu {g}"))
                        .or_else(|| s["device"].as_str().map(|d| format!("{d}/{}", s["port"])))
                        .unwrap_or_default();
                    (s["node"].as_str().unwrap_or("?").to_owned(), place)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The same job sampled as agents sample it (`adaptive`: the agent's own sampler, stable
/// series sent every ~32 s out of phase, the two directions of a port at different times):
/// the stragglers of a 5-minute window, its end slid by 5 s a dozen times, are always the
/// slow GPU and the degraded port, the port with the same score, no healthy port among them.
#[test]
fn with_adaptive_sampling_the_stragglers_hold_in_every_window() {
    let dir = scratch_dir("stragglers-adaptive");
    let collector = collector(&dir).start();
    let mut fleet = SimulatedFleet::builder(64)
        .job("slurm:4343", 0..64)
        .slow_gpu(17, 3)
        .degraded_port(42, 5)
        .adaptive(true)
        .ticks_before_now(420)
        .build(key_from_hex(KEY_HEX));
    fleet
        .send_ticks(format!("127.0.0.1:{}", collector.udp).parse().unwrap(), 420)
        .unwrap();
    let last = fleet.tick_unix_ns(fleet.ticks() - 1);
    let expected: BTreeSet<(String, String)> = [
        ("node-017".to_owned(), "gpu 3".to_owned()),
        ("node-042".to_owned(), "mlx5_5/1".to_owned()),
    ]
    .into();
    let ask = |end: u64| {
        collector.json(&format!(
            "/api/v1/stragglers?job_id=slurm:4343&start={:.3}&end={:.3}",
            (end - 300_000_000_000) as f64 / 1e9,
            end as f64 / 1e9
        ))
    };
    // The writer appends what was received within moments.
    let start = Instant::now();
    let first = loop {
        let a = ask(last);
        if straggler_places(&a) == expected || start.elapsed() > Duration::from_secs(30) {
            break a;
        }
        thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(straggler_places(&first), expected, "{first:#}");
    let mut scores = Vec::new();
    for i in 0..12 {
        let end = last - i * 5_000_000_000;
        let answer = ask(end);
        assert_eq!(answer["jobs"][0]["gpus"], 512, "{answer:#}");
        assert_eq!(
            straggler_places(&answer),
            expected,
            "window ending {} s before the last sample: {answer:#}",
            i * 5
        );
        let port = answer["jobs"][0]["stragglers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["device"] == "mlx5_5")
            .unwrap();
        scores.push(port["score"].as_f64().unwrap());
    }
    let (lo, hi) = scores
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &s| (lo.min(s), hi.max(s)));
    assert!(lo > 20.0 && hi - lo < 0.02 * lo, "{scores:?}");
    stop(collector);
    let _ = std::fs::remove_dir_all(&dir);
}
