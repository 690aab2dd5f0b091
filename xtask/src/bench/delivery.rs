//! `cargo xtask bench delivery`: what acknowledged delivery costs (docs/agent.md,
//! "Delivery"; docs/wire-format.md, "Acknowledgements"), written to
//! `bench/results/delivery.md` and `delivery.json`.
//!
//! 1. **One node through an outage**: a release `railscope agent` on the fixture node (8 GPUs
//!    of the NVML stand-in, 8 mlx5-like HCA ports whose counters move, its defaults: a 1 s
//!    minimum interval, adaptive sampling, a flush every 10 s) sends to a release
//!    `railscope-collector run`. After `--live` seconds the collector is killed (SIGKILL),
//!    stays away `--outage` seconds (the agent's memory is sampled every 5 s), and is started
//!    again on the same archive; then the time until the collector holds every frame of the
//!    agent's session again (its receive state names no frame missing) and has archived it,
//!    and `--live` seconds more. The acknowledgements' bytes against the frames' bytes over
//!    the whole run (both collectors' own counters), and the agent's spool as the agent itself
//!    reported it (`railscope_agent_entries{table="spool_bytes"}`, sent through the outage and
//!    delivered afterwards with its own times).
//! 2. **A fleet's backlog**: `--nodes` simulated nodes (`monitor-user/examples/
//!    fleet_backlog.rs`: the agent's own encoder and series, every reading of every second,
//!    each node's `--outage` seconds of frames in the agent's own spool) return to a fresh
//!    collector and send their backlogs as the agent does, at the spool's adaptive pace:
//!    the time until every node's spool is empty, what was sent again and lost on the way
//!    (the collector's receive buffers), the collector's ingest rate, CPU and memory.

use std::{
    fs,
    io::{BufRead as _, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use super::{
    agent::process::{Proc, clock_ticks_per_second, cpu_ticks, status_kb},
    host_cpu, sorted_json, utc_now,
};
use crate::{
    build, cargo,
    http::{Metrics, encode, http_get, metric_sum, metrics_at, wait_http},
    scratch::{free_tcp_port, free_udp_port, write_key},
    setup::{self, Tools},
};

/// The node name of part 1.
const NODE: &str = "bench-node";
/// Acknowledgement bytes at most, as a share of frame bytes (issue 25).
const GOAL_ACK_SHARE: f64 = 0.02;

/// Options of `cargo xtask bench delivery`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct DeliveryOptions {
    /// `delivery`: seconds the collector is away (the node's outage; also the length of each
    /// simulated node's backlog).
    #[arg(long, default_value_t = 600)]
    pub outage: u64,
    /// `delivery`: seconds the node sends with the collector up before the outage, and again
    /// after its backlog is archived (at least 30: the agent flushes every 10 s, and the
    /// collector must hold some of its frames before it goes).
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(30..))]
    pub live: u64,
}

/// The binaries the bench runs.
struct Binaries {
    railscope: PathBuf,
    collector: PathBuf,
    fleet: PathBuf,
    agent_bench: PathBuf,
    standin: PathBuf,
}

pub(super) fn run(tools: &Tools, options: &super::Options) -> anyhow::Result<()> {
    let started = Instant::now();
    let o = &options.delivery;
    let (collector, _, _) = super::collector::build(tools)?;
    let bins = Binaries {
        railscope: build::railscope_binary(tools, true)?,
        collector,
        fleet: cargo::build_example(tools, "monitor-user", "fleet_backlog")?,
        agent_bench: super::agent::build_example(tools)?,
        standin: super::build_standin(tools)?,
    };
    let work = cargo::workspace_root().join("target/bench/delivery");
    if work.exists() {
        fs::remove_dir_all(&work).with_context(|| format!("emptying {}", work.display()))?;
    }
    fs::create_dir_all(&work)?;
    let node = one_node(&bins, o, &work.join("node"))?;
    let fleet = fleet_backlog(&bins, o, options.collector.nodes(), &work.join("fleet"))?;

    let ack_share = node["ack_share"].as_f64().unwrap_or(f64::NAN);
    let report = json!({
        "command": format!(
            "cargo xtask bench delivery --outage {} --live {} --nodes {}",
            o.outage, o.live, options.collector.nodes()
        ),
        "date": utc_now(),
        "host_cpu": host_cpu(),
        "cores": thread::available_parallelism().map_or(0, |n| n.get()),
        "total_s": started.elapsed().as_secs_f64(),
        "node": node,
        "fleet": fleet,
        "goals": {"ack_share": {"goal": GOAL_ACK_SHARE, "value": ack_share, "met": ack_share <= GOAL_ACK_SHARE}},
    });
    let md_path = cargo::workspace_root().join("bench/results/delivery.md");
    fs::write(&md_path, markdown(&report))?;
    fs::write(md_path.with_extension("json"), sorted_json(&report)?)?;
    setup::step(&format!(
        "wrote {} in {:.0?}",
        md_path.display(),
        started.elapsed()
    ));
    Ok(())
}

