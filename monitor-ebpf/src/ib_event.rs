//! Port and device events: a kprobe on `ib_dispatch_event(const struct ib_event *)`.
//!
//! `ib_dispatch_event` is exported by ib_core and has no tracepoint; every driver (mlx5_ib,
//! rxe, ...) calls it for PORT_ACTIVE, PORT_ERR, DEVICE_FATAL, LID/PKEY/GID changes.
//! The uverbs async handlers (see `uverbs`) read the same `struct ib_event` through
//! [`read_event_type`].

use aya_ebpf::{Global, macros::kprobe, programs::ProbeContext};
use monitor_common::events::Origin;

use crate::{
    device,
    shared::{Delivery, read_at, send_event},
};

#[unsafe(no_mangle)]
static IB_EVENT_DEVICE_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static IB_EVENT_ELEMENT_OFFSET: Global<u32> = Global::new(8);
#[unsafe(no_mangle)]
static IB_EVENT_PORT_SIZE: Global<u32> = Global::new(4);
#[unsafe(no_mangle)]
static IB_EVENT_TYPE_OFFSET: Global<u32> = Global::new(16);

/// # Safety
/// `event` is a kernel `struct ib_event *`.
#[inline(always)]
pub(crate) unsafe fn read_event_type(event: *const u8) -> Result<u32, i32> {
    unsafe { read_at::<u32>(event, IB_EVENT_TYPE_OFFSET.load()) }
}

/// The `element` union as a pointer (the QP or CQ of async events).
///
/// # Safety
/// `event` is a kernel `struct ib_event *`.
#[inline(always)]
pub(crate) unsafe fn read_element_ptr(event: *const u8) -> Result<*const u8, i32> {
    unsafe { read_at::<*const u8>(event, IB_EVENT_ELEMENT_OFFSET.load()) }
}

#[kprobe]
pub(crate) fn ib_dispatch_event(ctx: ProbeContext) -> u32 {
    let Some(event) = ctx.arg::<*const u8>(0) else {
        return 0;
    };
    send_event(Delivery::Wake, |record| {
        record.origin = Origin::Dispatch as u32;
        // SAFETY: `event` is the kernel's `struct ib_event *`; every read goes through
        // bpf_probe_read_kernel.
        unsafe {
            record.event_type = read_event_type(event)?;
            let element = IB_EVENT_ELEMENT_OFFSET.load();
            record.port = if IB_EVENT_PORT_SIZE.load() == 1 {
                u32::from(read_at::<u8>(event, element)?)
            } else {
                read_at::<u32>(event, element)?
            };
            let dev = read_at::<*const u8>(event, IB_EVENT_DEVICE_OFFSET.load())?;
            record.device = device::remember_checked(dev);
            Ok(())
        }
    });
    0
}
