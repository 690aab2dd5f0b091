//! `cq-overflow`: a verbs program that overflows a completion queue on purpose, so that the
//! kernel raises `IB_EVENT_CQ_ERR` on a real user CQ (the `async-errors` scenario runs it).
//!
//! It opens a device through libibverbs (loaded at run time, see [`crate::ibverbs`]) and
//! creates one PD, one MR, a tiny CQ and a roomy one, and two RC QPs on the same device
//! connected to each other through the device's own RoCE v2 GID (loopback):
//! - the sender's send CQ is the tiny one, never polled;
//! - the receiver has a receive posted for every send, on the roomy CQ, which is polled.
//!
//! It then posts `sends` signaled SENDs, one `ibv_post_send` each. Every send completes, and
//! rxe's completer posts its completion to the tiny CQ: once the CQ is full, `rxe_cq_post`
//! calls the CQ's event handler with `IB_EVENT_CQ_ERR` (`ib_uverbs_cq_event_handler` for a user
//! CQ, which queues it on the context's async event file) and drops the completion. The
//! program reads those events back with `ibv_get_async_event`, so the scenario can compare
//! what the kernel delivered with what the agent saw.
//!
//! Output: progress lines, then one line `cq-overflow-result {json}` with the device, the CQ's
//! real capacity, the QP numbers, `CLOCK_MONOTONIC` before the first send and after the last
//! event (the clock of the agent's kernel timestamps), the completions found, and every async
//! event read. On an error it exits non-zero and the kernel cleans up after the process.

use std::{
    ffi::{CStr, c_int, c_void},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};
use serde_json::json;

use crate::ibverbs::{
    self as ibv, IbvAsyncEvent, IbvCq, IbvGid, IbvQp, IbvQpAttr, Verbs, check, monotonic_ns,
    nonnull,
};

/// The guest-init subcommand that runs this program.
pub const COMMAND: &str = "cq-overflow";
/// The prefix of the result line.
pub const RESULT_PREFIX: &str = "cq-overflow-result ";

/// Bytes per message (and per receive buffer).
const MSG_LEN: usize = 64;
/// The port of the device.
const PORT: u8 = 1;
/// How long the program waits, after the last receive completed, for further async events.
const QUIET: Duration = Duration::from_secs(1);
/// A run that has not finished by then gives up (the kernel frees what it holds).
const DEADLINE: Duration = Duration::from_secs(20);

struct Options {
    device: String,
    gid_index: u8,
    cq_entries: c_int,
    sends: u32,
}

fn parse(args: &[String]) -> anyhow::Result<Options> {
    let usage = "usage: cq-overflow DEVICE GID_INDEX CQ_ENTRIES SENDS";
    let [device, gid_index, cq_entries, sends] = args else {
        bail!("{usage}");
    };
    Ok(Options {
        device: device.clone(),
        gid_index: gid_index.parse().context(usage)?,
        cq_entries: cq_entries.parse().context(usage)?,
        sends: sends.parse().context(usage)?,
    })
}

/// Runs the program with its arguments (after the subcommand's name).
pub fn main(args: &[String]) -> anyhow::Result<()> {
    let opts = parse(args)?;
    ensure!(opts.sends > 0, "SENDS must be positive");
    thread::spawn(|| {
        thread::sleep(DEADLINE + Duration::from_secs(20));
        eprintln!("cq-overflow: stuck, exiting");
        std::process::exit(3);
    });
    let v = Verbs::load()?;
    run(&v, &opts)
}

/// (completions, completions with an error status) among polled work completions.
fn tally(wc: &[ibv::IbvWc]) -> (usize, usize) {
    (wc.len(), wc.iter().filter(|c| c.status != 0).count())
}

