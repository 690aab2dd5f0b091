//! `railscope-collector`: the collector's binary (`railscope collector ...` runs it).

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use monitor_archive::{archive::Archive, query::QueryEngine};
use monitor_collector::{
    Collector, Parts, metrics,
    settings::{self, CollectorSettings, RunPlan},
    writer::PublishingArchive,
};
use monitor_config::ServiceManager;
use monitor_findings::FindingsStore;
use monitor_remote_write::{ArchiveSource, RemoteWriter};

#[derive(Debug, Parser)]
#[command(
    name = "railscope-collector",
    version,
    about = "railscope's collector: receives the agents' frames, keeps them and serves them",
    long_about = "railscope's collector receives the frames of railscope agents over UDP, keeps \
                  the latest value of every series and the recent events, archives every \
                  accepted frame and serves /metrics and an HTTP API. It needs no privileges. \
                  `railscope collector ...` runs it; without a subcommand it runs the \
                  collector (`run`).\n\nLogs go to stderr (filter with RAILSCOPE_LOG, e.g. \
                  RAILSCOPE_LOG=debug).",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunOptions,
}

// Parsed once at start-up: the size of `Run` (the settings with the findings' thresholds)
// does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    /// Run the collector until Ctrl-C or SIGTERM (the default).
    Run(RunOptions),
    /// Ask a running collector (its HTTP API): series, events, nodes.
    Query(monitor_client::query::QueryArgs),
    /// Write a node's samples and events over a time range as a capture file
    /// (docs/capture-format.md), for `railscope report`.
    Export(monitor_client::export::ExportArgs),
    /// Moneo's metric selection over a stored range: drops constant and redundant metrics,
    /// learns each kept metric's interval cap, prints the agent's `--sampling` settings.
    Select(monitor_client::select::cli::SelectArgs),
    /// Ask a running collector for its health findings (docs/findings.md).
    Findings(monitor_client::findings::FindingsArgs),
    /// Ask a running collector what it did about its findings, or release its brake
    /// (docs/actions.md).
    Actions(monitor_client::actions::ActionsArgs),
    /// Slurm's health hook: exit 0 if this node has no active critical finding, 1 with one
    /// line naming the worst (docs/actions.md, "The health hook").
    Health(monitor_client::health::HealthArgs),
    /// Ask a running collector for the stragglers of its jobs (docs/findings.md).
    Stragglers(monitor_client::stragglers::StragglerArgs),
    /// Derive a node's own frame key from the fleet secret, as 64 hex characters (what
    /// `railscope-gen-wire-key --node NAME` runs).
    NodeKey(NodeKeyArgs),
}

#[derive(Debug, clap::Args)]
struct NodeKeyArgs {
    /// The node's name, exactly as its agent sends it (`node` in agent.toml; default its
    /// hostname).
    #[arg(long)]
    node: String,
    /// The fleet secret.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/etc/railscope/fleet.secret"
    )]
    fleet_secret: PathBuf,
}

/// Prints the node's key: the one line a provisioning pipeline writes to the node's
/// /etc/railscope/wire.key.
fn node_key(args: &NodeKeyArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        !args.node.is_empty() && args.node.len() <= 255,
        "node name {:?}: 1 to 255 bytes, as a frame carries it",
        args.node
    );
    let secret = monitor_wire::FleetSecret::from_file(&args.fleet_secret)?;
    println!("{}", secret.node_key(&args.node).to_hex());
    Ok(())
}

#[derive(Debug, clap::Args)]
struct RunOptions {
    /// Configuration file (default: /etc/railscope/collector.toml when it exists). Every
    /// flag below can be set there under its name without `--`; flags override it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Check the configuration (file, flags and the key file), print the settings in effect
    /// and exit: 0 if usable, 1 with the reason if not.
    #[arg(long)]
    check_config: bool,
    #[command(flatten)]
    settings: CollectorSettings,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RAILSCOPE_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .init();
    match cli.command {
        Some(Command::Run(options)) => run(options),
        Some(Command::Query(args)) => monitor_client::query::run(&args),
        Some(Command::Export(args)) => monitor_client::export::run(&args),
        Some(Command::Select(args)) => monitor_client::select::cli::run(&args),
        Some(Command::Findings(args)) => monitor_client::findings::run(&args),
        Some(Command::Actions(args)) => monitor_client::actions::run(&args),
        Some(Command::Health(args)) => {
            std::process::exit(monitor_client::health::run(&args).into())
        }
        Some(Command::Stragglers(args)) => monitor_client::stragglers::run(&args),
        Some(Command::NodeKey(args)) => node_key(&args),
        None => run(cli.run),
    }
}

