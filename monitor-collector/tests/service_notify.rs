//! Both daemons speak systemd's notification protocol (`Type=notify` in
//! dist/railscope-*.service): READY=1 once they do their job, WATCHDOG=1 at half the
//! watchdog period, STOPPING=1 on SIGTERM. Checked against a notification socket of the test's
//! own, as systemd would provide it (NOTIFY_SOCKET, WATCHDOG_USEC).

use std::{
    os::unix::net::UnixDatagram,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use monitor_testkit::{KEY_HEX, agent_binary_next_to, key_file, scratch_dir};

const COLLECTOR: &str = env!("CARGO_BIN_EXE_railscope-collector");

/// The daemon started with a notification socket and a 400 ms watchdog.
fn start(dir: &Path, program: &Path, args: &[&str]) -> (Child, UnixDatagram) {
    let socket_path = dir.join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let child = Command::new(program)
        .args(args)
        .env("NOTIFY_SOCKET", &socket_path)
        .env("WATCHDOG_USEC", "400000")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    (child, socket)
}

/// Messages received until `until` holds for them or `limit` passes.
fn receive(
    socket: &UnixDatagram,
    limit: Duration,
    until: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    let start = Instant::now();
    let mut messages = Vec::new();
    let mut buf = [0u8; 4096];
    while start.elapsed() < limit && !until(&messages) {
        if let Ok(n) = socket.recv(&mut buf) {
            messages.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    messages
}

fn check_protocol(mut child: Child, socket: &UnixDatagram) {
    let ready = |m: &[String]| m.iter().any(|m| m.lines().any(|l| l == "READY=1"));
    let messages = receive(socket, Duration::from_secs(30), ready);
    assert!(ready(&messages), "no READY=1 in {messages:?}");
    // A 400 ms watchdog: pinged every 200 ms, so at least 4 pings in 1.1 s.
    let pings = |m: &[String]| m.iter().filter(|m| m.lines().eq(["WATCHDOG=1"])).count();
    let messages = receive(socket, Duration::from_millis(1100), |_| false);
    assert!(pings(&messages) >= 4, "{messages:?}");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let stopping = |m: &[String]| m.iter().any(|m| m.lines().any(|l| l == "STOPPING=1"));
    let messages = receive(socket, Duration::from_secs(10), stopping);
    assert!(stopping(&messages), "no STOPPING=1 in {messages:?}");
    assert!(child.wait().unwrap().success());
}

#[test]
fn the_collector_notifies_ready_watchdog_and_stopping() {
    let dir = scratch_dir("notify-collector");
    let key = key_file(&dir, KEY_HEX);
    let data = dir.join("data");
    let (child, socket) = start(
        &dir,
        Path::new(COLLECTOR),
        &[
            "run",
            // An empty file: not the machine's /etc/railscope/collector.toml.
            "--config",
            "/dev/null",
            "--listen",
            "127.0.0.1:0",
            "--no-http",
            "--key",
            key.to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
        ],
    );
    check_protocol(child, &socket);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The agent is ready once every probe family's first attach attempt is in (here, on a host
/// without RDMA, each reported unavailable), and pings the watchdog from its event loop.
#[test]
fn the_agent_notifies_ready_watchdog_and_stopping() {
    let agent = agent_binary_next_to(COLLECTOR);
    let dir = scratch_dir("notify-agent");
    let (child, socket) = start(&dir, &agent, &["agent", "--config", "/dev/null"]);
    check_protocol(child, &socket);
    let _ = std::fs::remove_dir_all(&dir);
}
