//! A port going down, as real agents report it (docs/findings.md, `ib_port_down`): four
//! `railscope agent` processes, each on its own copy of the mlx5 fixture sysfs tree (no eBPF
//! probes here, so no port events: the port's `state` file is what changes, and the agents'
//! `railscope_ib_port_state` samples say it), send to a collector as an operator runs it, with
//! an `[actions]` table that drains a node for any port finding (a new install's dry run:
//! Slurm is never asked, `/api/v1/actions` says what it would do; the brake's percentage
//! lifted, as a fleet of four has no 10% to drain).
//!
//! node-04's port is DOWN before its agent starts: found from its first frames. node-02's
//! goes DOWN while the fleet runs: found, judged its node's (no burst of other nodes), the
//! drain it would make recorded; back ACTIVE: its finding ends. node-01 and node-03 are
//! healthy: no port finding.

use std::{ffi::OsStr, fs, path::Path, time::Duration};

use monitor_testkit::{
    CollectorProcess, FixtureAgent, Running, agent_binary_next_to, copy_tree, key_file,
    scratch_dir, sysfs_fixture, wait_for,
};
use serde_json::Value;

const COLLECTOR: &str = env!("CARGO_BIN_EXE_railscope-collector");
const KEY_HEX: &str = "8899aabbccddeeff00112233445566778899aabbccddeeff0011223344556677";
const PORT: &str = "class/infiniband/mlx5_0/ports/1";

fn node_name(n: usize) -> String {
    format!("node-{n:02}")
}

/// Rewrites a sysfs file in place: the agent keeps its files open and reads them again, as
/// sysfs attributes are read (a file replaced by another would never be read).
fn write_file(path: &Path, text: &str) {
    fs::write(path, text).unwrap();
}

/// Sets the port of the tree at `sys` DOWN (phys state Polling: no link) or ACTIVE.
fn set_port(sys: &Path, down: bool) {
    let port = sys.join(PORT);
    let (state, phys) = if down {
        ("1: DOWN\n", "2: Polling\n")
    } else {
        ("4: ACTIVE\n", "5: LinkUp\n")
    };
    write_file(&port.join("state"), state);
    write_file(&port.join("phys_state"), phys);
}

/// Every finding the collector holds, active or ended.
fn findings(c: &CollectorProcess) -> Vec<Value> {
    c.json("/api/v1/findings")["findings"]
        .as_array()
        .unwrap()
        .clone()
}

fn port_down_of(c: &CollectorProcess, node: &str) -> Vec<Value> {
    findings(c)
        .into_iter()
        .filter(|f| f["rule"] == "ib_port_down" && f["node"] == node)
        .collect()
}

#[test]
fn a_port_going_down_on_a_real_agent_s_node_is_found_and_ends_when_it_is_back() {
    let dir = scratch_dir("port-down-agents");
    let key = key_file(&dir, KEY_HEX);
    let config = dir.join("collector.toml");
    fs::write(
        &config,
        "[findings]\ntick-s = 1\n\n[actions]\nbrake-max-percent = 100.0\n\
         [[actions.rule]]\nrule = \"*\"\ndevice = \"ib_port\"\naction = \"slurm-drain\"\n",
    )
    .unwrap();
    let c = CollectorProcess::command(COLLECTOR, &key, &dir.join("data"))
        .args([OsStr::new("--config"), config.as_os_str()])
        .args(["--sockets", "1"])
        .start();
    let trees: Vec<_> = (1..=4)
        .map(|n| {
            let sys = dir.join(node_name(n)).join("sys");
            copy_tree(&sysfs_fixture("mlx5"), &sys);
            if n == 4 {
                set_port(&sys, true);
            }
            sys
        })
        .collect();
    let _agents: Vec<Running> = trees
        .iter()
        .enumerate()
        .map(|(i, sys)| {
            FixtureAgent::new(&c.udp_addr().to_string(), &key, sys)
                .node(&node_name(i + 1))
                .args(["--no-gpu"])
                .cadence("0.5", "1")
                .spawn(agent_binary_next_to(COLLECTOR))
        })
        .collect();

    // Down before its agent started: no port event ever says so, its state samples do.
    let early = wait_for("node-04's port found down", Duration::from_secs(60), || {
        port_down_of(&c, "node-04").into_iter().next()
    });
    assert_eq!(
        (&early["device"], &early["port"], &early["severity"]),
        (
            &Value::from("mlx5_0"),
            &Value::from(1),
            &Value::from("critical")
        ),
        "{early:#}"
    );
    assert_eq!(early["evidence"]["state"], "DOWN", "{early:#}");
    assert_eq!(early["evidence"]["source"], "railscope_ib_port_state");
    assert_eq!(early["evidence"]["phys_state_name"], "Polling", "{early:#}");
    assert_eq!(early["evidence"]["down_at"], early["start"]);

    // node-02's port goes down while the fleet runs.
    set_port(&trees[1], true);
    let down = wait_for(
        "node-02's port found down and judged its own",
        Duration::from_secs(60),
        || {
            port_down_of(&c, "node-02")
                .into_iter()
                .find(|f| f["end"].is_null() && f["evidence"].get("upstream").is_none())
        },
    );
    assert_eq!(down["device"], "mlx5_0", "{down:#}");
    assert_eq!(down["severity"], "critical", "{down:#}");
    assert_eq!(down["evidence"]["state"], "DOWN", "{down:#}");
    let id = down["id"].as_str().unwrap().to_owned();
    // Its node's own fault: the dry run would drain it, for this finding.
    let would = wait_for("node-02's dry-run drain", Duration::from_secs(30), || {
        c.json("/api/v1/actions")["records"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["node"] == "node-02" && r["action"] == "drain" && r["outcome"] == "would")
            .cloned()
    });
    assert_eq!(would["finding"], id.as_str(), "{would:#}");

    // Back ACTIVE: the finding ends (the same one: same id, an end).
    set_port(&trees[1], false);
    let ended = wait_for("node-02's finding ended", Duration::from_secs(60), || {
        port_down_of(&c, "node-02")
            .into_iter()
            .find(|f| f["id"] == id.as_str() && !f["end"].is_null())
    });
    assert!(
        ended["end"].as_u64().unwrap() >= ended["start"].as_u64().unwrap(),
        "{ended:#}"
    );
    let all = findings(&c);
    assert_eq!(port_down_of(&c, "node-02").len(), 1, "{all:#?}");
    // node-04's is still open; the healthy ports have none.
    assert!(
        port_down_of(&c, "node-04")
            .iter()
            .all(|f| f["end"].is_null()),
        "{all:#?}"
    );
    for node in ["node-01", "node-03"] {
        assert!(port_down_of(&c, node).is_empty(), "{node}: {all:#?}");
    }
    let (ok, _, err) = c.stop();
    assert!(ok, "{err}");
    let _ = fs::remove_dir_all(&dir);
}
