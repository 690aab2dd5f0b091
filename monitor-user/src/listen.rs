//! `railscope listen`: receives frames on a UDP port, verifies and decodes them, and prints
//! one readable block (or one JSON line) per frame, for debugging and for tests. A bad frame
//! is reported in one line naming its sender and the listener goes on; per-node sequence
//! gaps (lost frames) are shown with the frame that revealed them. When frames carry samples
//! of series it has no schema entry for (it started after the agent), it sends the agent a
//! schema request, at most once every 5 s per agent session. Every frame it printed is
//! acknowledged to its agent (docs/wire-format.md, "Acknowledgements"): printing is all the
//! keeping `listen` does, so an agent sending to it drops a frame from its spool once it was
//! printed, and sends again what `listen` lacks.

use std::{
    collections::HashMap,
    io::{self, Write},
    net::SocketAddr,
    time::{Duration, Instant, UNIX_EPOCH},
};

use serde_json::{Value as Json, json};
use tokio::net::UdpSocket;

use monitor_wire::{
    self as wire, Frame, Key, Kind, Labels, ReceiverState, SchemaRequest, Series, SeriesData,
    WireError,
};

use crate::stop_signals::StopSignals;

/// How each frame is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

/// What one datagram turned out to be.
#[derive(Debug)]
pub enum Received {
    Frame {
        from: SocketAddr,
        len: usize,
        frame: Box<Frame>,
    },
    Bad {
        from: SocketAddr,
        len: usize,
        error: WireError,
    },
}

pub struct Listener {
    socket: UdpSocket,
    key: Key,
    format: Format,
    state: ReceiverState,
    buf: Vec<u8>,
    bad: u64,
    /// When each (node, session) was last asked for its schema.
    asked: HashMap<(String, u32), Instant>,
}

/// A node is asked for its schema at most this often (its answer comes with its next flush).
const SCHEMA_REQUEST_EVERY: Duration = Duration::from_secs(5);

