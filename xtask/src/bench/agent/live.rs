//! One interval measured live: the fixture writer, the agent sending to `railscope listen`,
//! the read floors and node_exporter scraped as Prometheus would.

use std::{
    collections::BTreeSet,
    fs,
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use serde::Serialize;
use serde_json::{Value, json};

use crate::setup::{self};

use super::{http::*, *};

/// One subject measured at one interval.
#[derive(Debug, Clone)]
pub(super) struct Subject {
    pub(super) name: &'static str,
    pub(super) what: &'static str,
    pub(super) cost: Cost,
    /// What it sent or what was scraped from it.
    pub(super) traffic: Value,
}

#[derive(Debug, Clone)]
pub(super) struct LiveConfig {
    pub(super) interval: f64,
    pub(super) subjects: Vec<Subject>,
    pub(super) fixture_cpu_pct: f64,
    pub(super) standin_script: Value,
}

impl LiveConfig {
    pub(super) fn subject(&self, name: &str) -> Option<&Subject> {
        self.subjects.iter().find(|s| s.name == name)
    }
}

/// Where the moving fixture tree lives: on tmpfs (`/dev/shm`) where there is one, because
/// sysfs is in memory too — on a disk file system every read would also update the file's
/// access time in the journal, a cost no real node has. Elsewhere, under `dir` (the
/// interval's work directory).
pub(super) fn tree_dir(dir: &Path, interval: f64) -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.join(format!("railscope-bench-{}", slug(interval)))
    } else {
        dir.join("sys")
    }
}

pub(super) fn live_config(ctx: &Ctx, interval: f64) -> anyhow::Result<LiveConfig> {
    let dir = ctx.work.join(format!("live-{}", slug(interval)));
    fs::create_dir_all(&dir)?;
    let steps = ((warmup(interval) + ctx.duration).as_secs_f64() / interval).ceil() as usize + 300;
    let script = run_json(
        Command::new(&ctx.example)
            .args(["gpu-script", "--dir"])
            .arg(dir.join("nvml"))
            .arg("--standin")
            .arg(&ctx.standin)
            .args(["--steps", &steps.to_string()])
            .args(["--interval", &interval.to_string()]),
    )?;
    let lib = PathBuf::from(
        script["lib"]
            .as_str()
            .context("gpu-script printed no lib")?,
    );
    let tree = tree_dir(&dir, interval);
    setup::step(&format!(
        "{}: starting the fixture writer (8 ports, counters moving 10 times a second)",
        label(interval)
    ));
    let (mut writer, _) = Proc::spawn_ready(
        "fixture",
        Command::new(&ctx.example)
            .args(["fixture", "--dir"])
            .arg(&tree)
            .stdin(Stdio::piped()),
        &dir,
    )?;
    let writer_t0 = (Instant::now(), cpu_ticks(writer.pid())?.total());

    let mut subjects = Vec::new();
    for (name, what, gpu) in [
        ("railscope", "railscope agent: IB + 8 GPUs (stand-in)", true),
        ("railscope-ib", "railscope agent: IB only (--no-gpu)", false),
    ] {
        setup::step(&format!(
            "{}: {what}, {:.0?} warm-up + {:.0?} measured",
            label(interval),
            warmup(interval),
            ctx.duration
        ));
        subjects.push(railscope_run(
            ctx,
            &dir,
            &tree,
            interval,
            gpu.then_some(&*lib),
            name,
            what,
        )?);
    }
    setup::step(&format!(
        "{}: node_exporter (infiniband collector) scraped every {}, {:.0?} warm-up + {:.0?} measured",
        label(interval),
        label(interval),
        warmup(interval),
        ctx.duration
    ));
    subjects.push(node_exporter_run(ctx, &dir, &tree, interval)?);
    for floor in FLOORS {
        setup::step(&format!(
            "{}: the read floor, {}, {:.0?} warm-up + {:.0?} measured",
            label(interval),
            floor.what,
            warmup(interval),
            ctx.duration
        ));
        subjects.push(read_floor_run(ctx, &dir, &tree, interval, floor)?);
    }

    let writer_cpu =
        (cpu_ticks(writer.pid())?.total() - writer_t0.1) as f64 / clock_ticks_per_second();
    let fixture_cpu_pct = 100.0 * writer_cpu / writer_t0.0.elapsed().as_secs_f64();
    drop(writer.child.stdin.take()); // the writer exits when its stdin closes
    writer.stop(libc::SIGTERM, Duration::from_secs(5))?;
    let _ = fs::remove_dir_all(&tree);
    for s in &subjects {
        eprintln!(
            "    {:14} CPU {:6.3} % of a core, peak RSS {:5.1} MB",
            s.name,
            s.cost.cpu_pct(),
            s.cost.hwm_mb()
        );
    }
    Ok(LiveConfig {
        interval,
        subjects,
        fixture_cpu_pct,
        standin_script: script,
    })
}

