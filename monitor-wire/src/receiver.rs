//! What a receiver knows of each sending node: its session, its schema, and which sequence
//! numbers arrived (lost, late, duplicated and replayed frames). What it keeps per node is
//! bounded ([`ReceiverLimits`]): a node that sends more schema entries than that, even with a
//! valid MAC, has the rest refused and counted.

use std::collections::HashMap;

use crate::{error::WireError, frame::Frame, seqset::SeqSet, series::Series};

/// What a receiver knows of each sending node.
#[derive(Debug, Default)]
pub struct ReceiverState {
    limits: ReceiverLimits,
    nodes: HashMap<String, NodeState>,
}

/// How much schema a receiver keeps per node and session. A node of 8 GPUs and 8 ports has
/// about 700 series of about 100 bytes each: the defaults leave room for a hundred times that.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReceiverLimits {
    /// Schema entries kept per node (default 65,536).
    pub max_series_per_node: usize,
    /// Bytes those entries may take, each counted as if none of its strings were shared with
    /// another entry (default 16 MiB): see `schema_entry_cost`.
    pub max_schema_bytes_per_node: usize,
}

impl Default for ReceiverLimits {
    fn default() -> Self {
        Self {
            max_series_per_node: 1 << 16,
            max_schema_bytes_per_node: 16 << 20,
        }
    }
}

/// What one schema entry costs a receiver, at most: its strings and label pairs as if it
/// shared none of them, its share of reference counts, and its slot in the node's table
/// counted twice over (a hash table is at most about half full after it grows).
pub(crate) fn schema_entry_cost(series: &Series) -> usize {
    let labels: usize = series
        .labels
        .iter()
        .map(|(k, v)| k.len() + v.len() + size_of::<(String, String)>())
        .sum();
    series.name.len() + labels + 4 * size_of::<usize>() + 2 * (size_of::<(u32, Series)>() + 1)
}

/// Sessions remembered per node after they end, so a replayed old frame cannot reset a node.
const RETIRED_SESSIONS: usize = 8;

#[derive(Debug)]
pub struct NodeState {
    session: u32,
    retired: Vec<u32>,
    schema: HashMap<u32, Series>,
    /// The schema's cost ([`schema_entry_cost`] of each entry).
    schema_bytes: usize,
    /// The frames of the session received (and not taken back): a frame held is refused as
    /// a duplicate, a late one it lacks is taken however late (an agent sends again what
    /// was not acknowledged).
    received: SeqSet,
    /// The first frame of the session this receiver saw: frames missing before it are not
    /// counted as lost (the receiver started after the sender).
    first_seen: u64,
    /// Frames accepted from this node (all sessions).
    pub frames: u64,
    /// Frames missing from the sequence (a late arrival is taken back off).
    pub lost: u64,
    /// Frames that arrived after a later one.
    pub late: u64,
    /// Samples whose series id had no schema entry yet: received but not attributable.
    pub unknown_samples: u64,
    /// Sessions seen (1 + sender restarts).
    pub sessions: u64,
    /// Schema entries refused because the node's schema was at its limit
    /// ([`ReceiverLimits`]); their samples count as unknown.
    pub schema_refused: u64,
    /// About the last accepted frame.
    pub last: LastFrame,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LastFrame {
    /// Frames missing just before it.
    pub lost_before: u64,
    /// Its samples with no schema entry known.
    pub unknown_samples: u64,
    /// It started a new session (the sender restarted).
    pub new_session: bool,
    /// Its schema entries refused because the node's schema was at its limit.
    pub schema_refused: u64,
}

impl NodeState {
    /// A node first heard from in `session`, holding `received` of it, counting frames missing
    /// from `first_seen` on as lost.
    fn start(session: u32, received: SeqSet, first_seen: u64) -> Self {
        Self {
            session,
            retired: Vec::new(),
            schema: HashMap::new(),
            schema_bytes: 0,
            received,
            first_seen,
            frames: 0,
            lost: 0,
            late: 0,
            unknown_samples: 0,
            sessions: 1,
            schema_refused: 0,
            last: LastFrame::default(),
        }
    }

    pub fn session(&self) -> u32 {
        self.session
    }

    /// The frames of the current session received so far.
    pub fn received(&self) -> &SeqSet {
        &self.received
    }

