//! `railscope topology`: the node's hardware path as the agent reads it
//! ([`crate::sources::hwpath`]), for a person: each GPU and RDMA device with its PCI address,
//! NUMA node, switch, root port, link (current and maximum) and firmware, then the distance
//! of each GPU–NIC pair as a matrix, the way `nvidia-smi topo -m` prints it, with a legend;
//! or all of it as one JSON object.

use std::fmt::Write as _;

use monitor_wire::pci::Distance;
use serde_json::{Value, json};

use crate::sources::hwpath::{HardwarePath, PciDevice, PciLink};

/// What each distance means, nearest first.
pub const LEGEND: [(Distance, &str); 5] = [
    (Distance::Switch, "under one PCIe switch"),
    (
        Distance::RootPort,
        "under one root port, through more than one switch",
    ),
    (
        Distance::NumaNode,
        "under different root ports of one NUMA node: through the CPU",
    ),
    (
        Distance::System,
        "across NUMA nodes: through the link between the sockets",
    ),
    (
        Distance::Unknown,
        "not known: no switch or root port shared and a NUMA node the kernel does not say \
         (numa_node -1), or no PCI parent",
    ),
];

fn link_text(generation: Option<u32>, width: Option<u32>) -> String {
    match (generation, width) {
        (None, None) => "-".into(),
        (g, w) => format!(
            "Gen{} x{}",
            g.map_or("?".into(), |g| g.to_string()),
            w.map_or("?".into(), |w| w.to_string())
        ),
    }
}

/// The columns of a PCI device: address, NUMA node, switch, root port, link, maximum.
fn pci_columns(pci: Option<&PciDevice>, address: &str) -> [String; 6] {
    let dash = |s: &str| {
        if s.is_empty() {
            "-".to_owned()
        } else {
            s.to_owned()
        }
    };
    let link = pci.map(|p| p.link).unwrap_or_default();
    [
        dash(pci.map_or(address, |p| p.address.as_str())),
        pci.and_then(|p| p.place.numa_node)
            .map_or("-".into(), |n| n.to_string()),
        dash(pci.map_or("", |p| p.place.switch.as_str())),
        dash(pci.map_or("", |p| p.place.root_port.as_str())),
        link_text(link.generation, link.width_lanes),
        link_text(link.max_generation, link.max_width_lanes),
    ]
}

/// Rows as left-aligned columns two spaces apart.
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            let _ = write!(line, "{cell:<width$}  ", width = widths[c]);
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The text `railscope topology` prints.
pub fn text(path: &HardwarePath) -> String {
    let n = &path.node;
    let mut out = format!(
        "node: kernel {}, NVIDIA driver {}; {} GPUs ({}), {} RDMA devices ({}), {} ports ACTIVE\n\n",
        n.kernel,
        if n.driver.is_empty() { "-" } else { &n.driver },
        n.gpus.map_or("no NVML: -".into(), |g| g.to_string()),
        if n.gpu_model.is_empty() {
            "-"
        } else {
            &n.gpu_model
        },
        n.rdma_devices,
        if n.nic_model.is_empty() {
            "-"
        } else {
            &n.nic_model
        },
        n.active_ports,
    );
    let header = |first: &str, rest: &[&str]| {
        [first, "PCI", "NUMA", "SWITCH", "ROOT PORT", "LINK", "MAX"]
            .iter()
            .chain(rest)
            .map(|s| (*s).to_owned())
            .collect::<Vec<_>>()
    };
    if !path.gpus().is_empty() {
        let mut rows = vec![header("GPU", &["MODEL", "VBIOS", "SERIAL"])];
        for g in path.gpus() {
            let mut row = vec![format!("GPU{}", g.index)];
            row.extend(pci_columns(g.pci.as_ref(), &g.pci_address));
            row.extend([g.model.clone(), g.vbios.clone(), g.serial.clone()]);
            rows.push(row);
        }
        out.push_str(&table(&rows));
        out.push('\n');
    }
    if !path.rdma.is_empty() {
        let mut rows = vec![header("RDMA", &["FIRMWARE", "BOARD", "HCA", "PORTS"])];
        for d in &path.rdma {
            let mut row = vec![d.name.clone()];
            row.extend(pci_columns(d.pci.as_ref(), ""));
            let ports: Vec<String> = d
                .ports
                .iter()
                .map(|p| format!("{}:{}:{}", p.number, p.link_layer, p.state))
                .collect();
            row.extend([
                d.fw_ver.clone(),
                d.board_id.clone(),
                d.hca_type.clone(),
                ports.join(" "),
            ]);
            rows.push(row);
        }
        out.push_str(&table(&rows));
        out.push('\n');
    }
    if !path.gpus().is_empty() && !path.rdma.is_empty() {
        let distances = path.distances();
        let mut rows = vec![
            std::iter::once(String::new())
                .chain(path.rdma.iter().map(|d| d.name.clone()))
                .collect::<Vec<_>>(),
        ];
        for g in path.gpus() {
            let mut row = vec![format!("GPU{}", g.index)];
            row.extend(
                distances
                    .iter()
                    .filter(|(gpu, _, _)| *gpu == g.index)
                    .map(|(_, _, d)| d.as_str().to_owned()),
            );
            rows.push(row);
        }
        out.push_str(&table(&rows));
        out.push_str("\nLegend:\n");
        for (distance, meaning) in LEGEND {
            let _ = writeln!(out, "  {:<4}  {meaning}", distance.as_str());
        }
    }
    out
}