/// A `railscope-collector run` on `data`, its HTTP API at `http`.
fn collector(
    bins: &Binaries,
    dir: &Path,
    name: &str,
    key: &Path,
    udp: u16,
    http: SocketAddr,
) -> anyhow::Result<Proc> {
    let proc = Proc::spawn(
        name,
        Command::new(&bins.collector)
            .args(["run", "--listen", &format!("127.0.0.1:{udp}")])
            .args(["--http", &http.to_string(), "--key"])
            .arg(key)
            .arg("--data")
            .arg(dir.join("data")),
        dir,
        None,
    )?;
    wait_http(http, Duration::from_secs(30))?;
    Ok(proc)
}

/// The collector's own totals.
fn totals(http: SocketAddr) -> anyhow::Result<Metrics> {
    metrics_at(http, "/metrics/collector")
}

/// The receive state of `node` (`/api/v1/live/nodes`), if the collector has heard from it.
fn node_state(http: SocketAddr, node: &str) -> anyhow::Result<Option<Value>> {
    let (status, body) = http_get(http, "/api/v1/live/nodes")?;
    if status != 200 {
        bail!("GET /api/v1/live/nodes: status {status}: {body}");
    }
    let nodes: Vec<Value> = serde_json::from_str(&body).context("/api/v1/live/nodes")?;
    Ok(nodes.into_iter().find(|n| n["node"] == node))
}

