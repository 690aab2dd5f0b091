//! Connection management: the `rdma_cma:cm_event_handler` tracepoint, fired for every event
//! rdma_cm delivers to a consumer (CONNECT_REQUEST, ESTABLISHED, REJECTED, DISCONNECTED, ...).
//! Rejects are also counted by reason (the event's `status`). The tracepoint runs in rdma_cm's
//! work queue, so these counters carry the device-less, kernel-side cgroup.

use aya_ebpf::{Global, macros::tracepoint, programs::TracePointContext};
use monitor_common::verbs::Verb;

use crate::shared::count;

#[unsafe(no_mangle)]
static CM_EVENT_FIELD_OFFSET: Global<u32> = Global::new(16);
#[unsafe(no_mangle)]
static CM_STATUS_FIELD_OFFSET: Global<u32> = Global::new(24);
#[unsafe(no_mangle)]
static CM_EVENT_REJECTED: Global<u32> = Global::new(8);

#[tracepoint]
pub fn cm_event_handler(ctx: TracePointContext) -> u32 {
    // SAFETY: offsets come from this tracepoint's tracefs format.
    let Ok(event) = (unsafe { ctx.read_at::<u64>(CM_EVENT_FIELD_OFFSET.load() as usize) }) else {
        return 0;
    };
    let event = event as u32;
    count(0, Verb::CmEvent, event);
    if event == CM_EVENT_REJECTED.load() {
        // SAFETY: as above.
        let status = unsafe { ctx.read_at::<i32>(CM_STATUS_FIELD_OFFSET.load() as usize) };
        count(0, Verb::CmReject, status.unwrap_or(-1) as u32);
    }
    0
}
