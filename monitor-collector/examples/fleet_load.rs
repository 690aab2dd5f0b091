//! The load generator of `cargo xtask bench fleet`: a fleet of simulated nodes sending what
//! real agents send, in real time, with faults injected at known times.
//!
//! The fleet is `monitor_testkit::SimulatedFleet` with [`adaptive`] sampling on (every series
//! through the agent's own sampler: stable series every ~32 s, out of phase, gauges as
//! envelopes, events at once), 8 GPUs and 8 IB ports per node read every second, flushed
//! every 10 s (each node at its own second of the cycle), 100 jobs of 8 to 1,024 nodes
//! (fewer and smaller on a small fleet) whose `job_id` labels the GPU series, and faults at
//! known ticks, each on a node of its own: ports going down for good, XID 79s, GPUs slowing
//! down (thermally throttled: the straggler's onset) and ports training down from 4X to 2X.
//!
//! Making a second of a large fleet takes longer than a second on a small machine, so every
//! tick's frames are made first, with times starting far enough ahead that they are ready
//! before the first tick's time comes; then each tick's frames are sent spread over its
//! second, from 256 sockets (a node always from the same one). Over stdin / stdout, one JSON
//! line per command: it prints `ready` (the fleet, its jobs and faults with their times)
//! when the frames are made; `go` sends them (answering when the last tick is sent: how late
//! the sending ran behind the ticks' times); `quit`.
//!
//! `cargo run --release -p monitor-collector --example fleet_load -- --target ADDR --key FILE
//! [--nodes N] [--seconds S]`
//!
//! [`adaptive`]: monitor_testkit::FleetBuilder::adaptive

