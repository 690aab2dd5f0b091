//! A tiny HTTP/1.0 GET client over loopback and the Prometheus text format as name -> value:
//! enough for the collector bench and the test bed's host-side checks to read a collector's
//! `/metrics` and query API and a TSDB's HTTP API.

use std::{
    collections::BTreeMap,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

/// A `/metrics` page as `name{labels}` -> value.
pub(crate) type Metrics = BTreeMap<String, f64>;

/// `GET path` over HTTP/1.0 (the server closes the connection after the body): status and body.
pub(crate) fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .with_context(|| format!("connecting to {addr}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("GET {path}: no HTTP response"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("GET {path}: no status"))?;
    Ok((status, body.to_owned()))
}

pub(crate) fn wait_http(addr: SocketAddr, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if matches!(http_get(addr, "/metrics/collector"), Ok((200, _))) {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(100));
    }
    bail!("nothing answered on http://{addr}/metrics within {timeout:?}")
}

pub(crate) fn metrics_at(addr: SocketAddr, path: &str) -> anyhow::Result<Metrics> {
    let (status, body) = http_get(addr, path)?;
    if status != 200 {
        bail!("GET http://{addr}{path}: status {status}");
    }
    Ok(parse_metrics(&body))
}

pub(crate) fn parse_metrics(text: &str) -> Metrics {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, rest) = match l.find('}') {
                Some(i) => (&l[..=i], &l[i + 1..]),
                None => l.split_once(' ')?,
            };
            let value = rest.split_whitespace().next()?.parse().ok()?;
            Some((series.to_owned(), value))
        })
        .collect()
}

/// The sum of a metric over all its label sets.
pub(crate) fn metric_sum(m: &Metrics, name: &str) -> f64 {
    m.iter()
        .filter(|(k, _)| {
            k.as_str() == name || k.strip_prefix(name).is_some_and(|r| r.starts_with('{'))
        })
        .map(|(_, v)| v)
        .sum()
}

/// Percent-encodes a query-string value.
pub(crate) fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
