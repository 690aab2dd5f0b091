//! Which key ingest accepts on a node's frame, and why a frame that carries none of them was
//! refused (docs/wire-format.md, "Keys").
//!
//! Each node's keys are derived once, when the node is first heard from, and tried in the
//! order that worked last, so a fleet on per-node keys pays one MAC per frame as it did with
//! one shared key. Two rules keep a node from speaking for another:
//! - a frame is accepted only with a key of the node its header names;
//! - once a node has sealed a frame with its own key, the shared key is refused for it (a
//!   tenant who kept the old shared key cannot speak for a node that moved off it).
//!
//! A refused frame is told apart only when that is cheap: sealed with the shared key after the
//! node's own, or with the previous secret's key after the rotation window (one more MAC); or,
//! for a frame naming a node the table holds, with the key of a node whose frames came from
//! the same address (at most [`NAMES_PER_ADDRESS`] names an address; on a fleet with an
//! address per node, none to try): the node found doing so is tried first from then on, and
//! all of them at most once a second per named node and 100 times a second in all. Anything else is a bad MAC, at the cost of
//! one MAC, as with one shared key: a flood naming random nodes costs what it did.

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use monitor_wire::{self as wire, Frame, Key, Keyring, ReceiverState, Sealer, WireError};

use crate::drops::DropReason;
use monitor_archive::lock::lock;

/// Node names remembered per source address, for naming the sealer of a forged frame.
pub(crate) const NAMES_PER_ADDRESS: usize = 8;

/// The ring ingest accepts, and which nodes sent from which address.
pub(crate) struct IngestKeys {
    ring: Keyring,
    by_address: Mutex<HashMap<IpAddr, Vec<Arc<str>>>>,
    /// When any refused frame was last tried with its neighbours' keys (all nodes together).
    searched_unix_ns: AtomicU64,
    /// A key for a datagram whose header names no node (too short, or not UTF-8): derived
    /// once, so that a flood of garbage costs no key derivation.
    unnamed: Key,
}

/// A refused frame naming a node is tried with all its address's neighbours' keys at most
/// this often per node (a flood of garbage naming a node costs one MAC per datagram, and a
/// few more once a second).
const SEARCH_EVERY_NS: u64 = 1_000_000_000;

/// And at most this often over all nodes together: a flood of forgeries each naming another
/// node starts at most 100 searches a second (at most 800 more MACs).
const ANY_SEARCH_EVERY_NS: u64 = 10_000_000;

/// One node's keys, as ingest tries them.
pub(crate) struct NodeKeys {
    keys: Vec<(Sealer, Key)>,
    /// The key that sealed the node's last accepted frame (tried first).
    last: usize,
    /// The node sealed a frame with its own key: the shared key is refused for it.
    on_own_key: bool,
    /// The node found sealing frames that name this one, and its key: tried first on every
    /// refused frame (kept with the node, under its shard's lock: no lock of its own).
    forger: Option<(Arc<str>, Key)>,
    /// When a refused frame naming this node was last tried with every neighbour's key.
    searched_unix_ns: u64,
}

impl NodeKeys {
    /// What sealed the node's last accepted frame.
    pub(crate) fn sealer(&self) -> Sealer {
        self.keys[self.last].0
    }

    /// The key to seal what goes back to the node with (schema requests): the one its last
    /// frame carried, which it holds.
    pub(crate) fn reply_key(&self) -> &Key {
        &self.keys[self.last].1
    }
}

impl IngestKeys {
    pub(crate) fn new(ring: Keyring) -> Self {
        Self {
            unnamed: ring.sealing_key(""),
            ring,
            by_address: Mutex::new(HashMap::new()),
            searched_unix_ns: AtomicU64::new(0),
        }
    }

    /// The key to check a datagram with whose header names no node (its refusal says why).
    pub(crate) fn unnamed_key(&self) -> &Key {
        &self.unnamed
    }

