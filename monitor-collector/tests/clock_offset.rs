//! Time across nodes (docs/agent.md, "Clock offset"; docs/findings.md, `clock_skew` and
//! "Fabric faults"): each acknowledgement's timing is a round trip from which an agent
//! estimates its clock's offset from the collector's; the collector shows it per node
//! (`/api/v1/live/nodes`, `/metrics`), finds a node whose clock is off, and compares
//! different nodes' port DOWN transitions on its own clock.
//!
//! - A real `railscope agent` on loopback (the fixture sysfs tree): its clock is the
//!   collector's, so its offset is zero within a bound of a few milliseconds.
//! - Three agents whose frames are made by monitor-wire's encoder and whose offsets are
//!   estimated by monitor-wire's estimator (the agent's own code) from the real collector's
//!   acknowledgements; one of them runs 3 s ahead: every time it stamps (its frames' send
//!   times, its samples and events, its side of each round trip) is 3 s ahead. It is found
//!   `clock_skew`, the others are not, and a switch dropping one port of each at the same
//!   moment is one `fabric_upstream_down` burst: on their own clocks its DOWN is 3 s after the
//!   others', far outside the 50 ms window.

use std::{
    collections::HashMap,
    ffi::OsStr,
    net::{SocketAddr, UdpSocket},
    sync::mpsc,
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use monitor_testkit::{
    CollectorProcess, FixtureAgent, KEY_HEX, agent_binary_next_to, key_file, key_from_hex,
    scratch_dir, sysfs_fixture, wait_for,
};
use monitor_wire::{
    EncoderConfig, FrameEncoder, GaugeSample, Key, Kind, Labels, Sample, Series, TIMING_MAGIC,
    WireEvent,
    clock_offset::{ClockEstimate, ClockFilter, Exchange},
    decode_timing,
    names::{event_kind, metric},
    peek_sequence,
};
use serde_json::Value;

const COLLECTOR: &str = env!("CARGO_BIN_EXE_railscope-collector");
const S: i64 = 1_000_000_000;
const MS: u64 = 1_000_000;

fn unix_now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// `/api/v1/live/nodes`' entry of `node`, once it has a clock offset.
fn live_clock(c: &CollectorProcess, node: &str) -> Option<(f64, f64)> {
    c.json("/api/v1/live/nodes")
        .as_array()?
        .iter()
        .find(|n| n["node"] == node)
        .and_then(|n| {
            Some((
                n["clock_offset_seconds"].as_f64()?,
                n["clock_offset_error_seconds"].as_f64()?,
            ))
        })
}

/// The value of `/metrics`' line `name{node="NODE"}`.
fn metric_of(c: &CollectorProcess, name: &str, node: &str) -> Option<f64> {
    let start = format!("{name}{{node=\"{node}\"}} ");
    c.get("/metrics")
        .lines()
        .find_map(|l| l.strip_prefix(&start)?.parse().ok())
}

fn findings(c: &CollectorProcess) -> Vec<Value> {
    c.json("/api/v1/findings")["findings"]
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn a_real_agent_on_the_collector_s_clock_has_an_offset_of_zero_within_a_small_bound() {
    let dir = scratch_dir("clock-offset-agent");
    let key = key_file(&dir, KEY_HEX);
    let config = dir.join("collector.toml");
    std::fs::write(&config, "[findings]\ntick-s = 1\n").unwrap();
    let c = CollectorProcess::command(COLLECTOR, &key, &dir.join("data"))
        .args([OsStr::new("--config"), config.as_os_str()])
        .args(["--sockets", "1"])
        .start();
    let _agent = FixtureAgent::new(&c.udp_addr().to_string(), &key, &sysfs_fixture("mlx5"))
        .node("clock-node")
        .args(["--no-gpu"])
        .cadence("0.3", "1")
        .spawn(agent_binary_next_to(COLLECTOR));
    // A few exchanges (one per acknowledgement, about a second apart) for the filter to
    // choose among.
    let (offset, error) = wait_for(
        "the agent's clock offset in /api/v1/live/nodes",
        Duration::from_secs(60),
        || live_clock(&c, "clock-node"),
    );
    thread::sleep(Duration::from_secs(5));
    let (offset, error) = live_clock(&c, "clock-node").unwrap_or((offset, error));
    eprintln!("clock-node: {offset:+.6} s within {error:.6} s");
    assert!(
        offset.abs() <= error,
        "one clock, so no offset beyond the bound: {offset} s within {error} s"
    );
    assert!(error < 0.02, "a loopback round trip: {error} s");
    let shown = metric_of(
        &c,
        "railscope_collector_node_clock_offset_error_seconds",
        "clock-node",
    );
    assert!(shown.is_some_and(|e| e < 0.02), "{shown:?}");
    let skewed: Vec<Value> = findings(&c)
        .into_iter()
        .filter(|f| f["rule"] == "clock_skew")
        .collect();
    assert!(skewed.is_empty(), "{skewed:#?}");
    let (ok, _, err) = c.stop();
    assert!(ok, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// An agent whose clock runs `skew_ns` ahead of the machine's: what it sends is made by
/// monitor-wire's encoder and stamped on its clock, and its clock offset is estimated from
/// the collector's acknowledgement timings by monitor-wire's estimator, as the agent does
/// (monitor-user/src/clock_exchange.rs): t1 when a frame is handed to the socket, t4 when a
/// timing comes off it (a thread of its own waits on the socket, as the agent's does).
struct SkewedAgent {
    node: String,
    skew_ns: i64,
    key: Key,
    socket: UdpSocket,
    encoder: FrameEncoder,
    /// seq → when it was sent, on this agent's clock.
    sent: HashMap<u64, u64>,
    replies: mpsc::Receiver<(Vec<u8>, u64)>,
    filter: ClockFilter,
}

impl SkewedAgent {
    fn new(node: &str, skew_ns: i64, key: &Key, collector: SocketAddr) -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket.connect(collector).unwrap();
        let (tx, replies) = mpsc::channel();
        let reader = socket.try_clone().unwrap();
        thread::spawn(move || {
            let mut buf = vec![0; 2048];
            while let Ok(n) = reader.recv(&mut buf) {
                let back = unix_now_ns().saturating_add_signed(skew_ns);
                if tx.send((buf[..n].to_vec(), back)).is_err() {
                    break;
                }
            }
        });
        Self {
            node: node.into(),
            skew_ns,
            key: key.clone(),
            socket,
            encoder: FrameEncoder::new(EncoderConfig::new(node), key.clone()).unwrap(),
            sent: HashMap::new(),
            replies,
            filter: ClockFilter::default(),
        }
    }

    /// Now, on this agent's clock.
    fn now(&self) -> u64 {
        unix_now_ns().saturating_add_signed(self.skew_ns)
    }

    fn send(&mut self, frames: Vec<Vec<u8>>) {
        for frame in frames {
            let (_, seq) = peek_sequence(&frame).unwrap();
            self.sent.insert(seq, self.now());
            self.socket.send(&frame).unwrap();
        }
    }

    /// Takes the timings that came (acknowledgements and the rest are not this test's).
    fn take_replies(&mut self) {
        while let Ok((datagram, back_ns)) = self.replies.try_recv() {
            if !datagram.starts_with(&TIMING_MAGIC) {
                continue;
            }
            let timing = decode_timing(&datagram, &self.key).unwrap();
            assert_eq!(
                (timing.node.as_str(), timing.session),
                (self.node.as_str(), self.encoder.session())
            );
            let Some(&sent_ns) = self.sent.get(&timing.seq) else {
                continue;
            };
            let _ = self.filter.take(&Exchange {
                sent_ns,
                received_ns: timing.received_ns,
                answered_ns: timing.sent_ns,
                back_ns,
            });
        }
    }

    /// One flush: the agent's version and, once it has one, its clock offset estimate.
    fn flush(&mut self) {
        self.take_replies();
        let now = self.now();
        let gauge = |name: &str, labels: Labels| Series {
            name: name.into(),
            labels,
            kind: Kind::Gauge,
        };
        let mut values = vec![(
            gauge(metric::AGENT_INFO, Labels::new([("version", "test")])),
            1.0,
        )];
        if let Some(e) = self.estimate() {
            values.push((
                gauge(metric::AGENT_CLOCK_OFFSET_SECONDS, Labels::default()),
                e.offset_seconds(),
            ));
            values.push((
                gauge(metric::AGENT_CLOCK_OFFSET_ERROR_SECONDS, Labels::default()),
                e.error_seconds(),
            ));
        }
        for (series, value) in values {
            self.encoder
                .push_sample(&series, Sample::Gauge(GaugeSample::reading(now, value)))
                .unwrap();
        }
        let frames = self.encoder.flush(now);
        self.send(frames);
    }

    fn estimate(&self) -> Option<ClockEstimate> {
        self.filter.estimate()
    }

    /// Port mlx5_0/1 goes DOWN at `at_ns` on this agent's clock: its `port_transition`, sent
    /// at once.
    fn port_down(&mut self, at_ns: u64) {
        self.encoder.push_event(WireEvent {
            unix_ns: at_ns,
            kind: event_kind::PORT_TRANSITION.into(),
            labels: Labels::new([("device", "mlx5_0"), ("port", "1"), ("from", "ACTIVE")]),
            code: 0,
            text: "DOWN".into(),
        });
        let frames = self.encoder.flush_events(self.now());
        self.send(frames);
    }
}

/// Flushes every agent every 250 ms for `time`.
fn run_for(agents: &mut [SkewedAgent], time: Duration) {
    let start = Instant::now();
    while start.elapsed() < time {
        for a in agents.iter_mut() {
            a.flush();
        }
        thread::sleep(Duration::from_millis(250));
    }
}

/// Flushes every agent every 250 ms until `done` answers (checked every second), or panics
/// after `within`.
fn run_until<T>(
    agents: &mut [SkewedAgent],
    what: &str,
    within: Duration,
    mut done: impl FnMut(&[SkewedAgent]) -> Option<T>,
) -> T {
    let start = Instant::now();
    let mut checked = Instant::now();
    loop {
        for a in agents.iter_mut() {
            a.flush();
        }
        if checked.elapsed() >= Duration::from_secs(1) {
            checked = Instant::now();
            if let Some(found) = done(agents) {
                return found;
            }
        }
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn a_node_3_s_ahead_is_found_skewed_and_its_port_down_is_grouped_on_the_collector_s_clock() {
    let dir = scratch_dir("clock-offset-skew");
    let key_path = key_file(&dir, KEY_HEX);
    let config = dir.join("collector.toml");
    std::fs::write(&config, "[findings]\ntick-s = 1\nfabric-min-nodes = 3\n").unwrap();
    let c = CollectorProcess::command(COLLECTOR, &key_path, &dir.join("data"))
        .args([OsStr::new("--config"), config.as_os_str()])
        .args(["--sockets", "1"])
        .start();
    let key = key_from_hex(KEY_HEX);
    let mut agents: Vec<SkewedAgent> = [("n1", 0), ("n2", 0), ("n3", 3 * S)]
        .into_iter()
        .map(|(node, skew)| SkewedAgent::new(node, skew, &key, c.udp_addr()))
        .collect();

    // The estimates, as the agents make them and as the collector shows them: n3 3 s ahead
    // within its bound, the others at 0; n3 alone found skewed.
    let skewed = run_until(
        &mut agents,
        "every node's clock offset, and n3 found skewed",
        Duration::from_secs(60),
        |_| {
            let known = ["n1", "n2", "n3"]
                .iter()
                .all(|n| live_clock(&c, n).is_some());
            known
                .then(|| c.active_finding("clock_skew", "n3"))
                .flatten()
        },
    );
    // A few more exchanges, and the tick after them (the fabric grouping gets the offsets
    // with each tick).
    run_for(&mut agents, Duration::from_secs(3));
    for a in &agents {
        let e = a.estimate().unwrap();
        let truth = a.skew_ns as f64 / 1e9;
        assert!(
            (e.offset_seconds() - truth).abs() <= e.error_seconds(),
            "{}: {e:?}",
            a.node
        );
        assert!(
            e.error_ns < 10 * MS,
            "{}: a loopback round trip: {e:?}",
            a.node
        );
        let (offset, error) = live_clock(&c, &a.node).unwrap();
        eprintln!("{}: {offset:+.6} s within {error:.6} s", a.node);
        assert!(
            (offset - truth).abs() <= error + 1e-9,
            "{}: /api/v1/live/nodes says {offset} s within {error} s",
            a.node
        );
        let shown = metric_of(&c, "railscope_collector_node_clock_offset_seconds", &a.node)
            .unwrap_or_else(|| panic!("{}'s offset on /metrics", a.node));
        assert!((shown - truth).abs() <= error + 1e-9, "{}: {shown}", a.node);
    }
    assert_eq!(skewed["severity"], "warning", "{skewed:#}");
    let evidence = &skewed["evidence"];
    assert!(
        (evidence["offset_ms"].as_f64().unwrap() - 3000.0).abs()
            <= evidence["error_ms"].as_f64().unwrap() + 1e-6,
        "{skewed:#}"
    );
    assert_eq!(evidence["threshold_ms"], 25);
    let others: Vec<Value> = findings(&c)
        .into_iter()
        .filter(|f| f["rule"] == "clock_skew" && f["node"] != "n3")
        .collect();
    assert!(others.is_empty(), "{others:#?}");

    // A switch drops one port of each node at the same moment: 2 ms apart as the kernels see
    // it, n3's stamped 3 s later by its clock.
    let moment = unix_now_ns() - 100 * MS;
    for (n, a) in agents.iter_mut().enumerate() {
        let at = (moment + n as u64 * 2 * MS).saturating_add_signed(a.skew_ns);
        a.port_down(at);
    }
    let upstream = run_until(
        &mut agents,
        "the upstream finding of the three nodes",
        Duration::from_secs(30),
        |_| {
            findings(&c)
                .into_iter()
                .find(|f| f["rule"] == "fabric_upstream_down")
        },
    );
    let evidence = &upstream["evidence"];
    assert_eq!(
        evidence["nodes"],
        serde_json::json!(["n1", "n2", "n3"]),
        "{upstream:#}"
    );
    assert_eq!(
        evidence["clock_unknown"],
        serde_json::json!([]),
        "{upstream:#}"
    );
    // 4 ms on the collector's clock, within the bounds of the three estimates.
    let spread = evidence["spread_ms"].as_f64().unwrap();
    assert!((spread - 4.0).abs() < 10.0, "{upstream:#}");
    let (ok, _, err) = c.stop();
    assert!(ok, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
