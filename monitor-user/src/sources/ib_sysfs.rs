//! InfiniBand and RoCE port counters and link facts from sysfs
//! (`<root>/class/infiniband/<device>/...`, `<root>` being `/sys` on a real node).
//!
//! Every call to [`IbSysfs::read`] lists the devices again, so a driver loaded or unloaded
//! while the agent runs is picked up (logged at info), and reads every file of:
//!
//! - `ports/<p>/counters/` (IB PMA counters; each read is a MAD to the adapter),
//! - `ports/<p>/hw_counters/` (mlx5, rxe: driver and firmware counters),
//! - `hw_counters/` at device level (mlx5),
//! - the port attributes `state`, `phys_state`, `rate` and `link_layer`.
//!
//! [`IbSysfs::read_due`] reads only the files whose series the adaptive sampler wants now; the
//! agent uses it, so a stable counter is read at its collection interval, not every sweep.
//!
//! # Cost
//!
//! The agent reads hundreds of these files a second on every node, so the source keeps them
//! open and reads each again with one `pread` at offset 0: sysfs builds an attribute's text
//! anew on every read from offset 0, and one system call replaces `open`, `read` and `close`
//! (and the path walk). A device's directories are listed when it appears, again every
//! `replan_every` (60 s) to pick up files that appeared, and at the next read after one of its
//! files was found missing. A file whose read fails is closed and opened again by path at its
//! next read. At most half the process's descriptor limit is kept open (the agent raises its
//! soft limit to the hard one); beyond that a file is opened, read and closed each time.
//!
//! Counter files are not filtered against a list: a name this code has never seen (new
//! firmware, another driver) becomes a series like any other. A file that cannot be read or
//! holds something unexpected is reported once with `tracing::warn!` naming the file, listed in
//! [`IbSysfs::problems`] for as long as it stays that way, and costs only its own series.
//!
//! # Series
//!
//! | name | kind | labels | from |
//! |---|---|---|---|
//! | `railscope_ib_<file>_total` | counter | device, port | each file of `ports/<p>/counters/` and `ports/<p>/hw_counters/` |
//! | `railscope_ib_<file>_total` | counter | device | each file of the device-level `hw_counters/` |
//! | `railscope_ib_hw_<file>_total` | counter | device, port | a `hw_counters/` file whose name `counters/` of the same port already uses |
//! | `railscope_ib_port_xmit_bytes_total` | counter | device, port | `counters/port_xmit_data` × 4 (the file counts 4-byte words) |
//! | `railscope_ib_port_rcv_bytes_total` | counter | device, port | `counters/port_rcv_data` × 4 |
//! | `railscope_ib_hw_counters_lifespan_seconds` | gauge | device[, port] | `hw_counters/lifespan` (milliseconds in the file) |
//! | `railscope_ib_port_state` | gauge | device, port | `state`: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER |
//! | `railscope_ib_port_phys_state` | gauge | device, port | `phys_state`: 1 Sleep, 2 Polling, 3 Disabled, 4 PortConfigurationTraining, 5 LinkUp, 6 LinkErrorRecovery, 7 PhyTest |
//! | `railscope_ib_port_rate_gbps` | gauge | device, port | `rate`: "400 Gb/sec (4X NDR)" gives 400 |
//! | `railscope_ib_port_width_lanes` | gauge | device, port | `rate`: "(4X NDR)" gives 4; a link trained down to one lane gives 1 |
//! | `railscope_ib_port_link_layer_info` | gauge, always 1 | device, port, link_layer | `link_layer`: `InfiniBand`, `Ethernet` (RoCE) |
//!
//! `<file>` is the file name lowercased (`VL15_dropped` gives `railscope_ib_vl15_dropped_total`),
//! with any character outside `[a-z0-9_]` replaced by `_` and a trailing `_total` not doubled.
//!
//! Choices:
//! - `link_layer` is a label of its own info series, not a label on every counter: it never
//!   changes while a port exists, so repeating it on each of ~60 series per port would only
//!   cost bytes; `railscope_ib_port_link_layer_info` joins on {device, port} when a query
//!   needs it (`* on(device, port) group_left(link_layer)`).
//! - The per-lane speed name (NDR, HDR, ...) is not a series: `rate_gbps / width_lanes` gives
//!   the lane speed as a number that can be alerted on; the name is in [`LinkRate::speed`] for
//!   capture mode and reports.
//! - `lifespan` is a setting (how long the driver caches hw_counters, in ms), not a count: it
//!   is sent as a gauge in seconds, because it says how fresh the counters next to it can be.
//! - `state` and `phys_state` are sent as their numeric codes. A name this code does not know
//!   for a code ("4: WHATEVER") is reported once, and the code is still sent.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs, io,
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
    sync::{
        OnceLock,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use railscope_wire::{Kind, Labels, Reading, Series, Value};

use super::{Collect, ReadingSink};
use crate::sampler::Slot;

const PREFIX: &str = "railscope_ib_";

/// Why one sysfs file gave no value, or not the value expected. Each message is one line and
/// names the file.
#[derive(Debug, thiserror::Error)]
pub enum SysfsError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot list {}: {source}", path.display())]
    List {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: contents are not UTF-8", path.display())]
    NotUtf8 { path: PathBuf },
    #[error("{}: unexpected value {value:?} (expected {expected})", path.display())]
    Malformed {
        path: PathBuf,
        value: String,
        expected: &'static str,
    },
    #[error("{}: unknown name {name:?} for code {code} (code still used)", path.display())]
    UnknownName {
        path: PathBuf,
        code: u32,
        name: String,
    },
}

impl SysfsError {
    /// The file or directory the problem is about.
    pub fn path(&self) -> &Path {
        match self {
            SysfsError::Read { path, .. }
            | SysfsError::List { path, .. }
            | SysfsError::NotUtf8 { path }
            | SysfsError::Malformed { path, .. }
            | SysfsError::UnknownName { path, .. } => path,
        }
    }

    fn not_found(&self) -> bool {
        matches!(
            self,
            SysfsError::Read { source, .. } | SysfsError::List { source, .. }
                if source.kind() == io::ErrorKind::NotFound
        )
    }
}

/// A port state as sysfs prints it, "4: ACTIVE": the code, and the name the kernel gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodedState {
    pub code: u32,
    pub name: String,
}

impl CodedState {
    /// `state` is ACTIVE: the port passes traffic.
    pub fn is_active(&self) -> bool {
        self.code == 4
    }
}

/// The `link_layer` of a port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    InfiniBand,
    /// RoCE.
    Ethernet,
    /// What the kernel prints when the driver does not say.
    Unknown,
    Other(String),
}

impl LinkLayer {
    pub fn as_str(&self) -> &str {
        match self {
            LinkLayer::InfiniBand => "InfiniBand",
            LinkLayer::Ethernet => "Ethernet",
            LinkLayer::Unknown => "Unknown",
            LinkLayer::Other(s) => s,
        }
    }
}

/// The `rate` of a port, "400 Gb/sec (4X NDR)".
#[derive(Clone, Debug, PartialEq)]
pub struct LinkRate {
    /// Total data rate of the port, all lanes together.
    pub gbps: f64,
    /// Active lanes (1, 2, 4, 8, 12); `None` when the file does not say.
    pub width_lanes: Option<u32>,
    /// Lane speed name (SDR, DDR, QDR, FDR10, FDR, EDR, HDR, NDR, XDR), when printed.
    pub speed: Option<String>,
}

/// What the port attributes say about one port's link, as of the last scan. A field is `None`
/// when its file could not be read or parsed (see [`IbSysfs::problems`]).
#[derive(Clone, Debug, PartialEq)]
pub struct PortLink {
    pub device: String,
    pub port: u32,
    pub state: Option<CodedState>,
    pub phys_state: Option<CodedState>,
    pub rate: Option<LinkRate>,
    pub link_layer: Option<LinkLayer>,
}

