//! The collector unreachable for a minute, then back: the agent keeps running, frames resume,
//! and the frames the collector is missing are exactly the ones the agent counted as lost
//! (dropped, or refused at the collector's host: each ICMP port unreachable that came back).
//!
//! Between the agent and `railscope listen` sits a relay this test owns: closing its socket
//! is the collector going away (its host answers port unreachable, as for a stopped
//! collector), binding the port again is the collector coming back, while the listener keeps
//! the session's sequence numbers and so counts every frame that never arrived.

use std::{
    net::UdpSocket,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use monitor_testkit::{
    FixtureAgent, KEY_HEX, free_udp_port, key_file, scratch_dir, spawn_json_listener, sysfs_fixture,
};

const RAILSCOPE: &str = env!("CARGO_BIN_EXE_railscope");
/// How long the collector is away (the "a minute").
const OUTAGE: Duration = Duration::from_secs(60);

/// Forwards datagrams from its port to `to` while open; closed, the port is unbound. Its
/// thread ends with the test.
struct Relay {
    open: Arc<AtomicBool>,
    forwarded: Arc<AtomicU64>,
}

impl Relay {
    fn start(to: u16) -> (Self, u16) {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = socket.local_addr().unwrap().port();
        let open = Arc::new(AtomicBool::new(true));
        let forwarded = Arc::new(AtomicU64::new(0));
        let (o, f) = (Arc::clone(&open), Arc::clone(&forwarded));
        thread::spawn(move || relay(socket, port, to, &o, &f));
        (Self { open, forwarded }, port)
    }
}

/// The relay's loop. Told to close, it closes its socket at the first 50 ms of silence after
/// a frame (the agent sends a batch per flush, every 500 ms here), so no frame is left unread
/// in the socket when it goes; told to open, it binds the same port again.
fn relay(socket: UdpSocket, port: u16, to: u16, open: &AtomicBool, forwarded: &AtomicU64) {
    let mut socket = Some(socket);
    let mut buf = vec![0u8; 65536];
    // A frame was forwarded since the relay was told to close.
    let mut frame_since_close = false;
    loop {
        match socket.as_ref() {
            Some(s) => {
                s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
                let closing = !open.load(Ordering::SeqCst);
                match s.recv(&mut buf) {
                    Ok(n) => {
                        s.send_to(&buf[..n], ("127.0.0.1", to)).unwrap();
                        forwarded.fetch_add(1, Ordering::SeqCst);
                        frame_since_close = closing;
                    }
                    Err(_) if closing && frame_since_close => {
                        socket = None;
                        frame_since_close = false;
                    }
                    Err(_) => {}
                }
            }
            None if open.load(Ordering::SeqCst) => {
                socket =
                    Some(UdpSocket::bind(("127.0.0.1", port)).expect("the relay's port again"));
            }
            None => thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// A count in the agent's closing line "to the collector: N frames sent, M dropped (...), R
/// refused by the collector's host, ...": the number before `what`.
fn count_before(line: &str, what: &str) -> u64 {
    let at = line
        .find(what)
        .unwrap_or_else(|| panic!("no {what:?} in {line:?}"));
    line[..at]
        .split_whitespace()
        .last()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count before {what:?} in {line:?}"))
}

#[test]
fn collector_away_for_a_minute_costs_exactly_the_counted_frames() {
    let dir = scratch_dir("outage");
    let key = key_file(&dir, KEY_HEX);
    let listen_port = free_udp_port();
    let listener = spawn_json_listener(RAILSCOPE, listen_port, &key);
    thread::sleep(Duration::from_millis(300));
    let (relay, relay_port) = Relay::start(listen_port);
    let relay_addr = format!("127.0.0.1:{relay_port}");
    let mut agent = FixtureAgent::new(&relay_addr, &key, &sysfs_fixture("mlx5"))
        .node("outage-node")
        .args(["--no-gpu"])
        .cadence("0.2", "0.5")
        .spawn(RAILSCOPE);
    thread::sleep(Duration::from_secs(4));
    let before = relay.forwarded.load(Ordering::SeqCst);
    assert!(before > 0, "no frame reached the relay before the outage");

    relay.open.store(false, Ordering::SeqCst);
    let away = Instant::now();
    while relay.forwarded.load(Ordering::SeqCst) == before {
        assert!(
            away.elapsed() < Duration::from_secs(5),
            "no frame to close on"
        );
        thread::sleep(Duration::from_millis(10));
    }
    // The relay closes 50 ms after that frame's batch.
    thread::sleep(OUTAGE);
    let at_outage_end = relay.forwarded.load(Ordering::SeqCst);
    assert!(
        agent.is_running(),
        "the agent exited while the collector was away"
    );
    relay.open.store(true, Ordering::SeqCst);
    thread::sleep(Duration::from_secs(5));
    let resumed = relay.forwarded.load(Ordering::SeqCst) - at_outage_end;
    assert!(
        resumed >= 5,
        "only {resumed} frames in the 5 s after the collector came back"
    );
    let (agent_ok, _, agent_err) = agent.interrupt();
    thread::sleep(Duration::from_millis(300));
    let (_, frames, listen_err) = listener.interrupt();
    assert!(agent_ok, "the agent failed: {agent_err}");

    let lost: u64 = frames
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{e}: {l}"))
        })
        .filter_map(|f| f["lost_before"].as_u64())
        .sum();
    let stats = agent_err
        .lines()
        .find(|l| l.contains("to the collector: "))
        .unwrap_or_else(|| panic!("the agent did not report its sender's counts: {agent_err}"));
    let dropped = count_before(stats, "dropped");
    let refused = count_before(stats, "refused by the collector's host");
    println!("collector missing {lost} frames; agent: {stats}");
    assert!(
        refused > 0,
        "the agent counted no refused frame over a minute's outage: {stats}"
    );
    assert_eq!(
        lost,
        dropped + refused,
        "the listener is missing {lost} frames, the agent counted {dropped} dropped and \
         {refused} refused\nagent: {agent_err}\nlisten: {listen_err}"
    );
}
