//! `cargo xtask bench fleet`: one collector under a fleet of simulated nodes that send what
//! real agents send, in real time, with faults injected at known times; its read path next
//! to VictoriaMetrics fed the same samples by the collector's own remote-write in the same
//! run.
//!
//! 1. VictoriaMetrics (`/usr/bin/victoria-metrics`) on a fresh storage directory, and a
//!    release `railscope-collector run` (fresh data directory, the bench's key,
//!    `--remote-write` to it); the idle collector's RSS (the fixed cost).
//! 2. The load generator (`monitor-collector/examples/fleet_load.rs`) makes every second's
//!    frames of `--nodes` nodes over `--seconds` first (the agent's adaptive sampler, 8 GPUs
//!    and 8 ports a node, 100 jobs of 8-1,024 nodes, faults at known ticks), then sends them,
//!    each second's at its own time.
//! 3. Meanwhile `/api/v1/findings?active=true` is polled every 100 ms and
//!    `/api/v1/stragglers` (every job, its default 5-minute window) one request after the
//!    other, at most every 100 ms: the time from each fault's own timestamp to its finding
//!    or straggler appearing, and each straggler search's duration.
//! 4. After: the collector's CPU per sample (utime + stime over the run, and per thread:
//!    ingest and archive apart from the HTTP answers the polls cost and the remote-write),
//!    RSS per node, the findings tick's duration (`railscope_collector_findings_tick_seconds`
//!    on `/metrics/collector`), datagrams lost; once the remote-write has caught up, four
//!    questions asked of both (median of 5), the job and jobs views' questions as the page
//!    asks them (its straggler window: 5 minutes ending on a 10 s step, one step behind the
//!    load's end), and `/metrics` at that scale.
//!
//! Writes `bench/results/fleet.md` and `fleet.json`.

