//! Types shared by railscope's eBPF programs (`monitor-ebpf`) and its agent (`monitor-user`).
//!
//! Everything here is `#[repr(C)]` plain data: the kernel side writes it into maps and ring
//! buffers, userspace reads the same bytes back. Field offsets of kernel structs are not here:
//! they are resolved from the running kernel's BTF (and tracefs formats) at load time and
//! handed to the programs as globals (see [`globals`]).
#![no_std]

pub mod events;
pub mod verbs;

/// Names of the load-time globals the programs read. Userspace sets them with
/// `EbpfLoader::override_global`; a typo on either side would silently leave a default, so both
/// sides use these constants (and userspace sets them with `must_exist`).
pub mod globals {
    /// Byte offset of `struct ib_event.device`.
    pub const IB_EVENT_DEVICE_OFFSET: &str = "IB_EVENT_DEVICE_OFFSET";
    /// Byte offset of `struct ib_event.element` (port number, or the QP/CQ pointer).
    pub const IB_EVENT_ELEMENT_OFFSET: &str = "IB_EVENT_ELEMENT_OFFSET";
    /// Size in bytes of `ib_event.element.port_num` (u8 before Linux 5.13, u32 after).
    pub const IB_EVENT_PORT_SIZE: &str = "IB_EVENT_PORT_SIZE";
    /// Byte offset of `struct ib_event.event` (an `enum ib_event_type`).
    pub const IB_EVENT_TYPE_OFFSET: &str = "IB_EVENT_TYPE_OFFSET";
    /// How to read the device name from `struct ib_device`: see [`crate::events::NameSource`].
    pub const IB_DEVICE_NAME_SOURCE: &str = "IB_DEVICE_NAME_SOURCE";
    /// Byte offset of the name in `struct ib_device`: of the `name` char array, or of the
    /// `dev.kobj.name` pointer, depending on [`IB_DEVICE_NAME_SOURCE`].
    pub const IB_DEVICE_NAME_OFFSET: &str = "IB_DEVICE_NAME_OFFSET";
    /// Byte offset of `struct ib_device.index` (u32): the device's identity, allocated
    /// cyclically at registration, so a device that reuses a freed one's memory gets another.
    pub const IB_DEVICE_INDEX_OFFSET: &str = "IB_DEVICE_INDEX_OFFSET";
    /// `struct ib_qp`: offsets of `device` and `qp_num`.
    pub const IB_QP_DEVICE_OFFSET: &str = "IB_QP_DEVICE_OFFSET";
    pub const IB_QP_NUM_OFFSET: &str = "IB_QP_NUM_OFFSET";
    /// `struct ib_cq`: offset of `device`.
    pub const IB_CQ_DEVICE_OFFSET: &str = "IB_CQ_DEVICE_OFFSET";
    /// Offsets of `res.task` (the restrack owner: the process that created the object) in
    /// `struct ib_cq` and `struct ib_qp`, and the path from a task to its cgroup id:
    /// `task_struct.cgroups`, `css_set.dfl_cgrp`, `cgroup.kn`, `kernfs_node.id`.
    pub const IB_CQ_OWNER_OFFSET: &str = "IB_CQ_OWNER_OFFSET";
    pub const IB_QP_OWNER_OFFSET: &str = "IB_QP_OWNER_OFFSET";
    pub const TASK_CGROUPS_OFFSET: &str = "TASK_CGROUPS_OFFSET";
    pub const CSS_SET_DFL_CGRP_OFFSET: &str = "CSS_SET_DFL_CGRP_OFFSET";
    pub const CGROUP_KN_OFFSET: &str = "CGROUP_KN_OFFSET";
    pub const KERNFS_NODE_ID_OFFSET: &str = "KERNFS_NODE_ID_OFFSET";
    /// `struct ib_qp_attr`: offset of `qp_state`.
    pub const QP_ATTR_STATE_OFFSET: &str = "QP_ATTR_STATE_OFFSET";
    /// Value of `IB_QP_STATE` in `enum ib_qp_attr_mask`.
    pub const QP_ATTR_MASK_STATE: &str = "QP_ATTR_MASK_STATE";
    /// Value of `IB_QPS_ERR` in `enum ib_qp_state`.
    pub const QP_STATE_ERR: &str = "QP_STATE_ERR";
    /// `struct rdma_restrack_entry`: offsets of `type` (u32 enum) and `user` (bool).
    pub const RESTRACK_TYPE_OFFSET: &str = "RESTRACK_TYPE_OFFSET";
    pub const RESTRACK_USER_OFFSET: &str = "RESTRACK_USER_OFFSET";
    /// `struct rdma_restrack_entry`: offsets of `valid` (bool: the entry was added) and
    /// `task` (the owning process, null for kernel resources).
    pub const RESTRACK_VALID_OFFSET: &str = "RESTRACK_VALID_OFFSET";
    pub const RESTRACK_TASK_OFFSET: &str = "RESTRACK_TASK_OFFSET";
    /// Per `enum rdma_restrack_type` value: the verb counted when such a resource is added.
    pub const RESTRACK_ADD_VERB: &str = "RESTRACK_ADD_VERB";
    /// Per `enum rdma_restrack_type` value: the verb counted when such a resource is deleted.
    pub const RESTRACK_DEL_VERB: &str = "RESTRACK_DEL_VERB";
    /// Per `enum rdma_restrack_type` value: `offsetof(T, device) - offsetof(T, res)` for the
    /// object type T embedding the entry, or [`crate::verbs::NO_DEVICE`].
    pub const RESTRACK_DEVICE_DELTA: &str = "RESTRACK_DEVICE_DELTA";
    /// `struct uverbs_attr_bundle`: offset of `ufile`; `struct ib_uverbs_file`: of
    /// `ucontext`; `struct ib_ucontext`: of `device`.
    pub const ATTRS_UFILE_OFFSET: &str = "ATTRS_UFILE_OFFSET";
    pub const UFILE_UCONTEXT_OFFSET: &str = "UFILE_UCONTEXT_OFFSET";
    pub const UCONTEXT_DEVICE_OFFSET: &str = "UCONTEXT_DEVICE_OFFSET";
    /// Offsets of `device` in the objects the destroy functions receive (QPs and CQs use
    /// [`IB_QP_DEVICE_OFFSET`] and [`IB_CQ_DEVICE_OFFSET`]).
    pub const IB_PD_DEVICE_OFFSET: &str = "IB_PD_DEVICE_OFFSET";
    pub const IB_MR_DEVICE_OFFSET: &str = "IB_MR_DEVICE_OFFSET";
    pub const IB_SRQ_DEVICE_OFFSET: &str = "IB_SRQ_DEVICE_OFFSET";
    /// `offsetof(struct rdma_id_private, id.event_handler)` (rdma_cm's BTF).
    pub const CM_ID_HANDLER_OFFSET: &str = "CM_ID_HANDLER_OFFSET";
    /// The address of rdma_cm's `cma_listen_handler` (u64, from `/proc/kallsyms`).
    pub const CM_LISTEN_HANDLER: &str = "CM_LISTEN_HANDLER";
    /// `struct rdma_cm_event`: offsets of `event` and `status`.
    pub const CM_EVENT_OFFSET: &str = "CM_EVENT_OFFSET";
    pub const CM_STATUS_OFFSET: &str = "CM_STATUS_OFFSET";
    /// Value of `RDMA_CM_EVENT_REJECTED`.
    pub const CM_EVENT_REJECTED: &str = "CM_EVENT_REJECTED";
    /// Tracepoint field offset, from the tracefs `format` file.
    pub const MAD_WC_STATUS_FIELD_OFFSET: &str = "MAD_WC_STATUS_FIELD_OFFSET";
}

