//! The collector as an operator runs it, fed by the real node agent: `railscope agent` reads
//! an mlx5-modelled sysfs tree and the NVML stand-in (a scripted 8-GPU replay, not a GPU) and
//! sends to `railscope collector run` (the agent's binary hands the subcommand to
//! `railscope-collector`). A relay between them keeps a copy of every datagram, so what the
//! collector holds and shows on `/metrics` is checked against what was sent. Also: forged,
//! replayed, truncated and random datagrams counted exactly by reason, and a collector killed
//! mid-stream that asks the agent for its schema when it comes back.
//!
//! The agent's binary is built next to the collector's before the first use
//! (`monitor_testkit::agent_binary_next_to`), so `cargo test -p monitor-collector` alone runs it.

use std::{
    collections::BTreeMap,
    net::UdpSocket,
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

mod tsdb;

use tsdb::{Tsdb, tsdb_binary};

use monitor_testkit::{
    CollectorProcess, FixtureAgent, Impairment, KEY_HEX, Relay, Running, agent_binary_next_to,
    free_tcp_port, free_udp_port, http_get, key_file, key_from_hex, metric_sum,
    remote_write_caught_up, scratch_dir,
    sent_frames::{TsdbComparison, archive_points, metric_names, queried_points, tsdb_samples_of},
    standin_with_script, sysfs_fixture, wait_for,
};
use monitor_wire::{
    EncoderConfig, Frame, FrameEncoder, Key, Labels, ReceiverState, SeriesData, WireError,
};

const COLLECTOR: &str = env!("CARGO_BIN_EXE_railscope-collector");

fn key() -> Key {
    key_from_hex(KEY_HEX)
}

/// `railscope`, next to `railscope-collector`.
fn railscope() -> PathBuf {
    agent_binary_next_to(COLLECTOR)
}

/// `railscope collector run` on loopback ports, through the agent binary's hand-over.
fn start_collector(udp: u16, http: u16, key: &Path, data: &Path) -> CollectorProcess {
    start_collector_with(udp, http, key, data, &[])
}

/// [`start_collector`] with more options.
fn start_collector_with(
    udp: u16,
    http: u16,
    key: &Path,
    data: &Path,
    extra: &[&str],
) -> CollectorProcess {
    CollectorProcess::command(railscope(), key, data)
        .through_agent_binary()
        .ports(udp, http)
        .args(["--sockets", "2"])
        .args(extra)
        .start()
}

/// The value of the exposition line `start VALUE`.
fn metric(text: &str, start: &str) -> Option<String> {
    text.lines()
        .find(|l| l.starts_with(start) && l[start.len()..].starts_with(' '))
        .map(|l| l[start.len() + 1..].to_owned())
}

/// The agent on the mlx5 fixture tree as node `gpu-node-001`, sending to `to`.
fn fixture_agent(to: &str, key: &Path) -> FixtureAgent {
    FixtureAgent::new(to, key, &sysfs_fixture("mlx5")).node("gpu-node-001")
}

/// A [`Relay`] in front of the collector's port `udp`, and the agent sending through it: the
/// mlx5 fixture tree and the NVML stand-in `lib`, read every 0.3 s, flushed every second.
fn relayed_agent(udp: u16, key: &Path, lib: &Path) -> (Relay, Running) {
    let relay = Relay::start(([127, 0, 0, 1], udp).into());
    let agent = fixture_agent(&relay.addr.to_string(), key)
        .nvml_lib(lib)
        .cadence("0.3", "1")
        .spawn(railscope());
    (relay, agent)
}

/// What the agent sent, as a receiver decodes it.
struct Sent {
    state: ReceiverState,
    frames: Vec<Frame>,
    /// `name{node="..",labels}` -> `value timestamp_ms`, the newest sample of each series.
    latest: BTreeMap<String, (u64, String)>,
}

fn decode_sent(datagrams: &[Vec<u8>]) -> Sent {
    let mut state = ReceiverState::default();
    let mut frames = Vec::new();
    let mut latest: BTreeMap<String, (u64, String)> = BTreeMap::new();
    for d in datagrams {
        let frame = monitor_wire::decode(d, &key(), &mut state)
            .unwrap_or_else(|e| panic!("the agent sent a datagram that does not decode: {e}"));
        let node = state.node(&frame.node).unwrap();
        for s in &frame.samples {
            let series = node.series(s.id).expect("every sample named (loopback)");
            let line = format!(
                "{}{}",
                series.name,
                exposition_labels(&frame.node, &series.labels)
            );
            let newest = match &s.data {
                SeriesData::Counter(v) => v
                    .iter()
                    .max_by_key(|c| c.unix_ns)
                    .map(|c| (c.unix_ns, c.value.to_string())),
                SeriesData::Gauge(v) => v
                    .iter()
                    .max_by_key(|g| g.end_unix_ns)
                    .map(|g| (g.end_unix_ns, g.mean.to_string())),
            };
            if let Some((t, value)) = newest
                && latest.get(&line).is_none_or(|(held, _)| *held <= t)
            {
                latest.insert(line, (t, format!("{value} {}", t / 1_000_000)));
            }
        }
        frames.push(frame);
    }
    Sent {
        state,
        frames,
        latest,
    }
}

fn exposition_labels(node: &str, labels: &Labels) -> String {
    let mut out = format!("{{node=\"{node}\"");
    for (k, v) in labels.iter() {
        out.push_str(&format!(",{k}=\"{v}\""));
    }
    out.push('}');
    out
}

/// The node series lines of an exposition: `name{labels}` -> `value timestamp_ms` (not the
/// collector's own families, nor its findings', docs/findings.md).
fn node_series(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter(|l| l.starts_with("railscope_") && !l.starts_with("railscope_collector_"))
        .filter(|l| !l.starts_with("railscope_finding"))
        .map(|l| {
            let (series, rest) = l.split_once("} ").unwrap();
            (format!("{series}}}"), rest.to_owned())
        })
        .collect()
}

#[test]
fn what_the_agent_sent_is_what_the_collector_holds_and_shows() {
    let dir = scratch_dir("collector-e2e");
    let key_path = key_file(&dir, KEY_HEX);
    let lib = standin_with_script(&dir);
    let (udp, http) = (free_udp_port(), free_tcp_port());
    let collector = start_collector(udp, http, &key_path, &dir.join("data"));
    let (relay, agent) = relayed_agent(udp, &key_path, &lib);
    // The stand-in's 10 scripted steps (one per read) and a few flushes.
    thread::sleep(Duration::from_secs(6));
    let (agent_ok, _, agent_err) = agent.signal(libc::SIGINT);
    assert!(agent_ok, "agent failed: {agent_err}");
    thread::sleep(Duration::from_millis(500));
    let datagrams = relay.stop();
    let sent = decode_sent(&datagrams);
    assert!(sent.frames.len() > 3, "{} frames", sent.frames.len());
    let samples: usize = sent.frames.iter().map(Frame::sample_count).sum();
    let events: usize = sent.frames.iter().map(|f| f.events.len()).sum();
    let node = sent.state.node("gpu-node-001").unwrap();
    assert_eq!(node.lost, 0, "loopback loses nothing");

    let text = http_get(http, "/metrics");
    let node_label = "{node=\"gpu-node-001\"}";
    let get = |name: &str| metric(&text, &format!("{name}{node_label}"));
    assert_eq!(
        get("railscope_collector_node_frames_total"),
        Some(sent.frames.len().to_string()),
        "{text}"
    );
    assert_eq!(
        get("railscope_collector_node_samples_total"),
        Some(samples.to_string())
    );
    assert_eq!(
        get("railscope_collector_node_events_total"),
        Some(events.to_string())
    );
    assert_eq!(
        get("railscope_collector_node_frames_lost_total"),
        Some("0".into())
    );
    assert_eq!(
        get("railscope_collector_node_unknown_samples_total"),
        Some("0".into())
    );
    assert_eq!(
        metric(&text, "railscope_collector_samples_accepted_total"),
        Some(samples.to_string())
    );
    for reason in [
        "bad_mac",
        "duplicate",
        "stale",
        "malformed",
        "receive_buffer_full",
    ] {
        assert_eq!(
            metric(
                &text,
                &format!("railscope_collector_frames_dropped_total{{reason=\"{reason}\"}}")
            ),
            Some("0".into()),
            "{reason}"
        );
    }
    // The agent's version, from its railscope_agent_info series.
    assert!(
        text.lines()
            .any(|l| l.starts_with("railscope_collector_node_info{")
                && l.contains(&format!("agent_version=\"{}\"", env!("CARGO_PKG_VERSION")))),
        "{text}"
    );

    // Every series the agent sent, with its newest value and time, and nothing else.
    let shown = node_series(&text);
    let expected: BTreeMap<String, String> = sent
        .latest
        .iter()
        .map(|(k, (_, line))| (k.clone(), line.clone()))
        .collect();
    assert!(expected.len() > 100, "{} series", expected.len());
    let missing: Vec<_> = expected
        .iter()
        .filter(|(k, v)| shown.get(*k) != Some(v))
        .take(5)
        .collect();
    assert!(missing.is_empty(), "not shown as sent: {missing:?}");
    assert_eq!(shown.len(), expected.len());
    for name in [
        "railscope_ib_port_xmit_bytes_total",
        "railscope_gpu_power_watts",
        "railscope_gpu_utilization_ratio",
    ] {
        assert!(
            shown.keys().any(|k| k.starts_with(&format!("{name}{{"))),
            "{name}"
        );
    }

    // The events, in the live view: every XID the stand-in scripted.
    let live: serde_json::Value =
        serde_json::from_str(&http_get(http, "/api/v1/live/events?limit=10000")).unwrap();
    let live = live.as_array().unwrap();
    assert_eq!(live.len(), events);
    let xids = live.iter().filter(|e| e["kind"] == "xid").count();
    let sent_xids = sent
        .frames
        .iter()
        .flat_map(|f| &f.events)
        .filter(|e| e.kind == "xid")
        .count();
    assert_eq!(xids, sent_xids);
    assert!(xids >= 5, "{xids}");

    // Now the bad ones, from elsewhere: each counted under its reason, exactly.
    let attacker = UdpSocket::bind("127.0.0.1:0").unwrap();
    let to = ("127.0.0.1", udp);
    let mut expect: BTreeMap<&str, u64> = BTreeMap::new();
    let mut state = sent.state;
    let mut paced = 0;
    let mut send = |bytes: &[u8]| {
        attacker.send_to(bytes, to).unwrap();
        paced += 1;
        if paced % 32 == 0 {
            thread::sleep(Duration::from_millis(2));
        }
    };
    // Replays: what a receiver that took every frame says of each (duplicate or stale).
    for d in &datagrams {
        let reason = match monitor_wire::decode(d, &key(), &mut state) {
            Err(WireError::Duplicate { .. }) => "duplicate",
            Err(WireError::Stale { .. }) => "stale",
            other => panic!("a replay is refused: {other:?}"),
        };
        *expect.entry(reason).or_default() += 1;
        send(d);
    }
    // Forged: the same node's frames sealed with another key.
    let mut forger =
        FrameEncoder::new(EncoderConfig::new("gpu-node-001"), Key::from_bytes([3; 32])).unwrap();
    forger.push_event(monitor_wire::WireEvent {
        unix_ns: 1,
        kind: "xid".into(),
        labels: Labels::new([("gpu", "0")]),
        code: 79,
        text: "forged".into(),
    });
    for f in forger.flush_events(2) {
        send(&f);
        *expect.entry("bad_mac").or_default() += 1;
    }
    // Truncated: every length of one real frame.
    let frame = &datagrams[datagrams.len() / 2];
    for len in 0..frame.len() {
        send(&frame[..len]);
        let reason = if len < monitor_wire::MIN_FRAME_LEN {
            "too_short"
        } else {
            "bad_mac"
        };
        *expect.entry(reason).or_default() += 1;
    }
    // Random bytes of every length up to 1400.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for len in (0..1400).step_by(7) {
        let random: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        send(&random);
        let reason = if len < monitor_wire::MIN_FRAME_LEN {
            "too_short"
        } else {
            "bad_mac"
        };
        *expect.entry(reason).or_default() += 1;
    }
    let total: u64 = expect.values().sum();
    let start = Instant::now();
    let dropped = |text: &str, reason: &str| {
        metric(
            text,
            &format!("railscope_collector_frames_dropped_total{{reason=\"{reason}\"}}"),
        )
        .unwrap()
        .parse::<u64>()
        .unwrap()
    };
    let text = loop {
        let text = http_get(http, "/metrics");
        let counted: u64 = [
            "too_short",
            "bad_mac",
            "duplicate",
            "stale",
            "bad_magic",
            "malformed",
            "receive_buffer_full",
        ]
        .iter()
        .map(|r| dropped(&text, r))
        .sum();
        if counted >= total || start.elapsed() > Duration::from_secs(10) {
            break text;
        }
        thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        dropped(&text, "receive_buffer_full"),
        0,
        "paced sends overflowed"
    );
    for (reason, count) in &expect {
        assert_eq!(dropped(&text, reason), *count, "{reason}");
    }
    assert_eq!(
        get("railscope_collector_node_frames_total"),
        Some(sent.frames.len().to_string()),
        "nothing bad was accepted"
    );
    let (_, _, collector_err) = collector.signal(libc::SIGTERM);
    assert!(
        collector_err.contains("dropped a datagram from 127.0.0.1:"),
        "{collector_err}"
    );
    // Rate-limited: a few lines for hundreds of drops.
    let drop_lines = collector_err.matches("dropped a datagram").count();
    assert!(drop_lines <= 8, "{drop_lines} lines:\n{collector_err}");
}

