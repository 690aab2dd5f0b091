//! The node agent's main loop: keeps each probe family attached when the kernel allows it,
//! drains their ring buffers every [`EVENT_DRAIN_INTERVAL`], prints events (and port transitions), and, on request, the live
//! verb counters.
//!
//! A source that fails never stops the agent: a family whose module is missing is retried every
//! `rescan` interval, and one whose module goes away is dropped and retried the same way.

use std::{io::Write, time::Duration};

use tokio::{
    signal::unix::{SignalKind, signal},
    sync::{mpsc, oneshot},
    task::JoinHandle,
};

use railscope_wire::{self as wire, Labels};

use crate::{
    cgroup::CgroupNames,
    kernel::{Kernel, WallClock},
    pipeline::{self, Pipeline, PipelineOptions, Polled},
    probes::{
        AttachedFamily, Family, FamilyUnavailable, ProbeReport, Status,
        decode::{self, Event, PortStates, PortTransition, VerbCount},
        names::KernelNames,
        render_table,
    },
    sources::gpu::GpuEvent,
};

/// How often each family's ring buffer is drained. The probes submit events without waking
/// the reader (a wake-up is a self-IPI on the CPU that runs the hook, most of what a rare
/// event would cost there), so events reach the agent up to this late; their kernel
/// timestamps keep the time they happened.
const EVENT_DRAIN_INTERVAL: Duration = Duration::from_millis(250);

/// How the agent prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    Text,
    Json,
}

#[derive(Clone, Debug)]
pub struct AgentOptions {
    pub format: OutputFormat,
    /// How often to look for modules that appeared or disappeared.
    pub rescan: Duration,
    /// Print the verb counters this often (None: never).
    pub counters_every: Option<Duration>,
    pub kernel: Kernel,
    /// Send metrics and events to a collector (None: print only).
    pub pipeline: Option<PipelineOptions>,
}

/// A family's state in the agent.
enum FamilyState {
    Unavailable {
        reason: String,
    },
    Attached {
        attached: Box<AttachedFamily>,
        reader: JoinHandle<()>,
        /// Tells the reader to drain its ring buffer one last time and end.
        stop: Option<oneshot::Sender<()>>,
        reported_losses: (u64, u64),
    },
}

/// What reader tasks send to the main loop.
type Record = (Family, monitor_common::events::EventRecord);

