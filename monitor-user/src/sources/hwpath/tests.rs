use std::{fs, os::unix::fs::symlink, path::PathBuf};

use monitor_wire::pci::{Distance, PciPlace};

use super::*;

/// A scratch sysfs tree of its own for each test.
struct Tree(PathBuf);

impl Tree {
    fn new(name: &str) -> Self {
        let root =
            std::env::temp_dir().join(format!("railscope-hwpath-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("bus/pci/devices")).unwrap();
        fs::create_dir_all(root.join("class/infiniband")).unwrap();
        Self(root)
    }

    /// A PCI function at `devices/<path>` (host bridge first), with its attributes, linked
    /// from `bus/pci/devices`.
    fn pci(&self, path: &str, numa: i32, speed: &str, width: u32) -> PathBuf {
        let dir = self.0.join("devices").join(path);
        fs::create_dir_all(&dir).unwrap();
        for (file, text) in [
            ("numa_node", numa.to_string()),
            ("current_link_speed", speed.to_owned()),
            ("max_link_speed", "32.0 GT/s PCIe".to_owned()),
            ("current_link_width", width.to_string()),
            ("max_link_width", "16".to_owned()),
        ] {
            fs::write(dir.join(file), format!("{text}\n")).unwrap();
        }
        let address = dir.file_name().unwrap();
        symlink(&dir, self.0.join("bus/pci/devices").join(address)).unwrap();
        dir
    }

    /// An RDMA device `name` under the PCI function at `pci` (None: no `device` link).
    fn rdma(&self, name: &str, pci: Option<&PathBuf>, state: &str) -> PathBuf {
        let dir = self.0.join("class/infiniband").join(name);
        fs::create_dir_all(dir.join("ports/1")).unwrap();
        fs::write(dir.join("ports/1/state"), format!("{state}\n")).unwrap();
        fs::write(dir.join("ports/1/link_layer"), "InfiniBand\n").unwrap();
        fs::write(dir.join("fw_ver"), "28.39.1002\n").unwrap();
        fs::write(dir.join("hca_type"), "MT4129\n").unwrap();
        if let Some(pci) = pci {
            symlink(pci, dir.join("device")).unwrap();
        }
        dir
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn place(switch: &str, root_port: &str, numa_node: Option<u32>) -> PciPlace {
    PciPlace {
        switch: switch.into(),
        root_port: root_port.into(),
        numa_node,
    }
}

#[test]
fn a_device_under_a_switch_names_the_switch_s_upstream_port_and_its_root_port() {
    let tree = Tree::new("switch");
    let nic = tree.pci(
        "pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0",
        0,
        "32.0 GT/s PCIe",
        16,
    );
    let on_root_port = tree.pci(
        "pci0000:95/0000:95:01.0/0000:96:00.0",
        1,
        "16.0 GT/s PCIe",
        8,
    );
    tree.rdma("mlx5_0", Some(&nic), "4: ACTIVE");
    tree.rdma("mlx5_1", Some(&on_root_port), "1: DOWN");
    let path = HardwarePath::read(&tree.0, None);
    assert_eq!(path.problems, Vec::<String>::new());
    let pci = |i: usize| path.rdma[i].pci.clone().unwrap();
    assert_eq!(pci(0).address, "0000:18:00.0");
    assert_eq!(pci(0).place, place("0000:16:00.0", "0000:15:01.0", Some(0)));
    assert_eq!(
        pci(0).link,
        PciLink {
            generation: Some(5),
            max_generation: Some(5),
            width_lanes: Some(16),
            max_width_lanes: Some(16)
        }
    );
    assert_eq!(pci(1).place, place("", "0000:95:01.0", Some(1)));
    assert_eq!(pci(1).link.generation, Some(4));
    assert_eq!(pci(1).link.width_lanes, Some(8));
    assert_eq!(path.node.rdma_devices, 2);
    assert_eq!(path.node.active_ports, 1);
    assert_eq!(path.node.nic_model, "MT4129");
    assert_eq!(path.node.gpus, None);
    assert_eq!(
        Distance::between(&pci(0).place, &pci(1).place),
        Distance::System
    );
}

/// Azure's GPU VMs (Hyper-V): each passed-through function has a PCI domain and host bridge
/// of its own under the VMBus device, as the kernel's `pci-hyperv` lays them out, and a
/// virtual function's link speed reads "Unknown" (its width 0).
#[test]
fn a_hyper_v_device_under_the_vmbus_has_its_address_and_unknown_link_without_a_problem() {
    let tree = Tree::new("hyperv");
    let vmbus = "LNXSYSTM:00/LNXSYBUS:00/ACPI0004:00/VMBUS:00";
    let nic = tree.pci(
        &format!("{vmbus}/00000041-0101-0000-3130-444531303244/pci0101:00/0101:00:00.0"),
        0,
        "Unknown",
        0,
    );
    tree.rdma("mlx5_0", Some(&nic), "4: ACTIVE");
    let path = HardwarePath::read(&tree.0, None);
    assert_eq!(path.problems, Vec::<String>::new());
    let pci = path.rdma[0].pci.clone().expect("the NIC's PCI function");
    assert_eq!(pci.address, "0101:00:00.0");
    assert_eq!(pci.place, place("", "", Some(0)));
    assert_eq!(pci.link.generation, None);
    assert_eq!(pci.link.width_lanes, None);
    assert_eq!(pci.link.max_generation, Some(5));
    assert_eq!(pci.link.max_width_lanes, Some(16));
}

#[test]
fn a_missing_or_unreadable_attribute_costs_only_its_own_value_and_is_named() {
    let tree = Tree::new("attributes");
    let nic = tree.pci(
        "pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0",
        0,
        "32.0 GT/s PCIe",
        16,
    );
    fs::remove_file(nic.join("max_link_speed")).unwrap();
    // Unreadable: a directory where the attribute should be.
    fs::remove_file(nic.join("numa_node")).unwrap();
    fs::create_dir(nic.join("numa_node")).unwrap();
    fs::write(nic.join("current_link_width"), "lots\n").unwrap();
    tree.rdma("mlx5_0", Some(&nic), "4: ACTIVE");
    let path = HardwarePath::read(&tree.0, None);
    let pci = path.rdma[0].pci.clone().unwrap();
    assert_eq!(pci.place, place("0000:16:00.0", "0000:15:01.0", None));
    assert_eq!(pci.link.generation, Some(5));
    assert_eq!(pci.link.max_generation, None);
    assert_eq!(pci.link.width_lanes, None);
    assert_eq!(pci.link.max_width_lanes, Some(16));
    assert_eq!(path.problems.len(), 3, "{:?}", path.problems);
    for (problem, file) in
        path.problems
            .iter()
            .zip(["numa_node", "max_link_speed", "current_link_width"])
    {
        assert!(
            problem.starts_with(&nic.join(file).display().to_string()),
            "{problem}"
        );
        assert!(!problem.contains('\n'));
    }
    // What could be read is still sent; what could not is not.
    let names: Vec<String> = path
        .series()
        .iter()
        .map(|(s, _)| s.name.to_string())
        .collect();
    assert!(names.contains(&metric::RDMA_PCIE_LINK_GENERATION.to_owned()));
    assert!(!names.contains(&metric::RDMA_PCIE_LINK_MAX_GENERATION.to_owned()));
    let info = path
        .series()
        .into_iter()
        .find(|(s, _)| s.name.as_ref() == metric::RDMA_DEVICE_INFO)
        .unwrap()
        .0;
    assert_eq!(info.labels.get("numa_node"), Some("-1"));
    assert_eq!(info.labels.get("switch"), Some("0000:16:00.0"));
}

#[test]
fn soft_roce_on_a_veth_has_no_pci_parent_and_no_problem() {
    let tree = Tree::new("rxe");
    let rxe = tree.rdma("rxe0", None, "4: ACTIVE");
    fs::write(rxe.join("parent"), "veth0\n").unwrap();
    fs::create_dir_all(tree.0.join("devices/virtual/net/veth0")).unwrap();
    fs::create_dir_all(tree.0.join("class/net")).unwrap();
    symlink(
        tree.0.join("devices/virtual/net/veth0"),
        tree.0.join("class/net/veth0"),
    )
    .unwrap();
    let path = HardwarePath::read(&tree.0, None);
    assert_eq!(path.problems, Vec::<String>::new());
    assert_eq!(path.rdma[0].pci, None);
    let info = path
        .series()
        .into_iter()
        .find(|(s, _)| s.name.as_ref() == metric::RDMA_DEVICE_INFO)
        .unwrap()
        .0;
    // What is unknown is left out, not sent empty (a TSDB holds no empty label).
    let labels: Vec<(&str, &str)> = info.labels.iter().collect();
    assert!(labels.iter().all(|(_, v)| !v.is_empty()), "{labels:?}");
    assert!(info.labels.get("pci").is_none(), "{labels:?}");
    assert!(info.labels.get("root_port").is_none(), "{labels:?}");
    assert!(labels.contains(&("numa_node", "-1")), "{labels:?}");
}

#[test]
fn rxe_on_a_pci_nic_takes_its_netdev_s_pci_function() {
    let tree = Tree::new("rxe-virtio");
    let nic = tree.pci(
        "pci0000:00/0000:00:02.0/0000:01:00.0",
        0,
        "2.5 GT/s PCIe",
        1,
    );
    fs::create_dir_all(nic.join("virtio1/net/eth0")).unwrap();
    fs::create_dir_all(tree.0.join("class/net")).unwrap();
    symlink(nic.join("virtio1/net/eth0"), tree.0.join("class/net/eth0")).unwrap();
    symlink(nic.join("virtio1"), nic.join("virtio1/net/eth0/device")).unwrap();
    let rxe = tree.rdma("rxe0", None, "4: ACTIVE");
    fs::write(rxe.join("parent"), "eth0\n").unwrap();
    let path = HardwarePath::read(&tree.0, None);
    assert_eq!(path.problems, Vec::<String>::new());
    let pci = path.rdma[0].pci.clone().unwrap();
    assert_eq!(pci.address, "0000:01:00.0");
    assert_eq!(pci.place, place("", "0000:00:02.0", Some(0)));
    assert_eq!(pci.link.generation, Some(1));
}

#[test]
fn a_path_that_loops_is_one_problem_and_the_other_devices_are_read() {
    let tree = Tree::new("loop");
    let nic = tree.pci(
        "pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0",
        0,
        "32.0 GT/s PCIe",
        16,
    );
    tree.rdma("mlx5_0", Some(&nic), "4: ACTIVE");
    let looping = tree.rdma("mlx5_1", None, "4: ACTIVE");
    symlink(looping.join("device-b"), looping.join("device")).unwrap();
    symlink(looping.join("device"), looping.join("device-b")).unwrap();
    let path = HardwarePath::read(&tree.0, None);
    assert_eq!(path.problems.len(), 1, "{:?}", path.problems);
    assert!(
        path.problems[0].starts_with(&format!(
            "{}: cannot resolve: ",
            looping.join("device").display()
        )),
        "{}",
        path.problems[0]
    );
    assert!(path.rdma[0].pci.is_some());
    assert_eq!(path.rdma[1].pci, None);
    assert_eq!(path.rdma[1].fw_ver, "28.39.1002");
    assert_eq!(path.node.active_ports, 2);
    // Reported once, not at every read; again once it went away and came back.
    let mut log = ProblemLog::default();
    assert_eq!(log.report(&path.problems).len(), 1);
    assert_eq!(log.report(&path.problems).len(), 0);
    assert_eq!(log.report(&[]).len(), 0);
    assert_eq!(log.report(&path.problems).len(), 1);
}
