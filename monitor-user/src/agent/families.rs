//! The probe families in the agent: each attached when its kernel module is present, retried
//! while it is not, detached when the module goes away, with a reader task per attached family
//! draining its ring buffer.

use std::time::Duration;

use aya::maps::{MapData, RingBuf};
use tokio::{
    io::{Interest, unix::AsyncFd},
    sync::{mpsc, oneshot},
    task::JoinHandle,
};

use crate::{
    cgroup::CgroupNames,
    kernel::{Kernel, WallClock},
    probes::{
        AttachedFamily, Family, FamilyUnavailable, ProbeReport, Status, decode::Event,
        names::KernelNames,
    },
};

/// How often each family's ring buffer is drained. Frequent events (QPs moved to ERR) are
/// submitted without waking the reader (a wake-up is a self-IPI on the CPU that runs the
/// hook, most of what the probe would cost there), so they reach the agent up to this late;
/// their kernel timestamps keep the time they happened. Rare ones (port and device events,
/// async errors) wake the reader and are read at once.
pub(super) const EVENT_DRAIN_INTERVAL: Duration = Duration::from_millis(250);

/// A family's state in the agent.
pub(super) enum FamilyState {
    Unavailable {
        reason: String,
    },
    Attached {
        attached: Box<AttachedFamily>,
        reader: JoinHandle<()>,
        /// Tells the reader to drain its ring buffer one last time and end.
        stop: Option<oneshot::Sender<()>>,
        reported_losses: (u64, u64),
    },
}

/// What reader tasks send to the main loop.
pub(super) type Record = (Family, monitor_common::events::EventRecord);

/// Every attached family's raw counters.
pub(super) fn all_counts(families: &[(Family, FamilyState)]) -> Vec<crate::probes::RawCount> {
    families
        .iter()
        .filter_map(|(_, s)| match s {
            FamilyState::Attached { attached, .. } => Some(attached.counts()),
            FamilyState::Unavailable { .. } => None,
        })
        .flatten()
        .collect()
}

pub(super) fn log_state(family: Family, state: &FamilyState, rows: &[ProbeReport], at_start: bool) {
    match state {
        FamilyState::Unavailable { reason } => {
            let probes: Vec<&str> = rows.iter().map(|r| r.probe).collect();
            let when = if at_start {
                " (will attach when possible)"
            } else {
                ""
            };
            tracing::warn!("{} unavailable: {reason}{when}", probes.join(", "));
        }
        FamilyState::Attached { .. } => {
            for row in rows {
                match &row.status {
                    Status::Attached => tracing::info!("{} attached", row.probe),
                    Status::Unavailable(reason) => {
                        tracing::warn!("{} unavailable: {reason}", row.probe)
                    }
                }
            }
            tracing::debug!(?family, "family attached");
        }
    }
}

pub(super) fn rescan_family(
    family: Family,
    state: &mut FamilyState,
    kernel: &Kernel,
    records: &mpsc::Sender<Record>,
    names: &mut KernelNames,
) {
    match state {
        FamilyState::Unavailable { reason } => {
            if !kernel.module_present(family.module()) {
                return; // still missing: nothing new to say
            }
            let (new, rows) = try_attach(family, kernel, records);
            match &new {
                FamilyState::Attached { attached, .. } => {
                    names.merge(&attached.names);
                    log_state(family, &new, &rows, false);
                }
                FamilyState::Unavailable { reason: new_reason } if new_reason != reason => {
                    log_state(family, &new, &rows, false);
                }
                FamilyState::Unavailable { .. } => {}
            }
            *state = new;
        }
        FamilyState::Attached {
            attached,
            reader,
            reported_losses,
            ..
        } => {
            if !kernel.module_present(family.module()) || reader.is_finished() {
                reader.abort();
                let reason = format!(
                    "{} unloaded: {} inactive",
                    family.module(),
                    family.feature()
                );
                tracing::warn!("{reason}");
                *state = FamilyState::Unavailable { reason };
                return;
            }
            let losses = attached.losses();
            if losses.0 > reported_losses.0 {
                tracing::warn!(
                    "ring buffer full: {} events lost ({} in total, {})",
                    losses.0 - reported_losses.0,
                    losses.0,
                    family.module()
                );
            }
            if losses.1 > reported_losses.1 {
                tracing::warn!(
                    "counter map full: {} verb counts lost ({} in total, {})",
                    losses.1 - reported_losses.1,
                    losses.1,
                    family.module()
                );
            }
            *reported_losses = losses;
        }
    }
}