use std::{
    collections::BTreeMap,
    fs,
    io::{BufRead, BufReader, Write as _},
    net::SocketAddr,
    process::{Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use super::{
    agent::process::{Proc, clock_ticks_per_second, cpu_ticks, status_kb, thread_run_ns, unix_ns},
    collector::{self, f64_of, fmt, metrics, start_victoria_metrics, u64_of},
    host_cpu, sorted_json, utc_now,
};
use crate::{
    cargo,
    http::{encode, http_get, metric_sum, wait_http},
    scratch::{free_tcp_port, free_udp_port, write_key},
    setup::{self, Tools},
};

/// Options of `cargo xtask bench fleet`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct FleetOptions {
    /// `fleet`: seconds the simulated fleet sends (long enough for findings ticks, straggler
    /// searches over a window where the faults started, and a segment sealed).
    #[arg(long, default_value_t = 180)]
    pub seconds: u64,
}

/// `--nodes` by default: 12,500 nodes of 8 GPUs, a 100,000-GPU fleet.
const DEFAULT_NODES: usize = 12_500;

/// Goals (issue 29).
const GOAL_EVENT_FINDING_P99_S: f64 = 1.0;
const GOAL_STRAGGLER_S: f64 = 30.0;
const GOAL_FINDINGS_TICK_S: f64 = 1.0;
const GOAL_JOB_VIEW_S: f64 = 1.0;

/// A slow GPU's detection is judged only for onsets this long after the fleet's start (see
/// `with_goals`).
const STRAGGLER_JUDGED_FROM_S: u64 = 30;

/// How often the findings are polled.
const POLL: Duration = Duration::from_millis(100);

/// Polls go on this long after the last frame was sent, for faults not detected yet.
const DETECT_GRACE: Duration = Duration::from_secs(30);

/// Each read-path question is asked this many times; the median is reported.
const REPEATS: usize = 5;

pub(super) fn run(tools: &Tools, options: &super::Options) -> anyhow::Result<()> {
    let nodes = options.collector.nodes.unwrap_or(DEFAULT_NODES);
    let seconds = options.fleet.seconds;
    let (collector_bin, load_bin) = build(tools)?;
    let dir = cargo::workspace_root().join("target/bench/fleet");
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    fs::create_dir_all(&dir)?;
    let key = write_key(&dir)?;
    setup::step("starting VictoriaMetrics and the collector (remote-writing to it)");
    let (mut vm, vm_addr, vm_version) = start_victoria_metrics(
        &dir,
        "victoria-metrics",
        // The latest value of every GPU series matches more than its default 300,000.
        &["-search.maxUniqueTimeseries=100000000"],
    )?;
    let udp = free_udp_port()?;
    let http: SocketAddr = ([127, 0, 0, 1], free_tcp_port()?).into();
    let mut cmd = Command::new(&collector_bin);
    cmd.args(["run", "--listen", &format!("127.0.0.1:{udp}")])
        .args(["--http", &http.to_string()])
        .arg("--key")
        .arg(&key)
        .arg("--data")
        .arg(dir.join("data"))
        .args(["--max-nodes", &(nodes + 16).to_string()])
        .args(["--max-series", &(nodes * 400).to_string()])
        // So that the archive's questions below are answered rather than refused.
        .args(["--query-max-points", "50000000"])
        .args([
            "--remote-write",
            &format!("vm=http://{vm_addr}/api/v1/write"),
        ]);
    let mut collector = Proc::spawn("collector", &mut cmd, &dir, None)?;
    wait_http(http, Duration::from_secs(30))?;
    let pid = collector.pid();
    thread::sleep(Duration::from_secs(2));
    let rss_idle_kb = status_kb(pid, "VmRSS").unwrap_or(0);

    setup::step(&format!(
        "making {seconds} s of frames of {nodes} nodes (the agent's adaptive sampler), before sending them in real time"
    ));
    let mut load_cmd = Command::new(&load_bin);
    load_cmd
        .args(["--target", &format!("127.0.0.1:{udp}")])
        .arg("--key")
        .arg(&key)
        .args([
            "--nodes",
            &nodes.to_string(),
            "--seconds",
            &seconds.to_string(),
        ]);
    let mut load = Proc::spawn(
        "load",
        load_cmd.stdin(Stdio::piped()),
        &dir,
        Some(Stdio::piped()),
    )?;
    let mut load_in = load.child.stdin.take().context("no stdin")?;
    let mut load_out = BufReader::new(load.child.stdout.take().context("no stdout")?);
    let ready = read_line_json(&mut load_out)?;
    if ready["ready"] != true {
        bail!(
            "the load generator did not start: {ready} (see {}/load.err)",
            dir.display()
        );
    }
    eprintln!(
        "    {} datagrams made in {:.0} s (estimated {:.0} s); sending from {}",
        ready["datagrams"],
        f64_of(&ready["generate_s"]),
        f64_of(&ready["estimated_generate_s"]),
        ready["start_unix_ns"]
    );
    let faults: Vec<Value> = ready["faults"].as_array().cloned().unwrap_or_default();

    // The run.
    let before = metrics(http)?;
    let cpu_before = cpu_ticks(pid)?.total();
    let threads_before = thread_run_ns(pid);
    let vm_cpu_before = cpu_ticks(vm.pid())?.total();
    let stop = Arc::new(AtomicBool::new(false));
    let detected: Arc<Mutex<BTreeMap<usize, Value>>> = Arc::default();
    let straggler_passes: Arc<Mutex<Vec<f64>>> = Arc::default();
    let findings_poll = spawn_findings_poll(http, &faults, &stop, &detected);
    let straggler_poll = spawn_straggler_poll(http, &faults, &stop, &detected, &straggler_passes);
    setup::step(&format!("sending {seconds} s of the fleet in real time"));
    writeln!(load_in, "go")?;
    load_in.flush()?;
    let sent = read_line_json(&mut load_out)?;
    let send_end = Instant::now();
    eprintln!("    sent: {sent}");
    if f64_of(&sent["started_late_s"]) > 1.0 {
        bail!(
            "the frames were ready {:.1} s after the first one's time, so the fleet was not sent in real time \
             (the machine was busier than the load generator's estimate): run again, or with fewer --nodes",
            f64_of(&sent["started_late_s"])
        );
    }
    let after_send = collector::settle(
        http,
        &before,
        u64_of(&sent["datagrams"]),
        Duration::from_secs(120),
    )?;
    let cpu_s = (cpu_ticks(pid)?.total() - cpu_before) as f64 / clock_ticks_per_second();
    let threads_after = thread_run_ns(pid);
    let rss_kb = status_kb(pid, "VmRSS").unwrap_or(0);
    let hwm_kb = status_kb(pid, "VmHWM").unwrap_or(0);
    while send_end.elapsed() < DETECT_GRACE && detected.lock().unwrap().len() < faults.len() {
        thread::sleep(POLL);
    }
    stop.store(true, Ordering::Relaxed);
    let _ = findings_poll.join();
    let _ = straggler_poll.join();
    let _ = writeln!(load_in, "quit");

    let delta = |name: &str| metric_sum(&after_send, name) - metric_sum(&before, name);
    let samples = delta("railscope_collector_samples_accepted_total");
    let frames = delta("railscope_collector_frames_accepted_total");
    let lost = u64_of(&sent["datagrams"]) as f64 - frames;
    let by_thread = thread_cpu(&threads_before, &threads_after);
    let ingest_cpu_s: f64 = by_thread
        .iter()
        .filter(|(group, _)| group.as_str() != "http" && group.as_str() != "remote-write")
        .map(|(_, s)| s)
        .sum();
    let nodes_held = metric_sum(&after_send, "railscope_collector_nodes");
    let own = metrics(http)?;
    let tick_count = metric_sum(&own, "railscope_collector_findings_tick_seconds_count");
    let tick_sum = metric_sum(&own, "railscope_collector_findings_tick_seconds_sum");
    let tick_max = metric_sum(&own, "railscope_collector_findings_tick_max_seconds");

    setup::step("waiting for the remote-write to VictoriaMetrics to catch up");
    let caught_up = remote_write_caught_up(http, Duration::from_secs(600))?;
    let vm_cpu_s = (cpu_ticks(vm.pid())?.total() - vm_cpu_before) as f64 / clock_ticks_per_second();
    http_get(vm_addr, "/internal/force_flush")?;
    thread::sleep(Duration::from_secs(2));

    setup::step("asking both the same questions (median of 5)");
    let end_ns = u64_of(&ready["end_unix_ns"]);
    let start_ns = u64_of(&ready["start_unix_ns"]);
    let node = ready["node_names"][0]
        .as_str()
        .unwrap_or("node-000")
        .to_owned();
    let read_path = read_path(http, vm_addr, &node, start_ns, end_ns)?;
    setup::step("the job view of the largest job");
    let job_view = job_view(http, &ready["jobs"], end_ns)?;
    setup::step("/metrics at this scale");
    let scrape = scrape_costs(http, pid, &node)?;
    collector.stop(libc::SIGTERM, Duration::from_secs(30))?;
    vm.stop(libc::SIGTERM, Duration::from_secs(30))?;

    let detection = detection_report(&faults, &detected.lock().unwrap());
    let passes = straggler_passes.lock().unwrap().clone();
    let report = json!({
        "command": command_line(nodes, seconds, options.collector.nodes.is_some()),
        "date": utc_now(),
        "machine": {
            "cpu": host_cpu(),
            "cores": thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
            "loadavg_at_end": fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
        },
        "fleet": {
            "nodes": nodes,
            "gpus": nodes * 8,
            "ports": nodes * 8,
            "seconds": seconds,
            "jobs": ready["jobs"],
            "datagrams": sent["datagrams"],
            "bytes": ready["bytes"],
            "generate_s": ready["generate_s"],
            "estimated_generate_s": ready["estimated_generate_s"],
            "seconds_per_tick": ready["seconds_per_tick"],
            "send": sent,
        },
        "collector": {
            "samples_accepted": samples,
            "samples_per_s": samples / seconds as f64,
            "frames_accepted": frames,
            "datagrams_lost": lost,
            "drops": collector::drops(&after_send, &before),
            "cpu_s": cpu_s,
            "cpu_by_thread_s": by_thread,
            "ingest_cpu_s": ingest_cpu_s,
            "cpu_ns_per_sample": cpu_s * 1e9 / samples.max(1.0),
            "ingest_cpu_ns_per_sample": ingest_cpu_s * 1e9 / samples.max(1.0),
            "nodes_held": nodes_held,
            "rss_idle_kb": rss_idle_kb,
            "rss_kb": rss_kb,
            "rss_peak_kb": hwm_kb,
            "rss_per_node_kb": rss_kb.saturating_sub(rss_idle_kb) as f64 / nodes_held.max(1.0),
            "segments_sealed": delta("railscope_collector_archive_segments_sealed_total"),
            "findings_ticks": tick_count,
            "findings_tick_mean_s": tick_sum / tick_count.max(1.0),
            "findings_tick_max_s": tick_max,
            "straggler_passes": passes.len(),
            "straggler_pass_median_s": median(&passes),
            "straggler_pass_max_s": passes.iter().copied().fold(f64::NAN, f64::max),
            "remote_write_caught_up_s": caught_up,
            "metrics_scrape": scrape,
        },
        "victoria_metrics": {
            "version": vm_version,
            "ingest_cpu_s": vm_cpu_s,
        },
        "detection": detection,
        "faults_onset_ticks": onset_ticks(&faults),
        "read_path": read_path,
        "job_view": job_view,
    });
    let report = with_goals(report);
    let md_path = cargo::workspace_root().join(super::results_path(super::Target::Fleet));
    fs::write(&md_path, markdown(&report))?;
    fs::write(md_path.with_extension("json"), sorted_json(&report)?)?;
    eprintln!("    wrote {}", md_path.display());
    Ok(())
}

fn build(tools: &Tools) -> anyhow::Result<(std::path::PathBuf, std::path::PathBuf)> {
    setup::step("building railscope-collector and the fleet's load generator (release)");
    let mut cmd = cargo::command(tools);
    cmd.args(["build", "--release", "--package", "monitor-collector"])
        .args(["--bin", "railscope-collector", "--example", "fleet_load"]);
    let built = cargo::build_executables(cmd)?;
    let find = |name: &str| {
        built
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| p.clone())
            .with_context(|| format!("cargo did not report {name}"))
    };
    Ok((find("railscope-collector")?, find("fleet_load")?))
}

