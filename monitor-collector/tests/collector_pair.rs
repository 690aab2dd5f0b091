//! A collector pair (docs/deployment.md, "A collector pair"): real agents (`railscope agent`
//! on the mlx5 fixture tree with the NVML stand-in) send every frame to two collectors, each
//! with its own archive, both remote-writing to one VictoriaMetrics that deduplicates
//! (`-dedup.minScrapeInterval=1ms`, as the deployment guide says to run it). One collector is
//! killed (SIGKILL) and kept down for a minute, then started again on its data directory.
//! Afterwards both archives hold every sample the agents sent (the one that was down got
//! what it missed from the agents' spools), and the TSDB holds each sample once, as sent.
//!
//! A relay in front of each collector keeps what each agent sent (the same datagrams go to
//! both), and the acknowledgements each collector sent back.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

mod tsdb;

use monitor_testkit::{
    CollectorProcess, FixtureAgent, KEY_HEX, Relay, Running, agent_binary_next_to, free_tcp_port,
    free_udp_port, key_file, key_from_hex, metric_sum, remote_write_caught_up, scratch_dir,
    sent_frames::{
        SentFrames, TsdbComparison, decode_sent, metric_names, points_differing, queried_points,
    },
    standin_with_script, sysfs_fixture,
};
use monitor_wire::Key;
use tsdb::{Server, Tsdb, tsdb_binary};

const COLLECTOR: &str = env!("CARGO_BIN_EXE_railscope-collector");
/// How long one collector of the pair is down (the "a minute").
const DOWN: Duration = Duration::from_secs(60);
const NODES: [&str; 2] = ["gpu-node-001", "gpu-node-002"];

fn key() -> Key {
    key_from_hex(KEY_HEX)
}

/// `railscope`, next to `railscope-collector`.
fn railscope() -> PathBuf {
    agent_binary_next_to(COLLECTOR)
}

/// One member of the pair on its ports and data directory, remote-writing to `endpoint`.
fn start_collector(
    udp: u16,
    http: u16,
    key: &Path,
    data: &Path,
    endpoint: &str,
) -> CollectorProcess {
    CollectorProcess::command(COLLECTOR, key, data)
        .ports(udp, http)
        .args(["--remote-write", endpoint])
        .start()
}

/// An agent and the relays it sends through, one per collector of the pair.
struct PairedAgent {
    node: &'static str,
    agent: Running,
    to_a: Relay,
    to_b: Relay,
}

