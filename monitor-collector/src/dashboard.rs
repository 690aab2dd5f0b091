//! The web dashboard: a page at `/` and its assets under `/ui/`, all compiled into the binary
//! (clusters are often air-gapped: the page fetches nothing but this collector's own API).
//! The page is plain JavaScript of our own (`monitor-collector/ui/`) on top of dygraphs, the
//! charting library `build.rs` takes from Debian's `libjs-dygraphs`; it reads the live view,
//! the query API and the findings and stragglers API, and polls them to stay current
//! (docs/http-api.md, "Dashboard").

use axum::{
    http::{HeaderValue, header},
    response::IntoResponse,
};

pub(crate) const INDEX_HTML: &str = include_str!("../ui/index.html");
pub(crate) const APP_JS: &str = include_str!("../ui/app.js");
pub(crate) const APP_CSS: &str = include_str!("../ui/app.css");
pub(crate) const ICON_SVG: &str = include_str!("../ui/icon.svg");
pub(crate) const DYGRAPH_JS: &str = include_str!(concat!(env!("OUT_DIR"), "/dygraph.min.js"));
pub(crate) const DYGRAPH_CSS: &str = include_str!(concat!(env!("OUT_DIR"), "/dygraph.min.css"));

/// The metrics each view of the page reads (`ui/app.js`, which names them): the fleet and job
/// views colour GPUs by SM activity or utilization and ports by throughput against their line
/// rate; a node's view charts these. `railscope select` never drops them ([`crate::reads`]);
/// a test holds this list to the script.
pub const VIEWS: &[(&str, &[&str])] = &[
    (
        "fleet",
        &[
            "railscope_gpu_utilization_ratio",
            "railscope_gpu_sm_util_ratio",
            "railscope_ib_port_xmit_bytes_total",
            "railscope_ib_port_rcv_bytes_total",
            "railscope_ib_port_rate_gbps",
        ],
    ),
    (
        "job",
        &[
            "railscope_gpu_utilization_ratio",
            "railscope_gpu_sm_util_ratio",
            "railscope_ib_port_xmit_bytes_total",
            "railscope_ib_port_rcv_bytes_total",
            "railscope_ib_port_rate_gbps",
        ],
    ),
    (
        "node",
        &[
            "railscope_gpu_utilization_ratio",
            "railscope_gpu_sm_util_ratio",
            "railscope_gpu_power_watts",
            "railscope_gpu_temperature_celsius",
            "railscope_ib_port_xmit_bytes_total",
            "railscope_ib_port_rcv_bytes_total",
            // Charted instead where a port has no byte counters (soft-RoCE).
            "railscope_ib_port_xmit_packets_total",
            "railscope_ib_port_rcv_packets_total",
            "railscope_ib_sent_pkts_total",
            "railscope_ib_rcvd_pkts_total",
        ],
    ),
];

/// Only this collector may be asked for anything: a stray reference to another host would
/// break on an air-gapped cluster, so the browser refuses it everywhere.
const CONTENT_SECURITY_POLICY: &str =
    "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'";

/// Content types of the assets.
pub(crate) const HTML: &str = "text/html; charset=utf-8";
pub(crate) const JS: &str = "text/javascript; charset=utf-8";
pub(crate) const CSS: &str = "text/css; charset=utf-8";
pub(crate) const SVG: &str = "image/svg+xml";

/// One asset as served (its routes are in [`crate::routes`]).
pub(crate) async fn asset(body: &'static str, content_type: &'static str) -> impl IntoResponse {
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
        // Every script and stylesheet the page names is a route of the table (`crate::routes`), by a path
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

    #[test]
    fn the_views_declare_every_metric_the_script_names() {
        let named: std::collections::BTreeSet<&str> =
            regex::Regex::new(r#""(railscope_[a-z0-9_]+)""#)
                .unwrap()
                .captures_iter(APP_JS)
                .map(|c| c.get(1).unwrap().as_str())
                .collect();
        let declared: std::collections::BTreeSet<&str> = VIEWS
            .iter()
            .flat_map(|(_, metrics)| metrics.iter().copied())
            .collect();
        assert_eq!(named, declared);
    }
}
