//! The web dashboard: a page at `/` and its assets under `/ui/`, all compiled into the binary
//! (clusters are often air-gapped: the page fetches nothing but this collector's own API).
//! The page is plain JavaScript of our own (`monitor-collector/ui/`) on top of dygraphs, the
//! charting library `build.rs` takes from Debian's `libjs-dygraphs`; it reads the live view,
//! the query API and the findings and stragglers API, and polls them to stay current
//! (docs/http-api.md, "Dashboard").

use axum::{
    Router,
    http::{HeaderValue, header},
    response::IntoResponse,
    routing::get,
};

const INDEX_HTML: &str = include_str!("../ui/index.html");
const APP_JS: &str = include_str!("../ui/app.js");
const APP_CSS: &str = include_str!("../ui/app.css");
const ICON_SVG: &str = include_str!("../ui/icon.svg");
const DYGRAPH_JS: &str = include_str!(concat!(env!("OUT_DIR"), "/dygraph.min.js"));
const DYGRAPH_CSS: &str = include_str!(concat!(env!("OUT_DIR"), "/dygraph.min.css"));

/// Only this collector may be asked for anything: a stray reference to another host would
/// break on an air-gapped cluster, so the browser refuses it everywhere.
const CONTENT_SECURITY_POLICY: &str =
    "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'";

/// The dashboard's routes: `/` and `/ui/...`.
pub fn router() -> Router {
    Router::new()
        .route("/", get(|| asset(INDEX_HTML, "text/html; charset=utf-8")))
        .route(
            "/ui/app.js",
            get(|| asset(APP_JS, "text/javascript; charset=utf-8")),
        )
        .route(
            "/ui/app.css",
            get(|| asset(APP_CSS, "text/css; charset=utf-8")),
        )
        .route("/ui/icon.svg", get(|| asset(ICON_SVG, "image/svg+xml")))
        .route(
            "/ui/dygraph.min.js",
            get(|| asset(DYGRAPH_JS, "text/javascript; charset=utf-8")),
        )
        .route(
            "/ui/dygraph.min.css",
            get(|| asset(DYGRAPH_CSS, "text/css; charset=utf-8")),
        )
}

async fn asset(body: &'static str, content_type: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(CONTENT_SECURITY_POLICY),
            ),
            // The assets change only with the binary; a new collector must not be shown an
            // old page.
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        body,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_assets_this_collector_serves() {
        // Every script and stylesheet the page names is a route of `router`, by a path
        // relative to this collector (nothing fetched from elsewhere).
        for needed in [
            "/ui/icon.svg",
            "/ui/app.js",
            "/ui/app.css",
            "/ui/dygraph.min.js",
            "/ui/dygraph.min.css",
        ] {
            assert!(INDEX_HTML.contains(&format!("\"{needed}\"")), "{needed}");
        }
        assert!(!INDEX_HTML.contains("http://") && !INDEX_HTML.contains("https://"));
        assert!(DYGRAPH_JS.contains("Dygraph"), "dygraphs was embedded");
    }
}
