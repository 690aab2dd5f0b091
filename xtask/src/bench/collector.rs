//! `cargo xtask bench collector`: the collector under simulated agents on loopback, next to
//! VictoriaMetrics fed the same samples.
//!
//! A release build of `railscope-collector run` is started as its own process (a fresh data
//! directory, the bench's key). The load generator (`monitor-collector/examples/
//! collector_load.rs`) makes the frames of a fleet of simulated nodes with the agent's own
//! encoder (`monitor_testkit::NodeSender`: busy nodes of 8 GPUs and 8 IB ports sending the
//! agent's series, 236 a node, every reading of every second, flushed every 10 s), plus one
//! node over a whole hour, and sends them from its own UDP sockets when told.
//! The bench then
//!
//! 1. sends the hour node, then the fleet at rising rates (`--rates`, samples a second, each
//!    for `--step-seconds`) until the collector saturates (a step loses datagrams, or takes
//!    more than half as long again as it should to archive them). For each step: the
//!    collector's CPU time (utime + stime of `/proc/<pid>/stat`) from the step's start until
//!    every accepted frame is archived and one fsync interval has passed, samples accepted
//!    and archived (its `/metrics`), and the loss;
//! 2. RSS growth per node, bytes at rest per sample (the data directory's allocated blocks
//!    over the samples accepted), query latency through the HTTP API (one metric of one node
//!    over its hour, every metric of that node-hour, one metric across 1,000 nodes);
//! 3. a flood at ten times the saturation rate in datagrams of forged, replayed, truncated and
//!    random datagrams: the collector must stay up, within its memory bound, and count every
//!    datagram it was sent as a drop by reason;
//! 4. VictoriaMetrics (`/usr/bin/victoria-metrics`, a fresh `-storageDataPath`): the collector
//!    is started again on the same archive with `--remote-write` to it and sends it every
//!    archived sample; VictoriaMetrics' CPU over that ingest per sample, and its bytes at rest
//!    per sample after `/internal/force_flush`, `/internal/force_merge` and its active merges
//!    falling to zero (then 5 s more).
//!
//! Writes `bench/results/collector.md` and `collector.json`.

use std::{
    collections::BTreeMap,
    fs,
    io::{BufRead, BufReader, Write as _},
    net::SocketAddr,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    process::{ChildStdin, ChildStdout, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use crate::http::{Metrics, encode, http_get, metric_sum, metrics_at, wait_http};
use crate::scratch::{free_tcp_port, free_udp_port, write_key};

use super::{
    agent::process::{Proc, clock_ticks_per_second, cpu_ticks, status_kb},
    host_cpu, sorted_json, utc_now,
};
use crate::{
    cargo,
    setup::{self, Tools},
};

/// Options of `cargo xtask bench collector`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct CollectorOptions {
    /// `collector`, `node-keys`, `delivery` (default 2,000), `fleet` (default 12,500):
    /// simulated nodes (node identities) of the fleet.
    #[arg(long)]
    pub nodes: Option<usize>,
    /// `collector`: the rising rates, in samples a second, sent until the collector saturates.
    #[arg(long, value_delimiter = ',', default_values_t = [500_000u64, 1_000_000, 2_000_000, 4_000_000, 6_000_000, 8_000_000, 12_000_000])]
    pub rates: Vec<u64>,
    /// `collector`: seconds each rate is sent for.
    #[arg(long, default_value_t = 2.0)]
    pub step_seconds: f64,
    /// `collector`: receive sockets of the collector (default: one per core).
    #[arg(long)]
    pub sockets: Option<usize>,
    /// `collector`: nodes of the long-series comparison of bytes at rest (each an hour at 1 s:
    /// 3,600 samples per series), 0 to skip it.
    #[arg(long, default_value_t = 50)]
    pub long_nodes: u64,
    /// `collector`: only write bench/results/collector.md again from collector.json.
    #[arg(long)]
    pub rewrite_report: bool,
    /// `collector`: how the simulated nodes seal their frames: `shared` (one key, the
    /// collector's `--key`; bench/results/collector.md) or `node` (each node its own key,
    /// the collector's `--fleet-secret`; bench/results/collector-node-keys.md).
    #[arg(long, value_enum, default_value_t = Keys::Shared)]
    pub keys: Keys,
}

impl CollectorOptions {
    /// `--nodes`, or the default of `collector`, `node-keys` and `delivery`.
    pub(crate) fn nodes(&self) -> usize {
        self.nodes.unwrap_or(2000)
    }
}

/// How the bench's nodes seal their frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Keys {
    Shared,
    Node,
}

/// The goals of issue 11.
const GOAL_SAMPLES_PER_CORE_S: f64 = 2_000_000.0;
const GOAL_CPU_RATIO_VS_VM: f64 = 5.0;

/// The collector's archive syncs its open segment this often (ArchiveConfig::sync_interval).
const SYNC_INTERVAL: Duration = Duration::from_secs(1);

/// Samples a second of the warm-up, which sends every node's first frames.
const WARM_UP_RATE: u64 = 2_000_000;

/// A step is saturated when archiving what was sent ends more than this after the last send.
const MAX_LAG_S: f64 = 2.0;

/// The flood runs at this multiple of the saturation rate (in datagrams a second).
const FLOOD_FACTOR: f64 = 10.0;

/// Seconds the flood lasts.
const FLOOD_SECONDS: f64 = 3.0;

/// The flood's rate counts as reached when the generator sent at least this share of the
/// asked rate (what its 100 µs pacing can miss by); below, the flood goal is not met.
const FLOOD_RATE_REACHED: f64 = 0.99;

pub(super) const VICTORIA_METRICS: &str = "/usr/bin/victoria-metrics";

