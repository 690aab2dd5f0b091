//! job-labels: verbs traffic in cgroup trees laid out as Slurm and Kubernetes lay them out
//! (and one named by a `[[jobs.patterns]]` of the agent's configuration file) reaches
//! `railscope listen` with each per-cgroup verb series and event labelled with its job:
//!
//! - `ibv_rc_pingpong` between a Slurm step (cgroup v2, under `slurmstepd.scope`) and a
//!   Kubernetes pod (systemd cgroup driver): each side's job counts exactly one QP created and
//!   `ITERS` doorbells;
//! - `rping` between a Slurm step in the v1-style layout (`/slurm/uid_0/job_<id>/step_<n>`)
//!   and a configured launcher's cgroup: one QP created and destroyed per job, and the QPs
//!   `rdma_disconnect` moves to ERR arrive as events carrying the job.

use std::{collections::BTreeMap, thread, time::Duration};

use anyhow::ensure;
use serde_json::Value;

use crate::guest::{self, ADDR_A, ADDR_B};

const PORT: &str = "17410";
const ITERS: u64 = 100;
const POD_UID: &str = "5f0c1d2e-3a4b-4c5d-8e9f-0a1b2c3d4e5f";
const CONFIG: &str = "/tmp/railscope-job-labels.toml";

/// A job's cgroup and the labels it must travel with.
struct JobCgroup {
    cgroup: String,
    job_id: String,
    job_step: Option<&'static str>,
}

impl JobCgroup {
    fn new(path: &str, job_id: &str, job_step: Option<&'static str>) -> anyhow::Result<Self> {
        Ok(Self {
            cgroup: guest::cgroup(path.trim_start_matches('/'))?,
            job_id: job_id.to_owned(),
            job_step,
        })
    }

    /// Whether `labels` carry exactly this job's labels.
    fn labels_match(&self, labels: &Value) -> bool {
        labels["job_id"] == self.job_id.as_str() && labels["job_step"].as_str() == self.job_step
    }
}

