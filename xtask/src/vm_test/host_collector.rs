//! The host side of the guest scenarios `host-collector` and `collector-away`: before the
//! boot, VictoriaMetrics (the Debian binary, a fresh storage directory) and
//! `railscope-collector run` remote-writing to it, listening on the host's loopback, which the
//! guest reaches as 10.0.2.2 through QEMU's user network; after the guest powered off, once
//! remote-write has caught up, what VictoriaMetrics holds of the guest's node is compared
//! sample by sample with the collector's archive (its query API): every sample, times and
//! values exact, none twice, nothing else; and the collector saw no frame of the agent lost
//! (sequence numbers).
//!
//! During the boot the guest may stop the collector and start it again on the same data
//! directory and ports, as an upgrade does (`collector-away`): it asks over a TCP control
//! port ([`CONTROL_STOP`], [`CONTROL_START`], one line each, answered with one line once
//! done), so the outage falls exactly where the guest wants it.
//!
//! For `slurm-drain` (a boot of its own) the collector also acts: it drains node `guest` in
//! a Slurm cluster started on the host ([`host_slurm`](super::host_slurm)), and the check
//! after the boot reads the node back from Slurm.

use std::{
    collections::BTreeMap,
    fs,
    io::{BufRead as _, BufReader, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use serde_json::Value;

use super::host_slurm::SlurmHost;
use crate::{
    cargo,
    http::{encode, http_get, metric_sum, metrics_at, wait_http},
    scratch::{free_tcp_port, free_udp_port},
    setup::{self, Tools},
};

/// The guest scenario that checks the TSDB against the archive.
pub(crate) const SCENARIO: &str = "host-collector";

/// The guest scenario that flaps a link while the host's collector is stopped.
pub(crate) const AWAY_SCENARIO: &str = "collector-away";

/// The guest scenario whose flapping link drains the guest's node in Slurm.
pub(crate) const SLURM_SCENARIO: &str = "slurm-drain";

/// The guest scenarios this module serves: a boot running any of them gets the collector,
/// and each one's verdict includes the comparison after the boot.
pub(crate) const SCENARIOS: &[&str] = &[SCENARIO, AWAY_SCENARIO, SLURM_SCENARIO];

/// What the guest sends on the control port to have the collector stopped (SIGTERM, waited
/// for), and to have it started again; the answer is `ok` or `error: WHY`.
const CONTROL_STOP: &str = "stop";
const CONTROL_START: &str = "start";

/// The node name the guest's agent sends as.
const NODE: &str = "guest";

const VICTORIA_METRICS: &str = "/usr/bin/victoria-metrics";

/// A child killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How to start the collector: again and again on the same data directory and ports.
struct Launch {
    binary: PathBuf,
    secret: PathBuf,
    udp: u16,
    http: SocketAddr,
    vm: SocketAddr,
    dir: PathBuf,
    /// The `--config` with `[actions]` and the `SLURM_CONF` its `scontrol` uses, when the
    /// collector acts.
    actions: Option<(PathBuf, PathBuf)>,
}

impl Launch {
    /// Starts the collector and waits for its HTTP port. Each start appends to one log.
    fn start(&self) -> anyhow::Result<Running> {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("collector.log"))?;
        let mut cmd = Command::new(&self.binary);
        cmd.args(["run", "--listen", &format!("127.0.0.1:{}", self.udp)])
            .args(["--http", &self.http.to_string(), "--sockets", "1"])
            .arg("--fleet-secret")
            .arg(&self.secret)
            .arg("--data")
            .arg(self.dir.join("data"))
            .arg("--remote-write")
            .arg(format!("vm=http://{}/api/v1/write", self.vm));
        if let Some((config, slurm_conf)) = &self.actions {
            cmd.arg("--config")
                .arg(config)
                .env("SLURM_CONF", slurm_conf);
        }
        let child = cmd
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("starting {}", cargo::render(&cmd)))?;
        let running = Running(child);
        wait_http(self.http, Duration::from_secs(30))?;
        Ok(running)
    }
}

