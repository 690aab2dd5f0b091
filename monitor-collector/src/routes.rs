//! Every HTTP route the collector serves, in one table ([`ROUTES`]), as Prometheus'
//! `web/api/v1/api.go` registers its API in one place: each route's method, path, role and
//! handler, the handler's kind saying what the route answers from ([`Route::source`]). The
//! router is built from the table ([`router`]), and the tests read the same table: that
//! docs/http-api.md documents each route with its method, role and source (below), that
//! each route asks for its role (tests/web_auth.rs), that the collector serves the table's
//! routes and no other. The handlers live with what they serve: `/metrics` and the live
//! view in `http`, the archive's queries in [`query::api`], the findings in
//! `findings::api`, the stragglers in `stragglers`, the page's assets in
//! `dashboard`. A route is served only where the collector has what it
//! reads: no archive, no query API.

use std::sync::Arc;

use axum::{
    Router,
    routing::{MethodFilter, MethodRouter, on},
};

use crate::{
    actions,
    dashboard::{
        APP_CSS, APP_JS, CSS, DYGRAPH_CSS, DYGRAPH_JS, HTML, ICON_SVG, INDEX_HTML, JS, NAMES_JS,
        SVG, asset,
    },
    findings::{self, hardware_api},
    http, latest, query, reads, scrape_targets,
    shared::Shared,
    stragglers,
    web::{
        Role::{self, Admin, Read},
        WebAuth,
        auth::{self, admin, read},
    },
};
use Method::{Get, Post};
use Serve::{Actions, Findings, Live, Page, Query, Stragglers, Web};
use monitor_archive::query::QueryEngine;
use monitor_findings::FindingsStore;

/// The route table: every route the collector serves (where it has the route's source),
/// and no other. A row: the method, the path, the role the route asks for (`Read`: any
/// authenticated caller; `Admin`: what changes the collector's state), and the handler,
/// made for the row's method (`|m| on(m, handler)`), its kind (`Live`, `Query`, ...) naming
/// the state it is given.
#[rustfmt::skip]
pub const ROUTES: &[Route] = &[
    // The dashboard: one page and its assets, compiled into the binary.
    route(Get,  "/",                       Read,  Page(|m| on(m, || asset(INDEX_HTML, HTML)))),
    route(Get,  "/ui/app.js",              Read,  Page(|m| on(m, || asset(APP_JS, JS)))),
    // The names agent and collector share (`monitor_wire::names`), for the script.
    route(Get,  "/ui/names.js",            Read,  Page(|m| on(m, || asset(NAMES_JS.as_str(), JS)))),
    route(Get,  "/ui/app.css",             Read,  Page(|m| on(m, || asset(APP_CSS, CSS)))),
    route(Get,  "/ui/icon.svg",            Read,  Page(|m| on(m, || asset(ICON_SVG, SVG)))),
    route(Get,  "/ui/dygraph.min.js",      Read,  Page(|m| on(m, || asset(DYGRAPH_JS, JS)))),
    route(Get,  "/ui/dygraph.min.css",     Read,  Page(|m| on(m, || asset(DYGRAPH_CSS, CSS)))),
    // Prometheus' text format: every node's latest samples and the collector's own families
    // (or one node's, one shard's); the fleet-level families (collector and findings) without
    // any node's; the collector's own alone.
    route(Get,  "/metrics",                Read,  Live(|m| on(m, http::metrics_page))),
    route(Get,  "/metrics/fleet",          Read,  Live(|m| on(m, http::fleet_metrics_page))),
    route(Get,  "/metrics/collector",      Read,  Live(|m| on(m, http::own_metrics_page))),
    // Prometheus' HTTP service discovery: a scrape target per node or shard.
    route(Get,  "/api/v1/targets",         Read,  Live(|m| on(m, scrape_targets::handler))),
    // The live view, from memory: the nodes and the recent events.
    route(Get,  "/api/v1/live/nodes",      Read,  Live(|m| on(m, http::live_nodes))),
    route(Get,  "/api/v1/live/events",     Read,  Live(|m| on(m, http::live_events))),
    // A node's hardware path, its class and the class's majority.
    route(Get, "/api/v1/nodes/{node}/hardware", Read, Live(|m| on(m, hardware_api::node_hardware))),
    // The latest point of chosen metrics' series across the fleet.
    route(Get,  "/api/v1/live/latest",     Read,  Live(|m| on(m, latest::handler))),
    // What railscope reads (rules, stragglers, dashboard): what `railscope select` keeps.
    route(Get,  "/api/v1/reads",           Read,  Page(|m| on(m, reads::handler))),
    // The archive: series, events, nodes, metric names, a capture file.
    route(Get,  "/api/v1/series",          Read,  Query(|m| on(m, query::api::series))),
    route(Get,  "/api/v1/events",          Read,  Query(|m| on(m, query::api::events))),
    route(Get,  "/api/v1/nodes",           Read,  Query(|m| on(m, query::api::nodes))),
    route(Get,  "/api/v1/metric-names",    Read,  Query(|m| on(m, query::api::metric_names))),
    route(Get,  "/api/v1/export",          Read,  Query(|m| on(m, query::api::export))),
    // A job's stragglers over a window of the archive.
    route(Get,  "/api/v1/stragglers",      Read,  Stragglers(|m| on(m, stragglers::stragglers))),
    // The health findings, active and past.
    route(Get,  "/api/v1/findings",        Read,  Findings(|m| on(m, findings::api::findings))),
    // The actions on findings: settings, brake, nodes acted on, audit records.
    route(Get,  "/api/v1/actions",         Read,  Actions(|m| on(m, actions::api::actions))),
    // The drains the brake holds go ahead.
    route(Post, "/api/v1/actions/release", Admin, Actions(|m| on(m, actions::api::release))),
    // A finding and every action about it (`railscope actions show`).
    route(Get,  "/api/v1/actions/finding", Read,  Actions(|m| on(m, actions::api::finding))),
    // Prometheus' lifecycle API: reads the web config file and its certificates again (as
    // SIGHUP does).
    route(Post, "/-/reload",               Admin, Web(|m| on(m, auth::reload))),
];

