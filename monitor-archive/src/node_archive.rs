//! Test-only: a simulated node's frames (`monitor_testkit::NodeSender`, the agent's series)
//! appended to an archive as the collector appends what it accepts, the sender's schema at
//! hand: the archive the query tests fill.

pub use monitor_testkit::{NodeFrame, NodeSender};

use crate::archive::{AcceptedFrame, Archive, ArchiveError};

/// Appends `frames`, made by `sender`, under the sender's node name.
pub fn append_node_frames(
    archive: &mut Archive,
    sender: &NodeSender,
    frames: &[NodeFrame],
) -> Result<(), ArchiveError> {
    append(archive, &sender.name, frames, &|_| sender.schema_frame())
}

/// Appends `frames` of node `node` in the order given, as a collector that knows no schema of
/// the session yet appends them (a segment starts without one): frames that came out of order.
pub fn append_frames_as_they_came(
    archive: &mut Archive,
    node: &str,
    frames: &[NodeFrame],
) -> Result<(), ArchiveError> {
    append(archive, node, frames, &|_| None)
}

/// Appends `frames` under `node`, `schema` giving the node's schema where a segment starts.
fn append(
    archive: &mut Archive,
    node: &str,
    frames: &[NodeFrame],
    schema: &dyn Fn(&str) -> Option<Vec<u8>>,
) -> Result<(), ArchiveError> {
    for f in frames {
        let frame = AcceptedFrame {
            node,
            received_ns: f.received_ns,
            first_ns: f.first_ns,
            last_ns: f.last_ns,
            bytes: &f.bytes,
        };
        archive.append(&frame, schema)?;
    }
    Ok(())
}
