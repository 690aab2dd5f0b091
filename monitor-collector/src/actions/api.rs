//! `GET /api/v1/actions` (read role): the settings in effect, the brake, each node railscope
//! acts on and the latest audit records; `POST /api/v1/actions/release` (admin role): the
//! drains the brake holds go ahead (docs/http-api.md, docs/actions.md).

use std::sync::Arc;

use axum::{Json, extract::State};
use serde_json::json;

use super::Actions;
use crate::{clock::unix_now_ns, nodes::NodeTable};

#[derive(Clone)]
pub struct ApiState {
    pub actions: Arc<Actions>,
    pub table: Arc<NodeTable>,
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
