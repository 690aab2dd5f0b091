//! What railscope itself reads from the agent's series: the finding rules
//! ([`monitor_findings::reads`]), the straggler search
//! ([`monitor_findings::stragglers::metrics_read`]) and the dashboard's views
//! (`dashboard::VIEWS`). Each declares its own list next to the code
//! that reads it; this module only gathers them, so that `railscope select` never advises
//! turning off a metric one of them needs (it asks `/api/v1/reads`).

use std::collections::{BTreeMap, BTreeSet};

use monitor_findings::stragglers;

use crate::dashboard;

/// Every metric railscope reads, with what reads it (`finding ib_port_degraded`,
/// `stragglers`, `dashboard fleet view`), each reader once, in declaration order.
pub fn readers() -> BTreeMap<&'static str, Vec<String>> {
    let mut out: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    let mut add = |metric: &'static str, reader: String| {
        let readers = out.entry(metric).or_default();
        if !readers.contains(&reader) {
            readers.push(reader);
        }
    };
    for (rule, metrics) in monitor_findings::reads::RULE_READS {
        for &m in *metrics {
            add(m, format!("finding {rule}"));
        }
    }
    for m in stragglers::metrics_read() {
        add(m, "stragglers".into());
    }
    for (view, metrics) in dashboard::VIEWS {
        for &m in *metrics {
            add(m, format!("dashboard {view} view"));
        }
    }
    out
}

/// `GET /api/v1/reads`: [`readers`] as `{"reads": {metric: [reader, ...]}}`, what `railscope
/// select` (which runs away from the collector) never drops.
pub async fn handler() -> axum::Json<serde_json::Value> {
    axum::Json(serde_json::json!({ "reads": readers() }))
}

/// Every metric railscope reads (the finding rules, the straggler search, the dashboard).
pub fn metrics_railscope_reads() -> BTreeSet<&'static str> {
    monitor_findings::metrics_read()
        .into_iter()
        .chain(stragglers::metrics_read())
        .chain(
            dashboard::VIEWS
                .iter()
                .flat_map(|(_, metrics)| metrics.iter().copied()),
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A finding rule, the straggler search, a `select` keep-rule (which keeps exactly what
    /// these read) or a dashboard view reading a metric the agent never sends would wait
    /// forever on nothing: each must be one of `monitor_wire::names::AGENT_METRICS`.
    #[test]
    fn everything_railscope_reads_is_a_metric_the_agent_sends() {
        let unknown: Vec<(&str, Vec<String>)> = readers()
            .into_iter()
            .filter(|(metric, _)| !monitor_wire::names::is_agent_metric(metric))
            .collect();
        assert!(
            unknown.is_empty(),
            "read, but never sent by the agent: {unknown:?}"
        );
        assert_eq!(metrics_railscope_reads().len(), readers().len());
    }

    #[test]
    fn the_port_metrics_the_rules_stragglers_and_charts_need_are_read() {
        let read = metrics_railscope_reads();
        assert_eq!(read, readers().keys().copied().collect());
        let readers = readers();
        assert_eq!(
            readers["railscope_ib_port_rate_gbps"],
            [
                "finding ib_port_degraded",
                "dashboard fleet view",
                "dashboard job view"
            ]
        );
        assert_eq!(
            readers["railscope_ib_port_xmit_bytes_total"],
            [
                "stragglers",
                "dashboard fleet view",
                "dashboard job view",
                "dashboard node view"
            ]
        );
        for m in [
            "railscope_ib_port_width_lanes",
            "railscope_ib_port_rcv_bytes_total",
            "railscope_ib_link_downed_total",
            "railscope_ib_port_phys_state",
            "railscope_gpu_row_remap_pending",
            "railscope_gpu_sm_util_ratio",
        ] {
            assert!(read.contains(m), "{m}");
        }
    }
}