use std::{
    io::{BufRead, Write as _},
    net::{SocketAddr, UdpSocket},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::Context as _;
use monitor_testkit::SimulatedFleet;
use monitor_wire::Key;
use serde_json::{Value, json};

/// Sending sockets: nodes share them round-robin.
const SOCKETS: usize = 256;

/// Jobs of the fleet, and their smallest and largest size in nodes.
const JOBS: usize = 100;
const MIN_JOB: usize = 8;
const MAX_JOB: usize = 1024;

/// The estimate of the time to make the frames: ticks measured after the probe's first ones.
const PROBE_FROM: u64 = 35;
const PROBE_TICKS: u64 = 10;

/// Faults of each kind.
const FAULTS_PER_KIND: usize = 10;

/// The load generator's command line (xtask's fleet bench passes it).
#[derive(clap::Parser)]
struct Args {
    /// The collector's UDP address.
    #[arg(long)]
    target: SocketAddr,
    /// The fleet's key file.
    #[arg(long, value_parser = read_key)]
    key: Key,
    #[arg(long, default_value_t = 12_500)]
    nodes: usize,
    #[arg(long, default_value_t = 180)]
    seconds: u64,
}

fn read_key(path: &str) -> Result<Key, String> {
    Key::from_file(path).map_err(|e| e.to_string())
}

fn parse_args() -> anyhow::Result<Args> {
    let args = <Args as clap::Parser>::parse();
    anyhow::ensure!(
        args.nodes >= 4 * MIN_JOB,
        "--nodes {}: at least {} (four jobs of {MIN_JOB})",
        args.nodes,
        4 * MIN_JOB
    );
    anyhow::ensure!(
        args.seconds >= 60,
        "--seconds {}: at least 60 (the faults come after the series' first 32 s)",
        args.seconds
    );
    Ok(args)
}

/// Job sizes from [`MIN_JOB`] to [`MAX_JOB`] nodes, most jobs small and a few large (sizes
/// growing as exp(x^2) along the jobs), the largest as large as the fleet allows (up to
/// [`MAX_JOB`]: the job view's goal is for a 1,024-node job), the rest scaled to fit 90% of
/// the fleet with it.
fn job_sizes(nodes: usize) -> Vec<usize> {
    let jobs = JOBS.min(nodes * 9 / 10 / MIN_JOB).max(1);
    let room = nodes * 9 / 10;
    let largest = MAX_JOB.min(room.saturating_sub(MIN_JOB * (jobs - 1)));
    let ratio = (MAX_JOB as f64 / MIN_JOB as f64).ln();
    let mut sizes: Vec<f64> = (0..jobs - 1)
        .map(|i| {
            let x = i as f64 / jobs.saturating_sub(2).max(1) as f64;
            MIN_JOB as f64 * (ratio * x * x).exp()
        })
        .collect();
    let rest = (room - largest) as f64;
    for _ in 0..20 {
        let sum: f64 = sizes.iter().sum();
        if sum <= rest {
            break;
        }
        let scale = rest / sum;
        for s in &mut sizes {
            *s = (*s * scale).max(MIN_JOB as f64);
        }
    }
    sizes
        .into_iter()
        .map(|s| (s.floor() as usize).clamp(MIN_JOB, MAX_JOB))
        .chain([largest.max(MIN_JOB)])
        .collect()
}

/// A fault injected: what, where, and the time the node stamps it with.
struct Fault {
    kind: &'static str,
    node: usize,
    /// The GPU or the port (`mlx5_<index>`).
    index: usize,
    job: Option<String>,
    tick: u64,
}

/// The fleet with its jobs and faults: faults start after the series' first 32 s (their
/// phases) and a warm-up, spread over the middle of the run, each kind on nodes of its own
/// in jobs (a straggler needs a job: the biggest jobs first).
fn build(args: &Args, start_unix_ns: u64) -> (SimulatedFleet, Vec<Fault>, Vec<(String, usize)>) {
    let sizes = job_sizes(args.nodes);
    let mut builder = SimulatedFleet::builder(args.nodes)
        .adaptive(true)
        .staggered_flush(true)
        .start_unix_ns(start_unix_ns)
        .seed(0xf1ee7);
    let mut jobs = Vec::new();
    let mut next = 0;
    for (i, &size) in sizes.iter().enumerate() {
        let id = format!("slurm:{}", 10_000 + i);
        builder = builder.job(&id, next..next + size);
        jobs.push((id, next, size));
        next += size;
    }
    // Faults between 40 s and the run's last third, one node of a job each, walking the jobs
    // from the largest down so that kinds do not share a node.
    let first = 40u64.min(args.seconds / 2);
    let last = (args.seconds * 2 / 3).max(first + 1);
    let kinds = ["port_down", "xid_79", "slow_gpu", "degraded_port"];
    let mut faults = Vec::new();
    let mut by_size: Vec<&(String, usize, usize)> = jobs.iter().collect();
    by_size.sort_by_key(|j| std::cmp::Reverse(j.2));
    let count = FAULTS_PER_KIND * kinds.len();
    for f in 0..count {
        let (job, job_start, job_size) = by_size[f % by_size.len()];
        let node = job_start + (f / by_size.len() * 7 + 3) % job_size;
        let kind = kinds[f % kinds.len()];
        let tick = first + (last - first) * f as u64 / count as u64;
        let index = (f * 3) % 8;
        builder = match kind {
            "port_down" => builder.port_down(node, index, tick),
            "xid_79" => builder.xid(node, index, 79, tick),
            "slow_gpu" => builder.slow_gpu_from(node, index, tick),
            _ => builder.degraded_port_from(node, index, tick),
        };
        faults.push(Fault {
            kind,
            node,
            index,
            job: Some(job.clone()),
            tick,
        });
    }
    let fleet = builder.build(args.key.clone());
    let jobs = jobs.into_iter().map(|(id, _, size)| (id, size)).collect();
    (fleet, faults, jobs)
}

fn unix_now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Seconds one tick of `nodes` nodes takes to make, from the ticks of a smaller fleet after
/// every series has started (the first 32 s send less: series start out of phase).
fn seconds_per_tick(args: &Args) -> f64 {
    let probe_nodes = args.nodes.min(100);
    let probe = Args {
        nodes: probe_nodes,
        seconds: args.seconds,
        target: args.target,
        key: args.key.clone(),
    };
    let (mut fleet, _, _) = build(&probe, 1_790_000_000_000_000_000);
    for _ in 0..PROBE_FROM {
        fleet.tick();
    }
    let started = Instant::now();
    for _ in 0..PROBE_TICKS {
        fleet.tick();
    }
    started.elapsed().as_secs_f64() / PROBE_TICKS as f64 * args.nodes as f64 / probe_nodes as f64
}

/// Sends every tick's frames, each tick's spread over its second from its time on.
fn send(
    ticks: &[Vec<Vec<u8>>],
    last: &[Vec<u8>],
    nodes_of: &[Vec<usize>],
    start_unix_ns: u64,
    target: SocketAddr,
) -> anyhow::Result<Value> {
    let sockets = (0..SOCKETS)
        .map(|_| UdpSocket::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .context("binding the sending sockets")?;
    let (mut datagrams, mut bytes, mut errors) = (0u64, 0u64, 0u64);
    let mut worst_late_ns = 0u64;
    let started_late_ns = unix_now_ns().saturating_sub(start_unix_ns);
    for (t, frames) in ticks.iter().enumerate() {
        let tick_ns = start_unix_ns + t as u64 * 1_000_000_000;
        while unix_now_ns() < tick_ns {
            std::thread::sleep(Duration::from_millis(1));
        }
        worst_late_ns = worst_late_ns.max(unix_now_ns() - tick_ns);
        for (i, frame) in frames.iter().enumerate() {
            let due = tick_ns + 1_000_000_000 * i as u64 / frames.len() as u64;
            if i % 16 == 0 {
                while unix_now_ns() < due {
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
            let node = nodes_of[t][i];
            if sockets[node % SOCKETS].send_to(frame, target).is_err() {
                errors += 1;
            }
            datagrams += 1;
            bytes += frame.len() as u64;
        }
    }
    for frame in last {
        if sockets[0].send_to(frame, target).is_err() {
            errors += 1;
        }
        datagrams += 1;
        bytes += frame.len() as u64;
    }
    Ok(json!({
        "datagrams": datagrams,
        "bytes": bytes,
        "send_errors": errors,
        "started_late_s": started_late_ns as f64 / 1e9,
        "worst_tick_late_s": worst_late_ns as f64 / 1e9,
    }))
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let started = Instant::now();
    let per_tick = seconds_per_tick(&args);
    // Ready with a margin (the machine is shared), on a whole second: the probe's estimate
    // has held to within 5% (a 2x margin left 15 minutes idle at 2,200 nodes × 540 s).
    let estimate = per_tick * args.seconds as f64 * 1.3 + 30.0;
    let start_unix_ns = (unix_now_ns() + (estimate * 1e9) as u64) / 1_000_000_000 * 1_000_000_000;
    let (mut fleet, faults, jobs) = build(&args, start_unix_ns);
    // Each tick's frames, and which node sends each (its socket).
    let mut ticks = Vec::with_capacity(args.seconds as usize);
    let mut nodes_of = Vec::with_capacity(args.seconds as usize);
    for _ in 0..args.seconds {
        let (nodes, frames): (Vec<usize>, Vec<Vec<u8>>) = fleet.tick_by_node().into_iter().unzip();
        nodes_of.push(nodes);
        ticks.push(frames);
    }
    let last = fleet.flush();
    let generate_s = started.elapsed().as_secs_f64();
    let fault_json: Vec<Value> = faults
        .iter()
        .map(|f| {
            let (gpu, device) = match f.kind {
                "xid_79" | "slow_gpu" => (Some(f.index.to_string()), None),
                _ => (None, Some(format!("mlx5_{}", f.index))),
            };
            json!({
                "kind": f.kind,
                "node": fleet.node_name(f.node),
                "gpu": gpu,
                "device": device,
                "port": device.as_ref().map(|_| 1),
                "job_id": f.job,
                "tick": f.tick,
                "unix_ns": fleet.tick_unix_ns(f.tick),
            })
        })
        .collect();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{}",
        json!({
            "ready": true,
            "nodes": args.nodes,
            "seconds": args.seconds,
            "start_unix_ns": start_unix_ns,
            "end_unix_ns": start_unix_ns + args.seconds * 1_000_000_000,
            "datagrams": ticks.iter().map(Vec::len).sum::<usize>() + last.len(),
            "bytes": ticks.iter().flatten().map(Vec::len).sum::<usize>(),
            "jobs": jobs.iter().map(|(id, size)| json!({"job_id": id, "nodes": size})).collect::<Vec<_>>(),
            "faults": fault_json,
            "node_names": [fleet.node_name(0), fleet.node_name(args.nodes - 1)],
            "estimated_generate_s": estimate,
            "seconds_per_tick": per_tick,
            "generate_s": generate_s,
        })
    )?;
    out.flush()?;
    for line in std::io::stdin().lock().lines() {
        let reply = match line?.trim() {
            "go" => send(&ticks, &last, &nodes_of, start_unix_ns, args.target)?,
            "quit" => break,
            other => anyhow::bail!("unknown command {other:?}"),
        };
        writeln!(out, "{reply}")?;
        out.flush()?;
    }
    Ok(())
}