#[test]
fn a_collector_killed_mid_stream_asks_for_the_schema_when_it_is_back() {
    let dir = scratch_dir("collector-restart");
    let key_path = key_file(&dir, KEY_HEX);
    let (udp, http) = (free_udp_port(), free_tcp_port());
    let data = dir.join("data");
    let collector = start_collector(udp, http, &key_path, &data);
    let to = format!("127.0.0.1:{udp}");
    let agent = fixture_agent(&to, &key_path)
        .args(["--no-gpu"])
        .cadence("0.2", "0.5")
        .spawn(railscope());
    thread::sleep(Duration::from_secs(3));
    let before = node_series(&http_get(http, "/metrics"));
    assert!(before.len() > 50, "{} series before the kill", before.len());
    let (_, _, _) = collector.signal(libc::SIGKILL);

    // Back on the same ports: the schema went out in the agent's first flushes, long ago.
    let collector = start_collector(udp, http, &key_path, &data);
    thread::sleep(Duration::from_secs(4));
    let text = http_get(http, "/metrics");
    let (agent_ok, _, agent_err) = agent.signal(libc::SIGINT);
    let (_, _, collector_err) = collector.signal(libc::SIGTERM);
    assert!(agent_ok, "{agent_err}");
    assert!(
        collector_err.contains("asked gpu-node-001"),
        "{collector_err}"
    );
    assert!(agent_err.contains("asked for the schema"), "{agent_err}");
    let requests: u64 = metric(&text, "railscope_collector_schema_requests_sent_total")
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=2).contains(&requests), "{requests} requests");
    let unknown: u64 = metric(
        &text,
        "railscope_collector_node_unknown_samples_total{node=\"gpu-node-001\"}",
    )
    .unwrap()
    .parse()
    .unwrap();
    assert!(
        unknown > 0,
        "the restarted collector first got unnamed samples"
    );
    // Named again: the same series as before the kill.
    let after = node_series(&text);
    let before_names: Vec<_> = before.keys().collect();
    let after_names: Vec<_> = after.keys().collect();
    assert_eq!(before_names, after_names);
}

