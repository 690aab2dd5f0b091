//! verbs: the agent's verb counters equal what `ibv_rc_pingpong` did, per device and per
//! job (cgroup). Each side of a pingpong of N iterations opens one context and creates one
//! PD, one MR, one CQ and one RC QP, moves the QP through INIT, RTR and RTS, calls
//! `ibv_post_send` exactly N times (one kernel doorbell each on rxe), and destroys it all.

use std::{thread, time::Duration};

use anyhow::ensure;

use crate::guest::{self, ADDR_B, Agent, Counters};

const ITERS: u64 = 100;

pub(super) fn run() -> anyhow::Result<()> {
    super::ensure_rdma_modules()?;
    guest::ensure_rxe_pair()?;
    let server_job = guest::cgroup("job_server")?;
    let client_job = guest::cgroup("job_client")?;
    let mut agent = Agent::start(&["--json", "--counters", "1"])?;
    agent.wait_for_log("ib_uverbs_post_send attached", Duration::from_secs(20))?;
    agent.wait_for_log("rdma_restrack_add attached", Duration::from_secs(20))?;

    pingpong(&server_job, &client_job)?;
    thread::sleep(Duration::from_millis(500));
    ensure!(agent.is_running(), "the agent died during the scenario");
    let (stdout, _) = agent.stop()?;
    let counts = guest::Counters::last_snapshot(&stdout);
    counts.print("");
    let mut failures = Vec::new();
    for (device, job) in [("rxe1", &server_job), ("rxe0", &client_job)] {
        check_side(&counts, device, job, &mut failures);
    }
    ensure!(failures.is_empty(), "{}", failures.join("; "));
    Ok(())
}

/// One `ibv_rc_pingpong` of [`ITERS`] iterations, its server on rxe1 in `server_job`, its
/// client on rxe0 in `client_job`.
pub(super) fn pingpong(server_job: &str, client_job: &str) -> anyhow::Result<()> {
    let gid = guest::ipv4_gid_index("rxe0")?.to_string();
    let iters = ITERS.to_string();
    let common = ["-g", gid.as_str(), "-n", iters.as_str()];
    let mut server_args = vec!["-d", "rxe1"];
    server_args.extend(common);
    let server = guest::spawn_output(guest::in_cgroup(
        server_job,
        "/usr/bin/ibv_rc_pingpong",
        &server_args,
    ))?;
    thread::sleep(Duration::from_secs(1));
    let mut client_args = vec!["-d", "rxe0"];
    client_args.extend(common);
    client_args.push(ADDR_B);
    let client = guest::spawn_output(guest::in_cgroup(
        client_job,
        "/usr/bin/ibv_rc_pingpong",
        &client_args,
    ))?;
    guest::check_output("pingpong client", client.join().expect("no panic"))?;
    guest::check_output("pingpong server", server.join().expect("no panic"))?;
    Ok(())
}

/// The verb counts of one side of a [`pingpong`] in `job`, which did nothing else.
pub(super) fn check_side(counts: &Counters, device: &str, job: &str, failures: &mut Vec<String>) {
    let get = |verb: &str, detail: &str| counts.get(device, verb, detail, job);
    let expected: [(&str, &str, u64); 13] = [
        ("alloc_ucontext", "user", 1),
        ("alloc_pd", "user", 1),
        ("reg_mr", "user", 1),
        ("create_cq", "user", 1),
        ("create_qp", "user", 1),
        ("modify_qp", "INIT", 1),
        ("modify_qp", "RTR", 1),
        ("modify_qp", "RTS", 1),
        ("post_send", "", ITERS),
        ("destroy_qp", "user", 1),
        ("destroy_cq", "user", 1),
        ("dereg_mr", "user", 1),
        ("dealloc_pd", "user", 1),
    ];
    for (verb, detail, want) in expected {
        let got = get(verb, detail);
        if got != want {
            failures.push(format!(
                "{device} {job} {verb} {detail}: {got}, expected {want}"
            ));
        }
    }
}
