//! The spool: every frame the agent sends, kept until its collectors acknowledge it
//! (docs/wire-format.md, "Acknowledgements"; docs/agent.md, "Delivery"). A collector
//! acknowledges only frames durable in its archive, so a frame leaves the spool once no
//! collector crash can lose it: when every collector has it, or, past the age limit, when
//! one has it (a collector pair with one member away for long).
//!
//! What is not acknowledged in time, or what a collector names as missing, is sent again,
//! oldest first, paced so that a fleet returning to a collector after an outage does not
//! flood it. The pace adapts to what the collector takes (`Pace`): a collector that drops
//! datagrams (its receive buffers full: a fleet's backlog at once) names the frames sent
//! again as missing once more, and the agent halves its pace; while they arrive, it speeds
//! up again, up to [`SpoolConfig::resend_rate`]. So a fleet of any size settles near what
//! its collector can take, as TCP's senders share a link. Resent frames are the very bytes
//! first sent (original times, original sequence numbers): the collector stores each once.
//!
//! Bounded: at [`SpoolConfig::max_bytes`] the oldest frames are evicted, and frames no
//! collector acknowledged within [`SpoolConfig::max_age`] are given up; both are counted
//! (`railscope_agent_bound_hits_total{bound="spool_full"|"spool_age"}`), never silent.
//!
//! With a `SpoolFile`, every frame is also written to disk before it is sent, and what a
//! previous run left there is taken back at start ([`Spool::attach`]), so an agent restart
//! loses nothing either.

use std::{
    collections::VecDeque,
    time::{Duration, Instant, SystemTime},
};

use monitor_wire::{Ack, peek_sequence};

use crate::spool_file::{Loaded, SessionState, SpoolFile, record_len};

/// How much the spool keeps, and how it sends again.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpoolConfig {
    /// Bytes of frames kept at most (default 16 MiB: over four hours of a node of 8 GPUs and
    /// 8 ports, which sends about 1 KB/s).
    pub max_bytes: usize,
    /// A frame no collector acknowledged is given up after this (default 1 h, the
    /// collector's `max-frame-age`: older frames would be refused there).
    pub max_age: Duration,
    /// A frame not acknowledged this long after it was sent is sent again, if its collector
    /// answered since (default 10 s: a collector acknowledges within about a second).
    pub resend_after: Duration,
    /// Bytes per second resent at most, per collector (default 16 KiB/s, about 12 times what
    /// a node of 8 GPUs and 8 ports sends live: alone, a 10-minute backlog drains in under a
    /// minute). The pace starts at a quarter of it and adapts (`Pace`).
    pub resend_rate: u64,
}

impl Default for SpoolConfig {
    fn default() -> Self {
        Self {
            max_bytes: 16 << 20,
            max_age: Duration::from_secs(3600),
            resend_after: Duration::from_secs(10),
            resend_rate: 16 << 10,
        }
    }
}

/// What the spool did, for the agent's state report and its log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpoolStats {
    /// Frames evicted at the byte bound, unacknowledged.
    pub evicted_full: u64,
    /// Frames given up at the age limit, acknowledged by no collector.
    pub evicted_age: u64,
    /// Frames that left the spool acknowledged.
    pub delivered: u64,
    /// Frames sent again.
    pub resent: u64,
    /// Times the pace of resends halved: frames sent again were lost again (a collector
    /// taking more than it can).
    pub resend_slowdowns: u64,
    /// Acknowledgements taken.
    pub acks: u64,
    /// Acknowledgements refused: not for this node, of a session it never had, or naming
    /// frames it never sent.
    pub acks_refused: u64,
    /// Frames taken back from the spool file at start, to deliver.
    pub restored: u64,
}

/// Why an acknowledgement was not taken.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AckRefused {
    #[error("acknowledgement for node {0:?}, not this one")]
    OtherNode(String),
    #[error("acknowledgement of session {0:08x}, which this agent never had")]
    UnknownSession(u32),
    #[error(
        "acknowledgement of frames up to {acked} of session {session:08x}, but only {sent} were sent"
    )]
    BeyondSent { session: u32, acked: u64, sent: u64 },
}

