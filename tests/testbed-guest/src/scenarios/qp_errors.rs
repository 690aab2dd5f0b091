//! qp-errors: a peer killed in the middle of an RDMA transfer. The agent keeps running and
//! accounts for every QP of both jobs (created = destroyed, the victim's through the kernel's
//! cleanup of a killed process). rxe moves the survivor's QP to ERR inside the driver without
//! an async event, so QP_FATAL cannot be produced here; any QP/CQ async event that does come
//! is printed. (CQ_ERR is proven by the async-errors scenario, with a CQ overflowed on
//! purpose; no QP async error has been produced on rxe so far.)

use std::{thread, time::Duration};

use anyhow::ensure;

use crate::guest::{self, ADDR_B, Agent};

pub(super) fn run() -> anyhow::Result<()> {
    super::ensure_rdma_modules()?;
    guest::ensure_rxe_pair()?;
    let victim_job = guest::cgroup("job_victim")?;
    let survivor_job = guest::cgroup("job_survivor")?;
    let mut agent = Agent::start(&["--json", "--counters", "1"])?;
    agent.wait_for_log(
        "ib_uverbs_qp_event_handler attached",
        Duration::from_secs(20),
    )?;

    let gid = guest::ipv4_gid_index("rxe0")?.to_string();
    let mut server = guest::in_cgroup(
        &victim_job,
        "/usr/bin/ib_write_bw",
        &["-d", "rxe1", "-x", &gid, "-F", "-D", "14"],
    )
    .spawn()?;
    guest::wait_for_perftest_server()?;
    let client = guest::spawn_output(guest::in_cgroup(
        &survivor_job,
        "/usr/bin/ib_write_bw",
        &["-d", "rxe0", "-x", &gid, "-F", "-D", "14", ADDR_B],
    ))?;
    // Under emulation perftest needs several seconds to exchange keys: kill mid-transfer.
    thread::sleep(Duration::from_secs(10));
    println!("killing the ib_write_bw server (pid {})", server.id());
    server.kill()?;
    let _ = server.wait();
    let client_result = client.join().expect("no panic");
    let _ = guest::check_output("surviving ib_write_bw client", client_result);
    thread::sleep(Duration::from_secs(2));
    ensure!(agent.is_running(), "the agent died when a peer was killed");
    let (stdout, _) = agent.stop()?;

    // Printed for the log: rxe raises none here (see the module doc).
    guest::qp_cq_events(&stdout);
    let counts = guest::Counters::last_snapshot(&stdout);
    counts.print("job_");
    let get = |verb: &str, job: &str| counts.in_cgroup(verb, job);
    for job in [&victim_job, &survivor_job] {
        ensure!(get("create_qp", job) >= 1, "no QP created in {job}");
        ensure!(
            get("destroy_qp", job) == get("create_qp", job),
            "{job}: {} QPs created, {} destroyed",
            get("create_qp", job),
            get("destroy_qp", job)
        );
    }
    Ok(())
}