/// Stops the collector as systemd would for an upgrade (SIGTERM: it writes its cursor) and
/// waits for it to exit.
fn stop(mut running: Running) -> anyhow::Result<()> {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(running.0.id() as libc::pid_t, libc::SIGTERM) };
    running.0.wait()?;
    Ok(())
}

/// The collector while the control port may stop it: `None` while stopped.
type Collector = Arc<Mutex<Option<Running>>>;

/// The collector and VictoriaMetrics, running, and the guest's control port.
pub(crate) struct HostCollector {
    collector: Collector,
    launch: Arc<Launch>,
    victoria_metrics: Running,
    control: SocketAddr,
    control_done: Arc<AtomicBool>,
    udp: u16,
    http: SocketAddr,
    vm: SocketAddr,
    dir: PathBuf,
    /// The guest's own frame key, derived from the host's fleet secret.
    node_key_hex: String,
    /// The Slurm cluster the collector drains in (`slurm-drain`).
    slurm: Option<SlurmHost>,
}

/// The collector binary, built for the host (and put into the guest image for the
/// scenarios that run one there).
pub(crate) fn collector_binary(tools: &Tools) -> anyhow::Result<PathBuf> {
    setup::step("building railscope-collector");
    let mut cmd = cargo::command(tools);
    cmd.args(["build", "--release", "--package", "monitor-collector"])
        .args(["--bin", "railscope-collector"]);
    cargo::build_executables(cmd)?
        .into_iter()
        .find(|(name, _)| name == "railscope-collector")
        .map(|(_, p)| p)
        .context("cargo did not report railscope-collector")
}

fn spawn(name: &str, cmd: &mut Command, dir: &Path) -> anyhow::Result<Running> {
    let log = fs::File::create(dir.join(format!("{name}.log")))?;
    let child = cmd
        .stdout(Stdio::from(log.try_clone()?))
        .stderr(Stdio::from(log))
        .spawn()
        .with_context(|| format!("starting {}", cargo::render(cmd)))?;
    Ok(Running(child))
}

/// Starts the collector `binary` and VictoriaMetrics under `work_dir/host-collector`, and the
/// control port; with `slurm`, under `work_dir/host-slurm-drain`, with a Slurm cluster the
/// collector drains in.
pub(crate) fn start(binary: &Path, work_dir: &Path, slurm: bool) -> anyhow::Result<HostCollector> {
    let dir = work_dir.join(if slurm {
        "host-slurm-drain"
    } else {
        "host-collector"
    });
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    fs::create_dir_all(&dir)?;
    // Per-node keys, as a fleet runs them: a fresh fleet secret for the collector, and the
    // guest's own key derived from it by the collector's command, for the guest only.
    let secret = dir.join("fleet.secret");
    crate::scratch::write_random_key(&secret)?;
    let derived = Command::new(binary)
        .args(["node-key", "--node", NODE, "--fleet-secret"])
        .arg(&secret)
        .output()?;
    if !derived.status.success() {
        bail!(
            "railscope-collector node-key: {}",
            String::from_utf8_lossy(&derived.stderr)
        );
    }
    let node_key_hex = String::from_utf8(derived.stdout)?.trim().to_owned();

    let vm: SocketAddr = ([127, 0, 0, 1], free_tcp_port()?).into();
    let victoria_metrics = spawn(
        "victoria-metrics",
        Command::new(VICTORIA_METRICS)
            .arg(format!("-storageDataPath={}", dir.join("vm").display()))
            .arg(format!("-httpListenAddr={vm}"))
            .arg("-retentionPeriod=1y")
            // As docs/deployment.md says to run it: remote-write delivers at least once.
            .arg("-dedup.minScrapeInterval=1ms"),
        &dir,
    )?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !matches!(http_get(vm, "/health"), Ok((200, _))) {
        if Instant::now() > deadline {
            bail!(
                "VictoriaMetrics did not start: {}",
                dir.join("victoria-metrics.log").display()
            );
        }
        thread::sleep(Duration::from_millis(100));
    }
    let slurm = slurm.then(|| SlurmHost::start(&dir)).transpose()?;
    let launch = Arc::new(Launch {
        binary: binary.to_owned(),
        secret,
        udp: free_udp_port()?,
        http: ([127, 0, 0, 1], free_tcp_port()?).into(),
        vm,
        dir: dir.clone(),
        actions: slurm
            .as_ref()
            .map(|s| (s.collector_config().to_owned(), s.slurm_conf().to_owned())),
    });
    let collector = Arc::new(Mutex::new(Some(launch.start()?)));
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let control = listener.local_addr()?;
    let control_done = Arc::new(AtomicBool::new(false));
    {
        let (collector, launch, done) = (
            Arc::clone(&collector),
            Arc::clone(&launch),
            Arc::clone(&control_done),
        );
        thread::spawn(move || serve_control(&listener, &collector, &launch, &done));
    }
    Ok(HostCollector {
        collector,
        udp: launch.udp,
        http: launch.http,
        launch,
        victoria_metrics,
        control,
        control_done,
        vm,
        dir,
        node_key_hex,
        slurm,
    })
}

