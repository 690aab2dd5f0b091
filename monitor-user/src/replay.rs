//! `railscope replay`: sends a capture file's frames to a collector, so a capture taken on
//! an air-gapped node can be studied where the fleet's data is.
//!
//! Each frame is decoded with the capture's own key and encoded again, unchanged but for
//! three things: the collector's key seals it, the node may be renamed (`--node`), and its
//! send time is now. Every sample and event keeps its original timestamp (the wire format
//! codes them against the send time, so re-encoding moves nothing); only the send time is
//! new, because a collector refuses frames sent longer ago than its `--max-frame-age`
//! (1 h by default) as replays. The capture's session is a session of its own at the
//! collector: replayed under a live node's name it would retire that node's session, which
//! is why `--node` exists.

use std::{net::UdpSocket, time::Duration};

use anyhow::Context as _;
use monitor_wire::{Key, encode_frame};

use crate::{sender::Target, time_base::TimeBase};

/// What a replay sent.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ReplayStats {
    pub frames: u64,
    pub samples: u64,
    pub events: u64,
    pub bytes: u64,
}

/// Pause between two datagrams, so a collector's socket buffer is never overrun by a
/// capture of thousands of frames.
const PACE: Duration = Duration::from_micros(500);

/// Sends every complete frame of `bytes` (a capture file) to `target`. A torn or corrupt end
/// is logged and what precedes it is sent.
pub fn replay(
    name: &str,
    bytes: &[u8],
    target: &Target,
    key: &Key,
    node: Option<&str>,
) -> anyhow::Result<ReplayStats> {
    let addr = std::net::ToSocketAddrs::to_socket_addrs(&target.to_string())
        .with_context(|| format!("resolving {target}"))?
        .next()
        .with_context(|| format!("{target} resolves to no address"))?;
    let bind = if addr.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    let socket = UdpSocket::bind(bind).context("a UDP socket")?;
    socket
        .connect(addr)
        .with_context(|| format!("connecting to {addr}"))?;
    let mut frames = Vec::new();
    let read = monitor_capture::read_capture(bytes, |_, frame, _| frames.push(frame.clone()))
        .with_context(|| name.to_owned())?;
    if let Some(stopped) = &read.stopped {
        tracing::warn!("{name}: {stopped}; replaying what precedes it");
    }
    let mut stats = ReplayStats::default();
    for mut frame in frames {
        if let Some(node) = node {
            frame.node = node.to_owned();
        }
        frame.send_unix_ns = TimeBase::global().now_unix_ns().0;
        let datagram = encode_frame(&frame, key)
            .with_context(|| format!("{name}: encoding frame {}", frame.seq))?;
        // A refused send (the collector is not there yet) is not fatal: UDP loses frames
        // either way, and the next ones may go.
        if let Err(e) = socket.send(&datagram) {
            tracing::warn!("sending frame {} to {addr}: {e}", frame.seq);
            continue;
        }
        stats.frames += 1;
        stats.samples += frame.sample_count() as u64;
        stats.events += frame.events.len() as u64;
        stats.bytes += datagram.len() as u64;
        std::thread::sleep(PACE);
    }
    Ok(stats)
}
