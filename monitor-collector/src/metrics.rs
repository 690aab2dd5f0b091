//! `/metrics` in the Prometheus text format: the latest value of every series of every node
//! (the agents' own names, which follow Prometheus' conventions: `_total` counters, units in
//! the name), with a `node` label and the sample's own timestamp, then the collector's health
//! under `railscope_collector_`.
//!
//! Why timestamps: agents send samples in batches (every 10 s) and sample adaptively, so the
//! time a value was read is not the time of the scrape; Prometheus keeps the read time.

use std::{fmt::Write as _, sync::atomic::Ordering};

use monitor_actions::alert_stats::{AlertStats, Counters};
use monitor_findings::live_table::LatestValue;
use monitor_wire::{Kind, names::metric};

use crate::{
    drops::DropReason,
    nodes::{LiveSeries, NodeSet, kind_name},
    shared::Shared,
};

/// The whole exposition at `now_unix_ns`.
pub fn render(shared: &Shared, now_unix_ns: u64) -> String {
    let mut out = String::new();
    render_series(&mut out, shared.table.live_series(now_unix_ns));
    render_health(&mut out, shared);
    render_node_health(&mut out, shared);
    if let Some(store) = &shared.findings {
        crate::findings::api::write_metrics(&mut out, store);
    }
    if let Some(extra) = &shared.extra_metrics {
        extra(&mut out);
    }
    out
}

/// The series and per-node health of the nodes of `set` only (`/metrics?node=` and
/// `/metrics?shard=&shards=`): a scrape target that grows with its share of the fleet, not
/// with the fleet. The fleet-level families are on `/metrics/fleet`.
/// None when `set` is one node the collector does not hold.
pub fn render_nodes(shared: &Shared, set: &NodeSet, now_unix_ns: u64) -> Option<String> {
    let nodes = shared.table.summaries_of(set);
    if nodes.is_empty() && matches!(set, NodeSet::One(_)) {
        return None;
    }
    let mut out = String::new();
    render_series(&mut out, shared.table.live_series_of(set, now_unix_ns));
    render_node_families(&mut out, &nodes);
    Some(out)
}

/// Everything of `/metrics` that is not a node's (`/metrics/fleet`): the collector's own
/// totals, the nodes' count by key, the archive's and remote-write's, and the findings, whose
/// size grows with the findings open rather than with the fleet.
pub fn render_fleet(shared: &Shared) -> String {
    let mut out = String::new();
    render_health(&mut out, shared);
    render_nodes_by_key(&mut out, &shared.table.summaries());
    if let Some(store) = &shared.findings {
        crate::findings::api::write_metrics(&mut out, store);
    }
    if let Some(extra) = &shared.extra_metrics {
        extra(&mut out);
    }
    out
}

/// The collector's own totals only (`/metrics/collector`): what `render` ends with, without
/// the fleet's series and the per-node health, whose rendering grows with the fleet; for
/// polling the collector's health often (`cargo xtask bench collector` does).
pub fn render_own(shared: &Shared) -> String {
    let mut out = String::new();
    render_health(&mut out, shared);
    if let Some(store) = &shared.findings {
        crate::findings::api::write_tick_metrics(&mut out, store);
    }
    if let Some(extra) = &shared.extra_metrics {
        extra(&mut out);
    }
    out
}

/// The archive's files: bytes on disk, segments, records, torn tails cut, errors.
pub fn write_archive_stats(out: &mut String, s: &monitor_archive::archive::ArchiveStats) {
    use Kind::{Counter, Gauge};
    let families: [(&str, Kind, &str, u64); 10] = [
        (
            "railscope_collector_archive_disk_bytes",
            Gauge,
            "Bytes of all archive segment files.",
            s.bytes_on_disk,
        ),
        (
            "railscope_collector_archive_segments",
            Gauge,
            "Archive segments (sealed ones, full ones waiting to be sealed, the open one).",
            s.segments,
        ),
        (
            "railscope_collector_archive_records",
            Gauge,
            "Records in the archive (frames and schema records).",
            s.records,
        ),
        (
            "railscope_collector_archive_torn_tails_cut_total",
            Counter,
            "Torn segment tails cut when the archive was opened.",
            s.torn_tails_cut,
        ),
        (
            "railscope_collector_archive_file_errors_total",
            Counter,
            "Failed archive file writes, syncs and seals.",
            s.write_errors,
        ),
        (
            "railscope_collector_archive_dropped_records_total",
            Counter,
            "Records the archive dropped because writes kept failing.",
            s.dropped_records,
        ),
        (
            "railscope_collector_archive_segments_deleted_total",
            Counter,
            "Segments deleted by retention.",
            s.segments_deleted,
        ),
        (
            "railscope_collector_archive_segments_sealed_total",
            Counter,
            "Archive segments sealed since the collector started.",
            s.segments_sealed,
        ),
        (
            "railscope_collector_archive_segments_waiting_seal",
            Gauge,
            "Full archive segments waiting for the sealer thread (readable meanwhile).",
            s.segments_waiting_seal,
        ),
        (
            "railscope_collector_archive_unwritten_bytes",
            Gauge,
            "Bytes appended to the archive and not yet written out.",
            s.unwritten_bytes,
        ),
    ];
    for (name, kind, help, value) in families {
        one(out, name, kind, help, value);
    }
}

