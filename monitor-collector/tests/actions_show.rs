//! `railscope actions show ID` (docs/actions.md, "API and command line"): the evidence around
//! an action, as whoever looks at a drained node reads it. A collector with an `[actions]`
//! rule for `ib_link_flapping`, in its default dry run (Slurm is asked nothing; the drain it
//! would make is recorded), is fed a simulated fleet's real frames in which node01's mlx5_2
//! goes down every 4 s. `railscope actions show` of the finding's id, through the agent's
//! binary, prints the finding with its evidence, the drain it would make, the port's events
//! from the archive and the port's flight-recorder report from the archive's export
//! (`railscope report --collector`'s reading), which finds the port flapping with the downs
//! the finding counted; `--json` of the audit record's number gives the same; an id no one
//! knows is refused, naming it.

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use monitor_testkit::{
    CollectorProcess, SimulatedFleet, agent_binary_next_to, key_file, key_from_hex, scratch_dir,
    wait_for,
};
use serde_json::Value;

const COLLECTOR: &str = env!("CARGO_BIN_EXE_railscope-collector");
const KEY_HEX: &str = "8899aabbccddeeff00112233445566778899aabbccddeeff0011223344556677";

fn railscope() -> PathBuf {
    agent_binary_next_to(COLLECTOR)
}

/// `railscope actions ARGS...`: (success, stdout, stderr).
fn actions(program: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(program)
        .arg("actions")
        .args(args)
        .env("NO_COLOR", "1")
        .env_remove("RAILSCOPE_HTTP_CONFIG_FILE")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The lines of `text` from the one starting with `heading` to the next unindented one.
fn section<'a>(text: &'a str, heading: &str) -> Vec<&'a str> {
    let mut lines = text.lines().skip_while(|l| !l.starts_with(heading));
    let Some(first) = lines.next() else {
        panic!("no {heading:?} section in:\n{text}");
    };
    std::iter::once(first)
        .chain(lines.take_while(|l| l.starts_with(' ') || l.is_empty()))
        .collect()
}

