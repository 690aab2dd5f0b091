//! A node's hardware path as its agent sends it (docs/agent.md): its GPUs and RDMA devices,
//! where each sits on the PCIe tree, their links and firmware, the node's counts and class.
//! Read from the node's latest series, for the golden profile ([`super::profile`]) and for
//! `GET /api/v1/nodes/{node}/hardware`.
//!
//! A series whose labels change (new firmware, a GPU's job) is a new series; the old one
//! stays in the live view for a while. Of several series for one device and metric, the one
//! with the newest sample is the device's.

use std::collections::HashMap;

use monitor_wire::{
    Labels, Series,
    names::metric,
    pci::{Distance, PciPlace},
};
use serde::Serialize;

use crate::live_table::{Latest, LatestValue};

/// The series the hardware path is read from.
pub const SERIES: &[&str] = &[
    metric::NODE_HARDWARE_INFO,
    metric::NODE_GPUS,
    metric::NODE_RDMA_DEVICES,
    metric::NODE_ACTIVE_PORTS,
    metric::GPU_PCI_INFO,
    metric::GPU_PCIE_LINK_GENERATION,
    metric::GPU_PCIE_LINK_MAX_GENERATION,
    metric::GPU_PCIE_LINK_WIDTH_LANES,
    metric::GPU_PCIE_LINK_MAX_WIDTH_LANES,
    metric::RDMA_DEVICE_INFO,
    metric::RDMA_PCIE_LINK_GENERATION,
    metric::RDMA_PCIE_LINK_MAX_GENERATION,
    metric::RDMA_PCIE_LINK_WIDTH_LANES,
    metric::RDMA_PCIE_LINK_MAX_WIDTH_LANES,
];

/// Whether `name` is one of the hardware path's series (asked for every watched series of
/// the fleet each tick: a set, not a scan).
pub fn is_hardware_series(name: &str) -> bool {
    static NAMES: std::sync::LazyLock<
        std::collections::HashSet<&'static str, foldhash::fast::RandomState>,
    > = std::sync::LazyLock::new(|| SERIES.iter().copied().collect());
    NAMES.contains(name)
}

/// A PCIe link: what it trained at and the most it can (generation 1-6, lanes); `None`
/// where the agent sent no value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Link {
    pub generation: Option<u32>,
    pub max_generation: Option<u32>,
    pub width: Option<u32>,
    pub max_width: Option<u32>,
}

impl Link {
    /// `Gen5 x16`, `?` for what is unknown.
    pub fn describe(gen_: Option<u32>, width: Option<u32>) -> String {
        let show = |v: Option<u32>| v.map_or("?".into(), |v| v.to_string());
        format!("Gen{} x{}", show(gen_), show(width))
    }
}

/// Where a device sits, as the API writes it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Place {
    pub numa_node: Option<u32>,
    pub switch: String,
    pub root_port: String,
}

impl Place {
    fn of(labels: &Labels) -> Self {
        Self {
            numa_node: labels.get("numa_node").and_then(|n| n.parse().ok()),
            switch: labels.get("switch").unwrap_or_default().to_owned(),
            root_port: labels.get("root_port").unwrap_or_default().to_owned(),
        }
    }

    pub fn pci_place(&self) -> PciPlace {
        PciPlace {
            switch: self.switch.clone(),
            root_port: self.root_port.clone(),
            numa_node: self.numa_node,
        }
    }
}

/// One GPU (`railscope_gpu_pci_info` and its link gauges).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GpuPath {
    /// NVML's index (the `gpu` label).
    pub gpu: String,
    pub uuid: String,
    pub pci: String,
    pub place: Place,
    pub model: String,
    pub vbios: String,
    pub serial: String,
    pub link: Link,
}

/// One RDMA device (`railscope_rdma_device_info` and its link gauges).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RdmaPath {
    pub device: String,
    pub pci: String,
    pub place: Place,
    pub fw_ver: String,
    pub board_id: String,
    pub hca_type: String,
    pub node_guid: String,
    pub link: Link,
}

