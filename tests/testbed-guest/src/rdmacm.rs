//! A minimal run-time binding of librdmacm (rdma-core), like [`crate::ibverbs`]: opened with
//! `dlopen` inside the guest. Only what the guest's iWARP program needs: event channels, ids,
//! address and route resolution, listen/connect/accept and the QP helpers.
//!
//! The `#[repr(C)]` types mirror `rdma/rdma_cma.h` (x86-64 ABI), each only up to the last
//! field read or written.

use std::ffi::{c_char, c_int, c_void};
use std::mem::{offset_of, size_of};

use crate::ibverbs::{IbvContext, IbvPd, IbvQp, IbvQpInitAttr, dl_api};

/// `struct rdma_event_channel`.
#[repr(C)]
pub struct RdmaEventChannel {
    pub fd: c_int,
}

/// `struct rdma_cm_id`, up to `qp`.
#[repr(C)]
pub struct RdmaCmId {
    /// The device context librdmacm opened for the id's device (shared by its ids).
    pub verbs: *mut IbvContext,
    pub channel: *mut RdmaEventChannel,
    pub context: *mut c_void,
    /// The QP `rdma_create_qp` made for the id.
    pub qp: *mut IbvQp,
}

/// `struct rdma_conn_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RdmaConnParam {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

impl Default for RdmaConnParam {
    fn default() -> Self {
        Self {
            private_data: std::ptr::null(),
            private_data_len: 0,
            responder_resources: 1,
            initiator_depth: 1,
            flow_control: 0,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: 0,
            qp_num: 0,
        }
    }
}

/// `struct rdma_cm_event`, up to `status` (the union of parameters is not read).
#[repr(C)]
pub struct RdmaCmEvent {
    pub id: *mut RdmaCmId,
    pub listen_id: *mut RdmaCmId,
    /// `enum rdma_cm_event_type`: see [`event`].
    pub event: u32,
    pub status: c_int,
}

const _: () = {
    assert!(offset_of!(RdmaCmId, qp) == 24);
    assert!(size_of::<RdmaConnParam>() == 24);
    assert!(offset_of!(RdmaCmEvent, status) == 20);
};

/// `enum rdma_port_space`: RDMA_PS_TCP (reliable connections).
pub const PS_TCP: u32 = 0x0106;

/// `enum rdma_cm_event_type`.
pub mod event {
    pub const ADDR_RESOLVED: u32 = 0;
    pub const ROUTE_RESOLVED: u32 = 2;
    pub const CONNECT_REQUEST: u32 = 4;
    pub const ESTABLISHED: u32 = 9;
    pub const DISCONNECTED: u32 = 10;
}

dl_api! {
    /// The librdmacm functions the guest's iWARP program calls.
    pub struct RdmaCm from "librdmacm.so.1" {
    rdma_create_event_channel: fn() -> *mut RdmaEventChannel;
    rdma_create_id: fn(
        channel: *mut RdmaEventChannel,
        id: *mut *mut RdmaCmId,
        context: *mut c_void,
        ps: u32
    ) -> c_int;
    rdma_bind_addr: fn(id: *mut RdmaCmId, addr: *mut libc::sockaddr) -> c_int;
    rdma_listen: fn(id: *mut RdmaCmId, backlog: c_int) -> c_int;
    rdma_resolve_addr: fn(
        id: *mut RdmaCmId,
        src: *mut libc::sockaddr,
        dst: *mut libc::sockaddr,
        timeout_ms: c_int
    ) -> c_int;
    rdma_resolve_route: fn(id: *mut RdmaCmId, timeout_ms: c_int) -> c_int;
    rdma_create_qp: fn(id: *mut RdmaCmId, pd: *mut IbvPd, attr: *mut IbvQpInitAttr) -> c_int;
    rdma_connect: fn(id: *mut RdmaCmId, param: *mut RdmaConnParam) -> c_int;
    rdma_accept: fn(id: *mut RdmaCmId, param: *mut RdmaConnParam) -> c_int;
    rdma_get_cm_event: fn(channel: *mut RdmaEventChannel, event: *mut *mut RdmaCmEvent) -> c_int;
    rdma_ack_cm_event: fn(event: *mut RdmaCmEvent) -> c_int;
    rdma_event_str: fn(event: u32) -> *const c_char;
    }
}