fn command_line(nodes: usize, seconds: u64, nodes_given: bool) -> String {
    let mut c = String::from("cargo xtask bench fleet");
    if nodes_given {
        c += &format!(" --nodes {nodes}");
    }
    c + &format!(" --seconds {seconds}")
}

fn read_line_json(out: &mut impl BufRead) -> anyhow::Result<Value> {
    let mut line = String::new();
    if out.read_line(&mut line)? == 0 {
        bail!("the load generator exited (see target/bench/fleet/load.err)");
    }
    serde_json::from_str(&line).with_context(|| format!("not JSON: {line:?}"))
}

/// Whether a finding or straggler (its `node`, `gpu`, `device`) is about a fault's GPU or port.
fn about(fault: &Value, item: &Value) -> bool {
    item["node"] == fault["node"]
        && if fault["gpu"].is_null() {
            item["device"] == fault["device"]
        } else {
            item["gpu"] == fault["gpu"]
        }
}

/// Polls the active findings every [`POLL`]: the first finding about each fault that is not
/// a straggler's (those are the straggler poll's), with when it was seen.
fn spawn_findings_poll(
    http: SocketAddr,
    faults: &[Value],
    stop: &Arc<AtomicBool>,
    detected: &Arc<Mutex<BTreeMap<usize, Value>>>,
) -> thread::JoinHandle<()> {
    let (faults, stop, detected) = (faults.to_vec(), stop.clone(), detected.clone());
    thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let asked = Instant::now();
            if let Ok((200, body)) = http_get(http, "/api/v1/findings?active=true") {
                let seen_ns = unix_ns();
                let answer: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
                let found = answer["findings"].as_array().cloned().unwrap_or_default();
                let mut d = detected.lock().unwrap();
                for (i, fault) in faults.iter().enumerate() {
                    if fault["kind"] == "slow_gpu" || d.contains_key(&i) {
                        continue;
                    }
                    if let Some(f) = found.iter().find(|f| about(fault, f)) {
                        d.insert(
                            i,
                            json!({"seen_unix_ns": seen_ns, "by": f["rule"], "id": f["id"]}),
                        );
                    }
                }
            }
            thread::sleep(POLL.saturating_sub(asked.elapsed()));
        }
    })
}

/// Asks `/api/v1/stragglers` (every job, the default window) one request after the other, at
/// most every [`POLL`]: each request's duration, and when each slow GPU is first flagged.
fn spawn_straggler_poll(
    http: SocketAddr,
    faults: &[Value],
    stop: &Arc<AtomicBool>,
    detected: &Arc<Mutex<BTreeMap<usize, Value>>>,
    passes: &Arc<Mutex<Vec<f64>>>,
) -> thread::JoinHandle<()> {
    let (faults, stop, detected, passes) = (
        faults.to_vec(),
        stop.clone(),
        detected.clone(),
        passes.clone(),
    );
    thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let asked = Instant::now();
            let answer = http_get(http, "/api/v1/stragglers");
            let took = asked.elapsed();
            if let Ok((200, body)) = answer {
                passes.lock().unwrap().push(took.as_secs_f64());
                let seen_ns = unix_ns();
                let answer: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
                let mut d = detected.lock().unwrap();
                for job in answer["jobs"].as_array().into_iter().flatten() {
                    for s in job["stragglers"].as_array().into_iter().flatten() {
                        for (i, fault) in faults.iter().enumerate() {
                            if fault["kind"] == "slow_gpu" && !d.contains_key(&i) && about(fault, s)
                            {
                                d.insert(i, json!({"seen_unix_ns": seen_ns, "by": "straggler", "metric": s["metric"]}));
                            }
                        }
                    }
                }
            }
            thread::sleep(POLL.saturating_sub(took));
        }
    })
}

/// Per fault kind, the ticks (seconds into the run) its faults start at.
fn onset_ticks(faults: &[Value]) -> BTreeMap<String, Vec<u64>> {
    let mut out: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for f in faults {
        out.entry(f["kind"].as_str().unwrap_or("?").to_owned())
            .or_default()
            .push(u64_of(&f["tick"]));
    }
    out
}