#[test]
fn actions_show_prints_the_finding_its_evidence_its_actions_the_events_and_the_ports_report() {
    let dir = scratch_dir("actions-show");
    let key = key_file(&dir, KEY_HEX);
    let config = dir.join("collector.toml");
    std::fs::write(
        &config,
        "[findings]\ntick-s = 1\n\n[actions]\n\
         [[actions.rule]]\nrule = \"ib_link_flapping\"\naction = \"slurm-drain\"\n",
    )
    .unwrap();
    let c = CollectorProcess::command(COLLECTOR, &key, &dir.join("data"))
        .args([OsStr::new("--config"), config.as_os_str()])
        .start();

    SimulatedFleet::builder(2)
        .node_names(["node01", "node02"])
        .interval(Duration::from_secs(1))
        .flush_every(1)
        .ticks_before_now(16)
        .flapping_port(0, 2)
        .flap_period(4, 1)
        .build(key_from_hex(KEY_HEX))
        .send_ticks(c.udp_addr(), 16)
        .unwrap();
    let finding = wait_for("node01's flapping finding", Duration::from_secs(20), || {
        c.active_finding("ib_link_flapping", "node01")
    });
    let id = finding["id"].as_str().unwrap().to_owned();
    let downs = finding["evidence"]["downs"].as_u64().unwrap();
    assert!(downs >= 3, "{finding}");
    let would = wait_for("the dry run's drain", Duration::from_secs(20), || {
        c.json("/api/v1/actions")["records"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["node"] == "node01" && r["action"] == "drain" && r["outcome"] == "would")
            .cloned()
    });
    assert_eq!(would["finding"], id.as_str());

    let (ok, text, err) = actions(&railscope(), &["--collector", &c.url(), "show", &id]);
    assert!(ok, "{text}{err}");
    // The finding and its evidence.
    let head = section(&text, "finding ");
    assert_eq!(head[0], format!("finding {id}"), "{text}");
    for want in [
        "  rule:     ib_link_flapping",
        "  severity: critical",
        "  node:     node01",
        "  device:   mlx5_2/1",
        &format!("      \"downs\": {downs},"),
        &format!(
            "      \"first_down\": {},",
            finding["evidence"]["first_down"]
        ),
    ] {
        assert!(head.contains(&want), "{want:?} not in:\n{text}");
    }
    // The drain it would make.
    let acted = section(&text, "actions:");
    assert!(
        acted
            .iter()
            .any(|l| l.contains(" drain   would ") && l.contains("node01") && l.contains(&id)),
        "{text}"
    );
    // The port's events, from the archive: every down and up of the 16 s.
    let events = section(&text, "events of node01 ");
    let transitions = |to: &str| {
        events
            .iter()
            .filter(|l| {
                l.contains("port_transition") && l.contains("device=\"mlx5_2\"") && l.ends_with(to)
            })
            .count() as u64
    };
    assert!(transitions("DOWN") >= downs, "{text}");
    assert!(transitions("UP") >= downs - 1, "{text}");
    assert!(!events.iter().any(|l| l.contains("mlx5_0")), "{text}");
    // The flight recorder's report of that port alone, from the archive's export.
    let report = section(&text, "flight recorder of node01 mlx5_2/1 ");
    let verdict = report
        .iter()
        .find(|l| l.trim_start().starts_with("node01 mlx5_2/1: "))
        .unwrap_or_else(|| panic!("no port line in:\n{text}"));
    // Flapping, or down where the fleet's last frame left it down: either way, because of
    // the downs the finding counted.
    assert!(
        verdict.contains("node01 mlx5_2/1: FLAPPING") || verdict.contains("node01 mlx5_2/1: DOWN"),
        "{verdict}\n{text}"
    );
    let because = report
        .iter()
        .find_map(|l| {
            l.trim_start()
                .strip_prefix("because ")?
                .strip_suffix(" down transitions within 24 h (rule: 2 or more)")
        })
        .unwrap_or_else(|| panic!("no flap reason in:\n{text}"));
    assert!(because.parse::<u64>().unwrap() >= downs, "{text}");
    let report_downs = report
        .iter()
        .filter(|l| l.trim_start().starts_with("down +"))
        .count() as u64;
    assert!(report_downs >= downs, "{text}");
    assert!(
        !report.iter().any(|l| l.contains("mlx5_0/1:")),
        "other ports reported:\n{text}"
    );

    // The audit record's number stands for its finding; --json has it all.
    let seq = would["seq"].as_u64().unwrap().to_string();
    let (ok, out, err) = actions(
        Path::new(COLLECTOR),
        &["--collector", &c.url(), "show", &seq, "--json"],
    );
    assert!(ok, "{out}{err}");
    let json: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["finding"]["id"], id.as_str());
    assert_eq!(json["finding"]["evidence"], finding["evidence"]);
    assert!(
        json["records"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["seq"] == would["seq"] && r["outcome"] == "would"),
        "{json}"
    );
    let ports = json["report"]["ports"].as_array().unwrap();
    assert_eq!(ports.len(), 1, "{json}");
    assert_eq!(ports[0]["port"]["device"], "mlx5_2");
    assert_eq!(ports[0]["down_transitions"], report_downs, "{json}");
    assert!(
        json["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "port_transition"),
        "{json}"
    );

    // An id nobody knows.
    let (ok, out, err) = actions(
        &railscope(),
        &[
            "--collector",
            &c.url(),
            "show",
            "ib_link_flapping/node09/mlx5_0/1/1",
        ],
    );
    assert!(!ok, "{out}");
    assert!(
        err.contains("ib_link_flapping/node09/mlx5_0/1/1") && err.contains("404"),
        "{err}"
    );
}
