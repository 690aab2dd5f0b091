//! The load generator of `cargo xtask bench collector`: simulated agents on loopback.
//!
//! It makes the frames of a fleet of simulated nodes up front (`monitor_testkit::NodeSender`:
//! a busy node of 8 GPUs and 8 IB ports sending the agent's own series, 236 of them, every
//! reading of every second, as the agent sends with adaptive sampling off, through the agent's
//! encoder, flushed every 10 s), then sends them to a collector when told,
//! each node from its own UDP socket (so the kernel spreads the nodes over the collector's
//! `SO_REUSEPORT` sockets as it does a fleet's), paced at a given number of samples per second.
//! The bench (xtask/src/bench/collector.rs) drives it over stdin, one command a line, and reads
//! one JSON line back per command:
//!
//! - `hour`: sends the frames of one node over the hour before the fleet's data (`hour-node`),
//!   for the node-hour query;
//! - `send RATE SECONDS`: sends the next RATE x SECONDS samples of the fleet, in whole frames,
//!   paced every millisecond;
//! - `finish RATE`: sends the rest of the current round (every node up to the same second);
//! - `flood RATE SECONDS`: sends datagrams that must all be refused, RATE a second, in turn
//!   forged (a valid frame with a byte changed), replayed (a frame of the hour node, already
//!   accepted), truncated and random bytes, and says how many of each (a pool made first,
//!   sent by two threads with `sendmmsg` from message headers made once, at nice -10);
//! - `ping`: one short random datagram from every socket (so that the collector reads the
//!   kernel's count of datagrams it dropped, which comes with the next datagram received);
//! - `quit`.
//!
//! `cargo run --release -p monitor-collector --example collector_load -- --target ADDR (--key
//! FILE | --fleet-secret FILE) [--nodes N] [--samples S | --rounds R] [--threads T]` (each
//! node's frames sealed with the shared key, or with its own key from the fleet secret): rounds of 10 s of every node,
//! enough for S samples and one more round (default 6 rounds).

use std::{
    io::{BufRead, Write as _},
    net::{SocketAddr, UdpSocket},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::Context as _;
use monitor_testkit::NodeSender;
use monitor_wire::{FleetSecret, Key};

/// Sending sockets: nodes share them round-robin (a node always sends from the same one).
const SOCKETS: usize = 256;

/// Seconds of readings in one frame round (the agent's flush interval).
const ROUND_S: u64 = 10;

struct Args {
    target: SocketAddr,
    /// Who seals each node's frames: one shared key, or each node's own key.
    keys: Sealing,
    nodes: usize,
    rounds: u64,
    /// Samples the fleet's rounds must hold at least (then one more round); overrides rounds.
    samples: Option<u64>,
    threads: usize,
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
            v.parse()
                .with_context(|| format!("{name} {v}: not a number"))
        })
    };
    Ok(Args {
        target: value("--target")
            .context("--target ADDR:PORT is required")?
            .parse()
            .context("--target: not an ADDR:PORT")?,
        keys: match (value("--key"), value("--fleet-secret")) {
            (Some(key), None) => Sealing::Shared(Key::from_file(key)?),
            (None, Some(secret)) => Sealing::PerNode(FleetSecret::from_file(secret)?),
            _ => anyhow::bail!("give --key FILE (a shared key) or --fleet-secret FILE"),
        },
        nodes: number("--nodes", 2000)? as usize,
        rounds: number("--rounds", 6)?,
        samples: value("--samples")
            .map(|_| number("--samples", 0))
            .transpose()?,
        threads: number("--threads", 2)?.max(1) as usize,
    })
}

/// How the simulated nodes seal their frames.
#[derive(Clone)]
enum Sealing {
    /// One key shared by every node.
    Shared(Key),
    /// Each node its own key, derived from the fleet secret.
    PerNode(FleetSecret),
}

impl Sealing {
    fn key_of(&self, node: &str) -> Key {
        match self {
            Sealing::Shared(key) => key.clone(),
            Sealing::PerNode(secret) => secret.node_key(node),
        }
    }
}

/// One datagram of the fleet: its node (which socket sends it) and its sample count.
struct Datagram {
    node: usize,
    samples: usize,
    bytes: Vec<u8>,
}

fn unix_now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn node_name(n: usize) -> String {
    format!("gpu-node-{n:04}")
}

