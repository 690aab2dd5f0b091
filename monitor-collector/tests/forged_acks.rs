//! Acknowledgements that cannot be right never make an agent drop a frame it still has to
//! deliver, and are counted (docs/agent.md, "Delivery"; docs/wire-format.md,
//! "Acknowledgements").
//!
//! The real agent (`railscope agent` on the mlx5 fixture tree with the NVML stand-in) sends
//! through a relay to `railscope-collector`. The collector is killed; while it is down, the
//! agent is sent, from the collector's address, acknowledgements that each claim every frame
//! it has sent — sealed with a wrong key, for another node, of a session it never had, of
//! frames beyond those it sent, with a floor far in the future, garbled — and an old genuine
//! acknowledgement replayed. Had the agent taken any of the forged ones, the frames sent while
//! the collector was down would have left its spool and never reach the archive. The
//! collector comes back on its data directory: its archive holds every sample the agent sent,
//! and the agent reports exactly the forged acknowledgements as refused, on the collector's
//! `/metrics` (`railscope_agent_bound_hits_total{bound="acks_refused"}`) and in its state
//! line at stop.

use std::{
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use monitor_testkit::{
    CollectorProcess, FixtureAgent, KEY_HEX, Relay, agent_binary_next_to, free_tcp_port,
    free_udp_port, key_file, key_from_hex, scratch_dir,
    sent_frames::{decode_sent, metric_names, points_differing, queried_points},
    standin_with_script, sysfs_fixture,
};
use monitor_wire::{ACK_MAGIC, Ack, Key, encode_ack};

const COLLECTOR: &str = env!("CARGO_BIN_EXE_railscope-collector");
const NODE: &str = "gpu-node-001";

fn key() -> Key {
    key_from_hex(KEY_HEX)
}

fn railscope() -> PathBuf {
    agent_binary_next_to(COLLECTOR)
}

fn start_collector(udp: u16, http: u16, key: &Path, data: &Path) -> CollectorProcess {
    CollectorProcess::command(COLLECTOR, key, data)
        .ports(udp, http)
        .start()
}

/// An acknowledgement sealed with `key`, as a collector encodes one.
fn sealed(ack: &Ack, key: &Key) -> Vec<u8> {
    encode_ack(ack, key, 1400).unwrap()
}

/// The value of `name=` in the agent's state line.
fn state_value(line: &str, name: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {line:?}"))
}

/// What the collector's `/metrics` shows of the agent's refused acknowledgements.
fn refused_shown(http: u16) -> Option<u64> {
    let text = monitor_testkit::http_get(http, "/metrics");
    text.lines()
        .find(|l| {
            l.starts_with("railscope_agent_bound_hits_total{")
                && l.contains(&format!("node=\"{NODE}\""))
                && l.contains("bound=\"acks_refused\"")
        })
        .and_then(|l| l.split_once("} ")?.1.split(' ').next()?.parse().ok())
}

#[test]
fn forged_and_replayed_acknowledgements_drop_no_frame_and_are_counted() {
    let dir = scratch_dir("forged-acks");
    let key_path = key_file(&dir, KEY_HEX);
    let lib = standin_with_script(&dir);
    let data = dir.join("data");
    let (udp, http) = (free_udp_port(), free_tcp_port());
    let collector = start_collector(udp, http, &key_path, &data);
    let relay = Relay::start(([127, 0, 0, 1], udp).into());
    let agent = FixtureAgent::new(&relay.addr.to_string(), &key_path, &sysfs_fixture("mlx5"))
        .node(NODE)
        .nvml_lib(&lib)
        .cadence("0.3", "1")
        .spawn(railscope());
    thread::sleep(Duration::from_secs(4));
    let (_, _, first_err) = collector.signal(libc::SIGKILL);
    // A genuine acknowledgement from before the kill, to replay.
    let genuine = relay
        .replies_so_far()
        .into_iter()
        .rfind(|d| d.starts_with(&ACK_MAGIC))
        .unwrap_or_else(|| panic!("the collector acknowledged nothing in 4 s: {first_err}"));
    // The agent goes on sending into the void.
    thread::sleep(Duration::from_secs(3));

    let (session, highest) = relay.highest_sent().unwrap();
    // Each claims every frame sent so far, as an acknowledgement that empties the spool would.
    let all = Ack {
        node: NODE.into(),
        session,
        floor: highest + 1,
        held: Vec::new(),
    };
    let mut garbled = sealed(&all, &key());
    let last = garbled.len() - 1;
    garbled[last] ^= 1;
    let forged: Vec<(&str, Vec<u8>)> = vec![
        ("a wrong key", sealed(&all, &Key::from_bytes([3; 32]))),
        (
            "another node's",
            sealed(
                &Ack {
                    node: "gpu-node-002".into(),
                    ..all.clone()
                },
                &key(),
            ),
        ),
        (
            "a session never had",
            sealed(
                &Ack {
                    session: session.wrapping_add(1),
                    ..all.clone()
                },
                &key(),
            ),
        ),
        (
            "frames never sent",
            sealed(
                &Ack {
                    floor: 0,
                    held: vec![(1, highest + 10)],
                    ..all.clone()
                },
                &key(),
            ),
        ),
        (
            "far in the future",
            sealed(
                &Ack {
                    floor: u64::MAX - 1,
                    ..all.clone()
                },
                &key(),
            ),
        ),
        ("garbled", garbled),
    ];
    // Twice each, apart, and the genuine old one replayed in between: it holds only frames
    // the collector had archived, so taking it again drops nothing still owed.
    for _ in 0..2 {
        for (_, datagram) in &forged {
            relay.send_to_agent(datagram);
            thread::sleep(Duration::from_millis(50));
        }
        relay.send_to_agent(&genuine);
    }
    let refused = 2 * forged.len() as u64;
    thread::sleep(Duration::from_secs(2));

    // The collector is back: it asks for what it lacks, the agent sends it again.
    let collector = start_collector(udp, http, &key_path, &data);
    let back = Instant::now();
    let upto = relay.highest_sent().unwrap();
    while !relay.acknowledged_up_to(&key(), upto) {
        assert!(
            back.elapsed() < Duration::from_secs(60),
            "the collector did not acknowledge the agent's frames within 60 s of its return: did the agent take a forged acknowledgement and drop them?"
        );
        thread::sleep(Duration::from_millis(250));
    }
    // The count reaches the collector with the agent's state report.
    while refused_shown(http) != Some(refused) {
        assert!(
            back.elapsed() < Duration::from_secs(90),
            "the collector shows {:?} refused acknowledgements of {NODE}, not the {refused} forged",
            refused_shown(http)
        );
        thread::sleep(Duration::from_millis(250));
    }

    let (agent_ok, _, agent_err) = agent.signal(libc::SIGINT);
    assert!(agent_ok, "the agent failed: {agent_err}");
    let state = agent_err
        .lines()
        .find(|l| l.contains("stopping; state: "))
        .unwrap_or_else(|| panic!("the agent did not report its state: {agent_err}"));
    assert_eq!(
        state_value(state, "acks_refused"),
        refused,
        "forged: {:?}\n{state}",
        forged.iter().map(|(what, _)| what).collect::<Vec<_>>()
    );
    assert_eq!(
        (
            state_value(state, "spool_full"),
            state_value(state, "spool_age")
        ),
        (0, 0),
        "{state}"
    );
    thread::sleep(Duration::from_millis(300));
    let datagrams = relay.stop();
    let sent = decode_sent(&key(), datagrams.iter().map(Vec::as_slice));
    assert!(sent.resent > 0, "nothing was sent again: {state}");

    // Every sample the agent sent is in the archive, exactly.
    let expected = sent.archive_points();
    let samples: usize = expected.values().map(Vec::len).sum();
    assert!(samples > 500, "{samples} samples sent");
    let answered = queried_points(&railscope(), http, &metric_names(&expected));
    let differ = points_differing(&expected, &answered);
    assert!(
        differ.is_empty() && answered.len() == expected.len(),
        "the archive differs from what the agent sent ({} series answered, {} sent): {differ:?}",
        answered.len(),
        expected.len()
    );
    let (ok, _, err) = collector.stop();
    assert!(ok, "the collector failed: {err}");
    let _ = std::fs::remove_dir_all(&dir);
}