impl Listener {
    pub async fn bind(addr: SocketAddr, key: Key, format: Format) -> io::Result<Self> {
        let socket = UdpSocket::bind(addr)
            .await
            .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on UDP {addr}: {e}")))?;
        grow_receive_buffer(&socket);
        Ok(Self {
            socket,
            key,
            format,
            state: ReceiverState::default(),
            buf: vec![0; 65_536],
            bad: 0,
            asked: HashMap::new(),
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    /// Per-node schema and sequence accounting of everything received so far.
    pub fn state(&self) -> &ReceiverState {
        &self.state
    }

    /// Datagrams that were not valid frames.
    pub fn bad_frames(&self) -> u64 {
        self.bad
    }

    /// Waits for one datagram; prints it to `out` if it is a frame, logs it if not.
    pub async fn recv(&mut self, out: &mut impl Write) -> io::Result<Received> {
        let (len, from) = self.socket.recv_from(&mut self.buf).await?;
        match wire::decode(&self.buf[..len], &self.key, &mut self.state) {
            Ok(frame) => {
                self.ask_for_schema(&frame, from).await;
                self.acknowledge(&frame.node, frame.session, len, from)
                    .await;
                out.write_all(
                    render_frame(&frame, from, len, &self.state, self.format).as_bytes(),
                )?;
                out.flush()?;
                Ok(Received::Frame {
                    from,
                    len,
                    frame: Box::new(frame),
                })
            }
            Err(error) => {
                if let WireError::Duplicate { node, .. } = &error
                    && let Some((session, _)) = wire::peek_sequence(&self.buf[..len])
                {
                    // Printed before: its acknowledgement was lost.
                    let node = node.clone();
                    self.acknowledge(&node, session, len, from).await;
                }
                self.bad += 1;
                tracing::warn!("bad frame from {from} ({len} bytes): {error}");
                Ok(Received::Bad { from, len, error })
            }
        }
    }

    /// Tells the agent what it holds of the session, in no more bytes than the frame.
    async fn acknowledge(&mut self, node: &str, session: u32, len: usize, to: SocketAddr) {
        let Some(state) = self.state.node(node).filter(|n| n.session() == session) else {
            return;
        };
        let ack = wire::Ack::of(node, session, state.received());
        match wire::encode_ack(&ack, &self.key, len) {
            Ok(bytes) => {
                if let Err(e) = self.socket.send_to(&bytes, to).await {
                    tracing::debug!("acknowledgement to {to}: {e}");
                }
            }
            Err(e) => tracing::debug!("acknowledgement for {node:?}: {e}"),
        }
    }

    /// Samples of series this receiver has no entry for (it started after the agent): ask the
    /// agent to send its schema again, from the address the frame came from.
    async fn ask_for_schema(&mut self, frame: &Frame, from: SocketAddr) {
        let unknown = self
            .state
            .node(&frame.node)
            .is_some_and(|n| n.last.unknown_samples > 0);
        if !unknown {
            return;
        }
        let now = Instant::now();
        let key = (frame.node.clone(), frame.session);
        if self
            .asked
            .get(&key)
            .is_some_and(|at| now.duration_since(*at) < SCHEMA_REQUEST_EVERY)
        {
            return;
        }
        self.asked
            .retain(|_, at| now.duration_since(*at) < SCHEMA_REQUEST_EVERY);
        self.asked.insert(key, now);
        let request = SchemaRequest {
            node: frame.node.clone(),
            session: frame.session,
        };
        match wire::encode_schema_request(&request, &self.key) {
            Ok(bytes) => match self.socket.send_to(&bytes, from).await {
                Ok(_) => tracing::info!(
                    "asked {} ({from}) for its schema: samples of unknown series",
                    frame.node
                ),
                Err(e) => tracing::debug!("schema request to {from}: {e}"),
            },
            Err(e) => tracing::debug!("schema request for {:?}: {e}", frame.node),
        }
    }

    /// Receives and prints frames until an I/O error (a closed `out`, for one).
    pub async fn run(mut self, mut out: impl Write) -> io::Result<()> {
        loop {
            self.recv(&mut out).await?;
        }
    }
}

/// Binds `addr` and prints every frame that arrives until SIGINT or SIGTERM
/// (`StopSignals`), then flushes `out` and returns.
pub async fn listen(
    addr: SocketAddr,
    key: Key,
    format: Format,
    mut out: impl Write,
) -> io::Result<()> {
    let mut stop = StopSignals::install()?;
    let listener = Listener::bind(addr, key, format).await?;
    tokio::select! {
        result = listener.run(&mut out) => result?,
        _ = stop.recv() => {}
    }
    out.flush()
}

/// One frame as printed: a block of lines (text) or one JSON line. Series names come from
/// `state`, which has already taken in the frame's own schema entries.
pub fn render_frame(
    frame: &Frame,
    from: SocketAddr,
    len: usize,
    state: &ReceiverState,
    format: Format,
) -> String {
    let node = state.node(&frame.node);
    let series = |id: u32| node.and_then(|n| n.series(id));
    let last = node.map(|n| n.last).unwrap_or_default();
    match format {
        Format::Json => {
            let samples: Vec<Json> = frame
                .samples
                .iter()
                .map(|s| {
                    let known = series(s.id);
                    json!({
                        "id": s.id,
                        "name": known.map(|k| &*k.name),
                        "labels": known.map(|k| labels_json(&k.labels)),
                        "kind": kind_name(s.data.kind()),
                        "points": points_json(&s.data),
                    })
                })
                .collect();
            let line = json!({
                "from": from.to_string(),
                "bytes": len,
                "node": frame.node,
                "session": frame.session,
                "seq": frame.seq,
                "send_unix_ns": frame.send_unix_ns,
                "lost_before": last.lost_before,
                "new_session": last.new_session,
                "unknown_samples": last.unknown_samples,
                "schema_refused": last.schema_refused,
                "schema": frame.schema.iter().map(|e| json!({
                    "id": e.id,
                    "name": e.series.name,
                    "labels": labels_json(&e.series.labels),
                    "kind": kind_name(e.series.kind),
                })).collect::<Vec<_>>(),
                "samples": samples,
                "events": frame.events.iter().map(|e| json!({
                    "unix_ns": e.unix_ns,
                    "kind": e.kind,
                    "labels": labels_json(&e.labels),
                    "code": e.code,
                    "text": e.text,
                })).collect::<Vec<_>>(),
            });
            format!("{line}\n")
        }
        Format::Text => {
            let mut out = format!(
                "{}  frame from {from}  node {}  session {:08x}  seq {}  {len} bytes: {} schema entries, {} samples, {} events\n",
                rfc3339(frame.send_unix_ns),
                frame.node,
                frame.session,
                frame.seq,
                frame.schema.len(),
                frame.sample_count(),
                frame.events.len(),
            );
            if last.new_session {
                out.push_str("  (new session: the sender started or restarted)\n");
            }
            if last.lost_before > 0 {
                out.push_str(&format!(
                    "  ({} frames lost before this one)\n",
                    last.lost_before
                ));
            }
            if last.unknown_samples > 0 {
                out.push_str(&format!(
                    "  ({} samples of series whose schema entry has not arrived yet)\n",
                    last.unknown_samples
                ));
            }
            if last.schema_refused > 0 {
                out.push_str(&format!(
                    "  ({} schema entries refused: the node's schema is at its limit)\n",
                    last.schema_refused
                ));
            }
            for e in &frame.schema {
                out.push_str(&format!(
                    "  schema #{} {} {}\n",
                    e.id,
                    e.series,
                    kind_name(e.series.kind)
                ));
            }
            for s in &frame.samples {
                let name =
                    series(s.id).map_or_else(|| "(unknown series)".into(), Series::to_string);
                out.push_str(&format!("  #{} {name} {}:", s.id, kind_name(s.data.kind())));
                points_text(&mut out, &s.data, frame.send_unix_ns);
                out.push('\n');
            }
            for e in &frame.events {
                out.push_str(&format!(
                    "  event {} {} {} code {}: {}\n",
                    rfc3339(e.unix_ns),
                    e.kind,
                    e.labels,
                    e.code,
                    e.text
                ));
            }
            out
        }
    }
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Counter => "counter",
        Kind::Gauge => "gauge",
    }
}

fn labels_json(labels: &Labels) -> Json {
    Json::Object(
        labels
            .iter()
            .map(|(k, v)| (k.to_owned(), Json::String(v.to_owned())))
            .collect(),
    )
}

fn points_json(data: &SeriesData) -> Vec<Json> {
    match data {
        SeriesData::Counter(v) => v
            .iter()
            .map(|c| json!({"unix_ns": c.unix_ns, "value": c.value}))
            .collect(),
        SeriesData::Gauge(v) => v
            .iter()
            .map(|g| {
                if g.is_single_value() && g.start_unix_ns == g.end_unix_ns {
                    json!({"unix_ns": g.end_unix_ns, "value": g.mean})
                } else {
                    json!({
                        "start_unix_ns": g.start_unix_ns,
                        "end_unix_ns": g.end_unix_ns,
                        "min": g.min,
                        "max": g.max,
                        "mean": g.mean,
                    })
                }
            })
            .collect(),
    }
}

/// Samples as `<time relative to the send time> <value>`, e.g. `-9.990s 312.456`.
fn points_text(out: &mut String, data: &SeriesData, send_ns: u64) {
    let rel = |t: u64| (t as i128 - send_ns as i128) as f64 / 1e9;
    match data {
        SeriesData::Counter(v) => {
            for c in v {
                out.push_str(&format!("  {:+.3}s {}", rel(c.unix_ns), c.value));
            }
        }
        SeriesData::Gauge(v) => {
            for g in v {
                if g.is_single_value() && g.start_unix_ns == g.end_unix_ns {
                    out.push_str(&format!("  {:+.3}s {}", rel(g.end_unix_ns), g.mean));
                } else {
                    out.push_str(&format!(
                        "  {:+.3}s [{} .. {}, mean {} over {:.3}s]",
                        rel(g.end_unix_ns),
                        g.min,
                        g.max,
                        g.mean,
                        (g.end_unix_ns - g.start_unix_ns) as f64 / 1e9
                    ));
                }
            }
        }
    }
}

fn rfc3339(unix_ns: u64) -> String {
    humantime::format_rfc3339_micros(UNIX_EPOCH + Duration::from_nanos(unix_ns)).to_string()
}

/// Bursts of frames (an agent's flush of hundreds of series, many agents at once) must wait in
/// the socket while a frame is printed: ask for 8 MiB instead of the kernel's ~200 KiB default
/// (capped by net.core.rmem_max; a failure only means the default stays).
fn grow_receive_buffer(socket: &UdpSocket) {
    use std::os::fd::AsRawFd as _;
    let size: libc::c_int = 8 << 20;
    // SAFETY: a valid socket fd and a c_int option value of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        tracing::debug!("SO_RCVBUF not raised: {}", io::Error::last_os_error());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use monitor_wire::{EncoderConfig, FrameEncoder, Reading, Value, WireEvent};

    use crate::sender::Sender;

    const T0: u64 = 1_763_164_800_000_000_000; // 2025-11-15T00:00:00Z

    fn key() -> Key {
        Key::from_bytes([42; 32])
    }

    fn encoder() -> FrameEncoder {
        FrameEncoder::new(EncoderConfig::new("gpu-node-017"), key()).unwrap()
    }

    fn push(encoder: &mut FrameEncoder) {
        let port = Labels::new([("device", "mlx5_0"), ("port", "1")]);
        let gpu = Labels::new([("gpu", "0")]);
        for s in 0..3u64 {
            let t = T0 + s * 1_000_000_000;
            encoder
                .push_reading(&Reading {
                    series: Series {
                        name: "railscope_ib_port_xmit_data_total".into(),
                        labels: port.clone(),
                        kind: Kind::Counter,
                    },
                    value: Value::U64(1_000 + s * 500),
                    unix_ns: t,
                })
                .unwrap();
            encoder
                .push_reading(&Reading {
                    series: Series {
                        name: "railscope_gpu_power_watts".into(),
                        labels: gpu.clone(),
                        kind: Kind::Gauge,
                    },
                    value: Value::F64(312.5 + s as f64),
                    unix_ns: t,
                })
                .unwrap();
        }
        encoder.push_event(WireEvent {
            unix_ns: T0 + 1_500_000_000,
            kind: "ib_port".into(),
            labels: port,
            code: 10,
            text: "PORT_ERR".into(),
        });
    }

    fn decoded(frames: &[Vec<u8>]) -> (Frame, ReceiverState) {
        let mut state = ReceiverState::default();
        let frame = wire::decode(&frames[0], &key(), &mut state).unwrap();
        (frame, state)
    }

    #[test]
    fn text_block_names_series_values_and_events() {
        let mut enc = encoder();
        push(&mut enc);
        let frames = enc.flush(T0 + 3_000_000_000);
        assert_eq!(frames.len(), 1);
        let (frame, state) = decoded(&frames);
        let from: SocketAddr = "10.1.2.3:40000".parse().unwrap();
        let text = render_frame(&frame, from, frames[0].len(), &state, Format::Text);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with(
                "2025-11-15T00:00:03.000000Z  frame from 10.1.2.3:40000  node gpu-node-017"
            ),
            "{text}"
        );
        assert!(
            lines[0].ends_with("2 schema entries, 6 samples, 1 events"),
            "{text}"
        );
        assert!(text.contains("(new session"), "{text}");
        assert!(text.contains(
            "railscope_ib_port_xmit_data_total{device=\"mlx5_0\",port=\"1\"} counter:  -3.000s 1000  -2.000s 1500  -1.000s 2000\n"
        ), "{text}");
        assert!(text.contains(
            "railscope_gpu_power_watts{gpu=\"0\"} gauge:  -3.000s 312.5  -2.000s 313.5  -1.000s 314.5\n"
        ), "{text}");
        assert!(text.contains(
            "  event 2025-11-15T00:00:01.500000Z ib_port {device=\"mlx5_0\",port=\"1\"} code 10: PORT_ERR\n"
        ), "{text}");
    }

    #[test]
    fn json_line_is_one_object_per_frame() {
        let mut enc = encoder();
        push(&mut enc);
        let frames = enc.flush(T0 + 3_000_000_000);
        let (frame, state) = decoded(&frames);
        let from: SocketAddr = "10.1.2.3:40000".parse().unwrap();
        let line = render_frame(&frame, from, frames[0].len(), &state, Format::Json);
        assert_eq!(line.lines().count(), 1);
        let v: Json = serde_json::from_str(&line).unwrap();
        assert_eq!(v["node"], "gpu-node-017");
        assert_eq!(v["from"], "10.1.2.3:40000");
        assert_eq!(v["seq"], 0);
        let counter = v["samples"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["kind"] == "counter")
            .unwrap();
        assert_eq!(counter["name"], "railscope_ib_port_xmit_data_total");
        assert_eq!(counter["labels"]["device"], "mlx5_0");
        assert_eq!(counter["points"][2]["value"], 2000);
        assert_eq!(counter["points"][2]["unix_ns"], T0 + 2_000_000_000);
        assert_eq!(v["events"][0]["text"], "PORT_ERR");
    }

    async fn next(listener: &mut Listener, out: &mut Vec<u8>) -> Received {
        tokio::time::timeout(Duration::from_secs(5), listener.recv(out))
            .await
            .expect("a datagram within 5 s")
            .unwrap()
    }

    #[tokio::test]
    async fn sender_to_listener_over_loopback_with_a_bad_frame_and_a_gap() {
        let mut listener = Listener::bind("127.0.0.1:0".parse().unwrap(), key(), Format::Text)
            .await
            .unwrap();
        let (sender, _task) = Sender::spawn(listener.local_addr().unwrap(), 16);
        let mut out = Vec::new();

        let mut enc = encoder();
        push(&mut enc);
        for f in enc.flush(T0 + 3_000_000_000) {
            sender.try_send(f).unwrap();
        }
        assert!(matches!(
            next(&mut listener, &mut out).await,
            Received::Frame { .. }
        ));

        // Garbage, then a frame sealed with another key: both refused, listening goes on.
        sender.try_send(b"not a frame".to_vec()).unwrap();
        let mut stranger =
            FrameEncoder::new(EncoderConfig::new("intruder"), Key::from_bytes([1; 32])).unwrap();
        push(&mut stranger);
        sender.try_send(stranger.flush(T0).remove(0)).unwrap();
        for expected_len in [11, 0] {
            match next(&mut listener, &mut out).await {
                Received::Bad { from, len, error } => {
                    assert_eq!(from.ip().to_string(), "127.0.0.1");
                    if expected_len > 0 {
                        assert_eq!(len, expected_len);
                        assert!(matches!(error, WireError::TooShort { .. }));
                    } else {
                        assert!(matches!(error, WireError::BadMac { .. }));
                    }
                }
                other => panic!("expected a bad frame, got {other:?}"),
            }
        }
        assert_eq!(listener.bad_frames(), 2);

        // Two flushes whose frames never leave: the next frame shows the gap.
        for _ in 0..2 {
            push(&mut enc);
            let _lost = enc.flush(T0 + 4_000_000_000);
        }
        push(&mut enc);
        for f in enc.flush(T0 + 5_000_000_000) {
            sender.try_send(f).unwrap();
        }
        let Received::Frame { frame, .. } = next(&mut listener, &mut out).await else {
            panic!("expected a frame");
        };
        assert_eq!(frame.seq, 3);
        let node = listener.state().node("gpu-node-017").unwrap();
        assert_eq!((node.frames, node.lost), (2, 2));
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.matches(" frame from 127.0.0.1:").count(), 2, "{text}");
        assert!(text.contains("(2 frames lost before this one)"), "{text}");
        assert!(
            text.contains("railscope_gpu_power_watts{gpu=\"0\"} gauge:"),
            "{text}"
        );
    }
}