pub async fn run(options: AgentOptions) -> anyhow::Result<()> {
    // Handlers first: a stop request during the first attach must still stop us cleanly.
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let clock = WallClock::now();
    let mut cgroups = CgroupNames::new(options.kernel.sys_root().join("fs/cgroup"));
    let mut names = KernelNames::default();
    let mut ports = PortStates::default();
    let (records_tx, mut records_rx) = mpsc::channel::<Record>(4096);
    let mut pipeline = options.pipeline.as_ref().map(Pipeline::start).transpose()?;

    let mut families: Vec<(Family, FamilyState)> = Vec::new();
    let mut rows: Vec<ProbeReport> = Vec::new();
    for family in Family::ALL {
        let (state, family_rows) = try_attach(family, &options.kernel, &records_tx);
        log_state(family, &state, &family_rows, true);
        if let FamilyState::Attached { attached, .. } = &state {
            names.merge(&attached.names);
        }
        rows.extend(family_rows);
        families.push((family, state));
    }
    eprint!("{}", render_table(&rows));

    let mut rescan = tokio::time::interval(options.rescan);
    let mut last_rescan = std::time::Instant::now();
    let sweeps_pace_rescans = pipeline
        .as_ref()
        .is_some_and(|p| p.interval <= options.rescan);
    rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut counters = tokio::time::interval(options.counters_every.unwrap_or(Duration::MAX / 4));
    counters.tick().await; // the first tick is immediate: skip it
    let flush_every = pipeline
        .as_ref()
        .map_or(Duration::MAX / 4, |p| p.flush_every);
    let mut flush = tokio::time::interval(flush_every);
    flush.tick().await;
    loop {
        tokio::select! {
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            Some(record) = records_rx.recv() => {
                let event = decode_record(&families, &record, &names, &clock, &mut cgroups);
                report_event(&event, &mut ports, pipeline.as_mut(), options.format);
            }
            // With a pipeline that reads at least as often as the rescan interval, its sweeps
            // pace the rescans (one wake-up a second, not two).
            _ = rescan.tick(), if !sweeps_pace_rescans => {
                last_rescan = std::time::Instant::now();
                for (family, state) in &mut families {
                    rescan_family(*family, state, &options.kernel, &records_tx, &mut names);
                }
            }
            polled = next_polled(&mut pipeline) => match polled {
                Polled::Samples(samples) => {
                    if last_rescan.elapsed() >= options.rescan {
                        last_rescan = std::time::Instant::now();
                        for (family, state) in &mut families {
                            rescan_family(*family, state, &options.kernel, &records_tx, &mut names);
                        }
                    }
                    let now = crate::kernel::realtime_ns();
                    let counts = decode::decode_counts(&all_counts(&families), &names, &mut cgroups);
                    if let Some(p) = pipeline.as_mut() {
                        p.on_samples(&samples);
                        p.on_readings(&pipeline::verb_readings(&counts, now));
                    }
                }
                Polled::Gpu(event) => {
                    let mut out = std::io::stdout().lock();
                    let _ = write_gpu_event(&mut out, &event, options.format).and_then(|()| out.flush());
                    if let Some(p) = pipeline.as_mut() {
                        p.on_event(pipeline::gpu_event(&event));
                    }
                }
            },
            _ = flush.tick(), if pipeline.is_some() => {
                if let Some(p) = pipeline.as_mut() {
                    p.flush();
                }
            }
            _ = counters.tick(), if options.counters_every.is_some() => {
                print_counts(&families, &names, &mut cgroups, options.format);
            }
        }
    }
    tracing::info!("stopping");
    // What the probes wrote since the last drain is still in the ring buffers: each reader
    // drains its buffer once more and ends, and those events go out like any other.
    for (_, state) in &mut families {
        if let FamilyState::Attached { reader, stop, .. } = state {
            if let Some(stop) = stop.take() {
                let _ = stop.send(());
            }
            if tokio::time::timeout(Duration::from_secs(1), reader)
                .await
                .is_err()
            {
                tracing::warn!("an event reader did not finish: its last events are lost");
            }
        }
    }
    while let Ok(record) = records_rx.try_recv() {
        let event = decode_record(&families, &record, &names, &clock, &mut cgroups);
        report_event(&event, &mut ports, pipeline.as_mut(), options.format);
    }
    if let Some(p) = pipeline.as_mut() {
        p.flush_all();
        // Give the sender a moment to hand the last frames to the kernel.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let stats = p.sender_stats();
        tracing::info!("to the collector: {stats}");
    }
    if options.counters_every.is_some() {
        // A last snapshot, so a run's totals are on record.
        print_counts(&families, &names, &mut cgroups, options.format);
    }
    for (_, state) in families {
        if let FamilyState::Attached { reader, .. } = state {
            reader.abort();
        }
    }
    Ok(())
}

/// Every attached family's raw counters.
fn all_counts(families: &[(Family, FamilyState)]) -> Vec<crate::probes::RawCount> {
    families
        .iter()
        .filter_map(|(_, s)| match s {
            FamilyState::Attached { attached, .. } => Some(attached.counts()),
            FamilyState::Unavailable { .. } => None,
        })
        .flatten()
        .collect()
}

async fn next_polled(pipeline: &mut Option<Pipeline>) -> Polled {
    match pipeline {
        Some(p) => p.next().await,
        None => std::future::pending().await,
    }
}

/// An IB, QP or CQ event for the collector.
fn ib_wire_event(event: &Event) -> wire::Event {
    let mut labels = vec![
        ("device", event.device.clone()),
        ("cgroup", event.cgroup.clone()),
    ];
    match event.origin {
        "port" => labels.push(("port", event.port.to_string())),
        "cq_async" => {}
        _ => labels.push(("qp", event.qp_num.to_string())),
    }
    wire::Event {
        unix_ns: event.unix_ns,
        kind: match event.origin {
            "port" => "ib_port".into(),
            origin => origin.into(),
        },
        labels: Labels::new(labels),
        code: i64::from(event.code),
        text: event.event.clone(),
    }
}

