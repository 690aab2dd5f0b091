//! A running collector: its receive threads, the archive writer, the HTTP server, and the
//! state they share.

use std::{
    collections::HashMap,
    net::{SocketAddr, TcpListener},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::Context as _;

use crate::{
    acks::{AckStats, Acker},
    config::CollectorConfig,
    drops::Drops,
    events::RecentEvents,
    http, ingest,
    nodes::NodeTable,
    routes::{self, Sources},
    shared::{ExtraMetrics, IngestStats, Shared},
    udp,
    writer::{self, Delivery, FrameArchive, Writer},
};
use monitor_archive::{
    liveness::{Heartbeat, Heartbeats},
    query::QueryEngine,
};
use monitor_findings::{
    FindingsInbox, FindingsStore, Thresholds,
    engine::{FindingsEngine, FindingsThread},
    profile::ProfileBoard,
};

/// What a collector is started with beyond its configuration.
#[derive(Default)]
pub struct Parts {
    /// The archive every accepted frame is appended to.
    pub archive: Option<Box<dyn FrameArchive>>,
    /// The archive's query engine, for the query API and the stragglers (`crate::routes`).
    pub query: Option<Arc<QueryEngine>>,
    /// Routes a test adds to the table.
    #[cfg(test)]
    pub test_routes: Option<axum::Router>,
    /// More `/metrics` families (the archive's files, remote-write).
    pub extra_metrics: Option<ExtraMetrics>,
    /// Evaluate health findings into this store with these thresholds.
    pub findings: Option<(Arc<FindingsStore>, Thresholds)>,
    /// Act on those findings (docs/actions.md): needs `findings`.
    pub actions: Option<Arc<monitor_actions::Actions>>,
    /// What the archive holds of each node's newest session ([`held_in_archive`](monitor_archive::archive::recent::held_in_archive),
    /// read at start-up): copies of those frames are refused and acknowledged.
    pub held: HashMap<Arc<str>, (u32, monitor_wire::SeqSet)>,
    /// When the archive last received a frame of each recent node (read at start-up): a node
    /// not heard again is judged silent since then.
    pub heard_before: HashMap<Arc<str>, u64>,
}

pub struct Collector {
    shared: Arc<Shared>,
    udp: SocketAddr,
    http: Option<SocketAddr>,
    stop: Arc<AtomicBool>,
    http_stop: tokio::sync::watch::Sender<bool>,
    receivers: Vec<JoinHandle<()>>,
    writer: Option<Writer>,
    server: Option<JoinHandle<()>>,
    findings: Option<FindingsThread>,
    actions: Option<monitor_actions::ActionsThread>,
}

/// One line at start-up saying who may use the HTTP API.
fn log_who_may_use(addr: SocketAddr, web: &crate::web::WebAuth) {
    let config = web.current();
    let scheme = if web.serves_tls() { "HTTPS" } else { "HTTP" };
    match web.path() {
        Some(path) if config.authenticates() => tracing::info!(
            "{scheme} API on {addr}, authenticated as {} says",
            path.display()
        ),
        Some(path) => tracing::warn!(
            "{scheme} API on {addr} without authentication ({} has no basic_auth_users nor \
             RequireAndVerifyClientCert)",
            path.display()
        ),
        None if addr.ip().is_loopback() => tracing::info!(
            "HTTP API without authentication (no --web.config.file): on loopback {addr} only"
        ),
        None => tracing::warn!(
            "HTTP API on {addr} answers anyone (no --web.config.file, --web.allow-unauthenticated)"
        ),
    }
}

/// How long a receive thread waits for a datagram before it looks at the stop flag.
const RECEIVE_TIMEOUT: Duration = Duration::from_millis(200);

impl Collector {
    /// Binds the sockets and the HTTP port and starts every thread.
    pub fn start(config: CollectorConfig, parts: Parts) -> anyhow::Result<Self> {
        config.limits.validate()?;
        let sockets = udp::bind_group(config.listen, config.sockets, RECEIVE_TIMEOUT)
            .with_context(|| format!("UDP {}", config.listen))?;
        let udp_addr = sockets[0].local_addr()?;
        let listener = config
            .http
            .map(|addr| {
                TcpListener::bind(addr).with_context(|| format!("cannot listen on HTTP {addr}"))
            })
            .transpose()?;
        let http_addr = listener.as_ref().map(|l| l.local_addr()).transpose()?;

        // Every thread the watchdog watches: the receive threads (beaten by index), the
        // archive's writer and its own threads, the HTTP server, the findings thread.
        let mut heartbeats = Heartbeats::new((0..sockets.len()).map(|i| format!("receive-{i}")));
        let table = Arc::new(NodeTable::new(config.keys.clone(), config.limits.clone()));
        let ack_stats = Arc::new(AckStats::default());
        let (archive, writer) = match parts.archive {
            Some(archive) => {
                for (name, beat) in archive.heartbeats() {
                    heartbeats.watch(name, beat);
                }
                let beat = Heartbeat::new();
                heartbeats.watch("archive-writer", beat.clone());
                let mut acker = Acker::new(Some(sockets[0].try_clone()?), ack_stats.clone());
                for (node, (session, held)) in &parts.held {
                    acker.seed(node, *session, held.clone());
                }
                if !parts.held.is_empty() {
                    tracing::info!(
                        "the archive holds recent frames of {} nodes: copies of them are acknowledged, not stored again",
                        parts.held.len()
                    );
                }
                table.resume_from_archive(parts.held);
                let forget = table.clone();
                let delivery = Delivery {
                    acker,
                    not_stored: Box::new(move |frame| {
                        forget.forget_frame(&frame.node, frame.session, frame.seq)
                    }),
                };
                let (queue, handle) = writer::spawn(
                    archive,
                    config.keys.clone(),
                    config.limits.archive_queue_bytes,
                    beat,
                    delivery,
                )?;
                (Some(queue), Some(handle))
            }
            None => (None, None),
        };
        let http_beat = Heartbeat::new();
        if listener.is_some() {
            heartbeats.watch("http", http_beat.clone());
        }
        let findings_beat = Heartbeat::new();
        let findings_tick_beat = Heartbeat::new();
        if parts.findings.is_some() {
            heartbeats.watch("findings", findings_beat.clone());
            heartbeats.watch("findings-tick", findings_tick_beat.clone());
        }
        let (findings_inbox, findings_rx) = match &parts.findings {
            Some(_) => {
                let (inbox, rx) = FindingsInbox::new();
                (Some(inbox), Some(rx))
            }
            None => (None, None),
        };
        let shared = Arc::new(Shared {
            table,
            acks: ack_stats,
            drops: Drops::default(),
            events: RecentEvents::new(
                config.limits.max_recent_events,
                config.limits.max_recent_event_bytes,
            ),
            stats: IngestStats::default(),
            archive,
            extra_metrics: parts.extra_metrics,
            heartbeats,
            findings: parts.findings.as_ref().map(|(store, _)| store.clone()),
            findings_inbox,
            profile: parts
                .findings
                .as_ref()
                .map(|_| Arc::new(ProfileBoard::default())),
            web: config.web.clone(),
        });
        let findings = match (parts.findings, findings_rx) {
            (Some((store, thresholds)), Some(rx)) => Some(FindingsThread::spawn(
                FindingsEngine::new(thresholds, store)
                    .with_board(shared.profile.clone().unwrap_or_default())
                    .heard_before(parts.heard_before),
                rx,
                shared.table.clone(),
                findings_beat,
                findings_tick_beat,
            )?),
            _ => None,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let mut receivers = Vec::new();
        for (index, socket) in sockets.into_iter().enumerate() {
            let (shared, stop) = (shared.clone(), stop.clone());
            receivers.push(
                std::thread::Builder::new()
                    .name(format!("receive-{index}"))
                    .spawn(move || ingest::receive_loop(socket, index, shared, stop))?,
            );
        }
        let actions = match (&parts.actions, &shared.findings) {
            (Some(actions), Some(store)) => Some(monitor_actions::ActionsThread::spawn(
                actions.clone(),
                store.clone(),
                {
                    let table = shared.table.clone();
                    move || table.node_count()
                },
                parts.query.clone(),
            )?),
            _ => None,
        };
        let routes = routes::router(Sources {
            live: Some(shared.clone()),
            query: parts.query,
            actions: parts.actions,
            web: config.web.clone(),
        });
        #[cfg(test)]
        let routes = match parts.test_routes {
            Some(more) => routes.merge(more),
            None => routes,
        };
        if let Some(addr) = http_addr {
            log_who_may_use(addr, &config.web);
        }
        let (http_stop, stopped) = tokio::sync::watch::channel(false);
        let server = match listener {
            Some(listener) => Some(http::spawn(
                listener,
                routes,
                config.web.clone(),
                stopped,
                http_beat,
            )?),
            None => None,
        };
        tracing::info!(
            "collector receiving on UDP {udp_addr} ({} sockets){}{}",
            receivers.len(),
            http_addr
                .map(|a| format!(", HTTP on {a} (/metrics, /api/v1/live/...)"))
                .unwrap_or_default(),
            if writer.is_some() {
                format!(", archiving under {}", config.data_dir.display())
            } else {
                ", no archive".into()
            }
        );
        Ok(Self {
            shared,
            udp: udp_addr,
            http: http_addr,
            stop,
            http_stop,
            receivers,
            writer,
            server,
            findings,
            actions,
        })
    }

    /// The UDP address agents send to.
    pub fn udp_addr(&self) -> SocketAddr {
        self.udp
    }

    /// The HTTP address, if there is a server.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Stops receiving, stops the HTTP server, lets the writer archive what was queued.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for r in self.receivers.drain(..) {
            let _ = r.join();
        }
        let _ = self.http_stop.send(true);
        if let Some(server) = self.server.take() {
            let _ = server.join();
        }
        if let Some(actions) = self.actions.take() {
            actions.stop();
        }
        if let Some(findings) = self.findings.take() {
            findings.stop();
        }
        // Nothing is queued any more: the writer appends what is left and stops.
        if let Some(writer) = self.writer.take() {
            writer.stop();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io::{Read as _, Write as _},
        net::{TcpStream, UdpSocket},
        time::Instant,
    };

    use monitor_wire::{
        EncoderConfig, FrameEncoder, Kind, Labels, Reading, ReceiverState, Series, Value, WireEvent,
    };

    use super::*;
    use crate::{config::Limits, drops::DropReason, writer::testing::RecordingArchive};
    use monitor_archive::clock::unix_now_ns;
    use monitor_wire::Key;

    fn key() -> Key {
        Key::from_bytes([5; 32])
    }

    fn start(archive: &RecordingArchive) -> Collector {
        start_with(Parts {
            archive: Some(Box::new(archive.clone())),
            query: None,
            extra_metrics: None,
            findings: None,
            actions: None,
            test_routes: None,
            held: HashMap::new(),
            heard_before: HashMap::new(),
        })
    }

    fn start_with(parts: Parts) -> Collector {
        Collector::start(
            CollectorConfig {
                listen: "127.0.0.1:0".parse().unwrap(),
                sockets: 2,
                http: Some("127.0.0.1:0".parse().unwrap()),
                web: Default::default(),
                data_dir: "/nonexistent".into(),
                keys: key().into(),
                limits: Limits::default(),
            },
            parts,
        )
        .unwrap()
    }

    pub(crate) fn http_get(addr: SocketAddr, path: &str) -> String {
        let mut stream = TcpStream::connect(addr).unwrap();
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        response
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_owned())
            .unwrap()
    }

    /// The value of one line of an exposition, found by its start.
    fn metric(text: &str, start: &str) -> Option<String> {
        text.lines()
            .find(|l| l.starts_with(start) && l[start.len()..].starts_with(' '))
            .map(|l| l[start.len() + 1..].split(' ').next().unwrap().to_owned())
    }

    fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        let start = Instant::now();
        while !done() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "timed out: {what}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn readings(enc: &mut FrameEncoder, t: u64, step: u64) {
        for port in 0..4 {
            enc.push_reading(&Reading {
                series: Series {
                    name: "railscope_ib_port_xmit_bytes_total".into(),
                    labels: Labels::new([
                        ("device", "mlx5_0".to_owned()),
                        ("port", port.to_string()),
                    ]),
                    kind: Kind::Counter,
                },
                value: Value::U64(1_000 * step + port),
                unix_ns: t,
            })
            .unwrap();
            enc.push_reading(&Reading {
                series: Series {
                    name: "railscope_gpu_power_watts".into(),
                    labels: Labels::new([("gpu", port.to_string())]),
                    kind: Kind::Gauge,
                },
                value: Value::F64(300.25 + step as f64),
                unix_ns: t,
            })
            .unwrap();
        }
    }

    #[test]
    fn frames_are_accepted_archived_exposed_and_bad_datagrams_counted_by_reason() {
        let archive = RecordingArchive::default();
        let collector = start(&archive);
        let to = collector.udp_addr();
        let http = collector.http_addr().unwrap();
        let agent = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut enc = FrameEncoder::new(EncoderConfig::new("gpu-node-001"), key()).unwrap();
        // Whole milliseconds, as the encoder's quantum keeps them.
        let t0 = (unix_now_ns() - 5_000_000_000) / 1_000_000 * 1_000_000;
        let mut sent = Vec::new();
        for step in 0..3 {
            readings(&mut enc, t0 + step * 1_000_000_000, step);
            if step == 1 {
                enc.push_event(WireEvent {
                    unix_ns: t0 + 1_500_000_000,
                    kind: "xid".into(),
                    labels: Labels::new([("gpu", "3")]),
                    code: 79,
                    text: "fallen off the bus".into(),
                });
            }
            for f in enc.flush(t0 + step * 1_000_000_000 + 1) {
                agent.send_to(&f, to).unwrap();
                sent.push(f);
            }
        }
        let shared = collector.shared().clone();
        wait_for("frames accepted", || {
            shared.stats.frames.load(Ordering::Relaxed) == sent.len() as u64
        });

        // Forged (another key), replayed, truncated and random datagrams, from another socket.
        let attacker = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut stranger =
            FrameEncoder::new(EncoderConfig::new("gpu-node-001"), Key::from_bytes([6; 32]))
                .unwrap();
        readings(&mut stranger, t0, 0);
        let forged = stranger.flush(t0 + 1);
        for f in &forged {
            attacker.send_to(f, to).unwrap();
        }
        for f in &sent {
            attacker.send_to(f, to).unwrap(); // replays
        }
        let mut short = 0;
        for len in [0, 1, 10, 36, 37, 100, sent[0].len() - 1] {
            attacker.send_to(&sent[0][..len], to).unwrap();
            short += u64::from(len < monitor_wire::MIN_FRAME_LEN);
        }
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for i in 0..50 {
            let random: Vec<u8> = (0..37 + i * 20)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            attacker.send_to(&random, to).unwrap();
        }
        let datagrams = sent.len() * 2 + forged.len() + 7 + 50;
        wait_for("every datagram", || {
            shared.stats.datagrams.load(Ordering::Relaxed) == datagrams as u64
        });
        let drops = &shared.drops;
        assert_eq!(drops.count(DropReason::Duplicate), sent.len() as u64);
        assert_eq!(drops.count(DropReason::TooShort), short);
        assert_eq!(
            drops.count(DropReason::BadMac),
            forged.len() as u64 + (7 - short) + 50
        );
        assert_eq!(drops.total(), (datagrams - sent.len()) as u64);

        // Every accepted frame reached the archive, as received, each with its node's schema.
        wait_for("archived", || {
            archive.appended.lock().unwrap().len() == sent.len()
        });
        let appended = archive.appended.lock().unwrap().clone();
        for (a, s) in appended.iter().zip(&sent) {
            assert_eq!(&a.bytes, s);
            assert_eq!(a.node, "gpu-node-001");
            assert!(
                a.received_ns > a.last_ns,
                "received after its samples were read"
            );
            // Sample times are rounded to the encoder's 1 ms quantum.
            assert!(
                a.first_ns + 1_000_000 >= t0 && a.last_ns <= t0 + 2_001_000_000,
                "{a:?}"
            );
            let mut reader = ReceiverState::default();
            if let Some(schema) = &a.schema {
                let schema = monitor_wire::decode(schema, &key(), &mut reader).unwrap();
                assert!(schema.samples.is_empty());
                assert_eq!(schema.schema.len(), 8);
            }
            let frame = monitor_wire::decode(&a.bytes, &key(), &mut reader).unwrap();
            // Decoded alone with its schema frame: every series is named.
            assert_eq!(reader.node("gpu-node-001").unwrap().last.unknown_samples, 0);
            assert_eq!(a.schema.is_none(), frame.seq == 0);
        }
        wait_for("the writer ticks the archive", || {
            archive.ticks.load(Ordering::Relaxed) > 0
        });

        // /metrics: the latest value of each series with its timestamp, and the health.
        let text = http_get(http, "/metrics");
        let ts_ms = (t0 + 2_000_000_000) / 1_000_000;
        assert!(
            text.contains(&format!(
                "railscope_ib_port_xmit_bytes_total{{node=\"gpu-node-001\",device=\"mlx5_0\",port=\"3\"}} 2003 {ts_ms}\n"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "railscope_gpu_power_watts{{node=\"gpu-node-001\",gpu=\"0\"}} 302.25 {ts_ms}\n"
            )),
            "{text}"
        );
        assert_eq!(
            text.matches("# TYPE railscope_gpu_power_watts gauge")
                .count(),
            1
        );
        let reason = |r: &str| {
            metric(
                &text,
                &format!("railscope_collector_frames_dropped_total{{reason=\"{r}\"}}"),
            )
            .unwrap()
        };
        assert_eq!(reason("duplicate"), sent.len().to_string());
        assert_eq!(reason("too_short"), short.to_string());
        assert_eq!(
            metric(
                &text,
                "railscope_collector_node_frames_duplicated_total{node=\"gpu-node-001\"}"
            ),
            Some(sent.len().to_string())
        );
        assert_eq!(
            metric(&text, "railscope_collector_samples_accepted_total"),
            Some("24".into())
        );
        assert_eq!(
            metric(&text, "railscope_collector_archive_frames_total"),
            Some(sent.len().to_string())
        );
        let events = http_get(http, "/api/v1/live/events?kind=xid");
        let events: serde_json::Value = serde_json::from_str(&events).unwrap();
        assert_eq!(events[0]["code"], 79);
        assert_eq!(events[0]["node"], "gpu-node-001");
        let nodes: serde_json::Value =
            serde_json::from_str(&http_get(http, "/api/v1/live/nodes")).unwrap();
        assert_eq!(nodes[0]["series"], 8);
        assert_eq!(nodes[0]["duplicates"], sent.len());

        // A full disk: appends fail, counted; the live view goes on.
        archive.full.store(true, Ordering::Relaxed);
        readings(&mut enc, t0 + 3_000_000_000, 3);
        let more = enc.flush(t0 + 3_000_000_001);
        for f in &more {
            agent.send_to(f, to).unwrap();
        }
        let stats = shared.archive.as_ref().unwrap().stats().clone();
        wait_for("append errors", || {
            stats.append_errors.load(Ordering::Relaxed) == more.len() as u64
        });
        let text = http_get(http, "/metrics");
        assert_eq!(
            metric(&text, "railscope_collector_archive_failing"),
            Some("1".into())
        );
        assert!(text.contains(" 3003 "), "the live view kept going: {text}");
        collector.stop();
    }

    /// What the watchdog is told in these tests: a thread that has not beaten for this long
    /// is stalled (the collector uses half of `WatchdogSec=`).
    const MAX_AGE: Duration = Duration::from_millis(1500);

    /// The watchdog line after a stall of twice `MAX_AGE` (None: it may ping).
    fn after_a_stall(collector: &Collector) -> Option<String> {
        std::thread::sleep(2 * MAX_AGE);
        collector.shared().heartbeats.watchdog_check(MAX_AGE).err()
    }

    #[test]
    fn a_hung_sealer_or_http_server_stops_the_watchdog_pings_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let archive = monitor_archive::archive::Archive::open(
            monitor_archive::archive::ArchiveConfig::new(tmp.path()),
        )
        .unwrap();
        let stall = archive.stall_sealer();
        // A handler that blocks the server's runtime (its one worker) for a while.
        let hang = axum::Router::new().route(
            "/hang",
            axum::routing::get(|| async {
                std::thread::sleep(3 * MAX_AGE);
                "done"
            }),
        );
        let collector = start_with(Parts {
            archive: Some(Box::new(crate::writer::PublishingArchive::new(archive))),
            query: None,
            test_routes: Some(hang),
            extra_metrics: None,
            findings: None,
            actions: None,
            held: HashMap::new(),
            heard_before: HashMap::new(),
        });
        let names: Vec<&str> = collector.shared().heartbeats.names().collect();
        for name in [
            "receive-0",
            "receive-1",
            "archive-sealer",
            "archive-writer",
            "http",
        ] {
            assert!(names.contains(&name), "{name} is not watched: {names:?}");
        }
        // The sealer stands still: named, and only it.
        let line = after_a_stall(&collector).expect("a stalled sealer stops the pings");
        assert!(
            line.starts_with("not pinging the watchdog: stalled: archive-sealer ("),
            "{line}"
        );
        assert!(!line.contains(", "), "only the sealer: {line}");
        drop(stall);
        std::thread::sleep(MAX_AGE / 2);
        assert_eq!(
            collector.shared().heartbeats.watchdog_check(MAX_AGE),
            Ok(())
        );
        // A request hangs the HTTP server's runtime: the server is named.
        let http = collector.http_addr().unwrap();
        let request = std::thread::spawn(move || http_get(http, "/hang"));
        let line = after_a_stall(&collector).expect("a hung HTTP runtime stops the pings");
        assert!(line.contains("stalled: http ("), "{line}");
        assert!(!line.contains("archive-sealer"), "{line}");
        assert_eq!(request.join().unwrap(), "done");
        std::thread::sleep(MAX_AGE / 2);
        assert_eq!(
            collector.shared().heartbeats.watchdog_check(MAX_AGE),
            Ok(())
        );
        collector.stop();
    }

    #[test]
    fn a_hung_archive_writer_stops_the_watchdog_pings_naming_it() {
        let archive = RecordingArchive::default();
        let collector = start(&archive);
        archive.hang.store(true, Ordering::Relaxed);
        let line = after_a_stall(&collector).expect("a hung writer stops the pings");
        assert!(
            line.starts_with("not pinging the watchdog: stalled: archive-writer ("),
            "{line}"
        );
        archive.hang.store(false, Ordering::Relaxed);
        std::thread::sleep(MAX_AGE / 2);
        assert_eq!(
            collector.shared().heartbeats.watchdog_check(MAX_AGE),
            Ok(())
        );
        collector.stop();
    }
}
