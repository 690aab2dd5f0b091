//! The durable archive: every accepted frame, as received, appended to segment files under
//! the data directory.
