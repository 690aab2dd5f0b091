//! Creation and destruction of RDMA resources.
//!
//! Creation: a kprobe on ib_core's `rdma_restrack_add(struct rdma_restrack_entry *)`. Every PD,
//! CQ, QP, MR (including dmabuf MRs), SRQ, user context and rdma_cm id is added to the
//! kernel's resource tracker once created, whether userspace made it through the legacy
//! write() path or the ioctl path, and whatever the driver: one exported function where the
//! per-verb handlers differ between paths and versions. The entry is embedded in the
//! resource; the device is reached with a per-type offset from BTF
//! (`offsetof(T, device) - offsetof(T, res)`).
//!
//! Destruction: kprobes on the exported `ib_dealloc_pd_user`, `ib_destroy_cq_user`,
//! `ib_destroy_qp_user`, `ib_dereg_mr_user`, `ib_destroy_srq_user`; user contexts and cm ids,
//! which have none, through `rdma_restrack_del`. rdma_cm calls `rdma_restrack_del` for every
//! id it destroys, also for ids it never added (an id never bound to a device, a listener on
//! a wildcard address): the kernel returns at once for those (`res->valid` is false), and so
//! does the count, so that destroyed ids equal created ones.
//!
//! Both are counted for the job that owns the resource: the entry's `task` (the process that
//! created it, or for the ids of a listener's connections and per-device listens, the
//! listener's process), falling back to the running task for kernel resources, which have
//! none. rdma_cm adds and deletes ids in its work queues too (an id bound when its address
//! resolves, the id of an incoming connection), where the running task is a kernel worker.

use aya_ebpf::{Global, macros::kprobe, programs::ProbeContext};
use monitor_common::verbs::{DETAIL_USER, NO_DEVICE, RESTRACK_TYPES, Verb};

use crate::{
    device, modify_qp,
    shared::{count, count_in, current_cgroup, read_at, task_cgroup},
    uverbs,
};

#[unsafe(no_mangle)]
static RESTRACK_TYPE_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static RESTRACK_USER_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static RESTRACK_VALID_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static RESTRACK_TASK_OFFSET: Global<u32> = Global::new(0);
// Tables by `enum rdma_restrack_type`, set at load time. Plain statics read one element at a
// time (see `element`): `Global::load` of an array copies all of it, 16 loads and stores per
// table on every resource created.
#[unsafe(no_mangle)]
static RESTRACK_ADD_VERB: [u32; RESTRACK_TYPES] = [0; RESTRACK_TYPES];
#[unsafe(no_mangle)]
static RESTRACK_DEL_VERB: [u32; RESTRACK_TYPES] = [0; RESTRACK_TYPES];
#[unsafe(no_mangle)]
static RESTRACK_DEVICE_DELTA: [i32; RESTRACK_TYPES] = [NO_DEVICE; RESTRACK_TYPES];

/// Element `kind` of a load-time table. The read is volatile so that the compiler does not
/// fold in the compiled-in values, which the loader replaces.
#[inline(always)]
fn element<T: Copy>(table: &'static [T; RESTRACK_TYPES], kind: usize) -> Option<T> {
    if kind >= RESTRACK_TYPES {
        return None;
    }
    // SAFETY: in bounds (checked above) of a static that lives for the program's life.
    Some(unsafe { core::ptr::read_volatile(table.as_ptr().add(kind)) })
}

#[kprobe]
pub(crate) fn rdma_restrack_add(ctx: ProbeContext) -> u32 {
    on_restrack(&ctx, &RESTRACK_ADD_VERB, false);
    0
}

#[kprobe]
pub(crate) fn rdma_restrack_del(ctx: ProbeContext) -> u32 {
    on_restrack(&ctx, &RESTRACK_DEL_VERB, true);
    0
}

