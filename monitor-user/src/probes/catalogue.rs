//! The catalogue: every probe railscope has, the hook it attaches to, the family (kernel
//! module) it belongs to and the layout (load-time globals) it needs.

use std::fmt;

/// Where a program attaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    Kprobe(&'static str),
    Tracepoint {
        system: &'static str,
        event: &'static str,
    },
    /// A tracepoint whose program reads the tracepoint's arguments (kernel pointers) rather
    /// than its record.
    RawTracepoint(&'static str),
}

impl fmt::Display for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Hook::Kprobe(function) => write!(f, "kprobe:{function}"),
            Hook::Tracepoint { system, event } => write!(f, "tracepoint:{system}:{event}"),
            Hook::RawTracepoint(name) => write!(f, "raw_tracepoint:{name}"),
        }
    }
}

/// The kernel module whose code a family hooks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Family {
    IbCore,
    IbUverbs,
    RdmaCm,
}

impl Family {
    pub const ALL: [Family; 3] = [Family::IbCore, Family::IbUverbs, Family::RdmaCm];

    pub fn module(self) -> &'static str {
        match self {
            Family::IbCore => "ib_core",
            Family::IbUverbs => "ib_uverbs",
            Family::RdmaCm => "rdma_cm",
        }
    }

    /// What the operator loses while the family is not attached.
    pub fn feature(self) -> &'static str {
        match self {
            Family::IbCore => "IB event and verb probes",
            Family::IbUverbs => "user verbs probes",
            Family::RdmaCm => "rdma_cm probes",
        }
    }

    pub fn probes(self) -> impl Iterator<Item = &'static ProbeInfo> {
        CATALOGUE.iter().filter(move |p| p.family == self)
    }
}

/// Which layout (set of globals) a program needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Layout {
    IbEvent,
    Restrack,
    ModifyQp,
    Mad,
    Uverbs,
    RdmaCm,
    /// A device's identity and name only (its removal).
    Device,
}

impl Layout {
    pub const ALL: [Layout; 7] = [
        Layout::IbEvent,
        Layout::Restrack,
        Layout::ModifyQp,
        Layout::Mad,
        Layout::Uverbs,
        Layout::RdmaCm,
        Layout::Device,
    ];

    /// Every global the programs of this layout read. A global left unset would silently
    /// keep its compiled-in default, so a test checks that `super::layout::resolve` sets them all.
    pub fn required_globals(self) -> &'static [&'static str] {
        use monitor_common::globals::*;
        match self {
            Layout::IbEvent => &[
                IB_EVENT_DEVICE_OFFSET,
                IB_EVENT_ELEMENT_OFFSET,
                IB_EVENT_PORT_SIZE,
                IB_EVENT_TYPE_OFFSET,
                IB_DEVICE_NAME_SOURCE,
                IB_DEVICE_NAME_OFFSET,
                IB_DEVICE_INDEX_OFFSET,
            ],
            Layout::Restrack => &[
                RESTRACK_TYPE_OFFSET,
                RESTRACK_USER_OFFSET,
                RESTRACK_VALID_OFFSET,
                RESTRACK_TASK_OFFSET,
                TASK_CGROUPS_OFFSET,
                CSS_SET_DFL_CGRP_OFFSET,
                CGROUP_KN_OFFSET,
                KERNFS_NODE_ID_OFFSET,
                RESTRACK_ADD_VERB,
                RESTRACK_DEL_VERB,
                RESTRACK_DEVICE_DELTA,
                IB_PD_DEVICE_OFFSET,
                IB_CQ_DEVICE_OFFSET,
                IB_QP_DEVICE_OFFSET,
                IB_MR_DEVICE_OFFSET,
                IB_SRQ_DEVICE_OFFSET,
                IB_DEVICE_NAME_SOURCE,
                IB_DEVICE_NAME_OFFSET,
                IB_DEVICE_INDEX_OFFSET,
            ],
            Layout::ModifyQp => &[
                IB_QP_DEVICE_OFFSET,
                IB_QP_NUM_OFFSET,
                QP_ATTR_STATE_OFFSET,
                QP_ATTR_MASK_STATE,
                QP_STATE_ERR,
                IB_DEVICE_NAME_SOURCE,
                IB_DEVICE_NAME_OFFSET,
                IB_DEVICE_INDEX_OFFSET,
            ],
            Layout::Mad => &[MAD_WC_STATUS_FIELD_OFFSET],
            Layout::Uverbs => &[
                ATTRS_UFILE_OFFSET,
                UFILE_UCONTEXT_OFFSET,
                UCONTEXT_DEVICE_OFFSET,
                IB_CQ_DEVICE_OFFSET,
                IB_QP_DEVICE_OFFSET,
                IB_QP_NUM_OFFSET,
                IB_CQ_OWNER_OFFSET,
                IB_QP_OWNER_OFFSET,
                TASK_CGROUPS_OFFSET,
                CSS_SET_DFL_CGRP_OFFSET,
                CGROUP_KN_OFFSET,
                KERNFS_NODE_ID_OFFSET,
                IB_EVENT_TYPE_OFFSET,
                IB_EVENT_ELEMENT_OFFSET,
                IB_DEVICE_NAME_SOURCE,
                IB_DEVICE_NAME_OFFSET,
                IB_DEVICE_INDEX_OFFSET,
            ],
            Layout::Device => &[
                IB_DEVICE_NAME_SOURCE,
                IB_DEVICE_NAME_OFFSET,
                IB_DEVICE_INDEX_OFFSET,
            ],
            Layout::RdmaCm => &[
                CM_ID_HANDLER_OFFSET,
                CM_LISTEN_HANDLER,
                CM_EVENT_OFFSET,
                CM_STATUS_OFFSET,
                CM_EVENT_REJECTED,
            ],
        }
    }
}

