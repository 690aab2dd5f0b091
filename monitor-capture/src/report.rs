//! The report as text and JSON.

use std::fmt::Write as _;

use serde::Serialize;

use crate::analysis::{PortReport, Rules, duration_text};

/// Where a report's data came from and how far it could be read.
#[derive(Clone, Debug, Serialize)]
pub struct Source {
    /// The file (or `archive DIR node N`).
    pub name: String,
    pub host: Option<String>,
    pub kernel: Option<String>,
    pub railscope_version: Option<String>,
    /// Snapshot interval, ns (capture files).
    pub interval_ns: Option<u64>,
    /// How the capture ended: its trailer's reason, or `cut` (no trailer).
    pub ended: String,
    /// The error that stopped reading (a torn or corrupt record), naming its offset.
    pub stopped: Option<String>,
    pub frames: u64,
}

/// A whole report.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub sources: Vec<Source>,
    pub rules: Rules,
    pub ports: Vec<PortReport>,
}

impl Report {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report always serialises")
    }

    /// The report for people: per source its origin, per port its verdict and why, its down
    /// periods, episodes, link changes and counters that moved.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for s in &self.sources {
            let _ = write!(out, "{}: {} frames", s.name, s.frames);
            if let Some(h) = &s.host {
                let _ = write!(out, ", host {h}");
            }
            if let Some(k) = &s.kernel {
                let _ = write!(out, ", kernel {k}");
            }
            if let Some(v) = &s.railscope_version {
                let _ = write!(out, ", railscope {v}");
            }
            if let Some(i) = s.interval_ns {
                let _ = write!(out, ", snapshots every {}", duration_text(i));
            }
            let _ = writeln!(out, ", ended: {}", s.ended);
            if let Some(e) = &s.stopped {
                let _ = writeln!(out, "  stopped reading: {e}; reporting what precedes it");
            }
        }
        for p in &self.ports {
            let start = p.first_unix_ns;
            let rel = |t: u64| format!("+{:.3} s", t.saturating_sub(start) as f64 / 1e9);
            let _ = writeln!(
                out,
                "\n{} {}/{}: {}  ({} down, {} up, {} down in all, {} episode(s); transitions from {})",
                p.port.node,
                p.port.device,
                p.port.port,
                p.verdict.as_str().to_uppercase(),
                p.down_transitions,
                p.up_transitions,
                duration_text(p.time_down_ns),
                p.episodes.len(),
                p.transitions_from,
            );
            let _ = writeln!(
                out,
                "  range {} .. {} ({})",
                utc_text(p.first_unix_ns),
                utc_text(p.last_unix_ns),
                duration_text(p.last_unix_ns.saturating_sub(p.first_unix_ns))
            );
            for r in &p.reasons {
                let _ = writeln!(out, "  because {r}");
            }
            if !p.events.is_empty() {
                let list: Vec<String> = p.events.iter().map(|(k, v)| format!("{k} x{v}")).collect();
                let _ = writeln!(out, "  events: {}", list.join(", "));
            }
            for d in &p.downs {
                let _ = writeln!(
                    out,
                    "  down {}{} ({}) .. {}: {}",
                    if d.from_start { "at the start " } else { "" },
                    rel(d.down_unix_ns),
                    utc_text(d.down_unix_ns),
                    d.up_unix_ns.map_or("still down".into(), &rel),
                    duration_text(d.duration_ns)
                );
            }
            for (i, e) in p.episodes.iter().enumerate() {
                let deltas: Vec<String> = e
                    .counter_deltas
                    .iter()
                    .map(|(k, v)| format!("{k} +{v}"))
                    .collect();
                let _ = writeln!(
                    out,
                    "  episode {}: {} .. {}, {} down(s), {} down; counters: {}",
                    i + 1,
                    rel(e.start_unix_ns),
                    rel(e.end_unix_ns),
                    e.downs,
                    duration_text(e.time_down_ns),
                    if deltas.is_empty() {
                        "none moved".into()
                    } else {
                        deltas.join(", ")
                    }
                );
            }
            for (what, list) in [("width", &p.width_changes), ("rate", &p.rate_changes)] {
                for c in list {
                    let _ = writeln!(out, "  {what} {} -> {} at {}", c.from, c.to, rel(c.unix_ns));
                }
            }
            if !p.counter_deltas.is_empty() {
                let list: Vec<String> = p
                    .counter_deltas
                    .iter()
                    .map(|(k, v)| format!("{k} +{v}"))
                    .collect();
                let _ = writeln!(out, "  counters moved: {}", list.join(", "));
            }
        }
        out
    }
}

