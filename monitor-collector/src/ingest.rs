//! A receive thread: reads batches of datagrams from its socket, has the node table verify,
//! decode and account each one, feeds the live view and the archive queue with what was
//! accepted, counts what was not by reason, and asks senders for a schema it lacks (from the
//! same socket, to the address the frame came from).

use std::{
    net::{SocketAddr, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use monitor_wire::{self as wire, Key, SchemaRequest};

use crate::{
    acks::Copied,
    drops::DropReason,
    events::LiveEvent,
    nodes::{Accepted, time_range},
    shared::Shared,
    udp::BatchReceiver,
    writer::QueuedFrame,
};
use monitor_archive::clock::unix_now_ns;

/// How often the first receive thread forgets nodes silent for the node ttl.
const HOUSEKEEPING_EVERY: Duration = Duration::from_secs(10);

/// Receives on `socket` until `stop` is set.
pub(crate) fn receive_loop(
    socket: UdpSocket,
    index: usize,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
) {
    let mut receiver = BatchReceiver::new();
    let mut housekeeping = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        shared.heartbeats.beat(index);
        let n = match receiver.recv(&socket) {
            Ok(n) => n,
            Err(e) => {
                tracing::error!("receive socket {index}: {e}");
                std::thread::sleep(Duration::from_millis(100));
                0
            }
        };
        if n > 0 {
            shared.stats.batches.fetch_add(1, Ordering::Relaxed);
            shared
                .stats
                .datagrams
                .fetch_add(n as u64, Ordering::Relaxed);
            let now_ns = unix_now_ns();
            for i in 0..n {
                let (bytes, from) = receiver.datagram(i);
                let from = from.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
                handle(&shared, &socket, bytes, from, now_ns);
            }
        }
        let overflow = receiver.take_overflow();
        if overflow > 0 {
            shared.drops.add(DropReason::ReceiveBufferFull, overflow);
            tracing::warn!(
                "receive socket {index}: the kernel dropped {overflow} datagrams (receive buffer full: the collector is saturated, or net.core.rmem_max is small)"
            );
        }
        if index == 0 && housekeeping.elapsed() >= HOUSEKEEPING_EVERY {
            housekeeping = Instant::now();
            shared.table.forget_silent(unix_now_ns());
        }
    }
}

/// One datagram, start to end.
pub(crate) fn handle(
    shared: &Shared,
    socket: &UdpSocket,
    bytes: &[u8],
    from: SocketAddr,
    now_ns: u64,
) {
    match shared.table.ingest(bytes, from, now_ns) {
        Ok(accepted) => {
            let reply_key = accepted.reply_key.clone();
            let (node, session) = (accepted.node.clone(), accepted.frame.session);
            take(shared, accepted, bytes, from, now_ns);
            if let Some(key) = reply_key {
                ask_for_schema(shared, socket, &key, &node, session, from);
            }
        }
        Err(refused) => {
            if refused.reason == DropReason::Duplicate
                && let Some(queue) = &shared.archive
                && let (Some(node), Some((session, seq))) =
                    (wire::peek_node(bytes), wire::peek_sequence(bytes))
            {
                // Its MAC was checked before it was found a copy: acknowledged again once
                // durable (the agent missed the acknowledgement, or sent before it came).
                queue.duplicate(Copied {
                    node: node.into(),
                    session,
                    seq,
                    len: bytes.len(),
                    from,
                });
            }
            shared.drops.record(refused.reason, from, &refused.detail)
        }
    }
}

fn take(shared: &Shared, accepted: Accepted, bytes: &[u8], from: SocketAddr, now_ns: u64) {
    let Accepted {
        node,
        frame,
        schema,
        key,
        ..
    } = accepted;
    let stats = &shared.stats;
    stats.frames.fetch_add(1, Ordering::Relaxed);
    stats.bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
    stats
        .samples
        .fetch_add(frame.sample_count() as u64, Ordering::Relaxed);
    stats
        .events
        .fetch_add(frame.events.len() as u64, Ordering::Relaxed);
    for event in &frame.events {
        shared.events.push(LiveEvent::new(&node, event, now_ns));
        if let Some(inbox) = &shared.findings_inbox {
            inbox.push(&node, event);
        }
    }
    if let Some(inbox) = &shared.findings_inbox {
        inbox.push_samples(&node, &frame, &schema);
    }
    if let Some(queue) = &shared.archive {
        let (first_ns, last_ns) = time_range(&frame);
        let (session, seq) = (frame.session, frame.seq);
        let queued = queue.push(QueuedFrame {
            node: node.clone(),
            received_ns: now_ns,
            first_ns,
            last_ns,
            seq,
            bytes: bytes.to_vec(),
            schema,
            session,
            from,
            key,
        });
        if !queued {
            // Not archived: the agent's next copy of it must be taken.
            shared.table.forget_frame(&node, session, seq);
        }
    }
}

/// Asks `node` for its schema, sealed with `key`: the node's own, which it holds (the one its
/// frame carried).
fn ask_for_schema(
    shared: &Shared,
    socket: &UdpSocket,
    key: &Key,
    node: &str,
    session: u32,
    to: SocketAddr,
) {
    let request = SchemaRequest {
        node: node.to_owned(),
        session,
    };
    let sent = wire::encode_schema_request(&request, key)
        .map_err(|e| e.to_string())
        .and_then(|bytes| socket.send_to(&bytes, to).map_err(|e| e.to_string()));
    match sent {
        Ok(_) => {
            shared
                .stats
                .schema_requests_sent
                .fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                "asked {node} ({to}) for its schema: samples of series it has not named to this collector"
            );
        }
        Err(e) => {
            shared
                .stats
                .schema_request_errors
                .fetch_add(1, Ordering::Relaxed);
            tracing::debug!("schema request to {node} ({to}): {e}");
        }
    }
}
