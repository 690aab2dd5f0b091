//! port-events: the agent, started before any RDMA module is loaded, attaches its kprobe on
//! `ib_dispatch_event` when ib_core appears, and reports every PORT_ERR/PORT_ACTIVE of real
//! link flaps with the right device, port and increasing timestamps, while RDMA traffic runs.
//! A last link-down just before the agent is stopped is reported too: the probe wakes the
//! agent for it, and the agent drains its ring buffers once more when it stops.

use std::{process::Command, thread, time::Duration};

use anyhow::{Context as _, bail, ensure};
use serde_json::Value;

use crate::guest::{self, Agent};

const FLAPS: usize = 3;

pub(super) fn run() -> anyhow::Result<()> {
    ensure!(
        !std::path::Path::new("/sys/module/ib_core").exists(),
        "ib_core is already loaded: this scenario must run first in its boot"
    );
    let mut agent = Agent::start(&["--json"])?;
    agent.wait_for_log("ib_core not loaded", Duration::from_secs(20))?;

    guest::load_rdma_modules()?;
    agent.wait_for_log("ib_dispatch_event attached", Duration::from_secs(20))?;

    guest::create_rxe_pair()?;
    write_traffic()?;
    for i in 1..=FLAPS {
        guest::run("/usr/bin/ip", &["link", "set", "vethA", "down"])?;
        thread::sleep(Duration::from_secs(1));
        println!("flap {i}: vethA down, rxe0 {}", guest::port_state("rxe0"));
        guest::run("/usr/bin/ip", &["link", "set", "vethA", "up"])?;
        thread::sleep(Duration::from_secs(1));
        println!("flap {i}: vethA up, rxe0 {}", guest::port_state("rxe0"));
    }
    thread::sleep(Duration::from_secs(1));
    ensure!(agent.is_running(), "the agent died during the scenario");
    // rxe raises PORT_ERR inside the netdev notifier, so it is in the ring buffer when `ip`
    // returns; the agent is stopped at once, before its next periodic drain.
    guest::run("/usr/bin/ip", &["link", "set", "vethA", "down"])?;
    let (stdout, _stderr) = agent.stop()?;
    // Later scenarios of this boot need the link.
    guest::run("/usr/bin/ip", &["link", "set", "vethA", "up"])?;
    check_events(&stdout)
}

/// Three seconds of `ib_write_bw` from rxe0 to rxe1, as a workload under which the
/// link flaps (and to prove the stack is real).
fn write_traffic() -> anyhow::Result<()> {
    let gid = guest::ipv4_gid_index("rxe0")?.to_string();
    let [server_args, client_args] =
        guest::perftest_pair_args(&["-x", &gid, "-F", "-D", "3", "--report_gbits"]);
    let server = Command::new("/usr/bin/ib_write_bw")
        .args(server_args)
        .output_in_background()?;
    guest::wait_for_perftest_server()?;
    guest::run("/usr/bin/ib_write_bw", &client_args).context("ib_write_bw client")?;
    let server = server
        .join()
        .map_err(|_| anyhow::anyhow!("server thread panicked"))??;
    ensure!(
        server.status.success(),
        "ib_write_bw server failed ({})",
        server.status
    );
    Ok(())
}

trait Background {
    fn output_in_background(
        &mut self,
    ) -> anyhow::Result<thread::JoinHandle<std::io::Result<std::process::Output>>>;
}

impl Background for Command {
    fn output_in_background(
        &mut self,
    ) -> anyhow::Result<thread::JoinHandle<std::io::Result<std::process::Output>>> {
        let child = self
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .context("starting a background command")?;
        Ok(thread::spawn(move || child.wait_with_output()))
    }
}

/// What a user checks in the agent's JSON lines after three flaps of rxe0's link and a last
/// link-down.
fn check_events(lines: &[String]) -> anyhow::Result<()> {
    let events: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).with_context(|| format!("not a JSON line: {l}")))
        .collect::<anyhow::Result<_>>()?;
    let rxe0: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "ib_event" && e["device"] == "rxe0" && e["port"] == 1)
        .collect();
    let count = |name: &str| rxe0.iter().filter(|e| e["event"] == name).count();
    let (errs, actives) = (count("PORT_ERR"), count("PORT_ACTIVE"));
    println!(
        "agent reported {} events, {} for rxe0 port 1: {errs} PORT_ERR, {actives} PORT_ACTIVE",
        events.len(),
        rxe0.len()
    );
    ensure!(
        errs > FLAPS,
        "expected at least {} PORT_ERR for rxe0 port 1 ({FLAPS} flaps and a last link-down), \
         got {errs}",
        FLAPS + 1
    );
    ensure!(
        rxe0.last().is_some_and(|e| e["event"] == "PORT_ERR"),
        "the link-down just before the agent stopped was not reported (last event: {:?})",
        rxe0.last().map(|e| &e["event"])
    );
    ensure!(
        actives >= FLAPS,
        "expected at least {FLAPS} PORT_ACTIVE for rxe0 port 1, got {actives}"
    );
    // Each flap is a PORT_ERR followed by a PORT_ACTIVE (which rxe sends twice).
    let mut transitions = Vec::<&str>::new();
    for e in &rxe0 {
        let name = e["event"].as_str().unwrap_or_default();
        if transitions.last() != Some(&name) {
            transitions.push(name);
        }
    }
    let flaps = transitions
        .windows(2)
        .filter(|w| w == &["PORT_ERR", "PORT_ACTIVE"])
        .count();
    ensure!(
        flaps >= FLAPS,
        "expected {FLAPS} PORT_ERR -> PORT_ACTIVE transitions, got {transitions:?}"
    );
    let mut last = 0u64;
    for e in &rxe0 {
        let ts = e["ktime_ns"].as_u64().context("event without ktime_ns")?;
        if ts <= last {
            bail!("timestamps not increasing: {ts} after {last}");
        }
        last = ts;
    }
    Ok(())
}
