//! `railscope findings` (and `railscope-collector findings`): the client of
//! `/api/v1/findings`, text or `--json`.

use std::fmt::Write as _;

use serde_json::Value as Json;

use crate::{query::get_json, time::format_time};

/// `railscope findings [--collector URL] [--json] [--node N] [--severity S] [--active|--ended]`
#[derive(clap::Args, Debug, Clone)]
pub struct FindingsArgs {
    /// The collector's HTTP address.
    #[arg(long, default_value = "http://127.0.0.1:7671")]
    pub collector: String,
    /// Print the API's JSON answer instead of text.
    #[arg(long)]
    pub json: bool,
    #[arg(long)]
    pub node: Option<String>,
    /// Only this severity: critical, warning or info.
    #[arg(long)]
    pub severity: Option<String>,
    /// Only findings still active.
    #[arg(long, conflicts_with = "ended")]
    pub active: bool,
    /// Only findings that ended.
    #[arg(long)]
    pub ended: bool,
    /// Findings active at some time in this range: `now`, `-15m`, an RFC 3339 time or Unix
    /// seconds (default: the last hour).
    #[arg(long, default_value = "-1h", allow_hyphen_values = true)]
    pub start: String,
    #[arg(long, default_value = "now", allow_hyphen_values = true)]
    pub end: String,
}

pub fn run(args: &FindingsArgs) -> anyhow::Result<()> {
    let mut query = vec![("start", args.start.clone()), ("end", args.end.clone())];
    if let Some(n) = &args.node {
        query.push(("node", n.clone()));
    }
    if let Some(s) = &args.severity {
        query.push(("severity", s.clone()));
    }
    if args.active || args.ended {
        query.push(("active", args.active.to_string()));
    }
    let json = get_json(&args.collector, "/api/v1/findings", &query)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        print!("{}", text(&json));
    }
    Ok(())
}

/// One line per finding: start, end (or `active`), severity, rule, where, summary.
pub fn text(json: &Json) -> String {
    let mut out = String::new();
    let findings = json["findings"].as_array().cloned().unwrap_or_default();
    if findings.is_empty() {
        out.push_str("no findings\n");
    }
    for f in findings {
        let mut place = f["node"].as_str().unwrap_or("?").to_owned();
        if let Some(d) = f["device"].as_str() {
            let _ = write!(place, " {d}");
            if let Some(p) = f["port"].as_u64() {
                let _ = write!(place, "/{p}");
            }
        }
        if let Some(g) = f["gpu"].as_str() {
            let _ = write!(place, " gpu {g}");
        }
        if let Some(j) = f["job_id"].as_str() {
            let _ = write!(place, " job {j}");
        }
        let end = f["end"]
            .as_u64()
            .map_or_else(|| "active".to_owned(), format_time);
        let _ = writeln!(
            out,
            "{} {:>8} {:<8} {:<22} {place}: {}",
            format_time(f["start"].as_u64().unwrap_or(0)),
            end,
            f["severity"].as_str().unwrap_or("?"),
            f["rule"].as_str().unwrap_or("?"),
            f["summary"].as_str().unwrap_or(""),
        );
    }
    out
}
