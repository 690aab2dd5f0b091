//! What the agent prints on stdout: one line per event, port transition, GPU event or
//! counter, as text or JSON objects.

use std::{io::Write, time::Duration};

use crate::{
    probes::decode::{self, EventOrigin, PortTransition, ProbeEvent, VerbCount},
    sources::gpu::GpuEvent,
};

/// How the agent prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    Text,
    Json,
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
                "unix_ns": event.unix_ns().0,
            });
            writeln!(out, "{value}")
        }
        OutputFormat::Text => writeln!(
            out,
            "{}  GPU {gpu} ({uuid})  {what}",
            rfc3339(event.unix_ns().0)
        ),
    }
}

fn rfc3339(unix_ns: u64) -> humantime::Rfc3339Timestamp {
    humantime::format_rfc3339_micros(std::time::UNIX_EPOCH + Duration::from_nanos(unix_ns))
}

/// Writes one event as a line: human-readable text or a JSON object (`kind: ib_event`).
pub fn write_event(
    out: &mut impl Write,
    event: &ProbeEvent,
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
                EventOrigin::Port => format!("port {}", event.port),
                EventOrigin::CqAsync => "cq".to_owned(),
                EventOrigin::QpAsync | EventOrigin::QpToErr | EventOrigin::Unknown => {
                    format!("qp {}", event.qp_num)
                }
            };
            let what = if event.origin == EventOrigin::QpToErr {
                "QP moved to ERR".to_owned()
            } else {
                event.event.clone()
            };
            let job = event
                .job
                .as_ref()
                .map_or_else(String::new, |job| format!("  job {job}"));
            writeln!(
                out,
                "{}  {} {place}  {what}  cgroup {}{job}{partial}",
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
    use crate::probes::decode::PortUpDown;

    fn event() -> ProbeEvent {
        ProbeEvent {
            ktime_ns: 5_000,
            unix_ns: 1_700_000_000_123_456_000,
            origin: EventOrigin::Port,
            device: "rxe0".into(),
            port: 1,
            qp_num: 0,
            event: "PORT_ERR".into(),
            code: 10,
            cgroup: "/".into(),
            job: None,
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
    fn transitions_as_text_and_json() {
        let t = PortTransition {
            ktime_ns: 5_000,
            unix_ns: 1_700_000_000_123_456_000,
            device: "rxe0".into(),
            port: 1,
            from: PortUpDown::Unknown,
            to: PortUpDown::Up,
        };
        let mut out = Vec::new();
        write_transition(&mut out, &t, OutputFormat::Text).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "2023-11-14T22:13:20.123456Z  rxe0 port 1  UNKNOWN -> UP\n"
        );
        let mut out = Vec::new();
        write_transition(&mut out, &t, OutputFormat::Json).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["kind"], "port_transition");
        assert_eq!((&v["from"], &v["to"]), (&"UNKNOWN".into(), &"UP".into()));
    }

    #[test]
    fn origins_keep_their_names_in_json() {
        for (origin, name) in [
            (EventOrigin::Port, "port"),
            (EventOrigin::QpAsync, "qp_async"),
            (EventOrigin::CqAsync, "cq_async"),
            (EventOrigin::QpToErr, "qp_to_err"),
            (EventOrigin::Unknown, "unknown"),
        ] {
            let mut out = Vec::new();
            write_event(
                &mut out,
                &ProbeEvent { origin, ..event() },
                OutputFormat::Json,
            )
            .unwrap();
            let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(v["origin"], name);
            assert_eq!(origin.as_str(), name);
        }
    }

    #[test]
    fn counters_as_json_lines() {
        let counts = vec![VerbCount {
            device: "rxe0".into(),
            verb: "create_qp",
            detail: "user".into(),
            cgroup: "/slurm/uid_0/job_1/step_0".into(),
            job: Some(crate::jobs::Job {
                id: "slurm:1".into(),
                step: Some("0".into()),
            }),
            value: 2,
        }];
        let mut out = Vec::new();
        write_counts(&mut out, &counts, 7, OutputFormat::Json).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["kind"], "verb_count");
        assert_eq!(v["snapshot"], 7);
        assert_eq!(v["verb"], "create_qp");
        assert_eq!(v["value"], 2);
        assert_eq!(v["job_id"], "slurm:1");
        assert_eq!(v["job_step"], "0");
    }
}
