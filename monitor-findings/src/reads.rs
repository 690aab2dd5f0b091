//! Which series each rule reads. Each rule family declares the series it reads in its
//! `SERIES` (the engine watches those and nothing else, so a rule cannot read a series its
//! family leaves out); [`RULE_READS`] says which of its rules reads which, and the tests below
//! hold the two together: every rule of a family is listed, and the series its rules are
//! listed with are exactly its `SERIES`. `railscope select` asks [`metrics_read`] so that it
//! never advises turning off what a rule needs ([`crate::reads`]).

use std::collections::BTreeSet;

use monitor_wire::names::metric;

use super::{affinity, clock_skew, fabric, gpus, hardware, ib_links, pfc, verbs};

/// Each rule and the series it reads, by metric name; the rules that read events only (the
/// kernel's port events, XIDs, a GPU lost) read none. (`ib_port_down` reads the port state
/// samples as they arrive, beside the port events.)
pub const RULE_READS: &[(&str, &[&str])] = &[
    (
        "ib_port_down",
        &[metric::IB_PORT_STATE, metric::IB_PORT_PHYS_STATE],
    ),
    ("ib_link_flapping", &[]),
    ("ib_symbol_errors", &[metric::IB_SYMBOL_ERROR_TOTAL]),
    (
        "ib_link_error_recovery",
        &[metric::IB_LINK_ERROR_RECOVERY_TOTAL],
    ),
    ("ib_link_downed", &[metric::IB_LINK_DOWNED_TOTAL]),
    (
        "ib_port_degraded",
        &[
            metric::IB_PORT_STATE,
            metric::IB_PORT_WIDTH_LANES,
            metric::IB_PORT_RATE_GBPS,
            metric::IB_PORT_LINK_LAYER_INFO,
            metric::RDMA_DEVICE_INFO,
        ],
    ),
    ("ib_phys_state", &[metric::IB_PORT_PHYS_STATE]),
    ("roce_congestion", &[metric::IB_NP_CNP_SENT_TOTAL]),
    // The agents' LLDP neighbours (the topology) and their clock offsets (DOWN transitions
    // on the collector's clock).
    (
        "fabric_upstream_down",
        &[
            metric::IB_PORT_NEIGHBOR_INFO,
            metric::AGENT_CLOCK_OFFSET_SECONDS,
            metric::AGENT_CLOCK_OFFSET_ERROR_SECONDS,
        ],
    ),
    (pfc::RULE, pfc::SERIES),
    ("gpu_xid", &[]),
    ("gpu_lost", &[]),
    ("gpu_ecc_uncorrected", &[metric::GPU_ECC_ERRORS_TOTAL]),
    ("gpu_row_remap_pending", &[metric::GPU_ROW_REMAP_PENDING]),
    ("gpu_row_remap_failed", &[metric::GPU_ROW_REMAP_FAILED]),
    ("gpu_thermal_throttle", &[metric::GPU_THROTTLE_ACTIVE]),
    ("gpu_power_throttle", &[metric::GPU_THROTTLE_ACTIVE]),
    (
        "gpu_pcie_degraded",
        &[
            metric::GPU_PCIE_LINK_GENERATION,
            metric::GPU_PCIE_LINK_MAX_GENERATION,
            metric::GPU_PCIE_LINK_WIDTH_LANES,
            metric::GPU_PCIE_LINK_MAX_WIDTH_LANES,
            metric::GPU_UTILIZATION_RATIO,
        ],
    ),
    (
        "pcie_downtrained",
        &[
            metric::NODE_HARDWARE_INFO,
            metric::GPU_PCI_INFO,
            metric::GPU_PCIE_LINK_GENERATION,
            metric::GPU_PCIE_LINK_MAX_GENERATION,
            metric::GPU_PCIE_LINK_WIDTH_LANES,
            metric::GPU_PCIE_LINK_MAX_WIDTH_LANES,
            metric::RDMA_DEVICE_INFO,
            metric::RDMA_PCIE_LINK_GENERATION,
            metric::RDMA_PCIE_LINK_MAX_GENERATION,
            metric::RDMA_PCIE_LINK_WIDTH_LANES,
            metric::RDMA_PCIE_LINK_MAX_WIDTH_LANES,
        ],
    ),
    (
        "firmware_drift",
        &[
            metric::NODE_HARDWARE_INFO,
            metric::GPU_PCI_INFO,
            metric::RDMA_DEVICE_INFO,
        ],
    ),
    (
        "device_missing",
        &[
            metric::NODE_HARDWARE_INFO,
            metric::NODE_GPUS,
            metric::NODE_RDMA_DEVICES,
            metric::NODE_ACTIVE_PORTS,
        ],
    ),
    (
        "topology_drift",
        &[
            metric::NODE_HARDWARE_INFO,
            metric::NODE_GPUS,
            metric::NODE_RDMA_DEVICES,
            metric::GPU_PCI_INFO,
            metric::RDMA_DEVICE_INFO,
        ],
    ),
    ("nic_affinity", affinity::SERIES),
    ("verbs_qp_error", &[verbs::SERIES]),
    ("verbs_cm_reject", &[verbs::SERIES]),
    (clock_skew::RULE, clock_skew::SERIES),
    // The time of each node's last frame, from the live table: no series.
    ("node_silent", &[]),
];

