//! Whether the collector's receive threads still turn. Each receive loop beats once per
//! turn (at least every socket read timeout, traffic or not); the main thread pings systemd's
//! watchdog only while every thread beat recently, so a receive thread that hangs gets the
//! collector killed and restarted by systemd (`WatchdogSec=`), as a hung main thread would.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One heartbeat per named thread: the time of its last beat.
pub struct Heartbeats {
    start: Instant,
    /// (thread name, milliseconds after `start` of its last beat)
    beats: Vec<(String, AtomicU64)>,
}

impl Heartbeats {
    /// Heartbeats for `names`, each counting as just beaten.
    pub fn new(names: impl IntoIterator<Item = String>) -> Self {
        Self {
            start: Instant::now(),
            beats: names.into_iter().map(|n| (n, AtomicU64::new(0))).collect(),
        }
    }

    /// Thread `index` is alive now.
    pub fn beat(&self, index: usize) {
        if let Some((_, at)) = self.beats.get(index) {
            at.store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
        }
    }

    /// The threads that have not beaten for longer than `max_age`, with how long.
    pub fn stalled(&self, max_age: Duration) -> Vec<(&str, Duration)> {
        let now = self.start.elapsed();
        self.beats
            .iter()
            .filter_map(|(name, at)| {
                let age = now.saturating_sub(Duration::from_millis(at.load(Ordering::Relaxed)));
                (age > max_age).then_some((name.as_str(), age))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_that_stops_beating_is_named() {
        let beats = Heartbeats::new(["receive-0".to_owned(), "receive-1".to_owned()]);
        assert!(beats.stalled(Duration::from_secs(5)).is_empty());
        std::thread::sleep(Duration::from_millis(30));
        beats.beat(0);
        let stalled = beats.stalled(Duration::from_millis(20));
        assert_eq!(stalled.len(), 1, "{stalled:?}");
        assert_eq!(stalled[0].0, "receive-1");
        assert!(stalled[0].1 >= Duration::from_millis(30));
        beats.beat(1);
        assert!(beats.stalled(Duration::from_millis(20)).is_empty());
    }
}
