//! `cargo xtask run`: the main job on this node — build, start a collector (data under a
//! default directory, a key made on first run), load the probes and run the agent sending to
//! it, print where to look, and stop both at Ctrl-C.

use std::{
    io::Read as _,
    net::{SocketAddr, TcpStream},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Child, Command},
    sync::atomic::{AtomicI32, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{build, cargo, setup};

/// Where the local collector listens (loopback only).
const UDP: &str = "127.0.0.1:7670";
const HTTP: &str = "127.0.0.1:7671";

#[derive(Debug, clap::Args)]
pub(crate) struct Options {
    /// The collector's data directory and key (default: ~/.local/share/railscope).
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Run the agent alone, printing events, without a collector.
    #[arg(long)]
    pub no_collector: bool,
    /// The demo, for a machine without RDMA devices or GPUs: a test-bed guest with
    /// soft-RoCE traffic in two jobs, a flapping link and the NVML stand-in, its agent
    /// sending to a local collector (data under DIR/demo); prints the dashboard's URL.
    #[arg(long, conflicts_with = "no_collector")]
    pub demo: bool,
    /// With --demo: stop after this many seconds and check what the API shows (live data,
    /// both jobs, a flapping-port finding, from 120 s a lost GPU) instead of running until Ctrl-C.
    #[arg(long, value_name = "SECONDS", requires = "demo")]
    pub demo_seconds: Option<u64>,
    /// Arguments passed to `railscope agent` (e.g. `-- --json`).
    #[arg(last = true)]
    pub agent_args: Vec<String>,
    #[command(flatten)]
    pub setup: setup::Options,
}

pub(crate) fn run(options: &Options) -> anyhow::Result<()> {
    setup::require_root("loading eBPF probes")?;
    let tools = setup::run(&options.setup)?;
    if !options.demo
        && let Some(why) = nothing_to_watch()
    {
        println!(
            "{why}: railscope has little to show here; `cargo xtask run --demo` runs it on a \
             test-bed guest with soft-RoCE traffic, a flapping link and a stand-in for 8 GPUs"
        );
    }
    let railscope = build::railscope_binary(&tools, true)?;
    if options.no_collector {
        return exec_agent(&railscope, &options.agent_args);
    }
    setup::step("building the collector");
    let mut cmd = cargo::command(&tools);
    cmd.args([
        "build",
        "--release",
        "--package",
        "monitor-collector",
        "--bin",
        "railscope-collector",
    ]);
    let built = cargo::build_executables(cmd)?;
    let collector_bin = built
        .iter()
        .find(|(name, _)| name == "railscope-collector")
        .map(|(_, path)| path.clone())
        .context("cargo did not report the railscope-collector binary")?;
    if collector_bin.parent() != railscope.parent() {
        bail!(
            "railscope-collector ({}) is not next to railscope ({})",
            collector_bin.display(),
            railscope.display()
        );
    }

    let data = options.data.clone().unwrap_or_else(default_data_dir);
    if options.demo {
        return crate::demo::run(
            &tools,
            &railscope,
            UDP,
            HTTP,
            &crate::demo::data_dir(&data),
            options.demo_seconds,
        );
    }
    std::fs::create_dir_all(&data)
        .with_context(|| format!("cannot create the data directory {}", data.display()))?;
    let key = key_file(&data)?;
    setup::step(&format!(
        "starting the collector: UDP {UDP}, HTTP {HTTP}, data under {}",
        data.display()
    ));
    // From here Ctrl-C (which reaches the children too: same process group) and SIGTERM are
    // noted, not fatal: this process waits for its children and says how they ended. (The
    // children start with the default actions: exec resets caught signals.)
    let stop = StopRequest::install();
    let mut collector = Command::new(&railscope)
        .args(["collector", "run", "--listen", UDP, "--http", HTTP])
        .arg("--key")
        .arg(&key)
        .arg("--data")
        .arg(data.join("archive"))
        .spawn()
        .context("cannot start the collector")?;
    if let Err(e) = wait_for_http(&mut collector) {
        let _ = collector.kill();
        let _ = collector.wait();
        return Err(e);
    }
    if stop.signal().is_some() {
        let status = stop_child(&mut collector)?;
        println!("stopped before the agent started: the collector exited ({status})");
        return Ok(());
    }
    println!(
        "\nrailscope is running: the agent below sends to the collector on {UDP}.\n\
         \x20 dashboard           http://{HTTP}/   (open it in a browser)\n\
         \x20 /metrics            curl http://{HTTP}/metrics\n\
         \x20 nodes (live)        curl http://{HTTP}/api/v1/live/nodes\n\
         \x20 events (live)       curl 'http://{HTTP}/api/v1/live/events?limit=20'\n\
         \x20 queries             {} query --help   (the HTTP API under http://{HTTP}/api/v1/)\n\
         \x20 key, data           {}, {}\n\
         Ctrl-C stops both.\n",
        railscope.display(),
        key.display(),
        data.join("archive").display(),
    );
    setup::step("starting the agent");
    let agent = match Command::new(&railscope)
        .args(["agent", "--collector", UDP])
        .arg("--key")
        .arg(&key)
        // Beside the demo's archive, not the system's /var/lib/railscope-agent.
        .arg("--spool-dir")
        .arg(data.join("agent-spool"))
        .args(&options.agent_args)
        .spawn()
    {
        Ok(agent) => agent,
        Err(e) => {
            let _ = stop_child(&mut collector);
            return Err(anyhow::Error::from(e).context("cannot start the agent"));
        }
    };
    let ended = supervise(agent, collector, stop)?;
    println!("{}", ended.message());
    ended.result()
}

/// SIGINT or SIGTERM received by this process: the signal's number, 0 while none came.
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn note_stop(signal: libc::c_int) {
    STOP_SIGNAL.store(signal, Ordering::Relaxed);
}

/// Whether (and by which signal) the user asked `cargo xtask run` to stop.
#[derive(Clone, Copy)]
pub(crate) struct StopRequest(&'static AtomicI32);

impl StopRequest {
    /// Catches SIGINT and SIGTERM in this process from now on (the default actions would
    /// end it before its children, with status 130 or 143 and nothing said).
    pub(crate) fn install() -> Self {
        let handler = note_stop as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: the handler only stores into an atomic (async-signal-safe).
        unsafe {
            libc::signal(libc::SIGINT, handler);
            libc::signal(libc::SIGTERM, handler);
        }
        Self(&STOP_SIGNAL)
    }

    /// The stop signal received, if any.
    fn signal(self) -> Option<libc::c_int> {
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            s => Some(s),
        }
    }
}

/// How `cargo xtask run` ended: how the agent and the collector exited, and whether the user
/// asked for it.
#[derive(Debug)]
struct Ended {
    stop_signal: Option<libc::c_int>,
    agent: std::process::ExitStatus,
    collector: std::process::ExitStatus,
}

impl Ended {
    fn message(&self) -> String {
        let how = |status: &std::process::ExitStatus| {
            if status.success() {
                "cleanly".to_owned()
            } else {
                format!("({status})")
            }
        };
        let agent = format!("the agent stopped {}", how(&self.agent));
        let collector = format!("the collector stopped {}", how(&self.collector));
        match self.stop_signal {
            Some(signal) => format!(
                "\n{} received: {agent}, {collector}.",
                if signal == libc::SIGINT {
                    "Ctrl-C (SIGINT)"
                } else {
                    "SIGTERM"
                }
            ),
            None => format!("\nthe agent exited: {agent}; {collector}."),
        }
    }

    /// Success when the user asked both to stop and they did (cleanly or by that signal), or
    /// when the agent ended by itself with success.
    fn result(&self) -> anyhow::Result<()> {
        use std::os::unix::process::ExitStatusExt as _;
        let stopped = |status: &std::process::ExitStatus| {
            status.success()
                || (self.stop_signal.is_some()
                    && matches!(status.signal(), Some(libc::SIGINT | libc::SIGTERM)))
        };
        if !stopped(&self.agent) {
            bail!("the agent exited with {}", self.agent);
        }
        if self.stop_signal.is_some() && !stopped(&self.collector) {
            bail!("the collector exited with {}", self.collector);
        }
        Ok(())
    }
}

/// Waits for the agent; on a stop request passes SIGTERM on to it (the terminal's Ctrl-C
/// reached it already; a SIGTERM sent to this process alone did not), then stops the
/// collector.
fn supervise(mut agent: Child, mut collector: Child, stop: StopRequest) -> anyhow::Result<Ended> {
    let mut passed_on = false;
    let agent_status = loop {
        if let Some(status) = agent.try_wait().context("waiting for the agent")? {
            break status;
        }
        if !passed_on && stop.signal().is_some() {
            passed_on = true;
            // SAFETY: signalling our own child, not yet reaped.
            unsafe { libc::kill(agent.id() as libc::pid_t, libc::SIGTERM) };
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let collector_status = stop_child(&mut collector);
    Ok(Ended {
        stop_signal: stop.signal(),
        agent: agent_status,
        collector: collector_status.context("waiting for the collector")?,
    })
}

/// `$XDG_DATA_HOME/railscope`, or `~/.local/share/railscope`.
fn default_data_dir() -> PathBuf {
    std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("/var/lib"))
        .join("railscope")
}

/// The key under `data`, made (32 random bytes, mode 600) on first run.
fn key_file(data: &Path) -> anyhow::Result<PathBuf> {
    let path = data.join("wire.key");
    if path.exists() {
        return Ok(path);
    }
    let mut key = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut key))
        .context("reading /dev/urandom for a new key")?;
    std::fs::write(&path, key).with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    setup::step(&format!(
        "made a new key: {} (copy it to the nodes that send here)",
        path.display()
    ));
    Ok(path)
}

