//! RoCE's Ethernet side: the ethtool statistics of each RoCE port's netdev, the counters
//! `ethtool -S` prints (per-priority PFC pause frames and pause durations, ECN marks,
//! `rx_discards_phy`, `rx_out_of_buffer` on mlx5), read through the kernel's ethtool ioctl
//! (`ioctl`) in the agent's network namespace.
//!
//! Each RDMA port whose link layer is Ethernet is matched to its netdev as the LLDP source
//! matches it ([`rdma_netdevs`], listed again every [`RELIST_EVERY`]). Each sweep asks the
//! netdev how many statistics it has (`ETHTOOL_GSSET_INFO`, one small ioctl), reads their
//! names (`ETHTOOL_GSTRINGS`) only when that count or the netdev (its ifindex) changed, and
//! reads the values (`ETHTOOL_GSTATS`, all of them in one ioctl) when at least one of its
//! series is due in the agent's sampler: they are sampled as the IB counters are.
//!
//! Each statistic is sent as `railscope_ethtool_<stat>_total{device, port, netdev}`, a
//! counter, every name passed through ([`stat_names`] says how names are made and why the
//! per-queue statistics of a netdev with many queues are left out). ethtool does not say
//! which statistics are counts: the few that are not (veth's `peer_ifindex`) are sent as
//! counters all the same, as read.
//!
//! A netdev that cannot be read (gone, renamed, a driver without statistics answering
//! EOPNOTSUPP) is warned about once, naming it, and costs only its own series; it is tried
//! again at each sweep, and its recovery logged.

mod ioctl;
pub mod stat_names;

use std::{
    collections::BTreeMap,
    ffi::CString,
    path::PathBuf,
    time::{Duration, Instant},
};

use monitor_wire::{Kind, Labels, Reading, Series, Value};

use super::{
    Collect, ReadingSink,
    lldp::{PortNetdev, rdma_netdevs},
};
use ioctl::{EthtoolSocket, Request};
use monitor_sampler::Slot;

/// How often the RDMA ports and their netdevs are listed again.
pub const RELIST_EVERY: Duration = Duration::from_secs(5);

/// Why a netdev's statistics could not be read: one line naming it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ethtool statistics of {netdev} (the netdev of {device}/{port}): {what}")]
pub struct EthtoolError {
    pub netdev: String,
    pub device: String,
    pub port: u32,
    pub what: String,
}

/// A statistic sent: its index in the netdev's set, its series and the sampler's slot.
#[derive(Debug)]
struct Stat {
    index: usize,
    series: Series,
    slot: Slot,
}

/// The statistics of one netdev as last named: which netdev (its ifindex) and how many.
#[derive(Debug)]
struct StatSet {
    ifindex: u32,
    count: u32,
    stats: Vec<Stat>,
}

#[derive(Debug)]
struct PortStats {
    port: PortNetdev,
    set: Option<StatSet>,
}

/// The ethtool source; see the module's documentation.
#[derive(Debug)]
pub struct EthtoolStats {
    sysfs_root: PathBuf,
    socket: Option<EthtoolSocket>,
    ports: Vec<PortStats>,
    listed_at: Option<Instant>,
    /// Each netdev failing now, with its problem as last warned about.
    problems: BTreeMap<String, EthtoolError>,
    socket_problem: Option<String>,
    scratch: Vec<u64>,
    values: Vec<u64>,
    due: Vec<bool>,
}

impl EthtoolStats {
    /// `sysfs_root` holds `class/infiniband` (`/sys` on a node, a fixture tree in tests).
    pub fn new(sysfs_root: PathBuf) -> Self {
        Self {
            sysfs_root,
            socket: None,
            ports: Vec::new(),
            listed_at: None,
            problems: BTreeMap::new(),
            socket_problem: None,
            scratch: Vec::new(),
            values: Vec::new(),
            due: Vec::new(),
        }
    }

    /// Reads every statistic of every RoCE port's netdev, stamped `unix_ns`.
    pub fn read(&mut self, unix_ns: u64) -> Vec<Reading> {
        let mut out = Vec::new();
        self.read_into(&mut Collect::new(&mut out, unix_ns, |_| true));
        out
    }

    /// The netdevs failing now, each as of its last read.
    pub fn problems(&self) -> impl Iterator<Item = &EthtoolError> {
        self.problems.values()
    }