    /// The series an id stands for in the current session, once its entry was received.
    pub fn series(&self, id: u32) -> Option<&Series> {
        self.schema.get(&id)
    }

    pub fn known_series(&self) -> usize {
        self.schema.len()
    }

    /// What the node's schema costs (`schema_entry_cost` of each entry).
    pub fn schema_bytes(&self) -> usize {
        self.schema_bytes
    }

    /// Stores an entry if the limits allow it (an entry for a known id replaces the old one).
    fn learn(&mut self, id: u32, series: &Series, limits: &ReceiverLimits) -> bool {
        let cost = schema_entry_cost(series);
        let old = self.schema.get(&id);
        let bytes = self.schema_bytes - old.map_or(0, schema_entry_cost) + cost;
        let count = self.schema.len() + usize::from(old.is_none());
        if bytes > limits.max_schema_bytes_per_node || count > limits.max_series_per_node {
            return false;
        }
        self.schema.insert(id, series.clone());
        self.schema_bytes = bytes;
        true
    }
}

impl ReceiverState {
    /// A receiver that keeps at most `limits` per node.
    pub fn with_limits(limits: ReceiverLimits) -> Self {
        Self {
            limits,
            nodes: HashMap::new(),
        }
    }

    pub fn limits(&self) -> ReceiverLimits {
        self.limits
    }

    pub fn node(&self, name: &str) -> Option<&NodeState> {
        self.nodes.get(name)
    }

