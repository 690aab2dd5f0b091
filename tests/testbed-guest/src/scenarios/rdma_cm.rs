//! rdma-cm: `rping` between two jobs is seen as rdma_cm events (connect request,
//! established, disconnected) and its disconnect as QP moves to ERR attributed to each job;
//! a connect to a port nobody listens on is counted as a reject with its reason.

use std::{thread, time::Duration};

use anyhow::{Context as _, ensure};
use serde_json::Value;

use crate::guest::{self, ADDR_A, ADDR_B, Agent};

pub(super) fn run() -> anyhow::Result<()> {
    super::ensure_rdma_modules()?;
    guest::ensure_rxe_pair()?;
    let server_job = guest::cgroup("job_rping_server")?;
    let client_job = guest::cgroup("job_rping_client")?;
    let mut agent = Agent::start(&["--json", "--counters", "1"])?;
    agent.wait_for_log("cm_event_handler attached", Duration::from_secs(20))?;
    agent.wait_for_log("ib_modify_qp_with_udata attached", Duration::from_secs(20))?;

    let server = guest::spawn_output(guest::in_cgroup(
        &server_job,
        "/usr/bin/rping",
        &["-s", "-a", ADDR_B, "-C", "10", "-p", "7471"],
    ))?;
    thread::sleep(Duration::from_secs(1));
    let client = guest::in_cgroup(
        &client_job,
        "/usr/bin/rping",
        &["-c", "-I", ADDR_A, "-a", ADDR_B, "-C", "10", "-p", "7471"],
    );
    guest::check_output(
        "rping client",
        guest::spawn_output(client)?.join().expect("no panic"),
    )?;
    guest::check_output("rping server", server.join().expect("no panic"))?;

    // Nobody listens on 7472: the passive side's CM rejects the request (rping reports
    // "RDMA_CM_EVENT_REJECTED, error 8": IB_CM_REJ_INVALID_SERVICE_ID).
    let refused = guest::in_cgroup(
        &client_job,
        "/usr/bin/rping",
        &["-c", "-I", ADDR_A, "-a", ADDR_B, "-C", "1", "-p", "7472"],
    );
    let refused = guest::spawn_output(refused)?.join().expect("no panic");
    let _ = guest::check_output("rping to a closed port", refused);

    thread::sleep(Duration::from_secs(2));
    ensure!(agent.is_running(), "the agent died during the scenario");
    let (stdout, _) = agent.stop()?;
    let counts = guest::Counters::last_snapshot(&stdout);
    counts.print("");
    let cm = |event: &str| counts.sum("cm_event", |_, detail, _| detail == event);
    // What the kernel delivers for one user-space connection: the passive side gets
    // CONNECT_REQUEST then ESTABLISHED; the active side CONNECT_RESPONSE (librdmacm turns it
    // into ESTABLISHED in userspace); a DISCONNECTED reaches at least the side that did not
    // disconnect first; the refused connect gets REJECTED.
    for event in [
        "CONNECT_REQUEST",
        "CONNECT_RESPONSE",
        "ESTABLISHED",
        "DISCONNECTED",
        "REJECTED",
    ] {
        ensure!(cm(event) >= 1, "no {event} counted");
    }
    let rejects = counts.of("cm_reject");
    ensure!(
        rejects
            .iter()
            .any(|((_, reason, _), _)| reason == "INVALID_SERVICE_ID"),
        "the connect to a closed port was not counted as a reject for INVALID_SERVICE_ID: \
         {rejects:?}"
    );

    let to_err: Vec<Value> = stdout
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["kind"] == "ib_event" && v["origin"] == "qp_to_err")
        .collect();
    for job in [&server_job, &client_job] {
        let n = to_err
            .iter()
            .filter(|v| v["cgroup"] == job.as_str())
            .count();
        ensure!(
            n >= 1,
            "no QP moved to ERR attributed to {job} (events: {to_err:?})"
        );
    }
    let qp = to_err[0]["qp_num"].as_u64().context("qp_num")?;
    ensure!(qp > 0, "QP number missing from the ERR event");
    Ok(())
}
