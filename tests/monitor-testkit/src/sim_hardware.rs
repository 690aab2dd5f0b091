//! The hardware path a simulated node sends (monitor-wire's `names`: `railscope_gpu_pci_info`,
//! `railscope_rdma_device_info`, the RDMA devices' PCIe links, `railscope_node_hardware_info`
//! and the node's counts), laid out as an 8-GPU HGX H100: four PCIe switches, each under its
//! own root port with two GPUs and two NICs, two switches per NUMA node. The faults the
//! golden profile looks for: a NIC on other firmware, a NIC gone, a node wired like PFN's
//! servers (twice the switches: each switch's GPUs under one switch and its NICs under
//! another, so a GPU reaches its NIC through the CPU). The GPUs' link gauges are the fleet's
//! own (`railscope_gpu_pcie_link_*`, [`crate::FleetBuilder::pcie_degraded`]).

use monitor_wire::{Labels, names::metric};

use crate::{GPUS, PORTS};

pub const GPU_MODEL: &str = "NVIDIA H100 80GB HBM3";
pub const NIC_MODEL: &str = "MT4129";
pub const VBIOS: &str = "96.00.74.00.01";
pub const FW_VER: &str = "28.39.1002";
pub const DRIVER: &str = "550.90.07";
pub const KERNEL: &str = "6.8.0-45-generic";

/// A node's hardware faults.
#[derive(Clone, Debug, Default)]
pub struct HardwareFaults {
    /// (NIC, its firmware).
    pub firmware: Vec<(usize, String)>,
    /// NICs the node lacks.
    pub missing_nics: Vec<usize>,
    /// Wired with twice the PCIe switches.
    pub pfn_wired: bool,
}

/// The root port bus of switch `s` (0-3; 0 and 1 on NUMA node 0).
fn root_bus(s: usize) -> usize {
    [0x15, 0x37, 0x9a, 0xb8][s]
}

/// PCI address of a function on `bus`.
fn pci(bus: usize) -> String {
    format!("0000:{bus:02x}:00.0")
}

/// (pci, numa_node, switch, root_port) of GPU or NIC `i` (`nic`: a NIC).
fn place(i: usize, nic: bool, pfn: bool) -> (String, String, String, String) {
    let s = i / 2;
    let rp = root_bus(s);
    let bus = rp + 2 + 2 * (i % 2) + usize::from(!nic);
    let numa = if s < 2 { "0" } else { "1" };
    let (switch, root) = if pfn && nic {
        // The NICs' own switch, under a root port of its own.
        (pci(rp + 0x11), format!("0000:{:02x}:01.0", rp + 0x10))
    } else {
        (pci(rp + 1), format!("0000:{rp:02x}:01.0"))
    };
    (pci(bus), numa.into(), switch, root)
}

/// The node's hardware series as (name, labels, value).
pub fn series(node: usize, faults: &HardwareFaults) -> Vec<(&'static str, Labels, f64)> {
    let mut out = Vec::new();
    for g in 0..GPUS {
        let (pci, numa, switch, root) = place(g, false, faults.pfn_wired);
        out.push((
            metric::GPU_PCI_INFO,
            Labels::new([
                ("gpu", g.to_string()),
                ("uuid", format!("GPU-{node:04x}{g:04x}-sim")),
                ("pci", pci),
                ("numa_node", numa),
                ("switch", switch),
                ("root_port", root),
                ("model", GPU_MODEL.into()),
                ("vbios", VBIOS.into()),
                ("serial", format!("165{node:04}{g:03}")),
            ]),
            1.0,
        ));
    }
    let nics: Vec<usize> = (0..PORTS)
        .filter(|n| !faults.missing_nics.contains(n))
        .collect();
    for &n in &nics {
        let device = format!("mlx5_{n}");
        let (pci, numa, switch, root) = place(n, true, faults.pfn_wired);
        let fw = faults
            .firmware
            .iter()
            .find(|f| f.0 == n)
            .map_or(FW_VER.to_owned(), |f| f.1.clone());
        out.push((
            metric::RDMA_DEVICE_INFO,
            Labels::new([
                ("device", device.clone()),
                ("pci", pci),
                ("numa_node", numa),
                ("switch", switch),
                ("root_port", root),
                ("fw_ver", fw),
                ("board_id", "MT_0000000838".into()),
                ("hca_type", NIC_MODEL.into()),
                ("node_guid", format!("a088:c203:00{node:02x}:{n:04x}")),
            ]),
            1.0,
        ));
        for (name, v) in [
            (metric::RDMA_PCIE_LINK_GENERATION, 5.0),
            (metric::RDMA_PCIE_LINK_MAX_GENERATION, 5.0),
            (metric::RDMA_PCIE_LINK_WIDTH_LANES, 16.0),
            (metric::RDMA_PCIE_LINK_MAX_WIDTH_LANES, 16.0),
        ] {
            out.push((name, Labels::new([("device", device.clone())]), v));
        }
    }
    out.push((
        metric::NODE_HARDWARE_INFO,
        Labels::new([
            ("kernel", KERNEL),
            ("driver", DRIVER),
            ("gpu_model", GPU_MODEL),
            ("nic_model", NIC_MODEL),
        ]),
        1.0,
    ));
    out.push((metric::NODE_GPUS, Labels::default(), GPUS as f64));
    out.push((
        metric::NODE_RDMA_DEVICES,
        Labels::default(),
        nics.len() as f64,
    ));
    out.push((
        metric::NODE_ACTIVE_PORTS,
        Labels::default(),
        nics.len() as f64,
    ));
    out
}
