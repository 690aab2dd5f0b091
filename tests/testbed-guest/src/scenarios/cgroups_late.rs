//! cgroups-late: jobs whose cgroups are created after the agent started, and used at once,
//! have their events named by their cgroup's path from the first event on.
//!
//! The agent names a cgroup id it has not seen yet at once, by opening the cgroup through a
//! kernfs file handle built from the id; walking the hierarchy instead (at most once a
//! second) would leave the events of a job created within a second of the last walk with
//! the raw `cgroup:<id>`, which is reserved for cgroups that are gone. Events are decoded
//! once, so that label would stay.
//!
//! Each job is created only when the agent has printed an event of the previous one (the
//! moment a walk would just have happened) and runs the test bed's verbs program at once:
//! `cq-overflow` on rxe0 with a 1-entry send CQ and 4 signaled sends, so rxe raises
//! `4 - 1 = 3` CQ_ERR on its CQ (see async-errors), reported with the CQ owner's cgroup. Then
//! the agent's events must carry the job's path, as many as the program read, and no
//! `cgroup:<id>`. The unit test of the lookup by handle runs here too, on the guest's cgroup2
//! mount.

use std::{thread, time::Duration};

use anyhow::{Context as _, ensure};
use serde_json::Value;

use crate::{
    cq_overflow,
    guest::{self, Agent},
};

const DEVICE: &str = "rxe0";
const JOBS: usize = 4;

pub(super) fn run() -> anyhow::Result<()> {
    super::ensure_rdma_modules()?;
    guest::ensure_rxe_pair()?;

    let mut agent = Agent::start(&["--json"])?;
    agent.wait_for_log(
        "ib_uverbs_cq_event_handler attached",
        Duration::from_secs(20),
    )?;
    let gid = guest::ipv4_gid_index(DEVICE)?.to_string();
    let cq_errs_seen = |agent: &Agent| cq_errs(&agent.stdout_lines()).len();

    let mut programs = Vec::new();
    for n in 0..JOBS {
        let before = cq_errs_seen(&agent);
        let job = guest::cgroup(&format!("job_late_{n}"))?;
        let program = guest::spawn_output(guest::in_cgroup(
            &job,
            "/init",
            &[cq_overflow::COMMAND, DEVICE, &gid, "1", "4"],
        ))?;
        guest::wait_for(Duration::from_secs(30), "an event of the new job", || {
            cq_errs_seen(&agent) > before
        })?;
        programs.push((job, program));
    }
    let mut delivered = Vec::new();
    for (job, program) in programs {
        let output = guest::check_output("cq-overflow", program.join().expect("no panic"))?;
        let result: Value = output
            .lines()
            .find_map(|l| l.strip_prefix(cq_overflow::RESULT_PREFIX))
            .context("cq-overflow printed no result line")?
            .parse()
            .context("cq-overflow's result line")?;
        let n = result["events"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["event"] == "CQ_ERR" && e["cq"] == "tiny")
            .count();
        ensure!(n == 3, "{job}: the kernel delivered {n} CQ_ERR, expected 3");
        delivered.push((job, n));
    }
    thread::sleep(Duration::from_secs(1));
    ensure!(agent.is_running(), "the agent died during the scenario");
    let (stdout, _) = agent.stop()?;
    let events = cq_errs(&stdout);
    for e in &events {
        println!("CQ_ERR event: {e}");
    }
    let unnamed: Vec<&Value> = events
        .iter()
        .filter(|e| {
            e["cgroup"]
                .as_str()
                .is_none_or(|c| c.starts_with("cgroup:"))
        })
        .collect();
    ensure!(
        unnamed.is_empty(),
        "events of live jobs without their cgroup's path: {unnamed:?}"
    );
    for (job, n) in delivered {
        let reported = events
            .iter()
            .filter(|e| e["cgroup"] == job.as_str())
            .count();
        ensure!(
            reported == n,
            "{job}: the agent reported {reported} CQ_ERR with its path, the program read {n}"
        );
    }
    let out = guest::run(
        "/usr/bin/railscope-unit-tests",
        &["--ignored", "cgroup2", "--nocapture"],
    )?;
    ensure!(
        out.contains("test result: ok. 1 passed"),
        "expected the cgroup2 unit test to run and pass"
    );
    Ok(())
}

/// The CQ_ERR events among the agent's JSON lines.
fn cq_errs(lines: &[String]) -> Vec<Value> {
    lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["kind"] == "ib_event" && v["origin"] == "cq_async" && v["event"] == "CQ_ERR")
        .collect()
}
