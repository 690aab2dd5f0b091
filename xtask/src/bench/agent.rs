//! `cargo xtask bench agent`: the node agent's cost, next to what Prometheus would do with the
//! same node, written to `bench/results/agent.md` and `agent.json`.
//!
//! 1. **Bytes per sample**: the fixture node (8 GPUs of the NVML stand-in, 8 mlx5-like HCA
//!    ports whose counters move) read through railscope's real sources, encoded by railscope's
//!    `FrameEncoder` (default config, a flush every 10 s), as Prometheus text exposition (one
//!    scrape per sweep) and as remote-write v1 (protobuf + snappy).
//! 2. **CPU and memory**: `railscope agent` sending to `railscope listen` at a 1 s and a 100 ms
//!    interval, next to Debian's prometheus-node-exporter (only its infiniband collector)
//!    reading the same moving tree (`--path.sysfs`) and scraped over loopback at the same
//!    rate, as Prometheus scrapes (keep-alive, gzip). CPU is the scheduler's run time of every
//!    thread (`/proc/<pid>/task/*/schedstat`) over the measured window, peak RSS is `VmHWM`.
//! 3. **Adaptive sampling** on the workload-shaped traces of the `sampler-traces` crate.
//!
//! The measuring that needs the railscope library is `monitor-user/examples/agent_bench`
//! (xtask does not depend on monitor-user); this module builds it, runs it, runs the
//! processes, and writes the report.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    fs,
    io::{self, BufRead, BufReader, Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream, UdpSocket},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use super::{Options, host_cpu, utc_now};
use crate::{
    build, cargo,
    setup::{self, Tools},
};

const NODE_EXPORTER_PACKAGE: &str = "prometheus-node-exporter";
const NODE_EXPORTER: &str = "/usr/bin/prometheus-node-exporter";
/// The two minimum intervals measured, in seconds.
const INTERVALS: [f64; 2] = [1.0, 0.1];
/// Sweeps of the bytes-per-sample measurement per interval: 5 minutes of the node at 1 s,
/// 1 minute at 100 ms.
const WIRE_SWEEPS: [(f64, usize); 2] = [(1.0, 300), (0.1, 600)];
/// Time a process runs before its measured window starts (loading, first reads, BTF).
/// Warm-up before a process is measured: at least 5 s, and 30 minimum intervals, so the
/// agent's sampler has filled its windows (24 reads) and runs as it does for the weeks a node
/// is up; node_exporter gets the same.
fn warmup(interval: f64) -> Duration {
    Duration::from_secs_f64((30.0 * interval).max(5.0))
}
const NODE: &str = "bench-node";

const GOAL_BYTES_PER_SAMPLE: f64 = 2.0;
const GOAL_VS_REMOTE_WRITE: f64 = 20.0;
const GOAL_CPU_PCT_AT_1S: f64 = 0.5;
const GOAL_RSS_MB: f64 = 30.0;
const GOAL_VS_NODE_EXPORTER: f64 = 10.0;
const GOAL_REDUCTION: f64 = 0.70;
const GOAL_PEAK_ERROR: f64 = 0.10;
const GOAL_STEP_DELAY: f64 = 2.0;

pub fn run(tools: &Tools, options: &Options) -> anyhow::Result<()> {
    let started = Instant::now();
    let duration = Duration::from_secs(options.duration.max(5));
    let date = utc_now();
    let load_before = loadavg();
    if options.setup.no_apt {
        if !Path::new(NODE_EXPORTER).is_file() {
            bail!("{NODE_EXPORTER} is missing (install {NODE_EXPORTER_PACKAGE}, or drop --no-apt)");
        }
    } else {
        setup::ensure_debian_packages(&[NODE_EXPORTER_PACKAGE, "xz-utils"])?;
    }
    let railscope = build::railscope_binary(tools, true)?;
    let standin = build_standin(tools)?;
    let example = build_example(tools)?;
    let work = cargo::workspace_root().join("target/bench/agent");
    if work.exists() {
        fs::remove_dir_all(&work).with_context(|| format!("emptying {}", work.display()))?;
    }
    fs::create_dir_all(&work)?;
    let key = write_key(&work)?;
    let ctx = Ctx {
        railscope,
        example,
        standin,
        key,
        work: work.clone(),
        duration,
    };

    let mut wire = Vec::new();
    for (interval, sweeps) in WIRE_SWEEPS {
        setup::step(&format!(
            "bytes per sample: {sweeps} sweeps of the fixture node at {} (about {:.0} s)",
            label(interval),
            sweeps as f64 * 0.11
        ));
        let dir = work.join(format!("wire-{}", slug(interval)));
        let out = run_json(
            Command::new(&ctx.example)
                .args(["wire", "--dir"])
                .arg(&dir)
                .arg("--standin")
                .arg(&ctx.standin)
                .args(["--interval", &interval.to_string()])
                .args(["--sweeps", &sweeps.to_string(), "--node", NODE])
                .arg("--frames-out")
                .arg(dir.join("frames.bin")),
        )?;
        wire.push(with_stream_xz(out, &dir.join("frames.bin"))?);
    }

    setup::step("adaptive sampling on the workload-shaped traces");
    let traces = run_json(Command::new(&ctx.example).arg("traces"))?;

    let mut live = Vec::new();
    for interval in INTERVALS {
        live.push(live_config(&ctx, interval)?);
    }

    let facts = Facts {
        date,
        command: command_line(options),
        host_cpu: host_cpu(),
        cores: thread::available_parallelism().map_or(0, |n| n.get()),
        kernel: fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_owned())
            .unwrap_or_default(),
        load_before,
        load_after: loadavg(),
        node_exporter: node_exporter_version(),
        railscope_commit: git_commit(),
        duration_s: duration.as_secs_f64(),
        warmup_s: warmup(1.0).as_secs_f64(),
        total_s: started.elapsed().as_secs_f64(),
    };
    let report = Report {
        facts,
        wire,
        traces,
        live,
    };
    let md_path = cargo::workspace_root().join(super::results_path(super::Target::Agent));
    let json_path = md_path.with_extension("json");
    if let Some(dir) = md_path.parent() {
        fs::create_dir_all(dir)?;
    }
    let goals = report.goals();
    fs::write(&md_path, report.markdown(&goals))?;
    fs::write(
        &json_path,
        serde_json::to_string_pretty(&report.json(&goals))? + "\n",
    )?;
    for g in &goals {
        eprintln!("    {:5} {} ({})", g.verdict(), g.what, g.measured);
    }
    setup::step(&format!(
        "wrote {} and {} in {:.0?}",
        md_path.display(),
        json_path.display(),
        started.elapsed()
    ));
    Ok(())
}

/// What every part of the run needs.
struct Ctx {
    railscope: PathBuf,
    example: PathBuf,
    standin: PathBuf,
    key: PathBuf,
    work: PathBuf,
    duration: Duration,
}

fn command_line(options: &Options) -> String {
    if options.duration == super::DEFAULT_DURATION {
        "cargo xtask bench agent".into()
    } else {
        format!("cargo xtask bench agent --duration {}", options.duration)
    }
}

fn label(interval: f64) -> String {
    if interval >= 1.0 {
        format!("{interval} s")
    } else {
        format!("{:.0} ms", interval * 1000.0)
    }
}

fn slug(interval: f64) -> String {
    label(interval).replace(' ', "")
}

/// The stand-in `libnvidia-ml.so` (a cdylib, which cargo reports as a file, not an
/// executable).
fn build_standin(tools: &Tools) -> anyhow::Result<PathBuf> {
    setup::step("building the NVML stand-in (libnvidia_ml_standin.so)");
    let mut cmd = cargo::command(tools);
    cmd.args([
        "build",
        "--release",
        "--package",
        "nvml-standin",
        "--lib",
        "--message-format=json-render-diagnostics",
    ])
    .stdout(Stdio::piped());
    let out = cmd.spawn()?.wait_with_output()?;
    if !out.status.success() {
        bail!("building nvml-standin failed ({})", out.status);
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|m| {
            m["reason"] == "compiler-artifact" && m["target"]["name"] == "nvidia_ml_standin"
        })
        .flat_map(|m| {
            m["filenames"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter_map(|f| f.as_str().map(PathBuf::from))
                .collect::<Vec<_>>()
        })
        .find(|p| p.extension().is_some_and(|e| e == "so"))
        .context("cargo did not report libnvidia_ml_standin.so")
}

fn build_example(tools: &Tools) -> anyhow::Result<PathBuf> {
    setup::step("building the measuring example (monitor-user/examples/agent_bench)");
    let mut cmd = cargo::command(tools);
    cmd.args([
        "build",
        "--release",
        "--package",
        "monitor-user",
        "--example",
        "agent_bench",
    ]);
    cargo::build_executables(cmd)?
        .into_iter()
        .find(|(name, _)| name == "agent_bench")
        .map(|(_, path)| path)
        .context("cargo did not report the agent_bench example")
}

/// Adds to a `wire` result what xz -9e makes of railscope's whole frame stream: what a
/// strong general-purpose compressor still finds to remove, across frames (which UDP frames,
/// each decoded on its own, cannot use).
fn with_stream_xz(mut wire: Value, frames: &Path) -> anyhow::Result<Value> {
    let out = Command::new("xz")
        .args(["-9e", "--stdout", "--keep"])
        .arg(frames)
        .output()
        .context("running xz (Debian package xz-utils)")?;
    if !out.status.success() {
        bail!(
            "xz on {} failed: {}",
            frames.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let bytes = out.stdout.len() as u64;
    let samples = wire["railscope"]["samples"].as_u64().unwrap_or(0);
    wire["railscope_stream_xz"] = json!({
        "bytes": bytes,
        "bytes_per_sample": bytes as f64 / samples.max(1) as f64,
    });
    Ok(wire)
}

fn write_key(dir: &Path) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let key = dir.join("wire.key");
    let mut bytes = [0u8; 32];
    fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    fs::write(&key, hex + "\n")?;
    fs::set_permissions(&key, fs::Permissions::from_mode(0o600))?;
    Ok(key)
}

/// Runs a command that prints one JSON document on stdout.
fn run_json(cmd: &mut Command) -> anyhow::Result<Value> {
    let rendered = cargo::render(cmd);
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("failed to start {rendered}"))?;
    if !out.status.success() {
        bail!("{rendered} failed ({})", out.status);
    }
    serde_json::from_slice(&out.stdout).with_context(|| format!("{rendered} did not print JSON"))
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn node_exporter_version() -> String {
    Command::new(NODE_EXPORTER)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned()
                + &String::from_utf8_lossy(&o.stderr);
            text.lines().next().map(str::to_owned)
        })
        .unwrap_or_else(|| "unknown".into())
}

