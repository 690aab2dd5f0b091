//! What a collector is started with: where it listens, its key, and the bounds that keep its
//! memory finite whatever the senders do (docs/collector.md, "Memory bounds").

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use monitor_wire::{Keyring, MAX_FRAME_SAMPLES};

use crate::web::WebAuth;

/// The bounds of a collector's memory. Each is a count; docs/collector.md, "Memory bounds", gives what they
/// cost in bytes.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Nodes held at once; a new node beyond it is dropped (`too_many_nodes`).
    pub max_nodes: usize,
    /// Series (schema entries) one node session may hold; a session that goes beyond it is
    /// refused until the node restarts (`series_limit`). At most 65,536: a segment's schema
    /// frame must hold them all.
    pub max_series_per_node: usize,
    /// Series held over all nodes; the session that would go beyond it is refused likewise.
    pub max_series: usize,
    /// Recent events kept for the live view (all nodes), and the bytes they may take.
    pub max_recent_events: usize,
    pub max_recent_event_bytes: usize,
    /// Accepted frames waiting for the archive writer, in bytes; beyond it a frame is kept in
    /// the live view but not archived (counted).
    pub archive_queue_bytes: usize,
    /// A frame sent longer ago than this, or further ahead than `max_frame_ahead`, by the
    /// collector's clock, is dropped (`out_of_time_range`): a replay from before a node was
    /// forgotten, or a sender with a broken clock.
    pub max_frame_age: Duration,
    pub max_frame_ahead: Duration,
    /// A node not heard from for this long is forgotten (longer than `max_frame_age`, so its
    /// old frames cannot be replayed as a new node's).
    pub node_ttl: Duration,
    /// A series whose latest sample is older than this is left out of `/metrics`.
    pub live_ttl: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_nodes: 10_000,
            max_series_per_node: 20_000,
            max_series: 4_000_000,
            max_recent_events: 10_000,
            max_recent_event_bytes: 16 << 20,
            archive_queue_bytes: 64 << 20,
            max_frame_age: Duration::from_secs(3600),
            max_frame_ahead: Duration::from_secs(600),
            node_ttl: Duration::from_secs(24 * 3600),
            live_ttl: Duration::from_secs(600),
        }
    }
}

/// Why a configuration cannot run.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error(
        "max series per node is {0}, at most {MAX_FRAME_SAMPLES} (a schema frame holds that many)"
    )]
    SeriesPerNode(usize),
    #[error("{what} must be at least 1")]
    Zero { what: &'static str },
    #[error(
        "node ttl must be longer than the max frame age, so a forgotten node's frames cannot be replayed"
    )]
    NodeTtl,
}

impl Limits {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_series_per_node > MAX_FRAME_SAMPLES {
            return Err(ConfigError::SeriesPerNode(self.max_series_per_node));
        }
        for (value, what) in [
            (self.max_nodes, "max nodes"),
            (self.max_series_per_node, "max series per node"),
            (self.max_series, "max series"),
        ] {
            if value == 0 {
                return Err(ConfigError::Zero { what });
            }
        }
        if self.node_ttl <= self.max_frame_age {
            return Err(ConfigError::NodeTtl);
        }
        Ok(())
    }
}

/// Everything `railscope-collector run` needs.
#[derive(Clone, Debug)]
pub struct CollectorConfig {
    /// UDP address the agents send to.
    pub listen: SocketAddr,
    /// Receive sockets (and threads) on that address, with SO_REUSEPORT.
    pub sockets: usize,
    /// HTTP address of `/metrics`, the live view and the query API (none: no HTTP server).
    pub http: Option<SocketAddr>,
    /// Who may use the HTTP API (the web config file; without one, everyone who can reach
    /// the port, which then is loopback unless the operator allowed more).
    pub web: Arc<WebAuth>,
    /// Data directory of the archive.
    pub data_dir: PathBuf,
    /// The keys frames are accepted with: each node's own (from the fleet secret), the
    /// previous secret's during a rotation, the shared key of old.
    pub keys: Keyring,
    pub limits: Limits,
}
