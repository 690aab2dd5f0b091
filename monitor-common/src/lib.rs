//! Types shared by railscope's eBPF programs (`monitor-ebpf`) and its agent (`monitor-user`).
//!
//! Everything here is `#[repr(C)]` plain data: the kernel side writes it into maps and ring
//! buffers, userspace reads the same bytes back. Field offsets of kernel structs are not here:
//! they are resolved from the running kernel's BTF at load time and handed to the programs as
//! globals (see [`globals`]).
#![no_std]

pub mod ib_event;

/// Names of the load-time globals the programs read. Userspace sets them with
/// `EbpfLoader::override_global`; a typo on either side would silently leave a default, so both
/// sides use these constants.
pub mod globals {
    /// Byte offset of `struct ib_event.device`.
    pub const IB_EVENT_DEVICE_OFFSET: &str = "IB_EVENT_DEVICE_OFFSET";
    /// Byte offset of `struct ib_event.element.port_num`.
    pub const IB_EVENT_PORT_OFFSET: &str = "IB_EVENT_PORT_OFFSET";
    /// Size in bytes of `ib_event.element.port_num` (u8 before Linux 5.13, u32 after).
    pub const IB_EVENT_PORT_SIZE: &str = "IB_EVENT_PORT_SIZE";
    /// Byte offset of `struct ib_event.event` (an `enum ib_event_type`).
    pub const IB_EVENT_TYPE_OFFSET: &str = "IB_EVENT_TYPE_OFFSET";
    /// How to read the device name from `struct ib_device`: see [`crate::ib_event::NameSource`].
    pub const IB_DEVICE_NAME_SOURCE: &str = "IB_DEVICE_NAME_SOURCE";
    /// Byte offset of the name in `struct ib_device`: of the `name` char array, or of the
    /// `dev.kobj.name` pointer, depending on [`IB_DEVICE_NAME_SOURCE`].
    pub const IB_DEVICE_NAME_OFFSET: &str = "IB_DEVICE_NAME_OFFSET";
}

/// Names of the maps the programs share with userspace.
pub mod maps {
    /// Ring buffer of [`crate::ib_event::IbEventRecord`].
    pub const IB_EVENTS: &str = "IB_EVENTS";
    /// Per-CPU array of counters about the probes themselves (see [`crate::ProbeStat`]).
    pub const PROBE_STATS: &str = "PROBE_STATS";
}

/// Slots of the `PROBE_STATS` per-CPU array: what the probes could not deliver.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeStat {
    /// An IB event was seen but the ring buffer was full.
    IbEventsDropped = 0,
    /// An IB event was seen but a kernel read failed (the record is still sent, marked).
    IbEventReadErrors = 1,
}

/// Number of slots in `PROBE_STATS`.
pub const PROBE_STAT_SLOTS: u32 = 2;