    /// `node`'s keys, derived once per node.
    pub(crate) fn node_keys(&self, node: &str) -> NodeKeys {
        NodeKeys {
            keys: self.ring.keys_of(node),
            last: 0,
            on_own_key: false,
            forger: None,
            searched_unix_ns: 0,
        }
    }

    /// Verifies and decodes a frame naming `node` (`held`: a node of the table) with one of
    /// its keys the ring accepts now.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn decode(
        &self,
        bytes: &[u8],
        node: &str,
        held: bool,
        keys: &mut NodeKeys,
        state: &mut ReceiverState,
        from: SocketAddr,
        now_unix_ns: u64,
    ) -> Result<Frame, DecodeError> {
        let n = keys.keys.len();
        for i in (0..n).map(|i| (keys.last + i) % n) {
            let (sealer, key) = &keys.keys[i];
            let allowed = match sealer {
                Sealer::Node => true,
                Sealer::PreviousNode => self.ring.accepts_previous_at(now_unix_ns),
                Sealer::Shared => !keys.on_own_key,
            };
            if !allowed {
                continue;
            }
            match wire::decode(bytes, key, state) {
                Err(WireError::BadMac { .. }) => continue,
                Err(e) => return Err(DecodeError::Wire(e)),
                Ok(frame) => {
                    keys.last = i;
                    if *sealer != Sealer::Shared && !keys.on_own_key {
                        keys.on_own_key = true;
                        self.remember(from.ip(), &frame.node);
                    }
                    return Ok(frame);
                }
            }
        }
        let refused = self.why_refused(bytes, node, held, keys, from, now_unix_ns);
        Err(DecodeError::Refused(refused))
    }

    /// Remembers that `node` sends from `address` (bounded per address).
    fn remember(&self, address: IpAddr, node: &str) {
        let mut by_address = lock(&self.by_address);
        let names = by_address.entry(address).or_default();
        if names.len() < NAMES_PER_ADDRESS && !names.iter().any(|n| &**n == node) {
            names.push(node.into());
        }
    }

    /// Forgets a node (it went silent and left the table).
    pub(crate) fn forget(&self, node: &str) {
        let mut by_address = lock(&self.by_address);
        by_address.retain(|_, names| {
            names.retain(|n| &**n != node);
            !names.is_empty()
        });
    }

    /// Why a frame naming `node` carried none of the keys accepted now.
    fn why_refused(
        &self,
        bytes: &[u8],
        node: &str,
        held: bool,
        keys: &mut NodeKeys,
        from: SocketAddr,
        now_unix_ns: u64,
    ) -> Refused {
        // The node's keys not tried because they are not accepted now.
        let untried = keys.keys.iter().filter(|(sealer, _)| match sealer {
            Sealer::Node => false,
            Sealer::PreviousNode => !self.ring.accepts_previous_at(now_unix_ns),
            Sealer::Shared => keys.on_own_key,
        });
        for (sealer, key) in untried {
            if !wire::sealed_with(bytes, key) {
                continue;
            }
            return match sealer {
                Sealer::PreviousNode => Refused {
                    reason: DropReason::RetiredKey,
                    detail: format!(
                        "frame of node {node:?} sealed with its key from the previous fleet \
                         secret, whose rotation window has ended: give the node its new key"
                    ),
                },
                _ => Refused {
                    reason: DropReason::WrongNodeKey,
                    detail: format!(
                        "frame of node {node:?} sealed with the shared key, but the node \
                         already sends with its own key"
                    ),
                },
            };
        }
        if held
            && self.ring.has_fleet_secret()
            && let Some(sealer) = self.neighbour_sealing(bytes, node, keys, from.ip(), now_unix_ns)
        {
            return Refused {
                reason: DropReason::WrongNodeKey,
                detail: format!(
                    "frame names node {node:?} but is sealed with the key of node {sealer:?}"
                ),
            };
        }
        Refused {
            reason: DropReason::BadMac,
            detail: format!(
                "frame of node {node:?} ({} bytes) carries none of its keys: forged, another \
                 fleet's key, or corrupted",
                bytes.len()
            ),
        }
    }
}

