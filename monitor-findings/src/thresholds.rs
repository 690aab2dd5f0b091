//! Every rule's threshold (the `[findings]` table of collector.toml). Each default comes from
//! a rule operators use (docs/findings.md names the source; /work references:
//! NVSentinel's NIC monitor, gpud, NVIDIA's IB bring-up guide, NVIDIA's XID catalogue), or is
//! marked as railscope's own choice where no published rule exists.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct Thresholds {
    /// How often counters and gauges are evaluated, seconds (events are taken at once).
    pub tick_s: u64,
    /// Port DOWN transitions (kernel port events) within `flap-window-s` that make a port
    /// flapping: gpud, "three or more flaps".
    pub flap_downs: u32,
    pub flap_window_s: u64,
    /// Symbol errors per second (warning): NVSentinel's non-fatal `symbol_error > 10/s`.
    pub symbol_errors_per_s: f64,
    /// Symbol errors within an hour (critical): NVSentinel's fatal `symbol_error > 120/h`.
    pub symbol_errors_per_hour: u64,
    /// Link error recoveries per minute (warning): NVSentinel's "micro-flapping",
    /// `link_error_recovery > 5/min`.
    pub link_error_recovery_per_min: f64,
    /// How long a `link_downed` increment keeps its finding active, seconds (NVSentinel: any
    /// increment is fatal; NVIDIA's bring-up guide records every delta).
    pub link_downed_hold_s: u64,
    /// The width (lanes) and speed (Gb/s) a port should run at; unset: the fleet's most
    /// common value among active ports.
    pub expected_width_lanes: Option<f64>,
    pub expected_rate_gbps: Option<f64>,
    /// How long phys state must stay off LinkUp before it is a finding, seconds: gpud counts
    /// a port down for at least 25 s.
    pub phys_state_grace_s: u64,
    /// Modified z-score above which a port's CNP rate is far above the fleet's norm:
    /// Iglewicz & Hoaglin's 3.5.
    pub congestion_score: f64,
    /// ...and at least this many CNPs per second (railscope's choice: below it congestion
    /// control is not what slows a job).
    pub congestion_min_cnp_per_s: f64,
    /// A RoCE port's PFC pause frames per second (one priority, one direction) above this
    /// many times the fleet's median for that counter are a pause storm (railscope's choice:
    /// a storm runs orders of magnitude above a congested port's pauses)...
    pub pfc_storm_factor: f64,
    /// ...and above this many pause frames per second (railscope's choice: below it pauses
    /// are ordinary flow control).
    pub pfc_storm_min_pps: f64,
    /// A port paused more than this fraction of the last minute (mlx5's `*_pause_duration`)
    /// is in a pause storm whatever the fleet does (railscope's choice: half the time).
    pub pfc_storm_paused_fraction: f64,
    /// How long an XID or a lost GPU keeps its finding active, seconds (railscope's choice:
    /// the event needs an operator's action, which the collector cannot see).
    pub xid_hold_s: u64,
    /// GPU utilisation above which a PCIe link below its maximum counts (GPUs lower their
    /// link when idle to save power; NVIDIA's nvidia-smi documentation).
    pub pcie_busy_utilization: f64,
    /// QPs moving to ERR within `verbs-window-s` (warning; railscope's choice: any).
    pub qp_errors: u64,
    /// rdma_cm rejects within `verbs-window-s` (warning; railscope's choice).
    pub cm_rejects: u64,
    pub verbs_window_s: u64,
    /// Findings reloaded as active at start-up end if their condition is not seen again
    /// within this many seconds.
    pub restart_grace_s: u64,
    /// A node from which no frame came for this many seconds is `node_silent`, and its other
    /// findings stay open, marked stale (railscope's choice: the agent flushes every 10 s and
    /// resends a lost frame within 2-3 s, so 60 s is five flushes missed in a row).
    pub silent_after_s: u64,
    /// Port DOWN transitions of different nodes each within this many milliseconds of the
    /// one before are one burst (railscope's choice: a switch that reboots drops all its
    /// links within a few ms, nodes' clocks agree to a few ms under NTP; docs/findings.md).
    pub fabric_window_ms: u64,
    /// A burst that takes ports of at least this many nodes down is the fabric's fault, not
    /// the nodes' (railscope's choice: one node resetting its HCAs drops all its ports at
    /// once, so nodes are counted, not ports).
    pub fabric_min_nodes: u32,
    /// How long after a DOWN transition arrives its burst waits for the other nodes' frames
    /// before it is judged, seconds (a lost event frame is resent about 2-3 s later).
    pub fabric_settle_s: u64,
    /// How long an upstream finding stays active after its last burst, seconds (as long as
    /// `link-downed-hold-s` keeps the ports' own findings, which point at it).
    pub fabric_hold_s: u64,
    /// A node whose clock is certainly further than this many milliseconds from the
    /// collector's (its agent's offset estimate less its error bound) is `clock_skew`
    /// (railscope's choice: half the default `fabric-window-ms`, so that two nodes within it
    /// stay within one burst's window even where the fabric grouping must compare them on
    /// their own clocks; NTP keeps a LAN's clocks within a few ms).
    pub clock_skew_ms: u64,
    /// The golden profile's majority rule: a class's value must be held by more than half of
    /// its nodes (or devices) and by at least this many nodes; a class of fewer nodes learns
    /// nothing (railscope's choice: three, the fewest where one node can be outvoted).
    pub profile_min_nodes: usize,
    /// Which switch each port hangs off: Slurm's topology.conf or a file of
    /// `HOST DEVICE/PORT SWITCH SWITCH_PORT` lines (unset: upstream findings name "fabric").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topology: Option<PathBuf>,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            tick_s: 5,
            flap_downs: 3,
            flap_window_s: 3600,
            symbol_errors_per_s: 10.0,
            symbol_errors_per_hour: 120,
            link_error_recovery_per_min: 5.0,
            link_downed_hold_s: 3600,
            expected_width_lanes: None,
            expected_rate_gbps: None,
            phys_state_grace_s: 25,
            congestion_score: 3.5,
            congestion_min_cnp_per_s: 500.0,
            pfc_storm_factor: 10.0,
            pfc_storm_min_pps: 1000.0,
            pfc_storm_paused_fraction: 0.5,
            xid_hold_s: 3600,
            pcie_busy_utilization: 0.5,
            qp_errors: 1,
            cm_rejects: 10,
            verbs_window_s: 300,
            restart_grace_s: 300,
            silent_after_s: 60,
            fabric_window_ms: 50,
            fabric_min_nodes: 4,
            fabric_settle_s: 5,
            fabric_hold_s: 3600,
            clock_skew_ms: 25,
            profile_min_nodes: 3,
            topology: None,
        }
    }
}

