//! A stand-in `libnvidia-ml.so`: a shared library exporting the NVML C functions that
//! railscope's GPU source calls through nvml-wrapper, answering them from a scripted
//! multi-GPU trace instead of a driver. It is not a GPU and not NVIDIA's library; it exists so
//! the NVML path (dynamic loading, symbol lookup, struct layouts, error codes, the event
//! thread, GPM sampling, a GPU falling off the bus) is exercised on machines without one.
//!
//! - The script: `nvml-standin.json` in the directory the library is loaded from, else the
//!   file named by `RAILSCOPE_NVML_STANDIN_SCRIPT` (format in [`script`] and
//!   `docs/nvml-standin.md`).
//! - Time: one step per `nvmlDeviceGetUtilizationRates` call on a GPU (see [`state`]).
//! - Logs: through `tracing` to stderr, filtered by `RAILSCOPE_NVML_STANDIN_LOG` (default
//!   `warn`); the library installs its own subscriber because a dlopen'ed copy of `tracing`
//!   does not share the host's.
//!
//! nvml-wrapper-sys looks every symbol up when the library is loaded but keeps a missing one
//! as an error that only surfaces when that function is called, so the stand-in exports just
//! the functions the source uses (plus `nvmlShutdown` and `nvmlGpmSampleFree`, which
//! nvml-wrapper calls unchecked from `Drop` and would panic without).
//!
//! Every export is `unsafe extern "C"` with NVML's contract: pointer arguments are either
//! null (answered with `NVML_ERROR_INVALID_ARGUMENT`) or valid for the reads and writes
//! nvml.h documents for that function.
#![allow(non_snake_case)] // the exports carry NVML's names
#![allow(clippy::missing_safety_doc)] // one contract for all exports, stated above

pub mod counts;
pub mod ffi;
pub mod script;
pub mod state;

use std::{
    ffi::{CStr, CString, c_char, c_int, c_uint, c_ulonglong},
    sync::Once,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use ffi::{
    EventData, FieldValue, GpmMetric, GpmMetricsGet, GpmSupport, Handle, MemoryV2, NvmlReturn,
    Utilization, Value, field,
};
use state::{Run, View};

fn init_logging() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_env("RAILSCOPE_NVML_STANDIN_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        // Fails only if this copy of tracing already has a subscriber (the rlib in a test).
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init();
    });
}

/// Check `out`, compute the answer on the current replay, write it.
unsafe fn answer<T>(out: *mut T, f: impl FnOnce(&mut Run) -> Result<T, NvmlReturn>) -> NvmlReturn {
    if out.is_null() {
        return ffi::ERROR_INVALID_ARGUMENT;
    }
    match state::with_run(f) {
        Ok(value) => {
            // SAFETY: `out` is non-null and, by the export's contract, valid for a write of T.
            unsafe { out.write(value) };
            ffi::SUCCESS
        }
        Err(e) => e,
    }
}

/// Copy `s` with its NUL into the caller's `length`-byte buffer.
unsafe fn copy_str(buf: *mut c_char, length: c_uint, s: Result<CString, NvmlReturn>) -> NvmlReturn {
    if buf.is_null() {
        return ffi::ERROR_INVALID_ARGUMENT;
    }
    let s = match s {
        Ok(s) => s,
        Err(e) => return e,
    };
    let s = s.as_bytes_with_nul();
    if s.len() > length as usize {
        return ffi::ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: `buf` is valid for `length` >= `s.len()` bytes by contract; the regions are
    // distinct (ours is a CString owned by the replay).
    unsafe { std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), buf, s.len()) };
    ffi::SUCCESS
}

fn status(r: Result<(), NvmlReturn>) -> NvmlReturn {
    r.err().unwrap_or(ffi::SUCCESS)
}

fn supported<T>(v: Option<T>) -> Result<T, NvmlReturn> {
    v.ok_or(ffi::ERROR_NOT_SUPPORTED)
}

