//! Names of cgroups: the probes key counters by cgroup v2 id (the id of the cgroup's kernfs
//! node, which is also its directory's inode number and what `bpf_get_current_cgroup_id`
//! returns), and this turns ids back into paths such as `/system.slice/slurmstepd.scope/job_1234`.
//!
//! An id not yet known is resolved at once, by the id itself: kernfs (the file system under
//! cgroup v2) takes a file handle made of the node id, so `open_by_handle_at` on the cgroup2
//! mount opens the cgroup's directory and `/proc/self/fd/N` names it (what systemd and bpftool
//! do). A job whose cgroup was created a moment ago is named correctly in its first event.
//! Where that is not possible (not a cgroup2 mount, no `CAP_DAC_READ_SEARCH`) the hierarchy is
//! walked instead, at most once per `refresh_every`.
//!
//! Each name is cached with the job its path names ([`crate::jobs`]), derived once when the
//! name is found, and forgotten with it.
//!
//! Both tables are bounded and every entry has a lifetime: a name is kept while its job has
//! counters (the agent [`forget`](CgroupNames::forget)s it once the job's final values are
//! sent) and at most [`MAX_NAMES`] at once, the least recently used going first (counted); an
//! id found gone is remembered as gone for [`GONE_LIFETIME`] (at most [`MAX_GONE`]), so a
//! record of a job that ended costs no new lookup or walk.

use std::{
    collections::HashMap,
    ffi::CString,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::{ffi::OsStrExt as _, fs::MetadataExt as _},
    },
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::jobs::{Job, JobRules};

/// `CGROUP2_SUPER_MAGIC` (include/uapi/linux/magic.h).
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
/// `FILEID_KERNFS` (include/linux/exportfs.h): a kernfs file handle is the node's 64-bit id.
const FILEID_KERNFS: i32 = 0xfe;
/// Names kept at once; past it the least recently used half is evicted (and counted).
pub(crate) const MAX_NAMES: usize = 16_384;
/// Ids remembered as gone at once; past it the oldest are forgotten.
pub(crate) const MAX_GONE: usize = 16_384;
/// How long an id is remembered as gone. Kernfs never reuses an id, so this only bounds how
/// long a late record of a gone job is named without a lookup.
pub(crate) const GONE_LIFETIME: Duration = Duration::from_secs(3600);
/// Where cgroups are found by walking the hierarchy: how often a walk checks which are gone.
pub(crate) const WALK_LIVENESS_EVERY: Duration = Duration::from_secs(30);

/// id -> path.
pub struct CgroupNames {
    root: PathBuf,
    /// Path, its job, and when it was last asked for.
    names: HashMap<u64, (String, Option<Job>, Instant)>,
    /// What names a path's job.
    jobs: JobRules,
    /// Ids found gone, and when.
    gone: HashMap<u64, Instant>,
    /// Walking: the ids the last walk found.
    walked: std::collections::HashSet<u64>,
    lookup: Lookup,
    last_walk: Option<Instant>,
    refresh_every: Duration,
    stats: CgroupNameStats,
}

/// What the name tables hold and what their bounds cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupNameStats {
    /// Names held now.
    pub names: usize,
    /// Ids remembered as gone now.
    pub gone: usize,
    /// Names evicted because [`MAX_NAMES`] were held (a job still counting may then be named
    /// `cgroup:<id>` if its cgroup is gone by the next lookup).
    pub evicted: u64,
    /// Walks of the hierarchy (only where lookups by handle are not possible).
    pub walks: u64,
}

/// How an id missing from the cache is resolved.
enum Lookup {
    /// Not decided until the first miss.
    Untried,
    /// By file handle, through the cgroup2 mount (an open directory of it) whose canonical
    /// path is `mount_path`.
    ByHandle { mount: OwnedFd, mount_path: PathBuf },
    /// By walking the hierarchy.
    Walk,
}

/// What a lookup by handle found.
#[derive(Debug)]
enum Resolved {
    Path(String),
    /// No cgroup has this id (any more).
    Gone,
    /// The kernel would not open it (no permission, not supported): walk instead.
    Unsupported(std::io::Error),
}

