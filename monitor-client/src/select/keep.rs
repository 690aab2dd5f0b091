//! What selection never drops, whatever the data says, and why:
//!
//! - what railscope itself reads: a finding rule, the straggler search or a dashboard view
//!   (the collector's `/api/v1/reads`; each declares its metrics beside the code that reads
//!   them). Turning one off would silence the rule or empty the view, however flat or redundant the metric
//!   looked in the range;
//! - failure counters: a metric whose name has a failure word ([`FAILURE_WORDS`]: `error`,
//!   `err`, `downed`, `discards`, `dropped`, `replays`, `ecc`, `remap`, ...). They stay at
//!   zero until the failure they exist for, so a healthy range shows them constant; that says
//!   nothing about whether they are needed (`--no-keep-failures` lets them go);
//! - what the operator keeps (`--keep PREFIX`).

use serde::Serialize;

use super::SelectConfig;

/// The words (between `_`) that make a metric a failure counter; `out_of_sequence` (packets
/// out of order on a reliable connection) is one as a whole.
pub const FAILURE_WORDS: &[&str] = &[
    "err",
    "error",
    "errors",
    "downed",
    "discard",
    "discards",
    "drop",
    "drops",
    "dropped",
    "overrun",
    "overruns",
    "fault",
    "faults",
    "fail",
    "failed",
    "failure",
    "failures",
    "replay",
    "replays",
    "retry",
    "retries",
    "timeout",
    "timeouts",
    "nak",
    "naks",
    "ecc",
    "xid",
    "xids",
    "remap",
    "remapped",
    "retired",
    "reject",
    "rejects",
    "violation",
    "violations",
    "integrity",
    "lost",
];

/// Whether `metric` counts failures (its name has a word of [`FAILURE_WORDS`]).
pub fn is_failure_counter(metric: &str) -> bool {
    let name = metric.strip_prefix("railscope_").unwrap_or(metric);
    name.contains("out_of_sequence") || name.split('_').any(|w| FAILURE_WORDS.contains(&w))
}

/// A metric kept whatever the data, and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Protected {
    pub metric: String,
    /// `read by finding ib_port_degraded, dashboard fleet view`, `failure counter`,
    /// `--keep railscope_ib_` (each that applies, `; ` between them).
    pub reason: String,
}

/// Why `metric` is never dropped under `config`, or `None` when the data decides.
pub fn reason(metric: &str, config: &SelectConfig) -> Option<String> {
    let mut why: Vec<String> = Vec::new();
    if let Some(readers) = config.read_by.get(metric).filter(|r| !r.is_empty()) {
        why.push(format!("read by {}", readers.join(", ")));
    }
    if config.keep_failures && is_failure_counter(metric) {
        why.push("failure counter".into());
    }
    if let Some(p) = config.keep.iter().find(|p| metric.starts_with(p.as_str())) {
        why.push(format!("--keep {p}"));
    }
    (!why.is_empty()).then(|| why.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_counters_are_told_by_their_names() {
        for m in [
            "railscope_ib_symbol_error_total",
            "railscope_ib_link_error_recovery_total",
            "railscope_ib_link_downed_total",
            "railscope_ib_port_rcv_errors_total",
            "railscope_ib_port_xmit_discards_total",
            "railscope_ib_vl15_dropped_total",
            "railscope_ib_excessive_buffer_overrun_errors_total",
            "railscope_ib_local_link_integrity_errors_total",
            "railscope_ib_out_of_sequence_total",
            "railscope_ib_packet_seq_err_total",
            "railscope_ib_local_ack_timeout_err_total",
            "railscope_ib_rnr_nak_retry_err_total",
            "railscope_gpu_ecc_errors_total",
            "railscope_gpu_nvlink_errors_total",
            "railscope_gpu_pcie_replays_total",
            "railscope_gpu_remapped_rows_total",
            "railscope_gpu_row_remap_pending",
            "railscope_gpu_row_remap_failed",
            "railscope_gpu_retired_pages_double_bit_total",
        ] {
            assert!(is_failure_counter(m), "{m}");
        }
        for m in [
            "railscope_ib_port_xmit_bytes_total",
            "railscope_ib_port_xmit_wait_total",
            "railscope_ib_multicast_xmit_packets_total",
            "railscope_ib_np_cnp_sent_total",
            "railscope_gpu_power_watts",
            "railscope_gpu_sm_clock_hertz",
            "railscope_gpu_throttle_active",
            "railscope_gpu_energy_millijoules_total",
        ] {
            assert!(!is_failure_counter(m), "{m}");
        }
    }
}
