//! Helpers for code running inside the test bed's guest: system start-up, commands, the
//! soft-RoCE device pair, and the railscope agent as a child process.

use std::{
    ffi::CString,
    io::{BufRead as _, BufReader},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};

/// The guest-only addresses of the two ends of the veth pair (RFC 2544 benchmarking range;
/// the guest has no network card).
pub const ADDR_A: &str = "198.18.0.1";
pub const ADDR_B: &str = "198.18.0.2";

fn mount(source: &str, target: &str, fstype: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(target)?;
    let c = |s: &str| CString::new(s).expect("no NUL in mount arguments");
    let (source, target_c, fstype) = (c(source), c(target), c(fstype));
    // SAFETY: all pointers are valid NUL-terminated strings; no mount data.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target_c.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        bail!("mount {target}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Mounts what the kernel's interfaces need and sets up PATH and loopback.
pub fn init_system() -> anyhow::Result<()> {
    mount("proc", "/proc", "proc")?;
    mount("sys", "/sys", "sysfs")?;
    mount("dev", "/dev", "devtmpfs")?;
    mount("tmp", "/tmp", "tmpfs")?;
    mount("nodev", "/sys/kernel/tracing", "tracefs")?;
    mount("nodev", "/sys/kernel/debug", "debugfs")?;
    mount("bpf", "/sys/fs/bpf", "bpf")?;
    mount("cgroup2", "/sys/fs/cgroup", "cgroup2")?;
    // SAFETY: single-threaded at this point; nothing else reads the environment concurrently.
    unsafe { std::env::set_var("PATH", "/usr/bin:/bin:/sbin:/usr/sbin") };
    std::fs::write("/proc/sys/kernel/modprobe", "/bin/modprobe")?;
    run("/usr/bin/ip", &["link", "set", "lo", "up"])?;
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!("guest-init: kernel {}", release.trim());
    Ok(())
}

/// The value of `key=value` on a kernel command line.
pub fn cmdline_value(cmdline: &str, key: &str) -> Option<String> {
    cmdline
        .split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .map(str::to_owned)
}

pub fn power_off() -> ! {
    // SAFETY: sync and reboot take no pointers; PID 1 may power the machine off.
    unsafe {
        libc::sync();
        libc::reboot(libc::LINUX_REBOOT_CMD_POWER_OFF);
    }
    loop {
        thread::sleep(Duration::from_secs(1));
    }
}

/// Runs a command, echoing it and its output to the console; fails on a non-zero exit.
pub fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    println!("+ {program} {}", args.join(" "));
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("starting {program}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    for line in stdout
        .lines()
        .chain(String::from_utf8_lossy(&out.stderr).lines())
    {
        println!("  {line}");
    }
    if !out.status.success() {
        bail!("{program} {} failed ({})", args.join(" "), out.status);
    }
    Ok(stdout)
}

pub fn write_sysctl(key: &str, value: &str) -> anyhow::Result<()> {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    std::fs::write(&path, value).with_context(|| format!("writing {path}"))
}

/// Loads the soft-RoCE stack: rxe and the user-verbs, rdma_cm and umad interfaces.
pub fn load_rdma_modules() -> anyhow::Result<()> {
    for module in ["veth", "rdma_rxe", "ib_uverbs", "rdma_ucm", "ib_umad"] {
        run("/bin/modprobe", &[module])?;
    }
    Ok(())
}

/// Creates vethA/vethB with `ADDR_A`/`ADDR_B` and rxe0 on vethA, rxe1 on vethB, all in the
/// initial network namespace (rxe's UDP socket lives only there on 6.1).
pub fn create_rxe_pair() -> anyhow::Result<()> {
    let ip = "/usr/bin/ip";
    run(
        ip,
        &[
            "link", "add", "vethA", "type", "veth", "peer", "name", "vethB",
        ],
    )?;
    run(
        ip,
        &["addr", "add", &format!("{ADDR_A}/24"), "dev", "vethA"],
    )?;
    run(
        ip,
        &["addr", "add", &format!("{ADDR_B}/24"), "dev", "vethB"],
    )?;
    // Both ends are local addresses: accept packets from them and skip reverse-path checks.
    for dev in ["all", "vethA", "vethB"] {
        write_sysctl(&format!("net.ipv4.conf.{dev}.accept_local"), "1")?;
        write_sysctl(&format!("net.ipv4.conf.{dev}.rp_filter"), "0")?;
    }
    run(ip, &["link", "set", "vethA", "up"])?;
    run(ip, &["link", "set", "vethB", "up"])?;
    thread::sleep(Duration::from_secs(1));
    run(
        "/usr/bin/rdma",
        &["link", "add", "rxe0", "type", "rxe", "netdev", "vethA"],
    )?;
    run(
        "/usr/bin/rdma",
        &["link", "add", "rxe1", "type", "rxe", "netdev", "vethB"],
    )?;
    wait_for(Duration::from_secs(10), "rxe0 port 1 ACTIVE", || {
        port_state("rxe0").contains("ACTIVE")
    })
}

/// [`create_rxe_pair`] unless an earlier scenario of this boot already did; if one left the
/// veth pair without its devices (it failed midway), the missing devices are made again.
pub fn ensure_rxe_pair() -> anyhow::Result<()> {
    let exists = |path: &str| std::path::Path::new(path).exists();
    if !exists("/sys/class/net/vethA") {
        return create_rxe_pair();
    }
    for (device, netdev) in [("rxe0", "vethA"), ("rxe1", "vethB")] {
        if !exists(&format!("/sys/class/infiniband/{device}")) {
            run(
                "/usr/bin/rdma",
                &["link", "add", device, "type", "rxe", "netdev", netdev],
            )?;
        }
    }
    wait_for(Duration::from_secs(10), "rxe0 port 1 ACTIVE", || {
        port_state("rxe0").contains("ACTIVE")
    })
}

/// Creates the cgroup `/sys/fs/cgroup/<name>` (a job, for attribution tests).
pub fn cgroup(name: &str) -> anyhow::Result<String> {
    let path = format!("/sys/fs/cgroup/{name}");
    std::fs::create_dir_all(&path).with_context(|| format!("creating {path}"))?;
    Ok(format!("/{name}"))
}

/// A command that runs inside the cgroup `/sys/fs/cgroup/<cgroup>` (it moves itself there
/// before exec'ing the program).
pub fn in_cgroup(cgroup: &str, program: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(format!(
            "echo $$ > /sys/fs/cgroup{cgroup}/cgroup.procs && exec \"$0\" \"$@\""
        ))
        .arg(program)
        .args(args);
    cmd
}

/// Runs a command to completion in the background, collecting its output.
pub fn spawn_output(
    mut cmd: Command,
) -> anyhow::Result<thread::JoinHandle<std::io::Result<std::process::Output>>> {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting a background command")?;
    Ok(thread::spawn(move || child.wait_with_output()))
}

/// Prints a finished command's output to the console and fails on a non-zero exit.
pub fn check_output(
    what: &str,
    output: std::io::Result<std::process::Output>,
) -> anyhow::Result<String> {
    let output = output.with_context(|| format!("waiting for {what}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    for line in stdout
        .lines()
        .chain(String::from_utf8_lossy(&output.stderr).lines())
    {
        println!("  {what}: {line}");
    }
    if !output.status.success() {
        // The console has all of it; the summary line names why: the last lines of its
        // errors (perftest: "Completion with error", the status, "Failed to complete"), or
        // its last line of output when it printed no error.
        let words = |text: &str| -> Vec<String> {
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('-'))
                .map(str::to_owned)
                .collect()
        };
        let errors = words(&String::from_utf8_lossy(&output.stderr));
        let why = if errors.is_empty() {
            words(&stdout).pop().unwrap_or_else(|| "no output".into())
        } else {
            errors[errors.len().saturating_sub(3)..].join(" / ")
        };
        bail!("{what} failed ({}): {why}", output.status);
    }
    Ok(stdout)
}

/// The last verb-counter snapshot in the agent's JSON output.
pub struct Counters(std::collections::BTreeMap<(String, String, String, String), u64>);

impl Counters {
    /// Reads the `verb_count` lines of the latest `snapshot` in `lines`.
    pub fn last_snapshot(lines: &[String]) -> Self {
        let counts: Vec<serde_json::Value> = lines
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["kind"] == "verb_count")
            .collect();
        let last = counts.iter().filter_map(|v| v["snapshot"].as_u64()).max();
        Self(
            counts
                .iter()
                .filter(|v| v["snapshot"].as_u64() == last)
                .map(|v| {
                    let s = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
                    (
                        (s("device"), s("verb"), s("detail"), s("cgroup")),
                        v["value"].as_u64().unwrap_or(0),
                    )
                })
                .collect(),
        )
    }

    /// One counter: device, verb, detail and cgroup as the agent names them (0 if absent).
    pub fn get(&self, device: &str, verb: &str, detail: &str, cgroup: &str) -> u64 {
        self.0
            .get(&(device.into(), verb.into(), detail.into(), cgroup.into()))
            .copied()
            .unwrap_or(0)
    }

    /// The sum of a verb's counters that match `keep(device, detail, cgroup)`.
    pub fn sum(&self, verb: &str, keep: impl Fn(&str, &str, &str) -> bool) -> u64 {
        self.0
            .iter()
            .filter(|((d, v, t, c), _)| v == verb && keep(d, t, c))
            .map(|(_, n)| *n)
            .sum()
    }

    /// A verb's total in one cgroup, over devices and details.
    pub fn in_cgroup(&self, verb: &str, cgroup: &str) -> u64 {
        self.sum(verb, |_, _, c| c == cgroup)
    }

    /// Prints the counters whose cgroup contains `filter` (all for ""), for the log.
    pub fn print(&self, filter: &str) {
        for ((device, verb, detail, cgroup), value) in &self.0 {
            if cgroup.contains(filter) {
                println!("counter {device:6} {verb:16} {detail:24} {cgroup:24} {value}");
            }
        }
    }

    /// Every counter with its verb == `verb`: ((device, detail, cgroup), value).
    pub fn of(&self, verb: &str) -> Vec<((String, String, String), u64)> {
        self.0
            .iter()
            .filter(|((_, v, _, _), _)| v == verb)
            .map(|((d, _, t, c), n)| ((d.clone(), t.clone(), c.clone()), *n))
            .collect()
    }
}

/// The QP and CQ events (everything but port events) among the agent's JSON lines, each
/// printed to the scenario's log.
pub fn qp_cq_events(agent_stdout: &[String]) -> Vec<serde_json::Value> {
    let events: Vec<serde_json::Value> = agent_stdout
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["kind"] == "ib_event" && v["origin"] != "port")
        .collect();
    for e in &events {
        println!("qp/cq event: {e}");
    }
    events
}

