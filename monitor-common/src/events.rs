//! Discrete events the probes send through the `EVENTS` ring buffer: each one keeps its own
//! kernel timestamp, so a flapping link is a sequence, not a last value.

/// Longest RDMA device name the kernel allows (`IB_DEVICE_NAME_MAX`), including the NUL.
pub const DEVICE_NAME_LEN: usize = 64;

/// Where the probe finds an `ib_device`'s name; chosen by userspace from BTF.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameSource {
    /// `struct ib_device` has `char name[IB_DEVICE_NAME_MAX]` at the given offset.
    InlineArray = 0,
    /// The name is behind a `const char *` at the given offset (`dev.kobj.name`).
    Pointer = 1,
}

/// The key of a device in counters, events and `DEVICE_NAMES`: its `ib_device.index` plus
/// one (0 means no device). ib_core allocates indexes cyclically over 31 bits at
/// registration, so a device registered after another went away, even at the same address,
/// has another key.
pub const fn device_key(index: u32) -> u64 {
    index as u64 + 1
}

/// What `DEVICE_NAMES` holds for a device.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DeviceEntry {
    /// The NUL-terminated name, as the probes read it when they first met the device.
    pub name: [u8; DEVICE_NAME_LEN],
    /// `bpf_ktime_get_ns()` when `ib_dealloc_device` freed the device, 0 while it lives.
    /// Userspace deletes the entry (and the device's counters) a grace period later.
    pub removed_ns: u64,
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for DeviceEntry {}

/// Which hook saw the event.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// `ib_dispatch_event`: port and device events (`event_type` is an `ib_event_type`).
    Dispatch = 0,
    /// `ib_uverbs_qp_event_handler`: an async event of a user QP (QP_FATAL, QP_REQ_ERR, ...).
    QpAsync = 1,
    /// `ib_uverbs_cq_event_handler`: an async event of a user CQ (CQ_ERR).
    CqAsync = 2,
    /// `ib_modify_qp_with_udata` moving a QP to ERR (`event_type` is the new `ib_qp_state`).
    QpToErr = 3,
    /// Not an event: a cgroup counted a verb for the first time (in a while). The agent,
    /// woken, names the cgroup while it still exists, so a job shorter than a sweep of the
    /// counters is still named when its counters are read.
    NewCgroup = 4,
}

impl Origin {
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            0 => Self::Dispatch,
            1 => Self::QpAsync,
            2 => Self::CqAsync,
            3 => Self::QpToErr,
            4 => Self::NewCgroup,
            _ => return None,
        })
    }
}

/// One event as a probe writes it to the ring buffer: the layout the kernel side and
/// userspace share (`#[repr(C)]`, fixed size), raw numbers only (a device key, an enum value,
/// a cgroup id), what a probe can write cheaply. Userspace names them
/// (`monitor-user`'s `ProbeEvent`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EventRecord {
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC nanoseconds when the hook ran.
    pub timestamp_ns: u64,
    /// cgroup v2 id of the job: the task that was running, or the owner of the QP or CQ an
    /// async event is about.
    pub cgroup: u64,
    /// The device's key ([`device_key`]) in the probes' `DEVICE_NAMES` map, which holds its
    /// name by the time the record is written (userspace resolves it); 0 if unread.
    /// A key, not the name: copying a string out of the kernel was most of an event's cost.
    pub device: u64,
    /// An [`Origin`].
    pub origin: u32,
    /// Raw enum value; userspace names it from the kernel's BTF.
    pub event_type: u32,
    /// Port number for port events, else 0.
    pub port: u32,
    /// QP number for QP events, else 0.
    pub qp_num: u32,
    /// Non-zero when a kernel read failed and some fields are missing.
    pub read_error: u32,
    pub _pad: u32,
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for EventRecord {}

#[cfg(feature = "user")]
impl EventRecord {
    /// Reads a record from ring-buffer bytes; `None` if the slice is too short.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < core::mem::size_of::<Self>() {
            return None;
        }
        // SAFETY: the length is checked above; the type is plain old data, any bit pattern is
        // valid, and read_unaligned copes with any alignment.
        Some(unsafe { core::ptr::read_unaligned(bytes.as_ptr().cast::<Self>()) })
    }
}

/// A NUL-terminated name buffer as text (`?` if it is not UTF-8).
#[cfg(feature = "user")]
pub fn name_str(buf: &[u8]) -> &str {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    core::str::from_utf8(&buf[..end]).unwrap_or("?")
}
