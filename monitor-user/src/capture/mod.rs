//! `railscope capture`: a flight recorder of IB port events and port snapshots
//! (docs/capture-format.md).
//!
//! It runs as its own process, next to the agent if one runs: the probes attach a second
//! time (kprobes take several handlers on one function, each with its own ring buffer), so
//! neither depends on the other's lifetime, options or failures — a capture is started for
//! an hour on a suspect node and stopped with Ctrl-C without touching the daemon. The IB
//! sysfs source and the probe families are the agent's own code ([`crate::sources::ib_sysfs`],
//! `crate::probes::families` and its ring-buffer readers, `crate::probes::ring`).
//!
//! - `recorder`: the pre-trigger ring and which snapshots are written;
//! - `triggers`: what, between two snapshots, starts a recording window.

mod recorder;
mod triggers;

use std::{
    collections::BTreeSet,
    io::{IsTerminal as _, Write as _},
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use monitor_capture::{
    CaptureError, CaptureHeader, CaptureWriter, PortInfo, Trailer, format::key_hex,
};
use monitor_wire::{EncoderConfig, FrameEncoder, Key, Kind, Reading};
use tokio::sync::mpsc;

use crate::{
    cgroup::CgroupNames,
    kernel::Kernel,
    probes::{
        Family,
        decode::EventOrigin,
        families::{self, Families},
        ring::RingRecord,
    },
    sources::ib_sysfs::IbSysfs,
    stop_signals::StopSignals,
    time_base::TimeBase,
};
use recorder::{Recorder, Snapshot};
use triggers::TriggerWatch;

/// Snapshots are flushed to the file this often (and at each trigger).
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// Outside a triggered window, one snapshot in this long is written.
const BASELINE: Duration = Duration::from_secs(1);
/// The shortest snapshot interval.
pub const MIN_INTERVAL: Duration = Duration::from_millis(10);

/// What `railscope capture` was asked.
#[derive(Clone, Debug)]
pub struct CaptureOptions {
    pub out: PathBuf,
    /// `None`: every port present at the start.
    pub ports: Option<Vec<(String, u32)>>,
    pub duration: Option<Duration>,
    pub max_size: u64,
    pub interval: Duration,
    pub pre: Duration,
    pub post: Duration,
    /// Errors per second on one counter that trigger.
    pub error_rate: f64,
    pub sysfs_root: PathBuf,
    pub kernel: Kernel,
    pub host: String,
}

/// Why the capture ended.
#[derive(Debug)]
enum End {
    Interrupted,
    Duration,
    SizeCap,
    WriteFailed(String),
}

impl End {
    fn reason(&self) -> String {
        match self {
            End::Interrupted => "interrupted".into(),
            End::Duration => "duration".into(),
            End::SizeCap => "size cap".into(),
            End::WriteFailed(e) => format!("write failed: {e}"),
        }
    }
}

/// Parses `DEV/PORT,DEV/PORT,...`.
pub fn parse_ports(text: &str) -> anyhow::Result<Vec<(String, u32)>> {
    text.split(',')
        .map(|item| {
            let (dev, port) = item
                .split_once('/')
                .with_context(|| format!("--ports: {item:?} is not DEVICE/PORT (e.g. mlx5_0/1)"))?;
            let port = port
                .parse()
                .ok()
                .with_context(|| format!("--ports: {item:?}: port {port:?} is not a number"))?;
            Ok((dev.to_owned(), port))
        })
        .collect()
}

/// Parses a size: bytes, or with a `K`, `M`, `G` suffix (powers of 1024), e.g. `512M`.
pub fn parse_size(text: &str) -> anyhow::Result<u64> {
    let t = text.trim();
    let (digits, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => t.split_at(i),
        None => (t, ""),
    };
    let factor: u64 = match unit
        .trim()
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => bail!("--max-size: {text:?} is not a size (e.g. 512M, 2G)"),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(factor))
        .filter(|&n| n > 0)
        .with_context(|| format!("--max-size: {text:?} is not a size (e.g. 512M, 2G)"))
}

/// The output file's default name: `railscope-<host>-<UTC time>.rscap`.
pub fn default_out(host: &str, unix_ns: u64) -> PathBuf {
    let stamp = monitor_capture::report::utc_text(unix_ns)
        .replace(':', "-")
        .replace(".000Z", "Z");
    let stamp = stamp.split('.').next().unwrap_or(&stamp).to_owned();
    PathBuf::from(format!("railscope-{host}-{stamp}.rscap"))
}

