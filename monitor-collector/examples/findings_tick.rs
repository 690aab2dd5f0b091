//! The findings tick alone at fleet scale: a simulated fleet of real agents' frames is
//! ingested by a node table as ingest does (counter samples handed to the engine as the
//! findings inbox hands them), and every `tick-s` simulated seconds the engine runs a full
//! pass, `refresh` of the live view then `evaluate(Pass::All)`, as the findings thread's tick
//! does; each pass is timed. No sockets, no archive, no HTTP: only what the tick does.
//!
//! The fleet is `monitor_testkit::SimulatedFleet` as `cargo xtask bench fleet` makes it (the
//! agent's adaptive sampler, each node flushing every 10 s at its own second) with the
//! hardware path on (the golden profile reads it), jobs over 90% of the nodes and a few
//! faults, so the rules have something to find.
//!
//! `cargo run --release -p monitor-collector --example findings_tick -- [--nodes N]
//! [--seconds S]`: prints each pass's time and a markdown summary (bench/results/findings-tick.md
//! keeps one).

use std::{
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use clap::Parser as _;
use monitor_collector::{config::Limits, nodes::NodeTable};
use monitor_findings::{
    FindingsEngine, FindingsStore, Thresholds, engine::Pass, store::FindingFilter,
};
use monitor_testkit::SimulatedFleet;
use monitor_wire::Key;

/// Nodes a job spans.
const JOB_NODES: usize = 100;

#[derive(clap::Parser)]
struct Args {
    #[arg(long, default_value_t = 12_500)]
    nodes: usize,
    /// Simulated seconds of the fleet (one sweep a second); a full pass every `tick-s` (5).
    #[arg(long, default_value_t = 60)]
    seconds: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let key = Key::from_bytes([7; 32]);
    let t0: u64 = 1_790_000_000_000_000_000;
    let mut builder = SimulatedFleet::builder(args.nodes)
        .adaptive(true)
        .staggered_flush(true)
        .hardware_path()
        .start_unix_ns(t0)
        .seed(0xf1ee7);
    for (j, first) in (0..args.nodes * 9 / 10).step_by(JOB_NODES).enumerate() {
        let last = (first + JOB_NODES).min(args.nodes);
        builder = builder.job(&format!("slurm:{}", 10_000 + j), first..last);
    }
    for f in 0..10usize {
        let node = (f * 997 + 13) % args.nodes;
        let tick = 20 + f as u64 * 3;
        builder = match f % 3 {
            0 => builder.port_down(node, f % 8, tick),
            1 => builder.degraded_port_from(node, f % 8, tick),
            _ => builder.xid(node, f % 8, 79, tick),
        };
    }
    let mut fleet = builder.build(key.clone());

    let table = NodeTable::new(
        key,
        Limits {
            max_nodes: args.nodes + 1,
            max_series: usize::MAX,
            ..Limits::default()
        },
    );
    let th = Thresholds::default();
    let tick_s = th.tick_s;
    let store = Arc::new(FindingsStore::in_memory());
    let mut engine = FindingsEngine::new(th, store.clone());
    let from: SocketAddr = "127.0.0.1:9".parse()?;
    let mut making = Duration::ZERO;
    let mut ingesting = Duration::ZERO;
    let mut passes: Vec<(u64, Duration)> = Vec::new();
    eprintln!(
        "{} nodes, {} s, a full pass every {tick_s} s",
        args.nodes, args.seconds
    );
    for _ in 0..args.seconds {
        let tick = fleet.ticks();
        let t = fleet.tick_unix_ns(tick);
        let started = Instant::now();
        let frames = fleet.tick();
        making += started.elapsed();
        let started = Instant::now();
        let mut events = false;
        for f in frames {
            let accepted = table
                .ingest(&f, from, t + 1_000_000)
                .map_err(|r| anyhow::anyhow!("a frame was refused: {}", r.detail))?;
            events |= engine.take_frame(&accepted.node, &accepted.frame, &accepted.schema, t);
        }
        if events {
            engine.evaluate(Pass::Events, t);
        }
        ingesting += started.elapsed();
        if (tick + 1).is_multiple_of(tick_s) {
            let started = Instant::now();
            engine.refresh(&table);
            let refreshed = started.elapsed();
            engine.evaluate(Pass::All, t);
            let took = started.elapsed();
            eprintln!(
                "pass at {:>3} s: {:.3} s (refresh {:.3} s)",
                tick + 1,
                took.as_secs_f64(),
                refreshed.as_secs_f64()
            );
            passes.push((tick + 1, took));
        }
    }
    let mut found = store.list(&FindingFilter {
        start_ns: 0,
        end_ns: u64::MAX,
        ..Default::default()
    });
    let findings = found.len();
    // What was found, as one digest: the same fleet gives the same findings whatever the
    // engine's internals.
    found.sort_by(|a, b| a.id.cmp(&b.id));
    let mut digest = blake3::Hasher::new();
    for f in &found {
        let line = format!("{} {:?} {} {}\n", f.id, f.end, f.summary, f.evidence);
        digest.update(line.as_bytes());
    }
    let mut by_rule = std::collections::BTreeMap::<&str, usize>::new();
    for f in &found {
        *by_rule.entry(&f.rule).or_default() += 1;
    }
    eprintln!(
        "findings {by_rule:?}, digest {}",
        &digest.finalize().to_hex()[..16]
    );
    let secs: Vec<f64> = passes.iter().map(|p| p.1.as_secs_f64()).collect();
    let mean = secs.iter().sum::<f64>() / secs.len().max(1) as f64;
    let (longest_at, longest) = passes
        .iter()
        .max_by_key(|p| p.1)
        .map_or((0, 0.0), |p| (p.0, p.1.as_secs_f64()));
    // After every series has been sent once (the sampler's longest interval is ~32 s).
    let steady: Vec<f64> = passes
        .iter()
        .filter(|p| p.0 > 35)
        .map(|p| p.1.as_secs_f64())
        .collect();
    let steady_mean = steady.iter().sum::<f64>() / steady.len().max(1) as f64;
    let steady_longest = steady.iter().copied().fold(0.0, f64::max);
    println!(
        "| {} | {} | {} | {:.3} | {:.3} (at {} s) | {:.3} | {:.3} | {} | {:.0} | {:.0} |",
        args.nodes,
        table.series_count(),
        passes.len(),
        mean,
        longest,
        longest_at,
        steady_mean,
        steady_longest,
        findings,
        making.as_secs_f64(),
        ingesting.as_secs_f64(),
    );
    Ok(())
}
