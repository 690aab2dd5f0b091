//! cm-wildcard: a listener on the wildcard address (`rping -s -a 0.0.0.0`) and one
//! connection to it are counted as the consumers saw them.
//!
//! From Linux 6.1 and 6.12 `drivers/infiniband/core/cma.c`: `rdma_listen` on a wildcard
//! address listens through one internal id per RDMA device (`cma_listen_on_all`, here rxe0
//! and rxe1), whose handler is `cma_listen_handler`. A connect request creates the
//! connection's id with that handler and `cma_cm_event_handler` fires the
//! `rdma_cma:cm_event_handler` tracepoint for it; `cma_listen_handler` then hands the id to the
//! listener's consumer and fires the tracepoint again before calling it. One request is one
//! delivery: CONNECT_REQUEST 1. The other events of one user-space connection: the active
//! side gets ADDR_RESOLVED, ROUTE_RESOLVED and CONNECT_RESPONSE (librdmacm sends the RTU
//! itself and makes its own ESTABLISHED: the kernel delivers none there), the passive side
//! ESTABLISHED when the RTU arrives: 1 each.
//!
//! The server job's cm ids (see cm-ids for the rules): the wildcard listener is never added
//! to the resource tracker (0), its 2 per-device ids are (owned by the listener's process),
//! and the connection's id: 3 created, 3 destroyed; the client: 1 and 1.

use std::{thread, time::Duration};

use anyhow::ensure;

use crate::guest::{self, ADDR_A, ADDR_B, Agent, Counters};

pub(super) fn run() -> anyhow::Result<()> {
    super::ensure_rdma_modules()?;
    guest::ensure_rxe_pair()?;
    let server_job = guest::cgroup("job_wildcard_server")?;
    let client_job = guest::cgroup("job_wildcard_client")?;
    let mut agent = Agent::start(&["--json", "--counters", "1"])?;
    agent.wait_for_log("cm_event_handler attached", Duration::from_secs(20))?;
    agent.wait_for_log("rdma_restrack_del attached", Duration::from_secs(20))?;

    let server = guest::spawn_output(guest::in_cgroup(
        &server_job,
        "/usr/bin/rping",
        &["-s", "-a", "0.0.0.0", "-C", "3", "-p", "7491"],
    ))?;
    thread::sleep(Duration::from_secs(1));
    let client = guest::in_cgroup(
        &client_job,
        "/usr/bin/rping",
        &["-c", "-I", ADDR_A, "-a", ADDR_B, "-C", "3", "-p", "7491"],
    );
    guest::check_output(
        "rping client",
        guest::spawn_output(client)?.join().expect("no panic"),
    )?;
    guest::check_output("rping server", server.join().expect("no panic"))?;

    thread::sleep(Duration::from_secs(2));
    ensure!(agent.is_running(), "the agent died during the scenario");
    let (stdout, _) = agent.stop()?;
    let counts = Counters::last_snapshot(&stdout);
    counts.print("");
    let mut failures = Vec::new();
    for event in [
        "ADDR_RESOLVED",
        "ROUTE_RESOLVED",
        "CONNECT_REQUEST",
        "CONNECT_RESPONSE",
        "ESTABLISHED",
    ] {
        let n = counts.sum("cm_event", |_, detail, _| detail == event);
        if n != 1 {
            failures.push(format!("{event} counted {n} times for one connection"));
        }
    }
    failures.extend(super::cm_ids::check_cm_ids(
        &counts,
        &[(server_job, 3, 3), (client_job, 1, 1)],
    ));
    ensure!(failures.is_empty(), "{}", failures.join("; "));
    Ok(())
}
