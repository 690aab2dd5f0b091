//! railscope's frame format between node agents and a collector (docs/wire-format.md is its
//! byte-level spec): one UDP datagram is one frame, authenticated with a keyed BLAKE3 MAC,
//! decodable on its own given the schema entries the receiver has seen. The agent, `railscope
//! listen` and the collector share this crate; it has no eBPF, NVML or async runtime in it.
//!
//! A receiver needs:
//! - [`Key`]: a node's key (or the cluster's shared key of old), from its file, and a
//!   [`Keyring`]: which keys a receiver accepts, each node's derived from the [`FleetSecret`];
//! - [`decode`]: checks the MAC before reading anything else, parses the frame and accounts
//!   it in a [`ReceiverState`] (per node: session, schema, lost, late, duplicate and replayed
//!   frames, samples of unknown ids);
//! - [`Frame`]: the decoded model (schema entries, samples grouped by series id, events), with
//!   [`Series`] (name, [`Labels`], [`Kind`]) as the series model;
//! - [`encode_schema_request`]: asks an agent for its whole schema after a restart;
//! - [`encode_ack`] and [`encode_timing`]: tells an agent which frames are durable, and when
//!   the newest of them arrived and the answer left (one round trip, from which
//!   [`clock_offset`] estimates the node's clock offset as NTP does).
//!
//! Decoding is bounded: a frame, even one with a valid MAC from a compromised node, may
//! allocate at most `DECODE_BYTES_PER_FRAME_BYTE` bytes per byte for what it describes by
//! reference, plus its schema entries and samples (at most [`MAX_FRAME_SAMPLES`] of each),
//! or it is refused with [`WireError::OverBudget`]; a [`ReceiverState`] keeps at most
//! [`ReceiverLimits`] of schema per node.
//!
//! A sender uses [`FrameEncoder`]: it takes [`Reading`]s, [`Sample`]s and [`WireEvent`]s, assigns
//! ids, decides when schema entries are due and cuts each batch into frames no larger than
//! the MTU; [`encode_frame`] writes one frame exactly as given.
//!
//! Modules, one concept each: `key`, `keyring` (per-node keys and what a receiver accepts), `series` (the series model), `frame` (the frame model and
//! the format's constants), `mac`, `codec` (header and sections), `schema`, `samples` and
//! `events` (the section codecs), `budget` (the decoder's memory budget), `prim` (varints and
//! value coders), `request` (schema requests), `ack` and `ack_timing` (acknowledgements and
//! their timing), `clock_offset` (a node's clock offset from the acknowledgements' round
//! trips), `receiver` (receiver state), `encoder`, `measure` (cost of a batch), `names` (the metric names and event kinds the agent sends and
//! the collector reads), `pci` (a device's place on the PCIe tree and the distance between two).

mod ack;
mod ack_timing;
mod budget;
pub mod clock_offset;
mod codec;
mod encoder;
mod error;
mod events;
mod frame;
mod key;
mod keyring;
mod limits;
mod mac;
mod measure;
pub mod names;
pub mod pci;
mod prim;
mod receiver;
mod request;
mod samples;
mod schema;
mod seqset;
mod series;

#[cfg(test)]
mod testing;

pub use ack::{ACK_MAGIC, Ack, decode_ack, encode_ack};
pub use ack_timing::{AckTiming, TIMING_MAGIC, decode_timing, encode_timing};
pub use codec::{
    StoredFrame, decode, encode_frame, open_stored, open_stored_where, peek_has_schema, peek_node,
    peek_sequence,
};
pub use encoder::{EncoderConfig, EncoderStats, FrameEncoder};
pub use error::WireError;
pub use frame::{
    CounterSample, Frame, GaugeSample, MAGIC, MAX_FRAME_SAMPLES, MIN_FRAME_LEN, Sample,
    SchemaEntry, SeriesData, SeriesSamples, VERSION, WireEvent,
};
pub use key::{Key, KeyError};
pub use keyring::{FleetSecret, Keyring, NoKeys, PreviousSecret, Sealer, sealed_with};
pub use mac::MAC_LEN;
pub use measure::{WireCost, measure, measure_with};
pub use receiver::{LastFrame, NodeState, ReceiverLimits, ReceiverState};
pub use request::{SchemaRequest, decode_schema_request, encode_schema_request};
pub use seqset::{MAX_RANGES, SeqSet};
pub use series::{Kind, Labels, Reading, Series, Value};

/// Appends the MAC of `body` with `key`: for the fuzz targets only (cargo-fuzz builds with
/// `--cfg fuzzing`), so that the fuzzer reaches the parser behind the MAC check.
#[cfg(fuzzing)]
pub fn seal_for_fuzzing(body: &mut Vec<u8>, key: &Key) {
    mac::seal(body, key);
}
