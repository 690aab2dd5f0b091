//! Every HTTP route the collector serves, in one table ([`router`]), as Prometheus'
//! `web/api/v1/api.go` registers its API in one place; docs/http-api.md documents each (a
//! test holds the two together). The handlers live with what they serve: `/metrics` and the
//! live view in [`http`], the archive's queries in [`query::api`], the findings in
//! [`findings::api`], the stragglers in [`stragglers`], the page's assets in [`dashboard`].
//! A route is served only where the collector has what it reads: no archive, no query API.

use std::sync::Arc;

use axum::{
    Router,
    routing::{get, post},
};

use crate::{
    actions::{self, Actions},
    dashboard::{self, asset},
    findings::{self, FindingsStore},
    http, latest,
    query::{self, QueryEngine},
    scrape_targets,
    shared::Shared,
    stragglers,
    web::{
        WebAuth,
        auth::{admin, read},
    },
};

/// What the routes answer from.
#[derive(Default)]
pub struct Sources {
    /// The collector's live state: `/metrics`, the live view, and (where it evaluates them)
    /// the findings.
    pub live: Option<Arc<Shared>>,
    /// The archive's query engine: the query API and the stragglers.
    pub query: Option<Arc<QueryEngine>>,
    /// The actions on findings (docs/actions.md), where they are configured.
    pub actions: Option<Arc<Actions>>,
    /// Who may use the routes (the layer that authenticates every request is
    /// [`http::spawn`]'s), and what `POST /-/reload` reloads.
    pub web: Arc<WebAuth>,
}

/// The route table. Each route names the role it asks for: `read` (any authenticated
/// caller) or `admin` (what changes the collector's state).
pub fn router(sources: Sources) -> Router {
    let Sources {
        live,
        query,
        actions,
        web,
    } = sources;
    let findings: Option<Arc<FindingsStore>> = live.as_ref().and_then(|s| s.findings.clone());
    let table = live.as_ref().map(|s| s.table.clone());
    // The dashboard: one page and its assets, compiled into the binary.
    let mut routes = Router::new()
        .route(
            "/",
            read(get(|| asset(dashboard::INDEX_HTML, dashboard::HTML))),
        )
        .route(
            "/ui/app.js",
            read(get(|| asset(dashboard::APP_JS, dashboard::JS))),
        )
        // The names agent and collector share (`monitor_wire::names`), for the script.
        .route(
            "/ui/names.js",
            read(get(|| asset(dashboard::NAMES_JS.as_str(), dashboard::JS))),
        )
        .route(
            "/ui/app.css",
            read(get(|| asset(dashboard::APP_CSS, dashboard::CSS))),
        )
        .route(
            "/ui/icon.svg",
            read(get(|| asset(dashboard::ICON_SVG, dashboard::SVG))),
        )
        .route(
            "/ui/dygraph.min.js",
            read(get(|| asset(dashboard::DYGRAPH_JS, dashboard::JS))),
        )
        .route(
            "/ui/dygraph.min.css",
            read(get(|| asset(dashboard::DYGRAPH_CSS, dashboard::CSS))),
        );
    if let Some(live) = live {
        routes = routes.merge(
            Router::new()
                // Prometheus' text format: every node's latest samples and the collector's
                // own families (or one node's, one shard's); the fleet-level families
                // (collector and findings) without any node's; the collector's own alone.
                .route("/metrics", read(get(http::metrics_page)))
                .route("/metrics/fleet", read(get(http::fleet_metrics_page)))
                .route("/metrics/collector", read(get(http::own_metrics_page)))
                // Prometheus' HTTP service discovery: a scrape target per node or shard.
                .route("/api/v1/targets", read(get(scrape_targets::handler)))
                // The live view, from memory: the nodes and the recent events.
                .route("/api/v1/live/nodes", read(get(http::live_nodes)))
                .route("/api/v1/live/events", read(get(http::live_events)))
                // A node's hardware path, its class and the class's majority.
                .route(
                    "/api/v1/nodes/{node}/hardware",
                    read(get(findings::hardware_api::node_hardware)),
                )
                .route("/api/v1/live/latest", read(get(latest::handler)))
                .with_state(live),
        );
    }
    if let Some(engine) = query {
        routes = routes
            .merge(
                Router::new()
                    // The archive: series, events, nodes, metric names, a capture file.
                    .route("/api/v1/series", read(get(query::api::series)))
                    .route("/api/v1/events", read(get(query::api::events)))
                    .route("/api/v1/nodes", read(get(query::api::nodes)))
                    .route("/api/v1/metric-names", read(get(query::api::metric_names)))
                    .route("/api/v1/export", read(get(query::api::export)))
                    .with_state(engine.clone()),
            )
            .merge(
                Router::new()
                    // A job's stragglers over a window of the archive.
                    .route("/api/v1/stragglers", read(get(stragglers::stragglers)))
                    .with_state(stragglers::ApiState {
                        engine,
                        findings: findings.clone(),
                        live: table.clone(),
                    }),
            );
    }
    if let Some(store) = findings.clone() {
        routes = routes.merge(
            Router::new()
                // The health findings, active and past.
                .route("/api/v1/findings", read(get(findings::api::findings)))
                .with_state(store),
        );
    }
    if let (Some(actions), Some(table)) = (actions, table) {
        routes = routes.merge(
            Router::new()
                // The actions on findings: settings, brake, nodes acted on, audit records.
                .route("/api/v1/actions", read(get(actions::api::actions)))
                // The drains the brake holds go ahead.
                .route(
                    "/api/v1/actions/release",
                    admin(post(actions::api::release)),
                )
                // A finding and every action about it (`railscope actions show`).
                .route("/api/v1/actions/finding", read(get(actions::api::finding)))
                .with_state(actions::api::ApiState {
                    actions,
                    table,
                    findings,
                }),
        );
    }
    routes.merge(
        Router::new()
            // Prometheus' lifecycle API: reads the web config file and its certificates
            // again (as SIGHUP does).
            .route("/-/reload", admin(post(crate::web::auth::reload)))
            .with_state(web),
    )
}

