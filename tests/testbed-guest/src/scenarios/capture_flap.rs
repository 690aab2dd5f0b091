//! capture-flap: `railscope capture` under `ib_write_bw` traffic on one rxe pair while the
//! other pair's link flaps on a scripted, irregular pattern (some downs shorter than a
//! second). The test knows the exact sequence: it takes the link down and up itself with
//! `SIOCSIFFLAGS` and brackets each call with the wall clock. `railscope report` on the
//! capture must name both ports of the flapped pair flapping with exactly as many down
//! transitions as the script made, rxe0's time down within one snapshot interval of the
//! script's, and both ports of the traffic pair stable. A second capture of the same run,
//! killed with SIGKILL after the third cycle, must still report those three cycles.
//!
//! The clean capture is printed to the console in base64 between `RAILSCOPE-CAPTURE-BEGIN`
//! and `RAILSCOPE-CAPTURE-END` (a few tens of kB), so the guest log carries a real capture:
//! docs/examples/capture-flap.rscap is one.

use std::{
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::Duration,
};

use anyhow::{Context as _, bail, ensure};
use serde_json::Value;

use crate::guest::{self, realtime_ns};

/// The flapped pair's device whose netdev the script takes down (its peer rxe1 follows
/// through the veth carrier).
const FLAPPED: &str = "vethA";
/// The second pair: rxe2 on vethC, rxe3 on vethD, carrying the traffic.
const ADDR_C: &str = "198.18.1.1";
const ADDR_D: &str = "198.18.1.2";
/// The script: (ms up before the down, ms down). Irregular; three downs under a second.
const PATTERN: [(u64, u64); 5] = [
    (1000, 300),
    (1500, 1200),
    (1300, 150),
    (1700, 700),
    (1200, 450),
];
/// The killed capture is killed after this many cycles (and a flush).
const KILL_AFTER: usize = 3;
/// The captures' snapshot interval.
const INTERVAL_MS: u64 = 10;
const CAPTURE: &str = "/tmp/capture-flap.rscap";
const KILLED: &str = "/tmp/capture-killed.rscap";

pub(super) fn run() -> anyhow::Result<()> {
    super::ensure_rdma_modules()?;
    guest::ensure_rxe_pair()?;
    create_second_pair()?;

    let interval = format!("{INTERVAL_MS}ms");
    let capture_args = [
        "--interval",
        interval.as_str(),
        "--pre",
        "2s",
        "--post",
        "3s",
    ];
    let mut capture = Capture::start(CAPTURE, &capture_args, "capture! ")?;
    let mut killed = Capture::start(KILLED, &capture_args, "")?;
    capture.wait_recording()?;
    killed.wait_recording()?;

    // Traffic on the stable pair for the whole script.
    let total: u64 = PATTERN.iter().map(|(u, d)| u + d).sum::<u64>() / 1000 + 3;
    let gid = guest::ipv4_gid_index("rxe2")?.to_string();
    let duration = total.to_string();
    // Small messages and a short send queue: rxe under TCG retries (and can fail) a QP
    // with many 64 KiB writes in flight while the guest's two vCPUs are busy.
    let bw_args = [
        "-x",
        gid.as_str(),
        "-F",
        "-D",
        duration.as_str(),
        "-s",
        "4096",
        "-t",
        "16",
        "--report_gbits",
        guest::PERFTEST_QP_TIMEOUT,
    ];
    let server = guest::spawn_output({
        let mut c = Command::new("/usr/bin/ib_write_bw");
        c.args(["-d", "rxe3"]).args(bw_args);
        c
    })?;
    guest::wait_for_perftest_server()?;
    let client = guest::spawn_output({
        let mut c = Command::new("/usr/bin/ib_write_bw");
        c.args(["-d", "rxe2"]).args(bw_args).arg(ADDR_D);
        c
    })?;
    thread::sleep(Duration::from_millis(500));

    // The script, each down period bracketed: (earliest, latest) possible length in ns.
    let mut downs = Vec::new();
    for (i, (up_ms, down_ms)) in PATTERN.into_iter().enumerate() {
        thread::sleep(Duration::from_millis(up_ms));
        let before_down = realtime_ns();
        set_link(FLAPPED, false)?;
        let after_down = realtime_ns();
        thread::sleep(Duration::from_millis(down_ms));
        let before_up = realtime_ns();
        set_link(FLAPPED, true)?;
        let after_up = realtime_ns();
        downs.push((before_up - after_down, after_up - before_down));
        println!(
            "cycle {}: {FLAPPED} down for {:.1}..{:.1} ms",
            i + 1,
            (before_up - after_down) as f64 / 1e6,
            (after_up - before_down) as f64 / 1e6
        );
        if i + 1 == KILL_AFTER {
            // Events are written at once, snapshots flushed each second: wait for one flush.
            thread::sleep(Duration::from_millis(1500));
            killed.kill()?;
        }
    }
    thread::sleep(Duration::from_secs(1));
    let client = client.join().expect("no panic");
    let server = server.join().expect("no panic");
    if let Ok(out) = &client
        && !out.status.success()
    {
        // What the kernel said about the devices while the traffic failed.
        let _ = guest::run("/bin/dmesg", &[]);
    }
    guest::check_output("ib_write_bw client", client)?;
    guest::check_output("ib_write_bw server", server)?;
    capture.interrupt()?;

    let report = report(CAPTURE)?;
    check_flapped(&report, PATTERN.len(), &downs)?;
    for device in ["rxe2", "rxe3"] {
        let p = port(&report, device)?;
        ensure!(
            p["verdict"] == "stable" && p["down_transitions"] == 0,
            "{device} carried the traffic and never went down, yet: {p}"
        );
    }
    ensure!(
        report["sources"][0]["ended"] == "interrupted",
        "the capture did not end cleanly on SIGINT: {}",
        report["sources"][0]
    );

    dump(CAPTURE)?;

    let killed_report = report_of(KILLED)?;
    ensure!(
        killed_report["sources"][0]["ended"] == "cut (no trailer)",
        "the killed capture has a trailer: {}",
        killed_report["sources"][0]
    );
    check_flapped(&killed_report, KILL_AFTER, &downs[..KILL_AFTER])?;
    Ok(())
}

