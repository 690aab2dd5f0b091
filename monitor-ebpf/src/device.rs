//! `struct ib_device`: its name, read through BTF-resolved offsets, and the `DEVICE_NAMES` map
//! that lets counters key on the device pointer instead of copying the name every time.

use aya_ebpf::{
    Global,
    helpers::bpf_probe_read_kernel_str_bytes,
    macros::map,
    maps::{HashMap, PerCpuArray},
};
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
pub unsafe fn read_name(device: *const u8, out: &mut [u8; DEVICE_NAME_LEN]) -> Result<(), i32> {
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

/// The device this CPU named last: a node has a handful of devices and a burst of verbs goes
/// to one, so most events skip the `DEVICE_NAMES` hash lookup for an array read.
#[map]
static LAST_DEVICE: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Makes sure `DEVICE_NAMES` knows the device, and returns its key for counters.
///
/// # Safety
/// `device` is a kernel `struct ib_device *` or null.
#[inline(always)]
pub unsafe fn remember(device: *const u8) -> u64 {
    let key = device as u64;
    let Some(last) = LAST_DEVICE.get_ptr_mut(0) else {
        return key;
    };
    // SAFETY: this CPU's slot, valid while the program runs.
    if key == 0 || unsafe { *last } == key {
        return key;
    }
    if unsafe { DEVICE_NAMES.get(&key) }.is_none() {
        let mut name = [0u8; DEVICE_NAME_LEN];
        if unsafe { read_name(device, &mut name) }.is_ok() {
            let _ = DEVICE_NAMES.insert(&key, &name, 0);
        }
    }
    // SAFETY: as above.
    unsafe { *last = key };
    key
}