fn git_commit() -> String {
    let root = cargo::workspace_root();
    let out = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(&root)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let commit = out(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty =
        out(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    if dirty {
        format!("{commit} (with uncommitted changes)")
    } else {
        commit
    }
}

// ---------------------------------------------------------------------------------------
// Processes and their cost

/// A child process that is stopped (SIGKILL) if still running when dropped.
struct Proc {
    name: String,
    child: Child,
    started: Instant,
}

impl Proc {
    /// Starts `cmd` with stdout and stderr to `<dir>/<name>.out` and `.err` (unless the
    /// caller set stdout).
    fn spawn(
        name: &str,
        cmd: &mut Command,
        dir: &Path,
        stdout: Option<Stdio>,
    ) -> anyhow::Result<Self> {
        let out = match stdout {
            Some(s) => s,
            None => fs::File::create(dir.join(format!("{name}.out")))?.into(),
        };
        let err = fs::File::create(dir.join(format!("{name}.err")))?;
        let child = cmd
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("failed to start {}", cargo::render(cmd)))?;
        Ok(Self {
            name: name.into(),
            child,
            started: Instant::now(),
        })
    }

    /// Starts `cmd` (an `agent_bench` subcommand) and waits for the JSON line with
    /// `"ready": true` it prints on stdout once it is set up; returns that line.
    fn spawn_ready(name: &str, cmd: &mut Command, dir: &Path) -> anyhow::Result<(Self, Value)> {
        let mut proc = Self::spawn(name, cmd, dir, Some(Stdio::piped()))?;
        let mut line = String::new();
        BufReader::new(proc.child.stdout.take().context("no stdout")?).read_line(&mut line)?;
        match serde_json::from_str::<Value>(&line) {
            Ok(ready) if ready["ready"] == true => Ok((proc, ready)),
            _ => bail!(
                "{name} did not start: {line:?} (see {})",
                dir.join(format!("{name}.err")).display()
            ),
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends `signal`, waits up to `timeout`, then kills.
    fn stop(&mut self, signal: i32, timeout: Duration) -> anyhow::Result<ExitStatus> {
        if let Some(status) = self.child.try_wait()? {
            return Ok(status);
        }
        // SAFETY: signalling our own child, which has not been reaped (try_wait said so).
        unsafe { libc::kill(self.pid(), signal) };
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "    warning: {} did not stop within {timeout:?}; killing it",
            self.name
        );
        self.child.kill()?;
        Ok(self.child.wait()?)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// CPU time of a process or thread, in clock ticks (for a process: all its threads, those
/// that exited included).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Ticks {
    user: u64,
    system: u64,
    threads: u64,
}

impl Ticks {
    fn total(self) -> u64 {
        self.user + self.system
    }
}

/// utime, stime and the thread count from the text of `/proc/<pid>/stat`.
fn parse_stat(stat: &str) -> Option<Ticks> {
    // The command name (field 2) is in parentheses and may hold spaces: fields after it.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(Ticks {
        user: fields.get(11)?.parse().ok()?,
        system: fields.get(12)?.parse().ok()?,
        threads: fields.get(17)?.parse().ok()?,
    })
}

fn cpu_ticks(pid: i32) -> anyhow::Result<Ticks> {
    let path = format!("/proc/{pid}/stat");
    let stat = fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    parse_stat(&stat).with_context(|| format!("{path}: unexpected contents"))
}

/// Per thread id, the name and the run time in ns (`/proc/<pid>/task/<tid>/schedstat`, first
/// field) of the process's threads now alive.
fn thread_run_ns(pid: i32) -> BTreeMap<u64, (String, u64)> {
    let mut out = BTreeMap::new();
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let dir = task.path();
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        let comm = fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let ns = fs::read_to_string(dir.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        out.insert(tid, (comm.trim().to_owned(), ns));
    }
    out
}

/// A counter of the `Udp:` lines of `/proc/net/snmp` (`RcvbufErrors`: datagrams dropped
/// because a socket's receive buffer was full).
fn udp_counter(name: &str) -> Option<u64> {
    let snmp = fs::read_to_string("/proc/net/snmp").ok()?;
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp: "));
    let (header, values) = (udp.next()?, udp.next()?);
    let i = header.split_whitespace().position(|h| h == name)?;
    values.split_whitespace().nth(i)?.parse().ok()
}

/// A `kB` field of `/proc/<pid>/status` (`VmHWM`, `VmRSS`).
fn status_kb(pid: i32, field: &str) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| {
        let rest = l.strip_prefix(field)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// One process's cost over the measured window.
#[derive(Debug, Clone, Default)]
struct Cost {
    window_s: f64,
    cpu_s: f64,
    /// Of `cpu_s`, in the kernel (system calls: here mostly reading files).
    system_cpu_s: f64,
    /// Since the process started (start-up included).
    lifetime_s: f64,
    lifetime_cpu_s: f64,
    hwm_kb: u64,
    rss_kb: u64,
    threads: u64,
    /// Unix ns of the window's start and end.
    from_ns: u64,
    to_ns: u64,
    /// The window, on the monotonic clock.
    window: Option<(Instant, Instant)>,
    /// CPU seconds in the window per thread name (threads alive at its end).
    per_thread: BTreeMap<String, f64>,
}

impl Cost {
    fn cpu_pct(&self) -> f64 {
        100.0 * self.cpu_s / self.window_s.max(1e-9)
    }

    fn hwm_mb(&self) -> f64 {
        self.hwm_kb as f64 / 1024.0
    }

    fn json(&self) -> Value {
        json!({
            "window_s": self.window_s,
            "cpu_s": self.cpu_s,
            "system_cpu_s": self.system_cpu_s,
            "cpu_pct_of_one_core": self.cpu_pct(),
            "lifetime_s": self.lifetime_s,
            "lifetime_cpu_s": self.lifetime_cpu_s,
            "peak_rss_kb": self.hwm_kb,
            "rss_kb": self.rss_kb,
            "threads": self.threads,
            "cpu_s_per_thread": self.per_thread,
        })
    }
}

/// Lets `proc` warm up, then measures its CPU over `duration`.
fn measure(proc: &mut Proc, warmup: Duration, duration: Duration) -> anyhow::Result<Cost> {
    thread::sleep(warmup.saturating_sub(proc.started.elapsed()));
    if !proc.alive() {
        bail!("{} exited during its warm-up", proc.name);
    }
    let tck = clock_ticks_per_second();
    let t0_ticks = cpu_ticks(proc.pid())?;
    let threads0 = thread_run_ns(proc.pid());
    let (t0, from_ns) = (Instant::now(), unix_ns());
    let end = t0 + duration;
    while Instant::now() < end {
        thread::sleep(
            Duration::from_millis(250).min(end.saturating_duration_since(Instant::now())),
        );
        if !proc.alive() {
            bail!("{} exited while it was measured", proc.name);
        }
    }
    let t1_ticks = cpu_ticks(proc.pid())?;
    let threads1 = thread_run_ns(proc.pid());
    let exited = threads0.keys().any(|tid| !threads1.contains_key(tid));
    let per_thread_ns = threads1.iter().fold(
        BTreeMap::<String, u64>::new(),
        |mut acc, (tid, (name, ns))| {
            let before = threads0.get(tid).map_or(0, |(_, ns)| *ns);
            *acc.entry(name.clone()).or_insert(0) += ns.saturating_sub(before);
            acc
        },
    );
    let window_s = t0.elapsed().as_secs_f64();
    let tick_cpu_s = (t1_ticks.total() - t0_ticks.total()) as f64 / tck;
    // The scheduler's run time of each thread, exact to the ns; clock ticks (10 ms) only when
    // a thread exited during the window (its run time would be missing).
    let cpu_s = if exited {
        tick_cpu_s
    } else {
        per_thread_ns.values().sum::<u64>() as f64 / 1e9
    };
    let per_thread = per_thread_ns
        .into_iter()
        .map(|(name, ns)| (name, ns as f64 / 1e9))
        .collect();
    Ok(Cost {
        window_s,
        cpu_s,
        system_cpu_s: (t1_ticks.system - t0_ticks.system) as f64 / tck,
        lifetime_s: proc.started.elapsed().as_secs_f64(),
        lifetime_cpu_s: t1_ticks.total() as f64 / tck,
        hwm_kb: status_kb(proc.pid(), "VmHWM").unwrap_or(0),
        rss_kb: status_kb(proc.pid(), "VmRSS").unwrap_or(0),
        threads: t1_ticks.threads,
        from_ns,
        to_ns: unix_ns(),
        window: Some((t0, Instant::now())),
        per_thread,
    })
}

fn free_udp_port() -> anyhow::Result<u16> {
    Ok(UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn free_tcp_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

// ---------------------------------------------------------------------------------------
// One interval: the fixture writer, the agent (twice), node_exporter

/// One subject measured at one interval.
#[derive(Debug, Clone)]
struct Subject {
    name: &'static str,
    what: &'static str,
    cost: Cost,
    /// What it sent or what was scraped from it.
    traffic: Value,
}

#[derive(Debug, Clone)]
struct LiveConfig {
    interval: f64,
    subjects: Vec<Subject>,
    fixture_cpu_pct: f64,
    standin_script: Value,
}

impl LiveConfig {
    fn subject(&self, name: &str) -> Option<&Subject> {
        self.subjects.iter().find(|s| s.name == name)
    }
}

/// Where the moving fixture tree lives: on tmpfs (`/dev/shm`) where there is one, because
/// sysfs is in memory too — on a disk file system every read would also update the file's
/// access time in the journal, a cost no real node has. Elsewhere, under `dir` (the
/// interval's work directory).
fn tree_dir(dir: &Path, interval: f64) -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.join(format!("railscope-bench-{}", slug(interval)))
    } else {
        dir.join("sys")
    }
}

fn live_config(ctx: &Ctx, interval: f64) -> anyhow::Result<LiveConfig> {
    let dir = ctx.work.join(format!("live-{}", slug(interval)));
    fs::create_dir_all(&dir)?;
    let steps = ((warmup(interval) + ctx.duration).as_secs_f64() / interval).ceil() as usize + 300;
    let script = run_json(
        Command::new(&ctx.example)
            .args(["gpu-script", "--dir"])
            .arg(dir.join("nvml"))
            .arg("--standin")
            .arg(&ctx.standin)
            .args(["--steps", &steps.to_string()])
            .args(["--interval", &interval.to_string()]),
    )?;
    let lib = PathBuf::from(
        script["lib"]
            .as_str()
            .context("gpu-script printed no lib")?,
    );
    let tree = tree_dir(&dir, interval);
    setup::step(&format!(
        "{}: starting the fixture writer (8 ports, counters moving 10 times a second)",
        label(interval)
    ));
    let (mut writer, _) = Proc::spawn_ready(
        "fixture",
        Command::new(&ctx.example)
            .args(["fixture", "--dir"])
            .arg(&tree)
            .stdin(Stdio::piped()),
        &dir,
    )?;
    let writer_t0 = (Instant::now(), cpu_ticks(writer.pid())?.total());

    let mut subjects = Vec::new();
    for (name, what, gpu) in [
        ("railscope", "railscope agent: IB + 8 GPUs (stand-in)", true),
        ("railscope-ib", "railscope agent: IB only (--no-gpu)", false),
    ] {
        setup::step(&format!(
            "{}: {what}, {:.0?} warm-up + {:.0?} measured",
            label(interval),
            warmup(interval),
            ctx.duration
        ));
        subjects.push(railscope_run(
            ctx,
            &dir,
            &tree,
            interval,
            gpu.then_some(&*lib),
            name,
            what,
        )?);
    }
    setup::step(&format!(
        "{}: node_exporter (infiniband collector) scraped every {}, {:.0?} warm-up + {:.0?} measured",
        label(interval),
        label(interval),
        warmup(interval),
        ctx.duration
    ));
    subjects.push(node_exporter_run(ctx, &dir, &tree, interval)?);
    for floor in FLOORS {
        setup::step(&format!(
            "{}: the read floor, {}, {:.0?} warm-up + {:.0?} measured",
            label(interval),
            floor.what,
            warmup(interval),
            ctx.duration
        ));
        subjects.push(read_floor_run(ctx, &dir, &tree, interval, floor)?);
    }

    let writer_cpu =
        (cpu_ticks(writer.pid())?.total() - writer_t0.1) as f64 / clock_ticks_per_second();
    let fixture_cpu_pct = 100.0 * writer_cpu / writer_t0.0.elapsed().as_secs_f64();
    drop(writer.child.stdin.take()); // the writer exits when its stdin closes
    writer.stop(libc::SIGTERM, Duration::from_secs(5))?;
    let _ = fs::remove_dir_all(&tree);
    for s in &subjects {
        eprintln!(
            "    {:14} CPU {:6.3} % of a core, peak RSS {:5.1} MB",
            s.name,
            s.cost.cpu_pct(),
            s.cost.hwm_mb()
        );
    }
    Ok(LiveConfig {
        interval,
        subjects,
        fixture_cpu_pct,
        standin_script: script,
    })
}

fn railscope_run(
    ctx: &Ctx,
    dir: &Path,
    tree: &Path,
    interval: f64,
    nvml_lib: Option<&Path>,
    name: &'static str,
    what: &'static str,
) -> anyhow::Result<Subject> {
    let port = free_udp_port()?;
    let frames_path = dir.join(format!("{name}-listen.jsonl"));
    let mut listener = Proc::spawn(
        &format!("{name}-listen"),
        Command::new(&ctx.railscope)
            .args([
                "listen",
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--key",
            ])
            .arg(&ctx.key)
            .arg("--json"),
        dir,
        Some(fs::File::create(&frames_path)?.into()),
    )?;
    thread::sleep(Duration::from_millis(300));
    let rcvbuf_errors = udp_counter("RcvbufErrors");
    let mut cmd = Command::new(&ctx.railscope);
    cmd.args([
        "agent",
        "--collector",
        &format!("127.0.0.1:{port}"),
        "--key",
    ])
    .arg(&ctx.key)
    .args(["--node", NODE, "--sysfs"])
    .arg(tree)
    .args(["--interval", &interval.to_string()])
    .env("NO_COLOR", "1");
    match nvml_lib {
        Some(lib) => cmd.arg("--nvml-lib").arg(lib),
        None => cmd.arg("--no-gpu"),
    };
    let mut agent = Proc::spawn(name, &mut cmd, dir, None)?;
    let cost = measure(&mut agent, warmup(interval), ctx.duration)?;
    let status = agent.stop(libc::SIGINT, Duration::from_secs(15))?;
    thread::sleep(Duration::from_millis(500));
    listener.stop(libc::SIGINT, Duration::from_secs(5))?;
    let log = fs::read_to_string(dir.join(format!("{name}.err"))).unwrap_or_default();
    let mut traffic = frames_summary(&fs::read_to_string(&frames_path)?, cost.from_ns, cost.to_ns);
    traffic["agent_exit"] = status.to_string().into();
    traffic["udp_rcvbuf_errors"] = rcvbuf_errors
        .zip(udp_counter("RcvbufErrors"))
        .map(|(a, b)| b.saturating_sub(a))
        .into();
    traffic["probes_unavailable"] = log.contains("unavailable").into();
    traffic["agent_sent_line"] = log
        .lines()
        .find(|l| l.contains("sent ") && l.contains("frames"))
        .map(|l| {
            l.split_once("railscope::agent: ")
                .map_or(l, |(_, m)| m)
                .to_owned()
        })
        .into();
    if !status.success() {
        bail!(
            "{name} exited with {status}; see {}",
            dir.join(format!("{name}.err")).display()
        );
    }
    Ok(Subject {
        name,
        what,
        cost,
        traffic,
    })
}

/// A process that only reads the tree's files (`agent_bench read-floor`): the least CPU any
/// agent reading those files that often can cost on this machine.
#[derive(Clone, Copy)]
struct Floor {
    name: &'static str,
    what: &'static str,
    files: &'static str,
    every: usize,
}

const FLOORS: [Floor; 2] = [
    Floor {
        name: "floor-railscope",
        what: "reads alone: railscope's 416 IB files, each every 2nd interval",
        files: "railscope",
        every: 2,
    },
    Floor {
        name: "floor-node-exporter",
        what: "reads alone: node_exporter's 200 IB files, each every interval",
        files: "node-exporter",
        every: 1,
    },
];

fn is_floor(name: &str) -> bool {
    FLOORS.iter().any(|f| f.name == name)
}

fn read_floor_run(
    ctx: &Ctx,
    dir: &Path,
    tree: &Path,
    interval: f64,
    floor: Floor,
) -> anyhow::Result<Subject> {
    let (mut proc, ready) = Proc::spawn_ready(
        floor.name,
        Command::new(&ctx.example)
            .args(["read-floor", "--sysfs"])
            .arg(tree)
            .args(["--files", floor.files])
            .args(["--interval", &interval.to_string()])
            .args(["--every", &floor.every.to_string()]),
        dir,
    )?;
    let cost = measure(&mut proc, warmup(interval), ctx.duration)?;
    proc.stop(libc::SIGTERM, Duration::from_secs(5))?;
    Ok(Subject {
        name: floor.name,
        what: floor.what,
        cost,
        traffic: ready,
    })
}

/// What `railscope listen --json` printed: frames, bytes, samples; and the bytes of the
/// frames sent during the measured window.
fn frames_summary(jsonl: &str, from_ns: u64, to_ns: u64) -> Value {
    let (mut frames, mut bytes, mut samples, mut lost) = (0u64, 0u64, 0u64, 0u64);
    let (mut window_frames, mut window_bytes) = (0u64, 0u64);
    let mut ib = BTreeSet::new();
    let mut gpu = BTreeSet::new();
    for frame in jsonl
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
    {
        let b = frame["bytes"].as_u64().unwrap_or(0);
        frames += 1;
        bytes += b;
        lost += frame["lost_before"].as_u64().unwrap_or(0);
        let sent = frame["send_unix_ns"].as_u64().unwrap_or(0);
        if (from_ns..to_ns).contains(&sent) {
            window_frames += 1;
            window_bytes += b;
        }
        for s in frame["samples"].as_array().into_iter().flatten() {
            samples += s["points"].as_array().map_or(0, |p| p.len() as u64);
            let series = format!("{}{}", s["name"].as_str().unwrap_or("?"), s["labels"]);
            if series.starts_with("railscope_ib_") {
                ib.insert(series);
            } else if series.starts_with("railscope_gpu_") {
                gpu.insert(series);
            }
        }
    }
    let window_s = (to_ns.saturating_sub(from_ns)) as f64 / 1e9;
    json!({
        "frames": frames,
        "bytes": bytes,
        "samples": samples,
        "lost_frames": lost,
        "ib_series": ib.len(),
        "gpu_series": gpu.len(),
        "window_frames": window_frames,
        "window_bytes": window_bytes,
        "bytes_per_second": window_bytes as f64 / window_s.max(1e-9),
    })
}

fn node_exporter_run(ctx: &Ctx, dir: &Path, tree: &Path, interval: f64) -> anyhow::Result<Subject> {
    let port = free_tcp_port()?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut ne = Proc::spawn(
        "node_exporter",
        Command::new(NODE_EXPORTER)
            .arg("--path.sysfs")
            .arg(tree)
            .args([
                "--collector.disable-defaults",
                "--collector.infiniband",
                "--web.disable-exporter-metrics",
                "--web.listen-address",
                &addr.to_string(),
            ]),
        dir,
        None,
    )?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(addr).is_err() {
        if Instant::now() > deadline || !ne.alive() {
            bail!(
                "node_exporter did not listen on {addr}; see {}",
                dir.join("node_exporter.err").display()
            );
        }
        thread::sleep(Duration::from_millis(50));
    }
    let before = check_scrape(addr)?;
    // A comparison with an exporter that read nothing would flatter railscope: refuse it.
    if before["collector_success"].as_f64() != Some(1.0)
        || before["infiniband_samples"].as_u64().unwrap_or(0) == 0
    {
        ne.stop(libc::SIGTERM, Duration::from_secs(5))?;
        bail!(
            "node_exporter's infiniband collector failed on the fixture tree ({before}); see {}",
            dir.join("node_exporter.err").display()
        );
    }
    let stats = Arc::new(Mutex::new(Vec::<(Instant, usize, usize)>::new()));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let scraper = {
        let (stats, errors, stop) = (stats.clone(), errors.clone(), stop.clone());
        let every = Duration::from_secs_f64(interval);
        thread::spawn(move || scrape_loop(addr, every, &stop, &stats, &errors))
    };
    let cost = measure(&mut ne, warmup(interval), ctx.duration);
    stop.store(true, Ordering::Relaxed);
    let _ = scraper.join();
    let cost = cost?;
    let after = check_scrape(addr)?;
    ne.stop(libc::SIGTERM, Duration::from_secs(5))?;

    let stats = stats.lock().expect("scraper finished").clone();
    let in_window: Vec<&(Instant, usize, usize)> = stats
        .iter()
        .filter(|s| {
            cost.window
                .is_some_and(|(from, to)| s.0 >= from && s.0 < to)
        })
        .collect();
    let scrapes = in_window.len() as u64;
    let wire: u64 = in_window.iter().map(|s| s.1 as u64).sum();
    let body: u64 = in_window.iter().map(|s| s.2 as u64).sum();
    let errors = errors.lock().expect("scraper finished").clone();
    let moved = match (
        before["tx_bytes_mlx5_0"].as_f64(),
        after["tx_bytes_mlx5_0"].as_f64(),
    ) {
        (Some(a), Some(b)) => Some(b > a),
        _ => None,
    };
    Ok(Subject {
        name: "node_exporter",
        what: "prometheus-node-exporter, infiniband collector only",
        cost: cost.clone(),
        traffic: json!({
            "scrapes_in_window": scrapes,
            "scrapes_expected": (cost.window_s / interval).round(),
            "scrape_errors": errors.len(),
            "first_errors": errors.iter().take(3).collect::<Vec<_>>(),
            "gzip_bytes_per_scrape": wire as f64 / scrapes.max(1) as f64,
            "bytes_per_second": wire as f64 / cost.window_s.max(1e-9),
            "body_bytes_per_scrape": body as f64 / scrapes.max(1) as f64,
            "check_before": before,
            "check_after": after,
            "counters_moved": moved,
        }),
    })
}

/// Scrapes `addr` every `every` until `stop`, as Prometheus does: one keep-alive connection,
/// gzip accepted, a missed slot skipped rather than caught up.
fn scrape_loop(
    addr: SocketAddr,
    every: Duration,
    stop: &AtomicBool,
    stats: &Mutex<Vec<(Instant, usize, usize)>>,
    errors: &Mutex<Vec<String>>,
) {
    let mut http = Http::new(addr, every.max(Duration::from_millis(100)));
    let start = Instant::now();
    let mut slot: u32 = 0;
    while !stop.load(Ordering::Relaxed) {
        let due = start + every * slot;
        thread::sleep(due.saturating_duration_since(Instant::now()));
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let t = Instant::now();
        match http.get(true) {
            Ok(r) if r.status == 200 => {
                stats
                    .lock()
                    .expect("stats")
                    .push((t, r.wire_bytes, r.body.len()));
            }
            Ok(r) => errors
                .lock()
                .expect("errors")
                .push(format!("HTTP {}", r.status)),
            Err(e) => errors.lock().expect("errors").push(e.to_string()),
        }
        let next = (start.elapsed().as_secs_f64() / every.as_secs_f64()).floor() as u32 + 1;
        slot = (slot + 1).max(next);
    }
}

/// One uncompressed scrape, to check what node_exporter reads: sample lines, IB sample
/// lines, whether the collector succeeded, and one data counter (to see the tree move).
fn check_scrape(addr: SocketAddr) -> anyhow::Result<Value> {
    let r = Http::new(addr, Duration::from_secs(5)).get(false)?;
    let text = String::from_utf8_lossy(&r.body);
    let samples: Vec<&str> = text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let value = |prefix: &str| {
        samples
            .iter()
            .find_map(|l| l.strip_prefix(prefix)?.trim().parse::<f64>().ok())
    };
    Ok(json!({
        "status": r.status,
        "samples": samples.len(),
        "infiniband_samples": samples.iter().filter(|l| l.starts_with("node_infiniband_")).count(),
        "collector_success": value("node_scrape_collector_success{collector=\"infiniband\"}"),
        "tx_bytes_mlx5_0": value("node_infiniband_port_data_transmitted_bytes_total{device=\"mlx5_0\",port=\"1\"}"),
        "body_bytes": r.body.len(),
    }))
}

// ---------------------------------------------------------------------------------------
// A tiny HTTP/1.1 client, enough for scraping over loopback

struct Http {
    addr: SocketAddr,
    timeout: Duration,
    conn: Option<BufReader<TcpStream>>,
}

#[derive(Debug)]
struct Response {
    status: u16,
    /// Status line, headers and body as they came over the connection.
    wire_bytes: usize,
    /// The body, de-chunked (still gzip-compressed when it was sent so).
    body: Vec<u8>,
    close: bool,
}

impl Http {
    fn new(addr: SocketAddr, timeout: Duration) -> Self {
        Self {
            addr,
            timeout,
            conn: None,
        }
    }

    /// GET /metrics with the headers Prometheus sends; retried once on a fresh connection when
    /// a kept-alive one turns out closed.
    fn get(&mut self, gzip: bool) -> io::Result<Response> {
        let request = format!(
            "GET /metrics HTTP/1.1\r\nHost: {}\r\nUser-Agent: Prometheus/2.45.0\r\n\
             Accept: application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1\r\n\
             {}X-Prometheus-Scrape-Timeout-Seconds: {}\r\n\r\n",
            self.addr,
            if gzip {
                "Accept-Encoding: gzip\r\n"
            } else {
                ""
            },
            self.timeout.as_secs_f64()
        );
        let mut last_error = None;
        for _ in 0..2 {
            if self.conn.is_none() {
                let stream = TcpStream::connect_timeout(&self.addr, self.timeout)?;
                stream.set_read_timeout(Some(self.timeout * 4))?;
                stream.set_nodelay(true)?;
                self.conn = Some(BufReader::new(stream));
            }
            let conn = self.conn.as_mut().expect("connected above");
            let result = conn
                .get_mut()
                .write_all(request.as_bytes())
                .and_then(|()| read_response(conn));
            match result {
                Ok(r) => {
                    if r.close {
                        self.conn = None;
                    }
                    return Ok(r);
                }
                Err(e) => {
                    self.conn = None;
                    last_error = Some(e);
                }
            }
        }
        Err(last_error.expect("two attempts failed"))
    }
}

fn read_line_counted(r: &mut impl BufRead, wire: &mut usize) -> io::Result<String> {
    let mut line = String::new();
    let n = r.read_line(&mut line)?;
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
    }
    *wire += n;
    Ok(line.trim_end_matches(['\r', '\n']).to_owned())
}

/// Reads one response: status line, headers, and a body framed by `Content-Length` or
/// chunked transfer encoding.
fn read_response(r: &mut impl BufRead) -> io::Result<Response> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_owned());
    let mut wire = 0;
    let status_line = read_line_counted(r, &mut wire)?;
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("bad status line"))?;
    let (mut length, mut chunked, mut close) = (None, false, false);
    loop {
        let line = read_line_counted(r, &mut wire)?;
        if line.is_empty() {
            break;
        }
        let Some((name, value)) = line.split_once(':') else {
            return Err(bad("bad header"));
        };
        let value = value.trim();
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => {
                length = Some(value.parse::<usize>().map_err(|_| bad("bad length"))?)
            }
            "transfer-encoding" => chunked = value.eq_ignore_ascii_case("chunked"),
            "connection" => close = value.eq_ignore_ascii_case("close"),
            _ => {}
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            let size_line = read_line_counted(r, &mut wire)?;
            let size = usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| bad("bad chunk size"))?;
            if size == 0 {
                // Trailers, then the empty line.
                while !read_line_counted(r, &mut wire)?.is_empty() {}
                break;
            }
            let start = body.len();
            body.resize(start + size, 0);
            r.read_exact(&mut body[start..])?;
            wire += size;
            if !read_line_counted(r, &mut wire)?.is_empty() {
                return Err(bad("chunk not followed by CRLF"));
            }
        }
    } else if let Some(n) = length {
        body.resize(n, 0);
        r.read_exact(&mut body)?;
        wire += n;
    } else {
        r.read_to_end(&mut body)?;
        wire += body.len();
        close = true;
    }
    Ok(Response {
        status,
        wire_bytes: wire,
        body,
        close,
    })
}