/// Both ports of the flapped pair: flapping, exactly `cycles` downs and ups from the
/// kernel's events; rxe0's time down within one snapshot interval of the script's bracket.
fn check_flapped(report: &Value, cycles: usize, downs: &[(u64, u64)]) -> anyhow::Result<()> {
    for device in ["rxe0", "rxe1"] {
        let p = port(report, device)?;
        ensure!(p["verdict"] == "flapping", "{device} is not flapping: {p}");
        ensure!(
            p["transitions_from"] == "events",
            "{device}'s transitions are not from the probes' events: {p}"
        );
        ensure!(
            p["down_transitions"] == cycles && p["up_transitions"] == cycles,
            "{device}: {} down and {} up transitions, the script made {cycles}",
            p["down_transitions"],
            p["up_transitions"]
        );
    }
    let rxe0 = port(report, "rxe0")?;
    let measured = rxe0["time_down_ns"].as_u64().context("time_down_ns")?;
    let shortest: u64 = downs.iter().map(|d| d.0).sum();
    let longest: u64 = downs.iter().map(|d| d.1).sum();
    let slack = INTERVAL_MS * 1_000_000;
    println!(
        "rxe0 down {:.1} ms in the report; the script: {:.1}..{:.1} ms",
        measured as f64 / 1e6,
        shortest as f64 / 1e6,
        longest as f64 / 1e6
    );
    ensure!(
        measured + slack >= shortest && measured <= longest + slack,
        "rxe0's time down {measured} ns is not within {slack} ns of the script's \
         {shortest}..{longest} ns"
    );
    let rxe1 = port(report, "rxe1")?;
    println!(
        "rxe1 (the peer, through the veth carrier) down {:.1} ms",
        rxe1["time_down_ns"].as_u64().unwrap_or(0) as f64 / 1e6
    );
    Ok(())
}

pub(super) fn port<'a>(report: &'a Value, device: &str) -> anyhow::Result<&'a Value> {
    report["ports"]
        .as_array()
        .and_then(|ports| ports.iter().find(|p| p["port"]["device"] == device))
        .with_context(|| format!("no port of {device} in the report"))
}

/// The text report (echoed to the console by `guest::run`), then the JSON one.
pub(super) fn report(file: &str) -> anyhow::Result<Value> {
    guest::run("/usr/bin/railscope", &["report", "--no-svg", file])?;
    report_of(file)
}