/// Answers the guest's control connections until `done`: each line [`CONTROL_STOP`] or
/// [`CONTROL_START`] is carried out, then answered.
fn serve_control(
    listener: &TcpListener,
    collector: &Collector,
    launch: &Launch,
    done: &AtomicBool,
) {
    if listener.set_nonblocking(true).is_err() {
        return;
    }
    while !done.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                if let Err(e) = control_session(stream, collector, launch) {
                    eprintln!("    host-collector control: {e:#}");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                eprintln!("    host-collector control: {e}");
                return;
            }
        }
    }
}

fn control_session(
    stream: TcpStream,
    collector: &Collector,
    launch: &Launch,
) -> anyhow::Result<()> {
    stream.set_nonblocking(false)?;
    let mut out = stream.try_clone()?;
    for line in BufReader::new(stream).lines() {
        let line = line?;
        let done = control(line.trim(), collector, launch);
        let answer = match &done {
            Ok(what) => {
                setup::step(&format!(
                    "host-collector: the guest had the collector {what}"
                ));
                "ok".to_owned()
            }
            Err(e) => format!("error: {e:#}"),
        };
        writeln!(out, "{answer}")?;
    }
    Ok(())
}

/// Carries out one control command; what was done.
fn control(command: &str, collector: &Collector, launch: &Launch) -> anyhow::Result<&'static str> {
    let mut held = collector.lock().expect("no panic while locked");
    match command {
        CONTROL_STOP => {
            let running = held.take().context("the collector is stopped already")?;
            stop(running)?;
            Ok("stopped")
        }
        CONTROL_START => {
            if held.is_some() {
                bail!("the collector is running already");
            }
            *held = Some(launch.start()?);
            Ok("started again on the same data directory")
        }
        other => {
            bail!("unknown control command {other:?} (expected {CONTROL_STOP} or {CONTROL_START})")
        }
    }
}

impl HostCollector {
    /// What the guest's kernel command line gets: where the collector, its HTTP API and the
    /// control port are, and the guest's own key (a test bed's throwaway secret).
    pub(crate) fn cmdline(&self) -> String {
        format!(
            "railscope.collector=10.0.2.2:{} railscope.collector_http=10.0.2.2:{} \
             railscope.collector_control=10.0.2.2:{} railscope.node_key={}",
            self.udp,
            self.http.port(),
            self.control.port(),
            self.node_key_hex
        )
    }