pub(super) fn railscope_run(
    ctx: &Ctx,
    dir: &Path,
    tree: &Path,
    interval: f64,
    nvml_lib: Option<&Path>,
    name: &'static str,
    what: &'static str,
) -> anyhow::Result<Subject> {
    let port = free_udp_port()?;
    let frames_path = dir.join(format!("{name}-listen.jsonl"));
    let mut listener = Proc::spawn(
        &format!("{name}-listen"),
        Command::new(&ctx.railscope)
            .args([
                "listen",
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--key",
            ])
            .arg(&ctx.key)
            .arg("--json"),
        dir,
        Some(fs::File::create(&frames_path)?.into()),
    )?;
    thread::sleep(Duration::from_millis(300));
    let rcvbuf_errors = udp_counter("RcvbufErrors");
    let mut cmd = Command::new(&ctx.railscope);
    cmd.args([
        "agent",
        "--collector",
        &format!("127.0.0.1:{port}"),
        "--key",
    ])
    .arg(&ctx.key)
    .arg("--spool-dir")
    .arg(dir.join(format!("{name}-spool")))
    .args(["--node", NODE, "--sysfs"])
    .arg(tree)
    .args(["--interval", &interval.to_string()])
    .env("NO_COLOR", "1");
    match nvml_lib {
        Some(lib) => cmd.arg("--nvml-lib").arg(lib),
        None => cmd.arg("--no-gpu"),
    };
    let mut agent = Proc::spawn(name, &mut cmd, dir, None)?;
    let cost = measure(&mut agent, warmup(interval), ctx.duration)?;
    let status = agent.stop(libc::SIGINT, Duration::from_secs(15))?;
    thread::sleep(Duration::from_millis(500));
    listener.stop(libc::SIGINT, Duration::from_secs(5))?;
    let log = fs::read_to_string(dir.join(format!("{name}.err"))).unwrap_or_default();
    let mut traffic = frames_summary(&fs::read_to_string(&frames_path)?, cost.from_ns, cost.to_ns);
    traffic["agent_exit"] = status.to_string().into();
    traffic["udp_rcvbuf_errors"] = rcvbuf_errors
        .zip(udp_counter("RcvbufErrors"))
        .map(|(a, b)| b.saturating_sub(a))
        .into();
    traffic["probes_unavailable"] = log.contains("unavailable").into();
    traffic["agent_sent_line"] = log
        .lines()
        .find(|l| l.contains("sent ") && l.contains("frames"))
        .map(|l| {
            l.split_once("monitor_user::agent: ")
                .map_or(l, |(_, m)| m)
                .to_owned()
        })
        .into();
    if !status.success() {
        bail!(
            "{name} exited with {status}; see {}",
            dir.join(format!("{name}.err")).display()
        );
    }
    Ok(Subject {
        name,
        what,
        cost,
        traffic,
    })
}

/// A process that only reads the tree's files (`agent_bench read-floor`): the least CPU any
/// agent reading those files that often can cost on this machine.
#[derive(Clone, Copy)]
pub(super) struct Floor {
    pub(super) name: &'static str,
    pub(super) what: &'static str,
    pub(super) files: &'static str,
    pub(super) every: usize,
}

pub(super) const FLOORS: [Floor; 2] = [
    Floor {
        name: "floor-railscope",
        what: "reads alone: railscope's 416 IB files, each every 2nd interval",
        files: "railscope",
        every: 2,
    },
    Floor {
        name: "floor-node-exporter",
        what: "reads alone: node_exporter's 200 IB files, each every interval",
        files: "node-exporter",
        every: 1,
    },
];

pub(super) fn is_floor(name: &str) -> bool {
    FLOORS.iter().any(|f| f.name == name)
}

pub(super) fn read_floor_run(
    ctx: &Ctx,
    dir: &Path,
    tree: &Path,
    interval: f64,
    floor: Floor,
) -> anyhow::Result<Subject> {
    let (mut proc, ready) = Proc::spawn_ready(
        floor.name,
        Command::new(&ctx.example)
            .args(["read-floor", "--sysfs"])
            .arg(tree)
            .args(["--files", floor.files])
            .args(["--interval", &interval.to_string()])
            .args(["--every", &floor.every.to_string()]),
        dir,
    )?;
    let cost = measure(&mut proc, warmup(interval), ctx.duration)?;
    proc.stop(libc::SIGTERM, Duration::from_secs(5))?;
    Ok(Subject {
        name: floor.name,
        what: floor.what,
        cost,
        traffic: ready,
    })
}

