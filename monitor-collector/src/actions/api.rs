//! `GET /api/v1/actions` (read role): the settings in effect, the brake, each node railscope
//! acts on and the latest audit records; `POST /api/v1/actions/release` (admin role): the
//! drains the brake holds go ahead; `GET /api/v1/actions/finding?id=ID` (read role): a
//! finding and every action about it, for `railscope actions show` (docs/http-api.md,
//! docs/actions.md).

use std::sync::Arc;

use axum::{
    Json,
    extract::{RawQuery, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde_json::json;

use crate::{
    nodes::NodeTable,
    query::api::{ApiError, bad, one, params},
};
use monitor_actions::{Actions, audit};
use monitor_archive::clock::unix_now_ns;
use monitor_findings::FindingsStore;

#[derive(Clone)]
pub(crate) struct ApiState {
    pub actions: Arc<Actions>,
    pub table: Arc<NodeTable>,
    pub findings: Option<Arc<FindingsStore>>,
}

/// `GET /api/v1/actions`.
pub(crate) async fn actions(State(s): State<ApiState>) -> Json<serde_json::Value> {
    Json(s.actions.view(s.table.node_count(), unix_now_ns()))
}

/// `POST /api/v1/actions/release`.
pub(crate) async fn release(State(s): State<ApiState>) -> Json<serde_json::Value> {
    let actions = s.actions.clone();
    // The audit log's fsync is blocking I/O.
    let released = tokio::task::spawn_blocking(move || actions.release(unix_now_ns()))
        .await
        .unwrap_or_default();
    Json(json!({ "released": released }))
}

/// `GET /api/v1/actions/finding?id=ID`: `id` a finding's id or an audit record's `seq`.
pub(crate) async fn finding(
    State(s): State<ApiState>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let pairs = params(raw, &["id"])?;
    let id = one(&pairs, "id")?
        .filter(|i| !i.is_empty())
        .ok_or_else(|| bad("parameter \"id\" is required (a finding's id or a record's seq)"))?
        .to_owned();
    let actions = s.actions.clone();
    // The whole audit log is read from disk.
    let records = tokio::task::spawn_blocking(move || actions.records())
        .await
        .unwrap_or_default();
    let about = audit::about(&records, &id);
    let finding = about
        .as_ref()
        .and_then(|(f, _)| f.as_deref())
        .and_then(|f| s.findings.as_ref()?.get(f));
    match about {
        Some((finding_id, records)) if finding.is_some() || !records.is_empty() => Ok(Json(
            json!({ "id": id, "finding_id": finding_id, "finding": finding, "records": records }),
        )
        .into_response()),
        _ => Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("no finding nor audit record has the id {id:?}"),
        )),
    }
}
