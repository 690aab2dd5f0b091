//! The maps every probe writes to, and the small helpers around them.

use aya_ebpf::{
    Global,
    helpers::bpf_get_current_cgroup_id,
    macros::map,
    maps::{LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
};
use monitor_common::{
    PROBE_STAT_SLOTS, ProbeStat,
    events::{EventRecord, Origin},
    verbs::{CounterKey, Verb},
};

/// Ring-buffer output flag: do not wake the reader (see [`send_event`]).
const BPF_RB_NO_WAKEUP: u64 = 1;
/// Ring-buffer output flag: wake the reader whatever it has left unread.
const BPF_RB_FORCE_WAKEUP: u64 = 2;

/// Whether the agent is woken for an event or finds it at its next periodic drain.
#[derive(Clone, Copy)]
pub(crate) enum Delivery {
    /// Rare events whose lateness matters (port and device events, async errors): the
    /// reader is woken at once. A plain wake-up (flags 0) only fires when the reader has
    /// consumed everything before this record, which records written without wake-up
    /// prevent, so this forces it.
    Wake,
    /// Events that come in numbers with the traffic (QPs moved to ERR at every job's end):
    /// no wake-up, the agent drains them within 250 ms.
    Batched,
}

/// 256 KiB holds about 4,500 records: far more than a burst of port flaps between two drains.
#[map]
pub(crate) static EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// Bounded by devices x verbs x details x cgroups (jobs), never by processes.
#[map]
static VERB_COUNTS: PerCpuHashMap<CounterKey, u64> = PerCpuHashMap::with_max_entries(8192, 0);

/// Cgroups that counted recently, so the agent is told of a new one once (see
/// [`note_cgroup`]); least recently used first out, which only costs another notice.
#[map]
static SEEN_CGROUPS: LruHashMap<u64, u8> = LruHashMap::with_max_entries(4096, 0);

#[map]
static PROBE_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(PROBE_STAT_SLOTS, 0);

/// Adds one to a slot of this CPU's `PROBE_STATS` (per-CPU: no atomics needed).
#[inline(always)]
pub(crate) fn bump(stat: ProbeStat) {
    if let Some(slot) = PROBE_STATS.get_ptr_mut(stat as u32) {
        // SAFETY: the pointer comes from the map and is valid for this CPU while we run.
        unsafe { *slot += 1 };
    }
}

/// Counts one verb for the calling task's cgroup.
#[inline(always)]
pub(crate) fn count(device: u64, verb: Verb, detail: u32) {
    count_raw(device, verb as u32, detail);
}

/// [`count`] with the verb's raw value (as stored in the restrack tables userspace fills).
#[inline(always)]
pub(crate) fn count_raw(device: u64, verb: u32, detail: u32) {
    count_in(current_cgroup(), device, verb, detail);
}

/// The cgroup v2 id of the running task.
#[inline(always)]
pub(crate) fn current_cgroup() -> u64 {
    // SAFETY: a helper without arguments.
    unsafe { bpf_get_current_cgroup_id() }
}

// From a `struct task_struct *` to its cgroup v2 id (`task_struct.cgroups` ->
// `css_set.dfl_cgrp` -> `cgroup.kn` -> `kernfs_node.id`), set at load time from BTF.
#[unsafe(no_mangle)]
static TASK_CGROUPS_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static CSS_SET_DFL_CGRP_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static CGROUP_KN_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static KERNFS_NODE_ID_OFFSET: Global<u32> = Global::new(0);

/// The cgroup v2 id of `task` (what `bpf_get_current_cgroup_id` gives for the current task),
/// or `None` for a null task or a failed read.
///
/// # Safety
/// `task` is a kernel `struct task_struct *` or null (reads are fault-safe).
#[inline(always)]
pub(crate) unsafe fn task_cgroup(task: *const u8) -> Option<u64> {
    if task.is_null() {
        return None;
    }
    // SAFETY: kernel pointers read through fault-safe helpers.
    unsafe {
        let cgroups = read_at::<*const u8>(task, TASK_CGROUPS_OFFSET.load()).ok()?;
        let cgroup = read_at::<*const u8>(cgroups, CSS_SET_DFL_CGRP_OFFSET.load()).ok()?;
        let kn = read_at::<*const u8>(cgroup, CGROUP_KN_OFFSET.load()).ok()?;
        read_at::<u64>(kn, KERNFS_NODE_ID_OFFSET.load()).ok()
    }
}

/// Counts one verb for `cgroup` (a probe that also sends an event reads it once for both).
#[inline(always)]
pub(crate) fn count_in(cgroup: u64, device: u64, verb: u32, detail: u32) {
    let key = CounterKey {
        device,
        cgroup,
        verb,
        detail,
    };
    match VERB_COUNTS.get_ptr_mut(&key) {
        // SAFETY: this CPU's slot of an existing entry.
        Some(value) => unsafe { *value += 1 },
        None => {
            if VERB_COUNTS.insert(&key, &1, 0).is_err() {
                bump(ProbeStat::CountsDropped);
            } else {
                note_cgroup(cgroup);
            }
        }
    }
}

/// On a new counter key (a verb, device or detail a cgroup had not counted): if the cgroup
/// is new too, wakes the agent with a [`Origin::NewCgroup`] record so it names the cgroup
/// at once. Userspace reads the counters at each sweep (1 s); a job that starts and ends
/// between two sweeps would be gone, and nameless, by then. Only on the slow path of a new
/// key: the frequent verbs of a known key never get here.
#[inline(always)]
fn note_cgroup(cgroup: u64) {
    if SEEN_CGROUPS.get_ptr(&cgroup).is_some() {
        return;
    }
    let _ = SEEN_CGROUPS.insert(&cgroup, &1, 0);
    send_event_in(cgroup, Delivery::Wake, |record| {
        record.origin = Origin::NewCgroup as u32;
        Ok(())
    });
}

/// Sends an event of the running task's cgroup, filled by `fill`, to the ring buffer; counts
/// it when the buffer is full.
///
/// `delivery` says whether the reader is woken. A wake-up queues an irq_work and raises a
/// self-IPI on the CPU that runs the hook, most of what the program costs, so frequent events
/// are written without it (`BPF_RB_NO_WAKEUP`) and the agent drains them on a short timer
/// (their kernel timestamps keep their time exact); rare ones, whose lateness matters more
/// than their cost, wake it (`BPF_RB_FORCE_WAKEUP`).
#[inline(always)]
pub(crate) fn send_event(
    delivery: Delivery,
    fill: impl FnOnce(&mut EventRecord) -> Result<(), i32>,
) {
    send_event_in(current_cgroup(), delivery, fill);
}

/// [`send_event`] for a cgroup the probe already read.
#[inline(always)]
pub(crate) fn send_event_in(
    cgroup: u64,
    delivery: Delivery,
    fill: impl FnOnce(&mut EventRecord) -> Result<(), i32>,
) {
    let mut record = EventRecord {
        // SAFETY: a helper without arguments.
        timestamp_ns: unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() },
        cgroup,
        device: 0,
        origin: 0,
        event_type: u32::MAX,
        port: 0,
        qp_num: 0,
        read_error: 0,
        _pad: 0,
    };
    if fill(&mut record).is_err() {
        record.read_error = 1;
        bump(ProbeStat::EventReadErrors);
    }
    // One helper call (`bpf_ringbuf_output` copies the 48 bytes), where reserve and submit
    // are two.
    let flags = match delivery {
        Delivery::Wake => BPF_RB_FORCE_WAKEUP,
        Delivery::Batched => BPF_RB_NO_WAKEUP,
    };
    if EVENTS.output::<EventRecord>(&record, flags).is_err() {
        bump(ProbeStat::EventsDropped);
    }
}

/// Reads a kernel value at `base + offset`.
///
/// # Safety
/// `base` must be a kernel address (reads go through bpf_probe_read_kernel, which faults
/// safely on a bad one).
#[inline(always)]
pub(crate) unsafe fn read_at<T>(base: *const u8, offset: u32) -> Result<T, i32> {
    unsafe { aya_ebpf::helpers::bpf_probe_read_kernel(base.add(offset as usize).cast::<T>()) }
}