/// What `railscope listen --json` printed: frames, bytes, samples; and the bytes of the
/// frames sent during the measured window.
pub(super) fn frames_summary(jsonl: &str, from_ns: u64, to_ns: u64) -> Value {
    let (mut frames, mut bytes, mut samples, mut lost) = (0u64, 0u64, 0u64, 0u64);
    let (mut window_frames, mut window_bytes) = (0u64, 0u64);
    let mut ib = BTreeSet::new();
    let mut gpu = BTreeSet::new();
    for frame in jsonl
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
    {
        let b = frame["bytes"].as_u64().unwrap_or(0);
        frames += 1;
        bytes += b;
        lost += frame["lost_before"].as_u64().unwrap_or(0);
        let sent = frame["send_unix_ns"].as_u64().unwrap_or(0);
        if (from_ns..to_ns).contains(&sent) {
            window_frames += 1;
            window_bytes += b;
        }
        for s in frame["samples"].as_array().into_iter().flatten() {
            samples += s["points"].as_array().map_or(0, |p| p.len() as u64);
            let series = format!("{}{}", s["name"].as_str().unwrap_or("?"), s["labels"]);
            if series.starts_with("railscope_ib_") {
                ib.insert(series);
            } else if series.starts_with("railscope_gpu_") {
                gpu.insert(series);
            }
        }
    }
    let window_s = (to_ns.saturating_sub(from_ns)) as f64 / 1e9;
    let summary = FramesSummary {
        frames,
        bytes,
        samples,
        lost_frames: lost,
        ib_series: ib.len(),
        gpu_series: gpu.len(),
        window_frames,
        window_bytes,
        bytes_per_second: window_bytes as f64 / window_s.max(1e-9),
    };
    // A subject's traffic is an object either way (the read floor's and node_exporter's come
    // from their own JSON), extended with fields of the run below.
    serde_json::to_value(summary).expect("a struct of numbers serialises")
}

/// What the collector received from one agent run.
#[derive(Serialize)]
pub(super) struct FramesSummary {
    pub(super) frames: u64,
    pub(super) bytes: u64,
    pub(super) samples: u64,
    pub(super) lost_frames: u64,
    pub(super) ib_series: usize,
    pub(super) gpu_series: usize,
    pub(super) window_frames: u64,
    pub(super) window_bytes: u64,
    pub(super) bytes_per_second: f64,
}

pub(super) fn node_exporter_run(
    ctx: &Ctx,
    dir: &Path,
    tree: &Path,
    interval: f64,
) -> anyhow::Result<Subject> {
    let port = free_tcp_port()?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut ne = Proc::spawn(
        "node_exporter",
        Command::new(NODE_EXPORTER)
            .arg("--path.sysfs")
            .arg(tree)
            .args([
                "--collector.disable-defaults",
                "--collector.infiniband",
                "--web.disable-exporter-metrics",
                "--web.listen-address",
                &addr.to_string(),
            ]),
        dir,
        None,
    )?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(addr).is_err() {
        if Instant::now() > deadline || !ne.alive() {
            bail!(
                "node_exporter did not listen on {addr}; see {}",
                dir.join("node_exporter.err").display()
            );
        }
        thread::sleep(Duration::from_millis(50));
    }
    let before = check_scrape(addr)?;
    // A comparison with an exporter that read nothing would flatter railscope: refuse it.
    if before["collector_success"].as_f64() != Some(1.0)
        || before["infiniband_samples"].as_u64().unwrap_or(0) == 0
    {
        ne.stop(libc::SIGTERM, Duration::from_secs(5))?;
        bail!(
            "node_exporter's infiniband collector failed on the fixture tree ({before}); see {}",
            dir.join("node_exporter.err").display()
        );
    }
    let stats = Arc::new(Mutex::new(Vec::<(Instant, usize, usize)>::new()));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let scraper = {
        let (stats, errors, stop) = (stats.clone(), errors.clone(), stop.clone());
        let every = Duration::from_secs_f64(interval);
        thread::spawn(move || scrape_loop(addr, every, &stop, &stats, &errors))
    };
    let cost = measure(&mut ne, warmup(interval), ctx.duration);
    stop.store(true, Ordering::Relaxed);
    let _ = scraper.join();
    let cost = cost?;
    let after = check_scrape(addr)?;
    ne.stop(libc::SIGTERM, Duration::from_secs(5))?;

    let stats = stats.lock().expect("scraper finished").clone();
    let in_window: Vec<&(Instant, usize, usize)> = stats
        .iter()
        .filter(|s| {
            cost.window
                .is_some_and(|(from, to)| s.0 >= from && s.0 < to)
        })
        .collect();
    let scrapes = in_window.len() as u64;
    let wire: u64 = in_window.iter().map(|s| s.1 as u64).sum();
    let body: u64 = in_window.iter().map(|s| s.2 as u64).sum();
    let errors = errors.lock().expect("scraper finished").clone();
    let moved = match (
        before["tx_bytes_mlx5_0"].as_f64(),
        after["tx_bytes_mlx5_0"].as_f64(),
    ) {
        (Some(a), Some(b)) => Some(b > a),
        _ => None,
    };
    Ok(Subject {
        name: "node_exporter",
        what: "prometheus-node-exporter, infiniband collector only",
        cost: cost.clone(),
        traffic: json!({
            "scrapes_in_window": scrapes,
            "scrapes_expected": (cost.window_s / interval).round(),
            "scrape_errors": errors.len(),
            "first_errors": errors.iter().take(3).collect::<Vec<_>>(),
            "gzip_bytes_per_scrape": wire as f64 / scrapes.max(1) as f64,
            "bytes_per_second": wire as f64 / cost.window_s.max(1e-9),
            "body_bytes_per_scrape": body as f64 / scrapes.max(1) as f64,
            "check_before": before,
            "check_after": after,
            "counters_moved": moved,
        }),
    })
}