    pub fn nodes(&self) -> impl Iterator<Item = (&str, &NodeState)> {
        self.nodes.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Takes a frame back out of what `node` sent in `session` (it was accepted, then could
    /// not be stored): a copy sent again is taken then.
    pub fn forget_frame(&mut self, node: &str, session: u32, seq: u64) {
        if let Some(state) = self.nodes.get_mut(node)
            && state.session == session
            && state.received.contains(seq)
        {
            state.received.remove(seq);
            if seq >= state.first_seen {
                state.lost += 1;
            }
        }
    }

    /// Starts `node` in `session` with the frames `received` already held (a collector that
    /// restarted, from its archive): copies of them are refused, the rest taken. The schema
    /// starts empty, as for any session this receiver had not seen.
    pub fn resume(&mut self, node: &str, session: u32, received: SeqSet) {
        // Frames missing before the first one held were never sent here: not lost. (Held
        // ranges start above the floor, so a floor above 0 comes first.)
        let first_seen = match received.floor() {
            0 => received.ranges().first().map_or(0, |r| r.0),
            floor => floor,
        };
        self.nodes.insert(
            node.to_owned(),
            NodeState::start(session, received, first_seen),
        );
    }

    pub(crate) fn accept(&mut self, frame: &Frame) -> Result<(), WireError> {
        let node = match self.nodes.get_mut(&frame.node) {
            Some(node) => node,
            None => self
                .nodes
                .entry(frame.node.clone())
                .or_insert_with(|| NodeState::start(frame.session, SeqSet::default(), frame.seq)),
        };
        let mut last = LastFrame::default();
        if node.session != frame.session {
            if node.retired.contains(&frame.session) {
                return Err(WireError::Stale {
                    node: frame.node.clone(),
                    seq: frame.seq,
                    session: frame.session,
                });
            }
            tracing::info!(
                "node {:?} started session {:08x} (was {:08x}): its series ids start over",
                frame.node,
                frame.session,
                node.session
            );
            if node.retired.len() == RETIRED_SESSIONS {
                node.retired.remove(0);
            }
            node.retired.push(node.session);
            node.session = frame.session;
            node.schema.clear();
            node.schema_bytes = 0;
            node.received = SeqSet::default();
            node.first_seen = frame.seq;
            node.sessions += 1;
            last.new_session = true;
        } else if node.frames == 0 {
            last.new_session = true;
        }
        if node.received.contains(frame.seq) {
            // Held, or given up at the set's bound (counted there): either way not taken.
            return Err(WireError::Duplicate {
                node: frame.node.clone(),
                seq: frame.seq,
            });
        }
        let highest = node.received.end();
        if frame.seq >= highest {
            let from = highest.max(node.first_seen);
            last.lost_before = frame.seq.saturating_sub(from);
            // Saturating: a forged or wrapped sequence can claim nearly 2^64 lost per
            // session, and the count spans sessions.
            node.lost = node.lost.saturating_add(last.lost_before);
        } else {
            if frame.seq >= node.first_seen {
                node.lost = node.lost.saturating_sub(1);
            }
            node.late += 1;
        }
        node.received.insert(frame.seq);
        node.frames += 1;
        for entry in &frame.schema {
            if !node.learn(entry.id, &entry.series, &self.limits) {
                last.schema_refused += 1;
            }
        }
        if last.schema_refused > 0 {
            if node.schema_refused == 0 {
                tracing::warn!(
                    "node {:?}: schema at its limit ({} series, {} bytes): further entries refused",
                    frame.node,
                    node.schema.len(),
                    node.schema_bytes
                );
            }
            node.schema_refused += last.schema_refused;
        }
        for s in &frame.samples {
            if !node.schema.contains_key(&s.id) {
                last.unknown_samples += s.data.len() as u64;
            }
        }
        node.unknown_samples += last.unknown_samples;
        node.last = last;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        codec::{decode, encode_frame},
        frame::{CounterSample, SchemaEntry, SeriesData, SeriesSamples},
        series::Kind,
        testing::{key, sample_frame, series},
    };

    #[test]
    fn sequence_gaps_duplicates_and_restarts_are_tracked() {
        let key = key();
        let mut state = ReceiverState::default();
        let mut frame = sample_frame();
        let send = |f: &Frame, state: &mut ReceiverState| {
            decode(&encode_frame(f, &key).unwrap(), &key, state)
        };
        frame.seq = 10;
        send(&frame, &mut state).unwrap();
        frame.seq = 14; // 11, 12, 13 lost
        send(&frame, &mut state).unwrap();
        let node = state.node("gpu-node-017").unwrap();
        assert_eq!((node.lost, node.last.lost_before), (3, 3));
        frame.seq = 12; // late, no longer lost
        send(&frame, &mut state).unwrap();
        assert_eq!(state.node("gpu-node-017").unwrap().lost, 2);
        assert_eq!(
            send(&frame, &mut state).unwrap_err(),
            WireError::Duplicate {
                node: "gpu-node-017".into(),
                seq: 12
            }
        );
        // The agent restarted: new session, seq from 0, ids mean nothing until new entries.
        let old_session = frame.session;
        frame.session = 7;
        frame.seq = 0;
        frame.schema.clear();
        send(&frame, &mut state).unwrap();
        let node = state.node("gpu-node-017").unwrap();
        assert!(node.last.new_session);
        assert_eq!(node.known_series(), 0);
        assert_eq!(node.last.unknown_samples, 12);
        assert_eq!(node.sessions, 2);
        // A frame of the old session (a replay) cannot take the node back.
        frame.session = old_session;
        frame.seq = 99;
        assert!(matches!(
            send(&frame, &mut state).unwrap_err(),
            WireError::Stale { .. }
        ));
    }

    /// Found by the `wire_frame` fuzz target: the lost count overflowed (a panic in a build
    /// with overflow checks) when two sessions of a node each claimed a gap of nearly 2^64.
    #[test]
    fn sequence_gaps_of_nearly_2_pow_64_in_two_sessions_saturate_the_lost_count() {
        let key = key();
        let mut state = ReceiverState::default();
        let mut frame = sample_frame();
        for session in [1, 2] {
            frame.session = session;
            for seq in [0, u64::MAX] {
                frame.seq = seq;
                decode(&encode_frame(&frame, &key).unwrap(), &key, &mut state).unwrap();
            }
        }
        let node = state.node("gpu-node-017").unwrap();
        assert_eq!((node.lost, node.sessions), (u64::MAX, 2));
        assert_eq!(node.last.lost_before, u64::MAX - 1);
    }

    #[test]
    fn a_late_frame_is_taken_however_late_and_a_held_one_never_twice() {
        let key = key();
        let mut state = ReceiverState::default();
        let mut frame = sample_frame();
        let session = frame.session;
        let mut send = |seq: u64, state: &mut ReceiverState| {
            frame.seq = seq;
            decode(&encode_frame(&frame, &key).unwrap(), &key, state)
        };
        send(0, &mut state).unwrap();
        send(1000, &mut state).unwrap();
        assert_eq!(state.node("gpu-node-017").unwrap().lost, 999);
        // Sent again 999 frames later (a collector that was away): still taken.
        send(5, &mut state).unwrap();
        assert!(matches!(
            send(5, &mut state),
            Err(WireError::Duplicate { seq: 5, .. })
        ));
        // Taken, then not stored: a copy is taken again.
        state.forget_frame("gpu-node-017", session, 5);
        send(5, &mut state).unwrap();
        let node = state.node("gpu-node-017").unwrap();
        assert_eq!((node.lost, node.late), (998, 2));
        assert_eq!(node.received().ranges(), &[(5, 6), (1000, 1001)]);

        // A receiver that restarted resumes from what it stored: copies refused, the rest taken.
        let mut restarted = ReceiverState::default();
        let held = state.node("gpu-node-017").unwrap().received().clone();
        restarted.resume("gpu-node-017", session, held);
        assert!(send(1000, &mut restarted).is_err());
        send(7, &mut restarted).unwrap();
        send(1001, &mut restarted).unwrap();
        let node = restarted.node("gpu-node-017").unwrap();
        assert_eq!(node.sessions, 1);
        assert_eq!(node.received().ranges(), &[(5, 6), (7, 8), (1000, 1002)]);
    }

    /// A frame of node `n` that names series `ids` and carries one sample of each.
    fn naming(session: u32, seq: u64, ids: std::ops::Range<u32>, name_len: usize) -> Frame {
        let name = format!("railscope_{}", "x".repeat(name_len));
        Frame {
            node: "n".into(),
            session,
            seq,
            send_unix_ns: 1_000_000_000,
            time_quantum_ns: 1,
            schema: ids
                .clone()
                .map(|id| SchemaEntry {
                    id,
                    series: series(&name, &[("id", &id.to_string())], Kind::Counter),
                })
                .collect(),
            samples: ids
                .map(|id| SeriesSamples {
                    id,
                    data: SeriesData::Counter(vec![CounterSample {
                        unix_ns: 1_000_000_000,
                        value: 1,
                    }]),
                })
                .collect(),
            events: Vec::new(),
        }
    }

    #[test]
    fn a_nodes_schema_is_held_to_its_limits_and_refusals_are_counted() {
        let key = key();
        let send = |f: &Frame, state: &mut ReceiverState| {
            decode(&encode_frame(f, &key).unwrap(), &key, state).unwrap();
        };
        let mut state = ReceiverState::with_limits(ReceiverLimits {
            max_series_per_node: 3,
            max_schema_bytes_per_node: usize::MAX,
        });
        send(&naming(1, 0, 0..5, 4), &mut state);
        let node = state.node("n").unwrap();
        assert_eq!(node.known_series(), 3);
        assert_eq!((node.schema_refused, node.last.schema_refused), (2, 2));
        assert_eq!(node.last.unknown_samples, 2, "the refused ids' samples");
        assert!(node.series(2).is_some() && node.series(3).is_none());
        // At the limit, a known id's entry is still replaced.
        send(&naming(1, 1, 1..2, 8), &mut state);
        let node = state.node("n").unwrap();
        assert_eq!(node.series(1).unwrap().name.len(), "railscope_".len() + 8);
        assert_eq!((node.known_series(), node.schema_refused), (3, 2));
        // A new session starts an empty schema.
        send(&naming(2, 0, 10..12, 4), &mut state);
        let node = state.node("n").unwrap();
        assert_eq!((node.known_series(), node.last.schema_refused), (2, 0));

        // The byte limit: room for two entries of this size, not three.
        let cost = schema_entry_cost(&naming(1, 0, 0..1, 1000).schema[0].series);
        let mut state = ReceiverState::with_limits(ReceiverLimits {
            max_series_per_node: 100,
            max_schema_bytes_per_node: 2 * cost + cost / 2,
        });
        send(&naming(1, 0, 0..3, 1000), &mut state);
        let node = state.node("n").unwrap();
        assert_eq!((node.known_series(), node.schema_refused), (2, 1));
        assert_eq!(node.schema_bytes(), 2 * cost);
    }
}