/// The IB sysfs source: per device present, the files it reads, kept open; the problems of
/// the files that are failing now, and the ones already warned about.
#[derive(Debug)]
pub struct IbSysfs {
    root: PathBuf,
    devices: BTreeMap<String, DevicePlan>,
    class_seen: Option<bool>,
    warned: BTreeSet<PathBuf>,
    problems: BTreeMap<PathBuf, SysfsError>,
    links: Vec<PortLink>,
    buf: Vec<u8>,
    replan_every: Duration,
    relist_every: Duration,
    /// When `class/infiniband` was last listed, and what it held.
    listed: Option<(Instant, Vec<String>)>,
}

impl Default for IbSysfs {
    fn default() -> Self {
        Self::new(PathBuf::from("/sys"))
    }
}

/// How a counter file's number becomes a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Convert {
    Count,
    /// `port_xmit_data` and `port_rcv_data` count 4-byte words.
    Words,
    /// `hw_counters/lifespan`: milliseconds, sent as a gauge in seconds.
    LifespanMs,
}

/// A file kept open and read again from offset 0: sysfs builds an attribute's text anew on
/// every read at offset 0, so one `pread` replaces `open`, `read` and `close`.
#[derive(Debug)]
struct OpenFile {
    path: PathBuf,
    file: Option<fs::File>,
}

/// Files kept open by every source of the process, against [`max_kept_files`]: a node with
/// many ports has thousands of counter files, and an agent that ran out of descriptors could
/// open nothing else. Beyond the budget a file is opened, read and closed each time.
static KEPT_FILES: AtomicUsize = AtomicUsize::new(0);

/// Half of the descriptor limit (the agent raises its soft limit to the hard one at start).
fn max_kept_files() -> usize {
    static MAX: OnceLock<usize> = OnceLock::new();
    *MAX.get_or_init(|| {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes a valid rlimit struct it is given.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
            return 256;
        }
        usize::try_from(limit.rlim_cur / 2).unwrap_or(usize::MAX)
    })
}

/// Counts one more kept file, if the budget allows it.
fn reserve_kept_file() -> bool {
    let max = max_kept_files();
    KEPT_FILES
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            (n < max).then_some(n + 1)
        })
        .is_ok()
}

impl OpenFile {
    fn new(path: PathBuf) -> Self {
        Self { path, file: None }
    }

