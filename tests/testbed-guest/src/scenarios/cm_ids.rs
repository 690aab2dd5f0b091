//! cm-ids: rdma_cm ids created and destroyed by librdmacm applications, exactly, per job.
//!
//! Where the numbers come from (Linux 6.1 and 6.12 `drivers/infiniband/core/cma.c` and
//! `restrack.c`, rdma-core 44 `librdmacm/cma.c` and `librdmacm/examples/rping.c`):
//! - an id is added to the resource tracker (`rdma_restrack_add`: `create_cm_id`) only once it
//!   is bound to a device: by `rdma_bind_addr` to a non-wildcard address
//!   (`cma_acquire_dev_by_src_ip`), when its address resolves (`addr_handler`, in rdma_cm's
//!   address work queue), or for an incoming connection (`cma_ib_acquire_dev`, in ib_cm's
//!   work queue, the id inheriting the listener's owner);
//! - `_destroy_id` calls `rdma_restrack_del` for every id; for an id never added it returns at
//!   once (`res->valid` false) and `destroy_cm_id` is not counted;
//! - every librdmacm process creates and destroys one id at start-up (`ucma_init` ->
//!   `ucma_set_af_ib_support`: bound to the AF_IB wildcard, never added): 0 and 0;
//! - `rping -s -a ADDR` (a bound listener, one connection): the listener and the connection's
//!   id: 2 created, 2 destroyed;
//! - `rping -c -I SRC -a DST`: its id is bound to SRC by `rdma_resolve_addr` in the process:
//!   1 and 1; `rping -c -a DST` without a source: bound when the address resolves, in a kernel
//!   worker, still the process's id: 1 and 1;
//! - a client whose connect is rejected (nobody listens on the port): 1 and 1.
//!
//! Counted for the job that owns the id (its restrack task), whichever task runs the add or
//! the delete; before the delete was restricted to added ids, each process here counted one
//! destroyed id more than it created (its start-up id).

use std::{thread, time::Duration};

use anyhow::ensure;

use crate::guest::{self, ADDR_A, ADDR_B, Agent, Counters};

pub(super) fn run() -> anyhow::Result<()> {
    super::ensure_rdma_modules()?;
    guest::ensure_rxe_pair()?;
    let mut agent = Agent::start(&["--json", "--counters", "1"])?;
    agent.wait_for_log("rdma_restrack_del attached", Duration::from_secs(20))?;
    agent.wait_for_log("cm_event_handler attached", Duration::from_secs(20))?;

    // (job, created, destroyed)
    let mut expected: Vec<(String, u64, u64)> = Vec::new();
    for (n, client_source) in [Some(ADDR_A), None].into_iter().enumerate() {
        let port = (7481 + n).to_string();
        let server_job = guest::cgroup(&format!("job_cm_server_{n}"))?;
        let client_job = guest::cgroup(&format!("job_cm_client_{n}"))?;
        rping_pair(&server_job, &client_job, client_source, &port)?;
        expected.push((server_job, 2, 2));
        expected.push((client_job, 1, 1));
    }
    let refused_job = guest::cgroup("job_cm_refused")?;
    let refused = guest::in_cgroup(
        &refused_job,
        "/usr/bin/rping",
        &["-c", "-I", ADDR_A, "-a", ADDR_B, "-C", "1", "-p", "7489"],
    );
    let refused = guest::spawn_output(refused)?.join().expect("no panic");
    let _ = guest::check_output("rping to a closed port", refused);
    expected.push((refused_job, 1, 1));

    thread::sleep(Duration::from_secs(2));
    ensure!(agent.is_running(), "the agent died during the scenario");
    let (stdout, _) = agent.stop()?;
    let counts = Counters::last_snapshot(&stdout);
    counts.print("job_cm");
    let failures = check_cm_ids(&counts, &expected);
    ensure!(failures.is_empty(), "{}", failures.join("; "));
    Ok(())
}

/// One rping connection (3 round trips) between a server on `ADDR_B` and a client, each in
/// its job.
fn rping_pair(
    server_job: &str,
    client_job: &str,
    client_source: Option<&str>,
    port: &str,
) -> anyhow::Result<()> {
    let server = guest::spawn_output(guest::in_cgroup(
        server_job,
        "/usr/bin/rping",
        &["-s", "-a", ADDR_B, "-C", "3", "-p", port],
    ))?;
    thread::sleep(Duration::from_secs(1));
    let mut args = vec!["-c"];
    if let Some(source) = client_source {
        args.extend(["-I", source]);
    }
    args.extend(["-a", ADDR_B, "-C", "3", "-p", port]);
    let client = guest::in_cgroup(client_job, "/usr/bin/rping", &args);
    guest::check_output(
        "rping client",
        guest::spawn_output(client)?.join().expect("no panic"),
    )?;
    guest::check_output("rping server", server.join().expect("no panic"))?;
    Ok(())
}

/// The mismatches between the counted and the `expected` (job, created, destroyed) cm ids,
/// and any cgroup (the root included) whose created and destroyed counts differ.
pub(super) fn check_cm_ids(counts: &Counters, expected: &[(String, u64, u64)]) -> Vec<String> {
    let mut failures = Vec::new();
    let cgroups: std::collections::BTreeSet<String> = ["create_cm_id", "destroy_cm_id"]
        .iter()
        .flat_map(|verb| counts.of(verb))
        .map(|((_, _, cgroup), _)| cgroup)
        .collect();
    for cgroup in cgroups {
        let (created, destroyed) = (
            counts.in_cgroup("create_cm_id", &cgroup),
            counts.in_cgroup("destroy_cm_id", &cgroup),
        );
        if created != destroyed {
            failures.push(format!(
                "{cgroup}: {created} cm ids created but {destroyed} destroyed"
            ));
        }
    }
    for (job, created, destroyed) in expected {
        let got = (
            counts.in_cgroup("create_cm_id", job),
            counts.in_cgroup("destroy_cm_id", job),
        );
        println!("{job}: {} cm ids created, {} destroyed", got.0, got.1);
        if got != (*created, *destroyed) {
            failures.push(format!(
                "{job}: {} cm ids created and {} destroyed, expected {created} and {destroyed}",
                got.0, got.1
            ));
        }
    }
    failures
}
