//! Fabric faults are blamed on the fabric, not the nodes (docs/findings.md,
//! `fabric_upstream_down`; docs/actions.md): the collector as an operator runs it, with a
//! Slurm `topology.conf` and an `[actions]` table that drains a node for any critical port
//! finding (a new install's dry run, so Slurm is never asked: what is checked is what the
//! collector decided, in `/api/v1/actions`), fed by simulated fleets (monitor-testkit: real
//! frames, the agent's own event and metric names). What is checked is what an operator
//! checks: `/api/v1/findings` and `/api/v1/actions`. On RoCE the switch comes from the
//! agents' LLDP neighbours (`railscope_ib_port_neighbor_info`) where the file has no word.

use std::{
    ffi::OsStr,
    path::Path,
    process::Command,
    thread,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use monitor_testkit::{
    CollectorCommand, CollectorProcess, SimulatedFleet, key_file, key_from_hex, scratch_dir,
    wait_for,
};
use serde_json::Value;

const COLLECTOR: &str = env!("CARGO_BIN_EXE_railscope-collector");
const KEY_HEX: &str = "8899aabbccddeeff00112233445566778899aabbccddeeff0011223344556677";
const S: u64 = 1_000_000_000;
/// Ticks each fleet sends (1 s apart, ending now): a port flapping every 4 ticks goes down at
/// ticks 3, 7, 11 and 15.
const TICKS: u64 = 16;

/// Leaf switches of 16 and 2 nodes under a spine, as Slurm's topology.conf writes them.
const TOPOLOGY: &str = "# railscope's test fabric\n\
    SwitchName=leaf1 Nodes=node[01-16]\n\
    SwitchName=leaf2 Nodes=node[17-18]\n\
    SwitchName=spine Switches=leaf[1-2]\n";

fn names(range: std::ops::RangeInclusive<usize>) -> Vec<String> {
    range.map(|i| format!("node{i:02}")).collect()
}

/// collector.toml: findings every second, a flap window of 20 s, the topology; actions in a
/// dry run draining for every critical port finding.
fn collector(dir: &Path, topology: &str) -> CollectorCommand {
    let key = key_file(dir, KEY_HEX);
    let topology_path = dir.join("topology.conf");
    std::fs::write(&topology_path, topology).unwrap();
    let config = dir.join("collector.toml");
    std::fs::write(
        &config,
        format!(
            "[findings]\ntick-s = 1\nflap-window-s = 20\ntopology = {:?}\n\n[actions]\n\
             [[actions.rule]]\nrule = \"*\"\ndevice = \"ib_port\"\naction = \"slurm-drain\"\n",
            topology_path.display().to_string()
        ),
    )
    .unwrap();
    CollectorProcess::command(COLLECTOR, &key, &dir.join("data"))
        .args([OsStr::new("--config"), config.as_os_str()])
        .args(["--sockets", "1"])
        .env("RAILSCOPE_LOG", "info")
}

/// A fleet of `nodes`, its frames 1 s apart from `start`.
fn fleet(nodes: &[String], start: u64) -> monitor_testkit::FleetBuilder {
    SimulatedFleet::builder(nodes.len())
        .node_names(nodes.iter().cloned())
        .interval(Duration::from_secs(1))
        .flush_every(1)
        .start_unix_ns(start)
}

/// The tick times' start: whole seconds, `TICKS` ticks before now.
fn start_ns() -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    (now - TICKS * S) / S * S
}

fn findings(c: &CollectorProcess) -> Vec<Value> {
    c.json("/api/v1/findings")["findings"]
        .as_array()
        .unwrap()
        .clone()
}

/// The first `fabric_upstream_down` finding, waited for up to 30 s.
fn upstream_finding(c: &CollectorProcess) -> Value {
    wait_for("the upstream finding", Duration::from_secs(30), || {
        findings(c)
            .into_iter()
            .find(|f| f["rule"] == "fabric_upstream_down")
    })
}