/// `state` of port 1 of an RDMA device, e.g. "4: ACTIVE".
pub fn port_state(device: &str) -> String {
    std::fs::read_to_string(format!("/sys/class/infiniband/{device}/ports/1/state"))
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// The GID index of the IPv4-mapped RoCEv2 GID of port 1.
pub fn ipv4_gid_index(device: &str) -> anyhow::Result<u32> {
    (0..16)
        .find(|i| {
            std::fs::read_to_string(format!("/sys/class/infiniband/{device}/ports/1/gids/{i}"))
                .is_ok_and(|g| g.starts_with("0000:0000:0000:0000:0000:ffff:"))
        })
        .with_context(|| format!("{device} has no IPv4 GID"))
}

/// Polls `ready` every 100 ms until it holds or `timeout` passes.
pub fn wait_for(
    timeout: Duration,
    what: &str,
    mut ready: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if ready() {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(100));
    }
    bail!("timed out after {timeout:?} waiting for {what}")
}

/// perftest's QP timeout for a transfer that must finish: 4 µs × 2^18 ≈ 1.07 s before the
/// sender retransmits, 8.6 s without progress before it gives up (7 retries). perftest's
/// default (14, 67 ms) is shorter than an ACK takes under TCG with 8 MiB in flight: a
/// passing agent-frames run had 327 retry timeouts and 12,183 duplicate requests in 2,000
/// writes. Seven in a row fail the write (perftest exits 1 after its results header, as
/// CI's agent-frames client did).
/// Scenarios that want a QP to fail (qp-errors) keep the default.
pub const PERFTEST_QP_TIMEOUT: &str = "--qp-timeout=18";