/// One route of [`ROUTES`].
pub struct Route {
    pub method: Method,
    pub path: &'static str,
    /// `read` (any authenticated caller) or `admin` (what changes the collector's state).
    pub role: Role,
    /// The handler, with what it answers from.
    serve: Serve,
}

/// The one method a route answers (another gets 405).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
}

impl Method {
    /// As HTTP spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Get => "GET",
            Post => "POST",
        }
    }

    fn filter(self) -> MethodFilter {
        match self {
            Get => MethodFilter::GET,
            Post => MethodFilter::POST,
        }
    }
}

/// What a route answers from: where the collector lacks it, the route is not served (404).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The binary (the dashboard) or the web config (`/-/reload`): always served.
    Always,
    /// The collector's live state ([`Sources::live`]).
    Live,
    /// The archive's query engine ([`Sources::query`]).
    Query,
    /// The findings store of the live state (where it evaluates findings).
    Findings,
    /// The actions on findings ([`Sources::actions`]) with the live state.
    Actions,
}

/// A route's handler, by the state it is given: made with the route's method
/// (`|m| on(m, handler)`, so that the method is the table's alone).
#[derive(Clone, Copy)]
enum Serve {
    Page(fn(MethodFilter) -> MethodRouter),
    Live(fn(MethodFilter) -> MethodRouter<Arc<Shared>>),
    Query(fn(MethodFilter) -> MethodRouter<Arc<QueryEngine>>),
    Stragglers(fn(MethodFilter) -> MethodRouter<stragglers::ApiState>),
    Findings(fn(MethodFilter) -> MethodRouter<Arc<FindingsStore>>),
    Actions(fn(MethodFilter) -> MethodRouter<actions::api::ApiState>),
    Web(fn(MethodFilter) -> MethodRouter<Arc<WebAuth>>),
}

/// A row of [`ROUTES`].
const fn route(method: Method, path: &'static str, role: Role, serve: Serve) -> Route {
    Route {
        method,
        path,
        role,
        serve,
    }
}

impl Route {
    /// What the route answers from.
    pub fn source(&self) -> Source {
        match self.serve {
            Page(_) | Web(_) => Source::Always,
            Live(_) => Source::Live,
            Query(_) | Stragglers(_) => Source::Query,
            Findings(_) => Source::Findings,
            Actions(_) => Source::Actions,
        }
    }

