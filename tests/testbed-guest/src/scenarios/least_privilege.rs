//! least-privilege: the agent started as its systemd unit starts it — uid 0 holding only the
//! capabilities docs/deployment.md documents (`CAP_BPF`, `CAP_PERFMON`, `CAP_SYSLOG`,
//! `CAP_DAC_READ_SEARCH`, and `CAP_SYS_ADMIN` where `kernel.perf_event_paranoid` is 3, as on
//! Debian), through the bounding and ambient sets with `SecureBits=noroot-locked` and
//! `NoNewPrivileges` — attaches every probe `railscope probes` attaches as full root, counts a
//! pingpong's verbs per job exactly (as `verbs` asserts) and the link flaps (as `port-events`
//! does), and does both again after rdma_rxe and ib_uverbs are unloaded (rdma_rxe the moment
//! the `ib_write_bw` traffic that holds it ends) and loaded again (the ib_uverbs family loaded
//! and attached anew with those capabilities only). Then, started
//! with each of those capabilities missing in turn, it keeps running and names the missing one
//! in exactly one line.

use std::{collections::BTreeSet, path::Path, process::Command, thread, time::Duration};

use anyhow::{Context as _, ensure};
use serde_json::Value;

use super::{attach_pace::add_rxe_links, verbs};
use crate::{
    capabilities::{self, agent_capabilities},
    guest::{self, Agent},
};

const FLAPS: usize = 2;

pub(super) fn run() -> anyhow::Result<()> {
    super::ensure_rdma_modules()?;
    guest::ensure_rxe_pair()?;
    let want = attached_as_root()?;
    println!("probes attached as full root: {want:?}");
    let caps = agent_capabilities();
    let numbers: Vec<u32> = caps.iter().map(|&(c, _)| c).collect();

    let mut agent = Agent::start_restricted(&["--json", "--counters", "1"], &numbers)?;
    guest::wait_for(Duration::from_secs(60), "every probe attached", || {
        attached(&agent.stderr_lines()).is_superset(&want)
    })
    .with_context(|| {
        format!(
            "attached with the documented capabilities only: {:?}",
            attached(&agent.stderr_lines())
        )
    })?;
    let effective = capabilities::effective_of(agent.pid())?;
    ensure!(
        effective == capabilities::mask(&numbers),
        "the agent holds the capabilities {effective:#x}, not exactly {:#x} ({caps:?})",
        capabilities::mask(&numbers)
    );
    let missing: Vec<String> = missing_lines(&agent.stderr_lines());
    ensure!(
        missing.is_empty(),
        "with every documented capability: {missing:?}"
    );

    let before = (guest::cgroup("lp_server")?, guest::cgroup("lp_client")?);
    verbs::pingpong(&before.0, &before.1)?;
    flap(FLAPS)?;
    // The counts before the reload are in the snapshots taken before it: the devices (and
    // with them their counters, already sent) go with rdma_rxe; rxe0 and rxe1 made again are
    // new devices.
    thread::sleep(Duration::from_millis(2500));
    let before_reload = complete_snapshot(&agent.stdout_lines());

    reload_rxe(&agent)?;
    let after = (
        guest::cgroup("lp_server_reloaded")?,
        guest::cgroup("lp_client_reloaded")?,
    );
    verbs::pingpong(&after.0, &after.1)?;
    flap(FLAPS)?;
    thread::sleep(Duration::from_millis(1500));
    ensure!(agent.is_running(), "the agent died");
    let (stdout, _) = agent.stop()?;

    let counts = guest::Counters::last_snapshot(&stdout);
    counts.print("lp_");
    let mut failures = Vec::new();
    for (counts, (server, client)) in [(&before_reload, &before), (&counts, &after)] {
        verbs::check_side(counts, "rxe1", server, &mut failures);
        verbs::check_side(counts, "rxe0", client, &mut failures);
    }
    ensure!(failures.is_empty(), "{}", failures.join("; "));
    let flaps = port_flaps(&stdout);
    println!("rxe0 port 1: {flaps} PORT_ERR -> PORT_ACTIVE transitions reported");
    ensure!(
        flaps >= 2 * FLAPS,
        "expected {} PORT_ERR -> PORT_ACTIVE transitions of rxe0 port 1 ({FLAPS} before and \
         {FLAPS} after the reload), got {flaps}",
        2 * FLAPS
    );

    for &(cap, name) in &caps {
        without(&numbers, cap, name)?;
    }
    Ok(())
}

/// The last snapshot of verb counts that the agent has printed in full: the latest one may
/// still be being printed while the agent runs, so it is left out.
fn complete_snapshot(lines: &[String]) -> guest::Counters {
    let snapshot = |l: &String| {
        serde_json::from_str::<Value>(l)
            .ok()
            .filter(|v| v["kind"] == "verb_count")
            .and_then(|v| v["snapshot"].as_u64())
    };
    let latest = lines.iter().rev().find_map(snapshot);
    let cut = lines
        .iter()
        .position(|l| latest.is_some() && snapshot(l) == latest)
        .unwrap_or(lines.len());
    guest::Counters::last_snapshot(&lines[..cut])
}

/// The probes `railscope probes` attaches run as full root.
fn attached_as_root() -> anyhow::Result<BTreeSet<String>> {
    let table = guest::run("/usr/bin/railscope", &["probes", "--json"])?;
    let rows: Vec<Value> = serde_json::from_str(&table).context("railscope probes --json")?;
    let names: BTreeSet<String> = rows
        .iter()
        .filter(|r| r["status"] == "attached")
        .filter_map(|r| r["probe"].as_str().map(str::to_owned))
        .collect();
    ensure!(!names.is_empty(), "no probe attaches even as full root");
    Ok(names)
}

