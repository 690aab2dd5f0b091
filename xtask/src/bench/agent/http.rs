//! A tiny HTTP/1.1 client, enough for scraping node_exporter over loopback.

use std::{
    io::{self, BufRead, BufReader, Write as _},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

pub(super) struct Http {
    pub(super) addr: SocketAddr,
    pub(super) timeout: Duration,
    pub(super) conn: Option<BufReader<TcpStream>>,
}

#[derive(Debug)]
pub(super) struct Response {
    pub(super) status: u16,
    /// Status line, headers and body as they came over the connection.
    pub(super) wire_bytes: usize,
    /// The body, de-chunked (still gzip-compressed when it was sent so).
    pub(super) body: Vec<u8>,
    pub(super) close: bool,
}

impl Http {
    pub(super) fn new(addr: SocketAddr, timeout: Duration) -> Self {
        Self {
            addr,
            timeout,
            conn: None,
        }
    }

    /// GET /metrics with the headers Prometheus sends; retried once on a fresh connection when
    /// a kept-alive one turns out closed.
    pub(super) fn get(&mut self, gzip: bool) -> io::Result<Response> {
        let request = format!(
            "GET /metrics HTTP/1.1\r\nHost: {}\r\nUser-Agent: Prometheus/2.45.0\r\n\
             Accept: application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1\r\n\
             {}X-Prometheus-Scrape-Timeout-Seconds: {}\r\n\r\n",
            self.addr,
            if gzip {
                "Accept-Encoding: gzip\r\n"
            } else {
                ""
            },
            self.timeout.as_secs_f64()
        );
        let mut last_error = None;
        for _ in 0..2 {
            if self.conn.is_none() {
                let stream = TcpStream::connect_timeout(&self.addr, self.timeout)?;
                stream.set_read_timeout(Some(self.timeout * 4))?;
                stream.set_nodelay(true)?;
                self.conn = Some(BufReader::new(stream));
            }
            let conn = self.conn.as_mut().expect("connected above");
            let result = conn
                .get_mut()
                .write_all(request.as_bytes())
                .and_then(|()| read_response(conn));
            match result {
                Ok(r) => {
                    if r.close {
                        self.conn = None;
                    }
                    return Ok(r);
                }
                Err(e) => {
                    self.conn = None;
                    last_error = Some(e);
                }
            }
        }
        Err(last_error.expect("two attempts failed"))
    }
}

pub(super) fn read_line_counted(r: &mut impl BufRead, wire: &mut usize) -> io::Result<String> {
    let mut line = String::new();
    let n = r.read_line(&mut line)?;
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
    }
    *wire += n;
    Ok(line.trim_end_matches(['\r', '\n']).to_owned())
}

/// Reads one response: status line, headers, and a body framed by `Content-Length` or
/// chunked transfer encoding.
pub(super) fn read_response(r: &mut impl BufRead) -> io::Result<Response> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_owned());
    let mut wire = 0;
    let status_line = read_line_counted(r, &mut wire)?;
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("bad status line"))?;
    let (mut length, mut chunked, mut close) = (None, false, false);
    loop {
        let line = read_line_counted(r, &mut wire)?;
        if line.is_empty() {
            break;
        }
        let Some((name, value)) = line.split_once(':') else {
            return Err(bad("bad header"));
        };
        let value = value.trim();
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => {
                length = Some(value.parse::<usize>().map_err(|_| bad("bad length"))?)
            }
            "transfer-encoding" => chunked = value.eq_ignore_ascii_case("chunked"),
            "connection" => close = value.eq_ignore_ascii_case("close"),
            _ => {}
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            let size_line = read_line_counted(r, &mut wire)?;
            let size = usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| bad("bad chunk size"))?;
            if size == 0 {
                // Trailers, then the empty line.
                while !read_line_counted(r, &mut wire)?.is_empty() {}
                break;
            }
            let start = body.len();
            body.resize(start + size, 0);
            r.read_exact(&mut body[start..])?;
            wire += size;
            if !read_line_counted(r, &mut wire)?.is_empty() {
                return Err(bad("chunk not followed by CRLF"));
            }
        }
    } else if let Some(n) = length {
        body.resize(n, 0);
        r.read_exact(&mut body)?;
        wire += n;
    } else {
        r.read_to_end(&mut body)?;
        wire += body.len();
        close = true;
    }
    Ok(Response {
        status,
        wire_bytes: wire,
        body,
        close,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_chunked_and_sized_responses() {
        let chunked = "HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n\
                       5\r\nhello\r\n3;ext=1\r\nabc\r\n0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\
                       Connection: close\r\n\r\nok";
        let mut r = io::Cursor::new(chunked.as_bytes());
        let a = read_response(&mut r).unwrap();
        assert_eq!(
            (a.status, a.body.as_slice(), a.close),
            (200, &b"helloabc"[..], false)
        );
        assert_eq!(
            a.wire_bytes,
            chunked.find("HTTP/1.1 200 OK\r\nContent-Length").unwrap()
        );
        let b = read_response(&mut r).unwrap();
        assert_eq!((b.body.as_slice(), b.close), (&b"ok"[..], true));
        assert!(read_response(&mut r).is_err());
    }
}
