//! capture-down-at-start: `railscope capture` started on ports that are already down. Before
//! the capture, the test takes vethA down (rxe0, and its peer rxe1 through the veth carrier)
//! and vethC down (rxe2, and rxe3), and waits until sysfs shows all four ports not ACTIVE.
//! Then it starts the capture, brings vethA up about 3.4 s after the capture says it records
//! (one `SIOCSIFFLAGS`, bracketed by the wall clock), leaves vethC down and stops the capture
//! with SIGINT about 2 s later. `railscope report` must date rxe0's down period from the
//! start of the range (the capture's start in its header, before the probes attached; the
//! port was down then) to its PORT_ACTIVE: rxe0 degraded, 0 down and 1 up transitions, one
//! period `from_start`, its time down within one snapshot interval of the script's bracket;
//! rxe2 down, one period open from the start, its time down the whole range within one
//! interval. The links are up again at the end, whatever happened, for the scenarios that
//! follow.
//!
//! `--pre 2s` is shorter than the 3.4 s down: when PORT_ACTIVE triggers, the ring holds only
//! the last 2 s at the full interval, and before that the capture kept one snapshot a second
//! (the first one when it began recording, after the probes attached). The range, though,
//! starts at the header's time, taken before the probes attach: a report that dated the
//! period from any snapshot would miss that time and fail the bracket. `--post 3s` covers
//! the rest of the capture.

use std::{thread, time::Duration};

use anyhow::{Context as _, ensure};
use serde_json::Value;

use super::capture_flap::{Capture, create_second_pair, port, report, set_link};
use crate::guest::{self, realtime_ns};

/// Down before the capture, up during it: rxe0 on it, and rxe1 on its peer vethB.
const COMES_UP: &str = "vethA";
/// Down before the capture and throughout: rxe2 on it, and rxe3 on its peer vethD.
const STAYS_DOWN: &str = "vethC";
const PORTS: [&str; 4] = ["rxe0", "rxe1", "rxe2", "rxe3"];
/// From the capture's "recording" line to vethA up, then to the SIGINT.
const UP_AFTER_MS: u64 = 3400;
const STOP_AFTER_MS: u64 = 2000;
/// The capture's snapshot interval.
const INTERVAL_MS: u64 = 10;
const CAPTURE: &str = "/tmp/capture-down-at-start.rscap";

pub(super) fn run() -> anyhow::Result<()> {
    super::ensure_rdma_modules()?;
    guest::ensure_rxe_pair()?;
    create_second_pair()?;
    let result = down_at_start();
    // The scenarios that follow expect both pairs up.
    let restored = restore();
    result?;
    restored
}

