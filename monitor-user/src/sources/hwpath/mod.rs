//! The node's hardware path, as the kernel and NVML see it: where each GPU and RDMA device
//! sits on the PCIe tree, its link, firmware and board, and the node's class (models, counts,
//! kernel and driver). It changes by hand (a repair, a firmware update), not by the second, so
//! the agent's poller reads it at start and every [`READ_EVERY`], never every sweep, and the
//! pipeline sends what was read last with every flush, like `railscope_agent_info` (constant
//! series cost about a byte a flush each).
//!
//! - `pci`: a PCI device's place and link from its sysfs path;
//! - `rdma`: the RDMA devices under `class/infiniband`;
//! - `gpu`: the GPUs through NVML, placed through `bus/pci/devices`;
//! - `node`: kernel, driver, models and counts.
//!
//! A problem (an attribute missing or unreadable, a path that loops, a GPU NVML does not
//! answer for) costs only what it would have told, and is logged once ([`ProblemLog`]), not
//! at every read.

mod gpu;
mod node;
mod pci;
mod rdma;

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use monitor_wire::{Kind, Labels, Series, names::metric, pci::Distance};
use nvml_wrapper::Nvml;

pub use gpu::GpuPath;
pub use node::NodeFacts;
pub use pci::{PciDevice, PciLink};
pub use rdma::{RdmaDevice, RdmaPort};

/// How often the agent reads the hardware path again.
pub const READ_EVERY: Duration = Duration::from_secs(60);

/// What one read found.
#[derive(Clone, Debug, Default)]
pub struct HardwarePath {
    /// `None`: NVML is off (or absent).
    pub gpus: Option<Vec<GpuPath>>,
    pub rdma: Vec<RdmaDevice>,
    pub node: NodeFacts,
    /// One line per thing that could not be read, naming it.
    pub problems: Vec<String>,
}

impl HardwarePath {
    /// Reads the hardware path of the node whose sysfs is at `root` (`/sys`), with the GPUs
    /// of `nvml` (`None`: none read).
    pub fn read(root: &Path, nvml: Option<&Nvml>) -> Self {
        let mut problems = Vec::new();
        let rdma = rdma::rdma_devices(root, &mut problems);
        let gpus = nvml.map(|nvml| gpu::gpus(nvml, root, &mut problems));
        let driver = nvml
            .and_then(|n| n.sys_driver_version().ok())
            .unwrap_or_default();
        let node = NodeFacts::of(driver, gpus.as_deref(), &rdma);
        Self {
            gpus,
            rdma,
            node,
            problems,
        }
    }

    pub fn gpus(&self) -> &[GpuPath] {
        self.gpus.as_deref().unwrap_or_default()
    }

    /// The distance between each GPU and each RDMA device, GPUs by index, devices by name.
    pub fn distances(&self) -> Vec<(u32, String, Distance)> {
        let place = |p: &Option<PciDevice>| p.as_ref().map(|p| p.place.clone()).unwrap_or_default();
        self.gpus()
            .iter()
            .flat_map(|g| {
                self.rdma.iter().map(move |d| {
                    (
                        g.index,
                        d.name.clone(),
                        Distance::between(&place(&g.pci), &place(&d.pci)),
                    )
                })
            })
            .collect()
    }

