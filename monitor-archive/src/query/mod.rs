//! Queries over the archive: series by metric name and label matchers over a time range
//! (counters with their rates, gauges with their min/max/mean envelopes) and events by kind,
//! node, device and time. Answers come from the archive, which includes what was appended
//! and not yet written out. The collector serves them over HTTP (its `query::api`).
//!
//! - [`engine`]: the query engine ([`QueryEngine`]) over an
//!   [`ArchiveReader`](crate::archive::ArchiveReader) and the keyring;
//! - [`export`]: a node's range as a capture file (`/api/v1/export`, what `railscope export`
//!   asks for), for `railscope report`;
//! - [`selector`]: label matchers;
//! - [`session_ids`]: what a node session's series ids stand for, whatever order its frames
//!   came in (samples that came before their schema entry wait for it).

pub mod engine;
pub mod export;
pub mod selector;
pub mod session_ids;

pub use engine::{EventQuery, QueryEngine, QueryError, SeriesQuery};
pub use selector::Matcher;
