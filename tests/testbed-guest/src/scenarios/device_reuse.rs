//! device-reuse: a device that goes away and the one made after it are never confused.
//! A job drives rxe0 (`ibv_rc_pingpong` against rxe1); rxe0 is deleted (`rdma link delete`)
//! and rxe9 made on the same netdev (the kernel may give it the freed device's memory, whose
//! address the probes used to key devices by); a second job drives rxe9. The agent must
//! count the second job's verbs on rxe9, exactly, and nothing of it on rxe0; it must release
//! rxe0 (its counters leave the snapshot, its name is deleted) once it has been gone for the
//! grace period, and keep the first job's rxe1 counters. rxe0 is made again at the end for
//! the scenarios that follow.

use std::{thread, time::Duration};

use anyhow::ensure;

use crate::guest::{self, ADDR_B, Agent, Counters};

/// The device made on rxe0's netdev (not rxe2: capture-flap's second pair holds that name).
const NEW: &str = "rxe9";

const FIRST: u64 = 10;
const SECOND: u64 = 20;

pub(super) fn run() -> anyhow::Result<()> {
    super::ensure_rdma_modules()?;
    guest::ensure_rxe_pair()?;
    let first = guest::cgroup("reuse_first")?;
    let second = guest::cgroup("reuse_second")?;
    let server = guest::cgroup("reuse_server")?;
    let mut agent = Agent::start(&["--json", "--counters", "1"])?;
    agent.wait_for_log("ib_uverbs_post_send attached", Duration::from_secs(20))?;
    agent.wait_for_log("ib_dealloc_device attached", Duration::from_secs(20))?;

    // The scenarios that follow need rxe0 back on vethA, whatever happens here.
    let run = (|| -> anyhow::Result<()> {
        pingpong("rxe0", &first, &server, FIRST)?;
        guest::run("/usr/bin/rdma", &["link", "delete", "rxe0"])?;
        guest::run(
            "/usr/bin/rdma",
            &["link", "add", NEW, "type", "rxe", "netdev", "vethA"],
        )?;
        guest::wait_for(Duration::from_secs(10), "rxe9 port 1 ACTIVE", || {
            guest::port_state(NEW).contains("ACTIVE")
        })?;
        pingpong(NEW, &second, &server, SECOND)?;
        agent.wait_for_log("device rxe0 (dev#", Duration::from_secs(10))?;
        // Two more snapshots after the release.
        thread::sleep(Duration::from_millis(2500));
        ensure!(agent.is_running(), "the agent died during the scenario");
        Ok(())
    })();
    let stopped = agent.stop();
    restore_rxe0()?;
    run?;
    let (stdout, _) = stopped?;

    let counts = Counters::last_snapshot(&stdout);
    counts.print("reuse_");
    let mut failures = Vec::new();
    let mut expect = |what: String, got: u64, want: u64| {
        if got != want {
            failures.push(format!("{what}: {got}, expected {want}"));
        }
    };
    let side = |device: &str, job: &str, iters: u64| {
        [
            ("alloc_ucontext", "user", 1),
            ("create_qp", "user", 1),
            ("modify_qp", "RTS", 1),
            ("post_send", "", iters),
            ("destroy_qp", "user", 1),
        ]
        .map(|(verb, detail, want)| {
            (
                format!("{device} {job} {verb} {detail}"),
                counts.get(device, verb, detail, job),
                want,
            )
        })
    };
    for (what, got, want) in side(NEW, &second, SECOND) {
        expect(what, got, want);
    }
    // The server side of both jobs ran on rxe1, which stayed.
    expect(
        format!("rxe1 {server} post_send"),
        counts.get("rxe1", "post_send", "", &server),
        FIRST + SECOND,
    );
    let rxe0: u64 = counts.sum("alloc_ucontext", |d, _, _| d == "rxe0")
        + counts.sum("post_send", |d, _, _| d == "rxe0");
    expect(
        "counters still named rxe0 after its release".into(),
        rxe0,
        0,
    );
    let unnamed = counts.sum("post_send", |d, _, _| d.starts_with("dev#"));
    expect("post_send on an unnamed device".into(), unnamed, 0);
    ensure!(failures.is_empty(), "{}", failures.join("; "));
    Ok(())
}

/// `ibv_rc_pingpong -n ITERS`: the client on `device` in `job`, the server on rxe1 in
/// `server_job`.
fn pingpong(device: &str, job: &str, server_job: &str, iters: u64) -> anyhow::Result<()> {
    let gid = guest::ipv4_gid_index(device)?.to_string();
    let iters = iters.to_string();
    let server = guest::spawn_output(guest::in_cgroup(
        server_job,
        "/usr/bin/ibv_rc_pingpong",
        &["-d", "rxe1", "-g", &gid, "-n", &iters],
    ))?;
    thread::sleep(Duration::from_secs(1));
    let client = guest::spawn_output(guest::in_cgroup(
        job,
        "/usr/bin/ibv_rc_pingpong",
        &["-d", device, "-g", &gid, "-n", &iters, ADDR_B],
    ))?;
    guest::check_output("pingpong client", client.join().expect("no panic"))?;
    guest::check_output("pingpong server", server.join().expect("no panic"))?;
    Ok(())
}

/// Deletes the new device if it is there and makes rxe0 on vethA again if it is not.
fn restore_rxe0() -> anyhow::Result<()> {
    if std::path::Path::new(&format!("/sys/class/infiniband/{NEW}")).exists() {
        guest::run("/usr/bin/rdma", &["link", "delete", NEW])?;
    }
    if !std::path::Path::new("/sys/class/infiniband/rxe0").exists() {
        guest::run(
            "/usr/bin/rdma",
            &["link", "add", "rxe0", "type", "rxe", "netdev", "vethA"],
        )?;
    }
    guest::wait_for(Duration::from_secs(10), "rxe0 port 1 ACTIVE again", || {
        guest::port_state("rxe0").contains("ACTIVE")
    })
}
