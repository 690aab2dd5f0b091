//! `railscope query`: the client of the collector's HTTP JSON API (docs/http-api.md). It
//! prints series, events or nodes as text, or the API's JSON with `--json`.

use std::{fmt::Write as _, time::Duration};

use anyhow::Context as _;
use serde_json::Value as Json;

use crate::{client::Client, time::format_time};

/// `railscope query [--collector URL] [--json] series|events|nodes ...`: the options of the
/// whole command are global, so they are taken before or after the subcommand
/// (`query series M --collector URL` as `query --collector URL series M`).
#[derive(clap::Args, Debug, Clone)]
pub struct QueryArgs {
    /// The collector's HTTP address.
    #[arg(long, global = true, default_value = "http://127.0.0.1:7671")]
    pub collector: String,
    /// Print the API's JSON answer instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub what: QueryCommand,
}

#[derive(clap::Subcommand, Debug, Clone)]
pub enum QueryCommand {
    /// Series of one metric: counters with their rates, gauges with their min/max/mean.
    Series {
        /// Metric name, e.g. railscope_ib_port_xmit_bytes_total.
        metric: String,
        /// Label matcher: label=value, label!=value, label=~regex, label!~regex; the node is
        /// the `node` label. Repeat for several.
        #[arg(long = "match", short = 'm', value_name = "MATCHER")]
        matchers: Vec<String>,
        #[command(flatten)]
        range: RangeArgs,
    },
    /// Events (port changes, XID errors, QP errors, ...), oldest first.
    Events {
        /// Only this kind (ib_port, port_transition, xid, gpu_lost, qp_error, ...).
        #[arg(long)]
        kind: Option<String>,
        #[arg(long)]
        node: Option<String>,
        /// Only this device: an event's `device` label (mlx5_0) or `gpu` label (3).
        #[arg(long)]
        device: Option<String>,
        #[command(flatten)]
        range: RangeArgs,
    },
    /// Nodes with data in the range.
    Nodes {
        #[command(flatten)]
        range: RangeArgs,
    },
}

/// A time range: `now`, `-15m`, an RFC 3339 time or Unix seconds (default: the last hour).
#[derive(clap::Args, Debug, Clone)]
pub struct RangeArgs {
    #[arg(long, default_value = "-1h", allow_hyphen_values = true)]
    pub start: String,
    #[arg(long, default_value = "now", allow_hyphen_values = true)]
    pub end: String,
}

impl QueryCommand {
    fn request(&self) -> (&'static str, Vec<(&'static str, String)>) {
        let range = |r: &RangeArgs| vec![("start", r.start.clone()), ("end", r.end.clone())];
        match self {
            QueryCommand::Series {
                metric,
                matchers,
                range: r,
            } => {
                let mut q = vec![("metric", metric.clone())];
                q.extend(matchers.iter().map(|m| ("match", m.clone())));
                q.extend(range(r));
                ("/api/v1/series", q)
            }
            QueryCommand::Events {
                kind,
                node,
                device,
                range: r,
            } => {
                let mut q = range(r);
                for (name, v) in [("kind", kind), ("node", node), ("device", device)] {
                    q.extend(v.iter().map(|v| (name, v.clone())));
                }
                ("/api/v1/events", q)
            }
            QueryCommand::Nodes { range: r } => ("/api/v1/nodes", range(r)),
        }
    }
}

/// Asks the collector and returns its JSON answer; a refusal is an error with its reason.
pub fn fetch(args: &QueryArgs) -> anyhow::Result<Json> {
    let (path, query) = args.what.request();
    get_json(&args.collector, path, &query)
}

/// `GET collector + path ? query` as JSON; a refusal is an error with the collector's reason.
pub fn get_json(collector: &str, path: &str, query: &[(&str, String)]) -> anyhow::Result<Json> {
    get_json_within(collector, path, query, Duration::from_secs(60))
}