fn link_json(link: PciLink) -> Value {
    json!({
        "generation": link.generation,
        "max_generation": link.max_generation,
        "width_lanes": link.width_lanes,
        "max_width_lanes": link.max_width_lanes,
    })
}

fn place_json(pci: Option<&PciDevice>) -> [(&'static str, Value); 4] {
    [
        ("numa_node", json!(pci.and_then(|p| p.place.numa_node))),
        (
            "switch",
            json!(pci.map(|p| p.place.switch.as_str()).unwrap_or("")),
        ),
        (
            "root_port",
            json!(pci.map(|p| p.place.root_port.as_str()).unwrap_or("")),
        ),
        ("link", link_json(pci.map(|p| p.link).unwrap_or_default())),
    ]
}

/// What `railscope topology --json` prints: `node`, `gpus`, `rdma_devices`, `distances`
/// (one `{gpu, device, distance}` per pair) and `problems`.
pub fn json(path: &HardwarePath) -> Value {
    let n = &path.node;
    let gpus: Vec<Value> = path
        .gpus()
        .iter()
        .map(|g| {
            let mut o = json!({
                "index": g.index, "uuid": g.uuid, "pci": g.pci_address, "model": g.model,
                "vbios": g.vbios, "serial": g.serial,
            });
            for (k, v) in place_json(g.pci.as_ref()) {
                o[k] = v;
            }
            o
        })
        .collect();
    let rdma: Vec<Value> = path
        .rdma
        .iter()
        .map(|d| {
            let mut o = json!({
                "name": d.name,
                "pci": d.pci.as_ref().map_or("", |p| p.address.as_str()),
                "fw_ver": d.fw_ver, "board_id": d.board_id, "hca_type": d.hca_type,
                "node_guid": d.node_guid,
                "ports": d.ports.iter().map(|p| json!({
                    "port": p.number, "link_layer": p.link_layer, "state": p.state,
                })).collect::<Vec<_>>(),
            });
            for (k, v) in place_json(d.pci.as_ref()) {
                o[k] = v;
            }
            o
        })
        .collect();
    let distances: Vec<Value> = path
        .distances()
        .into_iter()
        .map(|(gpu, device, d)| json!({"gpu": gpu, "device": device, "distance": d.as_str()}))
        .collect();
    json!({
        "node": {
            "kernel": n.kernel, "driver": n.driver, "gpu_model": n.gpu_model,
            "nic_model": n.nic_model, "gpus": n.gpus, "rdma_devices": n.rdma_devices,
            "active_ports": n.active_ports,
        },
        "gpus": gpus,
        "rdma_devices": rdma,
        "distances": distances,
        "problems": path.problems,
    })
}
