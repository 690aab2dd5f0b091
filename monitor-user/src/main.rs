//! `railscope`: the node agent of the railscope monitor for GPU + RDMA training clusters.

use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use railscope::{
    agent,
    kernel::Kernel,
    probes::{self, AttachedFamily, Family, ProbeReport, btf_cache::BtfCache},
    settings::{self, AgentSettings},
};

#[derive(Debug, Parser)]
#[command(
    name = "railscope",
    version,
    about = "Fine-grained, low-overhead monitor for GPU + InfiniBand/RoCE training nodes",
    long_about = "railscope watches RDMA verbs and InfiniBand driver events from the kernel with \
                  eBPF probes. It runs as root on each node.\n\nLogs go to stderr (filter with \
                  RAILSCOPE_LOG, e.g. RAILSCOPE_LOG=debug); events go to stdout."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the node agent: attach the probes and print each event as a line until Ctrl-C.
    ///
    /// Probes whose kernel module is not loaded yet (ib_core on a node without RDMA drivers)
    /// are reported once and attached as soon as the module appears; the agent never exits
    /// because one probe is unavailable.
    Agent {
        /// Configuration file (default: /etc/railscope/agent.toml when it exists). Every
        /// flag below can be set there under its name without `--`; flags override it.
        #[arg(long, value_name = "FILE")]
        config: Option<std::path::PathBuf>,
        /// Check the configuration (file and flags, and the key file when sending), print the
        /// settings in effect and exit: 0 if usable, 1 with the reason if not.
        #[arg(long)]
        check_config: bool,
        #[command(flatten)]
        settings: AgentSettings,
    },
    /// Print the frames that arrive on a UDP port, decoded (one block per frame, or JSON
    /// lines): for debugging an agent's output and for the tests.
    Listen {
        /// UDP port to listen on.
        #[arg(long)]
        port: u16,
        /// Address to bind.
        #[arg(long, default_value = "0.0.0.0")]
        bind: std::net::IpAddr,
        /// Pre-shared key that authenticates frames: 32 raw bytes or 64 hex characters.
        #[arg(long, value_name = "PATH", default_value = "/etc/railscope/wire.key")]
        key: std::path::PathBuf,
        /// Print each frame as a JSON line.
        #[arg(long)]
        json: bool,
    },
    /// Run the collector (`railscope collector run --help`): the `railscope-collector` binary
    /// installed next to this one (or on PATH), with these arguments. The agent itself links
    /// nothing of the collector.
    #[command(disable_help_flag = true)]
    Collector {
        /// Arguments for `railscope-collector` (e.g. `run --key FILE --data DIR`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Ask a collector (`railscope query --help`): runs `railscope-collector query` with these
    /// arguments.
    #[command(disable_help_flag = true)]
    Query {
        /// Arguments for `railscope-collector query`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Show every probe, its hook and whether it attaches on this kernel (and why not).
    ///
    /// Each probe is attached for real and detached again, so "attached" means it works here.
    Probes {
        /// Print the table as JSON.
        #[arg(long)]
        json: bool,
        /// Also load every program into the kernel's verifier, without attaching, and report
        /// the verdicts (useful on kernels where the hooks themselves are missing).
        #[arg(long)]
        verify: bool,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // The collector's subcommands belong to its own binary: hand over before anything else.
    match &cli.command {
        Command::Collector { args } => return run_collector(None, args),
        Command::Query { args } => return run_collector(Some("query"), args),
        _ => {}
    }
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RAILSCOPE_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .init();
    raise_memlock_limit();
    raise_open_files_limit();
    match cli.command {
        Command::Agent {
            config,
            check_config,
            settings,
        } => {
            let sources = settings::load(config.as_deref(), settings)?;
            if check_config {
                let shown = settings::check(&sources)?;
                match sources.file() {
                    Some(file) => {
                        println!("# {}: OK; the settings in effect:", file.path().display())
                    }
                    None => println!("# no configuration file; the settings in effect:"),
                }
                print!("{shown}");
                return Ok(());
            }
            let options = settings::agent_options(&sources)?;
            keep_only_needed_capabilities();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let result = runtime.block_on(agent::run(options));
            // An attach still running on a blocking thread is not waited for.
            runtime.shutdown_timeout(Duration::from_secs(1));
            result
        }
        Command::Probes { json, verify } => show_probes(json, verify),
        Command::Collector { .. } | Command::Query { .. } => unreachable!("handed over above"),
        Command::Listen {
            port,
            bind,
            key,
            json,
        } => {
            let key = railscope_wire::Key::from_file(&key)?;
            let format = if json {
                railscope::listen::Format::Json
            } else {
                railscope::listen::Format::Text
            };
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(railscope::listen::listen(
                    (bind, port).into(),
                    key,
                    format,
                    std::io::stdout(),
                ))?;
            Ok(())
        }
    }
}

/// The collector's binary: next to this one (as installed and as cargo builds them), else on
/// PATH.
fn collector_binary() -> anyhow::Result<std::path::PathBuf> {
    const NAME: &str = "railscope-collector";
    let beside = std::env::current_exe()
        .ok()
        .map(|exe| exe.with_file_name(NAME))
        .filter(|p| p.is_file());
    let on_path = || {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(NAME))
                .find(|p| p.is_file())
        })
    };
    beside.or_else(on_path).with_context(|| {
        format!(
            "{NAME} not found next to {} or on PATH: install it with the agent (cargo build -p monitor-collector)",
            std::env::current_exe()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|_| "railscope".into())
        )
    })
}

