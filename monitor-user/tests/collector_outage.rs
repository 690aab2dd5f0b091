//! The collector unreachable for a minute, then back: the agent keeps running, frames resume,
//! and the collector misses nothing: the agent kept every frame it sent meanwhile (its
//! spool) and sends again what was not acknowledged.
//!
//! Between the agent and `railscope listen` sits a relay this test owns: closing its socket
//! is the collector going away (its host answers port unreachable, as for a stopped
//! collector), binding the port again is the collector coming back, while the listener keeps
//! the session's sequence numbers and so counts every frame that never arrived.
//!
//! And the agent killed (SIGKILL) while the collector is away, then started again: it takes
//! back from its spool file what the killed process had not delivered, resumes its session,
//! and the collector misses nothing of either process.

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
/// How long it is away while the agent restarts (the restart is the point, not the length).
const RESTART_OUTAGE: Duration = Duration::from_secs(16);

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

    /// The collector goes away, once the frame batch now on its way went through.
    fn close(&self) {
        let before = self.forwarded.load(Ordering::SeqCst);
        assert!(before > 0, "no frame reached the relay before the outage");
        self.open.store(false, Ordering::SeqCst);
        let away = Instant::now();
        while self.forwarded.load(Ordering::SeqCst) == before {
            assert!(
                away.elapsed() < Duration::from_secs(5),
                "no frame to close on"
            );
            thread::sleep(Duration::from_millis(10));
        }
        // The relay closes 50 ms after that frame's batch.
    }
}