#[test]
fn a_pair_with_one_collector_down_for_a_minute_archives_everything_and_the_tsdb_holds_each_sample_once()
 {
    let Some(vm) = tsdb_binary(Tsdb::VictoriaMetrics) else {
        return;
    };
    let dir = scratch_dir("collector-pair");
    let key_path = key_file(&dir, KEY_HEX);
    let mut server = Server::start(Tsdb::VictoriaMetrics, &vm, free_tcp_port(), &dir);
    let endpoint = format!("tsdb={}/api/v1/write", server.base());
    let (udp_a, http_a) = (free_udp_port(), free_tcp_port());
    let (udp_b, http_b) = (free_udp_port(), free_tcp_port());
    let (data_a, data_b) = (dir.join("a"), dir.join("b"));
    let a = start_collector(udp_a, http_a, &key_path, &data_a, &endpoint);
    let b = start_collector(udp_b, http_b, &key_path, &data_b, &endpoint);
    let agents: Vec<PairedAgent> = NODES
        .iter()
        .map(|&node| {
            let node_dir = dir.join(node);
            std::fs::create_dir_all(&node_dir).unwrap();
            let lib = standin_with_script(&node_dir);
            let to_a = Relay::start(a.udp_addr());
            let to_b = Relay::start(b.udp_addr());
            let agent =
                FixtureAgent::new(&to_a.addr.to_string(), &key_path, &sysfs_fixture("mlx5"))
                    .args(["--collector", &to_b.addr.to_string()])
                    .node(node)
                    .nvml_lib(&lib)
                    .cadence("0.3", "1")
                    .spawn(railscope());
            PairedAgent {
                node,
                agent,
                to_a,
                to_b,
            }
        })
        .collect();
    thread::sleep(Duration::from_secs(4));

    // B killed mid-stream: what it received but had not fsynced yet is lost with it.
    let (_, _, b_first_err) = b.signal(libc::SIGKILL);
    thread::sleep(DOWN);
    for paired in &agents {
        assert!(
            paired.to_a.sent_so_far().len() > 60,
            "{}: A kept receiving while B was down",
            paired.node
        );
    }
    let b = start_collector(udp_b, http_b, &key_path, &data_b, &endpoint);
    let back = Instant::now();
    // B catches up from the agents' spools (paced resends): wait until its acknowledgements
    // hold everything each agent had sent by then.
    let sent_by_then: Vec<(u32, u64)> = agents
        .iter()
        .map(|p| p.to_b.highest_sent().unwrap())
        .collect();
    loop {
        let done = agents
            .iter()
            .zip(&sent_by_then)
            .all(|(p, &upto)| p.to_b.acknowledged_up_to(&key(), upto));
        if done {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(60),
            "B did not acknowledge the agents' backlog within 60 s"
        );
        thread::sleep(Duration::from_millis(500));
    }
    let caught_up_in = back.elapsed();

    // The agents stop; each waits for both collectors to acknowledge its last frames.
    let mut sent: Vec<SentFrames> = Vec::new();
    let mut resent_to_b = 0;
    for paired in agents {
        let (ok, _, err) = paired.agent.signal(libc::SIGINT);
        assert!(ok, "{}: the agent failed: {err}", paired.node);
        assert!(
            !err.contains("no collector acknowledged"),
            "{}: stopped with frames unacknowledged: {err}",
            paired.node
        );
        thread::sleep(Duration::from_millis(300));
        let via_b = paired.to_b.stop();
        let via_a = paired.to_a.stop();
        resent_to_b += decode_sent(&key(), via_b.iter().map(Vec::as_slice)).resent;
        sent.push(decode_sent(&key(), via_a.iter().map(Vec::as_slice)));
    }
    assert!(
        resent_to_b > 0,
        "no frame was sent to B again: did it miss nothing?"
    );

    // Both archives: every sample each agent sent, exact.
    let mut expected: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for s in &sent {
        expected.extend(s.archive_points());
    }
    let metrics = metric_names(&expected);
    let samples: usize = expected.values().map(Vec::len).sum();
    assert!(samples > 1000, "{samples} samples sent");
    for (name, http) in [("A", http_a), ("B (down a minute)", http_b)] {
        let answered = queried_points(&railscope(), http, &metrics);
        let differ = points_differing(&expected, &answered);
        assert!(
            differ.is_empty() && answered.len() == expected.len(),
            "collector {name}'s archive differs from what the agents sent ({} series answered, {} sent): {differ:?}",
            answered.len(),
            expected.len()
        );
    }

    // The TSDB, once both have written everything: each sample once, as sent.
    for http in [http_a, http_b] {
        remote_write_caught_up(http, Duration::from_secs(90));
        let text = monitor_testkit::http_get(http, "/metrics/collector");
        assert_eq!(
            metric_sum(
                &text,
                "railscope_collector_remote_write_samples_failed_total"
            ),
            0.0,
            "{text}"
        );
    }
    let mut required: BTreeMap<(String, i64), f64> = BTreeMap::new();
    for s in &sent {
        required.extend(s.tsdb_samples());
    }
    let written_by_a = metric_sum(
        &monitor_testkit::http_get(http_a, "/metrics/collector"),
        "railscope_collector_remote_write_samples_sent_total",
    );
    assert!(
        written_by_a >= required.len() as f64,
        "A wrote {written_by_a} samples, fewer than the {} sent",
        required.len()
    );
    let got = server.read_back();
    let tsdb = TsdbComparison::of(&got, &required, &required);
    eprintln!(
        "B caught up {caught_up_in:?} after its return; {resent_to_b} frames sent to B again; \
         {} samples required, {} read back",
        required.len(),
        got.len()
    );
    assert!(
        tsdb.is_exact(),
        "{} wrong (first: {:?}); more than once (first): {:?}; missing (first): {:?}\nB before the kill: {b_first_err}",
        tsdb.wrong.len(),
        tsdb.wrong.iter().take(5).collect::<Vec<_>>(),
        tsdb.twice.iter().take(5).collect::<Vec<_>>(),
        tsdb.missing.iter().take(5).collect::<Vec<_>>(),
    );
    let (ok_a, _, err_a) = a.stop();
    let (ok_b, _, err_b) = b.stop();
    assert!(ok_a && ok_b, "A: {err_a}\nB: {err_b}");
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