impl IngestKeys {
    /// The node sending from `address` whose key sealed a frame naming `node`: the one found
    /// doing so before, else (at most once a second per named node) any of its neighbours.
    fn neighbour_sealing(
        &self,
        bytes: &[u8],
        node: &str,
        keys: &mut NodeKeys,
        address: IpAddr,
        now_unix_ns: u64,
    ) -> Option<Arc<str>> {
        if let Some((forger, key)) = &keys.forger
            && wire::sealed_with(bytes, key)
        {
            return Some(forger.clone());
        }
        if now_unix_ns.saturating_sub(keys.searched_unix_ns) < SEARCH_EVERY_NS {
            return None;
        }
        let last = self.searched_unix_ns.load(Ordering::Relaxed);
        if now_unix_ns.saturating_sub(last) < ANY_SEARCH_EVERY_NS
            || self
                .searched_unix_ns
                .compare_exchange(last, now_unix_ns, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return None;
        }
        keys.searched_unix_ns = now_unix_ns;
        let names = lock(&self.by_address).get(&address).cloned()?;
        for other in names.iter().filter(|o| &***o != node) {
            let found = self
                .ring
                .keys_of(other)
                .into_iter()
                .find(|(s, key)| *s != Sealer::Shared && wire::sealed_with(bytes, key));
            if let Some((_, key)) = found {
                keys.forger = Some((other.clone(), key));
                return Some(other.clone());
            }
        }
        None
    }
}

/// A dropped datagram: why, and what to log.
#[derive(Debug)]
pub struct Refused {
    pub reason: DropReason,
    pub detail: String,
}

impl Refused {
    pub(crate) fn decode(error: DecodeError) -> Self {
        match error {
            DecodeError::Wire(e) => Self::wire(&e),
            DecodeError::Refused(refused) => refused,
        }
    }

    pub(crate) fn wire(error: &WireError) -> Self {
        Self {
            reason: DropReason::of(error),
            detail: error.to_string(),
        }
    }
}

/// Why [`IngestKeys::decode`] did not return a frame.
#[derive(Debug)]
pub(crate) enum DecodeError {
    /// Authenticated, but the decoder or the node's receiver state refused it.
    Wire(WireError),
    /// Sealed with none of the node's keys accepted now.
    Refused(Refused),
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use monitor_wire::{
        EncoderConfig, FleetSecret, FrameEncoder, Key, Keyring, Kind, Labels, PreviousSecret,
        Reading, Series, Value, names::metric,
    };

    use crate::{config::Limits, drops::DropReason, nodes::NodeTable};

    const T0: u64 = 1_763_164_800_000_000_000;
    const SECOND: u64 = 1_000_000_000;

    fn secret(b: u8) -> FleetSecret {
        FleetSecret::from_bytes([b; 32])
    }

    fn at(address: &str) -> SocketAddr {
        format!("{address}:7000").parse().unwrap()
    }

    /// A node's first flush: one port counter, as the agent names it.
    fn frame(node: &str, key: Key, t: u64) -> Vec<u8> {
        let mut enc = FrameEncoder::new(EncoderConfig::new(node), key).unwrap();
        enc.push_reading(&Reading {
            series: Series {
                name: metric::IB_PORT_XMIT_BYTES_TOTAL.into(),
                labels: Labels::new([("device", "mlx5_0"), ("port", "1")]),
                kind: Kind::Counter,
            },
            value: Value::U64(4096),
            unix_ns: t,
        })
        .unwrap();
        enc.flush(t).remove(0)
    }