fn records(c: &CollectorProcess) -> Vec<Value> {
    c.json("/api/v1/actions")["records"]
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn a_switch_wide_flap_across_16_nodes_is_one_upstream_finding_naming_the_switch_and_drains_nothing()
{
    let dir = scratch_dir("fabric-switch");
    let c = collector(&dir, TOPOLOGY).start();
    let start = start_ns();
    let key = key_from_hex(KEY_HEX);
    // leaf1's 16 nodes lose port mlx5_0 every 4 s, each node's kernel seeing it 2 ms after
    // the one before (30 ms first to last); node17 and node18 are healthy. Three of the
    // nodes' frames come first, the other 15 nodes' 2 s later (a slower path, a resend):
    // three nodes alone are below `fabric-min-nodes`, so judged before the rest arrived they
    // would be three flapping ports, three drains.
    let early = names(1..=3);
    let late = names(4..=18);
    let mut first = fleet(&early, start);
    for n in 0..early.len() {
        first = first.flapping_port(n, 0);
    }
    let mut second = fleet(&late, start + 6_000_000);
    for n in 0..13 {
        second = second.flapping_port(n, 0);
    }
    let skew = Duration::from_millis(2);
    first
        .flap_period(4, 1)
        .port_event_skew(skew)
        .build(key.clone())
        .send_ticks(c.udp_addr(), TICKS)
        .unwrap();
    thread::sleep(Duration::from_secs(2));
    // (The late fleet's ticks are 6 ms later: its nodes follow the early three in leaf1.)
    second
        .flap_period(4, 1)
        .port_event_skew(skew)
        .build(key)
        .send_ticks(c.udp_addr(), TICKS)
        .unwrap();

    // The finding opens with the first burst judged; its evidence counts each burst as the
    // engine judges it (the fleet's frames arrive over a few seconds): all four, one finding.
    let upstream = wait_for(
        "the upstream finding of all four bursts",
        Duration::from_secs(30),
        || {
            findings(&c)
                .into_iter()
                .find(|f| f["rule"] == "fabric_upstream_down" && f["evidence"]["bursts"] == 4)
        },
    );
    let leaf1 = names(1..=16);
    assert_eq!(upstream["node"], "leaf1", "{upstream:#}");
    assert_eq!(upstream["severity"], "critical");
    assert!(upstream["end"].is_null(), "{upstream:#}");
    let evidence = &upstream["evidence"];
    assert_eq!(evidence["switch"], "leaf1");
    assert_eq!(evidence["nodes"], serde_json::json!(leaf1));
    assert_eq!(evidence["port_count"], 16);
    // Four bursts (downs at ticks 3, 7, 11, 15), each spread over 30 ms.
    assert_eq!(evidence["bursts"], 4, "{upstream:#}");
    assert!(
        (evidence["spread_ms"].as_f64().unwrap() - 30.0).abs() < 0.5,
        "{evidence:#}"
    );
    assert!(
        evidence["ports"]
            .as_array()
            .unwrap()
            .contains(&Value::from("node07 mlx5_0/1")),
        "{evidence:#}"
    );
    let id = upstream["id"].as_str().unwrap().to_owned();

    // Each node's link_downed finding is there, blamed on it, and the actions skip it.
    let skipped = wait_for(
        "every leaf1 node's port finding skipped",
        Duration::from_secs(30),
        || {
            let r = records(&c);
            let skipped: Vec<Value> = r
                .into_iter()
                .filter(|r| r["action"] == "drain" && r["outcome"] == "skipped")
                .collect();
            leaf1
                .iter()
                .all(|n| skipped.iter().any(|r| r["node"] == n.as_str()))
                .then_some(skipped)
        },
    );
    for r in &skipped {
        let detail = r["detail"].as_str().unwrap();
        assert!(
            detail.contains(&format!("blamed on the fabric ({id})")),
            "{r:#}"
        );
    }
    // A few more passes of the actions: still no drain, tried, would or held, for any node.
    thread::sleep(Duration::from_secs(3));
    let acted: Vec<Value> = records(&c)
        .into_iter()
        .filter(|r| r["action"] == "drain" && r["outcome"] != "skipped")
        .collect();
    assert!(acted.is_empty(), "{acted:#?}");
    let all = findings(&c);
    assert_eq!(
        all.iter()
            .filter(|f| f["rule"] == "fabric_upstream_down")
            .count(),
        1,
        "{all:#?}"
    );
    let flapping: Vec<&Value> = all
        .iter()
        .filter(|f| f["rule"] == "ib_link_flapping")
        .collect();
    assert!(flapping.is_empty(), "{flapping:#?}");
    for node in &leaf1 {
        let downed = all
            .iter()
            .find(|f| f["rule"] == "ib_link_downed" && f["node"] == node.as_str())
            .unwrap_or_else(|| panic!("{node}'s link_downed finding: {all:#?}"));
        assert_eq!(downed["evidence"]["upstream"], id.as_str(), "{downed:#}");
    }
    let (ok, _, err) = c.stop();
    assert!(ok, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ports_a_switch_takes_down_for_good_are_found_at_once_blamed_on_it_and_never_drained() {
    let dir = scratch_dir("fabric-port-down");
    let c = collector(&dir, TOPOLOGY).start();
    // leaf1 loses power at tick 10: its 16 nodes' mlx5_0 go down and stay down, each node's
    // kernel seeing it 2 ms after the one before. node17's mlx5_2 goes down alone at tick 12.
    let mut f = fleet(&names(1..=18), start_ns());
    for n in 0..16 {
        f = f.port_down(n, 0, 10);
    }
    f.port_down(16, 2, 12)
        .port_event_skew(Duration::from_millis(2))
        .build(key_from_hex(KEY_HEX))
        .send_ticks(c.udp_addr(), TICKS)
        .unwrap();
    let upstream = upstream_finding(&c);
    assert_eq!(upstream["node"], "leaf1", "{upstream:#}");
    let id = upstream["id"].as_str().unwrap().to_owned();
    let leaf1 = names(1..=16);
    // Each leaf1 node's port is found down (the port did go down) and, once the burst is
    // judged, carries the upstream finding's id; node17's is its own.
    let downs = wait_for(
        "every port's finding judged",
        Duration::from_secs(30),
        || {
            let downs: Vec<Value> = findings(&c)
                .into_iter()
                .filter(|f| f["rule"] == "ib_port_down")
                .collect();
            (downs.len() == 17 && downs.iter().all(|f| f["evidence"]["upstream"] != "pending"))
                .then_some(downs)
        },
    );
    for f in &downs {
        assert!(f["end"].is_null(), "{f:#}");
        assert_eq!(f["severity"], "critical", "{f:#}");
        let e = &f["evidence"];
        assert_eq!(e["state"], "DOWN", "{f:#}");
        assert_eq!(e["source"], "port_transition", "{f:#}");
        assert_eq!(e["from"], "UP", "{f:#}");
        assert_eq!(e["down_at"], f["start"], "{f:#}");
        if f["node"] == "node17" {
            assert_eq!(f["device"], "mlx5_2", "{f:#}");
            assert!(e.get("upstream").is_none(), "{f:#}");
        } else {
            assert!(leaf1.iter().any(|n| f["node"] == n.as_str()), "{f:#}");
            assert_eq!(f["device"], "mlx5_0", "{f:#}");
            assert_eq!(e["upstream"], id.as_str(), "{f:#}");
        }
    }
    // The actions: node17 drained (a dry run: would), every leaf1 node's port finding
    // skipped as the fabric's, and no leaf1 node drained, now or a few passes later.
    wait_for("node17's dry-run drain", Duration::from_secs(30), || {
        records(&c)
            .into_iter()
            .find(|r| r["node"] == "node17" && r["action"] == "drain" && r["outcome"] == "would")
    });
    wait_for(
        "every leaf1 port-down finding skipped",
        Duration::from_secs(30),
        || {
            let r = records(&c);
            leaf1
                .iter()
                .all(|n| {
                    r.iter().any(|r| {
                        r["node"] == n.as_str()
                            && r["outcome"] == "skipped"
                            && r["finding"]
                                .as_str()
                                .is_some_and(|f| f.starts_with("ib_port_down/"))
                    })
                })
                .then_some(())
        },
    );
    thread::sleep(Duration::from_secs(3));
    let acted: Vec<Value> = records(&c)
        .into_iter()
        .filter(|r| {
            leaf1.iter().any(|n| r["node"] == n.as_str())
                && r["action"] == "drain"
                && r["outcome"] != "skipped"
        })
        .collect();
    assert!(acted.is_empty(), "{acted:#?}");
    let (ok, _, err) = c.stop();
    assert!(ok, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn on_roce_the_agents_lldp_neighbours_name_the_switch_the_topology_file_does_not_know() {
    let dir = scratch_dir("fabric-lldp");
    // The topology file knows the InfiniBand nodes only; gpu01-gpu06 are RoCE nodes whose
    // agents send the switch port lldpd hears on each port (gpu01-gpu05's mlx5_0 on
    // roce-leaf7, gpu06's on roce-leaf8).
    let c = collector(&dir, TOPOLOGY).start();
    let roce: Vec<String> = (1..=6).map(|i| format!("gpu{i:02}")).collect();
    let mut f = fleet(&roce, start_ns());
    for n in 0..roce.len() {
        let switch = if n < 5 { "roce-leaf7" } else { "roce-leaf8" };
        f = f.lldp_neighbour(n, 0, switch, &format!("swp{}", n + 1));
    }
    // roce-leaf7 reboots: its five nodes' mlx5_0 go down together, every 4 s.
    for n in 0..5 {
        f = f.flapping_port(n, 0);
    }
    f.flap_period(4, 1)
        .port_event_skew(Duration::from_millis(2))
        .build(key_from_hex(KEY_HEX))
        .send_ticks(c.udp_addr(), TICKS)
        .unwrap();
    let upstream = upstream_finding(&c);
    assert_eq!(upstream["node"], "roce-leaf7", "{upstream:#}");
    assert_eq!(upstream["evidence"]["switch"], "roce-leaf7");
    assert_eq!(
        upstream["evidence"]["nodes"],
        serde_json::json!(roce[..5].to_vec())
    );
    assert!(
        upstream["summary"]
            .as_str()
            .unwrap()
            .ends_with("switch roce-leaf7"),
        "{upstream:#}"
    );
    let (ok, _, err) = c.stop();
    assert!(ok, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_lone_flapping_port_is_still_its_node_s_finding_and_drains_it() {
    let dir = scratch_dir("fabric-lone");
    let c = collector(&dir, TOPOLOGY).start();
    // node17's port mlx5_2 flaps, alone.
    fleet(&names(1..=18), start_ns())
        .flapping_port(16, 2)
        .flap_period(4, 1)
        .build(key_from_hex(KEY_HEX))
        .send_ticks(c.udp_addr(), TICKS)
        .unwrap();
    // Its four downs (ticks 3, 7, 11, 15), each its own once judged.
    let flap = wait_for("node17's flapping finding", Duration::from_secs(30), || {
        findings(&c).into_iter().find(|f| {
            f["rule"] == "ib_link_flapping" && f["node"] == "node17" && f["evidence"]["downs"] == 4
        })
    });
    assert_eq!(flap["device"], "mlx5_2");
    assert_eq!(flap["evidence"]["upstream_downs"], 0, "{flap:#}");
    let would = wait_for("node17's dry-run drain", Duration::from_secs(30), || {
        records(&c)
            .into_iter()
            .find(|r| r["node"] == "node17" && r["action"] == "drain" && r["outcome"] == "would")
    });
    let finding = would["finding"].as_str().unwrap();
    assert!(
        finding.starts_with("ib_link_") && finding.contains("/node17/mlx5_2/1/"),
        "{would:#}"
    );
    // A port finding the tick judged before the events thread judged its transitions' burst
    // is "pending" until a later tick (seconds later on a loaded machine: CI saw it still
    // pending when the drain was done); once none is, none is upstream.
    let all = wait_for(
        "every port finding's blame judged",
        Duration::from_secs(30),
        || {
            let all = findings(&c);
            all.iter()
                .all(|f| f["evidence"]["upstream"] != "pending")
                .then_some(all)
        },
    );
    assert!(
        all.iter().all(|f| f["rule"] != "fabric_upstream_down"
            && f["evidence"].get("upstream").is_none()),
        "{all:#?}"
    );
    let (ok, _, err) = c.stop();
    assert!(ok, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_malformed_topology_is_refused_at_start_with_its_file_line_and_what_is_wrong() {
    let dir = scratch_dir("fabric-bad-topology");
    let key = key_file(&dir, KEY_HEX);
    let topology = dir.join("topology.conf");
    std::fs::write(
        &topology,
        "SwitchName=leaf1 Nodes=node[01-16]\nSwitchName=leaf2 Nodes=node[17-18\n",
    )
    .unwrap();
    let config = dir.join("collector.toml");
    std::fs::write(
        &config,
        format!(
            "[findings]\ntopology = {:?}\n",
            topology.display().to_string()
        ),
    )
    .unwrap();
    let run = |check: bool| {
        let mut command = Command::new(COLLECTOR);
        command
            .arg("run")
            .args([OsStr::new("--config"), config.as_os_str()])
            .args([OsStr::new("--key"), key.as_os_str()])
            .args([OsStr::new("--data"), dir.join("data").as_os_str()])
            .args(["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"]);
        if check {
            command.arg("--check-config");
        }
        command.output().unwrap()
    };
    let expect = format!(
        "topology {}:2: Nodes: unclosed '[' in \"node[17-18\"",
        topology.display()
    );
    for check in [true, false] {
        let out = run(check);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "check {check}: {err}");
        assert!(err.contains(&expect), "check {check}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