pub(super) fn run(tools: &Tools, options: &super::Options) -> anyhow::Result<()> {
    let o = &options.collector;
    let md_path = match o.keys {
        Keys::Shared => cargo::workspace_root().join(super::results_path(super::Target::Collector)),
        Keys::Node => cargo::workspace_root().join("bench/results/collector-node-keys.md"),
    };
    if o.rewrite_report {
        let report: Value =
            serde_json::from_str(&fs::read_to_string(md_path.with_extension("json"))?)?;
        fs::write(&md_path, markdown(&report))?;
        eprintln!("    wrote {}", md_path.display());
        return Ok(());
    }
    if o.rates.is_empty() || o.nodes() < 1000 {
        bail!("--rates must not be empty and --nodes at least 1000 (the 1,000-node query)");
    }
    let (collector_bin, load_bin, archive_size_bin) = build(tools)?;
    let dir = cargo::workspace_root().join("target/bench/collector");
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    fs::create_dir_all(&dir)?;
    let key = write_key(&dir)?;
    let data = dir.join("data");
    let sockets = o
        .sockets
        .unwrap_or_else(|| thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get));
    let udp = free_udp_port()?;
    let http_port = free_tcp_port()?;
    let http: SocketAddr = ([127, 0, 0, 1], http_port).into();
    let collector_on = |data: &Path, extra: &[String]| {
        let mut cmd = Command::new(&collector_bin);
        cmd.args(["run", "--listen", &format!("127.0.0.1:{udp}")])
            .args([
                "--http",
                &http.to_string(),
                "--sockets",
                &sockets.to_string(),
            ])
            // Per-node keys only; the long series' archive (made with the shared key) needs
            // the shared key too.
            .args(match (o.keys, o.long_nodes) {
                (Keys::Shared, _) => vec!["--key".into(), key.clone().into_os_string()],
                (Keys::Node, 0) => vec!["--fleet-secret".into(), key.clone().into_os_string()],
                (Keys::Node, _) => vec![
                    "--fleet-secret".into(),
                    key.clone().into_os_string(),
                    "--key".into(),
                    key.clone().into_os_string(),
                ],
            })
            .arg("--data")
            .arg(data)
            // The hour node's frames are up to 1 h 2 min old when sent.
            .args(["--max-frame-age", "7200"])
            .args(extra);
        cmd
    };
    let collector_args = |extra: &[String]| collector_on(&data, extra);

    // The fleet's frames: enough rounds of 10 s for every step at its rate (the load
    // generator counts them from its nodes' series).
    let wanted: f64 = o.rates.iter().map(|&r| r as f64 * o.step_seconds).sum();
    setup::step(&format!(
        "making the frames of {} nodes, {wanted:.0} samples and a round more (+ one node-hour) with the agent's encoder",
        o.nodes(),
    ));
    let mut collector = Proc::spawn("collector", &mut collector_args(&[]), &dir, None)?;
    wait_http(http, Duration::from_secs(20))?;
    let mut load_cmd = Command::new(&load_bin);
    load_cmd
        .args(["--target", &format!("127.0.0.1:{udp}")])
        .arg(match o.keys {
            Keys::Shared => "--key",
            Keys::Node => "--fleet-secret",
        })
        .arg(&key)
        .args([
            "--nodes",
            &o.nodes().to_string(),
            "--samples",
            &(wanted.ceil() as u64).to_string(),
        ]);
    let mut load = Proc::spawn(
        "load",
        load_cmd.stdin(Stdio::piped()),
        &dir,
        Some(Stdio::piped()),
    )?;
    let mut load_in = load.child.stdin.take().context("no stdin")?;
    let mut load_out = BufReader::new(load.child.stdout.take().context("no stdout")?);
    let ready = read_json(&mut load_out)?;
    if ready["ready"] != true {
        bail!("the load generator did not start: {ready}");
    }
    eprintln!(
        "    {} samples in {} datagrams made in {:.0} s",
        ready["fleet_samples"],
        ready["fleet_datagrams"],
        f64_of(&ready["generate_s"])
    );
    let pid = collector.pid();
    let rss_empty_kb = status_kb(pid, "VmRSS").unwrap_or(0);

    // The node-hour first, at a modest rate.
    setup::step("sending one node over an hour");
    let hour = command(&mut load_in, &mut load_out, "hour")?;
    settle(
        http,
        &metrics(http)?,
        u64_of(&hour["datagrams"]),
        Duration::from_secs(60),
    )?;

    // Every node's first frames (its schema: a session's start costs more than its steady
    // state) at a modest rate, so that the steps measure a fleet already connected.
    setup::step("connecting the fleet: every node's first 10 s");
    let warm_cpu = cpu_ticks(pid)?.total();
    let before = metrics(http)?;
    let warm = command(
        &mut load_in,
        &mut load_out,
        &format!("finish {WARM_UP_RATE}"),
    )?;
    let after = settle(
        http,
        &before,
        u64_of(&warm["datagrams"]),
        Duration::from_secs(120),
    )?;
    let warm_up = json!({
        "rate_samples_per_s": WARM_UP_RATE,
        "samples": u64_of(&warm["samples"]),
        "collector_cpu_s": (cpu_ticks(pid)?.total() - warm_cpu) as f64 / clock_ticks_per_second(),
        "nodes_held": metric_sum(&after, "railscope_collector_nodes"),
    });
    eprintln!("    {warm_up}");

    // Rising rates.
    let mut steps = Vec::new();
    let mut saturation: Option<Value> = None;
    for &rate in &o.rates {
        setup::step(&format!(
            "sending {rate} samples/s for {} s",
            o.step_seconds
        ));
        let before = metrics(http)?;
        let cpu_before = cpu_ticks(pid)?.total();
        let started = Instant::now();
        let sent = command(
            &mut load_in,
            &mut load_out,
            &format!("send {rate} {}", o.step_seconds),
        )?;
        let datagrams = u64_of(&sent["datagrams"]);
        // So that datagrams the kernel dropped are counted now, not with the next step's.
        let pings = u64_of(&command(&mut load_in, &mut load_out, "ping")?["datagrams"]);
        let after = settle(http, &before, datagrams + pings, Duration::from_secs(120))?;
        let archived_after = started.elapsed();
        thread::sleep(SYNC_INTERVAL);
        let cpu_s = (cpu_ticks(pid)?.total() - cpu_before) as f64 / clock_ticks_per_second();
        let delta = |name: &str| metric_sum(&after, name) - metric_sum(&before, name);
        let accepted = delta("railscope_collector_samples_accepted_total");
        let frames = delta("railscope_collector_frames_accepted_total");
        let archived = delta("railscope_collector_archive_frames_total");
        let lost = datagrams as f64 - frames;
        let send_s = f64_of(&sent["elapsed_s"]);
        let saturated = lost > 0.0 || archived_after.as_secs_f64() > send_s + MAX_LAG_S;
        let step = json!({
            "rate_samples_per_s": rate,
            "sent_samples": sent["samples"],
            "sent_datagrams": datagrams,
            "send_s": send_s,
            "accepted_samples": accepted,
            "accepted_frames": frames,
            "archived_frames": archived,
            "lost_datagrams": lost,
            "drops": drops(&after, &before),
            "until_archived_s": archived_after.as_secs_f64(),
            "collector_cpu_s": cpu_s,
            "samples_per_cpu_s": accepted / cpu_s.max(1e-9),
            "accepted_samples_per_s": accepted / send_s,
            "segments_sealed": delta("railscope_collector_archive_segments"),
            "saturated": saturated,
        });
        eprintln!(
            "    accepted {accepted:.0} samples, lost {lost:.0} datagrams, {cpu_s:.2} CPU s: {:.2} M samples per CPU s, archived after {:.2} s{}",
            accepted / cpu_s.max(1e-9) / 1e6,
            archived_after.as_secs_f64(),
            if saturated { " (saturated)" } else { "" }
        );
        steps.push(step.clone());
        if saturated {
            saturation = Some(step);
            break;
        }
    }
    let unsaturated: Vec<&Value> = steps.iter().filter(|s| s["saturated"] == false).collect();
    let best = unsaturated
        .iter()
        .map(|s| f64_of(&s["samples_per_cpu_s"]))
        .fold(0.0, f64::max);
    let top = unsaturated.last().copied();
    // Samples per CPU second over every unsaturated step together: what the archive's
    // occasional work (a segment sealed and compressed) costs is spread as it falls.
    let sustained = (!unsaturated.is_empty()).then(|| {
        let samples: f64 = unsaturated
            .iter()
            .map(|s| f64_of(&s["accepted_samples"]))
            .sum();
        let cpu: f64 = unsaturated
            .iter()
            .map(|s| f64_of(&s["collector_cpu_s"]))
            .sum();
        samples / cpu.max(1e-9)
    });
    let loss_below: f64 = unsaturated
        .iter()
        .map(|s| f64_of(&s["lost_datagrams"]))
        .sum();
    // The highest rate taken without loss or lag (what the flood is ten times of).
    let saturation_rate = top.map(|s| f64_of(&s["rate_samples_per_s"]));

    // Memory, bytes at rest, queries.
    let after_steps = metrics(http)?;
    let nodes_held = metric_sum(&after_steps, "railscope_collector_nodes");
    let rss_kb = status_kb(pid, "VmRSS").unwrap_or(0);
    let hwm_kb = status_kb(pid, "VmHWM").unwrap_or(0);
    let samples_total = metric_sum(&after_steps, "railscope_collector_samples_accepted_total");
    let data_bytes = allocated_bytes(&data)?;
    setup::step("timing queries through the HTTP API");
    let queries = time_queries(http, &ready)?;

    // The flood, at ten times the saturation rate in datagrams.
    let samples_per_datagram =
        f64_of(&ready["fleet_samples"]) / f64_of(&ready["fleet_datagrams"]).max(1.0);
    let flood_rate =
        FLOOD_FACTOR * saturation_rate.unwrap_or(o.rates[0] as f64) / samples_per_datagram;
    setup::step(&format!(
        "flooding with forged, replayed, truncated and random datagrams at {flood_rate:.0}/s for 3 s"
    ));
    // What the kernel dropped in the last step is counted with the next datagram: first that.
    command(&mut load_in, &mut load_out, "ping")?;
    thread::sleep(Duration::from_secs(1));
    let before = metrics(http)?;
    let flood_rss_before_kb = status_kb(pid, "VmRSS").unwrap_or(0);
    let flood_hwm_before_kb = status_kb(pid, "VmHWM").unwrap_or(0);
    let flood = command(
        &mut load_in,
        &mut load_out,
        &format!("flood {flood_rate:.0} {FLOOD_SECONDS}"),
    )?;
    let flood_sent = u64_of(&flood["datagrams"]);
    thread::sleep(Duration::from_secs(2));
    let alive = collector.alive();
    let after = metrics(http)?;
    let flood_drops = drops(&after, &before);
    let counted: f64 = flood_drops.values().sum();
    let accepted_in_flood = metric_sum(&after, "railscope_collector_frames_accepted_total")
        - metric_sum(&before, "railscope_collector_frames_accepted_total");
    let flood_hwm_kb = status_kb(pid, "VmHWM").unwrap_or(0);
    let flood_rss_after_kb = status_kb(pid, "VmRSS").unwrap_or(0);
    let achieved = flood_sent as f64 / f64_of(&flood["elapsed_s"]).max(FLOOD_SECONDS);
    let saturation_datagrams = flood_rate / FLOOD_FACTOR;
    let flood_json = json!({
        "rate_datagrams_per_s": flood_rate,
        "achieved_datagrams_per_s": achieved,
        "achieved_multiple": achieved / saturation_datagrams.max(1e-9),
        "rate_reached": achieved >= FLOOD_RATE_REACHED * flood_rate,
        "sent": flood,
        "drops": flood_drops,
        "counted": counted,
        "accepted": accepted_in_flood,
        "all_counted": counted == flood_sent as f64 && accepted_in_flood == 0.0,
        "collector_alive": alive,
        "rss_kb_before": flood_rss_before_kb,
        "rss_kb_after": flood_rss_after_kb,
        "rss_peak_kb_before": flood_hwm_before_kb,
        "rss_peak_kb_after": flood_hwm_kb,
    });
    eprintln!("    flood: {flood_json}");
    let _ = command(&mut load_in, &mut load_out, "quit");
    collector.stop(libc::SIGTERM, Duration::from_secs(30))?;

    // VictoriaMetrics fed the same samples by remote-write from the archive.
    setup::step("VictoriaMetrics: remote-writing every archived sample to it");
    let vm = victoria_metrics(
        &dir,
        "victoria-metrics",
        &collector_args,
        http,
        samples_total,
    )?;

    // Bytes at rest with long series: few nodes, an hour each.
    let long = if o.long_nodes > 0 {
        setup::step(&format!(
            "long series: {} nodes x 1 h at 1 s into an archive, then into VictoriaMetrics",
            o.long_nodes
        ));
        let long_data = dir.join("long-data");
        let made = Command::new(&archive_size_bin)
            .args(["--nodes", &o.long_nodes.to_string(), "--seconds", "3600"])
            .arg("--data")
            .arg(&long_data)
            .arg("--key")
            .arg(&key)
            .stderr(Stdio::inherit())
            .output()
            .context("running the archive_size example")?;
        if !made.status.success() {
            bail!("archive_size failed: {}", made.status);
        }
        let made: Value = serde_json::from_slice(&made.stdout).context("archive_size output")?;
        let long_samples = f64_of(&made["samples"]);
        let long_bytes = allocated_bytes(&long_data)?;
        let long_args = |extra: &[String]| collector_on(&long_data, extra);
        let vm_long = victoria_metrics(
            &dir,
            "victoria-metrics-long",
            &long_args,
            http,
            long_samples,
        )?;
        Some(json!({
            "nodes": o.long_nodes,
            "seconds": 3600,
            "samples": long_samples,
            "samples_per_series": long_samples / (o.long_nodes as f64 * f64_of(&ready["series_per_node"])).max(1.0),
            "data_dir_bytes": long_bytes,
            "bytes_at_rest_per_sample": long_bytes as f64 / long_samples.max(1.0),
            "victoria_metrics": vm_long,
        }))
    } else {
        None
    };

    let per_core = sustained;
    let our_cpu_per_sample = per_core.map(|p| 1e9 / p);
    let vm_cpu_per_sample = f64_of(&vm["cpu_ns_per_sample"]);
    let ours_at_rest = data_bytes as f64 / samples_total.max(1.0);
    let vm_at_rest = f64_of(&vm["bytes_at_rest_per_sample"]);
    let goals = json!({
        "samples_per_core_s": {
            "goal": GOAL_SAMPLES_PER_CORE_S,
            "value": per_core,
            "met": per_core.is_some_and(|p| p >= GOAL_SAMPLES_PER_CORE_S),
        },
        "cpu_vs_victoria_metrics": {
            "goal": GOAL_CPU_RATIO_VS_VM,
            "value": our_cpu_per_sample.map(|c| vm_cpu_per_sample / c),
            "met": our_cpu_per_sample.is_some_and(|c| vm_cpu_per_sample / c >= GOAL_CPU_RATIO_VS_VM),
        },
        "bytes_at_rest_vs_victoria_metrics": {
            "goal": "<= VictoriaMetrics",
            "value": ours_at_rest,
            "victoria_metrics": vm_at_rest,
            "met": ours_at_rest <= vm_at_rest,
        },
        "bytes_at_rest_vs_victoria_metrics_long_series": long.as_ref().map(|l| {
            let ours = f64_of(&l["bytes_at_rest_per_sample"]);
            let theirs = f64_of(&l["victoria_metrics"]["bytes_at_rest_per_sample"]);
            json!({ "goal": "<= VictoriaMetrics", "value": ours, "victoria_metrics": theirs, "met": ours <= theirs })
        }),
        "no_loss_below_saturation": { "value": loss_below, "met": loss_below == 0.0 },
        "flood_counted_and_survived": {
            "achieved_multiple": flood_json["achieved_multiple"],
            "rate_reached": flood_json["rate_reached"],
            "met": flood_json["all_counted"] == true && alive && flood_json["rate_reached"] == true,
        },
    });
    let report = json!({
        "command": command_line(options),
        "date": utc_now(),
        "machine": {
            "cpu": host_cpu(),
            "cores": thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
            "loadavg_at_end": fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
            "net.core.rmem_max": fs::read_to_string("/proc/sys/net/core/rmem_max").unwrap_or_default().trim(),
        },
        "collector": {
            "sockets": sockets,
            "nodes": o.nodes() + 1,
            "series_per_node": ready["series_per_node"],
            "fleet_data_s": u64_of(&ready["end_ns"]).saturating_sub(u64_of(&ready["t0_ns"])) / 1_000_000_000,
            "warm_up": warm_up,
            "steps": steps,
            "samples_per_cpu_s_unsaturated_steps": per_core,
            "samples_per_cpu_s_best": best,
            "saturation_samples_per_s": saturation_rate,
            "saturated": saturation.is_some(),
            "loss_below_saturation": loss_below,
            "nodes_held": nodes_held,
            "rss_empty_kb": rss_empty_kb,
            "rss_kb": rss_kb,
            "rss_peak_kb": hwm_kb,
            "rss_growth_per_node_kb": (rss_kb.saturating_sub(rss_empty_kb)) as f64 / nodes_held.max(1.0),
            "samples": samples_total,
            "data_dir_bytes": data_bytes,
            "bytes_at_rest_per_sample": ours_at_rest,
            "queries": queries,
            "flood": flood_json,
        },
        "victoria_metrics": vm,
        "long_series": long,
        "goals": goals,
    });
    fs::write(&md_path, markdown(&report))?;
    fs::write(md_path.with_extension("json"), sorted_json(&report)?)?;
    eprintln!("    wrote {}", md_path.display());
    Ok(())
}