#[inline(always)]
fn on_restrack(ctx: &ProbeContext, verbs: &'static [u32; RESTRACK_TYPES], only_valid: bool) {
    let Some(entry) = ctx.arg::<*const u8>(0) else {
        return;
    };
    if only_valid {
        // SAFETY: the kernel's `struct rdma_restrack_entry *`; the read is fault-safe.
        let valid = unsafe { read_at::<u8>(entry, RESTRACK_VALID_OFFSET.load()) };
        if valid != Ok(1) {
            return; // never added: rdma_restrack_del returns at once
        }
    }
    let Some((kind, user)) = type_and_user(entry) else {
        return;
    };
    let kind = kind as usize;
    let Some(verb) = element(verbs, kind) else {
        return;
    };
    if verb == Verb::None as u32 {
        return;
    }
    let delta = element(&RESTRACK_DEVICE_DELTA, kind).unwrap_or(NO_DEVICE);
    let device = if delta == NO_DEVICE {
        0
    } else {
        // SAFETY: the entry is embedded in a resource whose `device` lies `delta` bytes away.
        unsafe {
            let at = entry.wrapping_offset(delta as isize);
            match read_at::<*const u8>(at, 0) {
                Ok(dev) => device::remember(dev),
                Err(_) => 0,
            }
        }
    };
    let detail = if user { DETAIL_USER } else { 0 };
    // SAFETY: the entry's `task` is a `struct task_struct *` the entry holds a reference on,
    // or null; reads are fault-safe.
    let owner = unsafe {
        read_at::<*const u8>(entry, RESTRACK_TASK_OFFSET.load())
            .ok()
            .and_then(|task| task_cgroup(task))
    };
    count_in(owner.unwrap_or_else(current_cgroup), device, verb, detail);
}

/// The entry's `type` and `user` fields. They are neighbours on every kernel so far (`enum
/// rdma_restrack_type type; bool user;`): then one read gets both, where two helper calls
/// would be most of the probe's cost.
#[inline(always)]
fn type_and_user(entry: *const u8) -> Option<(u32, bool)> {
    let (type_at, user_at) = (RESTRACK_TYPE_OFFSET.load(), RESTRACK_USER_OFFSET.load());
    // SAFETY: `entry` is the kernel's `struct rdma_restrack_entry *`; reads are fault-safe.
    unsafe {
        if user_at == type_at + 4 {
            let both = read_at::<u64>(entry, type_at).ok()?;
            Some((both as u32, (both >> 32) as u8 != 0))
        } else {
            let kind = read_at::<u32>(entry, type_at).ok()?;
            let user = read_at::<u8>(entry, user_at).unwrap_or(0);
            Some((kind, user != 0))
        }
    }
}

/// The device pointer of a resource object (`struct ib_qp *`, `ib_cq`, `ib_pd`, `ib_mr`,
/// `ib_srq`) at the BTF offset of its `device` field.
#[inline(always)]
fn object_device(object: *const u8, device_offset: u32) -> u64 {
    // SAFETY: `object` is the kernel object the destroy function received.
    match unsafe { read_at::<*const u8>(object, device_offset) } {
        // SAFETY: a `struct ib_device *` read from the object.
        Ok(dev) => unsafe { device::remember(dev) },
        Err(_) => 0,
    }
}

/// Counts a destroy verb: `fn(object, struct ib_udata *udata)`, user when udata is set.
#[inline(always)]
fn on_destroy(ctx: &ProbeContext, verb: Verb, device_offset: &Global<u32>) {
    let (Some(object), Some(udata)) = (ctx.arg::<*const u8>(0), ctx.arg::<u64>(1)) else {
        return;
    };
    let detail = if udata != 0 { DETAIL_USER } else { 0 };
    count(object_device(object, device_offset.load()), verb, detail);
}

#[unsafe(no_mangle)]
static IB_PD_DEVICE_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static IB_MR_DEVICE_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static IB_SRQ_DEVICE_OFFSET: Global<u32> = Global::new(0);

// The exported destroy functions of ib_core, which every user and kernel destroy goes
// through. (The resource tracker's own delete is not a reliable point for these: drivers
// destroy the object first, and newer kernels split the delete in begin/commit steps.)

#[kprobe]
pub(crate) fn ib_dealloc_pd_user(ctx: ProbeContext) -> u32 {
    on_destroy(&ctx, Verb::PdDealloc, &IB_PD_DEVICE_OFFSET);
    0
}

#[kprobe]
pub(crate) fn ib_destroy_cq_user(ctx: ProbeContext) -> u32 {
    on_destroy(&ctx, Verb::CqDestroy, &uverbs::IB_CQ_DEVICE_OFFSET);
    0
}

#[kprobe]
pub(crate) fn ib_destroy_qp_user(ctx: ProbeContext) -> u32 {
    on_destroy(&ctx, Verb::QpDestroy, &modify_qp::IB_QP_DEVICE_OFFSET);
    0
}

#[kprobe]
pub(crate) fn ib_dereg_mr_user(ctx: ProbeContext) -> u32 {
    on_destroy(&ctx, Verb::MrDereg, &IB_MR_DEVICE_OFFSET);
    0
}

#[kprobe]
pub(crate) fn ib_destroy_srq_user(ctx: ProbeContext) -> u32 {
    on_destroy(&ctx, Verb::SrqDestroy, &IB_SRQ_DEVICE_OFFSET);
    0
}