/// Scrapes `addr` every `every` until `stop`, as Prometheus does: one keep-alive connection,
/// gzip accepted, a missed slot skipped rather than caught up.
pub(super) fn scrape_loop(
    addr: SocketAddr,
    every: Duration,
    stop: &AtomicBool,
    stats: &Mutex<Vec<(Instant, usize, usize)>>,
    errors: &Mutex<Vec<String>>,
) {
    let mut http = Http::new(addr, every.max(Duration::from_millis(100)));
    let start = Instant::now();
    let mut slot: u32 = 0;
    while !stop.load(Ordering::Relaxed) {
        let due = start + every * slot;
        thread::sleep(due.saturating_duration_since(Instant::now()));
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let t = Instant::now();
        match http.get(true) {
            Ok(r) if r.status == 200 => {
                stats
                    .lock()
                    .expect("stats")
                    .push((t, r.wire_bytes, r.body.len()));
            }
            Ok(r) => errors
                .lock()
                .expect("errors")
                .push(format!("HTTP {}", r.status)),
            Err(e) => errors.lock().expect("errors").push(e.to_string()),
        }
        let next = (start.elapsed().as_secs_f64() / every.as_secs_f64()).floor() as u32 + 1;
        slot = (slot + 1).max(next);
    }
}

/// One uncompressed scrape, to check what node_exporter reads: sample lines, IB sample
/// lines, whether the collector succeeded, and one data counter (to see the tree move).
pub(super) fn check_scrape(addr: SocketAddr) -> anyhow::Result<Value> {
    let r = Http::new(addr, Duration::from_secs(5)).get(false)?;
    let text = String::from_utf8_lossy(&r.body);
    let samples: Vec<&str> = text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let value = |prefix: &str| {
        samples
            .iter()
            .find_map(|l| l.strip_prefix(prefix)?.trim().parse::<f64>().ok())
    };
    Ok(json!({
        "status": r.status,
        "samples": samples.len(),
        "infiniband_samples": samples.iter().filter(|l| l.starts_with("node_infiniband_")).count(),
        "collector_success": value("node_scrape_collector_success{collector=\"infiniband\"}"),
        "tx_bytes_mlx5_0": value("node_infiniband_port_data_transmitted_bytes_total{device=\"mlx5_0\",port=\"1\"}"),
        "body_bytes": r.body.len(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_the_frames_the_listener_printed() {
        let jsonl = concat!(
            r#"{"bytes":1000,"send_unix_ns":5,"lost_before":0,"samples":[{"name":"railscope_ib_x_total","labels":{"device":"mlx5_0"},"points":[1,2,3]},{"name":"railscope_gpu_power_watts","labels":{"gpu":"0"},"points":[1]}]}"#,
            "\n",
            r#"{"bytes":400,"send_unix_ns":50,"lost_before":1,"samples":[{"name":"railscope_ib_x_total","labels":{"device":"mlx5_0"},"points":[4]}]}"#,
            "\nnot json\n"
        );
        let s = frames_summary(jsonl, 10, 100);
        assert_eq!(s["frames"], 2);
        assert_eq!(s["bytes"], 1400);
        assert_eq!(s["samples"], 5);
        assert_eq!(s["lost_frames"], 1);
        assert_eq!(
            (s["ib_series"].clone(), s["gpu_series"].clone()),
            (json!(1), json!(1))
        );
        assert_eq!(s["window_bytes"], 400);
    }
}
