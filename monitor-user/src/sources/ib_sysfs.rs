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
    fs,
    io::{self, Read as _},
    path::{Path, PathBuf},
};

use crate::metrics::{Kind, Labels, Reading, Series, Value};

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

/// The IB sysfs source. Keeps only what it needs to report changes: the devices seen by the
/// last scan and the files already warned about.
#[derive(Debug)]
pub struct IbSysfs {
    root: PathBuf,
    devices: BTreeSet<String>,
    class_seen: Option<bool>,
    warned: BTreeSet<PathBuf>,
    problems: Vec<SysfsError>,
    links: Vec<PortLink>,
    buf: Vec<u8>,
}

impl Default for IbSysfs {
    fn default() -> Self {
        Self::new(PathBuf::from("/sys"))
    }
}

impl IbSysfs {
    /// `root` is the directory holding `class/infiniband`: `/sys` on a node, a fixture tree in
    /// tests.
    pub fn new(root: PathBuf) -> Self {
        Self {
            root,
            devices: BTreeSet::new(),
            class_seen: None,
            warned: BTreeSet::new(),
            problems: Vec::new(),
            links: Vec::new(),
            buf: Vec::with_capacity(64),
        }
    }

    /// Reads every counter and port attribute of every device present now, stamped `unix_ns`.
    /// Readings come sorted by device, port, then file name.
    pub fn read(&mut self, unix_ns: u64) -> Vec<Reading> {
        let mut out = Vec::new();
        self.scan(Some((&mut out, unix_ns)));
        out
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

    /// What went wrong in the last scan, one entry per file. Empty when everything was read.
    pub fn problems(&self) -> &[SysfsError] {
        &self.problems
    }

    /// The devices found by the last scan.
    pub fn devices(&self) -> impl Iterator<Item = &str> {
        self.devices.iter().map(String::as_str)
    }

    fn scan(&mut self, mut counters: Option<(&mut Vec<Reading>, u64)>) {
        let mut problems = Vec::new();
        let mut links = Vec::new();
        let mut present = BTreeSet::new();
        let class = self.root.join("class/infiniband");
        let names = match list_dir(&class) {
            Ok(names) => {
                if self.class_seen != Some(true) {
                    tracing::debug!("reading RDMA devices under {}", class.display());
                }
                self.class_seen = Some(true);
                names
            }
            Err(e) if e.not_found() => {
                if self.class_seen != Some(false) {
                    tracing::info!("no RDMA devices: {} does not exist", class.display());
                }
                self.class_seen = Some(false);
                Vec::new()
            }
            Err(e) => {
                problems.push(e);
                Vec::new()
            }
        };

        for device in names {
            let dir = class.join(&device);
            let mut scan = DeviceScan {
                device: &device,
                dir: &dir,
                buf: &mut self.buf,
                problems: Vec::new(),
                links: Vec::new(),
                readings: counters.as_mut().map(|(_, ns)| (Vec::new(), *ns)),
            };
            scan.run();
            let DeviceScan {
                problems: dev_problems,
                links: dev_links,
                readings,
                ..
            } = scan;
            // A device unregistered while it was being read leaves files that vanished; that
            // is the device going away, not a broken file.
            if !dev_problems.is_empty() && !dir.is_dir() {
                tracing::debug!(device, "vanished while being read");
                continue;
            }
            present.insert(device);
            problems.extend(dev_problems);
            links.extend(dev_links);
            if let (Some((out, _)), Some((mut readings, _))) = (counters.as_mut(), readings) {
                out.append(&mut readings);
            }
        }

        for gone in self.devices.difference(&present) {
            tracing::info!(device = %gone, "RDMA device disappeared");
        }
        for new in present.difference(&self.devices) {
            tracing::info!(device = %new, "RDMA device appeared");
        }
        self.devices = present;

        let now: BTreeSet<PathBuf> = problems.iter().map(|p| p.path().to_path_buf()).collect();
        for p in &problems {
            if !self.warned.contains(p.path()) {
                tracing::warn!("{p}; the other counters are still read");
            }
        }
        for fixed in self.warned.difference(&now) {
            tracing::info!("{} reads normally again", fixed.display());
        }
        self.warned = now;
        self.problems = problems;
        self.links = links;
    }
}

/// One device's part of a scan.
struct DeviceScan<'a> {
    device: &'a str,
    dir: &'a Path,
    buf: &'a mut Vec<u8>,
    problems: Vec<SysfsError>,
    links: Vec<PortLink>,
    /// `None` when only the link facts are read.
    readings: Option<(Vec<Reading>, u64)>,
}