fn render_series(out: &mut String, mut live: Vec<LiveSeries>) {
    live.sort_by(|a, b| {
        (&a.series.name, &a.node, &a.series.labels).cmp(&(
            &b.series.name,
            &b.node,
            &b.series.labels,
        ))
    });
    let mut family: Option<(&str, Kind)> = None;
    for l in &live {
        let name = &*l.series.name;
        let kind = match family {
            Some((current, kind)) if current == name => kind,
            _ => {
                let kind = l.series.kind;
                family = Some((name, kind));
                let help = metric::help(name);
                let help = help.as_deref().unwrap_or(UNKNOWN_SERIES_HELP);
                let name = metric_name(name);
                let _ = writeln!(out, "# HELP {name} {}", help_text(help));
                let _ = writeln!(out, "# TYPE {name} {}", kind_name(kind));
                kind
            }
        };
        // One family has one type: a node that sends the name with the other kind is left out.
        if l.series.kind != kind {
            continue;
        }
        out.push_str(&metric_name(name));
        out.push('{');
        label(out, "node", &l.node, true);
        for (k, v) in l.series.labels.iter() {
            let key = if k == "node" { "exported_node" } else { k };
            label(out, key, v, false);
        }
        out.push('}');
        let value = match l.latest.value {
            LatestValue::Counter { value, .. } => value.to_string(),
            LatestValue::Gauge { mean, .. } => float(mean),
        };
        let _ = writeln!(out, " {value} {}", l.latest.unix_ns / 1_000_000);
    }
}

/// The `# HELP` of a family an agent sent that is none of the names this collector knows
/// (an agent of another version).
const UNKNOWN_SERIES_HELP: &str =
    "A series the agents send that this collector's version does not describe.";

/// `help` as the text format wants a HELP line: backslashes and line feeds escaped.
fn help_text(help: &str) -> std::borrow::Cow<'_, str> {
    if help.contains(['\\', '\n']) {
        help.replace('\\', "\\\\").replace('\n', "\\n").into()
    } else {
        help.into()
    }
}

/// A metric name with anything Prometheus does not allow replaced by `_`.
fn metric_name(name: &str) -> std::borrow::Cow<'_, str> {
    let valid = |i: usize, c: char| {
        c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
    };
    if !name.is_empty() && name.chars().enumerate().all(|(i, c)| valid(i, c)) {
        return name.into();
    }
    let mut s: String = name
        .chars()
        .enumerate()
        .map(|(i, c)| if valid(i, c) { c } else { '_' })
        .collect();
    if s.is_empty() {
        s.push('_');
    }
    s.into()
}

/// A metric family of an Alertmanager's [`Counters`]: name, help, value.
type AlertFamily = (&'static str, &'static str, fn(&Counters) -> u64);

/// `railscope_collector_alerts_sent_total` and `_failed_total`, one line per Alertmanager URL
/// (none without `[actions.alertmanager]`).
pub fn render_alert_stats(out: &mut String, stats: &AlertStats) {
    let families: [AlertFamily; 2] = [
        (
            "railscope_collector_alerts_sent_total",
            "Alerts (firing or resolved) the Alertmanager at this URL accepted.",
            |c| c.sent.load(Ordering::Relaxed),
        ),
        (
            "railscope_collector_alerts_failed_total",
            "Sends of alerts to the Alertmanager at this URL that failed (each is tried again).",
            |c| c.failed.load(Ordering::Relaxed),
        ),
    ];
    if stats.by_url().next().is_none() {
        return;
    }
    for (name, help, value) in families {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} counter");
        for (url, c) in stats.by_url() {
            let mut labels = String::from("{");
            label(&mut labels, "alertmanager", url, true);
            let _ = writeln!(out, "{name}{labels}}} {}", value(c));
        }
    }
}

