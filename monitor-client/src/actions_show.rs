//! `railscope actions show ID`: the evidence around an action, so whoever looks at a drained
//! node starts with it. From the collector: the finding and every action about it
//! (`/api/v1/actions/finding`), the node's events from a minute before the finding to a
//! minute after it ended, or to now while it is active (`/api/v1/events`), and, for a port's finding, the flight-recorder report
//! of that port over the same span from the archive's export (`/api/v1/export`, read as
//! `railscope report --collector` reads it). A part the collector cannot give (no archive,
//! say) is named with why, and the rest is still shown.

use std::{fmt::Write as _, time::Duration};

use serde_json::{Value as Json, json};

use crate::{
    export::fetch_export,
    query::{events_text, get_json, get_json_within},
    time::{api_seconds, format_time, unix_now_ns},
};

/// How far around the finding's span the events and the report reach.
const AROUND_NS: u64 = 60_000_000_000;

/// What `actions show` gathered.
pub(crate) struct Shown {
    /// `/api/v1/actions/finding`'s answer: `finding` (or null) and `records`.
    pub answer: Json,
    /// The span read around the finding, Unix ns.
    pub window: Option<(u64, u64)>,
    /// The node's events over the window, or why there are none.
    pub events: Option<Result<Json, String>>,
    /// The port's report over the window, or why there is none (a port's finding only).
    pub report: Option<Result<monitor_capture::report::Report, String>>,
}

/// Asks the collector at `collector` about `id` (a finding's id or an audit record's seq).
pub(crate) fn gather(collector: &str, id: &str) -> anyhow::Result<Shown> {
    let answer = get_json(
        collector,
        "/api/v1/actions/finding",
        &[("id", id.to_owned())],
    )?;
    let finding = &answer["finding"];
    let (Some(node), Some(start)) = (finding["node"].as_str(), finding["start"].as_u64()) else {
        return Ok(Shown {
            answer,
            window: None,
            events: None,
            report: None,
        });
    };
    // An active finding's window ends now: a later end would read as the port's state
    // lasting into the future.
    let end = finding["end"]
        .as_u64()
        .map_or_else(unix_now_ns, |end| end.max(start).saturating_add(AROUND_NS));
    let window = (start.saturating_sub(AROUND_NS), end.max(start));
    let (from, to) = (api_seconds(window.0), api_seconds(window.1));
    let events = get_json_within(
        collector,
        "/api/v1/events",
        &[
            ("node", node.to_owned()),
            ("start", from.clone()),
            ("end", to.clone()),
        ],
        Duration::from_secs(60),
    )
    .map_err(|e| format!("{e:#}"));
    let report = match (finding["device"].as_str(), finding["port"].as_u64()) {
        (Some(device), Some(port)) => Some(
            port_report(collector, node, device, port, &from, &to).map_err(|e| format!("{e:#}")),
        ),
        _ => None,
    };
    Ok(Shown {
        answer,
        window: Some(window),
        events: Some(events),
        report,
    })
}

/// The flight-recorder report of one port between `from` and `to` (Unix seconds), from the
/// collector's export: `railscope report --collector`'s reading, kept to that port.
fn port_report(
    collector: &str,
    node: &str,
    device: &str,
    port: u64,
    from: &str,
    to: &str,
) -> anyhow::Result<monitor_capture::report::Report> {
    let bytes = fetch_export(collector, node, from, to)?;
    let name = format!("{collector} node {node} from {from} to {to}");
    let (mut report, _) =
        monitor_capture::report::report_of(&[(name, bytes)], &monitor_capture::Rules::default())?;
    report.ports.retain(|p| {
        p.port.node == node && p.port.device == device && u64::from(p.port.port) == port
    });
    Ok(report)
}

impl Shown {
    /// `--json`: the API's answer with the window, the events and the report added.
    pub(crate) fn to_json(&self) -> Json {
        let mut out = self.answer.clone();
        if let Some((start, end)) = self.window {
            out["window"] = json!({ "start": start, "end": end });
        }
        match &self.events {
            Some(Ok(events)) => out["events"] = events["events"].clone(),
            Some(Err(e)) => out["events_error"] = json!(e),
            None => {}
        }
        match &self.report {
            Some(Ok(report)) => out["report"] = serde_json::to_value(report).unwrap_or_default(),
            Some(Err(e)) => out["report_error"] = json!(e),
            None => {}
        }
        out
    }