/// `railscope report --json` of a file (not echoed: the text report says the same).
pub(super) fn report_of(file: &str) -> anyhow::Result<Value> {
    let out = Command::new("/usr/bin/railscope")
        .args(["report", "--json", "--no-svg", file])
        .output()
        .context("starting railscope report")?;
    ensure!(
        out.status.success(),
        "railscope report --json {file} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).context("report --json")
}

/// Prints a capture file to the console in base64 (76 characters a line), unless it is
/// larger than 512 KiB.
fn dump(file: &str) -> anyhow::Result<()> {
    let bytes = std::fs::read(file).with_context(|| format!("reading {file}"))?;
    if bytes.len() > 512 << 10 {
        println!("{file}: {} bytes, not printed", bytes.len());
        return Ok(());
    }
    println!("RAILSCOPE-CAPTURE-BEGIN {file} {} bytes", bytes.len());
    for line in base64(&bytes).as_bytes().chunks(76) {
        println!("{}", String::from_utf8_lossy(line));
    }
    println!("RAILSCOPE-CAPTURE-END");
    Ok(())
}

/// Standard base64 with padding (RFC 4648).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// vethC/vethD with rxe2/rxe3, like the first pair.
pub(super) fn create_second_pair() -> anyhow::Result<()> {
    if std::path::Path::new("/sys/class/infiniband/rxe2").exists() {
        return Ok(());
    }
    let ip = "/usr/bin/ip";
    guest::run(
        ip,
        &[
            "link", "add", "vethC", "type", "veth", "peer", "name", "vethD",
        ],
    )?;
    guest::run(
        ip,
        &["addr", "add", &format!("{ADDR_C}/24"), "dev", "vethC"],
    )?;
    guest::run(
        ip,
        &["addr", "add", &format!("{ADDR_D}/24"), "dev", "vethD"],
    )?;
    for dev in ["vethC", "vethD"] {
        guest::write_sysctl(&format!("net.ipv4.conf.{dev}.accept_local"), "1")?;
        guest::write_sysctl(&format!("net.ipv4.conf.{dev}.rp_filter"), "0")?;
        guest::run(ip, &["link", "set", dev, "up"])?;
    }
    thread::sleep(Duration::from_secs(1));
    let rdma = "/usr/bin/rdma";
    guest::run(
        rdma,
        &["link", "add", "rxe2", "type", "rxe", "netdev", "vethC"],
    )?;
    guest::run(
        rdma,
        &["link", "add", "rxe3", "type", "rxe", "netdev", "vethD"],
    )?;
    guest::wait_for(Duration::from_secs(10), "rxe2 port 1 ACTIVE", || {
        guest::port_state("rxe2").contains("ACTIVE")
    })
}

/// Sets a network device up or down with one `SIOCSIFFLAGS` (microseconds, so the script's
/// times are exact, unlike running `ip`).
pub(super) fn set_link(name: &str, up: bool) -> anyhow::Result<()> {
    // SAFETY: a socket for the ioctl, closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
    ensure!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
    // SAFETY: ifreq is plain data; zeroed is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    // SAFETY: fd is a socket, req a valid ifreq naming the device.
    let result = unsafe {
        if libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req) != 0 {
            Err(std::io::Error::last_os_error())
        } else {
            let flags = req.ifr_ifru.ifru_flags;
            let up_flag = libc::IFF_UP as libc::c_short;
            req.ifr_ifru.ifru_flags = if up {
                flags | up_flag
            } else {
                flags & !up_flag
            };
            if libc::ioctl(fd, libc::SIOCSIFFLAGS, &req) != 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(())
            }
        }
    };
    // SAFETY: closing the socket made above.
    unsafe { libc::close(fd) };
    result.with_context(|| format!("setting {name} {}", if up { "up" } else { "down" }))
}

/// `railscope capture` running as a child.
pub(super) struct Capture {
    child: Child,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Capture {
    pub(super) fn start(out: &str, args: &[&str], echo: &'static str) -> anyhow::Result<Self> {
        println!("+ railscope capture --out {out} {}", args.join(" "));
        let mut child = Command::new("/usr/bin/railscope")
            .args(["capture", "--out", out])
            .args(args)
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting railscope capture")?;
        let stderr = guest::collect(child.stderr.take().expect("piped"), echo);
        Ok(Self { child, stderr })
    }

    /// Waits for the line saying the capture records, with port events from the probes.
    pub(super) fn wait_recording(&mut self) -> anyhow::Result<()> {
        guest::wait_for(Duration::from_secs(60), "capture: recording", || {
            self.lines()
                .iter()
                .any(|l| l.starts_with("capture: recording"))
        })?;
        let lines = self.lines();
        let line = lines
            .iter()
            .find(|l| l.starts_with("capture: recording"))
            .expect("waited for it");
        ensure!(
            line.contains("port events from the probes"),
            "the capture records without the probes: {line}"
        );
        Ok(())
    }

    fn lines(&self) -> Vec<String> {
        self.stderr.lock().expect("no panics while locked").clone()
    }

    fn kill(&mut self) -> anyhow::Result<()> {
        self.child.kill().context("SIGKILL to the capture")?;
        self.child.wait()?;
        Ok(())
    }

    /// Ctrl-C: the capture ends cleanly and exits 0.
    pub(super) fn interrupt(&mut self) -> anyhow::Result<()> {
        // SAFETY: kill with a pid we own.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
        let status = self.child.wait()?;
        thread::sleep(Duration::from_millis(200));
        if !status.success() {
            bail!(
                "the capture exited with {status} on SIGINT: {:?}",
                self.lines()
            );
        }
        Ok(())
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
