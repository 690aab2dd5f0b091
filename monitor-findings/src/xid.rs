//! XID codes classified by what they mean and what to do, after NVIDIA's XID catalogue for Ampere
//! and newer GPUs (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, checked
//! 2026-11-24). `action` is the catalogue's "Resolution Bucket (Immediate Action)" as published
//! (RESTART_APP, RESET_GPU, RESTART_BM, IGNORE, CONTACT_SUPPORT, or a named workflow).
//!
//! The severity is railscope's, derived from that bucket alone:
//! - critical: RESET_GPU, RESTART_BM, and the workflows whose recovery is a GPU reset or a
//!   reboot (WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR): the GPU must not run work until then;
//! - warning: RESTART_APP (the application's, the GPU stays usable) and CONTACT_SUPPORT (codes
//!   the catalogue marks unused on Ampere and newer), like any code not in the table;
//! - info: IGNORE, and the buckets that defer to another XID (WORKFLOW_XID_45, XID_154).
//!
//! Except that the codes operators drain a node on are critical whatever the bucket
//! ([`DRAINED_ON`]): 63 (a row remapping that takes effect only at the next GPU reset), 92 (a
//! single-bit error rate that foretells double-bit ones) and 94 (a contained memory error: an
//! application already died on this GPU's memory) besides those the rule makes critical.

use super::Severity;

/// What an XID code means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct XidClass {
    pub code: u64,
    pub meaning: &'static str,
    pub severity: Severity,
    /// NVIDIA's immediate action bucket.
    pub action: &'static str,
    /// What the operator should do, in a few words.
    pub advice: &'static str,
}

const fn x(
    code: u64,
    meaning: &'static str,
    severity: Severity,
    action: &'static str,
    advice: &'static str,
) -> XidClass {
    XidClass {
        code,
        meaning,
        severity,
        action,
        advice,
    }
}

use Severity::{Critical, Info, Warning};

/// The XIDs a fleet's operators drain a node on (the fatal ones the project's issue names):
/// critical even where NVIDIA's immediate action is lighter.
#[cfg(test)]
pub(crate) const DRAINED_ON: [u64; 8] = [48, 63, 64, 74, 79, 92, 94, 95];