/// The two argument lists of a perftest pair on the rxe pair whose transfer must finish:
/// the server on rxe1, the client on rxe0 connecting to [`ADDR_B`], each with `common` and
/// [`PERFTEST_QP_TIMEOUT`].
pub fn perftest_pair_args<'a>(common: &[&'a str]) -> [Vec<&'a str>; 2] {
    let side = |device: &'a str| {
        let mut args = vec!["-d", device];
        args.extend_from_slice(common);
        args.push(PERFTEST_QP_TIMEOUT);
        args
    };
    let mut client = side("rxe0");
    client.push(ADDR_B);
    [side("rxe1"), client]
}

/// The TCP port on which perftest's and `ibv_rc_pingpong`'s servers wait for their client.
const PERFTEST_TCP_PORT: u16 = 18515;

/// Waits until a perftest (or `ibv_rc_pingpong`) server listens for its client. A client
/// started before that fails at once ("Couldn't connect"), and under TCG, with the agent's
/// probes attached, a server can take more than a second to get there.
pub fn wait_for_perftest_server() -> anyhow::Result<()> {
    wait_for(
        Duration::from_secs(20),
        "the perftest server to listen",
        || tcp_listening(PERFTEST_TCP_PORT),
    )
}

/// Whether a TCP socket listens on `port` (IPv4 or IPv6).
fn tcp_listening(port: u16) -> bool {
    let local = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && cols[1].ends_with(&local) && cols[3] == "0A"
            })
        })
    })
}

