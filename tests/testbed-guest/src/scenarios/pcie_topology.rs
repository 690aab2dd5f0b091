//! pcie-topology: the agent's hardware path read from the kernel's own PCI sysfs, not a
//! fixture. The guest is a q35 machine with two NUMA nodes (xtask's `PCIE_NUMA_ARGS`): a
//! virtio NIC behind a PCIe switch under node 0's expander bus, another straight on a root
//! port of node 1's. With rxe on each NIC, the agent's `railscope_rdma_device_info` and
//! `railscope_rdma_pcie_link_*` series name each rxe device's PCI function (the NIC it runs
//! on), its NUMA node, root port, switch and link as `lspci -vv` and sysfs show them, and
//! `railscope topology` prints both devices.

use std::{collections::BTreeMap, path::Path, thread, time::Duration};

use anyhow::{Context as _, bail, ensure};
use serde_json::Value;

use crate::guest;

const PORT: &str = "17430";

/// One NIC as the guest's kernel and `lspci -vv` show it.
#[derive(Debug)]
struct Nic {
    netdev: String,
    rxe: String,
    /// The PCI function (`0000:43:00.0`).
    pci: String,
    numa_node: String,
    root_port: String,
    /// The switch's upstream port, empty on a root port.
    switch: String,
    generation: u32,
    width: u32,
    max_generation: u32,
    max_width: u32,
}

pub(super) fn run() -> anyhow::Result<()> {
    for module in ["virtio_pci", "virtio_net"] {
        guest::run("/bin/modprobe", &[module])?;
    }
    super::ensure_rdma_modules()?;
    let nics = virtio_nics()?;
    ensure!(
        nics.len() == 2,
        "expected the two virtio NICs of the PCIe tree, found {nics:?}"
    );
    for nic in &nics {
        println!("{nic:?}");
        check_against_lspci(nic)?;
        guest::run("/usr/bin/ip", &["link", "set", &nic.netdev, "up"])?;
        guest::run(
            "/usr/bin/rdma",
            &[
                "link",
                "add",
                &nic.rxe,
                "type",
                "rxe",
                "netdev",
                &nic.netdev,
            ],
        )?;
    }
    let on_switch = nics.iter().filter(|n| !n.switch.is_empty()).count();
    ensure!(
        on_switch == 1,
        "one NIC sits behind the PCIe switch, here {on_switch}"
    );
    // The root ports are set to train faster and wider than the virtio NICs under them can
    // (QEMU's `x-speed`, `x-width`: the ports' maximum link): the agent's values must be the
    // NIC's own, not its port's.
    let port_links: Vec<(u32, u32)> = nics
        .iter()
        .map(|n| root_port_link(&n.root_port))
        .collect::<anyhow::Result<_>>()?;
    println!("root ports' maximum links (generation, width): {port_links:?}");
    ensure!(
        nics.iter()
            .zip(&port_links)
            .any(|(n, port)| (n.max_generation, n.max_width) != *port),
        "no root port's link differs from its NIC's: the test cannot tell them apart"
    );
    let numa: Vec<&str> = nics.iter().map(|n| n.numa_node.as_str()).collect();
    ensure!(
        numa.contains(&"0") && numa.contains(&"1"),
        "the NICs sit on NUMA nodes 0 and 1, here {numa:?}"
    );

    let (mut agent, listener) =
        guest::agent_and_listener(PORT, &["--interval", "0.5", "--flush", "1"], false)?;
    thread::sleep(Duration::from_secs(4));
    let (_, frames) = guest::stop_and_decode(&mut agent, listener)?;
    let sent = hardware_series(&frames);
    for nic in &nics {
        let info = sent
            .get(&("railscope_rdma_device_info".to_owned(), nic.rxe.clone()))
            .with_context(|| format!("no railscope_rdma_device_info of {}", nic.rxe))?;
        for (label, want) in [
            ("pci", &nic.pci),
            ("numa_node", &nic.numa_node),
            ("root_port", &nic.root_port),
            ("switch", &nic.switch),
        ] {
            // A label the agent does not know is left out (no switch: none).
            let got = info.0[label].as_str().unwrap_or("");
            ensure!(
                got == want,
                "{}: the agent sent {label}={got:?}, the guest's sysfs says {want:?}",
                nic.rxe
            );
        }
        for (name, want) in [
            ("railscope_rdma_pcie_link_generation", nic.generation),
            ("railscope_rdma_pcie_link_width_lanes", nic.width),
            (
                "railscope_rdma_pcie_link_max_generation",
                nic.max_generation,
            ),
            ("railscope_rdma_pcie_link_max_width_lanes", nic.max_width),
        ] {
            let got = sent
                .get(&(name.to_owned(), nic.rxe.clone()))
                .map(|(_, v)| *v)
                .with_context(|| format!("no {name} of {}", nic.rxe))?;
            ensure!(
                got == f64::from(want),
                "{}: the agent sent {name} {got}, lspci and sysfs say {want}",
                nic.rxe
            );
        }
    }

    let topology = guest::run("/usr/bin/railscope", &["topology"])?;
    println!("{topology}");
    for nic in &nics {
        ensure!(
            topology.contains(&nic.rxe) && topology.contains(&nic.pci),
            "`railscope topology` does not show {} at {}",
            nic.rxe,
            nic.pci
        );
    }
    Ok(())
}