/// The probes the agent logged as attached ("<probe> attached").
fn attached(stderr: &[String]) -> BTreeSet<String> {
    stderr
        .iter()
        .filter_map(|l| l.strip_suffix(" attached"))
        .filter_map(|l| l.split_whitespace().last().map(str::to_owned))
        .collect()
}

/// The agent's lines naming a missing capability.
fn missing_lines(stderr: &[String]) -> Vec<String> {
    stderr
        .iter()
        .filter(|l| l.contains("CAP_") && l.contains(" missing: "))
        .cloned()
        .collect()
}

fn flap(times: usize) -> anyhow::Result<()> {
    for _ in 0..times {
        guest::run("/usr/bin/ip", &["link", "set", "vethA", "down"])?;
        thread::sleep(Duration::from_secs(1));
        guest::run("/usr/bin/ip", &["link", "set", "vethA", "up"])?;
        guest::wait_for(Duration::from_secs(10), "rxe0 port 1 ACTIVE", || {
            guest::port_state("rxe0").contains("ACTIVE")
        })?;
    }
    Ok(())
}

/// rdma_rxe and ib_uverbs (with rdma_ucm, which needs it) unloaded and loaded again, rxe0
/// and rxe1 made again; returns once the agent attached ib_uverbs' family anew.
///
/// The removal is tried while `ib_write_bw` traffic runs: rxe cannot disassociate user
/// contexts, so each open verbs file holds a reference on rdma_rxe and `rmmod` is refused
/// until the traffic ends; it is tried again every 100 ms and goes through the moment it does.
fn reload_rxe(agent: &Agent) -> anyhow::Result<()> {
    let count = |needle: &str| {
        agent
            .stderr_lines()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    };
    let attached_before = count("ib_uverbs_post_send attached");
    let traffic = write_traffic()?;
    if Path::new("/sys/module/rdma_ucm").exists() {
        guest::run("/bin/rmmod", &["rdma_ucm"])?;
    }
    let mut refused = 0;
    while Command::new("/bin/rmmod")
        .arg("rdma_rxe")
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        refused += 1;
        ensure!(refused < 300, "rdma_rxe could not be removed within 30 s");
        thread::sleep(Duration::from_millis(100));
    }
    println!("rdma_rxe removed after {refused} refusals while the traffic ran");
    guest::run("/bin/rmmod", &["ib_uverbs"])?;
    for side in traffic {
        // The traffic itself may end in an error when its device goes: only its end matters.
        let _ = side.join();
    }
    guest::wait_for(
        Duration::from_secs(10),
        "the agent to see ib_uverbs go",
        || count("ib_uverbs unloaded") >= 1,
    )?;
    for module in ["rdma_rxe", "rdma_ucm"] {
        guest::run("/bin/modprobe", &[module])?;
    }
    add_rxe_links()?;
    guest::wait_for(Duration::from_secs(30), "ib_uverbs' family again", || {
        count("ib_uverbs_post_send attached") > attached_before
    })
}

type Side = thread::JoinHandle<std::io::Result<std::process::Output>>;

/// Three seconds of `ib_write_bw` from rxe0 to rxe1, started in the background.
fn write_traffic() -> anyhow::Result<Vec<Side>> {
    let gid = guest::ipv4_gid_index("rxe0")?.to_string();
    let [server_args, client_args] = guest::perftest_pair_args(&["-x", &gid, "-F", "-D", "3"]);
    let mut server = Command::new("/usr/bin/ib_write_bw");
    server.args(server_args);
    let server = guest::spawn_output(server)?;
    guest::wait_for_perftest_server()?;
    let mut client = Command::new("/usr/bin/ib_write_bw");
    client.args(client_args);
    let client = guest::spawn_output(client)?;
    thread::sleep(Duration::from_millis(500));
    Ok(vec![server, client])
}

/// A PORT_ERR followed by a PORT_ACTIVE of rxe0 port 1 (rxe sends PORT_ACTIVE twice).
fn port_flaps(stdout: &[String]) -> usize {
    let mut transitions = Vec::<String>::new();
    for e in stdout
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["kind"] == "ib_event" && e["device"] == "rxe0" && e["port"] == 1)
    {
        let name = e["event"].as_str().unwrap_or_default().to_owned();
        if transitions.last() != Some(&name) {
            transitions.push(name);
        }
    }
    transitions
        .windows(2)
        .filter(|w| w[0] == "PORT_ERR" && w[1] == "PORT_ACTIVE")
        .count()
}

/// The agent started without `cap` keeps running and names it, in exactly one line.
fn without(all: &[u32], cap: u32, name: &str) -> anyhow::Result<()> {
    let caps: Vec<u32> = all.iter().copied().filter(|&c| c != cap).collect();
    let mut agent = Agent::start_restricted(&["--json"], &caps)?;
    agent.wait_for_log(" missing: ", Duration::from_secs(10))?;
    // Long enough for the families' first attach attempts, which fail or not without it.
    thread::sleep(Duration::from_secs(3));
    ensure!(agent.is_running(), "without {name} the agent died");
    let (_, stderr) = agent.stop()?;
    let lines = missing_lines(&stderr);
    ensure!(
        lines.len() == 1 && lines[0].contains(&format!("{name} missing: ")),
        "without {name} the agent should name it in one line, it said: {lines:?}"
    );
    println!("without {name}: {}", lines[0]);
    Ok(())
}
