//! The job view's straggler search alone, at fleet scale: a simulated fleet of real agents'
//! frames (the agent's own adaptive sampler) is ingested by a node table as ingest does, so
//! the straggler metrics' steps are kept at ingest; then one job's search over the window the
//! dashboard's job view asks (5 minutes ending on a 10 s step, one step behind the fleet's
//! clock) is timed, answered from those steps, as `GET /api/v1/stragglers?job_id=` answers it.
//! No sockets, no archive (an empty one: every node is answered from the steps), no HTTP.
//!
//! The fleet: `--nodes` nodes of 8 GPUs and 8 ports, one job of `--job-nodes` (1,024 by
//! default: the largest job) and jobs of 64 nodes on the rest, a slow GPU and a
//! degraded port in the big job.
//!
//! `cargo run --release -p monitor-collector --example stragglers_search -- [--nodes N]
//! [--job-nodes J] [--runs R]`: prints each search's time, the median, and what was found.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use clap::Parser as _;
use monitor_archive::{
    archive::{Archive, ArchiveConfig},
    query::engine::QueryEngine,
};
use monitor_collector::{config::Limits, nodes::NodeTable};
use monitor_findings::stragglers::{StragglerSettings, find};
use monitor_testkit::SimulatedFleet;
use monitor_wire::Key;

#[derive(clap::Parser)]
struct Args {
    #[arg(long, default_value_t = 1_100)]
    nodes: usize,
    /// Nodes of the job searched (the first ones).
    #[arg(long, default_value_t = 1_024)]
    job_nodes: usize,
    /// Searches timed.
    #[arg(long, default_value_t = 5)]
    runs: usize,
}

/// Simulated seconds: the 5-minute window, its 2-minute look-back for the archive's path and
/// a step behind the clock.
const SECONDS: u64 = 300 + 10 + 20;
const STEP_NS: u64 = 10_000_000_000;

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let key = Key::from_bytes([7; 32]);
    // On a step, so the window the page asks is one of the steps kept at ingest.
    let t0: u64 = 1_790_000_000_000_000_000 / STEP_NS * STEP_NS;
    let job = "slurm:1";
    let mut builder = SimulatedFleet::builder(args.nodes)
        .adaptive(true)
        .staggered_flush(true)
        .start_unix_ns(t0)
        .seed(0x5_1ab)
        .job(job, 0..args.job_nodes)
        .slow_gpu_from(args.job_nodes / 3, 5, 120)
        .degraded_port_from(args.job_nodes / 2, 3, 60);
    for (j, first) in (args.job_nodes..args.nodes).step_by(64).enumerate() {
        builder = builder.job(
            &format!("slurm:{}", 100 + j),
            first..(first + 64).min(args.nodes),
        );
    }
    let mut fleet = builder.build(key.clone());
    let table = NodeTable::new(
        key.clone(),
        Limits {
            max_nodes: args.nodes + 1,
            max_series: usize::MAX,
            ..Limits::default()
        },
    );
    let dir = tempfile::tempdir()?;
    let archive = Archive::open(ArchiveConfig::new(dir.path()))?;
    let engine = QueryEngine::new(archive.reader(), key);
    let from: SocketAddr = "127.0.0.1:9".parse()?;
    let started = Instant::now();
    for _ in 0..SECONDS {
        let t = fleet.tick_unix_ns(fleet.ticks());
        for f in fleet.tick() {
            table
                .ingest(&f, from, t + 1_000_000)
                .map_err(|r| anyhow::anyhow!("a frame was refused: {}", r.detail))?;
        }
    }
    eprintln!(
        "{} nodes, {} series, {SECONDS} s of frames made and ingested in {:.0} s",
        args.nodes,
        table.series_count(),
        started.elapsed().as_secs_f64()
    );
    // The job view's window: 5 minutes ending on the step one behind the fleet's clock.
    let now = fleet.tick_unix_ns(fleet.ticks());
    let end = (now / STEP_NS - 1) * STEP_NS;
    let start = end - 300_000_000_000;
    let settings = StragglerSettings::default();
    let mut took: Vec<Duration> = Vec::new();
    let mut answer = None;
    for _ in 0..args.runs {
        let started = Instant::now();
        let search = find(
            &engine,
            None,
            Some(&table),
            Some(job),
            start,
            end,
            &settings,
        )?;
        took.push(started.elapsed());
        answer = Some(search);
    }
    let search = answer.expect("at least one run");
    for t in &took {
        eprintln!("search: {:.3} s", t.as_secs_f64());
    }
    took.sort();
    let found = &search.jobs;
    eprintln!(
        "nodes read: {:?}; {}",
        search.read,
        found
            .iter()
            .map(|j| format!(
                "{}: {} nodes, {} GPUs, stragglers {:?}",
                j.job_id,
                j.nodes,
                j.gpus,
                j.stragglers
                    .iter()
                    .map(|s| format!(
                        "{} {}{} {} (score {:.1}{})",
                        s.node,
                        s.gpu
                            .as_deref()
                            .map(|g| format!("GPU {g}"))
                            .unwrap_or_default(),
                        s.device
                            .as_deref()
                            .map(|d| format!("{d}/{}", s.port.unwrap_or(0)))
                            .unwrap_or_default(),
                        s.metric,
                        s.score,
                        if s.onset { ", onset" } else { "" }
                    ))
                    .collect::<Vec<_>>()
            ))
            .collect::<Vec<_>>()
            .join("; ")
    );
    println!(
        "| {} | {} | {:.3} | {:.3} |",
        args.nodes,
        args.job_nodes,
        took[took.len() / 2].as_secs_f64(),
        took[0].as_secs_f64()
    );
    Ok(())
}
