//! Which keys a receiver accepts, and each node's own key.
//!
//! With one key shared by the cluster, root on any node (on a bare-metal GPU cloud, the
//! tenant) can seal frames for every other node. So each node holds a key of its own,
//! derived from the fleet secret, which only the collector (and provisioning) holds, and the
//! node's name: [`FleetSecret::node_key`] is BLAKE3's key derivation with [`NODE_KEY_CONTEXT`]
//! over the secret followed by the name. A frame names its node in its header, so the
//! receiver derives the one key that node's frames must carry; a node that seals a frame
//! naming another node with its own key is refused.
//!
//! A [`Keyring`] is what a receiver accepts:
//! - the node's key derived from the current fleet secret;
//! - during a rotation, until its deadline, the node's key derived from the previous secret,
//!   so nodes move to the new key one by one and nothing is dropped meanwhile;
//! - while a cluster moves off it, the one shared key of old (every node holds the same).
//!
//! Readers of what was accepted earlier (the archive) accept every key of the ring, whatever
//! the deadline: a frame archived during a rotation stays readable after it.

use std::{
    collections::HashMap,
    path::Path,
    sync::{Arc, Mutex},
};

use crate::{
    Frame, StoredFrame, codec,
    error::WireError,
    key::{Key, KeyError},
    mac,
    receiver::ReceiverState,
};

/// The context string of node key derivation (BLAKE3 `derive_key`): railscope's own, fixed
/// forever for this derivation, so no other use of the fleet secret yields the same keys.
pub(crate) const NODE_KEY_CONTEXT: &str = "railscope 2026-11-27 frame key of one node";

/// The secret every node key of a fleet is derived from. The collector holds it; a node holds
/// only its own key. Same file format as a [`Key`] (32 raw bytes or 64 hex characters).
#[derive(Clone, PartialEq, Eq)]
pub struct FleetSecret(Key);

impl std::fmt::Debug for FleetSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FleetSecret(..)")
    }
}

impl FleetSecret {
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(Key::from_bytes(bytes))
    }

    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, KeyError> {
        Key::from_file(path).map(Self)
    }

    /// The key of node `node`: BLAKE3 `derive_key(NODE_KEY_CONTEXT, secret ‖ name)`. The
    /// secret has a fixed length, so the concatenation is unambiguous.
    pub fn node_key(&self, node: &str) -> Key {
        let mut hasher = blake3::Hasher::new_derive_key(NODE_KEY_CONTEXT);
        hasher.update(self.0.bytes());
        hasher.update(node.as_bytes());
        Key::from_bytes(*hasher.finalize().as_bytes())
    }
}

/// Which key of a [`Keyring`] sealed a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Sealer {
    /// The node's key from the current fleet secret.
    Node,
    /// The node's key from the previous fleet secret (a rotation in progress).
    PreviousNode,
    /// The cluster's shared key (no per-node keys yet).
    Shared,
}

impl Sealer {
    pub fn label(self) -> &'static str {
        match self {
            Sealer::Node => "node",
            Sealer::PreviousNode => "previous_node",
            Sealer::Shared => "shared",
        }
    }
}

/// The previous fleet secret of a rotation, and until when frames sealed with its node keys
/// are accepted.
#[derive(Clone, Debug)]
pub struct PreviousSecret {
    pub secret: FleetSecret,
    /// Accepted while the receiver's clock is before this (Unix ns); `None`: no deadline.
    pub until_unix_ns: Option<u64>,
}

/// The keys a receiver accepts (see the module's doc). Cheap to clone: one ring is shared by
/// ingest and the archive's readers.
#[derive(Clone, Debug)]
pub struct Keyring(Arc<Ring>);

#[derive(Debug)]
struct Ring {
    current: Option<FleetSecret>,
    previous: Option<PreviousSecret>,
    shared: Option<Key>,
    /// Readers' derived keys by node, bounded: cleared when it reaches [`READER_CACHE`].
    derived: Mutex<HashMap<Box<str>, Arc<[Key]>>>,
}

/// Nodes whose keys a reader keeps derived (a fleet's worth; a key is 32 bytes).
const READER_CACHE: usize = 1 << 17;

/// A keyring without any key.
#[derive(Debug, thiserror::Error)]
#[error("no key to accept frames with: give a fleet secret, a shared key or both")]
pub struct NoKeys;

impl Keyring {
    /// Accepts `current`'s node keys, `previous`'s until its deadline, and `shared`.
    pub fn new(
        current: Option<FleetSecret>,
        previous: Option<PreviousSecret>,
        shared: Option<Key>,
    ) -> Result<Self, NoKeys> {
        if current.is_none() && previous.is_none() && shared.is_none() {
            return Err(NoKeys);
        }
        Ok(Self(Arc::new(Ring {
            current,
            previous,
            shared,
            derived: Mutex::new(HashMap::new()),
        })))
    }

    /// A cluster on one shared key, as before per-node keys.
    pub fn shared(key: Key) -> Self {
        Self::new(None, None, Some(key)).expect("one key")
    }

    /// Per-node keys from `secret` only.
    pub fn fleet(secret: FleetSecret) -> Self {
        Self::new(Some(secret), None, None).expect("one key")
    }

    pub fn has_fleet_secret(&self) -> bool {
        self.0.current.is_some()
    }

    pub fn has_shared_key(&self) -> bool {
        self.0.shared.is_some()
    }

    pub fn previous_until_unix_ns(&self) -> Option<Option<u64>> {
        self.0.previous.as_ref().map(|p| p.until_unix_ns)
    }

