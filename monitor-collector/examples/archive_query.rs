//! The archive's read path alone: the query engine's answers to the fleet bench's archive
//! questions, over an archive of simulated nodes (`monitor_testkit::NodeSender` with the
//! agent's adaptive sampler, the agent's metric names), without HTTP or JSON. For profiling
//! (`perf record`) and for comparing a change side by side in one run.
//!
//! `cargo run --release -p monitor-collector --example archive_query -- [--nodes N]
//! [--seconds S] [--open-s O] [--runs R] [--data DIR] [--only I]`
//!
//! With `--data` the archive is kept in DIR, and a later run with the same DIR asks its
//! questions of it without making it again (for a profiler to see the questions alone).
//!
//! The first `S - O` seconds are sealed; the last `O` seconds stay in the open segment, as in
//! a collector that has run for a while (its newest data is not yet sealed).

use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser as _;
use monitor_archive::{
    archive::{AcceptedFrame, Archive, ArchiveConfig},
    query::{
        engine::{Points, QueryEngine, SeriesQuery},
        selector::Matcher,
    },
};
use monitor_testkit::NodeSender;
use monitor_wire::Key;

#[derive(clap::Parser)]
struct Args {
    /// Simulated nodes (8 GPUs and 8 IB ports each) of a new archive.
    #[arg(long, default_value_t = 200)]
    nodes: u64,
    /// Seconds of the fleet, ending now.
    #[arg(long, default_value_t = 600)]
    seconds: u64,
    /// The last seconds left in the open segment (the rest sealed).
    #[arg(long, default_value_t = 120)]
    open_s: u64,
    /// Times each question is asked (the median is printed).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Where the archive is kept and found again (a temporary directory without it).
    #[arg(long)]
    data: Option<std::path::PathBuf>,
    /// The I-th question alone (from 0), for a profiler.
    #[arg(long)]
    only: Option<usize>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let (nodes, seconds, runs) = (args.nodes, args.seconds, args.runs.max(1));
    let open_s = args.open_s.min(seconds);
    let key = Key::from_bytes([7; 32]);
    let temp = tempfile::tempdir()?;
    let dir = args.data.as_deref().unwrap_or(temp.path());
    let made_file = dir.join("archive_query.json");
    let config = ArchiveConfig {
        segment_span: Duration::from_secs(86_400),
        retention_age: None,
        ..ArchiveConfig::new(dir)
    };
    let (archive, t0, seconds) = match std::fs::read(&made_file) {
        Ok(made) => {
            let made: serde_json::Value = serde_json::from_slice(&made)?;
            let (t0, seconds) = (made["t0"].as_u64(), made["seconds"].as_u64());
            (
                Archive::open(config)?,
                t0.context("t0")?,
                seconds.context("seconds")?,
            )
        }
        Err(_) => {
            let (archive, t0) = make(config, nodes, seconds, open_s, &key)?;
            std::fs::write(
                &made_file,
                serde_json::json!({ "t0": t0, "seconds": seconds }).to_string(),
            )?;
            (archive, t0, seconds)
        }
    };
    let end_ns = t0 + seconds * 1_000_000_000;

    let engine = QueryEngine::new(archive.reader(), key).with_max_points(50_000_000);
    let minute = end_ns - 60_000_000_000;
    let q = |metric: &str, matchers: &[&str], start_ns: u64| SeriesQuery {
        metric: metric.to_owned(),
        matchers: matchers
            .iter()
            .map(|m| Matcher::parse(m).unwrap())
            .collect(),
        start_ns,
        end_ns,
    };
    let counter = "railscope_ib_port_xmit_bytes_total";
    let gauge = "railscope_gpu_sm_util_ratio";
    let questions = [
        (
            "one counter, one node, the whole run",
            q(counter, &["node=gpu-node-0007", "device=mlx5_0"], t0),
        ),
        ("one gauge, all nodes, last minute", q(gauge, &[], minute)),
        ("one gauge, all nodes, the whole run", q(gauge, &[], t0)),
        (
            "a counter's rate, all nodes, last minute",
            q(counter, &[], minute),
        ),
    ];
    for (i, (what, question)) in questions.iter().enumerate() {
        if args.only.is_some_and(|o| o != i) {
            continue;
        }
        let mut times = Vec::new();
        let mut points = 0;
        let mut cost = None;
        for _ in 0..runs {
            let started = Instant::now();
            let (answer, c) = engine.series(question)?;
            times.push(started.elapsed().as_secs_f64() * 1e3);
            points = answer
                .iter()
                .map(|a| match &a.points {
                    Points::Counter(p) => p.len(),
                    Points::Gauge(p) => p.len(),
                })
                .sum::<usize>();
            cost = Some(c);
        }
        times.sort_by(f64::total_cmp);
        println!(
            "{what}: median {:.1} ms, {points} points, {:?}",
            times[times.len() / 2],
            cost.unwrap_or_default()
        );
    }
    Ok(())
}

/// Appends `seconds` of `nodes` simulated nodes, ending now, to a new archive; seals all but
/// the last `open_s` seconds. Returns the archive and the first second (Unix ns).
fn make(
    config: ArchiveConfig,
    nodes: u64,
    seconds: u64,
    open_s: u64,
    key: &Key,
) -> anyhow::Result<(Archive, u64)> {
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let t0: u64 = (now_s - seconds) * 1_000_000_000;
    let flush_s = 10;
    let mut senders: Vec<NodeSender> = (0..nodes)
        .map(|n| NodeSender::new(&format!("gpu-node-{n:04}"), n + 1, key.clone()).adaptive(true))
        .collect();
    let mut archive = Archive::open(config)?;
    let made = Instant::now();
    let mut samples = 0u64;
    // The first flush interval left open: everything before it is sealed.
    let open_from = (seconds - open_s).div_ceil(flush_s);
    let chunks = seconds.div_ceil(flush_s);
    for chunk in 0..chunks {
        if chunk == open_from {
            archive.seal()?;
        }
        let start = t0 + chunk * flush_s * 1_000_000_000;
        let len = (seconds - chunk * flush_s).min(flush_s);
        for s in senders.iter_mut() {
            for f in &s.run(start, len, flush_s) {
                let accepted = AcceptedFrame {
                    node: &s.name,
                    received_ns: f.received_ns,
                    first_ns: f.first_ns,
                    last_ns: f.last_ns,
                    bytes: &f.bytes,
                };
                archive.append(&accepted, &|_| s.schema_frame())?;
                samples += f.samples as u64;
            }
        }
        archive.tick()?;
    }
    if open_from >= chunks {
        archive.seal()?; // --open-s 0: all of it sealed
    }
    archive.tick()?;
    eprintln!(
        "{nodes} nodes x {seconds} s: {samples} samples in {:.0} s; {} segments",
        made.elapsed().as_secs_f64(),
        archive.stats().segments
    );
    Ok((archive, t0))
}