    /// Reads the statistics of the series `sink` says are due, handing it each value.
    pub fn read_into(&mut self, sink: &mut dyn ReadingSink) {
        if self.listed_at.is_none_or(|at| at.elapsed() >= RELIST_EVERY) {
            self.relist();
        }
        if self.ports.is_empty() {
            return;
        }
        let socket = match &self.socket {
            Some(socket) => socket,
            None => match EthtoolSocket::open() {
                Ok(socket) => {
                    self.socket_problem = None;
                    self.socket.insert(socket)
                }
                Err(e) => {
                    let what = e.to_string();
                    if self.socket_problem.as_ref() != Some(&what) {
                        tracing::warn!("ethtool statistics off: cannot open a socket: {what}");
                        self.socket_problem = Some(what);
                    }
                    return;
                }
            },
        };
        for port in &mut self.ports {
            let netdev = port.port.netdev.clone();
            let read = sweep_port(
                socket,
                port,
                sink,
                &mut self.scratch,
                &mut self.values,
                &mut self.due,
            );
            match read {
                Ok(()) => {
                    if self.problems.remove(&netdev).is_some() {
                        tracing::info!("ethtool statistics of {netdev}: read again");
                    }
                }
                Err(e) => {
                    if self.problems.get(&netdev) != Some(&e) {
                        tracing::warn!("{e}");
                        self.problems.insert(netdev, e);
                    }
                }
            }
        }
    }

    /// Lists the RoCE ports again, keeping what is known of the ports still there.
    fn relist(&mut self) {
        self.listed_at = Some(Instant::now());
        let found = rdma_netdevs(&self.sysfs_root);
        if found.len() != self.ports.len()
            || found.iter().zip(&self.ports).any(|(f, p)| *f != p.port)
        {
            let mut old: Vec<PortStats> = std::mem::take(&mut self.ports);
            self.ports = found
                .into_iter()
                .map(|port| match old.iter().position(|o| o.port == port) {
                    Some(i) => old.swap_remove(i),
                    None => PortStats { port, set: None },
                })
                .collect();
            let netdevs: Vec<&str> = self.ports.iter().map(|p| p.port.netdev.as_str()).collect();
            tracing::info!("ethtool: statistics of the RoCE netdevs {netdevs:?}");
            self.problems
                .retain(|netdev, _| netdevs.contains(&netdev.as_str()));
        }
    }
}

/// One port's sweep: the count, the names when the set changed, the values when one is due.
fn sweep_port(
    socket: &EthtoolSocket,
    port: &mut PortStats,
    sink: &mut dyn ReadingSink,
    scratch: &mut Vec<u64>,
    values: &mut Vec<u64>,
    due: &mut Vec<bool>,
) -> Result<(), EthtoolError> {
    let p = &port.port;
    let error = |what: String| EthtoolError {
        netdev: p.netdev.clone(),
        device: p.device.clone(),
        port: p.port,
        what,
    };
    let failed =
        |(request, e): (Request, std::io::Error)| error(format!("{}: {e}", request.name()));
    let ifindex = ifindex(&p.netdev).ok_or_else(|| error("no such netdev here".into()))?;
    let count = socket.stat_count(&p.netdev).map_err(failed)?;
    let current = port
        .set
        .as_ref()
        .is_some_and(|s| s.ifindex == ifindex && s.count == count);
    if !current {
        port.set = None;
        let names = if count == 0 {
            Vec::new()
        } else {
            socket.stat_names(&p.netdev, count).map_err(failed)?
        };
        if names.len() != count as usize {
            // The set changed between the two requests: named again at the next sweep.
            return Ok(());
        }
        let labels = Labels::new([
            ("device", p.device.as_str()),
            ("port", p.port.to_string().as_str()),
            ("netdev", p.netdev.as_str()),
        ]);
        let stats = stat_names::kept(&names)
            .into_iter()
            .map(|(index, name)| Stat {
                index,
                series: Series {
                    name: name.into(),
                    labels: labels.clone(),
                    kind: Kind::Counter,
                },
                slot: Slot::default(),
            })
            .collect();
        port.set = Some(StatSet {
            ifindex,
            count,
            stats,
        });
    }
    let Some(set) = &mut port.set else {
        return Ok(());
    };
    due.clear();
    due.extend(
        set.stats
            .iter_mut()
            .map(|s| sink.due(&s.series, &mut s.slot)),
    );
    if !due.contains(&true) {
        return Ok(());
    }
    socket
        .stats(&p.netdev, count, scratch, values)
        .map_err(failed)?;
    if values.len() != count as usize {
        // Not the set its names were read for: named again at the next sweep.
        port.set = None;
        return Ok(());
    }
    for (stat, _) in set.stats.iter_mut().zip(due.iter()).filter(|(_, d)| **d) {
        sink.reading(&stat.series, &mut stat.slot, Value::U64(values[stat.index]));
    }
    Ok(())
}

/// The ifindex of `netdev` in this network namespace; None when there is no such netdev.
fn ifindex(netdev: &str) -> Option<u32> {
    let name = CString::new(netdev).ok()?;
    // SAFETY: a NUL-terminated name; if_nametoindex only reads it.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    (index != 0).then_some(index)
}
