//! slurm-drain: a real soft-RoCE link flapping drains the guest's node in Slurm. The agent
//! sends to the collector on the host (as in `host-collector`), whose `[actions]` drain a
//! node on `ib_link_flapping` for real (not a dry run) through `scontrol` of a Slurm cluster
//! the host started on its loopback: a `slurmctld`, munge, and a `slurmd` for node `guest`
//! running on the host in the guest's stead (the guest runs no Slurm; the controller only
//! needs a node that answers). Here: vethA flaps three times (the default `flap-downs`), and
//! the collector's `/api/v1/actions` must show the drain done for the flapping finding of the
//! guest's node. After the boot the host reads the node back with `scontrol show node guest`
//! (xtask/src/vm_test/host_slurm.rs): drained, with railscope's reason naming the finding's
//! id, and exactly one drain made.

use std::time::Duration;

use anyhow::ensure;
use serde_json::Value;

use super::{
    collector_away::node_frames,
    host_collector::{agent_to_host, host_address},
};
use crate::{guest, http};

/// vethA's flaps: the default `flap-downs` threshold of `ib_link_flapping`.
const FLAPS: usize = 3;
const LINK: &str = "vethA";

/// The node name the agent sends as, and Slurm's name for it.
const NODE: &str = "guest";

pub(super) fn run() -> anyhow::Result<()> {
    let http = host_address("railscope.collector_http")?;
    let (mut agent, collector) = agent_to_host(&["--interval", "0.5", "--flush", "1"], true)?;
    agent.wait_for_log("ib_dispatch_event attached", Duration::from_secs(20))?;
    guest::poll_until(
        Duration::from_secs(20),
        "the collector to accept the agent's frames",
        || Ok(node_frames(&http)? >= 2),
    )?;
    let before = drains(&http)?;
    ensure!(before.is_empty(), "a drain before any flap: {before:?}");
    println!("the agent sends to {collector}; flapping {LINK} {FLAPS} times");
    guest::flap_link(LINK, FLAPS)?;
    // The finding is judged on the collector's next tick once the fabric grouping has seen
    // no burst of other nodes (`fabric-settle-s`), then drained on the actions' next pass.
    let mut done = Vec::new();
    guest::poll_until(
        Duration::from_secs(60),
        "the collector's drain of node guest (/api/v1/actions)",
        || {
            done = drains(&http)?;
            Ok(!done.is_empty())
        },
    )?;
    ensure!(agent.is_running(), "the agent died");
    agent.stop()?;
    println!("drain done: {}", done[0]);
    let finding = &done[0]["finding"];
    let flapping = http::get_json(&http, "/api/v1/findings?node=guest")?;
    let ours = flapping["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|f| f["id"] == *finding);
    ensure!(
        ours.is_some_and(|f| f["rule"] == "ib_link_flapping"),
        "the drain names finding {finding}, not an ib_link_flapping finding of node {NODE}: \
         {flapping}"
    );
    ensure!(
        done.len() == 1,
        "{} drains done for node {NODE}: {done:?}",
        done.len()
    );
    // The host checks Slurm's side after the boot.
    Ok(())
}

/// The collector's audit records of a drain of [`NODE`] that Slurm made (`done`).
fn drains(http: &str) -> anyhow::Result<Vec<Value>> {
    let answer = http::get_json(http, "/api/v1/actions")?;
    Ok(answer["records"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["node"] == NODE && r["action"] == "drain" && r["outcome"] == "done")
        .cloned()
        .collect())
}