pub(super) fn build(tools: &Tools) -> anyhow::Result<(PathBuf, PathBuf, PathBuf)> {
    setup::step("building railscope-collector and the load generators (release)");
    let mut cmd = cargo::command(tools);
    cmd.args(["build", "--release", "--package", "monitor-collector"])
        .args([
            "--bin",
            "railscope-collector",
            "--example",
            "collector_load",
            "--example",
            "archive_size",
        ]);
    let built = cargo::build_executables(cmd)?;
    let find = |name: &str| {
        built
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| p.clone())
            .with_context(|| format!("cargo did not report {name}"))
    };
    Ok((
        find("railscope-collector")?,
        find("collector_load")?,
        find("archive_size")?,
    ))
}

fn command_line(options: &super::Options) -> String {
    let o = &options.collector;
    let rates: Vec<String> = o.rates.iter().map(u64::to_string).collect();
    format!(
        "cargo xtask bench collector --nodes {} --rates {} --step-seconds {} --long-nodes {}{}",
        o.nodes(),
        rates.join(","),
        o.step_seconds,
        o.long_nodes,
        o.sockets
            .map(|s| format!(" --sockets {s}"))
            .unwrap_or_default()
    ) + if o.keys == Keys::Node {
        " --keys node"
    } else {
        ""
    }
}

