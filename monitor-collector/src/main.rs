//! `railscope-collector`: the collector's binary (`railscope collector ...` runs it).

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use railscope_collector::{
    Collector, CollectorConfig, Limits, Parts,
    archive::{Archive, ArchiveConfig},
    metrics, query,
    remote_write::{self, ArchiveSource, EndpointConfig, RemoteWriter},
    writer::PublishingArchive,
};

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
    /// Ask a running collector (its HTTP API): series, events, nodes.
    Query(query::cli::QueryArgs),
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
    /// Archive segments whose newest frame is older than this are deleted (e.g. 30d, 12h;
    /// 0: kept whatever their age).
    #[arg(long, value_name = "AGE", default_value = "30d", value_parser = humantime::parse_duration)]
    retention_age: Duration,
    /// The oldest archive segments are deleted to keep the archive under this many bytes.
    #[arg(long, value_name = "BYTES")]
    retention_bytes: Option<u64>,
    /// Most points one query answer may hold (a larger one is refused with a message saying
    /// so): bounds a query's memory at about 140 B a point.
    #[arg(long, value_name = "N", default_value_t = query::engine::DEFAULT_MAX_POINTS)]
    query_max_points: usize,
    /// Remote-write the archive's samples to this Prometheus-compatible endpoint, e.g.
    /// vm=http://127.0.0.1:8428/api/v1/write (NAME names its cursor and metrics). Repeat
    /// for several.
    #[arg(long = "remote-write", value_name = "NAME=URL", value_parser = parse_endpoint)]
    remote_write: Vec<EndpointConfig>,
}

fn parse_endpoint(spec: &str) -> Result<EndpointConfig, String> {
    EndpointConfig::parse(spec).map_err(|e| e.to_string())
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
        Command::Query(args) => query::cli::run(&args),
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
    let mut archive_config = ArchiveConfig::new(&options.data);
    archive_config.retention_age =
        (!options.retention_age.is_zero()).then_some(options.retention_age);
    archive_config.retention_bytes = options.retention_bytes;
    let archive = Archive::open(archive_config)
        .with_context(|| format!("opening the archive in {}", options.data.display()))?;
    let reader = archive.reader();
    let archive = PublishingArchive::new(archive);
    let archive_stats = archive.stats();

    let state_dir = options.data.join("remote_write");
    let mut writers = Vec::new();
    for endpoint in options.remote_write {
        let source = ArchiveSource::new(reader.clone(), config.key.clone());
        writers.push(RemoteWriter::start(endpoint, source, &state_dir)?);
    }
    let writers = Arc::new(Mutex::new(writers));
    let shown = writers.clone();
    let extra_metrics = Box::new(move |out: &mut String| {
        metrics::write_archive_stats(
            out,
            &archive_stats.lock().unwrap_or_else(|p| p.into_inner()),
        );
        let writers = shown.lock().unwrap_or_else(|p| p.into_inner());
        if !writers.is_empty() {
            let stats: Vec<_> = writers.iter().map(|w| (w.name(), w.stats())).collect();
            remote_write::write_metrics(out, &stats);
        }
    });
    let engine = Arc::new(
        query::QueryEngine::new(reader, config.key.clone())
            .with_max_points(options.query_max_points),
    );
    let parts = Parts {
        archive: Some(Box::new(archive)),
        api: Some(query::api_router(engine)),
        extra_metrics: Some(extra_metrics),
    };
    let collector = Collector::start(config, parts)?;
    wait_for_signal().context("waiting for a signal")?;
    tracing::info!("stopping");
    collector.stop();
    let writers = std::mem::take(&mut *writers.lock().unwrap_or_else(|p| p.into_inner()));
    for writer in writers {
        writer.shutdown();
    }
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