// ---------------------------------------------------------------------------------------
// The report

struct Facts {
    date: String,
    command: String,
    host_cpu: String,
    cores: usize,
    kernel: String,
    load_before: String,
    load_after: String,
    node_exporter: String,
    railscope_commit: String,
    duration_s: f64,
    warmup_s: f64,
    total_s: f64,
}

struct Report {
    facts: Facts,
    /// The example's `wire` output, per interval of [`WIRE_SWEEPS`].
    wire: Vec<Value>,
    traces: Value,
    live: Vec<LiveConfig>,
}

/// One goal, measured.
struct Goal {
    what: String,
    target: String,
    measured: String,
    pass: Option<bool>,
}

impl Goal {
    fn verdict(&self) -> &'static str {
        match self.pass {
            Some(true) => "PASS",
            Some(false) => "FAIL",
            None => "n/a",
        }
    }
}

fn f(v: &Value) -> Option<f64> {
    v.as_f64()
}

fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "–".into(), |v| format!("{v:.digits$}"))
}

impl Report {
    fn wire_at(&self, interval: f64) -> Option<&Value> {
        self.wire
            .iter()
            .find(|w| f(&w["interval_s"]).is_some_and(|i| (i - interval).abs() < 1e-9))
    }

    fn goals(&self) -> Vec<Goal> {
        let mut goals = Vec::new();
        if let Some(w) = self.wire_at(1.0) {
            let ours = f(&w["railscope"]["bytes_per_sample"]);
            goals.push(Goal {
                what: "bytes per sample on the wire (1 s reads, 10 s flush, schema included)"
                    .into(),
                target: format!("≤ {GOAL_BYTES_PER_SAMPLE}"),
                measured: fmt_opt(ours, 2),
                pass: ours.map(|b| b <= GOAL_BYTES_PER_SAMPLE),
            });
            for (key, name) in [
                (
                    "remote_write_grouped",
                    "remote-write, each series once per 10 s request",
                ),
                (
                    "remote_write_as_prometheus",
                    "remote-write as Prometheus sends it (one TimeSeries per sample)",
                ),
            ] {
                let ratio = ours.zip(f(&w[key]["bytes_per_sample"])).map(|(o, t)| t / o);
                goals.push(Goal {
                    what: format!("smaller than {name}"),
                    target: format!("≥ {GOAL_VS_REMOTE_WRITE:.0}×"),
                    measured: format!("{}×", fmt_opt(ratio, 1)),
                    pass: ratio.map(|r| r >= GOAL_VS_REMOTE_WRITE),
                });
            }
        }
        for l in &self.live {
            let ne = l.subject("node_exporter");
            for name in ["railscope", "railscope-ib"] {
                let Some(s) = l.subject(name) else { continue };
                if l.interval >= 1.0 {
                    goals.push(Goal {
                        what: format!("CPU at 1 s: {}", s.what),
                        target: format!("≤ {GOAL_CPU_PCT_AT_1S} % of a core"),
                        measured: format!("{:.3} %", s.cost.cpu_pct()),
                        pass: Some(s.cost.cpu_pct() <= GOAL_CPU_PCT_AT_1S),
                    });
                }
                goals.push(Goal {
                    what: format!("peak RSS at {}: {}", label(l.interval), s.what),
                    target: format!("≤ {GOAL_RSS_MB:.0} MB"),
                    measured: format!("{:.1} MB", s.cost.hwm_mb()),
                    pass: Some(s.cost.hwm_mb() <= GOAL_RSS_MB),
                });
                if let Some(ne) = ne {
                    let ratio = ne.cost.cpu_s / s.cost.cpu_s.max(1e-9);
                    goals.push(Goal {
                        what: format!(
                            "less CPU than node_exporter at {}: {}",
                            label(l.interval),
                            s.what
                        ),
                        target: format!("≥ {GOAL_VS_NODE_EXPORTER:.0}×"),
                        measured: format!("{ratio:.1}×"),
                        pass: Some(ratio >= GOAL_VS_NODE_EXPORTER),
                    });
                }
            }
        }
        let total = &self.traces["total"];
        let reduction = f(&total["reduction"]);
        goals.push(Goal {
            what: "adaptive sampling: fewer samples than a fixed interval (all traces)".into(),
            target: format!("≥ {:.0} %", GOAL_REDUCTION * 100.0),
            measured: format!("{} %", fmt_opt(reduction.map(|r| r * 100.0), 1)),
            pass: reduction.map(|r| r >= GOAL_REDUCTION),
        });
        let error = f(&total["worst_interval_error"]);
        let inconsistent = total["inconsistent_emits"].as_u64().unwrap_or(0);
        goals.push(Goal {
            what: "adaptive sampling: every sent interval's peak within 10 % (worst interval)"
                .into(),
            target: format!("≤ {:.0} %", GOAL_PEAK_ERROR * 100.0),
            measured: format!(
                "{} %{}",
                fmt_opt(error.map(|e| e * 100.0), 1),
                if inconsistent > 0 {
                    format!(", {inconsistent} inconsistent records")
                } else {
                    String::new()
                }
            ),
            pass: error.map(|e| e <= GOAL_PEAK_ERROR && inconsistent == 0),
        });
        let delay = f(&total["max_step_delay_min_intervals"]);
        goals.push(Goal {
            what: "adaptive sampling: every step change caught (worst delay)".into(),
            target: format!("≤ {GOAL_STEP_DELAY:.0} minimum intervals"),
            measured: delay.map_or_else(|| "never caught".into(), |d| format!("{d:.0}")),
            pass: Some(delay.is_some_and(|d| d <= GOAL_STEP_DELAY)),
        });
        goals
    }