/// The relay's loop. Told to close, it closes its socket at the first 50 ms of silence after
/// a frame (the agent sends a batch per flush, every 500 ms here), so no frame is left unread
/// in the socket when it goes; told to open, it binds the same port again.
fn relay(socket: UdpSocket, port: u16, to: u16, open: &AtomicBool, forwarded: &AtomicU64) {
    let mut socket = Some(socket);
    let mut buf = vec![0u8; 65536];
    let mut agent = None;
    // A frame was forwarded since the relay was told to close.
    let mut frame_since_close = false;
    loop {
        match socket.as_ref() {
            Some(s) => {
                s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
                let closing = !open.load(Ordering::SeqCst);
                match s.recv_from(&mut buf) {
                    // The listener's acknowledgements and schema requests, back to the agent.
                    Ok((n, from)) if from.port() == to => {
                        if let Some(agent) = agent {
                            let _ = s.send_to(&buf[..n], agent);
                        }
                    }
                    Ok((n, from)) => {
                        agent = Some(from);
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

/// (session, seq) of each frame `railscope listen --json` printed.
fn printed(frames: &str) -> Vec<(u64, u64)> {
    frames
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{e}: {l}"))
        })
        .filter_map(|f| Some((f["session"].as_u64()?, f["seq"].as_u64()?)))
        .collect()
}

/// The agent's state line at stop.
fn state_line(agent_err: &str) -> &str {
    agent_err
        .lines()
        .find(|l| l.contains("stopping; state: "))
        .unwrap_or_else(|| panic!("the agent did not report its state: {agent_err}"))
}

/// The value of `name=` in the agent's state line.
fn state_value(line: &str, name: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {line:?}"))
}

#[test]
fn collector_away_for_a_minute_misses_nothing() {
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
    relay.close();
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

    // Every frame of the session was printed, once a frame (the agent sends again what was
    // not acknowledged, and `listen` refuses a copy it printed).
    let seqs: Vec<u64> = printed(&frames).into_iter().map(|(_, seq)| seq).collect();
    let distinct: std::collections::BTreeSet<u64> = seqs.iter().copied().collect();
    let highest = *distinct.last().expect("frames");
    let missing: Vec<u64> = (0..=highest).filter(|s| !distinct.contains(s)).collect();
    let state = state_line(&agent_err);
    println!(
        "{} frames printed, {} missing; agent: {state}",
        seqs.len(),
        missing.len()
    );
    assert_eq!(seqs.len(), distinct.len(), "a frame printed twice");
    assert!(
        missing.is_empty(),
        "the listener never got frames {missing:?} of 0..={highest}\nagent: {agent_err}\nlisten: {listen_err}"
    );
    assert!(
        state_value(state, "frames_resent") > 0,
        "nothing was sent again after a minute's outage: {state}"
    );
    assert_eq!(
        (
            state_value(state, "spool_full"),
            state_value(state, "spool_age")
        ),
        (0, 0),
        "{state}"
    );
}

#[test]
fn an_agent_killed_while_the_collector_is_away_loses_nothing() {
    let dir = scratch_dir("outage-restart");
    let key = key_file(&dir, KEY_HEX);
    let listen_port = free_udp_port();
    let listener = spawn_json_listener(RAILSCOPE, listen_port, &key);
    thread::sleep(Duration::from_millis(300));
    let (relay, relay_port) = Relay::start(listen_port);
    let relay_addr = format!("127.0.0.1:{relay_port}");
    // Both processes share the agent's spool directory, as a restarted service does.
    let agent = FixtureAgent::new(&relay_addr, &key, &sysfs_fixture("mlx5"))
        .node("restart-node")
        .args(["--no-gpu"])
        .cadence("0.2", "0.5");
    let mut first = agent.spawn(RAILSCOPE);
    thread::sleep(Duration::from_secs(4));
    relay.close();
    thread::sleep(RESTART_OUTAGE / 2);
    assert!(
        first.is_running(),
        "the agent exited while the collector was away"
    );
    let (_, _, first_err) = first.signal(libc::SIGKILL);
    let second = agent.spawn(RAILSCOPE);
    thread::sleep(RESTART_OUTAGE / 2);
    relay.open.store(true, Ordering::SeqCst);
    thread::sleep(Duration::from_secs(8));
    let (agent_ok, _, agent_err) = second.interrupt();
    thread::sleep(Duration::from_millis(300));
    let (_, frames, listen_err) = listener.interrupt();
    assert!(agent_ok, "the restarted agent failed: {agent_err}");

    // The restarted agent took back what the killed one had not delivered, and went on with
    // its session from the frame after its last.
    let resumed = agent_err
        .lines()
        .find_map(|l| l.find("resuming session").map(|at| &l[at..]))
        .unwrap_or_else(|| panic!("the restarted agent resumed nothing: {agent_err}"));
    let after = |word: &str| -> u64 {
        let rest =
            &resumed[resumed.find(word).unwrap_or_else(|| panic!("{resumed}")) + word.len()..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().unwrap_or_else(|e| panic!("{e}: {resumed}"))
    };
    let first_of_second = after("at frame ");
    let restored = after(": ");
    let state = state_line(&agent_err);
    println!("{resumed}\nagent: {state}");
    assert!(
        restored >= 5,
        "the killed agent's {} s of outage left only {restored} frames: {resumed}",
        RESTART_OUTAGE.as_secs() / 2
    );
    assert_eq!(state_value(state, "frames_restored"), restored, "{state}");

    // One session, both processes' frames: every sequence number of it printed once.
    let printed = printed(&frames);
    let sessions: std::collections::BTreeSet<u64> = printed.iter().map(|(s, _)| *s).collect();
    assert_eq!(
        sessions.len(),
        1,
        "the restart started another session: {sessions:x?}"
    );
    let seqs: Vec<u64> = printed.iter().map(|(_, seq)| *seq).collect();
    let distinct: std::collections::BTreeSet<u64> = seqs.iter().copied().collect();
    let highest = *distinct.last().expect("frames");
    assert!(
        highest > first_of_second,
        "nothing of the restarted agent arrived (highest {highest}, its first {first_of_second})"
    );
    let missing: Vec<u64> = (0..=highest).filter(|s| !distinct.contains(s)).collect();
    assert_eq!(seqs.len(), distinct.len(), "a frame printed twice");
    assert!(
        missing.is_empty(),
        "the listener never got frames {missing:?} of 0..={highest} (the killed agent's: \
         0..{first_of_second})\nkilled agent: {first_err}\nrestarted agent: {agent_err}\nlisten: {listen_err}"
    );
    assert!(state_value(state, "frames_resent") > 0, "{state}");
    assert_eq!(
        (
            state_value(state, "spool_full"),
            state_value(state, "spool_age")
        ),
        (0, 0),
        "{state}"
    );
}