/// One program of the object and what it needs.
#[derive(Clone, Copy, Debug)]
pub struct ProbeInfo {
    /// The program's name in the object (the function name in monitor-ebpf).
    pub program: &'static str,
    pub hook: Hook,
    pub family: Family,
    pub layout: Layout,
    /// What it observes, for `railscope probes` and docs/probes.md.
    pub observes: &'static str,
}

const fn kprobe(
    program: &'static str,
    function: &'static str,
    family: Family,
    layout: Layout,
    observes: &'static str,
) -> ProbeInfo {
    ProbeInfo {
        program,
        hook: Hook::Kprobe(function),
        family,
        layout,
        observes,
    }
}

const fn tracepoint(
    program: &'static str,
    system: &'static str,
    event: &'static str,
    family: Family,
    layout: Layout,
    observes: &'static str,
) -> ProbeInfo {
    ProbeInfo {
        program,
        hook: Hook::Tracepoint { system, event },
        family,
        layout,
        observes,
    }
}

/// Every probe railscope has, in the order the table shows them.
pub const CATALOGUE: &[ProbeInfo] = &[
    kprobe(
        "ib_dispatch_event",
        "ib_dispatch_event",
        Family::IbCore,
        Layout::IbEvent,
        "port and device events (PORT_ACTIVE, PORT_ERR, DEVICE_FATAL, ...)",
    ),
    kprobe(
        "rdma_restrack_add",
        "rdma_restrack_add",
        Family::IbCore,
        Layout::Restrack,
        "PD/CQ/QP/MR/SRQ/user context/cm_id creation",
    ),
    kprobe(
        "rdma_restrack_del",
        "rdma_restrack_del",
        Family::IbCore,
        Layout::Restrack,
        "user context and cm_id destruction (of added entries only)",
    ),
    kprobe(
        "ib_dealloc_pd_user",
        "ib_dealloc_pd_user",
        Family::IbCore,
        Layout::Restrack,
        "PD deallocation",
    ),
    kprobe(
        "ib_destroy_cq_user",
        "ib_destroy_cq_user",
        Family::IbCore,
        Layout::Restrack,
        "CQ destruction",
    ),
    kprobe(
        "ib_destroy_qp_user",
        "ib_destroy_qp_user",
        Family::IbCore,
        Layout::Restrack,
        "QP destruction",
    ),
    kprobe(
        "ib_dereg_mr_user",
        "ib_dereg_mr_user",
        Family::IbCore,
        Layout::Restrack,
        "MR deregistration",
    ),
    kprobe(
        "ib_destroy_srq_user",
        "ib_destroy_srq_user",
        Family::IbCore,
        Layout::Restrack,
        "SRQ destruction",
    ),
    kprobe(
        "ib_modify_qp_with_udata",
        "ib_modify_qp_with_udata",
        Family::IbCore,
        Layout::ModifyQp,
        "modify_qp by target state; QP moves to ERR",
    ),
    kprobe(
        "ib_dealloc_device",
        "ib_dealloc_device",
        Family::IbCore,
        Layout::Device,
        "devices going away (their names and counters are then released)",
    ),
    tracepoint(
        "ib_mad_send_done_handler",
        "ib_mad",
        "ib_mad_send_done_handler",
        Family::IbCore,
        Layout::Mad,
        "MAD sends completed with an error",
    ),
    tracepoint(
        "ib_mad_send_done_resend",
        "ib_mad",
        "ib_mad_send_done_resend",
        Family::IbCore,
        Layout::Mad,
        "MAD retries",
    ),
    kprobe(
        "ib_uverbs_post_send",
        "ib_uverbs_post_send",
        Family::IbUverbs,
        Layout::Uverbs,
        "post_send doorbells the kernel sees (none on mlx5)",
    ),
    kprobe(
        "ib_uverbs_reg_dmabuf_mr",
        "ib_uverbs_handler_UVERBS_METHOD_REG_DMABUF_MR",
        Family::IbUverbs,
        Layout::Uverbs,
        "dmabuf (GPU memory) MR registrations",
    ),
    kprobe(
        "ib_uverbs_qp_event_handler",
        "ib_uverbs_qp_event_handler",
        Family::IbUverbs,
        Layout::Uverbs,
        "async errors of user QPs (QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR, ...)",
    ),
    kprobe(
        "ib_uverbs_cq_event_handler",
        "ib_uverbs_cq_event_handler",
        Family::IbUverbs,
        Layout::Uverbs,
        "async errors of user CQs (CQ_ERR)",
    ),
    kprobe(
        "uverbs_ib_dealloc_device",
        "ib_dealloc_device",
        Family::IbUverbs,
        Layout::Device,
        "devices going away, for this family's own device names",
    ),
    ProbeInfo {
        program: "cm_event_handler",
        hook: Hook::RawTracepoint("cm_event_handler"),
        family: Family::RdmaCm,
        layout: Layout::RdmaCm,
        observes: "rdma_cm events delivered to consumers, rejects by reason",
    },
];

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn every_family_has_probes_and_names_are_unique() {
        for family in Family::ALL {
            assert!(family.probes().count() > 0, "{family:?}");
        }
        let names: BTreeSet<&str> = CATALOGUE.iter().map(|p| p.program).collect();
        assert_eq!(names.len(), CATALOGUE.len());
    }
}