/// The virtio NICs and where they sit, from sysfs: `/sys/class/net/X/device` is the virtio
/// device, whose parent is the PCI function; its path names the root port and the bridges
/// between.
fn virtio_nics() -> anyhow::Result<Vec<Nic>> {
    let mut nics = Vec::new();
    for entry in std::fs::read_dir("/sys/class/net")? {
        let netdev = entry?.file_name().to_string_lossy().into_owned();
        let device = Path::new("/sys/class/net").join(&netdev).join("device");
        let Ok(virtio) = std::fs::canonicalize(&device) else {
            continue; // lo, veths
        };
        let function = virtio.parent().context("a virtio device without parent")?;
        // /sys/devices/pci0000:40/0000:40:00.0/0000:41:00.0/0000:42:00.0/0000:43:00.0
        let chain: Vec<String> = function
            .components()
            .filter_map(|c| c.as_os_str().to_str())
            .filter(|c| c.len() == 12 && c.as_bytes()[4] == b':' && c.contains('.'))
            .map(str::to_owned)
            .collect();
        let pci = chain.last().cloned().context("no PCI function")?;
        let read = |name: &str| -> anyhow::Result<String> {
            let path = function.join(name);
            Ok(std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?
                .trim()
                .to_owned())
        };
        // root port, [switch upstream, switch downstream], function.
        let switch = if chain.len() >= 4 {
            chain[chain.len() - 3].clone()
        } else {
            String::new()
        };
        nics.push(Nic {
            rxe: format!("rxe_{netdev}"),
            root_port: chain.first().cloned().unwrap_or_default(),
            switch,
            numa_node: read("numa_node")?,
            generation: generation(&read("current_link_speed")?)?,
            width: read("current_link_width")?.parse()?,
            max_generation: generation(&read("max_link_speed")?)?,
            max_width: read("max_link_width")?.parse()?,
            pci,
            netdev,
        });
    }
    nics.sort_by(|a, b| a.pci.cmp(&b.pci));
    Ok(nics)
}

/// A root port's maximum link (generation, width), from its sysfs.
fn root_port_link(address: &str) -> anyhow::Result<(u32, u32)> {
    let dir = Path::new("/sys/bus/pci/devices").join(address);
    let read = |name: &str| -> anyhow::Result<String> {
        Ok(std::fs::read_to_string(dir.join(name))
            .with_context(|| format!("reading {address}'s {name}"))?
            .trim()
            .to_owned())
    };
    Ok((
        generation(&read("max_link_speed")?)?,
        read("max_link_width")?.parse()?,
    ))
}

/// The PCIe generation of a sysfs link speed (`16.0 GT/s PCIe`).
fn generation(speed: &str) -> anyhow::Result<u32> {
    let gts: f64 = speed
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("not a link speed: {speed:?}"))?;
    Ok(match gts {
        s if s <= 2.5 => 1,
        s if s <= 5.0 => 2,
        s if s <= 8.0 => 3,
        s if s <= 16.0 => 4,
        s if s <= 32.0 => 5,
        _ => 6,
    })
}

/// `lspci -vv` of the NIC agrees with sysfs on its NUMA node and link (`LnkSta: Speed
/// 16GT/s, Width x16`).
fn check_against_lspci(nic: &Nic) -> anyhow::Result<()> {
    let out = guest::run("/usr/bin/lspci", &["-vv", "-s", &nic.pci])?;
    let lnksta = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("LnkSta:"))
        .with_context(|| format!("no LnkSta in lspci -vv -s {}:\n{out}", nic.pci))?;
    let speed = lnksta
        .split("Speed ")
        .nth(1)
        .and_then(|s| s.split("GT/s").next())
        .with_context(|| format!("no speed in {lnksta:?}"))?;
    let width: u32 = lnksta
        .split("Width x")
        .nth(1)
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no width in {lnksta:?}"))?;
    let lspci_gen = generation(speed)?;
    if (lspci_gen, width) != (nic.generation, nic.width) {
        bail!(
            "{}: lspci says {speed} GT/s x{width}, sysfs gen {} x{}",
            nic.pci,
            nic.generation,
            nic.width
        );
    }
    if let Some(node) = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("NUMA node:"))
    {
        ensure!(
            node.trim() == nic.numa_node,
            "{}: lspci says NUMA node {node}, sysfs {}",
            nic.pci,
            nic.numa_node
        );
    }
    Ok(())
}

/// The hardware series the frames carried: (name, device) -> (labels, last value).
fn hardware_series(frames: &[Value]) -> BTreeMap<(String, String), (Value, f64)> {
    let mut out = BTreeMap::new();
    for s in frames
        .iter()
        .flat_map(|f| f["samples"].as_array().into_iter().flatten())
    {
        let name = s["name"].as_str().unwrap_or("");
        if !name.starts_with("railscope_rdma_device_info")
            && !name.starts_with("railscope_rdma_pcie_link_")
        {
            continue;
        }
        let device = s["labels"]["device"].as_str().unwrap_or("").to_owned();
        let value = s["points"]
            .as_array()
            .and_then(|p| p.last())
            .and_then(|p| p["value"].as_f64().or(p["mean"].as_f64()))
            .unwrap_or(f64::NAN);
        out.insert((name.to_owned(), device), (s["labels"].clone(), value));
    }
    out
}
