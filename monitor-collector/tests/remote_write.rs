//! Remote-write end to end: frames of a realistic node (8 GPUs, 8 IB ports) made by the
//! agent's encoder and decoded as a receiver does, served by an in-memory stand-in for the
//! archive's reader, written by `RemoteWriter`, and read back from
//! - a fake receiver in this process (retries on 5xx/429, no retry on 400, request headers);
//! - a real Prometheus and a real VictoriaMetrics, started from their Debian packages: every
//!   sample back through the query API, compared sample by sample with what the agent pushed
//!   (none missing, none duplicated, times and values exact), also across the TSDB being
//!   stopped for a while and the writer being restarted meanwhile;
//! - a real Prometheus behind https (a test CA, a client certificate required) and basic
//!   auth: a wrong CA and a wrong password fail with errors naming the endpoint and counted
//!   by reason, nothing is dropped, and once the settings are corrected every sample
//!   arrives.
//!
//! The TSDB tests skip with a message when the servers are not installed, unless
//! `RAILSCOPE_REQUIRE_TSDB=1` (set by `cargo xtask test`), which makes that a failure.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

mod tsdb;

use tsdb::{Server, Tsdb, Web, canonical, now_ms, tsdb_binary};

use monitor_remote_write::{
    Auth, Batch, Cursor, EndpointConfig, Failure, RemoteWriter, SampleSource, SeriesChunk,
    SourceError, TlsFiles, prompb::decode_body,
};
use monitor_testkit::free_tcp_port;
use monitor_wire::{
    CounterSample, EncoderConfig, FrameEncoder, GaugeSample, Key, Kind, Labels, ReceiverState,
    Sample, Series, decode,
};

// ---------------------------------------------------------------------------------------
// A realistic fleet: what the agents push, and the frames they send.

/// Series and samples as the agent pushed them, and the archive's content: decoded frames,
/// one archive position each.
struct Fleet {
    pushed: Vec<(String, Series, Sample)>,
    frames: Vec<Vec<SeriesChunk>>,
}

fn series(name: &str, labels: &[(&str, String)], kind: Kind) -> Series {
    Series {
        name: name.into(),
        labels: Labels::new(labels.iter().map(|(k, v)| (*k, v.clone()))),
        kind,
    }
}

