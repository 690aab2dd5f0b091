//! `iwarp-errors`: a verbs program over siw (soft iWARP) that provokes real QP async errors,
//! so the `siw-async-errors` scenario can hold the agent's `qp_async` events to what the
//! kernel delivered.
//!
//! iWARP QPs are connected through rdma_cm (iw_cm runs MPA over a kernel TCP socket), so it
//! drives librdmacm and libibverbs (both loaded at run time, see [`crate::rdmacm`] and
//! [`crate::ibverbs`]). It runs as two processes of one job:
//! - `target ADDR PORT INFO_FILE` listens on ADDR:PORT, registers a 4 MiB buffer for remote
//!   writes, writes its address, length and rkey to INFO_FILE and accepts every connection;
//! - `writer ADDR PORT INFO_FILE STREAMING_FILE` connects three times:
//!   1. it posts one RDMA WRITE into the target's buffer with a wrong rkey (its key byte
//!      changed): siw terminates the connection (an invalid STag) and raises no async event;
//!   2. it posts one RDMA WRITE with the target's rkey just past the end of its buffer: the
//!      target's siw finds the access out of bounds (`siw_check_mem`), raises
//!      `IB_EVENT_QP_ACCESS_ERR` on its QP and terminates the connection;
//!   3. it streams RDMA WRITEs into the buffer and, once they flow, creates STREAMING_FILE,
//!      the sign for the scenario to kill the target: the writer's QP then fails mid-transfer.
//!
//! Each process reads the async events of its device context with `ibv_get_async_event` and
//! prints every one at once as `iwarp-errors-event {json}` (role, event name, QP number): the
//! target is killed, so it cannot print them at its end. The QPs are printed as
//! `iwarp-errors-qp {json}`, the writer's outcome as `iwarp-errors-result {json}`. The kernel
//! frees everything when a process exits.

use std::{
    cell::Cell,
    ffi::{CStr, c_int},
    net::Ipv4Addr,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};
use serde_json::{Value, json};

use crate::ibverbs::{
    self as ibv, IbvAsyncEvent, IbvContext, IbvCq, IbvQp, Verbs, check, monotonic_ns, nonnull,
};
use crate::rdmacm::{self as cm, RdmaCm, RdmaCmId, RdmaEventChannel};

/// The guest-init subcommand that runs this program.
pub const COMMAND: &str = "iwarp-errors";
/// Prefix of the line printed for every async event read.
pub const EVENT_PREFIX: &str = "iwarp-errors-event ";
/// Prefix of the line printed for every QP created.
pub const QP_PREFIX: &str = "iwarp-errors-qp ";
/// Prefix of the writer's result line.
pub const RESULT_PREFIX: &str = "iwarp-errors-result ";

/// The target's buffer for remote writes.
const TARGET_LEN: usize = 4 << 20;
/// Bytes per streamed RDMA WRITE: large, so that siw's transmit path is most likely in the
/// middle of one (many DDP segments) when the connection drops, which is when it raises
/// QP_FATAL; a write still queued is flushed with SQ_DRAINED instead.
const CHUNK: usize = 1 << 20;
/// Streamed writes kept in flight.
const IN_FLIGHT: u32 = 8;
/// Streamed writes completed before the writer says it is streaming: one, so data flows and
/// [`IN_FLIGHT`] more are queued behind it. Under TCG siw's stream has stalled after two
/// completed writes until the target was killed (CI, 6.1, 2026-11-28: 16 were asked for, the
/// scenario waited 30 s for them); a stalled stream still has its writes in flight, which is
/// all the kill needs.
const STREAMING_AFTER: u64 = 1;
/// How long a phase keeps reading events after its last one.
const QUIET: Duration = Duration::from_secs(2);
/// A phase (or the target's whole run) that has not finished by then gives up.
const DEADLINE: Duration = Duration::from_secs(30);
/// rdma_cm's address and route resolution timeout.
const RESOLVE_MS: c_int = 2000;

