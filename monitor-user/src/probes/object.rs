//! The eBPF object embedded in the binary, and loading a fresh instance of it with given
//! load-time globals (for attaching a family, or for the verifier alone).

use aya::{Ebpf, EbpfLoader};

use super::layout::{GlobalValue, Globals};

/// The eBPF object built from `monitor-ebpf` by build.rs.
pub static PROBES_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/railscope-probes"));

/// Overrides the size of each family's event ring buffer (bytes; a power of two, at least a
/// page): a test knob, to overflow it on purpose (the `ring-overflow` scenario). Not a
/// setting: the built-in 256 KiB holds thousands of events, far more than a node raises
/// between two drains.
pub const EVENT_RING_BYTES_ENV: &str = "RAILSCOPE_EVENT_RING_BYTES";

/// The event ring size [`EVENT_RING_BYTES_ENV`] asks for, if it is a valid one.
fn event_ring_override() -> Option<u32> {
    let text = std::env::var(EVENT_RING_BYTES_ENV).ok()?;
    match text.trim().parse::<u32>() {
        Ok(bytes) if bytes.is_power_of_two() && bytes >= 4096 => Some(bytes),
        _ => {
            tracing::warn!(
                "{EVENT_RING_BYTES_ENV}={text:?} ignored: not a power of two of at least 4096"
            );
            None
        }
    }
}

/// Loads a fresh instance of the object with the given load-time globals.
pub(super) fn load_object(globals: &Globals) -> Result<Ebpf, aya::EbpfError> {
    let mut loader = EbpfLoader::new();
    if let Some(bytes) = event_ring_override() {
        loader.map_max_entries("EVENTS", bytes);
    }
    for (name, value) in globals {
        match value {
            GlobalValue::U32(v) => loader.override_global(name, v, true),
            GlobalValue::U64(v) => loader.override_global(name, v, true),
            GlobalValue::U32s(v) => loader.override_global(name, v, true),
            GlobalValue::I32s(v) => loader.override_global(name, v, true),
        };
    }
    loader.load(PROBES_OBJECT)
}
