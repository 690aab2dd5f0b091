//! A running collector: its receive threads, the archive writer, the HTTP server, and the
//! state they share.

use std::{
    net::{SocketAddr, TcpListener},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::Context as _;
use railscope_wire::Key;

use crate::{
    config::CollectorConfig,
    drops::Drops,
    events::RecentEvents,
    http,
    ingest::{self, IngestStats},
    nodes::NodeTable,
    udp,
    writer::{self, ArchiveQueue, FrameArchive},
};

/// What the receive threads, the writer and the HTTP server share.
pub struct Shared {
    pub key: Key,
    pub table: NodeTable,
    pub drops: Drops,
    pub events: RecentEvents,
    pub stats: IngestStats,
    /// None: no archive (the live view only).
    pub archive: Option<ArchiveQueue>,
}

/// What a collector is started with beyond its configuration.
#[derive(Default)]
pub struct Parts {
    /// The archive every accepted frame is appended to.
    pub archive: Option<Box<dyn FrameArchive>>,
    /// More HTTP routes (the query API), merged with `/metrics` and the live view.
    pub api: Option<axum::Router>,
}

pub struct Collector {
    shared: Arc<Shared>,
    udp: SocketAddr,
    http: Option<SocketAddr>,
    stop: Arc<AtomicBool>,
    http_stop: tokio::sync::watch::Sender<bool>,
    receivers: Vec<JoinHandle<()>>,
    writer: Option<JoinHandle<()>>,
    server: Option<JoinHandle<()>>,
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

        let (archive, writer) = match parts.archive {
            Some(archive) => {
                let (queue, handle) = writer::spawn(
                    archive,
                    config.key.clone(),
                    config.limits.archive_queue_bytes,
                )?;
                (Some(queue), Some(handle))
            }
            None => (None, None),
        };
        let shared = Arc::new(Shared {
            key: config.key.clone(),
            table: NodeTable::new(config.key.clone(), config.limits.clone()),
            drops: Drops::default(),
            events: RecentEvents::new(
                config.limits.max_recent_events,
                config.limits.max_recent_event_bytes,
            ),
            stats: IngestStats::default(),
            archive,
        });
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
        let (http_stop, stopped) = tokio::sync::watch::channel(false);
        let server = match listener {
            Some(listener) => Some(http::spawn(
                listener,
                http::router(shared.clone(), parts.api),
                stopped,
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

    /// Stops receiving, lets the writer archive what was queued, stops the HTTP server.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for r in self.receivers.drain(..) {
            let _ = r.join();
        }
        let _ = self.http_stop.send(true);
        if let Some(server) = self.server.take() {
            let _ = server.join();
        }
        // The receive threads are gone; the last queue end goes with the shared state.
        let writer = self.writer.take();
        drop(self.shared);
        if let Some(writer) = writer {
            let _ = writer.join();
        }
    }
}