    /// The route as served with `states`, asking for its role; None where they lack its
    /// source.
    fn served(&self, states: &States) -> Option<MethodRouter> {
        let m = self.method.filter();
        let served = match self.serve {
            Page(serve) => serve(m),
            Live(serve) => serve(m).with_state(states.live.clone()?),
            Query(serve) => serve(m).with_state(states.query.clone()?),
            Stragglers(serve) => serve(m).with_state(states.stragglers.clone()?),
            Findings(serve) => serve(m).with_state(states.findings.clone()?),
            Actions(serve) => serve(m).with_state(states.actions.clone()?),
            Web(serve) => serve(m).with_state(states.web.clone()),
        };
        Some(match self.role {
            Read => read(served),
            Admin => admin(served),
        })
    }
}

/// What the routes answer from.
#[derive(Default)]
pub struct Sources {
    /// The collector's live state: `/metrics`, the live view, and (where it evaluates them)
    /// the findings.
    pub live: Option<Arc<Shared>>,
    /// The archive's query engine: the query API and the stragglers.
    pub query: Option<Arc<QueryEngine>>,
    /// The actions on findings (docs/actions.md), where they are configured.
    pub actions: Option<Arc<monitor_actions::Actions>>,
    /// Who may use the routes (the layer that authenticates every request is
    /// `http::spawn`'s), and what `POST /-/reload` reloads.
    pub web: Arc<WebAuth>,
}

/// Each kind of handler's state, where the sources have it.
struct States {
    live: Option<Arc<Shared>>,
    query: Option<Arc<QueryEngine>>,
    stragglers: Option<stragglers::ApiState>,
    findings: Option<Arc<FindingsStore>>,
    actions: Option<actions::api::ApiState>,
    web: Arc<WebAuth>,
}

impl States {
    fn of(sources: Sources) -> Self {
        let Sources {
            live,
            query,
            actions,
            web,
        } = sources;
        let findings = live.as_ref().and_then(|s| s.findings.clone());
        let table = live.as_ref().map(|s| s.table.clone());
        States {
            stragglers: query.clone().map(|engine| stragglers::ApiState {
                engine,
                findings: findings.clone(),
                live: table.clone(),
            }),
            actions: actions
                .zip(table)
                .map(|(actions, table)| crate::actions::api::ApiState {
                    actions,
                    table,
                    findings: findings.clone(),
                }),
            live,
            query,
            findings,
            web,
        }
    }
}

