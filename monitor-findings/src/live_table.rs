//! What the findings read of the collector's live view, and the trait through which they
//! read it ([`LiveTable`]): each node's schema and the latest value of each of its series,
//! with stamps that say what changed since the last reading. The collector's node table
//! implements it (and the straggler search's `stragglers::LiveSteps`); the rules never see
//! the table itself, its locks or what else the collector shares.

use std::sync::Arc;

use monitor_wire::Series;

/// Maps keyed by series id: foldhash (seeded per process) rather than SipHash, as the node
/// table's own.
pub type HashMap<K, V> = foldhash::HashMap<K, V>;

/// The live view as the findings read it.
pub trait LiveTable: Send + Sync {
    /// Shows `f` every node's latest values.
    fn visit_nodes(&self, f: &mut dyn FnMut(&NodeLatest));
}

/// A node's stamps ([`NodeLatest`]'s): what changed since a reading.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stamps {
    pub schema: u64,
    pub grown: u64,
    pub latest: u64,
}

/// The series a node session's ids stand for: the snapshot the archive writes at the start of
/// a segment. Shared copy-on-write: a frame waiting for the archive keeps the schema it was
/// accepted under, and the node's map is copied only if it changes meanwhile.
#[derive(Clone, Debug, Default)]
pub struct Schema {
    pub node: Arc<str>,
    pub session: u32,
    pub entries: HashMap<u32, Series>,
}

/// The latest sample of a series (by sample time, not arrival).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Latest {
    pub unix_ns: u64,
    pub value: LatestValue,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LatestValue {
    /// A counter's value, and its rate per second from the sample before (None for the
    /// first sample, or after a reset): what a fleet view colours a port by, from the live
    /// table rather than a scan of the archive. (An `f32` in the variant's spare bytes: a
    /// `Latest` stays 40 bytes.)
    Counter { value: u64, per_second: Option<f32> },
    /// The envelope of the readings the sample covers (one reading: all three equal).
    Gauge { min: f64, max: f64, mean: f64 },
}

/// One node's latest values as [`LiveTable::visit_nodes`] shows them.
pub struct NodeLatest<'a> {
    pub name: &'a Arc<str>,
    pub schema: &'a Schema,
    /// Changes when the schema or the set of series with a latest value may have changed
    /// otherwise than by a new series getting its first value.
    pub schema_stamp: u64,
    /// Changes when the schema gained ids (a schema that changed otherwise changes
    /// `schema_stamp`).
    pub grown_stamp: u64,
    /// Changes when any latest value may have changed (and with `schema_stamp`).
    pub latest_stamp: u64,
    /// When the collector last accepted a frame of the node (Unix ns, its own clock).
    pub last_seen_unix_ns: u64,
    latest: &'a HashMap<u32, Latest>,
}

impl<'a> NodeLatest<'a> {
    /// A node's view: `latest` holds the latest value of each of `schema`'s ids that has one.
    pub fn new(
        name: &'a Arc<str>,
        schema: &'a Schema,
        stamps: Stamps,
        last_seen_unix_ns: u64,
        latest: &'a HashMap<u32, Latest>,
    ) -> Self {
        Self {
            name,
            schema,
            schema_stamp: stamps.schema,
            grown_stamp: stamps.grown,
            latest_stamp: stamps.latest,
            last_seen_unix_ns,
            latest,
        }
    }

    /// The latest value of the series with schema id `id`, if it has one.
    pub fn latest(&self, id: u32) -> Option<&Latest> {
        self.latest.get(&id)
    }
}
