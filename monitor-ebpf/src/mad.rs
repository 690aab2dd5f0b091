//! Management datagrams (SM/SA traffic): `ib_mad:ib_mad_send_done_handler` for sends that
//! completed with an error status, `ib_mad:ib_mad_send_done_resend` for retries after a
//! timeout. Both run in completion context: device-less, kernel-side cgroup.

use aya_ebpf::{Global, macros::tracepoint, programs::TracePointContext};
use monitor_common::verbs::Verb;

use crate::shared::count;

#[unsafe(no_mangle)]
static MAD_WC_STATUS_FIELD_OFFSET: Global<u32> = Global::new(26);

#[tracepoint]
pub(crate) fn ib_mad_send_done_handler(ctx: TracePointContext) -> u32 {
    // SAFETY: the offset comes from this tracepoint's tracefs format.
    if let Ok(status) = unsafe { ctx.read_at::<u16>(MAD_WC_STATUS_FIELD_OFFSET.load() as usize) }
        && status != 0
    {
        count(0, Verb::MadSendError, u32::from(status));
    }
    0
}

#[tracepoint]
pub(crate) fn ib_mad_send_done_resend(_ctx: TracePointContext) -> u32 {
    count(0, Verb::MadRetry, 0);
    0
}
