//! Which snapshots go to the file: the pre-trigger ring, the post-trigger window and the
//! baseline (docs/capture-format.md, "Which snapshots are kept"). Pure bookkeeping on times,
//! so it is tested without a clock.

use std::collections::VecDeque;

use monitor_wire::Reading;

/// One read of every captured port.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Snapshot {
    pub unix_ns: u64,
    pub readings: Vec<Reading>,
    /// Kept even outside a triggered window (one per baseline interval).
    baseline: bool,
}

/// Holds the last `pre` of snapshots and decides which are written.
#[derive(Debug)]
pub(super) struct Recorder {
    ring: VecDeque<Snapshot>,
    pre_ns: u64,
    post_ns: u64,
    baseline_ns: u64,
    /// Snapshots up to this time are written as they come.
    post_until: Option<u64>,
    last_baseline: Option<u64>,
    pub triggers: u64,
}

impl Recorder {
    pub(super) fn new(pre_ns: u64, post_ns: u64, baseline_ns: u64) -> Self {
        Self {
            ring: VecDeque::new(),
            pre_ns,
            post_ns,
            baseline_ns,
            post_until: None,
            last_baseline: None,
            triggers: 0,
        }
    }

    /// Takes a snapshot; returns what to write now, in time order.
    pub(super) fn on_snapshot(&mut self, unix_ns: u64, readings: Vec<Reading>) -> Vec<Snapshot> {
        let baseline = self
            .last_baseline
            .is_none_or(|b| unix_ns.saturating_sub(b) >= self.baseline_ns);
        if baseline {
            self.last_baseline = Some(unix_ns);
        }
        let snapshot = Snapshot {
            unix_ns,
            readings,
            baseline,
        };
        if self.post_until.is_some_and(|until| unix_ns <= until) {
            // The ring was emptied by the trigger: writing now keeps time order.
            return vec![snapshot];
        }
        self.ring.push_back(snapshot);
        let mut out = Vec::new();
        while let Some(oldest) = self.ring.front() {
            if unix_ns.saturating_sub(oldest.unix_ns) <= self.pre_ns {
                break;
            }
            let oldest = self.ring.pop_front().expect("front exists");
            if oldest.baseline {
                out.push(oldest);
            }
        }
        out
    }

    /// A trigger at `unix_ns`: everything in the ring is written now, and every snapshot
    /// until `post` after it.
    pub(super) fn on_trigger(&mut self, unix_ns: u64) -> Vec<Snapshot> {
        self.triggers += 1;
        let until = unix_ns.saturating_add(self.post_ns);
        self.post_until = Some(self.post_until.map_or(until, |u| u.max(until)));
        self.ring.drain(..).collect()
    }

    /// Whether a trigger's window is open at `unix_ns`.
    pub(super) fn triggered(&self, unix_ns: u64) -> bool {
        self.post_until.is_some_and(|until| unix_ns <= until)
    }

    /// At the end: the baseline snapshots still in the ring.
    pub(super) fn finish(&mut self) -> Vec<Snapshot> {
        self.ring.drain(..).filter(|s| s.baseline).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn times(out: &[Snapshot]) -> Vec<u64> {
        out.iter().map(|s| s.unix_ns / MS).collect()
    }

    #[test]
    fn quiet_times_keep_one_snapshot_per_baseline_and_triggers_keep_the_seconds_before() {
        // Every 100 ms; ring 1 s, post window 500 ms, baseline 1 s.
        let mut r = Recorder::new(1000 * MS, 500 * MS, 1000 * MS);
        let mut written = Vec::new();
        for step in 0..=50u64 {
            let t = step * 100 * MS;
            if step == 35 {
                written.extend(r.on_trigger(t));
            }
            written.extend(r.on_snapshot(t, Vec::new()));
        }
        written.extend(r.finish());
        let t = times(&written);
        // Baselines 0, 1000, 2000 left the ring before the trigger; at 3500 the ring held
        // 2400..3400 (within 1 s of the last snapshot), then 3500..4000 came directly; after
        // the window, only the next baseline (5000, written at the end).
        let mut expected = vec![0, 1000, 2000];
        expected.extend((24..=40).map(|s| s * 100));
        expected.push(5000);
        assert_eq!(t, expected);
        assert!(t.windows(2).all(|w| w[0] < w[1]), "time order: {t:?}");
        assert_eq!(r.triggers, 1);
    }
}