/// `nodes` nodes of 8 GPUs and 8 ports, one sweep per second for `sweeps` seconds from
/// `start_ms`, flushed every 10 sweeps as the agent does. GPU utilization and power go out as
/// envelopes over the second before each sweep, temperature and memory as single readings.
fn fleet(nodes: usize, sweeps: u64, start_ms: u64) -> Fleet {
    let key = Key::from_bytes([7; 32]);
    let mut pushed = Vec::new();
    let mut datagrams = Vec::new();
    for n in 0..nodes {
        let node = format!("gpu-node-{n:03}");
        let mut config = EncoderConfig::new(node.clone());
        // Values below carry few digits; no rounding, so what is pushed is what is sent.
        config.gauge_digits = None;
        let mut encoder = FrameEncoder::new(config, key.clone()).unwrap();
        let mut series_list = Vec::new();
        for g in 0..8 {
            let l = [("gpu", g.to_string())];
            series_list.push(series("railscope_gpu_utilization_ratio", &l, Kind::Gauge));
            series_list.push(series("railscope_gpu_power_watts", &l, Kind::Gauge));
            series_list.push(series("railscope_gpu_temperature_celsius", &l, Kind::Gauge));
            series_list.push(series("railscope_gpu_memory_used_bytes", &l, Kind::Gauge));
            series_list.push(series(
                "railscope_gpu_energy_millijoules_total",
                &l,
                Kind::Counter,
            ));
        }
        for p in 0..8 {
            let l = [("device", format!("mlx5_{p}")), ("port", "1".to_string())];
            for name in [
                "railscope_ib_port_xmit_bytes_total",
                "railscope_ib_port_rcv_bytes_total",
                "railscope_ib_port_xmit_packets_total",
                "railscope_ib_port_rcv_packets_total",
                "railscope_ib_symbol_error_total",
            ] {
                series_list.push(series(name, &l, Kind::Counter));
            }
        }
        for i in 0..sweeps {
            let t = (start_ms + i * 1000) * 1_000_000;
            for (s_idx, s) in series_list.iter().enumerate() {
                let k = (s_idx as u64 * 31 + i * 17 + n as u64 * 7) % 100;
                let sample = match (s.kind, &*s.name) {
                    (Kind::Counter, name) => {
                        let rate = if name.ends_with("symbol_error_total") {
                            u64::from(k == 3)
                        } else {
                            1_000_000 + k * 12_345_678
                        };
                        Sample::Counter(CounterSample {
                            unix_ns: t,
                            value: 5_000_000_000_000 + (i + 1) * rate + s_idx as u64,
                        })
                    }
                    (Kind::Gauge, "railscope_gpu_utilization_ratio") => {
                        Sample::Gauge(envelope(t, k, 5, 100.0))
                    }
                    (Kind::Gauge, "railscope_gpu_power_watts") => {
                        Sample::Gauge(envelope(t, 3000 + k * 25, 250, 10.0))
                    }
                    (Kind::Gauge, "railscope_gpu_temperature_celsius") => {
                        Sample::Gauge(GaugeSample::reading(t, 40.0 + (k % 30) as f64))
                    }
                    (Kind::Gauge, _) => Sample::Gauge(GaugeSample::reading(
                        t,
                        (40_000_000_000 + k * 1_048_576) as f64,
                    )),
                };
                encoder.push_sample(s, sample).unwrap();
                pushed.push((node.clone(), s.clone(), sample));
            }
            if i % 10 == 9 || i + 1 == sweeps {
                datagrams.extend(encoder.flush(t + 5_000_000));
            }
        }
    }
    // The receiver's side: MAC check, decode, series resolved from the node's schema.
    let mut state = ReceiverState::default();
    let frames = datagrams
        .iter()
        .map(|d| {
            let frame = decode(d, &key, &mut state).unwrap();
            let node_state = state.node(&frame.node).unwrap();
            let node: Arc<str> = frame.node.as_str().into();
            frame
                .samples
                .iter()
                .map(|s| SeriesChunk {
                    node: node.clone(),
                    series: node_state.series(s.id).unwrap().clone(),
                    data: s.data.clone(),
                })
                .collect()
        })
        .collect();
    Fleet { pushed, frames }
}

/// Mean `mean / scale`, `spread / scale` either side, over the 900 ms before `t`. Each value
/// is the float nearest a short decimal, as the agent's rounding to significant digits makes
/// them (VictoriaMetrics stores decimals: 0.7699999999999999, the difference of two short
/// decimals, came back from it as 0.77).
fn envelope(t: u64, mean: u64, spread: u64, scale: f64) -> GaugeSample {
    GaugeSample {
        start_unix_ns: t - 900_000_000,
        end_unix_ns: t,
        min: mean.saturating_sub(spread) as f64 / scale,
        max: (mean + spread) as f64 / scale,
        mean: mean as f64 / scale,
    }
}

/// A series as `name{k=v,...}` with labels sorted (the key both sides are compared by).
type Expected = BTreeMap<String, BTreeMap<i64, f64>>;

/// What a TSDB must hold for what the agents pushed, by the documented convention
/// (docs/deployment.md): counters as they are; a gauge's mean at the end of its period, and
/// for a period (not a single reading) also `_min` and `_max`; label `node`; times in ms.
fn expected(pushed: &[(String, Series, Sample)]) -> Expected {
    let mut out = Expected::new();
    let mut put = |node: &str, s: &Series, suffix: &str, ms: u64, v: f64| {
        let mut labels: Vec<(&str, &str)> = s.labels.iter().collect();
        labels.push(("node", node));
        let key = canonical(&format!("{}{suffix}", s.name), &labels);
        let prev = out.entry(key).or_default().insert(ms as i64, v);
        assert!(
            prev.is_none(),
            "the fixture pushes one sample per series and time"
        );
    };
    for (node, s, sample) in pushed {
        match sample {
            Sample::Counter(c) => put(node, s, "", c.unix_ns / 1_000_000, c.value as f64),
            Sample::Gauge(g) => {
                let ms = g.end_unix_ns / 1_000_000;
                put(node, s, "", ms, g.mean);
                if g.start_unix_ns < g.end_unix_ns {
                    put(node, s, "_min", ms, g.min);
                    put(node, s, "_max", ms, g.max);
                }
            }
        }
    }
    out
}

