//! What a receiver knows of each sending node: its session, its schema, and which sequence
//! numbers arrived (lost, late, duplicated and replayed frames). What it keeps per node is
//! bounded ([`ReceiverLimits`]): a node that sends more schema entries than that, even with a
//! valid MAC, has the rest refused and counted.

use std::collections::HashMap;

use crate::{error::WireError, frame::Frame, series::Series};

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
    /// another entry (default 16 MiB): see [`schema_entry_cost`].
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
pub fn schema_entry_cost(series: &Series) -> usize {
    let labels: usize = series
        .labels
        .iter()
        .map(|(k, v)| k.len() + v.len() + size_of::<(String, String)>())
        .sum();
    series.name.len() + labels + 4 * size_of::<usize>() + 2 * (size_of::<(u32, Series)>() + 1)
}

/// Sessions remembered per node after they end, so a replayed old frame cannot reset a node.
const RETIRED_SESSIONS: usize = 8;
/// How far back (in sequence numbers) a late frame is still placed.
const SEQ_WINDOW: u64 = 64;

#[derive(Debug)]
pub struct NodeState {
    session: u32,
    retired: Vec<u32>,
    schema: HashMap<u32, Series>,
    /// The schema's cost ([`schema_entry_cost`] of each entry).
    schema_bytes: usize,
    highest_seq: u64,
    /// Bit i: frame `highest_seq - i` was received.
    seen: u64,
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
    fn new(frame: &Frame) -> Self {
        Self {
            session: frame.session,
            retired: Vec::new(),
            schema: HashMap::new(),
            schema_bytes: 0,
            highest_seq: frame.seq,
            seen: 1,
            frames: 0,
            lost: 0,
            late: 0,
            unknown_samples: 0,
            sessions: 1,
            schema_refused: 0,
            last: LastFrame {
                new_session: true,
                ..LastFrame::default()
            },
        }
    }

    pub fn session(&self) -> u32 {
        self.session
    }

    /// The series an id stands for in the current session, once its entry was received.
    pub fn series(&self, id: u32) -> Option<&Series> {
        self.schema.get(&id)
    }

    pub fn known_series(&self) -> usize {
        self.schema.len()
    }

    /// What the node's schema costs ([`schema_entry_cost`] of each entry).
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

    pub(crate) fn accept(&mut self, frame: &Frame) -> Result<(), WireError> {
        let node = match self.nodes.get_mut(&frame.node) {
            Some(node) => node,
            None => self
                .nodes
                .entry(frame.node.clone())
                .or_insert_with(|| NodeState::new(frame)),
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
            node.highest_seq = frame.seq;
            node.seen = 1;
            node.sessions += 1;
            last.new_session = true;
        } else if node.frames == 0 {
            last.new_session = true;
        } else if frame.seq > node.highest_seq {
            let ahead = frame.seq - node.highest_seq;
            last.lost_before = ahead - 1;
            node.lost += ahead - 1;
            node.seen = if ahead >= SEQ_WINDOW {
                1
            } else {
                (node.seen << ahead) | 1
            };
            node.highest_seq = frame.seq;
        } else {
            let behind = node.highest_seq - frame.seq;
            if behind >= SEQ_WINDOW {
                return Err(WireError::Stale {
                    node: frame.node.clone(),
                    seq: frame.seq,
                    session: frame.session,
                });
            }
            if node.seen & (1 << behind) != 0 {
                return Err(WireError::Duplicate {
                    node: frame.node.clone(),
                    seq: frame.seq,
                });
            }
            node.seen |= 1 << behind;
            node.lost = node.lost.saturating_sub(1);
            node.late += 1;
        }
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
