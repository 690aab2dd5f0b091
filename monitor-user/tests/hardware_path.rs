//! The hardware path on an 8-GPU HGX H100 node (monitor_testkit::hgx: a sysfs tree laid out
//! as the kernel's, four PCIe switches with two GPUs and two ConnectX-7 each, and the NVML
//! stand-in answering the same GPUs' PCI addresses; not a GPU): what `railscope topology`
//! prints, and what a real `railscope agent` sends, as `railscope listen` decodes it.

use std::{collections::BTreeMap, path::Path, process::Command, thread, time::Duration};

use monitor_testkit::{
    FixtureAgent, HgxNode, KEY_HEX, free_udp_port, hgx, key_file, scratch_dir, spawn_json_listener,
};
use monitor_wire::names::metric;
use serde_json::Value;

const RAILSCOPE: &str = env!("CARGO_BIN_EXE_railscope");

/// `railscope topology --sysfs TREE --nvml-lib LIB [extra]`: (stdout, stderr).
fn topology(tree: &Path, lib: &Path, extra: &[&str]) -> (String, String) {
    let out = Command::new(RAILSCOPE)
        .arg("topology")
        .arg("--sysfs")
        .arg(tree)
        .arg("--nvml-lib")
        .arg(lib)
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// The node `node` written into a scratch directory: (tree, stand-in library).
fn written(name: &str, node: &HgxNode) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = scratch_dir(name);
    let tree = dir.join("sys");
    node.write(&tree);
    let lib = node.standin(&dir);
    (tree, lib)
}

