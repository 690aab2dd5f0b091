//! Which of a netdev's ethtool statistics become series, and under which names.
//!
//! Every statistic is passed through, named `railscope_ethtool_<stat>_total` with `<stat>`
//! made a metric name part as the IB counter files are (lowercase, `[a-z0-9_]`, a trailing
//! `_total` not doubled), except the per-queue ones of a netdev that has many: mlx5 prints
//! some 40 statistics per channel (`rx0_packets`, `tx3_bytes`, `ch5_events`), hundreds per
//! port on a node with 64 cores, and each is a share of a port-level total it also prints
//! (`rx_packets`, `rx_bytes`), so they would multiply the series without saying anything new
//! about the port. A netdev whose per-queue statistics are all it has (a veth or virtio-net
//! of one or two queues, under soft-RoCE: `rx_queue_0_drops`) keeps them: at most
//! [`PER_QUEUE_LIMIT`] per-queue statistics are kept, and beyond that none.
//! Per-priority statistics (`rx_prio3_pause`, `tx_prio3_pause_duration`, `rx_prio3_marked`)
//! are the port's own, one per traffic class, and always kept.

use monitor_wire::names::metric::ETHTOOL_PREFIX;

use crate::sources::ib_sysfs::metric_stem;

/// The most per-queue statistics a netdev may have for them to be kept.
pub const PER_QUEUE_LIMIT: usize = 128;

/// Whether `stat` counts one queue or channel rather than the port: a word that is a queue's
/// name with its number (`rx0`, `tx12`, `ch5`, `sq3`, `rq0`, `cq1`, `txq2`, `queue0`), the
/// word `queue` followed by a number (`rx_queue_0_drops`), or a name that starts with a
/// queue's number (`tx-0.tx_packets`, `[3]: rx_ucast_packets`). A size range
/// (`rx_65_to_127_bytes_phy`) is the port's.
pub fn is_per_queue(stat: &str) -> bool {
    const QUEUES: &[&str] = &["rx", "tx", "ch", "sq", "rq", "cq", "txq", "rxq", "queue"];
    let s = stat.to_ascii_lowercase();
    let digit_at = |i: usize| s.as_bytes().get(i).is_some_and(u8::is_ascii_digit);
    if (s.starts_with('[') && digit_at(1))
        || ((s.starts_with("rx-") || s.starts_with("tx-")) && digit_at(3))
    {
        return true;
    }
    let words: Vec<&str> = s
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let numeric = |w: &str| w.bytes().all(|b| b.is_ascii_digit());
    words.iter().enumerate().any(|(i, w)| {
        let letters = w.trim_end_matches(|c: char| c.is_ascii_digit());
        let numbered = letters.len() < w.len() && QUEUES.contains(&letters);
        let followed = *w == "queue" && words.get(i + 1).is_some_and(|n| numeric(n));
        numbered || followed
    })
}

/// The series name of the statistic `stat`.
pub fn series_name(stat: &str) -> String {
    format!("{ETHTOOL_PREFIX}{}_total", metric_stem(stat))
}

/// The statistics of a set that become series, as (index in the set, series name), in the
/// set's order: per-queue ones only when the set has at most [`PER_QUEUE_LIMIT`] of them; a
/// statistic whose series name an earlier one took is left out (a driver printing a name
/// twice).
pub fn kept(stats: &[String]) -> Vec<(usize, String)> {
    let per_queue = stats.iter().filter(|s| is_per_queue(s)).count();
    let keep_queues = per_queue <= PER_QUEUE_LIMIT;
    let mut taken = std::collections::HashSet::new();
    stats
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.is_empty() && (keep_queues || !is_per_queue(s)))
        .filter_map(|(i, s)| {
            let name = series_name(s);
            taken.insert(name.clone()).then_some((i, name))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_and_channel_statistics_are_told_from_the_ports_own() {
        for stat in [
            "rx0_packets",
            "tx3_bytes",
            "ch5_events",
            "rx12_xdp_drop",
            "rx_queue_0_drops",
            "tx_queue_1_xdp_xmit",
            "tx-0.tx_packets",
            "txq2_bytes",
            "[3]: rx_ucast_packets",
            "queue0_bytes",
        ] {
            assert!(is_per_queue(stat), "{stat}");
        }
        for stat in [
            "rx_prio3_pause",
            "rx_prio3_pause_duration",
            "tx_prio7_pause",
            "rx_prio0_marked",
            "rx_discards_phy",
            "rx_out_of_buffer",
            "rx_pause_ctrl_phy",
            "tx_packets",
            "peer_ifindex",
            "rx_vport_rdma_unicast_bytes",
            "rx_65_to_127_bytes_phy",
        ] {
            assert!(!is_per_queue(stat), "{stat}");
        }
    }

    #[test]
    fn many_queues_are_left_out_and_a_few_kept() {
        let mut mlx5: Vec<String> = vec!["rx_bytes".into(), "rx_prio3_pause".into()];
        for ch in 0..64 {
            mlx5.push(format!("rx{ch}_packets"));
            mlx5.push(format!("tx{ch}_packets"));
            mlx5.push(format!("ch{ch}_events"));
        }
        assert_eq!(
            kept(&mlx5),
            [
                (0, "railscope_ethtool_rx_bytes_total".to_string()),
                (1, "railscope_ethtool_rx_prio3_pause_total".to_string()),
            ]
        );
        let veth: Vec<String> = ["peer_ifindex", "rx_queue_0_drops", "Rx-Queue 0 Drops"]
            .map(String::from)
            .into();
        assert_eq!(
            kept(&veth),
            [
                (0, "railscope_ethtool_peer_ifindex_total".to_string()),
                (1, "railscope_ethtool_rx_queue_0_drops_total".to_string()),
            ],
            "the third names the same series as the second"
        );
    }
}