    /// The whole contents, (re)opening the file when needed. After an error the file is
    /// closed, so the next read opens the path again (a file replaced, a device re-registered).
    fn read<'b>(&mut self, buf: &'b mut [u8]) -> io::Result<&'b [u8]> {
        let result = match &self.file {
            Some(file) => read_whole(file, buf),
            None => {
                let file = fs::File::open(&self.path)?;
                let result = read_whole(&file, buf);
                if result.is_ok() && reserve_kept_file() {
                    self.file = Some(file);
                }
                return result;
            }
        };
        if result.is_err() {
            self.close();
        }
        result
    }

    fn close(&mut self) {
        if self.file.take().is_some() {
            KEPT_FILES.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for OpenFile {
    fn drop(&mut self) {
        self.close();
    }
}

/// One read: a sysfs attribute gives its whole text (at most a page) at once; reading on to
/// see the end of the file would double the system calls.
fn read_whole<'b>(file: &fs::File, buf: &'b mut [u8]) -> io::Result<&'b [u8]> {
    loop {
        match file.read_at(buf, 0) {
            Ok(n) => return Ok(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// A series this source reads, with the slot its sink keeps for it.
#[derive(Debug)]
struct Tracked {
    series: Series,
    slot: Slot,
}

impl Tracked {
    fn new(series: Series) -> Self {
        Self {
            series,
            slot: Slot::default(),
        }
    }
}

#[derive(Debug)]
struct CounterFile {
    file: OpenFile,
    tracked: Tracked,
    convert: Convert,
}

#[derive(Debug)]
struct PortPlan {
    link: PortLink,
    state: OpenFile,
    phys_state: OpenFile,
    rate: OpenFile,
    link_layer: OpenFile,
    state_series: Tracked,
    phys_state_series: Tracked,
    rate_series: Tracked,
    width_series: Tracked,
    /// `railscope_ib_port_link_layer_info` with the link layer last read as a label.
    link_layer_series: Option<Tracked>,
    counters: Vec<CounterFile>,
}

/// One device's files, from listing its directories.
#[derive(Debug)]
struct DevicePlan {
    dir: PathBuf,
    ports: Vec<PortPlan>,
    counters: Vec<CounterFile>,
    planned_at: Instant,
    /// A file listed in the plan was gone: list the directories again at the next read.
    stale: bool,
}

/// What one read of the source touches: where values go (nowhere when only the link facts
/// are read), the buffer and the problem list.
struct Sweep<'a, 's> {
    sink: Option<&'s mut dyn ReadingSink>,
    buf: &'a mut [u8],
    problems: &'a mut BTreeMap<PathBuf, SysfsError>,
}

impl IbSysfs {
    /// `root` is the directory holding `class/infiniband`: `/sys` on a node, a fixture tree in
    /// tests.
    pub fn new(root: PathBuf) -> Self {
        Self {
            root,
            devices: BTreeMap::new(),
            class_seen: None,
            warned: BTreeSet::new(),
            problems: BTreeMap::new(),
            links: Vec::new(),
            buf: vec![0; 4096],
            replan_every: Duration::from_secs(60),
            relist_every: Duration::ZERO,
            listed: None,
        }
    }

    /// How often each device's directories are listed again, to find counter files that
    /// appeared (a firmware update, a driver reloaded between two reads). Default 60 s.
    pub fn with_replan_every(mut self, every: Duration) -> Self {
        self.replan_every = every;
        self
    }

    /// How often `class/infiniband` is listed to find devices that appeared. Default: at every
    /// read. A device that goes away is noticed at the first read of its files either way.
    pub fn with_relist_every(mut self, every: Duration) -> Self {
        self.relist_every = every;
        self
    }

    /// Reads every counter and port attribute of every device present now, stamped `unix_ns`.
    /// Readings come sorted by device, port, then file name.
    pub fn read(&mut self, unix_ns: u64) -> Vec<Reading> {
        self.read_due(unix_ns, |_| true)
    }

    /// Like [`read`](Self::read), but reads only the files whose series `due` asks for (the
    /// adaptive sampler's read schedule). A port attribute is read when its first series is
    /// due (`rate` for either of its two).
    pub fn read_due(&mut self, unix_ns: u64, due: impl FnMut(&Series) -> bool) -> Vec<Reading> {
        let mut out = Vec::new();
        self.read_into(&mut Collect::new(&mut out, unix_ns, due));
        out
    }

    /// Reads the files of the series `sink` says are due, handing it each value.
    pub fn read_into(&mut self, sink: &mut dyn ReadingSink) {
        self.scan(Some(sink));
    }

    /// Reads only the port attributes (`state`, `phys_state`, `rate`, `link_layer`) of every
    /// device: four small files per port and no firmware command, cheap enough to poll fast
    /// while capturing a flapping link.
    pub fn read_links(&mut self) -> &[PortLink] {
        self.scan(None);
        &self.links
    }

    /// The link facts of every port found by the last [`read`](Self::read) or
    /// [`read_links`](Self::read_links).
    pub fn links(&self) -> &[PortLink] {
        &self.links
    }

    /// The files failing now, one entry per file, each as of its last read. Empty when
    /// everything was read.
    pub fn problems(&self) -> Vec<&SysfsError> {
        self.problems.values().collect()
    }

    /// The devices found by the last scan.
    pub fn devices(&self) -> impl Iterator<Item = &str> {
        self.devices.keys().map(String::as_str)
    }

    fn scan(&mut self, sink: Option<&mut dyn ReadingSink>) {
        let class = self.root.join("class/infiniband");
        if let Some((at, names)) = &self.listed
            && at.elapsed() < self.relist_every
        {
            // Between listings, one stat per device: a removed device's files may still read
            // (an unlinked file does; sysfs gives ENODEV), its directory does not.
            let names: Vec<String> = names
                .iter()
                .filter(|name| class.join(name).is_dir())
                .cloned()
                .collect();
            if self
                .listed
                .as_ref()
                .is_some_and(|(_, all)| all.len() != names.len())
            {
                // A device went away (a driver unloading?): list again at the next read.
                self.listed = None;
            }
            self.scan_devices(&class, names, sink);
            return;
        }
        let class_problem = class.clone();
        self.problems.remove(&class_problem);
        let names = match list_dir(&class) {
            Ok(names) => {
                if self.class_seen != Some(true) {
                    tracing::debug!("reading RDMA devices under {}", class.display());
                }
                self.class_seen = Some(true);
                names
            }
            Err(e) if e.not_found() => {
                // Absent from the start is the caller's to say (the agent does, once); gone
                // after it existed (the drivers unloaded) is news.
                if self.class_seen == Some(true) {
                    tracing::info!("no RDMA devices: {} no longer exists", class.display());
                }
                self.class_seen = Some(false);
                Vec::new()
            }
            Err(e) => {
                self.problems.insert(class_problem, e);
                // Keep reading the devices already known.
                self.devices.keys().cloned().collect()
            }
        };
        self.listed = Some((Instant::now(), names.clone()));
        self.scan_devices(&class, names, sink);
    }

    fn scan_devices(
        &mut self,
        class: &Path,
        names: Vec<String>,
        sink: Option<&mut dyn ReadingSink>,
    ) {
        let mut sweep = Sweep {
            sink,
            buf: &mut self.buf,
            problems: &mut self.problems,
        };
        let before: BTreeSet<String> = self.devices.keys().cloned().collect();
        // A device that went away: list the class directory again at the next read.
        let mut relist = false;
        let mut present = BTreeMap::new();
        for name in names {
            let dir = class.join(&name);
            let plan = match self.devices.remove(&name) {
                Some(plan) if !plan.stale && plan.planned_at.elapsed() < self.replan_every => {
                    Some(plan)
                }
                _ => {
                    forget_listing_problems(sweep.problems, &dir);
                    plan_device(&name, dir.clone(), sweep.problems)
                }
            };
            let Some(mut plan) = plan else {
                // Gone while being listed: a device unregistered during the scan.
                tracing::debug!(device = name, "vanished while being listed");
                forget_problems_under(sweep.problems, &dir);
                relist = true;
                continue;
            };
            let failed = sweep.device(&mut plan);
            // A device unregistered while it was being read leaves files that vanished; that
            // is the device going away, not a broken file.
            if failed && !plan.dir.is_dir() {
                tracing::debug!(device = name, "vanished while being read");
                forget_problems_under(sweep.problems, &plan.dir);
                relist = true;
                continue;
            }
            present.insert(name, plan);
        }

        if relist {
            self.listed = None;
        }
        // What is left of the previous plans: devices no longer listed (those that vanished
        // while being read have had their problems dropped already).
        for plan in self.devices.values() {
            forget_problems_under(&mut self.problems, &plan.dir);
        }
        for gone in before.iter().filter(|d| !present.contains_key(*d)) {
            tracing::info!(device = %gone, "RDMA device disappeared");
        }
        for new in present.keys().filter(|d| !before.contains(*d)) {
            tracing::info!(device = %new, "RDMA device appeared");
        }
        self.devices = present;
        self.links = self
            .devices
            .values()
            .flat_map(|d| d.ports.iter().map(|p| p.link.clone()))
            .collect();

        for (path, p) in &self.problems {
            if !self.warned.contains(path) {
                tracing::warn!("{p}; the other counters are still read");
            }
        }
        for fixed in &self.warned {
            if !self.problems.contains_key(fixed) {
                tracing::info!("{} reads normally again", fixed.display());
            }
        }
        self.warned = self.problems.keys().cloned().collect();
    }
}

/// Lists a device's directories: its ports, each port's attributes and counter files, the
/// device-level counters. `None` when the device directory itself is gone.
fn plan_device(
    device: &str,
    dir: PathBuf,
    problems: &mut BTreeMap<PathBuf, SysfsError>,
) -> Option<DevicePlan> {
    let ports_dir = dir.join("ports");
    let mut port_names: Vec<(u32, String)> = Vec::new();
    match list_dir(&ports_dir) {
        Ok(names) => {
            for name in names {
                match name.parse::<u32>() {
                    Ok(n) => port_names.push((n, name)),
                    Err(_) => {
                        let path = ports_dir.join(&name);
                        problems.insert(
                            path.clone(),
                            SysfsError::Malformed {
                                path,
                                value: name,
                                expected: PORT_NUMBER,
                            },
                        );
                    }
                }
            }
        }
        Err(e) if !dir.is_dir() => {
            drop(e);
            return None;
        }
        Err(e) => {
            problems.insert(e.path().to_path_buf(), e);
        }
    }
    port_names.sort();
    let mut ports = Vec::new();
    for (port, name) in port_names {
        let pdir = ports_dir.join(name);
        let port_label = port.to_string();
        let labels = Labels::new([("device", device), ("port", port_label.as_str())]);
        let gauge = |name: &str| {
            Tracked::new(Series {
                name: format!("{PREFIX}{name}").into(),
                labels: labels.clone(),
                kind: Kind::Gauge,
            })
        };
        let mut counters = counter_files(&pdir.join("counters"), &labels, None, problems);
        let taken: BTreeSet<String> = counters
            .iter()
            .map(|c| c.tracked.series.name.to_string())
            .collect();
        counters.extend(counter_files(
            &pdir.join("hw_counters"),
            &labels,
            Some(&taken),
            problems,
        ));
        ports.push(PortPlan {
            link: PortLink {
                device: device.to_string(),
                port,
                state: None,
                phys_state: None,
                rate: None,
                link_layer: None,
            },
            state: OpenFile::new(pdir.join("state")),
            phys_state: OpenFile::new(pdir.join("phys_state")),
            rate: OpenFile::new(pdir.join("rate")),
            link_layer: OpenFile::new(pdir.join("link_layer")),
            state_series: gauge("port_state"),
            phys_state_series: gauge("port_phys_state"),
            rate_series: gauge("port_rate_gbps"),
            width_series: gauge("port_width_lanes"),
            link_layer_series: None,
            counters,
        });
    }
    let labels = Labels::new([("device", device)]);
    let counters = counter_files(&dir.join("hw_counters"), &labels, None, problems);
    Some(DevicePlan {
        dir,
        ports,
        counters,
        planned_at: Instant::now(),
        stale: false,
    })
}

/// The files of a counter directory, with their series; an absent directory is normal (rxe
/// has no `counters/`, IB-only drivers no `hw_counters/`). `taken`: the series names of the
/// port's `counters/`, which a `hw_counters/` file must not reuse.
fn counter_files(
    dir: &Path,
    labels: &Labels,
    taken: Option<&BTreeSet<String>>,
    problems: &mut BTreeMap<PathBuf, SysfsError>,
) -> Vec<CounterFile> {
    let names = match list_files(dir) {
        Ok(names) => names,
        Err(e) if e.not_found() => return Vec::new(),
        Err(e) => {
            problems.insert(dir.to_path_buf(), e);
            return Vec::new();
        }
    };
    names
        .into_iter()
        .map(|file| {
            let (name, kind, convert) = match file.as_str() {
                "lifespan" => (
                    "hw_counters_lifespan_seconds".to_string(),
                    Kind::Gauge,
                    Convert::LifespanMs,
                ),
                "port_xmit_data" => (
                    "port_xmit_bytes_total".to_string(),
                    Kind::Counter,
                    Convert::Words,
                ),
                "port_rcv_data" => (
                    "port_rcv_bytes_total".to_string(),
                    Kind::Counter,
                    Convert::Words,
                ),
                _ => (
                    format!("{}_total", metric_stem(&file)),
                    Kind::Counter,
                    Convert::Count,
                ),
            };
            let mut name = format!("{PREFIX}{name}");
            if kind == Kind::Counter && taken.is_some_and(|t| t.contains(&name)) {
                name = format!("{PREFIX}hw_{}", &name[PREFIX.len()..]);
            }
            CounterFile {
                file: OpenFile::new(dir.join(&file)),
                tracked: Tracked::new(Series {
                    name: name.into(),
                    labels: labels.clone(),
                    kind,
                }),
                convert,
            }
        })
        .collect()
}

/// Drops the directory-listing problems under `dir` (they are found again when it is listed).
/// What a `ports/` entry should be; a problem with it comes from listing, not from reading.
const PORT_NUMBER: &str = "a port number";

fn forget_listing_problems(problems: &mut BTreeMap<PathBuf, SysfsError>, dir: &Path) {
    problems.retain(|path, p| {
        !(path.starts_with(dir)
            && matches!(
                p,
                SysfsError::List { .. }
                    | SysfsError::Malformed {
                        expected: PORT_NUMBER,
                        ..
                    }
            ))
    });
}

/// Drops every problem under `dir`: the device went away, and its files with it.
fn forget_problems_under(problems: &mut BTreeMap<PathBuf, SysfsError>, dir: &Path) {
    problems.retain(|path, _| !path.starts_with(dir));
}

impl Sweep<'_, '_> {
    /// Whether to read the file of `series` (always, when only the link facts are read).
    fn due(&mut self, tracked: &mut Tracked) -> bool {
        self.sink
            .as_mut()
            .is_none_or(|sink| sink.due(&tracked.series, &mut tracked.slot))
    }

    /// Reads one device's due files. Returns whether any read failed.
    fn device(&mut self, plan: &mut DevicePlan) -> bool {
        let mut failed = false;
        for port in &mut plan.ports {
            failed |= self.port(port, &mut plan.stale);
        }
        if self.sink.is_some() {
            for counter in &mut plan.counters {
                failed |= self.counter(counter, &mut plan.stale);
            }
        }
        failed
    }

    fn port(&mut self, port: &mut PortPlan, stale: &mut bool) -> bool {
        let mut failed = false;
        let counting = self.sink.is_some();
        if self.due(&mut port.state_series) {
            port.link.state = self.coded(&mut port.state, &STATE_NAMES, stale);
            failed |= port.link.state.is_none();
            if let Some(s) = &port.link.state {
                self.emit(&mut port.state_series, Value::U64(s.code.into()));
            }
        }
        if self.due(&mut port.phys_state_series) {
            port.link.phys_state = self.coded(&mut port.phys_state, &PHYS_STATE_NAMES, stale);
            failed |= port.link.phys_state.is_none();
            if let Some(s) = &port.link.phys_state {
                self.emit(&mut port.phys_state_series, Value::U64(s.code.into()));
            }
        }
        if self.due(&mut port.rate_series) || self.due(&mut port.width_series) {
            port.link.rate = None;
            if let Some(text) = self.text(&mut port.rate, stale) {
                match parse_rate(&text) {
                    Ok(rate) => {
                        self.ok(&port.rate.path);
                        port.link.rate = Some(rate);
                    }
                    Err(partial) => {
                        port.link.rate = partial;
                        self.problem(SysfsError::Malformed {
                            path: port.rate.path.clone(),
                            value: text,
                            expected: "\"<rate> Gb/sec (<width>X <speed>)\"",
                        });
                    }
                }
            } else {
                failed = true;
            }
            if let Some(r) = &port.link.rate {
                self.emit(&mut port.rate_series, Value::F64(r.gbps));
                if let Some(w) = r.width_lanes {
                    self.emit(&mut port.width_series, Value::U64(w.into()));
                }
            }
        }
        let layer_due = match &mut port.link_layer_series {
            Some(series) => self.due(series),
            None => true,
        };
        if layer_due {
            port.link.link_layer = None;
            if let Some(text) = self.text(&mut port.link_layer, stale) {
                let path = &port.link_layer.path;
                match parse_link_layer(&text) {
                    LinkLayer::Other(s) => {
                        self.problem(SysfsError::Malformed {
                            path: path.clone(),
                            value: text,
                            expected: "InfiniBand or Ethernet",
                        });
                        if !s.is_empty() {
                            port.link.link_layer = Some(LinkLayer::Other(s));
                        }
                    }
                    known => {
                        self.ok(path);
                        port.link.link_layer = Some(known);
                    }
                }
            } else {
                failed = true;
            }
            if let Some(l) = &port.link.link_layer {
                let current = port
                    .link_layer_series
                    .as_ref()
                    .is_some_and(|t| t.series.labels.get("link_layer") == Some(l.as_str()));
                if !current {
                    let series = Series {
                        name: format!("{PREFIX}port_link_layer_info").into(),
                        labels: Labels::new([
                            ("device", port.link.device.as_str()),
                            ("port", port.link.port.to_string().as_str()),
                            ("link_layer", l.as_str()),
                        ]),
                        kind: Kind::Gauge,
                    };
                    port.link_layer_series = Some(Tracked::new(series));
                }
                if let Some(tracked) = &mut port.link_layer_series {
                    self.emit(tracked, Value::U64(1));
                }
            }
        }
        if counting {
            for counter in &mut port.counters {
                failed |= self.counter(counter, stale);
            }
        }
        failed
    }

    /// Reads one counter file when its series is due. Returns whether the read failed.
    fn counter(&mut self, counter: &mut CounterFile, stale: &mut bool) -> bool {
        if !self.due(&mut counter.tracked) {
            return false;
        }
        let parsed = match counter.file.read(self.buf) {
            Ok(bytes) => {
                let text = String::from_utf8_lossy(bytes);
                text.trim()
                    .parse::<u64>()
                    .map_err(|_| text.trim_end_matches('\n').to_string())
            }
            Err(source) => {
                *stale |= source.kind() == io::ErrorKind::NotFound;
                self.problem(SysfsError::Read {
                    path: counter.file.path.clone(),
                    source,
                });
                return true;
            }
        };
        let raw = match parsed {
            Ok(raw) => raw,
            Err(value) => {
                self.problem(SysfsError::Malformed {
                    path: counter.file.path.clone(),
                    value,
                    expected: match counter.convert {
                        Convert::LifespanMs => "milliseconds",
                        _ => "an unsigned integer",
                    },
                });
                return false;
            }
        };
        self.ok(&counter.file.path);
        let value = match counter.convert {
            Convert::Count => Value::U64(raw),
            Convert::Words => Value::U64(raw.saturating_mul(4)),
            Convert::LifespanMs => Value::F64(raw as f64 / 1000.0),
        };
        self.emit(&mut counter.tracked, value);
        false
    }

    /// Hands a value read to the sink (nowhere when only the link facts are read).
    fn emit(&mut self, tracked: &mut Tracked, value: Value) {
        if let Some(sink) = self.sink.as_mut() {
            sink.reading(&tracked.series, &mut tracked.slot, value);
        }
    }

    fn coded(
        &mut self,
        file: &mut OpenFile,
        names: &[&str],
        stale: &mut bool,
    ) -> Option<CodedState> {
        let text = self.text(file, stale)?;
        let path = &file.path;
        let Some(state) = parse_coded(&text) else {
            self.problem(SysfsError::Malformed {
                path: path.clone(),
                value: text,
                expected: "\"<code>: <name>\"",
            });
            return None;
        };
        let known = usize::try_from(state.code)
            .ok()
            .and_then(|i| names.get(i))
            .is_some_and(|n| !n.is_empty() && n.eq_ignore_ascii_case(&state.name));
        if known {
            self.ok(path);
        } else {
            self.problem(SysfsError::UnknownName {
                path: path.clone(),
                code: state.code,
                name: state.name.clone(),
            });
        }
        Some(state)
    }

    /// The contents of one small file as text, or `None` with the problem recorded.
    fn text(&mut self, file: &mut OpenFile, stale: &mut bool) -> Option<String> {
        match file.read(self.buf) {
            Ok(bytes) => match std::str::from_utf8(bytes) {
                Ok(s) => Some(s.trim_end_matches('\n').to_string()),
                Err(_) => {
                    self.problem(SysfsError::NotUtf8 {
                        path: file.path.clone(),
                    });
                    None
                }
            },
            Err(source) => {
                *stale |= source.kind() == io::ErrorKind::NotFound;
                self.problem(SysfsError::Read {
                    path: file.path.clone(),
                    source,
                });
                None
            }
        }
    }

    fn problem(&mut self, p: SysfsError) {
        self.problems.insert(p.path().to_path_buf(), p);
    }

    /// `path` read normally: it is no longer a problem.
    fn ok(&mut self, path: &Path) {
        if !self.problems.is_empty() {
            self.problems.remove(path);
        }
    }
}

/// `state` names by code (`ib_port_state`); index 0 unused.
const STATE_NAMES: [&str; 6] = ["", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"];
/// `phys_state` names by code; index 0 is what the kernel prints for "no state change".
const PHYS_STATE_NAMES: [&str; 8] = [
    "",
    "Sleep",
    "Polling",
    "Disabled",
    "PortConfigurationTraining",
    "LinkUp",
    "LinkErrorRecovery",
    "PhyTest",
];

/// Parses "4: ACTIVE". `None` unless the text starts with a number followed by a colon.
pub fn parse_coded(text: &str) -> Option<CodedState> {
    let (code, name) = text.split_once(':')?;
    Some(CodedState {
        code: code.trim().parse().ok()?,
        name: name.trim().to_string(),
    })
}

/// Parses "400 Gb/sec (4X NDR)", "2.5 Gb/sec (1X SDR)" or "10 Gb/sec (4X)". On error, returns
/// what could be used anyway (the rate alone when the width is missing or garbled).
pub fn parse_rate(text: &str) -> Result<LinkRate, Option<LinkRate>> {
    let text = text.trim();
    let (number, rest) = text.split_once("Gb/sec").ok_or(None)?;
    let gbps: f64 = number.trim().parse().map_err(|_| None)?;
    if !gbps.is_finite() || gbps < 0.0 {
        return Err(None);
    }
    let partial = LinkRate {
        gbps,
        width_lanes: None,
        speed: None,
    };
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'));
    let Some(inner) = inner else {
        return Err(Some(partial));
    };
    let mut words = inner.split_whitespace();
    let width = words
        .next()
        .and_then(|w| w.strip_suffix('X').or_else(|| w.strip_suffix('x')))
        .and_then(|w| w.parse::<u32>().ok())
        .filter(|&w| w > 0);
    let Some(width) = width else {
        return Err(Some(partial));
    };
    let speed = words.next().map(str::to_string);
    if words.next().is_some() {
        return Err(Some(partial));
    }
    Ok(LinkRate {
        width_lanes: Some(width),
        speed,
        ..partial
    })
}

/// Parses `link_layer`; anything but the kernel's three words is `Other`.
pub fn parse_link_layer(text: &str) -> LinkLayer {
    match text.trim() {
        "InfiniBand" => LinkLayer::InfiniBand,
        "Ethernet" => LinkLayer::Ethernet,
        "Unknown" => LinkLayer::Unknown,
        other => LinkLayer::Other(other.to_string()),
    }
}

/// A counter file name as a metric name part: lowercase, `[a-z0-9_]` only, no `_total` suffix
/// (it is added back once).
fn metric_stem(file: &str) -> String {
    let mut s: String = file
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '_') => c,
            _ => '_',
        })
        .collect();
    if let Some(stripped) = s.strip_suffix("_total") {
        s.truncate(stripped.len());
    }
    s
}

/// Entry names of a directory, sorted. Names that are not UTF-8 are reported and skipped.
fn list_dir(dir: &Path) -> Result<Vec<String>, SysfsError> {
    list(dir, false)
}

/// Like [`list_dir`], without subdirectories.
fn list_files(dir: &Path) -> Result<Vec<String>, SysfsError> {
    list(dir, true)
}

fn list(dir: &Path, files_only: bool) -> Result<Vec<String>, SysfsError> {
    let err = |source| SysfsError::List {
        path: dir.to_path_buf(),
        source,
    };
    let mut names = BTreeMap::new();
    for entry in fs::read_dir(dir).map_err(err)? {
        let entry = entry.map_err(err)?;
        if files_only && entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        match entry.file_name().into_string() {
            Ok(name) => {
                names.insert(name, ());
            }
            Err(raw) => tracing::debug!("skipping {raw:?} in {}: not UTF-8", dir.display()),
        }
    }
    Ok(names.into_keys().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{
        collections::HashMap,
        sync::{Arc, Mutex},
    };

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/sysfs")
            .join(name)
    }

    /// A copy of a fixture tree that a test may change; removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn of(name: &str, test: &str) -> Self {
            let dir = std::env::temp_dir()
                .join(format!("railscope-ib-sysfs-{}-{test}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            copy_tree(&fixture(name), &dir);
            Self(dir)
        }

        fn path(&self, rel: &str) -> PathBuf {
            self.0.join(rel)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn copy_tree(from: &Path, to: &Path) {
        fs::create_dir_all(to).unwrap();
        for entry in fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy_tree(&entry.path(), &target);
            } else {
                fs::copy(entry.path(), &target).unwrap();
            }
        }
    }

    /// Series name and labels to value, for lookups.
    fn by_series(readings: &[Reading]) -> HashMap<(String, String), Reading> {
        readings
            .iter()
            .map(|r| {
                (
                    (r.series.name.to_string(), r.series.labels.to_string()),
                    r.clone(),
                )
            })
            .collect()
    }

    fn port_labels(device: &str, port: &str) -> String {
        Labels::new([("device", device), ("port", port)]).to_string()
    }

    fn value(
        map: &HashMap<(String, String), Reading>,
        name: &str,
        labels: &str,
    ) -> Option<(Value, Kind)> {
        map.get(&(name.to_string(), labels.to_string()))
            .map(|r| (r.value, r.series.kind))
    }

    /// Captures what `tracing` prints while `f` runs.
    fn logs_of<T>(f: impl FnOnce() -> T) -> (T, String) {
        #[derive(Clone, Default)]
        struct Sink(Arc<Mutex<Vec<u8>>>);
        impl io::Write for Sink {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let sink = Sink::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let out = tracing::subscriber::with_default(subscriber, f);
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        (out, text)
    }

    #[test]
    fn mlx5_ib_port_counters_and_link() {
        let mut src = IbSysfs::new(fixture("mlx5"));
        let readings = src.read(1_700_000_000_000_000_000);
        assert!(src.problems().is_empty(), "{:?}", src.problems());
        assert!(
            readings
                .iter()
                .all(|r| r.unix_ns == 1_700_000_000_000_000_000)
        );
        let map = by_series(&readings);
        let p = port_labels("mlx5_0", "1");

        // The data counters count 4-byte words; the series are bytes.
        assert_eq!(
            value(&map, "railscope_ib_port_xmit_bytes_total", &p),
            Some((Value::U64(4 * 912_345_678_901), Kind::Counter))
        );
        assert_eq!(
            value(&map, "railscope_ib_port_rcv_bytes_total", &p),
            Some((Value::U64(4 * 887_654_321_098), Kind::Counter))
        );
        assert!(value(&map, "railscope_ib_port_xmit_data_total", &p).is_none());
        assert_eq!(
            value(&map, "railscope_ib_symbol_error_total", &p),
            Some((Value::U64(3), Kind::Counter))
        );
        assert_eq!(
            value(&map, "railscope_ib_vl15_dropped_total", &p),
            Some((Value::U64(0), Kind::Counter))
        );
        assert_eq!(
            value(&map, "railscope_ib_link_downed_total", &p),
            Some((Value::U64(1), Kind::Counter))
        );
        // Every PMA counter file of the port is a series.
        let pma = fs::read_dir(fixture("mlx5").join("class/infiniband/mlx5_0/ports/1/counters"))
            .unwrap()
            .count();
        let port_counters = readings
            .iter()
            .filter(|r| r.series.labels.to_string() == p && r.series.kind == Kind::Counter)
            .count();
        let hw = fs::read_dir(fixture("mlx5").join("class/infiniband/mlx5_0/ports/1/hw_counters"))
            .unwrap()
            .count();
        // lifespan is a gauge, not a counter.
        assert_eq!(port_counters, pma + hw - 1);

        assert_eq!(
            value(&map, "railscope_ib_port_state", &p),
            Some((Value::U64(4), Kind::Gauge))
        );
        assert_eq!(
            value(&map, "railscope_ib_port_phys_state", &p),
            Some((Value::U64(5), Kind::Gauge))
        );
        assert_eq!(
            value(&map, "railscope_ib_port_rate_gbps", &p),
            Some((Value::F64(400.0), Kind::Gauge))
        );
        assert_eq!(
            value(&map, "railscope_ib_port_width_lanes", &p),
            Some((Value::U64(4), Kind::Gauge))
        );
        let info = Labels::new([
            ("device", "mlx5_0"),
            ("port", "1"),
            ("link_layer", "InfiniBand"),
        ])
        .to_string();
        assert_eq!(
            value(&map, "railscope_ib_port_link_layer_info", &info),
            Some((Value::U64(1), Kind::Gauge))
        );
        assert_eq!(
            value(&map, "railscope_ib_hw_counters_lifespan_seconds", &p),
            Some((Value::F64(0.01), Kind::Gauge))
        );

        let link = src.links().iter().find(|l| l.device == "mlx5_0").unwrap();
        assert_eq!(
            link,
            &PortLink {
                device: "mlx5_0".into(),
                port: 1,
                state: Some(CodedState {
                    code: 4,
                    name: "ACTIVE".into()
                }),
                phys_state: Some(CodedState {
                    code: 5,
                    name: "LinkUp".into()
                }),
                rate: Some(LinkRate {
                    gbps: 400.0,
                    width_lanes: Some(4),
                    speed: Some("NDR".into())
                }),
                link_layer: Some(LinkLayer::InfiniBand),
            }
        );
    }

    #[test]
    fn mlx5_roce_port_congestion_and_unknown_counters() {
        let mut src = IbSysfs::new(fixture("mlx5"));
        let map = by_series(&src.read(1));
        let p = port_labels("mlx5_1", "1");
        for (name, v) in [
            ("railscope_ib_np_cnp_sent_total", 48_213),
            ("railscope_ib_rp_cnp_handled_total", 47_990),
            ("railscope_ib_np_ecn_marked_roce_packets_total", 51_877),
            ("railscope_ib_rp_cnp_ignored_total", 0),
            // A name this code has never heard of is passed through.
            ("railscope_ib_roce_cc_future_event_total", 17),
        ] {
            assert_eq!(
                value(&map, name, &p),
                Some((Value::U64(v), Kind::Counter)),
                "{name}"
            );
        }
        let info = Labels::new([
            ("device", "mlx5_1"),
            ("port", "1"),
            ("link_layer", "Ethernet"),
        ])
        .to_string();
        assert!(value(&map, "railscope_ib_port_link_layer_info", &info).is_some());
        assert_eq!(
            value(&map, "railscope_ib_port_rate_gbps", &p),
            Some((Value::F64(200.0), Kind::Gauge))
        );
        let link = src.links().iter().find(|l| l.device == "mlx5_1").unwrap();
        assert_eq!(link.link_layer, Some(LinkLayer::Ethernet));
        assert_eq!(link.rate.as_ref().unwrap().speed.as_deref(), Some("HDR"));
    }

    #[test]
    fn device_level_hw_counters_carry_only_the_device_label() {
        let mut src = IbSysfs::new(fixture("mlx5"));
        let map = by_series(&src.read(1));
        let d = Labels::new([("device", "mlx5_0")]).to_string();
        assert_eq!(
            value(&map, "railscope_ib_rx_write_requests_total", &d),
            Some((Value::U64(1_203_334), Kind::Counter))
        );
        assert_eq!(
            value(&map, "railscope_ib_hw_counters_lifespan_seconds", &d),
            Some((Value::F64(0.01), Kind::Gauge))
        );
    }

    #[test]
    fn every_series_is_unique_and_well_named() {
        let mut src = IbSysfs::new(fixture("mlx5"));
        let readings = src.read(1);
        let mut seen = BTreeSet::new();
        for r in &readings {
            assert!(
                seen.insert((r.series.name.clone(), r.series.labels.clone())),
                "duplicate {} {}",
                r.series.name,
                r.series.labels
            );
            let name = &r.series.name;
            assert!(name.starts_with("railscope_ib_"), "{name}");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{name}"
            );
            assert_eq!(
                r.series.kind == Kind::Counter,
                name.ends_with("_total"),
                "{name}"
            );
        }
    }

    #[test]
    fn rxe_layout_without_pma_counters() {
        let mut src = IbSysfs::new(fixture("rxe"));
        let map = by_series(&src.read(5));
        assert!(src.problems().is_empty(), "{:?}", src.problems());
        for dev in ["rxe0", "rxe1"] {
            let p = port_labels(dev, "1");
            for file in [
                "ack_deferred",
                "completer_retry_err",
                "duplicate_request",
                "link_downed",
                "out_of_seq_request",
                "rcvd_pkts",
                "rcvd_rnr_err",
                "rcvd_seq_err",
                "rdma_recvs",
                "rdma_sends",
                "retry_exceeded_err",
                "retry_rnr_exceeded_err",
                "send_err",
                "send_rnr_err",
                "sent_pkts",
            ] {
                let name = format!("railscope_ib_{file}_total");
                assert!(
                    matches!(value(&map, &name, &p), Some((_, Kind::Counter))),
                    "{dev} {name}"
                );
            }
            assert!(value(&map, "railscope_ib_hw_counters_lifespan_seconds", &p).is_some());
        }
        // What the test bed saw after ib_write_bw: rxe0 sent what rxe1 received.
        assert_eq!(
            value(
                &map,
                "railscope_ib_sent_pkts_total",
                &port_labels("rxe0", "1")
            ),
            value(
                &map,
                "railscope_ib_rcvd_pkts_total",
                &port_labels("rxe1", "1")
            )
        );
        let rxe0 = src.links().iter().find(|l| l.device == "rxe0").unwrap();
        assert_eq!(rxe0.link_layer, Some(LinkLayer::Ethernet));
        assert!(rxe0.state.as_ref().unwrap().is_active());
    }

    #[test]
    fn degraded_width_is_visible() {
        let tree = Scratch::of("mlx5", "degraded");
        let rate = tree.path("class/infiniband/mlx5_0/ports/1/rate");
        let mut src = IbSysfs::new(tree.0.clone());
        let p = port_labels("mlx5_0", "1");
        let before = by_series(&src.read(1));
        assert_eq!(
            value(&before, "railscope_ib_port_width_lanes", &p).map(|v| v.0),
            Some(Value::U64(4))
        );

        fs::write(&rate, "100 Gb/sec (1X NDR)\n").unwrap();
        let after = by_series(&src.read(2));
        assert!(src.problems().is_empty(), "{:?}", src.problems());
        assert_eq!(
            value(&after, "railscope_ib_port_width_lanes", &p).map(|v| v.0),
            Some(Value::U64(1))
        );
        assert_eq!(
            value(&after, "railscope_ib_port_rate_gbps", &p).map(|v| v.0),
            Some(Value::F64(100.0))
        );
        let link = src.links().iter().find(|l| l.device == "mlx5_0").unwrap();
        assert_eq!(
            link.rate,
            Some(LinkRate {
                gbps: 100.0,
                width_lanes: Some(1),
                speed: Some("NDR".into())
            })
        );
    }

    #[test]
    fn broken_values_cost_only_their_own_series() {
        let mut src = IbSysfs::new(fixture("broken"));
        let map = by_series(&src.read(1));
        let p = port_labels("mlx5_0", "1");

        let mut bad: Vec<String> = src
            .problems()
            .iter()
            .map(|e| {
                e.path()
                    .strip_prefix(fixture("broken").join("class/infiniband/mlx5_0"))
                    .unwrap()
                    .display()
                    .to_string()
            })
            .collect();
        bad.sort();
        assert_eq!(
            bad,
            [
                "hw_counters/out_of_buffer",
                "ports/1/counters/port_rcv_errors",
                "ports/1/counters/port_xmit_discards",
                "ports/1/counters/symbol_error",
                "ports/1/hw_counters/rx_icrc_encapsulated",
                "ports/1/link_layer",
                "ports/1/phys_state",
                "ports/1/rate",
                "ports/1/state",
            ]
        );
        // Unknown state name: the code is still sent, and the problem says which file.
        assert_eq!(
            value(&map, "railscope_ib_port_state", &p).map(|v| v.0),
            Some(Value::U64(4))
        );
        let problems = src.problems();
        let state = problems
            .iter()
            .find(|e| e.path().ends_with("ports/1/state"))
            .unwrap();
        assert!(
            matches!(state, SysfsError::UnknownName { code: 4, name, .. } if name == "WHATEVER")
        );
        // Garbage phys_state gives no series; garbage counters neither.
        assert!(value(&map, "railscope_ib_port_phys_state", &p).is_none());
        assert!(value(&map, "railscope_ib_symbol_error_total", &p).is_none());
        assert!(value(&map, "railscope_ib_port_rcv_errors_total", &p).is_none());
        // A rate without its width still gives the rate.
        assert_eq!(
            value(&map, "railscope_ib_port_rate_gbps", &p).map(|v| v.0),
            Some(Value::F64(200.0))
        );
        assert!(value(&map, "railscope_ib_port_width_lanes", &p).is_none());
        // Everything else is still read.
        assert_eq!(
            value(&map, "railscope_ib_port_xmit_bytes_total", &p).map(|v| v.0),
            Some(Value::U64(4 * 1000))
        );
        assert_eq!(
            value(&map, "railscope_ib_link_downed_total", &p).map(|v| v.0),
            Some(Value::U64(2))
        );
        assert!(value(&map, "railscope_ib_out_of_sequence_total", &p).is_some());
        // The healthy device next to it is untouched.
        let healthy = port_labels("mlx5_1", "1");
        assert_eq!(
            value(&map, "railscope_ib_port_state", &healthy).map(|v| v.0),
            Some(Value::U64(4))
        );
        assert_eq!(
            value(&map, "railscope_ib_port_width_lanes", &healthy).map(|v| v.0),
            Some(Value::U64(4))
        );
    }

    #[test]
    fn each_broken_file_is_warned_about_once() {
        let mut src = IbSysfs::new(fixture("broken"));
        let (_, first) = logs_of(|| src.read(1));
        let (_, second) = logs_of(|| src.read(2));
        let warnings: Vec<&str> = first.lines().filter(|l| l.contains("WARN")).collect();
        assert_eq!(warnings.len(), src.problems().len(), "{first}");
        for p in src.problems() {
            let path = p.path().display().to_string();
            assert_eq!(
                warnings.iter().filter(|w| w.contains(&path)).count(),
                1,
                "{path} in {first}"
            );
        }
        assert!(!second.contains("WARN"), "warned again: {second}");
        // The problems are still listed on the second scan.
        assert_eq!(src.problems().len(), warnings.len());
    }

    #[test]
    fn unreadable_files_are_reported_and_recover() {
        let tree = Scratch::of("mlx5", "unreadable");
        // A counter listed but gone when opened, and an attribute whose read fails (a
        // directory gives EISDIR, as some mlx5 counters give EINVAL).
        let counter = tree.path("class/infiniband/mlx5_0/ports/1/counters/symbol_error");
        fs::remove_file(&counter).unwrap();
        std::os::unix::fs::symlink(tree.path("nowhere"), &counter).unwrap();
        let rate = tree.path("class/infiniband/mlx5_0/ports/1/rate");
        fs::remove_file(&rate).unwrap();
        fs::create_dir(&rate).unwrap();

        let mut src = IbSysfs::new(tree.0.clone());
        let (readings, logs) = logs_of(|| src.read(1));
        let map = by_series(&readings);
        let p = port_labels("mlx5_0", "1");
        let mut bad: Vec<&Path> = src.problems().iter().map(|p| p.path()).collect();
        bad.sort();
        assert_eq!(bad, [counter.as_path(), rate.as_path()]);
        assert!(
            src.problems()
                .iter()
                .all(|p| matches!(p, SysfsError::Read { .. }))
        );
        for path in [&counter, &rate] {
            assert!(logs.contains(&path.display().to_string()), "{logs}");
        }
        assert!(value(&map, "railscope_ib_symbol_error_total", &p).is_none());
        assert!(value(&map, "railscope_ib_port_rate_gbps", &p).is_none());
        assert!(value(&map, "railscope_ib_port_state", &p).is_some());
        assert!(value(&map, "railscope_ib_link_downed_total", &p).is_some());

        fs::remove_file(&counter).unwrap();
        fs::write(&counter, "5\n").unwrap();
        fs::remove_dir(&rate).unwrap();
        fs::write(&rate, "400 Gb/sec (4X NDR)\n").unwrap();
        let map = by_series(&src.read(2));
        assert!(src.problems().is_empty(), "{:?}", src.problems());
        assert!(value(&map, "railscope_ib_port_rate_gbps", &p).is_some());
        assert_eq!(
            value(&map, "railscope_ib_symbol_error_total", &p).map(|v| v.0),
            Some(Value::U64(5))
        );
    }

    #[test]
    fn a_hw_counter_named_like_a_pma_counter_is_kept_apart() {
        let tree = Scratch::of("mlx5", "collision");
        fs::write(
            tree.path("class/infiniband/mlx5_0/ports/1/hw_counters/link_downed"),
            "9\n",
        )
        .unwrap();
        let mut src = IbSysfs::new(tree.0.clone());
        let map = by_series(&src.read(1));
        let p = port_labels("mlx5_0", "1");
        assert_eq!(
            value(&map, "railscope_ib_link_downed_total", &p).map(|v| v.0),
            Some(Value::U64(1))
        );
        assert_eq!(
            value(&map, "railscope_ib_hw_link_downed_total", &p).map(|v| v.0),
            Some(Value::U64(9))
        );
    }

    #[test]
    fn devices_that_come_and_go() {
        let tree = Scratch::of("mlx5", "hotplug");
        let class = tree.path("class/infiniband");
        let mut src = IbSysfs::new(tree.0.clone());
        src.read(1);
        assert_eq!(src.devices().collect::<Vec<_>>(), ["mlx5_0", "mlx5_1"]);

        let (readings, logs) = logs_of(|| {
            fs::remove_dir_all(class.join("mlx5_1")).unwrap();
            src.read(2)
        });
        assert!(src.problems().is_empty(), "{:?}", src.problems());
        assert_eq!(src.devices().collect::<Vec<_>>(), ["mlx5_0"]);
        assert!(
            readings
                .iter()
                .all(|r| r.series.labels.get("device") == Some("mlx5_0"))
        );
        assert!(!readings.is_empty());
        assert!(
            logs.contains("disappeared") && logs.contains("mlx5_1"),
            "{logs}"
        );

        let (readings, logs) = logs_of(|| {
            copy_tree(
                &fixture("rxe").join("class/infiniband/rxe0"),
                &class.join("rxe0"),
            );
            src.read(3)
        });
        assert_eq!(src.devices().collect::<Vec<_>>(), ["mlx5_0", "rxe0"]);
        assert!(
            readings
                .iter()
                .any(|r| r.series.labels.get("device") == Some("rxe0"))
        );
        assert!(logs.contains("appeared") && logs.contains("rxe0"), "{logs}");

        // No class directory at all: a node without RDMA.
        fs::remove_dir_all(&class).unwrap();
        assert!(src.read(4).is_empty());
        assert!(src.problems().is_empty());
        assert_eq!(src.devices().count(), 0);
    }

    #[test]
    fn device_vanishing_mid_scan_is_not_a_broken_file() {
        // Listed, then gone when its files are read: what a device unregistered during a scan
        // looks like (sysfs entries are symlinks to the device's directory).
        let tree = Scratch::of("mlx5", "vanish");
        std::os::unix::fs::symlink(
            tree.path("devices/gone"),
            tree.path("class/infiniband/mlx5_2"),
        )
        .unwrap();
        let mut src = IbSysfs::new(tree.0.clone());
        let (readings, logs) = logs_of(|| src.read(1));
        assert!(src.problems().is_empty(), "{:?}", src.problems());
        assert!(!logs.contains("WARN"), "{logs}");
        assert_eq!(src.devices().collect::<Vec<_>>(), ["mlx5_0", "mlx5_1"]);
        assert!(
            readings
                .iter()
                .any(|r| r.series.labels.get("device") == Some("mlx5_1"))
        );
    }

    #[test]
    fn files_kept_open_show_values_written_in_place() {
        // sysfs files change contents, never identity: the source keeps them open and reads
        // each again from offset 0.
        let tree = Scratch::of("mlx5", "in-place");
        let data = tree.path("class/infiniband/mlx5_0/ports/1/counters/port_xmit_data");
        let state = tree.path("class/infiniband/mlx5_0/ports/1/state");
        let mut src = IbSysfs::new(tree.0.clone());
        let p = port_labels("mlx5_0", "1");
        let before = by_series(&src.read(1));
        let Some((Value::U64(bytes), _)) = value(&before, "railscope_ib_port_xmit_bytes_total", &p)
        else {
            panic!("no xmit bytes");
        };
        fs::write(&data, format!("{}\n", bytes / 4 + 1000)).unwrap();
        fs::write(&state, "1: DOWN\n").unwrap();
        let after = by_series(&src.read(2));
        assert_eq!(
            value(&after, "railscope_ib_port_xmit_bytes_total", &p).map(|v| v.0),
            Some(Value::U64(bytes + 4000))
        );
        assert_eq!(
            value(&after, "railscope_ib_port_state", &p).map(|v| v.0),
            Some(Value::U64(1))
        );
        assert!(!src.links()[0].state.as_ref().unwrap().is_active());
    }

    #[test]
    fn only_due_series_are_read() {
        let tree = Scratch::of("broken", "due");
        let mut src = IbSysfs::new(tree.0.clone());
        let all = src.read(1);
        let broken = src.problems().len();
        assert!(broken > 0);
        let wanted = |s: &Series| {
            &*s.name == "railscope_ib_port_xmit_bytes_total"
                || &*s.name == "railscope_ib_port_state"
        };
        let some = src.read_due(2, wanted);
        assert_eq!(
            some.len(),
            all.iter().filter(|r| wanted(&r.series)).count(),
            "{some:?}"
        );
        assert!(some.iter().all(|r| wanted(&r.series)));
        assert!(
            some.iter()
                .any(|r| &*r.series.name == "railscope_ib_port_state")
        );
        // Broken files that were not read stay reported: not read is not fixed.
        assert_eq!(src.problems().len(), broken);
        // Links keep what was read before for attributes not read now.
        assert!(
            src.links()
                .iter()
                .all(|l| l.link_layer.is_some() || l.device == "mlx5_0")
        );
    }

    #[test]
    fn counter_files_that_appear_are_found_at_the_next_listing() {
        let tree = Scratch::of("mlx5", "new-file");
        let mut src = IbSysfs::new(tree.0.clone()).with_replan_every(Duration::ZERO);
        let p = port_labels("mlx5_0", "1");
        assert!(
            value(
                &by_series(&src.read(1)),
                "railscope_ib_new_firmware_counter_total",
                &p
            )
            .is_none()
        );
        fs::write(
            tree.path("class/infiniband/mlx5_0/ports/1/hw_counters/new_firmware_counter"),
            "7\n",
        )
        .unwrap();
        assert_eq!(
            value(
                &by_series(&src.read(2)),
                "railscope_ib_new_firmware_counter_total",
                &p
            )
            .map(|v| v.0),
            Some(Value::U64(7))
        );
    }

    #[test]
    fn with_a_relist_interval_devices_that_go_are_dropped_at_once() {
        let tree = Scratch::of("mlx5", "relist");
        let class = tree.path("class/infiniband");
        let mut src = IbSysfs::new(tree.0.clone()).with_relist_every(Duration::from_secs(3600));
        src.read(1);
        fs::remove_dir_all(class.join("mlx5_1")).unwrap();
        let readings = src.read(2);
        assert_eq!(src.devices().collect::<Vec<_>>(), ["mlx5_0"]);
        assert!(src.problems().is_empty(), "{:?}", src.problems());
        assert!(
            readings
                .iter()
                .all(|r| r.series.labels.get("device") == Some("mlx5_0"))
        );
        // A device that appears waits for the next listing (here: the one the vanished
        // device asked for).
        copy_tree(
            &fixture("rxe").join("class/infiniband/rxe0"),
            &class.join("rxe0"),
        );
        src.read(3);
        assert_eq!(src.devices().collect::<Vec<_>>(), ["mlx5_0", "rxe0"]);
        copy_tree(
            &fixture("rxe").join("class/infiniband/rxe0"),
            &class.join("rxe1"),
        );
        src.read(4);
        assert_eq!(src.devices().collect::<Vec<_>>(), ["mlx5_0", "rxe0"]);
    }

    #[test]
    fn read_links_reads_only_the_port_attributes() {
        let mut src = IbSysfs::new(fixture("mlx5"));
        let links = src.read_links().to_vec();
        assert_eq!(links.len(), 2);
        assert!(
            links
                .iter()
                .all(|l| l.state.as_ref().is_some_and(CodedState::is_active))
        );
        assert_eq!(links[1].rate.as_ref().unwrap().gbps, 200.0);
    }

    /// Against this machine's `/sys`: meant for the soft-RoCE test bed guest (run with
    /// `--exact sources::ib_sysfs::tests::real_rxe_devices`); on a machine without rxe
    /// devices it has nothing to check and says so.
    #[test]
    #[ignore = "needs rxe devices: runs inside the soft-RoCE test bed"]
    fn ib_core_real_rxe_devices() {
        let mut src = IbSysfs::default();
        let readings = src.read(1);
        let rxe: Vec<String> = src
            .devices()
            .filter(|d| d.starts_with("rxe"))
            .map(str::to_string)
            .collect();
        assert!(!rxe.is_empty(), "no rxe device under /sys/class/infiniband");
        assert!(src.problems().is_empty(), "{:?}", src.problems());
        let map = by_series(&readings);
        for dev in &rxe {
            let p = port_labels(dev, "1");
            for name in ["sent_pkts", "rcvd_pkts", "rdma_sends", "link_downed"] {
                let name = format!("railscope_ib_{name}_total");
                assert!(value(&map, &name, &p).is_some(), "{dev}: no {name}");
            }
            let link = src.links().iter().find(|l| &l.device == dev).unwrap();
            assert_eq!(link.link_layer, Some(LinkLayer::Ethernet), "{link:?}");
            assert!(
                link.state.is_some() && link.phys_state.is_some(),
                "{link:?}"
            );
            assert!(
                link.rate.as_ref().is_some_and(|r| r.width_lanes.is_some()),
                "{link:?}"
            );
        }
    }

    #[test]
    fn rate_strings() {
        let ok = |s: &str| parse_rate(s).unwrap();
        assert_eq!(
            ok("2.5 Gb/sec (1X SDR)"),
            LinkRate {
                gbps: 2.5,
                width_lanes: Some(1),
                speed: Some("SDR".into())
            }
        );
        assert_eq!(ok("56 Gb/sec (4X FDR)").width_lanes, Some(4));
        assert_eq!(ok("600 Gb/sec (12X HDR)").width_lanes, Some(12));
        assert_eq!(ok("10 Gb/sec (4X)").speed, None);
        assert_eq!(ok("  400 Gb/sec (4X NDR)\n").gbps, 400.0);
        assert!(matches!(parse_rate("N/A"), Err(None)));
        assert!(matches!(parse_rate(""), Err(None)));
        assert!(matches!(parse_rate("NaN Gb/sec (4X NDR)"), Err(None)));
        assert!(matches!(
            parse_rate("100 Gb/sec (weird)"),
            Err(Some(LinkRate {
                gbps: 100.0,
                width_lanes: None,
                ..
            }))
        ));
    }

    #[test]
    fn state_strings() {
        assert_eq!(
            parse_coded("5: LinkUp"),
            Some(CodedState {
                code: 5,
                name: "LinkUp".into()
            })
        );
        assert_eq!(parse_coded("1: DOWN").map(|s| s.is_active()), Some(false));
        assert_eq!(parse_coded("ACTIVE"), None);
        assert_eq!(parse_coded("x: ACTIVE"), None);
        assert_eq!(parse_coded(""), None);
    }

    #[test]
    fn metric_names_from_file_names() {
        assert_eq!(metric_stem("VL15_dropped"), "vl15_dropped");
        assert_eq!(metric_stem("rdma_tx_bytes"), "rdma_tx_bytes");
        assert_eq!(metric_stem("fw.event-count"), "fw_event_count");
        assert_eq!(metric_stem("packets_total"), "packets");
    }
}