pub(super) fn try_attach(
    family: Family,
    kernel: &Kernel,
    records: &mpsc::Sender<Record>,
) -> (FamilyState, Vec<ProbeReport>) {
    let mut attached = match AttachedFamily::attach(family, kernel) {
        Ok(attached) => attached,
        Err(unavailable) => {
            let FamilyUnavailable { reason, rows } = *unavailable;
            let reason = match reason {
                crate::probes::Unavailable::NothingAttached => rows
                    .iter()
                    .find_map(|r| match &r.status {
                        Status::Unavailable(why) => Some(why.clone()),
                        Status::Attached => None,
                    })
                    .unwrap_or_else(|| reason.to_string()),
                other => other.to_string(),
            };
            return (FamilyState::Unavailable { reason }, rows);
        }
    };
    let rows = attached.statuses.clone();
    let Some(ring) = attached.take_events() else {
        return (
            FamilyState::Unavailable {
                reason: "event ring buffer missing".into(),
            },
            rows,
        );
    };
    let (stop, stopped) = oneshot::channel();
    let reader = tokio::spawn(read_events(family, ring, records.clone(), stopped));
    (
        FamilyState::Attached {
            attached: Box::new(attached),
            reader,
            stop: Some(stop),
            reported_losses: (0, 0),
        },
        rows,
    )
}

/// Drains a family's ring buffer into the loop's channel: at once when the probes wake it
/// (rare events: port, device, async errors), and every [`EVENT_DRAIN_INTERVAL`] for what
/// they write without a wake-up. A stop (or the agent dropping its end) drains once more,
/// then ends.
async fn read_events(
    family: Family,
    ring: RingBuf<MapData>,
    tx: mpsc::Sender<Record>,
    mut stopped: oneshot::Receiver<()>,
) {
    // SAFETY: the ring buffer owns its map's file descriptor: it stays open, and `as_raw_fd`
    // returns it, for as long as the `RingBuf` lives, which the `AsyncFd` owns.
    let registered = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) };
    let mut ring = match registered {
        Ok(ring) => Ring::Woken(ring),
        Err(e) => {
            let (ring, e) = e.into_parts();
            tracing::warn!(
                "{}: cannot wait on the event ring buffer ({e}): events arrive within {:?}",
                family.module(),
                EVENT_DRAIN_INTERVAL
            );
            Ring::Timed(ring)
        }
    };
    let mut drain = tokio::time::interval(EVENT_DRAIN_INTERVAL);
    drain.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let last = tokio::select! {
            _ = drain.tick() => false,
            _ = &mut stopped => true,
            woken = ring.woken() => {
                if let Err(e) = woken {
                    tracing::warn!(
                        "{}: waiting on the event ring buffer failed ({e}): events arrive \
                         within {:?}",
                        family.module(),
                        EVENT_DRAIN_INTERVAL
                    );
                    ring = ring.into_timed();
                }
                false
            }
        };
        let buffer = ring.buffer();
        while let Some(item) = buffer.next() {
            match monitor_common::events::EventRecord::from_bytes(&item) {
                Some(record) => {
                    if tx.send((family, record)).await.is_err() {
                        return;
                    }
                }
                None => tracing::warn!(len = item.len(), "short event record ignored"),
            }
        }
        if last {
            return;
        }
    }
}

/// A family's ring buffer as its reader waits on it: through epoll (the probes' wake-ups),
/// or, where that failed, on the drain timer only.
enum Ring {
    Woken(AsyncFd<RingBuf<MapData>>),
    Timed(RingBuf<MapData>),
}

impl Ring {
    /// Resolves when the probes woke the reader (never for [`Ring::Timed`]).
    async fn woken(&self) -> std::io::Result<()> {
        match self {
            Ring::Woken(fd) => fd.readable().await.map(|mut guard| guard.clear_ready()),
            Ring::Timed(_) => std::future::pending().await,
        }
    }

    fn into_timed(self) -> Self {
        match self {
            Ring::Woken(fd) => Ring::Timed(fd.into_inner()),
            timed => timed,
        }
    }

    fn buffer(&mut self) -> &mut RingBuf<MapData> {
        match self {
            Ring::Woken(fd) => fd.get_mut(),
            Ring::Timed(ring) => ring,
        }
    }
}

/// A record as an event, its device named from the `DEVICE_NAMES` map of the family that
/// sent it.
pub(super) fn decode_record(
    families: &[(Family, FamilyState)],
    (family, record): &Record,
    names: &KernelNames,
    clock: &WallClock,
    cgroups: &mut CgroupNames,
) -> Event {
    let device = families
        .iter()
        .find_map(|(f, state)| match state {
            FamilyState::Attached { attached, .. } if f == family => {
                Some(attached.device_name(record.device))
            }
            _ => None,
        })
        .unwrap_or_else(|| format!("dev@{:x}", record.device));
    Event::decode(record, device, names, clock, cgroups)
}