    /// Waits for remote-write to catch up, compares, stops both servers. A collector the
    /// guest left stopped (a scenario that failed half-way) is started again first, so the
    /// comparison still runs.
    pub(crate) fn verify(mut self) -> Result<(), String> {
        self.control_done.store(true, Ordering::Relaxed);
        let restarted = {
            let mut held = self.collector.lock().expect("no panic while locked");
            match held.as_ref() {
                Some(_) => Ok(()),
                None => self.launch.start().map(|r| *held = Some(r)),
            }
        };
        let result = restarted
            .and_then(|()| self.compare())
            .and_then(|()| match &self.slurm {
                Some(slurm) => slurm.check(self.http),
                None => Ok(()),
            })
            .map_err(|e| format!("{e:#}"));
        // SIGTERM: the collector writes its cursor and stops.
        if let Some(running) = self.collector.lock().expect("no panic while locked").take() {
            let _ = stop(running);
        }
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.victoria_metrics.0.id() as libc::pid_t, libc::SIGTERM) };
        let _ = self.victoria_metrics.0.wait();
        eprintln!("    host side logs: {}", self.dir.display());
        result
    }

    fn compare(&mut self) -> anyhow::Result<()> {
        // Remote-write caught up: nothing pending, nothing sent for 2 s.
        let started = Instant::now();
        let (mut last, mut since) = (f64::NAN, Instant::now());
        loop {
            let m = metrics_at(self.http, "/metrics/collector")?;
            let sent = metric_sum(&m, "railscope_collector_remote_write_samples_sent_total");
            let pending = metric_sum(&m, "railscope_collector_remote_write_samples_pending");
            if sent != last {
                (last, since) = (sent, Instant::now());
            }
            if pending == 0.0 && sent > 0.0 && since.elapsed() > Duration::from_secs(2) {
                break;
            }
            if started.elapsed() > Duration::from_secs(120) {
                bail!(
                    "remote-write did not catch up in 2 min ({sent} samples sent, {pending} pending)"
                );
            }
            thread::sleep(Duration::from_millis(200));
        }
        let all = metrics_at(self.http, "/metrics")?;
        let node = |name: &str| {
            all.get(&format!("{name}{{node=\"{NODE}\"}}"))
                .copied()
                .unwrap_or(f64::NAN)
        };
        let (frames, lost) = (
            node("railscope_collector_node_frames_total"),
            node("railscope_collector_node_frames_lost_total"),
        );
        if frames.is_nan() || frames <= 0.0 {
            bail!("no frame of node {NODE:?} reached the collector on the host");
        }
        if lost != 0.0 {
            bail!("the collector counted {lost} of the guest agent's frames lost (of {frames})");
        }
        // The guest sealed with its own key, and nothing was refused.
        let on_own_key = all
            .get("railscope_collector_nodes_by_key{key=\"node\"}")
            .copied();
        if on_own_key != Some(1.0) {
            bail!("the guest is not counted as on its own key: {on_own_key:?} nodes");
        }
        let refused: f64 = all
            .iter()
            .filter(|(k, _)| k.starts_with("railscope_collector_frames_dropped_total{"))
            .map(|(_, v)| v)
            .sum();
        if refused != 0.0 {
            bail!("the collector dropped {refused} datagrams of the guest's");
        }
        // The guest's metric names, from the archive (the live view of a collector that was
        // restarted knows only the series sent since).
        let node_match = encode(&format!("node={NODE}"));
        let path = format!("/api/v1/metric-names?match={node_match}&start=-1h");
        let (status, body) = http_get(self.http, &path)?;
        if status != 200 {
            bail!("GET {path}: {status} {body}");
        }
        let names: std::collections::BTreeSet<String> =
            serde_json::from_str::<Value>(&body)?["metrics"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|m| m["name"].as_str().map(str::to_owned))
                .collect();
        let mut expected = BTreeMap::new();
        for name in &names {
            let path = format!("/api/v1/series?metric={name}&match={node_match}&start=-1h");
            let (status, body) = http_get(self.http, &path)?;
            if status != 200 {
                bail!("GET {path}: {status} {body}");
            }
            let answer: Value = serde_json::from_str(&body)?;
            for s in answer["series"].as_array().into_iter().flatten() {
                archive_samples(s, &mut expected)?;
            }
        }
        let got = exported(self.vm)?;
        let mut seen: BTreeMap<&(String, i64), usize> = BTreeMap::new();
        let mut wrong = Vec::new();
        for (key, v) in &got {
            *seen.entry(key).or_default() += 1;
            match expected.get(key) {
                Some(e) if f64::to_bits(*e) == v.to_bits() => {}
                e => wrong.push(format!(
                    "{} @{}: {v} in the TSDB, {e:?} archived",
                    key.0, key.1
                )),
            }
        }
        let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).take(5).collect();
        let missing: Vec<_> = expected.keys().filter(|k| !seen.contains_key(k)).collect();
        eprintln!(
            "    host-collector: {} frames from the guest, none lost; {} samples archived ({} metrics), {} in VictoriaMetrics",
            frames,
            expected.len(),
            names.len(),
            got.len()
        );
        if expected.len() < 100 || !wrong.is_empty() || !twice.is_empty() || !missing.is_empty() {
            bail!(
                "{} samples archived, {} in the TSDB: {} wrong or extra (first: {:?}), {} twice (first: {twice:?}), {} missing (first: {:?})",
                expected.len(),
                got.len(),
                wrong.len(),
                wrong.iter().take(3).collect::<Vec<_>>(),
                twice.len(),
                missing.len(),
                missing.iter().take(3).collect::<Vec<_>>()
            );
        }
        Ok(())
    }
}

