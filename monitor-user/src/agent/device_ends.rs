//! The end of a device's counters. When a device goes away (`rdma link delete`, a driver
//! unloaded or reset), the probes' `ib_dealloc_device` hook marks its `DEVICE_NAMES` entry
//! with the time. After the same grace period as a job's end ([`GRACE`]: a resource still
//! being torn down is counted against the device a moment longer), the counters just read
//! are the device's final values: they are sent, the device's series are forgotten (unless a
//! live device of the same name counts under the same labels), and its keys are deleted from
//! `VERB_COUNTS` and its entry from `DEVICE_NAMES`.
//!
//! A new device never inherits anything: devices are keyed by their `ib_device.index`, which
//! ib_core allocates cyclically, not by their address, which the allocator may reuse.

use std::collections::HashSet;

use super::job_ends::GRACE;
use crate::probes::families::Families;
use crate::{
    pipeline::{Pipeline, VERB_SERIES},
    probes::RawCount,
    time_base::MonoNs,
};

/// Devices whose state was released so far.
#[derive(Debug, Default)]
pub(super) struct DeviceEnds {
    pub ended: u64,
}

/// At a sweep, right after the counters were read and handed to the pipeline: ends the
/// devices that were freed at least [`GRACE`] ago (`now`: the probes' clock).
pub(super) fn end_devices(
    ends: &mut DeviceEnds,
    counts: &[RawCount],
    families: &mut Families,
    pipeline: Option<&mut Pipeline>,
    now: MonoNs,
) {
    let due: Vec<_> = families
        .removed_devices()
        .into_iter()
        .filter(|(_, d)| now.0.saturating_sub(d.removed_ns) >= GRACE.as_nanos() as u64)
        .collect();
    if due.is_empty() {
        return;
    }
    let keys: HashSet<u64> = due.iter().map(|(_, d)| d.key).collect();
    if let Some(p) = pipeline {
        // A device made again under the same name (rxe0 deleted and added back) keeps the
        // series its live counters share.
        let live: HashSet<&str> = counts
            .iter()
            .filter(|c| !keys.contains(&c.key.device))
            .map(|c| c.device.as_str())
            .collect();
        let ended: HashSet<&str> = due
            .iter()
            .map(|(_, d)| d.name.as_str())
            .filter(|name| !live.contains(name))
            .collect();
        let series = p.end_series(|s| {
            s.name.as_ref() == VERB_SERIES
                && s.labels.get("device").is_some_and(|d| ended.contains(d))
        });
        tracing::debug!(
            "{} device(s) ended: {series} series sent a last time",
            ended.len()
        );
    }
    let mut deleted = 0;
    for (family, device) in &due {
        deleted += families.remove_device(*family, device.key);
        tracing::info!(
            "device {} ({}) removed: its counters and name are released ({})",
            device.name,
            crate::probes::unnamed_device(device.key),
            family.module()
        );
    }
    ends.ended += keys.len() as u64;
    tracing::debug!("{deleted} verb counter keys of removed devices deleted");
}
