//! The HTTP JSON API of the query engine (docs/http-api.md): the handlers of
//! `/api/v1/series`, `/events`, `/nodes`, `/metric-names` and `/export` (routed in
//! [`crate::routes`]). Queries run on tokio's blocking pool (they read files).

use std::{sync::Arc, time::SystemTime};

use axum::{
    Json,
    extract::{RawQuery, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use serde::Serialize;
use serde_json::json;

use monitor_client::time::{parse_time, unix_ns};

use monitor_archive::query::{
    engine::{EventQuery, QueryCost, QueryEngine, QueryError, SeriesAnswer, SeriesQuery},
    export::export_capture,
    selector::Matcher,
};

/// Default range of a query without `start`: the hour before `end`.
const DEFAULT_RANGE_NS: u64 = 3_600_000_000_000;

/// A refused request: 400 with the reason, naming the parameter.
pub(crate) struct ApiError(pub(crate) StatusCode, pub(crate) String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

pub(crate) fn bad(msg: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, msg.into())
}

impl From<QueryError> for ApiError {
    fn from(e: QueryError) -> Self {
        match e {
            QueryError::Range { .. } | QueryError::TooManyPoints { .. } => bad(e.to_string()),
            QueryError::Archive(_) => ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        }
    }
}

/// The query string's parameters, in order; only `allowed` names are accepted.
pub(crate) fn params(
    raw: Option<String>,
    allowed: &[&str],
) -> Result<Vec<(String, String)>, ApiError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(raw.as_deref().unwrap_or(""))
        .map_err(|e| bad(format!("query string: {e}")))?;
    if let Some((name, _)) = pairs.iter().find(|(k, _)| !allowed.contains(&k.as_str())) {
        return Err(bad(format!(
            "unknown parameter {name:?} (accepted: {})",
            allowed.join(", ")
        )));
    }
    Ok(pairs)
}

pub(crate) fn one<'a>(
    pairs: &'a [(String, String)],
    name: &str,
) -> Result<Option<&'a str>, ApiError> {
    let mut values = pairs
        .iter()
        .filter(|(k, _)| k == name)
        .map(|(_, v)| v.as_str());
    let first = values.next();
    if values.next().is_some() {
        return Err(bad(format!("parameter {name:?} given more than once")));
    }
    Ok(first)
}

/// `start` and `end` (default: the hour before now).
pub(crate) fn range(pairs: &[(String, String)]) -> Result<(u64, u64), ApiError> {
    let now = unix_ns(SystemTime::now());
    let time = |name: &str| -> Result<Option<u64>, ApiError> {
        one(pairs, name)?
            .map(|t| parse_time(t, now).map_err(|e| bad(format!("parameter {name:?}: {e}"))))
            .transpose()
    };
    let end = time("end")?.unwrap_or(now);
    let start = time("start")?.unwrap_or(end.saturating_sub(DEFAULT_RANGE_NS));
    if start > end {
        return Err(bad(format!("start ({start} ns) is after end ({end} ns)")));
    }
    Ok((start, end))
}

pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, QueryError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| {
            ApiError(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("query failed: {e}"),
            )
        })?
        .map_err(ApiError::from)
}