    /// For people: the finding, its evidence, the actions, the events, the port's report.
    pub(crate) fn to_text(&self) -> String {
        let mut out = String::new();
        let f = &self.answer["finding"];
        if f.is_object() {
            let text = |k: &str| f[k].as_str().unwrap_or("-").to_owned();
            let mut device = text("device");
            if let Some(p) = f["port"].as_u64() {
                let _ = write!(device, "/{p}");
            }
            if let Some(g) = f["gpu"].as_str() {
                device = format!("gpu {g}");
            }
            let end = f["end"]
                .as_u64()
                .map_or_else(|| "active".to_owned(), format_time);
            let _ = writeln!(out, "finding {}", text("id"));
            let _ = writeln!(out, "  rule:     {}", text("rule"));
            let _ = writeln!(out, "  severity: {}", text("severity"));
            let _ = writeln!(out, "  node:     {}", text("node"));
            let _ = writeln!(out, "  device:   {device}");
            if let Some(j) = f["job_id"].as_str() {
                let _ = writeln!(out, "  job:      {j}");
            }
            let _ = writeln!(
                out,
                "  span:     {} to {end}",
                format_time(f["start"].as_u64().unwrap_or(0))
            );
            let _ = writeln!(out, "  summary:  {}", text("summary"));
            out.push_str("  evidence:\n");
            let evidence = serde_json::to_string_pretty(&f["evidence"]).unwrap_or_default();
            for line in evidence.lines() {
                let _ = writeln!(out, "    {line}");
            }
        } else if let Some(id) = self.answer["finding_id"].as_str() {
            let _ = writeln!(
                out,
                "finding {id}: no longer held by the collector (only its actions are shown)"
            );
        }
        let records = self.answer["records"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if records.is_empty() {
            out.push_str("actions: none (no rule of [actions] matched it)\n");
        } else {
            out.push_str("actions:\n");
        }
        for r in &records {
            let _ = writeln!(out, "  {}", record_line(r));
        }
        if let (Some((start, end)), Some(events)) = (self.window, &self.events) {
            let _ = writeln!(
                out,
                "events of {} from {} to {}:",
                f["node"].as_str().unwrap_or("?"),
                format_time(start),
                format_time(end)
            );
            match events {
                Ok(json) => {
                    for line in events_text(json).lines() {
                        let _ = writeln!(out, "  {line}");
                    }
                }
                Err(e) => {
                    let _ = writeln!(out, "  not available: {e}");
                }
            }
        }
        if let (Some((start, end)), Some(report)) = (self.window, &self.report) {
            let _ = writeln!(
                out,
                "flight recorder of {} {}/{} from {} to {} (the collector's archive):",
                f["node"].as_str().unwrap_or("?"),
                f["device"].as_str().unwrap_or("?"),
                f["port"],
                format_time(start),
                format_time(end)
            );
            match report {
                Ok(report) if report.ports.is_empty() => {
                    out.push_str("  no data of this port in the archive over that span\n");
                }
                Ok(report) => {
                    for line in report.to_text().lines() {
                        let _ = writeln!(out, "  {line}");
                    }
                }
                Err(e) => {
                    let _ = writeln!(out, "  not available: {e}");
                }
            }
        }
        out
    }
}

/// One audit record: time, action, outcome, node, finding and detail.
pub(crate) fn record_line(r: &Json) -> String {
    format!(
        "{} {:<7} {:<8} {:<16} {}{}{}",
        format_time(r["at"].as_u64().unwrap_or(0)),
        r["action"].as_str().unwrap_or("?"),
        r["outcome"].as_str().unwrap_or("?"),
        r["node"].as_str().unwrap_or("?"),
        if r["seq"].is_u64() {
            format!("#{} ", r["seq"])
        } else {
            String::new()
        },
        r["finding"]
            .as_str()
            .map(|f| format!("{f}: "))
            .unwrap_or_default(),
        r["detail"].as_str().unwrap_or(""),
    )
}