/// Sends one command to the load generator and reads its JSON answer.
fn command(
    input: &mut ChildStdin,
    output: &mut BufReader<ChildStdout>,
    line: &str,
) -> anyhow::Result<Value> {
    writeln!(input, "{line}").context("the load generator stopped")?;
    input.flush()?;
    read_json(output).with_context(|| format!("load generator, {line:?}"))
}

fn read_json(output: &mut BufReader<ChildStdout>) -> anyhow::Result<Value> {
    let mut line = String::new();
    if output.read_line(&mut line)? == 0 {
        bail!("the load generator exited (see target/bench/collector/load.err)");
    }
    serde_json::from_str(&line).with_context(|| format!("not JSON: {line:?}"))
}

pub(super) fn f64_of(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

pub(super) fn u64_of(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// The collector's own totals (`/metrics/collector`: rendering the fleet's latest values and
/// per-node health on every poll would cost the collector more than the polls measure).
pub(super) fn metrics(addr: SocketAddr) -> anyhow::Result<Metrics> {
    metrics_at(addr, "/metrics/collector")
}

/// Drops by reason between two scrapes (reasons that moved only).
pub(super) fn drops(after: &Metrics, before: &Metrics) -> BTreeMap<String, f64> {
    const NAME: &str = "railscope_collector_frames_dropped_total{reason=\"";
    after
        .iter()
        .filter_map(|(k, v)| {
            let reason = k.strip_prefix(NAME)?.strip_suffix("\"}")?;
            let d = v - before.get(k).copied().unwrap_or(0.0);
            (d != 0.0).then(|| (reason.to_owned(), d))
        })
        .collect()
}

/// Waits until the collector has seen `datagrams` more datagrams than in `before` (received
/// or dropped by the kernel) and archived every frame it accepted, or nothing moved for 3 s
/// (datagrams lost before the socket), or `timeout`. Returns the last scrape.
pub(super) fn settle(
    addr: SocketAddr,
    before: &Metrics,
    datagrams: u64,
    timeout: Duration,
) -> anyhow::Result<Metrics> {
    let deadline = Instant::now() + timeout;
    let mut last = metrics(addr)?;
    let mut last_change = Instant::now();
    loop {
        let seen = metric_sum(&last, "railscope_collector_datagrams_received_total")
            + metric_sum(
                &last,
                "railscope_collector_frames_dropped_total{reason=\"receive_buffer_full\"}",
            )
            - metric_sum(before, "railscope_collector_datagrams_received_total")
            - metric_sum(
                before,
                "railscope_collector_frames_dropped_total{reason=\"receive_buffer_full\"}",
            );
        let accepted = metric_sum(&last, "railscope_collector_frames_accepted_total");
        let archived = metric_sum(&last, "railscope_collector_archive_frames_total")
            + metric_sum(&last, "railscope_collector_archive_dropped_frames_total");
        if seen >= datagrams as f64 && archived >= accepted {
            return Ok(last);
        }
        if Instant::now() > deadline || last_change.elapsed() > Duration::from_secs(3) {
            return Ok(last);
        }
        thread::sleep(Duration::from_millis(50));
        let next = metrics(addr)?;
        if next != last {
            last_change = Instant::now();
        }
        last = next;
    }
}

/// Bytes allocated on disk under `dir` (as `du` counts them).
fn allocated_bytes(dir: &Path) -> anyhow::Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            allocated_bytes(&entry.path())?
        } else {
            meta.blocks() * 512
        };
    }
    Ok(total)
}

