//! Queries over the archive.
