//! A query's memory is bounded: over a node-hour (0.85 M samples of the 236 series of a busy
//! simulated node, `monitor_testkit::NodeSender`), one metric's answer and its JSON take a few
//! MiB (the node-hour decoded would take about 30 MiB), an
//! answer over the points limit is refused before it grows past it, and nothing a query
//! decoded is kept after it answered. Measured with a counting global allocator (this test
//! binary holds one test, so no other test allocates meanwhile).

use std::{
    alloc::{GlobalAlloc, Layout, System},
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use monitor_archive::{
    archive::{AcceptedFrame, Archive, ArchiveConfig},
    query::{Matcher, QueryEngine, QueryError, SeriesQuery},
};
use monitor_collector::query::api::series_body;
use monitor_testkit::NodeSender;
use monitor_wire::Key;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator, only counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f`; returns its result and the most memory it held at once above what was live
/// before it.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let out = f();
    (out, PEAK.load(Ordering::Relaxed) - before)
}

const MIB: usize = 1 << 20;

#[test]
fn a_large_query_stays_within_its_memory_bound_and_keeps_nothing() {
    let key = Key::from_bytes([7; 32]);
    let now_s = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let seconds = 3600;
    let t0 = (now_s - seconds - 60) * 1_000_000_000;
    let dir = tempfile::tempdir().unwrap();
    let mut archive = Archive::open(ArchiveConfig {
        segment_span: Duration::from_secs(600),
        retention_age: None,
        ..ArchiveConfig::new(dir.path())
    })
    .unwrap();
    let mut sender = NodeSender::new("gpu-node-0001", 1, key.clone());
    let mut samples = 0;
    for chunk in 0..seconds / 10 {
        let frames = sender.run(t0 + chunk * 10_000_000_000, 10, 10);
        samples += frames.iter().map(|f| f.samples).sum::<usize>();
        for f in &frames {
            let accepted = AcceptedFrame {
                node: &sender.name,
                received_ns: f.received_ns,
                first_ns: f.first_ns,
                last_ns: f.last_ns,
                bytes: &f.bytes,
            };
            archive
                .append(&accepted, &|_| sender.schema_frame())
                .unwrap();
        }
        archive.tick().unwrap();
    }
    archive.seal().unwrap();
    assert_eq!(sender.series(), 236, "a busy node's series");
    assert_eq!(samples, 236 * 3600);

    let query = |metric: &str| SeriesQuery {
        metric: metric.into(),
        matchers: vec![Matcher::parse("node=~gpu-node-000[0-9]").unwrap()],
        start_ns: t0,
        end_ns: t0 + seconds * 1_000_000_000,
    };
    let limited = QueryEngine::new(archive.reader(), key.clone()).with_max_points(20_000);
    let engine = QueryEngine::new(archive.reader(), key);
    let live_before = LIVE.load(Ordering::Relaxed);

    // One metric of 8 ports: 8 x 3600 points, over the limit of 20,000.
    let (refused, peak) = peak_of(|| limited.series(&query("railscope_ib_port_xmit_bytes_total")));
    match refused {
        Err(e @ QueryError::TooManyPoints { limit: 20_000 }) => {
            assert!(e.to_string().contains("more than 20000 points"), "{e}")
        }
        other => panic!("expected the points limit, got {other:?}"),
    }
    assert!(peak < 8 * MIB, "a refused query held {peak} bytes");

    // One GPU metric of 8 GPUs (its default limit of a million points).
    let ((answers, body), peak) = peak_of(|| {
        let (answers, _) = engine.series(&query("railscope_gpu_power_watts")).unwrap();
        let body = series_body(&answers, &Default::default());
        (answers, body)
    });
    let points: usize = answers
        .iter()
        .map(|a| match &a.points {
            monitor_archive::query::engine::Points::Counter(p) => p.len(),
            monitor_archive::query::engine::Points::Gauge(p) => p.len(),
        })
        .sum();
    assert_eq!(answers.len(), 8, "one series per GPU");
    assert!(points > 8 * 300, "{points} points");
    assert!(
        peak < 8 * MIB,
        "one metric of a node-hour ({points} points, {} B of JSON) held {peak} bytes",
        body.len()
    );
    drop((answers, body));
    let kept = LIVE.load(Ordering::Relaxed).saturating_sub(live_before);
    assert!(
        kept < 64 << 10,
        "{kept} bytes still held after the queries answered"
    );
}
