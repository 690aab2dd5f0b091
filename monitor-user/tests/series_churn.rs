//! A million series that come and go, as the verb counters of jobs do on a node that runs for
//! months: the loop's sampler and the frame encoder must hold only the live ones, and the
//! memory they take must stay where it was after the first jobs.
//!
//! Memory is measured with a counting global allocator (bytes allocated and not yet freed by
//! this test binary), not with the process' RSS, which the system allocator keeps high.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    sync::atomic::{AtomicI64, Ordering},
    time::Duration,
};

use monitor_sampler::Slot;
use monitor_user::pipeline::{VERB_SERIES, sampler_config, wire_sample};
use monitor_wire::{EncoderConfig, FrameEncoder, Key, Kind, Labels, Series, Value};

struct Counting;

static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);

// SAFETY: every call is passed on to the system allocator unchanged; only a counter changes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: as the caller promised.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: as the caller promised.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        // SAFETY: as the caller promised.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const SERIES_PER_JOB: u64 = 100;
/// Jobs that start (and end) per sweep; each lives `JOB_SWEEPS` sweeps (one keeps the test
/// within a minute or two in debug builds: every series is still read, sent and forgotten).
const JOBS_PER_SWEEP: u64 = 10;
const JOB_SWEEPS: u64 = 1;
const TOTAL_SERIES: u64 = 1_000_000;
const SECOND: u64 = 1_000_000_000;

fn series(job: u64, i: u64) -> Series {
    Series {
        name: VERB_SERIES.into(),
        labels: Labels::new([
            ("cgroup", format!("/slurm/job_{job}")),
            ("device", format!("mlx5_{}", i % 8)),
            ("verb", format!("verb_{}", i / 8)),
        ]),
        kind: Kind::Counter,
    }
}

#[test]
fn a_million_series_that_come_and_go_leave_memory_bounded() {
    let mut sampler = sampler_config(Duration::from_secs(1), true, &[]).unwrap();
    let mut encoder =
        FrameEncoder::new(EncoderConfig::new("node"), Key::from_bytes([7; 32])).unwrap();
    let jobs = TOTAL_SERIES / SERIES_PER_JOB;
    let sweeps = jobs / JOBS_PER_SWEEP + JOB_SWEEPS;
    let live_series = (JOBS_PER_SWEEP * JOB_SWEEPS * SERIES_PER_JOB) as usize;
    let t0 = 1_700_000_000 * SECOND;
    let mut warm: Option<i64> = None;
    let mut peak_after_warm = 0i64;
    let mut frames = 0usize;
    for sweep in 0..sweeps {
        let now = t0 + sweep * SECOND;
        // Jobs started in the last JOB_SWEEPS sweeps are live.
        let first_live = (sweep + 1).saturating_sub(JOB_SWEEPS) * JOBS_PER_SWEEP;
        let last_live = ((sweep + 1) * JOBS_PER_SWEEP).min(jobs);
        for job in first_live..last_live {
            for i in 0..SERIES_PER_JOB {
                let s = series(job, i);
                let value = Value::U64((sweep - job / JOBS_PER_SWEEP + 1) * (i + 1));
                for emit in sampler
                    .observe_at(&s, &mut Slot::default(), value, now)
                    .iter()
                {
                    encoder.push_sample(&s, wire_sample(emit)).unwrap();
                }
            }
        }
        // The jobs started JOB_SWEEPS - 1 sweeps ago end: their last values go out, then
        // sampler and encoder forget them (what the agent does once their cgroup is gone).
        if sweep + 1 >= JOB_SWEEPS {
            let ending = (sweep + 1 - JOB_SWEEPS) * JOBS_PER_SWEEP;
            let names: Vec<String> = (ending..(ending + JOBS_PER_SWEEP).min(jobs))
                .map(|j| format!("/slurm/job_{j}"))
                .collect();
            let ended = |s: &Series| {
                s.labels
                    .get("cgroup")
                    .is_some_and(|c| names.iter().any(|n| n == c))
            };
            for (s, emit) in sampler.remove_where(|s, _| ended(s)) {
                encoder.push_sample(&s, wire_sample(&emit)).unwrap();
            }
            encoder.retire_where(ended);
        }
        frames += encoder.flush(now).len();
        assert!(
            sampler.len() <= live_series,
            "sweep {sweep}: {}",
            sampler.len()
        );
        assert!(encoder.known_series() <= live_series);
        let bytes = LIVE_BYTES.load(Ordering::Relaxed);
        match warm {
            // After the first few jobs came and went.
            None if sweep == 4 * JOB_SWEEPS => warm = Some(bytes),
            Some(_) => peak_after_warm = peak_after_warm.max(bytes),
            None => {}
        }
    }
    assert!(frames > 0);
    assert_eq!(sampler.len(), 0, "every job ended");
    assert_eq!(encoder.known_series(), 0);
    assert_eq!(encoder.stats().forgotten_series, TOTAL_SERIES);
    let warm = warm.unwrap();
    println!(
        "{TOTAL_SERIES} series over {sweeps} sweeps: {warm} bytes after the first jobs, \
         at most {peak_after_warm} after, {} at the end",
        LIVE_BYTES.load(Ordering::Relaxed)
    );
    // A series held costs a few hundred bytes: had they piled up, a million would be
    // hundreds of MB. What is live stays within a small multiple of the first jobs' share.
    assert!(
        peak_after_warm < 2 * warm,
        "memory grew from {warm} to {peak_after_warm} bytes while series came and went"
    );
}
