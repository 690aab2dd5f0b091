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

use std::{collections::HashSet, sync::Arc, time::SystemTime};

use axum::{
    extract::{RawQuery, State},
    http::header,
    response::{IntoResponse, Response},
};
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

/// One series' latest point.
#[derive(Serialize)]
struct LatestSeries {
    metric: Arc<str>,
    labels: serde_json::Map<String, serde_json::Value>,
    kind: &'static str,
    points: [Point; 1],
}

#[derive(Serialize)]
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
) -> Vec<LatestSeries> {
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
        let mut labels = serde_json::Map::new();
        labels.insert("node".into(), node.to_string().into());
        for (k, v) in series.labels.iter() {
            labels.insert(k.to_string(), v.to_string().into());
        }
        let t = latest.unix_ns as f64 / 1e9;
        let (kind, point) = match latest.value {
            LatestValue::Counter { value, per_second } => (
                "counter",
                Point::Counter {
                    t,
                    value,
                    rate: per_second,
                },
            ),
            LatestValue::Gauge { min, max, mean } => ("gauge", Point::Gauge { t, mean, min, max }),
        };
        out.push(LatestSeries {
            metric: series.name.clone(),
            labels,
            kind,
            points: [point],
        });
    });
    out
}

/// `GET /api/v1/live/latest?metric=NAME[&metric=NAME...][&match=MATCHER...]`.
pub(crate) async fn handler(
    State(shared): State<Arc<Shared>>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let pairs = params(raw, &["metric", "match"])?;
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
        let series = latest(
            &shared.table,
            &wanted,
            &matchers,
            unix_ns(SystemTime::now()),
        );
        #[derive(Serialize)]
        struct Body {
            series: Vec<LatestSeries>,
        }
        serde_json::to_vec(&Body { series }).expect("an answer always serialises")
    })
    .await
    .map_err(|e| bad(format!("latest values: {e}")))?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}