    /// The series sent for it, each with its value. A label whose value is unknown (a GPU
    /// without VBIOS, rxe's firmware, a device on a root port has no switch) is left out
    /// rather than sent empty: Prometheus and the TSDBs treat an empty label as an absent one,
    /// so an empty one would name a series they do not hold.
    pub fn series(&self) -> Vec<(Series, f64)> {
        let gauge = |name: &str, labels: Labels| Series {
            name: name.into(),
            labels,
            kind: Kind::Gauge,
        };
        fn known<K, V: AsRef<str>>(
            labels: impl IntoIterator<Item = (K, V)>,
        ) -> impl Iterator<Item = (K, V)> {
            labels.into_iter().filter(|(_, v)| !v.as_ref().is_empty())
        }
        let places = |p: &Option<PciDevice>| {
            let place = p.as_ref().map(|p| p.place.clone()).unwrap_or_default();
            [
                (
                    "pci",
                    p.as_ref().map(|p| p.address.clone()).unwrap_or_default(),
                ),
                (
                    "numa_node",
                    place.numa_node.map_or("-1".to_owned(), |n| n.to_string()),
                ),
                ("switch", place.switch),
                ("root_port", place.root_port),
            ]
        };
        let mut out = Vec::new();
        for g in self.gpus() {
            let labels = [
                ("gpu", g.index.to_string()),
                ("uuid", g.uuid.clone()),
                ("model", g.model.clone()),
                ("vbios", g.vbios.clone()),
                ("serial", g.serial.clone()),
            ];
            let mut place = places(&g.pci);
            // NVML's address stands where sysfs has no such device.
            place[0].1.clone_from(&g.pci_address);
            out.push((
                gauge(
                    metric::GPU_PCI_INFO,
                    Labels::new(known(labels.into_iter().chain(place))),
                ),
                1.0,
            ));
        }
        for d in &self.rdma {
            let labels = [
                ("device", d.name.clone()),
                ("fw_ver", d.fw_ver.clone()),
                ("board_id", d.board_id.clone()),
                ("hca_type", d.hca_type.clone()),
                ("node_guid", d.node_guid.clone()),
            ];
            out.push((
                gauge(
                    metric::RDMA_DEVICE_INFO,
                    Labels::new(known(labels.into_iter().chain(places(&d.pci)))),
                ),
                1.0,
            ));
            let link = d.pci.as_ref().map(|p| p.link).unwrap_or_default();
            for (name, value) in [
                (metric::RDMA_PCIE_LINK_GENERATION, link.generation),
                (metric::RDMA_PCIE_LINK_MAX_GENERATION, link.max_generation),
                (metric::RDMA_PCIE_LINK_WIDTH_LANES, link.width_lanes),
                (metric::RDMA_PCIE_LINK_MAX_WIDTH_LANES, link.max_width_lanes),
            ] {
                if let Some(value) = value {
                    out.push((
                        gauge(name, Labels::new([("device", d.name.as_str())])),
                        f64::from(value),
                    ));
                }
            }
        }
        let n = &self.node;
        out.push((
            gauge(
                metric::NODE_HARDWARE_INFO,
                Labels::new(known([
                    ("kernel", n.kernel.as_str()),
                    ("driver", n.driver.as_str()),
                    ("gpu_model", n.gpu_model.as_str()),
                    ("nic_model", n.nic_model.as_str()),
                ])),
            ),
            1.0,
        ));
        if let Some(gpus) = n.gpus {
            out.push((gauge(metric::NODE_GPUS, Labels::default()), gpus as f64));
        }
        out.push((
            gauge(metric::NODE_RDMA_DEVICES, Labels::default()),
            n.rdma_devices as f64,
        ));
        out.push((
            gauge(metric::NODE_ACTIVE_PORTS, Labels::default()),
            n.active_ports as f64,
        ));
        out
    }
}

/// Logs each problem once: a problem read again at the next read is not logged again; one
/// that went away and comes back is.
#[derive(Debug, Default)]
pub struct ProblemLog {
    current: HashSet<String>,
}

impl ProblemLog {
    /// Logs the problems of this read not in the last one; returns them.
    pub fn report(&mut self, problems: &[String]) -> Vec<String> {
        let new: Vec<String> = problems
            .iter()
            .filter(|p| !self.current.contains(*p))
            .cloned()
            .collect();
        for problem in &new {
            tracing::warn!("hardware path: {problem}");
        }
        self.current = problems.iter().cloned().collect();
        new
    }
}

/// Series with their values, as read last.
pub type Values = Arc<Vec<(Series, f64)>>;

/// The hardware path's series as read last, shared between the poller that reads them and
/// the pipeline that sends them at each flush.
#[derive(Clone, Default)]
pub struct HardwareSeries(Arc<Mutex<Values>>);

impl HardwareSeries {
    pub fn current(&self) -> Values {
        self.0.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn set(&self, series: Vec<(Series, f64)>) {
        if let Ok(mut held) = self.0.lock()
            && **held != series
        {
            *held = Arc::new(series);
        }
    }
}

/// The poller's side: reads the hardware path when due and publishes its series.
pub struct HardwarePoll {
    root: PathBuf,
    last: Option<Instant>,
    log: ProblemLog,
    shared: HardwareSeries,
}

impl HardwarePoll {
    pub fn new(root: PathBuf, shared: HardwareSeries) -> Self {
        Self {
            root,
            last: None,
            log: ProblemLog::default(),
            shared,
        }
    }

    /// Reads the hardware path if it was never read or [`READ_EVERY`] has passed.
    pub fn poll(&mut self, nvml: Option<&Nvml>) {
        if self.last.is_some_and(|t| t.elapsed() < READ_EVERY) {
            return;
        }
        let first = self.last.is_none();
        self.last = Some(Instant::now());
        let path = HardwarePath::read(&self.root, nvml);
        self.log.report(&path.problems);
        if first {
            let n = &path.node;
            tracing::info!(
                "hardware path: {} GPUs, {} RDMA devices, {} active ports",
                n.gpus.unwrap_or(0),
                n.rdma_devices,
                n.active_ports
            );
        }
        self.shared.set(path.series());
    }
}

#[cfg(test)]
mod tests;
