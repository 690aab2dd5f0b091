//! attach-pace: attaching runs off the agent's loop. While rdma_rxe and ib_uverbs (which rxe
//! needs) are unloaded and loaded again three times (ib_uverbs' family detaches and attaches
//! anew: BTF, object load, verifier), the ib_core family's reader keeps draining its ring
//! buffer every 250 ms, and a link flap in the middle of it is reported. (rdma_cm cannot be
//! unloaded under the agent: its raw tracepoint holds a reference to the module.)
//!
//! The pace is judged against the guest itself: a thread of the scenario sleeps 250 ms in a
//! loop and keeps its longest gap between two wake-ups, which is what the emulated guest (TCG,
//! module loads, a host whose cores are shared) does to any timer. The agent's longest gap
//! between two drains, which it reports when it stops, may exceed that by less than one drain
//! interval: an attach on the loop (seconds of BTF parsing and verification) would miss
//! several drains.

use std::{path::Path, time::Duration};

use anyhow::{Context as _, ensure};

use crate::guest::{self, Agent};

const RELOADS: usize = 3;
/// The agent's drain interval, which the baseline ticker sleeps too.
const DRAIN_INTERVAL: Duration = Duration::from_millis(250);

pub(super) fn run() -> anyhow::Result<()> {
    super::ensure_rdma_modules()?;
    guest::ensure_rxe_pair()?;
    let mut agent = Agent::start(&["--json"])?;
    agent.wait_for_log("cm_event_handler attached", Duration::from_secs(30))?;
    agent.wait_for_log("ib_uverbs_post_send attached", Duration::from_secs(30))?;
    let baseline = guest::Ticker::start(DRAIN_INTERVAL);
    for round in 1..=RELOADS {
        for module in ["rdma_ucm", "rdma_rxe", "ib_uverbs"] {
            if Path::new("/sys/module").join(module).exists() {
                guest::run("/bin/rmmod", &[module])?;
            }
        }
        let unloaded = |l: &String| l.contains("ib_uverbs unloaded");
        guest::wait_for(
            Duration::from_secs(10),
            "the agent to see ib_uverbs go",
            || agent.stderr_lines().iter().filter(|l| unloaded(l)).count() >= round,
        )?;
        for module in ["rdma_rxe", "rdma_ucm"] {
            guest::run("/bin/modprobe", &[module])?;
        }
        add_rxe_links()?;
        if round == 2 {
            guest::run("/usr/bin/ip", &["link", "set", "vethA", "down"])?;
            guest::run("/usr/bin/ip", &["link", "set", "vethA", "up"])?;
        }
        let attached = |l: &String| l.contains("ib_uverbs_post_send attached");
        guest::wait_for(Duration::from_secs(30), "ib_uverbs' family again", || {
            agent.stderr_lines().iter().filter(|l| attached(l)).count() > round
        })?;
    }
    let baseline = baseline.stop();
    ensure!(agent.is_running(), "the agent died");
    let (stdout, stderr) = agent.stop()?;
    let gap = stderr
        .iter()
        .find_map(|l| {
            let rest = l.split("ib_core event drain: ").nth(1)?;
            let ms = rest.split("longest gap between two ").nth(1)?;
            // "829 ms" or "829 ms; 11 woken events, ..."
            ms.split_whitespace().next()?.parse::<u64>().ok()
        })
        .context("the agent did not report ib_core's drain pace")?;
    let baseline_ms = baseline.as_millis() as u64;
    println!(
        "ib_core's longest gap between two drains: {gap} ms; a 250 ms ticker of the guest's own, \
         longest gap: {baseline_ms} ms"
    );
    let limit = baseline_ms + DRAIN_INTERVAL.as_millis() as u64;
    ensure!(
        gap < limit,
        "ib_core's event drain paused {gap} ms while other families attached, where the \
         guest's own 250 ms ticker paused at most {baseline_ms} ms (limit {limit} ms)"
    );
    let err = stdout
        .iter()
        .any(|l| l.contains("\"PORT_ERR\"") && l.contains("\"rxe0\""));
    ensure!(err, "the link flap during the reloads was not reported");
    Ok(())
}

/// rxe0 and rxe1 on the veth pair again, after rdma_rxe was reloaded.
pub(super) fn add_rxe_links() -> anyhow::Result<()> {
    for (rxe, netdev) in [("rxe0", "vethA"), ("rxe1", "vethB")] {
        guest::run(
            "/usr/bin/rdma",
            &["link", "add", rxe, "type", "rxe", "netdev", netdev],
        )?;
    }
    guest::wait_for(Duration::from_secs(10), "rxe0 port 1 ACTIVE", || {
        guest::port_state("rxe0").contains("ACTIVE")
    })
}
