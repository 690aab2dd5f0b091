//! What per-node keys cost ingest: the part of `cargo xtask bench node-keys` that runs under
//! callgrind (instructions are counted exactly; CPU time here is shared and noisy).
//!
//! `node_keys_cost MODE [--nodes N] [--rounds R]`: makes the frames of N simulated nodes
//! (`monitor_testkit::NodeSender`, the agent's own 236 series of a busy node, every reading
//! of every second, flushed every 10 s, as the collector bench sends them) over R rounds,
//! sealed as MODE says, then hands every one to a fresh `NodeTable` in
//! [`ingest_all`], the one function the bench counts:
//! - `shared`: one shared key, the collector holding it (as before per-node keys);
//! - `node`: each node's own key, the collector holding the fleet secret;
//! - `flood`: the `node` fleet's frames first, then as many datagrams again that name
//!   random nodes (each a well-formed frame with a random MAC), all refused, from an address
//!   no node sent from; the counted part is the flood alone ([`ingest_flood`]), and it
//!   prints the nodes held, the refusals by reason and the resident memory before and after;
//! - `flood-neighbour`: the worst case: the fleet's frames with a random MAC, each naming a
//!   node the table holds, from the address every node of the fleet sent from (a refused frame
//!   naming a held node is also tried with the keys of the 8 nodes remembered for its address,
//!   to name a node speaking for another);
//! - `flood-shared`: the same flood against the `shared` fleet, for comparison.
//!
//! It prints one JSON line: frames, accepted, refused, samples, nodes held, RSS.

use std::time::{Duration, Instant};

use monitor_collector::{Limits, nodes::NodeTable};
use monitor_testkit::NodeSender;
use monitor_wire::{FleetSecret, Key, Keyring};

const ROUND_S: u64 = 10;

/// The key each node seals with.
type Sealing = Box<dyn Fn(&str) -> Key>;
const T0: u64 = 1_790_000_000_000_000_000;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("node");
    let flag = |name: &str, default: u64| -> anyhow::Result<u64> {
        match args.iter().position(|a| a == name) {
            Some(i) => Ok(args
                .get(i + 1)
                .ok_or_else(|| anyhow::anyhow!("{name} needs a value"))?
                .parse()?),
            None => Ok(default),
        }
    };
    let nodes = flag("--nodes", 500)? as usize;
    let rounds = flag("--rounds", 2)?;
    let secret = FleetSecret::from_bytes([0x42; 32]);
    let shared = Key::from_bytes([0x24; 32]);
    let (ring, sealing): (Keyring, Sealing) = match mode {
        "shared" | "flood-shared" => (
            Keyring::shared(shared.clone()),
            Box::new(move |_| shared.clone()),
        ),
        "node" | "flood" | "flood-neighbour" => {
            let s = secret.clone();
            (Keyring::fleet(secret), Box::new(move |n| s.node_key(n)))
        }
        other => {
            anyhow::bail!("mode {other:?}: shared, node, flood, flood-neighbour or flood-shared")
        }
    };
    let mut frames: Vec<Vec<u8>> = Vec::new();
    let mut senders: Vec<NodeSender> = (0..nodes)
        .map(|n| {
            let name = format!("gpu-node-{n:05}");
            NodeSender::new(&name, n as u64 + 1, sealing(&name))
        })
        .collect();
    let mut samples = 0usize;
    for r in 0..rounds {
        for sender in &mut senders {
            for f in sender.run(T0 + r * ROUND_S * 1_000_000_000, ROUND_S, ROUND_S) {
                samples += f.samples;
                frames.push(f.bytes);
            }
        }
    }
    let now = T0 + (rounds + 1) * ROUND_S * 1_000_000_000;
    let table = NodeTable::new(ring, Limits::default());
    let from = "10.0.0.1:7000".parse().unwrap();

    if mode.starts_with("flood") {
        let (accepted, _) = ingest_all(&table, &frames, from, now);
        let forged = forged_frames(&frames, mode != "flood-neighbour");
        let rss_before = rss_kib();
        let nodes_before = table.node_count();
        let flood_from = match mode {
            "flood-neighbour" => from,
            _ => "192.0.2.66:7000".parse().unwrap(),
        };
        let started = Instant::now();
        let outcomes = ingest_flood(&table, &forged, flood_from, now);
        let took = started.elapsed();
        println!(
            "{}",
            serde_json::json!({
                "mode": mode, "fleet_frames": frames.len(), "accepted": accepted,
                "flood_datagrams": forged.len(), "flood_outcomes": outcomes,
                "nodes_before": nodes_before,
                "nodes_after": table.node_count(), "rss_kib_before": rss_before,
                "rss_kib_after": rss_kib(), "flood_seconds": secs(took),
            })
        );
        return Ok(());
    }
    let started = Instant::now();
    let (accepted, refused) = ingest_all(&table, &frames, from, now);
    let took = started.elapsed();
    println!(
        "{}",
        serde_json::json!({
            "mode": mode, "frames": frames.len(), "accepted": accepted, "refused": refused,
            "samples": samples, "nodes": table.node_count(), "seconds": secs(took),
            "rss_kib": rss_kib(),
        })
    );
    Ok(())
}

/// Every frame through the table, as the receive threads hand them over: the counted part.
#[inline(never)]
fn ingest_all(
    table: &NodeTable,
    frames: &[Vec<u8>],
    from: std::net::SocketAddr,
    now: u64,
) -> (usize, usize) {
    let (mut accepted, mut refused) = (0, 0);
    for f in frames {
        match table.ingest(f, from, now) {
            Ok(_) => accepted += 1,
            Err(_) => refused += 1,
        }
    }
    (accepted, refused)
}

/// The flood through the table, refusals counted by reason: the counted part in the flood
/// modes.
#[inline(never)]
fn ingest_flood(
    table: &NodeTable,
    forged: &[Vec<u8>],
    from: std::net::SocketAddr,
    now: u64,
) -> std::collections::BTreeMap<&'static str, usize> {
    let mut outcomes = std::collections::BTreeMap::new();
    for f in forged {
        let outcome = match table.ingest(f, from, now) {
            Ok(_) => "accepted",
            Err(refused) => refused.reason.label(),
        };
        *outcomes.entry(outcome).or_default() += 1;
    }
    outcomes
}

/// As many datagrams as `frames`, each a frame of the fleet with a random MAC and, when
/// `rename`, its node renamed to a random name of the same length: what a flood naming random
/// nodes looks like once past the header.
fn forged_frames(frames: &[Vec<u8>], rename: bool) -> Vec<Vec<u8>> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    frames
        .iter()
        .map(|f| {
            let mut f = f.clone();
            let len = usize::from(f[6]);
            if rename {
                for b in &mut f[7..7 + len] {
                    *b = b'a' + (next() % 26) as u8;
                }
            }
            let n = f.len();
            for b in &mut f[n - 16..] {
                *b = next() as u8;
            }
            f
        })
        .collect()
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}