/// A port going UP or DOWN, for the collector.
fn transition_wire_event(t: &PortTransition) -> wire::Event {
    wire::Event {
        unix_ns: t.unix_ns,
        kind: "port_transition".into(),
        labels: Labels::new([
            ("device", t.device.clone()),
            ("port", t.port.to_string()),
            ("from", t.from.to_owned()),
        ]),
        code: i64::from(t.to == "UP"),
        text: t.to.into(),
    }
}

/// Writes a GPU event (XID, GPU lost) as a line (`kind: gpu_event`).
pub fn write_gpu_event(
    out: &mut impl Write,
    event: &GpuEvent,
    format: OutputFormat,
) -> std::io::Result<()> {
    let labels = event.labels();
    let gpu = labels.get("gpu").unwrap_or("?");
    let uuid = labels.get("uuid").unwrap_or("?");
    let what = match event {
        GpuEvent::Xid { xid, .. } => format!("XID {xid}"),
        GpuEvent::Lost { reason, .. } => format!("GPU lost: {reason}"),
    };
    match format {
        OutputFormat::Json => {
            let value = serde_json::json!({
                "kind": "gpu_event",
                "event": event.kind(),
                "gpu": gpu,
                "uuid": uuid,
                "code": event.code(),
                "text": what,
                "unix_ns": event.unix_ns(),
            });
            writeln!(out, "{value}")
        }
        OutputFormat::Text => writeln!(
            out,
            "{}  GPU {gpu} ({uuid})  {what}",
            rfc3339(event.unix_ns())
        ),
    }
}

fn print_counts(
    families: &[(Family, FamilyState)],
    names: &KernelNames,
    cgroups: &mut CgroupNames,
    format: OutputFormat,
) {
    let counts = decode::decode_counts(&all_counts(families), names, cgroups);
    if counts.is_empty() {
        return;
    }
    let snapshot = crate::kernel::realtime_ns();
    let mut out = std::io::stdout().lock();
    let _ = write_counts(&mut out, &counts, snapshot, format).and_then(|()| out.flush());
}

fn log_state(family: Family, state: &FamilyState, rows: &[ProbeReport], at_start: bool) {
    match state {
        FamilyState::Unavailable { reason } => {
            let probes: Vec<&str> = rows.iter().map(|r| r.probe).collect();
            let when = if at_start {
                " (will attach when possible)"
            } else {
                ""
            };
            tracing::warn!("{} unavailable: {reason}{when}", probes.join(", "));
        }
        FamilyState::Attached { .. } => {
            for row in rows {
                match &row.status {
                    Status::Attached => tracing::info!("{} attached", row.probe),
                    Status::Unavailable(reason) => {
                        tracing::warn!("{} unavailable: {reason}", row.probe)
                    }
                }
            }
            tracing::debug!(?family, "family attached");
        }
    }
}

fn rescan_family(
    family: Family,
    state: &mut FamilyState,
    kernel: &Kernel,
    records: &mpsc::Sender<Record>,
    names: &mut KernelNames,
) {
    match state {
        FamilyState::Unavailable { reason } => {
            if !kernel.module_present(family.module()) {
                return; // still missing: nothing new to say
            }
            let (new, rows) = try_attach(family, kernel, records);
            match &new {
                FamilyState::Attached { attached, .. } => {
                    names.merge(&attached.names);
                    log_state(family, &new, &rows, false);
                }
                FamilyState::Unavailable { reason: new_reason } if new_reason != reason => {
                    log_state(family, &new, &rows, false);
                }
                FamilyState::Unavailable { .. } => {}
            }
            *state = new;
        }
        FamilyState::Attached {
            attached,
            reader,
            reported_losses,
            ..
        } => {
            if !kernel.module_present(family.module()) || reader.is_finished() {
                reader.abort();
                let reason = format!(
                    "{} unloaded: {} inactive",
                    family.module(),
                    family.feature()
                );
                tracing::warn!("{reason}");
                *state = FamilyState::Unavailable { reason };
                return;
            }
            let losses = attached.losses();
            if losses.0 > reported_losses.0 {
                tracing::warn!(
                    "ring buffer full: {} events lost ({} in total, {})",
                    losses.0 - reported_losses.0,
                    losses.0,
                    family.module()
                );
            }
            if losses.1 > reported_losses.1 {
                tracing::warn!(
                    "counter map full: {} verb counts lost ({} in total, {})",
                    losses.1 - reported_losses.1,
                    losses.1,
                    family.module()
                );
            }
            *reported_losses = losses;
        }
    }
}

