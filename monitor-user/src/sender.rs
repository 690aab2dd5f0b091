//! The UDP sender: frames go through a bounded queue to one tokio task that sends them to the
//! collector. Handing a frame over never blocks or waits, so sampling never stalls on the
//! network.
//!
//! The collector is named by `HOST:PORT` ([`Target`]) and the name is resolved when the task
//! connects, not when the agent starts: a name that does not resolve yet at boot (DNS not up)
//! is retried with backoff while frames wait in the queue, and a collector that moved is found
//! again, because a send that fails drops the connection and the next frame resolves the name
//! afresh (as does a periodic check while sending works, for a collector that moved without
//! a trace on the old address).
//!
//! Every frame handed over is either sent (given to the kernel) or dropped and counted with
//! its reason ([`SenderStats`]): the queue was full, the send failed, or the sender had
//! stopped. A frame taken off the queue while the collector cannot be reached is kept and
//! sent first once it can, so a short outage costs nothing but queue space. A collector that
//! is down (ICMP port unreachable, no route) costs counted send errors, logged once per change
//! of state; each port unreachable that comes back is one frame the kernel sent and the
//! collector's host refused, counted as `refused`, so `dropped + refused` is what a collector
//! misses of the session.
//!
//! Datagrams that come back on the socket (a collector's acknowledgements, their timings and
//! schema requests) are handed, as they are, to the channel given to
//! [`Sender::spawn_with_replies`], each with the monotonic time it was read off the socket
//! (an acknowledgement's timing needs when it arrived, not when the agent's loop got to it);
//! the sender does not read them.

use std::{
    fmt, io,
    net::{Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs as _},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::{net::UdpSocket, sync::mpsc, task::JoinHandle};

use crate::time_base::{MonoNs, monotonic_ns};

/// While sending works, the name is resolved again this often, so a collector that moved to
/// another address without the old one refusing (a black hole) is found within this time.
const RECHECK_EVERY: Duration = Duration::from_secs(60);
/// A failed send asks for the name to be resolved again, but not more often than this.
const MIN_RECHECK: Duration = Duration::from_secs(1);
/// The first wait after the collector could not be reached; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A name lookup that takes longer than this counts as failed (it goes on in the background).
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// The collector's address as the operator gave it, `HOST:PORT` (a name, an IPv4 address or
/// a bracketed IPv6 address). Only its form is checked here; the sending task resolves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target(String);

/// `--collector` is not of the form `HOST:PORT`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("collector address {0:?} is not HOST:PORT (a name or address, then a port 1-65535)")]
pub struct TargetError(String);

impl Target {
    pub fn parse(text: &str) -> Result<Self, TargetError> {
        if text.parse::<SocketAddr>().is_ok() {
            return Ok(Self(text.to_owned()));
        }
        let bad = || TargetError(text.to_owned());
        let (host, port) = text.rsplit_once(':').ok_or_else(bad)?;
        let port_ok = port.parse::<u16>().is_ok_and(|p| p != 0);
        // An unbracketed IPv6 address would be ambiguous; a name has no ':' at all.
        let host_ok =
            !host.is_empty() && !host.contains(':') && !host.contains(char::is_whitespace);
        if port_ok && host_ok {
            Ok(Self(text.to_owned()))
        } else {
            Err(bad())
        }
    }
}

impl std::str::FromStr for Target {
    type Err = TargetError;
    fn from_str(text: &str) -> Result<Self, TargetError> {
        Self::parse(text)
    }
}

impl serde::Serialize for Target {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Target {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

impl From<SocketAddr> for Target {
    fn from(addr: SocketAddr) -> Self {
        Self(addr.to_string())
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Turns `HOST:PORT` into addresses. It blocks (getaddrinfo), so the sender runs it on
/// tokio's blocking pool. Replaceable for tests of names that change or do not resolve yet.
pub type Resolver = Arc<dyn Fn(&str) -> io::Result<Vec<SocketAddr>> + Send + Sync>;

/// The system's resolver (`/etc/hosts`, DNS, ... as glibc is configured).
pub fn system_resolver() -> Resolver {
    Arc::new(|target: &str| Ok(target.to_socket_addrs()?.collect()))
}

/// A datagram the collector sent back, and when it was read off the socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub datagram: Vec<u8>,
    pub received: MonoNs,
}

/// Why a frame was not queued.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum TrySendError {
    #[error("send queue to {target} is full ({capacity} frames): frame dropped")]
    QueueFull { target: Target, capacity: usize },
    #[error("sender to {target} has stopped: frame dropped")]
    Closed { target: Target },
}

/// Counters of a sender, read at any time. Every frame handed to [`SenderHandle::try_send`]
/// ends in exactly one of `sent` and the `dropped_*` counts (or is still queued).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SenderStats {
    /// Frames handed to the kernel.
    pub sent: u64,
    /// Dropped because the queue was full (the collector could not be reached for a while, or
    /// frames came faster than they could be sent).
    pub dropped_queue_full: u64,
    /// Dropped because sending them failed (no route, the collector's port refused twice).
    pub dropped_send_failed: u64,
    /// Still queued when the agent stopped while the collector could not be reached.
    pub dropped_unreachable: u64,
    /// Handed over after the sending task had stopped.
    pub dropped_stopped: u64,
    /// Handed to the kernel but refused at the collector's host: each ICMP port unreachable
    /// reported back (ECONNREFUSED on a later send or read) is one datagram that arrived
    /// while nothing listened. Lost on the way, so not in [`Self::dropped`]; what a collector
    /// sees missing from a session is `dropped() + refused` (where its host answers with ICMP;
    /// a firewall that drops silently reports nothing).
    pub refused: u64,
    /// Send errors: collector unreachable (ICMP port unreachable on an earlier frame), no
    /// route, ... (a frame may still be sent after one, on its second try).
    pub send_errors: u64,
    /// Lookups of the collector's name, or connects, that failed.
    pub resolve_failures: u64,
    /// Connections made: the first, and one after each failure or move of the collector.
    pub connects: u64,
}

impl SenderStats {
    /// Every frame dropped, whatever the reason.
    pub fn dropped(&self) -> u64 {
        self.dropped_queue_full
            + self.dropped_send_failed
            + self.dropped_unreachable
            + self.dropped_stopped
    }
}

impl fmt::Display for SenderStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} frames sent, {} dropped ({} queue full, {} send failed, {} unreachable at stop, \
             {} after stop), {} refused by the collector's host, {} send errors, {} failed \
             lookups, {} connects",
            self.sent,
            self.dropped(),
            self.dropped_queue_full,
            self.dropped_send_failed,
            self.dropped_unreachable,
            self.dropped_stopped,
            self.refused,
            self.send_errors,
            self.resolve_failures,
            self.connects
        )
    }
}

