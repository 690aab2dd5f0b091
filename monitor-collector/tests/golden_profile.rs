//! The fleet's golden profile (docs/findings.md, "The golden profile"): 16 HGX H100 nodes
//! whose frames carry the hardware path (monitor-wire's names, through the agent's own
//! adaptive sampler: monitor-testkit's simulated fleet and its `sim_hardware` layout) into a
//! collector as an operator runs it. One GPU runs at Gen4 x8, one NIC has older firmware, one
//! node lacks a NIC, one node is wired like PFN's servers: exactly four findings, nothing
//! else; and `GET /api/v1/nodes/{node}/hardware` shows the node's path against its class.

use std::{
    ffi::OsStr,
    io::{Read, Write},
    net::TcpStream,
    time::Duration,
};

use monitor_testkit::{
    CollectorProcess, SimulatedFleet, key_file, key_from_hex, scratch_dir, sim_hardware, wait_for,
};
use serde_json::Value;

const COLLECTOR: &str = env!("CARGO_BIN_EXE_railscope-collector");
const KEY_HEX: &str = "8899aabbccddeeff00112233445566778899aabbccddeeff0011223344556677";
/// Ticks the fleet sends, 1 s apart and ending now: the adaptive sampler sends a stable
/// series every ~32 s, each series starting at its own phase within the first 64.
const TICKS: u64 = 120;
const OLD_FW: &str = "28.36.1010";

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
fn sixteen_hgx_nodes_with_four_hardware_faults_are_exactly_four_findings() {
    let dir = scratch_dir("golden-profile");
    let key = key_file(&dir, KEY_HEX);
    let config = dir.join("collector.toml");
    std::fs::write(&config, "[findings]\ntick-s = 1\n").unwrap();
    let c = CollectorProcess::command(COLLECTOR, &key, &dir.join("data"))
        .args([OsStr::new("--config"), config.as_os_str()])
        .args(["--sockets", "1"])
        .start();
    SimulatedFleet::builder(16)
        .job("slurm:7", 0..16)
        .adaptive(true)
        .ticks_before_now(TICKS)
        .hardware_path()
        .pcie_degraded(3, 5)
        .nic_firmware(6, 2, OLD_FW)
        .missing_nic(9, 7)
        .pfn_wired(12)
        .build(key_from_hex(KEY_HEX))
        .send_ticks(c.udp_addr(), TICKS)
        .unwrap();

    let expected = [
        ("device_missing", "node-009", ""),
        ("firmware_drift", "node-006", "mlx5_2"),
        ("pcie_downtrained", "node-003", "5"),
        ("topology_drift", "node-012", ""),
    ]
    .map(|(r, n, d)| (r.to_owned(), n.to_owned(), d.to_owned()));
    wait_for("the four findings", Duration::from_secs(30), || {
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
    assert_eq!(of("firmware_drift")["evidence"]["fw_ver"], OLD_FW);
    assert_eq!(
        of("firmware_drift")["evidence"]["class_fw_ver"]["value"],
        sim_hardware::FW_VER
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
    let hw = c.json("/api/v1/nodes/node-012/hardware");
    assert_eq!(hw["class"]["gpu_model"], sim_hardware::GPU_MODEL);
    assert_eq!(hw["class"]["nic_model"], sim_hardware::NIC_MODEL);
    assert_eq!(hw["counts"]["gpus"], 8);
    assert_eq!(hw["gpus"].as_array().unwrap().len(), 8);
    assert_eq!(hw["rdma"][0]["device"], "mlx5_0");
    assert_eq!(hw["rdma"][0]["fw_ver"], sim_hardware::FW_VER);
    assert_eq!(hw["class_profile"]["nodes"], 16);
    assert_eq!(hw["class_profile"]["gpus"]["value"], 8);
    assert_eq!(hw["distances"]["nics"][7], "mlx5_7");
    assert_eq!(hw["distances"]["node"][0][0], "NODE");
    assert_eq!(hw["distances"]["class"][0][0], "PIX");
    assert_eq!(hw["distances"]["node"][0][4], "SYS");
    assert_eq!(hw["distances"]["class"][0][4], "SYS");
    // A healthy node's matrix is its class's.
    let healthy = c.json("/api/v1/nodes/node-000/hardware");
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
