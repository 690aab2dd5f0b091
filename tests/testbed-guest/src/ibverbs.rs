//! A minimal run-time binding of libibverbs (rdma-core), for the guest programs of the test
//! bed: `libibverbs.so.1` is opened with `dlopen` inside the guest, so the host needs neither
//! its headers nor the library to build this crate.
//!
//! The `#[repr(C)]` types mirror rdma-core's `libibverbs/verbs.h` (x86-64 ABI, stable across
//! rdma-core releases): only the structs this crate touches, each complete up to the last
//! field that is read or written, with the sizes and offsets that matter checked at compile
//! time. `ibv_post_send`, `ibv_post_recv` and `ibv_poll_cq` are `static inline` in verbs.h
//! (they call through `ibv_context::ops`), so they are reproduced here as methods of
//! [`Verbs`] that do the same.

use std::{
    ffi::{CStr, c_char, c_int, c_void},
    mem::{offset_of, size_of},
};

use anyhow::{Context as _, bail};

/// `struct ibv_device` is only passed around.
#[repr(C)]
pub struct IbvDevice {
    _opaque: [u8; 0],
}

/// `struct ibv_pd` is only passed around.
#[repr(C)]
pub struct IbvPd {
    _opaque: [u8; 0],
}

/// `union ibv_gid` (16 bytes; its `global` view of two `__be64` makes it 8-aligned).
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub struct IbvGid {
    pub raw: [u8; 16],
}

/// `struct ibv_context_ops`: 32 function pointers, of which only `poll_cq`, `post_send` and
/// `post_recv` are called (the others are kept as opaque slots).
#[repr(C)]
pub struct IbvContextOps {
    /// `_compat_query_device` .. `_compat_create_cq` (incl. `alloc_mw`, `bind_mw`, `dealloc_mw`).
    _before_poll_cq: [usize; 11],
    pub poll_cq: unsafe extern "C" fn(cq: *mut IbvCq, num_entries: c_int, wc: *mut IbvWc) -> c_int,
    _req_notify_cq: usize,
    /// `_compat_cq_event` .. `_compat_destroy_qp` (incl. `post_srq_recv`).
    _before_post_send: [usize; 12],
    pub post_send: unsafe extern "C" fn(
        qp: *mut IbvQp,
        wr: *mut IbvSendWr,
        bad_wr: *mut *mut IbvSendWr,
    ) -> c_int,
    pub post_recv: unsafe extern "C" fn(
        qp: *mut IbvQp,
        wr: *mut IbvRecvWr,
        bad_wr: *mut *mut IbvRecvWr,
    ) -> c_int,
    /// `_compat_create_ah` .. `_compat_async_event`.
    _after_post_recv: [usize; 5],
}

