//! Acknowledgements to the agents: which frames of each node's session are durable in the
//! archive (docs/wire-format.md, "Acknowledgements"). The archive's writer owns this: a frame
//! counts once its record is fsynced ([`monitor_archive::archive::Archive::durable_seq`]), never on
//! receipt, so an agent drops from its spool only what a collector crash cannot lose. At
//! start-up what the archive holds of recent sessions is read back ([`held_in_archive`](monitor_archive::archive::recent::held_in_archive)), so
//! a collector that restarted refuses the copies it has and asks for the rest.
//!
//! With an acknowledgement that answers for frames received since the last one goes its timing
//! ([`wire::AckTiming`]): when the newest of them arrived and when the answer left, so that the
//! agent can estimate its clock's offset from the collector's (docs/wire-format.md,
//! "Acknowledgement timing").

use std::{
    collections::HashMap,
    net::{SocketAddr, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use monitor_wire::{self as wire, Ack, AckTiming, Key, SeqSet};

use monitor_archive::clock::unix_now_ns;

/// Sessions acknowledged per node: the newest ones (an agent resumes its session across a
/// restart, so a node rarely has more than one).
const SESSIONS_PER_NODE: usize = 4;
/// A session not added to for this long is forgotten (the longest an agent keeps a frame,
/// docs/agent.md, "Delivery").
const SESSION_IDLE: Duration = Duration::from_secs(3600);
/// The largest acknowledgement: within one unfragmented datagram, like a frame.
const MAX_ACK_LEN: usize = 1400;

/// What was acknowledged, for `/metrics`.
#[derive(Debug, Default)]
pub struct AckStats {
    pub sent: AtomicU64,
    pub bytes: AtomicU64,
    pub errors: AtomicU64,
    /// Frames that arrived again after they were stored, acknowledged again.
    pub duplicates_answered: AtomicU64,
    /// Timings sent with acknowledgements (their bytes are in `bytes`).
    pub timings_sent: AtomicU64,
}

/// A frame accepted by ingest, to acknowledge once its record is durable.
#[derive(Clone, Debug)]
pub struct Delivered {
    pub node: Arc<str>,
    pub session: u32,
    pub seq: u64,
    /// When it was received (the collector's clock): its acknowledgement's timing says so.
    pub received_ns: u64,
    /// Its size: an acknowledgement is never larger than the frames it answers.
    pub len: usize,
    /// Where the agent's socket is, and the key its frame carried (the node's own).
    pub from: SocketAddr,
    pub key: Key,
}

/// A copy of a frame ingest had already (refused as a duplicate after its MAC was checked).
#[derive(Clone, Debug)]
pub struct Copied {
    pub node: Arc<str>,
    pub session: u32,
    pub seq: u64,
    pub len: usize,
    pub from: SocketAddr,
}

struct SessionAcks {
    session: u32,
    durable: SeqSet,
    /// Bytes of frames answered since the last acknowledgement.
    answered: usize,
    /// The newest frame made durable since the last acknowledgement, and when it was received:
    /// the next acknowledgement's timing.
    newest: Option<(u64, u64)>,
    last_added: Instant,
}

impl SessionAcks {
    fn new(session: u32, durable: SeqSet) -> Self {
        Self {
            session,
            durable,
            answered: 0,
            newest: None,
            last_added: Instant::now(),
        }
    }
}

/// Counts a frame of `len` bytes as answered by the session's next acknowledgement, which
/// becomes due with the first.
fn answer(due: &mut Vec<(Arc<str>, u32)>, s: &mut SessionAcks, node: &Arc<str>, len: usize) {
    if s.answered == 0 {
        due.push((node.clone(), s.session));
    }
    s.answered += len;
}

struct NodeAcks {
    sessions: Vec<SessionAcks>,
    to: SocketAddr,
    key: Key,
    /// A frame of this collector's run carried the node's key (not so for sessions read
    /// back from the archive, until the node's next frame).
    key_known: bool,
}

/// Per node and session, the frames durable in the archive, and the acknowledgements due.
pub struct Acker {
    nodes: HashMap<Arc<str>, NodeAcks>,
    due: Vec<(Arc<str>, u32)>,
    socket: Option<UdpSocket>,
    stats: Arc<AckStats>,
    last_sweep: Instant,
}

impl Acker {
    /// Sends from `socket` (one of the collector's receive sockets, so that the agents'
    /// connected sockets take the reply); None: acknowledges nothing (tests of the writer).
    pub fn new(socket: Option<UdpSocket>, stats: Arc<AckStats>) -> Self {
        Self {
            nodes: HashMap::new(),
            due: Vec::new(),
            socket,
            stats,
            last_sweep: Instant::now(),
        }
    }

    /// The node's acknowledgements of `session`, made if new; the node's address and key
    /// updated to its frame's.
    fn session<'a>(
        nodes: &'a mut HashMap<Arc<str>, NodeAcks>,
        node: &Arc<str>,
        session: u32,
        to: SocketAddr,
        key: &Key,
    ) -> &'a mut SessionAcks {
        let acks = nodes.entry(node.clone()).or_insert_with(|| NodeAcks {
            sessions: Vec::new(),
            to,
            key: key.clone(),
            key_known: true,
        });
        acks.to = to;
        acks.key_known = true;
        acks.key = key.clone();
        let i = match acks.sessions.iter().position(|s| s.session == session) {
            Some(i) => i,
            None => {
                if acks.sessions.len() == SESSIONS_PER_NODE {
                    acks.sessions.remove(0);
                }
                acks.sessions
                    .push(SessionAcks::new(session, SeqSet::default()));
                acks.sessions.len() - 1
            }
        };
        &mut acks.sessions[i]
    }

    /// Frames read back from the archive at start-up: durable already.
    pub fn seed(&mut self, node: &Arc<str>, session: u32, held: SeqSet) {
        let acks = self.nodes.entry(node.clone()).or_insert_with(|| NodeAcks {
            sessions: Vec::new(),
            to: SocketAddr::from(([0, 0, 0, 0], 0)),
            key: Key::from_bytes([0; 32]),
            key_known: false,
        });
        acks.sessions.retain(|s| s.session != session);
        acks.sessions.push(SessionAcks::new(session, held));
    }

    /// The frame's record is durable: acknowledge it with the next [`send_due`](Self::send_due).
    pub fn durable(&mut self, frame: &Delivered) {
        let s = Self::session(
            &mut self.nodes,
            &frame.node,
            frame.session,
            frame.from,
            &frame.key,
        );
        s.durable.insert(frame.seq);
        if s.newest.is_none_or(|(seq, _)| frame.seq > seq) {
            s.newest = Some((frame.seq, frame.received_ns));
        }
        s.last_added = Instant::now();
        answer(&mut self.due, s, &frame.node, frame.len);
    }

    /// A copy of a frame ingest had already: acknowledged again (its acknowledgement was
    /// lost) if it is durable; if not yet, the acknowledgement comes when it is.
    pub fn duplicate(&mut self, frame: &Copied) {
        let Some(acks) = self.nodes.get_mut(&frame.node) else {
            return;
        };
        let Some(s) = acks
            .sessions
            .iter_mut()
            .find(|s| s.session == frame.session)
        else {
            return;
        };
        if !s.durable.contains(frame.seq) || !acks.key_known {
            return;
        }
        acks.to = frame.from;
        self.stats
            .duplicates_answered
            .fetch_add(1, Ordering::Relaxed);
        answer(&mut self.due, s, &frame.node, frame.len);
    }

    /// Sends the acknowledgements due: one per session that has new durable frames, sealed
    /// with the key the node's frames carry, no larger than the frames it answers; then its
    /// timing, where a frame was received since the last one and both fit in that size.
    pub fn send_due(&mut self) {
        for (node, session) in std::mem::take(&mut self.due) {
            let Some(acks) = self.nodes.get_mut(&node) else {
                continue;
            };
            let Some(s) = acks.sessions.iter_mut().find(|s| s.session == session) else {
                continue;
            };
            if !acks.key_known {
                continue;
            }
            let answered = std::mem::take(&mut s.answered);
            let newest = s.newest.take();
            let ack = Ack::of(&node, session, &s.durable);
            let Some(socket) = &self.socket else {
                continue;
            };
            let send = |bytes: Vec<u8>| {
                socket
                    .send_to(&bytes, acks.to)
                    .map(|_| bytes.len())
                    .map_err(|e| e.to_string())
            };
            let sent = wire::encode_ack(&ack, &acks.key, answered.min(MAX_ACK_LEN))
                .map_err(|e| e.to_string())
                .and_then(send);
            let len = match sent {
                Ok(len) => {
                    self.stats.sent.fetch_add(1, Ordering::Relaxed);
                    self.stats.bytes.fetch_add(len as u64, Ordering::Relaxed);
                    len
                }
                Err(e) => {
                    self.stats.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!("acknowledgement to {node} ({}): {e}", acks.to);
                    continue;
                }
            };
            let Some((seq, received_ns)) = newest else {
                continue;
            };
            let mut timing = AckTiming {
                node: node.to_string(),
                session,
                seq,
                received_ns,
                sent_ns: 0,
            };
            if len + timing.encoded_len() > answered {
                continue;
            }
            // Stamped as late as can be: the time it spends here counts as network delay.
            timing.sent_ns = unix_now_ns().max(received_ns);
            match wire::encode_timing(&timing, &acks.key)
                .map_err(|e| e.to_string())
                .and_then(send)
            {
                Ok(len) => {
                    self.stats.timings_sent.fetch_add(1, Ordering::Relaxed);
                    self.stats.bytes.fetch_add(len as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    self.stats.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!("acknowledgement timing to {node} ({}): {e}", acks.to);
                }
            }
        }
        if self.last_sweep.elapsed() >= Duration::from_secs(10) {
            self.last_sweep = Instant::now();
            self.nodes.retain(|_, acks| {
                acks.sessions
                    .retain(|s| s.last_added.elapsed() < SESSION_IDLE);
                !acks.sessions.is_empty()
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::UdpSocket;

    use super::*;

    const T0: u64 = 1_790_000_000_000_000_000;

    fn key() -> Key {
        Key::from_bytes([5; 32])
    }

    /// An acker sending from a loopback socket, and the agent's socket it sends to.
    fn acker() -> (Acker, UdpSocket) {
        let agent = UdpSocket::bind("127.0.0.1:0").unwrap();
        agent
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        (Acker::new(Some(socket), Arc::default()), agent)
    }

    fn delivered(seq: u64, received_ns: u64, len: usize, to: SocketAddr) -> Delivered {
        Delivered {
            node: "n1".into(),
            session: 7,
            seq,
            received_ns,
            len,
            from: to,
            key: key(),
        }
    }

    /// Every datagram that came within the read timeout.
    fn received(agent: &UdpSocket) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut buf = [0u8; 2048];
        while let Ok(n) = agent.recv(&mut buf) {
            out.push(buf[..n].to_vec());
        }
        out
    }

    #[test]
    fn an_acknowledgement_of_new_frames_comes_with_the_timing_of_the_newest() {
        let (mut acker, agent) = acker();
        let to = agent.local_addr().unwrap();
        for (seq, at) in [(3, T0 + 30), (5, T0 + 50), (4, T0 + 40)] {
            acker.durable(&delivered(seq, at, 1000, to));
        }
        acker.send_due();
        let got = received(&agent);
        assert_eq!(got.len(), 2, "an acknowledgement and its timing");
        let ack = wire::decode_ack(&got[0], &key()).unwrap();
        assert!(ack.holds(5) && ack.holds(3));
        let timing = wire::decode_timing(&got[1], &key()).unwrap();
        assert_eq!(
            (
                timing.node.as_str(),
                timing.session,
                timing.seq,
                timing.received_ns
            ),
            ("n1", 7, 5, T0 + 50)
        );
        assert!(timing.sent_ns >= timing.received_ns);
        // A copy of a frame it holds: acknowledged again, but nothing new was received, so
        // no timing.
        acker.duplicate(&Copied {
            node: "n1".into(),
            session: 7,
            seq: 5,
            len: 1000,
            from: to,
        });
        acker.send_due();
        let got = received(&agent);
        assert_eq!(got.len(), 1);
        assert!(got[0].starts_with(&wire::ACK_MAGIC));
        assert_eq!(acker.stats.timings_sent.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn the_timing_is_left_out_where_both_would_be_larger_than_the_frames_answered() {
        let (mut acker, agent) = acker();
        let to = agent.local_addr().unwrap();
        // A frame of 60 bytes: room for the acknowledgement, not for both.
        acker.durable(&delivered(0, T0, 60, to));
        acker.send_due();
        let got = received(&agent);
        assert_eq!(got.len(), 1);
        assert!(got[0].starts_with(&wire::ACK_MAGIC));
        assert!(got[0].len() <= 60);
        // Frames read back from the archive at start-up are durable already: nothing is due.
        let mut held = SeqSet::default();
        held.insert(0);
        acker.seed(&Arc::from("n2"), 9, held);
        acker.send_due();
        assert!(received(&agent).is_empty());
    }
}
