//! QP state changes: a kprobe on ib_core's exported
//! `ib_modify_qp_with_udata(struct ib_qp *, struct ib_qp_attr *, int attr_mask, struct ib_udata *)`,
//! the single entry of every userspace `ibv_modify_qp` (legacy and extended commands).
//! Counted by target state; a move to ERR is also sent as an event with the QP number.

use aya_ebpf::{Global, macros::kprobe, programs::ProbeContext};
use monitor_common::{
    events::Origin,
    verbs::{NO_STATE_CHANGE, Verb},
};

use crate::{
    device,
    shared::{Delivery, count_in, current_cgroup, read_at, send_event_in},
};

#[unsafe(no_mangle)]
pub(crate) static IB_QP_DEVICE_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static IB_QP_NUM_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static QP_ATTR_STATE_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static QP_ATTR_MASK_STATE: Global<u32> = Global::new(1);
#[unsafe(no_mangle)]
static QP_STATE_ERR: Global<u32> = Global::new(6);

/// The device and number of a `struct ib_qp *`.
///
/// # Safety
/// `qp` is a kernel `struct ib_qp *`.
#[inline(always)]
pub(crate) unsafe fn qp_device_and_num(qp: *const u8) -> Result<(*const u8, u32), i32> {
    unsafe {
        Ok((
            read_at::<*const u8>(qp, IB_QP_DEVICE_OFFSET.load())?,
            read_at::<u32>(qp, IB_QP_NUM_OFFSET.load())?,
        ))
    }
}

#[kprobe]
pub(crate) fn ib_modify_qp_with_udata(ctx: ProbeContext) -> u32 {
    let (Some(qp), Some(attr), Some(mask)) = (
        ctx.arg::<*const u8>(0),
        ctx.arg::<*const u8>(1),
        ctx.arg::<u32>(2),
    ) else {
        return 0;
    };
    // SAFETY: the kernel's `struct ib_qp *`.
    let Ok(dev) = (unsafe { read_at::<*const u8>(qp, IB_QP_DEVICE_OFFSET.load()) }) else {
        return 0;
    };
    // SAFETY: as above.
    let device = unsafe { device::remember(dev) };
    let state = if mask & QP_ATTR_MASK_STATE.load() != 0 {
        // SAFETY: the kernel's `struct ib_qp_attr *`.
        unsafe { read_at::<u32>(attr, QP_ATTR_STATE_OFFSET.load()) }.unwrap_or(NO_STATE_CHANGE)
    } else {
        NO_STATE_CHANGE
    };
    let cgroup = current_cgroup();
    count_in(cgroup, device, Verb::QpModify as u32, state);
    if state == QP_STATE_ERR.load() {
        send_event_in(cgroup, Delivery::Batched, |record| {
            record.origin = Origin::QpToErr as u32;
            record.event_type = state;
            record.device = device;
            // SAFETY: the kernel's `struct ib_qp *` (read only here: moves to ERR are rare).
            record.qp_num = unsafe { read_at::<u32>(qp, IB_QP_NUM_OFFSET.load())? };
            Ok(())
        });
    }
    0
}