/// `railscope_node_hardware_info`'s labels.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NodeInfo {
    pub kernel: String,
    pub driver: String,
    pub gpu_model: String,
    pub nic_model: String,
}

/// A node's hardware class: nodes of one class are compared with each other.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Class {
    pub gpu_model: String,
    pub nic_model: String,
}

impl std::fmt::Display for Class {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |s: &str| if s.is_empty() { "none" } else { s }.to_owned();
        write!(f, "{} + {}", show(&self.gpu_model), show(&self.nic_model))
    }
}

/// The node's counts (`railscope_node_gpus`, `_rdma_devices`, `_active_ports`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub gpus: Option<u32>,
    pub rdma_devices: Option<u32>,
    pub active_ports: Option<u32>,
}

/// A node's hardware path.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct NodeHardware {
    /// None: the node sends no `railscope_node_hardware_info` (an older agent): no class.
    pub info: Option<NodeInfo>,
    pub counts: Counts,
    /// By index.
    pub gpus: Vec<GpuPath>,
    /// In PCI-address order (devices without one last, by name): a NIC's ordinal is its
    /// place in this list.
    pub rdma: Vec<RdmaPath>,
    /// The newest sample time among its hardware series.
    pub seen_ns: u64,
}

impl NodeHardware {
    pub fn class(&self) -> Option<Class> {
        self.info.as_ref().map(|i| Class {
            gpu_model: i.gpu_model.clone(),
            nic_model: i.nic_model.clone(),
        })
    }

    /// The distance of each GPU (rows, by index) to each RDMA device (columns, by ordinal).
    pub fn distances(&self) -> Vec<Vec<Distance>> {
        let nics: Vec<PciPlace> = self.rdma.iter().map(|r| r.place.pci_place()).collect();
        self.gpus
            .iter()
            .map(|g| {
                let place = g.place.pci_place();
                nics.iter().map(|n| Distance::between(&place, n)).collect()
            })
            .collect()
    }
}

/// Which of a link's four gauges a metric is.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum LinkPart {
    // The discriminants index a link's gauges in `HardwareReader`.
    Generation,
    MaxGeneration,
    Width,
    MaxWidth,
}

fn link_part(name: &str) -> Option<(bool, LinkPart)> {
    Some(match name {
        metric::GPU_PCIE_LINK_GENERATION => (true, LinkPart::Generation),
        metric::GPU_PCIE_LINK_MAX_GENERATION => (true, LinkPart::MaxGeneration),
        metric::GPU_PCIE_LINK_WIDTH_LANES => (true, LinkPart::Width),
        metric::GPU_PCIE_LINK_MAX_WIDTH_LANES => (true, LinkPart::MaxWidth),
        metric::RDMA_PCIE_LINK_GENERATION => (false, LinkPart::Generation),
        metric::RDMA_PCIE_LINK_MAX_GENERATION => (false, LinkPart::MaxGeneration),
        metric::RDMA_PCIE_LINK_WIDTH_LANES => (false, LinkPart::Width),
        metric::RDMA_PCIE_LINK_MAX_WIDTH_LANES => (false, LinkPart::MaxWidth),
        _ => return None,
    })
}

/// The reader's maps: foldhash, as the tracks (see `view::Tracks`).
type FoldHashMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Reads one node's hardware path from its series, newest sample first (see the module
/// documentation).
#[derive(Default)]
pub struct HardwareReader {
    info: Option<(u64, Labels)>,
    counts: [Option<(u64, f64)>; 3],
    gpus: FoldHashMap<String, (u64, Labels)>,
    rdma: FoldHashMap<String, (u64, Labels)>,
    /// gpu (GPUs) or device (RDMA devices) → (time, value) of each [`LinkPart`]: looked up
    /// by the label's text (the whole fleet is read when the profile is learnt).
    gpu_links: FoldHashMap<String, [Option<(u64, f64)>; 4]>,
    rdma_links: FoldHashMap<String, [Option<(u64, f64)>; 4]>,
    seen_ns: u64,
}