/// Part 1: one node's agent through a collector outage.
fn one_node(bins: &Binaries, o: &DeliveryOptions, dir: &Path) -> anyhow::Result<Value> {
    fs::create_dir_all(dir)?;
    let key = write_key(dir)?;
    let steps = 2 * o.live + 2 * o.outage + 600;
    let script = run_json(
        Command::new(&bins.agent_bench)
            .args(["gpu-script", "--dir"])
            .arg(dir.join("nvml"))
            .arg("--standin")
            .arg(&bins.standin)
            .args(["--steps", &steps.to_string(), "--interval", "1"]),
    )?;
    let lib = PathBuf::from(
        script["lib"]
            .as_str()
            .context("gpu-script printed no lib")?,
    );
    let tree = dir.join("tree");
    let (mut writer, _) = Proc::spawn_ready(
        "fixture",
        Command::new(&bins.agent_bench)
            .args(["fixture", "--dir"])
            .arg(&tree)
            .stdin(Stdio::piped()),
        dir,
    )?;
    let udp = free_udp_port()?;
    let http: SocketAddr = ([127, 0, 0, 1], free_tcp_port()?).into();
    let mut first = collector(bins, dir, "collector", &key, udp, http)?;
    setup::step(&format!(
        "one node: the agent (8 stand-in GPUs, 8 ports) sending for {} s",
        o.live
    ));
    let mut agent = Proc::spawn(
        "agent",
        Command::new(&bins.railscope)
            .args(["agent", "--collector", &format!("127.0.0.1:{udp}"), "--key"])
            .arg(&key)
            .arg("--spool-dir")
            .arg(dir.join("agent-spool"))
            .args(["--node", NODE, "--sysfs"])
            .arg(&tree)
            .arg("--nvml-lib")
            .arg(&lib)
            .env("NO_COLOR", "1"),
        dir,
        None,
    )?;
    thread::sleep(Duration::from_secs(o.live));
    let rss_before_kb = status_kb(agent.pid(), "VmRSS").unwrap_or(0);
    let before_kill = totals(http)?;

    setup::step(&format!(
        "one node: the collector killed (SIGKILL), away for {} s",
        o.outage
    ));
    first.stop(libc::SIGKILL, Duration::from_secs(5))?;
    let away = Instant::now();
    let mut rss_max_kb = rss_before_kb;
    while away.elapsed() < Duration::from_secs(o.outage) {
        thread::sleep(Duration::from_secs(5).min(Duration::from_secs(o.outage)));
        if !agent.alive() {
            bail!(
                "the agent exited during the outage; see {}/agent.err",
                dir.display()
            );
        }
        rss_max_kb = rss_max_kb.max(status_kb(agent.pid(), "VmRSS").unwrap_or(0));
    }
    let rss_end_of_outage_kb = status_kb(agent.pid(), "VmRSS").unwrap_or(0);

    setup::step("one node: the collector started again on its archive; waiting for the backlog");
    let mut second = collector(bins, dir, "collector-again", &key, udp, http)?;
    let back = Instant::now();
    let (mut gap_seen, mut first_frame_s, mut largest_gap) = (false, None, 0u64);
    let backlog_s = loop {
        if back.elapsed() > Duration::from_secs(o.outage + 600) {
            bail!(
                "the node's backlog was not in the archive {:?} after the collector returned",
                back.elapsed()
            );
        }
        if let Some(state) = node_state(http, NODE)? {
            let lost = state["lost"].as_u64().unwrap_or(0);
            first_frame_s.get_or_insert(back.elapsed().as_secs_f64());
            largest_gap = largest_gap.max(lost);
            gap_seen |= lost > 0;
            let m = totals(http)?;
            let archived = metric_sum(&m, "railscope_collector_archive_frames_total");
            let accepted = metric_sum(&m, "railscope_collector_frames_accepted_total");
            if gap_seen && lost == 0 && archived >= accepted {
                break back.elapsed().as_secs_f64();
            }
        }
        thread::sleep(Duration::from_millis(200));
    };
    setup::step(&format!(
        "one node: backlog archived {backlog_s:.1} s after the collector returned; {} s more",
        o.live
    ));
    thread::sleep(Duration::from_secs(o.live));
    let end = totals(http)?;
    let end_state = node_state(http, NODE)?.unwrap_or_default();
    let spool = spool_bytes_reported(http)?;
    agent.stop(libc::SIGINT, Duration::from_secs(15))?;
    second.stop(libc::SIGTERM, Duration::from_secs(15))?;
    drop(writer.child.stdin.take());
    writer.stop(libc::SIGTERM, Duration::from_secs(5))?;
    let _ = fs::remove_dir_all(&tree);
    let agent_log = fs::read_to_string(dir.join("agent.err")).unwrap_or_default();
    let state = agent_log
        .lines()
        .find_map(|l| l.split_once("stopping; state: ").map(|(_, s)| s.to_owned()))
        .unwrap_or_default();

    let sum = |name: &str| metric_sum(&before_kill, name) + metric_sum(&end, name);
    let frame_bytes = sum("railscope_collector_accepted_bytes_total");
    let ack_bytes = sum("railscope_collector_ack_bytes_total");
    Ok(json!({
        "live_s": o.live,
        "outage_s": o.outage,
        "frames_accepted": sum("railscope_collector_frames_accepted_total"),
        "frame_bytes": frame_bytes,
        "acks_sent": sum("railscope_collector_acks_sent_total"),
        "ack_bytes": ack_bytes,
        "ack_share": ack_bytes / frame_bytes,
        "duplicates_acknowledged": sum("railscope_collector_duplicates_acknowledged_total"),
        "agent_rss_before_kb": rss_before_kb,
        "agent_rss_max_during_outage_kb": rss_max_kb,
        "agent_rss_end_of_outage_kb": rss_end_of_outage_kb,
        "spool_bytes_max_reported": spool,
        "first_frame_after_return_s": first_frame_s,
        "frames_missing_at_return": largest_gap,
        "backlog_archived_s": backlog_s,
        "frames_missing_at_end": end_state["lost"],
        "agent_state_at_stop": state,
    }))
}

