//! Which `counters/` files saturate, and at what value.
//!
//! The IB PMA's `PortCounters` do not wrap: a counter that reaches its all-ones value stays
//! there until it is reset. The kernel's `counters/` files print the fields at their width in
//! the MAD (`PORT_PMA_ATTR` in `drivers/infiniband/core/sysfs.c`): 4, 8, 16 or 32 bits. An
//! HCA whose PMA has the extended counters (`PortCountersExtended`) gets the data and packet
//! files from them, 64 bits wide; older HCAs keep the 32-bit ones, and their `port_xmit_data`
//! stops at 4294967295 words (16 GiB) within seconds at line rate. A counter at its maximum
//! reads as a rate of zero forever, which looks like an idle port: the source reports it (a
//! warning, and `railscope_ib_counter_saturated`).
//!
//! The counters only `PortCountersExtended` has (`unicast_*`, `multicast_*`) and every
//! `hw_counters/` file are 64 bits: none of them is checked.

/// `counters/` files by the width of their PMA field, as the kernel names them.
const PMA_WIDTHS: &[(&str, u32)] = &[
    ("symbol_error", 16),
    ("link_error_recovery", 8),
    ("link_downed", 8),
    ("port_rcv_errors", 16),
    ("port_rcv_remote_physical_errors", 16),
    ("port_rcv_switch_relay_errors", 16),
    ("port_xmit_discards", 16),
    ("port_xmit_constraint_errors", 8),
    ("port_rcv_constraint_errors", 8),
    ("local_link_integrity_errors", 4),
    ("excessive_buffer_overrun_errors", 4),
    ("VL15_dropped", 16),
    ("port_xmit_data", 32),
    ("port_rcv_data", 32),
    ("port_xmit_packets", 32),
    ("port_rcv_packets", 32),
    ("port_xmit_wait", 32),
];

/// A PMA counter's width in bits and the value it stops at, for a file of `counters/`;
/// `None` for a file that is not one of the PMA's `PortCounters` fields.
pub(super) fn pma_limit(file: &str) -> Option<Limit> {
    PMA_WIDTHS
        .iter()
        .find(|(name, _)| *name == file)
        .map(|&(_, bits)| Limit {
            bits,
            max: (1u64 << bits) - 1,
        })
}

/// Where a counter stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Limit {
    pub(super) bits: u32,
    /// The all-ones value of the field: the counter stays there once it gets there.
    pub(super) max: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widths_of_the_pma_fields() {
        let max = |f: &str| pma_limit(f).map(|l| l.max);
        assert_eq!(max("port_xmit_data"), Some(4_294_967_295));
        assert_eq!(max("port_xmit_wait"), Some(4_294_967_295));
        assert_eq!(max("symbol_error"), Some(65_535));
        assert_eq!(max("VL15_dropped"), Some(65_535));
        assert_eq!(max("link_downed"), Some(255));
        assert_eq!(max("local_link_integrity_errors"), Some(15));
        // Only in PortCountersExtended: 64 bits, never checked.
        assert_eq!(max("unicast_xmit_packets"), None);
        assert_eq!(max("vl15_dropped"), None);
    }
}