fn total(e: &Expected) -> usize {
    e.values().map(BTreeMap::len).sum()
}

// ---------------------------------------------------------------------------------------
// The archive's reader, stand-in: decoded frames published as the test goes.

#[derive(Clone, Default)]
struct MemoryArchive(Arc<Mutex<Vec<Vec<SeriesChunk>>>>);

impl MemoryArchive {
    fn publish(&self, frames: &[Vec<SeriesChunk>]) -> Cursor {
        let mut v = self.0.lock().unwrap();
        v.extend_from_slice(frames);
        at(v.len())
    }
}

fn at(frames: usize) -> Cursor {
    Cursor {
        segment: 0,
        offset: frames as u64,
    }
}

impl SampleSource for MemoryArchive {
    fn read_after(&mut self, after: Cursor, max_samples: usize) -> Result<Batch, SourceError> {
        let frames = self.0.lock().unwrap();
        let mut i = after.offset as usize;
        let mut chunks = Vec::new();
        let mut samples = 0;
        while i < frames.len() && samples < max_samples {
            samples += frames[i].iter().map(|c| c.data.len()).sum::<usize>();
            chunks.extend(frames[i].iter().cloned());
            i += 1;
        }
        Ok(Batch {
            chunks,
            next: at(i),
            skipped_samples: 0,
        })
    }
}

fn quick_config(name: &str, url: &str, shards: usize) -> EndpointConfig {
    let mut c = EndpointConfig::new(name, url);
    c.shards = shards;
    c.max_samples_per_send = 1000;
    c.batch_send_deadline = Duration::from_millis(50);
    c.poll_interval = Duration::from_millis(20);
    c.min_backoff = Duration::from_millis(20);
    c.max_backoff = Duration::from_millis(300);
    c.timeout = Duration::from_secs(10);
    c.cursor_sync_interval = Duration::ZERO;
    c.drain_timeout = Duration::from_millis(300);
    c
}

fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn temp_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "railscope-rw-{what}-{}-{}",
        std::process::id(),
        now_ms()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

// ---------------------------------------------------------------------------------------
// A fake receiver: answers each request with the next status of a script (then 204),
// keeps what it acknowledged.

#[derive(Default)]
struct Received {
    statuses: Vec<u16>,
    /// (labels, ms) -> value, for acknowledged requests only; duplicates kept apart.
    samples: Vec<(String, i64, f64)>,
    bad_headers: Vec<String>,
}

fn fake_receiver(script: Vec<u16>, default: u16) -> (String, Arc<Mutex<Received>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/api/v1/write", listener.local_addr().unwrap());
    let received = Arc::new(Mutex::new(Received::default()));
    let script = Arc::new(Mutex::new(script.into_iter()));
    let r = received.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let (r, script) = (r.clone(), script.clone());
            std::thread::spawn(move || serve(conn, &r, &script, default));
        }
    });
    (url, received)
}

fn serve(
    conn: TcpStream,
    received: &Mutex<Received>,
    script: &Mutex<std::vec::IntoIter<u16>>,
    default: u16,
) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut conn = conn;
    loop {
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end().to_owned();
            if line.is_empty() {
                break;
            }
            headers.push(line.to_ascii_lowercase());
        }
        let len: usize = headers
            .iter()
            .find_map(|h| h.strip_prefix("content-length:"))
            .map(|v| v.trim().parse().unwrap())
            .unwrap_or(0);
        let mut body = vec![0; len];
        reader.read_exact(&mut body).unwrap();
        let status = script.lock().unwrap().next().unwrap_or(default);
        {
            let mut r = received.lock().unwrap();
            r.statuses.push(status);
            for want in [
                "content-encoding: snappy",
                "content-type: application/x-protobuf",
                "x-prometheus-remote-write-version: 0.1.0",
            ] {
                if !headers.iter().any(|h| h == want) {
                    r.bad_headers.push(want.to_owned());
                }
            }
            if (200..300).contains(&status) {
                for ts in decode_body(&body).unwrap().timeseries {
                    let name = ts.labels.iter().find(|l| l.name == "__name__").unwrap();
                    let labels: Vec<(&str, &str)> = ts
                        .labels
                        .iter()
                        .filter(|l| l.name != "__name__")
                        .map(|l| (l.name.as_str(), l.value.as_str()))
                        .collect();
                    let key = canonical(&name.value, &labels);
                    for s in ts.samples {
                        r.samples.push((key.clone(), s.timestamp, s.value));
                    }
                }
            }
        }
        let reply = if status == 400 { "out of bounds" } else { "" };
        let _ = write!(
            conn,
            "HTTP/1.1 {status} X\r\nContent-Length: {}\r\n\r\n{reply}",
            reply.len()
        );
    }
}

