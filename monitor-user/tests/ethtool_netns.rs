//! RoCE's Ethernet side on this host: a network namespace holding one end of a veth pair,
//! a sysfs tree whose soft-RoCE device `rxe0` sits on that veth (its `parent`, as rxe's
//! sysfs names it), and a real `railscope agent` run in the namespace (`ip netns exec`)
//! sending to `railscope listen` there. Traffic is sent over the veth; once it has stopped,
//! every statistic `ethtool -S` prints for the veth is what the agent sent last, under
//! `railscope_ethtool_<stat>_total{device="rxe0", port="1", netdev}`. A second device on a
//! netdev that does not exist is warned about once, naming it, and costs nothing else.
//!
//! A veth counts its statistics on its XDP path only (`rx_queue_0_xdp_packets`,
//! `rx_queue_0_xdp_bytes`), so the test attaches an XDP program that passes every packet
//! (two instructions, loaded with bpf(2)) to the namespace's end.
//!
//! Needs root (network namespaces, bpf(2)), `ip` and `ethtool` (Debian's iproute2 and
//! ethtool; `cargo xtask setup` installs them). Without them it skips with a message,
//! unless `RAILSCOPE_REQUIRE_ETHTOOL=1` (set by `cargo xtask test`), which makes that a
//! failure.

use std::{
    collections::BTreeMap,
    ffi::CString,
    fs,
    net::UdpSocket,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    process::Command,
    thread,
    time::Duration,
};

use monitor_testkit::{
    FixtureAgent, KEY_HEX, Running, copy_tree, key_file, scratch_dir, sysfs_fixture,
};

const RAILSCOPE: &str = env!("CARGO_BIN_EXE_railscope");

/// Why this host cannot run the test, if it cannot.
fn missing_tool() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (network namespaces and bpf(2) need it)".into());
    }
    for (tool, version) in [("ip", "-V"), ("ethtool", "--version")] {
        let found = Command::new(tool)
            .arg(version)
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            return Some(format!(
                "`{tool}` is not installed (apt-get install {tool})"
            ));
        }
    }
    None
}