struct Spooled {
    session: u32,
    seq: u64,
    bytes: Vec<u8>,
    made: Instant,
    /// When it was first spooled, on the wall clock (kept in the file across restarts).
    unix_ns: u64,
    /// Per collector: when it was last sent there.
    sent: Vec<Instant>,
    /// Collectors that hold it (bit per collector).
    acked: u32,
    /// Collectors that named it missing since it was last sent there.
    missing: u32,
    /// Collectors it was sent to again (a bit each): named missing once more, it was lost
    /// again, which slows the pace.
    resent: u32,
}

/// The pace at which frames are sent again to one collector: additive increase,
/// multiplicative decrease, as TCP's congestion control. A resent frame that the collector's
/// acknowledgement names as missing once more (past [`IN_FLIGHT`]) was dropped on the way,
/// most likely at a collector flooded by a fleet's backlog: the pace halves, at most once per
/// [`IN_FLIGHT`] (one burst of losses is one signal), down to [`Pace::MIN`] (1 KiB/s). An
/// acknowledgement that takes resent frames and names none lost raises it by a sixteenth of
/// the maximum, up to [`SpoolConfig::resend_rate`].
#[derive(Clone, Copy, Debug)]
struct Pace {
    /// Bytes per second.
    rate: f64,
    /// The slowest and fastest rate.
    min: f64,
    max: f64,
    /// Bytes it may send now.
    tokens: f64,
    last_cut: Option<Instant>,
}

impl Pace {
    /// The slowest pace: about what a node sends live, so a backlog still shrinks.
    const MIN: f64 = 1024.0;

    fn new(max: u64) -> Self {
        let max = max as f64;
        let min = Self::MIN.min(max);
        Self {
            rate: (max / 4.0).max(min),
            min,
            max,
            tokens: 0.0,
            last_cut: None,
        }
    }

    fn refill(&mut self, seconds: f64) {
        let burst = self.rate.max(1500.0);
        self.tokens = (self.tokens + seconds * self.rate).min(burst);
    }

    fn lost(&mut self, now: Instant) {
        if self
            .last_cut
            .is_none_or(|cut| now.duration_since(cut) >= IN_FLIGHT)
        {
            self.rate = (self.rate / 2.0).max(self.min);
            self.last_cut = Some(now);
        }
    }

    fn delivered(&mut self) {
        self.rate = (self.rate + self.max / 16.0).min(self.max);
    }
}

/// Frames not yet acknowledged by every collector.
pub struct Spool {
    config: SpoolConfig,
    node: String,
    collectors: usize,
    frames: VecDeque<Spooled>,
    bytes: usize,
    /// Per session seen, one more than the highest sequence number sent.
    sessions: Vec<(u32, u64)>,
    /// Per collector: when it last acknowledged anything.
    heard: Vec<Option<Instant>>,
    /// Per collector: the pace of resends.
    pace: Vec<Pace>,
    refilled: Instant,
    stats: SpoolStats,
    /// The frames on disk too, when the spool directory could be used.
    file: Option<SpoolFile>,
}

/// How long after a frame went to a collector that collector's acknowledgement may still
/// lack it without it being lost: a collector acknowledges what is durable, synced about once
/// a second, so an acknowledgement made in the second after a frame arrived does not name it
/// yet. Sending it again then would only make a copy the collector refuses.
pub const IN_FLIGHT: Duration = Duration::from_secs(2);

/// At most this many collectors (a bit each).
pub const MAX_COLLECTORS: usize = 8;

impl Spool {
    pub fn new(node: &str, collectors: usize, config: SpoolConfig, now: Instant) -> Self {
        let collectors = collectors.clamp(1, MAX_COLLECTORS);
        Self {
            config,
            node: node.to_owned(),
            collectors,
            frames: VecDeque::new(),
            bytes: 0,
            sessions: Vec::new(),
            heard: vec![None; collectors],
            pace: vec![Pace::new(config.resend_rate); collectors],
            refilled: now,
            stats: SpoolStats::default(),
            file: None,
        }
    }

