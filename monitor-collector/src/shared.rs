//! What the receive threads, the writer, the findings thread and the HTTP server share: one
//! [`Shared`], made by [`collector`](crate::collector) and handed to each. It sits below every
//! module that uses it (it names only the parts it holds), so the assembler, ingest, the HTTP
//! layer and `/metrics` import it without importing one another.

use std::sync::{Arc, atomic::AtomicU64};

use crate::{
    drops::Drops, events::RecentEvents, nodes::NodeTable, web::WebAuth, writer::ArchiveQueue,
};
use monitor_archive::liveness::Heartbeats;
use monitor_findings::{FindingsInbox, FindingsStore, profile::ProfileBoard};

/// What the receive threads, the writer and the HTTP server share.
pub struct Shared {
    pub table: Arc<NodeTable>,
    pub drops: Drops,
    pub events: RecentEvents,
    pub stats: IngestStats,
    /// None: no archive (the live view only).
    pub archive: Option<ArchiveQueue>,
    /// Acknowledgements sent to the agents (with an archive).
    pub acks: Arc<crate::acks::AckStats>,
    /// More `/metrics` families (the archive's files, remote-write), appended to the page.
    pub extra_metrics: Option<ExtraMetrics>,
    /// One per watched thread (the receive threads first, by index), for the watchdog.
    pub heartbeats: Heartbeats,
    /// Health findings (None: not evaluated), and where ingest hands them events.
    pub findings: Option<Arc<FindingsStore>>,
    pub findings_inbox: Option<FindingsInbox>,
    /// The golden profile the findings thread learnt last (None: findings not evaluated).
    pub profile: Option<Arc<ProfileBoard>>,
    /// Who may use the HTTP API, and the requests it refused.
    pub web: Arc<WebAuth>,
}

/// Writes more families onto the `/metrics` page.
pub(crate) type ExtraMetrics = Box<dyn Fn(&mut String) + Send + Sync>;

/// Counters of everything that was received and accepted.
#[derive(Debug, Default)]
pub struct IngestStats {
    pub datagrams: AtomicU64,
    pub batches: AtomicU64,
    pub frames: AtomicU64,
    pub samples: AtomicU64,
    pub events: AtomicU64,
    pub bytes: AtomicU64,
    pub schema_requests_sent: AtomicU64,
    pub schema_request_errors: AtomicU64,
}
