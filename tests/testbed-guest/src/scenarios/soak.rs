//! soak: the agent through many short jobs, as on a training node over months. Each job is
//! its own cgroup running `ibv_rc_pingpong -n 5` between rxe0 and rxe1 (both sides in the
//! job), then its cgroup is removed; every tenth job the link flaps first. The agent sends to
//! `railscope listen`. At the end:
//!
//! - every job's final verb counts reached the listener exactly (on each device: one
//!   context, PD, MR, CQ and QP created, the last four destroyed, INIT/RTR/RTS once,
//!   5 `post_send`), and the agent says it ended every job;
//! - the agent's maps and tables hold only live keys: no verb counter key, no job waiting
//!   for its grace period (`railscope_agent_entries` as received);
//! - its series count and memory are back where they were after the first jobs: the verb
//!   and encoder series no more than then, RSS at most 4 MiB or 10 % above it.
//!
//! The number of jobs comes from the kernel command line (`railscope.soak_jobs`, set by
//! xtask: a short run in `cargo xtask test`, several hundred under `vm-test --all-kernels`).

use std::{
    collections::BTreeMap,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};
use serde_json::Value;

use crate::guest::{self, ADDR_B};

const PORT: &str = "17460";
/// `ibv_rc_pingpong` iterations per job: as many `post_send` doorbells on each side.
const ITERS: u64 = 5;
/// The jobs after which the "early" state is taken.
const EARLY_JOBS: usize = 5;
/// What each side of a job's pingpong does on its device (verb, detail, count; `None`:
/// [`ITERS`]), as the `verbs` scenario proves for one job.
const PER_SIDE: [(&str, &str, Option<u64>); 13] = [
    ("alloc_ucontext", "user", Some(1)),
    ("alloc_pd", "user", Some(1)),
    ("reg_mr", "user", Some(1)),
    ("create_cq", "user", Some(1)),
    ("create_qp", "user", Some(1)),
    ("modify_qp", "INIT", Some(1)),
    ("modify_qp", "RTR", Some(1)),
    ("modify_qp", "RTS", Some(1)),
    ("post_send", "", None),
    ("destroy_qp", "user", Some(1)),
    ("destroy_cq", "user", Some(1)),
    ("dereg_mr", "user", Some(1)),
    ("dealloc_pd", "user", Some(1)),
];
/// Jobs when the kernel command line does not say.
const DEFAULT_JOBS: usize = 40;

