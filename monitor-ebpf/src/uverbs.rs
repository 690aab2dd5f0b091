//! Hooks in ib_uverbs, the userspace verbs interface:
//! - `ib_uverbs_post_send`: each `ibv_post_send` that reaches the kernel (one `write()`
//!   doorbell per call on rxe and other software providers; never on mlx5, whose doorbells are
//!   rung from userspace — its data path comes from hardware counters);
//! - `ib_uverbs_handler_UVERBS_METHOD_REG_DMABUF_MR`: GPU memory registered through dmabuf;
//! - `ib_uverbs_qp_event_handler` / `ib_uverbs_cq_event_handler`: async errors of user QPs
//!   and CQs (QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR, CQ_ERR, ...), which do not pass through
//!   `ib_dispatch_event`.

use aya_ebpf::{Global, macros::kprobe, programs::ProbeContext};
use monitor_common::{events::Origin, verbs::Verb};

use crate::{
    device, ib_event, modify_qp,
    shared::{Delivery, count, read_at, send_event, task_cgroup},
};

#[unsafe(no_mangle)]
static ATTRS_UFILE_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static UFILE_UCONTEXT_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static UCONTEXT_DEVICE_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static IB_CQ_DEVICE_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static IB_CQ_OWNER_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static IB_QP_OWNER_OFFSET: Global<u32> = Global::new(0);

/// The cgroup id of the process that created a QP or CQ (`res.task`, the restrack owner at
/// `owner_offset` in the object), if the kernel recorded one.
///
/// Async events are raised by whichever task the driver runs in when it notices the error:
/// the application's own system call on some kernels, a kernel worker on others (rxe on
/// 6.12, hardware interrupts), so the current task's cgroup would blame the root cgroup.
/// The object's owner is the job the event is about.
///
/// # Safety
/// `object` is a kernel `struct ib_qp *` or `struct ib_cq *` matching `owner_offset`.
#[inline(always)]
unsafe fn owner_cgroup(object: *const u8, owner_offset: u32) -> Option<u64> {
    // SAFETY: kernel pointers read through fault-safe helpers; a null owner ends the walk.
    unsafe { task_cgroup(read_at::<*const u8>(object, owner_offset).ok()?) }
}

/// The device of a `struct uverbs_attr_bundle *`, through the file's user context
/// (`attrs->context` is only set once the handler has looked up its object).
#[inline(always)]
fn bundle_device(ctx: &ProbeContext) -> u64 {
    let Some(attrs) = ctx.arg::<*const u8>(0) else {
        return 0;
    };
    // SAFETY: the kernel's `struct uverbs_attr_bundle *`; reads are fault-safe.
    unsafe {
        let Ok(ufile) = read_at::<*const u8>(attrs, ATTRS_UFILE_OFFSET.load()) else {
            return 0;
        };
        let Ok(context) = read_at::<*const u8>(ufile, UFILE_UCONTEXT_OFFSET.load()) else {
            return 0;
        };
        match read_at::<*const u8>(context, UCONTEXT_DEVICE_OFFSET.load()) {
            Ok(dev) => device::remember(dev),
            Err(_) => 0,
        }
    }
}

#[kprobe]
pub(crate) fn ib_uverbs_post_send(ctx: ProbeContext) -> u32 {
    count(bundle_device(&ctx), Verb::PostSend, 0);
    0
}

#[kprobe]
pub(crate) fn ib_uverbs_reg_dmabuf_mr(ctx: ProbeContext) -> u32 {
    count(bundle_device(&ctx), Verb::MrRegDmabuf, 1);
    0
}

#[kprobe]
pub(crate) fn ib_uverbs_qp_event_handler(ctx: ProbeContext) -> u32 {
    let Some(event) = ctx.arg::<*const u8>(0) else {
        return 0;
    };
    send_event(Delivery::Wake, |record| {
        record.origin = Origin::QpAsync as u32;
        // SAFETY: the kernel's `struct ib_event *` whose element is a `struct ib_qp *`.
        unsafe {
            record.event_type = ib_event::read_event_type(event)?;
            let qp = ib_event::read_element_ptr(event)?;
            if let Some(cgroup) = owner_cgroup(qp, IB_QP_OWNER_OFFSET.load()) {
                record.cgroup = cgroup;
            }
            let (dev, qp_num) = modify_qp::qp_device_and_num(qp)?;
            record.qp_num = qp_num;
            record.device = device::remember_checked(dev);
            Ok(())
        }
    });
    0
}

#[kprobe]
pub(crate) fn ib_uverbs_cq_event_handler(ctx: ProbeContext) -> u32 {
    let Some(event) = ctx.arg::<*const u8>(0) else {
        return 0;
    };
    send_event(Delivery::Wake, |record| {
        record.origin = Origin::CqAsync as u32;
        // SAFETY: the kernel's `struct ib_event *` whose element is a `struct ib_cq *`.
        unsafe {
            record.event_type = ib_event::read_event_type(event)?;
            let cq = ib_event::read_element_ptr(event)?;
            if let Some(cgroup) = owner_cgroup(cq, IB_CQ_OWNER_OFFSET.load()) {
                record.cgroup = cgroup;
            }
            let dev = read_at::<*const u8>(cq, IB_CQ_DEVICE_OFFSET.load())?;
            record.device = device::remember_checked(dev);
            Ok(())
        }
    });
    0
}
