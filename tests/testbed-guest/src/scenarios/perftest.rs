//! perftest: `ib_write_bw` and `ib_send_bw` with a fixed iteration count, each pair in its
//! own jobs. perftest (post list 1) calls `ibv_post_send` once per iteration on the client,
//! and the server of `ib_write_bw` posts nothing (it is written to); each side creates and
//! destroys one RC QP.

use std::{thread, time::Duration};

use anyhow::ensure;

use crate::guest::{self, Agent};

const ITERS: u64 = 500;

pub(super) fn run() -> anyhow::Result<()> {
    super::ensure_rdma_modules()?;
    guest::ensure_rxe_pair()?;
    let mut agent = Agent::start(&["--json", "--counters", "1"])?;
    agent.wait_for_log("ib_uverbs_post_send attached", Duration::from_secs(20))?;
    agent.wait_for_log("rdma_restrack_add attached", Duration::from_secs(20))?;
    let gid = guest::ipv4_gid_index("rxe0")?.to_string();
    let iters = ITERS.to_string();
    for tool in ["ib_write_bw", "ib_send_bw"] {
        let server_job = guest::cgroup(&format!("{tool}_server"))?;
        let client_job = guest::cgroup(&format!("{tool}_client"))?;
        let program = format!("/usr/bin/{tool}");
        let [server_args, client_args] =
            guest::perftest_pair_args(&["-x", &gid, "-F", "-n", &iters]);
        let server = guest::spawn_output(guest::in_cgroup(&server_job, &program, &server_args))?;
        guest::wait_for_perftest_server()?;
        let client = guest::spawn_output(guest::in_cgroup(&client_job, &program, &client_args))?;
        guest::check_output(&format!("{tool} client"), client.join().expect("no panic"))?;
        guest::check_output(&format!("{tool} server"), server.join().expect("no panic"))?;
    }
    thread::sleep(Duration::from_millis(500));
    ensure!(agent.is_running(), "the agent died");
    let (stdout, _) = agent.stop()?;
    let counts = guest::Counters::last_snapshot(&stdout);
    counts.print("_bw_");
    let get = |verb: &str, job: &str| counts.in_cgroup(verb, job);
    let mut failures = Vec::new();
    for tool in ["ib_write_bw", "ib_send_bw"] {
        for side in ["server", "client"] {
            let job = format!("/{tool}_{side}");
            for verb in ["create_qp", "destroy_qp"] {
                if get(verb, &job) != 1 {
                    failures.push(format!("{job} {verb}: {}, expected 1", get(verb, &job)));
                }
            }
        }
        // One doorbell per iteration on the client; none on the server, which only posts
        // receives (ib_send_bw) or is written to (ib_write_bw).
        for (side, want) in [("client", ITERS), ("server", 0)] {
            let job = format!("/{tool}_{side}");
            if get("post_send", &job) != want {
                failures.push(format!(
                    "{job} post_send: {}, expected {want}",
                    get("post_send", &job)
                ));
            }
        }
    }
    ensure!(failures.is_empty(), "{}", failures.join("; "));
    Ok(())
}