/// Runs the program with its arguments (after the subcommand's name).
pub fn main(args: &[String]) -> anyhow::Result<()> {
    let usage = "usage: iwarp-errors target ADDR PORT INFO_FILE | \
                 iwarp-errors writer ADDR PORT INFO_FILE STREAMING_FILE";
    let addr = |a: &String| a.parse::<Ipv4Addr>().context(usage);
    let port = |p: &String| p.parse::<u16>().context(usage);
    let api = Api::load()?;
    match args {
        [role, a, p, info] if role == "target" => target(&api, addr(a)?, port(p)?, info),
        [role, a, p, info, streaming] if role == "writer" => {
            writer(&api, addr(a)?, port(p)?, info, streaming)
        }
        _ => bail!("{usage}"),
    }
}

/// Both libraries.
struct Api {
    v: Verbs,
    cm: RdmaCm,
}

impl Api {
    fn load() -> anyhow::Result<Self> {
        Ok(Self {
            v: Verbs::load()?,
            cm: RdmaCm::load()?,
        })
    }
}

fn sockaddr(addr: Ipv4Addr, port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(addr).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// Which of `fds` are readable, waiting up to `timeout_ms`.
fn readable<const N: usize>(fds: [c_int; N], timeout_ms: c_int) -> [bool; N] {
    let mut pfds = fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    // SAFETY: N valid pollfds.
    let n = unsafe { libc::poll(pfds.as_mut_ptr(), N as libc::nfds_t, timeout_ms) };
    pfds.map(|p| n > 0 && p.revents & libc::POLLIN != 0)
}

/// One rdma_cm event: its type, status and id, acknowledged.
///
/// # Safety
/// `ch` is a live event channel.
unsafe fn cm_event(
    api: &Api,
    ch: *mut RdmaEventChannel,
) -> anyhow::Result<(u32, c_int, *mut RdmaCmId)> {
    let mut ev = std::ptr::null_mut();
    // SAFETY: `ch` is live; `ev` receives an event we acknowledge below.
    unsafe {
        check((api.cm.rdma_get_cm_event)(ch, &mut ev), "rdma_get_cm_event")?;
        let got = ((*ev).event, (*ev).status, (*ev).id);
        let name = CStr::from_ptr((api.cm.rdma_event_str)(got.0)).to_string_lossy();
        println!("rdma_cm event {name} (status {})", got.1);
        check((api.cm.rdma_ack_cm_event)(ev), "rdma_ack_cm_event")?;
        Ok(got)
    }
}

/// Waits for the rdma_cm event `expected` on `ch`; any other one is an error.
///
/// # Safety
/// `ch` is a live event channel.
unsafe fn expect_cm_event(
    api: &Api,
    ch: *mut RdmaEventChannel,
    expected: u32,
) -> anyhow::Result<*mut RdmaCmId> {
    // SAFETY: `ch` is live.
    let fd = unsafe { (*ch).fd };
    let [ready] = readable([fd], 10_000);
    ensure!(
        ready,
        "no rdma_cm event within 10 s (waiting for {expected})"
    );
    // SAFETY: `ch` is live.
    let (event, status, id) = unsafe { cm_event(api, ch)? };
    // SAFETY: rdma_event_str returns a static string for any value.
    let name = |e| unsafe { CStr::from_ptr((api.cm.rdma_event_str)(e)) }.to_string_lossy();
    ensure!(
        event == expected && status == 0,
        "rdma_cm event {} (status {status}) where {} was expected",
        name(event),
        name(expected)
    );
    Ok(id)
}

/// The next async event of `ctx` if one is ready, acknowledged at once and printed.
///
/// # Safety
/// `ctx` is a live context.
unsafe fn async_event(
    api: &Api,
    ctx: *mut IbvContext,
    role: &str,
) -> anyhow::Result<Option<Value>> {
    // SAFETY: `ctx` is live.
    let [ready] = readable([unsafe { (*ctx).async_fd }], 0);
    if !ready {
        return Ok(None);
    }
    let mut event = IbvAsyncEvent::default();
    // SAFETY: `ctx` is live; the fd is readable, so this does not block.
    check(
        unsafe { (api.v.ibv_get_async_event)(ctx, &mut event) },
        "ibv_get_async_event",
    )?;
    let code = event.event_type;
    let name = ibv::event_name(code);
    let mut value =
        json!({ "role": role, "event": name, "code": code, "ktime_ns": monotonic_ns() });
    if ibv::is_qp_event(code) {
        // SAFETY: for QP events `element` is the `struct ibv_qp *` the event is about.
        value["qp_num"] = unsafe { (*event.element.cast::<IbvQp>()).qp_num }.into();
    }
    // SAFETY: an event returned by ibv_get_async_event, acknowledged once.
    unsafe { (api.v.ibv_ack_async_event)(&mut event) };
    println!("{EVENT_PREFIX}{value}");
    Ok(Some(value))
}

/// An RC QP for `id` with one SGE per work request, both queues on `cq`.
///
/// # Safety
/// `id` is a live, bound id and `pd` and `cq` belong to its device context.
unsafe fn create_qp(
    api: &Api,
    id: *mut RdmaCmId,
    pd: *mut ibv::IbvPd,
    cq: *mut IbvCq,
    max_send_wr: u32,
) -> anyhow::Result<*mut IbvQp> {
    let mut attr = ibv::IbvQpInitAttr {
        qp_context: std::ptr::null_mut(),
        send_cq: cq,
        recv_cq: cq,
        srq: std::ptr::null_mut(),
        cap: ibv::IbvQpCap {
            max_send_wr,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: ibv::QPT_RC,
        sq_sig_all: 0,
    };
    // SAFETY: per this function's contract; `attr` is a valid ibv_qp_init_attr.
    unsafe {
        check((api.cm.rdma_create_qp)(id, pd, &mut attr), "rdma_create_qp")?;
        nonnull((*id).qp, "rdma_create_qp (no QP)")
    }
}

/// The name of the device of `ctx`.
///
/// # Safety
/// `ctx` is a live context.
unsafe fn device_name(api: &Api, ctx: *mut IbvContext) -> String {
    // SAFETY: a live context has a device with a NUL-terminated name.
    unsafe { CStr::from_ptr((api.v.ibv_get_device_name)((*ctx).device)) }
        .to_string_lossy()
        .into_owned()
}

/// The passive side: listens, accepts every connection and prints every async event until it
/// is killed (or [`DEADLINE`] twice over passed).
fn target(api: &Api, addr: Ipv4Addr, port: u16, info_file: &str) -> anyhow::Result<()> {
    // SAFETY (for the whole block): every pointer passed to the libraries is one they returned
    // (checked non-NULL) or points to a live local value of the type the C headers declare;
    // the registered buffer lives until the process exits.
    unsafe {
        let ch = nonnull(
            (api.cm.rdma_create_event_channel)(),
            "rdma_create_event_channel",
        )?;
        let mut listen = std::ptr::null_mut();
        check(
            (api.cm.rdma_create_id)(ch, &mut listen, std::ptr::null_mut(), cm::PS_TCP),
            "rdma_create_id",
        )?;
        let mut sa = sockaddr(addr, port);
        check(
            (api.cm.rdma_bind_addr)(listen, (&raw mut sa).cast()),
            &format!("rdma_bind_addr {addr}:{port}"),
        )?;
        check((api.cm.rdma_listen)(listen, 4), "rdma_listen")?;
        let ctx = nonnull(
            (*listen).verbs,
            &format!("{addr} is on no RDMA device: binding"),
        )?;
        let pd = nonnull((api.v.ibv_alloc_pd)(ctx), "ibv_alloc_pd")?;
        let buf: &'static mut [u8] = Box::leak(vec![0u8; TARGET_LEN].into_boxed_slice());
        let mr = nonnull(
            (api.v.ibv_reg_mr)(
                pd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                ibv::ACCESS_LOCAL_WRITE | ibv::ACCESS_REMOTE_WRITE,
            ),
            "ibv_reg_mr",
        )?;
        let cq = nonnull(
            (api.v.ibv_create_cq)(ctx, 16, std::ptr::null_mut(), std::ptr::null_mut(), 0),
            "ibv_create_cq",
        )?;
        let info = json!({
            "device": device_name(api, ctx),
            "addr": (*mr).addr as u64,
            "len": (*mr).length,
            "rkey": (*mr).rkey,
        });
        let partial = format!("{info_file}.partial");
        std::fs::write(&partial, info.to_string())
            .and_then(|()| std::fs::rename(&partial, info_file))
            .with_context(|| format!("writing {info_file}"))?;
        println!("target listening on {addr}:{port}: {info}");

        let started = Instant::now();
        let mut connections = 0;
        while started.elapsed() < 2 * DEADLINE {
            let [cm_ready, _] = readable([(*ch).fd, (*ctx).async_fd], 200);
            if cm_ready {
                let (event, _, id) = cm_event(api, ch)?;
                if event == cm::event::CONNECT_REQUEST {
                    connections += 1;
                    let qp = create_qp(api, id, pd, cq, 1)?;
                    println!(
                        "{QP_PREFIX}{}",
                        json!({ "role": "target", "connection": connections, "qp_num": (*qp).qp_num })
                    );
                    let mut param = cm::RdmaConnParam::default();
                    check((api.cm.rdma_accept)(id, &mut param), "rdma_accept")?;
                }
            }
            while async_event(api, ctx, "target")?.is_some() {}
        }
        bail!("the target was not killed within {:?}", 2 * DEADLINE)
    }
}

/// The writer's view of one connection.
struct Connection {
    id: *mut RdmaCmId,
    qp: *mut IbvQp,
    cq: *mut IbvCq,
}

/// The active side: the out-of-bounds write, then the stream the target dies in.
fn writer(
    api: &Api,
    addr: Ipv4Addr,
    port: u16,
    info_file: &str,
    streaming_file: &str,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let info: Value = loop {
        if let Ok(text) = std::fs::read_to_string(info_file) {
            break text.parse().context("the target's info file")?;
        }
        ensure!(
            started.elapsed() < Duration::from_secs(10),
            "the target wrote no {info_file} within 10 s"
        );
        thread::sleep(Duration::from_millis(50));
    };
    let remote = |k: &str| {
        info[k]
            .as_u64()
            .with_context(|| format!("no {k} in {info}"))
    };
    let (remote_addr, remote_len, rkey) = (remote("addr")?, remote("len")?, remote("rkey")? as u32);

    // SAFETY (for the whole block): as in `target`; `local` lives until the process exits.
    unsafe {
        let ch = nonnull(
            (api.cm.rdma_create_event_channel)(),
            "rdma_create_event_channel",
        )?;
        let dst = Cell::new(sockaddr(addr, port));
        // The device context (shared by librdmacm's ids of one device), PD and local MR, set
        // up at the first connection.
        let device: Cell<Option<(*mut IbvContext, *mut ibv::IbvPd, *mut ibv::IbvMr)>> =
            Cell::new(None);
        let local = Box::leak(vec![0u8; CHUNK].into_boxed_slice()).as_mut_ptr();
        let connect = |n: u32| -> anyhow::Result<Connection> {
            let mut id = std::ptr::null_mut();
            check(
                (api.cm.rdma_create_id)(ch, &mut id, std::ptr::null_mut(), cm::PS_TCP),
                "rdma_create_id",
            )?;
            check(
                (api.cm.rdma_resolve_addr)(
                    id,
                    std::ptr::null_mut(),
                    dst.as_ptr().cast(),
                    RESOLVE_MS,
                ),
                "rdma_resolve_addr",
            )?;
            expect_cm_event(api, ch, cm::event::ADDR_RESOLVED)?;
            check(
                (api.cm.rdma_resolve_route)(id, RESOLVE_MS),
                "rdma_resolve_route",
            )?;
            expect_cm_event(api, ch, cm::event::ROUTE_RESOLVED)?;
            let ctx = nonnull((*id).verbs, "the resolved id's device context")?;
            let (_, pd, _) = match device.get() {
                Some(d) => d,
                None => {
                    let pd = nonnull((api.v.ibv_alloc_pd)(ctx), "ibv_alloc_pd")?;
                    let mr = nonnull(
                        (api.v.ibv_reg_mr)(pd, local.cast(), CHUNK, ibv::ACCESS_LOCAL_WRITE),
                        "ibv_reg_mr",
                    )?;
                    device.set(Some((ctx, pd, mr)));
                    (ctx, pd, mr)
                }
            };
            let cq = nonnull(
                (api.v.ibv_create_cq)(
                    ctx,
                    2 * IN_FLIGHT as c_int,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    0,
                ),
                "ibv_create_cq",
            )?;
            let qp = create_qp(api, id, pd, cq, IN_FLIGHT)?;
            let mut param = cm::RdmaConnParam::default();
            check((api.cm.rdma_connect)(id, &mut param), "rdma_connect")?;
            expect_cm_event(api, ch, cm::event::ESTABLISHED)?;
            println!(
                "{QP_PREFIX}{}",
                json!({ "role": "writer", "connection": n, "qp_num": (*qp).qp_num, "device": device_name(api, ctx) })
            );
            Ok(Connection { id, qp, cq })
        };
        let post_write = |qp: *mut IbvQp, lkey: u32, wr_id: u64, to: u64, key: u32, len: usize| {
            let mut sge = ibv::IbvSge {
                addr: local as u64,
                length: len as u32,
                lkey,
            };
            let mut wr = ibv::IbvSendWr {
                wr_id,
                next: std::ptr::null_mut(),
                sg_list: &mut sge,
                num_sge: 1,
                opcode: ibv::WR_RDMA_WRITE,
                send_flags: ibv::SEND_SIGNALED,
                imm_data: 0,
                // The `rdma` member of the union: remote_addr, then rkey.
                wr: [to, u64::from(key), 0, 0],
                qp_type: 0,
                bind_mw_or_tso: [0; 6],
            };
            check(api.v.post_send(qp, &mut wr), "ibv_post_send (RDMA WRITE)")
        };

        // 1. and 2.: one bad write each, on a connection of its own.
        let mut events = Vec::new();
        let mut wc = [ibv::IbvWc::default(); 16];
        let mut single_write = |n: u32, what: &str, to: u64, key: u32| -> anyhow::Result<Value> {
            let conn = connect(n)?;
            let (ctx, _, mr) = device.get().expect("set by connect");
            post_write(conn.qp, (*mr).lkey, u64::from(n), to, key, 4096)?;
            println!("posted an RDMA WRITE of 4096 bytes to {to:#x}, rkey {key:#x}: {what}");
            let mut statuses = Vec::new();
            let phase = Instant::now();
            let mut last = Instant::now();
            while phase.elapsed() < DEADLINE && (statuses.is_empty() || last.elapsed() < QUIET) {
                let got = api.v.poll_cq(conn.cq, &mut wc);
                ensure!(got >= 0, "ibv_poll_cq failed: {got}");
                for c in &wc[..got as usize] {
                    println!("{what}: the write completed with status {}", c.status);
                    statuses.push(c.status);
                    last = Instant::now();
                }
                let [cm_ready, _] = readable([(*ch).fd, (*ctx).async_fd], 100);
                if cm_ready {
                    cm_event(api, ch)?;
                }
                while let Some(e) = async_event(api, ctx, "writer")? {
                    events.push(e);
                    last = Instant::now();
                }
            }
            Ok(json!({ "qp_num": (*conn.qp).qp_num, "statuses": statuses }))
        };
        // 1. The right address with a wrong key (the STag's index kept, its key byte changed).
        let wrong_rkey = single_write(1, "wrong rkey", remote_addr, rkey ^ 0xff)?;
        // 2. The right key just past the end of the target's buffer.
        let out_of_bounds = single_write(2, "out of bounds", remote_addr + remote_len, rkey)?;
        let (ctx, _, mr) = device.get().expect("set by connect");
        let lkey = (*mr).lkey;

        // 3. A stream of writes; the target is killed during it.
        let second = connect(3)?;
        let slots = (remote_len as usize / CHUNK).max(1) as u64;
        let mut posted = 0u64;
        let mut completed = 0u64;
        let mut stream_errors = Vec::new();
        let mut streaming = false;
        while posted < u64::from(IN_FLIGHT) {
            post_write(
                second.qp,
                lkey,
                posted,
                remote_addr + (posted % slots) * CHUNK as u64,
                rkey,
                CHUNK,
            )?;
            posted += 1;
        }
        let phase = Instant::now();
        let mut failed_at: Option<Instant> = None;
        let mut post_errors = 0u32;
        loop {
            let n = api.v.poll_cq(second.cq, &mut wc);
            ensure!(n >= 0, "ibv_poll_cq failed: {n}");
            for c in &wc[..n as usize] {
                if c.status == 0 {
                    completed += 1;
                } else {
                    stream_errors.push(c.status);
                    failed_at.get_or_insert_with(Instant::now);
                }
            }
            while failed_at.is_none() && posted - completed < u64::from(IN_FLIGHT) {
                let to = remote_addr + (posted % slots) * CHUNK as u64;
                match post_write(second.qp, lkey, posted, to, rkey, CHUNK) {
                    Ok(()) => posted += 1,
                    Err(e) => {
                        // The connection is gone (siw refuses posts on a QP in ERROR).
                        println!("stream: {e:#}");
                        post_errors += 1;
                        failed_at.get_or_insert_with(Instant::now);
                    }
                }
            }
            if !streaming && completed >= STREAMING_AFTER {
                std::fs::write(streaming_file, completed.to_string())
                    .with_context(|| format!("writing {streaming_file}"))?;
                println!("streaming: {completed} writes of {CHUNK} bytes completed");
                streaming = true;
            }
            let [cm_ready, _] = readable([(*ch).fd, (*ctx).async_fd], 5);
            if cm_ready {
                let (event, _, id) = cm_event(api, ch)?;
                if event == cm::event::DISCONNECTED && id == second.id {
                    failed_at.get_or_insert_with(Instant::now);
                }
            }
            while let Some(e) = async_event(api, ctx, "writer")? {
                if e["qp_num"] == (*second.qp).qp_num {
                    failed_at.get_or_insert_with(Instant::now);
                }
                events.push(e);
            }
            if failed_at.is_some_and(|t| t.elapsed() >= QUIET) {
                break;
            }
            ensure!(
                phase.elapsed() < DEADLINE,
                "the stream did not fail within {DEADLINE:?} ({completed} writes completed)"
            );
        }
        let result = json!({
            "device": device_name(api, ctx),
            "wrong_rkey": wrong_rkey,
            "out_of_bounds": out_of_bounds,
            "stream": {
                "qp_num": (*second.qp).qp_num,
                "completed": completed,
                "error_statuses": stream_errors.len(),
                "first_error_status": stream_errors.first(),
                "post_errors": post_errors,
            },
            "events": events,
        });
        println!("{RESULT_PREFIX}{result}");
    }
    Ok(())
}