    /// Keeps the frames on disk too, from now on, starting with what a previous run left
    /// there (`loaded`, from `SpoolFile::open`): its frames are kept as if just sent, with
    /// their age, and sent again once a collector names them missing or late; those past the
    /// age limit count as given up. `state` is the session the agent goes on with (the
    /// loaded one, resumed, when it has frames).
    pub fn attach(
        &mut self,
        mut file: SpoolFile,
        loaded: Loaded,
        state: SessionState,
        now: Instant,
    ) {
        self.stats.evicted_age += loaded.too_old;
        let now_unix = unix_now();
        for frame in loaded.frames {
            let age = Duration::from_nanos(now_unix.saturating_sub(frame.spooled_unix_ns));
            // Sent when it was made, before the restart: the first acknowledgement that
            // lacks it names it missing.
            let made = now.checked_sub(age).unwrap_or(now);
            self.keep(frame.bytes, made, frame.spooled_unix_ns, made);
            self.stats.restored += 1;
        }
        self.note_sent(state.session, state.next_seq);
        file.set_state(state);
        self.file = Some(file);
        self.rewrite_file();
    }

    /// The encoder's session, next frame and next series id: what the file's header keeps,
    /// so that a restart resumes above them.
    pub fn set_session(&mut self, state: SessionState) {
        if let Some(file) = &mut self.file {
            file.set_state(state);
        }
    }

    /// At stop: the file holds only what is still to deliver, synced.
    pub fn persist(&mut self) {
        if self.file.is_some() {
            self.rewrite_file();
        }
    }

    fn rewrite_file(&mut self) {
        let Some(file) = &mut self.file else { return };
        let live = self.frames.iter().map(|f| (f.bytes.as_slice(), f.unix_ns));
        if let Err(e) = file.rewrite(live) {
            self.file_failed(&e);
        }
    }

    /// The file cannot be written (a full disk): one warning, memory only from now on.
    fn file_failed(&mut self, e: &std::io::Error) {
        if let Some(file) = self.file.take() {
            tracing::warn!(
                "spool file {}: {e}: frames kept in memory only from now on (an agent \
                 restart loses those not yet acknowledged)",
                file.path().display()
            );
        }
    }

    /// Frames whose records take `record_bytes` left the spool: those records are dead,
    /// rewritten away once they are most of the file.
    fn released(&mut self, record_bytes: u64) {
        if let Some(file) = &mut self.file {
            file.released(record_bytes);
        }
    }

    fn rewrite_if_due(&mut self) {
        if self.file.as_ref().is_some_and(SpoolFile::wants_rewrite) {
            self.rewrite_file();
        }
    }

    /// `session` had frames up to `end` (exclusive) sent: acknowledgements up to there are
    /// believable.
    fn note_sent(&mut self, session: u32, end: u64) {
        match self.sessions.iter_mut().find(|(s, _)| *s == session) {
            Some((_, e)) => *e = (*e).max(end),
            None => {
                if self.sessions.len() == 8 {
                    self.sessions.remove(0);
                }
                self.sessions.push((session, end));
            }
        }
    }

    /// The pace of resends to `collector` now, in bytes per second.
    pub fn resend_rate(&self, collector: usize) -> f64 {
        self.pace.get(collector).map_or(0.0, |p| p.rate)
    }

    pub fn stats(&self) -> SpoolStats {
        self.stats
    }

    /// An acknowledgement that did not decode (a wrong key, another node's, garbled).
    pub fn count_refused(&mut self) {
        self.stats.acks_refused += 1;
    }