pub(crate) fn label(out: &mut String, key: &str, value: &str, first: bool) {
    if !first {
        out.push(',');
    }
    for (i, c) in key.chars().enumerate() {
        let ok = c.is_ascii_alphabetic() || c == '_' || (i > 0 && c.is_ascii_digit());
        out.push(if ok { c } else { '_' });
    }
    out.push_str("=\"");
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
}

fn float(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        v.to_string()
    }
}

/// A family of the collector's own: HELP, TYPE and its lines.
fn family(out: &mut String, name: &str, kind: Kind, help: &str, lines: &[(String, String)]) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {}", kind_name(kind));
    for (labels, value) in lines {
        let _ = writeln!(out, "{name}{labels} {value}");
    }
}

fn one(out: &mut String, name: &str, kind: Kind, help: &str, value: impl ToString) {
    family(out, name, kind, help, &[(String::new(), value.to_string())]);
}

fn render_health(out: &mut String, shared: &Shared) {
    let s = &shared.stats;
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    use Kind::{Counter, Gauge};
    one(
        out,
        "railscope_collector_datagrams_received_total",
        Counter,
        "Datagrams read from the UDP sockets.",
        get(&s.datagrams),
    );
    one(
        out,
        "railscope_collector_receive_batches_total",
        Counter,
        "recvmmsg calls that returned datagrams.",
        get(&s.batches),
    );
    one(
        out,
        "railscope_collector_frames_accepted_total",
        Counter,
        "Frames authenticated, decoded and accepted.",
        get(&s.frames),
    );
    one(
        out,
        "railscope_collector_samples_accepted_total",
        Counter,
        "Samples in accepted frames.",
        get(&s.samples),
    );
    one(
        out,
        "railscope_collector_events_accepted_total",
        Counter,
        "Events in accepted frames.",
        get(&s.events),
    );
    one(
        out,
        "railscope_collector_accepted_bytes_total",
        Counter,
        "Bytes of accepted frames.",
        get(&s.bytes),
    );
    let drops: Vec<(String, String)> = DropReason::ALL
        .iter()
        .map(|r| {
            (
                format!("{{reason=\"{}\"}}", r.label()),
                shared.drops.count(*r).to_string(),
            )
        })
        .collect();
    family(
        out,
        "railscope_collector_frames_dropped_total",
        Counter,
        "Datagrams dropped, by reason.",
        &drops,
    );
    let (unauthenticated, forbidden) = shared.web.refused.get();
    family(
        out,
        "railscope_collector_http_refused_total",
        Counter,
        "HTTP requests refused: without valid credentials (401), or by role (403).",
        &[
            (
                "{reason=\"unauthenticated\"}".into(),
                unauthenticated.to_string(),
            ),
            ("{reason=\"forbidden\"}".into(), forbidden.to_string()),
        ],
    );
    one(
        out,
        "railscope_collector_schema_requests_sent_total",
        Counter,
        "Schema requests sent to agents whose schema the collector lacked.",
        get(&s.schema_requests_sent),
    );
    let acks = &shared.acks;
    one(
        out,
        "railscope_collector_acks_sent_total",
        Counter,
        "Acknowledgements sent to agents: which of their frames are durable in the archive.",
        get(&acks.sent),
    );
    one(
        out,
        "railscope_collector_ack_timings_sent_total",
        Counter,
        "Timings sent with acknowledgements (when the newest frame answered for arrived, when the answer left): the agents' clock offset exchanges.",
        get(&acks.timings_sent),
    );
    one(
        out,
        "railscope_collector_ack_bytes_total",
        Counter,
        "Bytes of the acknowledgements and their timings sent (UDP payload).",
        get(&acks.bytes),
    );
    one(
        out,
        "railscope_collector_ack_errors_total",
        Counter,
        "Acknowledgements that could not be sent.",
        get(&acks.errors),
    );
    one(
        out,
        "railscope_collector_duplicates_acknowledged_total",
        Counter,
        "Copies of stored frames that arrived again and were acknowledged again, not stored.",
        get(&acks.duplicates_answered),
    );
    one(
        out,
        "railscope_collector_nodes",
        Gauge,
        "Nodes held.",
        shared.table.node_count(),
    );
    one(
        out,
        "railscope_collector_series",
        Gauge,
        "Series held over all nodes.",
        shared.table.series_count(),
    );
    let limits = shared.table.limits();
    one(
        out,
        "railscope_collector_max_nodes",
        Gauge,
        "Bound on the nodes held.",
        limits.max_nodes,
    );
    one(
        out,
        "railscope_collector_max_series",
        Gauge,
        "Bound on the series held over all nodes.",
        limits.max_series,
    );
    let (events, event_bytes) = shared.events.held();
    one(
        out,
        "railscope_collector_recent_events",
        Gauge,
        "Events held for the live view.",
        events,
    );
    one(
        out,
        "railscope_collector_recent_event_bytes",
        Gauge,
        "Bytes the live view's events take.",
        event_bytes,
    );

    match &shared.archive {
        Some(queue) => {
            let w = queue.stats();
            one(
                out,
                "railscope_collector_archive_queue_frames",
                Gauge,
                "Accepted frames waiting for the archive writer.",
                w.queued_frames.load(Ordering::Relaxed),
            );
            one(
                out,
                "railscope_collector_archive_queue_bytes",
                Gauge,
                "Bytes of frames waiting for the archive writer.",
                w.queued_bytes.load(Ordering::Relaxed),
            );
            one(
                out,
                "railscope_collector_archive_queue_capacity_bytes",
                Gauge,
                "Bound of the archive queue.",
                queue.capacity_bytes(),
            );
            one(
                out,
                "railscope_collector_archive_frames_total",
                Counter,
                "Frames appended to the archive.",
                get(&w.appended),
            );
            family(
                out,
                "railscope_collector_archive_dropped_frames_total",
                Counter,
                "Accepted frames not archived, by reason (kept in the live view).",
                &[
                    (
                        "{reason=\"queue_full\"}".into(),
                        get(&w.dropped_queue_full).to_string(),
                    ),
                    (
                        "{reason=\"error\"}".into(),
                        get(&w.append_errors).to_string(),
                    ),
                ],
            );
            one(
                out,
                "railscope_collector_archive_write_errors_total",
                Counter,
                "Archive write-outs that failed.",
                get(&w.tick_errors),
            );
            one(
                out,
                "railscope_collector_archive_failing",
                Gauge,
                "1 while the archive's last append or write-out failed (a full disk).",
                u8::from(w.failing.load(Ordering::Relaxed)),
            );
        }
        None => one(
            out,
            "railscope_collector_archive_enabled",
            Gauge,
            "0: this collector keeps no archive.",
            0,
        ),
    }
}

