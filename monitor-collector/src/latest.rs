//! `GET /api/v1/live/latest`: the latest value of chosen metrics across the fleet, from the
//! live table in memory: what a fleet view or a heat map colours its cells by.
//!
//! Why not the archive: the latest value of 8,000 series asked of `/api/v1/series` over a
//! minute decodes every block of every node's segments in that minute (seconds at 1,000
//! nodes), to keep one point of each. The live table holds that point already, and for a
//! counter its rate from the sample before (`LatestValue::Counter`). One visit of
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
//!
//! `format=compact` is what the fleet's heat map reads every 5 s: each label value once in a
//! dictionary for the whole answer, each series as indexes into it, and one number per
//! series (a counter's rate, a gauge's mean, as f32): no time, no envelope, no object or row
//! per series; `label=` keeps it to the labels a view tells series apart by. 12,500 nodes'
//! GPUs and ports (500,000 series) are 9.4 MB so, against 35.7 MB as columns, and a browser
//! parses arrays of small numbers far faster than rows of strings.

use std::{
    collections::{BTreeMap, BTreeSet},
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

use monitor_client::time::unix_ns;

use monitor_findings::live_table::LatestValue;

use crate::{
    nodes::NodeTable,
    query::api::{ApiError, bad, params},
    shared::Shared,
};
use monitor_archive::query::selector::Matcher;

/// Dictionaries and node positions: foldhash rather than SipHash (a compact answer of a
/// 12,500-node fleet looks up 1.5 million label values).
type HashMap<K, V> = foldhash::HashMap<K, V>;

/// Asked for the series of at most this many metrics at once.
const MAX_METRICS: usize = 32;

/// One series' latest point, as found in the live table.
struct Found {
    metric: Arc<str>,
    /// The metric's place among those asked for.
    asked: usize,
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
/// every matcher, each node's series together (as the table holds them).
fn latest(table: &NodeTable, metrics: &[&str], matchers: &[Matcher], now_ns: u64) -> Vec<Found> {
    let oldest = now_ns.saturating_sub(table.live_ttl_ns());
    let mut out = Vec::new();
    // The node's matchers are asked once a node, before any of its series.
    let (of_node, of_series): (Vec<&Matcher>, Vec<&Matcher>) =
        matchers.iter().partition(|m| m.label == "node");
    let wants = |node: &str| of_node.iter().all(|m| m.matches(Some(node)));
    table.visit_latest(&wants, &mut |node, series, latest| {
        if latest.unix_ns < oldest {
            return;
        }
        // A few names compared (most differ in length) beat hashing every series' name.
        let Some(asked) = metrics.iter().position(|m| *m == &*series.name) else {
            return;
        };
        if !of_series
            .iter()
            .all(|m| m.matches(series.labels.get(&m.label)))
        {
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
            asked,
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

/// The values of one label (`node` included) across a compact answer, each once, and the
/// index of each in that list.
#[derive(Default)]
struct Dictionary<'a> {
    values: Vec<&'a str>,
    index: HashMap<&'a str, u32>,
}

impl<'a> Dictionary<'a> {
    fn index_of(&mut self, value: &'a str) -> u32 {
        *self.index.entry(value).or_insert_with(|| {
            self.values.push(value);
            (self.values.len() - 1) as u32
        })
    }
}

/// The series of one metric and kind in the compact format: per label (`node` first), each
/// series' index into the answer's dictionary of that label (null where a series has no
/// such label), and each series' value.
#[derive(Serialize)]
struct CompactMetric<'a> {
    metric: Arc<str>,
    kind: &'static str,
    labels: BTreeMap<&'a str, Vec<Option<u32>>>,
    values: Vec<Option<f32>>,
}

/// The compact answer: the label values once (`dictionary`), the series as indexes into it.
#[derive(Serialize)]
struct Compact<'a> {
    dictionary: BTreeMap<&'a str, Vec<&'a str>>,
    metrics: Vec<CompactMetric<'a>>,
}

/// `found` (of `asked` metrics) in the compact format: nodes in the dictionary by name, each
/// metric's series by node (then as the node holds them), by metric name and kind; of the
/// labels `only` where given (`node` always).
fn compact<'a>(found: &'a [Found], asked: usize, only: &[String]) -> Compact<'a> {
    // Nodes by first sight (a node's series come together), then by name.
    let mut seen: Vec<&str> = Vec::new();
    let mut seen_at: HashMap<*const u8, u32> = HashMap::default();
    let mut node_of: Vec<u32> = Vec::with_capacity(found.len());
    let mut last: Option<(*const u8, u32)> = None;
    for f in found {
        let ptr = f.node.as_ptr();
        let at = match last {
            Some((p, at)) if p == ptr => at,
            _ => *seen_at.entry(ptr).or_insert_with(|| {
                seen.push(&f.node);
                (seen.len() - 1) as u32
            }),
        };
        last = Some((ptr, at));
        node_of.push(at);
    }
    let mut by_name: Vec<u32> = (0..seen.len() as u32).collect();
    by_name.sort_unstable_by_key(|&i| seen[i as usize]);
    let mut rank = vec![0u32; seen.len()];
    for (r, &i) in by_name.iter().enumerate() {
        rank[i as usize] = r as u32;
    }
    let names: Vec<&str> = by_name.iter().map(|&i| seen[i as usize]).collect();

    // Each series' labels as (dictionary, index) pairs, in the order the table gave them:
    // reading the series where they lie, not hopping through them by node name.
    let wanted = |name: &str| name != "node" && (only.is_empty() || only.iter().any(|o| o == name));
    let mut dictionaries: Vec<(&str, Dictionary<'_>)> = Vec::new();
    let mut pairs: Vec<(u32, u32)> = Vec::with_capacity(found.len() * 2);
    let mut pairs_of: Vec<u32> = Vec::with_capacity(found.len() + 1);
    pairs_of.push(0);
    for f in found {
        for (name, value) in f.labels.iter().filter(|(name, _)| wanted(name)) {
            let d = match dictionaries.iter().position(|(n, _)| *n == name) {
                Some(d) => d,
                None => {
                    dictionaries.push((name, Dictionary::default()));
                    dictionaries.len() - 1
                }
            };
            pairs.push((d as u32, dictionaries[d].1.index_of(value)));
        }
        pairs_of.push(pairs.len() as u32);
    }

    // Series by metric asked and kind, each as (its node's rank, its place in `found`).
    let mut groups: Vec<Vec<(u32, u32)>> = vec![Vec::new(); asked * 2];
    for (i, (f, at)) in found.iter().zip(node_of).enumerate() {
        let kind = usize::from(matches!(f.point, Point::Gauge { .. }));
        groups[f.asked * 2 + kind].push((rank[at as usize], i as u32));
    }
    let mut metrics: Vec<CompactMetric<'_>> = groups
        .into_iter()
        .filter(|list| !list.is_empty())
        .map(|mut list| {
            list.sort_by_key(|(rank, _)| *rank);
            let mut columns: Vec<Option<Vec<Option<u32>>>> = vec![None; dictionaries.len()];
            for (at, (_, i)) in list.iter().enumerate() {
                let i = *i as usize;
                for &(d, v) in &pairs[pairs_of[i] as usize..pairs_of[i + 1] as usize] {
                    columns[d as usize].get_or_insert_with(|| vec![None; list.len()])[at] = Some(v);
                }
            }
            let mut labels: BTreeMap<&str, Vec<Option<u32>>> = columns
                .into_iter()
                .zip(&dictionaries)
                .filter_map(|(column, (name, _))| Some((*name, column?)))
                .collect();
            labels.insert("node", list.iter().map(|(rank, _)| Some(*rank)).collect());
            let values = list
                .iter()
                .map(|(_, i)| match found[*i as usize].point {
                    Point::Counter { rate, .. } => rate,
                    Point::Gauge { mean, .. } => Some(mean as f32),
                })
                .collect();
            let f = &found[list[0].1 as usize];
            CompactMetric {
                metric: f.metric.clone(),
                kind: f.kind(),
                labels,
                values,
            }
        })
        .collect();
    metrics.sort_by(|a, b| a.metric.cmp(&b.metric).then(a.kind.cmp(b.kind)));
    let mut dictionary: BTreeMap<&str, Vec<&str>> = dictionaries
        .into_iter()
        .map(|(name, d)| (name, d.values))
        .collect();
    dictionary.insert("node", names);
    Compact {
        dictionary,
        metrics,
    }
}

/// The shapes of a `/api/v1/live/latest` answer (`format=`).
#[derive(Clone, Copy)]
enum Format {
    Series,
    Columns,
    Compact,
}

/// `GET /api/v1/live/latest?metric=NAME[&metric=NAME...][&match=MATCHER...][&format=series|columns|compact][&label=NAME...]`.
pub(crate) async fn handler(
    State(shared): State<Arc<Shared>>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let pairs = params(raw, &["metric", "match", "format", "label"])?;
    let format = match pairs.iter().rev().find(|(k, _)| k == "format") {
        None => Format::Series,
        Some((_, f)) if f == "series" => Format::Series,
        Some((_, f)) if f == "columns" => Format::Columns,
        Some((_, f)) if f == "compact" => Format::Compact,
        Some((_, f)) => {
            return Err(bad(format!(
                "parameter \"format\": {f:?} is not \"series\", \"columns\" or \"compact\""
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
    // The labels a compact answer carries (`node` always): a fleet view needs `gpu`, not
    // each GPU's `uuid` (100,000 distinct values in a 12,500-node fleet).
    let only: Vec<String> = pairs
        .iter()
        .filter(|(k, _)| k == "label")
        .map(|(_, v)| v.clone())
        .collect();
    if !only.is_empty() && !matches!(format, Format::Compact) {
        return Err(bad(
            "parameter \"label\" is for format=compact only (the other formats carry every label)",
        ));
    }
    let matchers = pairs
        .iter()
        .filter(|(k, _)| k == "match")
        .map(|(_, v)| Matcher::parse(v).map_err(|e| bad(format!("parameter \"match\": {e}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let body = tokio::task::spawn_blocking(move || {
        let wanted: Vec<&str> = metrics.iter().map(String::as_str).collect();
        let found = latest(
            &shared.table,
            &wanted,
            &matchers,
            unix_ns(SystemTime::now()),
        );
        match format {
            Format::Columns => {
                #[derive(Serialize)]
                struct Body<'a> {
                    metrics: Vec<Columns<'a>>,
                }
                let metrics = columns(&found);
                serde_json::to_vec(&Body { metrics }).expect("an answer always serialises")
            }
            Format::Compact => serde_json::to_vec(&compact(&found, metrics.len(), &only))
                .expect("an answer always serialises"),
            Format::Series => {
                #[derive(Serialize)]
                struct Body {
                    series: Vec<LatestSeries>,
                }
                let series = found.into_iter().map(LatestSeries::from).collect();
                serde_json::to_vec(&Body { series }).expect("an answer always serialises")
            }
        }
    })
    .await
    .map_err(|e| bad(format!("latest values: {e}")))?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}