    fn markdown(&self, goals: &[Goal]) -> String {
        let mut md = String::new();
        let fa = &self.facts;
        let _ = writeln!(
            md,
            "# Node agent: wire size, CPU and memory, adaptive sampling\n"
        );
        let _ = writeln!(
            md,
            "Produced by `{}` (run as root) on {}; the whole run took {:.0} s.\n",
            fa.command, fa.date, fa.total_s
        );
        let _ = writeln!(md, "| | |\n|---|---|");
        let _ = writeln!(md, "| CPU | {} |", fa.host_cpu);
        let _ = writeln!(
            md,
            "| cores | {} (shared with other work: load average {} before, {} after) |",
            fa.cores, fa.load_before, fa.load_after
        );
        let _ = writeln!(md, "| kernel | {} |", fa.kernel);
        let _ = writeln!(
            md,
            "| railscope | commit {}, release build |",
            fa.railscope_commit
        );
        let _ = writeln!(
            md,
            "| node_exporter | {} (Debian package `{NODE_EXPORTER_PACKAGE}`) |",
            fa.node_exporter
        );
        let _ = writeln!(
            md,
            "| measured | each process {:.0} s after a warm-up of {:.0} s at 1 s (30 intervals, at least 5 s), one process at a time |\n",
            fa.duration_s, fa.warmup_s
        );

        let _ = writeln!(md, "## Goals\n");
        let _ = writeln!(md, "| goal | target | measured | |\n|---|---|---|---|");
        for g in goals {
            let _ = writeln!(
                md,
                "| {} | {} | {} | **{}** |",
                g.what,
                g.target,
                g.measured,
                g.verdict()
            );
        }
        let passed = goals.iter().filter(|g| g.pass == Some(true)).count();
        let _ = writeln!(md, "\n{passed} of {} goals met.\n", goals.len());
        let _ = writeln!(
            md,
            "Two references show how far the goals are from what is possible here: the bytes \
             that xz -9e leaves of railscope's whole frame stream (section 1), and the CPU of a \
             process that does nothing but read the files (section 2, \"Reading alone\").\n"
        );

        self.wire_markdown(&mut md);
        self.live_markdown(&mut md);
        self.traces_markdown(&mut md);
        md
    }

