//! Names of cgroups: the probes key counters by cgroup v2 id (the kernfs inode number of the
//! cgroup's directory, what `bpf_get_current_cgroup_id` returns), and this turns ids back
//! into paths such as `/system.slice/slurmstepd.scope/job_1234`.

use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// id -> path, rebuilt by walking the hierarchy when an unknown id shows up (at most once
/// per `refresh_every`, so a burst of short-lived cgroups cannot make us walk in a loop).
pub struct CgroupNames {
    root: PathBuf,
    names: HashMap<u64, String>,
    last_walk: Option<Instant>,
    refresh_every: Duration,
}

impl CgroupNames {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            names: HashMap::new(),
            last_walk: None,
            refresh_every: Duration::from_secs(1),
        }
    }

    /// The cgroup's path relative to the hierarchy root (`/` for the root), or `cgroup:<id>`
    /// for one that is gone or not on cgroup v2.
    pub fn name(&mut self, id: u64) -> String {
        if !self.names.contains_key(&id)
            && self
                .last_walk
                .is_none_or(|t| t.elapsed() >= self.refresh_every)
        {
            self.walk();
        }
        self.names
            .get(&id)
            .cloned()
            .unwrap_or_else(|| format!("cgroup:{id}"))
    }

    fn walk(&mut self) {
        self.last_walk = Some(Instant::now());
        self.names.clear();
        let mut stack = vec![self.root.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(meta) = std::fs::metadata(&dir) else {
                continue;
            };
            let relative = dir.strip_prefix(&self.root).unwrap_or(Path::new(""));
            self.names
                .insert(meta.ino(), format!("/{}", relative.display()));
            if let Ok(entries) = std::fs::read_dir(&dir) {
                stack.extend(
                    entries
                        .filter_map(Result::ok)
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .map(|e| e.path()),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_directories_by_inode() {
        let dir = std::env::temp_dir().join(format!("railscope-cgroup-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("job_1/step_0")).unwrap();
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        let mut names = CgroupNames::new(&dir);
        assert_eq!(names.name(ino(&dir)), "/");
        assert_eq!(names.name(ino(&dir.join("job_1/step_0"))), "/job_1/step_0");
        // A cgroup created later is found on the next walk.
        std::fs::create_dir_all(dir.join("job_2")).unwrap();
        names.refresh_every = Duration::ZERO;
        assert_eq!(names.name(ino(&dir.join("job_2"))), "/job_2");
        assert_eq!(names.name(u64::MAX), format!("cgroup:{}", u64::MAX));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