pub(super) fn run() -> anyhow::Result<()> {
    super::ensure_rdma_modules()?;
    guest::ensure_rxe_pair()?;
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let jobs: usize = guest::cmdline_value(&cmdline, "railscope.soak_jobs")
        .map(|v| v.parse().context("railscope.soak_jobs is not a number"))
        .transpose()?
        .unwrap_or(DEFAULT_JOBS);
    ensure!(
        jobs > EARLY_JOBS,
        "a soak needs more than {EARLY_JOBS} jobs"
    );
    println!("soak: {jobs} jobs of {ITERS} pingpong iterations");
    let (mut agent, listener) =
        guest::agent_and_listener(PORT, &["--interval", "0.5", "--flush", "1"], false)?;
    // Every hook the jobs' counters come from: ib_uverbs' family can be in before ib_core's
    // (the first job's server then moved its QP to INIT before `ib_modify_qp_with_udata`
    // was attached, on 6.12).
    for probe in [
        "ib_uverbs_post_send",
        "rdma_restrack_add",
        "rdma_restrack_del",
        "ib_modify_qp_with_udata",
    ] {
        agent.wait_for_log(&format!("{probe} attached"), Duration::from_secs(30))?;
    }
    let gid = guest::ipv4_gid_index("rxe0")?.to_string();

    let started = Instant::now();
    let mut early_end_ns = 0;
    let mut names = Vec::with_capacity(jobs);
    for job in 0..jobs {
        // The first flap comes before the early state is taken: the root cgroup, where
        // `ip` runs, is then named in both.
        if job % 10 == 2 {
            flap()?;
        }
        let name = format!("soak_{job:04}");
        let cgroup = guest::cgroup(&name)?;
        run_job(&cgroup, &gid).with_context(|| format!("job {name}"))?;
        remove_cgroup(&name)?;
        names.push(cgroup);
        if job + 1 == EARLY_JOBS {
            // The state after the first jobs is what the agent reports once they ended.
            thread::sleep(Duration::from_secs(4));
            early_end_ns = guest::realtime_ns();
        }
        if job % 50 == 49 {
            println!("soak: {} jobs in {:.0?}", job + 1, started.elapsed());
        }
    }
    println!("soak: {jobs} jobs in {:.0?}", started.elapsed());
    // Grace period (2 s) plus a sweep, plus a flush.
    thread::sleep(Duration::from_secs(5));
    ensure!(agent.is_running(), "the agent died during the soak");
    let (stderr, frames) = guest::stop_and_decode(&mut agent, listener)?;
    if let Some(state) = stderr.iter().find(|l| l.contains("stopping; state:")) {
        println!("soak: {state}");
    }
    let received = Received::from_frames(&frames);

    let mut failures = Vec::new();
    for cgroup in &names {
        for device in ["rxe0", "rxe1"] {
            for (verb, detail, want) in PER_SIDE {
                let want = want.unwrap_or(ITERS);
                let got = received.verb(device, verb, detail, cgroup);
                if got != Some(want) {
                    failures.push(format!(
                        "{cgroup} {device} {verb} {detail}: {got:?}, expected {want}"
                    ));
                }
            }
        }
    }
    let missing = failures.len();
    if missing > 10 {
        failures.truncate(10);
        failures.push(format!("... {missing} wrong or missing counts in all"));
    }
    let ended = received.last_counter("railscope_agent_bound_hits_total", "bound", "jobs_ended");
    if ended < Some(jobs as u64) {
        failures.push(format!("jobs_ended {ended:?}, expected >= {jobs}"));
    }
    let gauge_end = |table: &str| received.entries(table, u64::MAX);
    let gauge_early = |table: &str| received.entries(table, early_end_ns);
    for table in ["verb_keys", "jobs_ending"] {
        if gauge_end(table) != Some(0.0) {
            failures.push(format!(
                "{table} at the end: {:?}, expected 0",
                gauge_end(table)
            ));
        }
    }
    for table in ["verb_series", "encoder_series", "cgroup_names"] {
        let (early, end) = (gauge_early(table), gauge_end(table));
        println!("soak: {table} after {EARLY_JOBS} jobs {early:?}, at the end {end:?}");
        match (early, end) {
            (Some(e), Some(n)) if n <= e => {}
            _ => failures.push(format!(
                "{table} grew: {early:?} after {EARLY_JOBS} jobs, {end:?} at the end"
            )),
        }
    }
    let rss_early = received.gauge("railscope_agent_rss_bytes", None, early_end_ns);
    let rss_end = received.gauge("railscope_agent_rss_bytes", None, u64::MAX);
    println!("soak: RSS after {EARLY_JOBS} jobs {rss_early:?} B, at the end {rss_end:?} B");
    match (rss_early, rss_end) {
        (Some(e), Some(n)) if n <= (e * 1.1).max(e + 4.0 * 1024.0 * 1024.0) => {}
        _ => failures.push(format!(
            "RSS grew: {rss_early:?} B after {EARLY_JOBS} jobs, {rss_end:?} B at the end"
        )),
    }
    ensure!(failures.is_empty(), "{}", failures.join("; "));
    Ok(())
}

/// One job: both sides of a pingpong in `cgroup`.
fn run_job(cgroup: &str, gid: &str) -> anyhow::Result<()> {
    let iters = ITERS.to_string();
    let server = guest::spawn_output(guest::in_cgroup(
        cgroup,
        "/usr/bin/ibv_rc_pingpong",
        &["-d", "rxe1", "-g", gid, "-n", &iters],
    ))?;
    guest::wait_for_perftest_server()?;
    let client = guest::spawn_output(guest::in_cgroup(
        cgroup,
        "/usr/bin/ibv_rc_pingpong",
        &["-d", "rxe0", "-g", gid, "-n", &iters, ADDR_B],
    ))?;
    quiet_check("pingpong client", client.join().expect("no panic"))?;
    quiet_check("pingpong server", server.join().expect("no panic"))?;
    Ok(())
}

