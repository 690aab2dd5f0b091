//! `railscope`: the node agent of the railscope monitor for GPU + RDMA training clusters.

use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use monitor_user::{
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
    /// Print the node's hardware path as the agent reads it: each GPU and RDMA device with its
    /// PCI address, NUMA node, PCIe switch, root port, link (current and maximum) and
    /// firmware, then the distance of each GPU–NIC pair (PIX, PXB, NODE, SYS), the way
    /// `nvidia-smi topo -m` does.
    Topology {
        /// Directory holding `devices`, `bus/pci` and `class/infiniband` (a fixture tree
        /// for tests).
        #[arg(long, value_name = "PATH", default_value = "/sys")]
        sysfs: std::path::PathBuf,
        /// The NVML library to load (default: the system's libnvidia-ml.so.1).
        #[arg(long, value_name = "PATH")]
        nvml_lib: Option<std::path::PathBuf>,
        /// Do not ask NVML: RDMA devices only.
        #[arg(long)]
        no_gpu: bool,
        /// Print it as one JSON object.
        #[arg(long)]
        json: bool,
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
    /// Ask a collector (its HTTP API): series, events, nodes.
    Query(monitor_client::query::QueryArgs),
    /// Moneo's metric selection over a collector's stored range: drops constant and redundant
    /// metrics, learns each kept metric's interval cap, prints the agent's `--sampling`
    /// settings.
    Select(monitor_client::select::cli::SelectArgs),
    /// Write a node's samples and events over a time range from a collector's archive as a
    /// capture file (docs/capture-format.md), for `railscope report`.
    Export(monitor_client::export::ExportArgs),
    /// A collector's health findings (docs/findings.md).
    Findings(monitor_client::findings::FindingsArgs),
    /// What a collector did about its findings (drains, resumes, the brake), or release its
    /// brake (docs/actions.md).
    Actions(monitor_client::actions::ActionsArgs),
    /// Slurm's health hook: exit 0 if this node has no active critical finding at the
    /// collector, 1 with one line naming the worst (docs/actions.md, "The health hook").
    /// `--node` defaults to this agent's node name (agent.toml's `node`, else the host name).
    Health(monitor_client::health::HealthArgs),
    /// The stragglers of a collector's jobs (docs/findings.md).
    Stragglers(monitor_client::stragglers::StragglerArgs),
    /// Record every IB port event (kernel timestamps, duplicates kept) and snapshots of each
    /// port's link and error counters into a capture file, keeping the seconds before each
    /// trigger (docs/capture-format.md). Runs next to the agent if one runs; Ctrl-C ends it.
    Capture {
        /// Ports to capture, `DEVICE/PORT,...` (default: every port present).
        #[arg(long, value_name = "DEV/PORT,...")]
        ports: Option<String>,
        /// Stop after this long (e.g. `90s`, `2h`; default: until Ctrl-C).
        #[arg(long, value_name = "DURATION")]
        duration: Option<humantime::Duration>,
        /// Largest file (e.g. `512M`, `2G`): the capture ends cleanly before it.
        #[arg(long, value_name = "SIZE", default_value = "1G")]
        max_size: String,
        /// The capture file (default: `railscope-<host>-<UTC time>.rscap`).
        #[arg(long, value_name = "FILE")]
        out: Option<std::path::PathBuf>,
        /// Time between snapshots of the ports (at least 10ms).
        #[arg(long, value_name = "DURATION", default_value = "100ms")]
        interval: humantime::Duration,
        /// How much time before a trigger is kept at the full interval.
        #[arg(long, value_name = "DURATION", default_value = "5s")]
        pre: humantime::Duration,
        /// How long after a trigger every snapshot is kept.
        #[arg(long, value_name = "DURATION", default_value = "10s")]
        post: humantime::Duration,
        /// An error counter rising faster than this many per second triggers.
        #[arg(long, value_name = "PER_SECOND", default_value_t = 10.0)]
        error_rate: f64,
        /// Directory holding `class/infiniband` (a fixture tree for tests).
        #[arg(long, value_name = "PATH", default_value = "/sys")]
        sysfs: std::path::PathBuf,
    },
    /// Per port of one or more capture files: down/up transitions, time down, flap episodes,
    /// counter deltas, width and speed changes and a verdict (stable, flapping, degraded,
    /// down), with a timeline picture (SVG) per port.
    Report {
        /// Capture files (`railscope capture`).
        #[arg(required_unless_present = "collector")]
        files: Vec<std::path::PathBuf>,
        /// Also report a node's time range from this collector's archive (its HTTP address,
        /// e.g. http://127.0.0.1:7671), fetched by `railscope-collector export`.
        #[arg(long, value_name = "URL", requires = "node")]
        collector: Option<String>,
        /// The node to report from the collector.
        #[arg(long, requires = "collector")]
        node: Option<String>,
        /// Start of the collector range: `-15m`, an RFC 3339 time or Unix seconds.
        #[arg(long, default_value = "-1h", allow_hyphen_values = true)]
        start: String,
        /// End of the collector range.
        #[arg(long, default_value = "now", allow_hyphen_values = true)]
        end: String,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Write the pictures into this directory (default: next to the first file).
        #[arg(long, value_name = "DIR")]
        svg: Option<std::path::PathBuf>,
        /// Do not write pictures.
        #[arg(long, conflicts_with = "svg")]
        no_svg: bool,
        #[command(flatten)]
        rules: RulesArgs,
    },
    /// Send a capture file's events and counters to a collector as frames, every sample and
    /// event with its original timestamp (the frames' send time is now: a collector refuses
    /// frames sent long ago).
    Replay {
        /// The capture file.
        file: std::path::PathBuf,
        /// The collector (HOST:PORT, UDP).
        #[arg(long, value_name = "HOST:PORT")]
        collector: String,
        /// The key sealing the frames: the own key of the node they are sent as (the
        /// capture's host, or `--node`), or a cluster's shared key; 32 raw bytes or 64 hex
        /// characters.
        #[arg(long, value_name = "PATH", default_value = "/etc/railscope/wire.key")]
        key: std::path::PathBuf,
        /// Send under this node name instead of the capture's host (replaying under a live
        /// node's name would retire that node's session at the collector).
        #[arg(long)]
        node: Option<String>,
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

/// The report's thresholds (defaults: docs/capture-format.md, "Report").
#[derive(Debug, clap::Args)]
struct RulesArgs {
    /// Flapping: at least this many down transitions within --flap-window.
    #[arg(long, value_name = "N", default_value_t = 2)]
    flap_downs: u32,
    #[arg(long, value_name = "DURATION", default_value = "24h")]
    flap_window: humantime::Duration,
    /// Down periods with less time up than this between them are one episode.
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    episode_gap: humantime::Duration,
    /// Degraded: symbol_error rising by more than this within 1 s.
    #[arg(long, value_name = "N", default_value_t = 10)]
    symbol_error_per_s: u64,
    /// Degraded: symbol_error rising by more than this within 1 h.
    #[arg(long, value_name = "N", default_value_t = 120)]
    symbol_error_per_h: u64,
    /// Flapping: link_error_recovery rising by more than this within 1 min.
    #[arg(long, value_name = "N", default_value_t = 5)]
    link_error_recovery_per_min: u64,
    /// Degraded: port_rcv_errors rising by more than this within 1 s.
    #[arg(long, value_name = "N", default_value_t = 10)]
    port_rcv_errors_per_s: u64,
}

impl RulesArgs {
    fn rules(&self) -> monitor_capture::Rules {
        monitor_capture::Rules {
            flap_downs: self.flap_downs,
            flap_window_ns: self.flap_window.as_nanos() as u64,
            episode_gap_ns: self.episode_gap.as_nanos() as u64,
            symbol_error_per_s: self.symbol_error_per_s,
            symbol_error_per_h: self.symbol_error_per_h,
            link_error_recovery_per_min: self.link_error_recovery_per_min,
            port_rcv_errors_per_s: self.port_rcv_errors_per_s,
        }
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // `railscope collector ...` is the collector's binary: hand over before anything else.
    // The API's clients are linked (monitor_client): they need no collector installed.
    match &cli.command {
        Command::Collector { args } => return run_collector(args),
        Command::Select(args) => return monitor_client::select::cli::run(args),
        Command::Query(args) => return monitor_client::query::run(args),
        Command::Export(args) => return monitor_client::export::run(args),
        Command::Findings(args) => return monitor_client::findings::run(args),
        Command::Actions(args) => return monitor_client::actions::run(args),
        Command::Stragglers(args) => return monitor_client::stragglers::run(args),
        Command::Health(args) => {
            std::process::exit(monitor_client::health::run(&with_node(args)).into())
        }
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
        Command::Capture {
            ports,
            duration,
            max_size,
            out,
            interval,
            pre,
            post,
            error_rate,
            sysfs,
        } => {
            use monitor_user::capture;
            let interval: Duration = interval.into();
            if interval < capture::MIN_INTERVAL {
                anyhow::bail!("--interval must be at least 10ms (got {interval:?})");
            }
            if error_rate.is_nan() || error_rate <= 0.0 {
                anyhow::bail!("--error-rate must be a positive number (got {error_rate})");
            }
            let host = monitor_user::pipeline::hostname();
            let options = capture::CaptureOptions {
                out: out.unwrap_or_else(|| {
                    capture::default_out(
                        &host,
                        monitor_user::time_base::TimeBase::global().now_unix_ns().0,
                    )
                }),
                ports: ports.as_deref().map(capture::parse_ports).transpose()?,
                duration: duration.map(Into::into),
                max_size: capture::parse_size(&max_size)?,
                interval,
                pre: pre.into(),
                post: post.into(),
                error_rate,
                sysfs_root: sysfs,
                kernel: Kernel::default(),
                host,
            };
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let result = runtime.block_on(capture::run(options));
            runtime.shutdown_timeout(Duration::from_secs(1));
            one_line(result)
        }
        Command::Replay {
            file,
            collector,
            key,
            node,
        } => one_line((|| {
            let target = monitor_user::sender::Target::parse(&collector).context("--collector")?;
            let key = monitor_wire::Key::from_file(&key)?;
            let bytes =
                std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            let stats = monitor_user::replay::replay(
                &file.display().to_string(),
                &bytes,
                &target,
                &key,
                node.as_deref(),
            )?;
            println!(
                "replayed {} frames ({} samples, {} events, {} bytes) to {collector}",
                stats.frames, stats.samples, stats.events, stats.bytes
            );
            Ok(())
        })()),
        Command::Report {
            files,
            collector,
            node,
            start,
            end,
            json,
            svg,
            no_svg,
            rules,
        } => {
            let archive = match (collector, node) {
                (Some(url), Some(node)) => Some(export_from_collector(&url, &node, &start, &end)?),
                _ => None,
            };
            one_line(report(&files, archive, json, svg, no_svg, &rules.rules()))
        }
        Command::Collector { .. }
        | Command::Query(_)
        | Command::Select(_)
        | Command::Export(_)
        | Command::Findings(_)
        | Command::Actions(_)
        | Command::Health(_)
        | Command::Stragglers(_) => unreachable!("handled above"),
        Command::Topology {
            sysfs,
            nvml_lib,
            no_gpu,
            json,
        } => topology(&sysfs, nvml_lib.as_deref(), no_gpu, json),
        Command::Listen {
            port,
            bind,
            key,
            json,
        } => {
            let key = monitor_wire::Key::from_file(&key)?;
            let format = if json {
                monitor_user::listen::Format::Json
            } else {
                monitor_user::listen::Format::Text
            };
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(monitor_user::listen::listen(
                    (bind, port).into(),
                    key,
                    format,
                    std::io::stdout(),
                ))?;
            Ok(())
        }
    }
}

/// `railscope topology`: what could not be read goes to stderr, one line each.
fn topology(
    sysfs: &std::path::Path,
    nvml_lib: Option<&std::path::Path>,
    no_gpu: bool,
    json: bool,
) -> anyhow::Result<()> {
    use monitor_user::{sources::gpu, sources::hwpath::HardwarePath, topology};
    let nvml = if no_gpu {
        None
    } else {
        gpu::load_nvml(nvml_lib).map_err(|e| eprintln!("{e}")).ok()
    };
    let path = HardwarePath::read(sysfs, nvml.as_ref());
    if json {
        println!("{}", serde_json::to_string_pretty(&topology::json(&path))?);
    } else {
        print!("{}", topology::text(&path));
        for problem in &path.problems {
            eprintln!("hardware path: {problem}");
        }
    }
    Ok(())
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

/// Runs `railscope-collector args...` in place of this process (exec), so signals and the
/// exit status are the collector's. Its `argv[0]` is the command the user typed
/// ([`handed_over_name`]), which clap shows in usage lines and errors: `railscope collector
/// run --help` says `Usage: railscope collector run ...`, not `railscope-collector run ...`.
fn run_collector(args: &[String]) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt as _;
    let binary = collector_binary()?;
    let own = std::env::args_os().next().unwrap_or_default();
    let err = std::process::Command::new(&binary)
        .arg0(handed_over_name(&own))
        .args(args)
        .exec();
    anyhow::bail!("could not run {}: {err}", binary.display())
}

/// `railscope health`'s arguments, with `--node` set to the name this node's agent sends
/// (agent.toml's `node`, else the host name) unless one is given: the findings are filed
/// under that name. An agent.toml that cannot be read leaves the host name, the agent's
/// default; the check must still answer.
fn with_node(args: &monitor_client::health::HealthArgs) -> monitor_client::health::HealthArgs {
    let mut args = args.clone();
    if args.node.is_none() {
        args.node = Some(
            settings::load(None, settings::AgentSettings::default())
                .ok()
                .and_then(|sources| sources.merged().node)
                .unwrap_or_else(monitor_user::pipeline::hostname),
        );
    }
    args
}

/// The name the collector's binary runs under when `railscope collector ...` hands over:
/// this binary's own name (the file name of `argv0`, as clap takes it), followed by
/// ` collector`, the arguments being the collector's own.
fn handed_over_name(argv0: &std::ffi::OsStr) -> std::ffi::OsString {
    let mut name = std::path::Path::new(argv0)
        .file_name()
        .filter(|n| !n.is_empty())
        .unwrap_or(std::ffi::OsStr::new("railscope"))
        .to_owned();
    name.push(" collector");
    name
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

/// An error and its causes on one line ("reading F: No such file"), as the capture
/// commands print them.
fn one_line<T>(result: anyhow::Result<T>) -> anyhow::Result<T> {
    result.map_err(|e| anyhow::anyhow!("{e:#}"))
}

/// A node's range of a collector's archive as a capture file: (a name for it, its bytes),
/// from the collector's export (`/api/v1/export`).
fn export_from_collector(
    url: &str,
    node: &str,
    start: &str,
    end: &str,
) -> anyhow::Result<(String, Vec<u8>)> {
    let bytes = monitor_client::export::fetch_export(url, node, start, end)?;
    Ok((format!("{url} node {node} from {start} to {end}"), bytes))
}

/// `railscope report`: reads every file (a torn or corrupt end is reported, not fatal) and
/// the collector's export if any, prints the report and writes one picture per port.
fn report(
    files: &[std::path::PathBuf],
    archive: Option<(String, Vec<u8>)>,
    json: bool,
    svg: Option<std::path::PathBuf>,
    no_svg: bool,
    rules: &monitor_capture::Rules,
) -> anyhow::Result<()> {
    let mut captures = Vec::new();
    for file in files {
        let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
        captures.push((file.display().to_string(), bytes));
    }
    captures.extend(archive);
    let (report, timelines) = monitor_capture::report::report_of(&captures, rules)?;
    if json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.to_text());
    }
    if no_svg {
        return Ok(());
    }
    let (dir, stem) = match (&svg, files.first()) {
        (Some(dir), _) => (dir.clone(), String::from("timeline")),
        (None, None) => (std::path::PathBuf::from("."), String::from("timeline")),
        (None, Some(first)) => (
            first
                .parent()
                .map(std::path::Path::to_path_buf)
                .unwrap_or_default(),
            first
                .file_stem()
                .map_or("timeline".into(), |s| s.to_string_lossy().into_owned()),
        ),
    };
    std::fs::create_dir_all(if dir.as_os_str().is_empty() {
        ".".as_ref()
    } else {
        dir.as_path()
    })
    .with_context(|| format!("creating {}", dir.display()))?;
    for port in &report.ports {
        let Some(timeline) = timelines.ports.get(&port.port) else {
            continue;
        };
        let path = dir.join(format!(
            "{stem}.{}.{}-{}.svg",
            port.port.node, port.port.device, port.port.port
        ));
        std::fs::write(&path, monitor_capture::svg::port_timeline(port, timeline))
            .with_context(|| format!("writing {}", path.display()))?;
        if !json {
            println!("picture: {}", path.display());
        } else {
            eprintln!("picture: {}", path.display());
        }
    }
    Ok(())
}

/// Drops every capability the agent does not need (before any thread exists: capabilities are
/// per thread), and says in one line each which needed one is missing.
fn keep_only_needed_capabilities() {
    use monitor_user::privileges;
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
