//! `cargo xtask bench agent`: the node agent's cost, next to what Prometheus would do with the
//! same node, written to `bench/results/agent.md` and `agent.json`.
//!
//! 1. **Bytes per sample**: the fixture node (8 GPUs of the NVML stand-in, 8 mlx5-like HCA
//!    ports whose counters move) read through railscope's real sources, encoded by railscope's
//!    `FrameEncoder` (default config, a flush every 10 s), as Prometheus text exposition (one
//!    scrape per sweep) and as remote-write v1 (protobuf + snappy).
//! 2. **CPU and memory**: `railscope agent` sending to `railscope listen` at a 1 s and a 100 ms
//!    interval, next to Debian's prometheus-node-exporter (only its infiniband collector)
//!    reading the same moving tree (`--path.sysfs`) and scraped over loopback at the same
//!    rate, as Prometheus scrapes (keep-alive, gzip). CPU is the scheduler's run time of every
//!    thread (`/proc/<pid>/task/*/schedstat`) over the measured window, peak RSS is `VmHWM`.
//! 3. **Adaptive sampling** on the workload-shaped traces of the `sampler-traces` crate.
//!
//! The measuring that needs the railscope library is `monitor-user/examples/agent_bench`
//! (xtask does not depend on monitor-user); this module builds it, runs it, runs the
//! processes, and writes the report.
//!
//! Modules: [`process`] (running a process and measuring its cost), [`live`] (one interval:
//! the fixture writer, the agent, the read floors, node_exporter), [`http`] (the scraper's
//! HTTP client), [`report`] (goals, markdown and JSON).

mod callgrind;
mod http;
mod live;
pub(super) mod process;
mod report;

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use super::{Options, host_cpu, utc_now};
use crate::{
    build, cargo,
    setup::{self, Tools},
};

use crate::scratch::{free_tcp_port, free_udp_port, write_key};
use live::*;
use process::*;
use report::*;

const NODE_EXPORTER_PACKAGE: &str = "prometheus-node-exporter";
const NODE_EXPORTER: &str = "/usr/bin/prometheus-node-exporter";
/// The two minimum intervals measured, in seconds.
const INTERVALS: [f64; 2] = [1.0, 0.1];
/// Sweeps of the bytes-per-sample measurement per interval: 5 minutes of the node at 1 s,
/// 1 minute at 100 ms.
const WIRE_SWEEPS: [(f64, usize); 2] = [(1.0, 300), (0.1, 600)];
/// Time a process runs before its measured window starts (loading, first reads, BTF).
/// Warm-up before a process is measured: at least 5 s, and 30 minimum intervals, so the
/// agent's sampler has filled its windows (24 reads) and runs as it does for the weeks a node
/// is up; node_exporter gets the same.
fn warmup(interval: f64) -> Duration {
    Duration::from_secs_f64((30.0 * interval).max(5.0))
}
const NODE: &str = "bench-node";
/// Sweeps of `agent_bench gpu-sweep` (at least 110 ms apart, for GPM).
const GPU_SWEEPS: usize = 200;

const GOAL_BYTES_PER_SAMPLE: f64 = 2.0;
/// Frames at most this many times the bytes xz -9e leaves of the same frame stream.
const GOAL_VS_XZ_FLOOR: f64 = 1.2;
/// The agent's CPU at most this many times the read floor's.
const GOAL_VS_READ_FLOOR: f64 = 2.0;
/// NVML calls per GPU and sweep at most this many times the floor's.
const GOAL_VS_NVML_MIN: f64 = 1.2;
const GOAL_CPU_PCT_AT_1S: f64 = 0.5;
const GOAL_RSS_MB: f64 = 30.0;
const GOAL_REDUCTION: f64 = 0.70;
const GOAL_PEAK_ERROR: f64 = 0.10;
const GOAL_STEP_DELAY: f64 = 2.0;

