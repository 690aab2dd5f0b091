//! Why a datagram was not accepted, counted per reason, with log lines that name the source
//! address but are rate-limited per reason (a flood of forged frames costs one line every
//! few seconds, not one per datagram).

use std::{
    net::SocketAddr,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use monitor_wire::WireError;

use monitor_archive::lock::lock;

/// Why a datagram was dropped. The label is the `reason` of
/// `railscope_collector_frames_dropped_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// Shorter than the smallest frame.
    TooShort,
    /// Wrong MAC: forged, another cluster's key, corrupted or truncated in transit.
    BadMac,
    /// Sealed with a key that is not the named node's own: another node's key (a node
    /// speaking for another), or the shared key after the node moved to its own.
    WrongNodeKey,
    /// Sealed with the node's key from the previous fleet secret after the rotation window.
    RetiredKey,
    /// Authenticated but not a frame (a schema request, another magic).
    BadMagic,
    /// A frame format version this build does not read.
    UnsupportedVersion,
    /// Authenticated but cut short inside a section, or invalid: a sender's bug.
    Malformed,
    /// A sequence number already received in the current session (a duplicate or a replay).
    Duplicate,
    /// Too old to place: a sequence number more than 64 behind, or a retired session (a replay).
    Stale,
    /// Sent more than the allowed age ago or too far in the future by the collector's clock.
    OutOfTimeRange,
    /// A new node while the node table is full.
    TooManyNodes,
    /// From a session refused for holding more series than the per-node or overall bound.
    SeriesLimit,
    /// Lost in the kernel before the collector read it: the socket's receive buffer was full.
    ReceiveBufferFull,
}

impl DropReason {
    pub const ALL: [DropReason; 13] = [
        DropReason::TooShort,
        DropReason::BadMac,
        DropReason::WrongNodeKey,
        DropReason::RetiredKey,
        DropReason::BadMagic,
        DropReason::UnsupportedVersion,
        DropReason::Malformed,
        DropReason::Duplicate,
        DropReason::Stale,
        DropReason::OutOfTimeRange,
        DropReason::TooManyNodes,
        DropReason::SeriesLimit,
        DropReason::ReceiveBufferFull,
    ];

    pub fn label(self) -> &'static str {
        match self {
            DropReason::TooShort => "too_short",
            DropReason::BadMac => "bad_mac",
            DropReason::WrongNodeKey => "wrong_node_key",
            DropReason::RetiredKey => "retired_key",
            DropReason::BadMagic => "bad_magic",
            DropReason::UnsupportedVersion => "unsupported_version",
            DropReason::Malformed => "malformed",
            DropReason::Duplicate => "duplicate",
            DropReason::Stale => "stale",
            DropReason::OutOfTimeRange => "out_of_time_range",
            DropReason::TooManyNodes => "too_many_nodes",
            DropReason::SeriesLimit => "series_limit",
            DropReason::ReceiveBufferFull => "receive_buffer_full",
        }
    }

    fn index(self) -> usize {
        DropReason::ALL
            .iter()
            .position(|r| *r == self)
            .expect("every reason is in ALL")
    }

    /// The reason a decoding error stands for.
    pub fn of(error: &WireError) -> Self {
        match error {
            WireError::TooShort { .. } => DropReason::TooShort,
            WireError::BadMac { .. } => DropReason::BadMac,
            WireError::BadMagic => DropReason::BadMagic,
            WireError::UnsupportedVersion(_) => DropReason::UnsupportedVersion,
            WireError::Duplicate { .. } => DropReason::Duplicate,
            WireError::Stale { .. } => DropReason::Stale,
            // Truncated, Malformed, and the limits a frame can break (too many samples).
            _ => DropReason::Malformed,
        }
    }
}

/// How often each reason may log a line.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Dropped datagrams by reason, and the rate limit of their log lines.
#[derive(Debug)]
pub struct Drops {
    counts: [AtomicU64; DropReason::ALL.len()],
    /// Per reason: when it last logged, and how many drops went unlogged since.
    logged: Mutex<[(Option<Instant>, u64); DropReason::ALL.len()]>,
}

impl Default for Drops {
    fn default() -> Self {
        Self {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            logged: Mutex::new([(None, 0); DropReason::ALL.len()]),
        }
    }
}

impl Drops {
    /// Counts one dropped datagram and logs it (naming `from`) unless this reason logged less
    /// than 10 s ago; the next line says how many went unlogged.
    pub fn record(&self, reason: DropReason, from: SocketAddr, detail: &dyn std::fmt::Display) {
        self.add(reason, 1);
        let now = Instant::now();
        let mut logged = lock(&self.logged);
        let (last, unlogged) = &mut logged[reason.index()];
        if last.is_some_and(|at| now.duration_since(at) < LOG_EVERY) {
            *unlogged += 1;
            return;
        }
        let more = std::mem::take(unlogged);
        *last = Some(now);
        drop(logged);
        if more > 0 {
            tracing::warn!(
                "dropped a datagram from {from} ({}): {detail} (and {more} more for this reason in the last {}s)",
                reason.label(),
                LOG_EVERY.as_secs()
            );
        } else {
            tracing::warn!(
                "dropped a datagram from {from} ({}): {detail}",
                reason.label()
            );
        }
    }

    /// Counts drops that have no datagram to show (the kernel's receive-buffer overflows).
    pub fn add(&self, reason: DropReason, n: u64) {
        self.counts[reason.index()].fetch_add(n, Ordering::Relaxed);
    }

    pub fn count(&self, reason: DropReason) -> u64 {
        self.counts[reason.index()].load(Ordering::Relaxed)
    }

    pub fn total(&self) -> u64 {
        DropReason::ALL.iter().map(|r| self.count(*r)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_its_own_counter_and_label() {
        let drops = Drops::default();
        let from: SocketAddr = "192.0.2.7:4000".parse().unwrap();
        for (i, reason) in DropReason::ALL.iter().enumerate() {
            for _ in 0..=i {
                drops.record(*reason, from, &"test");
            }
        }
        for (i, reason) in DropReason::ALL.iter().enumerate() {
            assert_eq!(drops.count(*reason), i as u64 + 1, "{}", reason.label());
        }
        let labels: std::collections::BTreeSet<_> =
            DropReason::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(labels.len(), DropReason::ALL.len());
        assert_eq!(
            drops.total(),
            (1..=DropReason::ALL.len() as u64).sum::<u64>()
        );
    }

    #[test]
    fn wire_errors_map_to_their_reasons() {
        assert_eq!(
            DropReason::of(&WireError::BadMac { len: 40 }),
            DropReason::BadMac
        );
        assert_eq!(
            DropReason::of(&WireError::Truncated {
                what: "samples",
                offset: 3
            }),
            DropReason::Malformed
        );
        assert_eq!(
            DropReason::of(&WireError::Stale {
                node: "n".into(),
                seq: 1,
                session: 2
            }),
            DropReason::Stale
        );
    }
}