/// The agent -> the collector with its archive -> `railscope query`: every series the agent
/// sent, each sample exact, none missing, none extra; and the same after the collector was
/// killed with SIGKILL and started again on its data directory.
#[test]
fn what_the_agent_sent_is_answered_from_the_archive_also_after_sigkill() {
    let dir = scratch_dir("collector-archive-e2e");
    let key_path = key_file(&dir, KEY_HEX);
    let lib = standin_with_script(&dir);
    let data = dir.join("data");
    let (udp, http) = (free_udp_port(), free_tcp_port());
    let collector = start_collector(udp, http, &key_path, &data);
    let (relay, agent) = relayed_agent(udp, &key_path, &lib);
    thread::sleep(Duration::from_secs(5));
    let (agent_ok, _, agent_err) = agent.signal(libc::SIGINT);
    assert!(agent_ok, "agent failed: {agent_err}");
    thread::sleep(Duration::from_millis(500));
    let sent = decode_sent(&relay.stop());
    let expected = archive_points(&sent.state, &sent.frames);
    let metrics = metric_names(&expected);
    assert!(
        metrics.iter().any(|m| m.starts_with("railscope_ib_"))
            && metrics.iter().any(|m| m.starts_with("railscope_gpu_")),
        "the agent sent IB and GPU series: {metrics:?}"
    );
    let samples: usize = expected.values().map(Vec::len).sum();
    assert!(samples > 100, "{samples} samples sent");

    let answered = queried_points(&railscope(), http, &metrics);
    assert_eq!(
        answered, expected,
        "the archive answers exactly what was sent"
    );
    // The archive's files are on /metrics.
    let text = http_get(http, "/metrics");
    let records: u64 = metric(&text, "railscope_collector_archive_records")
        .unwrap()
        .parse()
        .unwrap();
    assert!(records >= sent.frames.len() as u64, "{text}");

    // SIGKILL: no shutdown, no last write-out. What was written out (every 100 ms) is kept.
    let (_, _, err) = collector.signal(libc::SIGKILL);
    let collector = start_collector(udp, http, &key_path, &data);
    let again = queried_points(&railscope(), http, &metrics);
    let (ok, _, err2) = collector.signal(libc::SIGTERM);
    assert!(ok, "collector failed after restart: {err2}");
    assert_eq!(
        again, expected,
        "after SIGKILL and restart the archive answers the same\nfirst run: {err}\nsecond: {err2}"
    );
}

