//! The actions on findings (docs/actions.md) against a **real Slurm**: a `slurmctld` and a
//! `slurmd` per node started by the test on loopback from Debian's packages
//! (monitor-testkit's `slurm`), and the collector as an operator runs it, with an `[actions]`
//! table, `scontrol` pointed at that cluster through `SLURM_CONF`, and fed by a simulated
//! fleet (monitor-testkit: real frames). What is checked is what an operator checks: the
//! node's state and reason as `scontrol show node` gives them, the controller's own log of
//! the drains it made, `/api/v1/actions` and `railscope-collector actions`.
//!
//! Skipped, saying so, where the packages are not installed (`cargo xtask setup` installs
//! them), unless `RAILSCOPE_REQUIRE_SLURM=1` (set by `cargo xtask test`, which runs setup
//! first), which makes that a failure.

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::Duration,
};

use monitor_testkit::{
    CollectorCommand, CollectorProcess, SimulatedFleet, key_file, key_from_hex, scratch_dir,
    slurm::{self, SlurmCluster},
    wait_for,
};
use serde_json::Value;

const COLLECTOR: &str = env!("CARGO_BIN_EXE_railscope-collector");
const KEY_HEX: &str = "5566778899aabbccddeeff00112233445566778899aabbccddeeff0011223344";
const S: u64 = 1_000_000_000;

/// collector.toml: findings every second, a flap window of 20 s (so a flap ends within the
/// test), XIDs held 10 minutes; `actions` is the `[actions]` table's body.
fn collector(dir: &Path, cluster: &SlurmCluster, actions: &str) -> CollectorCommand {
    let key = key_file(dir, KEY_HEX);
    let config = dir.join("collector.toml");
    std::fs::write(
        &config,
        format!(
            "[findings]\ntick-s = 1\nflap-window-s = 20\nxid-hold-s = 600\n\n[actions]\n{actions}\n\
             [[actions.rule]]\nrule = \"ib_link_flapping\"\naction = \"slurm-drain\"\n\
             [[actions.rule]]\nrule = \"gpu_xid\"\nseverity = \"critical\"\ndevice = \"gpu\"\naction = \"slurm-drain\"\n"
        ),
    )
    .unwrap();
    CollectorProcess::command(COLLECTOR, &key, &dir.join("data"))
        .args([OsStr::new("--config"), config.as_os_str()])
        .args(["--sockets", "1"])
        .env("SLURM_CONF", cluster.conf())
        .env("RAILSCOPE_LOG", "info")
}

/// A fleet named after the cluster's nodes, its frames ending now, 1 s apart.
fn fleet(names: &[&str], ticks: u64) -> monitor_testkit::FleetBuilder {
    SimulatedFleet::builder(names.len())
        .node_names(names.iter().copied())
        .interval(Duration::from_secs(1))
        .flush_every(1)
        .ticks_before_now(ticks)
}

fn record<'a>(actions: &'a Value, node: &str, action: &str, outcome: &str) -> Option<&'a Value> {
    actions["records"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["node"] == node && r["action"] == action && r["outcome"] == outcome)
}

