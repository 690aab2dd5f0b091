//! A collector's HTTP API from inside the guest: `GET` over HTTP/1.0 (the server closes the
//! connection after the body), the answer as JSON or as Prometheus text.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

use anyhow::{Context as _, bail};

/// `GET path` from `addr` (`HOST:PORT`): the status and the body.
pub fn get(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    let to: SocketAddr = addr
        .parse()
        .with_context(|| format!("{addr:?} is not an IP address and port"))?;
    let mut stream = TcpStream::connect_timeout(&to, Duration::from_secs(5))
        .with_context(|| format!("connecting to {addr}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .with_context(|| format!("reading the answer to GET {path} from {addr}"))?;
    parse_response(&String::from_utf8_lossy(&raw))
        .with_context(|| format!("GET {path} from {addr}"))
}

/// The status and body of an HTTP/1.x response.
fn parse_response(text: &str) -> anyhow::Result<(u16, String)> {
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        bail!("no HTTP response (no end of the head)");
    };
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no status in the response's first line")?;
    Ok((status, body.to_owned()))
}

/// `GET path`, which must answer 200 with JSON.
pub fn get_json(addr: &str, path: &str) -> anyhow::Result<serde_json::Value> {
    let (status, body) = get(addr, path)?;
    if status != 200 {
        bail!("GET {path} from {addr}: status {status}: {}", body.trim());
    }
    serde_json::from_str(&body).with_context(|| format!("GET {path} from {addr}: not JSON"))
}

/// The value of the sample `series` (`name` or `name{labels}`, as the page writes it) on a
/// Prometheus text page.
pub fn sample(page: &str, series: &str) -> Option<f64> {
    page.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_status_and_body() {
        let (status, body) =
            parse_response("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{\"a\":1}")
                .unwrap();
        assert_eq!((status, body.as_str()), (200, "{\"a\":1}"));
        assert_eq!(
            parse_response("HTTP/1.1 404 Not Found\r\n\r\n").unwrap().0,
            404
        );
        assert!(parse_response("HTTP/1.1 200 OK\r\n").is_err());
        assert!(parse_response("garbage\r\n\r\n").is_err());
    }

    #[test]
    fn finds_a_sample_by_its_whole_series() {
        let page = "# HELP x y\nrailscope_collector_archive_frames_total 12\n\
                    railscope_collector_archive_frames_total_other 3\n\
                    railscope_collector_node_frames_total{node=\"guest\"} 7\n";
        assert_eq!(
            sample(page, "railscope_collector_archive_frames_total"),
            Some(12.0)
        );
        assert_eq!(
            sample(
                page,
                "railscope_collector_node_frames_total{node=\"guest\"}"
            ),
            Some(7.0)
        );
        assert_eq!(sample(page, "railscope_collector_node_frames_total"), None);
    }
}
