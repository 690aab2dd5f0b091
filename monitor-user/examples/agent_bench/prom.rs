//! The same readings in Prometheus' own formats, to compare sizes with railscope's frames:
//!
//! - the text exposition format (0.0.4) of one scrape per sweep: `# HELP` and `# TYPE` per
//!   family, then `name{labels} value timestamp_ms` per series, families sorted by name and
//!   values written as Go's client library writes them (`strconv.AppendFloat(v, 'g', -1)`:
//!   `1.234567e+06`);
//! - remote-write v1: a `prometheus.WriteRequest` (protobuf; the collector's own messages and
//!   body encoding, its `remote_write/prompb.rs` included by path) compressed with snappy's
//!   block format, as the `Content-Encoding: snappy` body of a remote-write POST. Labels are
//!   `__name__`, the series' labels, and the `instance` and `job` labels a Prometheus server
//!   attaches to every scraped series, sorted by name. Metadata (`WriteRequest` tag 3), which
//!   Prometheus sends in requests of its own once a minute, is not counted.

use std::collections::BTreeMap;

use monitor_remote_write::prompb::{self, Label, Sample, TimeSeries, WriteRequest};
use monitor_wire::{Kind, Reading, Series, Value};

/// A float as Go's `strconv.AppendFloat(f, 'g', -1, 64)` writes it, with the special cases
/// of client_golang's `writeFloat`.
pub(crate) fn go_float(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    // Shortest round-trip digits, as both languages choose them.
    let sci = format!("{v:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("{:e} exponent is an integer");
    if (-4..6).contains(&exp) {
        format!("{v}")
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

fn escape_label(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

fn value_f64(v: Value) -> f64 {
    v.as_f64()
}

/// One scrape's text: the readings of one sweep.
pub(crate) fn text_exposition(sweep: &[Reading]) -> String {
    let mut families: BTreeMap<&str, Vec<&Reading>> = BTreeMap::new();
    for r in sweep {
        families.entry(&*r.series.name).or_default().push(r);
    }
    let mut out = String::new();
    for (name, mut readings) in families {
        readings.sort_by(|a, b| a.series.labels.cmp(&b.series.labels));
        let kind = match readings[0].series.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        };
        let help = name
            .strip_prefix("railscope_")
            .unwrap_or(name)
            .replace('_', " ");
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for r in readings {
            out.push_str(name);
            let labels: Vec<String> = r
                .series
                .labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
                .collect();
            if !labels.is_empty() {
                out.push('{');
                out.push_str(&labels.join(","));
                out.push('}');
            }
            out.push(' ');
            out.push_str(&go_float(value_f64(r.value)));
            out.push(' ');
            out.push_str(&(r.unix_ns / 1_000_000).to_string());
            out.push('\n');
        }
    }
    out
}

fn labels_of(series: &Series, node: &str) -> Vec<Label> {
    let mut labels: Vec<Label> = series
        .labels
        .iter()
        .map(|(k, v)| Label {
            name: k.into(),
            value: v.into(),
        })
        .chain([
            Label {
                name: "__name__".into(),
                value: series.name.to_string(),
            },
            Label {
                name: "instance".into(),
                value: format!("{node}:9100"),
            },
            Label {
                name: "job".into(),
                value: "railscope".into(),
            },
        ])
        .collect();
    labels.sort_by(|a, b| a.name.cmp(&b.name));
    labels
}

fn sample_of(r: &Reading) -> Sample {
    Sample {
        value: value_f64(r.value),
        timestamp: (r.unix_ns / 1_000_000) as i64,
    }
}

/// Sizes of a batch of remote-write requests.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub(crate) struct RemoteWriteCost {
    pub requests: u64,
    pub protobuf_bytes: u64,
    pub snappy_bytes: u64,
}

impl RemoteWriteCost {
    fn add(&mut self, req: &WriteRequest) {
        let raw = prost::Message::encode_to_vec(req);
        self.requests += 1;
        self.protobuf_bytes += raw.len() as u64;
        self.snappy_bytes += prompb::encode_body(req).len() as u64;
    }
}

/// Readings in order of time, cut into windows of `every_ns` from the first one.
fn windows(readings: &[Reading], every_ns: u64) -> Vec<Vec<&Reading>> {
    let mut sorted: Vec<&Reading> = readings.iter().collect();
    sorted.sort_by_key(|r| r.unix_ns);
    let Some(first) = sorted.first().map(|r| r.unix_ns) else {
        return Vec::new();
    };
    let mut out: Vec<Vec<&Reading>> = Vec::new();
    for r in sorted {
        let w = ((r.unix_ns - first) / every_ns.max(1)) as usize;
        if out.len() <= w {
            out.resize_with(w + 1, Vec::new);
        }
        out[w].push(r);
    }
    out.retain(|w| !w.is_empty());
    out
}

/// One request per window of `every_ns`, each series once with all its samples of the window
/// (the most compact a remote-write sender could do).
pub(crate) fn remote_write_grouped(
    readings: &[Reading],
    every_ns: u64,
    node: &str,
) -> RemoteWriteCost {
    let mut cost = RemoteWriteCost::default();
    for window in windows(readings, every_ns) {
        let mut by_series: BTreeMap<&Series, Vec<Sample>> = BTreeMap::new();
        for r in window {
            by_series.entry(&r.series).or_default().push(sample_of(r));
        }
        let req = WriteRequest {
            timeseries: by_series
                .into_iter()
                .map(|(s, samples)| TimeSeries {
                    labels: labels_of(s, node),
                    samples,
                })
                .collect(),
        };
        cost.add(&req);
    }
    cost
}

/// As Prometheus' remote-write queue sends: one `TimeSeries` per sample (labels repeated),
/// in the order scraped, at most `per_request` samples per request
/// (`max_samples_per_send`, 2000 by default).
pub(crate) fn remote_write_as_prometheus(
    readings: &[Reading],
    per_request: usize,
    node: &str,
) -> RemoteWriteCost {
    let mut sorted: Vec<&Reading> = readings.iter().collect();
    sorted.sort_by_key(|r| r.unix_ns);
    let mut cost = RemoteWriteCost::default();
    for chunk in sorted.chunks(per_request.max(1)) {
        let req = WriteRequest {
            timeseries: chunk
                .iter()
                .map(|r| TimeSeries {
                    labels: labels_of(&r.series, node),
                    samples: vec![sample_of(r)],
                })
                .collect(),
        };
        cost.add(&req);
    }
    cost
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_as_go_writes_them() {
        for (v, s) in [
            (0.0, "0"),
            (1.0, "1"),
            (0.35, "0.35"),
            (100.0, "100"),
            (123_456.0, "123456"),
            (1_234_567.0, "1.234567e+06"),
            (1e6, "1e+06"),
            (3_649_382_715_604.0, "3.649382715604e+12"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-2.5, "-2.5"),
            (1e100, "1e+100"),
        ] {
            assert_eq!(go_float(v), s, "{v}");
        }
    }
}