/// `struct ibv_context`.
#[repr(C)]
pub struct IbvContext {
    pub device: *mut IbvDevice,
    pub ops: IbvContextOps,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub abi_compat: *mut c_void,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct IbvMr {
    pub context: *mut IbvContext,
    pub pd: *mut IbvPd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_cq`.
#[repr(C)]
pub struct IbvCq {
    pub context: *mut IbvContext,
    pub channel: *mut c_void,
    pub cq_context: *mut c_void,
    pub handle: u32,
    /// The capacity the provider really gave (rxe rounds the request up to 2^n - 1).
    pub cqe: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

/// `struct ibv_qp`.
#[repr(C)]
pub struct IbvQp {
    pub context: *mut IbvContext,
    pub qp_context: *mut c_void,
    pub pd: *mut IbvPd,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
    pub state: u32,
    pub qp_type: u32,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvQpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub struct IbvQpInitAttr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut c_void,
    pub cap: IbvQpCap,
    /// `enum ibv_qp_type`.
    pub qp_type: u32,
    pub sq_sig_all: c_int,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvGlobalRoute {
    pub dgid: IbvGid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvAhAttr {
    pub grh: IbvGlobalRoute,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvQpAttr {
    /// `enum ibv_qp_state`.
    pub qp_state: u32,
    pub cur_qp_state: u32,
    /// `enum ibv_mtu`.
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub cap: IbvQpCap,
    pub ah_attr: IbvAhAttr,
    pub alt_ah_attr: IbvAhAttr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvSge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_send_wr`. The unions after `send_flags` (immediate data; the RDMA, atomic and
/// UD parts; XRC; bind-MW and TSO) are zeroed slots of their C size: a SEND uses none.
#[repr(C)]
pub struct IbvSendWr {
    pub wr_id: u64,
    pub next: *mut IbvSendWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
    /// `enum ibv_wr_opcode`.
    pub opcode: u32,
    pub send_flags: u32,
    pub imm_data: u32,
    pub wr: [u64; 4],
    pub qp_type: u32,
    pub bind_mw_or_tso: [u64; 6],
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct IbvRecvWr {
    pub wr_id: u64,
    pub next: *mut IbvRecvWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvWc {
    pub wr_id: u64,
    /// `enum ibv_wc_status` (0 = success).
    pub status: u32,
    /// `enum ibv_wc_opcode`.
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `struct ibv_async_event`: `element` is a union of `ibv_cq *`, `ibv_qp *`, `ibv_srq *`,
/// `ibv_wq *` and `int port_num`, told apart by `event_type`.
#[repr(C)]
pub struct IbvAsyncEvent {
    pub element: *mut c_void,
    /// `enum ibv_event_type`: an index into [`EVENT_NAMES`].
    pub event_type: u32,
}

impl Default for IbvAsyncEvent {
    fn default() -> Self {
        Self {
            element: std::ptr::null_mut(),
            event_type: u32::MAX,
        }
    }
}

// The layout of the structs above, as verbs.h gives it on x86-64.
const _: () = {
    assert!(offset_of!(IbvContextOps, poll_cq) == 11 * 8);
    assert!(offset_of!(IbvContextOps, post_send) == 25 * 8);
    assert!(offset_of!(IbvContextOps, post_recv) == 26 * 8);
    assert!(size_of::<IbvContextOps>() == 32 * 8);
    assert!(offset_of!(IbvContext, async_fd) == 268);
    assert!(offset_of!(IbvMr, lkey) == 36);
    assert!(offset_of!(IbvCq, cqe) == 28);
    assert!(offset_of!(IbvQp, qp_num) == 52);
    assert!(size_of::<IbvQpInitAttr>() == 64);
    assert!(size_of::<IbvAhAttr>() == 32);
    assert!(offset_of!(IbvQpAttr, ah_attr) == 56);
    assert!(offset_of!(IbvQpAttr, pkey_index) == 120);
    assert!(offset_of!(IbvQpAttr, rate_limit) == 136);
    assert!(size_of::<IbvQpAttr>() == 144);
    assert!(offset_of!(IbvSendWr, wr) == 40);
    assert!(offset_of!(IbvSendWr, bind_mw_or_tso) == 80);
    assert!(size_of::<IbvSendWr>() == 128);
    assert!(size_of::<IbvRecvWr>() == 32);
    assert!(size_of::<IbvWc>() == 48);
    assert!(size_of::<IbvAsyncEvent>() == 16);
};

/// `enum ibv_qp_type`: IBV_QPT_RC.
pub const QPT_RC: u32 = 2;
/// `enum ibv_qp_state`.
pub const QPS_INIT: u32 = 1;
pub const QPS_RTR: u32 = 2;
pub const QPS_RTS: u32 = 3;
/// `enum ibv_mtu`: IBV_MTU_1024.
pub const MTU_1024: u32 = 3;
/// `enum ibv_access_flags`: IBV_ACCESS_LOCAL_WRITE.
pub const ACCESS_LOCAL_WRITE: c_int = 1;
/// `enum ibv_access_flags`: IBV_ACCESS_REMOTE_WRITE.
pub const ACCESS_REMOTE_WRITE: c_int = 1 << 1;
/// `enum ibv_wr_opcode`: IBV_WR_RDMA_WRITE.
pub const WR_RDMA_WRITE: u32 = 0;
/// `enum ibv_wr_opcode`: IBV_WR_SEND.
pub const WR_SEND: u32 = 2;
/// `enum ibv_send_flags`: IBV_SEND_SIGNALED.
pub const SEND_SIGNALED: u32 = 1 << 1;

/// `enum ibv_qp_attr_mask`.
pub mod qp_attr {
    use std::ffi::c_int;
    pub const STATE: c_int = 1 << 0;
    pub const ACCESS_FLAGS: c_int = 1 << 3;
    pub const PKEY_INDEX: c_int = 1 << 4;
    pub const PORT: c_int = 1 << 5;
    pub const AV: c_int = 1 << 7;
    pub const PATH_MTU: c_int = 1 << 8;
    pub const TIMEOUT: c_int = 1 << 9;
    pub const RETRY_CNT: c_int = 1 << 10;
    pub const RNR_RETRY: c_int = 1 << 11;
    pub const RQ_PSN: c_int = 1 << 12;
    pub const MAX_QP_RD_ATOMIC: c_int = 1 << 13;
    pub const MIN_RNR_TIMER: c_int = 1 << 15;
    pub const SQ_PSN: c_int = 1 << 16;
    pub const MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
    pub const DEST_QPN: c_int = 1 << 20;
}

/// `enum ibv_event_type`, in order; the names are the kernel's `IB_EVENT_*` without the
/// prefix, as the agent prints them.
pub const EVENT_NAMES: [&str; 20] = [
    "CQ_ERR",
    "QP_FATAL",
    "QP_REQ_ERR",
    "QP_ACCESS_ERR",
    "COMM_EST",
    "SQ_DRAINED",
    "PATH_MIG",
    "PATH_MIG_ERR",
    "DEVICE_FATAL",
    "PORT_ACTIVE",
    "PORT_ERR",
    "LID_CHANGE",
    "PKEY_CHANGE",
    "SM_CHANGE",
    "SRQ_ERR",
    "SRQ_LIMIT_REACHED",
    "QP_LAST_WQE_REACHED",
    "CLIENT_REREGISTER",
    "GID_CHANGE",
    "WQ_FATAL",
];

/// The name of async event `code` (`IBV_EVENT_` left off), or `UNKNOWN` past the known ones.
pub fn event_name(code: u32) -> &'static str {
    EVENT_NAMES.get(code as usize).copied().unwrap_or("UNKNOWN")
}

/// The events whose `element` is a `struct ibv_qp *`.
pub fn is_qp_event(event_type: u32) -> bool {
    matches!(event_type, 1..=7 | 16)
}

/// Declares a struct with one field per exported function of a shared library, and its
/// loader (`load`, which `dlopen`s the library and resolves every function with `dlsym`).
macro_rules! dl_api {
    (
        $(#[$meta:meta])*
        pub struct $api:ident from $lib:literal {
            $($name:ident: fn($($arg:ident: $ty:ty),*) $(-> $ret:ty)?;)*
        }
    ) => {
        $(#[$meta])*
        pub struct $api {
            $(pub $name: unsafe extern "C" fn($($arg: $ty),*) $(-> $ret)?,)*
        }

        impl $api {
            #[doc = concat!("Opens `", $lib, "` and resolves every function. The library stays loaded until the process exits.")]
            pub fn load() -> anyhow::Result<Self> {
                let lib = $crate::ibverbs::open($lib)?;
                Ok(Self {
                    $(
                        // SAFETY: the symbol is the library's exported function of that name,
                        // whose C prototype in its header is the field's type.
                        $name: unsafe {
                            $crate::ibverbs::symbol(lib, concat!(stringify!($name), "\0"))?
                        },
                    )*
                })
            }
        }
    };
}
pub(crate) use dl_api;

dl_api! {
    /// The libibverbs functions the guest programs call (the library loads the rxe and siw
    /// providers itself).
    pub struct Verbs from "libibverbs.so.1" {
    ibv_get_device_list: fn(num_devices: *mut c_int) -> *mut *mut IbvDevice;
    ibv_free_device_list: fn(list: *mut *mut IbvDevice);
    ibv_get_device_name: fn(device: *mut IbvDevice) -> *const c_char;
    ibv_open_device: fn(device: *mut IbvDevice) -> *mut IbvContext;
    ibv_close_device: fn(context: *mut IbvContext) -> c_int;
    ibv_query_gid: fn(context: *mut IbvContext, port_num: u8, index: c_int, gid: *mut IbvGid) -> c_int;
    ibv_alloc_pd: fn(context: *mut IbvContext) -> *mut IbvPd;
    ibv_dealloc_pd: fn(pd: *mut IbvPd) -> c_int;
    ibv_reg_mr: fn(pd: *mut IbvPd, addr: *mut c_void, length: usize, access: c_int) -> *mut IbvMr;
    ibv_dereg_mr: fn(mr: *mut IbvMr) -> c_int;
    ibv_create_cq: fn(
        context: *mut IbvContext,
        cqe: c_int,
        cq_context: *mut c_void,
        channel: *mut c_void,
        comp_vector: c_int
    ) -> *mut IbvCq;
    ibv_destroy_cq: fn(cq: *mut IbvCq) -> c_int;
    ibv_create_qp: fn(pd: *mut IbvPd, attr: *mut IbvQpInitAttr) -> *mut IbvQp;
    ibv_modify_qp: fn(qp: *mut IbvQp, attr: *mut IbvQpAttr, attr_mask: c_int) -> c_int;
    ibv_destroy_qp: fn(qp: *mut IbvQp) -> c_int;
    ibv_get_async_event: fn(context: *mut IbvContext, event: *mut IbvAsyncEvent) -> c_int;
    ibv_ack_async_event: fn(event: *mut IbvAsyncEvent);
    }
}

impl Verbs {
    /// verbs.h's inline `ibv_post_send`.
    ///
    /// # Safety
    /// `qp` is a live QP of this library and `wr` a valid chain of work requests whose
    /// buffers lie in registered memory.
    pub unsafe fn post_send(&self, qp: *mut IbvQp, wr: *mut IbvSendWr) -> c_int {
        let mut bad = std::ptr::null_mut();
        // SAFETY: per this function's contract `qp` and its context are live.
        unsafe { ((*(*qp).context).ops.post_send)(qp, wr, &mut bad) }
    }

    /// verbs.h's inline `ibv_post_recv`.
    ///
    /// # Safety
    /// As [`Self::post_send`].
    pub unsafe fn post_recv(&self, qp: *mut IbvQp, wr: *mut IbvRecvWr) -> c_int {
        let mut bad = std::ptr::null_mut();
        // SAFETY: per this function's contract `qp` and its context are live.
        unsafe { ((*(*qp).context).ops.post_recv)(qp, wr, &mut bad) }
    }

    /// verbs.h's inline `ibv_poll_cq`: up to `wc.len()` completions, or a negative value.
    ///
    /// # Safety
    /// `cq` is a live CQ of this library.
    pub unsafe fn poll_cq(&self, cq: *mut IbvCq, wc: &mut [IbvWc]) -> c_int {
        let n = c_int::try_from(wc.len()).unwrap_or(c_int::MAX);
        // SAFETY: per this function's contract `cq` and its context are live; `wc` holds
        // `n` entries.
        unsafe { ((*(*cq).context).ops.poll_cq)(cq, n, wc.as_mut_ptr()) }
    }
}

/// `dlopen`s a shared library for good.
pub(crate) fn open(name: &str) -> anyhow::Result<*mut c_void> {
    let c_name = std::ffi::CString::new(name).expect("no NUL in library names");
    // SAFETY: a valid NUL-terminated name; the handle is never closed.
    let lib = unsafe { libc::dlopen(c_name.as_ptr(), libc::RTLD_NOW) };
    if lib.is_null() {
        bail!("dlopen {name}: {}", dl_error());
    }
    Ok(lib)
}

/// The function `name` (NUL-terminated) of `lib`, as the function-pointer type `F`.
///
/// # Safety
/// `F` must be the function's true type.
pub(crate) unsafe fn symbol<F: Copy>(lib: *mut c_void, name: &str) -> anyhow::Result<F> {
    assert_eq!(size_of::<F>(), size_of::<*mut c_void>());
    let c_name = CStr::from_bytes_with_nul(name.as_bytes()).expect("NUL-terminated");
    // SAFETY: `lib` is a live dlopen handle and `c_name` a valid C string.
    let ptr = unsafe { libc::dlsym(lib, c_name.as_ptr()) };
    if ptr.is_null() {
        return Err(anyhow::anyhow!(dl_error()))
            .with_context(|| format!("dlsym {}", name.trim_end_matches('\0')));
    }
    // SAFETY: `F` is a function pointer of the symbol's type (the caller's contract), the
    // same size as the data pointer dlsym returns.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&ptr) })
}

/// `dlerror()` as a string.
fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a valid C string owned by libc.
    let msg = unsafe { libc::dlerror() };
    if msg.is_null() {
        return "unknown error".into();
    }
    // SAFETY: non-NULL, NUL-terminated (above).
    unsafe { CStr::from_ptr(msg) }
        .to_string_lossy()
        .into_owned()
}

/// `Err` with the OS error when a constructor of libibverbs or librdmacm returned NULL.
pub fn nonnull<T>(ptr: *mut T, what: &str) -> anyhow::Result<*mut T> {
    if ptr.is_null() {
        bail!("{what} failed: {}", std::io::Error::last_os_error());
    }
    Ok(ptr)
}

/// `Err` when a libibverbs or librdmacm call returned non-zero (an errno value, or -1 with
/// errno set).
pub fn check(rc: std::ffi::c_int, what: &str) -> anyhow::Result<()> {
    match rc {
        0 => Ok(()),
        -1 => bail!("{what} failed: {}", std::io::Error::last_os_error()),
        e => bail!(
            "{what} failed: {}",
            std::io::Error::from_raw_os_error(e.abs())
        ),
    }
}

/// CLOCK_MONOTONIC in nanoseconds: the clock the kernel stamps the agent's events with, so a
/// program can tell an event was raised before it read it.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
