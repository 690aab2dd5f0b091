//! The GPUs NVML sees: index, UUID, PCI bus id, model, VBIOS and serial, and where each sits
//! on the PCIe tree (its `<root>/bus/pci/devices/ADDR`).

use std::path::Path;

use nvml_wrapper::{Nvml, error::NvmlError};

use super::pci::{PciDevice, pci_device_at};

/// One GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuPath {
    pub index: u32,
    pub uuid: String,
    /// Its PCI address as sysfs names it (`0000:1b:00.0`).
    pub pci_address: String,
    /// NVML's name (`NVIDIA H100 80GB HBM3`).
    pub model: String,
    pub vbios: String,
    pub serial: String,
    /// Its place and link; `None` where sysfs has no such device.
    pub pci: Option<PciDevice>,
}

/// NVML's PCI bus id (`00000000:1B:00.0`: an 8-digit domain, upper case) as sysfs names the
/// device (`0000:1b:00.0`).
pub(super) fn sysfs_address(bus_id: &str) -> Option<String> {
    let (domain, rest) = bus_id.trim().split_once(':')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let address = format!("{domain:04x}:{}", rest.to_ascii_lowercase());
    super::pci::is_pci_address(&address).then_some(address)
}

/// Every GPU `nvml` lists. A value NVML does not support is empty; a GPU or value that fails
/// otherwise is a line in `problems`.
pub(super) fn gpus(nvml: &Nvml, root: &Path, problems: &mut Vec<String>) -> Vec<GpuPath> {
    let count = match nvml.device_count() {
        Ok(count) => count,
        Err(e) => {
            problems.push(format!("NVML: cannot count the GPUs: {e}"));
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for index in 0..count {
        let device = match nvml.device_by_index(index) {
            Ok(device) => device,
            Err(e) => {
                problems.push(format!("NVML: GPU {index}: {e}"));
                continue;
            }
        };
        let mut value = |what: &str, r: Result<String, NvmlError>| match r {
            Ok(v) => v,
            Err(NvmlError::NotSupported) => String::new(),
            Err(e) => {
                problems.push(format!("NVML: GPU {index}: {what}: {e}"));
                String::new()
            }
        };
        let uuid = value("UUID", device.uuid());
        let model = value("name", device.name());
        let vbios = value("VBIOS version", device.vbios_version());
        let serial = value("serial", device.serial());
        let bus_id = value("PCI info", device.pci_info().map(|p| p.bus_id));
        let pci_address = sysfs_address(&bus_id).unwrap_or_default();
        if !bus_id.is_empty() && pci_address.is_empty() {
            problems.push(format!(
                "NVML: GPU {index}: PCI bus id {bus_id:?} not understood"
            ));
        }
        let pci = if pci_address.is_empty() {
            None
        } else {
            let link = root.join("bus/pci/devices").join(&pci_address);
            match pci_device_at(root, &link, problems) {
                Ok(None) => {
                    problems.push(format!("{}: absent", link.display()));
                    None
                }
                Ok(found) => found,
                Err(problem) => {
                    problems.push(problem);
                    None
                }
            }
        };
        out.push(GpuPath {
            index,
            uuid,
            pci_address,
            model,
            vbios,
            serial,
            pci,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvml_bus_ids_are_sysfs_addresses() {
        assert_eq!(
            sysfs_address("00000000:1B:00.0").as_deref(),
            Some("0000:1b:00.0")
        );
        assert_eq!(
            sysfs_address("0000:9a:00.0").as_deref(),
            Some("0000:9a:00.0")
        );
        assert_eq!(sysfs_address("garbage"), None);
    }
}
