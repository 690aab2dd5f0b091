//! `struct ib_device`: its name, read through BTF-resolved offsets, and the `DEVICE_NAMES` map
//! that lets counters and events key on the device pointer instead of copying the name every
//! time.

use aya_ebpf::{Global, helpers::bpf_probe_read_kernel_str_bytes, macros::map, maps::HashMap};
use monitor_common::events::{DEVICE_NAME_LEN, NameSource};

use crate::shared::read_at;

#[unsafe(no_mangle)]
static IB_DEVICE_NAME_SOURCE: Global<u32> = Global::new(NameSource::InlineArray as u32);
#[unsafe(no_mangle)]
static IB_DEVICE_NAME_OFFSET: Global<u32> = Global::new(0);

#[map]
static DEVICE_NAMES: HashMap<u64, [u8; DEVICE_NAME_LEN]> = HashMap::with_max_entries(256, 0);

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

/// Devices already named, in a small direct-mapped table (a slot per device pointer hash):
/// a node's job drives all its HCAs at once (a rail per GPU), so one "last device" would
/// miss on nearly every verb. A plain global (a `.bss` map the verifier turns into a direct
/// memory access), not a map lookup: this runs on every counted verb, and under
/// `cargo xtask bench probes` a helper call is the larger part of a probe's cost. Shared by
/// all CPUs without a lock: the name is inserted into `DEVICE_NAMES` before the key is stored
/// here, so a CPU that finds its device here knows the name is known; a race or a collision
/// only costs one more `DEVICE_NAMES` lookup.
#[unsafe(no_mangle)]
static mut KNOWN_DEVICES: [u64; KNOWN_SLOTS] = [0; KNOWN_SLOTS];
const KNOWN_SLOTS: usize = 16;

/// The slot of a device pointer: Fibonacci hashing (device structs are large, page-aligned
/// allocations, so the low bits say nothing).
#[inline(always)]
fn known_slot(key: u64) -> usize {
    (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 60) as usize & (KNOWN_SLOTS - 1)
}

/// Makes sure `DEVICE_NAMES` knows the device, and returns its key for counters.
///
/// # Safety
/// `device` is a kernel `struct ib_device *` or null.
#[inline(always)]
pub unsafe fn remember(device: *const u8) -> u64 {
    let key = device as u64;
    if key == 0 {
        return key;
    }
    // SAFETY: an element of this program's own global array (the index is masked below its
    // length); a torn or stale value only costs a lookup.
    let slot = unsafe { (&raw mut KNOWN_DEVICES).cast::<u64>().add(known_slot(key)) };
    if unsafe { core::ptr::read_volatile(slot) } == key {
        return key;
    }
    let named = unsafe { DEVICE_NAMES.get(&key) }.is_some() || {
        let mut name = [0u8; DEVICE_NAME_LEN];
        unsafe { read_name(device, &mut name) }.is_ok()
            && DEVICE_NAMES.insert(&key, &name, 0).is_ok()
    };
    if named {
        // SAFETY: as above.
        unsafe { core::ptr::write_volatile(slot, key) };
    }
    key
}