fn try_attach(
    family: Family,
    kernel: &Kernel,
    records: &mpsc::Sender<Record>,
) -> (FamilyState, Vec<ProbeReport>) {
    let mut attached = match AttachedFamily::attach(family, kernel) {
        Ok(attached) => attached,
        Err(unavailable) => {
            let FamilyUnavailable { reason, rows } = *unavailable;
            let reason = match reason {
                crate::probes::Unavailable::NothingAttached => rows
                    .iter()
                    .find_map(|r| match &r.status {
                        Status::Unavailable(why) => Some(why.clone()),
                        Status::Attached => None,
                    })
                    .unwrap_or_else(|| reason.to_string()),
                other => other.to_string(),
            };
            return (FamilyState::Unavailable { reason }, rows);
        }
    };
    let rows = attached.statuses.clone();
    let Some(ring) = attached.take_events() else {
        return (
            FamilyState::Unavailable {
                reason: "event ring buffer missing".into(),
            },
            rows,
        );
    };
    let tx = records.clone();
    let (stop, mut stopped) = oneshot::channel();
    let reader = tokio::spawn(async move {
        let mut ring = ring;
        let mut drain = tokio::time::interval(EVENT_DRAIN_INTERVAL);
        drain.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // A stop (or the agent dropping its end) drains once more, then ends.
            let last = tokio::select! {
                _ = drain.tick() => false,
                _ = &mut stopped => true,
            };
            while let Some(item) = ring.next() {
                match monitor_common::events::EventRecord::from_bytes(&item) {
                    Some(record) => {
                        if tx.send((family, record)).await.is_err() {
                            return;
                        }
                    }
                    None => tracing::warn!(len = item.len(), "short event record ignored"),
                }
            }
            if last {
                return;
            }
        }
    });
    (
        FamilyState::Attached {
            attached: Box::new(attached),
            reader,
            stop: Some(stop),
            reported_losses: (0, 0),
        },
        rows,
    )
}

/// A record as an event, its device named from the `DEVICE_NAMES` map of the family that
/// sent it.
fn decode_record(
    families: &[(Family, FamilyState)],
    (family, record): &Record,
    names: &KernelNames,
    clock: &WallClock,
    cgroups: &mut CgroupNames,
) -> Event {
    let device = families
        .iter()
        .find_map(|(f, state)| match state {
            FamilyState::Attached { attached, .. } if f == family => {
                Some(attached.device_name(record.device))
            }
            _ => None,
        })
        .unwrap_or_else(|| format!("dev@{:x}", record.device));
    Event::decode(record, device, names, clock, cgroups)
}

/// Prints an event (and the port transition it makes, if any) and sends both to the
/// collector.
fn report_event(
    event: &Event,
    ports: &mut PortStates,
    pipeline: Option<&mut Pipeline>,
    format: OutputFormat,
) {
    let transition = ports.observe(event);
    if let Some(p) = pipeline {
        p.on_event(ib_wire_event(event));
        if let Some(t) = &transition {
            p.on_event(transition_wire_event(t));
        }
    }
    let mut out = std::io::stdout().lock();
    // A closed stdout (the reader went away) is not a reason to stop monitoring.
    let _ = write_event(&mut out, event, format)
        .and_then(|()| match &transition {
            Some(t) => write_transition(&mut out, t, format),
            None => Ok(()),
        })
        .and_then(|()| out.flush());
}

fn rfc3339(unix_ns: u64) -> humantime::Rfc3339Timestamp {
    humantime::format_rfc3339_micros(std::time::UNIX_EPOCH + Duration::from_nanos(unix_ns))
}

