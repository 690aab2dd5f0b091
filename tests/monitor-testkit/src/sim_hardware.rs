//! The hardware path a simulated node sends (monitor-wire's `names`: `railscope_gpu_pci_info`,
//! `railscope_rdma_device_info`, the RDMA devices' PCIe links, `railscope_node_hardware_info`
//! and the node's counts), as a real agent sends it on the [`HgxNode`] of the same number:
//! the same places, firmware, models and variants (a NIC on older firmware, a NIC missing,
//! PFN's wiring), for the simulated fleet's frames. The GPUs' link gauges are the fleet's own
//! (`railscope_gpu_pcie_link_*`, [`crate::FleetBuilder::pcie_degraded`]).

use monitor_wire::{Labels, names::metric};

use crate::hgx::{self, HgxNode};

pub const KERNEL: &str = "6.8.0-45-generic";

/// The node's hardware series as (name, labels, value); node `n` of the fleet (the GPUs'
/// `uuid` labels are the fleet's).
pub fn series(n: usize, node: &HgxNode) -> Vec<(&'static str, Labels, f64)> {
    let mut out = Vec::new();
    for g in 0..crate::GPUS {
        let slot = node.gpu_slot(g);
        out.push((
            metric::GPU_PCI_INFO,
            Labels::new([
                ("gpu", g.to_string()),
                ("uuid", format!("GPU-{n:04x}{g:04x}-sim")),
                ("pci", slot.address),
                ("numa_node", slot.numa_node.to_string()),
                ("switch", slot.switch),
                ("root_port", slot.root_port),
                ("model", hgx::GPU_MODEL.into()),
                ("vbios", hgx::VBIOS.into()),
                ("serial", format!("165{n:04}{g:03}")),
            ]),
            1.0,
        ));
    }
    let nics: Vec<usize> = node.nics().collect();
    for &nic in &nics {
        let device = format!("mlx5_{nic}");
        let slot = node.nic_slot(nic);
        out.push((
            metric::RDMA_DEVICE_INFO,
            Labels::new([
                ("device", device.clone()),
                ("pci", slot.address),
                ("numa_node", slot.numa_node.to_string()),
                ("switch", slot.switch),
                ("root_port", slot.root_port),
                ("fw_ver", node.nic_firmware(nic).into()),
                ("board_id", hgx::BOARD_ID.into()),
                ("hca_type", hgx::HCA_TYPE.into()),
                ("node_guid", format!("a088:c203:00{n:02x}:{nic:04x}")),
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
            ("driver", hgx::DRIVER),
            ("gpu_model", hgx::GPU_MODEL),
            ("nic_model", hgx::HCA_TYPE),
        ]),
        1.0,
    ));
    out.push((metric::NODE_GPUS, Labels::default(), crate::GPUS as f64));
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
