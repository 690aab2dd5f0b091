//! `GET /api/v1/nodes/{node}/hardware` (docs/http-api.md): a node's hardware path from its
//! latest series ([`monitor_findings::hardware`]), its class and what the class's majority has
//! ([`monitor_findings::profile`]), and the distance between each GPU and each RDMA device, the node's
//! and the class's.

use std::sync::Arc;

use axum::{
    Json,
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde_json::json;

use crate::{query::api::ApiError, shared::Shared};
use monitor_findings::hardware::HardwareReader;

/// `GET /api/v1/nodes/{node}/hardware`.
pub(crate) async fn node_hardware(
    State(shared): State<Arc<Shared>>,
    Path(node): Path<String>,
) -> Result<Response, ApiError> {
    let mut reader = HardwareReader::default();
    let known = shared
        .table
        .visit_node_latest(&node, &mut |series, latest| reader.take(series, latest));
    if !known {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("unknown node {node:?}: no agent of that name sends to this collector"),
        ));
    }
    let hw = reader.finish();
    let profile = shared.profile.as_ref().map(|board| board.latest());
    let class = profile.as_ref().and_then(|p| p.class_of(&node));
    let distances = hw.distances();
    let class_distances: Option<Vec<Vec<Option<&str>>>> = class.map(|(_, p)| {
        (0..hw.gpus.len())
            .map(|g| {
                (0..hw.rdma.len())
                    .map(|n| p.distances.get(&(g, n)).map(|m| m.value.as_str()))
                    .collect()
            })
            .collect()
    });
    Ok(Json(json!({
        "node": node,
        "seen": hw.seen_ns,
        "info": hw.info,
        "class": hw.class(),
        "counts": hw.counts,
        "class_profile": class.map(|(_, p)| p),
        "gpus": hw.gpus,
        "rdma": hw.rdma,
        "distances": {
            "gpus": hw.gpus.iter().map(|g| &g.gpu).collect::<Vec<_>>(),
            "nics": hw.rdma.iter().map(|r| &r.device).collect::<Vec<_>>(),
            "node": distances.iter().map(|row| row.iter().map(|d| d.as_str()).collect::<Vec<_>>()).collect::<Vec<_>>(),
            "class": class_distances,
        },
    }))
    .into_response())
}