/// Every expected sample exactly once, nothing else, values bit for bit.
fn compare(expected: &Expected, got: &[(String, i64, f64)], who: &str) {
    let mut seen: BTreeMap<(&str, i64), usize> = BTreeMap::new();
    let mut wrong = Vec::new();
    for (key, ms, v) in got {
        *seen.entry((key, *ms)).or_default() += 1;
        match expected.get(key).and_then(|s| s.get(ms)) {
            Some(e) if e.to_bits() == v.to_bits() => {}
            e => wrong.push(format!("{key} @{ms}: got {v}, expected {e:?}")),
        }
    }
    let dups: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).take(5).collect();
    let missing: Vec<String> = expected
        .iter()
        .flat_map(|(k, s)| s.keys().map(move |ms| (k, *ms)))
        .filter(|(k, ms)| !seen.contains_key(&(k.as_str(), *ms)))
        .take(5)
        .map(|(k, ms)| format!("{k} @{ms}"))
        .collect();
    let missing_count = total(expected)
        - seen
            .keys()
            .filter(|(k, ms)| expected.get(*k).is_some_and(|s| s.contains_key(ms)))
            .count();
    assert!(
        wrong.is_empty() && dups.is_empty() && missing_count == 0,
        "{who}: {} samples read back for {} expected; {} wrong (first: {:?}), duplicated (first): {dups:?}, {missing_count} missing (first: {missing:?})",
        got.len(),
        total(expected),
        wrong.len(),
        wrong.iter().take(5).collect::<Vec<_>>(),
    );
}

#[test]
fn retries_5xx_and_429_until_acknowledged_then_resumes_after_restart_without_duplicates() {
    let fleet = fleet(1, 60, now_ms() - 600_000);
    let expected = expected(&fleet.pushed);
    let (url, received) = fake_receiver(vec![503, 500, 429, 503], 204);
    let state = temp_dir("fake-retry");
    let archive = MemoryArchive::default();
    let half = fleet.frames.len() / 2;
    let first_end = archive.publish(&fleet.frames[..half]);
    let writer =
        RemoteWriter::start(quick_config("fake", &url, 2), archive.clone(), &state).unwrap();
    wait_for("the first half committed", Duration::from_secs(30), || {
        writer.committed() == first_end
    });
    let first_stats = writer.stats();
    writer.shutdown();
    // A new writer (the collector restarted) goes on from the cursor file.
    let end = archive.publish(&fleet.frames[half..]);
    let writer =
        RemoteWriter::start(quick_config("fake", &url, 2), archive.clone(), &state).unwrap();
    wait_for("everything committed", Duration::from_secs(30), || {
        writer.committed() == end
    });
    let stats = writer.stats();
    writer.shutdown();
    let r = received.lock().unwrap();
    assert_eq!(&r.statuses[..4], &[503, 500, 429, 503]);
    assert!(
        r.bad_headers.is_empty(),
        "missing headers: {:?}",
        r.bad_headers
    );
    compare(&expected, &r.samples, "fake receiver");
    assert_eq!(stats.samples_failed, 0);
    assert_eq!(stats.samples_pending, 0);
    // The four refusals hit the first writer's first requests; the second had none.
    assert!(first_stats.samples_retried > 0, "{first_stats:?}");
    assert_eq!(stats.samples_retried, 0, "{stats:?}");
    std::fs::remove_dir_all(&state).unwrap();
}