/// Polls `ready` every 500 ms until it is true, or fails at `timeout` with its last error
/// (for checks that ask a server, which may fail before it is ready).
pub fn poll_until(
    timeout: Duration,
    what: &str,
    mut ready: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        let last = ready();
        if matches!(last, Ok(true)) {
            return Ok(());
        }
        if start.elapsed() > timeout {
            let why = last
                .err()
                .map(|e| format!(" (last: {e:#})"))
                .unwrap_or_default();
            bail!("timed out after {timeout:?} waiting for {what}{why}");
        }
        thread::sleep(Duration::from_millis(500));
    }
}

/// A thread of the scenario itself that sleeps `period` in a loop and keeps the longest gap
/// between two of its wake-ups: what the guest alone (emulated CPUs, module loads, the
/// kernel's own stalls) does to a timer, next to which an agent's pace can be judged.
pub struct Ticker {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: thread::JoinHandle<Duration>,
}

impl Ticker {
    pub fn start(period: Duration) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            thread::spawn(move || {
                let mut longest = Duration::ZERO;
                let mut last = Instant::now();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    thread::sleep(period);
                    let now = Instant::now();
                    longest = longest.max(now - last);
                    last = now;
                }
                longest
            })
        };
        Self { stop, thread }
    }

    /// Stops the thread; the longest gap between two wake-ups it saw.
    pub fn stop(self) -> Duration {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().expect("the ticker does not panic")
    }
}

/// `railscope agent` running as a child, with its output collected (and echoed to the
/// console with a prefix, so the serial log shows it).
pub struct Agent {
    child: Child,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Agent {
    pub fn start(args: &[&str]) -> anyhow::Result<Self> {
        Self::start_with(args, true)
    }

    /// [`Agent::start`], its output echoed to the console or not (the serial console is slow:
    /// a bench does not echo).
    pub fn start_with(args: &[&str], echo: bool) -> anyhow::Result<Self> {
        println!("+ railscope agent {}", args.join(" "));
        Self::spawn(Command::new("/usr/bin/railscope"), args, echo)
    }

    /// [`Agent::start`] holding only the capabilities `caps`, as its systemd unit starts it
    /// ([`crate::capabilities::restrict`]).
    pub fn start_restricted(args: &[&str], caps: &[u32]) -> anyhow::Result<Self> {
        println!(
            "+ railscope agent {} (capabilities {caps:?} only)",
            args.join(" ")
        );
        let mut cmd = Command::new("/usr/bin/railscope");
        crate::capabilities::restrict(&mut cmd, caps);
        Self::spawn(cmd, args, true)
    }

    /// [`Agent::start`] with environment variables set for it.
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Self> {
        println!("+ {env:?} railscope agent {}", args.join(" "));
        let mut cmd = Command::new("/usr/bin/railscope");
        cmd.envs(env.iter().copied());
        Self::spawn(cmd, args, true)
    }

    /// The process id, e.g. to read its `/proc` status.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn spawn(mut cmd: Command, args: &[&str], echo: bool) -> anyhow::Result<Self> {
        cmd.arg("agent").args(args);
        // Each agent its own spool directory: the scenarios of a boot share the node name
        // and key, and an agent that found the frames another left undelivered in the
        // default one would resume that agent's session.
        if !args.contains(&"--spool-dir") {
            static SPAWNED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = SPAWNED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            cmd.arg("--spool-dir").arg(format!("/tmp/agent-spool-{n}"));
        }
        let mut child = cmd
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting /usr/bin/railscope agent")?;
        let (out, err) = if echo {
            ("agent> ", "agent! ")
        } else {
            ("", "")
        };
        let stdout = collect(child.stdout.take().expect("piped"), out);
        let stderr = collect(child.stderr.take().expect("piped"), err);
        Ok(Self {
            child,
            stdout,
            stderr,
        })
    }

