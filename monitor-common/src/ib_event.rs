//! IB driver events as seen by the kprobe on `ib_dispatch_event`.

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

/// One event passed to `ib_dispatch_event`, as the probe writes it to the ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IbEventRecord {
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC nanoseconds when the event was dispatched.
    pub timestamp_ns: u64,
    /// Raw `enum ib_event_type` value; userspace names it from the kernel's BTF.
    pub event_type: u32,
    /// Port number (meaningful for port events; for QP/CQ events the union holds a pointer).
    pub port: u32,
    /// Non-zero when a kernel read failed and some fields are missing.
    pub read_error: u32,
    pub _pad: u32,
    /// NUL-terminated device name, e.g. `mlx5_0` or `rxe0`.
    pub device_name: [u8; DEVICE_NAME_LEN],
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for IbEventRecord {}

#[cfg(feature = "user")]
impl IbEventRecord {
    /// Reads a record from ring-buffer bytes; `None` if the slice is too short.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < core::mem::size_of::<Self>() {
            return None;
        }
        // SAFETY: the length is checked above; the type is plain old data, any bit pattern is
        // valid, and read_unaligned copes with the ring buffer's 8-byte alignment.
        Some(unsafe { core::ptr::read_unaligned(bytes.as_ptr().cast::<Self>()) })
    }

    /// The device name up to its first NUL, lossily decoded.
    pub fn device_name(&self) -> &str {
        let end = self
            .device_name
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(DEVICE_NAME_LEN);
        core::str::from_utf8(&self.device_name[..end]).unwrap_or("?")
    }
}
