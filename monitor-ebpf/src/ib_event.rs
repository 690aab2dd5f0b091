//! Port and device events: a kprobe on `ib_dispatch_event(const struct ib_event *)`.
//!
//! `ib_dispatch_event` is exported by ib_core and has no tracepoint; every driver (mlx5_ib,
//! rxe, ...) calls it for PORT_ACTIVE, PORT_ERR, DEVICE_FATAL, LID/PKEY/GID changes. The record
//! goes to a ring buffer so each event keeps its own timestamp: a flapping link is a sequence,
//! not a last value.

use aya_ebpf::{
    Global,
    helpers::{bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_kernel_str_bytes},
    macros::{kprobe, map},
    maps::RingBuf,
    programs::ProbeContext,
};
use monitor_common::{
    ProbeStat,
    ib_event::{DEVICE_NAME_LEN, IbEventRecord, NameSource},
};

use crate::stats::bump;

#[unsafe(no_mangle)]
static IB_EVENT_DEVICE_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static IB_EVENT_PORT_OFFSET: Global<u32> = Global::new(8);
#[unsafe(no_mangle)]
static IB_EVENT_PORT_SIZE: Global<u32> = Global::new(4);
#[unsafe(no_mangle)]
static IB_EVENT_TYPE_OFFSET: Global<u32> = Global::new(16);
#[unsafe(no_mangle)]
static IB_DEVICE_NAME_SOURCE: Global<u32> = Global::new(NameSource::InlineArray as u32);
#[unsafe(no_mangle)]
static IB_DEVICE_NAME_OFFSET: Global<u32> = Global::new(0);

/// 256 KiB holds about 2,900 records: far more than a burst of port flaps between two reads.
#[map]
static IB_EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

#[kprobe]
pub fn ib_dispatch_event(ctx: ProbeContext) -> u32 {
    let Some(event) = ctx.arg::<*const u8>(0) else {
        return 0;
    };
    let Some(mut entry) = IB_EVENTS.reserve::<IbEventRecord>(0) else {
        bump(ProbeStat::IbEventsDropped);
        return 0;
    };
    let mut record = IbEventRecord {
        // SAFETY: a helper call with no arguments.
        timestamp_ns: unsafe { bpf_ktime_get_ns() },
        event_type: u32::MAX,
        port: 0,
        read_error: 0,
        _pad: 0,
        device_name: [0; DEVICE_NAME_LEN],
    };
    // SAFETY: `event` is the kernel's `struct ib_event *`; every read goes through
    // bpf_probe_read_kernel, which faults safely on a bad address.
    if unsafe { fill(event, &mut record) }.is_err() {
        record.read_error = 1;
        bump(ProbeStat::IbEventReadErrors);
    }
    entry.write(record);
    entry.submit(0);
    0
}

unsafe fn fill(event: *const u8, record: &mut IbEventRecord) -> Result<(), i32> {
    unsafe {
        let type_at = event.add(IB_EVENT_TYPE_OFFSET.load() as usize);
        record.event_type = bpf_probe_read_kernel(type_at.cast::<u32>())?;

        let port_at = event.add(IB_EVENT_PORT_OFFSET.load() as usize);
        record.port = if IB_EVENT_PORT_SIZE.load() == 1 {
            u32::from(bpf_probe_read_kernel(port_at)?)
        } else {
            bpf_probe_read_kernel(port_at.cast::<u32>())?
        };

        let device_at = event.add(IB_EVENT_DEVICE_OFFSET.load() as usize);
        let device: *const u8 = bpf_probe_read_kernel(device_at.cast::<*const u8>())?;
        let name_at = device.add(IB_DEVICE_NAME_OFFSET.load() as usize);
        let name = if IB_DEVICE_NAME_SOURCE.load() == NameSource::Pointer as u32 {
            bpf_probe_read_kernel(name_at.cast::<*const u8>())?
        } else {
            name_at
        };
        bpf_probe_read_kernel_str_bytes(name, &mut record.device_name)?;
    }
    Ok(())
}