/// Median of three runs of a query: its latency and the points it returned.
fn time_query(addr: SocketAddr, path: &str) -> anyhow::Result<(f64, u64)> {
    let mut times = Vec::new();
    let mut points = 0;
    for _ in 0..3 {
        let started = Instant::now();
        let (status, body) = http_get(addr, path)?;
        times.push(started.elapsed().as_secs_f64());
        if status != 200 {
            bail!("GET {path}: status {status}: {body}");
        }
        let answer: Value = serde_json::from_str(&body).context("query answer")?;
        points = answer["series"].as_array().map_or(0, |s| {
            s.iter()
                .map(|s| s["points"].as_array().map_or(0, Vec::len) as u64)
                .sum()
        });
    }
    times.sort_by(f64::total_cmp);
    Ok((times[1], points))
}

fn time_queries(addr: SocketAddr, ready: &Value) -> anyhow::Result<Value> {
    let t0 = u64_of(&ready["t0_ns"]);
    let end = u64_of(&ready["end_ns"]);
    let secs = |ns: u64| format!("{}.{:09}", ns / 1_000_000_000, ns % 1_000_000_000);
    let hour = format!("&start={}&end={}", secs(t0 - 3_600_000_000_000), secs(t0));
    let hour_node = ready["hour_node"].as_str().unwrap_or("hour-node");
    let one_metric = "railscope_ib_port_xmit_bytes_total";
    let series = |metric: &str, matcher: &str, range: &str| {
        format!(
            "/api/v1/series?metric={metric}&match={}{range}",
            encode(matcher)
        )
    };
    let (one_s, one_points) = time_query(
        addr,
        &series(one_metric, &format!("node={hour_node}"), &hour),
    )?;
    let mut all_s = 0.0;
    let mut all_points = 0;
    for metric in ready["metrics"].as_array().into_iter().flatten() {
        let (s, p) = time_query(
            addr,
            &series(
                metric.as_str().unwrap_or_default(),
                &format!("node={hour_node}"),
                &hour,
            ),
        )?;
        all_s += s;
        all_points += p;
    }
    // The fleet's first 70 s (of 8,000 GPUs: under the default limit of a million points).
    let fleet_end = end.min(t0 + 70_000_000_000);
    let fleet = format!("&start={}&end={}", secs(t0), secs(fleet_end));
    let (k_s, k_points) = time_query(
        addr,
        &series(
            "railscope_gpu_utilization_ratio",
            "node=~gpu-node-0[0-9]{3}",
            &fleet,
        ),
    )?;
    if one_points == 0 || k_points == 0 {
        bail!("a timed query answered no points: a metric the simulated nodes do not send?");
    }
    eprintln!(
        "    node-hour, one metric: {:.1} ms ({one_points} points); every metric: {:.0} ms ({all_points} points); one metric x 1,000 nodes: {:.0} ms ({k_points} points)",
        one_s * 1e3,
        all_s * 1e3,
        k_s * 1e3
    );
    Ok(json!({
        "node_hour_one_metric": { "metric": one_metric, "seconds": one_s, "points": one_points },
        "node_hour_every_metric": { "metrics": ready["metrics"].as_array().map_or(0, Vec::len), "seconds": all_s, "points": all_points },
        "one_metric_1000_nodes": { "metric": "railscope_gpu_utilization_ratio", "seconds": k_s, "points": k_points, "range_s": (fleet_end - t0) / 1_000_000_000 },
    }))
}

/// VictoriaMetrics on a fresh storage directory `<dir>/<name>`, answering on a free loopback
/// port (`extra`: more of its flags): the process, its address and its version.
pub(super) fn start_victoria_metrics(
    dir: &Path,
    name: &str,
    extra: &[&str],
) -> anyhow::Result<(Proc, SocketAddr, String)> {
    let storage = dir.join(name);
    let port = free_tcp_port()?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut vm_cmd = Command::new(VICTORIA_METRICS);
    vm_cmd
        .arg(format!("-storageDataPath={}", storage.display()))
        .arg(format!("-httpListenAddr={addr}"))
        .arg("-retentionPeriod=100y")
        .args(extra);
    let mut vm = Proc::spawn(name, &mut vm_cmd, dir, None)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !matches!(http_get(addr, "/health"), Ok((200, _))) {
        if Instant::now() > deadline || !vm.alive() {
            bail!(
                "VictoriaMetrics did not start (see {})",
                dir.join(format!("{name}.err")).display()
            );
        }
        thread::sleep(Duration::from_millis(100));
    }
    let version = Command::new("dpkg-query")
        .args(["-W", "-f=${Version}", "victoria-metrics"])
        .output()
        .map(|o| {
            format!(
                "VictoriaMetrics {} (Debian package)",
                String::from_utf8_lossy(&o.stdout).trim()
            )
        })
        .unwrap_or_default();
    Ok((vm, addr, version))
}

