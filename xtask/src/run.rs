//! `cargo xtask run`: the main job on this node — build, start a collector (data under a
//! default directory, a key made on first run), load the probes and run the agent sending to
//! it, print where to look, and stop both at Ctrl-C.

use std::{
    io::Read as _,
    net::{SocketAddr, TcpStream},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Child, Command},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{build, cargo, setup};

/// Where the local collector listens (loopback only).
const UDP: &str = "127.0.0.1:7670";
const HTTP: &str = "127.0.0.1:7671";

#[derive(Debug, clap::Args)]
pub struct Options {
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

pub fn run(options: &Options) -> anyhow::Result<()> {
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
        return Err(e);
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
    let agent = Command::new(&railscope)
        .args(["agent", "--collector", UDP])
        .arg("--key")
        .arg(&key)
        .args(&options.agent_args)
        .spawn();
    // Ctrl-C reaches both children (same process group); this process waits for them.
    // SAFETY: ignoring SIGINT in this process only, after the children started.
    unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
    let status = match agent {
        Ok(mut agent) => agent.wait().map_err(anyhow::Error::from),
        Err(e) => Err(anyhow::Error::from(e).context("cannot start the agent")),
    };
    stop(&mut collector);
    let status = status?;
    if !status.success() {
        bail!("the agent exited with {status}");
    }
    Ok(())
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

fn stop(collector: &mut Child) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(collector.id() as libc::pid_t, libc::SIGTERM) };
    let _ = collector.wait();
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
