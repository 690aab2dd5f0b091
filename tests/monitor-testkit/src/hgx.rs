//! A sysfs tree of an 8-GPU HGX H100 node, for the hardware path's tests: four PCIe switches,
//! each under its own root port with two GPUs (Gen5 x16) and two ConnectX-7 NICs (`mlx5_N`,
//! `hca_type` MT4129, Gen5 x16, one InfiniBand port ACTIVE at 400 Gb/s); switches 0-1 on NUMA
//! node 0, 2-3 on NUMA node 1, as `lspci -tv` shows a DGX/HGX H100. The tree is laid out as
//! the kernel's is: the devices under `devices/pciDDDD:BB/<root port>/<switch upstream
//! port>/<downstream port>/<device>`, with `bus/pci/devices/ADDR` and `class/infiniband/DEV`
//! relative links to them, each NIC's `infiniband/mlx5_N` holding the port counters of the
//! mlx5 fixture tree (taken from a real adapter). [`HgxNode::standin_script`] is the NVML
//! stand-in's script of the same GPUs (their PCI addresses, links, VBIOS and serials).
//!
//! Variants, as operators meet them: one GPU trained at Gen4 x8, one NIC on older firmware,
//! one NIC missing (a node back from repair with seven), and PFN's wiring (twice the switches:
//! the GPUs of each pair under one switch and its NICs under another, each under its own root
//! port, so a GPU and its NIC talk through the CPU: `NODE` instead of `PIX`).

use std::{
    os::unix::fs::symlink,
    path::{Path, PathBuf},
};

use serde_json::{Value, json};

/// The NICs' firmware.
pub const FIRMWARE: &str = "28.39.1002";
/// The older firmware of [`HgxNode::nic_with_old_firmware`].
pub const OLD_FIRMWARE: &str = "28.36.1010";
pub const BOARD_ID: &str = "MT_0000000838";
pub const HCA_TYPE: &str = "MT4129";
pub const GPU_MODEL: &str = "NVIDIA H100 80GB HBM3";
pub const VBIOS: &str = "96.00.99.00.01";
pub const DRIVER: &str = "550.90.07";

/// The host bridge bus of each switch's root port (NUMA node 0: the first two).
const HOST_BRIDGES: [u32; 4] = [0x15, 0x3d, 0x95, 0xbd];
/// PFN's wiring: the bus of the extra switch's host bridge, above the switch's.
const PFN_OFFSET: u32 = 0x10;

/// One node's tree; see the module's documentation.
#[derive(Clone, Debug, Default)]
pub struct HgxNode {
    /// Tells nodes apart: the GPUs' UUIDs and serials and the NICs' GUIDs.
    node: u32,
    gpu_gen4_x8: Option<usize>,
    old_firmware_nic: Option<usize>,
    missing_nic: Option<usize>,
    pfn_wired: bool,
}

/// Where one device sits: its host bridge and the PCI addresses down to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    pub numa_node: u32,
    /// `pciDDDD:BB`.
    pub host_bridge: String,
    pub root_port: String,
    pub switch: String,
    pub downstream_port: String,
    pub address: String,
}

fn address(bus: u32, device: u32) -> String {
    format!("0000:{bus:02x}:{device:02x}.0")
}

impl HgxNode {
    /// Node number `node` (0-255) of a fleet, wired as shipped.
    pub fn new(node: u32) -> Self {
        Self {
            node,
            ..Self::default()
        }
    }

    /// GPU `gpu`'s link trained at Gen4 x8 (sysfs and NVML say so).
    pub fn gpu_at_gen4_x8(mut self, gpu: usize) -> Self {
        self.gpu_gen4_x8 = Some(gpu);
        self
    }

    /// NIC `nic` (`mlx5_<nic>`) on [`OLD_FIRMWARE`].
    pub fn nic_with_old_firmware(mut self, nic: usize) -> Self {
        self.old_firmware_nic = Some(nic);
        self
    }

    /// NIC `nic` absent: its PCI function and its RDMA device are not there.
    pub fn without_nic(mut self, nic: usize) -> Self {
        self.missing_nic = Some(nic);
        self
    }

    /// PFN's wiring: eight switches, GPUs and NICs never under the same one.
    pub fn pfn_wired(mut self) -> Self {
        self.pfn_wired = true;
        self
    }