/// [`get_json`], the whole exchange given up after `timeout`.
pub fn get_json_within(
    collector: &str,
    path: &str,
    query: &[(&str, String)],
    timeout: Duration,
) -> anyhow::Result<Json> {
    let url = format!("{}{path}", collector.trim_end_matches('/'));
    let client = Client::from_env(timeout)?;
    let mut response = client
        .get(&url)
        .query_pairs(query.iter().map(|(k, v)| (*k, v.as_str())))
        .call()
        .with_context(|| format!("asking the collector at {url}"))?;
    let status = response.status();
    let body = response
        .body_mut()
        .read_to_string()
        .with_context(|| format!("reading the answer of {url}"))?;
    if status == 404 && serde_json::from_str::<Json>(&body).is_err() {
        // No route: the collector serves a route only where it has what it reads.
        anyhow::bail!(
            "the collector at {collector} does not serve {path} (404): its query routes need an \
             archive (--data), /api/v1/actions an [actions] table (docs/http-api.md)"
        );
    }
    let json: Json = serde_json::from_str(&body)
        .with_context(|| format!("{url} answered {status} with something that is not JSON"))?;
    if !status.is_success() {
        let reason = json["error"].as_str().unwrap_or("no reason given");
        anyhow::bail!("the collector refused the query ({status}): {reason}");
    }
    Ok(json)
}

/// Runs `railscope query ...`: prints the answer on stdout.
pub fn run(args: &QueryArgs) -> anyhow::Result<()> {
    let json = fetch(args)?;
    let text = if args.json {
        serde_json::to_string_pretty(&json)? + "\n"
    } else {
        match args.what {
            QueryCommand::Series { .. } => series_text(&json),
            QueryCommand::Events { .. } => events_text(&json),
            QueryCommand::Nodes { .. } => nodes_text(&json),
        }
    };
    print!("{text}");
    Ok(())
}

fn labels_text(labels: &Json) -> String {
    let pairs: Vec<String> = labels
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={:?}", v.as_str().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    format!("{{{}}}", pairs.join(","))
}

fn time_text(v: &Json) -> String {
    v.as_u64().map(format_time).unwrap_or_else(|| "?".into())
}

/// A number as the API gave it (integers stay exact).
fn num(v: &Json) -> String {
    match v {
        Json::Null => "-".into(),
        v => v.to_string(),
    }
}

/// One block per series: its name and labels, then a line per sample.
pub fn series_text(json: &Json) -> String {
    let mut out = String::new();
    let series = json["series"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    if series.is_empty() {
        out.push_str("no series matched\n");
    }
    for s in series {
        let kind = s["kind"].as_str().unwrap_or("?");
        let _ = writeln!(
            out,
            "{}{} {kind}",
            s["metric"].as_str().unwrap_or("?"),
            labels_text(&s["labels"])
        );
        for p in s["points"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
            let t = time_text(&p["t"]);
            if kind == "counter" {
                let _ = writeln!(
                    out,
                    "  {t}  {}  rate {}/s",
                    num(&p["value"]),
                    num(&p["rate"])
                );
            } else if p["min"] == p["max"] && p["start"] == p["t"] {
                let _ = writeln!(out, "  {t}  {}", num(&p["mean"]));
            } else {
                let _ = writeln!(
                    out,
                    "  {t}  min {} max {} mean {} since {}",
                    num(&p["min"]),
                    num(&p["max"]),
                    num(&p["mean"]),
                    time_text(&p["start"])
                );
            }
        }
    }
    out
}

/// One line per event.
pub fn events_text(json: &Json) -> String {
    let mut out = String::new();
    let events = json["events"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    if events.is_empty() {
        out.push_str("no events\n");
    }
    for e in events {
        let _ = writeln!(
            out,
            "{}  {}  {}{}  code {}  {}",
            time_text(&e["t"]),
            e["node"].as_str().unwrap_or("?"),
            e["kind"].as_str().unwrap_or("?"),
            labels_text(&e["labels"]),
            num(&e["code"]),
            e["text"].as_str().unwrap_or("")
        );
    }
    out
}

pub fn nodes_text(json: &Json) -> String {
    let nodes = json["nodes"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    if nodes.is_empty() {
        return "no nodes\n".into();
    }
    nodes
        .iter()
        .map(|n| format!("{}\n", n.as_str().unwrap_or("?")))
        .collect()
}