/// A refused credential is a configuration error that gets fixed, not bad data: 401 and 403
/// are retried (counted with reason `auth`, the endpoint named in the error), and every
/// sample arrives once the endpoint accepts.
#[test]
fn a_401_or_403_is_retried_and_loses_nothing() {
    let fleet = fleet(1, 20, now_ms() - 600_000);
    let expected = expected(&fleet.pushed);
    let (url, received) = fake_receiver(vec![401, 403, 401], 204);
    let state = temp_dir("fake-401");
    let archive = MemoryArchive::default();
    let end = archive.publish(&fleet.frames);
    let writer = RemoteWriter::start(quick_config("fake", &url, 1), archive, &state).unwrap();
    wait_for("everything committed", Duration::from_secs(30), || {
        writer.committed() == end
    });
    let stats = writer.stats();
    assert_eq!(writer.last_error(), None, "delivering again");
    writer.shutdown();
    assert_eq!(stats.failures(Failure::Auth), 3, "{stats:?}");
    assert_eq!(stats.samples_failed, 0, "{stats:?}");
    assert!(stats.samples_retried > 0, "{stats:?}");
    compare(
        &expected,
        &received.lock().unwrap().samples,
        "fake receiver",
    );
    std::fs::remove_dir_all(&state).unwrap();
}

#[test]
fn a_400_is_counted_as_failed_not_retried_and_does_not_block_the_cursor() {
    let fleet = fleet(1, 20, now_ms() - 600_000);
    let expected_samples = total(&expected(&fleet.pushed)) as u64;
    let (url, received) = fake_receiver(Vec::new(), 400);
    let state = temp_dir("fake-400");
    let archive = MemoryArchive::default();
    let end = archive.publish(&fleet.frames);
    let writer = RemoteWriter::start(quick_config("fake", &url, 1), archive, &state).unwrap();
    wait_for(
        "the cursor past the refused samples",
        Duration::from_secs(30),
        || writer.committed() == end,
    );
    let stats = writer.stats();
    writer.shutdown();
    assert_eq!(stats.samples_failed, expected_samples);
    assert_eq!((stats.samples_sent, stats.samples_retried), (0, 0));
    assert!(stats.failures(Failure::Rejected) > 0, "{stats:?}");
    // Each request was sent once: about one per max_samples_per_send samples.
    let requests = received.lock().unwrap().statuses.len() as u64;
    assert!(
        requests <= expected_samples.div_ceil(1000) + 2,
        "{requests} requests for {expected_samples} samples"
    );
    std::fs::remove_dir_all(&state).unwrap();
}

// ---------------------------------------------------------------------------------------
// Real TSDBs.