/// VictoriaMetrics on a fresh storage directory, fed the archive by a collector started again
/// with `--remote-write` to it: its CPU per sample and bytes at rest per sample.
fn victoria_metrics(
    dir: &Path,
    name: &str,
    collector_args: &dyn Fn(&[String]) -> Command,
    http: SocketAddr,
    samples: f64,
) -> anyhow::Result<Value> {
    let storage = dir.join(name);
    let (mut vm, addr, version) = start_victoria_metrics(dir, name, &[])?;
    let vm_cpu_before = cpu_ticks(vm.pid())?.total();
    let started = Instant::now();
    let url = format!("vm=http://{addr}/api/v1/write");
    let mut collector = Proc::spawn(
        "collector-remote-write",
        &mut collector_args(&["--remote-write".into(), url]),
        dir,
        None,
    )?;
    wait_http(http, Duration::from_secs(30))?;
    let collector_cpu_before = cpu_ticks(collector.pid())?.total();
    let deadline = Instant::now() + Duration::from_secs(1800);
    let mut sent;
    loop {
        let m = metrics(http)?;
        sent = metric_sum(&m, "railscope_collector_remote_write_samples_sent_total");
        let vm_rows = metric_sum(&metrics_at(addr, "/metrics")?, "vm_rows_inserted_total");
        if sent >= samples && vm_rows >= samples {
            break;
        }
        if Instant::now() > deadline {
            eprintln!("    warning: remote-write sent {sent} of {samples} samples in 30 min");
            break;
        }
        thread::sleep(Duration::from_millis(200));
    }
    let ingest_s = started.elapsed().as_secs_f64();
    let vm_cpu_s = (cpu_ticks(vm.pid())?.total() - vm_cpu_before) as f64 / clock_ticks_per_second();
    let rw_cpu_s = (cpu_ticks(collector.pid())?.total() - collector_cpu_before) as f64
        / clock_ticks_per_second();
    collector.stop(libc::SIGTERM, Duration::from_secs(30))?;
    let vm_metrics = metrics_at(addr, "/metrics")?;
    let rows = metric_sum(&vm_metrics, "vm_rows_inserted_total");

    // At rest: flushed, merged, settled.
    http_get(addr, "/internal/force_flush")?;
    let month = utc_now()[..7].replace('-', "_");
    let _ = http_get(
        addr,
        &format!("/internal/force_merge?partition_prefix={month}"),
    );
    let deadline = Instant::now() + Duration::from_secs(300);
    while Instant::now() < deadline {
        thread::sleep(Duration::from_secs(1));
        if metric_sum(&metrics_at(addr, "/metrics")?, "vm_active_merges") == 0.0 {
            break;
        }
    }
    thread::sleep(Duration::from_secs(5));
    let total = allocated_bytes(&storage)?;
    let data_part = allocated_bytes(&storage.join("data")).unwrap_or(0);
    let index_part = allocated_bytes(&storage.join("indexdb")).unwrap_or(0);
    vm.stop(libc::SIGTERM, Duration::from_secs(30))?;
    let out = json!({
        "version": version,
        "samples_sent": sent,
        "rows_inserted": rows,
        "ingest_s": ingest_s,
        "cpu_s": vm_cpu_s,
        "cpu_ns_per_sample": vm_cpu_s * 1e9 / rows.max(1.0),
        "collector_remote_write_cpu_s": rw_cpu_s,
        "collector_remote_write_cpu_ns_per_sample": rw_cpu_s * 1e9 / sent.max(1.0),
        "storage_bytes": total,
        "data_bytes": data_part,
        "indexdb_bytes": index_part,
        "bytes_at_rest_per_sample": total as f64 / rows.max(1.0),
        "data_bytes_per_sample": data_part as f64 / rows.max(1.0),
    });
    eprintln!("    VictoriaMetrics: {out}");
    Ok(out)
}

pub(super) fn fmt(v: &Value, digits: usize) -> String {
    match v.as_f64() {
        Some(x) => format!("{x:.digits$}"),
        None => "-".into(),
    }
}