/// Names of the maps the programs share with userspace.
pub mod maps {
    /// Ring buffer of [`crate::events::EventRecord`].
    pub const EVENTS: &str = "EVENTS";
    /// Per-CPU hash of [`crate::verbs::CounterKey`] to a count.
    pub const VERB_COUNTS: &str = "VERB_COUNTS";
    /// A device's key (see [`crate::events::device_key`]) to its name and removal time
    /// ([`crate::events::DeviceEntry`]), filled the first time a probe meets a device.
    pub const DEVICE_NAMES: &str = "DEVICE_NAMES";
    /// Per-CPU array of counters about the probes themselves (see [`crate::ProbeStat`]).
    pub const PROBE_STATS: &str = "PROBE_STATS";
}

/// Slots of the `PROBE_STATS` per-CPU array: what the probes could not deliver.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeStat {
    /// An event was seen but the ring buffer was full.
    EventsDropped = 0,
    /// An event was seen but a kernel read failed (the record is still sent, marked).
    EventReadErrors = 1,
    /// A verb was seen but the counter map was full.
    CountsDropped = 2,
    /// A device was seen but `DEVICE_NAMES` was full: its counters and events carry no name.
    DeviceNamesFull = 3,
}

/// Number of slots in `PROBE_STATS`.
pub const PROBE_STAT_SLOTS: u32 = 4;
