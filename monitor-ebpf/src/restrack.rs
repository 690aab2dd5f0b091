//! Creation and destruction of every RDMA resource: kprobes on ib_core's
//! `rdma_restrack_add(struct rdma_restrack_entry *)` and `rdma_restrack_del(...)`.
//!
//! Every PD, CQ, QP, MR (including dmabuf MRs), SRQ, user context and rdma_cm id is added to
//! the kernel's resource tracker when created and removed when destroyed, whether userspace
//! made it through the legacy write() path or the ioctl path, and whatever the driver. Two
//! exported functions cover them all on every kernel since 5.x, where per-verb handlers differ
//! between paths and versions. The entry is embedded in the resource; the device is reached
//! with a per-type offset from BTF (`offsetof(T, device) - offsetof(T, res)`).

use aya_ebpf::{Global, macros::kprobe, programs::ProbeContext};
use monitor_common::verbs::{DETAIL_USER, NO_DEVICE, RESTRACK_TYPES, Verb};

use crate::{
    device,
    shared::{count_raw, read_at},
};

#[unsafe(no_mangle)]
static RESTRACK_TYPE_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static RESTRACK_USER_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static RESTRACK_ADD_VERB: Global<[u32; RESTRACK_TYPES]> = Global::new([0; RESTRACK_TYPES]);
#[unsafe(no_mangle)]
static RESTRACK_DEL_VERB: Global<[u32; RESTRACK_TYPES]> = Global::new([0; RESTRACK_TYPES]);
#[unsafe(no_mangle)]
static RESTRACK_DEVICE_DELTA: Global<[i32; RESTRACK_TYPES]> =
    Global::new([NO_DEVICE; RESTRACK_TYPES]);

#[kprobe]
pub fn rdma_restrack_add(ctx: ProbeContext) -> u32 {
    on_restrack(&ctx, &RESTRACK_ADD_VERB);
    0
}

#[kprobe]
pub fn rdma_restrack_del(ctx: ProbeContext) -> u32 {
    on_restrack(&ctx, &RESTRACK_DEL_VERB);
    0
}

#[inline(always)]
fn on_restrack(ctx: &ProbeContext, verbs: &Global<[u32; RESTRACK_TYPES]>) {
    let Some(entry) = ctx.arg::<*const u8>(0) else {
        return;
    };
    // SAFETY: `entry` is the kernel's `struct rdma_restrack_entry *`.
    let Ok(kind) = (unsafe { read_at::<u32>(entry, RESTRACK_TYPE_OFFSET.load()) }) else {
        return;
    };
    let kind = kind as usize;
    if kind >= RESTRACK_TYPES {
        return;
    }
    let verb = verbs.load()[kind];
    if verb == Verb::None as u32 {
        return;
    }
    // SAFETY: as above; `user` is a bool.
    let user = unsafe { read_at::<u8>(entry, RESTRACK_USER_OFFSET.load()) }.unwrap_or(0);
    let delta = RESTRACK_DEVICE_DELTA.load()[kind];
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
    let detail = if user != 0 { DETAIL_USER } else { 0 };
    count_raw(device, verb, detail);
}
