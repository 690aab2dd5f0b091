//! One port's timeline as a plain SVG picture: down periods, raw events and the error
//! counters that moved, on one time axis. Plain SVG (no plotting crate): three bands of
//! rectangles, ticks and step lines are all it needs.

use std::fmt::Write as _;

use crate::analysis::{PortReport, PortTimeline};

const WIDTH: f64 = 1000.0;
const LEFT: f64 = 150.0;
const RIGHT: f64 = 20.0;
const ROW: f64 = 28.0;

/// The SVG document for one port.
pub fn port_timeline(report: &PortReport, timeline: &PortTimeline) -> String {
    let start = report.first_unix_ns;
    let end = report.last_unix_ns.max(start.saturating_add(1));
    let span = (end - start) as f64;
    let x = |t: u64| LEFT + (t.saturating_sub(start) as f64 / span) * (WIDTH - LEFT - RIGHT);
    let moved: Vec<(&String, &Vec<(u64, u64)>)> = timeline
        .counters
        .iter()
        .filter(|(name, _)| report.counter_deltas.contains_key(*name) && is_error_counter(name))
        .collect();
    let height = 60.0 + ROW * (2.0 + moved.len() as f64) + 30.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<text x="10" y="20" font-size="14">{} {}/{}: {} ({} down, {:.3} s down)</text>"#,
        escape(&report.port.node),
        escape(&report.port.device),
        report.port.port,
        report.verdict.as_str(),
        report.down_transitions,
        report.time_down_ns as f64 / 1e9
    );
    // Band 1: up (green) with the down periods (red) over it.
    let y0 = 40.0;
    let _ = writeln!(s, r#"<text x="10" y="{}">link</text>"#, y0 + 17.0);
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{y0}" width="{}" height="{}" fill="#b7e4b0"/>"##,
        WIDTH - LEFT - RIGHT,
        ROW - 6.0
    );
    for d in &report.downs {
        let a = x(d.down_unix_ns);
        let b = x(d.down_unix_ns + d.duration_ns).max(a + 1.0);
        let _ = writeln!(
            s,
            r##"<rect x="{a:.2}" y="{y0}" width="{:.2}" height="{}" fill="#d9534f"><title>down {:.3} s</title></rect>"##,
            b - a,
            ROW - 6.0,
            d.duration_ns as f64 / 1e9
        );
    }
    // Band 2: every raw event as a tick.
    let y1 = y0 + ROW;
    let _ = writeln!(s, r#"<text x="10" y="{}">events</text>"#, y1 + 17.0);
    for (t, name) in &timeline.events {
        let colour = match name.as_str() {
            "PORT_ERR" => "#d9534f",
            "PORT_ACTIVE" => "#2e7d32",
            _ => "#555555",
        };
        let xt = x(*t);
        let _ = writeln!(
            s,
            r#"<line x1="{xt:.2}" x2="{xt:.2}" y1="{y1}" y2="{}" stroke="{colour}"><title>{}</title></line>"#,
            y1 + ROW - 6.0,
            escape(name)
        );
    }
    // Bands 3...: each error counter that moved, as a step line from 0 to its largest rise.
    for (i, (name, samples)) in moved.iter().enumerate() {
        let y = y1 + ROW * (i as f64 + 1.0);
        let base = samples.first().map_or(0, |s| s.1);
        let top = samples
            .iter()
            .map(|s| s.1.saturating_sub(base))
            .max()
            .unwrap_or(0)
            .max(1) as f64;
        let _ = writeln!(
            s,
            r#"<text x="10" y="{}">{} (+{})</text>"#,
            y + 17.0,
            escape(name),
            top as u64
        );
        let points = step_line(samples, x, |v| {
            y + ROW - 6.0 - (v.saturating_sub(base) as f64 / top) * (ROW - 8.0)
        });
        let _ = writeln!(
            s,
            r##"<polyline points="{points}" fill="none" stroke="#1f5fa8"/>"##
        );
    }
    // Time axis, in seconds from the start.
    let ya = y1 + ROW * (moved.len() as f64 + 1.0) + 4.0;
    let _ = writeln!(
        s,
        r#"<line x1="{LEFT}" x2="{}" y1="{ya}" y2="{ya}" stroke="black"/>"#,
        WIDTH - RIGHT
    );
    let step = nice_step(span / 1e9 / 8.0);
    let mut tick = 0.0;
    while tick <= span / 1e9 + 1e-9 {
        let xt = x(start.saturating_add((tick * 1e9) as u64));
        let _ = writeln!(
            s,
            r#"<line x1="{xt:.2}" x2="{xt:.2}" y1="{ya}" y2="{}" stroke="black"/><text x="{xt:.2}" y="{}" text-anchor="middle">{tick:.3} s</text>"#,
            ya + 5.0,
            ya + 18.0
        );
        tick += step;
    }
    s.push_str("</svg>\n");
    s
}

/// The points of a step line through `samples` (time, value): a corner where the value
/// changes and the last sample's instant, nothing for the samples in between that repeat the
/// value (a capture snapshots a counter every interval, so most samples do; drawing each made
/// pictures of thousands of collinear points).
fn step_line(samples: &[(u64, u64)], x: impl Fn(u64) -> f64, y: impl Fn(u64) -> f64) -> String {
    let mut points = String::new();
    let mut drawn: Option<(u64, f64)> = None;
    for (i, &(t, v)) in samples.iter().enumerate() {
        let last = i + 1 == samples.len();
        match drawn {
            Some((dv, _)) if dv == v && !last => continue,
            Some((dv, dy)) if dv == v => {
                let _ = write!(points, "{:.2},{dy:.2} ", x(t));
            }
            Some((_, dy)) => {
                let (xx, yy) = (x(t), y(v));
                let _ = write!(points, "{xx:.2},{dy:.2} {xx:.2},{yy:.2} ");
                drawn = Some((v, yy));
            }
            None => {
                let yy = y(v);
                let _ = write!(points, "{:.2},{yy:.2} ", x(t));
                drawn = Some((v, yy));
            }
        }
    }
    points
}

/// Counters that count errors (everything but data and packet counts), for the picture.
fn is_error_counter(name: &str) -> bool {
    !(name.contains("_data")
        || name.contains("_pkts")
        || name.contains("_packets")
        || name.contains("_bytes")
        || name == "lifespan")
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw <= 0.0 || !raw.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p)
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::step_line;

    #[test]
    fn a_step_line_has_corners_only_where_the_value_changes() {
        // 1000 snapshots of a counter that rises once, at t = 600, from 3 to 8.
        let samples: Vec<(u64, u64)> = (0..1000)
            .map(|t| (t, if t < 600 { 3 } else { 8 }))
            .collect();
        let points = step_line(&samples, |t| t as f64, |v| v as f64);
        assert_eq!(
            points.trim(),
            "0.00,3.00 600.00,3.00 600.00,8.00 999.00,8.00"
        );
    }

    #[test]
    fn a_step_line_keeps_every_change_and_a_single_sample() {
        let samples = [(0, 1), (1, 2), (2, 2), (3, 0)];
        let points = step_line(&samples, |t| t as f64, |v| v as f64);
        assert_eq!(
            points.trim(),
            "0.00,1.00 1.00,1.00 1.00,2.00 3.00,2.00 3.00,0.00"
        );
        assert_eq!(
            step_line(&[(5, 9)], |t| t as f64, |v| v as f64).trim(),
            "5.00,9.00"
        );
        assert_eq!(step_line(&[], |t| t as f64, |v| v as f64), "");
    }
}
