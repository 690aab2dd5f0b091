//! railscope's kernel-side probes, compiled for the `bpfel-unknown-none` target by
//! `monitor-user`'s build script and embedded in the `railscope` binary.
//!
//! One module per hook family. Kernel struct layouts are never assumed: every offset a program
//! needs is a load-time global that userspace fills in from the running kernel's BTF (or, for
//! tracepoints, from the event's tracefs `format`).
#![no_std]
#![no_main]

mod device;
mod ib_event;
mod mad;
mod modify_qp;
mod rdma_cm;
mod restrack;
mod shared;
mod uverbs;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// GPL-compatible: `bpf_probe_read_kernel` and the ring buffer helpers are GPL-only.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