/// One kind's faults: the times to detect (s), the faults missed, and what found them.
type Detections = (Vec<f64>, Vec<Value>, BTreeMap<String, u64>);

/// Per fault kind: the times to detect (s), their p50, p99 and max, and what was missed.
fn detection_report(faults: &[Value], detected: &BTreeMap<usize, Value>) -> Value {
    let mut kinds: BTreeMap<String, Detections> = BTreeMap::new();
    for (i, fault) in faults.iter().enumerate() {
        let kind = fault["kind"].as_str().unwrap_or("?").to_owned();
        let entry = kinds.entry(kind).or_default();
        match detected.get(&i) {
            Some(d) => {
                let s =
                    (u64_of(&d["seen_unix_ns"]) as f64 - u64_of(&fault["unix_ns"]) as f64) / 1e9;
                entry.0.push(s);
                *entry
                    .2
                    .entry(d["by"].as_str().unwrap_or("?").to_owned())
                    .or_default() += 1;
            }
            None => entry.1.push(fault.clone()),
        }
    }
    let out: serde_json::Map<String, Value> = kinds
        .into_iter()
        .map(|(kind, (mut times, missed, by))| {
            times.sort_by(f64::total_cmp);
            let v = json!({
                "faults": times.len() + missed.len(),
                "detected": times.len(),
                "seconds": times,
                "p50_s": percentile(&times, 0.5),
                "p99_s": percentile(&times, 0.99),
                "max_s": times.last(),
                "by": by,
                "missed": missed,
            });
            (kind, v)
        })
        .collect();
    Value::Object(out)
}

/// The `q` quantile of sorted `v` (nearest rank), `null` when empty.
fn percentile(v: &[f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[rank - 1])
}

fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    percentile(&v, 0.5)
}

/// CPU seconds per group of the collector's threads between two readings (threads gone in
/// between are not counted): `receive`, `archive`, `findings`, `http` (the HTTP thread and
/// its runtime's workers and blocking pool: the polls' and queries' answers),
/// `remote-write`, `other`.
fn thread_cpu(
    before: &BTreeMap<u64, (String, u64)>,
    after: &BTreeMap<u64, (String, u64)>,
) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (tid, (name, ns)) in after {
        let was = before.get(tid).map_or(0, |(_, ns)| *ns);
        let group = if name.starts_with("receive") {
            "receive"
        } else if name.starts_with("archive") {
            "archive"
        } else if name.starts_with("findings-remote") || name.starts_with("rw-") {
            "remote-write"
        } else if name.starts_with("findings") {
            "findings"
        } else if name == "http" || name.starts_with("tokio") {
            "http"
        } else {
            "other"
        };
        *out.entry(group.to_owned()).or_insert(0.0) += ns.saturating_sub(was) as f64 / 1e9;
    }
    out
}

/// Seconds until the collector's remote-write has nothing pending and its count of samples
/// sent stopped moving for 2 s.
fn remote_write_caught_up(http: SocketAddr, within: Duration) -> anyhow::Result<f64> {
    let started = Instant::now();
    let (mut last, mut moved) = (f64::NAN, Instant::now());
    loop {
        let m = metrics(http)?;
        let sent = metric_sum(&m, "railscope_collector_remote_write_samples_sent_total");
        let pending = metric_sum(&m, "railscope_collector_remote_write_samples_pending");
        if sent != last {
            (last, moved) = (sent, Instant::now());
        }
        if pending == 0.0 && sent > 0.0 && moved.elapsed() > Duration::from_secs(2) {
            return Ok(started.elapsed().as_secs_f64());
        }
        if started.elapsed() > within {
            bail!(
                "the remote-write did not catch up within {within:?} ({sent} samples sent, {pending} pending)"
            );
        }
        thread::sleep(Duration::from_millis(200));
    }
}

/// Asks `path` [`REPEATS`] times: the median latency (ms) and the points of the last answer,
/// counted by `points`.
fn timed(addr: SocketAddr, path: &str, points: impl Fn(&Value) -> u64) -> anyhow::Result<Value> {
    let mut times = Vec::new();
    let mut n = 0;
    for _ in 0..REPEATS {
        let started = Instant::now();
        let (status, body) = http_get(addr, path)?;
        times.push(started.elapsed().as_secs_f64() * 1e3);
        if status != 200 {
            bail!(
                "GET {path}: status {status}: {}",
                body.chars().take(300).collect::<String>()
            );
        }
        n = if body.trim_start().starts_with('{') && !body.contains("\n{") {
            points(&serde_json::from_str(&body).context("a query's answer")?)
        } else {
            // VictoriaMetrics' export: one JSON object a line.
            body.lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .map(|v| points(&v))
                .sum()
        };
    }
    Ok(json!({ "ms": median(&times), "points": n, "path": path }))
}

/// Points of a railscope `/api/v1/series` or `/api/v1/live/latest` answer.
fn railscope_points(v: &Value) -> u64 {
    v["series"].as_array().map_or(0, |s| {
        s.iter()
            .map(|s| s["points"].as_array().map_or(0, Vec::len) as u64)
            .sum()
    })
}

/// Points of a VictoriaMetrics export line or a Prometheus query answer.
fn vm_points(v: &Value) -> u64 {
    if let Some(values) = v["values"].as_array() {
        return values.len() as u64;
    }
    v["data"]["result"].as_array().map_or(0, |r| {
        r.iter()
            .map(|s| s["values"].as_array().map_or(1, Vec::len) as u64)
            .sum()
    })
}