/// The same, read back value by value, through what a lossy, busy network and an operator's
/// restarts do between them (issue 45: under loss, reordering and duplication, with the
/// collector killed and the agent restarted while it was away, whole flushes were
/// acknowledged and never answered): the link loses 5 % of the datagrams each way, passes 2 %
/// on twice and holds a quarter back behind the next; the collector is killed with SIGKILL and
/// started again twice, and the second time the agent is killed too and started again (its
/// spool and session kept) while the collector is away. Then the link is mended, the agent
/// delivers the rest and stops, and the archive answers exactly every sample it sent.
#[test]
fn every_sample_sent_through_loss_reordering_duplication_and_restarts_is_read_back() {
    let dir = scratch_dir("collector-lossy-e2e");
    let key_path = key_file(&dir, KEY_HEX);
    let lib = standin_with_script(&dir);
    let data = dir.join("data");
    let (udp, http) = (free_udp_port(), free_tcp_port());
    let mut collector = start_collector(udp, http, &key_path, &data);
    let relay = Relay::impaired(
        ([127, 0, 0, 1], udp).into(),
        Impairment {
            loss: 0.05,
            duplicate: 0.02,
            reorder: 0.25,
            seed: 45,
        },
    );
    let agent_of = fixture_agent(&relay.addr.to_string(), &key_path)
        .nvml_lib(&lib)
        .cadence("0.3", "1");
    let mut agent = agent_of.spawn(railscope());
    thread::sleep(Duration::from_secs(4));
    let _ = collector.signal(libc::SIGKILL);
    thread::sleep(Duration::from_secs(1));
    collector = start_collector(udp, http, &key_path, &data);
    thread::sleep(Duration::from_secs(3));
    // Both gone; the agent comes back first, with what its spool still holds.
    let _ = collector.signal(libc::SIGKILL);
    let _ = agent.signal(libc::SIGKILL);
    thread::sleep(Duration::from_millis(500));
    agent = agent_of.spawn(railscope());
    thread::sleep(Duration::from_secs(2));
    collector = start_collector(udp, http, &key_path, &data);
    thread::sleep(Duration::from_secs(4));

    relay.lift_impairment();
    let newest = wait_for(
        "a frame sent on the mended link",
        Duration::from_secs(10),
        || relay.highest_sent(),
    );
    let key = key();
    wait_for("every frame acknowledged", Duration::from_secs(30), || {
        relay.acknowledged_up_to(&key, newest).then_some(())
    });
    let (agent_ok, _, agent_err) = agent.signal(libc::SIGINT);
    assert!(agent_ok, "agent failed: {agent_err}");
    thread::sleep(Duration::from_millis(500));
    let sent =
        monitor_testkit::sent_frames::decode_sent(&key, relay.stop().iter().map(Vec::as_slice));
    assert!(sent.resent > 0, "the agent sent frames again");
    let expected = sent.archive_points();
    let metrics = metric_names(&expected);
    let samples: usize = expected.values().map(Vec::len).sum();
    assert!(samples > 1000, "{samples} samples sent");
    let answered = queried_points(&railscope(), http, &metrics);
    let missing: Vec<(&String, usize)> = expected
        .iter()
        .map(|(series, points)| {
            let got = answered.get(series).map_or(&[][..], Vec::as_slice);
            (series, points.iter().filter(|p| !got.contains(p)).count())
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    assert!(
        missing.is_empty(),
        "of {samples} samples sent, missing from the archive: {missing:#?}"
    );
    assert_eq!(
        answered, expected,
        "the archive answers exactly what was sent"
    );
    let (ok, _, err) = collector.signal(libc::SIGTERM);
    assert!(ok, "{err}");
}

// ---------------------------------------------------------------------------------------
// The agent -> the collector -> a TSDB, across a collector SIGKILL and a TSDB outage.

/// The real agent (fixture sysfs tree, NVML stand-in) sends through the relay to `railscope
/// collector run --remote-write` for about 14 s. The TSDB is stopped after 3 s; 2 s later the
/// collector is killed with SIGKILL mid-stream and started again on its data directory 1 s
/// later; 2 s after that the TSDB is started again. Afterwards the TSDB holds every sample of
/// every frame the agent sent, exactly (times and values), none twice: what reached the
/// collector in its last moments before the kill and what was sent while it was down, the
/// agent kept until acknowledged and sent again.
fn through_sigkill_and_outage(kind: Tsdb) {
    through_outage(kind, CollectorOutage::Killed);
}

/// How the collector goes away in [`through_outage`].
#[derive(Clone, Copy, Debug)]
enum CollectorOutage {
    /// SIGKILL mid-stream, started again 1 s later.
    Killed,
    /// Stopped (SIGTERM) for this long, as for an upgrade.
    Stopped(Duration),
}

fn through_outage(kind: Tsdb, outage: CollectorOutage) {
    let Some(binary) = tsdb_binary(kind) else {
        return;
    };
    let dir = scratch_dir(
        &format!("outage-{outage:?}-{}", kind.binary()).replace([' ', '(', ')', '.'], ""),
    );
    let key_path = key_file(&dir, KEY_HEX);
    let lib = standin_with_script(&dir);
    let mut server = tsdb::Server::start(kind, &binary, free_tcp_port(), &dir);
    let endpoint = format!("tsdb={}/api/v1/write", server.base());
    let extra = ["--remote-write", endpoint.as_str()];
    let data = dir.join("data");
    let (udp, http) = (free_udp_port(), free_tcp_port());
    let collector = start_collector_with(udp, http, &key_path, &data, &extra);
    let (relay, agent) = relayed_agent(udp, &key_path, &lib);
    thread::sleep(Duration::from_secs(3));
    server.stop();
    thread::sleep(Duration::from_secs(2));
    let killed_at = Instant::now();
    let (signal, down) = match outage {
        CollectorOutage::Killed => (libc::SIGKILL, Duration::from_secs(1)),
        CollectorOutage::Stopped(down) => (libc::SIGTERM, down),
    };
    let (_, _, first_err) = collector.signal(signal);
    thread::sleep(down);
    let collector = start_collector_with(udp, http, &key_path, &data, &extra);
    let back_at = Instant::now();
    thread::sleep(Duration::from_secs(2));
    server.spawn(&binary);
    // Long enough for the agent to send again what the collector missed, at its pace.
    thread::sleep(Duration::from_secs(3) + down / 4);
    let (agent_ok, _, agent_err) = agent.signal(libc::SIGINT);
    assert!(agent_ok, "agent failed: {agent_err}");
    thread::sleep(Duration::from_millis(500));
    let relayed = relay.stop_timed();

    remote_write_caught_up(http, Duration::from_secs(90));
    let text = http_get(http, "/metrics/collector");
    let archived_events: serde_json::Value =
        serde_json::from_str(&http_get(http, "/api/v1/events?start=-1h")).unwrap();
    let (ok, _, second_err) = collector.signal(libc::SIGTERM);
    assert!(ok, "collector failed after the restart: {second_err}");
    assert_eq!(
        metric_sum(
            &text,
            "railscope_collector_remote_write_samples_failed_total"
        ),
        0.0,
        "{text}"
    );

    // What the agent sent, frame by frame, as the TSDB must hold it: every frame (a frame
    // sent again is the same frame).
    let mut state = ReceiverState::default();
    let mut all = BTreeMap::new();
    let mut required = BTreeMap::new();
    let (mut frames_in_window, mut frames_required, mut resent) = (0, 0, 0);
    // Frames of the kill window: how long before the kill each reached the collector (none:
    // while it was down), and its samples.
    let mut window = Vec::new();
    // Every event the agent made, as (time, kind, code, text): the archive must hold each once.
    let mut events_sent = Vec::new();
    for (at, datagram) in &relayed {
        let frame = match monitor_wire::decode(datagram, &key(), &mut state) {
            Ok(frame) => frame,
            Err(monitor_wire::WireError::Duplicate { .. }) => {
                resent += 1;
                continue;
            }
            Err(e) => panic!("the agent sent a datagram that does not decode: {e}"),
        };
        events_sent.extend(
            frame
                .events
                .iter()
                .map(|e| (e.unix_ns, e.kind.clone(), e.code, e.text.clone())),
        );
        let mut samples = BTreeMap::new();
        tsdb_samples_of(&state, &frame, &mut samples);
        if *at + Duration::from_secs(1) >= killed_at && *at <= back_at {
            frames_in_window += 1;
            window.push((killed_at.checked_duration_since(*at), samples.clone()));
        }
        frames_required += 1;
        required.extend(samples.clone());
        all.extend(samples);
    }
    assert!(
        resent > 0,
        "nothing was sent again: the kill lost nothing to send again?"
    );
    assert!(
        frames_required > 10 && required.len() > 1000,
        "{} samples",
        required.len()
    );

    let got = server.read_back();
    let tsdb = TsdbComparison::of(&got, &all, &required);
    let seen = &tsdb.seen;

    let window: Vec<String> = window
        .iter()
        .map(|(before_kill, samples)| {
            let kept = samples.keys().filter(|k| seen.contains_key(*k)).count();
            let when = before_kill.map_or("while down".to_owned(), |d| {
                format!("{} ms before the kill", d.as_millis())
            });
            format!("{when}: {kept} of {} kept", samples.len())
        })
        .collect();
    eprintln!(
        "{}: {} samples read back; {} sent ({} frames, {resent} of them again), {} required ({} frames); kill window frames: {window:?}",
        kind.binary(),
        got.len(),
        all.len(),
        relayed.len(),
        required.len(),
        frames_required,
    );
    assert!(
        tsdb.is_exact(),
        "{}: {} wrong (first: {:?}), duplicated (first): {:?}, {} missing of {} required (first: {:?}); {frames_in_window} frames in the kill window\nfirst collector: {first_err}\nsecond: {second_err}",
        kind.binary(),
        tsdb.wrong.len(),
        tsdb.wrong.iter().take(5).collect::<Vec<_>>(),
        tsdb.twice.iter().take(5).collect::<Vec<_>>(),
        tsdb.missing.len(),
        required.len(),
        tsdb.missing.iter().take(5).collect::<Vec<_>>(),
    );

    // Every event, once, with the time the agent gave it (not the time it arrived).
    let mut events_archived: Vec<(u64, String, i64, String)> = archived_events["events"]
        .as_array()
        .expect("an events answer")
        .iter()
        .filter(|e| e["node"] == "gpu-node-001")
        .map(|e| {
            (
                e["t"].as_u64().unwrap(),
                e["kind"].as_str().unwrap().to_owned(),
                e["code"].as_i64().unwrap(),
                e["text"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    events_sent.sort();
    events_archived.sort();
    assert!(
        events_sent.iter().filter(|e| e.1 == "xid").count() >= 2,
        "the stand-in's XIDs did not come: {events_sent:?}"
    );
    assert_eq!(
        events_archived, events_sent,
        "the archive's events are not the agent's, once each"
    );
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn prometheus_holds_what_the_agent_sent_across_a_collector_sigkill_and_an_outage() {
    through_sigkill_and_outage(Tsdb::Prometheus);
}

#[test]
fn victoria_metrics_holds_what_the_agent_sent_across_a_collector_sigkill_and_an_outage() {
    through_sigkill_and_outage(Tsdb::VictoriaMetrics);
}

/// The collector stopped for a minute (an upgrade) while the agent goes on: afterwards the
/// TSDB holds every sample the agent made meanwhile, once, with its own time.
#[test]
fn victoria_metrics_holds_what_the_agent_sent_while_the_collector_was_stopped_for_a_minute() {
    through_outage(
        Tsdb::VictoriaMetrics,
        CollectorOutage::Stopped(Duration::from_secs(60)),
    );
}
