//! Where a device sits on the PCIe tree, as the agent sends it (the `numa_node`, `switch` and
//! `root_port` labels of `railscope_gpu_pci_info` and `railscope_rdma_device_info`), and the
//! distance between two devices: what `railscope topology` prints and what the collector's
//! golden profile compares. Shared so both sides rank a GPU–NIC pair the same way.
//!
//! The distances are `nvidia-smi topo -m`'s, as far as the PCIe tree tells them: traffic
//! between a GPU and a NIC under one switch turns round inside that switch; under one root
//! port it climbs through the switches but not into the CPU; otherwise it crosses the CPU's
//! host bridges, and across NUMA nodes also the link between the sockets.

/// A device's place on the PCIe tree.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PciPlace {
    /// The upstream port of the PCIe switch the device hangs off; empty on a root port.
    pub switch: String,
    /// The root port the device's branch starts at; empty without a PCI parent.
    pub root_port: String,
    /// The NUMA node of the device; `None` where the kernel does not say (`-1`).
    pub numa_node: Option<u32>,
}

/// How far apart two devices are on the PCIe tree, nearest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Distance {
    /// Under one PCIe switch (`PIX`).
    Switch,
    /// Under one root port, through more than one switch (`PXB`).
    RootPort,
    /// Under different root ports of one NUMA node: through the CPU (`NODE`).
    NumaNode,
    /// Across NUMA nodes: through the sockets' link (`SYS`).
    System,
    /// Not known: no switch or root port shared, and the NUMA node of one of them not known
    /// (`numa_node` -1, common on single-socket servers and VMs; no PCI parent at all). Read
    /// as `SYS`, it would claim a path across the sockets that may not exist, so nothing is
    /// judged on it.
    Unknown,
}

impl Distance {
    /// The distance between two devices.
    pub fn between(a: &PciPlace, b: &PciPlace) -> Self {
        if !a.switch.is_empty() && a.switch == b.switch {
            Self::Switch
        } else if !a.root_port.is_empty() && a.root_port == b.root_port {
            Self::RootPort
        } else {
            match (a.numa_node, b.numa_node) {
                (Some(x), Some(y)) if x == y => Self::NumaNode,
                (Some(_), Some(_)) => Self::System,
                _ => Self::Unknown,
            }
        }
    }

    /// `nvidia-smi topo -m`'s name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Switch => "PIX",
            Self::RootPort => "PXB",
            Self::NumaNode => "NODE",
            Self::System => "SYS",
            Self::Unknown => "unknown",
        }
    }

    /// The distance named by [`Self::as_str`].
    pub fn parse(text: &str) -> Option<Self> {
        [
            Self::Switch,
            Self::RootPort,
            Self::NumaNode,
            Self::System,
            Self::Unknown,
        ]
        .into_iter()
        .find(|d| d.as_str() == text)
    }

    /// Whether the distance is known (rules judge only known ones).
    pub fn is_known(self) -> bool {
        self != Self::Unknown
    }
}

impl std::fmt::Display for Distance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(switch: &str, root_port: &str, numa_node: Option<u32>) -> PciPlace {
        PciPlace {
            switch: switch.into(),
            root_port: root_port.into(),
            numa_node,
        }
    }

    #[test]
    fn distance_is_the_nearest_shared_level() {
        let gpu = place("0000:18:00.0", "0000:17:01.0", Some(0));
        assert_eq!(Distance::between(&gpu, &gpu.clone()), Distance::Switch);
        let other_switch = place("0000:1a:00.0", "0000:17:01.0", Some(0));
        assert_eq!(Distance::between(&gpu, &other_switch), Distance::RootPort);
        let other_root = place("0000:3a:00.0", "0000:39:01.0", Some(0));
        assert_eq!(Distance::between(&gpu, &other_root), Distance::NumaNode);
        let other_socket = place("0000:9a:00.0", "0000:99:01.0", Some(1));
        assert_eq!(Distance::between(&gpu, &other_socket), Distance::System);
    }

    #[test]
    fn unknown_places_are_unknown_not_across_the_sockets() {
        let rxe_on_veth = PciPlace::default();
        assert_eq!(
            Distance::between(&rxe_on_veth, &rxe_on_veth),
            Distance::Unknown
        );
        // numa_node -1 (a single-socket server): across root ports, not known to be SYS.
        let gpu = place("", "0000:17:01.0", None);
        let nic = place("", "0000:39:01.0", None);
        assert_eq!(Distance::between(&gpu, &nic), Distance::Unknown);
        assert_eq!(
            Distance::between(&gpu, &place("", "0000:39:01.0", Some(0))),
            Distance::Unknown
        );
        // A shared root port is known whatever the NUMA node.
        assert_eq!(
            Distance::between(&gpu, &place("", "0000:17:01.0", None)),
            Distance::RootPort
        );
        assert!(!Distance::Unknown.is_known() && Distance::System.is_known());
        for d in [
            Distance::Switch,
            Distance::RootPort,
            Distance::NumaNode,
            Distance::System,
            Distance::Unknown,
        ] {
            assert_eq!(Distance::parse(d.as_str()), Some(d));
        }
    }
}
