//! Whether the collector's threads still turn. Each watched thread beats its [`Heartbeat`]
//! once per turn of its loop, and from inside long work (the sealer per block): the receive
//! threads at least every socket read timeout, the archive writer at least every tick, the
//! archive's sealer and the findings thread at least every [`BEAT_EVERY`] when idle, the HTTP
//! server from a task on its runtime (a runtime whose worker is blocked stops beating). The
//! main thread pings systemd's watchdog only while every thread beat recently
//! ([`Heartbeats::watchdog_check`]), so a thread that hangs gets the collector killed and
//! restarted by systemd (`WatchdogSec=`), as a hung main thread would.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

/// How often an idle watched thread beats at least (well under the watchdog's ping period:
/// half of `WatchdogSec=`).
pub const BEAT_EVERY: Duration = Duration::from_millis(100);

/// One thread's heartbeat: cheap to clone, beaten from the thread, read by the main thread.
#[derive(Clone, Debug)]
pub struct Heartbeat {
    start: Instant,
    /// Milliseconds after `start` of the last beat.
    last_ms: Arc<AtomicU64>,
}

impl Default for Heartbeat {
    fn default() -> Self {
        Self::new()
    }
}

impl Heartbeat {
    /// A heartbeat that counts as just beaten.
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            last_ms: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The thread is alive now.
    pub fn beat(&self) {
        self.last_ms
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// How long ago the last beat was.
    pub fn age(&self) -> Duration {
        self.start
            .elapsed()
            .saturating_sub(Duration::from_millis(self.last_ms.load(Ordering::Relaxed)))
    }
}

/// The heartbeats of the watched threads, by thread name.
#[derive(Debug, Default)]
pub struct Heartbeats {
    beats: Vec<(String, Heartbeat)>,
}

impl Heartbeats {
    /// Heartbeats for `names`, each counting as just beaten.
    pub fn new(names: impl IntoIterator<Item = String>) -> Self {
        Self {
            beats: names.into_iter().map(|n| (n, Heartbeat::new())).collect(),
        }
    }

    /// Watches one more thread, by its heartbeat.
    pub fn watch(&mut self, name: impl Into<String>, heartbeat: Heartbeat) {
        self.beats.push((name.into(), heartbeat));
    }

    /// The heartbeat of thread `index` (in the order of `new`, then of `watch`).
    pub fn get(&self, index: usize) -> Option<&Heartbeat> {
        self.beats.get(index).map(|(_, h)| h)
    }

    /// The heartbeat of the thread called `name`.
    pub fn named(&self, name: &str) -> Option<&Heartbeat> {
        self.beats.iter().find(|(n, _)| n == name).map(|(_, h)| h)
    }

    /// Thread `index` is alive now.
    pub fn beat(&self, index: usize) {
        if let Some(h) = self.get(index) {
            h.beat();
        }
    }

    /// The names of the watched threads.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.beats.iter().map(|(n, _)| n.as_str())
    }

    /// The threads that have not beaten for longer than `max_age`, with how long.
    pub fn stalled(&self, max_age: Duration) -> Vec<(&str, Duration)> {
        self.beats
            .iter()
            .filter_map(|(name, h)| {
                let age = h.age();
                (age > max_age).then_some((name.as_str(), age))
            })
            .collect()
    }

    /// Whether the watchdog may be pinged: `Err` with the line to log, naming every thread
    /// that has not beaten for longer than `max_age`, when not.
    pub fn watchdog_check(&self, max_age: Duration) -> Result<(), String> {
        let stalled = self.stalled(max_age);
        if stalled.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = stalled
            .iter()
            .map(|(name, age)| format!("{name} ({:.1} s)", age.as_secs_f64()))
            .collect();
        Err(format!(
            "not pinging the watchdog: stalled: {}",
            names.join(", ")
        ))
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

    #[test]
    fn the_watchdog_line_names_each_stalled_thread_and_only_those() {
        let mut beats = Heartbeats::new(["receive-0".to_owned()]);
        let (writer, sealer, http) = (Heartbeat::new(), Heartbeat::new(), Heartbeat::new());
        beats.watch("archive-writer", writer.clone());
        beats.watch("archive-sealer", sealer.clone());
        beats.watch("http", http.clone());
        assert_eq!(beats.watchdog_check(Duration::from_millis(200)), Ok(()));
        std::thread::sleep(Duration::from_millis(300));
        // The receive thread and the writer go on; the sealer and the HTTP server do not.
        beats.beat(0);
        writer.beat();
        let line = beats
            .watchdog_check(Duration::from_millis(200))
            .unwrap_err();
        assert!(
            line.starts_with("not pinging the watchdog: stalled: "),
            "{line}"
        );
        assert!(line.contains("archive-sealer (0."), "{line}");
        assert!(line.contains("http (0."), "{line}");
        assert!(!line.contains("receive-0"), "{line}");
        assert!(!line.contains("archive-writer"), "{line}");
        sealer.beat();
        http.beat();
        assert_eq!(beats.watchdog_check(Duration::from_millis(200)), Ok(()));
    }
}