#[cfg(test)]
mod tests {
    /// The routes of the table above, read from this file.
    fn routes_in_table() -> Vec<&'static str> {
        roles_in_table().into_iter().map(|(path, _)| path).collect()
    }

    /// Each route of the table with the role it asks for (`read(...)` or `admin(...)`).
    fn roles_in_table() -> Vec<(&'static str, &'static str)> {
        let source = include_str!("routes.rs");
        let table = &source[..source.find("#[cfg(test)]").unwrap()];
        table
            .split(".route(")
            .skip(1)
            .map(|rest| {
                let rest = rest.trim_start().strip_prefix('"').unwrap();
                let path = &rest[..rest.find('"').unwrap()];
                let after = rest[path.len() + 1..].trim_start_matches([',', ' ', '\n']);
                let role = ["read", "admin"]
                    .into_iter()
                    .find(|role| after.starts_with(&format!("{role}(")))
                    .unwrap_or_else(|| panic!("{path} names no role: {after:.40}"));
                (path, role)
            })
            .collect()
    }

    #[test]
    fn every_route_names_its_role_as_the_docs_do() {
        let docs = include_str!("../../docs/http-api.md");
        let roles = roles_in_table();
        assert!(roles.contains(&("/-/reload", "admin")), "{roles:?}");
        // The docs' route table: | routes | role | ...
        let mut documented = Vec::new();
        for row in docs.lines().filter(|l| l.starts_with("| `")) {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            for (i, part) in cells[1].split('`').enumerate() {
                if i % 2 == 1 {
                    let path = part.strip_prefix("POST ").unwrap_or(part);
                    documented.push((path.to_owned(), cells[2].to_owned()));
                }
            }
        }
        for (path, role) in &roles {
            assert!(
                documented.contains(&((*path).to_owned(), (*role).to_owned())),
                "docs/http-api.md's table does not give {path} the role {role}"
            );
        }
    }

    #[test]
    fn every_asset_the_page_loads_is_a_route() {
        let routes = routes_in_table();
        let page = crate::dashboard::INDEX_HTML;
        let assets: Vec<&str> = page
            .split(['"', '\''])
            .filter(|s| s.starts_with("/ui/"))
            .collect();
        assert!(assets.len() >= 5, "{assets:?}");
        for asset in assets {
            assert!(
                routes.contains(&asset),
                "the page loads {asset}, which is no route"
            );
        }
    }

    #[test]
    fn docs_http_api_documents_every_route_and_no_other() {
        let docs = include_str!("../../docs/http-api.md");
        let routes = routes_in_table();
        assert!(routes.len() >= 16, "{routes:?}");
        for route in &routes {
            assert!(
                docs.contains(&format!("`GET {route}`"))
                    || docs.contains(&format!("`POST {route}`"))
                    || docs.contains(&format!("`{route}`")),
                "docs/http-api.md does not document {route}"
            );
        }
        // Every `GET /...` (or `POST`) heading of the docs is a route of the table.
        for heading in docs.lines().filter_map(|l| {
            l.strip_prefix("## `GET ")
                .or_else(|| l.strip_prefix("## `POST "))
        }) {
            let path = heading.split(['`', '?']).next().unwrap();
            assert!(
                routes.contains(&path),
                "docs/http-api.md documents {path}, which the collector does not serve"
            );
        }
    }
}
