//! The series model shared by the agent, the frame format and receivers: a series is a metric
//! name, labels and a kind; a reading is one value of one series at one time. (Events, which
//! happen once and are never sampled away, are part of the [frame model](crate::WireEvent).)

use std::{fmt, sync::Arc};

/// How a series behaves, which decides how it may be sampled and sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// Monotonic cumulative count (bytes sent, errors): the cumulative value is sent, rates
    /// are derived at the receiver, so sampling loses nothing.
    Counter,
    /// Instantaneous value (utilization, temperature): sampling sends min/max/mean envelopes.
    Gauge,
}

/// Label pairs, kept sorted by key so equal series compare equal. Shared, like a
/// [`Series`]' name: every sample the poller hands on carries its series, and a clone is then
/// a reference count, not a copy of the strings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Labels(Arc<Vec<(String, String)>>);

impl Labels {
    pub fn new<K: Into<String>, V: Into<String>>(pairs: impl IntoIterator<Item = (K, V)>) -> Self {
        let mut v: Vec<(String, String)> = pairs
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        v.sort();
        Self(Arc::new(v))
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

impl fmt::Display for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{k}={v:?}")?;
        }
        f.write_str("}")
    }
}

/// A series: metric name, labels and kind. Names follow Prometheus conventions
/// (`railscope_ib_port_xmit_bytes_total`, `railscope_gpu_sm_util_ratio`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Series {
    pub name: Arc<str>,
    pub labels: Labels,
    pub kind: Kind,
}

/// `name{labels}`, as Prometheus writes a series.
impl fmt::Display for Series {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.name, self.labels)
    }
}

/// One value of one series, read at `unix_ns`.
#[derive(Clone, Debug, PartialEq)]
pub struct Reading {
    pub series: Series,
    pub value: Value,
    pub unix_ns: u64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    U64(u64),
    F64(f64),
}

impl Value {
    pub fn as_f64(self) -> f64 {
        match self {
            Value::U64(v) => v as f64,
            Value::F64(v) => v,
        }
    }
}