/// The collector's health per node (frames, samples, loss, last seen, agent version).
fn render_node_health(out: &mut String, shared: &Shared) {
    let nodes = shared.table.summaries();
    render_nodes_by_key(out, &nodes);
    render_node_families(out, &nodes);
}

fn render_nodes_by_key(out: &mut String, nodes: &[crate::nodes::NodeSummary]) {
    // Which key the nodes' last frames carried: a rotation or a move off the shared key is
    // done when every node counts under `node`.
    let by_key: Vec<(String, String)> = ["node", "previous_node", "shared"]
        .iter()
        .map(|key| {
            let count = nodes.iter().filter(|n| n.key == *key).count();
            (format!("{{key=\"{key}\"}}"), count.to_string())
        })
        .collect();
    family(
        out,
        "railscope_collector_nodes_by_key",
        Kind::Gauge,
        "Nodes held, by the key their last frame was sealed with (node, previous_node, shared).",
        &by_key,
    );
}

/// The per-node health families of `nodes` (frames, loss, sessions, last seen, info).
fn render_node_families(out: &mut String, nodes: &[crate::nodes::NodeSummary]) {
    use Kind::{Counter, Gauge};
    let per_node = |f: &dyn Fn(&crate::nodes::NodeSummary) -> String| -> Vec<(String, String)> {
        nodes
            .iter()
            .map(|n| {
                let mut labels = String::from("{");
                label(&mut labels, "node", &n.node, true);
                labels.push('}');
                (labels, f(n))
            })
            .collect()
    };
    family(
        out,
        "railscope_collector_node_frames_total",
        Counter,
        "Frames accepted per node.",
        &per_node(&|n| n.frames.to_string()),
    );
    family(
        out,
        "railscope_collector_node_samples_total",
        Counter,
        "Samples accepted per node.",
        &per_node(&|n| n.samples.to_string()),
    );
    family(
        out,
        "railscope_collector_node_events_total",
        Counter,
        "Events accepted per node.",
        &per_node(&|n| n.events.to_string()),
    );
    family(
        out,
        "railscope_collector_node_frames_lost_total",
        Counter,
        "Frames missing from a node's sequence (a late arrival is taken back off).",
        &per_node(&|n| n.lost.to_string()),
    );
    family(
        out,
        "railscope_collector_node_frames_given_up_total",
        Counter,
        "Frames of a node's session the collector stopped waiting for (more gaps than it keeps): a copy arriving later is refused.",
        &per_node(&|n| n.given_up.to_string()),
    );
    family(
        out,
        "railscope_collector_node_frames_reordered_total",
        Counter,
        "Frames that arrived after a later one.",
        &per_node(&|n| n.reordered.to_string()),
    );
    family(
        out,
        "railscope_collector_node_frames_duplicated_total",
        Counter,
        "Frames refused as already received.",
        &per_node(&|n| n.duplicates.to_string()),
    );
    family(
        out,
        "railscope_collector_node_frames_replayed_total",
        Counter,
        "Frames refused as too old to place (old sequence numbers or sessions).",
        &per_node(&|n| n.replayed.to_string()),
    );
    family(
        out,
        "railscope_collector_node_unknown_samples_total",
        Counter,
        "Samples of series the node had not named yet.",
        &per_node(&|n| n.unknown_samples.to_string()),
    );
    family(
        out,
        "railscope_collector_node_sessions_total",
        Counter,
        "Sessions seen per node (1 + agent restarts).",
        &per_node(&|n| n.sessions.to_string()),
    );
    family(
        out,
        "railscope_collector_node_series",
        Gauge,
        "Series held per node.",
        &per_node(&|n| n.series.to_string()),
    );
    family(
        out,
        "railscope_collector_node_last_seen_timestamp_seconds",
        Gauge,
        "When the node's last frame was accepted.",
        &per_node(&|n| float(n.last_seen_unix_ns as f64 / 1e9)),
    );
    // The agents' clock offsets, of the nodes that sent one (docs/agent.md, "Clock offset").
    let clocks = |f: &dyn Fn(&crate::nodes::NodeSummary) -> Option<f64>| -> Vec<(String, String)> {
        nodes
            .iter()
            .filter_map(|n| {
                let value = f(n)?;
                let mut labels = String::from("{");
                label(&mut labels, "node", &n.node, true);
                labels.push('}');
                Some((labels, float(value)))
            })
            .collect()
    };
    family(
        out,
        "railscope_collector_node_clock_offset_seconds",
        Gauge,
        "The node's clock minus the collector's, as its agent last estimated it from the acknowledgements' round trips (positive: the node runs ahead).",
        &clocks(&|n| n.clock_offset_seconds),
    );
    family(
        out,
        "railscope_collector_node_clock_offset_error_seconds",
        Gauge,
        "The bound of the error of railscope_collector_node_clock_offset_seconds.",
        &clocks(&|n| n.clock_offset_error_seconds),
    );
    let info: Vec<(String, String)> = nodes
        .iter()
        .map(|n| {
            let mut labels = String::from("{");
            label(&mut labels, "node", &n.node, true);
            label(
                &mut labels,
                "agent_version",
                n.agent_version.as_deref().unwrap_or(""),
                false,
            );
            label(&mut labels, "address", &n.address, false);
            label(&mut labels, "session", &format!("{:08x}", n.session), false);
            labels.push('}');
            (labels, "1".into())
        })
        .collect();
    family(
        out,
        "railscope_collector_node_info",
        Gauge,
        "Each node's agent version, address and session.",
        &info,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_label_values_are_escaped() {
        assert_eq!(metric_name("railscope_ib_x_total"), "railscope_ib_x_total");
        assert_eq!(metric_name("9bad-name"), "_bad_name");
        let mut out = String::new();
        label(&mut out, "de-vice", "a\"b\\c\nd", true);
        assert_eq!(out, r#"de_vice="a\"b\\c\nd""#);
        assert_eq!(float(f64::NAN), "NaN");
        assert_eq!(float(f64::NEG_INFINITY), "-Inf");
        assert_eq!(float(312.456), "312.456");
        assert_eq!(help_text("a \\ b\nc"), "a \\\\ b\\nc");
    }
}
