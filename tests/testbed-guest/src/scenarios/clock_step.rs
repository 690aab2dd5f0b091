//! clock-step: the guest's wall clock is stepped an hour ahead, then back, while the agent
//! sends to `railscope listen`; a link flap after each step must sit, in the frames, between
//! the port-state samples that saw the port ACTIVE before it and DOWN after it (events and
//! samples on one time base), and every event must be stamped no later than its frame and on
//! the stepped clock.

use std::{thread, time::Duration};

use anyhow::{Context as _, bail, ensure};
use serde_json::Value;

use crate::guest;

const PORT: &str = "17401";
const HOUR_NS: i64 = 3_600_000_000_000;
const S: u64 = 1_000_000_000;

pub(super) fn run() -> anyhow::Result<()> {
    super::ensure_rdma_modules()?;
    guest::ensure_rxe_pair()?;
    // Every reading sent (no adaptive sampling), so the port state has a point every 0.5 s.
    let (mut agent, listener) = guest::agent_and_listener(
        PORT,
        &["--no-adaptive", "--interval", "0.5", "--flush", "1"],
        true,
    )?;
    agent.wait_for_log("ib_dispatch_event attached", Duration::from_secs(20))?;
    thread::sleep(Duration::from_secs(2));

    let mut flaps = Vec::new();
    for step in [HOUR_NS, -HOUR_NS] {
        step_clock(step)?;
        // The agent measures the offset again at its next sweep (0.5 s).
        thread::sleep(Duration::from_secs(2));
        let at = guest::realtime_ns();
        guest::run("/usr/bin/ip", &["link", "set", "vethA", "down"])?;
        thread::sleep(Duration::from_secs(2));
        guest::run("/usr/bin/ip", &["link", "set", "vethA", "up"])?;
        thread::sleep(Duration::from_secs(2));
        flaps.push(at);
    }
    let (_, frames) = guest::stop_and_decode(&mut agent, listener)?;
    check(&frames, &flaps)
}

/// Steps CLOCK_REALTIME by `by_ns`.
fn step_clock(by_ns: i64) -> anyhow::Result<()> {
    let now = guest::realtime_ns() as i64 + by_ns;
    let ts = libc::timespec {
        tv_sec: now / 1_000_000_000,
        tv_nsec: now % 1_000_000_000,
    };
    // SAFETY: a valid timespec; we are root in the guest.
    let rc = unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) };
    ensure!(
        rc == 0,
        "clock_settime: {}",
        std::io::Error::last_os_error()
    );
    println!("wall clock stepped by {} s", by_ns / 1_000_000_000);
    Ok(())
}

/// `flaps`: the guest's wall-clock time just before each link-down.
fn check(frames: &[Value], flaps: &[u64]) -> anyhow::Result<()> {
    // rxe0's port state points: (time, value).
    let mut state: Vec<(u64, f64)> = Vec::new();
    for frame in frames {
        for s in frame["samples"].as_array().into_iter().flatten() {
            if s["name"] != "railscope_ib_port_state" || s["labels"]["device"] != "rxe0" {
                continue;
            }
            for p in s["points"].as_array().into_iter().flatten() {
                let t = p["unix_ns"].as_u64().or(p["end_unix_ns"].as_u64());
                let v = p["value"].as_f64().or(p["mean"].as_f64());
                if let (Some(t), Some(v)) = (t, v) {
                    state.push((t, v));
                }
            }
        }
    }
    state.sort_by_key(|(t, _)| *t);
    // Every event no later than the frame that carries it, and sent at once.
    let mut errs = Vec::new();
    for frame in frames {
        let send = frame["send_unix_ns"]
            .as_u64()
            .context("frame without send time")?;
        for e in frame["events"].as_array().into_iter().flatten() {
            let t = e["unix_ns"].as_u64().context("event without time")?;
            ensure!(
                t <= send && send - t < 5 * S,
                "event {e} stamped {t}, its frame {send}: not on the frame's time base"
            );
            if e["kind"] == "ib_port" && e["labels"]["device"] == "rxe0" && e["text"] == "PORT_ERR"
            {
                errs.push(t);
            }
        }
    }
    println!(
        "{} port-state points, PORT_ERR at {errs:?}, flaps at {flaps:?}",
        state.len()
    );
    for (i, &at) in flaps.iter().enumerate() {
        // The PORT_ERR of this flap, on the stepped clock: within seconds of the guest's time.
        let Some(&err) = errs.iter().find(|&&t| t.abs_diff(at) < 3 * S) else {
            bail!("no PORT_ERR within 3 s of flap {i} at {at} (events at {errs:?})");
        };
        let before = state.iter().rev().find(|(t, _)| *t < err);
        let after = state.iter().find(|(t, _)| *t >= err);
        let (Some(&(tb, vb)), Some(&(ta, va))) = (before, after) else {
            bail!("flap {i}: no port-state samples around the PORT_ERR at {err}");
        };
        println!("flap {i}: ACTIVE? {vb} at {tb}, PORT_ERR at {err}, DOWN? {va} at {ta}");
        ensure!(
            vb == 4.0 && err - tb < 2 * S,
            "flap {i}: the last port-state sample before the PORT_ERR ({vb} at {tb}) is not the \
             ACTIVE one just before it ({err})"
        );
        ensure!(
            va != 4.0 && ta - err < 2 * S,
            "flap {i}: the first port-state sample after the PORT_ERR ({va} at {ta}) is not the \
             DOWN one just after it ({err})"
        );
    }
    Ok(())
}