#[test]
fn a_flapping_port_drains_its_node_and_it_is_resumed_after_the_hold_but_a_hand_drained_node_never_is()
 {
    const TEST: &str = "a_flapping_port_drains_its_node";
    if !slurm::installed_for(TEST) {
        return;
    }
    let dir = scratch_dir("actions-slurm");
    let nodes = ["node01", "node02", "node03"];
    let cluster = SlurmCluster::start(&dir.join("slurm"), &nodes);
    // An operator drained node03 for a reason of their own.
    cluster.drain_by_hand("node03", "bad PSU, ticket 4711");
    let c = collector(
        &dir,
        &cluster,
        "dry-run = false\nresume-hold-s = 5\nbrake-max-percent = 100\n",
    )
    .start();

    // node01's and node03's mlx5_2 go down every 4 s for 16 s, ending now; node02 is quiet.
    fleet(&nodes, 16)
        .flapping_port(0, 2)
        .flapping_port(2, 2)
        .flap_period(4, 1)
        .build(key_from_hex(KEY_HEX))
        .send_ticks(c.udp_addr(), 16)
        .unwrap();
    let finding = wait_for("node01's flapping finding", Duration::from_secs(20), || {
        c.active_finding("ib_link_flapping", "node01")
    });
    let id = finding["id"].as_str().unwrap().to_owned();

    // Drained, with the finding's id in the reason.
    let drained = wait_for("node01 drained", Duration::from_secs(20), || {
        let v = cluster.show("node01");
        v.drained().then_some(v)
    });
    assert_eq!(
        drained.reason.as_deref(),
        Some(format!("railscope: ib_link_flapping {id}").as_str()),
        "{drained:?}"
    );
    assert_eq!(cluster.drains_logged("node01"), 1);

    // The flap ends (fewer than 3 downs in 20 s), then the node stays clear for 5 s: resumed.
    let resumed = wait_for("node01 resumed", Duration::from_secs(60), || {
        let v = cluster.show("node01");
        (!v.drained()).then_some(v)
    });
    assert_eq!(resumed.reason, None, "{resumed:?}");
    // Slurm marks a node it resumes NOT_RESPONDING until its next ping of the slurmd.
    wait_for("node01 IDLE", Duration::from_secs(30), || {
        (cluster.show("node01").state == "IDLE").then_some(())
    });
    let ended = c.json("/api/v1/findings?active=false")["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == id.as_str())
        .cloned()
        .expect("node01's finding ended");
    let actions = c.json("/api/v1/actions");
    let resume = record(&actions, "node01", "resume", "done").expect("a resume recorded");
    let end = ended["end"].as_u64().unwrap();
    assert!(
        resume["at"].as_u64().unwrap() >= end + 5 * S,
        "resumed before the hold: finding ended {end}, {resume}"
    );
    assert_eq!(
        c.action_outcomes("node01"),
        ["drain tried", "drain done", "resume tried", "resume done"]
    );

    // node03 was drained by hand: railscope neither drained it nor resumes it, though its
    // finding ended long enough ago.
    assert!(
        c.json("/api/v1/findings?active=false")["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["node"] == "node03" && f["rule"] == "ib_link_flapping"),
        "node03's flap finding ended"
    );
    thread::sleep(Duration::from_secs(7));
    let node03 = cluster.show("node03");
    assert!(node03.drained(), "{node03:?}");
    assert_eq!(node03.reason.as_deref(), Some("bad PSU, ticket 4711"));
    assert_eq!(
        cluster.drains_logged("node03"),
        1,
        "only the operator's drain"
    );
    assert_eq!(
        c.action_outcomes("node03"),
        ["drain tried", "drain skipped"]
    );
    let skipped = record(&c.json("/api/v1/actions"), "node03", "drain", "skipped")
        .unwrap()
        .clone();
    assert!(
        skipped["detail"].as_str().unwrap().contains("bad PSU"),
        "{skipped}"
    );
    // node02 had no finding: untouched.
    assert_eq!(cluster.show("node02").state, "IDLE");
    assert_eq!(cluster.drains_logged("node02"), 0);

    // The command line says the same.
    let out = Command::new(COLLECTOR)
        .args(["actions", "--collector", &c.url()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("mode: acting"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.contains("resume") && l.contains("done") && l.contains("node01")),
        "{text}"
    );
    let (ok, _, err) = c.stop();
    assert!(ok, "{err}");
    // The audit log is in the data directory.
    assert!(dir.join("data/actions.log").metadata().unwrap().len() > 0);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_dry_run_drains_nothing_and_logs_what_it_would_do() {
    const TEST: &str = "a_dry_run_drains_nothing";
    if !slurm::installed_for(TEST) {
        return;
    }
    let dir = scratch_dir("actions-dry");
    let nodes = ["node01", "node02"];
    let cluster = SlurmCluster::start(&dir.join("slurm"), &nodes);
    // A new install's [actions]: no dry-run key, so a dry run.
    let c = collector(&dir, &cluster, "resume-hold-s = 2\n").start();
    fleet(&nodes, 16)
        .flapping_port(0, 2)
        .flap_period(4, 1)
        .build(key_from_hex(KEY_HEX))
        .send_ticks(c.udp_addr(), 16)
        .unwrap();
    let finding = wait_for("node01's flapping finding", Duration::from_secs(20), || {
        c.active_finding("ib_link_flapping", "node01")
    });
    let id = finding["id"].as_str().unwrap();
    let actions = wait_for("a dry-run drain", Duration::from_secs(20), || {
        let a = c.json("/api/v1/actions");
        record(&a, "node01", "drain", "would")
            .is_some()
            .then_some(a)
    });
    assert_eq!(actions["dry_run"], true);
    let would = record(&actions, "node01", "drain", "would").unwrap();
    assert_eq!(would["finding"], id);
    assert_eq!(would["dry_run"], true);
    assert_eq!(
        would["reason"].as_str(),
        Some(format!("railscope: ib_link_flapping {id}").as_str())
    );
    // And, once the flap ends and the hold passes, the resume it would make.
    wait_for("a dry-run resume", Duration::from_secs(60), || {
        record(&c.json("/api/v1/actions"), "node01", "resume", "would").map(|_| ())
    });
    assert_eq!(c.action_outcomes("node01"), ["drain would", "resume would"]);
    // Slurm was never asked to change anything.
    assert_eq!(cluster.show("node01").state, "IDLE");
    assert_eq!(cluster.drains_logged("node01"), 0);
    let (ok, _, err) = c.stop();
    assert!(ok, "{err}");
    // The log says what it would do.
    assert!(
        err.lines()
            .any(|l| l.contains("would drain node01") && l.contains(id)),
        "{err}"
    );
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `scontrol` as the collector runs it, through a script that, while `DIR/hold` exists,
/// writes its pid and its `sleep`'s to `DIR/drain-started` and waits before it drains (the
/// window between a finding and its action), and while `DIR/hold-after` exists drains, then
/// writes them to `DIR/drain-made` and waits before it answers (the window between the drain
/// and its record): each held open for the test to kill the collector in.
fn slow_scontrol(dir: &Path) -> PathBuf {
    let real = slurm::scontrol_program().unwrap();
    let real = real.display();
    let path = dir.join("scontrol");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\ncase \"$*\" in *State=DRAIN*)\n  \
             if [ -e {d}/hold ]; then sleep 60 & echo \"$$ $!\" > {d}/drain-started; wait $!; fi\n  \
             if [ -e {d}/hold-after ]; then {real} \"$@\"; rc=$?; sleep 60 & echo \"$$ $!\" > {d}/drain-made; wait $!; exit $rc; fi;;\n\
             esac\nexec {real} \"$@\"\n",
            d = dir.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn kill_9_between_a_finding_and_its_drain_or_its_record_then_a_restart_drains_exactly_once() {
    const TEST: &str = "kill_9_between_a_finding_and_its_drain";
    if !slurm::installed_for(TEST) {
        return;
    }
    let dir = scratch_dir("actions-kill");
    let nodes = ["node01", "node02"];
    let cluster = SlurmCluster::start(&dir.join("slurm"), &nodes);
    let scontrol = slow_scontrol(&dir);
    std::fs::write(dir.join("hold"), "").unwrap();
    let table = format!(
        "dry-run = false\nresume-hold-s = 600\nbrake-max-percent = 100\nscontrol = \"{}\"\nscontrol-timeout-s = 120\n",
        scontrol.display()
    );
    let c = collector(&dir, &cluster, &table).start();
    let (udp, http) = (c.udp, c.http);
    fleet(&nodes, 16)
        .flapping_port(0, 2)
        .flap_period(4, 1)
        .build(key_from_hex(KEY_HEX))
        .send_ticks(c.udp_addr(), 16)
        .unwrap();
    let finding = wait_for("node01's flapping finding", Duration::from_secs(20), || {
        c.active_finding("ib_link_flapping", "node01")
    });
    let id = finding["id"].as_str().unwrap().to_owned();
    // The drain is decided and on its way to Slurm: the collector dies, and the scontrol it
    // started with it (as a crash of the host takes both).
    let pids: Vec<i32> = wait_for("scontrol started", Duration::from_secs(20), || {
        let text = std::fs::read_to_string(dir.join("drain-started")).ok()?;
        let pids: Vec<i32> = text
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        (pids.len() == 2).then_some(pids)
    });
    let _ = c.signal(libc::SIGKILL);
    for pid in pids {
        // SAFETY: the script the collector started and its sleep, whose pids it wrote.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    assert!(
        !cluster.show("node01").drained(),
        "not drained before the crash"
    );
    std::fs::remove_file(dir.join("hold")).unwrap();

    // Restarted on the same data: the finding is reloaded, and the drain decided before the
    // crash is made, once.
    let c = collector(&dir, &cluster, &table).ports(udp, http).start();
    let drained = wait_for("node01 drained", Duration::from_secs(30), || {
        let v = cluster.show("node01");
        v.drained().then_some(v)
    });
    assert_eq!(
        drained.reason.as_deref(),
        Some(format!("railscope: ib_link_flapping {id}").as_str())
    );
    // A few more passes: nothing more.
    thread::sleep(Duration::from_secs(4));
    assert_eq!(cluster.drains_logged("node01"), 1, "{}", cluster.logs());
    assert_eq!(c.action_outcomes("node01"), ["drain tried", "drain done"]);

    // Then node02 flaps, and the collector dies after Slurm drained it and before it wrote
    // that down: restarted, it finds railscope's reason on the node and does not drain again.
    std::fs::write(dir.join("hold-after"), "").unwrap();
    fleet(&nodes, 16)
        .flapping_port(1, 2)
        .flap_period(4, 1)
        .seed(2)
        .build(key_from_hex(KEY_HEX))
        .send_ticks(c.udp_addr(), 16)
        .unwrap();
    let finding = wait_for("node02's flapping finding", Duration::from_secs(20), || {
        c.active_finding("ib_link_flapping", "node02")
    });
    let id2 = finding["id"].as_str().unwrap().to_owned();
    let pids: Vec<i32> = wait_for("node02 drained", Duration::from_secs(20), || {
        let text = std::fs::read_to_string(dir.join("drain-made")).ok()?;
        let pids: Vec<i32> = text
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        (pids.len() == 2).then_some(pids)
    });
    assert!(cluster.show("node02").drained());
    assert_eq!(c.action_outcomes("node02"), ["drain tried"]);
    let _ = c.signal(libc::SIGKILL);
    for pid in pids {
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    std::fs::remove_file(dir.join("hold-after")).unwrap();
    let c = collector(&dir, &cluster, &table).ports(udp, http).start();
    let done = wait_for("node02's drain recorded", Duration::from_secs(30), || {
        record(&c.json("/api/v1/actions"), "node02", "drain", "done").cloned()
    });
    assert!(
        done["detail"].as_str().unwrap().contains("already drained"),
        "{done}"
    );
    assert_eq!(
        cluster.show("node02").reason.as_deref(),
        Some(format!("railscope: ib_link_flapping {id2}").as_str())
    );
    assert_eq!(cluster.drains_logged("node02"), 1, "{}", cluster.logs());
    let _ = c.signal(libc::SIGKILL);

    // Killed and restarted again: the drain done is in the audit log, the finding with it,
    // and nothing is acted on again.
    let c = collector(&dir, &cluster, &table).ports(udp, http).start();
    let records = c.json("/api/v1/actions")["records"]
        .as_array()
        .unwrap()
        .len();
    let _ = c.signal(libc::SIGKILL);
    let c = collector(&dir, &cluster, &table).ports(udp, http).start();
    thread::sleep(Duration::from_secs(3));
    assert_eq!(
        c.json("/api/v1/actions")["records"]
            .as_array()
            .unwrap()
            .len(),
        records,
        "restarts add no action on a finding already handled"
    );
    assert_eq!(cluster.drains_logged("node01"), 1);
    assert_eq!(cluster.drains_logged("node02"), 1);
    let (ok, _, err) = c.stop();
    assert!(ok, "{err}");
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_brake_holds_drains_past_its_limit_reports_it_and_a_release_lets_them_go() {
    const TEST: &str = "the_brake_holds_drains";
    if !slurm::installed_for(TEST) {
        return;
    }
    let dir = scratch_dir("actions-brake");
    let nodes = ["node01", "node02", "node03", "node04", "node05"];
    let cluster = SlurmCluster::start(&dir.join("slurm"), &nodes);
    // The brake's defaults (10 nodes or 10 % of the nodes seen an hour, at least one): 1 of 5.
    let c = collector(&dir, &cluster, "dry-run = false\n").start();
    // XID 79 (fallen off the bus: critical) on 40 % of the nodes at once.
    let mut builder = fleet(&nodes, 10);
    for n in 0..2 {
        builder = builder.xid(n, 1, 79, 5);
    }
    builder
        .build(key_from_hex(KEY_HEX))
        .send_ticks(c.udp_addr(), 10)
        .unwrap();
    let brake = wait_for("the brake's finding", Duration::from_secs(30), || {
        c.active_finding("actions_brake", "fleet")
    });
    assert_eq!(brake["severity"], "critical");
    // Give the passes time to do anything more they would (they must not).
    thread::sleep(Duration::from_secs(3));
    let drained: Vec<&str> = nodes
        .iter()
        .copied()
        .filter(|n| cluster.show(n).drained())
        .collect();
    assert_eq!(drained.len(), 1, "{drained:?}");
    assert!(
        drained.iter().all(|n| nodes[..2].contains(n)),
        "{drained:?}"
    );
    let actions = c.json("/api/v1/actions");
    let held: Vec<&str> = actions["brake"]["held"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert_eq!(held.len(), 1, "{actions:#}");
    assert!(held.iter().all(|n| !drained.contains(n)));
    assert_eq!(actions["brake"]["engaged"], true);
    assert_eq!(actions["brake"]["limit"], 1);
    for n in &held {
        assert!(brake["summary"].as_str().unwrap().contains(n), "{brake}");
    }

    // A person looks and releases: the held nodes are drained, the brake's finding ends.
    let out = Command::new(COLLECTOR)
        .args(["actions", "release", "--collector", &c.url()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert_eq!(text.trim(), format!("released: {}", held.join(", ")));
    wait_for("the held nodes drained", Duration::from_secs(20), || {
        held.iter().all(|n| cluster.show(n).drained()).then_some(())
    });
    wait_for("the brake's finding ended", Duration::from_secs(10), || {
        c.active_finding("actions_brake", "fleet")
            .is_none()
            .then_some(())
    });
    for n in &nodes[..2] {
        let v = cluster.show(n);
        assert!(
            v.reason
                .as_deref()
                .is_some_and(|r| r.starts_with("railscope: gpu_xid gpu_xid/")),
            "{n}: {v:?}"
        );
        assert_eq!(cluster.drains_logged(n), 1, "{n}");
    }
    for n in &nodes[2..] {
        assert!(!cluster.show(n).drained(), "{n}");
    }
    let (ok, _, err) = c.stop();
    assert!(ok, "{err}");
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Right after a restart the live table holds only the nodes heard from since: a finding
/// judged then is braked against the fleet the collector knew (the archive's nodes of the
/// brake's window), not against those few (issue 45: "the limit is 1 (brake-max-nodes 100,
/// brake-max-percent 100 of 0 nodes)", and the drain held for good).
#[test]
fn after_a_restart_the_brake_counts_the_fleet_the_collector_knew() {
    const TEST: &str = "after_a_restart_the_brake_counts_the_fleet";
    if !slurm::installed_for(TEST) {
        return;
    }
    let dir = scratch_dir("actions-brake-restart");
    let nodes = ["node01", "node02", "node03", "node04"];
    let cluster = SlurmCluster::start(&dir.join("slurm"), &nodes);
    // Every node of the fleet may be drained within the hour: the limit is the fleet's size.
    let table = "dry-run = false\nbrake-max-nodes = 100\nbrake-max-percent = 100\n";
    let c = collector(&dir, &cluster, table).start();
    let (udp, http) = (c.udp, c.http);
    // The whole fleet sends; node01's port flaps and railscope drains it: one drain in the
    // brake's window.
    fleet(&nodes, 16)
        .flapping_port(0, 2)
        .flap_period(4, 1)
        .build(key_from_hex(KEY_HEX))
        .send_ticks(c.udp_addr(), 16)
        .unwrap();
    wait_for("node01's drain done", Duration::from_secs(30), || {
        record(&c.json("/api/v1/actions"), "node01", "drain", "done").cloned()
    });
    assert_eq!(c.json("/api/v1/actions")["brake"]["fleet"], 4);
    let _ = c.signal(libc::SIGKILL);

    // Restarted on the same data. Only node02 sends again so far, with an XID 79.
    let c = collector(&dir, &cluster, table).ports(udp, http).start();
    fleet(&nodes[1..2], 10)
        .xid(0, 1, 79, 5)
        .seed(3)
        .build(key_from_hex(KEY_HEX))
        .send_ticks(c.udp_addr(), 10)
        .unwrap();
    let drained = wait_for("node02 drained", Duration::from_secs(30), || {
        let v = cluster.show("node02");
        v.drained().then_some(v)
    });
    assert!(
        drained
            .reason
            .as_deref()
            .is_some_and(|r| r.starts_with("railscope: gpu_xid gpu_xid/node02/")),
        "{drained:?}"
    );
    let actions = c.json("/api/v1/actions");
    assert_eq!(actions["brake"]["fleet"], 4, "{actions:#}");
    assert_eq!(actions["brake"]["limit"], 4);
    assert_eq!(actions["brake"]["engaged"], false);
    assert!(
        record(&actions, "node02", "drain", "held").is_none(),
        "{actions:#}"
    );
    assert!(c.active_finding("actions_brake", "fleet").is_none());
    for n in &nodes[2..] {
        assert!(!cluster.show(n).drained(), "{n}");
    }
    let (ok, _, err) = c.stop();
    assert!(ok, "{err}");
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn slurm_down_delays_the_drain_and_loses_nothing_and_a_node_slurm_does_not_know_is_reported_once() {
    const TEST: &str = "slurm_down_delays_the_drain";
    if !slurm::installed_for(TEST) {
        return;
    }
    let dir = scratch_dir("actions-down");
    let mut cluster = SlurmCluster::start(&dir.join("slurm"), &["node01", "node02"]);
    let c = collector(
        &dir,
        &cluster,
        "dry-run = false\nbrake-max-percent = 100\nresume-hold-s = 600\nscontrol-timeout-s = 5\nretry-max-s = 2\n",
    )
    .start();
    // Slurm's controller goes away; node01 and node09 (which Slurm has never heard of) flap.
    cluster.stop_controller();
    let names = ["node01", "node02", "node09"];
    fleet(&names, 16)
        .flapping_port(0, 2)
        .flapping_port(2, 2)
        .flap_period(4, 1)
        .build(key_from_hex(KEY_HEX))
        .send_ticks(c.udp_addr(), 16)
        .unwrap();
    // The findings come as ever: nothing waits for Slurm.
    let finding = wait_for("node01's flapping finding", Duration::from_secs(20), || {
        c.active_finding("ib_link_flapping", "node01")
    });
    let id = finding["id"].as_str().unwrap().to_owned();
    let failed = wait_for("failed tries", Duration::from_secs(40), || {
        let a = c.json("/api/v1/actions");
        let n = a["records"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["node"] == "node01" && r["outcome"] == "failed")
            .count();
        (n >= 2).then_some(a)
    });
    let detail = record(&failed, "node01", "drain", "failed").unwrap()["detail"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(detail.contains("scontrol"), "{detail}");
    assert!(record(&failed, "node09", "drain", "gave_up").is_none());

    // Slurm is back: node01 is drained, once, for that finding; node09 is reported once.
    cluster.restart_controller();
    let drained = wait_for("node01 drained", Duration::from_secs(30), || {
        let v = cluster.show("node01");
        v.drained().then_some(v)
    });
    assert_eq!(
        drained.reason.as_deref(),
        Some(format!("railscope: ib_link_flapping {id}").as_str())
    );
    wait_for("node09 given up on", Duration::from_secs(20), || {
        record(&c.json("/api/v1/actions"), "node09", "drain", "gave_up").map(|_| ())
    });
    thread::sleep(Duration::from_secs(4));
    assert_eq!(cluster.drains_logged("node01"), 1);
    assert_eq!(cluster.drains_logged("node02"), 0);
    let node09 = c.action_outcomes("node09");
    assert_eq!(node09.first().unwrap(), "drain tried");
    assert_eq!(node09.last().unwrap(), "drain gave_up");
    assert_eq!(
        node09.iter().filter(|o| *o == "drain gave_up").count(),
        1,
        "{node09:?}"
    );
    let gave_up = record(&c.json("/api/v1/actions"), "node09", "drain", "gave_up")
        .unwrap()
        .clone();
    assert!(
        gave_up["detail"]
            .as_str()
            .unwrap()
            .contains("unknown to Slurm"),
        "{gave_up}"
    );
    let (ok, _, err) = c.stop();
    assert!(ok, "{err}");
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}