pub(super) fn run(tools: &Tools, options: &Options) -> anyhow::Result<()> {
    let started = Instant::now();
    let duration = Duration::from_secs(options.duration.max(5));
    let date = utc_now();
    let load_before = loadavg();
    if options.setup.no_apt {
        if !Path::new(NODE_EXPORTER).is_file() {
            bail!("{NODE_EXPORTER} is missing (install {NODE_EXPORTER_PACKAGE}, or drop --no-apt)");
        }
    } else {
        setup::ensure_debian_packages(&[NODE_EXPORTER_PACKAGE, "xz-utils"])?;
    }
    let railscope = build::railscope_binary(tools, true)?;
    let standin = build_standin(tools)?;
    let example = build_example(tools)?;
    let work = cargo::workspace_root().join("target/bench/agent");
    if work.exists() {
        fs::remove_dir_all(&work).with_context(|| format!("emptying {}", work.display()))?;
    }
    fs::create_dir_all(&work)?;
    let key = write_key(&work)?;
    let ctx = Ctx {
        railscope,
        example,
        standin,
        key,
        work: work.clone(),
        duration,
    };

    let mut wire = Vec::new();
    for (interval, sweeps) in WIRE_SWEEPS {
        setup::step(&format!(
            "bytes per sample: {sweeps} sweeps of the fixture node at {} (about {:.0} s)",
            label(interval),
            sweeps as f64 * 0.11
        ));
        let dir = work.join(format!("wire-{}", slug(interval)));
        let out = run_json(
            Command::new(&ctx.example)
                .args(["wire", "--dir"])
                .arg(&dir)
                .arg("--standin")
                .arg(&ctx.standin)
                .args(["--interval", &interval.to_string()])
                .args(["--sweeps", &sweeps.to_string(), "--node", NODE])
                .arg("--frames-out")
                .arg(dir.join("frames.bin")),
        )?;
        wire.push(with_stream_xz(out, &dir.join("frames.bin"))?);
    }

    setup::step("adaptive sampling on the workload-shaped traces");
    let traces = run_json(Command::new(&ctx.example).arg("traces"))?;

    let mut gpu = Vec::new();
    for floor in [false, true] {
        let what = if floor {
            "the GPU read floor"
        } else {
            "the GPU source"
        };
        setup::step(&format!(
            "{what} alone: {GPU_SWEEPS} sweeps of 8 stand-in GPUs, NVML calls counted"
        ));
        let dir = work.join(if floor { "gpu-floor" } else { "gpu-sweep" });
        let counts = work.join(format!("nvml-calls-{floor}.json"));
        let mut cmd = Command::new(&ctx.example);
        cmd.args(["gpu-sweep", "--dir"])
            .arg(&dir)
            .arg("--standin")
            .arg(&ctx.standin)
            .args(["--sweeps", &GPU_SWEEPS.to_string()])
            .env("RAILSCOPE_NVML_STANDIN_COUNTS", &counts);
        if floor {
            cmd.arg("--floor");
        }
        let mut out = run_json(&mut cmd)?;
        out["nvml_calls"] =
            serde_json::from_str(&fs::read_to_string(&counts).with_context(|| {
                format!("the stand-in wrote no call counts ({})", counts.display())
            })?)?;
        gpu.push(out);
    }
    let gpu_floor = gpu.pop().unwrap_or_default();
    let gpu_sweep = gpu.pop().unwrap_or_default();

    let callgrind = match callgrind::run(&ctx) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("    warning: the callgrind profile failed: {e:#}");
            json!({"error": format!("{e:#}")})
        }
    };

    let mut live = Vec::new();
    for interval in INTERVALS {
        live.push(live_config(&ctx, interval)?);
    }

    let facts = Facts {
        date,
        command: command_line(options),
        host_cpu: host_cpu(),
        cores: thread::available_parallelism().map_or(0, |n| n.get()),
        kernel: fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_owned())
            .unwrap_or_default(),
        load_before,
        load_after: loadavg(),
        node_exporter: node_exporter_version(),
        railscope_commit: git_commit(),
        duration_s: duration.as_secs_f64(),
        warmup_s: warmup(1.0).as_secs_f64(),
        total_s: started.elapsed().as_secs_f64(),
    };
    let report = Report {
        facts,
        wire,
        traces,
        live,
        gpu_sweep,
        gpu_floor,
        callgrind,
    };
    let md_path = cargo::workspace_root().join(super::results_path(super::Target::Agent));
    let json_path = md_path.with_extension("json");
    if let Some(dir) = md_path.parent() {
        fs::create_dir_all(dir)?;
    }
    let goals = report.goals();
    fs::write(&md_path, report.markdown(&goals))?;
    fs::write(&json_path, report.json(&goals)?)?;
    for g in &goals {
        eprintln!("    {:5} {} ({})", g.verdict(), g.what, g.measured);
    }
    setup::step(&format!(
        "wrote {} and {} in {:.0?}",
        md_path.display(),
        json_path.display(),
        started.elapsed()
    ));
    Ok(())
}