/// The largest spool the agent reported over the last hour (`railscope_agent_entries{table=
/// "spool_bytes"}`, a gauge: points of `t`, `min`, `max`, `mean`, read back from the archive).
fn spool_bytes_reported(http: SocketAddr) -> anyhow::Result<Option<f64>> {
    let path = format!(
        "/api/v1/series?metric=railscope_agent_entries&match={}&start=-1h",
        encode("table=spool_bytes")
    );
    let (status, body) = http_get(http, &path)?;
    if status != 200 {
        bail!("GET {path}: status {status}: {body}");
    }
    let answer: Value = serde_json::from_str(&body).context("series answer")?;
    Ok(answer["series"].as_array().and_then(|series| {
        series
            .iter()
            .flat_map(|s| s["points"].as_array().into_iter().flatten())
            .filter_map(|p| p["max"].as_f64())
            .reduce(f64::max)
    }))
}

/// Part 2: a fleet's backlog absorbed by one collector: the simulated nodes' own spools
/// (`monitor-user/examples/fleet_backlog.rs`) send it at their adaptive pace.
fn fleet_backlog(
    bins: &Binaries,
    o: &DeliveryOptions,
    nodes: usize,
    dir: &Path,
) -> anyhow::Result<Value> {
    fs::create_dir_all(dir)?;
    let key = write_key(dir)?;
    let udp = free_udp_port()?;
    let http: SocketAddr = ([127, 0, 0, 1], free_tcp_port()?).into();
    let mut collector = collector(bins, dir, "collector", &key, udp, http)?;
    setup::step(&format!(
        "fleet: making {nodes} nodes' {} s of frames (the agent's encoder) into their spools",
        o.outage
    ));
    let mut fleet = Proc::spawn(
        "fleet",
        Command::new(&bins.fleet)
            .args(["--target", &format!("127.0.0.1:{udp}"), "--key"])
            .arg(&key)
            .args([
                "--nodes",
                &nodes.to_string(),
                "--seconds",
                &o.outage.to_string(),
            ])
            .args(["--timeout", &(o.outage * 3 + 600).to_string()]),
        dir,
        Some(Stdio::piped()),
    )?;
    let mut output = BufReader::new(fleet.child.stdout.take().context("fleet stdout")?);
    let ready = read_json(&mut output)?;
    let before = totals(http)?;
    let cpu_before = cpu_ticks(collector.pid())?.total();
    setup::step(&format!(
        "fleet: the collector is back for {nodes} nodes with {:.0} MB ({:.0} M samples) to send again",
        ready["backlog_bytes"].as_f64().unwrap_or(0.0) / 1e6,
        ready["backlog_samples"].as_f64().unwrap_or(0.0) / 1e6,
    ));
    let started = Instant::now();
    let done = read_json(&mut output)?;
    let wall_s = started.elapsed().as_secs_f64();
    // Archived: every frame accepted is in the archive's files.
    let deadline = Instant::now() + Duration::from_secs(60);
    let last = loop {
        let m = totals(http)?;
        let accepted = metric_sum(&m, "railscope_collector_frames_accepted_total");
        let archived = metric_sum(&m, "railscope_collector_archive_frames_total");
        if archived >= accepted || Instant::now() > deadline {
            break m;
        }
        thread::sleep(Duration::from_millis(100));
    };
    let cpu_s =
        (cpu_ticks(collector.pid())?.total() - cpu_before) as f64 / clock_ticks_per_second();
    let rss_kb = status_kb(collector.pid(), "VmHWM").unwrap_or(0);
    fleet.stop(libc::SIGTERM, Duration::from_secs(10))?;
    collector.stop(libc::SIGTERM, Duration::from_secs(15))?;
    let delta = |name: &str| metric_sum(&last, name) - metric_sum(&before, name);
    let accepted_samples = delta("railscope_collector_samples_accepted_total");
    let delivered_s = done["delivered_s"].as_f64();
    Ok(json!({
        "nodes": nodes,
        "backlog_s": o.outage,
        "backlog_bytes": ready["backlog_bytes"],
        "backlog_samples": ready["backlog_samples"],
        "delivered_s": delivered_s,
        "nodes_unfinished": done["nodes_unfinished"],
        "wall_s": wall_s,
        "datagrams_sent": done["datagrams_sent"],
        "bytes_sent": done["bytes_sent"],
        "frames_resent": done["frames_resent"],
        "resend_slowdowns": done["resend_slowdowns"],
        "mean_pace_at_end": done["mean_pace_at_end"],
        "frames_accepted": delta("railscope_collector_frames_accepted_total"),
        "duplicates": delta("railscope_collector_frames_dropped_total{reason=\"duplicate\"}"),
        "samples_accepted": accepted_samples,
        "receive_buffer_drops": delta("railscope_collector_frames_dropped_total{reason=\"receive_buffer_full\"}"),
        "ingest_samples_per_s": accepted_samples / delivered_s.unwrap_or(wall_s).max(1e-9),
        "collector_cpu_s": cpu_s,
        "samples_per_cpu_s": accepted_samples / cpu_s.max(1e-9),
        "collector_peak_rss_kb": rss_kb,
    }))
}

