//! A PCI device's place on the PCIe tree and its link, from sysfs.
//!
//! A device's sysfs directory is `<root>/devices/pciDDDD:BB/<root port>/.../<device>`: the
//! host bridge, then one directory per bridge down to the device, each named by its PCI
//! address. The host bridge need not be the first directory: on Hyper-V (Azure's GPU VMs)
//! each passed-through device has a host bridge of its own under the VMBus device
//! (`devices/LNXSYSTM:00/LNXSYBUS:00/ACPI0004:00/VMBUS:00/<guid>/pci0001:00/0001:00:00.0`).
//! A link to it (`/sys/bus/pci/devices/ADDR`, an RDMA device's `device`) is resolved to that
//! path, and read as:
//!
//! - the root port: the first bridge below the host bridge (none for a device integrated in
//!   the host bridge);
//! - the switch: the upstream port of the nearest PCIe switch above the device. A switch is an
//!   upstream port with downstream ports under it, so when the device's parent is not the root
//!   port it is a downstream port, and the bridge above it (two levels above the device) is
//!   the switch;
//! - `numa_node` (`-1`: the kernel does not say), and the link's `current_link_speed`,
//!   `max_link_speed` ("16.0 GT/s PCIe" is generation 4; "Unknown": the kernel does not
//!   know, as for a virtual function or a link down), `current_link_width` and
//!   `max_link_width` (0: not known).
//!
//! A path that points elsewhere (a virtual device: rxe on a veth) has no PCI parent; one that
//! cannot be resolved (a symlink loop) or an attribute that is missing or unreadable is a
//! problem named by its path, and costs only what it would have told.

use std::{
    io,
    path::{Path, PathBuf},
};

use monitor_wire::pci::PciPlace;

/// A PCI device as sysfs tells it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PciDevice {
    /// Its PCI address, `DDDD:BB:DD.F` in lower case.
    pub address: String,
    pub place: PciPlace,
    pub link: PciLink,
}

/// A PCIe link's generation and width, current and maximum; `None` where sysfs does not say.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PciLink {
    pub generation: Option<u32>,
    pub max_generation: Option<u32>,
    pub width_lanes: Option<u32>,
    pub max_width_lanes: Option<u32>,
}

/// Whether `name` is a PCI host bridge, `pciDDDD:BB` (hex digits).
fn is_host_bridge(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("pci") else {
        return false;
    };
    let b = rest.as_bytes();
    b.len() == 7
        && b[4] == b':'
        && rest
            .bytes()
            .filter(|&c| c != b':')
            .all(|c| c.is_ascii_hexdigit())
}

/// Whether `name` is a PCI address, `DDDD:BB:DD.F` (hex digits).
pub(super) fn is_pci_address(name: &str) -> bool {
    let b = name.as_bytes();
    let hex = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_hexdigit);
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && hex(0..4)
        && hex(5..7)
        && hex(8..10)
        && hex(11..12)
}

/// The PCIe generation of a link speed as sysfs writes it: "16.0 GT/s PCIe" (or "16 GT/s")
/// is 4; 2.5 GT/s is 1 and 64 GT/s is 6.
pub(super) fn generation_of_speed(text: &str) -> Option<u32> {
    let number = text.split_whitespace().next()?;
    let gts: f64 = number.parse().ok()?;
    [2.5, 5.0, 8.0, 16.0, 32.0, 64.0]
        .iter()
        .position(|s| (gts - s).abs() < 0.01)
        .map(|i| i as u32 + 1)
}

/// A link width as sysfs writes it ("16"; older kernels "x16").
pub(super) fn lanes_of_width(text: &str) -> Option<u32> {
    let n: u32 = text.trim().trim_start_matches('x').parse().ok()?;
    (n > 0).then_some(n)
}