/// What every part of the run needs.
struct Ctx {
    railscope: PathBuf,
    example: PathBuf,
    standin: PathBuf,
    key: PathBuf,
    work: PathBuf,
    duration: Duration,
}

fn command_line(options: &Options) -> String {
    if options.duration == super::DEFAULT_DURATION {
        "cargo xtask bench agent".into()
    } else {
        format!("cargo xtask bench agent --duration {}", options.duration)
    }
}

fn label(interval: f64) -> String {
    if interval >= 1.0 {
        format!("{interval} s")
    } else {
        format!("{:.0} ms", interval * 1000.0)
    }
}

fn slug(interval: f64) -> String {
    label(interval).replace(' ', "")
}

/// The stand-in `libnvidia-ml.so` (a cdylib, which cargo reports as a file, not an
/// executable).
pub(crate) fn build_standin(tools: &Tools) -> anyhow::Result<PathBuf> {
    setup::step("building the NVML stand-in (libnvml_standin.so)");
    let mut cmd = cargo::command(tools);
    cmd.args([
        "build",
        "--release",
        "--package",
        "nvml-standin",
        "--lib",
        "--message-format=json-render-diagnostics",
    ])
    .stdout(Stdio::piped());
    let out = cmd.spawn()?.wait_with_output()?;
    if !out.status.success() {
        bail!("building nvml-standin failed ({})", out.status);
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "nvml_standin")
        .flat_map(|m| {
            m["filenames"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter_map(|f| f.as_str().map(PathBuf::from))
                .collect::<Vec<_>>()
        })
        .find(|p| p.extension().is_some_and(|e| e == "so"))
        .context("cargo did not report libnvml_standin.so")
}

pub(super) fn build_example(tools: &Tools) -> anyhow::Result<PathBuf> {
    setup::step("building the measuring example (monitor-user/examples/agent_bench)");
    cargo::build_example(tools, "monitor-user", "agent_bench")
}

/// Adds to a `wire` result what xz -9e makes of railscope's whole frame stream: what a
/// strong general-purpose compressor still finds to remove, across frames (which UDP frames,
/// each decoded on its own, cannot use).
fn with_stream_xz(mut wire: Value, frames: &Path) -> anyhow::Result<Value> {
    let out = Command::new("xz")
        .args(["-9e", "--stdout", "--keep"])
        .arg(frames)
        .output()
        .context("running xz (Debian package xz-utils)")?;
    if !out.status.success() {
        bail!(
            "xz on {} failed: {}",
            frames.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let bytes = out.stdout.len() as u64;
    let samples = wire["railscope"]["samples"].as_u64().unwrap_or(0);
    wire["railscope_stream_xz"] = json!({
        "bytes": bytes,
        "bytes_per_sample": bytes as f64 / samples.max(1) as f64,
    });
    Ok(wire)
}

/// Runs a command that prints one JSON document on stdout.
fn run_json(cmd: &mut Command) -> anyhow::Result<Value> {
    let rendered = cargo::render(cmd);
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("failed to start {rendered}"))?;
    if !out.status.success() {
        bail!("{rendered} failed ({})", out.status);
    }
    serde_json::from_slice(&out.stdout).with_context(|| format!("{rendered} did not print JSON"))
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn node_exporter_version() -> String {
    Command::new(NODE_EXPORTER)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned()
                + &String::from_utf8_lossy(&o.stderr);
            text.lines().next().map(str::to_owned)
        })
        .unwrap_or_else(|| "unknown".into())
}

fn git_commit() -> String {
    let root = cargo::workspace_root();
    let out = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(&root)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let commit = out(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty =
        out(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    if dirty {
        format!("{commit} (with uncommitted changes)")
    } else {
        commit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_of_intervals() {
        assert_eq!(label(1.0), "1 s");
        assert_eq!(label(0.1), "100 ms");
        assert_eq!(slug(0.1), "100ms");
    }
}
