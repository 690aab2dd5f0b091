//! The RDMA devices under `<root>/class/infiniband`: where each sits on the PCIe tree (its
//! `device` link; for rxe, which has none, its netdev's), its firmware and board (`fw_ver`,
//! `board_id`, `hca_type`, `node_guid`; empty where the driver has none) and its ports'
//! link layers and states.

use std::path::Path;

use super::pci::{PciDevice, pci_device_at};

/// One RDMA device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RdmaDevice {
    /// Its name under `class/infiniband` (`mlx5_0`, `rxe0`).
    pub name: String,
    /// Its PCI function; `None` without a PCI parent (rxe on a veth).
    pub pci: Option<PciDevice>,
    pub fw_ver: String,
    pub board_id: String,
    pub hca_type: String,
    pub node_guid: String,
    pub ports: Vec<RdmaPort>,
}

/// One port of an RDMA device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RdmaPort {
    pub number: u32,
    /// `InfiniBand` or `Ethernet`.
    pub link_layer: String,
    /// The state's name (`ACTIVE`, `DOWN`, ...) from `state` ("4: ACTIVE").
    pub state: String,
}

impl RdmaPort {
    pub fn is_active(&self) -> bool {
        self.state == "ACTIVE"
    }
}

/// Sorted entry names of `dir` (none if it cannot be listed).
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// A one-line attribute, trimmed; empty when absent.
fn text(path: &Path) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Every RDMA device under `root` (`/sys`), sorted by name. What cannot be read of one is a
/// line in `problems` and costs only that.
pub(super) fn rdma_devices(root: &Path, problems: &mut Vec<String>) -> Vec<RdmaDevice> {
    let class = root.join("class/infiniband");
    names(&class)
        .into_iter()
        .map(|name| {
            let dir = class.join(&name);
            let mut pci = pci_device_at(root, &dir.join("device"), problems);
            if matches!(pci, Ok(None)) {
                // rxe names its netdev in `parent`; that netdev may sit on a PCI NIC.
                let parent = text(&dir.join("parent"));
                if !parent.is_empty() {
                    pci = pci_device_at(
                        root,
                        &root.join("class/net").join(&parent).join("device"),
                        problems,
                    );
                }
            }
            let pci = pci.unwrap_or_else(|problem| {
                problems.push(problem);
                None
            });
            let ports = names(&dir.join("ports"))
                .into_iter()
                .filter_map(|p| {
                    let number = p.parse().ok()?;
                    let port = dir.join("ports").join(&p);
                    let state = text(&port.join("state"));
                    Some(RdmaPort {
                        number,
                        link_layer: text(&port.join("link_layer")),
                        state: state
                            .split_once(':')
                            .map_or(state.as_str(), |(_, s)| s)
                            .trim()
                            .to_owned(),
                    })
                })
                .collect();
            RdmaDevice {
                pci,
                fw_ver: text(&dir.join("fw_ver")),
                board_id: text(&dir.join("board_id")),
                hca_type: text(&dir.join("hca_type")),
                node_guid: text(&dir.join("node_guid")),
                ports,
                name,
            }
        })
        .collect()
}
