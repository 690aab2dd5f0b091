//! `GET /api/v1/live/latest`: the latest value of chosen metrics across the fleet, from the
//! live table in memory: what a fleet view or a heat map colours its cells by.
//!
//! Why not the archive: the latest value of 8,000 series asked of `/api/v1/series` over a
//! minute decodes every block of every node's segments in that minute (seconds at 1,000
//! nodes), to keep one point of each. The live table holds that point already, and for a
//! counter its rate from the sample before (`nodes::LatestValue::Counter`). One visit of
//! the table answers every metric asked, so a view asks once per refresh.
//!
//! The answer has the shape of `/api/v1/series`' (`series`, each with `labels`, `kind` and
//! `points`), one point per series: a counter's `value` and `rate`, a gauge's `mean`, `min`
//! and `max`, at `t` (Unix seconds). A series whose latest sample is older than the live
//! ttl is left out, as on `/metrics`.
//!
//! `format=columns` gives the same points in about a third of the bytes, for a fleet-wide
//! view (12,500 nodes x 40 series is 500,000 series): per metric and kind, the label names
//! once and a row of values per series, instead of an object with named fields per series.

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    sync::Arc,
    time::SystemTime,
};

use axum::{
    extract::{RawQuery, State},
    http::header,
    response::{IntoResponse, Response},
};
use monitor_wire::Labels;
use serde::Serialize;

use crate::{
    nodes::{LatestValue, NodeTable},
    query::{
        api::{ApiError, bad, params},
        selector::Matcher,
        time::unix_ns,
    },
    shared::Shared,
};

/// Asked for the series of at most this many metrics at once.
const MAX_METRICS: usize = 32;

/// One series' latest point, as found in the live table.
struct Found {
    metric: Arc<str>,
    node: Arc<str>,
    labels: Labels,
    point: Point,
}

impl Found {
    fn kind(&self) -> &'static str {
        match self.point {
            Point::Counter { .. } => "counter",
            Point::Gauge { .. } => "gauge",
        }
    }

    /// The value of label `name` (`node` included).
    fn label(&self, name: &str) -> Option<&str> {
        if name == "node" {
            Some(&self.node)
        } else {
            self.labels.get(name)
        }
    }
}

/// One series in the default format's answer.
#[derive(Serialize)]
struct LatestSeries {
    metric: Arc<str>,
    labels: serde_json::Map<String, serde_json::Value>,
    kind: &'static str,
    points: [Point; 1],
}

impl From<Found> for LatestSeries {
    fn from(f: Found) -> Self {
        let mut labels = serde_json::Map::new();
        labels.insert("node".into(), f.node.to_string().into());
        for (k, v) in f.labels.iter() {
            labels.insert(k.to_string(), v.to_string().into());
        }
        Self {
            kind: f.kind(),
            metric: f.metric,
            labels,
            points: [f.point],
        }
    }
}

#[derive(Serialize, Clone, Copy)]
#[serde(untagged)]
enum Point {
    Counter {
        t: f64,
        value: u64,
        rate: Option<f32>,
    },
    Gauge {
        t: f64,
        mean: f64,
        min: f64,
        max: f64,
    },
}

/// The latest point of every live series of `metrics` whose labels (with `node`) match
/// every matcher.
fn latest(
    table: &NodeTable,
    metrics: &HashSet<&str>,
    matchers: &[Matcher],
    now_ns: u64,
) -> Vec<Found> {
    let oldest = now_ns.saturating_sub(table.live_ttl_ns());
    let mut out = Vec::new();
    table.visit_latest(&mut |node, series, latest| {
        if latest.unix_ns < oldest || !metrics.contains(&*series.name) {
            return;
        }
        let label = |name: &str| {
            if name == "node" {
                Some(&**node)
            } else {
                series.labels.get(name)
            }
        };
        if !matchers.iter().all(|m| m.matches(label(&m.label))) {
            return;
        }
        let t = latest.unix_ns as f64 / 1e9;
        let point = match latest.value {
            LatestValue::Counter { value, per_second } => Point::Counter {
                t,
                value,
                rate: per_second,
            },
            LatestValue::Gauge { min, max, mean } => Point::Gauge { t, mean, min, max },
        };
        out.push(Found {
            metric: series.name.clone(),
            node: node.clone(),
            labels: series.labels.clone(),
            point,
        });
    });
    out
}