/// A finished command's exit, its output printed only when it failed (hundreds of jobs).
fn quiet_check(what: &str, output: std::io::Result<std::process::Output>) -> anyhow::Result<()> {
    let output = output.with_context(|| format!("waiting for {what}"))?;
    if !output.status.success() {
        bail!(
            "{what} failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

/// Removes a job's cgroup (its tasks have exited; the kernel may need a moment to see it).
fn remove_cgroup(name: &str) -> anyhow::Result<()> {
    let path = format!("/sys/fs/cgroup/{name}");
    let start = Instant::now();
    loop {
        match std::fs::remove_dir(&path) {
            Ok(()) => return Ok(()),
            Err(e) if start.elapsed() < Duration::from_secs(5) => {
                let _ = e;
                thread::sleep(Duration::from_millis(50));
            }
            Err(e) => bail!("removing {path}: {e}"),
        }
    }
}

/// vethB down and up again, then both ports ACTIVE.
fn flap() -> anyhow::Result<()> {
    guest::run("/usr/bin/ip", &["link", "set", "vethB", "down"])?;
    thread::sleep(Duration::from_millis(200));
    guest::run("/usr/bin/ip", &["link", "set", "vethB", "up"])?;
    guest::wait_for(Duration::from_secs(10), "both ports ACTIVE", || {
        guest::port_state("rxe0").contains("ACTIVE") && guest::port_state("rxe1").contains("ACTIVE")
    })
}

/// A series as the listener prints it: its name and labels.
type SeriesId = (String, BTreeMap<String, String>);

/// What the listener received: every point (time, JSON) of every series.
struct Received(BTreeMap<SeriesId, Vec<(u64, Value)>>);

impl Received {
    fn from_frames(frames: &[Value]) -> Self {
        let mut series: BTreeMap<_, Vec<(u64, Value)>> = BTreeMap::new();
        for frame in frames {
            for s in frame["samples"].as_array().into_iter().flatten() {
                let labels: BTreeMap<String, String> = s["labels"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect();
                let points = series
                    .entry((s["name"].as_str().unwrap_or("?").to_owned(), labels))
                    .or_default();
                for p in s["points"].as_array().into_iter().flatten() {
                    points.push((p["unix_ns"].as_u64().unwrap_or(0), p.clone()));
                }
            }
        }
        for points in series.values_mut() {
            points.sort_by_key(|(t, _)| *t);
        }
        Self(series)
    }

    /// The last point at or before `until_ns` of the series with `name` whose labels include
    /// every one of `labels`.
    fn last_point(&self, name: &str, labels: &[(&str, &str)], until_ns: u64) -> Option<&Value> {
        self.0
            .iter()
            .filter(|((n, l), _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.get(*k).map_or("", String::as_str) == *v)
            })
            .flat_map(|(_, points)| points.iter().filter(|(t, _)| *t <= until_ns))
            .max_by_key(|(t, _)| *t)
            .map(|(_, p)| p)
    }

    /// The final value of a job's verb counter.
    fn verb(&self, device: &str, verb: &str, detail: &str, cgroup: &str) -> Option<u64> {
        let labels = [
            ("device", device),
            ("verb", verb),
            ("detail", detail),
            ("cgroup", cgroup),
        ];
        self.last_point("railscope_rdma_verbs_total", &labels, u64::MAX)?["value"].as_u64()
    }

    fn last_counter(&self, name: &str, label: &str, value: &str) -> Option<u64> {
        self.last_point(name, &[(label, value)], u64::MAX)?["value"].as_u64()
    }

    /// A gauge's last value (its mean over the last envelope) at or before `until_ns`.
    fn gauge(&self, name: &str, label: Option<(&str, &str)>, until_ns: u64) -> Option<f64> {
        let labels: Vec<(&str, &str)> = label.into_iter().collect();
        let p = self.last_point(name, &labels, until_ns)?;
        p["value"].as_f64().or_else(|| p["mean"].as_f64())
    }

    fn entries(&self, table: &str, until_ns: u64) -> Option<f64> {
        self.gauge("railscope_agent_entries", Some(("table", table)), until_ns)
    }
}