fn run(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `ethtool -S NETDEV` in `netns`, as (statistic, value).
fn ethtool_s(netns: &str, netdev: &str) -> BTreeMap<String, u64> {
    let out = Command::new("ip")
        .args(["netns", "exec", netns, "ethtool", "-S", netdev])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (name, value) = l.trim().rsplit_once(':')?;
            Some((name.trim().to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

/// The namespace, the veth pair and what the test attached: removed when dropped.
struct Netns {
    name: String,
    root_end: String,
    _xdp: Option<OwnedFd>,
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.root_end])
            .output();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Loads an XDP program that passes every packet and links it to `netdev` of `netns`
/// (bpf(2): BPF_PROG_LOAD, then BPF_LINK_CREATE from a thread in the namespace). The link
/// lasts as long as the returned descriptor.
fn attach_xdp_pass(netns: &str, netdev: &str) -> OwnedFd {
    let ns_path = format!("/run/netns/{netns}");
    let netdev = CString::new(netdev).unwrap();
    thread::spawn(move || {
        let ns = fs::File::open(&ns_path).unwrap();
        // SAFETY: setns on a namespace file this thread opened; only this thread moves.
        assert_eq!(
            unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) },
            0,
            "setns {ns_path}: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: a NUL-terminated name, only read.
        let ifindex = unsafe { libc::if_nametoindex(netdev.as_ptr()) };
        assert_ne!(ifindex, 0, "{netdev:?} not in {ns_path}");
        // r0 = XDP_PASS (2); exit.
        let insns: [u64; 2] = [
            u64::from_le_bytes([0xb7, 0, 0, 0, 2, 0, 0, 0]),
            u64::from_le_bytes([0x95, 0, 0, 0, 0, 0, 0, 0]),
        ];
        let license = c"GPL";
        // union bpf_attr for BPF_PROG_LOAD: prog_type, insn_cnt, insns, license (u32, u32,
        // u64, u64); expected_attach_type at byte 68.
        let mut attr = [0u8; 128];
        attr[0..4].copy_from_slice(&6u32.to_ne_bytes()); // BPF_PROG_TYPE_XDP
        attr[4..8].copy_from_slice(&2u32.to_ne_bytes());
        attr[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_ne_bytes());
        attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
        attr[68..72].copy_from_slice(&37u32.to_ne_bytes()); // BPF_XDP
        // SAFETY: bpf(2) with an attr of the size given, pointing at live buffers.
        let prog = unsafe { libc::syscall(libc::SYS_bpf, 5, attr.as_ptr(), attr.len()) };
        assert!(
            prog >= 0,
            "BPF_PROG_LOAD: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: a descriptor bpf(2) just returned.
        let prog = unsafe { OwnedFd::from_raw_fd(prog as i32) };
        // BPF_LINK_CREATE: prog_fd, target_ifindex, attach_type, flags.
        let mut attr = [0u8; 128];
        attr[0..4].copy_from_slice(&(prog.as_raw_fd() as u32).to_ne_bytes());
        attr[4..8].copy_from_slice(&ifindex.to_ne_bytes());
        attr[8..12].copy_from_slice(&37u32.to_ne_bytes()); // BPF_XDP
        // SAFETY: as above.
        let link = unsafe { libc::syscall(libc::SYS_bpf, 28, attr.as_ptr(), attr.len()) };
        assert!(
            link >= 0,
            "BPF_LINK_CREATE: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: a descriptor bpf(2) just returned.
        unsafe { OwnedFd::from_raw_fd(link as i32) }
    })
    .join()
    .unwrap()
}

/// Sends `packets` UDP datagrams of 1000 bytes from the root namespace's end to the
/// namespace's, then waits for them to be counted.
fn traffic(packets: usize) {
    let socket = UdpSocket::bind("10.213.0.1:0").unwrap();
    for _ in 0..packets {
        socket.send_to(&[7u8; 1000], "10.213.0.2:9").unwrap();
    }
    thread::sleep(Duration::from_millis(300));
}

#[test]
fn the_agent_sends_what_ethtool_prints_for_a_roce_ports_netdev() {
    if let Some(why) = missing_tool() {
        assert!(
            !std::env::var("RAILSCOPE_REQUIRE_ETHTOOL").is_ok_and(|v| v == "1"),
            "ethtool statistics test: {why}, and RAILSCOPE_REQUIRE_ETHTOOL=1"
        );
        eprintln!("skipped: {why}");
        return;
    }
    let id = std::process::id() % 100_000;
    let name = format!("railscope-eth-{id}");
    let ns_end = format!("rse{id}n");
    let root_end = format!("rse{id}r");
    let mut netns = Netns {
        name: name.clone(),
        root_end: root_end.clone(),
        _xdp: None,
    };
    run(&["ip", "netns", "add", &name]);
    run(&[
        "ip", "link", "add", &root_end, "type", "veth", "peer", "name", &ns_end, "netns", &name,
    ]);
    // No traffic but the test's: no IPv6 (router solicitations), fixed neighbours (no ARP).
    for (ns, dev) in [(None, &root_end), (Some(&name), &ns_end)] {
        let sysctl = format!("net.ipv6.conf.{dev}.disable_ipv6=1");
        match ns {
            None => run(&["sysctl", "-qw", &sysctl]),
            Some(ns) => run(&["ip", "netns", "exec", ns, "sysctl", "-qw", &sysctl]),
        }
    }
    run(&["ip", "addr", "add", "10.213.0.1/24", "dev", &root_end]);
    run(&[
        "ip",
        "-n",
        &name,
        "addr",
        "add",
        "10.213.0.2/24",
        "dev",
        &ns_end,
    ]);
    run(&["ip", "-n", &name, "link", "set", "lo", "up"]);
    run(&["ip", "-n", &name, "link", "set", &ns_end, "up"]);
    run(&["ip", "link", "set", &root_end, "up"]);
    let mac = |ns: Option<&str>, dev: &str| -> String {
        let mut args = vec!["ip"];
        if let Some(ns) = ns {
            args.extend(["-n", ns]);
        }
        args.extend(["-j", "link", "show", dev]);
        let out = Command::new("ip").args(&args[1..]).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v[0]["address"].as_str().unwrap().to_owned()
    };
    let ns_mac = mac(Some(&name), &ns_end);
    let root_mac = mac(None, &root_end);
    run(&[
        "ip",
        "neigh",
        "replace",
        "10.213.0.2",
        "lladdr",
        &ns_mac,
        "dev",
        &root_end,
        "nud",
        "permanent",
    ]);
    run(&[
        "ip",
        "-n",
        &name,
        "neigh",
        "replace",
        "10.213.0.1",
        "lladdr",
        &root_mac,
        "dev",
        &ns_end,
        "nud",
        "permanent",
    ]);
    netns._xdp = Some(attach_xdp_pass(&name, &ns_end));

    let dir = scratch_dir("ethtool-netns");
    let key = key_file(&dir, KEY_HEX);
    let sysfs = dir.join("sys");
    copy_tree(&sysfs_fixture("rxe"), &sysfs);
    let class = sysfs.join("class/infiniband");
    fs::write(class.join("rxe0/parent"), format!("{ns_end}\n")).unwrap();
    fs::write(class.join("rxe1/parent"), "rse-gone0\n").unwrap();

    let port = 7690;
    let listener = Running::spawn(
        "ip",
        [
            "netns",
            "exec",
            &name,
            RAILSCOPE,
            "listen",
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--key",
            key.to_str().unwrap(),
            "--json",
        ],
    );
    thread::sleep(Duration::from_millis(300));
    let agent = FixtureAgent::new(&format!("127.0.0.1:{port}"), &key, &sysfs)
        .node("roce-node")
        .cadence("0.2", "0.5")
        .args(["--no-gpu", "--no-adaptive"])
        .spawn_in_netns(RAILSCOPE, &name);
    thread::sleep(Duration::from_secs(1));
    traffic(50);
    let first = ethtool_s(&name, &ns_end);
    thread::sleep(Duration::from_secs(1));
    traffic(120);
    thread::sleep(Duration::from_secs(1));
    let last = ethtool_s(&name, &ns_end);
    thread::sleep(Duration::from_millis(800));
    assert_eq!(ethtool_s(&name, &ns_end), last, "traffic after the test's");
    let (agent_ok, _, agent_err) = agent.interrupt();
    thread::sleep(Duration::from_millis(300));
    let (_, frames, listen_err) = listener.interrupt();
    assert!(agent_ok, "agent failed: {agent_err}");

    assert!(
        last["rx_queue_0_xdp_packets"] >= 170 && first["rx_queue_0_xdp_packets"] >= 50,
        "the traffic is counted: {first:?} then {last:?}"
    );
    // Every statistic's points as the listener decoded them, oldest first.
    let mut sent: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut labels_seen = Vec::new();
    for line in frames.lines() {
        let frame: serde_json::Value = serde_json::from_str(line).unwrap();
        for s in frame["samples"].as_array().into_iter().flatten() {
            let name = s["name"].as_str().unwrap();
            let Some(stat) = name.strip_prefix("railscope_ethtool_") else {
                continue;
            };
            labels_seen.push(s["labels"].clone());
            let points = sent.entry(stat.to_owned()).or_default();
            for p in s["points"].as_array().into_iter().flatten() {
                points.push(p["value"].as_u64().unwrap());
            }
        }
    }
    assert!(
        !sent.is_empty(),
        "no ethtool series arrived; agent: {agent_err}\nlisten: {listen_err}"
    );
    for labels in &labels_seen {
        assert_eq!(
            *labels,
            serde_json::json!({"device": "rxe0", "port": "1", "netdev": ns_end}),
        );
    }
    let names: std::collections::BTreeSet<String> =
        last.keys().map(|s| format!("{s}_total")).collect();
    assert_eq!(
        sent.keys()
            .cloned()
            .collect::<std::collections::BTreeSet<_>>(),
        names,
        "one series per statistic ethtool prints"
    );
    for (stat, value) in &last {
        let points = &sent[&format!("{stat}_total")];
        assert_eq!(
            points.last(),
            Some(value),
            "{stat}: the agent sent {points:?}, ethtool -S prints {value}"
        );
        assert!(
            points.contains(&first[stat]),
            "{stat}: between the two bursts ethtool -S printed {}, the agent sent {points:?}",
            first[stat]
        );
    }
    let warnings: Vec<&str> = agent_err
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("ethtool"))
        .collect();
    assert!(
        warnings.len() == 1 && warnings[0].contains("rse-gone0") && warnings[0].contains("rxe1/1"),
        "one warning, naming the missing netdev: {agent_err}"
    );
    let _ = fs::remove_dir_all(&dir);
}
