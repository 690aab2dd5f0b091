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
//! | `railscope_ib_counter_saturated` | gauge, 1 or 0 | device, port, counter | a PMA counter of `counters/` found at its field's maximum (`saturation.rs`): 1 while it stays there, 0 once it is below again; sent only for counters found saturated |
//!
//! The names are `monitor_wire::names::metric`'s (`AGENT_METRICS` lists them all, with the
//! counter files known from real adapters).
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
//! - A PMA counter stuck at its maximum (4294967295 for the 32-bit ones of older HCAs; the
//!   PMA's counters stop there, they do not wrap) is warned about once, and its value is still
//!   sent: it is what the adapter says, and `railscope_ib_counter_saturated` says why its rate
//!   is zero. A `rate` of "0 GB/sec" (MLNX_OFED, a port without a link) is a rate of 0.
//! - `state` and `phys_state` are sent as their numeric codes. A name this code does not know
//!   for a code ("4: WHATEVER") is reported once, and the code is still sent.

mod counter_value;
mod devices;
mod error;
mod kept_file;
mod link;
mod listing;
mod plan;
mod saturation;
mod sweep;
#[cfg(test)]
mod tests;

use std::{
    collections::BTreeMap,
    path::PathBuf,
    time::{Duration, Instant},
};

pub use counter_value::parse_counter;
pub use error::SysfsError;
pub use link::{
    CodedState, LinkLayer, LinkRate, PortLink, parse_coded, parse_link_layer, parse_rate,
};
pub use plan::metric_stem;

use super::{Collect, ReadingSink};
use monitor_wire::{Reading, Series, names::metric};
use plan::DevicePlan;

/// The prefix of every series name of this source.
const PREFIX: &str = metric::IB_PREFIX;

/// The IB sysfs source: per device present, the files it reads, kept open; the problems of
/// the files that are failing now, and the ones already warned about.
#[derive(Debug)]
pub struct IbSysfs {
    root: PathBuf,
    devices: BTreeMap<String, DevicePlan>,
    class_seen: Option<bool>,
    /// The files warned about, each with whether it was a saturated counter.
    warned: BTreeMap<PathBuf, bool>,
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

impl IbSysfs {
    /// `root` is the directory holding `class/infiniband`: `/sys` on a node, a fixture tree in
    /// tests.
    pub fn new(root: PathBuf) -> Self {
        Self {
            root,
            devices: BTreeMap::new(),
            class_seen: None,
            warned: BTreeMap::new(),
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
}