/// Keeps `(t, v)` in `slot` if it is newer than what is there.
fn newest<T>(slot: &mut Option<(u64, T)>, t: u64, v: T) {
    if slot.as_ref().is_none_or(|(held, _)| t >= *held) {
        *slot = Some((t, v));
    }
}

impl HardwareReader {
    /// Takes one series and its latest value; other series are ignored.
    pub fn take(&mut self, series: &Series, latest: &Latest) {
        let LatestValue::Gauge { mean, .. } = latest.value else {
            return;
        };
        let t = latest.unix_ns;
        let labels = &series.labels;
        let name = &*series.name;
        match name {
            metric::NODE_HARDWARE_INFO => newest(&mut self.info, t, labels.clone()),
            metric::NODE_GPUS => newest(&mut self.counts[0], t, mean),
            metric::NODE_RDMA_DEVICES => newest(&mut self.counts[1], t, mean),
            metric::NODE_ACTIVE_PORTS => newest(&mut self.counts[2], t, mean),
            metric::GPU_PCI_INFO | metric::RDMA_DEVICE_INFO => {
                let (map, key) = if name == metric::GPU_PCI_INFO {
                    (&mut self.gpus, "gpu")
                } else {
                    (&mut self.rdma, "device")
                };
                let Some(id) = labels.get(key) else { return };
                match map.get_mut(id) {
                    Some(slot) => {
                        if t >= slot.0 {
                            *slot = (t, labels.clone());
                        }
                    }
                    None => {
                        map.insert(id.to_owned(), (t, labels.clone()));
                    }
                }
            }
            _ => {
                let Some((gpu, part)) = link_part(name) else {
                    return;
                };
                let Some(id) = labels.get(if gpu { "gpu" } else { "device" }) else {
                    return;
                };
                let links = if gpu {
                    &mut self.gpu_links
                } else {
                    &mut self.rdma_links
                };
                let parts = match links.get_mut(id) {
                    Some(parts) => parts,
                    None => links.entry(id.to_owned()).or_default(),
                };
                newest(&mut parts[part as usize], t, mean);
            }
        }
        self.seen_ns = self.seen_ns.max(t);
    }

    /// Whether any hardware series was taken.
    pub fn is_empty(&self) -> bool {
        self.seen_ns == 0
    }

    fn link(&self, gpu: bool, id: &str) -> Link {
        let links = if gpu {
            &self.gpu_links
        } else {
            &self.rdma_links
        };
        let get = |part: LinkPart| {
            links
                .get(id)
                .and_then(|parts| parts[part as usize])
                .map(|(_, v)| v.round().max(0.0) as u32)
        };
        Link {
            generation: get(LinkPart::Generation),
            max_generation: get(LinkPart::MaxGeneration),
            width: get(LinkPart::Width),
            max_width: get(LinkPart::MaxWidth),
        }
    }

    /// The GPUs (`gpu`) or RDMA devices with an info series or a link gauge (an agent
    /// older than the hardware path sends the GPUs' links alone), each with its info labels.
    fn ids(&self, gpu: bool) -> Vec<(&str, Labels)> {
        let info = if gpu { &self.gpus } else { &self.rdma };
        let links = if gpu {
            &self.gpu_links
        } else {
            &self.rdma_links
        };
        let mut ids: Vec<&str> = info.keys().map(String::as_str).collect();
        ids.extend(links.keys().map(String::as_str));
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter()
            .map(|id| (id, info.get(id).map(|i| i.1.clone()).unwrap_or_default()))
            .collect()
    }