fn run(options: RunOptions) -> anyhow::Result<()> {
    let sources = settings::load(options.config.as_deref(), options.settings)?;
    if options.check_config {
        let shown = settings::check(&sources)?;
        match sources.file() {
            Some(file) => println!("# {}: OK; the settings in effect:", file.path().display()),
            None => println!("# no configuration file; the settings in effect:"),
        }
        print!("{shown}");
        return Ok(());
    }
    let RunPlan {
        collector: config,
        archive: archive_config,
        remote_write: endpoints,
        query_max_points,
        findings: thresholds,
        actions: actions_config,
    } = settings::run_plan(&sources)?;
    // Before anything serves: a SIGHUP that comes once the API answers must reload, not
    // kill (its default action).
    let signals = Signals::install()?;
    let web = config.web.clone();
    let data_dir = config.data_dir.clone();
    let retention_ns = archive_config
        .retention_age
        .map_or(0, |age| age.as_nanos() as u64);
    let archive = Archive::open(archive_config)
        .with_context(|| format!("opening the archive in {}", data_dir.display()))?;
    let reader = archive.reader();
    let recent = monitor_archive::archive::recent::recent_in_archive(&reader)
        .with_context(|| format!("reading back recent frames in {}", data_dir.display()))?;
    let archive = PublishingArchive::new(archive);
    let archive_stats = archive.stats();

    let state_dir = data_dir.join("remote_write");
    let findings_endpoints = endpoints.clone();
    let mut writers = Vec::new();
    for endpoint in endpoints {
        let source = ArchiveSource::new(reader.clone(), config.keys.clone());
        writers.push(RemoteWriter::start(endpoint, source, &state_dir)?);
    }
    let writers = Arc::new(Mutex::new(writers));
    let actions = actions_config
        .map(|config| {
            monitor_actions::Actions::open(&data_dir, config)
                .map(Arc::new)
                .context("opening the actions audit log")
        })
        .transpose()?;
    let shown = writers.clone();
    let alert_counts = actions.clone();
    let extra_metrics = Box::new(move |out: &mut String| {
        metrics::write_archive_stats(
            out,
            &archive_stats.lock().unwrap_or_else(|p| p.into_inner()),
        );
        let writers = shown.lock().unwrap_or_else(|p| p.into_inner());
        if !writers.is_empty() {
            let stats: Vec<_> = writers.iter().map(|w| (w.name(), w.stats())).collect();
            monitor_remote_write::write_metrics(out, &stats);
        }
        if let Some(actions) = &alert_counts {
            metrics::render_alert_stats(out, &actions.alert_stats);
        }
    });
    let engine =
        Arc::new(QueryEngine::new(reader, config.keys.clone()).with_max_points(query_max_points));
    let now_ns = monitor_archive::clock::unix_now_ns();
    let store = Arc::new(
        FindingsStore::open(
            &data_dir,
            now_ns.saturating_sub(retention_ns),
            now_ns + thresholds.restart_grace_s * 1_000_000_000,
        )
        .context("opening the findings log")?,
    );
    let findings_sender = monitor_findings::remote::FindingsSender::start(
        store.clone(),
        &findings_endpoints,
        std::time::Duration::from_secs(thresholds.tick_s),
    )?;
    let parts = Parts {
        archive: Some(Box::new(archive)),
        query: Some(engine),
        extra_metrics: Some(extra_metrics),
        findings: Some((store, thresholds)),
        actions,
        held: recent.held,
        heard_before: recent.last_received_ns,
    };
    let collector = Collector::start(config, parts)?;
    let mut service = ServiceManager::from_env();
    service.ready("receiving");
    let shared = collector.shared().clone();
    signals
        .wait(
            &service,
            |max_age| shared.heartbeats.watchdog_check(max_age),
            || {
                // The error is logged by reload, naming the file; the old config stays.
                let _ = web.reload();
            },
        )
        .context("waiting for a signal")?;
    service.stopping();
    tracing::info!("stopping");
    collector.stop();
    if let Some(sender) = findings_sender {
        sender.stop();
    }
    let writers = std::mem::take(&mut *writers.lock().unwrap_or_else(|p| p.into_inner()));
    for writer in writers {
        writer.shutdown();
    }
    Ok(())
}

/// SIGINT, SIGTERM and SIGHUP, taken from their default actions at start-up.
struct Signals {
    runtime: tokio::runtime::Runtime,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let _entered = runtime.enter();
        let term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
        let hup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
        Ok(Self { runtime, term, hup })
    }

    /// Blocks until SIGINT or SIGTERM, calling `on_hup` on each SIGHUP (the web config's
    /// reload, as Prometheus does), and pinging systemd's watchdog meanwhile if it is on, but
    /// only while `check` (whether every watched thread turned within the given time)
    /// passes: a hung receive thread, archive writer or sealer, HTTP server or findings
    /// thread stops the pings (its name logged), and systemd restarts the collector.
    fn wait(
        self,
        service: &ServiceManager,
        check: impl Fn(std::time::Duration) -> Result<(), String>,
        on_hup: impl Fn(),
    ) -> std::io::Result<()> {
        let Self {
            runtime,
            mut term,
            mut hup,
        } = self;
        runtime.block_on(async {
            let ping_every = service.ping_every();
            let mut watchdog =
                tokio::time::interval(ping_every.unwrap_or(std::time::Duration::MAX / 4));
            loop {
                tokio::select! {
                    r = tokio::signal::ctrl_c() => return r,
                    _ = term.recv() => return Ok(()),
                    _ = hup.recv() => {
                        tracing::info!("SIGHUP: reloading the web config");
                        on_hup();
                    }
                    _ = watchdog.tick(), if ping_every.is_some() => {
                        match check(ping_every.unwrap_or_default()) {
                            Ok(()) => service.alive(),
                            Err(line) => tracing::error!("{line}"),
                        }
                    }
                }
            }
        })
    }
}