fn down_at_start() -> anyhow::Result<()> {
    set_link(COMES_UP, false)?;
    set_link(STAYS_DOWN, false)?;
    guest::wait_for(
        Duration::from_secs(10),
        "rxe0..rxe3 port 1 not ACTIVE",
        || {
            PORTS.iter().all(|d| {
                let state = guest::port_state(d);
                !state.is_empty() && !state.contains("ACTIVE")
            })
        },
    )?;
    for device in PORTS {
        println!(
            "{device} port 1 before the capture: {}",
            guest::port_state(device)
        );
    }

    let interval = format!("{INTERVAL_MS}ms");
    let capture_args = [
        "--interval",
        interval.as_str(),
        "--pre",
        "2s",
        "--post",
        "3s",
    ];
    let spawned = realtime_ns();
    let mut capture = Capture::start(CAPTURE, &capture_args, "capture! ")?;
    capture.wait_recording()?;
    let recording = realtime_ns();

    thread::sleep(Duration::from_millis(UP_AFTER_MS));
    let before_up = realtime_ns();
    set_link(COMES_UP, true)?;
    let after_up = realtime_ns();
    println!(
        "{COMES_UP} up {:.1} ms after the capture was started ({:.1} ms bracket); \
         {STAYS_DOWN} stays down",
        (before_up - spawned) as f64 / 1e6,
        (after_up - before_up) as f64 / 1e6
    );
    thread::sleep(Duration::from_millis(STOP_AFTER_MS));
    let before_stop = realtime_ns();
    capture.interrupt()?;
    let stopped = realtime_ns();

    let report = report(CAPTURE)?;
    ensure!(
        report["sources"][0]["ended"] == "interrupted",
        "the capture did not end cleanly on SIGINT: {}",
        report["sources"][0]
    );
    let slack = INTERVAL_MS * 1_000_000;
    let rxe0 = port(&report, "rxe0")?;
    let start = u64_of(rxe0, "first_unix_ns")?;
    let end = u64_of(rxe0, "last_unix_ns")?;
    println!(
        "range: {:.1} ms, from {:.1} ms after the capture was spawned ({:.1} ms before it \
         said it records) to {:.1} ms after the SIGINT",
        (end - start) as f64 / 1e6,
        start.wrapping_sub(spawned) as i64 as f64 / 1e6,
        recording.wrapping_sub(start) as i64 as f64 / 1e6,
        end.wrapping_sub(before_stop) as i64 as f64 / 1e6
    );
    // The header's start is taken once the capture runs, before the probes attach; the end
    // is the trailer's, after the SIGINT.
    ensure!(
        start + slack >= spawned && start <= recording + slack,
        "the range starts at {start}, not between the capture's spawn ({spawned}) and its \
         recording line ({recording})"
    );
    ensure!(
        end + slack >= before_stop && end <= stopped + slack,
        "the range ends at {end}, not between the SIGINT ({before_stop}) and the capture's \
         exit ({stopped})"
    );

    // rxe0: down from the range's start to its PORT_ACTIVE.
    for device in ["rxe0", "rxe1"] {
        let p = port(&report, device)?;
        check_started_down(device, p, start)?;
        ensure!(
            p["verdict"] != "stable" && p["verdict"] != "down",
            "{device} came up during the capture, yet its verdict is {}: {p}",
            p["verdict"]
        );
        ensure!(
            p["transitions_from"] == "events",
            "{device}'s transitions are not from the probes' events: {p}"
        );
        ensure!(
            p["down_transitions"] == 0 && p["up_transitions"] == 1,
            "{device}: {} down and {} up transitions, expected 0 and 1 (down before the \
             capture, up once during it)",
            p["down_transitions"],
            p["up_transitions"]
        );
        ensure!(
            p["downs"][0]["up_unix_ns"].is_u64(),
            "{device}'s down period is not closed by its PORT_ACTIVE: {}",
            p["downs"][0]
        );
    }
    ensure!(
        rxe0["verdict"] == "degraded",
        "rxe0 was down at the start and came up: degraded, not {}",
        rxe0["verdict"]
    );
    let measured = u64_of(rxe0, "time_down_ns")?;
    let shortest = before_up - start;
    let longest = after_up - start;
    println!(
        "rxe0 {} down {:.1} ms in the report; the script: {:.1}..{:.1} ms from the range's \
         start",
        rxe0["verdict"],
        measured as f64 / 1e6,
        shortest as f64 / 1e6,
        longest as f64 / 1e6
    );
    ensure!(
        measured + slack >= shortest && measured <= longest + slack,
        "rxe0's time down {measured} ns is not within {slack} ns of the script's \
         {shortest}..{longest} ns from the range's start"
    );
    let rxe1 = port(&report, "rxe1")?;
    println!(
        "rxe1 (the peer, through the veth carrier) {} down {:.1} ms",
        rxe1["verdict"],
        u64_of(rxe1, "time_down_ns")? as f64 / 1e6
    );

    // rxe2: down for the whole range, one period open from its start.
    for device in ["rxe2", "rxe3"] {
        let p = port(&report, device)?;
        check_started_down(device, p, start)?;
        ensure!(
            p["verdict"] == "down",
            "{device} was down throughout, yet its verdict is {}: {p}",
            p["verdict"]
        );
        ensure!(
            p["down_transitions"] == 0 && p["up_transitions"] == 0,
            "{device}: {} down and {} up transitions, expected none (down throughout)",
            p["down_transitions"],
            p["up_transitions"]
        );
        ensure!(
            p["downs"][0]["up_unix_ns"].is_null(),
            "{device}'s down period is closed: {}",
            p["downs"][0]
        );
        ensure!(
            p["transitions_from"] == "snapshots",
            "{device} has port events, yet it stayed down: {p}"
        );
        let measured = u64_of(p, "time_down_ns")?;
        let whole = u64_of(p, "last_unix_ns")? - u64_of(p, "first_unix_ns")?;
        println!(
            "{device} {} down {:.1} ms in the report; the range: {:.1} ms",
            p["verdict"],
            measured as f64 / 1e6,
            whole as f64 / 1e6
        );
        ensure!(
            measured.abs_diff(whole) <= slack,
            "{device}'s time down {measured} ns is not the whole range {whole} ns within \
             {slack} ns"
        );
    }
    Ok(())
}

/// One down period, the first, marked `from_start` and starting at the range's start.
fn check_started_down(device: &str, p: &Value, start: u64) -> anyhow::Result<()> {
    let downs = p["downs"].as_array().context("downs")?;
    ensure!(
        downs.len() == 1,
        "{device} was down once (from before the capture), yet the report has {} down \
         periods: {p}",
        downs.len()
    );
    ensure!(
        downs[0]["from_start"] == true && downs[0]["down_unix_ns"] == start,
        "{device}'s down period does not start at the range's start ({start}): {}",
        downs[0]
    );
    Ok(())
}

fn u64_of(p: &Value, field: &str) -> anyhow::Result<u64> {
    p[field]
        .as_u64()
        .with_context(|| format!("{field} of {}", p["port"]))
}

/// Both links up again and all four ports ACTIVE.
fn restore() -> anyhow::Result<()> {
    set_link(COMES_UP, true)?;
    set_link(STAYS_DOWN, true)?;
    guest::wait_for(Duration::from_secs(10), "rxe0..rxe3 port 1 ACTIVE", || {
        PORTS
            .iter()
            .all(|d| guest::port_state(d).contains("ACTIVE"))
    })
}
