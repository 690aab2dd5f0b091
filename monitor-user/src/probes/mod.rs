//! railscope's eBPF probes: which exist, loading and attaching them, and reading what they
//! send.
//!
//! Probes come in families, one per kernel module that owns their hooks (ib_core, ib_uverbs,
//! rdma_cm). A family is loaded as its own instance of the embedded object, with globals
//! resolved from that module's BTF (and tracefs formats) at that moment, so a module loaded
//! after the agent started is probed with its own layout; a module unloaded drops its family.
//! Within a family each probe attaches on its own: a hook missing on one kernel leaves that
//! probe unavailable and the rest working.
//!
//! - `catalogue`: which probes exist: [`CATALOGUE`], each probe's hook, family and layout;
//! - `layout`: the load-time globals a layout needs, resolved from BTF and tracefs;
//! - `object`: the embedded eBPF object, loaded anew for each family (or for the verifier);
//! - `attach`: a family loaded and its probes attached ([`AttachedFamily`]), its maps read;
//! - `verify`: every program put through the kernel's verifier without attaching;
//! - `status`: the probe table, a row per probe, attached or why not;
//! - `families`: the families at run time, attached, retried and detached as their modules
//!   come and go (the agent's loop and `railscope capture` share it);
//! - `ring`: a family's event ring buffer drained by a reader task;
//! - `decode`: records and counter keys turned into what an operator reads;
//! - `names` and [`btf_cache`]: kernel enum names and each module's BTF, parsed once.

mod attach;
pub mod btf_cache;
mod catalogue;
pub(crate) mod decode;
pub(crate) mod families;
mod layout;
mod names;
mod object;
pub(crate) mod ring;
mod status;
mod verify;

pub use attach::{
    AttachedFamily, FamilyUnavailable, ProbeLosses, RawCount, RemovedDevice, Unavailable,
    unnamed_device,
};
pub use catalogue::{CATALOGUE, Family, Hook, Layout, ProbeInfo};
pub use object::{EVENT_RING_BYTES_ENV, PROBES_OBJECT};
pub use status::{ProbeReport, Status, render_table};
pub use verify::{VerifierResult, verify_all};
