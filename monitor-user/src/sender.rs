//! The UDP sender: frames go through a bounded queue to one tokio task that sends them to the
//! collector. Handing a frame over never blocks or waits, so sampling never stalls on the
//! network: when the queue is full the frame is dropped and counted. A collector that is
//! down (ICMP port unreachable, no route) costs counted send errors, logged once per change
//! of state, and sending goes on, so frames arrive again as soon as it is back.
//!
//! Datagrams that come back on the socket (a collector's schema requests) are handed, as they
//! are, to the channel given to [`Sender::spawn_with_replies`]; the sender does not read them.

use std::{
    io,
    net::{Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::{net::UdpSocket, sync::mpsc, task::JoinHandle};

/// Why a frame was not queued.
#[derive(Debug, thiserror::Error, Clone, Copy, PartialEq, Eq)]
pub enum TrySendError {
    #[error("send queue to {target} is full ({capacity} frames): frame dropped")]
    QueueFull { target: SocketAddr, capacity: usize },
    #[error("sender to {target} has stopped: frame dropped")]
    Closed { target: SocketAddr },
}

/// Counters of a sender, read at any time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SenderStats {
    /// Frames handed to the kernel.
    pub sent: u64,
    /// Frames dropped because the queue was full (or the task had stopped).
    pub dropped_queue_full: u64,
    /// Send errors: collector unreachable (ICMP port unreachable on an earlier frame), no
    /// route, ...
    pub send_errors: u64,
}

#[derive(Debug, Default)]
struct Counters {
    sent: AtomicU64,
    dropped_queue_full: AtomicU64,
    send_errors: AtomicU64,
}

/// Cheap to clone; every clone feeds the same queue.
#[derive(Clone, Debug)]
pub struct SenderHandle {
    tx: mpsc::Sender<Vec<u8>>,
    target: SocketAddr,
    capacity: usize,
    counters: Arc<Counters>,
}

impl SenderHandle {
    /// Queues one frame; returns at once. A full queue drops the frame (counted).
    pub fn try_send(&self, frame: Vec<u8>) -> Result<(), TrySendError> {
        match self.tx.try_send(frame) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.counters
                    .dropped_queue_full
                    .fetch_add(1, Ordering::Relaxed);
                Err(match e {
                    mpsc::error::TrySendError::Full(_) => TrySendError::QueueFull {
                        target: self.target,
                        capacity: self.capacity,
                    },
                    mpsc::error::TrySendError::Closed(_) => TrySendError::Closed {
                        target: self.target,
                    },
                })
            }
        }
    }

    pub fn stats(&self) -> SenderStats {
        SenderStats {
            sent: self.counters.sent.load(Ordering::Relaxed),
            dropped_queue_full: self.counters.dropped_queue_full.load(Ordering::Relaxed),
            send_errors: self.counters.send_errors.load(Ordering::Relaxed),
        }
    }

    pub fn target(&self) -> SocketAddr {
        self.target
    }
}

pub struct Sender;

impl Sender {
    /// Starts the sending task on the current tokio runtime. It ends when every handle has
    /// been dropped and the queue is drained.
    pub fn spawn(target: SocketAddr, queue_capacity: usize) -> (SenderHandle, JoinHandle<()>) {
        Self::spawn_with_replies(target, queue_capacity, None)
    }

    /// Like [`spawn`](Self::spawn); datagrams the target sends back go to `replies` (dropped
    /// when it is full or absent).
    pub fn spawn_with_replies(
        target: SocketAddr,
        queue_capacity: usize,
        replies: Option<mpsc::Sender<Vec<u8>>>,
    ) -> (SenderHandle, JoinHandle<()>) {
        let capacity = queue_capacity.max(1);
        let (tx, rx) = mpsc::channel(capacity);
        let counters = Arc::new(Counters::default());
        let task = tokio::spawn(run(target, rx, Arc::clone(&counters), replies));
        let handle = SenderHandle {
            tx,
            target,
            capacity,
            counters,
        };
        (handle, task)
    }
}