#[derive(Debug, Default)]
struct Counters {
    sent: AtomicU64,
    dropped_queue_full: AtomicU64,
    dropped_send_failed: AtomicU64,
    dropped_unreachable: AtomicU64,
    dropped_stopped: AtomicU64,
    refused: AtomicU64,
    send_errors: AtomicU64,
    resolve_failures: AtomicU64,
    connects: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Cheap to clone; every clone feeds the same queue.
#[derive(Clone)]
pub struct SenderHandle {
    tx: mpsc::Sender<Vec<u8>>,
    target: Target,
    capacity: usize,
    counters: Arc<Counters>,
}

impl SenderHandle {
    /// Queues one frame; returns at once. A full queue drops the frame (counted).
    pub fn try_send(&self, frame: Vec<u8>) -> Result<(), TrySendError> {
        match self.tx.try_send(frame) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(_)) => {
                bump(&self.counters.dropped_queue_full);
                Err(TrySendError::QueueFull {
                    target: self.target.clone(),
                    capacity: self.capacity,
                })
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                bump(&self.counters.dropped_stopped);
                Err(TrySendError::Closed {
                    target: self.target.clone(),
                })
            }
        }
    }

    pub fn stats(&self) -> SenderStats {
        stats(&self.counters)
    }

    pub fn target(&self) -> &Target {
        &self.target
    }
}

fn stats(c: &Counters) -> SenderStats {
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    SenderStats {
        sent: load(&c.sent),
        dropped_queue_full: load(&c.dropped_queue_full),
        dropped_send_failed: load(&c.dropped_send_failed),
        dropped_unreachable: load(&c.dropped_unreachable),
        dropped_stopped: load(&c.dropped_stopped),
        refused: load(&c.refused),
        send_errors: load(&c.send_errors),
        resolve_failures: load(&c.resolve_failures),
        connects: load(&c.connects),
    }
}

pub struct Sender;

