//! A fleet returning to its collector after an outage, for `cargo xtask bench delivery`: each
//! simulated node holds its backlog in the agent's own [`Spool`] (default settings: its
//! pace, its resends, its acknowledgements) and sends to a real collector from loopback
//! sockets, every 250 ms as the agent does.
//!
//! Each node's frames over `--seconds` are made first with the agent's encoder
//! (`monitor_testkit::NodeSender`: a busy node of 8 GPUs and 8 IB ports, every reading of
//! every second, flushed every 10 s) and spooled as sent and lost (the collector was away);
//! then each node sends its newest frame, as a live frame after the outage, and from there
//! only what the collector's acknowledgements ask for, at the spool's pace. Live traffic after
//! the return is left out: a node's live rate is about a tenth of its slowest resend pace.
//!
//! Prints one JSON line when its frames are made (`"ready": true`), progress on stderr every
//! 5 s, and one JSON line at the end: seconds until every node's spool was empty, datagrams
//! and bytes sent, frames sent again, times a pace halved, the pace's mean at the end.
//!
//! `cargo run --release -p monitor-user --example fleet_backlog -- --target ADDR --key FILE
//! [--nodes N] [--seconds S] [--timeout S]`

use std::{
    collections::HashMap,
    io::Write as _,
    net::{SocketAddr, UdpSocket},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::Context as _;
use monitor_testkit::NodeSender;
use monitor_user::spool::{Spool, SpoolConfig};
use monitor_wire::{Key, decode_ack};

/// Sending sockets, shared round-robin (a node always sends from the same one, and its
/// acknowledgements come back there).
const SOCKETS: usize = 64;
/// How often each node takes its acknowledgements and sends what is due (the agent's).
const DELIVER_EVERY: Duration = Duration::from_millis(250);

struct Args {
    target: SocketAddr,
    key: Key,
    nodes: usize,
    seconds: u64,
    timeout: Duration,
}

fn parse_args() -> anyhow::Result<Args> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |name: &str| -> Option<&String> {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    let number = |name: &str, default: u64| -> anyhow::Result<u64> {
        value(name).map_or(Ok(default), |v| {
            v.parse().with_context(|| format!("{name} {v:?}"))
        })
    };
    Ok(Args {
        target: value("--target")
            .context("--target ADDR is required")?
            .parse()?,
        key: Key::from_file(value("--key").context("--key FILE is required")?)?,
        nodes: number("--nodes", 2000)? as usize,
        seconds: number("--seconds", 600)?,
        timeout: Duration::from_secs(number("--timeout", 1800)?),
    })
}

/// One simulated node: its spool and its newest frame (sent first, live).
struct Node {
    name: String,
    spool: Spool,
    newest: Vec<u8>,
}

fn make_fleet(args: &Args, end_ns: u64) -> (Vec<Node>, u64, u64) {
    let start_ns = end_ns - args.seconds * 1_000_000_000;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let made: Vec<Vec<(usize, Node, u64, u64)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (key, nodes, seconds) = (args.key.clone(), args.nodes, args.seconds);
                scope.spawn(move || {
                    let mut out = Vec::new();
                    for n in (t..nodes).step_by(threads) {
                        let name = format!("gpu-node-{n:04}");
                        let mut sender = NodeSender::new(&name, n as u64 + 1, key.clone());
                        let mut frames = sender.run(start_ns, seconds, 10);
                        let newest = frames.pop().map(|f| f.bytes).unwrap_or_default();
                        let now = Instant::now();
                        let mut spool = Spool::new(&name, 1, SpoolConfig::default(), now);
                        let (mut bytes, mut samples) = (newest.len() as u64, 0u64);
                        for f in frames {
                            bytes += f.bytes.len() as u64;
                            samples += f.samples as u64;
                            spool.push(f.bytes, now);
                        }
                        out.push((
                            n,
                            Node {
                                name,
                                spool,
                                newest,
                            },
                            bytes,
                            samples,
                        ));
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a generator thread panicked"))
            .collect()
    });
    let mut all: Vec<(usize, Node, u64, u64)> = made.into_iter().flatten().collect();
    all.sort_by_key(|(n, ..)| *n);
    let bytes = all.iter().map(|(_, _, b, _)| b).sum();
    let samples = all.iter().map(|(_, _, _, s)| s).sum();
    (
        all.into_iter().map(|(_, node, ..)| node).collect(),
        bytes,
        samples,
    )
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let started = Instant::now();
    let end_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let (mut nodes, backlog_bytes, backlog_samples) = make_fleet(&args, end_ns);
    let by_name: HashMap<String, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.clone(), i))
        .collect();
    let sockets = (0..SOCKETS)
        .map(|_| {
            let s = UdpSocket::bind("127.0.0.1:0")?;
            s.set_nonblocking(true)?;
            Ok(s)
        })
        .collect::<std::io::Result<Vec<_>>>()
        .context("binding the sending sockets")?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{}",
        serde_json::json!({
            "ready": true,
            "nodes": nodes.len(),
            "backlog_bytes": backlog_bytes,
            "backlog_samples": backlog_samples,
            "generate_s": started.elapsed().as_secs_f64(),
        })
    )?;
    out.flush()?;

    // The collector is back: each node's live frame, then what it asks for.
    let back = Instant::now();
    let (mut datagrams, mut bytes, mut acks, mut bad_acks) = (0u64, 0u64, 0u64, 0u64);
    for (i, node) in nodes.iter_mut().enumerate() {
        let frame = std::mem::take(&mut node.newest);
        node.spool.push(frame.clone(), back);
        sockets[i % SOCKETS].send_to(&frame, args.target)?;
        datagrams += 1;
        bytes += frame.len() as u64;
    }
    let mut buf = vec![0u8; 65536];
    let mut next_report = back + Duration::from_secs(5);
    let finished = loop {
        let now = Instant::now();
        for socket in &sockets {
            while let Ok((len, _)) = socket.recv_from(&mut buf) {
                acks += 1;
                let Ok(ack) = decode_ack(&buf[..len], &args.key) else {
                    bad_acks += 1;
                    continue;
                };
                if let Some(&i) = by_name.get(&ack.node)
                    && nodes[i].spool.on_ack(0, &ack, now).is_err()
                {
                    bad_acks += 1;
                }
            }
        }
        let mut left = 0usize;
        for (i, node) in nodes.iter_mut().enumerate() {
            for (_, frame) in node.spool.due(now) {
                // A full socket buffer drops it here, as the kernel would on the way.
                let _ = sockets[i % SOCKETS].send_to(&frame, args.target);
                datagrams += 1;
                bytes += frame.len() as u64;
            }
            left += node.spool.len();
        }
        if left == 0 {
            break Some(back.elapsed());
        }
        if now >= next_report {
            let rate: f64 = nodes.iter().map(|n| n.spool.resend_rate(0)).sum::<f64>();
            eprintln!(
                "    {:>5.0} s: {left} frames not yet acknowledged; paces sum to {:.1} MB/s",
                back.elapsed().as_secs_f64(),
                rate / 1e6
            );
            next_report += Duration::from_secs(5);
        }
        if back.elapsed() > args.timeout {
            break None;
        }
        std::thread::sleep(DELIVER_EVERY.saturating_sub(now.elapsed()));
    };
    let stats: Vec<_> = nodes.iter().map(|n| n.spool.stats()).collect();
    let mean_pace =
        nodes.iter().map(|n| n.spool.resend_rate(0)).sum::<f64>() / nodes.len().max(1) as f64;
    writeln!(
        out,
        "{}",
        serde_json::json!({
            "delivered_s": finished.map(|d| d.as_secs_f64()),
            "nodes_unfinished": nodes.iter().filter(|n| !n.spool.is_empty()).count(),
            "datagrams_sent": datagrams,
            "bytes_sent": bytes,
            "frames_resent": stats.iter().map(|s| s.resent).sum::<u64>(),
            "resend_slowdowns": stats.iter().map(|s| s.resend_slowdowns).sum::<u64>(),
            "acks": acks,
            "acks_refused": bad_acks,
            "mean_pace_at_end": mean_pace,
        })
    )?;
    out.flush()?;
    Ok(())
}