fn wait_for_http(collector: &mut Child) -> anyhow::Result<()> {
    let addr: SocketAddr = HTTP.parse().expect("a socket address");
    let start = Instant::now();
    while TcpStream::connect(addr).is_err() {
        if let Some(status) = collector.try_wait()? {
            bail!("the collector exited ({status}); see its messages above");
        }
        if start.elapsed() > Duration::from_secs(10) {
            bail!("the collector did not open {HTTP} within 10 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// SIGTERM to `child` unless it exited already, and its exit status.
fn stop_child(child: &mut Child) -> std::io::Result<std::process::ExitStatus> {
    if let Some(status) = child.try_wait()? {
        return Ok(status);
    }
    // SAFETY: signalling our own child, not yet reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    child.wait()
}

/// The agent alone, in place of this process, so Ctrl-C and the exit status are its own.
fn exec_agent(railscope: &Path, args: &[String]) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt as _;
    setup::step(&format!(
        "starting {} agent (Ctrl-C stops it)",
        railscope.display()
    ));
    let err = Command::new(railscope).arg("agent").args(args).exec();
    bail!("could not start {}: {err}", railscope.display())
}

/// Why this node has nothing for railscope to watch (no RDMA device and no GPU), or `None`.
fn nothing_to_watch() -> Option<String> {
    let rdma = std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some());
    let gpu = Path::new("/dev/nvidia0").exists()
        || ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"]
            .iter()
            .any(|d| Path::new(d).join("libnvidia-ml.so.1").exists());
    (!rdma && !gpu).then(|| {
        "this node has no RDMA device (/sys/class/infiniband is empty) and no NVIDIA GPU".into()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for the agent or the collector: runs until SIGTERM, then exits 0, or with
    /// `code` by itself after `after` seconds.
    fn stand_in(exit_on_term: bool, own_exit: Option<(u32, i32)>) -> Child {
        let trap = if exit_on_term {
            "trap 'exit 0' TERM; "
        } else {
            ""
        };
        let body = match own_exit {
            Some((after, code)) => format!("sleep {after}; exit {code}"),
            None => "while :; do sleep 0.05; done".to_owned(),
        };
        // It says when its trap is set, so a signal sent at once finds the trap in place.
        let mut child = Command::new("sh")
            .args(["-c", &format!("{trap}echo ready; {body}")])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut ready = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut ready,
        )
        .unwrap();
        assert_eq!(ready, "ready\n");
        child
    }

    fn request(signal: libc::c_int) -> StopRequest {
        StopRequest(Box::leak(Box::new(AtomicI32::new(signal))))
    }

    #[test]
    fn ctrl_c_stops_both_and_says_so() {
        let ended = supervise(
            stand_in(true, None),
            stand_in(true, None),
            request(libc::SIGINT),
        )
        .unwrap();
        assert!(ended.result().is_ok(), "{ended:?}");
        assert_eq!(
            ended.message(),
            "\nCtrl-C (SIGINT) received: the agent stopped cleanly, the collector stopped cleanly."
        );
    }

    #[test]
    fn sigterm_to_this_process_alone_reaches_the_agent() {
        // The agent stand-in dies of the SIGTERM passed on (no handler): a stop all the same.
        let ended = supervise(
            stand_in(false, None),
            stand_in(true, None),
            request(libc::SIGTERM),
        )
        .unwrap();
        assert!(ended.result().is_ok(), "{ended:?}");
        let message = ended.message();
        assert!(
            message.contains("SIGTERM received: the agent stopped (signal: 15"),
            "{message}"
        );
        assert!(
            message.ends_with("the collector stopped cleanly."),
            "{message}"
        );
    }

    #[test]
    fn an_agent_that_fails_by_itself_is_an_error_and_the_collector_is_stopped() {
        let ended = supervise(
            stand_in(true, Some((0, 3))),
            stand_in(true, None),
            request(0),
        )
        .unwrap();
        assert!(ended.collector.success());
        let message = ended.message();
        assert!(
            message.contains("the agent exited: the agent stopped (exit status: 3)"),
            "{message}"
        );
        let e = ended.result().unwrap_err().to_string();
        assert_eq!(e, "the agent exited with exit status: 3");
    }
}