fn read_json(output: &mut BufReader<std::process::ChildStdout>) -> anyhow::Result<Value> {
    let mut line = String::new();
    if output.read_line(&mut line)? == 0 {
        bail!("the fleet simulation exited (see target/bench/delivery/fleet/fleet.err)");
    }
    serde_json::from_str(&line).with_context(|| format!("not JSON: {line:?}"))
}

fn run_json(cmd: &mut Command) -> anyhow::Result<Value> {
    let out = cmd.stderr(Stdio::inherit()).output()?;
    if !out.status.success() {
        bail!("{} failed: {}", cargo::render(cmd), out.status);
    }
    serde_json::from_slice(&out.stdout).context("not JSON")
}

fn markdown(r: &Value) -> String {
    let n = &r["node"];
    let f = &r["fleet"];
    let num = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    let kb = |v: &Value| num(v) / 1024.0;
    let goal = &r["goals"]["ack_share"];
    let mut s = String::new();
    s += "# Delivery bench\n\n";
    s += &format!("Command: `{}`  \n", r["command"].as_str().unwrap_or(""));
    s += &format!(
        "Date: {}; machine: {} ({} cores, shared with other work); {:.0} s in all.\n\n",
        r["date"].as_str().unwrap_or(""),
        r["host_cpu"].as_str().unwrap_or(""),
        r["cores"],
        num(&r["total_s"])
    );
    s += "What acknowledged delivery costs (docs/agent.md, \"Delivery\"): the acknowledgements' bytes, \
          the agent's memory while its collector is away, how long a backlog takes to come in, and \
          what a fleet's backlog costs one collector. xtask/src/bench/delivery.rs says how each is measured.\n\n";
    s += "## Goals\n\n| goal | value | |\n|---|---|---|\n";
    s += &format!(
        "| acknowledgement bytes <= {:.0} % of frame bytes | {:.2} % | {} |\n\n",
        100.0 * num(&goal["goal"]),
        100.0 * num(&goal["value"]),
        if goal["met"] == true {
            "met"
        } else {
            "**not met**"
        }
    );
    s += &format!(
        "## One node through a {} s outage\n\nA release `railscope agent` on the fixture node (8 stand-in GPUs, 8 ports whose counters move; defaults: 1 s minimum interval, adaptive, flush every 10 s) sends to a release collector; after {} s the collector is killed (SIGKILL), stays away {} s, and is started again on its archive.\n\n| | |\n|---|---|\n",
        n["outage_s"], n["live_s"], n["outage_s"]
    );
    let rows: Vec<(&str, String)> = vec![
        (
            "frames accepted (both collector runs)",
            format!("{}", num(&n["frames_accepted"])),
        ),
        ("frame bytes", format!("{}", num(&n["frame_bytes"]))),
        ("acknowledgements sent", format!("{}", num(&n["acks_sent"]))),
        (
            "acknowledgement bytes",
            format!(
                "{} ({:.2} % of frame bytes)",
                num(&n["ack_bytes"]),
                100.0 * num(&n["ack_share"])
            ),
        ),
        (
            "frames received again and acknowledged, not stored",
            format!("{}", num(&n["duplicates_acknowledged"])),
        ),
        (
            "agent RSS before the outage",
            format!("{:.1} MiB", kb(&n["agent_rss_before_kb"])),
        ),
        (
            "agent RSS, highest during the outage (every 5 s)",
            format!("{:.1} MiB", kb(&n["agent_rss_max_during_outage_kb"])),
        ),
        (
            "agent RSS at the end of the outage",
            format!("{:.1} MiB", kb(&n["agent_rss_end_of_outage_kb"])),
        ),
        (
            "spool, largest the agent reported",
            format!("{:.1} KiB", num(&n["spool_bytes_max_reported"]) / 1024.0),
        ),
        (
            "first frame after the collector returned",
            format!("{:.1} s", num(&n["first_frame_after_return_s"])),
        ),
        (
            "frames missing when it returned (largest gap seen)",
            format!("{}", num(&n["frames_missing_at_return"])),
        ),
        (
            "backlog archived after the collector returned",
            format!("{:.1} s", num(&n["backlog_archived_s"])),
        ),
        (
            "frames missing at the end",
            format!("{}", num(&n["frames_missing_at_end"])),
        ),
    ];
    for (k, v) in rows {
        s += &format!("| {k} | {v} |\n");
    }
    s += &format!(
        "\nThe agent's state when it stopped: `{}`\n\n",
        n["agent_state_at_stop"].as_str().unwrap_or("")
    );
    s += &format!(
        "## A fleet's backlog\n\n{} simulated nodes (the agent's encoder and series, every reading of every second: heavier than an adaptive agent), each with its {} s of frames in the agent's own spool, return to a fresh collector: each sends its newest frame, then what the acknowledgements name missing, at the spool's adaptive pace (4 KiB/s to start, halved when resent frames are lost again, up to 16 KiB/s).\n\n| | |\n|---|---|\n",
        f["nodes"], f["backlog_s"]
    );
    let rows: Vec<(&str, String)> = vec![
        (
            "backlog",
            format!(
                "{:.0} MB, {:.1} M samples",
                num(&f["backlog_bytes"]) / 1e6,
                num(&f["backlog_samples"]) / 1e6
            ),
        ),
        (
            "every spool empty after",
            format!(
                "{:.1} s ({} nodes unfinished)",
                num(&f["delivered_s"]),
                num(&f["nodes_unfinished"])
            ),
        ),
        (
            "datagrams / bytes sent",
            format!(
                "{} / {:.0} MB",
                num(&f["datagrams_sent"]),
                num(&f["bytes_sent"]) / 1e6
            ),
        ),
        ("frames sent again", format!("{}", num(&f["frames_resent"]))),
        (
            "datagrams lost at the collector (receive buffers full)",
            format!("{}", num(&f["receive_buffer_drops"])),
        ),
        (
            "copies refused as duplicates",
            format!("{}", num(&f["duplicates"])),
        ),
        (
            "times a node's pace halved",
            format!("{}", num(&f["resend_slowdowns"])),
        ),
        (
            "mean pace at the end",
            format!("{:.1} KiB/s a node", num(&f["mean_pace_at_end"]) / 1024.0),
        ),
        (
            "samples accepted",
            format!("{:.1} M", num(&f["samples_accepted"]) / 1e6),
        ),
        (
            "ingest rate over the backlog",
            format!("{:.2} M samples/s", num(&f["ingest_samples_per_s"]) / 1e6),
        ),
        (
            "collector CPU",
            format!(
                "{:.1} s ({:.2} M samples per CPU s)",
                num(&f["collector_cpu_s"]),
                num(&f["samples_per_cpu_s"]) / 1e6
            ),
        ),
        (
            "collector peak RSS",
            format!("{:.0} MiB", kb(&f["collector_peak_rss_kb"])),
        ),
    ];
    for (k, v) in rows {
        s += &format!("| {k} | {v} |\n");
    }
    s
}
