//! ring-overflow: a storm of port events overflows an agent's event ring buffer; the loss is
//! counted exactly and reported, and the agent goes on.
//!
//! Two agents watch the same link flaps: a reference with the built-in 256 KiB ring, and one
//! with a 4 KiB ring (`RAILSCOPE_EVENT_RING_BYTES`, a test knob: about 70 events) that is
//! stopped (SIGSTOP, an agent starved of CPU) while 150 flaps run in one `ip -batch`. Once it
//! runs again, the events it delivered plus the ones it reports lost equal the events the
//! reference delivered (which lost none), and it reports a link flap after the storm.

use std::{thread, time::Duration};

use anyhow::ensure;
use serde_json::Value;

use crate::guest::{self, Agent};

const FLAPS: usize = 150;
const SMALL_RING: &str = "4096";

pub(super) fn run() -> anyhow::Result<()> {
    super::ensure_rdma_modules()?;
    guest::ensure_rxe_pair()?;
    let mut reference = Agent::start(&["--json"])?;
    let mut small =
        Agent::start_with_env(&["--json"], &[("RAILSCOPE_EVENT_RING_BYTES", SMALL_RING)])?;
    for agent in [&reference, &small] {
        agent.wait_for_log("ib_dispatch_event attached", Duration::from_secs(30))?;
    }
    signal(&small, libc::SIGSTOP);
    let batch = "/tmp/flaps.batch";
    std::fs::write(
        batch,
        "link set vethA down\nlink set vethA up\n".repeat(FLAPS),
    )?;
    guest::run("/usr/bin/ip", &["-batch", batch])?;
    // The reference drains the storm; the stopped agent's ring overflowed meanwhile.
    thread::sleep(Duration::from_secs(2));
    signal(&small, libc::SIGCONT);
    guest::wait_for(Duration::from_secs(10), "rxe0 port 1 ACTIVE", || {
        guest::port_state("rxe0").contains("ACTIVE")
    })?;
    small.wait_for_log("ring buffer full", Duration::from_secs(15))?;
    // A flap after the storm: the agent goes on.
    let before_last = ib_events(&small.stdout_lines()).len();
    guest::run("/usr/bin/ip", &["link", "set", "vethA", "down"])?;
    thread::sleep(Duration::from_millis(500));
    guest::run("/usr/bin/ip", &["link", "set", "vethA", "up"])?;
    guest::wait_for(Duration::from_secs(10), "the flap after the storm", || {
        ib_events(&small.stdout_lines())[before_last..]
            .iter()
            .any(|e| e["event"] == "PORT_ERR" && e["device"] == "rxe0")
    })?;
    thread::sleep(Duration::from_secs(2));
    ensure!(small.is_running(), "the agent with the small ring died");
    let (small_out, small_err) = small.stop()?;
    let (ref_out, ref_err) = reference.stop()?;

    ensure!(
        lost_in_total(&ref_err) == 0,
        "the reference agent lost events too: the comparison would not be exact"
    );
    let seen = ib_events(&ref_out).len() as u64;
    let delivered = ib_events(&small_out).len() as u64;
    let lost = lost_in_total(&small_err);
    println!(
        "{FLAPS} flaps: the reference agent reported {seen} IB events; the one with a \
         {SMALL_RING}-byte ring {delivered}, and {lost} lost to its full ring"
    );
    ensure!(
        lost > 0,
        "the small ring did not overflow: nothing to check"
    );
    ensure!(
        delivered + lost == seen,
        "{delivered} delivered + {lost} reported lost != {seen} raised"
    );
    Ok(())
}

fn signal(agent: &Agent, sig: libc::c_int) {
    // SAFETY: kill with a pid we own.
    unsafe { libc::kill(agent.pid() as libc::pid_t, sig) };
}

fn ib_events(lines: &[String]) -> Vec<Value> {
    lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["kind"] == "ib_event")
        .collect()
}

/// The total in the agent's last "ring buffer full: N events lost (T in total, ib_core)".
fn lost_in_total(stderr: &[String]) -> u64 {
    stderr
        .iter()
        .filter_map(|l| {
            let rest = l.split("ring buffer full: ").nth(1)?;
            let total = rest.split('(').nth(1)?.split_whitespace().next()?;
            total.parse::<u64>().ok()
        })
        .max()
        .unwrap_or(0)
}