impl Thresholds {
    /// A threshold that cannot work, named.
    pub fn validate(&self) -> Result<(), String> {
        if self.tick_s == 0 {
            return Err("findings.tick-s must be at least 1".into());
        }
        if self.flap_downs == 0 {
            return Err("findings.flap-downs must be at least 1".into());
        }
        for (v, name) in [
            (self.flap_window_s, "flap-window-s"),
            (self.verbs_window_s, "verbs-window-s"),
            (self.silent_after_s, "silent-after-s"),
        ] {
            if v == 0 {
                return Err(format!("findings.{name} must be at least 1"));
            }
        }
        if self.clock_skew_ms == 0 {
            return Err("findings.clock-skew-ms must be at least 1".into());
        }
        if self.fabric_window_ms == 0 {
            return Err("findings.fabric-window-ms must be at least 1".into());
        }
        if self.fabric_min_nodes < 2 {
            return Err(
                "findings.fabric-min-nodes must be at least 2 (one node's ports are its own)"
                    .into(),
            );
        }
        if self.profile_min_nodes < 2 {
            return Err(
                "findings.profile-min-nodes must be at least 2 (one node cannot disagree with itself)"
                    .into(),
            );
        }
        if let Some(path) = &self.topology {
            super::topology::Topology::load(path).map_err(|e| e.to_string())?;
        }
        if self.congestion_score.is_nan() || self.congestion_score <= 0.0 {
            return Err("findings.congestion-score must be above 0".into());
        }
        if self.pfc_storm_factor.is_nan() || self.pfc_storm_factor < 1.0 {
            return Err("findings.pfc-storm-factor must be at least 1".into());
        }
        if self.pfc_storm_min_pps.is_nan() || self.pfc_storm_min_pps < 0.0 {
            return Err("findings.pfc-storm-min-pps must be 0 or more".into());
        }
        if !(self.pfc_storm_paused_fraction > 0.0 && self.pfc_storm_paused_fraction <= 1.0) {
            return Err("findings.pfc-storm-paused-fraction must be above 0 and at most 1".into());
        }
        Ok(())
    }
}
