//! Scraping a large fleet through one collector: `/metrics` of 12,500 nodes is one answer of
//! hundreds of megabytes (about 28 kB a node) that a Prometheus must take in one scrape, and
//! that one failed scrape loses whole. What operators run instead, and this module offers:
//!
//! - one target per node, `/metrics?node=NAME` (its series and its health, `up` per node, and
//!   Prometheus' own `hashmod` relabelling spreads the nodes over several Prometheus servers);
//! - or `N` shards, `/metrics?shard=K&shards=N` (each node in one shard by a hash of its name
//!   that survives restarts, [`shard_of`](crate::nodes::shard_of));
//! - and `/metrics/fleet`: the collector's own families and the findings, without any node's.
//!
//! `GET /api/v1/targets[?shards=N]` lists these targets in Prometheus' HTTP service discovery
//! format (`http_sd_configs`), so a Prometheus follows the fleet as nodes come and go.

use std::sync::Arc;

use axum::{
    Json,
    extract::{RawQuery, State},
    http::{HeaderMap, header},
};
use serde::Serialize;

use crate::{
    nodes::NodeSet,
    query::api::{ApiError, bad, one, params},
    shared::Shared,
};

/// Shards a target list may be cut into at most (each shard is one scrape).
pub(crate) const MAX_SHARDS: u64 = 65_536;

/// The nodes `/metrics`' query string asks for.
pub(crate) fn node_set(raw: Option<String>) -> Result<NodeSet, ApiError> {
    let pairs = params(raw, &["node", "shard", "shards"])?;
    let node = one(&pairs, "node")?;
    let shard = one(&pairs, "shard")?;
    let shards = one(&pairs, "shards")?;
    match (node, shard, shards) {
        (None, None, None) => Ok(NodeSet::All),
        (Some(node), None, None) => Ok(NodeSet::One(node.to_owned())),
        (None, Some(index), Some(of)) => {
            let of = shard_count(of)?;
            let index: u64 = index
                .parse()
                .map_err(|_| bad(format!("parameter \"shard\": {index:?} is not a number")))?;
            if index >= of {
                return Err(bad(format!(
                    "parameter \"shard\": {index} is not below \"shards\" ({of})"
                )));
            }
            Ok(NodeSet::Shard { index, of })
        }
        _ => Err(bad(
            "either \"node\", or \"shard\" with \"shards\", or neither".to_owned(),
        )),
    }
}

fn shard_count(of: &str) -> Result<u64, ApiError> {
    match of.parse::<u64>() {
        Ok(n) if (1..=MAX_SHARDS).contains(&n) => Ok(n),
        _ => Err(bad(format!(
            "parameter \"shards\": {of:?} is not a number from 1 to {MAX_SHARDS}"
        ))),
    }
}

/// One target group of Prometheus' HTTP service discovery.
#[derive(Serialize, Debug)]
pub(crate) struct TargetGroup {
    pub targets: [String; 1],
    pub labels: std::collections::BTreeMap<&'static str, String>,
}

/// `GET /api/v1/targets[?shards=N]`: a target per node (default) or per shard, and the
/// fleet-level target, all at the address the request was made to (its `Host`).
pub(crate) async fn handler(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Json<Vec<TargetGroup>>, ApiError> {
    let pairs = params(raw, &["shards"])?;
    let shards = one(&pairs, "shards")?.map(shard_count).transpose()?;
    let Some(address) = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| !h.is_empty())
    else {
        return Err(bad("the request has no Host header to name targets by"));
    };
    let nodes: Vec<String> = match shards {
        Some(_) => Vec::new(),
        None => shared
            .table
            .summaries()
            .into_iter()
            .map(|n| n.node)
            .collect(),
    };
    Ok(Json(targets(address, shards, &nodes)))
}

