//! `railscope-collector`: the collector's binary (`railscope collector ...` runs it).

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use railscope_collector::{Collector, CollectorConfig, Limits, Parts};

#[derive(Debug, Parser)]
#[command(
    name = "railscope-collector",
    version,
    about = "railscope's collector: receives the agents' frames, keeps them and serves them",
    long_about = "railscope's collector receives the frames of railscope agents over UDP, keeps \
                  the latest value of every series and the recent events, archives every \
                  accepted frame and serves /metrics and an HTTP API. It needs no privileges. \
                  `railscope collector ...` runs it.\n\nLogs go to stderr (filter with \
                  RAILSCOPE_LOG, e.g. RAILSCOPE_LOG=debug)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the collector until Ctrl-C or SIGTERM.
    Run(RunOptions),
}

#[derive(Debug, clap::Args)]
struct RunOptions {
    /// UDP address the agents send to (`railscope agent --collector HOST:PORT`).
    #[arg(long, default_value = "0.0.0.0:7670", value_name = "ADDR:PORT")]
    listen: SocketAddr,
    /// Receive sockets and threads on that address (default: one per core).
    #[arg(long, value_name = "N")]
    sockets: Option<usize>,
    /// HTTP address of /metrics, the live view and the query API.
    #[arg(long, default_value = "0.0.0.0:7671", value_name = "ADDR:PORT")]
    http: SocketAddr,
    /// No HTTP server.
    #[arg(long)]
    no_http: bool,
    /// Pre-shared key that authenticates frames: 32 raw bytes or 64 hex characters.
    #[arg(long, value_name = "PATH", default_value = "/etc/railscope/wire.key")]
    key: PathBuf,
    /// Data directory of the archive.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/railscope")]
    data: PathBuf,
    /// Nodes held at once (memory bound; see docs/architecture.md).
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_nodes)]
    max_nodes: usize,
    /// Series one node session may hold (at most 65536).
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_series_per_node)]
    max_series_per_node: usize,
    /// Series held over all nodes.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_series)]
    max_series: usize,
    /// Recent events kept for the live view.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_recent_events)]
    max_recent_events: usize,
    /// Frames sent longer ago than this many seconds are dropped (and forgotten nodes'
    /// frames cannot be replayed).
    #[arg(long, value_name = "SECONDS", default_value_t = Limits::default().max_frame_age.as_secs())]
    max_frame_age: u64,
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
        Command::Run(options) => run(options),
    }
}

fn run(options: RunOptions) -> anyhow::Result<()> {
    let key = railscope_wire::Key::from_file(&options.key)?;
    let limits = Limits {
        max_nodes: options.max_nodes,
        max_series_per_node: options.max_series_per_node,
        max_series: options.max_series,
        max_recent_events: options.max_recent_events,
        max_frame_age: Duration::from_secs(options.max_frame_age),
        ..Limits::default()
    };
    let sockets = options.sockets.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    if sockets == 0 {
        anyhow::bail!("--sockets must be at least 1");
    }
    let config = CollectorConfig {
        listen: options.listen,
        sockets,
        http: (!options.no_http).then_some(options.http),
        data_dir: options.data.clone(),
        key,
        limits,
    };
    let collector = Collector::start(config, Parts::default())?;
    wait_for_signal().context("waiting for a signal")?;
    tracing::info!("stopping");
    collector.stop();
    Ok(())
}

/// Blocks until SIGINT or SIGTERM.
fn wait_for_signal() -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r,
            _ = term.recv() => Ok(()),
        }
    })
}