pub(super) fn run() -> anyhow::Result<()> {
    super::ensure_rdma_modules()?;
    guest::ensure_rxe_pair()?;
    let slurm = JobCgroup::new(
        "/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0",
        "slurm:4242",
        Some("0"),
    )?;
    let pod = JobCgroup::new(
        &format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/\
             cri-containerd-7d3e9c1b5a.scope",
            POD_UID.replace('-', "_")
        ),
        &format!("k8s:{POD_UID}"),
        None,
    )?;
    let slurm_v1 = JobCgroup::new("/slurm/uid_0/job_77/step_1", "slurm:77", Some("1"))?;
    let launcher = JobCgroup::new("/mylauncher/run-9/rank-1", "mylauncher:9", Some("rank1"))?;
    std::fs::write(
        CONFIG,
        "[[jobs.patterns]]\nregex = '^/mylauncher/run-(\\d+)/rank-(\\d+)$'\n\
         id = \"mylauncher:$1\"\nstep = \"rank$2\"\n",
    )?;
    let (mut agent, listener) = guest::agent_and_listener(
        PORT,
        &["--config", CONFIG, "--interval", "0.5", "--flush", "1"],
        false,
    )?;
    agent.wait_for_log("ib_uverbs_post_send attached", Duration::from_secs(20))?;
    agent.wait_for_log("rdma_restrack_add attached", Duration::from_secs(20))?;
    agent.wait_for_log("cm_event_handler attached", Duration::from_secs(20))?;
    agent.wait_for_log("ib_modify_qp_with_udata attached", Duration::from_secs(20))?;

    // A Slurm step and a pod, over ibv_rc_pingpong.
    let gid = guest::ipv4_gid_index("rxe0")?.to_string();
    let iters = ITERS.to_string();
    let server = guest::spawn_output(guest::in_cgroup(
        &slurm.cgroup,
        "/usr/bin/ibv_rc_pingpong",
        &["-d", "rxe1", "-g", &gid, "-n", &iters],
    ))?;
    thread::sleep(Duration::from_secs(1));
    let client = guest::spawn_output(guest::in_cgroup(
        &pod.cgroup,
        "/usr/bin/ibv_rc_pingpong",
        &["-d", "rxe0", "-g", &gid, "-n", &iters, ADDR_B],
    ))?;
    guest::check_output("pingpong client", client.join().expect("no panic"))?;
    guest::check_output("pingpong server", server.join().expect("no panic"))?;

    // A Slurm step in the v1-style layout and a configured launcher's job, over rping.
    let server = guest::spawn_output(guest::in_cgroup(
        &slurm_v1.cgroup,
        "/usr/bin/rping",
        &["-s", "-a", ADDR_B, "-C", "10", "-p", "7481"],
    ))?;
    thread::sleep(Duration::from_secs(1));
    let client = guest::spawn_output(guest::in_cgroup(
        &launcher.cgroup,
        "/usr/bin/rping",
        &["-c", "-I", ADDR_A, "-a", ADDR_B, "-C", "10", "-p", "7481"],
    ))?;
    guest::check_output("rping client", client.join().expect("no panic"))?;
    guest::check_output("rping server", server.join().expect("no panic"))?;

    // Two flushes, so the last counter values are sent.
    thread::sleep(Duration::from_secs(3));
    let (_, frames) = guest::stop_and_decode(&mut agent, listener)?;
    println!("listener decoded {} frames", frames.len());

    // The last value of each verb series, keyed by its labels.
    let mut verbs: BTreeMap<String, (Value, u64, u64)> = BTreeMap::new();
    for s in frames
        .iter()
        .flat_map(|f| f["samples"].as_array().into_iter().flatten())
        .filter(|s| s["name"] == "railscope_rdma_verbs_total")
    {
        for p in s["points"].as_array().into_iter().flatten() {
            let (t, v) = (
                p["unix_ns"].as_u64().unwrap_or(0),
                p["value"].as_u64().unwrap_or(0),
            );
            let entry = verbs
                .entry(s["labels"].to_string())
                .or_insert((s["labels"].clone(), 0, 0));
            if t >= entry.1 {
                (entry.1, entry.2) = (t, v);
            }
        }
    }
    let events: Vec<&Value> = frames
        .iter()
        .flat_map(|f| f["events"].as_array().into_iter().flatten())
        .collect();

    let mut failures = Vec::new();
    let jobs = [&slurm, &pod, &slurm_v1, &launcher];
    // Every series and event of a job's cgroup carries that job's labels, and no other
    // cgroup's carry them.
    for (labels, _, _) in verbs.values() {
        for job in jobs {
            let in_cgroup = labels["cgroup"] == job.cgroup.as_str();
            if in_cgroup != job.labels_match(labels) {
                failures.push(format!("verb series {labels} (job of {})", job.cgroup));
            }
        }
    }
    for event in &events {
        for job in jobs {
            let labels = &event["labels"];
            if labels.get("cgroup").is_some()
                && (labels["cgroup"] == job.cgroup.as_str()) != job.labels_match(labels)
            {
                failures.push(format!("event {event} (job of {})", job.cgroup));
            }
        }
    }
    // Counts by job_id, from the labels alone.
    let count = |job: &JobCgroup, verb: &str, detail: &str| -> u64 {
        verbs
            .values()
            .filter(|(l, _, _)| {
                l["job_id"] == job.job_id.as_str() && l["verb"] == verb && l["detail"] == detail
            })
            .map(|(_, _, v)| v)
            .sum()
    };
    for (job, verb, detail, want) in [
        (&slurm, "create_qp", "user", 1),
        (&slurm, "post_send", "", ITERS),
        (&slurm, "destroy_qp", "user", 1),
        (&pod, "create_qp", "user", 1),
        (&pod, "post_send", "", ITERS),
        (&pod, "destroy_qp", "user", 1),
        (&slurm_v1, "create_qp", "user", 1),
        (&slurm_v1, "destroy_qp", "user", 1),
        (&launcher, "create_qp", "user", 1),
        (&launcher, "destroy_qp", "user", 1),
    ] {
        let got = count(job, verb, detail);
        println!("{} {verb} {detail}: {got}", job.job_id);
        if got != want {
            failures.push(format!(
                "job_id {} {verb} {detail}: {got}, expected {want}",
                job.job_id
            ));
        }
    }
    for job in [&slurm_v1, &launcher] {
        let to_err = events
            .iter()
            .filter(|e| e["kind"] == "qp_to_err" && job.labels_match(&e["labels"]))
            .count();
        println!("{}: {to_err} QP(s) moved to ERR", job.job_id);
        if to_err == 0 {
            failures.push(format!("no qp_to_err event with job_id {}", job.job_id));
        }
    }
    ensure!(failures.is_empty(), "{}", failures.join("; "));
    Ok(())
}