/// What the dashboard's job view asks for the fleet's largest job, as `ui/app.js` asks it
/// (its straggler window, its GPUs' latest values, the findings of the window, then its
/// nodes' ports, 200 nodes a request), each timed ([`REPEATS`], median): the goal is a
/// 1,024-node job's view in under 1 s.
fn job_view(http: SocketAddr, jobs: &Value, end_ns: u64) -> anyhow::Result<Value> {
    let Some(job) = jobs
        .as_array()
        .into_iter()
        .flatten()
        .max_by_key(|j| u64_of(&j["nodes"]))
    else {
        bail!("the load generator named no job");
    };
    let id = job["job_id"].as_str().unwrap_or_default();
    let job_match = encode(&format!("job_id={id:?}"));
    // The job's nodes, as the page learns them: from its GPUs' series.
    let (_, body) = http_get(
        http,
        &format!("/api/v1/live/latest?metric=railscope_gpu_sm_util_ratio&match={job_match}"),
    )?;
    let answer: Value = serde_json::from_str(&body).context("/api/v1/live/latest")?;
    let mut nodes: Vec<String> = answer["series"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["labels"]["node"].as_str().map(str::to_owned))
        .collect();
    nodes.sort();
    nodes.dedup();
    // The page's straggler window (`stragglerWindow` in ui/app.js), asked as the load ends:
    // 5 minutes ending on a 10 s step, one step behind the clock.
    let window_end = end_ns / 1_000_000_000 / 10 * 10 - 10;
    let stragglers = timed(
        http,
        &format!(
            "/api/v1/stragglers?job_id={}&start={}&end={window_end}",
            encode(id),
            window_end - 300
        ),
        |_| 0,
    )?;
    let gpus = timed(
        http,
        &format!(
            "/api/v1/live/latest?metric=railscope_gpu_sm_util_ratio&metric=railscope_gpu_utilization_ratio&match={job_match}&format=columns"
        ),
        |_| 0,
    )?;
    let findings = timed(
        http,
        &format!("/api/v1/findings?start={}", window_end - 300),
        |_| 0,
    )?;
    let mut ports_ms = 0.0;
    for chunk in nodes.chunks(200) {
        let regex = chunk.join("|");
        let t = timed(
            http,
            &format!(
                "/api/v1/live/latest?metric=railscope_ib_port_xmit_bytes_total&metric=railscope_ib_port_rcv_bytes_total&metric=railscope_ib_port_rate_gbps&match={}&format=columns",
                encode(&format!("node=~{regex}"))
            ),
            |_| 0,
        )?;
        ports_ms += f64_of(&t["ms"]);
    }
    // The jobs view: every job's stragglers over the same window.
    let jobs_view = timed(
        http,
        &format!(
            "/api/v1/stragglers?start={}&end={window_end}",
            window_end - 300
        ),
        |_| 0,
    )?;
    let ms = |v: &Value| f64_of(&v["ms"]);
    Ok(json!({
        "job_id": id,
        "nodes": nodes.len(),
        "stragglers_ms": ms(&stragglers),
        "gpus_ms": ms(&gpus),
        "findings_ms": ms(&findings),
        "ports_ms": ports_ms,
        // The page asks the first three at once, then the ports.
        "page_ms": ms(&stragglers).max(ms(&gpus)).max(ms(&findings)) + ports_ms,
        "jobs_view_stragglers_ms": ms(&jobs_view),
    }))
}

/// The four questions of issue 29, of railscope and of VictoriaMetrics.
fn read_path(
    http: SocketAddr,
    vm: SocketAddr,
    node: &str,
    start_ns: u64,
    end_ns: u64,
) -> anyhow::Result<Value> {
    let secs = |ns: u64| {
        format!(
            "{}.{:03}",
            ns / 1_000_000_000,
            ns % 1_000_000_000 / 1_000_000
        )
    };
    let (start, end, minute) = (secs(start_ns), secs(end_ns), secs(end_ns - 60_000_000_000));
    let counter = "railscope_ib_port_xmit_bytes_total";
    let gauge = "railscope_gpu_sm_util_ratio";
    // The GPU metrics the fleet sent (railscope's own list of the run's names).
    let (_, names) = http_get(
        http,
        &format!("/api/v1/metric-names?start={start}&end={end}"),
    )?;
    let names: Value = serde_json::from_str(&names).context("/api/v1/metric-names")?;
    let gpu_metrics: Vec<String> = names["metrics"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["name"].as_str().or(m.as_str()))
        .filter(|n| n.starts_with("railscope_gpu_"))
        .map(str::to_owned)
        .collect();
    if gpu_metrics.is_empty() {
        bail!("/api/v1/metric-names named no GPU metric: {names}");
    }
    let one = |metric: &str, matchers: &[String], from: &str| {
        let m: String = matchers
            .iter()
            .map(|m| format!("&match={}", encode(m)))
            .collect();
        format!("/api/v1/series?metric={metric}{m}&start={from}&end={end}")
    };
    let node_port = [format!("node={node}"), "device=mlx5_0".to_owned()];
    let rows = vec![
        (
            "one counter, one node, the whole run",
            timed(http, &one(counter, &node_port, &start), railscope_points)?,
            timed(
                vm,
                &format!(
                    "/api/v1/export?match[]={}&start={start}&end={end}",
                    encode(&format!("{counter}{{node=\"{node}\",device=\"mlx5_0\"}}"))
                ),
                vm_points,
            )?,
            "raw samples (`/api/v1/export`)",
        ),
        (
            "one gauge, all nodes, last minute",
            timed(http, &one(gauge, &[], &minute), railscope_points)?,
            timed(
                vm,
                &format!("/api/v1/export?match[]={gauge}&start={minute}&end={end}"),
                vm_points,
            )?,
            "raw samples (`/api/v1/export`; the mean only, railscope's points carry min and max too)",
        ),
        (
            "latest value of every GPU series",
            timed(
                http,
                &format!(
                    "/api/v1/live/latest?{}",
                    gpu_metrics
                        .iter()
                        .map(|m| format!("metric={m}"))
                        .collect::<Vec<_>>()
                        .join("&")
                ),
                railscope_points,
            )?,
            timed(
                vm,
                &format!(
                    "/api/v1/query?query={}&time={end}",
                    encode(&format!("{{__name__=~\"{}\"}}", gpu_metrics.join("|")))
                ),
                vm_points,
            )?,
            "instant query (`/api/v1/query`, 5 min lookback)",
        ),
        (
            "per-second rate of a counter, all nodes, last minute",
            timed(http, &one(counter, &[], &minute), railscope_points)?,
            timed(
                vm,
                &format!(
                    "/api/v1/query_range?query={}&start={minute}&end={end}&step=1s",
                    encode(&format!("rate({counter}[1m])"))
                ),
                vm_points,
            )?,
            "`rate(x[1m])`, `/api/v1/query_range`, step 1 s",
        ),
    ];
    Ok(json!({
        "gpu_metrics": gpu_metrics,
        "questions": rows
            .into_iter()
            .map(|(q, ours, theirs, how)| {
                json!({
                    "question": q,
                    "railscope": ours,
                    "victoria_metrics": theirs,
                    "victoria_metrics_how": how,
                    "ratio": f64_of(&ours["ms"]) / f64_of(&theirs["ms"]),
                })
            })
            .collect::<Vec<_>>(),
    }))
}

