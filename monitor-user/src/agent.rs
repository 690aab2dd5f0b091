//! The node agent's main loop: keeps each probe family attached when the kernel allows it,
//! drains their ring buffers, and prints what they saw.
//!
//! A source that fails never stops the agent: a probe whose module is missing is retried every
//! `rescan` interval, and one whose module goes away is dropped and retried the same way.

use std::{io::Write, time::Duration};

use tokio::{
    io::unix::AsyncFd,
    signal::unix::{SignalKind, signal},
    sync::mpsc,
    task::JoinHandle,
};

use crate::{
    kernel::{Kernel, WallClock},
    probes::{Attachment, IbEventProbe, ProbeReport, Status, ib_event::IbEvent, render_table},
};

/// How the agent prints events.
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
    pub kernel: Kernel,
}

/// The IB event family's state in the agent.
enum IbEventState {
    Unavailable(String),
    Attached {
        attachment: Box<Attachment>,
        reader: JoinHandle<()>,
        dropped_reported: u64,
    },
}

pub async fn run(options: AgentOptions) -> anyhow::Result<()> {
    let clock = WallClock::now();
    let (events_tx, mut events_rx) = mpsc::channel::<IbEvent>(4096);
    let mut ib = try_attach_ib(&options.kernel, clock, &events_tx);
    eprint!("{}", render_table(&[report(&ib)]));
    log_state(&ib, true);

    let mut sigterm = signal(SignalKind::terminate())?;
    let mut rescan = tokio::time::interval(options.rescan);
    rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stdout = std::io::stdout();
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = sigterm.recv() => break,
            Some(event) = events_rx.recv() => {
                let mut out = stdout.lock();
                // A closed stdout (the reader went away) is not a reason to stop monitoring.
                let _ = write_event(&mut out, &event, options.format).and_then(|()| out.flush());
            }
            _ = rescan.tick() => {
                ib = rescan_ib(ib, &options.kernel, clock, &events_tx);
            }
        }
    }
    tracing::info!("stopping");
    if let IbEventState::Attached { reader, .. } = ib {
        reader.abort();
    }
    Ok(())
}

fn report(state: &IbEventState) -> ProbeReport {
    let status = match state {
        IbEventState::Unavailable(reason) => Status::Unavailable(reason.clone()),
        IbEventState::Attached { .. } => Status::Attached,
    };
    ProbeReport::new(IbEventProbe::INFO, status)
}

fn log_state(state: &IbEventState, at_start: bool) {
    let probe = IbEventProbe::INFO.program;
    match state {
        IbEventState::Unavailable(reason) if at_start => {
            tracing::warn!("{probe} unavailable: {reason} (will attach when possible)")
        }
        IbEventState::Unavailable(reason) => tracing::warn!("{probe} detached: {reason}"),
        IbEventState::Attached { .. } => tracing::info!("{probe} attached"),
    }
}

fn rescan_ib(
    state: IbEventState,
    kernel: &Kernel,
    clock: WallClock,
    events: &mpsc::Sender<IbEvent>,
) -> IbEventState {
    match state {
        IbEventState::Unavailable(old_reason) => {
            let new = try_attach_ib(kernel, clock, events);
            match &new {
                IbEventState::Attached { .. } => log_state(&new, false),
                IbEventState::Unavailable(reason) if *reason != old_reason => {
                    tracing::warn!("{} still unavailable: {reason}", IbEventProbe::INFO.program)
                }
                IbEventState::Unavailable(_) => {}
            }
            new
        }
        IbEventState::Attached {
            attachment,
            reader,
            mut dropped_reported,
        } => {
            let info = IbEventProbe::INFO;
            if !kernel.module_present(info.module) || reader.is_finished() {
                reader.abort();
                let reason = format!("{} unloaded: {} inactive", info.module, info.feature);
                let new = IbEventState::Unavailable(reason);
                log_state(&new, false);
                return new;
            }
            let now = attachment.dropped_ib_events();
            if now > dropped_reported {
                tracing::warn!(
                    "ring buffer full: {} IB events lost ({} in total)",
                    now - dropped_reported,
                    now
                );
                dropped_reported = now;
            }
            IbEventState::Attached {
                attachment,
                reader,
                dropped_reported,
            }
        }
    }
}