    /// Frames held.
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Bytes of the frames held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Keeps a frame the agent is about to send to every collector (in the file first, when
    /// there is one); evicts the oldest at the byte bound.
    pub fn push(&mut self, bytes: Vec<u8>, now: Instant) {
        let unix_ns = unix_now();
        if let Some(file) = &mut self.file
            && let Err(e) = file.append(&bytes, unix_ns)
        {
            self.file_failed(&e);
        }
        self.keep(bytes, now, unix_ns, now);
    }

    /// Syncs the frames pushed to the spool file: called before they are sent, so that no
    /// frame leaves the node that a restart, even after a power loss, would not find.
    pub fn sync_file(&mut self) {
        if let Some(file) = &mut self.file
            && let Err(e) = file.sync()
        {
            self.file_failed(&e);
        }
    }

    fn keep(&mut self, bytes: Vec<u8>, made: Instant, unix_ns: u64, sent: Instant) {
        let Some((session, seq)) = peek_sequence(&bytes) else {
            return;
        };
        self.note_sent(session, seq + 1);
        self.bytes += bytes.len();
        self.frames.push_back(Spooled {
            session,
            seq,
            bytes,
            made,
            unix_ns,
            sent: vec![sent; self.collectors],
            acked: 0,
            missing: 0,
            resent: 0,
        });
        while self.bytes > self.config.max_bytes {
            let Some(old) = self.frames.pop_front() else {
                break;
            };
            self.bytes -= old.bytes.len();
            self.released(record_len(old.bytes.len()));
            if old.acked == 0 {
                self.stats.evicted_full += 1;
            } else {
                self.stats.delivered += 1;
            }
        }
        self.rewrite_if_due();
    }

    /// Takes collector `from`'s acknowledgement: frames it holds are marked, frames it names
    /// missing are sent again first. An acknowledgement that cannot be right (another node's,
    /// of a session never sent, of frames never sent) changes nothing and is counted.
    pub fn on_ack(&mut self, from: usize, ack: &Ack, now: Instant) -> Result<(), AckRefused> {
        let refused = self.check(ack);
        if refused.is_err() || from >= self.collectors {
            self.stats.acks_refused += 1;
            return refused;
        }
        self.stats.acks += 1;
        self.heard[from] = Some(now);
        let bit = 1 << from;
        let end = ack.end();
        let (mut resent_held, mut resent_lost) = (false, false);
        for f in self.frames.iter_mut().filter(|f| f.session == ack.session) {
            if ack.holds(f.seq) {
                resent_held |= f.acked & bit == 0 && f.resent & bit != 0;
                f.acked |= bit;
                f.missing &= !bit;
            } else if f.seq < end && now.duration_since(f.sent[from]) >= IN_FLIGHT {
                resent_lost |= f.resent & bit != 0 && f.missing & bit == 0;
                f.missing |= bit;
            }
        }
        if resent_lost {
            self.pace[from].lost(now);
            self.stats.resend_slowdowns += 1;
        } else if resent_held {
            self.pace[from].delivered();
        }
        self.release(now);
        Ok(())
    }

    fn check(&self, ack: &Ack) -> Result<(), AckRefused> {
        if ack.node != self.node {
            return Err(AckRefused::OtherNode(ack.node.clone()));
        }
        let Some(&(_, sent)) = self.sessions.iter().find(|(s, _)| *s == ack.session) else {
            return Err(AckRefused::UnknownSession(ack.session));
        };
        if ack.end() > sent {
            return Err(AckRefused::BeyondSent {
                session: ack.session,
                acked: ack.end(),
                sent,
            });
        }
        Ok(())
    }

    /// Drops what every collector holds, what one holds past the age limit, and gives up
    /// what none acknowledged past it.
    fn release(&mut self, now: Instant) {
        let all = (1u32 << self.collectors) - 1;
        let max_age = self.config.max_age;
        let mut delivered = 0;
        let mut given_up = 0;
        let mut freed = 0;
        let mut records = 0;
        self.frames.retain(|f| {
            let old = now.duration_since(f.made) >= max_age;
            let keep = f.acked != all && !old;
            if !keep {
                freed += f.bytes.len();
                records += record_len(f.bytes.len());
                if f.acked == 0 {
                    given_up += 1;
                } else {
                    delivered += 1;
                }
            }
            keep
        });
        self.bytes -= freed;
        self.stats.delivered += delivered;
        self.stats.evicted_age += given_up;
        self.released(records);
        self.rewrite_if_due();
    }

    /// The frames to send again now, oldest first, as (collector, bytes): those named
    /// missing, and those unacknowledged past `resend_after` by a collector that answered
    /// since; within each collector's pace.
    pub fn due(&mut self, now: Instant) -> Vec<(usize, Vec<u8>)> {
        self.release(now);
        let elapsed = now.duration_since(self.refilled).as_secs_f64();
        self.refilled = now;
        for pace in &mut self.pace {
            pace.refill(elapsed);
        }
        let mut out = Vec::new();
        for f in self.frames.iter_mut() {
            for c in 0..self.collectors {
                let bit = 1 << c;
                if f.acked & bit != 0 {
                    continue;
                }
                // Late: the collector acknowledged something since this frame went there,
                // but not this frame. A collector that answers nothing is sent nothing again
                // (its gaps are named when it is back).
                let late = now.duration_since(f.sent[c]) >= self.config.resend_after
                    && self.heard[c].is_some_and(|heard| heard > f.sent[c]);
                if f.missing & bit == 0 && !late {
                    continue;
                }
                if self.pace[c].tokens < f.bytes.len() as f64 {
                    continue;
                }
                self.pace[c].tokens -= f.bytes.len() as f64;
                f.sent[c] = now;
                f.missing &= !bit;
                f.resent |= bit;
                self.stats.resent += 1;
                out.push((c, f.bytes.clone()));
            }
        }
        out
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use monitor_wire::{Frame, Key, SeqSet, encode_frame};

    use super::*;

    fn frame(seq: u64) -> Vec<u8> {
        encode_frame(
            &Frame {
                node: "n1".into(),
                session: 7,
                seq,
                send_unix_ns: 1_000_000_000 + seq,
                time_quantum_ns: 1_000_000,
                schema: Vec::new(),
                samples: Vec::new(),
                events: Vec::new(),
            },
            &Key::from_bytes([1; 32]),
        )
        .unwrap()
    }

    fn ack(held: &[u64]) -> Ack {
        let mut set = SeqSet::default();
        for &s in held {
            set.insert(s);
        }
        Ack::of("n1", 7, &set)
    }

    #[test]
    fn frames_leave_once_acknowledged_and_gaps_are_sent_again_first() {
        let t0 = Instant::now();
        let mut spool = Spool::new("n1", 1, SpoolConfig::default(), t0);
        for seq in 0..10 {
            spool.push(frame(seq), t0);
        }
        // Frames 3 and 4 were lost on the way: an acknowledgement made once they could be
        // durable lacks them.
        let t1 = t0 + IN_FLIGHT;
        spool
            .on_ack(0, &ack(&[0, 1, 2, 5, 6, 7, 8, 9]), t1)
            .unwrap();
        assert_eq!(spool.len(), 2);
        let again: Vec<_> = spool
            .due(t1)
            .into_iter()
            .map(|(c, b)| (c, peek_sequence(&b).unwrap().1))
            .collect();
        assert_eq!(again, vec![(0, 3), (0, 4)]);
        assert!(spool.due(t1).is_empty(), "not twice at once");
        spool
            .on_ack(0, &ack(&(0..10).collect::<Vec<_>>()), t1)
            .unwrap();
        assert!(spool.is_empty());
        assert_eq!(spool.stats().delivered, 10);
    }

    /// A frame sent again is not sent a third time on an acknowledgement that cannot have
    /// seen it durable yet (the collector syncs about once a second), only on a later one
    /// that still lacks it.
    #[test]
    fn a_frame_in_flight_is_not_sent_again_until_an_acknowledgement_could_hold_it() {
        let t0 = Instant::now();
        let mut spool = Spool::new("n1", 1, SpoolConfig::default(), t0);
        for seq in 0..4 {
            spool.push(frame(seq), t0);
        }
        let t1 = t0 + IN_FLIGHT;
        spool.on_ack(0, &ack(&[0, 1, 3]), t1).unwrap();
        assert_eq!(spool.due(t1).len(), 1, "frame 2, sent again");
        // Half a second later the collector, not yet synced, still lacks it.
        let t2 = t1 + Duration::from_millis(500);
        spool.on_ack(0, &ack(&[0, 1, 3]), t2).unwrap();
        assert!(spool.due(t2 + Duration::from_millis(250)).is_empty());
        // Past the time it needs, an acknowledgement without it means it was lost again.
        let t3 = t1 + IN_FLIGHT;
        spool.on_ack(0, &ack(&[0, 1, 3]), t3).unwrap();
        assert_eq!(spool.due(t3).len(), 1);
        assert_eq!(spool.stats().resent, 2);
    }

    /// Resent frames lost again (a flooded collector) halve the pace, once per burst of
    /// losses; resent frames taken raise it by a sixteenth of the maximum.
    #[test]
    fn the_pace_halves_when_resends_are_lost_and_rises_when_they_arrive() {
        let t0 = Instant::now();
        let mut spool = Spool::new("n1", 1, SpoolConfig::default(), t0);
        for seq in 0..2000 {
            spool.push(frame(seq), t0);
        }
        assert_eq!(
            spool.resend_rate(0),
            4096.0,
            "a quarter of 16 KiB/s to start"
        );
        // The collector is back and has only the newest frame.
        let t1 = t0 + IN_FLIGHT;
        spool.on_ack(0, &ack(&[1999]), t1).unwrap();
        let first = spool.due(t1 + Duration::from_secs(1));
        assert!(!first.is_empty());
        // Two seconds on, it still lacks them all: the resends were dropped.
        let t2 = t1 + Duration::from_secs(1) + IN_FLIGHT;
        spool.on_ack(0, &ack(&[1999]), t2).unwrap();
        assert_eq!(spool.resend_rate(0), 2048.0);
        // The same losses named again at once are not a second signal.
        spool.on_ack(0, &ack(&[1999]), t2).unwrap();
        assert_eq!(spool.resend_rate(0), 2048.0);
        assert_eq!(spool.stats().resend_slowdowns, 1);
        // Sent again, and this time they arrive.
        let second: Vec<u64> = spool
            .due(t2 + Duration::from_secs(1))
            .iter()
            .map(|(_, b)| peek_sequence(b).unwrap().1)
            .collect();
        assert!(!second.is_empty());
        let mut held = second.clone();
        held.push(1999);
        spool
            .on_ack(0, &ack(&held), t2 + Duration::from_secs(1) + IN_FLIGHT)
            .unwrap();
        assert_eq!(spool.resend_rate(0), 2048.0 + 1024.0);
    }

    #[test]
    fn acknowledgements_that_cannot_be_right_drop_nothing_and_are_counted() {
        let t0 = Instant::now();
        let mut spool = Spool::new("n1", 1, SpoolConfig::default(), t0);
        for seq in 0..3 {
            spool.push(frame(seq), t0);
        }
        let beyond = ack(&[0, 1, 2, 3, 4]);
        assert!(matches!(
            spool.on_ack(0, &beyond, t0),
            Err(AckRefused::BeyondSent { .. })
        ));
        let other_node = Ack {
            node: "n2".into(),
            ..ack(&[0])
        };
        assert!(spool.on_ack(0, &other_node, t0).is_err());
        let other_session = Ack {
            session: 8,
            ..ack(&[0])
        };
        assert!(spool.on_ack(0, &other_session, t0).is_err());
        let far = Ack {
            floor: u64::MAX - 1,
            held: Vec::new(),
            ..ack(&[])
        };
        assert!(spool.on_ack(0, &far, t0).is_err());
        assert_eq!((spool.len(), spool.stats().acks_refused), (3, 4));
    }

    #[test]
    fn a_pair_releases_when_both_have_it_or_one_has_it_past_the_age_limit() {
        let t0 = Instant::now();
        let config = SpoolConfig {
            max_age: Duration::from_secs(60),
            ..SpoolConfig::default()
        };
        let mut spool = Spool::new("n1", 2, config, t0);
        for seq in 0..4 {
            spool.push(frame(seq), t0);
        }
        spool.on_ack(0, &ack(&[0, 1, 2, 3]), t0).unwrap();
        spool.on_ack(1, &ack(&[0, 1]), t0).unwrap();
        assert_eq!(spool.len(), 2, "2 and 3: only the first collector has them");
        spool.due(t0 + Duration::from_secs(61));
        assert!(spool.is_empty());
        assert_eq!((spool.stats().delivered, spool.stats().evicted_age), (4, 0));
    }

    #[test]
    fn the_bounds_evict_and_count() {
        let t0 = Instant::now();
        let size = frame(0).len();
        let config = SpoolConfig {
            max_bytes: 3 * size,
            max_age: Duration::from_secs(60),
            ..SpoolConfig::default()
        };
        let mut spool = Spool::new("n1", 1, config, t0);
        for seq in 0..5 {
            spool.push(frame(seq), t0);
        }
        assert_eq!((spool.len(), spool.stats().evicted_full), (3, 2));
        spool.due(t0 + Duration::from_secs(60));
        assert_eq!((spool.len(), spool.stats().evicted_age), (0, 3));
    }

    #[test]
    fn resends_keep_to_the_pace() {
        let t0 = Instant::now();
        let size = frame(0).len() as u64;
        let config = SpoolConfig {
            resend_rate: 10 * size,
            ..SpoolConfig::default()
        };
        let mut spool = Spool::new("n1", 1, config, t0);
        for seq in 1..=1000 {
            spool.push(frame(seq), t0);
        }
        let t1 = t0 + IN_FLIGHT;
        spool.on_ack(0, &ack(&[1000]), t1).unwrap();
        // What the tokens saved up while nothing was due goes first (a burst of at most
        // 1,500 bytes or a second's worth); then the pace.
        assert!(spool.due(t1).len() as u64 * size <= 1500.max(10 * size));
        let mut sent = 0;
        for s in 1..=10 {
            sent += spool.due(t1 + Duration::from_secs(s)).len();
        }
        // 10 frames a second, over 10 s.
        assert!((90..=110).contains(&sent), "{sent}");
    }
}

#[cfg(test)]
mod file_tests {
    use monitor_wire::{Frame, Key, SeqSet, encode_frame};

    use super::*;
    use crate::spool_file::SpoolFile;

    fn frame(seq: u64) -> Vec<u8> {
        let frame = Frame {
            node: "n1".into(),
            session: 7,
            seq,
            send_unix_ns: unix_now(),
            time_quantum_ns: 1_000_000,
            schema: Vec::new(),
            samples: Vec::new(),
            events: Vec::new(),
        };
        encode_frame(&frame, &Key::from_bytes([1; 32])).unwrap()
    }

    fn open(dir: &std::path::Path) -> (SpoolFile, Loaded) {
        let key = Key::from_bytes([1; 32]);
        SpoolFile::open(dir, "n1", &key, Duration::from_secs(3600), unix_now()).unwrap()
    }

    #[test]
    fn what_a_killed_run_left_is_delivered_by_the_next_and_then_leaves_the_file() {
        let dir = std::env::temp_dir().join(format!("railscope-spool-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let t0 = Instant::now();
        let state = |next_seq| SessionState {
            session: 7,
            next_seq,
            next_series_id: 4,
        };
        let mut first = Spool::new("n1", 1, SpoolConfig::default(), t0);
        let (file, loaded) = open(&dir);
        first.attach(file, loaded, state(0), t0);
        for seq in 0..5 {
            first.set_session(state(seq + 1));
            first.push(frame(seq), t0);
        }
        let acked = |seqs: &[u64]| {
            let mut set = SeqSet::default();
            for &s in seqs {
                set.insert(s);
            }
            Ack::of("n1", 7, &set)
        };
        first.on_ack(0, &acked(&[0, 1]), t0).unwrap();
        drop(first); // killed: nothing rewritten

        let mut second = Spool::new("n1", 1, SpoolConfig::default(), t0);
        let (file, loaded) = open(&dir);
        let resume = loaded.resume.unwrap();
        assert_eq!(resume, state(5));
        second.attach(file, loaded, resume, t0);
        // Frames 0 and 1 were acknowledged, but the file was not rewritten yet: taken back
        // too, and dropped at the first acknowledgement, which names 2..5 missing.
        assert_eq!((second.len(), second.stats().restored), (5, 5));
        second.push(frame(5), t0);
        let t1 = t0 + IN_FLIGHT;
        second.on_ack(0, &acked(&[0, 1, 5]), t1).unwrap();
        let again: Vec<u64> = (second.due(t1 + Duration::from_secs(1)))
            .iter()
            .map(|(_, b)| peek_sequence(b).unwrap().1)
            .collect();
        assert_eq!(again, [2, 3, 4]);
        second.persist();
        drop(second);
        let (_, loaded) = open(&dir);
        let left: Vec<u64> = (loaded.frames.iter())
            .map(|f| peek_sequence(&f.bytes).unwrap().1)
            .collect();
        assert_eq!(
            left,
            [2, 3, 4],
            "the stop keeps only what is still to deliver"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_file_is_rewritten_once_mostly_delivered() {
        let dir = std::env::temp_dir().join(format!("railscope-spool-rw-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let t0 = Instant::now();
        let mut spool = Spool::new("n1", 1, SpoolConfig::default(), t0);
        let (file, loaded) = open(&dir);
        spool.attach(file, loaded, SessionState::default(), t0);
        let path = dir.join(crate::spool_file::FILE_NAME);
        let record = record_len(frame(0).len());
        let mut held = SeqSet::default();
        let mut largest = 0;
        for seq in 0..2000 {
            spool.push(frame(seq), t0);
            held.insert(seq);
            spool.on_ack(0, &Ack::of("n1", 7, &held), t0).unwrap();
            largest = largest.max(std::fs::metadata(&path).unwrap().len());
        }
        // 2,000 records written; the delivered ones go once they reach 16 KiB.
        assert!(largest < (16 << 10) + 2 * record, "{largest} bytes");
        assert!(spool.is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
