//! What the series ids of each node's sessions stand for, whatever order the archive holds
//! their frames in.
//!
//! An id means something only within a node's session, from the schema entry that defines
//! it. Frames reach the collector in any order — a session's first datagram (its schema)
//! delayed behind the second (the first flush's samples), an agent restarted while its
//! collector was away whose spool still holds the frames defining the new session's ids while
//! newer frames come first — and the archive keeps them as they came, each accepted and
//! acknowledged. So a reader meets samples before the entry of their id. Those samples wait
//! here, within a bound, and are handed back when the entry is read; what never finds its
//! entry (or found no room to wait) is counted as unplaced: a visible error, never a silent
//! loss (issue 45).

use std::{collections::VecDeque, sync::Arc};

use monitor_wire::SeriesData;

type HashMap<K, V> = foldhash::HashMap<K, V>;

/// Samples (values of [`SeriesData`]) that may wait for their entry at once, all sessions
/// together: a few minutes of a large backlog (an agent's spool of 78 series at one sample a
/// second holds some 28,000 values in 6 min), at about 40 bytes each.
pub const MAX_WAITING: usize = 1 << 20;

/// Sessions of one node kept at once: an agent restarted a few times while its old frames
/// are still replayed. The oldest is forgotten past this (its waiting samples unplaced).
const SESSIONS_PER_NODE: usize = 8;

/// One node session's ids: what each stands for once defined (`T`: the series, or what a
/// reader made of it), and the samples waiting for an id not yet defined.
pub struct Session<T> {
    ids: Vec<Option<T>>,
    waiting: HashMap<u32, Vec<SeriesData>>,
}

impl<T> Default for Session<T> {
    fn default() -> Self {
        Self {
            ids: Vec::new(),
            waiting: HashMap::default(),
        }
    }
}

impl<T> Session<T> {
    /// What `id` stands for, `None` while no entry defined it.
    pub fn get(&self, id: u32) -> Option<&T> {
        self.ids.get(id as usize)?.as_ref()
    }

    /// Whether an entry defined `id`.
    pub fn is_defined(&self, id: u32) -> bool {
        self.get(id).is_some()
    }

    /// Whether any defined id stands for something `wanted` accepts.
    pub fn any(&self, wanted: impl Fn(&T) -> bool) -> bool {
        self.ids.iter().flatten().any(wanted)
    }
}

/// Every node session's ids, with the waiting room their samples share.
pub struct SessionIds<T> {
    sessions: HashMap<(Arc<str>, u32), Session<T>>,
    /// Per node, its sessions in the order first met (the oldest is forgotten first).
    order: HashMap<Arc<str>, VecDeque<u32>>,
    waiting: usize,
    max_waiting: usize,
    unplaced: u64,
}

impl<T> SessionIds<T> {
    pub fn new(max_waiting: usize) -> Self {
        Self {
            sessions: HashMap::default(),
            order: HashMap::default(),
            waiting: 0,
            max_waiting,
            unplaced: 0,
        }
    }

    /// The session `session` of `node` (made, empty, when first met).
    pub fn session(&mut self, node: &Arc<str>, session: u32) -> SessionMut<'_, T> {
        let key = (node.clone(), session);
        if !self.sessions.contains_key(&key) {
            let order = self.order.entry(node.clone()).or_default();
            order.push_back(session);
            if order.len() > SESSIONS_PER_NODE
                && let Some(oldest) = order.pop_front()
                && let Some(old) = self.sessions.remove(&(node.clone(), oldest))
            {
                let values: usize = old.waiting.values().flatten().map(SeriesData::len).sum();
                self.waiting -= values;
                self.unplaced += values as u64;
            }
        }
        SessionMut {
            session: self.sessions.entry(key).or_default(),
            waiting: &mut self.waiting,
            max_waiting: self.max_waiting,
            unplaced: &mut self.unplaced,
        }
    }

    /// Samples that found no entry: refused for want of room, or in a session forgotten.
    pub fn unplaced(&self) -> u64 {
        self.unplaced
    }

    /// Samples waiting now.
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// Every sample still waiting counted as unplaced (the read is over: no entry will come).
    pub fn finish(&mut self) -> u64 {
        for s in self.sessions.values_mut() {
            s.waiting.clear();
        }
        self.unplaced += self.waiting as u64;
        self.waiting = 0;
        self.unplaced
    }
}