// ---- Initialisation and the system ----

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit_v2() -> NvmlReturn {
    counts::count("nvmlInit_v2");
    init_logging();
    state::init(state::load_script)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlShutdown() -> NvmlReturn {
    counts::count("nvmlShutdown");
    let result = state::shutdown();
    if state::is_shut_down() {
        counts::write();
    }
    result
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlErrorString(result: NvmlReturn) -> *const c_char {
    counts::count("nvmlErrorString");
    let s: &'static CStr = match result {
        ffi::SUCCESS => c"Success",
        ffi::ERROR_UNINITIALIZED => c"Uninitialized",
        ffi::ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        ffi::ERROR_NOT_SUPPORTED => c"Not Supported",
        ffi::ERROR_NOT_FOUND => c"Not Found",
        ffi::ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        ffi::ERROR_DRIVER_NOT_LOADED => c"Driver Not Loaded (nvml stand-in: no script)",
        ffi::ERROR_TIMEOUT => c"Timeout",
        ffi::ERROR_GPU_IS_LOST => c"GPU is lost",
        ffi::ERROR_ARGUMENT_VERSION_MISMATCH => c"Argument version mismatch",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    counts::count("nvmlSystemGetDriverVersion");
    let v = state::with_run(|run| Ok(run.trace.driver_version.clone()));
    // SAFETY: forwarded contract.
    unsafe { copy_str(version, length, v) }
}

// ---- Devices ----

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(device_count: *mut c_uint) -> NvmlReturn {
    counts::count("nvmlDeviceGetCount_v2");
    // SAFETY: forwarded contract.
    unsafe { answer(device_count, |run| Ok(run.device_count() as c_uint)) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut Handle,
) -> NvmlReturn {
    counts::count("nvmlDeviceGetHandleByIndex_v2");
    // SAFETY: forwarded contract.
    unsafe {
        answer(device, |run| {
            let index = run.handle_index(index as usize)?;
            Ok(state::device_handle(index))
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: Handle, index: *mut c_uint) -> NvmlReturn {
    counts::count("nvmlDeviceGetIndex");
    // SAFETY: forwarded contract.
    unsafe { answer(index, |run| Ok(run.view(device)?.index as c_uint)) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: Handle,
    name: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    counts::count("nvmlDeviceGetName");
    let v = state::with_run(|run| Ok(run.view(device)?.gpu.name.clone()));
    // SAFETY: forwarded contract.
    unsafe { copy_str(name, length, v) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: Handle,
    uuid: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    counts::count("nvmlDeviceGetUUID");
    let v = state::with_run(|run| Ok(run.view(device)?.gpu.uuid.clone()));
    // SAFETY: forwarded contract.
    unsafe { copy_str(uuid, length, v) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: Handle,
    pci: *mut ffi::PciInfo,
) -> NvmlReturn {
    counts::count("nvmlDeviceGetPciInfo_v3");
    // SAFETY: forwarded contract.
    unsafe {
        answer(pci, |run| {
            let id = supported(run.view(device)?.gpu.pci)?;
            // NVML's C strings, NUL-padded (the ids are ASCII and shorter than their arrays).
            let fill = |text: String, out: &mut [c_char]| {
                for (o, b) in out.iter_mut().zip(text.bytes()) {
                    *o = b as c_char;
                }
            };
            let mut info = ffi::PciInfo {
                bus_id_legacy: [0; 16],
                domain: id.domain,
                bus: id.bus,
                device: id.device,
                pci_device_id: 0,
                pci_sub_system_id: 0,
                bus_id: [0; 32],
            };
            fill(id.bus_id_legacy(), &mut info.bus_id_legacy);
            fill(id.bus_id(), &mut info.bus_id);
            Ok(info)
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetVbiosVersion(
    device: Handle,
    version: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    counts::count("nvmlDeviceGetVbiosVersion");
    let v = state::with_run(|run| supported(run.view(device)?.gpu.vbios_version.clone()));
    // SAFETY: forwarded contract.
    unsafe { copy_str(version, length, v) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSerial(
    device: Handle,
    serial: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    counts::count("nvmlDeviceGetSerial");
    let v = state::with_run(|run| supported(run.view(device)?.gpu.serial.clone()));
    // SAFETY: forwarded contract.
    unsafe { copy_str(serial, length, v) }
}

/// Also the stand-in's clock: each call moves this GPU to its next step.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: Handle,
    utilization: *mut Utilization,
) -> NvmlReturn {
    counts::count("nvmlDeviceGetUtilizationRates");
    // SAFETY: forwarded contract.
    unsafe {
        answer(utilization, |run| {
            let v = run.advance(device)?;
            // NVML answers both together: a script giving only GPU utilization means 0 for
            // the memory controller.
            Ok(Utilization {
                gpu: supported(v.values.gpu_util_pct)?,
                memory: v.values.mem_util_pct.unwrap_or(0),
            })
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: Handle,
    memory: *mut MemoryV2,
) -> NvmlReturn {
    counts::count("nvmlDeviceGetMemoryInfo_v2");
    if memory.is_null() {
        return ffi::ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null and valid for reads by contract; the caller sets `version`.
    if unsafe { (*memory).version } != ffi::MEMORY_V2_VERSION {
        return ffi::ERROR_ARGUMENT_VERSION_MISMATCH;
    }
    // SAFETY: forwarded contract.
    unsafe {
        answer(memory, |run| {
            let s = run.view(device)?.values;
            let total = supported(s.memory_total_bytes)?;
            let used = supported(s.memory_used_bytes)?;
            let reserved = s.memory_reserved_bytes.unwrap_or(0);
            Ok(MemoryV2 {
                version: ffi::MEMORY_V2_VERSION,
                total,
                reserved,
                free: total.saturating_sub(reserved).saturating_sub(used),
                used,
            })
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: Handle,
    clock_type: c_uint,
    clock: *mut c_uint,
) -> NvmlReturn {
    counts::count("nvmlDeviceGetClockInfo");
    // SAFETY: forwarded contract.
    unsafe {
        answer(clock, |run| {
            let s = run.view(device)?.values;
            match clock_type {
                ffi::CLOCK_SM => supported(s.sm_clock_mhz),
                ffi::CLOCK_MEM => supported(s.mem_clock_mhz),
                _ => Err(ffi::ERROR_NOT_SUPPORTED),
            }
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: Handle,
    sensor: c_uint,
    temp: *mut c_uint,
) -> NvmlReturn {
    counts::count("nvmlDeviceGetTemperature");
    // SAFETY: forwarded contract.
    unsafe {
        answer(temp, |run| {
            let s = run.view(device)?.values;
            if sensor != ffi::TEMPERATURE_GPU {
                return Err(ffi::ERROR_INVALID_ARGUMENT);
            }
            supported(s.temperature_c)
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(device: Handle, power: *mut c_uint) -> NvmlReturn {
    counts::count("nvmlDeviceGetPowerUsage");
    // SAFETY: forwarded contract.
    unsafe { answer(power, |run| supported(run.view(device)?.values.power_mw)) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    device: Handle,
    energy: *mut c_ulonglong,
) -> NvmlReturn {
    counts::count("nvmlDeviceGetTotalEnergyConsumption");
    // SAFETY: forwarded contract.
    unsafe { answer(energy, |run| supported(run.view(device)?.values.energy_mj)) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device: Handle,
    reasons: *mut c_ulonglong,
) -> NvmlReturn {
    counts::count("nvmlDeviceGetCurrentClocksThrottleReasons");
    // SAFETY: forwarded contract.
    unsafe {
        answer(reasons, |run| {
            supported(run.view(device)?.values.throttle_mask())
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPcieThroughput(
    device: Handle,
    counter: c_uint,
    value: *mut c_uint,
) -> NvmlReturn {
    counts::count("nvmlDeviceGetPcieThroughput");
    // SAFETY: forwarded contract.
    unsafe {
        answer(value, |run| {
            let s = run.view(device)?.values;
            match counter {
                ffi::PCIE_UTIL_TX_BYTES => supported(s.pcie_tx_kbps),
                ffi::PCIE_UTIL_RX_BYTES => supported(s.pcie_rx_kbps),
                _ => Err(ffi::ERROR_INVALID_ARGUMENT),
            }
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPcieReplayCounter(
    device: Handle,
    value: *mut c_uint,
) -> NvmlReturn {
    counts::count("nvmlDeviceGetPcieReplayCounter");
    // SAFETY: forwarded contract.
    unsafe {
        answer(value, |run| {
            supported(run.view(device)?.values.pcie_replays)
        })
    }
}

/// `nvmlDevice{Compute,Graphics}RunningProcesses_v3`: `*count` in is the room in `infos`, out
/// the number of processes; too little room answers `NVML_ERROR_INSUFFICIENT_SIZE` with the
/// number needed (nvml-wrapper asks with 0 room first).
unsafe fn running_processes(
    device: Handle,
    count: *mut c_uint,
    infos: *mut ffi::ProcessInfo,
    graphics: bool,
) -> NvmlReturn {
    if count.is_null() {
        return ffi::ERROR_INVALID_ARGUMENT;
    }
    let listed = state::with_run(|run| {
        let processes = supported(run.view(device)?.values.processes.clone())?;
        Ok(processes
            .into_iter()
            .filter(|p| p.graphics == graphics)
            .collect::<Vec<_>>())
    });
    let processes = match listed {
        Ok(p) => p,
        Err(e) => return e,
    };
    // SAFETY: non-null, valid for reads and writes by contract.
    let room = unsafe { *count } as usize;
    // SAFETY: as above.
    unsafe { *count = processes.len() as c_uint };
    if processes.len() > room {
        return ffi::ERROR_INSUFFICIENT_SIZE;
    }
    if processes.is_empty() {
        return ffi::SUCCESS;
    }
    if infos.is_null() {
        return ffi::ERROR_INVALID_ARGUMENT;
    }
    for (i, p) in processes.iter().enumerate() {
        // SAFETY: `infos` holds `room` >= processes.len() entries by contract.
        unsafe {
            infos.add(i).write(ffi::ProcessInfo {
                pid: p.pid,
                used_gpu_memory: p.memory_bytes.unwrap_or(ffi::VALUE_NOT_AVAILABLE),
                gpu_instance_id: c_uint::MAX,
                compute_instance_id: c_uint::MAX,
            })
        };
    }
    ffi::SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: Handle,
    count: *mut c_uint,
    infos: *mut ffi::ProcessInfo,
) -> NvmlReturn {
    counts::count("nvmlDeviceGetComputeRunningProcesses_v3");
    // SAFETY: forwarded contract.
    unsafe { running_processes(device, count, infos, false) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: Handle,
    count: *mut c_uint,
    infos: *mut ffi::ProcessInfo,
) -> NvmlReturn {
    counts::count("nvmlDeviceGetGraphicsRunningProcesses_v3");
    // SAFETY: forwarded contract.
    unsafe { running_processes(device, count, infos, true) }
}

/// The PCIe link's current and maximum generation and width.
macro_rules! pcie_link {
    ($($name:ident => $field:ident),* $(,)?) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(device: Handle, value: *mut c_uint) -> NvmlReturn {
            counts::count(stringify!($name));
            // SAFETY: forwarded contract.
            unsafe { answer(value, |run| supported(run.view(device)?.values.$field)) }
        }
    )*};
}

pcie_link!(
    nvmlDeviceGetCurrPcieLinkGeneration => pcie_link_gen,
    nvmlDeviceGetMaxPcieLinkGeneration => pcie_link_max_gen,
    nvmlDeviceGetCurrPcieLinkWidth => pcie_link_width,
    nvmlDeviceGetMaxPcieLinkWidth => pcie_link_max_width,
);

/// One NVLink link's share of a GPU-wide total (link 0 takes the remainder), or the total for
/// scope `UINT_MAX`.
fn link_share(total: u64, links: u32, scope: c_uint) -> Option<u64> {
    if scope == c_uint::MAX {
        return Some(total);
    }
    if scope >= links {
        return None;
    }
    let share = total / u64::from(links);
    Some(if scope == 0 {
        total - share * u64::from(links - 1)
    } else {
        share
    })
}

fn field_value(
    v: &View<'_>,
    field_id: c_uint,
    scope: c_uint,
) -> Result<(c_uint, Value), NvmlReturn> {
    let s = v.values;
    let links = v.gpu.nvlink_links;
    let ull = |x: Option<u64>| {
        supported(x).map(|x| (ffi::VALUE_TYPE_UNSIGNED_LONG_LONG, Value { ull_val: x }))
    };
    let ui =
        |x: Option<u32>| supported(x).map(|x| (ffi::VALUE_TYPE_UNSIGNED_INT, Value { ui_val: x }));
    let nvlink = |x: Option<u64>| {
        if links == 0 {
            Err(ffi::ERROR_NOT_SUPPORTED)
        } else {
            ull(x)
        }
    };
    match field_id {
        field::ECC_SBE_VOL_TOTAL => ull(s.ecc_corrected_volatile),
        field::ECC_DBE_VOL_TOTAL => ull(s.ecc_uncorrected_volatile),
        field::ECC_SBE_AGG_TOTAL => ull(s.ecc_corrected_aggregate),
        field::ECC_DBE_AGG_TOTAL => ull(s.ecc_uncorrected_aggregate),
        field::NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL => nvlink(s.nvlink_crc_flit_errors),
        field::NVLINK_CRC_DATA_ERROR_COUNT_TOTAL => nvlink(s.nvlink_crc_data_errors),
        field::NVLINK_REPLAY_ERROR_COUNT_TOTAL => nvlink(s.nvlink_replay_errors),
        field::NVLINK_RECOVERY_ERROR_COUNT_TOTAL => nvlink(s.nvlink_recovery_errors),
        field::NVLINK_LINK_COUNT => ui(Some(links)),
        field::NVLINK_THROUGHPUT_DATA_TX => {
            nvlink(s.nvlink_tx_kib.and_then(|t| link_share(t, links, scope)))
        }
        field::NVLINK_THROUGHPUT_DATA_RX => {
            nvlink(s.nvlink_rx_kib.and_then(|t| link_share(t, links, scope)))
        }
        field::REMAPPED_COR => ui(s.remapped_rows_corrected),
        field::REMAPPED_UNC => ui(s.remapped_rows_uncorrected),
        field::REMAPPED_PENDING => ui(s.remap_pending.map(u32::from)),
        field::REMAPPED_FAILURE => ui(s.remap_failure.map(u32::from)),
        _ => Err(ffi::ERROR_NOT_SUPPORTED),
    }
}

/// Answers each requested field in place, with its own status; the call fails as a whole
/// only when the GPU does not answer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: Handle,
    values_count: c_int,
    values: *mut FieldValue,
) -> NvmlReturn {
    counts::count("nvmlDeviceGetFieldValues");
    let count = match usize::try_from(values_count) {
        Ok(n) if n > 0 && !values.is_null() => n,
        _ => return ffi::ERROR_INVALID_ARGUMENT,
    };
    // SAFETY: by contract `values` points to `values_count` entries the caller owns.
    let values = unsafe { std::slice::from_raw_parts_mut(values, count) };
    let now_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    status(state::with_run(|run| {
        let v = run.view(device)?;
        for fv in values.iter_mut() {
            fv.timestamp = now_us;
            fv.latency_usec = 0;
            match field_value(&v, fv.field_id, fv.scope_id) {
                Ok((value_type, value)) => {
                    fv.value_type = value_type;
                    fv.value = value;
                    fv.nvml_return = ffi::SUCCESS;
                }
                Err(e) => fv.nvml_return = e,
            }
        }
        Ok(())
    }))
}

// ---- Events ----

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: Handle,
    event_types: *mut c_ulonglong,
) -> NvmlReturn {
    counts::count("nvmlDeviceGetSupportedEventTypes");
    // SAFETY: forwarded contract.
    unsafe {
        answer(event_types, |run| {
            run.view(device)?;
            Ok(ffi::EVENT_TYPE_XID_CRITICAL_ERROR)
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut Handle) -> NvmlReturn {
    counts::count("nvmlEventSetCreate");
    // SAFETY: forwarded contract.
    unsafe { answer(set, |run| Ok(state::set_handle(run.create_set()))) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: Handle,
    event_types: c_ulonglong,
    set: Handle,
) -> NvmlReturn {
    counts::count("nvmlDeviceRegisterEvents");
    status(state::with_run(|run| {
        run.register(device, event_types, set)
    }))
}

/// Delivers the XIDs raised for the set's GPUs one by one, in order, each occurrence its own
/// event; waits up to `timeoutms` for one (without holding the replay's lock).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: Handle,
    data: *mut EventData,
    timeoutms: c_uint,
) -> NvmlReturn {
    counts::count("nvmlEventSetWait_v2");
    if data.is_null() {
        return ffi::ERROR_INVALID_ARGUMENT;
    }
    let queue = match state::with_run(|run| run.set(set)) {
        Ok(q) => q,
        Err(e) => return e,
    };
    match queue.wait(Duration::from_millis(u64::from(timeoutms))) {
        Some((gpu, xid)) => {
            // SAFETY: non-null and valid for a write by contract.
            unsafe {
                data.write(EventData {
                    device: state::device_handle(gpu),
                    event_type: ffi::EVENT_TYPE_XID_CRITICAL_ERROR,
                    event_data: xid,
                    gpu_instance_id: c_uint::MAX,
                    compute_instance_id: c_uint::MAX,
                })
            };
            ffi::SUCCESS
        }
        None => ffi::ERROR_TIMEOUT,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetFree(set: Handle) -> NvmlReturn {
    counts::count("nvmlEventSetFree");
    status(state::with_run(|run| run.free_set(set)))
}

// ---- GPM ----

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmQueryDeviceSupport(
    device: Handle,
    gpm_support: *mut GpmSupport,
) -> NvmlReturn {
    counts::count("nvmlGpmQueryDeviceSupport");
    if gpm_support.is_null() {
        return ffi::ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null and valid for reads by contract; the caller sets `version`.
    if unsafe { (*gpm_support).version } != ffi::GPM_SUPPORT_VERSION {
        return ffi::ERROR_ARGUMENT_VERSION_MISMATCH;
    }
    // SAFETY: forwarded contract.
    unsafe {
        answer(gpm_support, |run| {
            Ok(GpmSupport {
                version: ffi::GPM_SUPPORT_VERSION,
                is_supported_device: run.view(device)?.gpu.gpm_supported.into(),
            })
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleAlloc(gpm_sample: *mut Handle) -> NvmlReturn {
    counts::count("nvmlGpmSampleAlloc");
    // SAFETY: forwarded contract.
    unsafe {
        answer(gpm_sample, |run| {
            Ok(state::sample_handle(run.alloc_sample()))
        })
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleGet(device: Handle, gpm_sample: Handle) -> NvmlReturn {
    counts::count("nvmlGpmSampleGet");
    status(state::with_run(|run| run.take_sample(device, gpm_sample)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleFree(gpm_sample: Handle) -> NvmlReturn {
    counts::count("nvmlGpmSampleFree");
    status(state::with_run(|run| run.free_sample(gpm_sample)))
}

/// Names and units the stand-in reports for each metric it knows.
fn metric_info(metric_id: c_uint) -> (&'static CStr, &'static CStr, &'static CStr) {
    match metric_id {
        1 => (c"graphics_util", c"Graphics utilization", c"%"),
        2 => (c"sm_util", c"SM utilization", c"%"),
        3 => (c"sm_occupancy", c"SM occupancy", c"%"),
        4 => (c"integer_util", c"Integer pipe utilization", c"%"),
        5 => (c"any_tensor_util", c"Tensor pipe utilization", c"%"),
        6 => (c"dfma_tensor_util", c"DFMA tensor utilization", c"%"),
        7 => (c"hmma_tensor_util", c"HMMA tensor utilization", c"%"),
        9 => (c"imma_tensor_util", c"IMMA tensor utilization", c"%"),
        10 => (c"dram_bw_util", c"DRAM bandwidth utilization", c"%"),
        11 => (c"fp64_util", c"FP64 pipe utilization", c"%"),
        12 => (c"fp32_util", c"FP32 pipe utilization", c"%"),
        13 => (c"fp16_util", c"FP16 pipe utilization", c"%"),
        20 => (c"pcie_tx_per_sec", c"PCIe transmit bandwidth", c"MiB/s"),
        21 => (c"pcie_rx_per_sec", c"PCIe receive bandwidth", c"MiB/s"),
        60 => (
            c"nvlink_total_rx_per_sec",
            c"NVLink receive bandwidth",
            c"MiB/s",
        ),
        61 => (
            c"nvlink_total_tx_per_sec",
            c"NVLink transmit bandwidth",
            c"MiB/s",
        ),
        _ => (c"", c"", c""),
    }
}

/// The metrics over the interval ending at `sample2`'s step, as that step of the script
/// gives them; a metric the step does not give answers `NVML_ERROR_NOT_SUPPORTED`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmMetricsGet(metrics_get: *mut GpmMetricsGet) -> NvmlReturn {
    counts::count("nvmlGpmMetricsGet");
    if metrics_get.is_null() {
        return ffi::ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null and valid for reads by contract.
    let (version, count, sample1, sample2) = unsafe {
        let r = &*metrics_get;
        (r.version, r.num_metrics, r.sample1, r.sample2)
    };
    if version != ffi::GPM_METRICS_GET_VERSION {
        return ffi::ERROR_ARGUMENT_VERSION_MISMATCH;
    }
    if count > ffi::GPM_METRIC_MAX {
        return ffi::ERROR_INVALID_ARGUMENT;
    }
    let gpm = state::with_run(|run| {
        let (a, b) = (run.sample(sample1)?, run.sample(sample2)?);
        if a.gpu != b.gpu {
            return Err(ffi::ERROR_INVALID_ARGUMENT);
        }
        // NVML documents that the two samples must be more than 100 ms apart; what it
        // answers otherwise is not meaningful, so the stand-in refuses and reports it.
        let spacing = b.taken.max(a.taken) - b.taken.min(a.taken);
        if spacing <= state::GPM_MIN_SPACING {
            state::report_breach(&format!(
                "nvmlGpmMetricsGet: GPU {} samples {:.1} ms apart; NVML documents more than {} ms",
                b.gpu,
                spacing.as_secs_f64() * 1e3,
                state::GPM_MIN_SPACING.as_millis()
            ));
            return Err(ffi::ERROR_INVALID_ARGUMENT);
        }
        Ok(run.trace.gpus[b.gpu].at(b.step).gpm.clone())
    });
    let gpm = match gpm {
        Ok(g) => g,
        Err(e) => return e,
    };
    // SAFETY: the request is followed by at least `num_metrics` entries (checked against the
    // header's maximum above); we only touch those.
    let metrics = unsafe { std::ptr::addr_of_mut!((*metrics_get).metrics).cast::<GpmMetric>() };
    for i in 0..count as usize {
        // SAFETY: i < num_metrics, see above.
        let m = unsafe { &mut *metrics.add(i) };
        let (short, long, unit) = metric_info(m.metric_id);
        m.metric_info = ffi::GpmMetricInfo {
            short_name: short.as_ptr(),
            long_name: long.as_ptr(),
            unit: unit.as_ptr(),
        };
        match gpm.as_ref().and_then(|g| g.get(m.metric_id)) {
            Some(value) => {
                m.value = value;
                m.nvml_return = ffi::SUCCESS;
            }
            None => {
                m.value = 0.0;
                m.nvml_return = ffi::ERROR_NOT_SUPPORTED;
            }
        }
    }
    ffi::SUCCESS
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[test]
    fn per_link_nvlink_counters_add_up_to_the_scripted_total() {
        for (total, links) in [(1_000_000_007_u64, 18_u32), (17, 18), (5, 1)] {
            let sum: u64 = (0..links)
                .map(|l| link_share(total, links, l).unwrap())
                .sum();
            assert_eq!(sum, total, "{links} links");
            assert_eq!(link_share(total, links, c_uint::MAX), Some(total));
            assert_eq!(link_share(total, links, links), None);
        }
    }

    /// The only test here that drives the replay itself (it is one per process).
    #[test]
    fn an_event_wait_times_out_then_delivers_each_raised_xid_once() {
        let trace = script::Script::parse(
            r#"{"gpus": [{"name": "n", "uuid": "GPU-a", "xids": [
                {"step": 1, "xid": 43}, {"step": 1, "xid": 43}, {"step": 2, "xid": 13}]}]}"#,
        )
        .unwrap();
        assert_eq!(state::init(|| Ok(trace)), ffi::SUCCESS);
        let mut set: Handle = std::ptr::null_mut();
        let mut device: Handle = std::ptr::null_mut();
        let mut utilization = Utilization { gpu: 0, memory: 0 };
        let mut data = EventData {
            device: std::ptr::null_mut(),
            event_type: 0,
            event_data: 0,
            gpu_instance_id: 0,
            compute_instance_id: 0,
        };
        // SAFETY: every pointer passed is to a live local of the right type.
        unsafe {
            assert_eq!(nvmlEventSetCreate(&mut set), ffi::SUCCESS);
            assert_eq!(nvmlDeviceGetHandleByIndex_v2(0, &mut device), ffi::SUCCESS);
            assert_eq!(nvmlDeviceRegisterEvents(device, 0x8, set), ffi::SUCCESS);

            let start = Instant::now();
            assert_eq!(nvmlEventSetWait_v2(set, &mut data, 60), ffi::ERROR_TIMEOUT);
            assert!(start.elapsed() >= Duration::from_millis(60));

            // Steps 0 and 1: the script gives no utilization, the step still advances.
            for _ in 0..2 {
                let r = nvmlDeviceGetUtilizationRates(device, &mut utilization);
                assert_eq!(r, ffi::ERROR_NOT_SUPPORTED);
            }
            for _ in 0..2 {
                assert_eq!(nvmlEventSetWait_v2(set, &mut data, 0), ffi::SUCCESS);
                assert_eq!(
                    (data.device, data.event_type, data.event_data),
                    (device, 0x8, 43)
                );
            }
            assert_eq!(nvmlEventSetWait_v2(set, &mut data, 0), ffi::ERROR_TIMEOUT);
            assert_eq!(nvmlEventSetFree(set), ffi::SUCCESS);
            assert_eq!(nvmlShutdown(), ffi::SUCCESS);
            assert_eq!(nvmlShutdown(), ffi::ERROR_UNINITIALIZED);
        }
    }
}
