//! Processes placed in cgroups laid out as a scheduler lays them out (Slurm, Kubernetes, or a
//! path a `[[jobs.patterns]]` rule of agent.toml names), so that the agent, reading
//! `/proc/<pid>/cgroup` of the pids the NVML stand-in lists as a GPU's processes, labels the
//! GPU's series with their job (docs/agent.md, "Jobs").
//!
//! On a cgroup2 mount when this host lets us create cgroups there (root, `/sys/fs/cgroup` or
//! its `unified` hybrid mount): each a real `sleep` moved in through `cgroup.procs` and read
//! back through the real `/proc`. Else ([`JobProcesses::new`] only) pids with a `/proc`-like
//! tree of `<pid>/cgroup` files, for code that takes a proc root.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command},
};

/// How long each `sleep` runs at most (it is killed on drop).
const SLEEP_S: &str = "900";

/// One process per cgroup path, under a top cgroup of the test's own; the processes are
/// killed and the cgroups removed on drop.
pub struct JobProcesses {
    /// `/proc` when the processes are real ones in real cgroups, else the fixture tree.
    pub proc_root: PathBuf,
    /// The pid in each path, in the order given.
    pub pids: Vec<u32>,
    children: Vec<Child>,
    /// Cgroups made, deepest first.
    cgroups: Vec<PathBuf>,
}

impl JobProcesses {
    /// A process in each of `paths` (relative, `/`-separated, e.g.
    /// `system.slice/slurmstepd.scope/job_42/step_0`) under the top cgroup
    /// `railscope-TEST-PID`; a `/proc`-like fixture tree when no cgroup can be made.
    pub fn new(test: &str, paths: &[String]) -> JobProcesses {
        let top = top(test);
        if let Some(made) = Self::make(&top, paths) {
            eprintln!("processes in cgroups {:?}", made.cgroups);
            return made;
        }
        eprintln!("no cgroup2 mount to create cgroups in: a /proc-like fixture instead");
        let root = std::env::temp_dir().join(&top);
        let pids: Vec<u32> = (0..paths.len() as u32).map(|i| 4_000_001 + i).collect();
        for (pid, path) in pids.iter().zip(paths) {
            fs::create_dir_all(root.join(pid.to_string())).unwrap();
            fs::write(
                root.join(format!("{pid}/cgroup")),
                format!("0::/{top}/{path}\n"),
            )
            .unwrap();
        }
        JobProcesses {
            proc_root: root,
            pids,
            children: Vec::new(),
            cgroups: Vec::new(),
        }
    }

    /// Real processes in real cgroups, or `None` when this host lets us create none (not
    /// root, no cgroup2 mount): what a test of the agent binary needs, as the agent reads
    /// the real `/proc`.
    pub fn in_cgroups(test: &str, paths: &[String]) -> Option<JobProcesses> {
        let made = Self::make(&top(test), paths)?;
        eprintln!("processes in cgroups {:?}", made.cgroups);
        Some(made)
    }

    /// The cgroup path of `paths[i]` as `/proc/<pid>/cgroup` shows it (from the cgroup2 root).
    pub fn cgroup_path(test: &str, path: &str) -> String {
        format!("/{}/{path}", top(test))
    }

    fn make(top: &str, paths: &[String]) -> Option<JobProcesses> {
        let mount = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
            .into_iter()
            .map(Path::new)
            .find(|m| {
                fs::metadata(m.join("cgroup.procs")).is_ok() && fs::create_dir(m.join(top)).is_ok()
            })?;
        let mut made = JobProcesses {
            proc_root: "/proc".into(),
            pids: Vec::new(),
            children: Vec::new(),
            cgroups: vec![mount.join(top)],
        };
        for path in paths {
            let mut dir = mount.join(top);
            for part in path.split('/') {
                dir.push(part);
                if !dir.exists() {
                    fs::create_dir(&dir).ok()?;
                    made.cgroups.insert(0, dir.clone());
                }
            }
            let child = Command::new("sleep").arg(SLEEP_S).spawn().ok()?;
            let pid = child.id();
            made.pids.push(pid);
            made.children.push(child);
            fs::write(dir.join("cgroup.procs"), pid.to_string()).ok()?;
        }
        Some(made)
    }
}

fn top(test: &str) -> String {
    format!("railscope-{test}-{}", std::process::id())
}

impl Drop for JobProcesses {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        for cgroup in &self.cgroups {
            let _ = fs::remove_dir(cgroup);
        }
        if self.proc_root != Path::new("/proc") {
            let _ = fs::remove_dir_all(&self.proc_root);
        }
    }
}