/// The routes of [`ROUTES`] whose sources `sources` has, each asking for its role.
pub fn router(sources: Sources) -> Router {
    let states = States::of(sources);
    ROUTES
        .iter()
        .fold(Router::new(), |router, route| match route.served(&states) {
            Some(served) => router.route(route.path, served),
            None => router,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The docs' route table (`| route | role | answers from | what |`): each route of a row
    /// as its method and path, with the row's role and source.
    fn documented() -> Vec<(&'static str, &'static str, &'static str, &'static str)> {
        let docs = include_str!("../../docs/http-api.md");
        let table = docs
            .lines()
            .skip_while(|l| !l.starts_with("| route | role | answers from |"))
            .skip(2)
            .take_while(|l| l.starts_with('|'));
        let mut rows = Vec::new();
        for row in table {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            for (i, part) in cells[1].split('`').enumerate() {
                if i % 2 == 1 {
                    let (method, path) = part.split_once(' ').unwrap_or(("GET", part));
                    rows.push((method, path, cells[2], cells[3]));
                }
            }
        }
        rows
    }

    /// How the docs' "answers from" column says a source (the start of the cell).
    fn said_as(source: Source) -> &'static [&'static str] {
        match source {
            Source::Always => &["the binary", "the web config file"],
            Source::Live => &["memory"],
            Source::Query => &["archive"],
            Source::Findings => &["findings log"],
            Source::Actions => &["actions audit log"],
        }
    }

    #[test]
    fn every_route_names_its_role_as_the_docs_do() {
        assert!(
            ROUTES
                .iter()
                .any(|r| (r.path, r.method, r.role) == ("/-/reload", Method::Post, Admin)),
            "no admin POST /-/reload"
        );
        let documented = documented();
        assert_eq!(documented.len(), ROUTES.len(), "{documented:?}");
        for route in ROUTES {
            let (method, path, role) = (route.method.as_str(), route.path, route.role.to_string());
            let row = documented.iter().find(|(_, p, ..)| *p == path);
            let Some((doc_method, _, doc_role, from)) = row else {
                panic!("docs/http-api.md's table does not list {path}");
            };
            assert_eq!(
                (*doc_method, *doc_role),
                (method, role.as_str()),
                "docs/http-api.md's table does not give {path} the method {method} and the role {role}"
            );
            assert!(
                said_as(route.source())
                    .iter()
                    .any(|source| from.starts_with(source)),
                "docs/http-api.md's table says {path} answers from {from:?}, not {:?}",
                route.source()
            );
        }
        for (method, path, ..) in &documented {
            assert!(
                ROUTES
                    .iter()
                    .any(|r| r.path == *path && r.method.as_str() == *method),
                "docs/http-api.md's table lists {method} {path}, which the collector does not serve"
            );
        }
    }

    #[test]
    fn every_asset_the_page_loads_is_a_route() {
        let page = crate::dashboard::INDEX_HTML;
        let assets: Vec<&str> = page
            .split(['"', '\''])
            .filter(|s| s.starts_with("/ui/"))
            .collect();
        assert!(assets.len() >= 5, "{assets:?}");
        for asset in assets {
            assert!(
                ROUTES
                    .iter()
                    .any(|r| r.path == asset && r.method == Method::Get),
                "the page loads {asset}, which is no route"
            );
        }
    }

    #[test]
    fn docs_http_api_documents_every_route_and_no_other() {
        let docs = include_str!("../../docs/http-api.md");
        assert!(ROUTES.len() >= 16, "{}", ROUTES.len());
        for route in ROUTES {
            let path = route.path;
            assert!(
                docs.contains(&format!("`GET {path}`"))
                    || docs.contains(&format!("`POST {path}`"))
                    || docs.contains(&format!("`{path}`")),
                "docs/http-api.md does not document {path}"
            );
        }
        // Every `GET /...` (or `POST`) heading of the docs is a route of the table.
        for heading in docs.lines().filter_map(|l| l.strip_prefix("## `")) {
            let Some((method, rest)) = heading.split_once(' ') else {
                continue;
            };
            if !["GET", "POST"].contains(&method) {
                continue;
            }
            let path = rest.split(['`', '?']).next().unwrap();
            assert!(
                ROUTES
                    .iter()
                    .any(|r| r.path == path && r.method.as_str() == method),
                "docs/http-api.md documents {method} {path}, which the collector does not serve"
            );
        }
    }

    #[test]
    fn no_path_is_in_the_table_twice() {
        for (i, route) in ROUTES.iter().enumerate() {
            assert!(route.path.starts_with('/'), "{}", route.path);
            assert!(
                ROUTES[..i].iter().all(|r| r.path != route.path),
                "{} twice",
                route.path
            );
        }
    }

    /// The status of `method path` on `router` (no authentication layer), served on a
    /// loopback port.
    fn statuses(router: Router, requests: &[(&str, &str)]) -> Vec<u16> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _server = runtime.enter();
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        std::thread::spawn(move || {
            runtime.block_on(async move { axum::serve(listener, router).await.unwrap() });
        });
        let agent = ureq::Agent::new_with_config(
            ureq::Agent::config_builder()
                .http_status_as_error(false)
                .build(),
        );
        requests
            .iter()
            .map(|(method, path)| {
                let url = format!("{url}{path}");
                let answer = match *method {
                    "GET" => agent.get(&url).call(),
                    "POST" => agent.post(&url).send_empty(),
                    "DELETE" => agent.delete(&url).call(),
                    other => panic!("{other}"),
                };
                answer.unwrap().status().as_u16()
            })
            .collect()
    }

    /// Without live state, archive or actions, the collector serves the page and
    /// `/-/reload` (its sources are always there), and no other route of the table: a path
    /// is routed where another method gets 405, unrouted where it gets 404.
    #[test]
    fn without_sources_only_the_routes_that_need_none_are_served() {
        let requests: Vec<(&str, &str)> = ROUTES.iter().map(|r| ("DELETE", r.path)).collect();
        let answers = statuses(router(Sources::default()), &requests);
        let always = ROUTES
            .iter()
            .filter(|r| r.source() == Source::Always)
            .count();
        assert!(always >= 8, "{always}");
        for (route, status) in ROUTES.iter().zip(answers) {
            let expected = if route.source() == Source::Always {
                405
            } else {
                404
            };
            assert_eq!(
                status,
                expected,
                "DELETE {} ({:?}) without sources",
                route.path,
                route.source()
            );
        }
        let pages: Vec<(&str, &str)> = ROUTES
            .iter()
            .filter(|r| matches!(r.serve, Page(_)))
            .map(|r| ("GET", r.path))
            .collect();
        let answers = statuses(router(Sources::default()), &pages);
        assert!(answers.iter().all(|&s| s == 200), "{pages:?}: {answers:?}");
    }
}
