//! async-errors: a completion queue overflowed on purpose raises CQ_ERR, and the agent's
//! `ib_uverbs_cq_event_handler` probe reports it as an operator needs it.
//!
//! A job runs the guest's own verbs program [`crate::cq_overflow`]: two RC QPs on rxe0 in
//! loopback, the sender's send CQ a tiny one (1 entry) that is never polled, 16 signaled
//! sends. rxe's `rxe_cq_post` finds the CQ full for every completion after the first, calls
//! the CQ's event handler with `IB_EVENT_CQ_ERR` and drops the completion. The program reads
//! the async events back through libibverbs, which is the ground truth the agent's output is
//! held to:
//! - the kernel delivered one CQ_ERR per completion that did not fit, on the tiny CQ;
//! - the agent reported exactly as many CQ_ERR events (`cq_async`), each from rxe0, with a
//!   complete record, a kernel timestamp between the first send and the last event the
//!   program read, and the job's cgroup on every kernel: on 6.1 rxe raises the event in the
//!   program's own system call, on 6.12 from a kworker, so the probe takes the cgroup of the
//!   CQ's owner (its restrack `res.task`), not of the task that happens to run;
//! - the QP async events the agent reported for the program's QPs are the ones the program
//!   read (rxe does not move a QP to ERR for a full send CQ: it ignores the failed post, so
//!   none are expected; any that come are printed);
//! - the agent is still running.

use std::{thread, time::Duration};

use anyhow::{Context as _, ensure};
use serde_json::Value;

use crate::{
    cq_overflow,
    guest::{self, Agent},
};

const DEVICE: &str = "rxe0";
/// The CQ size asked for; rxe gives 2^n - 1 entries for n = ceil(log2(asked + 1)), so 1.
const CQ_ENTRIES: u64 = 1;
const SENDS: u64 = 16;

pub(super) fn run() -> anyhow::Result<()> {
    super::ensure_rdma_modules()?;
    guest::ensure_rxe_pair()?;
    let job = guest::cgroup("job_cq_overflow")?;
    let mut agent = Agent::start(&["--json", "--counters", "1"])?;
    for probe in ["ib_uverbs_cq_event_handler", "ib_uverbs_qp_event_handler"] {
        agent.wait_for_log(&format!("{probe} attached"), Duration::from_secs(20))?;
    }

    let gid = guest::ipv4_gid_index(DEVICE)?.to_string();
    let (cq_entries, sends) = (CQ_ENTRIES.to_string(), SENDS.to_string());
    // The guest's init binary is the verbs program too (it runs it when it is not PID 1).
    let program = guest::spawn_output(guest::in_cgroup(
        &job,
        "/init",
        &[cq_overflow::COMMAND, DEVICE, &gid, &cq_entries, &sends],
    ))?;
    let output = guest::check_output("cq-overflow", program.join().expect("no panic"))?;
    let result: Value = output
        .lines()
        .find_map(|l| l.strip_prefix(cq_overflow::RESULT_PREFIX))
        .context("cq-overflow printed no result line")?
        .parse()
        .context("cq-overflow's result line")?;
    // Events are printed as the agent reads them; leave it a moment.
    thread::sleep(Duration::from_secs(1));
    ensure!(agent.is_running(), "the agent died during the CQ overflow");
    let (stdout, _) = agent.stop()?;

    // What the kernel delivered to the program.
    let num = |key: &str| result[key].as_u64().unwrap_or(0);
    let capacity = num("cq_entries");
    let program_events: Vec<&Value> = result["events"].as_array().into_iter().flatten().collect();
    let delivered = program_events
        .iter()
        .filter(|e| e["event"] == "CQ_ERR" && e["cq"] == "tiny")
        .count() as u64;
    println!(
        "program: CQ of {capacity}, {SENDS} sends, {} send and {} receive completions, \
         {delivered} CQ_ERR on the tiny CQ, {} async events in all",
        num("send_completions"),
        num("recv_completions"),
        program_events.len()
    );
    ensure!(
        capacity == CQ_ENTRIES,
        "rxe gave a CQ of {capacity} entries for {CQ_ENTRIES}"
    );
    ensure!(
        num("recv_completions") == SENDS && num("recv_errors") == 0,
        "the receiver did not get every send: {result}"
    );
    ensure!(
        num("send_completions") == capacity && num("send_errors") == 0,
        "the tiny CQ does not hold {capacity} good completions: {result}"
    );
    ensure!(
        delivered == SENDS - capacity,
        "the kernel delivered {delivered} CQ_ERR events for {} completions that did not fit \
         (program result: {result})",
        SENDS - capacity
    );

    // What the agent reported.
    let events = guest::qp_cq_events(&stdout);
    let cq_errs: Vec<&Value> = events
        .iter()
        .filter(|e| e["origin"] == "cq_async" && e["event"] == "CQ_ERR")
        .collect();
    ensure!(
        cq_errs.len() as u64 == delivered,
        "the agent reported {} CQ_ERR events, the kernel delivered {delivered}",
        cq_errs.len()
    );
    let (start_ns, end_ns) = (num("start_ns"), num("end_ns"));
    let cgroup = job.clone();
    for e in &cq_errs {
        let ktime = e["ktime_ns"].as_u64().unwrap_or(0);
        ensure!(
            e["device"] == DEVICE
                && e["cgroup"] == cgroup.as_str()
                && e.get("partial").is_none()
                && (start_ns..=end_ns).contains(&ktime),
            "CQ_ERR not reported as {DEVICE}, cgroup {cgroup}, complete, kernel time in \
             [{start_ns}, {end_ns}]: {e}"
        );
    }

    // QP async events of the program's QPs: the agent's must be the program's.
    let qps = [num("sender_qp"), num("receiver_qp")];
    let qp_event = |e: &Value| {
        let name = e["event"].as_str().unwrap_or_default().to_owned();
        (name, e["qp_num"].as_u64().unwrap_or(0))
    };
    let mut reported: Vec<(String, u64)> = events
        .iter()
        .filter(|e| e["origin"] == "qp_async")
        .map(qp_event)
        .filter(|(_, qp)| qps.contains(qp))
        .collect();
    let mut read: Vec<(String, u64)> = program_events
        .iter()
        .filter(|e| e.get("qp_num").is_some())
        .map(|e| qp_event(e))
        .collect();
    reported.sort();
    read.sort();
    println!("QP async events: read by the program {read:?}, reported by the agent {reported:?}");
    ensure!(
        reported == read,
        "QP async events differ: the program read {read:?}, the agent reported {reported:?}"
    );
    Ok(())
}