fn try_attach_ib(
    kernel: &Kernel,
    clock: WallClock,
    events: &mpsc::Sender<IbEvent>,
) -> IbEventState {
    let probe = match IbEventProbe::attach(kernel) {
        Ok(probe) => probe,
        Err(reason) => return IbEventState::Unavailable(reason.to_string()),
    };
    let IbEventProbe {
        attachment,
        events: ring,
        names,
    } = probe;
    // SAFETY: the RingBuf owns its map fd and is neither closed nor replaced while the AsyncFd
    // owns it.
    let ring = match unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
    {
        Ok(ring) => ring,
        Err(e) => {
            return IbEventState::Unavailable(format!("cannot poll the IB event ring buffer: {e}"));
        }
    };
    let tx = events.clone();
    let reader = tokio::spawn(async move {
        let mut ring = ring;
        loop {
            let Ok(mut guard) = ring.readable_mut().await else {
                return;
            };
            let ring = guard.get_inner_mut();
            while let Some(item) = ring.next() {
                match monitor_common::ib_event::IbEventRecord::from_bytes(&item) {
                    Some(record) => {
                        let event =
                            IbEvent::decode(&record, &names, clock.unix_ns(record.timestamp_ns));
                        if tx.send(event).await.is_err() {
                            return;
                        }
                    }
                    None => tracing::warn!(len = item.len(), "short IB event record ignored"),
                }
            }
            guard.clear_ready();
        }
    });
    IbEventState::Attached {
        attachment: Box::new(attachment),
        reader,
        dropped_reported: 0,
    }
}

/// Writes one event as a line: human-readable text or a JSON object.
pub fn write_event(
    out: &mut impl Write,
    event: &IbEvent,
    format: OutputFormat,
) -> std::io::Result<()> {
    match format {
        OutputFormat::Json => {
            let mut value = serde_json::to_value(event).map_err(std::io::Error::other)?;
            value["kind"] = "ib_event".into();
            writeln!(out, "{value}")
        }
        OutputFormat::Text => {
            let time = humantime::format_rfc3339_micros(
                std::time::UNIX_EPOCH + Duration::from_nanos(event.unix_ns),
            );
            let partial = if event.partial {
                " (partial record)"
            } else {
                ""
            };
            writeln!(
                out,
                "{time}  {} port {}  {}{partial}",
                event.device, event.port, event.event
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event() -> IbEvent {
        IbEvent {
            ktime_ns: 5_000,
            unix_ns: 1_700_000_000_123_456_000,
            device: "rxe0".into(),
            port: 1,
            event: "PORT_ERR".into(),
            code: 10,
            partial: false,
        }
    }

    #[test]
    fn text_line_names_device_port_and_event() {
        let mut out = Vec::new();
        write_event(&mut out, &event(), OutputFormat::Text).unwrap();
        let line = String::from_utf8(out).unwrap();
        assert_eq!(line, "2023-11-14T22:13:20.123456Z  rxe0 port 1  PORT_ERR\n");
    }

    #[test]
    fn json_line_is_one_object_per_event() {
        let mut out = Vec::new();
        write_event(&mut out, &event(), OutputFormat::Json).unwrap();
        let line = String::from_utf8(out).unwrap();
        assert_eq!(line.lines().count(), 1);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["kind"], "ib_event");
        assert_eq!(v["device"], "rxe0");
        assert_eq!(v["port"], 1);
        assert_eq!(v["event"], "PORT_ERR");
        assert_eq!(v["code"], 10);
        assert_eq!(v["ktime_ns"], 5000);
        assert!(v.get("partial").is_none());
    }
}