    /// Where GPU `gpu` (0-7) sits.
    pub fn gpu_slot(&self, gpu: usize) -> Slot {
        self.slot(gpu / 2, true, gpu % 2)
    }

    /// Where NIC `nic` (0-7, `mlx5_<nic>`) sits.
    pub fn nic_slot(&self, nic: usize) -> Slot {
        self.slot(nic / 2, false, nic % 2)
    }

    /// Switch `switch` (0-3) holds NICs 2s, 2s+1 behind its downstream ports 0 and 1 and GPUs
    /// 2s, 2s+1 behind ports 2 and 3; wired as PFN's, the NICs have a switch of their own.
    fn slot(&self, switch: usize, gpu: bool, which: usize) -> Slot {
        let mut bridge = HOST_BRIDGES[switch];
        let mut port = if gpu { 2 + which } else { which } as u32;
        if self.pfn_wired && !gpu {
            bridge += PFN_OFFSET;
        }
        if self.pfn_wired {
            port = which as u32;
        }
        Slot {
            numa_node: (switch / 2) as u32,
            host_bridge: format!("pci0000:{bridge:02x}"),
            root_port: address(bridge, 1),
            switch: address(bridge + 1, 0),
            downstream_port: address(bridge + 2, port),
            address: address(bridge + 3 + port, 0),
        }
    }

    /// GPU `gpu`'s UUID.
    pub fn gpu_uuid(&self, gpu: usize) -> String {
        format!(
            "GPU-{:08x}-7d04-4e8b-9a61-0c5b2d7e8f{gpu:02x}",
            0x3f1c_9a00 + self.node
        )
    }

