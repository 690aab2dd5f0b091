//! The fleet's golden profile (docs/findings.md, "The golden profile"): 16 real `railscope
//! agent` processes, each on an 8-GPU HGX H100 node's sysfs tree with the NVML stand-in
//! answering the same GPUs (monitor-testkit's `hgx`), send their hardware path to a collector
//! as an operator runs it. One GPU runs at Gen4 x8, one NIC has older firmware, one node lacks
//! a NIC, one node is wired like PFN's servers: exactly four findings, nothing else; and
//! `GET /api/v1/nodes/{node}/hardware` shows the node's path against its class.

use std::{
    ffi::OsStr,
    io::{Read, Write},
    net::TcpStream,
    time::Duration,
};

use monitor_testkit::{
    CollectorProcess, FixtureAgent, HgxNode, Running, agent_binary_next_to, hgx, key_file,
    scratch_dir, wait_for,
};
use serde_json::Value;

const COLLECTOR: &str = env!("CARGO_BIN_EXE_railscope-collector");
const KEY_HEX: &str = "8899aabbccddeeff00112233445566778899aabbccddeeff0011223344556677";
const NODES: u32 = 16;

fn node_name(n: u32) -> String {
    format!("hgx-{n:02}")
}

fn findings(c: &CollectorProcess) -> Vec<Value> {
    c.json("/api/v1/findings")["findings"]
        .as_array()
        .unwrap()
        .clone()
}

/// (rule, node, device or GPU) of each finding, sorted.
fn places(found: &[Value]) -> Vec<(String, String, String)> {
    let mut out: Vec<_> = found
        .iter()
        .map(|f| {
            let what = f["device"].as_str().or(f["gpu"].as_str()).unwrap_or("");
            (
                f["rule"].as_str().unwrap().to_owned(),
                f["node"].as_str().unwrap().to_owned(),
                what.to_owned(),
            )
        })
        .collect();
    out.sort();
    out
}

/// Status line and body of a GET.
fn get(c: &CollectorProcess, path: &str) -> (String, String) {
    let port = c.url().rsplit(':').next().unwrap().parse::<u16>().unwrap();
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_owned(), body.to_owned())
}

#[test]
fn sixteen_real_agents_on_hgx_trees_with_four_hardware_faults_are_exactly_four_findings() {
    let dir = scratch_dir("golden-profile");
    let key = key_file(&dir, KEY_HEX);
    let config = dir.join("collector.toml");
    std::fs::write(&config, "[findings]\ntick-s = 1\n").unwrap();
    let c = CollectorProcess::command(COLLECTOR, &key, &dir.join("data"))
        .args([OsStr::new("--config"), config.as_os_str()])
        .args(["--sockets", "1"])
        .start();
    let _agents: Vec<Running> = (0..NODES)
        .map(|n| {
            let node = match n {
                3 => HgxNode::new(n).gpu_at_gen4_x8(5),
                6 => HgxNode::new(n).nic_with_old_firmware(2),
                9 => HgxNode::new(n).without_nic(7),
                12 => HgxNode::new(n).pfn_wired(),
                _ => HgxNode::new(n),
            };
            let here = dir.join(node_name(n));
            let tree = here.join("sys");
            node.write(&tree);
            let lib = node.standin(&here);
            FixtureAgent::new(&c.udp_addr().to_string(), &key, &tree)
                .node(&node_name(n))
                .nvml_lib(&lib)
                .cadence("1", "1")
                .spawn(agent_binary_next_to(COLLECTOR))
        })
        .collect();

    let expected = [
        ("device_missing", "hgx-09", ""),
        ("firmware_drift", "hgx-06", "mlx5_2"),
        ("pcie_downtrained", "hgx-03", "5"),
        ("topology_drift", "hgx-12", ""),
    ]
    .map(|(r, n, d)| (r.to_owned(), n.to_owned(), d.to_owned()));
    wait_for("the four findings", Duration::from_secs(90), || {
        (places(&findings(&c)).len() >= 4).then_some(())
    });
    // A few more passes (the profile is learnt again at most every 6): nothing else comes,
    // and nothing found was ended (every finding ever opened is listed).
    std::thread::sleep(Duration::from_secs(8));
    let found = findings(&c);
    assert_eq!(places(&found), expected, "{found:#?}");
    for f in &found {
        assert_eq!(f["severity"], "warning", "{f:#}");
        assert!(f["end"].is_null(), "{f:#}");
    }
    let of = |rule: &str| found.iter().find(|f| f["rule"] == rule).unwrap();
    assert_eq!(of("pcie_downtrained")["evidence"]["link"]["width"], 8);
    assert_eq!(
        of("firmware_drift")["evidence"]["fw_ver"],
        hgx::OLD_FIRMWARE
    );
    assert_eq!(
        of("firmware_drift")["evidence"]["class_fw_ver"]["value"],
        hgx::FIRMWARE
    );
    let missing = &of("device_missing")["evidence"];
    assert_eq!(missing["rdma_devices"]["value"], 7);
    assert_eq!(missing["rdma_devices"]["class"]["value"], 8);
    assert_eq!(missing["rdma_devices"]["class"]["held"], 15);
    assert_eq!(missing["active_ports"]["value"], 7);
    let pairs = of("topology_drift")["evidence"]["pairs"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(pairs.len(), 16, "{pairs:#?}");
    assert!(
        pairs
            .iter()
            .all(|p| p["distance"] == "NODE" && p["class_distance"] == "PIX")
    );

    // The PFN-wired node's hardware path: its matrix against its class's.
    let hw = c.json("/api/v1/nodes/hgx-12/hardware");
    assert_eq!(hw["class"]["gpu_model"], hgx::GPU_MODEL);
    assert_eq!(hw["class"]["nic_model"], hgx::HCA_TYPE);
    assert_eq!(hw["info"]["driver"], hgx::DRIVER);
    assert_eq!(hw["counts"]["gpus"], 8);
    assert_eq!(hw["gpus"].as_array().unwrap().len(), 8);
    assert_eq!(hw["rdma"][0]["device"], "mlx5_0");
    assert_eq!(hw["rdma"][0]["fw_ver"], hgx::FIRMWARE);
    assert_eq!(hw["gpus"][0]["vbios"], hgx::VBIOS);
    assert_eq!(hw["gpus"][0]["link"]["max_generation"], 5);
    assert_eq!(hw["class_profile"]["nodes"], 16);
    assert_eq!(hw["class_profile"]["gpus"]["value"], 8);
    assert_eq!(hw["distances"]["nics"][7], "mlx5_7");
    assert_eq!(hw["distances"]["node"][0][0], "NODE");
    assert_eq!(hw["distances"]["class"][0][0], "PIX");
    assert_eq!(hw["distances"]["node"][0][4], "SYS");
    assert_eq!(hw["distances"]["class"][0][4], "SYS");
    // A healthy node's matrix is its class's.
    let healthy = c.json("/api/v1/nodes/hgx-00/hardware");
    assert_eq!(healthy["distances"]["node"], healthy["distances"]["class"]);

    let (status, body) = get(&c, "/api/v1/nodes/node-999/hardware");
    assert!(status.contains(" 404 "), "{status}: {body}");
    let error: Value = serde_json::from_str(&body).unwrap();
    assert!(
        error["error"]
            .as_str()
            .unwrap()
            .contains("unknown node \"node-999\""),
        "{body}"
    );
}
