//! The search's pieces: spans over the grid of steps, and the recent steps kept at ingest.
//! (The search itself, over an archive and a live table filled by real ingest, is tested in
//! the collector, which has them.)

use std::collections::BTreeMap;

use monitor_archive::query::engine::{CounterPoint, GaugePoint};
use monitor_wire::GaugeSample;

use super::*;

const T0: u64 = 1_790_000_000_000_000_000;
const S: u64 = 1_000_000_000;

/// The steps covered, by index, with their values.
fn covered(values: &[f64]) -> BTreeMap<u64, f64> {
    (0..)
        .zip(values)
        .filter(|(_, v)| !v.is_nan())
        .map(|(k, &v)| (k, v))
        .collect()
}

/// Spans over the grid: a gauge's envelope holds over (previous sample, its time], a counter's
/// rate over (previous sample, its time], each step weighted by the time it covers.
#[test]
fn spans_cover_the_steps_they_overlap() {
    let grid = Grid {
        start: 100 * S,
        end: 130 * S,
        step: 10 * S,
    };
    assert_eq!(grid.steps(), 3);
    let gauge = |start: u64, t: u64, mean: f64| GaugePoint {
        start: start * S,
        t: t * S,
        min: mean,
        max: mean,
        mean,
    };
    // 1.0 over (70, 102], 3.0 over (102, 134]: step 0 is 2 s of 1.0 and 8 s of 3.0.
    let covers = gauge_covers(
        &grid,
        &[
            gauge(70, 70, 9.0),
            gauge(71, 102, 1.0),
            gauge(103, 134, 3.0),
        ],
    );
    let values = covered(&values_of(&covers));
    assert_eq!(values.len(), 3);
    assert!((values[&0] - 2.6).abs() < 1e-9, "{values:?}");
    assert_eq!(values[&1], 3.0);
    assert_eq!(values[&2], 3.0);
    // A first sample with nothing before it spans its own reads; one after a long pause too.
    let covers = gauge_covers(&grid, &[gauge(0, 0, 9.0), gauge(125, 128, 5.0)]);
    assert_eq!(covered(&values_of(&covers)), BTreeMap::from([(2, 5.0)]));
    // A counter's rate over the pair it is between; the first sample gives none.
    let counter = |t: u64, rate: Option<f64>| CounterPoint {
        t: t * S,
        value: 0,
        rate,
    };
    let covers = counter_covers(
        &grid,
        &[
            counter(95, Some(7.0)),
            counter(115, Some(4.0)),
            counter(150, Some(2.0)),
        ],
    );
    assert_eq!(
        covered(&values_of(&covers)),
        BTreeMap::from([(0, 4.0), (1, 3.0), (2, 2.0)])
    );
    // A window shorter than a step is one step; spans outside it cover nothing.
    let short = Grid {
        start: 100 * S,
        end: 104 * S,
        step: 10 * S,
    };
    let covers = counter_covers(&short, &[counter(90, None), counter(102, Some(6.0))]);
    assert_eq!(covered(&values_of(&covers)), BTreeMap::from([(0, 6.0)]));
    let covers = counter_covers(&short, &[counter(105, None), counter(110, Some(6.0))]);
    assert_eq!(covers.len(), 1);
    assert!(uncovered(&values_of(&covers)));
}

/// A series' recent steps: a gauge's mean over (previous sample, its time] in each epoch step
/// it covers; the ring keeps the last `RECENT_STEPS`, clears the steps a later sample passes
/// over, and says when a window's first step has rolled off.
#[test]
fn recent_steps_keep_the_last_steps_and_clear_those_they_pass() {
    use monitor_wire::SeriesData;
    use recent::{RECENT_STEPS, RecentSteps};
    let mut recent = RecentSteps::default();
    recent.define(7, Some(Kind::Gauge));
    recent.define(8, None);
    let envelope = |start: u64, t: u64, mean: f64| {
        SeriesData::Gauge(vec![GaugeSample {
            start_unix_ns: start,
            end_unix_ns: t,
            min: mean,
            max: mean,
            mean,
        }])
    };
    let reading = |t: u64, mean: f64| envelope(t, t, mean);
    let first = T0 / (10 * S);
    recent.add(7, &reading(T0, 1.0));
    recent.add(7, &reading(T0 + 25 * S, 2.0));
    recent.add(8, &reading(T0 + 25 * S, 2.0));
    let (_, steps) = recent.series().next().unwrap();
    assert_eq!(recent.series().count(), 1);
    let covers = steps.covers(first, first + 3).unwrap();
    // Step 0: the first reading, alone (an instant), then 2.0 over (0, 25 s].
    assert_eq!(
        covered(&values_of(&covers)),
        BTreeMap::from([(0, 2.0), (1, 2.0), (2, 2.0)])
    );
    assert_eq!(covers[2].ns, 5e9);
    // An envelope of the reads of the next 400 s spans 40 steps: the ring's last steps keep
    // it, the older ones are gone.
    recent.add(7, &envelope(T0 + 26 * S, T0 + 425 * S, 3.0));
    let (_, steps) = recent.series().next().unwrap();
    assert!(steps.covers(first, first + 43).is_none());
    let oldest = first + 42 - RECENT_STEPS as u64 + 1;
    let covers = steps.covers(oldest, first + 43).unwrap();
    assert_eq!(covers.len(), RECENT_STEPS);
    assert!(covers.iter().all(|c| c.value() == Some(3.0)));
    assert_eq!(covers[RECENT_STEPS - 1].ns, 5e9);
}