/// Runs a capture until Ctrl-C, the duration or the size cap.
pub async fn run(options: CaptureOptions) -> anyhow::Result<()> {
    let mut stop = StopSignals::install()?;
    let clock = TimeBase::global();
    let mut sysfs = IbSysfs::new(options.sysfs_root.clone());
    let class = options.sysfs_root.join("class/infiniband");
    let links = sysfs.read_links().to_vec();
    if links.is_empty() {
        bail!(
            "no InfiniBand/RoCE port under {}: nothing to capture on this node",
            class.display()
        );
    }
    let selected: BTreeSet<(String, u32)> = match &options.ports {
        None => links.iter().map(|l| (l.device.clone(), l.port)).collect(),
        Some(wanted) => {
            for (dev, port) in wanted {
                if !links.iter().any(|l| &l.device == dev && l.port == *port) {
                    let present: Vec<String> = links
                        .iter()
                        .map(|l| format!("{}/{}", l.device, l.port))
                        .collect();
                    bail!(
                        "--ports: no port {dev}/{port} under {} (present: {})",
                        class.display(),
                        present.join(", ")
                    );
                }
            }
            wanted.iter().cloned().collect()
        }
    };
    let is_selected = |r: &Reading| {
        let l = &r.series.labels;
        match (
            l.get("device"),
            l.get("port").and_then(|p| p.parse::<u32>().ok()),
        ) {
            (Some(d), Some(p)) => selected.contains(&(d.to_owned(), p)),
            _ => false,
        }
    };
    let (started, first) = snapshot(&mut sysfs, clock, &is_selected);
    let counters: BTreeSet<String> = first
        .iter()
        .filter(|r| r.series.kind == Kind::Counter)
        .filter_map(|r| {
            r.series
                .name
                .strip_prefix(monitor_wire::names::metric::IB_PREFIX)
                .map(|n| n.trim_end_matches("_total").to_owned())
        })
        .collect();
    let key_bytes = frame_key(started);
    let header = CaptureHeader {
        railscope_version: env!("CARGO_PKG_VERSION").into(),
        host: options.host.clone(),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "unknown".into()),
        started_unix_ns: started,
        interval_ns: options.interval.as_nanos() as u64,
        pre_trigger_ns: options.pre.as_nanos() as u64,
        post_trigger_ns: options.post.as_nanos() as u64,
        baseline_ns: BASELINE.as_nanos() as u64,
        devices: sysfs.devices().map(str::to_owned).collect(),
        ports: links
            .iter()
            .filter(|l| selected.contains(&(l.device.clone(), l.port)))
            .map(|l| PortInfo {
                device: l.device.clone(),
                port: l.port,
                link_layer: l
                    .link_layer
                    .as_ref()
                    .map_or("unknown".into(), |ll| ll.as_str().to_owned()),
            })
            .collect(),
        counters: counters.into_iter().collect(),
        frame_key: key_hex(&key_bytes),
    };
    let file = std::fs::File::create(&options.out)
        .with_context(|| format!("creating {}", options.out.display()))?;
    let mut writer = CaptureWriter::new(file, &header, options.max_size)
        .with_context(|| format!("writing {}", options.out.display()))?;
    let mut config = EncoderConfig::new(options.host.clone());
    config.gauge_digits = None;
    config.forget_after = Duration::from_secs(7 * 24 * 3600);
    let mut encoder = FrameEncoder::new(config, Key::from_bytes(key_bytes))
        .context("the capture's frame encoder")?;

    let (records_tx, mut records_rx) = mpsc::channel::<RingRecord>(4096);
    let mut families = Families::start(
        options.kernel.clone(),
        families::kernel_attach(options.kernel.clone()),
        records_tx,
    );
    let mut cgroups = CgroupNames::new(options.kernel.sys_root().join("fs/cgroup"));
    // Recording starts once the probes' first attempts are in, so the start line can say
    // whether port events are seen.
    while !families.started() {
        let attempt = families.next_attempt().await;
        families.on_attempt(attempt);
    }
    let ports_text: Vec<String> = header
        .ports
        .iter()
        .map(|p| format!("{}/{}", p.device, p.port))
        .collect();
    let probes_text = match families.status(Family::IbCore) {
        Some(Ok(())) => "port events from the probes".to_owned(),
        Some(Err(reason)) => format!("NO port events (probes unavailable: {reason})"),
        None => "probes still attaching".to_owned(),
    };
    eprintln!(
        "capture: recording {} port(s) ({}) every {:?}, {probes_text}, to {}",
        ports_text.len(),
        ports_text.join(", "),
        options.interval,
        options.out.display()
    );

    let mut recorder = Recorder::new(
        header.pre_trigger_ns,
        header.post_trigger_ns,
        header.baseline_ns,
    );
    let mut watch = TriggerWatch::new(options.error_rate);
    watch.check(&first);
    let mut stats = Stats::default();
    let mut snapshots = tokio::time::interval(options.interval);
    snapshots.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut ticks = tokio::time::interval(Duration::from_secs(1));
    ticks.tick().await;
    let begun = Instant::now();
    let deadline = options.duration.map(|d| tokio::time::Instant::now() + d);
    let mut last_flush = Instant::now();
    let tty = std::io::stderr().is_terminal();
    let mut rescans = 0u64;

    let end = loop {
        let step: Result<(), CaptureError> = tokio::select! {
            _ = stop.recv() => break End::Interrupted,
            _ = sleep_until(deadline) => break End::Duration,
            Some(record) = records_rx.recv() => {
                on_record(&record, &families, clock, &mut cgroups, &selected, &mut encoder,
                    &mut writer, &mut recorder, &mut stats)
            }
            attempt = families.next_attempt() => {
                families.on_attempt(attempt);
                Ok(())
            }
            _ = snapshots.tick() => {
                let (now, readings) = snapshot(&mut sysfs, clock, &is_selected);
                let reasons = watch.check(&readings);
                let mut out = Vec::new();
                if !reasons.is_empty() {
                    if !recorder.triggered(now) {
                        tracing::info!("trigger: {}", reasons.join("; "));
                    }
                    out.extend(recorder.on_trigger(now));
                }
                out.extend(recorder.on_snapshot(now, readings));
                let result = push_snapshots(&mut encoder, out, &mut stats);
                if result.is_ok() && (!reasons.is_empty() || last_flush.elapsed() >= FLUSH_EVERY) {
                    last_flush = Instant::now();
                    write_frames(&mut writer, encoder.flush(clock.now_unix_ns().0))
                } else {
                    result
                }
            }
            _ = ticks.tick() => {
                clock.refresh();
                rescans += 1;
                families.rescan();
                if tty || rescans.is_multiple_of(10) {
                    progress(tty, &header, &stats, &recorder, writer.bytes_written(), begun.elapsed());
                }
                Ok(())
            }
        };
        match step {
            Ok(()) => {}
            Err(CaptureError::SizeCap { .. }) => break End::SizeCap,
            Err(e) => break End::WriteFailed(e.to_string()),
        }
    };
    // The events of the last moments, then the baseline snapshots still in the ring.
    families.stop_readers().await;
    let mut last = Ok(());
    if !matches!(end, End::SizeCap | End::WriteFailed(_)) {
        while let Ok(record) = records_rx.try_recv() {
            last = last.and_then(|()| {
                on_record(
                    &record,
                    &families,
                    clock,
                    &mut cgroups,
                    &selected,
                    &mut encoder,
                    &mut writer,
                    &mut recorder,
                    &mut stats,
                )
            });
        }
        let rest = recorder.finish();
        last = last
            .and_then(|()| push_snapshots(&mut encoder, rest, &mut stats))
            .and_then(|()| write_frames(&mut writer, encoder.flush(clock.now_unix_ns().0)));
    }
    families.abort_readers();
    let end = match (end, last) {
        (End::Interrupted | End::Duration, Err(CaptureError::SizeCap { .. })) => End::SizeCap,
        (End::Interrupted | End::Duration, Err(e)) => End::WriteFailed(e.to_string()),
        (end, _) => end,
    };
    if tty {
        eprintln!();
    }
    let bytes = writer.bytes_written();
    let trailer = Trailer {
        reason: end.reason(),
        ended_unix_ns: clock.now_unix_ns().0,
        events: stats.events,
        snapshots_written: stats.snapshots,
        triggers: recorder.triggers,
    };
    // After a failed write the file may end in a torn record: a trailer behind it would
    // only be read as part of that record, so none is written.
    let finished = match end {
        End::WriteFailed(_) => Ok(()),
        _ => writer.finish(&trailer).map(drop),
    };
    eprintln!(
        "capture: ended ({}) after {:.1} s: {} events, {} snapshots written, {} triggers, {} bytes in {}",
        trailer.reason,
        begun.elapsed().as_secs_f64(),
        stats.events,
        stats.snapshots,
        recorder.triggers,
        bytes,
        options.out.display()
    );
    match (end, finished) {
        (End::WriteFailed(e), _) => bail!(
            "writing {} failed: {e}; the file is readable up to its last complete record",
            options.out.display()
        ),
        (_, Err(e)) => bail!("writing the end of {}: {e}", options.out.display()),
        _ => Ok(()),
    }
}

