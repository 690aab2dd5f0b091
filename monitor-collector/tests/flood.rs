//! Bad datagrams against the real `railscope-collector run`: forged, replayed, truncated,
//! random and out-of-time datagrams, first paced (each counted under its own reason, exactly),
//! then as fast as this process can send them from several threads for a few seconds (every
//! datagram counted: as a drop by reason, or as dropped by the kernel when the receive buffers
//! were full). The collector must keep running, hold no node more than before, stay within a
//! few MiB of its memory before the flood, and still accept a real frame afterwards.

use std::{
    collections::BTreeMap,
    net::{SocketAddr, TcpStream, UdpSocket},
    path::Path,
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use monitor_testkit::NodeSender;
use monitor_testkit::{free_tcp_port, free_udp_port, http_get};
use monitor_wire::{Key, MIN_FRAME_LEN};

const COLLECTOR: &str = env!("CARGO_BIN_EXE_railscope-collector");

/// How long the flood lasts.
const FLOOD: Duration = Duration::from_secs(3);

/// Sending threads of the flood, and sockets (source ports) in all.
const THREADS: usize = 2;
const SOCKETS: usize = 64;

/// What the flood may add to the collector's resident memory: nothing of a refused datagram is
/// kept; this is room for the allocator and the kernel's socket buffers being touched.
const FLOOD_RSS_GROWTH_MAX_KB: u64 = 32 * 1024;

fn unix_now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

struct Collector {
    child: Child,
    http: u16,
    udp: SocketAddr,
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(key: &Path, data: &Path, log: &Path) -> Collector {
    let (udp_port, http) = (free_udp_port(), free_tcp_port());
    let child = Command::new(COLLECTOR)
        .args(["run", "--listen", &format!("127.0.0.1:{udp_port}")])
        .args(["--http", &format!("127.0.0.1:{http}"), "--sockets", "2"])
        .arg("--key")
        .arg(key)
        .arg("--data")
        .arg(data)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while TcpStream::connect(("127.0.0.1", http)).is_err() {
        assert!(started.elapsed() < Duration::from_secs(20), "no HTTP port");
        thread::sleep(Duration::from_millis(50));
    }
    Collector {
        child,
        http,
        udp: ([127, 0, 0, 1], udp_port).into(),
    }
}

/// `/metrics/collector` as name{labels} -> value.
fn scrape(port: u16) -> BTreeMap<String, f64> {
    http_get(port, "/metrics/collector")
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

fn get(m: &BTreeMap<String, f64>, key: &str) -> u64 {
    m.get(key).copied().unwrap_or(0.0) as u64
}

fn dropped(m: &BTreeMap<String, f64>, reason: &str) -> u64 {
    get(
        m,
        &format!("railscope_collector_frames_dropped_total{{reason=\"{reason}\"}}"),
    )
}

fn all_drops(m: &BTreeMap<String, f64>) -> u64 {
    m.iter()
        .filter(|(k, _)| k.starts_with("railscope_collector_frames_dropped_total{"))
        .map(|(_, v)| *v as u64)
        .sum()
}

fn status_kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// Waits until the collector has read (or the kernel dropped for it) `datagrams` more
/// datagrams than in `before` and its counters have not moved for half a second (the last
/// batch handled); returns the last scrape.
fn wait_seen(port: u16, before: &BTreeMap<String, f64>, datagrams: u64) -> BTreeMap<String, f64> {
    let seen = |m: &BTreeMap<String, f64>| {
        get(m, "railscope_collector_datagrams_received_total") + dropped(m, "receive_buffer_full")
    };
    let started = Instant::now();
    let mut last = scrape(port);
    let mut still_since = Instant::now();
    loop {
        thread::sleep(Duration::from_millis(50));
        let now = scrape(port);
        if now != last {
            still_since = Instant::now();
        }
        last = now;
        let done = seen(&last) >= seen(before) + datagrams
            && still_since.elapsed() >= Duration::from_millis(500);
        if done || started.elapsed() > Duration::from_secs(30) {
            return last;
        }
    }
}

/// A splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A bad datagram of kind `kind % 4` made from `frames` (accepted earlier): forged (a byte
/// changed), replayed, truncated, random.
fn junk(kind: u64, frames: &[Vec<u8>], rng: &mut Rng, out: &mut Vec<u8>) {
    out.clear();
    let frame = &frames[rng.below(frames.len())];
    match kind % 4 {
        0 => {
            out.extend_from_slice(frame);
            let at = rng.below(out.len());
            out[at] ^= 1 + rng.below(255) as u8;
        }
        1 => out.extend_from_slice(frame),
        2 => out.extend_from_slice(&frame[..1 + rng.below(frame.len() - 1)]),
        _ => {
            let len = 1 + rng.below(1400);
            out.extend((0..len).map(|_| rng.next() as u8));
        }
    }
}

#[test]
fn bad_datagrams_are_counted_by_reason_and_a_flood_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let key_path = dir.path().join("wire.key");
    let key_bytes = [9u8; 32];
    std::fs::write(&key_path, key_bytes).unwrap();
    let key = Key::from_bytes(key_bytes);
    let collector = start(&key_path, &dir.path().join("data"), &dir.path().join("log"));
    let pid = collector.child.id();
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();

    // Real frames of a few nodes (each node from the same socket: one sender).
    let now_s = unix_now_ns() / 1_000_000_000;
    let start_ns = (now_s - 60) * 1_000_000_000;
    let mut frames = Vec::new();
    for n in 0..8u64 {
        let mut sender = NodeSender::new(&format!("gpu-node-{n:03}"), n + 1, key.clone());
        frames.extend(sender.run(start_ns, 30, 10).into_iter().map(|f| f.bytes));
    }
    let before = scrape(collector.http);
    for f in &frames {
        socket.send_to(f, collector.udp).unwrap();
        thread::sleep(Duration::from_millis(1));
    }
    let after = wait_seen(collector.http, &before, frames.len() as u64);
    assert_eq!(
        get(&after, "railscope_collector_frames_accepted_total"),
        frames.len() as u64,
        "every real frame accepted"
    );
    assert_eq!(get(&after, "railscope_collector_nodes"), 8);

    // Paced: each kind lands under its reason, exactly.
    let mut rng = Rng(11);
    let mut expected: BTreeMap<&str, u64> = BTreeMap::new();
    let mut datagrams = Vec::new();
    let mut buf = Vec::new();
    for i in 0..400u64 {
        junk(i, &frames, &mut rng, &mut buf);
        let reason = match i % 4 {
            // Every replayed frame is among the last 64 of its node: a duplicate.
            1 => "duplicate",
            _ if buf.len() < MIN_FRAME_LEN => "too_short",
            _ => "bad_mac",
        };
        *expected.entry(reason).or_default() += 1;
        datagrams.push(buf.clone());
    }
    // Sealed with the right key, but sent three hours ago.
    let mut old = NodeSender::new("gpu-node-old", 99, key.clone());
    let old_frames = old.run((now_s - 3 * 3600) * 1_000_000_000, 10, 10);
    *expected.entry("out_of_time_range").or_default() += old_frames.len() as u64;
    datagrams.extend(old_frames.into_iter().map(|f| f.bytes));
    let before = scrape(collector.http);
    for d in &datagrams {
        socket.send_to(d, collector.udp).unwrap();
        thread::sleep(Duration::from_micros(500));
    }
    let after = wait_seen(collector.http, &before, datagrams.len() as u64);
    assert_eq!(
        dropped(&after, "receive_buffer_full"),
        0,
        "paced: no kernel drops"
    );
    for (reason, n) in &expected {
        assert_eq!(
            dropped(&after, reason) - dropped(&before, reason),
            *n,
            "datagrams dropped as {reason}"
        );
    }
    assert_eq!(
        all_drops(&after) - all_drops(&before),
        datagrams.len() as u64,
        "no other reason"
    );
    assert_eq!(
        get(&after, "railscope_collector_frames_accepted_total"),
        frames.len() as u64
    );

    // The flood: as fast as THREADS threads send, from SOCKETS source ports. Its peak RSS is
    // measured from here (writing 5 to clear_refs resets VmHWM to the current RSS).
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
    let rss_before = status_kb(pid, "VmRSS");
    let before = scrape(collector.http);
    let sent = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let frames = Arc::new(frames);
    let started = Instant::now();
    let senders: Vec<_> = (0..THREADS)
        .map(|t| {
            let (sent, stop, frames, to) =
                (sent.clone(), stop.clone(), frames.clone(), collector.udp);
            thread::spawn(move || {
                let sockets: Vec<UdpSocket> = (0..SOCKETS / THREADS)
                    .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
                    .collect();
                let mut rng = Rng(t as u64 + 100);
                let mut buf = Vec::new();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    junk(i, &frames, &mut rng, &mut buf);
                    if sockets[rng.below(sockets.len())].send_to(&buf, to).is_ok() {
                        sent.fetch_add(1, Ordering::Relaxed);
                    }
                    i += 1;
                }
                sockets
            })
        })
        .collect();
    thread::sleep(FLOOD);
    stop.store(true, Ordering::Relaxed);
    let sockets: Vec<UdpSocket> = senders
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let elapsed = started.elapsed();
    // The kernel's count of what it dropped reaches the collector with the next datagram on
    // each of its sockets: one more bad datagram from every source port.
    thread::sleep(Duration::from_millis(300));
    let mut rng = Rng(7);
    for s in &sockets {
        let len = 1 + rng.below(100);
        let junk: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        if s.send_to(&junk, collector.udp).is_ok() {
            sent.fetch_add(1, Ordering::Relaxed);
        }
        thread::sleep(Duration::from_millis(2));
    }
    let sent = sent.load(Ordering::Relaxed);
    let after = wait_seen(collector.http, &before, sent);
    let rate = sent as f64 / elapsed.as_secs_f64();
    eprintln!(
        "flood: {sent} datagrams in {:.1} s ({rate:.0}/s); kernel dropped {}; counted {}",
        elapsed.as_secs_f64(),
        dropped(&after, "receive_buffer_full") - dropped(&before, "receive_buffer_full"),
        all_drops(&after) - all_drops(&before)
    );

    assert!(collector_alive(pid), "the collector died in the flood");
    assert_eq!(
        all_drops(&after) - all_drops(&before),
        sent,
        "every datagram of the flood counted as a drop, by reason"
    );
    assert_eq!(
        get(&after, "railscope_collector_frames_accepted_total"),
        frames.len() as u64,
        "nothing of the flood accepted"
    );
    assert_eq!(get(&after, "railscope_collector_nodes"), 8, "no node added");
    let rss_peak = status_kb(pid, "VmHWM");
    assert!(
        rss_peak <= rss_before + FLOOD_RSS_GROWTH_MAX_KB,
        "RSS {rss_before} kB before the flood, peak {rss_peak} kB"
    );

    // Still ingesting: the next frames of a node are accepted.
    let mut sender = NodeSender::new("gpu-node-after", 1234, key.clone());
    let next = sender.run(start_ns + 40_000_000_000, 10, 10);
    let before = scrape(collector.http);
    for f in &next {
        socket.send_to(&f.bytes, collector.udp).unwrap();
    }
    let after = wait_seen(collector.http, &before, next.len() as u64);
    let moved: Vec<_> = after
        .iter()
        .filter(|(k, v)| before.get(*k) != Some(*v))
        .collect();
    assert_eq!(
        get(&after, "railscope_collector_frames_accepted_total")
            - get(&before, "railscope_collector_frames_accepted_total"),
        next.len() as u64,
        "a real node's frames after the flood: {moved:?}"
    );
}

fn collector_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}