pub(crate) async fn series(
    State(engine): State<Arc<QueryEngine>>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let pairs = params(raw, &["metric", "match", "start", "end"])?;
    let metric = one(&pairs, "metric")?
        .filter(|m| !m.is_empty())
        .ok_or_else(|| bad("parameter \"metric\" is required (a metric name)"))?
        .to_owned();
    let matchers = pairs
        .iter()
        .filter(|(k, _)| k == "match")
        .map(|(_, v)| Matcher::parse(v).map_err(|e| bad(format!("parameter \"match\": {e}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let (start_ns, end_ns) = range(&pairs)?;
    let q = SeriesQuery {
        metric,
        matchers,
        start_ns,
        end_ns,
    };
    let body = blocking(move || {
        let (answers, cost) = engine.series(&q)?;
        let body = series_body(&answers, &cost);
        drop(answers);
        release_freed_memory();
        Ok(body)
    })
    .await?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// The JSON of a series answer, written straight from the answer (no intermediate JSON
/// tree: a point costs its text, about 100 B, and no more).
pub fn series_body(answers: &[SeriesAnswer], cost: &QueryCost) -> Vec<u8> {
    #[derive(Serialize)]
    struct Body<'a> {
        series: &'a [SeriesAnswer],
        cost: &'a QueryCost,
    }
    serde_json::to_vec(&Body {
        series: answers,
        cost,
    })
    .expect("an answer always serialises")
}

/// Hands the memory a large answer used back to the system: glibc keeps freed heap pages
/// of its per-thread arenas otherwise, and the query threads' RSS would stay at the
/// largest answer's.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages of the allocator's own heaps.
    unsafe {
        libc::malloc_trim(0);
    }
}

pub(crate) async fn events(
    State(engine): State<Arc<QueryEngine>>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let pairs = params(raw, &["kind", "node", "device", "start", "end"])?;
    let text =
        |name| -> Result<Option<String>, ApiError> { Ok(one(&pairs, name)?.map(str::to_owned)) };
    let (start_ns, end_ns) = range(&pairs)?;
    let q = EventQuery {
        kind: text("kind")?,
        node: text("node")?,
        device: text("device")?,
        start_ns,
        end_ns,
    };
    let (answers, cost) = blocking(move || engine.events(&q)).await?;
    Ok(Json(json!({ "events": answers, "cost": cost })).into_response())
}

pub(crate) async fn nodes(
    State(engine): State<Arc<QueryEngine>>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let pairs = params(raw, &["start", "end"])?;
    let (start_ns, end_ns) = range(&pairs)?;
    let nodes = blocking(move || engine.nodes(start_ns, end_ns)).await?;
    Ok(Json(json!({ "nodes": nodes })).into_response())
}

/// The metric names with series in the range (`match` on `node` chooses the nodes read).
pub(crate) async fn metric_names(
    State(engine): State<Arc<QueryEngine>>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let pairs = params(raw, &["match", "start", "end"])?;
    let matchers = pairs
        .iter()
        .filter(|(k, _)| k == "match")
        .map(|(_, v)| Matcher::parse(v).map_err(|e| bad(format!("parameter \"match\": {e}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let (start_ns, end_ns) = range(&pairs)?;
    let (names, cost) = blocking(move || engine.metric_names(&matchers, start_ns, end_ns)).await?;
    let metrics: Vec<_> = names
        .into_iter()
        .map(|(name, kind)| {
            let kind = match kind {
                monitor_wire::Kind::Counter => "counter",
                monitor_wire::Kind::Gauge => "gauge",
            };
            json!({ "name": name, "kind": kind })
        })
        .collect();
    Ok(Json(json!({ "metrics": metrics, "cost": cost })).into_response())
}

/// A node's frames over the range as a capture file (docs/capture-format.md).
pub(crate) async fn export(
    State(engine): State<Arc<QueryEngine>>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let pairs = params(raw, &["node", "start", "end"])?;
    let node = one(&pairs, "node")?
        .filter(|n| !n.is_empty())
        .ok_or_else(|| bad("parameter \"node\" is required (a node name)"))?
        .to_owned();
    let (start_ns, end_ns) = range(&pairs)?;
    let (bytes, stats) = blocking(move || export_capture(&engine, &node, start_ns, end_ns)).await?;
    if stats.skipped > 0 {
        tracing::warn!(
            "export: {} frames too large for a capture record were left out",
            stats.skipped
        );
    }
    if stats.unplaced > 0 {
        tracing::warn!(
            "export: {} samples of series ids that no schema entry of their node's session \
             defines were left out",
            stats.unplaced
        );
    }
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/octet-stream")],
        bytes,
    )
        .into_response())
}