/// The key the file's frames are sealed with: random (it is written in the header; it only
/// lets the wire decoder check and read the frames).
fn frame_key(started: u64) -> [u8; 32] {
    let mut key = [0u8; 32];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut key))
        .is_err()
    {
        key[..8].copy_from_slice(&started.to_le_bytes());
    }
    key
}

/// Reads every captured port's files, stamped with the time the reads were done: a change a
/// snapshot shows happened no later than its time, so the last snapshot before an event
/// never shows the event's effect (a read takes milliseconds on a busy node).
fn snapshot(
    sysfs: &mut IbSysfs,
    clock: &TimeBase,
    selected: &impl Fn(&Reading) -> bool,
) -> (u64, Vec<Reading>) {
    let mut readings: Vec<Reading> = sysfs.read(0).into_iter().filter(selected).collect();
    let now = clock.now_unix_ns().0;
    for r in &mut readings {
        r.unix_ns = now;
    }
    (now, readings)
}

#[derive(Debug, Default)]
struct Stats {
    events: u64,
    snapshots: u64,
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// A probe record: a port event of a captured port is written at once and triggers.
#[allow(clippy::too_many_arguments)]
fn on_record(
    record: &RingRecord,
    families: &Families,
    clock: &TimeBase,
    cgroups: &mut CgroupNames,
    selected: &BTreeSet<(String, u32)>,
    encoder: &mut FrameEncoder,
    writer: &mut CaptureWriter<std::fs::File>,
    recorder: &mut Recorder,
    stats: &mut Stats,
) -> Result<(), CaptureError> {
    let event = families.decode(record, clock, cgroups);
    if event.origin != EventOrigin::Port || !selected.contains(&(event.device.clone(), event.port))
    {
        return Ok(());
    }
    stats.events += 1;
    encoder.push_event(monitor_wire::WireEvent {
        unix_ns: event.unix_ns,
        kind: monitor_wire::names::event_kind::IB_PORT.into(),
        labels: monitor_wire::Labels::new([
            ("device", event.device.clone()),
            ("port", event.port.to_string()),
            ("cgroup", event.cgroup.clone()),
        ]),
        code: i64::from(event.code),
        text: event.event.clone(),
    });
    let now = clock.now_unix_ns().0;
    write_frames(writer, encoder.flush_events(now))?;
    if !recorder.triggered(now) {
        tracing::info!(
            "trigger: {} on {}/{}",
            event.event,
            event.device,
            event.port
        );
    }
    let ring = recorder.on_trigger(now);
    push_snapshots(encoder, ring, stats)?;
    write_frames(writer, encoder.flush(now))
}

fn push_snapshots(
    encoder: &mut FrameEncoder,
    snapshots: Vec<Snapshot>,
    stats: &mut Stats,
) -> Result<(), CaptureError> {
    for s in snapshots {
        stats.snapshots += 1;
        for r in &s.readings {
            if let Err(e) = encoder.push_reading(r) {
                // One series the wire format refuses (a name too long) costs only itself.
                tracing::warn!("not captured: {}: {e}", r.series);
            }
        }
    }
    Ok(())
}

fn write_frames(
    writer: &mut CaptureWriter<std::fs::File>,
    frames: Vec<Vec<u8>>,
) -> Result<(), CaptureError> {
    frames.iter().try_for_each(|f| writer.write_frame(f))
}

fn progress(
    tty: bool,
    header: &CaptureHeader,
    stats: &Stats,
    recorder: &Recorder,
    bytes: u64,
    elapsed: Duration,
) {
    let line = format!(
        "capture: {} ports, {} events, {} triggers, {} snapshots, {:.1} MiB, {} s",
        header.ports.len(),
        stats.events,
        recorder.triggers,
        stats.snapshots,
        bytes as f64 / (1 << 20) as f64,
        elapsed.as_secs()
    );
    let mut err = std::io::stderr().lock();
    let _ = if tty {
        write!(err, "\r{line}  ")
    } else {
        writeln!(err, "{line}")
    };
    let _ = err.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_or_name_the_bad_input() {
        assert_eq!(
            parse_ports("mlx5_0/1,rxe1/2").unwrap(),
            [("mlx5_0".to_owned(), 1), ("rxe1".to_owned(), 2)]
        );
        assert_eq!(
            parse_ports("mlx5_0").unwrap_err().to_string(),
            "--ports: \"mlx5_0\" is not DEVICE/PORT (e.g. mlx5_0/1)"
        );
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1KiB").unwrap(), 1024);
        assert!(
            parse_size("lots")
                .unwrap_err()
                .to_string()
                .contains("\"lots\"")
        );
    }
}