    pub fn stdout_lines(&self) -> Vec<String> {
        self.stdout
            .lock()
            .expect("reader thread never panics")
            .clone()
    }

    pub fn stderr_lines(&self) -> Vec<String> {
        self.stderr
            .lock()
            .expect("reader thread never panics")
            .clone()
    }

    /// Waits until a stderr line contains `needle`.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) -> anyhow::Result<()> {
        wait_for(timeout, &format!("the agent to log {needle:?}"), || {
            self.stderr_lines().iter().any(|l| l.contains(needle))
        })
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Stops the agent with SIGTERM and returns whether it exited successfully.
    pub fn stop(&mut self) -> anyhow::Result<(Vec<String>, Vec<String>)> {
        // SAFETY: kill with a pid we own.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let status = self.child.wait()?;
        // Let the reader threads drain the pipes.
        thread::sleep(Duration::from_millis(200));
        if !status.success() {
            bail!("the agent exited with {status} when asked to stop");
        }
        Ok((self.stdout_lines(), self.stderr_lines()))
    }
}

impl Drop for Agent {
    /// A scenario that fails half-way must not leave its agent running into the next one.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The key file the scenarios' agent and `railscope listen` share.
pub const WIRE_KEY: &str = "/tmp/wire.key";

/// The test bed's key (64 hex characters; the host side of `host-collector` uses the same).
pub const WIRE_KEY_HEX: &str = "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a";

/// Writes [`WIRE_KEY`] (mode 600, as the agent and `railscope listen` require).
pub fn write_wire_key() -> anyhow::Result<()> {
    std::fs::write(WIRE_KEY, WIRE_KEY_HEX)?;
    std::fs::set_permissions(
        WIRE_KEY,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )?;
    Ok(())
}

/// Starts `railscope agent` sending to `collector` (HOST:PORT) as node `guest`, without GPUs,
/// with `extra` options, echoing to the console or not. Writes the shared key file first
/// (mode 600, as the agent requires).
pub fn agent_sending_to(collector: &str, extra: &[&str], echo: bool) -> anyhow::Result<Agent> {
    write_wire_key()?;
    agent_sealing_with(collector, WIRE_KEY, extra, echo)
}

/// [`agent_sending_to`] with the key file `key` (the node's own key).
pub fn agent_sealing_with(
    collector: &str,
    key: &str,
    extra: &[&str],
    echo: bool,
) -> anyhow::Result<Agent> {
    let mut args = vec![
        "--collector",
        collector,
        "--key",
        key,
        "--node",
        "guest",
        "--no-gpu",
    ];
    args.extend_from_slice(extra);
    Agent::start_with(&args, echo)
}

/// Starts `railscope listen --json` on 127.0.0.1:`port` and an agent sending to it as node
/// `guest` ([`agent_sending_to`]) with `--json` and `extra` agent options, both echoing to
/// the console or not.
pub fn agent_and_listener(
    port: &str,
    extra: &[&str],
    echo: bool,
) -> anyhow::Result<(Agent, Listener)> {
    write_wire_key()?;
    let listener = Listener::start_with(
        &[
            "--port",
            port,
            "--bind",
            "127.0.0.1",
            "--key",
            WIRE_KEY,
            "--json",
        ],
        echo,
    )?;
    let collector = format!("127.0.0.1:{port}");
    let extra: Vec<&str> = std::iter::once("--json")
        .chain(extra.iter().copied())
        .collect();
    let agent = agent_sending_to(&collector, &extra, echo)?;
    Ok((agent, listener))
}

/// Stops the agent of [`agent_and_listener`], which must still be running, then the listener
/// once the agent's last flush is in: the agent's stderr and the frames the listener decoded.
pub fn stop_and_decode(
    agent: &mut Agent,
    listener: Listener,
) -> anyhow::Result<(Vec<String>, Vec<serde_json::Value>)> {
    ensure!(agent.is_running(), "the agent died");
    let (_, stderr) = agent.stop()?;
    thread::sleep(Duration::from_millis(500));
    let frames = listener
        .stop()?
        .iter()
        .map(|l| serde_json::from_str(l).with_context(|| format!("not JSON: {l}")))
        .collect::<anyhow::Result<_>>()?;
    Ok((stderr, frames))
}

/// Moves the rxe pair's counters with `ib_write_bw` (`iterations` writes from rxe0 to rxe1),
/// then flaps vethA once ([`flap_link`]).
pub fn write_bw_then_flap(iterations: u32) -> anyhow::Result<()> {
    let gid = ipv4_gid_index("rxe0")?.to_string();
    let n = iterations.to_string();
    let [server_args, client_args] = perftest_pair_args(&["-x", &gid, "-F", "-n", &n]);
    let server = spawn_output(in_cgroup("", "/usr/bin/ib_write_bw", &server_args))?;
    wait_for_perftest_server()?;
    let client = spawn_output(in_cgroup("", "/usr/bin/ib_write_bw", &client_args))?;
    check_output("ib_write_bw client", client.join().expect("no panic"))?;
    check_output("ib_write_bw server", server.join().expect("no panic"))?;
    flap_link("vethA", 1)
}

/// Takes the netdev `link` down for a second and up again, `times` times, a second apart:
/// a PORT_ERR and a PORT_ACTIVE of its rxe device each time.
pub fn flap_link(link: &str, times: usize) -> anyhow::Result<()> {
    for i in 0..times {
        if i > 0 {
            thread::sleep(Duration::from_secs(1));
        }
        run("/usr/bin/ip", &["link", "set", link, "down"])?;
        thread::sleep(Duration::from_secs(1));
        run("/usr/bin/ip", &["link", "set", link, "up"])?;
    }
    Ok(())
}

/// `railscope listen` running as a child, its JSON lines collected with the wall-clock time
/// each was read from its stdout.
pub struct Listener {
    child: Child,
    stdout: Arc<Mutex<Vec<(u64, String)>>>,
}

impl Listener {
    /// `railscope listen ARGS`, its frames echoed to the console or not.
    pub fn start_with(args: &[&str], echo: bool) -> anyhow::Result<Self> {
        println!("+ railscope listen {}", args.join(" "));
        let mut child = Command::new("/usr/bin/railscope")
            .arg("listen")
            .args(args)
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting /usr/bin/railscope listen")?;
        let stdout = collect_timed(
            child.stdout.take().expect("piped"),
            if echo { "listen> " } else { "" },
        );
        collect(child.stderr.take().expect("piped"), "listen! ");
        thread::sleep(Duration::from_millis(300));
        Ok(Self { child, stdout })
    }