/// A socket connected to the target: on Linux only a connected UDP socket hears of ICMP
/// errors (port unreachable shows up as ECONNREFUSED on a later send).
async fn connect(target: SocketAddr) -> io::Result<UdpSocket> {
    let local: SocketAddr = match target {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(local).await?;
    socket.connect(target).await?;
    Ok(socket)
}

async fn run(
    target: SocketAddr,
    mut rx: mpsc::Receiver<Vec<u8>>,
    counters: Arc<Counters>,
    replies: Option<mpsc::Sender<Vec<u8>>>,
) {
    let mut socket: Option<Arc<UdpSocket>> = None;
    let mut reader: Option<JoinHandle<()>> = None;
    // The reader saw ECONNREFUSED: an ICMP error of an earlier frame, which a send would
    // otherwise have reported.
    let refused = Arc::new(AtomicBool::new(false));
    // Errors since sending last worked; `None` while it works.
    let mut failing: Option<u64> = None;
    while let Some(frame) = rx.recv().await {
        if socket.is_none() {
            match connect(target).await {
                Ok(s) => {
                    let s = Arc::new(s);
                    if let Some(replies) = &replies {
                        reader = Some(tokio::spawn(read_replies(
                            Arc::clone(&s),
                            replies.clone(),
                            Arc::clone(&refused),
                        )));
                    }
                    socket = Some(s);
                }
                Err(e) => {
                    note_error(&counters, &mut failing, target, &e);
                    // Frames keep queueing (and overflowing, counted) while we wait.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            }
        }
        let Some(s) = &socket else { continue };
        // ECONNREFUSED reports the ICMP error of an earlier frame; this one was not sent
        // and gets one more try. Recovery is a send with no such report.
        let earlier_refused = refused.swap(false, Ordering::Relaxed);
        if earlier_refused {
            note_error(
                &counters,
                &mut failing,
                target,
                &io::Error::from(io::ErrorKind::ConnectionRefused),
            );
        }
        let result = match s.send(&frame).await {
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                note_error(&counters, &mut failing, target, &e);
                s.send(&frame).await.map(|_| false)
            }
            other => other.map(|_| !earlier_refused),
        };
        match result {
            Ok(clean) => {
                counters.sent.fetch_add(1, Ordering::Relaxed);
                if clean && let Some(errors) = failing.take() {
                    tracing::info!("sending to {target} works again after {errors} errors");
                }
            }
            Err(e) => note_error(&counters, &mut failing, target, &e),
        }
    }
    if let Some(reader) = reader {
        reader.abort();
    }
}

/// Hands what comes back on the socket to `replies`. A connected UDP socket receives only
/// from its target; ECONNREFUSED (the target's port was closed when an earlier frame came)
/// is left for the sending side through `refused`.
async fn read_replies(
    socket: Arc<UdpSocket>,
    replies: mpsc::Sender<Vec<u8>>,
    refused: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 2048];
    loop {
        match socket.recv(&mut buf).await {
            Ok(n) => {
                // A full channel drops the datagram: requests are repeated by the collector.
                let _ = replies.try_send(buf[..n].to_vec());
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                refused.store(true, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::debug!("reading replies from the collector: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

fn note_error(counters: &Counters, failing: &mut Option<u64>, target: SocketAddr, e: &io::Error) {
    counters.send_errors.fetch_add(1, Ordering::Relaxed);
    match failing {
        Some(n) => *n += 1,
        None => {
            tracing::warn!(
                "sending to {target} failed: {e}; errors are counted until it works again"
            );
            *failing = Some(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    async fn wait_for(handle: &SenderHandle, done: impl Fn(SenderStats) -> bool) -> SenderStats {
        for _ in 0..500 {
            let stats = handle.stats();
            if done(stats) {
                return stats;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("sender did not get there: {:?}", handle.stats());
    }

    async fn recv(socket: &UdpSocket) -> Vec<u8> {
        let mut buf = vec![0u8; 2048];
        let n = tokio::time::timeout(Duration::from_secs(5), socket.recv(&mut buf))
            .await
            .expect("a frame within 5 s")
            .unwrap();
        buf.truncate(n);
        buf
    }

    /// A loopback port with nobody listening (bound, noted, released).
    fn free_port() -> SocketAddr {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap()
    }

    #[tokio::test]
    async fn frames_arrive_in_order() {
        let receiver = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let (handle, task) = Sender::spawn(receiver.local_addr().unwrap(), 16);
        for i in 0..3u8 {
            handle.try_send(vec![i; 100]).unwrap();
        }
        for i in 0..3u8 {
            assert_eq!(recv(&receiver).await, vec![i; 100]);
        }
        let stats = wait_for(&handle, |s| s.sent == 3).await;
        assert_eq!(stats.dropped_queue_full + stats.send_errors, 0);
        drop(handle);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("task ends once every handle is gone")
            .unwrap();
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_full_queue_drops_and_counts_without_waiting() {
        let receiver = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let (handle, _task) = Sender::spawn(receiver.local_addr().unwrap(), 4);
        // The sending task cannot run until this task yields: the queue fills up.
        let start = Instant::now();
        let results: Vec<_> = (0..10u8).map(|i| handle.try_send(vec![i])).collect();
        assert!(start.elapsed() < Duration::from_millis(50));
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 4);
        let e = results[9].unwrap_err();
        assert!(e.to_string().contains("full (4 frames)"), "{e}");
        assert_eq!(handle.stats().dropped_queue_full, 6);
        for i in 0..4u8 {
            assert_eq!(recv(&receiver).await, vec![i]);
        }
    }

    #[tokio::test]
    async fn a_receiver_started_later_gets_the_later_frames() {
        let target = free_port();
        let (handle, _task) = Sender::spawn(target, 64);
        // Nobody listens: sending must neither block nor stop.
        let start = Instant::now();
        for i in 0..20u8 {
            handle.try_send(vec![i]).unwrap();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert!(start.elapsed() < Duration::from_secs(2));
        let before = wait_for(&handle, |s| s.sent == 20).await;
        assert!(
            before.send_errors > 0,
            "ECONNREFUSED from loopback is counted: {before:?}"
        );
        let receiver = UdpSocket::bind(target).await.unwrap();
        for i in 100..103u8 {
            handle.try_send(vec![i]).unwrap();
        }
        for i in 100..103u8 {
            assert_eq!(recv(&receiver).await, vec![i]);
        }
        let after = wait_for(&handle, |s| s.sent == 23).await;
        // At most the refusal of the last frame sent into the void is reported late.
        assert!(after.send_errors <= before.send_errors + 1, "{after:?}");
        assert_eq!(after.dropped_queue_full, 0);
    }
}