impl CgroupNames {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            names: HashMap::new(),
            jobs: JobRules::default(),
            gone: HashMap::new(),
            walked: Default::default(),
            lookup: Lookup::Untried,
            last_walk: None,
            refresh_every: Duration::from_secs(1),
            stats: CgroupNameStats::default(),
        }
    }

    /// Names jobs with `rules` (the built-in ones by default).
    pub fn with_jobs(mut self, rules: JobRules) -> Self {
        self.jobs = rules;
        self
    }

    pub fn stats(&self) -> CgroupNameStats {
        CgroupNameStats {
            names: self.names.len(),
            gone: self.gone.len(),
            ..self.stats
        }
    }

    /// Forgets the name of a cgroup whose job has ended (its final counters are sent): it is
    /// remembered as gone instead.
    pub fn forget(&mut self, id: u64) {
        self.names.remove(&id);
        self.remember_gone(id, Instant::now());
    }

    /// Whether the cgroup `id` no longer exists. By handle this asks the kernel each time;
    /// walking, it is answered from the last walk, made anew at most every
    /// [`WALK_LIVENESS_EVERY`] for this (so a job's end is seen that much later there).
    pub fn is_gone(&mut self, id: u64) -> bool {
        let now = Instant::now();
        if self.known_gone(id, now) {
            return true;
        }
        if matches!(self.lookup, Lookup::Untried) {
            self.lookup = Lookup::open(&self.root);
        }
        let gone = match &self.lookup {
            Lookup::ByHandle { mount, mount_path } => {
                matches!(resolve_by_handle(mount, mount_path, id), Resolved::Gone)
            }
            _ => {
                if self
                    .last_walk
                    .is_none_or(|t| t.elapsed() >= WALK_LIVENESS_EVERY)
                {
                    self.walk();
                }
                !self.walked.contains(&id)
            }
        };
        if gone {
            self.remember_gone(id, now);
        }
        gone
    }

    fn known_gone(&mut self, id: u64, now: Instant) -> bool {
        match self.gone.get(&id) {
            Some(t) if now.duration_since(*t) < GONE_LIFETIME => true,
            Some(_) => {
                self.gone.remove(&id);
                false
            }
            None => false,
        }
    }

    fn remember_gone(&mut self, id: u64, now: Instant) {
        if self.gone.len() >= MAX_GONE {
            self.gone
                .retain(|_, t| now.duration_since(*t) < GONE_LIFETIME / 2);
            if self.gone.len() >= MAX_GONE {
                // Still full of recent ones: forget the older half.
                let mut times: Vec<Instant> = self.gone.values().copied().collect();
                times.sort_unstable();
                let median = times[times.len() / 2];
                self.gone.retain(|_, t| *t > median);
            }
        }
        self.gone.insert(id, now);
    }

    fn cache(&mut self, id: u64, name: String, now: Instant) {
        if self.names.len() >= MAX_NAMES {
            let mut used: Vec<Instant> = self.names.values().map(|(_, _, t)| *t).collect();
            used.sort_unstable();
            let median = used[used.len() / 2];
            let before = self.names.len();
            self.names.retain(|_, (_, _, t)| *t > median);
            let evicted = before - self.names.len();
            self.stats.evicted += evicted as u64;
            tracing::warn!(
                "{before} cgroup names held (the limit): the {evicted} least recently used \
                 evicted ({} in total)",
                self.stats.evicted
            );
        }
        // A walk names every cgroup again: a known path keeps the job derived from it.
        let job = match self.names.get(&id) {
            Some((known, job, _)) if *known == name => job.clone(),
            _ => self.jobs.job_of(&name),
        };
        self.names.insert(id, (name, job, now));
    }

    /// [`name`](Self::name), and the job of that path, if any rule names one (none for a
    /// cgroup that is gone before it was named).
    pub fn named(&mut self, id: u64) -> (String, Option<Job>) {
        let name = self.name(id);
        let job = self.names.get(&id).and_then(|(_, job, _)| job.clone());
        (name, job)
    }

    /// The cgroup's path relative to the hierarchy root (`/` for the root), or `cgroup:<id>`
    /// for one that is gone or not on cgroup v2.
    pub fn name(&mut self, id: u64) -> String {
        let now = Instant::now();
        if let Some((name, _, used)) = self.names.get_mut(&id) {
            *used = now;
            return name.clone();
        }
        if self.known_gone(id, now) {
            return format!("cgroup:{id}");
        }
        if matches!(self.lookup, Lookup::Untried) {
            self.lookup = Lookup::open(&self.root);
        }
        if let Lookup::ByHandle { mount, mount_path } = &self.lookup {
            match resolve_by_handle(mount, mount_path, id) {
                Resolved::Path(name) => {
                    self.cache(id, name.clone(), now);
                    return name;
                }
                Resolved::Gone => {
                    self.remember_gone(id, now);
                    return format!("cgroup:{id}");
                }
                Resolved::Unsupported(e) => {
                    tracing::debug!(
                        "cgroup ids cannot be opened by handle under {} ({e}): walking the \
                         hierarchy instead",
                        self.root.display()
                    );
                    self.lookup = Lookup::Walk;
                }
            }
        }
        // An id a walk made after it was first asked for does not find is gone: remembered
        // as such, it costs no further walk.
        if self
            .last_walk
            .is_none_or(|t| t.elapsed() >= self.refresh_every)
        {
            self.walk();
            if !self.walked.contains(&id) {
                self.remember_gone(id, now);
            }
        }
        match self.names.get_mut(&id) {
            Some((name, _, used)) => {
                *used = now;
                name.clone()
            }
            None => format!("cgroup:{id}"),
        }
    }

    /// Names every cgroup of the hierarchy anew. Names of cgroups that are gone stay until
    /// [`forget`](Self::forget) (their jobs' last counters still carry them).
    fn walk(&mut self) {
        let now = Instant::now();
        self.last_walk = Some(now);
        self.stats.walks += 1;
        self.walked.clear();
        let mut stack = vec![self.root.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(meta) = std::fs::metadata(&dir) else {
                continue;
            };
            let relative = dir.strip_prefix(&self.root).unwrap_or(Path::new(""));
            self.walked.insert(meta.ino());
            self.cache(meta.ino(), format!("/{}", relative.display()), now);
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

impl Lookup {
    /// By handle when `root` is a cgroup2 mount we can open, else by walking.
    fn open(root: &Path) -> Self {
        let Ok(mount_path) = std::fs::canonicalize(root) else {
            return Lookup::Walk;
        };
        let Ok(c_path) = CString::new(mount_path.as_os_str().as_bytes()) else {
            return Lookup::Walk;
        };
        // SAFETY: a valid NUL-terminated path; the result is checked before use.
        let fd = unsafe {
            libc::open(
                c_path.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Lookup::Walk;
        }
        // SAFETY: a descriptor we just opened and own.
        let mount = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: statfs is plain data, filled by the kernel for a valid descriptor.
        let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstatfs(mount.as_raw_fd(), &mut fs) } != 0
            || fs.f_type as i64 != CGROUP2_SUPER_MAGIC
        {
            return Lookup::Walk;
        }
        Lookup::ByHandle { mount, mount_path }
    }
}

/// `struct file_handle` with its 8-byte kernfs payload.
#[repr(C)]
struct KernfsHandle {
    handle_bytes: u32,
    handle_type: i32,
    id: u64,
}

/// Opens the cgroup with kernfs node `id` through the cgroup2 `mount` and names it from the
/// path of the opened directory.
fn resolve_by_handle(mount: &OwnedFd, mount_path: &Path, id: u64) -> Resolved {
    let mut handle = KernfsHandle {
        handle_bytes: 8,
        handle_type: FILEID_KERNFS,
        id,
    };
    // SAFETY: `handle` is a `struct file_handle` header followed by its `handle_bytes` of
    // payload; the descriptor is checked before use.
    let fd = unsafe {
        libc::open_by_handle_at(
            mount.as_raw_fd(),
            (&raw mut handle).cast::<libc::file_handle>(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            // kernfs: no node with this id; ENOENT/ENOTDIR: not a directory any more.
            Some(libc::ESTALE | libc::ENOENT | libc::ENOTDIR) => Resolved::Gone,
            _ => Resolved::Unsupported(e),
        };
    }
    // SAFETY: a descriptor we just opened and own.
    let dir = unsafe { OwnedFd::from_raw_fd(fd) };
    let Ok(path) = std::fs::read_link(format!("/proc/self/fd/{}", dir.as_raw_fd())) else {
        return Resolved::Unsupported(std::io::Error::other("/proc/self/fd is not readable"));
    };
    if path.as_os_str().as_bytes().ends_with(b" (deleted)") {
        return Resolved::Gone;
    }
    match path.strip_prefix(mount_path) {
        Ok(relative) => Resolved::Path(format!("/{}", relative.display())),
        // Outside the mount we look through (another cgroup namespace's view).
        Err(_) => Resolved::Unsupported(std::io::Error::other(format!(
            "cgroup {id} opens as {}, outside {}",
            path.display(),
            mount_path.display()
        ))),
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
        assert!(
            matches!(names.lookup, Lookup::Walk),
            "a directory that is not a cgroup2 mount is walked"
        );
        assert_eq!(names.name(ino(&dir.join("job_1/step_0"))), "/job_1/step_0");
        // Named with its job, cached with the name.
        std::fs::create_dir_all(dir.join("slurm/uid_0/job_7/step_1")).unwrap();
        names.refresh_every = Duration::ZERO;
        let (name, job) = names.named(ino(&dir.join("slurm/uid_0/job_7/step_1")));
        assert_eq!(name, "/slurm/uid_0/job_7/step_1");
        let job = job.expect("a Slurm step's cgroup names its job");
        assert_eq!(
            (job.id.as_str(), job.step.as_deref()),
            ("slurm:7", Some("1"))
        );
        assert_eq!(names.named(ino(&dir)), ("/".into(), None));
        // A cgroup created later is found on the next walk.
        std::fs::create_dir_all(dir.join("job_2")).unwrap();
        names.refresh_every = Duration::ZERO;
        assert_eq!(names.name(ino(&dir.join("job_2"))), "/job_2");
        assert_eq!(names.name(u64::MAX), format!("cgroup:{}", u64::MAX));
        // An id a walk did not find is remembered as gone: asking again walks no more.
        let walks = names.stats().walks;
        for _ in 0..10 {
            assert_eq!(names.name(u64::MAX), format!("cgroup:{}", u64::MAX));
        }
        assert_eq!(
            names.stats().walks,
            walks,
            "a gone id is not walked for again"
        );
        // A job's cgroup removed: seen gone by the next walk, its name kept for its last
        // counters until the agent forgets it.
        let job_2 = ino(&dir.join("job_2"));
        assert!(!names.is_gone(job_2));
        std::fs::remove_dir(dir.join("job_2")).unwrap();
        names.last_walk = None;
        assert!(names.is_gone(job_2));
        assert_eq!(names.name(job_2), "/job_2");
        names.forget(job_2);
        assert_eq!(names.name(job_2), format!("cgroup:{job_2}"));
        assert_eq!(names.stats().walks, walks + 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_name_table_is_bounded_and_evictions_are_counted() {
        let dir = std::env::temp_dir().join(format!("railscope-cgroup-b-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut names = CgroupNames::new(&dir);
        let now = Instant::now();
        for id in 0..(MAX_NAMES as u64 + 10) {
            names.cache(id, format!("/job_{id}"), now + Duration::from_nanos(id));
        }
        let stats = names.stats();
        assert!(stats.names <= MAX_NAMES, "{stats:?}");
        assert_eq!(stats.evicted as usize + stats.names, MAX_NAMES + 10);
        // The most recent stay.
        assert_eq!(
            names.name(MAX_NAMES as u64 + 9),
            format!("/job_{}", MAX_NAMES + 9)
        );
        for id in 0..(MAX_GONE as u64 * 2) {
            names.remember_gone(id, now);
        }
        assert!(names.stats().gone <= MAX_GONE);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// On a real cgroup2 mount (the test bed's guest: run by the `cgroups-late` scenario): a
    /// cgroup created right after a lookup is named at once, by its id, without a walk; a
    /// removed one is `cgroup:<id>`.
    #[test]
    #[ignore = "needs a cgroup2 mount at /sys/fs/cgroup and root: runs inside the test bed"]
    fn cgroup2_names_a_new_cgroup_at_once() {
        let root = Path::new("/sys/fs/cgroup");
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        let mut names = CgroupNames::new(root);
        assert_eq!(names.name(ino(root)), "/");
        assert!(
            matches!(names.lookup, Lookup::ByHandle { .. }),
            "/sys/fs/cgroup is a cgroup2 mount: ids are opened by handle"
        );
        // A walk now would not help: the next one is a day away.
        names.refresh_every = Duration::from_secs(86_400);
        names.walk();
        let job = root.join(format!("railscope-test-{}", std::process::id()));
        std::fs::create_dir(&job).unwrap();
        std::fs::create_dir(job.join("step_0")).unwrap();
        let (job_id, step_id) = (ino(&job), ino(&job.join("step_0")));
        let job_name = format!("/railscope-test-{}", std::process::id());
        assert_eq!(names.name(step_id), format!("{job_name}/step_0"));
        assert_eq!(names.name(job_id), job_name);
        std::fs::remove_dir(job.join("step_0")).unwrap();
        std::fs::remove_dir(&job).unwrap();
        // Still cached: an event that was recorded before the cgroup went keeps its name.
        assert_eq!(names.name(job_id), job_name);
        let mut fresh = CgroupNames::new(root);
        assert_eq!(fresh.name(step_id), format!("cgroup:{step_id}"));
    }
}