    /// Stops the listener and returns what it printed.
    pub fn stop(self) -> anyhow::Result<Vec<String>> {
        Ok(self.stop_timed()?.into_iter().map(|(_, l)| l).collect())
    }

    /// Stops the listener and returns what it printed, each line with the CLOCK_REALTIME
    /// nanoseconds at which it was read.
    pub fn stop_timed(mut self) -> anyhow::Result<Vec<(u64, String)>> {
        // SAFETY: kill with a pid we own.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let _ = self.child.wait()?;
        thread::sleep(Duration::from_millis(200));
        Ok(self.stdout.lock().expect("no panics while locked").clone())
    }
}

/// CLOCK_REALTIME in nanoseconds since the Unix epoch.
pub fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Reads `pipe` line by line in a thread, echoing each line to the console after `prefix`
/// (unless it is empty) and collecting it with the time it was read.
pub fn collect_timed(
    pipe: impl std::io::Read + Send + 'static,
    prefix: &'static str,
) -> Arc<Mutex<Vec<(u64, String)>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&lines);
    thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            let at = realtime_ns();
            if !prefix.is_empty() {
                println!("{prefix}{line}");
            }
            sink.lock()
                .expect("no panics while locked")
                .push((at, line));
        }
    });
    lines
}

/// Reads `pipe` line by line in a thread, echoing each line to the console after `prefix`
/// (unless it is empty) and collecting it.
pub fn collect(
    pipe: impl std::io::Read + Send + 'static,
    prefix: &'static str,
) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&lines);
    thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            if !prefix.is_empty() {
                println!("{prefix}{line}");
            }
            sink.lock().expect("no panics while locked").push(line);
        }
    });
    lines
}