impl DeviceScan<'_> {
    fn run(&mut self) {
        let ports_dir = self.dir.join("ports");
        let mut ports: Vec<(u32, String)> = Vec::new();
        match list_dir(&ports_dir) {
            Ok(names) => {
                for name in names {
                    match name.parse::<u32>() {
                        Ok(n) => ports.push((n, name)),
                        Err(_) => self.problems.push(SysfsError::Malformed {
                            path: ports_dir.join(&name),
                            value: name,
                            expected: "a port number",
                        }),
                    }
                }
            }
            Err(e) => self.problems.push(e),
        }
        ports.sort();
        for (port, name) in ports {
            self.port(port, &ports_dir.join(name));
        }
        if self.readings.is_some() {
            let labels = Labels::new([("device", self.device)]);
            self.counter_dir(&self.dir.join("hw_counters"), &labels, None);
        }
    }

    fn port(&mut self, port: u32, dir: &Path) {
        let port_label = port.to_string();
        let labels = Labels::new([("device", self.device), ("port", port_label.as_str())]);
        let mut link = PortLink {
            device: self.device.to_string(),
            port,
            state: None,
            phys_state: None,
            rate: None,
            link_layer: None,
        };

        link.state = self.coded(&dir.join("state"), &STATE_NAMES);
        link.phys_state = self.coded(&dir.join("phys_state"), &PHYS_STATE_NAMES);
        let path = dir.join("rate");
        if let Some(text) = self.text(&path) {
            match parse_rate(&text) {
                Ok(rate) => link.rate = Some(rate),
                Err(partial) => {
                    link.rate = partial;
                    self.problems.push(SysfsError::Malformed {
                        path,
                        value: text,
                        expected: "\"<rate> Gb/sec (<width>X <speed>)\"",
                    });
                }
            }
        }
        let path = dir.join("link_layer");
        if let Some(text) = self.text(&path) {
            match parse_link_layer(&text) {
                LinkLayer::Other(s) if s.is_empty() => self.problems.push(SysfsError::Malformed {
                    path,
                    value: text,
                    expected: "InfiniBand or Ethernet",
                }),
                LinkLayer::Other(s) => {
                    self.problems.push(SysfsError::Malformed {
                        path,
                        value: text,
                        expected: "InfiniBand or Ethernet",
                    });
                    link.link_layer = Some(LinkLayer::Other(s));
                }
                known => link.link_layer = Some(known),
            }
        }

        if let Some((out, ns)) = self.readings.as_mut() {
            let ns = *ns;
            let mut gauge = |name: &str, value: Value, labels: Labels| {
                out.push(Reading {
                    series: Series {
                        name: format!("{PREFIX}{name}"),
                        labels,
                        kind: Kind::Gauge,
                    },
                    value,
                    unix_ns: ns,
                });
            };
            if let Some(s) = &link.state {
                gauge("port_state", Value::U64(s.code.into()), labels.clone());
            }
            if let Some(s) = &link.phys_state {
                gauge("port_phys_state", Value::U64(s.code.into()), labels.clone());
            }
            if let Some(r) = &link.rate {
                gauge("port_rate_gbps", Value::F64(r.gbps), labels.clone());
                if let Some(w) = r.width_lanes {
                    gauge("port_width_lanes", Value::U64(w.into()), labels.clone());
                }
            }
            if let Some(l) = &link.link_layer {
                let with_layer = Labels::new([
                    ("device", self.device),
                    ("port", port_label.as_str()),
                    ("link_layer", l.as_str()),
                ]);
                gauge("port_link_layer_info", Value::U64(1), with_layer);
            }
            let taken = self.counter_dir(&dir.join("counters"), &labels, None);
            self.counter_dir(&dir.join("hw_counters"), &labels, Some(&taken));
        }
        self.links.push(link);
    }

    /// Reads every file of a counter directory into readings; an absent directory is normal
    /// (rxe has no `counters/`, IB-only drivers no `hw_counters/`). Returns the series names
    /// used, so a second directory of the same port can avoid them.
    fn counter_dir(
        &mut self,
        dir: &Path,
        labels: &Labels,
        taken: Option<&BTreeSet<String>>,
    ) -> BTreeSet<String> {
        let mut used = BTreeSet::new();
        let names = match list_files(dir) {
            Ok(names) => names,
            Err(e) if e.not_found() && self.dir.is_dir() => return used,
            Err(e) => {
                self.problems.push(e);
                return used;
            }
        };
        let mut values = Vec::with_capacity(names.len());
        for file in names {
            let path = dir.join(&file);
            let Some(text) = self.text(&path) else {
                continue;
            };
            if file == "lifespan" {
                match text.trim().parse::<u64>() {
                    Ok(ms) => values.push((
                        "hw_counters_lifespan_seconds".to_string(),
                        Kind::Gauge,
                        Value::F64(ms as f64 / 1000.0),
                    )),
                    Err(_) => self.problems.push(SysfsError::Malformed {
                        path,
                        value: text,
                        expected: "milliseconds",
                    }),
                }
                continue;
            }
            let Ok(raw) = text.trim().parse::<u64>() else {
                self.problems.push(SysfsError::Malformed {
                    path,
                    value: text,
                    expected: "an unsigned integer",
                });
                continue;
            };
            let (stem, value) = match file.as_str() {
                "port_xmit_data" => ("port_xmit_bytes".to_string(), raw.saturating_mul(4)),
                "port_rcv_data" => ("port_rcv_bytes".to_string(), raw.saturating_mul(4)),
                _ => (metric_stem(&file), raw),
            };
            let mut name = format!("{stem}_total");
            if taken.is_some_and(|t| t.contains(&name)) {
                name = format!("hw_{name}");
            }
            used.insert(name.clone());
            values.push((name, Kind::Counter, Value::U64(value)));
        }
        if let Some((out, ns)) = self.readings.as_mut() {
            out.extend(values.into_iter().map(|(name, kind, value)| Reading {
                series: Series {
                    name: format!("{PREFIX}{name}"),
                    labels: labels.clone(),
                    kind,
                },
                value,
                unix_ns: *ns,
            }));
        }
        used
    }

    fn coded(&mut self, path: &Path, names: &[&str]) -> Option<CodedState> {
        let text = self.text(path)?;
        let Some(state) = parse_coded(&text) else {
            self.problems.push(SysfsError::Malformed {
                path: path.to_path_buf(),
                value: text,
                expected: "\"<code>: <name>\"",
            });
            return None;
        };
        let known = usize::try_from(state.code)
            .ok()
            .and_then(|i| names.get(i))
            .is_some_and(|n| !n.is_empty() && n.eq_ignore_ascii_case(&state.name));
        if !known {
            self.problems.push(SysfsError::UnknownName {
                path: path.to_path_buf(),
                code: state.code,
                name: state.name.clone(),
            });
        }
        Some(state)
    }

    /// The contents of one small file as text, or `None` with the problem recorded.
    fn text(&mut self, path: &Path) -> Option<String> {
        self.buf.clear();
        let read = fs::File::open(path).and_then(|mut f| f.read_to_end(self.buf));
        if let Err(source) = read {
            self.problems.push(SysfsError::Read {
                path: path.to_path_buf(),
                source,
            });
            return None;
        }
        match std::str::from_utf8(self.buf) {
            Ok(s) => Some(s.trim_end_matches('\n').to_string()),
            Err(_) => {
                self.problems.push(SysfsError::NotUtf8 {
                    path: path.to_path_buf(),
                });
                None
            }
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
                    (r.series.name.clone(), r.series.labels.to_string()),
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
        let state = src
            .problems()
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
        let mut bad: Vec<&Path> = src.problems().iter().map(SysfsError::path).collect();
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
