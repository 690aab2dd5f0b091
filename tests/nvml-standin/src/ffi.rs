//! The C types and constants of NVML's public header (`nvml.h`) that the stand-in's exports
//! take and fill, written out by hand from NVIDIA's API reference. Layouts must match what
//! nvml-wrapper-sys passes, field for field.

use std::ffi::{c_char, c_int, c_longlong, c_uint, c_ulong, c_ulonglong, c_ushort, c_void};

/// `nvmlReturn_t`.
pub type NvmlReturn = c_uint;

pub const SUCCESS: NvmlReturn = 0;
pub const ERROR_UNINITIALIZED: NvmlReturn = 1;
pub const ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
pub const ERROR_NOT_SUPPORTED: NvmlReturn = 3;
pub const ERROR_NOT_FOUND: NvmlReturn = 6;
pub const ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
pub const ERROR_DRIVER_NOT_LOADED: NvmlReturn = 9;
pub const ERROR_TIMEOUT: NvmlReturn = 10;
pub const ERROR_GPU_IS_LOST: NvmlReturn = 15;
pub const ERROR_ARGUMENT_VERSION_MISMATCH: NvmlReturn = 25;
pub const ERROR_UNKNOWN: NvmlReturn = 999;

/// `nvmlDevice_t`, `nvmlEventSet_t`, `nvmlGpmSample_t`: opaque pointers. The stand-in hands
/// out tagged addresses that it never dereferences (see `state`).
pub type Handle = *mut c_void;

/// `nvmlClockType_t`.
pub const CLOCK_SM: c_uint = 1;
pub const CLOCK_MEM: c_uint = 2;

/// `nvmlTemperatureSensors_t`.
pub const TEMPERATURE_GPU: c_uint = 0;

/// `nvmlPcieUtilCounter_t`.
pub const PCIE_UTIL_TX_BYTES: c_uint = 0;
pub const PCIE_UTIL_RX_BYTES: c_uint = 1;

/// `nvmlEventTypeXidCriticalError`.
pub const EVENT_TYPE_XID_CRITICAL_ERROR: c_ulonglong = 0x8;

/// `nvmlValueType_t`.
pub const VALUE_TYPE_UNSIGNED_INT: c_uint = 1;
pub const VALUE_TYPE_UNSIGNED_LONG_LONG: c_uint = 3;

/// `NVML_GPM_SUPPORT_VERSION`, `NVML_GPM_METRICS_GET_VERSION`.
pub const GPM_SUPPORT_VERSION: c_uint = 1;
pub const GPM_METRICS_GET_VERSION: c_uint = 1;
/// `NVML_GPM_METRIC_MAX`: the length of `nvmlGpmMetricsGet_t.metrics` in current headers
/// (older headers had 98; the stand-in only touches the first `numMetrics` entries).
pub const GPM_METRIC_MAX: c_uint = 210;

/// `nvmlUtilization_t`.
#[repr(C)]
pub struct Utilization {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// `nvmlPciInfo_t` (what `nvmlDeviceGetPciInfo_v3` fills).
#[repr(C)]
pub struct PciInfo {
    pub bus_id_legacy: [c_char; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pci_device_id: c_uint,
    pub pci_sub_system_id: c_uint,
    pub bus_id: [c_char; 32],
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct MemoryV2 {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlProcessInfo_t` (`nvmlProcessInfo_v2_t`), what the `_v3` process lists fill.
#[repr(C)]
pub struct ProcessInfo {
    pub pid: c_uint,
    pub used_gpu_memory: c_ulonglong,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

/// `NVML_VALUE_NOT_AVAILABLE` (as an unsigned long long): memory use not known.
pub const VALUE_NOT_AVAILABLE: c_ulonglong = c_ulonglong::MAX;

/// `nvmlMemory_v2`: `NVML_STRUCT_VERSION(Memory, 2)`, size in the low bits, version in the top
/// byte.
pub const MEMORY_V2_VERSION: c_uint = (size_of::<MemoryV2>() as c_uint) | (2 << 24);

/// `nvmlValue_t`.
#[repr(C)]
pub union Value {
    pub d_val: f64,
    pub si_val: c_int,
    pub ui_val: c_uint,
    pub ul_val: c_ulong,
    pub ull_val: c_ulonglong,
    pub sll_val: c_longlong,
    pub us_val: c_ushort,
}

/// `nvmlFieldValue_t`.
#[repr(C)]
pub struct FieldValue {
    pub field_id: c_uint,
    pub scope_id: c_uint,
    pub timestamp: c_longlong,
    pub latency_usec: c_longlong,
    pub value_type: c_uint,
    pub nvml_return: NvmlReturn,
    pub value: Value,
}

/// Field ids (`NVML_FI_*`) the stand-in answers.
pub mod field {
    use std::ffi::c_uint;

    pub const ECC_SBE_VOL_TOTAL: c_uint = 3;
    pub const ECC_DBE_VOL_TOTAL: c_uint = 4;
    pub const ECC_SBE_AGG_TOTAL: c_uint = 5;
    pub const ECC_DBE_AGG_TOTAL: c_uint = 6;
    pub const NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: c_uint = 38;
    pub const NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: c_uint = 45;
    pub const NVLINK_REPLAY_ERROR_COUNT_TOTAL: c_uint = 52;
    pub const NVLINK_RECOVERY_ERROR_COUNT_TOTAL: c_uint = 59;
    pub const NVLINK_LINK_COUNT: c_uint = 91;
    pub const NVLINK_THROUGHPUT_DATA_TX: c_uint = 138;
    pub const NVLINK_THROUGHPUT_DATA_RX: c_uint = 139;
    pub const REMAPPED_COR: c_uint = 142;
    pub const REMAPPED_UNC: c_uint = 143;
    pub const REMAPPED_PENDING: c_uint = 144;
    pub const REMAPPED_FAILURE: c_uint = 145;
}

/// `nvmlEventData_t`.
#[repr(C)]
pub struct EventData {
    pub device: Handle,
    pub event_type: c_ulonglong,
    pub event_data: c_ulonglong,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

/// `nvmlGpmSupport_t`.
#[repr(C)]
pub struct GpmSupport {
    pub version: c_uint,
    pub is_supported_device: c_uint,
}

/// `nvmlGpmMetric_t.metricInfo`.
#[repr(C)]
pub struct GpmMetricInfo {
    pub short_name: *const c_char,
    pub long_name: *const c_char,
    pub unit: *const c_char,
}

/// `nvmlGpmMetric_t`.
#[repr(C)]
pub struct GpmMetric {
    pub metric_id: c_uint,
    pub nvml_return: NvmlReturn,
    pub value: f64,
    pub metric_info: GpmMetricInfo,
}

/// `nvmlGpmMetricsGet_t` up to its `metrics` array, whose length differs between header
/// versions: the entries are reached through a pointer to the zero-length tail.
#[repr(C)]
pub struct GpmMetricsGet {
    pub version: c_uint,
    pub num_metrics: c_uint,
    pub sample1: Handle,
    pub sample2: Handle,
    pub metrics: [GpmMetric; 0],
}

/// nvml-wrapper-sys's `nvmlFieldValue_t` is 40 bytes on LP64; `nvmlGpmMetric_t` is 40.
const _: () = assert!(size_of::<FieldValue>() == 40);
const _: () = assert!(size_of::<GpmMetric>() == 40);
const _: () = assert!(std::mem::offset_of!(GpmMetricsGet, metrics) == 24);
const _: () = assert!(size_of::<EventData>() == 32);