/// What scraping the collector costs, each way docs/deployment.md offers: the whole
/// `/metrics`, one node's target, one of 16 shards, the fleet-level target and the target
/// list: the answer's size, the collector's CPU per scrape (over `times` scrapes one after
/// the other: a node's target costs less than the CPU clock's tick) and the median wall time.
fn scrape_costs(http: SocketAddr, pid: i32, node: &str) -> anyhow::Result<Value> {
    let mut out = serde_json::Map::new();
    for (key, path, times) in [
        ("whole", "/metrics".to_owned(), 3),
        ("node", format!("/metrics?node={node}"), 200),
        ("shard", "/metrics?shard=0&shards=16".to_owned(), 10),
        ("fleet", "/metrics/fleet".to_owned(), 50),
        ("targets", "/api/v1/targets".to_owned(), 10),
    ] {
        out.insert(key.into(), scrape_cost(http, pid, &path, times)?);
    }
    Ok(Value::Object(out))
}

/// `path` `times` times: its size, the collector's CPU per scrape and the median wall time.
fn scrape_cost(http: SocketAddr, pid: i32, path: &str, times: u32) -> anyhow::Result<Value> {
    let (mut wall, mut bytes) = (Vec::new(), 0);
    let before = cpu_ticks(pid)?.total();
    for _ in 0..times {
        let started = Instant::now();
        let (status, body) = http_get(http, path)?;
        wall.push(started.elapsed().as_secs_f64());
        if status != 200 {
            bail!("GET {path}: status {status}");
        }
        bytes = body.len();
    }
    thread::sleep(Duration::from_millis(100));
    let cpu = (cpu_ticks(pid)?.total() - before) as f64 / clock_ticks_per_second();
    Ok(json!({
        "path": path,
        "bytes": bytes,
        "scrapes": times,
        "cpu_s": cpu / f64::from(times),
        "wall_s": median(&wall),
    }))
}

/// Adds the goals, judged, to the report.
fn with_goals(mut r: Value) -> Value {
    let d = &r["detection"];
    let event_p99 = ["port_down", "xid_79"]
        .iter()
        .map(|k| {
            if d[k]["missed"].as_array().is_some_and(|m| !m.is_empty()) {
                f64::INFINITY
            } else {
                f64_of(&d[k]["p99_s"])
            }
        })
        .fold(f64::NAN, f64::max);
    let straggler = &d["slow_gpu"];
    let straggler_max = if straggler["missed"]
        .as_array()
        .is_some_and(|m| !m.is_empty())
    {
        f64::INFINITY
    } else {
        f64_of(&straggler["max_s"])
    };
    // Judged only where every onset came at least STRAGGLER_JUDGED_FROM_S after the fleet
    // started: a GPU slow since t into the run is far in 75% of its steps only d >= 3t after
    // it slowed (its steps since the start), 90 s at t = 30 s, so the onset test (its latest
    // two steps far, ~20 s) is what flags it, as in a fleet whose history is longer than the
    // window. An onset in the first seconds would be flagged sooner than the rule allows.
    let window_full = r["faults_onset_ticks"]["slow_gpu"]
        .as_array()
        .is_some_and(|t| t.iter().all(|t| u64_of(t) >= STRAGGLER_JUDGED_FROM_S));
    let tick_max = f64_of(&r["collector"]["findings_tick_max_s"]);
    // The job view's goal is for a 1,024-node job: judged where the run had one.
    let job_view_s = f64_of(&r["job_view"]["page_ms"]) / 1e3;
    let job_view_judged = u64_of(&r["job_view"]["nodes"]) >= 1024;
    let lost = f64_of(&r["collector"]["datagrams_lost"]);
    let finite = |v: f64| if v.is_finite() { json!(v) } else { Value::Null };
    r["goals"] = json!({
        "port_down_or_xid_finding_p99_s": { "goal": GOAL_EVENT_FINDING_P99_S, "value": finite(event_p99), "met": event_p99 <= GOAL_EVENT_FINDING_P99_S },
        "straggler_flagged_s": { "goal": GOAL_STRAGGLER_S, "value": finite(straggler_max), "judged": window_full, "met": if window_full { json!(straggler_max <= GOAL_STRAGGLER_S) } else { Value::Null } },
        "findings_tick_s": { "goal": GOAL_FINDINGS_TICK_S, "value": tick_max, "met": tick_max < GOAL_FINDINGS_TICK_S },
        "nothing_lost": { "value": lost, "met": lost == 0.0 },
        "job_view_s": {
            "goal": GOAL_JOB_VIEW_S,
            "value": job_view_s,
            "judged": job_view_judged,
            "met": if job_view_judged { json!(job_view_s < GOAL_JOB_VIEW_S) } else { Value::Null },
        },
    });
    r
}