fn markdown(r: &Value) -> String {
    let load: String = r["machine"]["loadavg_at_end"]
        .as_str()
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    let c = &r["collector"];
    let vm = &r["victoria_metrics"];
    let g = &r["goals"];
    let met = |v: &Value| {
        if v["met"] == true {
            "met"
        } else {
            "**not met**"
        }
    };
    let mut s = String::new();
    let per_node = r["command"]
        .as_str()
        .is_some_and(|c| c.ends_with("--keys node"));
    s += if per_node {
        "# Collector bench, per-node keys\n\n"
    } else {
        "# Collector bench\n\n"
    };
    s += &format!(
        "Command: `{}`  \n",
        r["command"].as_str().unwrap_or_default()
    );
    if per_node {
        s += "Each simulated node seals its frames with its own key, derived from the fleet \
              secret the collector holds (`--fleet-secret`; docs/wire-format.md, \"Keys\"): the \
              same run as bench/results/collector.md otherwise. What the keys cost per sample, \
              counted exactly, is in bench/results/node-keys.md; CPU time here is shared and \
              noisy.  \n";
    }
    s += &format!(
        "Date: {}; machine: {} ({} cores, shared with other work: load average at the end {}); net.core.rmem_max {}.\n\n",
        r["date"].as_str().unwrap_or_default(),
        r["machine"]["cpu"].as_str().unwrap_or_default(),
        r["machine"]["cores"],
        load,
        r["machine"]["net.core.rmem_max"]
            .as_str()
            .unwrap_or_default(),
    );
    s += &format!(
        "A release `railscope-collector run` ({} receive sockets, its archive on the local disk) \
         receives the frames of {} simulated nodes ({} series each, the agent's own: a busy node of \
         8 GPUs and 8 IB ports, `monitor_testkit::NodeSender`; every reading of every second sent, \
         as the agent sends with adaptive sampling off, flushed every 10 s by the agent's own \
         encoder) over loopback, from the load generator `monitor-collector/examples/collector_load.rs`, at rising \
         rates. CPU is the collector's utime + stime (`/proc/<pid>/stat`) from the start of a step \
         until every accepted frame is in the archive's files and one fsync interval (1 s) has \
         passed: samples ingested and archived per CPU second, i.e. per core.\n\n",
        c["sockets"], c["nodes"], c["series_per_node"]
    );
    s += "## Goals\n\n| goal | value | |\n|---|---|---|\n";
    s += &format!(
        "| >= 2 M samples/s per collector core | {} M | {} |\n",
        fmt(
            &(g["samples_per_core_s"]["value"]
                .as_f64()
                .map(|v| v / 1e6)
                .into()),
            2
        ),
        met(&g["samples_per_core_s"])
    );
    s += &format!(
        "| >= 5x less CPU per sample than VictoriaMetrics | {}x | {} |\n",
        fmt(&g["cpu_vs_victoria_metrics"]["value"], 1),
        met(&g["cpu_vs_victoria_metrics"])
    );
    s += &format!(
        "| bytes at rest per sample <= VictoriaMetrics' | {} B vs {} B | {} |\n",
        fmt(&g["bytes_at_rest_vs_victoria_metrics"]["value"], 2),
        fmt(
            &g["bytes_at_rest_vs_victoria_metrics"]["victoria_metrics"],
            2
        ),
        met(&g["bytes_at_rest_vs_victoria_metrics"])
    );
    let long_goal = &g["bytes_at_rest_vs_victoria_metrics_long_series"];
    if !long_goal.is_null() {
        s += &format!(
            "| bytes at rest per sample <= VictoriaMetrics', long series ({:.0} samples per series) | {} B vs {} B | {} |\n",
            f64_of(&r["long_series"]["samples_per_series"]),
            fmt(&long_goal["value"], 2),
            fmt(&long_goal["victoria_metrics"], 2),
            met(long_goal)
        );
    }
    s += &format!(
        "| no loss below saturation | {} datagrams lost | {} |\n",
        fmt(&g["no_loss_below_saturation"]["value"], 0),
        met(&g["no_loss_below_saturation"])
    );
    let flood_goal = &g["flood_counted_and_survived"];
    s += &format!(
        "| a 10x flood survived and counted exactly | {}x reached | {} |\n\n",
        fmt(&flood_goal["achieved_multiple"], 2),
        if flood_goal["met"] == true {
            "met"
        } else if flood_goal["rate_reached"] == false {
            "**not met here** (the generator did not reach 10x: see Flood)"
        } else {
            "**not met**"
        }
    );
    s += &format!(
        "Before the steps, every node's first 10 s ({} samples: each node's schema comes with its \
         first frames) is sent at {} samples/s: {} CPU s of the collector, {} M samples per CPU s.\n\n",
        c["warm_up"]["samples"],
        c["warm_up"]["rate_samples_per_s"],
        fmt(&c["warm_up"]["collector_cpu_s"], 2),
        fmt(
            &((f64_of(&c["warm_up"]["samples"]) / f64_of(&c["warm_up"]["collector_cpu_s"]) / 1e6)
                .into()),
            2
        ),
    );
    s += "## Rising rates\n\n| rate (samples/s) | sent samples | accepted | lost datagrams | archived after (s) | collector CPU (s) | M samples per CPU s | segments sealed | |\n|---|---|---|---|---|---|---|---|---|\n";
    for step in c["steps"].as_array().into_iter().flatten() {
        s += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            step["rate_samples_per_s"],
            step["sent_samples"],
            fmt(&step["accepted_samples"], 0),
            fmt(&step["lost_datagrams"], 0),
            fmt(&step["until_archived_s"], 2),
            fmt(&step["collector_cpu_s"], 2),
            fmt(
                &(step["samples_per_cpu_s"].as_f64().map(|v| v / 1e6).into()),
                2
            ),
            fmt(&step["segments_sealed"], 0),
            if step["saturated"] == true {
                "saturated"
            } else {
                ""
            }
        );
    }
    s += &format!(
        "\nSaturation: {} samples/s ({}). A step is saturated when datagrams are lost or archiving \
         them ends more than 2 s after the last was sent. The per-core figure in the goals is over every unsaturated step together (all their samples \
         over all their collector CPU time; steps differ as the archive's occasional work, e.g. a \
         segment sealed, falls into one or another; the best single step: {} M).\n\n",
        fmt(&c["saturation_samples_per_s"], 0),
        if c["saturated"] == true {
            "the highest rate taken without loss or lag; the next one was not"
        } else {
            "not reached: the highest rate sent"
        },
        fmt(
            &(c["samples_per_cpu_s_best"].as_f64().map(|v| v / 1e6).into()),
            2
        ),
    );
    s += "## Memory, bytes at rest, queries\n\n| | |\n|---|---|\n";
    s += &format!("| nodes held | {} |\n", fmt(&c["nodes_held"], 0));
    s += &format!(
        "| RSS empty / after / peak | {} / {} / {} MiB |\n",
        fmt(&(c["rss_empty_kb"].as_f64().map(|v| v / 1024.0).into()), 1),
        fmt(&(c["rss_kb"].as_f64().map(|v| v / 1024.0).into()), 1),
        fmt(&(c["rss_peak_kb"].as_f64().map(|v| v / 1024.0).into()), 1)
    );
    s += &format!(
        "| RSS growth per node | {} kB |\n",
        fmt(&c["rss_growth_per_node_kb"], 1)
    );
    s += &format!(
        "| bytes at rest per sample | {} B ({} samples, {} bytes allocated under the data directory) |\n",
        fmt(&c["bytes_at_rest_per_sample"], 3),
        fmt(&c["samples"], 0),
        c["data_dir_bytes"]
    );
    let q = &c["queries"];
    s += &format!(
        "| query: one metric of one node over an hour ({} series points) | {} ms |\n",
        q["node_hour_one_metric"]["points"],
        fmt(
            &(q["node_hour_one_metric"]["seconds"]
                .as_f64()
                .map(|v| v * 1e3)
                .into()),
            1
        )
    );
    s += &format!(
        "| query: every metric of that node-hour ({} queries, {} points) | {} ms |\n",
        q["node_hour_every_metric"]["metrics"],
        q["node_hour_every_metric"]["points"],
        fmt(
            &(q["node_hour_every_metric"]["seconds"]
                .as_f64()
                .map(|v| v * 1e3)
                .into()),
            0
        )
    );
    s += &format!(
        "| query: one metric across 1,000 nodes over {} s ({} points) | {} ms |\n\n",
        q["one_metric_1000_nodes"]["range_s"],
        q["one_metric_1000_nodes"]["points"],
        fmt(
            &(q["one_metric_1000_nodes"]["seconds"]
                .as_f64()
                .map(|v| v * 1e3)
                .into()),
            0
        )
    );
    s += "Query latencies are the median of three, through the HTTP API (`/api/v1/series`).\n\n";
    let f = &c["flood"];
    s += &format!(
        "## Flood\n\nAt {}x the saturation rate in datagrams ({} datagrams/s asked, {} achieved: {}x), \
         for 3 s, by two generator threads sending a pre-built pool with `sendmmsg` (64 a call, message headers made once) on the same 2 cores as the collector, {}: forged (a byte changed), replayed, truncated and random datagrams, {} in all. \
         Counted as drops: {} ({}); accepted: {}. The collector {}; its RSS {} MiB before, {} MiB after (peak {} MiB before, {} MiB after).\n\n",
        FLOOD_FACTOR,
        fmt(&f["rate_datagrams_per_s"], 0),
        fmt(&f["achieved_datagrams_per_s"], 0),
        fmt(&f["achieved_multiple"], 2),
        if f["sent"]["priority_raised"] == true {
            "at nice -10 (on loopback the sender also pays the kernel's receive path, so a generator at the collector's priority is slowed by the collector it floods)"
        } else {
            "at the collector's priority (nice -10 was refused)"
        },
        f["sent"]["datagrams"],
        fmt(&f["counted"], 0),
        f["drops"],
        fmt(&f["accepted"], 0),
        if f["collector_alive"] == true {
            "kept running"
        } else {
            "**died**"
        },
        fmt(&(f["rss_kb_before"].as_f64().map(|v| v / 1024.0).into()), 1),
        fmt(&(f["rss_kb_after"].as_f64().map(|v| v / 1024.0).into()), 1),
        fmt(
            &(f["rss_peak_kb_before"].as_f64().map(|v| v / 1024.0).into()),
            1
        ),
        fmt(
            &(f["rss_peak_kb_after"].as_f64().map(|v| v / 1024.0).into()),
            1
        ),
    );
    s += &format!(
        "## VictoriaMetrics\n\n{} on a fresh `-storageDataPath`, fed every archived sample by the \
         collector's remote-write (the collector started again on the same archive with \
         `--remote-write`). CPU is VictoriaMetrics' utime + stime from before the collector \
         started until it had inserted every row; at rest is every byte allocated under its \
         storage directory after `/internal/force_flush`, `/internal/force_merge` of the month \
         and `vm_active_merges` at 0, then 5 s.\n\n",
        vm["version"].as_str().unwrap_or("victoria-metrics")
    );
    s += "| | railscope collector | VictoriaMetrics |\n|---|---|---|\n";
    let ours_ns = g["samples_per_core_s"]["value"].as_f64().map(|p| 1e9 / p);
    s += &format!(
        "| CPU per sample | {} ns (ingest and archive) | {} ns (remote-write ingest) |\n",
        fmt(&ours_ns.into(), 0),
        fmt(&vm["cpu_ns_per_sample"], 0)
    );
    s += &format!(
        "| bytes at rest per sample | {} | {} ({} data, {} index) |\n",
        fmt(&c["bytes_at_rest_per_sample"], 3),
        fmt(&vm["bytes_at_rest_per_sample"], 3),
        fmt(&vm["data_bytes_per_sample"], 3),
        fmt(
            &((f64_of(&vm["indexdb_bytes"]) / f64_of(&vm["rows_inserted"]).max(1.0)).into()),
            3
        ),
    );
    s += &format!(
        "| samples | {} | {} rows inserted |\n\n",
        fmt(&c["samples"], 0),
        fmt(&vm["rows_inserted"], 0)
    );
    s += "The collector's own figure is ingest and archive: remote-write is extra work of the \
          collector, paid only where it forwards to a TSDB (below).\n\n";
    let series = f64_of(&c["nodes"]) * f64_of(&c["series_per_node"]);
    s += &format!(
        "Reading these figures: the machine was shared (load average {} at the end), which \
         inflates the wall-clock figures (saturation rate, query latencies, the flood rate the \
         generator achieved) but not CPU time per sample. VictoriaMetrics got about {:.0} \
         samples per series (the bench's {:.0} series over {} s of data): its index share per \
         sample shrinks on longer series, its data share ({} B) is the comparable part (see the \
         long-series comparison). A step in \
         which a 64 MiB segment was sealed costs more CPU (the re-coding and zstd, on the \
         archive's sealer thread); the writer goes on appending meanwhile, so it archives about as \
         soon as the others.\n\n",
        load,
        f64_of(&vm["rows_inserted"]) / series.max(1.0),
        series,
        if c["fleet_data_s"].is_null() {
            &c["queries"]["one_metric_1000_nodes"]["range_s"]
        } else {
            &c["fleet_data_s"]
        },
        fmt(&vm["data_bytes_per_sample"], 2),
    );
    let l = &r["long_series"];
    if !l.is_null() {
        let lvm = &l["victoria_metrics"];
        s += &format!(
            "## Bytes at rest with long series\n\nThe fleet above gives each series only about a \
             minute of samples, where VictoriaMetrics' index dominates. Here {} nodes send an hour \
             each at 1 s ({:.0} samples per series; the `archive_size` example writes the frames of \
             the same simulated nodes into an archive, sealed, the bench's key), and a collector on that \
             archive remote-writes them to a fresh VictoriaMetrics, measured at rest as above.\n\n\
             | | railscope collector | VictoriaMetrics |\n|---|---|---|\n\
             | bytes at rest per sample | {} | {} ({} data, {} index) |\n\
             | samples | {} | {} rows inserted |\n\
             | CPU per sample | | {} ns (remote-write ingest) |\n\n\
             Where ours is larger, the reason (every frame restarts each series' coding) and \
             what would close the gap are in bench/results/archive-size.md.\n\n",
            l["nodes"],
            f64_of(&l["samples_per_series"]),
            fmt(&l["bytes_at_rest_per_sample"], 3),
            fmt(&lvm["bytes_at_rest_per_sample"], 3),
            fmt(&lvm["data_bytes_per_sample"], 3),
            fmt(
                &((f64_of(&lvm["indexdb_bytes"]) / f64_of(&lvm["rows_inserted"]).max(1.0)).into()),
                3
            ),
            fmt(&l["samples"], 0),
            fmt(&lvm["rows_inserted"], 0),
            fmt(&lvm["cpu_ns_per_sample"], 0),
        );
    }
    s += &format!(
        "The collector's remote-write to VictoriaMetrics took {} CPU s of the collector ({} ns per sample sent); the ingest took {} s.\n",
        fmt(&vm["collector_remote_write_cpu_s"], 1),
        fmt(&vm["collector_remote_write_cpu_ns_per_sample"], 0),
        fmt(&vm["ingest_s"], 1)
    );
    s
}
