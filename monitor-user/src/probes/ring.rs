//! The reader of a family's event ring buffer: a task that drains the `EVENTS` map the
//! probes write into and hands each record, tagged with its family, to the loop (the agent's
//! or `railscope capture`'s), which decodes it ([`super::families::Families::decode`]).

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use aya::maps::{MapData, RingBuf};
use tokio::{
    io::{Interest, unix::AsyncFd},
    sync::{mpsc, oneshot},
};

use monitor_common::events::{EventRecord, Origin};

use super::Family;

/// How often each family's ring buffer is drained. Frequent events (QPs moved to ERR) are
/// submitted without waking the reader (a wake-up is a self-IPI on the CPU that runs the
/// hook, most of what the probe would cost there), so they reach the agent up to this late;
/// their kernel timestamps keep the time they happened. Rare ones (port and device events,
/// async errors) wake the reader and are read at once.
pub(crate) const EVENT_DRAIN_INTERVAL: Duration = Duration::from_millis(250);

/// A record as a reader hands it to the loop: the kernel's [`EventRecord`], as the probe
/// wrote it, and the family whose ring buffer it came from. The family is what it adds: the
/// record names its device by a key into that family's own `DEVICE_NAMES` map (each family
/// is its own instance of the object), so decoding it into a
/// [`ProbeEvent`](super::decode::ProbeEvent) needs both
/// ([`Families::decode`](super::families::Families::decode)).
pub(crate) struct RingRecord {
    pub family: Family,
    pub record: EventRecord,
}

/// How regularly a reader drained its ring buffer: the longest time between two drains, the
/// measure of a loop that stalls; and how late the records that wake it (port, device and
/// async-error events) reached it after their kernel timestamp, the part of an event's
/// latency that comes before the agent's own work (`cargo xtask bench events` reports it).
#[derive(Default)]
pub(crate) struct DrainPace {
    drains: AtomicU64,
    longest_gap_us: AtomicU64,
    /// Kernel timestamp to reader, in µs, of the first [`MAX_WOKEN_SAMPLES`] woken records.
    woken_us: std::sync::Mutex<Vec<u32>>,
}

/// Bound of [`DrainPace::woken_us`] (400 kB).
const MAX_WOKEN_SAMPLES: usize = 100_000;

impl DrainPace {
    fn record(&self, gap: Duration) {
        self.drains.fetch_add(1, Ordering::Relaxed);
        let us = u64::try_from(gap.as_micros()).unwrap_or(u64::MAX);
        self.longest_gap_us.fetch_max(us, Ordering::Relaxed);
    }

    /// A record that woke the reader, read `late_ns` after its kernel timestamp.
    fn record_woken(&self, late_ns: u64) {
        if let Ok(mut v) = self.woken_us.lock()
            && v.len() < MAX_WOKEN_SAMPLES
        {
            v.push(u32::try_from(late_ns / 1000).unwrap_or(u32::MAX));
        }
    }

    pub(crate) fn log(&self, family: Family) {
        let woken = self
            .woken_us
            .lock()
            .map(|mut v| {
                if v.is_empty() {
                    return String::new();
                }
                v.sort_unstable();
                let at = |q: f64| {
                    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
                    f64::from(v[rank - 1]) / 1000.0
                };
                format!(
                    "; {} woken events, kernel to reader p50 {:.2} ms p90 {:.2} ms p99 {:.2} ms \
                     max {:.2} ms",
                    v.len(),
                    at(0.5),
                    at(0.9),
                    at(0.99),
                    at(1.0)
                )
            })
            .unwrap_or_default();
        tracing::info!(
            "{} event drain: {} drains, longest gap between two {} ms{woken}",
            family.module(),
            self.drains.load(Ordering::Relaxed),
            self.longest_gap_us.load(Ordering::Relaxed) / 1000
        );
    }
}

/// Drains a family's ring buffer into the loop's channel: at once when the probes wake it
/// (rare events: port, device, async errors), and every [`EVENT_DRAIN_INTERVAL`] for what
/// they write without a wake-up. A stop (or the agent dropping its end) drains once more,
/// then ends.
pub(crate) async fn read_events(
    family: Family,
    ring: RingBuf<MapData>,
    tx: mpsc::Sender<RingRecord>,
    mut stopped: oneshot::Receiver<()>,
    pace: Arc<DrainPace>,
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
    drain.tick().await;
    let mut last_drain = Instant::now();
    loop {
        let last = tokio::select! {
            _ = drain.tick() => {
                pace.record(last_drain.elapsed());
                last_drain = Instant::now();
                false
            }
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
            match EventRecord::from_bytes(&item) {
                Some(record) => {
                    if wakes(&record) {
                        let read_ns = crate::time_base::monotonic_ns().0;
                        pace.record_woken(read_ns.saturating_sub(record.timestamp_ns));
                    }
                    if tx.send(RingRecord { family, record }).await.is_err() {
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

/// Whether the probes wrote this record with a wake-up (`Delivery::Wake` in monitor-ebpf).
fn wakes(record: &EventRecord) -> bool {
    matches!(
        Origin::from_u32(record.origin),
        Some(Origin::Dispatch | Origin::QpAsync | Origin::CqAsync)
    )
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
