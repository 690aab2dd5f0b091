//! Counters about the probes themselves: what they saw but could not deliver.

use aya_ebpf::{macros::map, maps::PerCpuArray};
use monitor_common::{PROBE_STAT_SLOTS, ProbeStat};

#[map]
static PROBE_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(PROBE_STAT_SLOTS, 0);

/// Adds one to a slot of this CPU's `PROBE_STATS` (per-CPU: no atomics needed).
#[inline(always)]
pub fn bump(stat: ProbeStat) {
    if let Some(slot) = PROBE_STATS.get_ptr_mut(stat as u32) {
        // SAFETY: the pointer comes from the map and is valid for this CPU while we run.
        unsafe { *slot += 1 };
    }
}
