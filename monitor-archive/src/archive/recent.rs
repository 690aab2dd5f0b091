//! What the archive says of the nodes heard shortly before its newest record: each node's
//! newest session and the frames of it held, and when each node was last heard. A collector
//! reads it at start-up, so that it refuses the copies it has (and acknowledges them), names
//! the rest as missing, and knows which nodes fell silent while it was away.

use std::{collections::HashMap, sync::Arc, time::Duration};

use monitor_wire::{self as wire, SeqSet};

use super::{ArchiveError, ArchiveReader, RecordKind};

/// How far back from its newest record a collector that starts reads what the archive
/// holds: frames durable but not yet acknowledged when it stopped were received in its last
/// seconds (acknowledgements are cumulative and go out every second), so ten minutes leaves
/// a wide margin. Counted back from the newest record, not from now, so that an outage
/// longer than the horizon does not make the collector store its last frames twice.
pub const HELD_HORIZON: Duration = Duration::from_secs(600);

/// What the archive holds of each node's newest session, among the records received in the
/// [`HELD_HORIZON`] before its newest one: read at start-up, so that a restarted collector
/// refuses the copies it has and acknowledges them, and names the rest as missing. Returns,
/// per node, its newest session (by append order) and the frames of it held.
pub fn held_in_archive(
    reader: &ArchiveReader,
) -> Result<HashMap<Arc<str>, (u32, SeqSet)>, ArchiveError> {
    Ok(recent_in_archive(reader)?.held)
}

/// What the archive says of the nodes heard in the [`HELD_HORIZON`] before its newest record.
#[derive(Debug, Default)]
pub struct RecentNodes {
    /// Each node's newest session and the frames of it held ([`held_in_archive`]).
    pub held: HashMap<Arc<str>, (u32, SeqSet)>,
    /// When each node's newest frame was received (Unix ns): a node a restarted collector
    /// does not hear from again is silent since then (`node_silent`), not unknown.
    pub last_received_ns: HashMap<Arc<str>, u64>,
}

/// [`RecentNodes`], read in one pass over the horizon's records.
pub fn recent_in_archive(reader: &ArchiveReader) -> Result<RecentNodes, ArchiveError> {
    let cutoff_ns = reader
        .last_received_ns()
        .saturating_sub(HELD_HORIZON.as_nanos() as u64);
    let mut recent = RecentNodes::default();
    let mut sequential = reader.sequential(reader.received_since(cutoff_ns));
    loop {
        let batch = sequential.next_batch(4096)?;
        if batch.is_empty() {
            return Ok(recent);
        }
        for record in batch {
            if record.kind != RecordKind::Frame || record.received_ns < cutoff_ns {
                continue;
            }
            let Some((session, seq)) = wire::peek_sequence(&record.bytes) else {
                continue;
            };
            let last = recent
                .last_received_ns
                .entry(record.node.clone())
                .or_default();
            *last = (*last).max(record.received_ns);
            let entry = recent
                .held
                .entry(record.node.clone())
                .or_insert_with(|| (session, SeqSet::default()));
            if entry.0 != session {
                *entry = (session, SeqSet::default());
            }
            entry.1.insert(seq);
        }
    }
}