fn run(v: &Verbs, opts: &Options) -> anyhow::Result<()> {
    let sends = opts.sends as usize;
    // SAFETY (for the whole function): every pointer passed to libibverbs is either one it
    // returned (checked non-NULL, and not yet destroyed) or points to a live local value of
    // the type verbs.h declares; the buffer registered as the MR outlives the MR.
    unsafe {
        let mut count = 0;
        let list = nonnull((v.ibv_get_device_list)(&mut count), "ibv_get_device_list")?;
        let devices = std::slice::from_raw_parts(list, usize::try_from(count).unwrap_or(0));
        let device = devices
            .iter()
            .copied()
            .find(|&d| {
                CStr::from_ptr((v.ibv_get_device_name)(d)).to_bytes() == opts.device.as_bytes()
            })
            .with_context(|| format!("no RDMA device {}", opts.device))?;
        let ctx = nonnull((v.ibv_open_device)(device), "ibv_open_device")?;
        let mut gid = IbvGid::default();
        check(
            (v.ibv_query_gid)(ctx, PORT, c_int::from(opts.gid_index), &mut gid),
            "ibv_query_gid",
        )?;
        let pd = nonnull((v.ibv_alloc_pd)(ctx), "ibv_alloc_pd")?;
        let mut buf = vec![0u8; 2 * sends * MSG_LEN];
        let mr = nonnull(
            (v.ibv_reg_mr)(
                pd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                ibv::ACCESS_LOCAL_WRITE,
            ),
            "ibv_reg_mr",
        )?;
        let null = std::ptr::null_mut();
        let small_cq = nonnull(
            (v.ibv_create_cq)(ctx, opts.cq_entries, null, null, 0),
            "ibv_create_cq (tiny)",
        )?;
        let roomy = c_int::try_from(2 * sends + 2).context("too many sends")?;
        let big_cq = nonnull(
            (v.ibv_create_cq)(ctx, roomy, null, null, 0),
            "ibv_create_cq (roomy)",
        )?;
        let sender = create_qp(v, pd, small_cq, big_cq, opts.sends, 1)?;
        let receiver = create_qp(v, pd, big_cq, big_cq, 1, opts.sends)?;
        let capacity = (*small_cq).cqe;
        println!(
            "{} GID index {}: CQ of {capacity} entries (asked {}) for the sends \
             of QP {} to QP {}",
            opts.device,
            opts.gid_index,
            opts.cq_entries,
            (*sender).qp_num,
            (*receiver).qp_num
        );
        for (qp, peer) in [(sender, receiver), (receiver, sender)] {
            connect(v, qp, (*peer).qp_num, gid, opts.gid_index)?;
        }

        let base = buf.as_mut_ptr() as u64;
        let lkey = (*mr).lkey;
        for i in 0..sends {
            let mut sge = ibv::IbvSge {
                addr: base + ((sends + i) * MSG_LEN) as u64,
                length: MSG_LEN as u32,
                lkey,
            };
            let mut wr = ibv::IbvRecvWr {
                wr_id: i as u64,
                next: null.cast(),
                sg_list: &mut sge,
                num_sge: 1,
            };
            check(v.post_recv(receiver, &mut wr), "ibv_post_recv")?;
        }
        let start_ns = monotonic_ns();
        for i in 0..sends {
            let mut sge = ibv::IbvSge {
                addr: base + (i * MSG_LEN) as u64,
                length: MSG_LEN as u32,
                lkey,
            };
            let mut wr = ibv::IbvSendWr {
                wr_id: i as u64,
                next: null.cast(),
                sg_list: &mut sge,
                num_sge: 1,
                opcode: ibv::WR_SEND,
                send_flags: ibv::SEND_SIGNALED,
                imm_data: 0,
                wr: [0; 4],
                qp_type: 0,
                bind_mw_or_tso: [0; 6],
            };
            check(v.post_send(sender, &mut wr), "ibv_post_send")?;
        }
        println!("{sends} signaled sends posted, the send CQ is not polled");

        // Receive completions on the roomy CQ, async events from the context, until every
        // receive completed and no event came for QUIET (or DEADLINE passed).
        let started = Instant::now();
        let mut last_event = Instant::now();
        let mut recv_completions = 0usize;
        let mut recv_errors = 0usize;
        let mut events = Vec::new();
        let mut wc = [ibv::IbvWc::default(); 16];
        loop {
            let n = v.poll_cq(big_cq, &mut wc);
            ensure!(n >= 0, "ibv_poll_cq (roomy) failed: {n}");
            let (done, failed) = tally(&wc[..n as usize]);
            recv_completions += done;
            recv_errors += failed;
            if let Some(e) = next_event(v, ctx, 100, small_cq)? {
                println!("async event {e}");
                events.push(e);
                last_event = Instant::now();
            }
            if recv_completions >= sends && last_event.elapsed() >= QUIET {
                break;
            }
            if started.elapsed() >= DEADLINE {
                println!("gave up waiting after {DEADLINE:?}");
                break;
            }
        }
        let end_ns = monotonic_ns();
        let mut send_completions = 0usize;
        let mut send_errors = 0usize;
        loop {
            let n = v.poll_cq(small_cq, &mut wc);
            ensure!(n >= 0, "ibv_poll_cq (tiny) failed: {n}");
            if n == 0 {
                break;
            }
            let (done, failed) = tally(&wc[..n as usize]);
            send_completions += done;
            send_errors += failed;
        }
        // ibv_destroy_cq/qp wait until every async event of theirs has been acknowledged.
        while let Some(e) = next_event(v, ctx, 0, small_cq)? {
            println!("late async event {e}");
            events.push(e);
        }
        println!(
            "cq-overflow: {recv_completions} receive completions ({recv_errors} failed), \
             {send_completions} send completions in the CQ ({send_errors} failed), \
             {} async events",
            events.len()
        );
        let result = json!({
            "device": opts.device,
            "cq_entries_requested": opts.cq_entries,
            "cq_entries": capacity,
            "sends": sends,
            "sender_qp": (*sender).qp_num,
            "receiver_qp": (*receiver).qp_num,
            "start_ns": start_ns,
            "end_ns": end_ns,
            "recv_completions": recv_completions,
            "recv_errors": recv_errors,
            "send_completions": send_completions,
            "send_errors": send_errors,
            "events": events,
        });
        println!("{RESULT_PREFIX}{result}");

        check((v.ibv_destroy_qp)(sender), "ibv_destroy_qp")?;
        check((v.ibv_destroy_qp)(receiver), "ibv_destroy_qp")?;
        check((v.ibv_destroy_cq)(small_cq), "ibv_destroy_cq")?;
        check((v.ibv_destroy_cq)(big_cq), "ibv_destroy_cq")?;
        check((v.ibv_dereg_mr)(mr), "ibv_dereg_mr")?;
        drop(buf);
        check((v.ibv_dealloc_pd)(pd), "ibv_dealloc_pd")?;
        check((v.ibv_close_device)(ctx), "ibv_close_device")?;
        (v.ibv_free_device_list)(list);
    }
    Ok(())
}