/// Every series a finding rule reads: the union of the families' `SERIES`.
pub fn metrics_read() -> BTreeSet<&'static str> {
    ib_links::SERIES
        .iter()
        .chain(fabric::SERIES)
        .chain(gpus::SERIES)
        .chain(hardware::SERIES)
        .chain(pfc::SERIES)
        .chain(affinity::SERIES)
        .chain(clock_skew::SERIES)
        .copied()
        .chain([verbs::SERIES])
        .collect()
}

/// The rules that read `metric`, in [`RULE_READS`]'s order.
pub fn rules_reading(metric: &str) -> impl Iterator<Item = &'static str> + '_ {
    RULE_READS
        .iter()
        .filter(move |(_, reads)| reads.contains(&metric))
        .map(|(rule, _)| *rule)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each family's rules and the series it declares.
    fn families() -> [(
        &'static str,
        &'static [&'static str],
        BTreeSet<&'static str>,
    ); 9] {
        [
            (
                "ib_links",
                ib_links::RULES,
                ib_links::SERIES.iter().copied().collect(),
            ),
            (
                "fabric",
                fabric::RULES,
                fabric::SERIES.iter().copied().collect(),
            ),
            ("gpus", gpus::RULES, gpus::SERIES.iter().copied().collect()),
            ("verbs", verbs::RULES, [verbs::SERIES].into()),
            (
                "profile",
                super::super::profile::RULES,
                hardware::SERIES.iter().copied().collect(),
            ),
            ("pfc", pfc::RULES, pfc::SERIES.iter().copied().collect()),
            (
                "affinity",
                affinity::RULES,
                affinity::SERIES.iter().copied().collect(),
            ),
            ("silence", super::super::silence::RULES, BTreeSet::new()),
            (
                "clock_skew",
                clock_skew::RULES,
                clock_skew::SERIES.iter().copied().collect(),
            ),
        ]
    }

    #[test]
    fn every_rule_is_listed_once_with_what_it_reads() {
        let listed: Vec<&str> = RULE_READS.iter().map(|(r, _)| *r).collect();
        let unique: BTreeSet<&str> = listed.iter().copied().collect();
        assert_eq!(
            unique.len(),
            listed.len(),
            "a rule listed twice: {listed:?}"
        );
        let rules: BTreeSet<&str> = families()
            .iter()
            .flat_map(|(_, rules, _)| rules.iter().copied())
            .collect();
        assert_eq!(unique, rules);
    }

    #[test]
    fn a_familys_rules_read_exactly_the_series_it_declares() {
        for (family, rules, series) in families() {
            let read: BTreeSet<&str> = RULE_READS
                .iter()
                .filter(|(r, _)| rules.contains(r))
                .flat_map(|(_, reads)| reads.iter().copied())
                .collect();
            assert_eq!(read, series, "{family}");
        }
        let all: BTreeSet<&str> = RULE_READS
            .iter()
            .flat_map(|(_, reads)| reads.iter().copied())
            .collect();
        assert_eq!(all, metrics_read());
    }

    #[test]
    fn the_port_rules_read_width_rate_and_the_error_counters() {
        assert_eq!(
            rules_reading("railscope_ib_port_rate_gbps").collect::<Vec<_>>(),
            ["ib_port_degraded"]
        );
        assert_eq!(
            rules_reading("railscope_gpu_throttle_active").collect::<Vec<_>>(),
            ["gpu_thermal_throttle", "gpu_power_throttle"]
        );
        for m in [
            "railscope_ib_link_downed_total",
            "railscope_ib_port_phys_state",
            "railscope_gpu_row_remap_pending",
            "railscope_gpu_row_remap_failed",
        ] {
            assert!(metrics_read().contains(m), "{m}");
        }
    }
}