/// `2026-11-23T23:59:01.123Z`.
pub fn utc_text(unix_ns: u64) -> String {
    let secs = unix_ns / 1_000_000_000;
    let millis = (unix_ns / 1_000_000) % 1000;
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// The Gregorian date of a day count since 1970-01-01 (proleptic calendar: 400-year eras
/// starting on March 1st, so the leap day is each era-year's last day).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// A capture that could not be read at all, named (one line: the error is in the message,
/// not chained, so `{:#}` does not say it twice).
#[derive(Debug, thiserror::Error)]
#[error("{name}: {error}")]
pub struct SourceError {
    pub name: String,
    pub error: crate::CaptureError,
}

/// The report of capture files' bytes, each with a name for it (a file, or a collector's
/// export): every capture read into one set of timelines (a torn or corrupt end is said in
/// its source, not an error), then each port analysed. What `railscope report` prints, and
/// `railscope actions show` of a port's finding; the timelines are for the pictures.
pub fn report_of(
    captures: &[(String, Vec<u8>)],
    rules: &Rules,
) -> Result<(Report, crate::Timelines), SourceError> {
    let mut timelines = crate::Timelines::default();
    let mut sources = Vec::new();
    for (name, bytes) in captures {
        sources.push(
            load_capture(name, bytes, &mut timelines).map_err(|error| SourceError {
                name: name.clone(),
                error,
            })?,
        );
    }
    timelines.finish();
    let ports = crate::analyse(&timelines, rules);
    let report = Report {
        sources,
        rules: rules.clone(),
        ports,
    };
    Ok((report, timelines))
}

/// Reads one capture file's bytes into `timelines`; the source says how far it was read.
/// Only an unreadable header is an error.
pub fn load_capture(
    name: &str,
    bytes: &[u8],
    timelines: &mut crate::Timelines,
) -> Result<Source, crate::CaptureError> {
    let read = crate::read_capture(bytes, |_, frame, state| timelines.add_frame(frame, state))?;
    // The capture's own span: from its start to its end (trailer), so a port down at the end
    // is down until then, and quiet seconds count.
    timelines.see(read.header.started_unix_ns);
    if let Some(t) = &read.trailer {
        timelines.see(t.ended_unix_ns);
    }
    Ok(Source {
        name: name.to_owned(),
        host: Some(read.header.host.clone()),
        kernel: Some(read.header.kernel.clone()),
        railscope_version: Some(read.header.railscope_version.clone()),
        interval_ns: Some(read.header.interval_ns),
        ended: read
            .trailer
            .as_ref()
            .map_or_else(|| "cut (no trailer)".to_owned(), |t| t.reason.clone()),
        stopped: read.stopped.as_ref().map(ToString::to_string),
        frames: read.frames,
    })
}

#[cfg(test)]
mod tests {
    use super::utc_text;

    #[test]
    fn utc_text_of_known_instants() {
        assert_eq!(utc_text(0), "1970-01-01T00:00:00.000Z");
        // The wire format's worked example: 2025-11-15T00:00:02Z.
        assert_eq!(
            utc_text(1_763_164_802_000_000_000),
            "2025-11-15T00:00:02.000Z"
        );
        // A leap day.
        assert_eq!(
            utc_text(1_709_208_000_250_000_000),
            "2024-02-29T12:00:00.250Z"
        );
    }
}