    fn wire_markdown(&self, md: &mut String) {
        let _ = writeln!(md, "## 1. Bytes per sample\n");
        if let Some(w) = self.wire.first() {
            let c = &w["composition"];
            let fx = &w["facts"]["fixture"];
            let _ = writeln!(
                md,
                "The fixture node: 8 GPUs of the NVML stand-in (H100-like, in steady training, one \
                 scripted step per sweep) and 8 mlx5-like NDR ports ({} counter files: {} fast, \
                 {} slow, {} constant), read through railscope's own sources (`IbSysfs`, \
                 `GpuSource`): {} series ({} IB counters, {} IB gauges, {} GPU counters, {} GPU \
                 gauges), {} readings per sweep. Between sweeps the tree is advanced by the \
                 sweep interval of the node's time (fast counters at training rates whose level \
                 changes by up to ±20 % from one second to the next, error counters ticking now \
                 and then).\n",
                fx["counter_files"],
                fx["fast"],
                fx["slow"],
                fx["constant"],
                c["series"],
                c["ib_counters"],
                c["ib_gauges"],
                c["gpu_counters"],
                c["gpu_gauges"],
                fmt_opt(f(&w["readings_per_sweep"]), 0),
            );
        }
        let _ = writeln!(
            md,
            "Every reading is one sample. railscope: `FrameEncoder` with its default config \
             (1400-byte frames, 6 significant digits for non-integer gauges, schema sent in the \
             first two flushes and every 5 min, or when a collector asks), flushed every 10 s as the agent does; every byte \
             of every frame counted (headers, schema, MAC). Prometheus text: one scrape per \
             sweep, `# HELP` and `# TYPE` per family, `name{{labels}} value timestamp` per \
             series, values as Go writes them. Remote-write v1: `WriteRequest` protobuf, \
             snappy block-compressed (the HTTP body), labels `__name__`, the series' labels, \
             `instance` and `job`; either one request per 10 s with each series once, or as \
             Prometheus' queue sends it (one `TimeSeries` per sample, labels repeated, 2000 \
             samples per request, its `max_samples_per_send` default). Transport headers \
             (UDP/IP, HTTP/TCP) are not counted for any format.\n"
        );
        let _ = writeln!(
            md,
            "| interval | sweeps | samples | format | bytes | B/sample | ÷ railscope |\n|---|--:|--:|---|--:|--:|--:|"
        );
        for w in &self.wire {
            let interval = f(&w["interval_s"]).unwrap_or(0.0);
            let ours = f(&w["railscope"]["bytes_per_sample"]);
            let rows: [(&str, &Value); 7] = [
                ("railscope frames", &w["railscope"]),
                ("railscope frames, schema excluded", &w["railscope"]),
                (
                    "railscope's whole frame stream through xz -9e (across frames: not \
                     sendable as UDP frames, which decode alone)",
                    &w["railscope_stream_xz"],
                ),
                ("Prometheus text exposition", &w["prometheus_text"]),
                (
                    "Prometheus text, gzip (as a scrape travels)",
                    &w["prometheus_text"],
                ),
                (
                    "remote-write, each series once per 10 s request",
                    &w["remote_write_grouped"],
                ),
                (
                    "remote-write as Prometheus sends it",
                    &w["remote_write_as_prometheus"],
                ),
            ];
            for (i, (name, v)) in rows.iter().enumerate() {
                let (bytes, per) = match i {
                    1 => (
                        v["bytes"]
                            .as_u64()
                            .zip(v["schema_bytes"].as_u64())
                            .map(|(b, s)| b - s),
                        f(&v["bytes_per_sample_without_schema"]),
                    ),
                    4 => (v["gzip_bytes"].as_u64(), f(&v["gzip_bytes_per_sample"])),
                    _ => (v["bytes"].as_u64(), f(&v["bytes_per_sample"])),
                };
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {name} | {} | {} | {} |",
                    label(interval),
                    w["sweeps"],
                    w["readings"],
                    bytes.map_or_else(|| "–".into(), |b| b.to_string()),
                    fmt_opt(per, 2),
                    fmt_opt(per.zip(ours).map(|(p, o)| p / o), 1),
                );
            }
            let a = &w["railscope_adaptive"];
            let _ = writeln!(
                md,
                "| {} | {} | {} | railscope frames with adaptive sampling (the agent's default): {} records for {} readings | {} | {} per reading | {} |",
                label(interval),
                w["sweeps"],
                w["readings"],
                a["samples_sent"],
                a["readings"],
                a["bytes"],
                fmt_opt(f(&a["bytes_per_reading"]), 2),
                fmt_opt(f(&a["bytes_per_reading"]).zip(ours).map(|(p, o)| p / o), 1),
            );
        }
        if let Some(w) = self.wire_at(1.0) {
            let r = &w["railscope"];
            let bytes = r["bytes"].as_u64().unwrap_or(0);
            let schema = r["schema_bytes"].as_u64().unwrap_or(0);
            let src = |k: &str, field: &str| fmt_opt(f(&r["by_source"][k][field]), 2);
            let _ = writeln!(
                md,
                "\nWhere railscope's bytes go at 1 s: {} frames; the schema (series names and \
                 labels) is {schema} of the {bytes} bytes ({:.0} %). Every series' entry once \
                 takes {} bytes; it is sent in the first two flushes and again every 5 min (the \
                 encoder's `schema_refresh`), and each frame repeats the strings its entries use. \
                 IB series alone: {} B/sample ({} without schema); GPU series alone: {} ({}). \
                 With adaptive sampling the agent sends fewer records, but a gauge envelope \
                 carries three values and the schema costs the same, so the bytes shrink less \
                 than the record count.\n",
                r["frames"],
                100.0 * schema as f64 / bytes.max(1) as f64,
                r["schema_bytes_one_flush"],
                src("ib", "bytes_per_sample"),
                src("ib", "bytes_per_sample_without_schema"),
                src("gpu", "bytes_per_sample"),
                src("gpu", "bytes_per_sample_without_schema"),
            );
        }
        for w in &self.wire {
            let xz = f(&w["railscope_stream_xz"]["bytes_per_sample"]);
            let rw = f(&w["remote_write_as_prometheus"]["bytes_per_sample"]);
            let _ = writeln!(
                md,
                "- At {}, xz -9e over railscope's whole frame stream (a compressor that sees every \
                 earlier frame, which a receiver of lossy UDP cannot rely on) leaves {} B/sample: \
                 remote-write as Prometheus sends it is {}× that. That is how far a lossless coding \
                 of these samples gets with every redundancy a strong general-purpose compressor \
                 finds, cross-frame included.",
                label(f(&w["interval_s"]).unwrap_or(0.0)),
                fmt_opt(xz, 2),
                fmt_opt(rw.zip(xz).map(|(r, x)| r / x), 1),
            );
        }
        let _ = writeln!(md);
    }

    fn live_markdown(&self, md: &mut String) {
        let _ = writeln!(md, "## 2. CPU and memory\n");
        let _ = writeln!(
            md,
            "A moving copy of the fixture tree on tmpfs (`/dev/shm`, in memory as sysfs is; 8 \
             mlx5-like ports, counters rewritten in place 10 times a second by a separate writer \
             process, as sysfs changes a file's contents but never the file) is read by:\n\n\
             - `railscope agent --collector 127.0.0.1:<port> --key <file> --node {NODE} --sysfs <tree> \
             --nvml-lib <stand-in> --interval <1|0.1>` (flush every 10 s, adaptive sampling on: \
             the defaults), sending to `railscope listen --json`; and the same with `--no-gpu` \
             instead of `--nvml-lib` (IB only: the same work as node_exporter's). The agent also \
             tries to load its eBPF probes: on this host they are unavailable (no `ib_core`), so it \
             reports them once and checks again every second, as it would on a node without RDMA \
             drivers loaded;\n\
             - `prometheus-node-exporter --path.sysfs <tree> --collector.disable-defaults \
             --collector.infiniband --web.disable-exporter-metrics`, scraped over loopback at the \
             same interval as Prometheus scrapes (one kept-alive connection, `Accept-Encoding: \
             gzip`, Prometheus' `Accept` header).\n\n\
             CPU: the scheduler's run time of each thread of the process \
             (`/proc/<pid>/task/<tid>/schedstat`, exact to the ns) over the measured window, in % \
             of one core, after a warm-up of 30 intervals (so the agent's sampler has filled its \
             windows). The % system shown comes from utime and stime in `/proc/<pid>/stat`, \
             sampled at {:.0} Hz clock ticks: only indicative. Peak RSS: `VmHWM` from \
             `/proc/<pid>/status` at the end of the window.\n",
            clock_ticks_per_second(),
        );
        let _ = writeln!(
            md,
            "| interval | process | CPU, % of one core | CPU per read or scrape | CPU incl. start-up | peak RSS | threads | on the wire | CPU ÷ railscope's (IB + GPUs) |\n|---|---|--:|--:|--:|--:|--:|---|--:|"
        );
        for l in &self.live {
            let ours = l.subject("railscope").map(|s| s.cost.cpu_s);
            for s in &l.subjects {
                let t = &s.traffic;
                let wire = if is_floor(s.name) {
                    format!(
                        "nothing sent; {} preads an interval of {} open files",
                        t["reads_per_interval"], t["files"]
                    )
                } else if s.name == "node_exporter" {
                    format!(
                        "{} scrapes of {} expected, {:.0} B/s gzip ({:.0} B per scrape, {:.0} B uncompressed)",
                        t["scrapes_in_window"],
                        t["scrapes_expected"],
                        f(&t["bytes_per_second"]).unwrap_or(0.0),
                        f(&t["gzip_bytes_per_scrape"]).unwrap_or(0.0),
                        f(&t["body_bytes_per_scrape"]).unwrap_or(0.0),
                    )
                } else {
                    format!(
                        "{:.0} B/s; {} samples of {} IB and {} GPU series in {} frames, {} lost",
                        f(&t["bytes_per_second"]).unwrap_or(0.0),
                        t["samples"],
                        t["ib_series"],
                        t["gpu_series"],
                        t["frames"],
                        t["lost_frames"],
                    )
                };
                let _ = writeln!(
                    md,
                    "| {} | {} | {:.3} % ({:.0} % system) | {:.2} ms | {:.2} s in {:.0} s | {:.1} MB | {} | {wire} | {} |",
                    label(l.interval),
                    s.what,
                    s.cost.cpu_pct(),
                    100.0 * s.cost.system_cpu_s / s.cost.cpu_s.max(1e-9),
                    1000.0 * s.cost.cpu_s * l.interval / s.cost.window_s.max(1e-9),
                    s.cost.lifetime_cpu_s,
                    s.cost.lifetime_s,
                    s.cost.hwm_mb(),
                    s.cost.threads,
                    fmt_opt(ours.map(|o| s.cost.cpu_s / o.max(1e-9)), 1),
                );
            }
        }
        let _ = writeln!(md);
        for l in &self.live {
            for s in l
                .subjects
                .iter()
                .filter(|s| s.name != "node_exporter" && !is_floor(s.name))
            {
                let threads: Vec<String> = s
                    .cost
                    .per_thread
                    .iter()
                    .map(|(name, cpu)| {
                        format!("`{name}` {:.3} %", 100.0 * cpu / s.cost.window_s.max(1e-9))
                    })
                    .collect();
                let t = &s.traffic;
                let lost = match (t["lost_frames"].as_u64(), t["udp_rcvbuf_errors"].as_u64()) {
                    (Some(0) | None, _) => String::new(),
                    (Some(n), Some(e)) => format!(
                        " {n} frames were lost on the way to `railscope listen` (the host \
                         counted {e} UDP datagrams dropped for a full receive buffer meanwhile: \
                         a flush sends its frames back to back, and the listener, printing \
                         JSON, falls behind); the agent itself reports: {}.",
                        t["agent_sent_line"].as_str().unwrap_or("?")
                    ),
                    (Some(n), None) => {
                        format!(" {n} frames were lost on the way to `railscope listen`.")
                    }
                };
                let _ = writeln!(
                    md,
                    "- {}, {}: CPU by thread: {} (`railscope-poll` reads the sources; the main \
                     thread samples, encodes, sends and checks for the probes' kernel modules).{lost}",
                    label(l.interval),
                    s.what,
                    threads.join(", "),
                );
            }
            if let Some(ne) = l.subject("node_exporter") {
                let t = &ne.traffic;
                let _ = writeln!(
                    md,
                    "- {}: node_exporter's scrape holds {} samples ({} of them `node_infiniband_*`; \
                     collector success {}; port data counters moved between the checks before and \
                     after: {}); {} scrape errors. The fixture writer used {:.2} % of a core. The \
                     stand-in script has {} steps ({} bytes).",
                    label(l.interval),
                    t["check_after"]["samples"],
                    t["check_after"]["infiniband_samples"],
                    t["check_after"]["collector_success"],
                    t["counters_moved"],
                    t["scrape_errors"],
                    l.fixture_cpu_pct,
                    l.standin_script["steps"],
                    l.standin_script["script_bytes"],
                );
            }
        }
        let _ = writeln!(
            md,
            "\nWhat differs between the processes: railscope reads more per port than node_exporter \
             1.5 (every file of `counters/` and `hw_counters/`, the device-level `hw_counters/`, \
             and the port attributes, against node_exporter's `counters/` and attributes), but \
             reads each file only when the sampler says its series is due: a stable series every \
             second interval, one whose rate moves (the data and packet counters of a training \
             job) every interval; it keeps the files open and reads each with one `pread`, where \
             node_exporter opens, reads and closes each file at every scrape; the GPU \
             figures are railscope reading the stand-in library through nvml-wrapper (the \
             stand-in's own work and its parsed script count in the agent's CPU and RSS; a real \
             NVML's calls cost differently); node_exporter does not read GPUs at all. The numbers \
             come from one machine with two cores shared with other work, so a few hundredths of \
             a percent are noise.\n"
        );
        self.floor_markdown(md);
    }

    /// What reading alone costs, against node_exporter: the most less CPU than node_exporter
    /// any agent reading those files that often could show on this machine.
    fn floor_markdown(&self, md: &mut String) {
        let _ = writeln!(
            md,
            "**Reading alone.** The rows \"reads alone\" are `agent_bench read-floor`, a process \
             that only reads the tree: every file opened once and kept open, one `pread` and an integer parse per \
             read, nothing sampled, encoded or sent. A stable series must be read at least every \
             2nd interval for a step in it to be caught within 2 minimum intervals (the adaptive \
             sampling goal), which is what the first floor reads; the second reads \
             node_exporter's own files as often as node_exporter is scraped.\n"
        );
        for l in &self.live {
            let Some(ne) = l.subject("node_exporter") else {
                continue;
            };
            let parts: Vec<String> = FLOORS
                .iter()
                .filter_map(|floor| l.subject(floor.name))
                .map(|s| {
                    format!(
                        "{} costs {:.3} % of a core, so node_exporter ({:.3} %) uses {:.1}× as much",
                        s.what,
                        s.cost.cpu_pct(),
                        ne.cost.cpu_pct(),
                        ne.cost.cpu_s / s.cost.cpu_s.max(1e-9),
                    )
                })
                .collect();
            if !parts.is_empty() {
                let _ = writeln!(md, "- {}: {}.", label(l.interval), parts.join("; "));
            }
        }
        let _ = writeln!(
            md,
            "\nAn agent that reads these files that often cannot use less CPU than its reads: \
             where node_exporter uses less than {GOAL_VS_NODE_EXPORTER:.0}× a floor's CPU, the \
             goal of {GOAL_VS_NODE_EXPORTER:.0}× less CPU than node_exporter is out of reach on \
             this machine for any agent that reads those files at that rate.\n"
        );
    }

    fn traces_markdown(&self, md: &mut String) {
        let t = &self.traces;
        let _ = writeln!(md, "## 3. Adaptive sampling on workload-shaped traces\n");
        let _ = writeln!(
            md,
            "`sampler_traces::standard({})` (one tick per second, about two hours \
             each: training steps with compute and communication phases, data-loader stalls, \
             evaluation and checkpoint pauses, idle gaps, a thermal throttle, a link trained \
             down, error bursts), each through `evaluate` with the trace's default sampler \
             config (window {}, tolerance {}, density {}, cap {} s, every minimum interval \
             read). Samples are the records sent (a counter value or a gauge envelope); the peak \
             error is, over every interval the adaptive run sent, its envelope's max against the \
             true max of the trace over the time it covers (counters: the derived rate against \
             the true mean rate); a step's delay counts minimum intervals from the last tick \
             before the step until the sampler is at its minimum interval and has sent a record \
             showing the new level (a fixed-interval reader scores 1).\n",
            t["seed"],
            t["config"]["window"],
            t["config"]["peak_tolerance"],
            t["config"]["density_threshold"],
            t["config"]["max_interval_s"],
        );
        let _ = writeln!(
            md,
            "| trace | kind | samples adaptive / fixed | reduction | worst interval peak error | steps | worst step delay (min intervals) |\n|---|---|--:|--:|--:|--:|--:|"
        );
        let row = |md: &mut String, e: &Value| {
            let _ = writeln!(
                md,
                "| {} | {} | {} / {} | {} % | {} % | {} | {} |",
                e["trace"].as_str().unwrap_or("?"),
                e["kind"].as_str().unwrap_or("all"),
                e["samples_adaptive"],
                e["samples_fixed"],
                fmt_opt(f(&e["reduction"]).map(|r| r * 100.0), 1),
                fmt_opt(f(&e["worst_interval_error"]).map(|r| r * 100.0), 1),
                e["steps"],
                match (e["steps"].as_u64(), f(&e["max_step_delay_min_intervals"])) {
                    (Some(0), _) => "–".to_owned(),
                    (_, Some(d)) => format!("{d:.0}"),
                    (_, None) => "never".to_owned(),
                },
            );
        };
        for e in t["traces"].as_array().into_iter().flatten() {
            row(md, e);
        }
        row(md, &t["total"]);
        row(md, &t["other_seeds"]);
        let _ = writeln!(
            md,
            "\nThe last row repeats the five traces with seeds {} to {}, for robustness.\n",
            t["seed"].as_u64().unwrap_or(1) + 1,
            t["seed"].as_u64().unwrap_or(1) + 5
        );
    }

    fn json(&self, goals: &[Goal]) -> Value {
        let fa = &self.facts;
        json!({
            "command": fa.command,
            "date": fa.date,
            "machine": {
                "cpu": fa.host_cpu,
                "cores": fa.cores,
                "kernel": fa.kernel,
                "load_average_before": fa.load_before,
                "load_average_after": fa.load_after,
            },
            "railscope_commit": fa.railscope_commit,
            "node_exporter": fa.node_exporter,
            "duration_s": fa.duration_s,
            "warmup_s": fa.warmup_s,
            "total_s": fa.total_s,
            "goals": goals.iter().map(|g| json!({
                "goal": g.what,
                "target": g.target,
                "measured": g.measured,
                "pass": g.pass,
            })).collect::<Vec<_>>(),
            "bytes_per_sample": self.wire,
            "live": self.live.iter().map(|l| json!({
                "interval_s": l.interval,
                "fixture_writer_cpu_pct": l.fixture_cpu_pct,
                "standin_script": l.standin_script,
                "processes": l.subjects.iter().map(|s| json!({
                    "name": s.name,
                    "what": s.what,
                    "cost": s.cost.json(),
                    "traffic": s.traffic,
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "adaptive_sampling": self.traces,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_proc_stat() {
        let stat = "4242 (rail scope) S 1 4242 4242 0 -1 4194560 900 0 0 0 731 129 0 0 20 0 5 0 \
                    12345 123456789 3000 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0";
        let t = parse_stat(stat).unwrap();
        assert_eq!((t.user, t.system, t.threads, t.total()), (731, 129, 5, 860));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn reads_chunked_and_sized_responses() {
        let chunked = "HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n\
                       5\r\nhello\r\n3;ext=1\r\nabc\r\n0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\
                       Connection: close\r\n\r\nok";
        let mut r = io::Cursor::new(chunked.as_bytes());
        let a = read_response(&mut r).unwrap();
        assert_eq!(
            (a.status, a.body.as_slice(), a.close),
            (200, &b"helloabc"[..], false)
        );
        assert_eq!(
            a.wire_bytes,
            chunked.find("HTTP/1.1 200 OK\r\nContent-Length").unwrap()
        );
        let b = read_response(&mut r).unwrap();
        assert_eq!((b.body.as_slice(), b.close), (&b"ok"[..], true));
        assert!(read_response(&mut r).is_err());
    }

    #[test]
    fn sums_the_frames_the_listener_printed() {
        let jsonl = concat!(
            r#"{"bytes":1000,"send_unix_ns":5,"lost_before":0,"samples":[{"name":"railscope_ib_x_total","labels":{"device":"mlx5_0"},"points":[1,2,3]},{"name":"railscope_gpu_power_watts","labels":{"gpu":"0"},"points":[1]}]}"#,
            "\n",
            r#"{"bytes":400,"send_unix_ns":50,"lost_before":1,"samples":[{"name":"railscope_ib_x_total","labels":{"device":"mlx5_0"},"points":[4]}]}"#,
            "\nnot json\n"
        );
        let s = frames_summary(jsonl, 10, 100);
        assert_eq!(s["frames"], 2);
        assert_eq!(s["bytes"], 1400);
        assert_eq!(s["samples"], 5);
        assert_eq!(s["lost_frames"], 1);
        assert_eq!(
            (s["ib_series"].clone(), s["gpu_series"].clone()),
            (json!(1), json!(1))
        );
        assert_eq!(s["window_bytes"], 400);
    }

    fn cost(cpu_s: f64, hwm_kb: u64) -> Cost {
        Cost {
            window_s: 60.0,
            cpu_s,
            hwm_kb,
            ..Cost::default()
        }
    }

    fn subject(name: &'static str, cpu_s: f64, hwm_kb: u64) -> Subject {
        Subject {
            name,
            what: name,
            cost: cost(cpu_s, hwm_kb),
            traffic: json!({}),
        }
    }

    #[test]
    fn goals_are_judged_honestly() {
        let report = Report {
            facts: Facts {
                date: "2026-01-01 00:00 UTC".into(),
                command: "cargo xtask bench agent".into(),
                host_cpu: "cpu".into(),
                cores: 2,
                kernel: "6.1".into(),
                load_before: "0 0 0".into(),
                load_after: "0 0 0".into(),
                node_exporter: "node_exporter 1.5.0".into(),
                railscope_commit: "abc".into(),
                duration_s: 60.0,
                warmup_s: 5.0,
                total_s: 500.0,
            },
            wire: vec![json!({
                "interval_s": 1.0, "sweeps": 300, "readings": 1000,
                "composition": {}, "facts": {"fixture": {}},
                "railscope": {"bytes_per_sample": 1.5, "bytes": 1500, "schema_bytes": 100, "bytes_per_sample_without_schema": 1.4},
                "railscope_adaptive": {"bytes_per_reading": 1.0},
                "prometheus_text": {"bytes_per_sample": 110.0, "gzip_bytes_per_sample": 9.0},
                "remote_write_grouped": {"bytes_per_sample": 4.5},
                "remote_write_as_prometheus": {"bytes_per_sample": 31.5},
            })],
            traces: json!({
                "seed": 1, "config": {}, "traces": [],
                "total": {"reduction": 0.78, "worst_interval_error": 0.0, "inconsistent_emits": 0, "max_step_delay_min_intervals": 1.0, "steps": 21},
                "other_seeds": {"steps": 0},
            }),
            live: vec![LiveConfig {
                interval: 1.0,
                subjects: vec![
                    subject("railscope", 0.24, 20 * 1024),
                    subject("railscope-ib", 0.12, 12 * 1024),
                    subject("node_exporter", 1.8, 25 * 1024),
                ],
                fixture_cpu_pct: 1.0,
                standin_script: json!({}),
            }],
        };
        let goals = report.goals();
        let verdict = |what: &str| {
            goals
                .iter()
                .find(|g| g.what.contains(what))
                .unwrap_or_else(|| panic!("no goal {what}"))
                .verdict()
        };
        assert_eq!(verdict("bytes per sample"), "PASS");
        assert_eq!(verdict("each series once"), "FAIL"); // 3x
        assert_eq!(verdict("as Prometheus sends"), "PASS"); // 21x
        assert_eq!(verdict("CPU at 1 s: railscope-ib"), "PASS"); // 0.2 %
        assert_eq!(
            verdict("less CPU than node_exporter at 1 s: railscope-ib"),
            "PASS"
        ); // 15x
        assert_eq!(
            verdict("less CPU than node_exporter at 1 s: railscope"),
            "FAIL"
        ); // 7.5x
        assert_eq!(verdict("fewer samples"), "PASS");
        assert_eq!(verdict("step change"), "PASS");
        let md = report.markdown(&goals);
        assert!(md.contains("`cargo xtask bench agent`"), "{md}");
        assert!(md.contains("| **FAIL** |"), "{md}");
        assert_eq!(
            report.json(&goals)["goals"].as_array().unwrap().len(),
            goals.len()
        );
    }

    #[test]
    fn labels_of_intervals() {
        assert_eq!(label(1.0), "1 s");
        assert_eq!(label(0.1), "100 ms");
        assert_eq!(slug(0.1), "100ms");
    }
}