/// Runs `railscope-collector [first] args...` in place of this process (exec), so signals and
/// the exit status are the collector's.
fn run_collector(first: Option<&str>, args: &[String]) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt as _;
    let binary = collector_binary()?;
    let err = std::process::Command::new(&binary)
        .args(first)
        .args(args)
        .exec();
    anyhow::bail!("could not run {}: {err}", binary.display())
}

fn show_probes(json: bool, verify: bool) -> anyhow::Result<()> {
    let kernel = Kernel::default();
    let btfs = BtfCache::new(kernel.clone());
    let mut rows: Vec<ProbeReport> = Vec::new();
    for family in Family::ALL {
        match AttachedFamily::attach(family, &kernel, &btfs) {
            // Dropping the family right away detaches it again.
            Ok(attached) => rows.extend(attached.statuses.iter().cloned()),
            Err(unavailable) => rows.extend(unavailable.rows),
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print!("{}", probes::render_table(&rows));
    }
    if verify {
        let verdicts = probes::verify_all().context("loading the eBPF object")?;
        println!();
        for v in &verdicts {
            match &v.result {
                Ok(()) => println!("verifier: {} accepted", v.program),
                Err(e) => println!("verifier: {} rejected: {e}", v.program),
            }
        }
        if verdicts.iter().any(|v| v.result.is_err()) {
            anyhow::bail!("the kernel's verifier rejected a program");
        }
    }
    Ok(())
}

/// Drops every capability the agent does not need (before any thread exists: capabilities are
/// per thread), and says in one line each which needed one is missing.
fn keep_only_needed_capabilities() {
    use railscope::privileges;
    let paranoid = privileges::perf_needs_sys_admin();
    match privileges::keep_only_needed(paranoid) {
        Ok(dropped) => tracing::debug!("dropped {dropped} capabilities the agent does not need"),
        Err(e) => tracing::warn!("could not drop the capabilities the agent does not need: {e}"),
    }
    match privileges::CapSets::current() {
        Ok(sets) => {
            for line in privileges::missing(&sets, paranoid) {
                tracing::warn!("{line} (docs/deployment.md, \"Privileges\")");
            }
        }
        Err(e) => tracing::warn!("cannot read the agent's capabilities: {e}"),
    }
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK; lift it so loading cannot fail there.
fn raise_memlock_limit() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads a valid rlimit struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) } != 0 {
        tracing::debug!("could not raise RLIMIT_MEMLOCK; fine on kernels >= 5.11");
    }
}

/// The IB source keeps its counter files open (one `pread` per read instead of three system
/// calls), thousands on a large node: take the descriptors the hard limit allows.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write a valid rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                tracing::debug!("could not raise RLIMIT_NOFILE to {}", limit.rlim_max);
            }
        }
    }
}
