//! Connection management: the `rdma_cma:cm_event_handler` tracepoint, as a raw tracepoint
//! (its arguments are the `struct rdma_id_private *` and the `struct rdma_cm_event *`), counted
//! once for every event rdma_cm delivers to a consumer (CONNECT_REQUEST, ESTABLISHED,
//! REJECTED, DISCONNECTED, ...). Rejects are also counted by reason (the event's `status`).
//!
//! rdma_cm fires the tracepoint in `cma_cm_event_handler` before it calls an id's handler. A
//! listener on a wildcard address listens through one internal id per device, whose handler
//! is rdma_cm's own `cma_listen_handler`: a connection request reaches the new connection's id
//! with that handler, which hands the id over to the listener's consumer and fires the
//! tracepoint again, for the listener, before calling the consumer. The first firing (the
//! handler is `cma_listen_handler`) is not a delivery and is not counted; nor is a
//! DEVICE_REMOVAL to an internal id, which `cma_listen_handler` consumes itself.
//!
//! The tracepoint runs in rdma_cm's work queue, so these counters carry the device-less,
//! kernel-side cgroup.

use aya_ebpf::{Global, macros::raw_tracepoint, programs::RawTracePointContext};
use monitor_common::verbs::Verb;

use crate::shared::{count, read_at};

/// `offsetof(struct rdma_id_private, id.event_handler)`.
#[unsafe(no_mangle)]
static CM_ID_HANDLER_OFFSET: Global<u32> = Global::new(0);
/// The address of rdma_cm's `cma_listen_handler`, from kallsyms.
#[unsafe(no_mangle)]
static CM_LISTEN_HANDLER: Global<u64> = Global::new(0);
/// `struct rdma_cm_event`: offsets of `event` and `status`.
#[unsafe(no_mangle)]
static CM_EVENT_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static CM_STATUS_OFFSET: Global<u32> = Global::new(4);
#[unsafe(no_mangle)]
static CM_EVENT_REJECTED: Global<u32> = Global::new(8);

#[raw_tracepoint(tracepoint = "cm_event_handler")]
pub(crate) fn cm_event_handler(ctx: RawTracePointContext) -> i32 {
    let id_priv: *const u8 = ctx.arg(0);
    let event: *const u8 = ctx.arg(1);
    // SAFETY: the tracepoint's arguments are kernel pointers; reads are fault-safe.
    unsafe {
        let Ok(handler) = read_at::<u64>(id_priv, CM_ID_HANDLER_OFFSET.load()) else {
            return 0;
        };
        if handler == CM_LISTEN_HANDLER.load() {
            return 0;
        }
        let Ok(kind) = read_at::<u32>(event, CM_EVENT_OFFSET.load()) else {
            return 0;
        };
        count(0, Verb::CmEvent, kind);
        if kind == CM_EVENT_REJECTED.load() {
            let status = read_at::<i32>(event, CM_STATUS_OFFSET.load());
            count(0, Verb::CmReject, status.unwrap_or(-1) as u32);
        }
    }
    0
}
