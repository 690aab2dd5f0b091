//! Which job uses a GPU: NVML's running compute and graphics processes of the GPU, each
//! process's cgroup (`/proc/<pid>/cgroup`), and that cgroup's job ([`crate::jobs`]).
//!
//! A GPU used by processes of several jobs (time-sliced, MPS) is labelled with the job whose
//! processes hold the most GPU memory (ties: the smallest `job_id`): a GPU's series carry one
//! `job_id`, so a query by job sums or compares GPUs without splitting one series between
//! jobs, and the job holding the memory is the one the GPU is working for in practice.
//!
//! Asked at every sweep, right after the GPU's utilization (the first call of a sweep): the
//! process lists are two NVML calls per list, and a process's cgroup is read once, when its
//! pid first shows up on a GPU, and kept while it stays on one (a process does not move
//! between jobs' cgroups).

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use nvml_wrapper::{Device, enums::device::UsedGpuMemory, error::NvmlError};

use crate::jobs::{Job, JobRules};

/// Names the jobs of GPU processes.
pub struct ProcessJobs {
    /// Where `<pid>/cgroup` is read (`/proc`; a fixture tree in tests).
    proc_root: PathBuf,
    rules: JobRules,
    /// pid -> its job, for the pids of the last sweep.
    known: HashMap<u32, Option<Job>>,
    /// The pids seen in this sweep (the others are forgotten at the next [`Self::end_sweep`]).
    seen: Vec<u32>,
}

impl ProcessJobs {
    pub fn new(proc_root: impl Into<PathBuf>, rules: JobRules) -> Self {
        Self {
            proc_root: proc_root.into(),
            rules,
            known: HashMap::new(),
            seen: Vec::new(),
        }
    }

    /// The job using `device` now, if its processes belong to one. A GPU whose process lists
    /// cannot be read (not supported, no permission) has none.
    pub(super) fn job_of(&mut self, device: &Device<'_>) -> Option<Job> {
        let mut processes = Vec::new();
        for list in [
            device.running_compute_processes(),
            device.running_graphics_processes(),
        ] {
            match list {
                Ok(list) => processes.extend(list.into_iter().map(|p| {
                    let bytes = match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => b,
                        UsedGpuMemory::Unavailable => 0,
                    };
                    (p.pid, bytes)
                })),
                Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)) => {}
                Err(e) => tracing::debug!("GPU processes not read: {e}"),
            }
        }
        self.job_of_processes(&processes)
    }

    /// The job of the processes `(pid, GPU memory bytes)` using one GPU: the one holding the
    /// most memory.
    pub fn job_of_processes(&mut self, processes: &[(u32, u64)]) -> Option<Job> {
        let mut memory: HashMap<Job, u64> = HashMap::new();
        for &(pid, bytes) in processes {
            self.seen.push(pid);
            let proc_root = &self.proc_root;
            let rules = &self.rules;
            let job = self
                .known
                .entry(pid)
                .or_insert_with(|| job_of_pid(proc_root, rules, pid));
            if let Some(job) = job {
                *memory.entry(job.clone()).or_default() += bytes;
            }
        }
        memory
            .into_iter()
            .max_by(|(a, am), (b, bm)| am.cmp(bm).then_with(|| b.cmp(a)))
            .map(|(job, _)| job)
    }

    /// After every GPU of a sweep: forgets the pids no GPU reported in it.
    pub fn end_sweep(&mut self) {
        let seen: std::collections::HashSet<u32> = self.seen.drain(..).collect();
        self.known.retain(|pid, _| seen.contains(pid));
    }
}

/// The job of process `pid`, from its cgroup v2 path (the `0::` line of
/// `/proc/<pid>/cgroup`); None if it has exited or its cgroup names no job.
fn job_of_pid(proc_root: &Path, rules: &JobRules, pid: u32) -> Option<Job> {
    let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup")).ok()?;
    let path = cgroup_v2_path(&text)?;
    rules.job_of(path)
}

/// The unified hierarchy's path in a `/proc/<pid>/cgroup` file (`0::/system.slice/...`).
fn cgroup_v2_path(text: &str) -> Option<&str> {
    text.lines().find_map(|l| l.strip_prefix("0::"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc_tree(processes: &[(u32, &str)]) -> PathBuf {
        let root = std::env::temp_dir().join(format!(
            "railscope-proc-{}-{}",
            std::process::id(),
            processes.first().map_or(0, |p| p.0)
        ));
        for (pid, cgroup) in processes {
            let dir = root.join(pid.to_string());
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("cgroup"), cgroup).unwrap();
        }
        root
    }

    #[test]
    fn the_job_holding_most_memory_labels_the_gpu() {
        let root = proc_tree(&[
            (
                101,
                "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n",
            ),
            (
                102,
                "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_1\n",
            ),
            (
                201,
                "12:memory:/kubepods/burstable/pod0a1b2c3d-4e5f-6789-abcd-ef0123456789/c1\n\
                 0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0a1b2c3d_4e5f_6789_abcd_ef0123456789.slice/cri-containerd-c1.scope\n",
            ),
            (301, "0::/\n"),
        ]);
        let mut jobs = ProcessJobs::new(&root, JobRules::default());
        let id = |j: Option<Job>| j.map(|j| j.id);
        assert_eq!(
            id(jobs.job_of_processes(&[(101, 10), (102, 10), (201, 15)])),
            Some("slurm:42".into()),
            "two processes of one job hold more than the other job's one"
        );
        assert_eq!(
            id(jobs.job_of_processes(&[(101, 10), (201, 15)])),
            Some("k8s:0a1b2c3d-4e5f-6789-abcd-ef0123456789".into())
        );
        // A process in no job's cgroup, one that exited (no /proc entry): no job.
        assert_eq!(id(jobs.job_of_processes(&[(301, 99), (999, 1)])), None);
        assert_eq!(id(jobs.job_of_processes(&[])), None);
        // Equal memory: the smallest job_id, whatever the order.
        let tie = |jobs: &mut ProcessJobs, p: &[(u32, u64)]| id(jobs.job_of_processes(p));
        assert_eq!(
            tie(&mut jobs, &[(201, 5), (101, 5)]),
            tie(&mut jobs, &[(101, 5), (201, 5)])
        );
        assert_eq!(
            tie(&mut jobs, &[(201, 5), (101, 5)]),
            Some("k8s:0a1b2c3d-4e5f-6789-abcd-ef0123456789".into())
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_pid_s_cgroup_is_read_once_while_it_stays_on_a_gpu() {
        let root = proc_tree(&[(401, "0::/system.slice/slurmstepd.scope/job_1/step_0\n")]);
        let mut jobs = ProcessJobs::new(&root, JobRules::default());
        assert_eq!(
            jobs.job_of_processes(&[(401, 1)]).map(|j| j.id).as_deref(),
            Some("slurm:1")
        );
        jobs.end_sweep();
        // The file changes (a pid reused): still the cached job while the pid stays.
        std::fs::write(
            root.join("401/cgroup"),
            "0::/system.slice/slurmstepd.scope/job_2\n",
        )
        .unwrap();
        assert_eq!(
            jobs.job_of_processes(&[(401, 1)]).map(|j| j.id).as_deref(),
            Some("slurm:1")
        );
        jobs.end_sweep();
        // Gone from every GPU for a sweep: forgotten, read again when it shows up.
        jobs.end_sweep();
        assert_eq!(
            jobs.job_of_processes(&[(401, 1)]).map(|j| j.id).as_deref(),
            Some("slurm:2")
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