fn markdown(r: &Value) -> String {
    let c = &r["collector"];
    let f = &r["fleet"];
    let g = &r["goals"];
    let met = |v: &Value| match &v["met"] {
        Value::Bool(true) => "met",
        Value::Null => "not judged: an onset within the first 30 s of the run (below)",
        _ => "**not met**",
    };
    let ms = |v: &Value| fmt(v, 1);
    let mut s =
        String::from("# Fleet bench: one collector, a simulated fleet of real agents' frames\n\n");
    s += &format!(
        "Command: `{}`  \nDate: {}; machine: {} ({} cores, shared with other work: load average at the end {}).\n\n",
        r["command"].as_str().unwrap_or_default(),
        r["date"].as_str().unwrap_or_default(),
        r["machine"]["cpu"].as_str().unwrap_or_default(),
        r["machine"]["cores"],
        r["machine"]["loadavg_at_end"].as_str().unwrap_or_default(),
    );
    s += &format!(
        "{} simulated nodes ({} GPUs, {} IB ports; `monitor_testkit::SimulatedFleet` with the agent's own adaptive sampler: stable series every ~32 s, out of phase, gauges as envelopes, events at once; each node flushing every 10 s at its own second), 1 s reads, {} jobs of {}-{} nodes (`job_id` on the GPU series), for {} s, sent over loopback to a release `railscope-collector run` that remote-writes to a fresh VictoriaMetrics ({}). Making a second of this fleet takes longer than a second here, so every second's frames were made first ({:.0} s), stamped from the time sending would start, then each second's frames were sent during that second (sending started {:.2} s late, the worst second {:.2} s late).\n\n",
        f["nodes"],
        f["gpus"],
        f["ports"],
        f["jobs"].as_array().map_or(0, Vec::len),
        f["jobs"]
            .as_array()
            .and_then(|j| j.iter().map(|j| u64_of(&j["nodes"])).min())
            .unwrap_or(0),
        f["jobs"]
            .as_array()
            .and_then(|j| j.iter().map(|j| u64_of(&j["nodes"])).max())
            .unwrap_or(0),
        f["seconds"],
        r["victoria_metrics"]["version"]
            .as_str()
            .unwrap_or_default(),
        f64_of(&f["generate_s"]),
        f64_of(&f["send"]["started_late_s"]),
        f64_of(&f["send"]["worst_tick_late_s"]),
    );
    if u64_of(&f["nodes"]) < DEFAULT_NODES as u64 {
        let per_node_tick = f64_of(&f["seconds_per_tick"]) / f64_of(&f["nodes"]).max(1.0);
        s += &format!(
            "**Reduced**: {} nodes instead of the issue's {DEFAULT_NODES}. Making the frames takes about {:.0} µs per node and second here, so {DEFAULT_NODES} nodes over 180 s would take about {:.0} min before sending starts (and about {:.1} GB of frames held). Per-sample and per-node figures carry over; the findings tick, the straggler search and the read path's answers grow with the fleet (see the notes below each).\n\n",
            f["nodes"],
            per_node_tick * 1e6,
            per_node_tick * DEFAULT_NODES as f64 * 180.0 / 60.0,
            f64_of(&f["bytes"]) / f64_of(&f["nodes"]).max(1.0) / f64_of(&f["seconds"]).max(1.0)
                * DEFAULT_NODES as f64
                * 180.0
                / 1e9,
        );
    }
    s += "## Goals\n\n| goal | value | |\n|---|---|---|\n";
    s += &format!(
        "| a port going down or an XID: its finding within 1 s of the node's timestamp, p99 | {} s | {} |\n",
        fmt(&g["port_down_or_xid_finding_p99_s"]["value"], 2),
        met(&g["port_down_or_xid_finding_p99_s"])
    );
    s += &format!(
        "| a GPU slowing down: flagged a straggler within 30 s | {} s (worst) | {} |\n",
        fmt(&g["straggler_flagged_s"]["value"], 1),
        met(&g["straggler_flagged_s"])
    );
    s += &format!(
        "| findings tick under 1 s | {} s (longest of {}) | {} |\n",
        fmt(&g["findings_tick_s"]["value"], 3),
        c["findings_ticks"],
        met(&g["findings_tick_s"])
    );
    let jv = &r["job_view"];
    s += &format!(
        "| the job view of a 1,024-node job under 1 s (here its largest, {} nodes: stragglers {} ms, GPUs {} ms, findings {} ms, then ports {} ms) | {} s | {} |\n",
        jv["nodes"],
        fmt(&jv["stragglers_ms"], 0),
        fmt(&jv["gpus_ms"], 0),
        fmt(&jv["findings_ms"], 0),
        fmt(&jv["ports_ms"], 0),
        fmt(&g["job_view_s"]["value"], 2),
        match &g["job_view_s"]["met"] {
            Value::Bool(true) => "met",
            Value::Null => "not judged: the run's largest job is under 1,024 nodes",
            _ => "**not met**",
        }
    );
    s += &format!(
        "| nothing lost below saturation | {} datagrams lost | {} |\n\n",
        fmt(&g["nothing_lost"]["value"], 0),
        met(&g["nothing_lost"])
    );
    s += "A goal whose faults were not all detected within the run and 30 s after it is not met (no value).\n\n";
    s += "## Time to detect\n\nFrom the fault's own timestamp (the time the node stamped its event or sample with) to the poll that first saw its finding (`/api/v1/findings?active=true`, every 100 ms) or its straggler (`/api/v1/stragglers`, every job over its default 5-minute window, one request after the other).\n\n| fault | injected | detected | p50 (s) | p99 (s) | max (s) | by |\n|---|---|---|---|---|---|---|\n";
    for (kind, d) in r["detection"].as_object().into_iter().flatten() {
        s += &format!(
            "| {kind} | {} | {} | {} | {} | {} | {} |\n",
            d["faults"],
            d["detected"],
            fmt(&d["p50_s"], 2),
            fmt(&d["p99_s"], 2),
            fmt(&d["max_s"], 2),
            d["by"]
                .as_object()
                .map(|b| b
                    .iter()
                    .map(|(k, v)| format!("`{k}` {v}"))
                    .collect::<Vec<_>>()
                    .join(", "))
                .unwrap_or_default(),
        );
    }
    s += "\nWhere the time goes:\n\n\
        - **A port going down**: an event rule (`ib_port_down`) opens its finding from the node's DOWN transition (its port event, sent at once) in the event pass within 100 ms of the event's arrival, as for an XID; `ib_link_downed` (the counter, next flush and findings tick) and `ib_phys_state` (after its 25 s grace) follow. The finding says `\"upstream\": \"pending\"` for `fabric-settle-s` (5 s), until the DOWN is judged its node's or a switch's: the actions wait that long, the finding does not.\n\
        - **XID 79**: an event rule (`gpu_xid`), evaluated within 100 ms of the event's arrival: the time is the poll's and the event pass's. The event rules run on a thread of their own (`findings`), the series rules' tick on another (`findings-tick`), so an event arriving during a tick is not held back by it.\n\
        - **A port trained down to 2X**: a gauge rule (`ib_port_degraded`) or its symbol errors (`ib_symbol_errors`), seen at the first findings tick after the node's next flush.\n\
        - **A GPU slowing down**: the straggler search reads the steps the collector kept at ingest of what the node flushed (every 10 s), over its default 5-minute window (from the step it begins in; the archive for a node the live table cannot vouch for), and flags a device far from its job's median in its latest two 10 s steps (an onset), or in at least 75% of the steps it is scored at. Its time is the node's next flush (up to 10 s), the two far steps (the first may be partly slow), and the poll's turn. Every onset here came 40 s or more into the run, when the 75% rule would need three times as long since the onset: the onset test flagged them, as it would in a fleet whose history is longer than the window.\n";
    s += "\n## The collector\n\n| | |\n|---|---|\n";
    s += &format!(
        "| samples accepted | {} ({} a second) in {} frames; {} datagrams lost |\n",
        fmt(&c["samples_accepted"], 0),
        fmt(&c["samples_per_s"], 0),
        fmt(&c["frames_accepted"], 0),
        fmt(&c["datagrams_lost"], 0)
    );
    s += &format!(
        "| CPU over the run | {} s: {} ns per sample; without the HTTP answers (the polls) and the remote-write, {} ns per sample |\n",
        fmt(&c["cpu_s"], 1),
        fmt(&c["cpu_ns_per_sample"], 0),
        fmt(&c["ingest_cpu_ns_per_sample"], 0)
    );
    s += &format!(
        "| CPU by thread (s) | {} |\n",
        c["cpu_by_thread_s"]
            .as_object()
            .map(|m| m
                .iter()
                .map(|(k, v)| format!("{k} {}", fmt(v, 1)))
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default()
    );
    s += &format!(
        "| RSS idle (fixed cost) / at the end / peak | {} / {} / {} MiB |\n",
        fmt(&json!(f64_of(&c["rss_idle_kb"]) / 1024.0), 1),
        fmt(&json!(f64_of(&c["rss_kb"]) / 1024.0), 1),
        fmt(&json!(f64_of(&c["rss_peak_kb"]) / 1024.0), 1)
    );
    s += &format!(
        "| RSS per node | {} kB ({} nodes held) |\n",
        fmt(&c["rss_per_node_kb"], 1),
        fmt(&c["nodes_held"], 0)
    );
    s += &format!(
        "| findings tick (`railscope_collector_findings_tick_seconds`) | mean {} s, longest {} s, {} ticks |\n",
        fmt(&c["findings_tick_mean_s"], 3),
        fmt(&c["findings_tick_max_s"], 3),
        c["findings_ticks"]
    );
    s += &format!(
        "| straggler search (`/api/v1/stragglers`, every job, 5 min window) | median {} s, longest {} s, {} searches |\n",
        fmt(&c["straggler_pass_median_s"], 2),
        fmt(&c["straggler_pass_max_s"], 2),
        c["straggler_passes"]
    );
    s += &format!(
        "| the jobs view's straggler search (every job, the page's window: 5 min ending on a 10 s step) | {} ms |\n",
        fmt(&r["job_view"]["jobs_view_stragglers_ms"], 0)
    );
    s += &format!(
        "| segments sealed during the run | {} |\n",
        fmt(&c["segments_sealed"], 0)
    );
    let m = &c["metrics_scrape"];
    for (key, what) in [
        ("whole", "`/metrics` at this scale (every node)"),
        ("node", "one node's target"),
        ("shard", "one shard of 16"),
        ("fleet", "the fleet-level target"),
        ("targets", "the target list (http_sd)"),
    ] {
        let t = &m[key];
        s += &format!(
            "| {what}: `{}` | {:.3} MB, {} CPU s (mean of {}) and {} s per scrape |\n",
            t["path"].as_str().unwrap_or_default(),
            f64_of(&t["bytes"]) / 1e6,
            fmt(&t["cpu_s"], 4),
            t["scrapes"],
            fmt(&t["wall_s"], 4)
        );
    }
    // What a Prometheus scraping 12,500 node targets every 15 s asks of the collector, from
    // one node's target here (a node's target does not grow with the fleet).
    let node = &m["node"];
    s += &format!(
        "| 12,500 node targets every 15 s (from one node's target) | {:.2} CPU s a second, {:.1} MB a second |\n",
        f64_of(&node["cpu_s"]) * 12_500.0 / 15.0,
        f64_of(&node["bytes"]) * 12_500.0 / 15.0 / 1e6,
    );
    s += &format!(
        "| remote-write caught up | {} s after the run; VictoriaMetrics' ingest CPU over the run: {} s |\n\n",
        fmt(&c["remote_write_caught_up_s"], 1),
        fmt(&r["victoria_metrics"]["ingest_cpu_s"], 1)
    );
    s += "## Read path, side by side with VictoriaMetrics (same samples, same run)\n\nMedian of 5, ms, through each one's HTTP API, after the remote-write caught up and VictoriaMetrics flushed.\n\n| question | railscope (ms) | points | VictoriaMetrics (ms) | points | ratio | VictoriaMetrics asked as |\n|---|---|---|---|---|---|---|\n";
    for q in r["read_path"]["questions"].as_array().into_iter().flatten() {
        s += &format!(
            "| {} | {} | {} | {} | {} | {}x | {} |\n",
            q["question"].as_str().unwrap_or_default(),
            ms(&q["railscope"]["ms"]),
            q["railscope"]["points"],
            ms(&q["victoria_metrics"]["ms"]),
            q["victoria_metrics"]["points"],
            fmt(&q["ratio"], 1),
            q["victoria_metrics_how"].as_str().unwrap_or_default(),
        );
    }
    s += &format!(
        "\nrailscope: `/api/v1/series` (a counter's points carry `rate`), `/api/v1/live/latest` for the latest values (from the live table: {} metrics asked at once). The machine is shared with other work: wall-clock figures are noisy; compare the two columns, measured in the same minute, rather than across runs.\n",
        r["read_path"]["gpu_metrics"].as_array().map_or(0, Vec::len)
    );
    s
}