/// The series of one metric and kind in the columns format: the names of its labels (the
/// union over its series, `node` first), the names of a point's fields, and one row per
/// series: its label values (null where a series has no such label), then its point's.
#[derive(Serialize)]
struct Columns<'a> {
    metric: Arc<str>,
    kind: &'static str,
    labels: Vec<&'a str>,
    fields: &'static [&'static str],
    rows: Vec<Row<'a>>,
}

/// One series' row of a `Columns`.
struct Row<'a> {
    labels: Vec<Option<&'a str>>,
    point: Point,
}

impl Serialize for Row<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq as _;
        let mut seq = s.serialize_seq(Some(self.labels.len() + 4))?;
        for v in &self.labels {
            seq.serialize_element(v)?;
        }
        match self.point {
            Point::Counter { t, value, rate } => {
                seq.serialize_element(&t)?;
                seq.serialize_element(&value)?;
                seq.serialize_element(&rate)?;
            }
            Point::Gauge { t, mean, min, max } => {
                seq.serialize_element(&t)?;
                seq.serialize_element(&mean)?;
                seq.serialize_element(&min)?;
                seq.serialize_element(&max)?;
            }
        }
        seq.end()
    }
}

/// `found` grouped by metric and kind, in the columns format (by metric name, then kind).
fn columns(found: &[Found]) -> Vec<Columns<'_>> {
    let mut groups: BTreeMap<(Arc<str>, &'static str), Vec<&Found>> = BTreeMap::new();
    for f in found {
        groups
            .entry((f.metric.clone(), f.kind()))
            .or_default()
            .push(f);
    }
    groups
        .into_iter()
        .map(|((metric, kind), list)| {
            let names: BTreeSet<&str> = list
                .iter()
                .flat_map(|f| f.labels.iter().map(|(k, _)| k))
                .filter(|k| *k != "node")
                .collect();
            let labels: Vec<&str> = std::iter::once("node").chain(names).collect();
            let rows = list
                .iter()
                .map(|f| Row {
                    labels: labels.iter().map(|n| f.label(n)).collect(),
                    point: f.point,
                })
                .collect();
            let fields: &[&str] = if kind == "counter" {
                &["t", "value", "rate"]
            } else {
                &["t", "mean", "min", "max"]
            };
            Columns {
                metric,
                kind,
                labels,
                fields,
                rows,
            }
        })
        .collect()
}

/// `GET /api/v1/live/latest?metric=NAME[&metric=NAME...][&match=MATCHER...][&format=columns]`.
pub(crate) async fn handler(
    State(shared): State<Arc<Shared>>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let pairs = params(raw, &["metric", "match", "format"])?;
    let in_columns = match pairs.iter().rev().find(|(k, _)| k == "format") {
        None => false,
        Some((_, f)) if f == "series" => false,
        Some((_, f)) if f == "columns" => true,
        Some((_, f)) => {
            return Err(bad(format!(
                "parameter \"format\": {f:?} is neither \"series\" nor \"columns\""
            )));
        }
    };
    let metrics: Vec<String> = pairs
        .iter()
        .filter(|(k, v)| k == "metric" && !v.is_empty())
        .map(|(_, v)| v.clone())
        .collect();
    if metrics.is_empty() {
        return Err(bad(
            "parameter \"metric\" is required (a metric name; repeatable)",
        ));
    }
    if metrics.len() > MAX_METRICS {
        return Err(bad(format!(
            "parameter \"metric\": at most {MAX_METRICS} metrics at once"
        )));
    }
    let matchers = pairs
        .iter()
        .filter(|(k, _)| k == "match")
        .map(|(_, v)| Matcher::parse(v).map_err(|e| bad(format!("parameter \"match\": {e}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let body = tokio::task::spawn_blocking(move || {
        let wanted: HashSet<&str> = metrics.iter().map(String::as_str).collect();
        let found = latest(
            &shared.table,
            &wanted,
            &matchers,
            unix_ns(SystemTime::now()),
        );
        if in_columns {
            #[derive(Serialize)]
            struct Body<'a> {
                metrics: Vec<Columns<'a>>,
            }
            let metrics = columns(&found);
            serde_json::to_vec(&Body { metrics }).expect("an answer always serialises")
        } else {
            #[derive(Serialize)]
            struct Body {
                series: Vec<LatestSeries>,
            }
            let series = found.into_iter().map(LatestSeries::from).collect();
            serde_json::to_vec(&Body { series }).expect("an answer always serialises")
        }
    })
    .await
    .map_err(|e| bad(format!("latest values: {e}")))?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}