/// The fleet's frames, round by round (every node's frames of one 10 s round, node by node),
/// made on `threads` threads, and where each round ends.
fn make_fleet(args: &Args, t0_ns: u64) -> (Vec<Datagram>, Vec<usize>) {
    let per_thread: Vec<Vec<(u64, usize, Vec<Datagram>)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..args.threads)
            .map(|t| {
                let keys = args.keys.clone();
                let (nodes, rounds, threads) = (args.nodes, args.rounds, args.threads);
                scope.spawn(move || {
                    let mut out = Vec::new();
                    for n in (t..nodes).step_by(threads) {
                        let name = node_name(n);
                        let mut sender = NodeSender::new(&name, n as u64 + 1, keys.key_of(&name));
                        for r in 0..rounds {
                            let start = t0_ns + r * ROUND_S * 1_000_000_000;
                            let frames = sender
                                .run(start, ROUND_S, ROUND_S)
                                .into_iter()
                                .map(|f| Datagram {
                                    node: n,
                                    samples: f.samples,
                                    bytes: f.bytes,
                                })
                                .collect();
                            out.push((r, n, frames));
                        }
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
    let mut all: Vec<(u64, usize, Vec<Datagram>)> = per_thread.into_iter().flatten().collect();
    all.sort_by_key(|(r, n, _)| (*r, *n));
    let mut round_ends = vec![0; args.rounds as usize];
    let mut fleet = Vec::new();
    for (r, _, datagrams) in all {
        fleet.extend(datagrams);
        round_ends[r as usize] = fleet.len();
    }
    (fleet, round_ends)
}

/// One node's frames over the hour that ends at `end_ns`.
fn make_hour(keys: &Sealing, end_ns: u64) -> Vec<Datagram> {
    let mut sender = NodeSender::new("hour-node", 1_000_000, keys.key_of("hour-node"));
    sender
        .run(end_ns - 3600 * 1_000_000_000, 3600, ROUND_S)
        .into_iter()
        .map(|f| Datagram {
            node: 0,
            samples: f.samples,
            bytes: f.bytes,
        })
        .collect()
}

/// Sends `datagrams` paced at `rate` samples a second (every millisecond, as many as are due).
fn send_paced(
    sockets: &[UdpSocket],
    target: SocketAddr,
    datagrams: &[Datagram],
    rate: f64,
) -> anyhow::Result<serde_json::Value> {
    let started = Instant::now();
    let (mut samples, mut bytes, mut errors) = (0u64, 0u64, 0u64);
    let mut i = 0;
    while i < datagrams.len() {
        let due = started.elapsed().as_secs_f64() * rate;
        while i < datagrams.len() && (samples as f64) <= due {
            let d = &datagrams[i];
            if sockets[d.node % SOCKETS].send_to(&d.bytes, target).is_err() {
                errors += 1;
            }
            samples += d.samples as u64;
            bytes += d.bytes.len() as u64;
            i += 1;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(serde_json::json!({
        "datagrams": datagrams.len(),
        "samples": samples,
        "bytes": bytes,
        "send_errors": errors,
        "elapsed_s": started.elapsed().as_secs_f64(),
    }))
}

/// A splitmix64 for the flood's random choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Threads sending the flood, each from its own share of the sockets.
const FLOOD_THREADS: usize = 2;

/// Datagrams handed to the kernel per `sendmmsg` call.
const FLOOD_BATCH: usize = 64;

/// Datagrams that must all be refused, `rate` a second for `seconds`: in turn forged,
/// replayed, truncated and random, made from frames the collector has accepted (`sent`: the
/// hour node's, sent at a modest rate), then, after 300 ms, a [`ping`]. A pool of them is
/// made first; [`FLOOD_THREADS`] threads then send it round and round, in batches of
/// [`FLOOD_BATCH`] per `sendmmsg` (headers made once, threads at nice -10), so that the
/// generator is not what limits the rate.
fn flood(
    sockets: &[UdpSocket],
    target: SocketAddr,
    sent: &[Datagram],
    rate: f64,
    seconds: f64,
) -> anyhow::Result<serde_json::Value> {
    anyhow::ensure!(!sent.is_empty(), "flood: no frames to make datagrams from");
    let SocketAddr::V4(v4) = target else {
        anyhow::bail!("flood: {target} is not an IPv4 address");
    };
    let mut rng = Rng(0x5eed);
    let pool: Vec<Vec<u8>> = (0..8192)
        .map(|i| {
            let d = &sent[(rng.next() % sent.len() as u64) as usize];
            let mut buf = Vec::new();
            match i % 4 {
                0 => {
                    buf.extend_from_slice(&d.bytes);
                    let at = (rng.next() % buf.len() as u64) as usize;
                    buf[at] ^= 1 + (rng.next() % 255) as u8;
                }
                1 => buf.extend_from_slice(&d.bytes),
                2 => {
                    let len = 1 + (rng.next() % (d.bytes.len() as u64 - 1)) as usize;
                    buf.extend_from_slice(&d.bytes[..len]);
                }
                _ => {
                    let len = 1 + (rng.next() % 1400) as usize;
                    buf.extend((0..len).map(|_| rng.next() as u8));
                }
            }
            buf
        })
        .collect();
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: v4.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*v4.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    let total = (rate * seconds) as u64;
    let started = Instant::now();
    let per_thread: Vec<([u64; 4], bool)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..FLOOD_THREADS)
            .map(|t| {
                let (pool, addr) = (&pool, &addr);
                scope.spawn(move || {
                    let raised = raise_priority();
                    let share = total / FLOOD_THREADS as u64
                        + u64::from((t as u64) < total % FLOOD_THREADS as u64);
                    let rate = rate / FLOOD_THREADS as f64;
                    // This thread's datagrams of the pool (every FLOOD_THREADS-th), with their
                    // message headers made once: a `sendmmsg` call then only points at a slice.
                    let mine: Vec<usize> = (t..pool.len()).step_by(FLOOD_THREADS).collect();
                    let mut iovs: Vec<libc::iovec> = mine
                        .iter()
                        .map(|&ix| libc::iovec {
                            iov_base: pool[ix].as_ptr() as *mut libc::c_void,
                            iov_len: pool[ix].len(),
                        })
                        .collect();
                    let mut msgs: Vec<libc::mmsghdr> =
                        iovs.iter_mut().map(|iov| message(addr, iov)).collect();
                    let mut counts = [0u64; 4];
                    let (mut done, mut next, mut calls) = (0u64, 0usize, 0usize);
                    while done < share {
                        let due = ((started.elapsed().as_secs_f64() * rate) as u64).min(share);
                        while done < due {
                            let n = ((due - done) as usize)
                                .min(FLOOD_BATCH)
                                .min(msgs.len() - next);
                            let socket = &sockets[(t + calls * FLOOD_THREADS) % sockets.len()];
                            calls += 1;
                            let taken = send_batch(socket, &mut msgs[next..next + n]);
                            for &ix in &mine[next..next + taken] {
                                counts[ix % 4] += 1;
                            }
                            // What the kernel refused (ENOBUFS) is not sent and not counted.
                            let advanced = taken.max(1);
                            next = (next + advanced) % msgs.len();
                            done += advanced as u64;
                        }
                        std::thread::sleep(Duration::from_micros(100));
                    }
                    (counts, raised)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a flood thread panicked"))
            .collect()
    });
    let elapsed = started.elapsed();
    let mut counts = [0u64; 4];
    for (c, _) in &per_thread {
        for (sum, n) in counts.iter_mut().zip(c) {
            *sum += n;
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    counts[3] += ping(sockets, target, &mut rng);
    Ok(serde_json::json!({
        "forged": counts[0],
        "replayed": counts[1],
        "truncated": counts[2],
        "random": counts[3],
        "datagrams": counts.iter().sum::<u64>(),
        "elapsed_s": elapsed.as_secs_f64(),
        "threads": FLOOD_THREADS,
        "batch": FLOOD_BATCH,
        "priority_raised": per_thread.iter().all(|(_, raised)| *raised),
    }))
}

/// Gives the calling thread nice -10 (root only; false where refused): on a machine whose
/// cores the collector shares with the generator, the flood must not be slowed by the very
/// collector it floods (on loopback the sender also pays the kernel's receive path).
fn raise_priority() -> bool {
    // SAFETY: plain system calls on the calling thread's own id.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, -10) == 0 }
}

/// A message header sending `iov` to `addr`.
fn message(addr: &libc::sockaddr_in, iov: &mut libc::iovec) -> libc::mmsghdr {
    // SAFETY: an all-zero mmsghdr is a valid empty message header.
    let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
    m.msg_hdr.msg_name = addr as *const libc::sockaddr_in as *mut libc::c_void;
    m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    m.msg_hdr.msg_iov = iov;
    m.msg_hdr.msg_iovlen = 1;
    m
}

/// Sends `msgs` with one `sendmmsg`; returns how many the kernel took (from the first on).
fn send_batch(socket: &UdpSocket, msgs: &mut [libc::mmsghdr]) -> usize {
    use std::os::fd::AsRawFd as _;
    // SAFETY: every header points at a live iovec, address and buffer (made by `message`
    // from the pool, which outlives the call).
    let n = unsafe {
        libc::sendmmsg(
            socket.as_raw_fd(),
            msgs.as_mut_ptr(),
            msgs.len() as libc::c_uint,
            0,
        )
    };
    usize::try_from(n).unwrap_or(0)
}

/// One short random datagram from every socket, 100 µs apart: each receive socket of the
/// collector then reads the kernel's count of what it dropped (which comes with the next
/// datagram it receives). Returns how many were sent.
fn ping(sockets: &[UdpSocket], target: SocketAddr, rng: &mut Rng) -> u64 {
    let mut sent = 0;
    for socket in sockets {
        let len = 1 + (rng.next() % 16) as usize;
        let junk: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        if socket.send_to(&junk, target).is_ok() {
            sent += 1;
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    sent
}

fn main() -> anyhow::Result<()> {
    let mut args = parse_args()?;
    let started = Instant::now();
    // A node's series and metric names: what its first second sends.
    let (series_per_node, metrics) = {
        let mut probe = NodeSender::new(&node_name(0), 1, args.keys.key_of(&node_name(0)));
        probe.run(1_790_000_000_000_000_000, 1, ROUND_S);
        (probe.series(), probe.metrics())
    };
    if let Some(samples) = args.samples {
        let per_round = (args.nodes * series_per_node) as u64 * ROUND_S;
        args.rounds = samples.div_ceil(per_round.max(1)) + 1;
    }
    // The fleet's data ends a minute before now; the hour node's hour ends where it starts.
    let span_ns = args.rounds * ROUND_S * 1_000_000_000;
    let t0_ns = (unix_now_ns() / 1_000_000_000) * 1_000_000_000 - span_ns - 60_000_000_000;
    let (fleet, round_ends) = make_fleet(&args, t0_ns);
    let hour = make_hour(&args.keys, t0_ns);
    let sockets = (0..SOCKETS)
        .map(|_| UdpSocket::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .context("binding the sending sockets")?;
    let fleet_samples: usize = fleet.iter().map(|d| d.samples).sum();
    let hour_samples: usize = hour.iter().map(|d| d.samples).sum();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{}",
        serde_json::json!({
            "ready": true,
            "nodes": args.nodes,
            "fleet_datagrams": fleet.len(),
            "fleet_samples": fleet_samples,
            "fleet_bytes": fleet.iter().map(|d| d.bytes.len()).sum::<usize>(),
            "hour_samples": hour_samples,
            "series_per_node": series_per_node,
            "rounds": args.rounds,
            "t0_ns": t0_ns,
            "end_ns": t0_ns + span_ns,
            "hour_node": "hour-node",
            "metrics": metrics,
            "generate_s": started.elapsed().as_secs_f64(),
        })
    )?;
    out.flush()?;
    let mut next = 0usize;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let reply = match words.as_slice() {
            ["hour"] => send_paced(&sockets, args.target, &hour, 2_000_000.0)?,
            ["send", rate, seconds] => {
                let rate: f64 = rate.parse().context("send: RATE")?;
                let seconds: f64 = seconds.parse().context("send: SECONDS")?;
                let want = (rate * seconds) as usize;
                let (mut end, mut samples) = (next, 0usize);
                while end < fleet.len() && samples < want {
                    samples += fleet[end].samples;
                    end += 1;
                }
                anyhow::ensure!(
                    samples >= want,
                    "send: only {samples} of the {want} samples asked for are left (--rounds)"
                );
                let reply = send_paced(&sockets, args.target, &fleet[next..end], rate)?;
                next = end;
                reply
            }
            ["finish", rate] => {
                let end = round_ends
                    .iter()
                    .copied()
                    .find(|&e| e > next)
                    .context("finish: every round was sent")?;
                let rate: f64 = rate.parse().context("finish: RATE")?;
                let reply = send_paced(&sockets, args.target, &fleet[next..end], rate)?;
                next = end;
                reply
            }
            ["flood", rate, seconds] => flood(
                &sockets,
                args.target,
                &hour,
                rate.parse().context("flood: RATE")?,
                seconds.parse().context("flood: SECONDS")?,
            )?,
            ["ping"] => {
                serde_json::json!({"datagrams": ping(&sockets, args.target, &mut Rng(0x9e11))})
            }
            ["quit"] => break,
            _ => anyhow::bail!("unknown command {line:?}"),
        };
        writeln!(out, "{reply}")?;
        out.flush()?;
    }
    Ok(())
}