/// One session of a [`SessionIds`], borrowed for a frame's worth of work.
pub struct SessionMut<'a, T> {
    session: &'a mut Session<T>,
    waiting: &'a mut usize,
    max_waiting: usize,
    unplaced: &'a mut u64,
}

impl<T> SessionMut<'_, T> {
    /// Defines `id` as `what` and hands back the samples that waited for it, oldest first.
    pub fn define(&mut self, id: u32, what: T) -> Vec<SeriesData> {
        let ix = id as usize;
        if self.session.ids.len() <= ix {
            self.session.ids.resize_with(ix + 1, || None);
        }
        self.session.ids[ix] = Some(what);
        let released = self.session.waiting.remove(&id).unwrap_or_default();
        *self.waiting -= released.iter().map(SeriesData::len).sum::<usize>();
        released
    }

    /// Defines `id` as `what` unless an entry defined it already; the samples that waited.
    pub fn define_if_new(&mut self, id: u32, what: T) -> Vec<SeriesData> {
        if self.session.is_defined(id) {
            return Vec::new();
        }
        self.define(id, what)
    }

    /// Keeps `data` (of an id not defined yet) until its entry comes; counted as unplaced
    /// where the waiting room is full.
    pub fn wait(&mut self, id: u32, data: SeriesData) {
        let values = data.len();
        if *self.waiting + values > self.max_waiting {
            *self.unplaced += values as u64;
            return;
        }
        *self.waiting += values;
        self.session.waiting.entry(id).or_default().push(data);
    }
}

impl<T> std::ops::Deref for SessionMut<'_, T> {
    type Target = Session<T>;

    fn deref(&self) -> &Session<T> {
        self.session
    }
}

#[cfg(test)]
mod tests {
    use monitor_wire::CounterSample;

    use super::*;

    fn counter(t: u64, v: u64) -> SeriesData {
        SeriesData::Counter(vec![CounterSample {
            unix_ns: t,
            value: v,
        }])
    }

    #[test]
    fn samples_before_their_entry_wait_and_come_back_when_it_is_read() {
        let node: Arc<str> = "n1".into();
        let mut ids: SessionIds<&str> = SessionIds::new(MAX_WAITING);
        let mut s = ids.session(&node, 7);
        assert!(s.get(3).is_none());
        s.wait(3, counter(1, 10));
        s.wait(3, counter(2, 11));
        assert_eq!(ids.waiting(), 2);
        let mut s = ids.session(&node, 7);
        assert_eq!(s.define(3, "ib_rx"), [counter(1, 10), counter(2, 11)]);
        assert_eq!(s.get(3), Some(&"ib_rx"));
        assert!(s.define_if_new(3, "other").is_empty());
        assert_eq!(s.get(3), Some(&"ib_rx"));
        // Another session of the node is another id space.
        assert!(ids.session(&node, 8).get(3).is_none());
        assert_eq!((ids.waiting(), ids.unplaced()), (0, 0));
    }

    #[test]
    fn what_never_finds_its_entry_or_no_room_is_unplaced() {
        let node: Arc<str> = "n1".into();
        let mut ids: SessionIds<()> = SessionIds::new(2);
        let mut s = ids.session(&node, 1);
        s.wait(5, counter(1, 1));
        s.wait(5, counter(2, 2));
        s.wait(6, counter(3, 3)); // no room
        assert_eq!((ids.waiting(), ids.unplaced()), (2, 1));
        assert_eq!(ids.finish(), 3);
        assert_eq!(ids.waiting(), 0);
    }

    #[test]
    fn the_oldest_session_of_a_node_is_forgotten_with_its_waiting_samples() {
        let node: Arc<str> = "n1".into();
        let mut ids: SessionIds<()> = SessionIds::new(MAX_WAITING);
        ids.session(&node, 0).wait(1, counter(1, 1));
        for session in 1..=SESSIONS_PER_NODE as u32 {
            ids.session(&node, session).define(1, ());
        }
        assert_eq!((ids.waiting(), ids.unplaced()), (0, 1));
        // Session 0 is met again: a new, empty one.
        assert!(ids.session(&node, 0).get(1).is_none());
    }
}