/// Writes one event as a line: human-readable text or a JSON object (`kind: ib_event`).
pub fn write_event(
    out: &mut impl Write,
    event: &Event,
    format: OutputFormat,
) -> std::io::Result<()> {
    match format {
        OutputFormat::Json => {
            let mut value = serde_json::to_value(event).map_err(std::io::Error::other)?;
            value["kind"] = "ib_event".into();
            writeln!(out, "{value}")
        }
        OutputFormat::Text => {
            let partial = if event.partial {
                " (partial record)"
            } else {
                ""
            };
            let place = match event.origin {
                "port" => format!("port {}", event.port),
                "cq_async" => "cq".to_owned(),
                _ => format!("qp {}", event.qp_num),
            };
            let what = if event.origin == "qp_to_err" {
                "QP moved to ERR".to_owned()
            } else {
                event.event.clone()
            };
            writeln!(
                out,
                "{}  {} {place}  {what}  cgroup {}{partial}",
                rfc3339(event.unix_ns),
                event.device,
                event.cgroup
            )
        }
    }
}

/// Writes a port state transition (`kind: port_transition`).
pub fn write_transition(
    out: &mut impl Write,
    t: &PortTransition,
    format: OutputFormat,
) -> std::io::Result<()> {
    match format {
        OutputFormat::Json => {
            let mut value = serde_json::to_value(t).map_err(std::io::Error::other)?;
            value["kind"] = "port_transition".into();
            writeln!(out, "{value}")
        }
        OutputFormat::Text => writeln!(
            out,
            "{}  {} port {}  {} -> {}",
            rfc3339(t.unix_ns),
            t.device,
            t.port,
            t.from,
            t.to
        ),
    }
}

/// Writes a counter snapshot: a table, or one JSON line per counter (`kind: verb_count`,
/// with `snapshot` the snapshot's wall-clock time, shared by its lines).
pub fn write_counts(
    out: &mut impl Write,
    counts: &[VerbCount],
    snapshot_unix_ns: u64,
    format: OutputFormat,
) -> std::io::Result<()> {
    match format {
        OutputFormat::Json => {
            for c in counts {
                let mut value = serde_json::to_value(c).map_err(std::io::Error::other)?;
                value["kind"] = "verb_count".into();
                value["snapshot"] = snapshot_unix_ns.into();
                writeln!(out, "{value}")?;
            }
            Ok(())
        }
        OutputFormat::Text => {
            writeln!(out, "verb counters at {}:", rfc3339(snapshot_unix_ns))?;
            write!(out, "{}", decode::render_counts(counts))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event() -> Event {
        Event {
            ktime_ns: 5_000,
            unix_ns: 1_700_000_000_123_456_000,
            origin: "port",
            device: "rxe0".into(),
            port: 1,
            qp_num: 0,
            event: "PORT_ERR".into(),
            code: 10,
            cgroup: "/".into(),
            partial: false,
        }
    }

    #[test]
    fn text_line_names_device_port_and_event() {
        let mut out = Vec::new();
        write_event(&mut out, &event(), OutputFormat::Text).unwrap();
        let line = String::from_utf8(out).unwrap();
        assert_eq!(
            line,
            "2023-11-14T22:13:20.123456Z  rxe0 port 1  PORT_ERR  cgroup /\n"
        );
    }

    #[test]
    fn json_line_is_one_object_per_event() {
        let mut out = Vec::new();
        write_event(&mut out, &event(), OutputFormat::Json).unwrap();
        let line = String::from_utf8(out).unwrap();
        assert_eq!(line.lines().count(), 1);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["kind"], "ib_event");
        assert_eq!(v["origin"], "port");
        assert_eq!(v["device"], "rxe0");
        assert_eq!(v["port"], 1);
        assert_eq!(v["event"], "PORT_ERR");
        assert_eq!(v["code"], 10);
        assert_eq!(v["ktime_ns"], 5000);
        assert!(v.get("partial").is_none());
    }

    #[test]
    fn counters_as_json_lines() {
        let counts = vec![VerbCount {
            device: "rxe0".into(),
            verb: "create_qp",
            detail: "user".into(),
            cgroup: "/job1".into(),
            value: 2,
        }];
        let mut out = Vec::new();
        write_counts(&mut out, &counts, 7, OutputFormat::Json).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["kind"], "verb_count");
        assert_eq!(v["snapshot"], 7);
        assert_eq!(v["verb"], "create_qp");
        assert_eq!(v["value"], 2);
    }
}