impl Sender {
    /// Starts the sending task on the current tokio runtime. It ends when every handle has
    /// been dropped and the queue is drained.
    pub fn spawn(
        target: impl Into<Target>,
        queue_capacity: usize,
    ) -> (SenderHandle, JoinHandle<SenderStats>) {
        Self::spawn_with_replies(target, queue_capacity, None)
    }

    /// Like [`spawn`](Self::spawn); datagrams the target sends back go to `replies` (dropped
    /// when it is full or absent).
    pub fn spawn_with_replies(
        target: impl Into<Target>,
        queue_capacity: usize,
        replies: Option<mpsc::Sender<Reply>>,
    ) -> (SenderHandle, JoinHandle<SenderStats>) {
        Self::spawn_with_resolver(target, queue_capacity, replies, system_resolver())
    }

    /// Like [`spawn_with_replies`](Self::spawn_with_replies), resolving the target's name
    /// with `resolver`.
    pub fn spawn_with_resolver(
        target: impl Into<Target>,
        queue_capacity: usize,
        replies: Option<mpsc::Sender<Reply>>,
        resolver: Resolver,
    ) -> (SenderHandle, JoinHandle<SenderStats>) {
        let target = target.into();
        let capacity = queue_capacity.max(1);
        let (tx, rx) = mpsc::channel(capacity);
        let counters = Arc::new(Counters::default());
        let task = SendTask {
            target: target.clone(),
            resolver,
            counters: Arc::clone(&counters),
            replies,
            failing: None,
        };
        let task = tokio::spawn(task.run(rx));
        let handle = SenderHandle {
            tx,
            target,
            capacity,
            counters,
        };
        (handle, task)
    }
}

/// A socket connected to one of the target's addresses: on Linux only a connected UDP socket
/// hears of ICMP errors (port unreachable shows up as ECONNREFUSED on a later send).
struct Connection {
    socket: Arc<UdpSocket>,
    addr: SocketAddr,
    /// When the name was last resolved for this connection.
    checked_at: Instant,
    /// The last send failed: resolve the name again (after [`MIN_RECHECK`]).
    suspect: bool,
    /// How many ECONNREFUSED the reader saw since the sender last looked: ICMP errors of
    /// earlier frames, which a send would otherwise have reported.
    refused: Arc<AtomicU64>,
    reader: Option<JoinHandle<()>>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        if let Some(reader) = self.reader.take() {
            reader.abort();
        }
    }
}

impl Connection {
    fn recheck_due(&self) -> bool {
        let since = self.checked_at.elapsed();
        since >= RECHECK_EVERY || (self.suspect && since >= MIN_RECHECK)
    }
}

struct SendTask {
    target: Target,
    resolver: Resolver,
    counters: Arc<Counters>,
    replies: Option<mpsc::Sender<Reply>>,
    /// Errors since sending last worked; `None` while it works.
    failing: Option<u64>,
}

impl SendTask {
    /// Runs until every handle is gone and the queue is drained; returns the final counts.
    async fn run(mut self, mut rx: mpsc::Receiver<Vec<u8>>) -> SenderStats {
        let mut connection: Option<Connection> = None;
        let mut backoff = FIRST_BACKOFF;
        // A frame taken off the queue that could not be sent yet: it goes first.
        let mut pending: Option<Vec<u8>> = None;
        loop {
            let frame = match pending.take() {
                Some(frame) => frame,
                None => match rx.recv().await {
                    Some(frame) => frame,
                    None => break,
                },
            };
            if let Some(c) = connection.as_mut()
                && c.recheck_due()
            {
                c.checked_at = Instant::now();
                c.suspect = false;
                if let Ok(addrs) = self.resolve().await
                    && !addrs.contains(&c.addr)
                {
                    tracing::info!(
                        "{} now resolves to {}: sending there",
                        self.target,
                        addrs[0]
                    );
                    connection = None;
                }
            }
            if connection.is_none() {
                match self.connect().await {
                    Ok(c) => {
                        backoff = FIRST_BACKOFF;
                        connection = Some(c);
                    }
                    Err(e) => {
                        bump(&self.counters.resolve_failures);
                        self.note_error(&e);
                        if rx.is_closed() {
                            // The agent is stopping and the collector cannot be reached.
                            let mut left = 1;
                            while rx.try_recv().is_ok() {
                                left += 1;
                            }
                            self.counters
                                .dropped_unreachable
                                .fetch_add(left, Ordering::Relaxed);
                            break;
                        }
                        // The frame waits, and the queue with it (overflow is counted).
                        pending = Some(frame);
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        continue;
                    }
                }
            }
            let Some(c) = connection.as_mut() else {
                continue;
            };
            if self.send(c, &frame).await {
                continue;
            }
            // The frame is lost; the next one looks the name up again (the collector may
            // have moved), or reconnects when the socket itself broke.
            bump(&self.counters.dropped_send_failed);
            c.suspect = true;
        }
        if let Some(c) = connection {
            // The last frames' refusals, not yet reported by a send.
            let mut refusals = c.refused.swap(0, Ordering::Relaxed);
            if let Ok(Some(e)) = c.socket.take_error()
                && e.kind() == io::ErrorKind::ConnectionRefused
            {
                refusals += 1;
            }
            self.counters.refused.fetch_add(refusals, Ordering::Relaxed);
        }
        stats(&self.counters)
    }