    pub fn finish(self) -> NodeHardware {
        let text = |l: &Labels, k: &str| l.get(k).unwrap_or_default().to_owned();
        let count = |c: Option<(u64, f64)>| c.map(|(_, v)| v.round().max(0.0) as u32);
        let mut gpus: Vec<GpuPath> = self
            .ids(true)
            .into_iter()
            .map(|(gpu, ref l)| GpuPath {
                gpu: gpu.to_owned(),
                uuid: text(l, "uuid"),
                pci: text(l, "pci"),
                place: Place::of(l),
                model: text(l, "model"),
                vbios: text(l, "vbios"),
                serial: text(l, "serial"),
                link: self.link(true, gpu),
            })
            .collect();
        gpus.sort_by(|a, b| {
            let index = |g: &GpuPath| g.gpu.parse::<u32>().unwrap_or(u32::MAX);
            (index(a), &a.gpu).cmp(&(index(b), &b.gpu))
        });
        let mut rdma: Vec<RdmaPath> = self
            .ids(false)
            .into_iter()
            .map(|(device, ref l)| RdmaPath {
                device: device.to_owned(),
                pci: text(l, "pci"),
                place: Place::of(l),
                fw_ver: text(l, "fw_ver"),
                board_id: text(l, "board_id"),
                hca_type: text(l, "hca_type"),
                node_guid: text(l, "node_guid"),
                link: self.link(false, device),
            })
            .collect();
        rdma.sort_by(|a, b| {
            (a.pci.is_empty(), &a.pci, &a.device).cmp(&(b.pci.is_empty(), &b.pci, &b.device))
        });
        NodeHardware {
            info: self.info.map(|(_, l)| NodeInfo {
                kernel: text(&l, "kernel"),
                driver: text(&l, "driver"),
                gpu_model: text(&l, "gpu_model"),
                nic_model: text(&l, "nic_model"),
            }),
            counts: Counts {
                gpus: count(self.counts[0]),
                rdma_devices: count(self.counts[1]),
                active_ports: count(self.counts[2]),
            },
            gpus,
            rdma,
            seen_ns: self.seen_ns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use monitor_wire::Kind;

    fn take(r: &mut HardwareReader, name: &str, labels: &[(&str, &str)], t: u64, v: f64) {
        let series = Series {
            name: name.into(),
            labels: Labels::new(labels.iter().copied()),
            kind: Kind::Gauge,
        };
        r.take(
            &series,
            &Latest {
                unix_ns: t,
                value: LatestValue::Gauge {
                    min: v,
                    max: v,
                    mean: v,
                },
            },
        );
    }

    #[test]
    fn the_newest_series_of_a_device_wins_and_nics_are_in_pci_order() {
        let mut r = HardwareReader::default();
        for (device, pci, fw, t) in [
            ("mlx5_1", "0000:1a:00.0", "28.39.1002", 10),
            ("mlx5_0", "0000:9a:00.0", "28.39.1002", 10),
            // mlx5_1 updated: its old series lingers with an older sample.
            ("mlx5_1", "0000:1a:00.0", "28.40.1000", 20),
            ("rxe0", "", "", 10),
        ] {
            take(
                &mut r,
                metric::RDMA_DEVICE_INFO,
                &[("device", device), ("pci", pci), ("fw_ver", fw)],
                t,
                1.0,
            );
        }
        take(
            &mut r,
            metric::RDMA_PCIE_LINK_WIDTH_LANES,
            &[("device", "mlx5_1")],
            20,
            8.0,
        );
        let hw = r.finish();
        let order: Vec<&str> = hw.rdma.iter().map(|d| d.device.as_str()).collect();
        assert_eq!(order, ["mlx5_1", "mlx5_0", "rxe0"]);
        assert_eq!(hw.rdma[0].fw_ver, "28.40.1000");
        assert_eq!(hw.rdma[0].link.width, Some(8));
        assert_eq!(hw.rdma[0].link.max_width, None);
        assert_eq!(hw.info, None);
        assert_eq!(hw.class(), None);
        assert_eq!(hw.seen_ns, 20);
    }
}
