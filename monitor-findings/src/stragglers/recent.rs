//! The straggler metrics' recent steps, kept at ingest: each series of the metrics the
//! search reads ([`super::metrics_read`]) has its samples' spans spread, as they arrive, over
//! the epoch's 10 s steps (`Grid::epoch`), the last [`RECENT_STEPS`] of them kept.
//!
//! Why: the job view asks for a 1,024-node job's stragglers over 5 minutes every time it
//! loads. Read from the archive, that is 1,024 nodes × 7 minutes of records decoded again
//! on every load (seconds); from these steps it is a copy of each series' 30 steps. A window
//! aligned to the step (what the dashboard asks) has the same steps as the epoch's, so its
//! values are the ones the archive gives. A node the live table has not held whole since
//! before the window (the collector restarted, the node's session changed) is still read
//! from the archive: see [`LiveSteps::visit_recent_steps`](super::LiveSteps::visit_recent_steps).
//!
//! Memory: [`RECENT_STEPS`] × 32 B a series, for 40 series a node (3 GPU metrics × 8 GPUs,
//! 2 port counters × 8 ports): about 46 kB a node.

use monitor_wire::{CounterSample, GaugeSample, Kind, SeriesData};

use super::{
    STEP_NS,
    spans::{Cover, Covers, Grid, gauge_span_start},
};
use monitor_archive::query::engine::counter_rate;

/// Steps kept per series: the default 5-minute window (30 steps) ending one step behind the
/// clock (as the dashboard asks), the step under way, and 40 s for frames still in flight.
pub const RECENT_STEPS: usize = 36;

type HashMap<K, V> = foldhash::HashMap<K, V>;

/// One node's recent steps, by series id (of its session's schema).
#[derive(Debug, Default)]
pub struct RecentSteps {
    series: HashMap<u32, SeriesSteps>,
}

/// One series' recent steps: its last [`RECENT_STEPS`] epoch steps, in a ring.
#[derive(Debug)]
pub struct SeriesSteps {
    kind: Kind,
    /// The previous sample: its time, and a counter's value (the next rate's base).
    previous: Option<(u64, u64)>,
    /// The latest step written; the ring holds `(head - RECENT_STEPS, head]`.
    head: u64,
    ring: Box<[Cover; RECENT_STEPS]>,
}

impl RecentSteps {
    /// Whether series named `name` are kept (the metrics the straggler search reads).
    pub fn keeps(name: &str) -> bool {
        super::metrics_read().any(|m| m == name)
    }

    /// Id `id` now stands for a series of kind `kind` that is kept (its steps start over)
    /// or, `None`, for one that is not.
    pub fn define(&mut self, id: u32, kind: Option<Kind>) {
        match kind {
            Some(kind) => {
                self.series.insert(
                    id,
                    SeriesSteps {
                        kind,
                        previous: None,
                        head: 0,
                        ring: Box::new([Cover::default(); RECENT_STEPS]),
                    },
                );
            }
            None => {
                self.series.remove(&id);
            }
        }
    }

    /// Forgets every series (a new session's ids start over).
    pub fn clear(&mut self) {
        self.series.clear();
    }

    /// Takes a sample of series `id`, if it is kept.
    pub fn add(&mut self, id: u32, data: &SeriesData) {
        if let Some(s) = self.series.get_mut(&id) {
            match data {
                SeriesData::Gauge(v) if s.kind == Kind::Gauge => s.add_gauges(v),
                SeriesData::Counter(v) if s.kind == Kind::Counter => s.add_counters(v),
                _ => {} // a kind that disagrees with the schema: not shown, as in `latest`
            }
        }
    }

    /// Every kept series, by id.
    pub fn series(&self) -> impl Iterator<Item = (u32, &SeriesSteps)> {
        self.series.iter().map(|(&id, s)| (id, s))
    }
}

impl SeriesSteps {
    fn add_gauges(&mut self, samples: &[GaugeSample]) {
        for g in samples {
            let from = gauge_span_start(self.previous.map(|p| p.0), g.start_unix_ns, g.end_unix_ns);
            self.spread(from, g.end_unix_ns, g.mean);
            self.previous = Some((g.end_unix_ns, 0));
        }
    }

    fn add_counters(&mut self, samples: &[CounterSample]) {
        let mut sorted: Vec<&CounterSample> = samples.iter().collect();
        sorted.sort_by_key(|c| c.unix_ns);
        for c in sorted {
            match self.previous {
                // Already seen, or older than what was: the rate it would give is lost.
                Some((t, _)) if c.unix_ns <= t => continue,
                Some(p) => {
                    let rate = counter_rate(p, (c.unix_ns, c.value));
                    self.spread(p.0, c.unix_ns, rate);
                }
                None => {}
            }
            self.previous = Some((c.unix_ns, c.value));
        }
    }

    /// Spreads `v` over `(a, b]` into the ring, moving its head on (and clearing the steps
    /// it passes) when the span reaches past it; the part of a span older than the ring is
    /// dropped.
    fn spread(&mut self, a: u64, b: u64, v: f64) {
        let (head, ring) = (&mut self.head, &mut self.ring);
        Grid::epoch(STEP_NS).spread_with(a, b, v, |k, c| {
            if k > *head {
                let from = (*head + 1).max(k.saturating_sub(RECENT_STEPS as u64 - 1));
                for cleared in from..=k {
                    ring[cleared as usize % RECENT_STEPS] = Cover::default();
                }
                *head = k;
            }
            if k + (RECENT_STEPS as u64) > *head {
                ring[k as usize % RECENT_STEPS].add(&c);
            }
        });
    }

    /// Whether the ring still holds epoch step `k` (or nothing has reached it yet).
    pub fn holds(&self, k: u64) -> bool {
        k + (RECENT_STEPS as u64) > self.head
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The covers of epoch steps `[first, end)`, numbered from `first` (the steps of an
    /// aligned window starting at step `first`); `None` if the ring no longer holds `first`.
    pub(crate) fn covers(&self, first: u64, end: u64) -> Option<Covers> {
        if !self.holds(first) {
            return None;
        }
        Some(
            (first..end)
                .map(|k| {
                    if k <= self.head {
                        self.ring[k as usize % RECENT_STEPS]
                    } else {
                        Cover::default()
                    }
                })
                .collect(),
        )
    }
}
