//! `railscope health`, Slurm's health hook (docs/actions.md, "The health hook"), as a site runs
//! it on its nodes: two real `railscope agent` processes on their own copies of the mlx5
//! fixture sysfs tree send to a real collector; on one of them a port's `link_downed` counter
//! rises (what the kernel's driver writes when the link went down), which the collector
//! judges `ib_link_downed` (critical). That node, asked about with no `--node` through the
//! agent's binary, as a `HealthCheckProgram` runs it, exits 1 with one line naming the
//! finding's rule, id and port; the quiet node exits 0. A collector that cannot be asked (no
//! one listening, an answer that is not JSON, no answer within `--timeout-s`) gives one line
//! naming its URL and the `--unreachable-exit` status: 0 unless the site says otherwise.

use std::{
    ffi::OsStr,
    fs,
    io::{Read as _, Write as _},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Command, Output},
    thread,
    time::{Duration, Instant},
};

use monitor_testkit::{
    CollectorProcess, FixtureAgent, KEY_HEX, agent_binary_next_to, copy_tree, free_tcp_port,
    key_file, scratch_dir, sysfs_fixture, wait_for,
};

const COLLECTOR: &str = env!("CARGO_BIN_EXE_railscope-collector");

fn railscope() -> PathBuf {
    agent_binary_next_to(COLLECTOR)
}

/// `program health ARGS...`: (exit status, stdout, stderr).
fn health(program: &Path, args: &[&str]) -> (i32, String, String) {
    let out: Output = Command::new(program)
        .arg("health")
        .args(args)
        .env("NO_COLOR", "1")
        .env_remove("RAILSCOPE_HTTP_CONFIG_FILE")
        .output()
        .unwrap();
    (
        out.status.code().expect("an exit status, not a signal"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The one line of stdout.
fn one_line(stdout: &str) -> &str {
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "not one line: {stdout:?}");
    lines[0]
}

/// This host's name: the node name an agent without `--node` sends.
fn host_name() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_owned()
}

#[test]
fn a_node_with_a_critical_finding_is_unhealthy_a_quiet_one_healthy_and_an_outage_is_the_sites_choice()
 {
    let dir = scratch_dir("health-hook");
    let key = key_file(&dir, KEY_HEX);
    let config = dir.join("collector.toml");
    fs::write(&config, "[findings]\ntick-s = 1\n").unwrap();
    let c = CollectorProcess::command(COLLECTOR, &key, &dir.join("data"))
        .args([OsStr::new("--config"), config.as_os_str()])
        .start();

    // The failing node's agent has no --node: it sends under this host's name, as a
    // compute node's agent does by default.
    let failing = host_name();
    let sys = dir.join("sys");
    copy_tree(&sysfs_fixture("mlx5"), &sys);
    let agent = |sysfs: &Path, node: Option<&str>| {
        let mut a = FixtureAgent::new(&c.udp_addr().to_string(), &key, sysfs)
            .args(["--no-gpu"])
            .cadence("0.2", "0.5");
        if let Some(n) = node {
            a = a.node(n);
        }
        a.spawn(railscope())
    };
    let _failing_agent = agent(&sys, None);
    let _healthy_agent = agent(&sysfs_fixture("mlx5"), Some("healthy-node"));
    wait_for("both agents' frames", Duration::from_secs(30), || {
        let nodes = c.json("/api/v1/live/nodes");
        let names: Vec<&str> = nodes
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|n| n["node"].as_str())
            .collect();
        (names.contains(&failing.as_str()) && names.contains(&"healthy-node")).then_some(())
    });
    // Both healthy so far.
    let (code, out, err) = health(&railscope(), &["--collector", &c.url()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(one_line(&out).contains(" healthy"), "{out}");

    // mlx5_0's link went down once: the driver counts it.
    let counter = sys.join("class/infiniband/mlx5_0/ports/1/counters/link_downed");
    let before: u64 = fs::read_to_string(&counter)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    fs::write(&counter, format!("{}\n", before + 1)).unwrap();
    let finding = wait_for(
        "the ib_link_downed finding",
        Duration::from_secs(30),
        || c.active_finding("ib_link_downed", &failing),
    );
    let id = finding["id"].as_str().unwrap();
    assert_eq!(finding["severity"], "critical", "{finding}");

    // As a HealthCheckProgram runs it: the agent's binary, no --node.
    let (code, out, err) = health(&railscope(), &["--collector", &c.url()]);
    assert_eq!(code, 1, "{out}{err}");
    let line = one_line(&out);
    for part in [
        "unhealthy",
        "ib_link_downed",
        id,
        "mlx5_0/1",
        failing.as_str(),
    ] {
        assert!(line.contains(part), "{part:?} not in {line:?}");
    }
    // The collector's binary, the node named.
    let (code, out, _) = health(
        Path::new(COLLECTOR),
        &["--collector", &c.url(), "--node", &failing],
    );
    assert_eq!((code, one_line(&out)), (1, line));
    // The quiet node.
    let (code, out, err) = health(
        &railscope(),
        &["--collector", &c.url(), "--node", "healthy-node"],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(one_line(&out).contains("healthy-node healthy"), "{out}");
    // A node the collector has never heard of has no finding either.
    let (code, _, _) = health(&railscope(), &["--collector", &c.url(), "--node", "nobody"]);
    assert_eq!(code, 0);

    // No collector listening: healthy by default, the site's status when it says so.
    let nowhere = format!("http://127.0.0.1:{}", free_tcp_port());
    let (code, out, err) = health(&railscope(), &["--collector", &nowhere]);
    assert_eq!(code, 0, "{out}{err}");
    let line = one_line(&out);
    assert!(
        line.contains(&nowhere) && line.contains("cannot ask"),
        "{line}"
    );
    let (code, out, _) = health(
        &railscope(),
        &["--collector", &nowhere, "--unreachable-exit", "2"],
    );
    assert_eq!(code, 2, "{out}");
    assert!(one_line(&out).contains(&nowhere), "{out}");

    // Something that answers, but not the collector's findings; and something that never
    // answers (`--timeout-s 1`).
    let garbage = TcpListener::bind("127.0.0.1:0").unwrap();
    let garbage_url = format!("http://{}", garbage.local_addr().unwrap());
    thread::spawn(move || {
        for stream in garbage.incoming() {
            let mut stream = stream.unwrap();
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf);
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 14\r\n\r\n<html>hi</html",
            );
        }
    });
    let (code, out, _) = health(
        &railscope(),
        &["--collector", &garbage_url, "--unreachable-exit", "3"],
    );
    assert_eq!(code, 3, "{out}");
    let line = one_line(&out);
    assert!(
        line.contains(&garbage_url) && line.contains("not JSON"),
        "{line}"
    );

    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_url = format!("http://{}", silent.local_addr().unwrap());
    let started = Instant::now();
    let (code, out, _) = health(
        &railscope(),
        &["--collector", &silent_url, "--timeout-s", "1"],
    );
    assert_eq!(code, 0, "{out}");
    assert!(one_line(&out).contains(&silent_url), "{out}");
    // Well within the 60 s after which Slurm kills a HealthCheckProgram.
    assert!(started.elapsed() < Duration::from_secs(30), "{out}");
    drop(silent);

    // A bad flag is refused, naming it, before anything is asked.
    let (code, _, err) = health(&railscope(), &["--min-severity", "urgent"]);
    assert_ne!(code, 0);
    assert!(err.contains("urgent"), "{err}");
}