    fn summary(table: &NodeTable, node: &str) -> crate::nodes::NodeSummary {
        table
            .summaries()
            .into_iter()
            .find(|s| s.node == node)
            .unwrap_or_else(|| panic!("no node {node}"))
    }

    #[test]
    fn a_node_is_accepted_with_its_own_key_and_refused_with_another_nodes() {
        let table = NodeTable::new(Keyring::fleet(secret(1)), Limits::default());
        let key = |n: &str| secret(1).node_key(n);
        table
            .ingest(&frame("gpu-a", key("gpu-a"), T0), at("10.0.0.1"), T0)
            .unwrap();
        table
            .ingest(&frame("gpu-b", key("gpu-b"), T0), at("10.0.0.2"), T0)
            .unwrap();
        assert_eq!(summary(&table, "gpu-a").key, "node");

        // gpu-a's root forges a frame for gpu-b with the only key it holds, its own.
        let forged = frame("gpu-b", key("gpu-a"), T0 + SECOND);
        let e = table
            .ingest(&forged, at("10.0.0.1"), T0 + SECOND)
            .unwrap_err();
        assert_eq!(e.reason, DropReason::WrongNodeKey, "{}", e.detail);
        assert!(
            e.detail.contains("\"gpu-b\"") && e.detail.contains("\"gpu-a\""),
            "{}",
            e.detail
        );
        // Within the same second (no new search): the node found forging is tried first, so
        // every forgery of it is named as such.
        for _ in 0..3 {
            let e = table
                .ingest(&forged, at("10.0.0.1"), T0 + SECOND)
                .unwrap_err();
            assert_eq!(e.reason, DropReason::WrongNodeKey, "{}", e.detail);
        }
        // gpu-a's key naming gpu-b from elsewhere: still gpu-a's key, which gpu-b's entry
        // remembers.
        let e = table
            .ingest(&forged, at("10.0.0.9"), T0 + SECOND)
            .unwrap_err();
        assert_eq!(e.reason, DropReason::WrongNodeKey, "{}", e.detail);
        // A genuine frame of gpu-a with its header rewritten to name gpu-b: the MAC covers
        // the name.
        let mut renamed = frame("gpu-a", key("gpu-a"), T0 + SECOND);
        renamed[7..12].copy_from_slice(b"gpu-b");
        let e = table
            .ingest(&renamed, at("10.0.0.1"), T0 + SECOND)
            .unwrap_err();
        assert_eq!(e.reason, DropReason::BadMac);
        // A node that never sent: its key is derived on its first frame.
        table
            .ingest(&frame("gpu-c", key("gpu-c"), T0), at("10.0.0.3"), T0)
            .unwrap();
        // A forgery of gpu-c from an address no node sent from: a bad MAC, no more is known.
        let t = T0 + 2 * SECOND;
        let e = table
            .ingest(&frame("gpu-c", key("gpu-a"), t), at("10.0.0.9"), t)
            .unwrap_err();
        assert_eq!(e.reason, DropReason::BadMac, "{}", e.detail);
        assert_eq!(summary(&table, "gpu-b").frames, 1);
        assert_eq!(table.node_count(), 3);
    }