    /// Whether the previous secret's node keys are still accepted at `now_unix_ns`.
    pub fn accepts_previous_at(&self, now_unix_ns: u64) -> bool {
        self.0
            .previous
            .as_ref()
            .is_some_and(|p| p.until_unix_ns.is_none_or(|until| now_unix_ns < until))
    }

    /// Every key `node`'s frames may be sealed with, with its [`Sealer`], whatever the
    /// rotation's deadline: current node key, previous node key, shared key.
    pub fn keys_of(&self, node: &str) -> Vec<(Sealer, Key)> {
        let ring = &self.0;
        let mut keys = Vec::with_capacity(3);
        if let Some(secret) = &ring.current {
            keys.push((Sealer::Node, secret.node_key(node)));
        }
        if let Some(previous) = &ring.previous {
            keys.push((Sealer::PreviousNode, previous.secret.node_key(node)));
        }
        if let Some(shared) = &ring.shared {
            keys.push((Sealer::Shared, shared.clone()));
        }
        keys
    }

    /// The key a receiver seals what it writes for `node` with (its archive's schema frames):
    /// the node's current key, or the shared key on a cluster without a fleet secret.
    pub fn sealing_key(&self, node: &str) -> Key {
        let ring = &self.0;
        match (&ring.current, &ring.shared, &ring.previous) {
            (Some(secret), _, _) => secret.node_key(node),
            (None, Some(shared), _) => shared.clone(),
            (None, None, Some(previous)) => previous.secret.node_key(node),
            (None, None, None) => unreachable!("a keyring holds a key"),
        }
    }

    /// `node`'s keys for a reader, derived once (bounded cache).
    fn reader_keys(&self, node: &str) -> Arc<[Key]> {
        let mut derived = self.0.derived.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(keys) = derived.get(node) {
            return keys.clone();
        }
        if derived.len() >= READER_CACHE {
            derived.clear();
        }
        let keys: Arc<[Key]> = self.keys_of(node).into_iter().map(|(_, k)| k).collect();
        derived.insert(node.into(), keys.clone());
        keys
    }

    /// [`codec::decode`] for a reader of archived frames: tries each key of the frame's node.
    pub fn decode(&self, bytes: &[u8], state: &mut ReceiverState) -> Result<Frame, WireError> {
        self.with_each_key(bytes, |key| codec::decode(bytes, key, state))
    }

    /// [`codec::open_stored_where`] for a reader of archived frames: tries each key of the
    /// frame's node.
    pub fn open_stored_where<'a>(
        &self,
        bytes: &'a [u8],
        keep: &mut dyn FnMut(&str) -> bool,
    ) -> Result<StoredFrame<'a>, WireError> {
        self.with_each_key(bytes, |key| codec::open_stored_where(bytes, key, keep))
    }

    /// `open` with each key of the node `bytes` names, until one is not a bad MAC.
    fn with_each_key<T>(
        &self,
        bytes: &[u8],
        mut open: impl FnMut(&Key) -> Result<T, WireError>,
    ) -> Result<T, WireError> {
        let keys = self.reader_keys(codec::peek_node(bytes).unwrap_or_default());
        let mut last = WireError::TooShort { len: bytes.len() };
        for key in keys.iter() {
            match open(key) {
                Err(e @ WireError::BadMac { .. }) => last = e,
                other => return other,
            }
        }
        Err(last)
    }
}

impl From<Key> for Keyring {
    fn from(key: Key) -> Self {
        Self::shared(key)
    }
}

/// Whether `bytes` (a frame or schema request, MAC last) carries a valid MAC under `key`;
/// nothing else is read. For telling why a frame was refused (which key did seal it).
pub fn sealed_with(bytes: &[u8], key: &Key) -> bool {
    mac::verify(bytes, key, crate::limits::MAC_LEN + 1).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{encode_frame, testing::sample_frame};

    fn secret(b: u8) -> FleetSecret {
        FleetSecret::from_bytes([b; 32])
    }

    #[test]
    fn node_keys_differ_by_node_and_by_secret_and_are_stable() {
        let a = secret(1).node_key("gpu-node-001");
        assert_eq!(a, secret(1).node_key("gpu-node-001"));
        assert_ne!(a, secret(1).node_key("gpu-node-002"));
        assert_ne!(a, secret(2).node_key("gpu-node-001"));
        // Not the secret itself, nor a keyed hash of the name under it.
        assert_ne!(a, Key::from_bytes([1; 32]));
        assert_ne!(
            a,
            Key::from_bytes(*blake3::keyed_hash(&[1; 32], b"gpu-node-001").as_bytes())
        );
    }

    #[test]
    fn readers_open_frames_of_every_key_of_the_ring() {
        let ring = Keyring::new(
            Some(secret(1)),
            Some(PreviousSecret {
                secret: secret(2),
                until_unix_ns: Some(1),
            }),
            Some(Key::from_bytes([3; 32])),
        )
        .unwrap();
        let frame = sample_frame();
        for key in [
            secret(1).node_key(&frame.node),
            secret(2).node_key(&frame.node),
            Key::from_bytes([3; 32]),
        ] {
            let bytes = encode_frame(&frame, &key).unwrap();
            assert!(ring.open_stored_where(&bytes, &mut |_| true).is_ok());
            assert!(ring.decode(&bytes, &mut ReceiverState::default()).is_ok());
        }
        // Another node's key, or another fleet's: refused as a bad MAC.
        let bytes = encode_frame(&frame, &secret(1).node_key("other")).unwrap();
        assert!(matches!(
            ring.open_stored_where(&bytes, &mut |_| true),
            Err(WireError::BadMac { .. })
        ));
        assert!(!ring.accepts_previous_at(1) && ring.accepts_previous_at(0));
    }
}
