//! Where the agent's CPU goes: `railscope agent` (IB + 8 stand-in GPUs, 1 s interval) under
//! callgrind on the moving fixture tree, instructions collected only over a fixed window after
//! a warm-up (`--instr-atstart=no`, then `callgrind_control -i on`), so start-up (BTF, the
//! probes' loading attempts, the series being built) is left out; `callgrind_annotate
//! --inclusive=yes` gives each function's inclusive share.

use std::{
    fs,
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use super::{Ctx, NODE, live::tree_dir, process::*, run_json};
use crate::setup;

/// Seconds before collection starts (the agent under valgrind starts slowly).
const WARMUP_S: u64 = 20;
/// Seconds collected: this many sweeps at 1 s.
const WINDOW_S: u64 = 30;
/// Functions kept in the report.
const TOP: usize = 25;

pub(super) fn run(ctx: &Ctx) -> anyhow::Result<Value> {
    if Command::new("valgrind").arg("--version").output().is_err() {
        bail!("valgrind is not installed (Debian package valgrind)");
    }
    let dir = ctx.work.join("callgrind");
    fs::create_dir_all(&dir)?;
    let script = run_json(
        Command::new(&ctx.example)
            .args(["gpu-script", "--dir"])
            .arg(dir.join("nvml"))
            .arg("--standin")
            .arg(&ctx.standin)
            .args(["--steps", &(WARMUP_S + WINDOW_S + 120).to_string()])
            .args(["--interval", "1"]),
    )?;
    let lib = script["lib"]
        .as_str()
        .context("gpu-script printed no lib")?;
    let tree = tree_dir(&dir, 1.0);
    let (mut writer, _) = Proc::spawn_ready(
        "callgrind-fixture",
        Command::new(&ctx.example)
            .args(["fixture", "--dir"])
            .arg(&tree)
            .stdin(Stdio::piped()),
        &dir,
    )?;
    // A socket that takes the frames, so sends do not fail.
    let sink = std::net::UdpSocket::bind("127.0.0.1:0")?;
    let port = sink.local_addr()?.port();
    let out = dir.join("callgrind.out");
    setup::step(&format!(
        "callgrind: the agent (IB + 8 GPUs, 1 s) on the fixture node, {WARMUP_S} s warm-up, \
         {WINDOW_S} s collected"
    ));
    let mut cmd = Command::new("valgrind");
    cmd.args(["--tool=callgrind", "--instr-atstart=no"])
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(&ctx.railscope)
        .args([
            "agent",
            "--collector",
            &format!("127.0.0.1:{port}"),
            "--key",
        ])
        .arg(&ctx.key)
        .arg("--spool-dir")
        .arg(dir.join("spool"))
        .args(["--node", NODE, "--sysfs"])
        .arg(&tree)
        .args(["--interval", "1", "--nvml-lib", lib])
        .env("NO_COLOR", "1");
    let mut agent = Proc::spawn("callgrind-agent", &mut cmd, &dir, None)?;
    thread::sleep(Duration::from_secs(WARMUP_S));
    let on = Command::new("callgrind_control")
        .args(["-i", "on", &agent.pid().to_string()])
        .output()?;
    if !on.status.success() {
        bail!(
            "callgrind_control -i on failed: {}",
            String::from_utf8_lossy(&on.stderr).trim()
        );
    }
    thread::sleep(Duration::from_secs(WINDOW_S));
    let _ = Command::new("callgrind_control")
        .args(["-i", "off", &agent.pid().to_string()])
        .output();
    agent.stop(libc::SIGINT, Duration::from_secs(60))?;
    drop(writer.child.stdin.take());
    writer.stop(libc::SIGTERM, Duration::from_secs(5))?;
    let _ = fs::remove_dir_all(&tree);
    drop(sink);
    let annotate = Command::new("callgrind_annotate")
        .args(["--inclusive=yes", "--threshold=100"])
        .arg(&out)
        .output()
        .context("callgrind_annotate")?;
    let text = String::from_utf8_lossy(&annotate.stdout);
    if total_ir(&text).unwrap_or(0) == 0 {
        bail!("callgrind collected nothing (see {})", out.display());
    }
    Ok(json!({
        "warmup_s": WARMUP_S,
        "window_s": WINDOW_S,
        "total_ir": total_ir(&text),
        "top": top_inclusive(&text, TOP),
    }))
}

fn ir(field: &str) -> Option<u64> {
    field.replace(',', "").parse().ok()
}

/// `N (100.0%)  PROGRAM TOTALS`.
fn total_ir(text: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.contains("PROGRAM TOTALS"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(ir)
}

/// The first `n` function lines: `Ir (share) file:function [object]`, inclusive.
fn top_inclusive(text: &str, n: usize) -> Vec<Value> {
    text.lines()
        .filter(|l| l.contains("%)") && !l.contains("PROGRAM TOTALS"))
        .filter_map(|l| {
            let l = l.trim();
            let (count, rest) = l.split_once(' ')?;
            let (share, function) = rest.trim().split_once(')')?;
            Some(json!({
                "ir": ir(count)?,
                "share_pct": share.trim().trim_start_matches('(').trim_end_matches('%').parse::<f64>().ok()?,
                "function": function.trim(),
            }))
        })
        .take(n)
        .collect()
}