/// The codes railscope classifies; any other is a warning pointing at the catalogue.
pub(crate) const XIDS: &[XidClass] = &[
    x(
        13,
        "graphics engine exception",
        Warning,
        "RESTART_APP",
        "usually the application (illegal instruction or address); if it repeats on one GPU only, run diagnostics",
    ),
    x(
        31,
        "GPU memory page fault",
        Warning,
        "RESTART_APP",
        "usually the application (illegal memory access); if it repeats on one GPU only, run diagnostics",
    ),
    x(
        32,
        "invalid or corrupted push buffer stream",
        Warning,
        "RESTART_APP",
        "restart the application; if it repeats, check the PCIe link",
    ),
    x(
        43,
        "GPU stopped processing: the application faulted, the GPU is healthy",
        Info,
        "IGNORE",
        "nothing to do on the GPU; look at the application",
    ),
    x(
        45,
        "preemptive cleanup after previous errors or an aborted application",
        Info,
        "WORKFLOW_XID_45",
        "follows another XID: act on that one; if it comes alone, restart the fabric manager",
    ),
    x(
        48,
        "double-bit ECC error",
        Critical,
        "WORKFLOW_XID_48",
        "drain the node and reset the GPU (with XID 63/64: drain, then reset); if it recurs, run field diagnostics",
    ),
    x(
        61,
        "internal micro-controller breakpoint (unused on Ampere and newer)",
        Warning,
        "CONTACT_SUPPORT",
        "not expected on Ampere or newer GPUs: contact support",
    ),
    x(
        62,
        "internal micro-controller halt",
        Critical,
        "RESET_GPU",
        "drain the node and reset the GPU; contact support if it repeats",
    ),
    x(
        63,
        "GPU memory row remapping event (page retirement on older GPUs)",
        Critical,
        "IGNORE",
        "recorded, nothing to do now; a pending remapping is applied at the next GPU reset",
    ),
    x(
        64,
        "GPU memory row remapping failure (page retirement on older GPUs)",
        Critical,
        "RESET_GPU",
        "drain the node and reset the GPU; contact support if it recurs",
    ),
    x(
        69,
        "graphics engine class error",
        Warning,
        "RESTART_APP",
        "restart the application",
    ),
    x(
        74,
        "NVLink error (A100 and H100; Blackwell reports XIDs 144-150)",
        Critical,
        "WORKFLOW_NVLINK_ERR",
        "drain the node, reset the GPU (or reboot) and decode the XID's registers; the fault may be at the link's other end",
    ),
    x(
        79,
        "GPU has fallen off the bus",
        Critical,
        "RESTART_BM",
        "drain and reboot the node; check the GPU's seating, power and PCIe; replace it if it recurs",
    ),
    x(
        92,
        "high single-bit ECC error rate",
        Critical,
        "IGNORE",
        "corrected errors, nothing to do now; watch its ECC counters and contact support if it recurs",
    ),
    x(
        94,
        "contained memory error",
        Critical,
        "RESTART_APP",
        "only the affected application was stopped: restart it; reset the GPU when convenient",
    ),
    x(
        95,
        "uncontained memory error",
        Critical,
        "RESET_GPU",
        "every application on the GPU is affected: drain the node and reset the GPU",
    ),
    x(
        109,
        "context switch timeout",
        Critical,
        "RESET_GPU",
        "drain the node and reset the GPU; contact support if it repeats",
    ),
    x(
        119,
        "GSP RPC timeout",
        Critical,
        "RESET_GPU",
        "drain the node and reset the GPU (or power-cycle the node if it persists)",
    ),
    x(
        120,
        "GSP error",
        Critical,
        "RESET_GPU",
        "drain the node and reset the GPU (or power-cycle the node if it persists)",
    ),
    x(
        140,
        "uncorrectable ECC error that escaped page offlining or row remapping",
        Critical,
        "RESET_GPU",
        "drain the node and reset the GPU; contact the vendor if it persists",
    ),
    x(
        154,
        "GPU recovery action changed",
        Info,
        "XID_154",
        "names the recovery another XID needs (none, drain, reset, reboot): follow it",
    ),
];

/// The class of `code`: from [`XIDS`], else an unclassified warning.
pub(crate) fn classify(code: u64) -> XidClass {
    XIDS.iter()
        .copied()
        .find(|c| c.code == code)
        .unwrap_or(XidClass {
            code,
            meaning: "not in railscope's table",
            severity: Warning,
            action: "UNKNOWN",
            advice: "look the code up in NVIDIA's XID catalogue",
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fatal_xids_are_critical_and_application_ones_are_not() {
        for code in [48, 63, 64, 74, 79, 92, 94, 95, 109] {
            assert_eq!(classify(code).severity, Critical, "XID {code}");
        }
        for code in [13, 31] {
            assert_eq!(classify(code).severity, Warning, "XID {code}");
        }
        for code in [43, 45, 154] {
            assert_eq!(classify(code).severity, Info, "XID {code}");
        }
        assert_eq!(classify(79).action, "RESTART_BM");
        assert_eq!(classify(9999).meaning, "not in railscope's table");
    }

    #[test]
    fn severity_follows_the_immediate_action_bucket_or_the_drain_list() {
        for c in XIDS {
            if DRAINED_ON.contains(&c.code) {
                assert_eq!(c.severity, Critical, "XID {} is drained on", c.code);
                continue;
            }
            let expected = match c.action {
                "RESET_GPU" | "RESTART_BM" | "WORKFLOW_XID_48" | "WORKFLOW_NVLINK_ERR" => Critical,
                "RESTART_APP" | "CONTACT_SUPPORT" => Warning,
                "IGNORE" | "WORKFLOW_XID_45" | "XID_154" => Info,
                other => panic!("XID {}: bucket {other} has no severity rule", c.code),
            };
            assert_eq!(c.severity, expected, "XID {} ({})", c.code, c.action);
        }
    }

    #[test]
    fn codes_are_listed_once_in_order() {
        assert!(XIDS.windows(2).all(|w| w[0].code < w[1].code));
    }
}
