//! `GET /api/v1/findings` (docs/http-api.md) and the findings' `/metrics` families:
//! `railscope_finding_active{rule,severity,node,device,port,gpu,job_id} 1` per active finding
//! and `railscope_findings_total{rule,severity}`.

use std::{fmt::Write as _, sync::Arc};

use axum::{
    Json,
    extract::{RawQuery, State},
    response::{IntoResponse, Response},
};
use serde_json::json;

use crate::query::api::{ApiError, bad, one, params, range};
use monitor_findings::{FindingsStore, Severity, store::FindingFilter};

/// `GET /api/v1/findings`.
pub(crate) async fn findings(
    State(store): State<Arc<FindingsStore>>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let pairs = params(raw, &["start", "end", "node", "severity", "active"])?;
    let (start_ns, end_ns) = range(&pairs)?;
    let severity = one(&pairs, "severity")?
        .map(|s| {
            Severity::parse(s).ok_or_else(|| {
                bad(format!(
                    "parameter \"severity\": {s:?} is not critical, warning or info"
                ))
            })
        })
        .transpose()?;
    let active = one(&pairs, "active")?
        .map(|a| match a {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(bad(format!(
                "parameter \"active\": {a:?} is not true or false"
            ))),
        })
        .transpose()?;
    let filter = FindingFilter {
        start_ns,
        end_ns,
        node: one(&pairs, "node")?.map(str::to_owned),
        severity,
        active,
    };
    Ok(Json(json!({ "findings": store.list(&filter) })).into_response())
}

/// Writes the findings' families onto the `/metrics` page.
pub(crate) fn write_metrics(out: &mut String, store: &FindingsStore) {
    out.push_str(
        "# HELP railscope_finding_active A health finding that is active (docs/findings.md).\n\
         # TYPE railscope_finding_active gauge\n",
    );
    for f in store.active() {
        let labels: Vec<String> = f
            .labels()
            .into_iter()
            .map(|(k, v)| format!("{k}=\"{}\"", escape(&v)))
            .collect();
        let _ = writeln!(out, "railscope_finding_active{{{}}} 1", labels.join(","));
    }
    out.push_str(
        "# HELP railscope_findings_total Health findings opened, by rule and severity.\n\
         # TYPE railscope_findings_total counter\n",
    );
    for ((rule, severity), n) in store.totals() {
        let _ = writeln!(
            out,
            "railscope_findings_total{{rule=\"{rule}\",severity=\"{}\"}} {n}",
            severity.as_str()
        );
    }
    let _ = writeln!(
        out,
        "# HELP railscope_collector_findings_log_errors_total Findings log entries that could not be written.\n\
         # TYPE railscope_collector_findings_log_errors_total counter\n\
         railscope_collector_findings_log_errors_total {}",
        store.log_errors()
    );
    write_tick_metrics(out, store);
}

/// How long the findings thread's ticks take (also on `/metrics/collector`).
pub(crate) fn write_tick_metrics(out: &mut String, store: &FindingsStore) {
    let (count, sum, max, last) = store.ticks().snapshot();
    let _ = writeln!(
        out,
        "# HELP railscope_collector_findings_tick_seconds Time the findings thread's ticks took (every rule over the live view, each tick-s).\n\
         # TYPE railscope_collector_findings_tick_seconds summary\n\
         railscope_collector_findings_tick_seconds_sum {sum}\n\
         railscope_collector_findings_tick_seconds_count {count}\n\
         # HELP railscope_collector_findings_tick_max_seconds The longest findings tick since the collector started.\n\
         # TYPE railscope_collector_findings_tick_max_seconds gauge\n\
         railscope_collector_findings_tick_max_seconds {max}\n\
         # HELP railscope_collector_findings_last_tick_seconds The last findings tick's duration.\n\
         # TYPE railscope_collector_findings_last_tick_seconds gauge\n\
         railscope_collector_findings_last_tick_seconds {last}"
    );
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
