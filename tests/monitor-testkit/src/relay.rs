//! A UDP relay between one agent and one collector that keeps a copy of every datagram the
//! agent sent and of every reply (acknowledgement, schema request) the collector sent back,
//! and can send the agent datagrams of its own from the address the agent sends to — what a
//! forger on the collector's address would send.

use monitor_wire::{ACK_MAGIC, Key, decode_ack, peek_sequence};
use std::{
    net::{SocketAddr, UdpSocket},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

/// Datagrams with when the relay passed them on.
pub type Relayed = Vec<(Instant, Vec<u8>)>;

pub struct Relay {
    /// Where the agent sends (give it as the agent's `--collector`).
    pub addr: SocketAddr,
    front: UdpSocket,
    agent: Arc<Mutex<Option<SocketAddr>>>,
    sent: Arc<Mutex<Relayed>>,
    replies: Arc<Mutex<Relayed>>,
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Relay {
    /// A relay on a free loopback port, forwarding to `collector` (which may be down: what
    /// the agent sends is kept all the same).
    pub fn start(collector: SocketAddr) -> Self {
        let front = UdpSocket::bind("127.0.0.1:0").unwrap();
        let back = UdpSocket::bind("127.0.0.1:0").unwrap();
        back.connect(collector).unwrap();
        for s in [&front, &back] {
            s.set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
        }
        let addr = front.local_addr().unwrap();
        let sent: Arc<Mutex<Relayed>> = Arc::default();
        let replies: Arc<Mutex<Relayed>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let agent: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
        let forward = {
            let (front, back) = (front.try_clone().unwrap(), back.try_clone().unwrap());
            let (sent, stop, agent) = (sent.clone(), stop.clone(), agent.clone());
            thread::spawn(move || {
                let mut buf = vec![0; 65_536];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((n, from)) = front.recv_from(&mut buf) {
                        *agent.lock().unwrap() = Some(from);
                        sent.lock()
                            .unwrap()
                            .push((Instant::now(), buf[..n].to_vec()));
                        // A collector that is down refuses it (ECONNREFUSED later): ignored.
                        let _ = back.send(&buf[..n]);
                    }
                }
            })
        };
        let back_channel = {
            let front = front.try_clone().unwrap();
            let (replies, stop, agent) = (replies.clone(), stop.clone(), agent.clone());
            thread::spawn(move || {
                let mut buf = vec![0; 65_536];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(n) = back.recv(&mut buf)
                        && let Some(agent) = *agent.lock().unwrap()
                    {
                        replies
                            .lock()
                            .unwrap()
                            .push((Instant::now(), buf[..n].to_vec()));
                        let _ = front.send_to(&buf[..n], agent);
                    }
                }
            })
        };
        Self {
            addr,
            front,
            agent,
            sent,
            replies,
            stop,
            threads: vec![forward, back_channel],
        }
    }

    /// Datagrams the agent sent so far.
    pub fn sent_so_far(&self) -> Vec<Vec<u8>> {
        let sent = self.sent.lock().unwrap();
        sent.iter().map(|(_, d)| d.clone()).collect()
    }

    /// Replies the collector sent back so far.
    pub fn replies_so_far(&self) -> Vec<Vec<u8>> {
        let replies = self.replies.lock().unwrap();
        replies.iter().map(|(_, d)| d.clone()).collect()
    }

    /// The agent's newest session and the highest sequence number it sent in it so far.
    pub fn highest_sent(&self) -> Option<(u32, u64)> {
        let sent = self.sent.lock().unwrap();
        sent.iter().filter_map(|(_, d)| peek_sequence(d)).max()
    }

    /// Whether the newest acknowledgement of `session` that the collector sent back holds
    /// every frame of it up to `highest` (acknowledgements are cumulative).
    pub fn acknowledged_up_to(&self, key: &Key, (session, highest): (u32, u64)) -> bool {
        let replies = self.replies.lock().unwrap();
        let newest = replies
            .iter()
            .rev()
            .filter(|(_, d)| d.starts_with(&ACK_MAGIC))
            .filter_map(|(_, d)| decode_ack(d, key).ok())
            .find(|ack| ack.session == session);
        newest.is_some_and(|ack| (0..=highest).all(|seq| ack.holds(seq)))
    }

    /// Sends `datagram` to the agent from the relay's address (the one the agent sends to).
    /// Panics if the agent has sent nothing yet (its address is not known).
    pub fn send_to_agent(&self, datagram: &[u8]) {
        let agent = self
            .agent
            .lock()
            .unwrap()
            .expect("the agent has sent nothing yet");
        self.front.send_to(datagram, agent).unwrap();
    }

    /// Stops; every datagram the agent sent.
    pub fn stop(self) -> Vec<Vec<u8>> {
        self.stop_timed().into_iter().map(|(_, d)| d).collect()
    }

    /// Stops; every datagram the agent sent, with when it was passed on.
    pub fn stop_timed(self) -> Relayed {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        std::mem::take(&mut *self.sent.lock().unwrap())
    }
}
