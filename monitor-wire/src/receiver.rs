//! What a receiver knows of each sending node: its session, its schema, and which sequence
//! numbers arrived (lost, late, duplicated and replayed frames).

use std::collections::HashMap;

use crate::{error::WireError, frame::Frame, series::Series};

/// What a receiver knows of each sending node.
#[derive(Debug, Default)]
pub struct ReceiverState {
    nodes: HashMap<String, NodeState>,
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
}

impl NodeState {
    fn new(frame: &Frame) -> Self {
        Self {
            session: frame.session,
            retired: Vec::new(),
            schema: HashMap::new(),
            highest_seq: frame.seq,
            seen: 1,
            frames: 0,
            lost: 0,
            late: 0,
            unknown_samples: 0,
            sessions: 1,
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
}

impl ReceiverState {
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
            node.schema.insert(entry.id, entry.series.clone());
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
        testing::{key, sample_frame},
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
}