/// The PCI device that `link` (a sysfs link to a device under `<root>/devices`) is, or sits
/// under (a virtio NIC's `virtio0` sits under its PCI function). `Ok(None)`: the link is
/// absent, or the device has no PCI parent. Problems with its attributes go to `problems`.
pub(super) fn pci_device_at(
    root: &Path,
    link: &Path,
    problems: &mut Vec<String>,
) -> Result<Option<PciDevice>, String> {
    let real = match std::fs::canonicalize(link) {
        Ok(real) => real,
        Err(e)
            if e.kind() == io::ErrorKind::NotFound && std::fs::symlink_metadata(link).is_err() =>
        {
            return Ok(None);
        }
        Err(e) => return Err(format!("{}: cannot resolve: {e}", link.display())),
    };
    let devices = std::fs::canonicalize(root.join("devices"))
        .map_err(|e| format!("{}: cannot resolve: {e}", root.join("devices").display()))?;
    let Ok(below) = real.strip_prefix(&devices) else {
        return Ok(None);
    };
    let parts: Vec<String> = below
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    let Some(bridge_at) = parts.iter().position(|p| is_host_bridge(p)) else {
        return Ok(None);
    };
    let chain: Vec<String> = parts[bridge_at + 1..]
        .iter()
        .take_while(|p| is_pci_address(p))
        .cloned()
        .collect();
    let Some(address) = chain.last() else {
        return Ok(None);
    };
    let dir: PathBuf = parts[..=bridge_at]
        .iter()
        .chain(&chain)
        .fold(devices.clone(), |dir, part| dir.join(part));
    let place = PciPlace {
        switch: if chain.len() >= 4 {
            chain[chain.len() - 3].clone()
        } else {
            String::new()
        },
        root_port: if chain.len() >= 2 {
            chain[0].clone()
        } else {
            String::new()
        },
        numa_node: read_attribute(&dir, "numa_node", problems, |t| t.parse::<i64>().ok())
            .and_then(|n| u32::try_from(n).ok()),
    };
    // "Unknown" speeds and a width of 0 are the kernel saying it does not know: no value,
    // and no problem.
    let speed = |t: &str| {
        if t.starts_with("Unknown") {
            Some(None)
        } else {
            generation_of_speed(t).map(Some)
        }
    };
    let width = |t: &str| {
        if t == "0" {
            Some(None)
        } else {
            lanes_of_width(t).map(Some)
        }
    };
    let link = PciLink {
        generation: read_attribute(&dir, "current_link_speed", problems, speed).flatten(),
        max_generation: read_attribute(&dir, "max_link_speed", problems, speed).flatten(),
        width_lanes: read_attribute(&dir, "current_link_width", problems, width).flatten(),
        max_width_lanes: read_attribute(&dir, "max_link_width", problems, width).flatten(),
    };
    Ok(Some(PciDevice {
        address: address.to_ascii_lowercase(),
        place,
        link,
    }))
}

/// `dir/name` parsed by `parse`; a file missing, unreadable or not understood is a problem
/// naming it.
fn read_attribute<T>(
    dir: &Path,
    name: &str,
    problems: &mut Vec<String>,
    parse: impl Fn(&str) -> Option<T>,
) -> Option<T> {
    let path = dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let value = parse(text.trim());
            if value.is_none() {
                problems.push(format!(
                    "{}: not understood: {:?}",
                    path.display(),
                    text.trim()
                ));
            }
            value
        }
        Err(e) => {
            problems.push(format!("{}: {e}", path.display()));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_speeds_are_pcie_generations() {
        for (text, generation) in [
            ("2.5 GT/s PCIe", 1),
            ("5.0 GT/s PCIe", 2),
            ("8.0 GT/s PCIe", 3),
            ("16.0 GT/s PCIe", 4),
            ("32.0 GT/s PCIe", 5),
            ("64.0 GT/s PCIe", 6),
            ("8 GT/s", 3),
        ] {
            assert_eq!(generation_of_speed(text), Some(generation), "{text}");
        }
        assert_eq!(generation_of_speed("Unknown"), None);
        assert_eq!(generation_of_speed("Unknown speed"), None);
        assert_eq!(lanes_of_width("16"), Some(16));
        assert_eq!(lanes_of_width("x8"), Some(8));
        assert_eq!(lanes_of_width("0"), None);
        assert!(is_pci_address("0000:1b:00.0"));
        assert!(!is_pci_address("pci0000:15"));
        assert!(!is_pci_address("virtio0"));
        assert!(is_host_bridge("pci0000:15"));
        assert!(is_host_bridge("pci0001:00"));
        assert!(!is_host_bridge("pci_express"));
        assert!(!is_host_bridge("pci0000:1"));
        assert!(!is_host_bridge("0000:15:01.0"));
    }
}