/// A series as `name{k=v,...}`, labels sorted.
fn canonical(name: &str, labels: &BTreeMap<String, String>) -> String {
    let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{name}{{{}}}", labels.join(","))
}

/// One series of the query API's answer as the TSDB must hold it (docs/deployment.md): a
/// counter as it is, a gauge's mean at the end of its period, and for a period also `_min`
/// and `_max`; times in ms.
fn archive_samples(s: &Value, out: &mut BTreeMap<(String, i64), f64>) -> anyhow::Result<()> {
    let name = s["metric"].as_str().context("metric")?;
    // A label with an empty value is no label in Prometheus' data model (the verb
    // counters' `detail=""`): the TSDB has none.
    let labels: BTreeMap<String, String> = s["labels"]
        .as_object()
        .context("labels")?
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
        .filter(|(_, v)| !v.is_empty())
        .collect();
    for p in s["points"].as_array().into_iter().flatten() {
        let ms = (p["t"].as_u64().context("t")? / 1_000_000) as i64;
        if s["kind"] == "counter" {
            let v = p["value"].as_u64().context("value")? as f64;
            out.insert((canonical(name, &labels), ms), v);
        } else {
            let (min, max, mean) = (
                p["min"].as_f64().context("min")?,
                p["max"].as_f64().context("max")?,
                p["mean"].as_f64().context("mean")?,
            );
            out.insert((canonical(name, &labels), ms), mean);
            if p["start"].as_u64() != p["t"].as_u64() || min != max {
                out.insert((canonical(&format!("{name}_min"), &labels), ms), min);
                out.insert((canonical(&format!("{name}_max"), &labels), ms), max);
            }
        }
    }
    Ok(())
}

/// Every sample VictoriaMetrics holds of the guest's node.
fn exported(vm: SocketAddr) -> anyhow::Result<Vec<((String, i64), f64)>> {
    http_get(vm, "/internal/force_flush")?;
    let selector = format!("{{node=\"{NODE}\"}}");
    let (status, body) = http_get(vm, &format!("/api/v1/export?match[]={}", encode(&selector)))?;
    if status != 200 {
        bail!("VictoriaMetrics export: {status} {body}");
    }
    let mut out = Vec::new();
    for line in body.lines().filter(|l| !l.is_empty()) {
        let series: Value = serde_json::from_str(line)?;
        let mut labels: BTreeMap<String, String> = series["metric"]
            .as_object()
            .context("metric")?
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
            .collect();
        let name = labels.remove("__name__").context("__name__")?;
        // The collector's findings (docs/findings.md) are its own, not the agent's samples.
        if name.starts_with("railscope_finding") {
            continue;
        }
        let key = canonical(&name, &labels);
        let values = series["values"].as_array().context("values")?;
        let times = series["timestamps"].as_array().context("timestamps")?;
        for (v, t) in values.iter().zip(times) {
            out.push((
                (key.clone(), t.as_i64().context("t")?),
                v.as_f64().context("v")?,
            ));
        }
    }
    Ok(out)
}
