//! The collector's HTTP server (axum on a small tokio runtime of its own thread), serving the
//! route table of [`crate::routes`]; and the handlers of what lives in memory: `/metrics`
//! (and `/metrics/collector`, the collector's own health alone) and the live view
//! (`/api/v1/live/nodes`, `/api/v1/live/events`).

use std::{net::TcpListener, sync::Arc};

use axum::{
    Json, Router,
    extract::{Query, RawQuery, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use tokio::sync::watch;

use crate::{
    events::EventFilter,
    metrics,
    nodes::NodeSet,
    query::api::ApiError,
    scrape_targets,
    shared::Shared,
    web::{WebAuth, auth, tls::TlsListener},
};
use monitor_archive::{
    clock::unix_now_ns,
    liveness::{BEAT_EVERY, Heartbeat},
};

/// `GET /metrics[?node=NAME | ?shard=K&shards=N]`: every node's series and health with the
/// fleet-level families, or only one node's or one shard's (see [`scrape_targets`]).
pub(crate) async fn metrics_page(
    State(shared): State<Arc<Shared>>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let set = scrape_targets::node_set(raw)?;
    let asked = set.clone();
    // Rendering walks the nodes: off the async threads.
    let body = tokio::task::spawn_blocking(move || match set {
        NodeSet::All => Some(metrics::render(&shared, unix_now_ns())),
        set => metrics::render_nodes(&shared, &set, unix_now_ns()),
    })
    .await
    .map_err(|e| {
        ApiError(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("rendering /metrics failed: {e}"),
        )
    })?;
    let Some(body) = body else {
        let node = match asked {
            NodeSet::One(node) => node,
            _ => String::new(),
        };
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("no node {node:?} is held (parameter \"node\")"),
        ));
    };
    Ok(text_format(body))
}

/// `GET /metrics/fleet`.
pub(crate) async fn fleet_metrics_page(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    let body = tokio::task::spawn_blocking(move || metrics::render_fleet(&shared))
        .await
        .unwrap_or_default();
    text_format(body)
}

/// An answer in Prometheus' text format.
fn text_format(body: String) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

/// `GET /metrics/collector`.
pub(crate) async fn own_metrics_page(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    let body = tokio::task::spawn_blocking(move || metrics::render_own(&shared))
        .await
        .unwrap_or_default();
    text_format(body)
}

/// `GET /api/v1/live/nodes`.
pub(crate) async fn live_nodes(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    Json(shared.table.summaries())
}

/// `GET /api/v1/live/events`.
pub(crate) async fn live_events(
    State(shared): State<Arc<Shared>>,
    Query(filter): Query<EventFilter>,
) -> impl IntoResponse {
    Json(shared.events.matching(&filter))
}

/// Serves `router` on `listener` from a thread of its own until `stop` turns true, every
/// request authenticated by `web` (and over TLS when its config has `tls_server_config`). A
/// task on the server's runtime beats `heartbeat` every [`BEAT_EVERY`]: a runtime whose
/// worker hangs (a handler blocking it) stops beating, and the watchdog sees it.
pub(crate) fn spawn(
    listener: TcpListener,
    router: Router,
    web: Arc<WebAuth>,
    mut stop: watch::Receiver<bool>,
    heartbeat: Heartbeat,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    listener.set_nonblocking(true)?;
    let router = router.layer(axum::middleware::from_fn_with_state(
        web.clone(),
        auth::authenticate,
    ));
    std::thread::Builder::new()
        .name("http".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!("HTTP server not started: {e}");
                    return;
                }
            };
            runtime.spawn(async move {
                let mut every = tokio::time::interval(BEAT_EVERY);
                loop {
                    every.tick().await;
                    heartbeat.beat();
                }
            });
            runtime.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::error!("HTTP server not started: {e}");
                        return;
                    }
                };
                let shutdown = async move {
                    let _ = stop.wait_for(|stopped| *stopped).await;
                };
                let served = if web.serves_tls() {
                    match TlsListener::new(listener, web) {
                        Ok(listener) => {
                            axum::serve(listener, router)
                                .with_graceful_shutdown(shutdown)
                                .await
                        }
                        Err(e) => Err(e),
                    }
                } else {
                    axum::serve(listener, router)
                        .with_graceful_shutdown(shutdown)
                        .await
                };
                if let Err(e) = served {
                    tracing::error!("HTTP server stopped: {e}");
                }
            });
        })
}
