//! What the collector's node state holds in memory, measured with a counting allocator: per
//! realistic node (8 GPUs x 40 gauges, 8 ports x 50 counters), and under a node that sends
//! far more series than the bound allows. The figures are the ones docs/architecture.md
//! gives ("Collector", memory bounds).

use std::{
    alloc::{GlobalAlloc, Layout, System},
    sync::atomic::{AtomicIsize, Ordering},
};

use monitor_collector::{Limits, drops::DropReason, nodes::NodeTable};
use monitor_findings::stragglers;
use monitor_wire::{EncoderConfig, FrameEncoder, Key, Kind, Labels, Reading, Series, Value};

/// Bytes currently allocated by the process.
static HELD: AtomicIsize = AtomicIsize::new(0);

struct Counting;

// SAFETY: forwards to the system allocator, only counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HELD.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's layout, as given.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: allocated above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn held() -> isize {
    HELD.load(Ordering::Relaxed)
}

const T0: u64 = 1_763_164_800_000_000_000;

fn key() -> Key {
    Key::from_bytes([4; 32])
}

/// The name of a node's `m`-th GPU gauge: the first ones are the straggler metrics the
/// collector keeps recent steps of (monitor_collector::stragglers), as agents name them.
fn gpu_metric(m: usize) -> String {
    stragglers::GPU_METRICS.get(m).map_or_else(
        || format!("railscope_gpu_metric_{m:02}_ratio"),
        |n| n.to_string(),
    )
}

/// The name of a port's `m`-th counter, the straggler search's two first.
fn port_counter(m: usize) -> String {
    stragglers::PORT_COUNTERS.get(m).map_or_else(
        || format!("railscope_ib_counter_{m:02}_total"),
        |n| n.to_string(),
    )
}

/// One flush of a realistic node at `t`: 320 GPU gauges and 400 port counters.
fn node_frames(enc: &mut FrameEncoder, t: u64) -> Vec<Vec<u8>> {
    for gpu in 0..8 {
        let labels = Labels::new([
            ("gpu", gpu.to_string()),
            (
                "uuid",
                format!("GPU-{gpu:08x}-5e1f-4c1a-9b2d-6f0a8c3e{gpu:04x}"),
            ),
        ]);
        for m in 0..40 {
            enc.push_reading(&Reading {
                series: Series {
                    name: gpu_metric(m).into(),
                    labels: labels.clone(),
                    kind: Kind::Gauge,
                },
                value: Value::F64(m as f64 * 1.5),
                unix_ns: t,
            })
            .unwrap();
        }
    }
    for port in 0..8 {
        let labels = Labels::new([("device", format!("mlx5_{port}")), ("port", "1".into())]);
        for m in 0..50 {
            enc.push_reading(&Reading {
                series: Series {
                    name: port_counter(m).into(),
                    labels: labels.clone(),
                    kind: Kind::Counter,
                },
                value: Value::U64(1_000_000 + m as u64),
                unix_ns: t,
            })
            .unwrap();
        }
    }
    enc.flush(t + 1_000_000)
}

#[test]
fn node_state_stays_within_its_documented_bounds() {
    let limits = Limits {
        max_series_per_node: 2_000,
        ..Limits::default()
    };
    let table = NodeTable::new(key(), limits);
    let from = "192.0.2.1:4000".parse().unwrap();
    let mut encoders: Vec<FrameEncoder> = (0..20)
        .map(|i| FrameEncoder::new(EncoderConfig::new(format!("gpu-node-{i:04}")), key()).unwrap())
        .collect();
    // The first flush of every node creates it; measure what 20 nodes hold after 3 flushes
    // (schema, latest values), not the frames, which are dropped after each ingest.
    let frames: Vec<Vec<Vec<u8>>> = encoders
        .iter_mut()
        .map(|e| {
            (0..3)
                .flat_map(|s| node_frames(e, T0 + s * 1_000_000_000))
                .collect()
        })
        .collect();
    let before = held();
    for node in &frames {
        for f in node {
            table.ingest(f, from, T0).unwrap();
        }
    }
    let per_node = (held() - before) / 20;
    println!("node state: {per_node} bytes per node of 720 series");
    assert_eq!(table.series_count(), 20 * 720);
    // docs/architecture.md: about 250 kB for such a node (at most 350 B per series).
    assert!(per_node < 720 * 350, "{per_node} bytes per node");

    // A node that keeps naming new series: refused at the bound, its memory stays bounded.
    let mut flood = FrameEncoder::new(EncoderConfig::new("flood"), key()).unwrap();
    let mut flood_frames = Vec::new();
    for round in 0..30u64 {
        for i in 0..500u64 {
            flood
                .push_reading(&Reading {
                    series: Series {
                        name: "railscope_flood_total".into(),
                        labels: Labels::new([("i", (round * 500 + i).to_string())]),
                        kind: Kind::Counter,
                    },
                    value: Value::U64(1),
                    unix_ns: T0,
                })
                .unwrap();
        }
        flood_frames.extend(flood.flush(T0 + round));
    }
    let before = held();
    let mut refused = 0;
    for f in &flood_frames {
        if let Err(e) = table.ingest(f, from, T0) {
            assert_eq!(e.reason, DropReason::SeriesLimit);
            refused += 1;
        }
    }
    let flood_bytes = held() - before;
    println!("flooding node: {flood_bytes} bytes after 15,000 series sent");
    assert!(refused > 0);
    let flood = table
        .summaries()
        .into_iter()
        .find(|n| n.node == "flood")
        .unwrap();
    assert!(flood.series_refused);
    // Bounded by the per-node bound plus one frame's entries, not by what was sent.
    assert!(flood_bytes < 2_500 * 350, "{flood_bytes} bytes");
}
