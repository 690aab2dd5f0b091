//! `struct ib_device`: its identity and name, read through BTF-resolved offsets, and the
//! `DEVICE_NAMES` map that lets counters and events carry a small key instead of copying the
//! name every time.
//!
//! The key is the device's `index` (plus one, [`device_key`]), not its address: ib_core
//! allocates indexes cyclically at registration, so a device that goes away and a new one
//! allocated at the same address never share a key, a name or counters. A probe on
//! `ib_dealloc_device` marks the gone device's entry (userspace deletes it and the device's
//! counters after a grace period) and clears its slot of the [`KNOWN_DEVICES`] cache; a
//! device whose entry is marked is never cached again, and the event hooks read the index
//! every time ([`remember_checked`]). In CI (attach-pace, 6.1) a port event of a new rxe0
//! once carried the name of an rxe3 freed seconds before, which the agent never reported
//! removed: a slot of the cache left for the old device's address, which the new device then
//! took. Why the slot outlived rxe3 is not established (rerun, the devices that existed
//! before the agent started were not reported removed either): the event hooks no longer
//! depend on it; a verb counted in that window could still be.

use aya_ebpf::{
    Global,
    helpers::{bpf_ktime_get_ns, bpf_probe_read_kernel_str_bytes},
    macros::{kprobe, map},
    maps::HashMap,
    programs::ProbeContext,
};
use monitor_common::{
    ProbeStat,
    events::{DEVICE_NAME_LEN, DeviceEntry, NameSource, device_key},
};

use crate::shared::{bump, read_at};

#[unsafe(no_mangle)]
static IB_DEVICE_NAME_SOURCE: Global<u32> = Global::new(NameSource::InlineArray as u32);
#[unsafe(no_mangle)]
static IB_DEVICE_NAME_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static IB_DEVICE_INDEX_OFFSET: Global<u32> = Global::new(0);

#[map]
static DEVICE_NAMES: HashMap<u64, DeviceEntry> = HashMap::with_max_entries(256, 0);

/// Copies the device's name into `out`.
///
/// # Safety
/// `device` is a kernel `struct ib_device *`.
#[inline(always)]
unsafe fn read_name(device: *const u8, out: &mut [u8; DEVICE_NAME_LEN]) -> Result<(), i32> {
    unsafe {
        let at = if IB_DEVICE_NAME_SOURCE.load() == NameSource::Pointer as u32 {
            read_at::<*const u8>(device, IB_DEVICE_NAME_OFFSET.load())?
        } else {
            device.add(IB_DEVICE_NAME_OFFSET.load() as usize)
        };
        bpf_probe_read_kernel_str_bytes(at, out)?;
    }
    Ok(())
}

/// The device's key: its `index` plus one.
///
/// # Safety
/// `device` is a kernel `struct ib_device *`.
#[inline(always)]
unsafe fn read_key(device: *const u8) -> Result<u64, i32> {
    unsafe { read_at::<u32>(device, IB_DEVICE_INDEX_OFFSET.load()) }.map(device_key)
}

/// Devices already named, in a small direct-mapped table (a slot per device pointer hash):
/// a node's job drives all its HCAs at once (a rail per GPU), so one "last device" would
/// miss on nearly every verb. A plain global (a `.bss` map the verifier turns into a direct
/// memory access), not a map lookup: this runs on every counted verb, and under
/// `cargo xtask bench probes` a helper call is the larger part of a probe's cost.
///
/// A slot holds `[pointer ^ mix(key), key]`: a hit needs both words to agree with the
/// pointer looked up, so a slot torn by two CPUs writing at once (no lock) fails the check
/// and costs one more lookup, never a wrong key. The name is inserted into `DEVICE_NAMES`
/// before a slot is written, so a device found here is named. `ib_dealloc_device` clears the
/// slot of a device that goes away, so a new device at its address is read afresh.
#[unsafe(no_mangle)]
static mut KNOWN_DEVICES: [[u64; 2]; KNOWN_SLOTS] = [[0; 2]; KNOWN_SLOTS];
const KNOWN_SLOTS: usize = 16;

/// The slot of a device pointer: Fibonacci hashing (device structs are large, page-aligned
/// allocations, so the low bits say nothing).
#[inline(always)]
fn known_slot(pointer: u64) -> usize {
    (pointer.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 60) as usize & (KNOWN_SLOTS - 1)
}

/// What a slot's first word holds for a (pointer, key) pair.
#[inline(always)]
fn check_word(pointer: u64, key: u64) -> u64 {
    pointer ^ key.wrapping_mul(0xbf58_476d_1ce4_e5b9)
}

/// Makes sure `DEVICE_NAMES` knows the device, and returns its key for counters and events
/// (0 for a null device or an unreadable index). The verbs' path: a device found in
/// [`KNOWN_DEVICES`] costs no read of its memory.
///
/// # Safety
/// `device` is a kernel `struct ib_device *` or null.
#[inline(always)]
pub(crate) unsafe fn remember(device: *const u8) -> u64 {
    let pointer = device as u64;
    if pointer == 0 {
        return 0;
    }
    let slot = known_slot_of(pointer);
    // SAFETY: an element of this program's own global array; a torn or stale value fails
    // the check below.
    let (check, key) = unsafe {
        (
            core::ptr::read_volatile(&raw const (*slot)[0]),
            core::ptr::read_volatile(&raw const (*slot)[1]),
        )
    };
    if key != 0 && check == check_word(pointer, key) {
        return key;
    }
    // SAFETY: as the caller's.
    unsafe { remember_read(device) }
}

