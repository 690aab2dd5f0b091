//! XID codes classified by what they mean and what to do, after NVIDIA's XID catalogue
//! (docs.nvidia.com/deploy/xid-errors, its "Resolution Bucket (Immediate Action)":
//! RESTART_APP, RESET_GPU, RESTART_BM, IGNORE). The fatal ones need the GPU reset or the node
//! rebooted before it runs work again; the others are usually the application's.

use super::Severity;

/// What an XID code means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XidClass {
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

/// The codes railscope classifies; any other is a warning pointing at the catalogue.
pub const XIDS: &[XidClass] = &[
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
        "GPU stopped processing",
        Warning,
        "RESTART_APP",
        "the application's context was stopped; restart it",
    ),
    x(
        45,
        "preemptive cleanup after previous errors",
        Info,
        "IGNORE",
        "follows another XID: act on that one",
    ),
    x(
        48,
        "double-bit ECC error",
        Critical,
        "RESET_GPU",
        "drain the node and reset the GPU; if it recurs, replace the GPU",
    ),
    x(
        61,
        "internal micro-controller breakpoint or warning",
        Warning,
        "RESET_GPU",
        "reset the GPU when it is drained; contact support if it repeats",
    ),
    x(
        62,
        "internal micro-controller halt",
        Critical,
        "RESET_GPU",
        "drain the node and reset the GPU",
    ),
    x(
        63,
        "ECC page retirement or row remapping recorded",
        Critical,
        "RESET_GPU",
        "reset the GPU to activate the remapping; it is not fully usable until then",
    ),
    x(
        64,
        "ECC page retirement or row remapping failure",
        Critical,
        "RESET_GPU",
        "drain the node and reset the GPU; if it recurs, replace the GPU",
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
        "NVLink error",
        Critical,
        "RESET_GPU",
        "drain the node, reset the GPU and check the NVLink/NVSwitch fabric",
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
        "RESET_GPU",
        "drain the node and reset the GPU; watch its ECC counters",
    ),
    x(
        94,
        "contained ECC error",
        Critical,
        "RESTART_APP",
        "the affected application was stopped; reset the GPU at the next opportunity",
    ),
    x(
        95,
        "uncontained ECC error",
        Critical,
        "RESET_GPU",
        "every application on the GPU is affected: drain the node and reset the GPU",
    ),
    x(
        109,
        "context switch timeout",
        Warning,
        "RESTART_APP",
        "restart the application; if it repeats, reset the GPU",
    ),
    x(
        119,
        "GSP RPC timeout",
        Critical,
        "RESET_GPU",
        "drain the node and reset the GPU (or reboot)",
    ),
    x(
        120,
        "GSP error",
        Critical,
        "RESET_GPU",
        "drain the node and reset the GPU (or reboot)",
    ),
    x(
        140,
        "unrecovered ECC error",
        Critical,
        "RESET_GPU",
        "drain the node and reset the GPU",
    ),
    x(
        154,
        "GPU recovery action changed",
        Info,
        "IGNORE",
        "the driver names the recovery the GPU needs: follow it",
    ),
];

/// The class of `code`: from [`XIDS`], else an unclassified warning.
pub fn classify(code: u64) -> XidClass {
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
        for code in [48, 63, 64, 74, 79, 92, 94, 95] {
            assert_eq!(classify(code).severity, Critical, "XID {code}");
        }
        for code in [13, 31, 43] {
            assert_eq!(classify(code).severity, Warning, "XID {code}");
        }
        assert_eq!(classify(79).action, "RESTART_BM");
        assert_eq!(classify(9999).meaning, "not in railscope's table");
    }

    #[test]
    fn codes_are_listed_once_in_order() {
        assert!(XIDS.windows(2).all(|w| w[0].code < w[1].code));
    }
}
