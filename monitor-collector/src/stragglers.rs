//! `GET /api/v1/stragglers`: the straggler search (`monitor_findings::stragglers`) over the
//! archive, the live table's recent steps and the findings for the likely causes.

use std::sync::Arc;

use axum::{
    Json,
    extract::{RawQuery, State},
    response::{IntoResponse, Response},
};
use monitor_archive::query::QueryEngine;
use monitor_findings::{
    FindingsStore,
    stragglers::{LiveSteps, StragglerSettings, find},
};
use serde_json::json;

use crate::{
    nodes::NodeTable,
    query::api::{ApiError, blocking, one, params, range},
};

/// Default window of `/api/v1/stragglers`: the last 5 minutes (from the 10 s step they begin
/// in).
const DEFAULT_WINDOW_NS: u64 = 300_000_000_000;

/// What `GET /api/v1/stragglers` reads: the archive, and the findings for the likely causes.
#[derive(Clone)]
pub(crate) struct ApiState {
    pub(crate) engine: Arc<QueryEngine>,
    pub(crate) findings: Option<Arc<FindingsStore>>,
    /// Which nodes a job's search may skip ([`NodeTable::ruled_out`]); without it (a query
    /// server on an archive alone) every node of the window is read.
    pub(crate) live: Option<Arc<NodeTable>>,
}

/// `GET /api/v1/stragglers?job_id=&start=&end=`.
pub(crate) async fn stragglers(
    State(state): State<ApiState>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let pairs = params(raw, &["job_id", "start", "end"])?;
    let job = one(&pairs, "job_id")?.map(str::to_owned);
    let mut pairs_with_default = pairs.clone();
    if one(&pairs, "start")?.is_none() {
        // The last 5 minutes, from the step they begin in: the window's steps are then the
        // epoch's, which the steps kept at ingest answer.
        let (_, end) = range(&pairs)?;
        let step = StragglerSettings::default().step_ns;
        let start = end.saturating_sub(DEFAULT_WINDOW_NS) / step * step;
        pairs_with_default.push(("start".into(), format!("{}", start / 1_000_000_000)));
    }
    let (start_ns, end_ns) = range(&pairs_with_default)?;
    let search = blocking(move || {
        find(
            &state.engine,
            state.findings.as_deref(),
            state.live.as_deref().map(|t| t as &dyn LiveSteps),
            job.as_deref(),
            start_ns,
            end_ns,
            &StragglerSettings::default(),
        )
    })
    .await?;
    Ok(Json(json!({ "jobs": search.jobs, "nodes_read": search.read })).into_response())
}

#[cfg(test)]
mod tests;