/// [`remember`] that reads the device's index every time, for the rare hooks (port and
/// async events): their device is named by what the kernel holds now, even if a device
/// that went away at the same address left a slot of [`KNOWN_DEVICES`] behind.
///
/// # Safety
/// `device` is a kernel `struct ib_device *` or null.
#[inline(always)]
pub(crate) unsafe fn remember_checked(device: *const u8) -> u64 {
    if device.is_null() {
        return 0;
    }
    // SAFETY: as the caller's.
    unsafe { remember_read(device) }
}

/// The slot of [`KNOWN_DEVICES`] for a device pointer.
#[inline(always)]
fn known_slot_of(pointer: u64) -> *mut [u64; 2] {
    // SAFETY: the index is masked below the array's length.
    unsafe {
        (&raw mut KNOWN_DEVICES)
            .cast::<[u64; 2]>()
            .add(known_slot(pointer))
    }
}

/// Reads the device's key, names it in `DEVICE_NAMES` if it is new, and caches it in its
/// slot unless it is being freed: an entry marked removed is a device in `ib_dealloc_device`
/// (a probe of its teardown runs after that hook's), and caching it then would hand its key
/// to the next device allocated at its address.
///
/// # Safety
/// `device` is a non-null kernel `struct ib_device *`.
#[inline(always)]
unsafe fn remember_read(device: *const u8) -> u64 {
    let pointer = device as u64;
    let Ok(key) = (unsafe { read_key(device) }) else {
        return 0;
    };
    let cache = match unsafe { DEVICE_NAMES.get(&key) } {
        Some(entry) => entry.removed_ns == 0,
        None => {
            let mut entry = DeviceEntry {
                name: [0u8; DEVICE_NAME_LEN],
                removed_ns: 0,
            };
            unsafe { read_name(device, &mut entry.name) }.is_ok() && {
                let inserted = DEVICE_NAMES.insert(&key, &entry, 0).is_ok();
                if !inserted {
                    bump(ProbeStat::DeviceNamesFull);
                }
                inserted
            }
        }
    };
    if cache {
        let slot = known_slot_of(pointer);
        // SAFETY: as in `remember`.
        unsafe {
            core::ptr::write_volatile(&raw mut (*slot)[1], key);
            core::ptr::write_volatile(&raw mut (*slot)[0], check_word(pointer, key));
        }
    }
    key
}

/// A device being freed (`ib_dealloc_device`): its cache slot is cleared and its
/// `DEVICE_NAMES` entry marked removed, made now (marked) if no probe had named the device:
/// a probe that runs later in its teardown then finds it removed and does not cache it. A
/// device freed before it was registered (a driver's error path) has no name yet and its
/// index is not its own: it is left alone.
///
/// # Safety
/// `device` is a kernel `struct ib_device *` or null.
#[inline(always)]
unsafe fn forget(device: *const u8) {
    let pointer = device as u64;
    if pointer == 0 {
        return;
    }
    let mut name = [0u8; DEVICE_NAME_LEN];
    if unsafe { read_name(device, &mut name) }.is_err() || name[0] == 0 {
        return;
    }
    let slot = known_slot_of(pointer);
    // SAFETY: as in `remember`.
    unsafe {
        core::ptr::write_volatile(&raw mut (*slot)[0], 0);
        core::ptr::write_volatile(&raw mut (*slot)[1], 0);
    }
    let Ok(key) = (unsafe { read_key(device) }) else {
        return;
    };
    // SAFETY: `bpf_ktime_get_ns` takes no arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    if let Some(entry) = DEVICE_NAMES.get_ptr_mut(&key) {
        // SAFETY: a value of our own map.
        unsafe { (*entry).removed_ns = now };
    } else {
        let entry = DeviceEntry {
            name,
            removed_ns: now,
        };
        if DEVICE_NAMES.insert(&key, &entry, 0).is_err() {
            bump(ProbeStat::DeviceNamesFull);
        }
    }
}

/// `ib_dealloc_device(struct ib_device *)` in the ib_core family's instance.
#[kprobe]
pub(crate) fn ib_dealloc_device(ctx: ProbeContext) -> u32 {
    if let Some(device) = ctx.arg::<*const u8>(0) {
        // SAFETY: the kernel's argument; every read is fault-safe.
        unsafe { forget(device) };
    }
    0
}

/// The same hook in the ib_uverbs family's instance, which has its own maps and cache.
#[kprobe]
pub(crate) fn uverbs_ib_dealloc_device(ctx: ProbeContext) -> u32 {
    if let Some(device) = ctx.arg::<*const u8>(0) {
        // SAFETY: as above.
        unsafe { forget(device) };
    }
    0
}
