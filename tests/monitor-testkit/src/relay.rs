//! A UDP relay between one agent and one collector that keeps a copy of every datagram the
//! agent sent and of every reply (acknowledgement, schema request) the collector sent back,
//! and can send the agent datagrams of its own from the address the agent sends to — what a
//! forger on the collector's address would send. [`Relay::impaired`] makes it a lossy link
//! both ways: datagrams lost, passed on twice, or held back behind the next (reordered), as a
//! congested network does to UDP (the host kernel here has no `netem`); what the agent sent is
//! kept as it sent it, before the impairment.

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

/// What a lossy link does to each datagram, each way, by chance (seeded: a run can be
/// repeated).
#[derive(Clone, Copy, Debug)]
pub struct Impairment {
    /// Lost.
    pub loss: f64,
    /// Passed on twice.
    pub duplicate: f64,
    /// Held back and passed on after the next datagram (or within 100 ms): reordered.
    pub reorder: f64,
    pub seed: u64,
}

/// One direction's impairment and the datagram it holds back.
struct Lossy {
    impairment: Impairment,
    rng: fastrand::Rng,
    held: Option<Vec<u8>>,
}

impl Lossy {
    fn new(impairment: Impairment, way: u64) -> Self {
        Self {
            impairment,
            rng: fastrand::Rng::with_seed(impairment.seed.wrapping_add(way)),
            held: None,
        }
    }

    /// Passes `datagram` on through `send` as the link would (`on`: impaired now).
    fn pass(&mut self, on: bool, datagram: &[u8], send: &mut impl FnMut(&[u8])) {
        if !on {
            self.flush(send);
            send(datagram);
            return;
        }
        let i = self.impairment;
        if self.rng.f64() < i.loss {
            return;
        }
        if self.held.is_none() && self.rng.f64() < i.reorder {
            self.held = Some(datagram.to_vec());
            return;
        }
        send(datagram);
        if self.rng.f64() < i.duplicate {
            send(datagram);
        }
        self.flush(send);
    }

    /// Passes on what is held back.
    fn flush(&mut self, send: &mut impl FnMut(&[u8])) {
        if let Some(d) = self.held.take() {
            send(&d);
        }
    }
}

pub struct Relay {
    /// Where the agent sends (give it as the agent's `--collector`).
    pub addr: SocketAddr,
    front: UdpSocket,
    agent: Arc<Mutex<Option<SocketAddr>>>,
    sent: Arc<Mutex<Relayed>>,
    replies: Arc<Mutex<Relayed>>,
    stop: Arc<AtomicBool>,
    /// Whether the impairment (if any) is on.
    impaired: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Relay {
    /// A relay on a free loopback port, forwarding to `collector` (which may be down: what
    /// the agent sends is kept all the same; it may be on another host).
    pub fn start(collector: SocketAddr) -> Self {
        Self::with(collector, None)
    }

    /// [`start`](Self::start), the link impaired both ways until
    /// [`lift_impairment`](Self::lift_impairment).
    pub fn impaired(collector: SocketAddr, impairment: Impairment) -> Self {
        Self::with(collector, Some(impairment))
    }

    /// The link passes every datagram on as it comes from now on.
    pub fn lift_impairment(&self) {
        self.impaired.store(false, Ordering::Relaxed);
    }

    fn with(collector: SocketAddr, impairment: Option<Impairment>) -> Self {
        let front = UdpSocket::bind("127.0.0.1:0").unwrap();
        // A collector beyond this machine (a namespace's veth in the guest) is reached from
        // an address of the route's device, not from loopback.
        let back = UdpSocket::bind(if collector.ip().is_loopback() {
            "127.0.0.1:0"
        } else {
            "0.0.0.0:0"
        })
        .unwrap();
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
        let impaired = Arc::new(AtomicBool::new(impairment.is_some()));
        let lossy = |way| impairment.map(|i| Lossy::new(i, way));
        let forward = {
            let (front, back) = (front.try_clone().unwrap(), back.try_clone().unwrap());
            let (sent, stop, agent) = (sent.clone(), stop.clone(), agent.clone());
            let (impaired, mut lossy) = (impaired.clone(), lossy(0));
            thread::spawn(move || {
                let mut buf = vec![0; 65_536];
                // A collector that is down refuses it (ECONNREFUSED later): ignored.
                let mut send = |d: &[u8]| {
                    let _ = back.send(d);
                };
                while !stop.load(Ordering::Relaxed) {
                    let Ok((n, from)) = front.recv_from(&mut buf) else {
                        if let Some(l) = &mut lossy {
                            l.flush(&mut send);
                        }
                        continue;
                    };
                    // The newest sender: an agent started again sends from another port.
                    *agent.lock().unwrap() = Some(from);
                    sent.lock()
                        .unwrap()
                        .push((Instant::now(), buf[..n].to_vec()));
                    match &mut lossy {
                        Some(l) => l.pass(impaired.load(Ordering::Relaxed), &buf[..n], &mut send),
                        None => send(&buf[..n]),
                    }
                }
            })
        };
        let back_channel = {
            let front = front.try_clone().unwrap();
            let (replies, stop, agent) = (replies.clone(), stop.clone(), agent.clone());
            let (impaired, mut lossy) = (impaired.clone(), lossy(1));
            thread::spawn(move || {
                let mut buf = vec![0; 65_536];
                let mut send = |d: &[u8]| {
                    if let Some(agent) = *agent.lock().unwrap() {
                        let _ = front.send_to(d, agent);
                    }
                };
                while !stop.load(Ordering::Relaxed) {
                    let Ok(n) = back.recv(&mut buf) else {
                        if let Some(l) = &mut lossy {
                            l.flush(&mut send);
                        }
                        continue;
                    };
                    replies
                        .lock()
                        .unwrap()
                        .push((Instant::now(), buf[..n].to_vec()));
                    match &mut lossy {
                        Some(l) => l.pass(impaired.load(Ordering::Relaxed), &buf[..n], &mut send),
                        None => send(&buf[..n]),
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
            impaired,
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