    /// NIC `nic`'s firmware.
    pub fn nic_firmware(&self, nic: usize) -> &'static str {
        if self.old_firmware_nic == Some(nic) {
            OLD_FIRMWARE
        } else {
            FIRMWARE
        }
    }

    /// The NICs present.
    pub fn nics(&self) -> impl Iterator<Item = usize> + '_ {
        (0..8).filter(|n| self.missing_nic != Some(*n))
    }

    /// GPU `gpu`'s link: (generation, width).
    fn gpu_link(&self, gpu: usize) -> (u32, u32) {
        if self.gpu_gen4_x8 == Some(gpu) {
            (4, 8)
        } else {
            (5, 16)
        }
    }

    /// Writes the tree under `root` (a fresh directory, the agent's `--sysfs`).
    pub fn write(&self, root: &Path) {
        for gpu in 0..8 {
            let slot = self.gpu_slot(gpu);
            let (generation, width) = self.gpu_link(gpu);
            self.pci_path(root, &slot, (generation, width), (0x10de, 0x2330, 0x030200));
        }
        for nic in self.nics() {
            let slot = self.nic_slot(nic);
            let dir = self.pci_path(root, &slot, (5, 16), (0x15b3, 0x1021, 0x020700));
            self.rdma_device(root, &dir, nic);
        }
    }

    /// Every bridge down to `slot`'s device and the device, with their attributes and
    /// `bus/pci/devices` links; returns the device's directory.
    fn pci_path(
        &self,
        root: &Path,
        slot: &Slot,
        (generation, width): (u32, u32),
        (vendor, device, class): (u32, u32, u32),
    ) -> PathBuf {
        let bridge = (0x8086, 0x352a, 0x060400);
        let mut dir = root.join("devices").join(&slot.host_bridge);
        let chain = [
            (&slot.root_port, (5, 16), bridge),
            (&slot.switch, (5, 16), (0x1000, 0xc030, 0x060400)),
            (&slot.downstream_port, (5, 16), (0x1000, 0xc030, 0x060400)),
            (&slot.address, (generation, width), (vendor, device, class)),
        ];
        let speed = |g: u32| {
            let gts = ["2.5", "5.0", "8.0", "16.0", "32.0", "64.0"][g as usize - 1];
            format!("{gts} GT/s PCIe")
        };
        for (addr, (generation, width), (vendor, device, class)) in chain {
            dir = dir.join(addr);
            std::fs::create_dir_all(&dir).unwrap();
            for (file, text) in [
                ("numa_node", slot.numa_node.to_string()),
                ("current_link_speed", speed(generation)),
                ("max_link_speed", speed(5)),
                ("current_link_width", width.to_string()),
                ("max_link_width", "16".to_owned()),
                ("vendor", format!("0x{vendor:04x}")),
                ("device", format!("0x{device:04x}")),
                ("class", format!("0x{class:06x}")),
            ] {
                std::fs::write(dir.join(file), format!("{text}\n")).unwrap();
            }
            let links = root.join("bus/pci/devices");
            std::fs::create_dir_all(&links).unwrap();
            let link = links.join(addr);
            if !link.exists() {
                // bus/pci/devices/ADDR -> ../../../devices/pci.../ADDR
                let target = Path::new("../../../devices")
                    .join(dir.strip_prefix(root.join("devices")).unwrap());
                symlink(target, link).unwrap();
            }
        }
        dir
    }

    /// `mlx5_<nic>` under the NIC's PCI function `pci_dir`, linked from `class/infiniband`.
    fn rdma_device(&self, root: &Path, pci_dir: &Path, nic: usize) {
        let name = format!("mlx5_{nic}");
        let dir = pci_dir.join("infiniband").join(&name);
        crate::copy_tree(
            &crate::sysfs_fixture("mlx5").join("class/infiniband/mlx5_0"),
            &dir,
        );
        let port = dir.join("ports/1");
        for (file, text) in [
            ("state", "4: ACTIVE"),
            ("phys_state", "5: LinkUp"),
            ("rate", "400 Gb/sec (4X NDR)"),
            ("link_layer", "InfiniBand"),
        ] {
            std::fs::write(port.join(file), format!("{text}\n")).unwrap();
        }
        for (file, text) in [
            ("fw_ver", self.nic_firmware(nic).to_owned()),
            ("board_id", BOARD_ID.to_owned()),
            ("hca_type", HCA_TYPE.to_owned()),
            ("hw_rev", "0x0".to_owned()),
            (
                "node_guid",
                format!("946d:ae03:00{:02x}:{nic:02x}a0", self.node & 0xff),
            ),
        ] {
            std::fs::write(dir.join(file), format!("{text}\n")).unwrap();
        }
        // As the kernel links it: ../../../ADDR from .../ADDR/infiniband/mlx5_N.
        let address = pci_dir.file_name().unwrap();
        symlink(Path::new("../../..").join(address), dir.join("device")).unwrap();
        let class = root.join("class/infiniband");
        std::fs::create_dir_all(&class).unwrap();
        let target =
            Path::new("../../devices").join(dir.strip_prefix(root.join("devices")).unwrap());
        symlink(target, class.join(&name)).unwrap();
    }

    /// The NVML stand-in's script for these GPUs (docs/nvml-standin.md): each with its PCI
    /// address, link, VBIOS and serial, idle and steady.
    pub fn standin_script(&self) -> Value {
        let gpus: Vec<Value> = (0..8)
            .map(|gpu| {
                let (generation, width) = self.gpu_link(gpu);
                json!({
                    "name": GPU_MODEL,
                    "uuid": self.gpu_uuid(gpu),
                    "pci_bus_id": self.gpu_slot(gpu).address,
                    "vbios_version": VBIOS,
                    "serial": format!("16549220{:03}{gpu:02}", self.node),
                    "nvlink_links": 18,
                    "steps": [{
                        "gpu_util_pct": 0, "temperature_c": 33, "power_mw": 71000,
                        "pcie_link_gen": generation, "pcie_link_width": width,
                    }],
                })
            })
            .collect();
        json!({
            "driver_version": DRIVER,
            "defaults": {
                "memory_total_bytes": 85520809984u64, "memory_used_bytes": 0,
                "sm_clock_mhz": 345, "mem_clock_mhz": 2619,
                "pcie_link_max_gen": 5, "pcie_link_max_width": 16,
            },
            "gpus": gpus,
        })
    }

    /// The stand-in library copied into `dir` with [`Self::standin_script`] (as
    /// [`crate::standin_with_script`] does with the shipped script); returns the library.
    pub fn standin(&self, dir: &Path) -> PathBuf {
        let lib = crate::standin_with_script(dir);
        std::fs::write(
            dir.join("nvml-standin.json"),
            serde_json::to_string_pretty(&self.standin_script()).unwrap(),
        )
        .unwrap();
        lib
    }
}
