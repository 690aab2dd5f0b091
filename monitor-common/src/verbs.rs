//! Counters of RDMA control-path verbs, kept in the per-CPU hash `VERB_COUNTS` and summed in
//! userspace. Keys carry the device (as its key, [`crate::events::device_key`], named
//! through `DEVICE_NAMES`) and the cgroup of the calling task, never a pid: a job is a cgroup, and
//! cardinality stays bounded by jobs, not processes.

/// `RESTRACK_DEVICE_DELTA` value for resource types whose device the probe cannot reach.
pub const NO_DEVICE: i32 = i32::MIN;

/// Number of slots in the per-restrack-type tables (`enum rdma_restrack_type` has 8 values
/// plus MAX on current kernels; larger values are ignored).
pub const RESTRACK_TYPES: usize = 16;

/// What a counter counts. `detail` in [`CounterKey`] refines some of them.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verb {
    /// Not counted (a restrack type we do not follow).
    None = 0,
    PdAlloc = 1,
    PdDealloc = 2,
    CqCreate = 3,
    CqDestroy = 4,
    QpCreate = 5,
    QpDestroy = 6,
    MrReg = 7,
    MrDereg = 8,
    SrqCreate = 9,
    SrqDestroy = 10,
    ContextCreate = 11,
    ContextDestroy = 12,
    CmIdCreate = 13,
    CmIdDestroy = 14,
    /// `detail`: the target `ib_qp_state`, or [`NO_STATE_CHANGE`].
    QpModify = 15,
    /// `ib_uverbs_post_send`: one per doorbell the kernel sees (0 on mlx5 by design).
    PostSend = 16,
    /// `detail`: 1. (dmabuf MRs are also counted by MrReg.)
    MrRegDmabuf = 17,
    /// `detail`: the `rdma_cm_event_type`.
    CmEvent = 18,
    /// `detail`: the reject reason (`status` of a REJECTED event).
    CmReject = 19,
    /// `detail`: the `ib_wc_status` of the failed MAD send.
    MadSendError = 20,
    /// A MAD resent after a timeout.
    MadRetry = 21,
}

/// `detail` of [`Verb::QpModify`] when the call did not change the state.
pub const NO_STATE_CHANGE: u32 = 0xffff;

/// `detail` flag: the resource belongs to userspace (restrack's `user`), not a kernel ULP.
pub const DETAIL_USER: u32 = 1;

impl Verb {
    pub const ALL: [Verb; 21] = [
        Verb::PdAlloc,
        Verb::PdDealloc,
        Verb::CqCreate,
        Verb::CqDestroy,
        Verb::QpCreate,
        Verb::QpDestroy,
        Verb::MrReg,
        Verb::MrDereg,
        Verb::SrqCreate,
        Verb::SrqDestroy,
        Verb::ContextCreate,
        Verb::ContextDestroy,
        Verb::CmIdCreate,
        Verb::CmIdDestroy,
        Verb::QpModify,
        Verb::PostSend,
        Verb::MrRegDmabuf,
        Verb::CmEvent,
        Verb::CmReject,
        Verb::MadSendError,
        Verb::MadRetry,
    ];

    pub fn from_u32(v: u32) -> Option<Self> {
        Self::ALL.iter().copied().find(|verb| *verb as u32 == v)
    }

    /// The name used in metrics and tables.
    pub fn name(self) -> &'static str {
        match self {
            Verb::None => "none",
            Verb::PdAlloc => "alloc_pd",
            Verb::PdDealloc => "dealloc_pd",
            Verb::CqCreate => "create_cq",
            Verb::CqDestroy => "destroy_cq",
            Verb::QpCreate => "create_qp",
            Verb::QpDestroy => "destroy_qp",
            Verb::MrReg => "reg_mr",
            Verb::MrDereg => "dereg_mr",
            Verb::SrqCreate => "create_srq",
            Verb::SrqDestroy => "destroy_srq",
            Verb::ContextCreate => "alloc_ucontext",
            Verb::ContextDestroy => "dealloc_ucontext",
            Verb::CmIdCreate => "create_cm_id",
            Verb::CmIdDestroy => "destroy_cm_id",
            Verb::QpModify => "modify_qp",
            Verb::PostSend => "post_send",
            Verb::MrRegDmabuf => "reg_dmabuf_mr",
            Verb::CmEvent => "cm_event",
            Verb::CmReject => "cm_reject",
            Verb::MadSendError => "mad_send_error",
            Verb::MadRetry => "mad_retry",
        }
    }
}

/// Key of `VERB_COUNTS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CounterKey {
    /// The device's key ([`crate::events::device_key`]), or 0 when the hook does not know
    /// the device (rdma_cm, MAD).
    pub device: u64,
    /// cgroup v2 id of the calling task.
    pub cgroup: u64,
    /// A [`Verb`].
    pub verb: u32,
    /// Verb-specific detail (target QP state, cm event, reject reason, user flag...).
    pub detail: u32,
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for CounterKey {}
