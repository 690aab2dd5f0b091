//! bench-events (on request, for `cargo xtask bench events`): how late port events reach the
//! collector. The agent sends to `railscope listen` while rxe0's link flaps a few hundred
//! times; for every port event that arrives, the time from the kernel's timestamp to the
//! frame leaving the agent (the frame's send time, on the agent's clock) and to `listen`
//! printing it (the time this scenario reads the line from listen's stdout, on the same
//! guest clock). Prints one `BENCH-EVENTS` JSON line with the percentiles.
//!
//! As a baseline of what the guest itself adds, a trivial thread sleeps 1 ms in a loop
//! during the flaps and records how much later than asked it wakes: the scheduling and
//! timer latency any process in this guest sees under the same load, ours or not.

use std::{
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, ensure};
use serde_json::{Value, json};

use crate::guest;

const PORT: &str = "17402";
const FLAPS: usize = 300;
/// Time between a link change and the next, so each event is alone in the ring buffer.
const PAUSE: Duration = Duration::from_millis(30);

pub(super) fn run() -> anyhow::Result<()> {
    super::ensure_rdma_modules()?;
    guest::ensure_rxe_pair()?;
    // Neither process echoes to the (slow, serial) console: it would delay their pipes.
    let (mut agent, listener) = guest::agent_and_listener(PORT, &[], false)?;
    agent.wait_for_log("ib_dispatch_event attached", Duration::from_secs(30))?;
    thread::sleep(Duration::from_secs(2));
    let done = Arc::new(AtomicBool::new(false));
    let baseline = {
        let done = Arc::clone(&done);
        thread::spawn(move || {
            let mut overshoot = Vec::new();
            while !done.load(Ordering::Relaxed) {
                let t = Instant::now();
                thread::sleep(Duration::from_millis(1));
                overshoot.push(ms(t.elapsed().as_nanos() as u64).max(1.0) - 1.0);
            }
            overshoot
        })
    };
    let start = Instant::now();
    for _ in 0..FLAPS {
        for state in ["down", "up"] {
            let status = Command::new("/usr/bin/ip")
                .args(["link", "set", "vethA", state])
                .status()
                .context("ip link set")?;
            ensure!(status.success(), "ip link set vethA {state}: {status}");
            thread::sleep(PAUSE);
        }
    }
    let flapping = start.elapsed();
    done.store(true, Ordering::Relaxed);
    let mut overshoot = baseline.join().expect("no panic");
    thread::sleep(Duration::from_secs(2));
    ensure!(agent.is_running(), "the agent died");
    let (_, agent_log) = agent.stop()?;
    thread::sleep(Duration::from_millis(500));
    let lines = listener.stop_timed()?;
    // The agent's own account of the first leg: kernel timestamp to its ring-buffer reader.
    let to_reader = agent_log
        .iter()
        .find(|l| l.contains("ib_core event drain:") && l.contains("kernel to reader"))
        .map(|l| reader_percentiles(l))
        .unwrap_or(Value::Null);

    let (mut to_frame, mut to_print) = (Vec::new(), Vec::new());
    for (read_ns, line) in &lines {
        let frame: Value =
            serde_json::from_str(line).with_context(|| format!("not JSON: {line}"))?;
        let send = frame["send_unix_ns"]
            .as_u64()
            .context("frame without send time")?;
        for e in frame["events"].as_array().into_iter().flatten() {
            if e["kind"] != "ib_port" || e["labels"]["device"] != "rxe0" {
                continue;
            }
            let t = e["unix_ns"].as_u64().context("event without time")?;
            to_frame.push(ms(send.saturating_sub(t)));
            to_print.push(ms(read_ns.saturating_sub(t)));
        }
    }
    println!(
        "{FLAPS} flaps in {flapping:?}: {} rxe0 port events at the collector",
        to_frame.len()
    );
    ensure!(
        to_frame.len() >= 2 * FLAPS,
        "expected at least {} port events (a PORT_ERR and a PORT_ACTIVE per flap), got {}",
        2 * FLAPS,
        to_frame.len()
    );
    let report = json!({
        "flaps": FLAPS,
        "pause_ms": PAUSE.as_millis() as u64,
        "events": to_frame.len(),
        "kernel_to_frame_ms": percentiles(&mut to_frame),
        "kernel_to_listen_ms": percentiles(&mut to_print),
        "kernel_to_reader_ms": to_reader,
        "sleep_1ms_overshoot_ms": percentiles(&mut overshoot),
    });
    println!("BENCH-EVENTS {report}");
    Ok(())
}

/// `... kernel to reader p50 0.41 ms p90 1.20 ms p99 9.87 ms max 20.00 ms` as JSON.
fn reader_percentiles(line: &str) -> Value {
    let tail = line.split("kernel to reader").nth(1).unwrap_or_default();
    let after = |key: &str| -> Option<f64> {
        let rest = tail.split(&format!("{key} ")).nth(1)?;
        rest.split_whitespace().next()?.parse().ok()
    };
    json!({
        "p50": after("p50"),
        "p90": after("p90"),
        "p99": after("p99"),
        "max": after("max"),
    })
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// p50, p90, p99 and the maximum (nearest rank).
fn percentiles(values: &mut [f64]) -> Value {
    values.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
        values[rank - 1]
    };
    json!({
        "p50": at(0.50),
        "p90": at(0.90),
        "p99": at(0.99),
        "max": values.last().copied().unwrap_or(0.0),
    })
}