/// A TSDB server process on a loopback port, with its data directory.
/// Two nodes over three minutes, written in three parts: the TSDB up; the TSDB stopped while
/// the second part arrives (the writer retries, its cursor holds, and the writer itself is
/// restarted meanwhile); the TSDB back and the third part. Then everything is read back.
fn write_through_an_outage(kind: Tsdb) {
    let Some(binary) = tsdb_binary(kind) else {
        return;
    };
    let dir = temp_dir(kind.binary());
    let mut server = Server::start(kind, &binary, free_tcp_port(), &dir);
    let url = format!("{}/api/v1/write", server.base());
    // Recent times: Prometheus refuses samples older than its head block allows.
    let fleet = fleet(2, 180, now_ms() - 20 * 60_000);
    let expected = expected(&fleet.pushed);
    let thirds = fleet.frames.len() / 3;
    let archive = MemoryArchive::default();
    let state = dir.join("remote_write");

    let first = archive.publish(&fleet.frames[..thirds]);
    let writer =
        RemoteWriter::start(quick_config("tsdb", &url, 4), archive.clone(), &state).unwrap();
    wait_for(
        "the first part acknowledged",
        Duration::from_secs(60),
        || writer.committed() == first,
    );

    server.stop();
    let second = archive.publish(&fleet.frames[thirds..2 * thirds]);
    wait_for(
        "retries while the TSDB is down",
        Duration::from_secs(30),
        || writer.stats().samples_retried > 0,
    );
    assert_eq!(
        writer.committed(),
        first,
        "the cursor moved past unacknowledged samples"
    );
    writer.shutdown();
    let writer =
        RemoteWriter::start(quick_config("tsdb", &url, 4), archive.clone(), &state).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(writer.committed(), first);
    assert!(second != first);

    server.spawn(&binary);
    let end = archive.publish(&fleet.frames[2 * thirds..]);
    wait_for("everything acknowledged", Duration::from_secs(120), || {
        writer.committed() == end
    });
    let stats = writer.stats();
    writer.shutdown();
    assert_eq!(stats.samples_failed, 0, "{stats:?}");
    assert_eq!(stats.samples_pending, 0, "{stats:?}");

    let got = server.read_back();
    compare(&expected, &got, kind.binary());
    eprintln!(
        "{}: {} samples of {} series read back, all as sent",
        kind.binary(),
        got.len(),
        expected.len()
    );
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn prometheus_holds_every_sample_exactly_once_across_an_outage() {
    write_through_an_outage(Tsdb::Prometheus);
}

#[test]
fn victoria_metrics_holds_every_sample_exactly_once_across_an_outage() {
    write_through_an_outage(Tsdb::VictoriaMetrics);
}

// ---------------------------------------------------------------------------------------
// Prometheus over https with basic auth.

/// A CA of this test run, and certificates it signs (ECDSA P-256, made by rcgen).
struct TestCa {
    issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl TestCa {
    fn new(name: &str) -> Self {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let key = rcgen::KeyPair::generate().unwrap();
        Self {
            issuer: rcgen::CertifiedIssuer::self_signed(params, key).unwrap(),
        }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// (certificate PEM, key PEM) for `names`, for a server or a client.
    fn issue(&self, names: &[&str], usage: rcgen::ExtendedKeyUsagePurpose) -> (String, String) {
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, names[0]);
        params.extended_key_usages = vec![usage];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// Waits until the writer fails for `failure`, then checks that nothing moved: no sample
/// refused for good, none acknowledged, the cursor where it was.
fn fails_without_losing(writer: &RemoteWriter, failure: Failure, start: Cursor) -> String {
    wait_for(
        &format!("failures of reason {}", failure.as_str()),
        Duration::from_secs(30),
        || writer.stats().failures(failure) > 0,
    );
    std::thread::sleep(Duration::from_millis(300));
    let stats = writer.stats();
    assert_eq!(
        (stats.samples_failed, stats.samples_sent),
        (0, 0),
        "{stats:?}"
    );
    assert_eq!(writer.committed(), start);
    let mut text = String::new();
    monitor_remote_write::write_metrics(&mut text, &[(writer.name(), stats)]);
    let line = format!(
        "railscope_collector_remote_write_failures_total{{endpoint=\"{}\",reason=\"{}\"}} ",
        writer.name(),
        failure.as_str()
    );
    assert!(
        text.lines()
            .any(|l| l.strip_prefix(&line).is_some_and(|v| v != "0")),
        "{text}"
    );
    writer.last_error().expect("a failure is reported")
}

/// Prometheus 2.42 with `--web.config.file`: TLS from a test CA, client certificates of that
/// CA required, basic auth with a bcrypt hash. The collector's writer is started three times
/// with the same cursor directory (as the collector restarts after its settings are edited):
/// with the wrong CA (TLS failures), with the wrong password (401s), then right; and every
/// sample arrives exactly once, read back over https with the same credentials.
#[test]
fn prometheus_over_https_with_basic_auth_gets_every_sample_once_the_settings_are_right() {
    let Some(binary) = tsdb_binary(Tsdb::Prometheus) else {
        return;
    };
    let dir = temp_dir("prometheus-tls");
    let ca = TestCa::new("railscope test CA");
    let other_ca = TestCa::new("some other CA");
    let (server_cert, server_key) = ca.issue(
        &["localhost", "127.0.0.1"],
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
    );
    let (client_cert, client_key) = ca.issue(
        &["railscope-collector"],
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    );
    let ca_file = write(&dir, "ca.pem", &ca.pem());
    let other_ca_file = write(&dir, "other-ca.pem", &other_ca.pem());
    let server_cert = write(&dir, "server.pem", &server_cert);
    let server_key = write(&dir, "server.key", &server_key);
    let cert_file = write(&dir, "client.pem", &client_cert);
    let key_file = write(&dir, "client.key", &client_key);
    let password = "correct horse battery staple";
    let password_file = write(&dir, "password", &format!("{password}\n"));
    let wrong_password_file = write(&dir, "wrong-password", "Tr0ub4dor&3\n");
    // Cost 4, the least bcrypt takes: the hash is checked on every request.
    let hash = bcrypt::hash(password, 4).unwrap();
    let web_config = write(
        &dir,
        "web.yml",
        &format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n  client_auth_type: \
             RequireAndVerifyClientCert\n  client_ca_file: {}\nbasic_auth_users:\n  railscope: \
             '{hash}'\n",
            server_cert.display(),
            server_key.display(),
            ca_file.display()
        ),
    );
    // The test's own client, as an operator's curl --cacert --cert --key -u.
    let pem = std::fs::read(&ca_file).unwrap();
    let roots = ureq::tls::Certificate::from_pem(&pem).unwrap();
    let client = ureq::tls::ClientCert::new_with_certs(
        &[ureq::tls::Certificate::from_pem(client_cert.as_bytes()).unwrap()],
        ureq::tls::PrivateKey::from_pem(client_key.as_bytes()).unwrap(),
    );
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .tls_config(
            ureq::tls::TlsConfig::builder()
                .root_certs(ureq::tls::RootCerts::new_with_certs(&[roots]))
                .client_cert(Some(client))
                .build(),
        )
        .build()
        .into();
    let web = Web {
        config_file: web_config,
        agent,
        authorization: format!(
            "Basic {}",
            base64_of(format!("railscope:{password}").as_bytes())
        ),
    };
    let mut server =
        Server::start_with(Tsdb::Prometheus, &binary, free_tcp_port(), &dir, Some(web));
    let url = format!("{}/api/v1/write", server.base());
    assert!(url.starts_with("https://"));

    let fleet = fleet(2, 120, now_ms() - 20 * 60_000);
    let expected = expected(&fleet.pushed);
    let archive = MemoryArchive::default();
    let state = dir.join("remote_write");
    let half = fleet.frames.len() / 2;
    let first = archive.publish(&fleet.frames[..half]);
    let config = |ca: &PathBuf, password: &PathBuf| {
        let mut c = quick_config("prom-tls", &url, 2);
        c.tls = TlsFiles {
            ca_file: Some(ca.clone()),
            cert_file: Some(cert_file.clone()),
            key_file: Some(key_file.clone()),
            insecure_skip_verify: false,
        };
        c.auth = Auth::Basic {
            username: "railscope".into(),
            password_file: password.clone(),
        };
        c
    };

    // The endpoint's certificate is not from the CA given: TLS failures, retried.
    let writer = RemoteWriter::start(
        config(&other_ca_file, &password_file),
        archive.clone(),
        &state,
    )
    .unwrap();
    let start = writer.committed();
    let error = fails_without_losing(&writer, Failure::Tls, start);
    assert!(
        error.contains("remote-write endpoint prom-tls") && error.contains("TLS"),
        "{error}"
    );
    eprintln!("wrong CA: {error}");
    writer.shutdown();

    // The right CA, the wrong password: 401s, retried.
    let writer = RemoteWriter::start(
        config(&ca_file, &wrong_password_file),
        archive.clone(),
        &state,
    )
    .unwrap();
    assert_eq!(writer.committed(), start, "the cursor survived the restart");
    let error = fails_without_losing(&writer, Failure::Auth, start);
    assert!(
        error.contains("remote-write endpoint prom-tls") && error.contains("HTTP 401"),
        "{error}"
    );
    eprintln!("wrong password: {error}");
    writer.shutdown();

    // Corrected: everything held back arrives, and what comes after.
    let writer =
        RemoteWriter::start(config(&ca_file, &password_file), archive.clone(), &state).unwrap();
    wait_for(
        "the first half acknowledged",
        Duration::from_secs(60),
        || writer.committed() == first,
    );
    let end = archive.publish(&fleet.frames[half..]);
    wait_for("everything acknowledged", Duration::from_secs(60), || {
        writer.committed() == end
    });
    let stats = writer.stats();
    assert_eq!(writer.last_error(), None);
    writer.shutdown();
    assert_eq!(
        (stats.samples_failed, stats.samples_pending),
        (0, 0),
        "{stats:?}"
    );
    assert_eq!(stats.samples_sent as usize, total(&expected), "{stats:?}");

    let got = server.read_back();
    compare(&expected, &got, "prometheus over https");
    eprintln!(
        "prometheus over https: {} samples of {} series read back, all as sent",
        got.len(),
        expected.len()
    );
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Standard base64 (the test's own basic-auth header).
fn base64_of(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            out.push(if i <= c.len() {
                A[(n >> (18 - 6 * i) & 63) as usize] as char
            } else {
                '='
            });
        }
    }
    out
}