/// Creates an RC QP with one SGE per work request.
///
/// # Safety
/// `pd` and the CQs are live objects of one context.
unsafe fn create_qp(
    v: &Verbs,
    pd: *mut ibv::IbvPd,
    send_cq: *mut IbvCq,
    recv_cq: *mut IbvCq,
    max_send_wr: u32,
    max_recv_wr: u32,
) -> anyhow::Result<*mut IbvQp> {
    let mut attr = ibv::IbvQpInitAttr {
        qp_context: std::ptr::null_mut(),
        send_cq,
        recv_cq,
        srq: std::ptr::null_mut(),
        cap: ibv::IbvQpCap {
            max_send_wr,
            max_recv_wr,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: ibv::QPT_RC,
        sq_sig_all: 0,
    };
    // SAFETY: per this function's contract; `attr` is a valid ibv_qp_init_attr.
    nonnull(unsafe { (v.ibv_create_qp)(pd, &mut attr) }, "ibv_create_qp")
}

/// Moves `qp` through INIT, RTR and RTS towards `dest_qp_num` at `gid` (RoCE v2, port 1).
///
/// # Safety
/// `qp` is a live QP.
unsafe fn connect(
    v: &Verbs,
    qp: *mut IbvQp,
    dest_qp_num: u32,
    gid: IbvGid,
    gid_index: u8,
) -> anyhow::Result<()> {
    use ibv::qp_attr as m;
    let mut init = IbvQpAttr {
        qp_state: ibv::QPS_INIT,
        pkey_index: 0,
        port_num: PORT,
        qp_access_flags: ibv::ACCESS_LOCAL_WRITE as u32,
        ..Default::default()
    };
    let mut rtr = IbvQpAttr {
        qp_state: ibv::QPS_RTR,
        path_mtu: ibv::MTU_1024,
        dest_qp_num,
        rq_psn: 0,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        ah_attr: ibv::IbvAhAttr {
            grh: ibv::IbvGlobalRoute {
                dgid: gid,
                sgid_index: gid_index,
                hop_limit: 1,
                ..Default::default()
            },
            is_global: 1,
            port_num: PORT,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut rts = IbvQpAttr {
        qp_state: ibv::QPS_RTS,
        sq_psn: 0,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 1,
        ..Default::default()
    };
    let steps = [
        (
            &mut init,
            m::STATE | m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS,
            "INIT",
        ),
        (
            &mut rtr,
            m::STATE
                | m::AV
                | m::PATH_MTU
                | m::DEST_QPN
                | m::RQ_PSN
                | m::MAX_DEST_RD_ATOMIC
                | m::MIN_RNR_TIMER,
            "RTR",
        ),
        (
            &mut rts,
            m::STATE | m::TIMEOUT | m::RETRY_CNT | m::RNR_RETRY | m::SQ_PSN | m::MAX_QP_RD_ATOMIC,
            "RTS",
        ),
    ];
    for (attr, mask, state) in steps {
        // SAFETY: `qp` is live (this function's contract); `attr` is a valid ibv_qp_attr.
        let rc = unsafe { (v.ibv_modify_qp)(qp, attr, mask) };
        check(rc, &format!("ibv_modify_qp to {state}"))?;
    }
    Ok(())
}

/// The next async event of `ctx`, waiting up to `timeout_ms` for one; acknowledged at once.
///
/// # Safety
/// `ctx` is a live context; `small_cq` is one of its CQs (only compared).
unsafe fn next_event(
    v: &Verbs,
    ctx: *mut ibv::IbvContext,
    timeout_ms: c_int,
    small_cq: *mut IbvCq,
) -> anyhow::Result<Option<serde_json::Value>> {
    let mut pfd = libc::pollfd {
        // SAFETY: `ctx` is live.
        fd: unsafe { (*ctx).async_fd },
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let ready = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    if ready <= 0 {
        return Ok(None);
    }
    let mut event = IbvAsyncEvent::default();
    // SAFETY: `ctx` is live; the fd is readable, so this does not block.
    check(
        unsafe { (v.ibv_get_async_event)(ctx, &mut event) },
        "ibv_get_async_event",
    )?;
    let code = event.event_type;
    let name = ibv::event_name(code);
    let mut value = json!({ "event": name, "code": code });
    if ibv::is_qp_event(code) {
        // SAFETY: for QP events `element` is the `struct ibv_qp *` the event is about.
        value["qp_num"] = unsafe { (*event.element.cast::<IbvQp>()).qp_num }.into();
    } else if code == 0 {
        let cq = if event.element == small_cq.cast::<c_void>() {
            "tiny"
        } else {
            "roomy"
        };
        value["cq"] = cq.into();
    }
    // SAFETY: an event returned by ibv_get_async_event, acknowledged once.
    unsafe { (v.ibv_ack_async_event)(&mut event) };
    Ok(Some(value))
}