    /// Sends one frame; false when it could not be sent.
    /// A refusal also marks the connection suspect: the collector may have moved.
    async fn send(&mut self, c: &mut Connection, frame: &[u8]) -> bool {
        // ECONNREFUSED reports the ICMP error of an earlier frame; this one was not sent
        // and gets one more try. Recovery is a send with no such report.
        let refusals = c.refused.swap(0, Ordering::Relaxed);
        self.counters.refused.fetch_add(refusals, Ordering::Relaxed);
        let earlier_refused = refusals > 0;
        if earlier_refused {
            c.suspect = true;
            self.note_error(&io::Error::from(io::ErrorKind::ConnectionRefused));
        }
        let result = match c.socket.send(frame).await {
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                bump(&self.counters.refused);
                c.suspect = true;
                self.note_error(&e);
                c.socket.send(frame).await.map(|_| false)
            }
            other => other.map(|_| !earlier_refused),
        };
        match result {
            Ok(clean) => {
                bump(&self.counters.sent);
                if clean && let Some(errors) = self.failing.take() {
                    tracing::info!(
                        "sending to {} works again after {errors} errors",
                        self.target
                    );
                }
                true
            }
            Err(e) => {
                self.note_error(&e);
                false
            }
        }
    }

    /// Resolves the target's name off the runtime, with a time limit.
    async fn resolve(&self) -> io::Result<Vec<SocketAddr>> {
        let resolver = Arc::clone(&self.resolver);
        let target = self.target.0.clone();
        let lookup = tokio::task::spawn_blocking(move || resolver(&target));
        let addrs = match tokio::time::timeout(RESOLVE_TIMEOUT, lookup).await {
            Ok(Ok(result)) => result?,
            Ok(Err(join)) => return Err(io::Error::other(join)),
            Err(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("looking up {} took over {RESOLVE_TIMEOUT:?}", self.target),
                ));
            }
        };
        if addrs.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} has no address", self.target),
            ));
        }
        Ok(addrs)
    }

    async fn connect(&self) -> io::Result<Connection> {
        let addrs = self.resolve().await?;
        let mut last_error = None;
        for addr in addrs {
            match connect(addr).await {
                Ok(socket) => {
                    bump(&self.counters.connects);
                    let socket = Arc::new(socket);
                    let refused = Arc::new(AtomicU64::new(0));
                    let reader = self.replies.as_ref().map(|replies| {
                        tokio::spawn(read_replies(
                            Arc::clone(&socket),
                            replies.clone(),
                            Arc::clone(&refused),
                        ))
                    });
                    return Ok(Connection {
                        socket,
                        addr,
                        checked_at: Instant::now(),
                        suspect: false,
                        refused,
                        reader,
                    });
                }
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| io::Error::from(io::ErrorKind::AddrNotAvailable)))
    }

    fn note_error(&mut self, e: &io::Error) {
        bump(&self.counters.send_errors);
        match &mut self.failing {
            Some(n) => *n += 1,
            None => {
                tracing::warn!(
                    "sending to {} failed: {e}; errors are counted until it works again",
                    self.target
                );
                self.failing = Some(1);
            }
        }
    }
}