/// The distance matrix of `topology --json`: (gpu, device) -> code.
fn matrix(json: &Value) -> BTreeMap<(u64, String), String> {
    json["distances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                (
                    d["gpu"].as_u64().unwrap(),
                    d["device"].as_str().unwrap().to_owned(),
                ),
                d["distance"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn topology_shows_pix_under_each_switch_and_sys_across_the_sockets() {
    let node = HgxNode::new(1);
    let (tree, lib) = written("topology-hgx", &node);
    let (out, err) = topology(&tree, &lib, &["--json"]);
    assert_eq!(err, "", "nothing unreadable on this node");
    let json: Value = serde_json::from_str(&out).unwrap();
    let distances = matrix(&json);
    assert_eq!(distances.len(), 64);
    for gpu in 0..8u64 {
        for nic in 0..8u64 {
            // GPUs 2s, 2s+1 and NICs 2s, 2s+1 share switch s; switches 0-1 are NUMA node 0.
            let expected = if gpu / 2 == nic / 2 {
                "PIX"
            } else if gpu / 4 == nic / 4 {
                "NODE"
            } else {
                "SYS"
            };
            assert_eq!(
                distances[&(gpu, format!("mlx5_{nic}"))],
                expected,
                "GPU{gpu} mlx5_{nic}"
            );
        }
    }
    let gpu5 = &json["gpus"][5];
    let slot = node.gpu_slot(5);
    assert_eq!(gpu5["pci"], slot.address.as_str());
    assert_eq!(gpu5["switch"], slot.switch.as_str());
    assert_eq!(gpu5["root_port"], slot.root_port.as_str());
    assert_eq!(gpu5["numa_node"], 1);
    assert_eq!(gpu5["model"], hgx::GPU_MODEL);
    assert_eq!(gpu5["vbios"], hgx::VBIOS);
    assert_eq!(gpu5["link"]["generation"], 5);
    assert_eq!(gpu5["link"]["width_lanes"], 16);
    let nic2 = &json["rdma_devices"][2];
    assert_eq!(nic2["name"], "mlx5_2");
    assert_eq!(nic2["pci"], node.nic_slot(2).address.as_str());
    assert_eq!(nic2["fw_ver"], hgx::FIRMWARE);
    assert_eq!(nic2["hca_type"], hgx::HCA_TYPE);
    assert_eq!(nic2["board_id"], hgx::BOARD_ID);
    assert_eq!(nic2["ports"][0]["state"], "ACTIVE");
    assert_eq!(nic2["ports"][0]["link_layer"], "InfiniBand");
    assert_eq!(json["node"]["gpus"], 8);
    assert_eq!(json["node"]["rdma_devices"], 8);
    assert_eq!(json["node"]["active_ports"], 8);
    assert_eq!(json["node"]["driver"], hgx::DRIVER);

    // The same as text: a row per GPU as `nvidia-smi topo -m` prints it, and the legend.
    let (text, _) = topology(&tree, &lib, &[]);
    let row = |gpu: &str| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(gpu) && l.contains("PIX"))
            .unwrap_or_else(|| panic!("no matrix row {gpu}:\n{text}"))
            .split_whitespace()
            .skip(1)
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(row("GPU0"), "PIX PIX NODE NODE SYS SYS SYS SYS", "{text}");
    assert_eq!(row("GPU7"), "SYS SYS SYS SYS NODE NODE PIX PIX", "{text}");
    assert!(text.contains("PIX   under one PCIe switch"), "{text}");
    assert!(
        text.contains(&format!("GPU5  {}  1", slot.address)),
        "{text}"
    );
}

#[test]
fn topology_of_a_pfn_wired_node_has_no_pix_pair_and_shows_what_differs() {
    let node = HgxNode::new(2)
        .pfn_wired()
        .gpu_at_gen4_x8(3)
        .nic_with_old_firmware(4)
        .without_nic(6);
    let (tree, lib) = written("topology-pfn", &node);
    let (out, err) = topology(&tree, &lib, &["--json"]);
    assert_eq!(err, "");
    let json: Value = serde_json::from_str(&out).unwrap();
    let distances = matrix(&json);
    assert_eq!(distances.len(), 8 * 7, "mlx5_6 is missing");
    for ((gpu, device), code) in &distances {
        let nic: u64 = device.trim_start_matches("mlx5_").parse().unwrap();
        let expected = if gpu / 4 == nic / 4 { "NODE" } else { "SYS" };
        assert_eq!(code, expected, "GPU{gpu} {device}");
    }
    // The GPU and NIC of one pair: each on its own switch under its own root port.
    assert_ne!(
        json["gpus"][0]["root_port"],
        json["rdma_devices"][0]["root_port"]
    );
    let gpu3 = &json["gpus"][3];
    assert_eq!(gpu3["link"]["generation"], 4);
    assert_eq!(gpu3["link"]["width_lanes"], 8);
    assert_eq!(gpu3["link"]["max_generation"], 5);
    let nic4 = json["rdma_devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "mlx5_4")
        .unwrap();
    assert_eq!(nic4["fw_ver"], hgx::OLD_FIRMWARE);
    assert_eq!(json["node"]["rdma_devices"], 7);
    assert_eq!(json["node"]["active_ports"], 7);
}

#[test]
fn topology_names_what_it_cannot_read_and_prints_the_rest() {
    let node = HgxNode::new(3);
    let (tree, lib) = written("topology-broken", &node);
    let nic1 = node.nic_slot(1);
    let dir = tree
        .join("devices")
        .join(&nic1.host_bridge)
        .join(&nic1.root_port)
        .join(&nic1.switch)
        .join(&nic1.downstream_port)
        .join(&nic1.address);
    std::fs::remove_file(dir.join("max_link_speed")).unwrap();
    let (out, err) = topology(&tree, &lib, &[]);
    assert_eq!(
        err.trim(),
        format!(
            "hardware path: {}: No such file or directory (os error 2)",
            dir.join("max_link_speed").display()
        )
    );
    let row = out
        .lines()
        .find(|l| l.starts_with("mlx5_1 "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(row.contains("Gen5 x16  Gen? x16"), "{row}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("GPU0") && l.contains("PIX"))
    );
}

/// The samples of the frames `railscope listen --json` printed, by series name.
fn samples(frames: &str) -> Vec<Value> {
    frames
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .flat_map(|f| f["samples"].as_array().cloned().unwrap_or_default())
        .collect()
}

fn last_value(sample: &Value) -> f64 {
    let point = sample["points"].as_array().unwrap().last().unwrap();
    point["value"].as_f64().or(point["mean"].as_f64()).unwrap()
}

#[test]
fn the_agent_sends_each_device_s_place_firmware_and_the_node_s_counts() {
    let node = HgxNode::new(4).nic_with_old_firmware(5).without_nic(7);
    let dir = scratch_dir("hwpath-agent");
    let tree = dir.join("sys");
    node.write(&tree);
    let lib = node.standin(&dir);
    let key = key_file(&dir, KEY_HEX);
    let port = free_udp_port();
    let listener = spawn_json_listener(RAILSCOPE, port, &key);
    thread::sleep(Duration::from_millis(300));
    let agent = FixtureAgent::new(&format!("127.0.0.1:{port}"), &key, &tree)
        .node("hgx-04")
        .nvml_lib(&lib)
        .cadence("0.3", "1")
        .spawn(RAILSCOPE);
    thread::sleep(Duration::from_secs(4));
    let (agent_ok, _, agent_err) = agent.interrupt();
    thread::sleep(Duration::from_millis(300));
    let (_, frames, _) = listener.interrupt();
    assert!(agent_ok, "{agent_err}");
    assert!(
        !agent_err
            .lines()
            .any(|l| l.contains("WARN") && l.contains("hardware path:")),
        "nothing unreadable on this node: {agent_err}"
    );
    let samples = samples(&frames);
    let named =
        |name: &str| -> Vec<&Value> { samples.iter().filter(|s| s["name"] == name).collect() };

    let gpu_info = named(metric::GPU_PCI_INFO);
    let gpu2 = gpu_info
        .iter()
        .find(|s| s["labels"]["gpu"] == "2")
        .unwrap_or_else(|| panic!("no GPU 2 info: {gpu_info:?}"));
    let slot = node.gpu_slot(2);
    for (label, value) in [
        ("uuid", node.gpu_uuid(2)),
        ("pci", slot.address.clone()),
        ("numa_node", "0".into()),
        ("switch", slot.switch.clone()),
        ("root_port", slot.root_port.clone()),
        ("model", hgx::GPU_MODEL.into()),
        ("vbios", hgx::VBIOS.into()),
        ("serial", "1654922000402".into()),
    ] {
        assert_eq!(gpu2["labels"][label], value.as_str(), "{label}: {gpu2}");
    }
    assert_eq!(last_value(gpu2), 1.0);

    let nic_info = named(metric::RDMA_DEVICE_INFO);
    let devices: std::collections::BTreeSet<&str> = nic_info
        .iter()
        .filter_map(|s| s["labels"]["device"].as_str())
        .collect();
    assert_eq!(devices.len(), 7, "{devices:?}");
    let nic5 = nic_info
        .iter()
        .find(|s| s["labels"]["device"] == "mlx5_5")
        .unwrap();
    let slot = node.nic_slot(5);
    for (label, value) in [
        ("pci", slot.address.as_str()),
        ("numa_node", "1"),
        ("switch", slot.switch.as_str()),
        ("root_port", slot.root_port.as_str()),
        ("fw_ver", hgx::OLD_FIRMWARE),
        ("board_id", hgx::BOARD_ID),
        ("hca_type", hgx::HCA_TYPE),
        ("node_guid", "946d:ae03:0004:05a0"),
    ] {
        assert_eq!(nic5["labels"][label], value, "{label}: {nic5}");
    }
    for (name, value) in [
        (metric::RDMA_PCIE_LINK_GENERATION, 5.0),
        (metric::RDMA_PCIE_LINK_MAX_GENERATION, 5.0),
        (metric::RDMA_PCIE_LINK_WIDTH_LANES, 16.0),
        (metric::RDMA_PCIE_LINK_MAX_WIDTH_LANES, 16.0),
    ] {
        let of_nic5 = named(name)
            .into_iter()
            .find(|s| s["labels"]["device"] == "mlx5_5")
            .unwrap_or_else(|| panic!("{name} of mlx5_5 never sent"));
        assert_eq!(last_value(of_nic5), value, "{name}");
    }
    let node_value = |name: &str| {
        last_value(
            named(name)
                .last()
                .unwrap_or_else(|| panic!("{name} never sent")),
        )
    };
    assert_eq!(node_value(metric::NODE_GPUS), 8.0);
    assert_eq!(node_value(metric::NODE_RDMA_DEVICES), 7.0);
    assert_eq!(node_value(metric::NODE_ACTIVE_PORTS), 7.0);
    let class = named(metric::NODE_HARDWARE_INFO);
    let class = class.last().unwrap();
    assert_eq!(class["labels"]["driver"], hgx::DRIVER);
    assert_eq!(class["labels"]["gpu_model"], hgx::GPU_MODEL);
    assert_eq!(class["labels"]["nic_model"], hgx::HCA_TYPE);
    assert_ne!(class["labels"]["kernel"], "");
    // The IB source reads the same tree's ports.
    assert!(
        named("railscope_ib_port_xmit_bytes_total")
            .iter()
            .any(|s| s["labels"]["device"] == "mlx5_6"),
        "no IB counters from the HGX tree"
    );
    // With every flush, like the agent's version: more than one frame carries them.
    assert!(named(metric::NODE_GPUS).len() >= 2, "sent once only");
}
