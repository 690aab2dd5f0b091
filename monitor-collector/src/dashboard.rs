//! The web dashboard: a page at `/` and its assets under `/ui/`, all compiled into the binary
//! (clusters are often air-gapped: the page fetches nothing but this collector's own API).
//! The page is plain JavaScript of our own (`monitor-collector/ui/`) on top of dygraphs, the
//! charting library `build.rs` takes from Debian's `libjs-dygraphs`; it reads the live view,
//! the query API and the findings and stragglers API, and polls them to stay current
//! (docs/http-api.md, "Dashboard").

use std::sync::LazyLock;

use axum::{
    http::{HeaderValue, header},
    response::IntoResponse,
};
use monitor_wire::names::{event_kind, metric};

pub(crate) const INDEX_HTML: &str = include_str!("../ui/index.html");
pub(crate) const APP_JS: &str = include_str!("../ui/app.js");
pub(crate) const APP_CSS: &str = include_str!("../ui/app.css");
pub(crate) const ICON_SVG: &str = include_str!("../ui/icon.svg");
pub(crate) const DYGRAPH_JS: &str = include_str!(concat!(env!("OUT_DIR"), "/dygraph.min.js"));
pub(crate) const DYGRAPH_CSS: &str = include_str!(concat!(env!("OUT_DIR"), "/dygraph.min.css"));

/// The metrics each view of the page reads (`ui/app.js`, which names them by their
/// [`metric`] constant, from [`NAMES_JS`]): the fleet and job views colour GPUs by SM activity
/// or utilization and ports by throughput against their line rate; a node's view charts
/// these. `railscope select` never drops them ([`crate::reads`]); a test holds this list to
/// the script.
pub(crate) const VIEWS: &[(&str, &[&str])] = &[
    (
        "fleet",
        &[
            metric::GPU_UTILIZATION_RATIO,
            metric::GPU_SM_UTIL_RATIO,
            metric::IB_PORT_XMIT_BYTES_TOTAL,
            metric::IB_PORT_RCV_BYTES_TOTAL,
            metric::IB_PORT_RATE_GBPS,
        ],
    ),
    (
        "job",
        &[
            metric::GPU_UTILIZATION_RATIO,
            metric::GPU_SM_UTIL_RATIO,
            metric::IB_PORT_XMIT_BYTES_TOTAL,
            metric::IB_PORT_RCV_BYTES_TOTAL,
            metric::IB_PORT_RATE_GBPS,
        ],
    ),
    (
        "node",
        &[
            metric::GPU_UTILIZATION_RATIO,
            metric::GPU_SM_UTIL_RATIO,
            metric::GPU_POWER_WATTS,
            metric::GPU_TEMPERATURE_CELSIUS,
            metric::IB_PORT_XMIT_BYTES_TOTAL,
            metric::IB_PORT_RCV_BYTES_TOTAL,
            // Charted instead where a port has no byte counters (soft-RoCE).
            metric::IB_PORT_XMIT_PACKETS_TOTAL,
            metric::IB_PORT_RCV_PACKETS_TOTAL,
            metric::IB_SENT_PKTS_TOTAL,
            metric::IB_RCVD_PKTS_TOTAL,
        ],
    ),
];

/// `/ui/names.js`: the metric names and event kinds of [`monitor_wire::names`] for the page,
/// as `window.RAILSCOPE_NAMES = {metric: {CONSTANT: "name", ...}, event_kind: {...}}`; the
/// script names each by its constant and holds no copy of its own.
pub(crate) static NAMES_JS: LazyLock<String> = LazyLock::new(|| {
    let object = |names: &[(&str, &str)]| {
        serde_json::Value::Object(
            names
                .iter()
                .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
                .collect(),
        )
    };
    let names = serde_json::json!({
        "metric": object(metric::ALL),
        "event_kind": object(event_kind::ALL),
    });
    format!(
        "// The names the agent sends (monitor_wire::names), served by the collector.\n\
         \"use strict\";\nwindow.RAILSCOPE_NAMES = {names};\n"
    )
});

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
            "/ui/names.js",
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
        use std::collections::BTreeSet;
        // The script names metrics and event kinds only through `/ui/names.js`.
        assert!(
            !APP_JS.contains("\"railscope_"),
            "a metric name copied into app.js"
        );
        assert!(
            !regex::Regex::new(r#"\be\.kind [!=]== "[a-z_]+""#)
                .unwrap()
                .is_match(APP_JS),
            "an event kind copied into app.js"
        );
        for kind in monitor_wire::names::EVENT_KINDS {
            // A finding rule may share an event kind's name (`gpu_lost`): only that.
            let quoted = format!("\"{kind}\"");
            let as_rule = format!(".rule === {quoted}");
            assert_eq!(
                APP_JS.matches(&quoted).count(),
                APP_JS.matches(&as_rule).count(),
                "event kind {kind} copied into app.js"
            );
        }
        let constants = |object: &str| -> BTreeSet<String> {
            regex::Regex::new(&format!(r"\b{object}\.([A-Z0-9_]+)"))
                .unwrap()
                .captures_iter(APP_JS)
                .map(|c| c[1].to_owned())
                .collect()
        };
        let lookup = |all: &[(&'static str, &'static str)], konst: &str| {
            all.iter()
                .find(|(k, _)| *k == konst)
                .map(|(_, v)| *v)
                .unwrap_or_else(|| panic!("app.js names {konst}, which names.js lacks"))
        };
        let named: BTreeSet<&str> = constants("METRIC")
            .iter()
            .map(|k| lookup(metric::ALL, k))
            .collect();
        for k in constants("EVENT") {
            lookup(event_kind::ALL, &k);
        }
        let declared: BTreeSet<&str> = VIEWS
            .iter()
            .flat_map(|(_, metrics)| metrics.iter().copied())
            .collect();
        assert_eq!(named, declared);
    }

    #[test]
    fn names_js_holds_every_name_the_agent_sends() {
        let body = NAMES_JS
            .strip_prefix("// The names the agent sends (monitor_wire::names), served by the collector.\n\"use strict\";\nwindow.RAILSCOPE_NAMES = ")
            .and_then(|b| b.strip_suffix(";\n"))
            .expect("names.js as built");
        let names: serde_json::Value = serde_json::from_str(body).unwrap();
        for (k, v) in metric::ALL {
            assert_eq!(names["metric"][k], *v);
        }
        for (k, v) in event_kind::ALL {
            assert_eq!(names["event_kind"][k], *v);
        }
        assert_eq!(
            names["metric"]["IB_PORT_RATE_GBPS"],
            "railscope_ib_port_rate_gbps"
        );
        assert_eq!(names["event_kind"]["IB_PORT"], "ib_port");
    }
}
