//! Fixture nodes' frames ([`archive::fixture_node`](crate::archive::fixture_node)) appended
//! to an archive as the collector appends what it accepts, the sender's schema at hand: the
//! archive filled the same way by the query tests, the query memory test and the archive size
//! example.

use crate::archive::{
    AcceptedFrame, Archive, ArchiveError,
    fixture_node::{FixtureFrame, FixtureSender},
};

/// Appends `frames`, made by `sender`, under the sender's node name.
pub fn append_fixture_frames(
    archive: &mut Archive,
    sender: &FixtureSender,
    frames: &[FixtureFrame],
) -> Result<(), ArchiveError> {
    for f in frames {
        let frame = AcceptedFrame {
            node: &sender.name,
            received_ns: f.received_ns,
            first_ns: f.first_ns,
            last_ns: f.last_ns,
            bytes: &f.bytes,
        };
        archive.append(&frame, &|_| sender.schema_frame())?;
    }
    Ok(())
}