/// The target groups at `address`: one per node of `nodes`, or one per shard of `shards`,
/// then `/metrics/fleet`. Each has its own `instance` (the node, `shard-K-of-N`, `fleet`):
/// the targets share one address, and Prometheus' `up` must tell them apart.
pub(crate) fn targets(address: &str, shards: Option<u64>, nodes: &[String]) -> Vec<TargetGroup> {
    let group = |labels: &[(&'static str, String)]| TargetGroup {
        targets: [address.to_owned()],
        labels: labels.iter().cloned().collect(),
    };
    let mut out: Vec<TargetGroup> = match shards {
        Some(of) => (0..of)
            .map(|k| {
                group(&[
                    ("instance", format!("shard-{k}-of-{of}")),
                    ("__metrics_path__", "/metrics".into()),
                    ("__param_shard", k.to_string()),
                    ("__param_shards", of.to_string()),
                ])
            })
            .collect(),
        None => nodes
            .iter()
            .map(|node| {
                group(&[
                    ("instance", node.clone()),
                    ("__metrics_path__", "/metrics".into()),
                    ("__param_node", node.clone()),
                ])
            })
            .collect(),
    };
    out.push(group(&[
        ("instance", "fleet".into()),
        ("__metrics_path__", "/metrics/fleet".into()),
    ]));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nodes::shard_of;

    #[test]
    fn the_query_string_names_one_node_one_shard_or_all() {
        assert_eq!(node_set(None).ok(), Some(NodeSet::All));
        assert_eq!(
            node_set(Some("node=gpu-001".into())).ok(),
            Some(NodeSet::One("gpu-001".into()))
        );
        assert_eq!(
            node_set(Some("shard=3&shards=8".into())).ok(),
            Some(NodeSet::Shard { index: 3, of: 8 })
        );
        for refused in [
            "shard=8&shards=8",
            "shard=1",
            "shards=0&shard=0",
            "node=a&shard=0&shards=2",
            "node=a&node=b",
            "shard=x&shards=2",
            "nodes=a",
        ] {
            assert!(node_set(Some(refused.into())).is_err(), "{refused}");
        }
    }

    #[test]
    fn every_node_is_in_exactly_one_shard_and_stays_there() {
        let nodes: Vec<String> = (0..1000).map(|i| format!("gpu-{i:05}")).collect();
        let of = 8;
        let mut sizes = [0usize; 8];
        for node in &nodes {
            let holding: Vec<u64> = (0..of)
                .filter(|&k| NodeSet::Shard { index: k, of }.holds(node))
                .collect();
            assert_eq!(holding.len(), 1, "{node} is in shards {holding:?}");
            sizes[holding[0] as usize] += 1;
        }
        // Spread: no shard holds more than twice its share.
        assert!(sizes.iter().all(|&n| n > 0 && n < 250), "{sizes:?}");
        // The hash is the documented FNV-1a, not a per-process one: fixed values.
        assert_eq!(shard_of("", 1 << 32), 0x8422_2325);
        assert_eq!(shard_of("a", 1 << 32), 0x8601_ec8c);
    }

    #[test]
    fn targets_have_an_instance_each_and_the_fleet_target_last() {
        let nodes = vec!["n1".to_owned(), "n2".to_owned()];
        let groups = targets("collector:9400", None, &nodes);
        let instances: Vec<&str> = groups
            .iter()
            .map(|g| g.labels["instance"].as_str())
            .collect();
        assert_eq!(instances, ["n1", "n2", "fleet"]);
        assert_eq!(groups[1].labels["__param_node"], "n2");
        assert_eq!(groups[2].labels["__metrics_path__"], "/metrics/fleet");
        assert!(groups.iter().all(|g| g.targets[0] == "collector:9400"));
        let sharded = targets("c:1", Some(4), &[]);
        assert_eq!(sharded.len(), 5);
        assert_eq!(sharded[3].labels["instance"], "shard-3-of-4");
        assert_eq!(sharded[3].labels["__param_shards"], "4");
    }
}