    #[test]
    fn a_rotation_accepts_both_secrets_until_its_deadline_then_refuses_the_previous() {
        let deadline = T0 + 60 * SECOND;
        let ring = Keyring::new(
            Some(secret(2)),
            Some(PreviousSecret {
                secret: secret(1),
                until_unix_ns: Some(deadline),
            }),
            None,
        )
        .unwrap();
        let table = NodeTable::new(ring, Limits::default());
        let old = |n: &str| secret(1).node_key(n);
        let new = |n: &str| secret(2).node_key(n);
        // Before the move: every node on its old key.
        for (i, n) in ["n1", "n2", "n3"].iter().enumerate() {
            table
                .ingest(&frame(n, old(n), T0), at(&format!("10.0.1.{i}")), T0)
                .unwrap();
            assert_eq!(summary(&table, n).key, "previous_node");
        }
        // n1 gets its new key (its agent restarts: a new session): accepted, nothing dropped.
        let t = T0 + 10 * SECOND;
        table
            .ingest(&frame("n1", new("n1"), t), at("10.0.1.0"), t)
            .unwrap();
        assert_eq!(summary(&table, "n1").key, "node");
        // n2 still on the old key inside the window: accepted.
        let t = T0 + 30 * SECOND;
        table
            .ingest(&frame("n2", old("n2"), t), at("10.0.1.1"), t)
            .unwrap();
        // After the window: the old key is refused, and said so.
        let t = deadline + SECOND;
        let e = table
            .ingest(&frame("n3", old("n3"), t), at("10.0.1.2"), t)
            .unwrap_err();
        assert_eq!(e.reason, DropReason::RetiredKey, "{}", e.detail);
        table
            .ingest(&frame("n3", new("n3"), t), at("10.0.1.2"), t)
            .unwrap();
    }

    #[test]
    fn shared_key_nodes_mix_with_per_node_ones_but_not_once_a_node_moved() {
        let shared = Key::from_bytes([7; 32]);
        let ring = Keyring::new(Some(secret(1)), None, Some(shared.clone())).unwrap();
        let table = NodeTable::new(ring, Limits::default());
        table
            .ingest(&frame("legacy", shared.clone(), T0), at("10.0.2.1"), T0)
            .unwrap();
        assert_eq!(summary(&table, "legacy").key, "shared");
        let own = secret(1).node_key("moved");
        table
            .ingest(&frame("moved", own.clone(), T0), at("10.0.2.2"), T0)
            .unwrap();
        // Whoever still holds the shared key cannot speak for the node that moved off it.
        let t = T0 + SECOND;
        let e = table
            .ingest(&frame("moved", shared.clone(), t), at("10.0.2.1"), t)
            .unwrap_err();
        assert_eq!(e.reason, DropReason::WrongNodeKey, "{}", e.detail);
        // ... while the node that has not moved goes on with it.
        table
            .ingest(&frame("legacy", shared, t), at("10.0.2.1"), t)
            .unwrap();
        assert_eq!(summary(&table, "legacy").frames, 2);
        assert_eq!(summary(&table, "moved").frames, 1);
    }

    #[test]
    fn schema_requests_are_sealed_with_the_key_the_node_holds() {
        let table = NodeTable::new(Keyring::fleet(secret(1)), Limits::default());
        let key = secret(1).node_key("gpu-a");
        let mut enc = FrameEncoder::new(EncoderConfig::new("gpu-a"), key.clone()).unwrap();
        let series = Series {
            name: metric::IB_PORT_XMIT_BYTES_TOTAL.into(),
            labels: Labels::new([("device", "mlx5_0"), ("port", "1")]),
            kind: Kind::Counter,
        };
        let mut flush = |t: u64| {
            enc.push_reading(&Reading {
                series: series.clone(),
                value: Value::U64(t / SECOND),
                unix_ns: t,
            })
            .unwrap();
            enc.flush(t).remove(0)
        };
        // The first two flushes carry the schema: this collector "missed" them.
        let _ = flush(T0);
        let _ = flush(T0 + SECOND);
        let third = flush(T0 + 2 * SECOND);
        let accepted = table
            .ingest(&third, at("10.0.0.1"), T0 + 2 * SECOND)
            .unwrap();
        assert!(accepted.ask_schema);
        let reply = accepted.reply_key.expect("a key to seal the request with");
        let request = monitor_wire::encode_schema_request(
            &monitor_wire::SchemaRequest {
                node: "gpu-a".into(),
                session: accepted.frame.session,
            },
            &reply,
        )
        .unwrap();
        // The agent holds only its own key, and opens the request with it.
        assert!(monitor_wire::decode_schema_request(&request, &key).is_ok());
    }
}