async fn connect(target: SocketAddr) -> io::Result<UdpSocket> {
    let local: SocketAddr = match target {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(local).await?;
    socket.connect(target).await?;
    Ok(socket)
}

/// Hands what comes back on the socket to `replies`. A connected UDP socket receives only
/// from its target; ECONNREFUSED (the target's port was closed when an earlier frame came)
/// is left for the sending side through `refused`.
async fn read_replies(
    socket: Arc<UdpSocket>,
    replies: mpsc::Sender<Reply>,
    refused: Arc<AtomicU64>,
) {
    let mut buf = vec![0u8; 2048];
    loop {
        match socket.recv(&mut buf).await {
            Ok(n) => {
                let received = monotonic_ns();
                // A full channel drops the datagram: requests are repeated by the collector.
                let _ = replies.try_send(Reply {
                    datagram: buf[..n].to_vec(),
                    received,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                refused.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::debug!("reading replies from the collector: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
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
        let e = results[9].clone().unwrap_err();
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

    /// A resolver whose answer the test changes: `None` = the name does not resolve.
    fn scripted_resolver(answer: Arc<std::sync::Mutex<Option<SocketAddr>>>) -> Resolver {
        Arc::new(move |_: &str| {
            answer
                .lock()
                .unwrap()
                .map(|a| vec![a])
                .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "name or service not known"))
        })
    }

    #[test]
    fn collector_addresses_are_checked_for_form_only() {
        for good in [
            "collector:9000",
            "10.0.0.1:9000",
            "[fe80::1]:9000",
            "c.example.org:1",
        ] {
            assert_eq!(Target::parse(good).unwrap().to_string(), good);
        }
        for bad in [
            "collector",
            "collector:",
            ":9000",
            "collector:0",
            "collector:70000",
            "fe80::1:9000",
            "a b:1",
        ] {
            let e = Target::parse(bad).unwrap_err();
            assert!(e.to_string().contains(bad), "{e}");
        }
    }

    #[tokio::test]
    async fn a_name_that_resolves_later_loses_no_frame() {
        let receiver = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let answer = Arc::new(std::sync::Mutex::new(None));
        let (handle, task) = Sender::spawn_with_resolver(
            Target::parse("collector.invalid:9000").unwrap(),
            64,
            None,
            scripted_resolver(Arc::clone(&answer)),
        );
        for i in 0..5u8 {
            handle.try_send(vec![i]).unwrap();
        }
        // The name does not resolve (DNS not up at boot): the sender keeps the frames.
        let waiting = wait_for(&handle, |s| s.resolve_failures >= 2).await;
        assert_eq!((waiting.sent, waiting.dropped()), (0, 0), "{waiting}");
        *answer.lock().unwrap() = Some(receiver.local_addr().unwrap());
        for i in 0..5u8 {
            assert_eq!(recv(&receiver).await, vec![i]);
        }
        drop(handle);
        let stats = tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (stats.sent, stats.dropped(), stats.connects),
            (5, 0, 1),
            "{stats}"
        );
    }

    #[tokio::test]
    async fn a_collector_that_moved_is_found_again() {
        let old = free_port();
        let new = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let answer = Arc::new(std::sync::Mutex::new(Some(old)));
        let (handle, task) = Sender::spawn_with_resolver(
            Target::parse("collector.example:9000").unwrap(),
            256,
            None,
            scripted_resolver(Arc::clone(&answer)),
        );
        handle.try_send(vec![1]).unwrap();
        wait_for(&handle, |s| s.sent == 1).await;
        // The old address refuses; the name now points to the new one.
        *answer.lock().unwrap() = Some(new.local_addr().unwrap());
        let mut handed = 1u64;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut buf = [0u8; 64];
        let first = loop {
            assert!(
                Instant::now() < deadline,
                "never reached the new address: {}",
                handle.stats()
            );
            handle.try_send(vec![7; 10]).unwrap();
            handed += 1;
            if let Ok(Ok(n)) =
                tokio::time::timeout(Duration::from_millis(50), new.recv(&mut buf)).await
            {
                break n;
            }
        };
        assert_eq!(first, 10);
        drop(handle);
        let stats = tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            stats.sent + stats.dropped(),
            handed,
            "every frame accounted for: {stats}"
        );
        assert_eq!(stats.connects, 2, "{stats}");
    }

    #[tokio::test]
    async fn frames_left_when_stopping_unreachable_are_counted() {
        let answer = Arc::new(std::sync::Mutex::new(None));
        let (handle, task) = Sender::spawn_with_resolver(
            Target::parse("collector.invalid:9000").unwrap(),
            64,
            None,
            scripted_resolver(answer),
        );
        for i in 0..7u8 {
            handle.try_send(vec![i]).unwrap();
        }
        drop(handle);
        let stats = tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((stats.sent, stats.dropped_unreachable), (0, 7), "{stats}");
    }
}
