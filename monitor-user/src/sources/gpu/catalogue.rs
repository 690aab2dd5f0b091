//! What is read from NVML besides the per-query metrics: GPM metrics, throttle reasons, and
//! the counters and flags of the batched field-value call, each with its series name.

use monitor_wire::names::metric;
use nvml_wrapper::{
    bitmasks::device::ThrottleReasons, enums::gpm::GpmMetricId, sys_exports::field_id::*,
};

/// GPM utilizations, which NVML gives in percent, reported as 0-1 ratios.
pub(super) const GPM_RATIOS: [(GpmMetricId, &str); 11] = [
    (GpmMetricId::SmUtil, metric::GPU_SM_UTIL_RATIO),
    (GpmMetricId::SmOccupancy, metric::GPU_SM_OCCUPANCY_RATIO),
    (GpmMetricId::IntegerUtil, metric::GPU_INTEGER_UTIL_RATIO),
    (GpmMetricId::AnyTensorUtil, metric::GPU_TENSOR_UTIL_RATIO),
    (
        GpmMetricId::DfmaTensorUtil,
        metric::GPU_TENSOR_DFMA_UTIL_RATIO,
    ),
    (
        GpmMetricId::HmmaTensorUtil,
        metric::GPU_TENSOR_HMMA_UTIL_RATIO,
    ),
    (
        GpmMetricId::ImmaTensorUtil,
        metric::GPU_TENSOR_IMMA_UTIL_RATIO,
    ),
    (GpmMetricId::Fp64Util, metric::GPU_FP64_UTIL_RATIO),
    (GpmMetricId::Fp32Util, metric::GPU_FP32_UTIL_RATIO),
    (GpmMetricId::Fp16Util, metric::GPU_FP16_UTIL_RATIO),
    (GpmMetricId::DramBwUtil, metric::GPU_DRAM_BW_UTIL_RATIO),
];

/// GPM bandwidths, which NVML gives in MiB/s, reported in bytes per second.
pub(super) const GPM_RATES: [(GpmMetricId, &str); 4] = [
    (
        GpmMetricId::PcieTxPerSec,
        metric::GPU_GPM_PCIE_TX_BYTES_PER_SECOND,
    ),
    (
        GpmMetricId::PcieRxPerSec,
        metric::GPU_GPM_PCIE_RX_BYTES_PER_SECOND,
    ),
    (
        GpmMetricId::NvlinkTotalTxPerSec,
        metric::GPU_GPM_NVLINK_TX_BYTES_PER_SECOND,
    ),
    (
        GpmMetricId::NvlinkTotalRxPerSec,
        metric::GPU_GPM_NVLINK_RX_BYTES_PER_SECOND,
    ),
];

#[derive(Clone, Copy)]
pub(super) enum GpmUnit {
    Percent,
    MibPerSec,
}

/// Clock event (throttle) reasons, one 0/1 gauge each.
pub(super) const THROTTLE_REASONS: [(ThrottleReasons, &str); 9] = [
    (ThrottleReasons::GPU_IDLE, "gpu_idle"),
    (
        ThrottleReasons::APPLICATIONS_CLOCKS_SETTING,
        "applications_clocks_setting",
    ),
    (ThrottleReasons::SW_POWER_CAP, "sw_power_cap"),
    (ThrottleReasons::HW_SLOWDOWN, "hw_slowdown"),
    (ThrottleReasons::SYNC_BOOST, "sync_boost"),
    (ThrottleReasons::SW_THERMAL_SLOWDOWN, "sw_thermal_slowdown"),
    (ThrottleReasons::HW_THERMAL_SLOWDOWN, "hw_thermal_slowdown"),
    (
        ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN,
        "hw_power_brake_slowdown",
    ),
    (
        ThrottleReasons::DISPLAY_CLOCK_SETTING,
        "display_clock_setting",
    ),
];

/// A cumulative counter read through the batched field-value call (scope 0).
pub(super) struct FieldCounter {
    pub(super) id: u32,
    pub(super) name: &'static str,
    /// The labels that tell the counters of one series apart.
    pub(super) labels: &'static [(&'static str, &'static str)],
}

pub(super) const fn field_counter(
    id: u32,
    name: &'static str,
    labels: &'static [(&'static str, &'static str)],
) -> FieldCounter {
    FieldCounter { id, name, labels }
}

/// None of these ids is in the 251-273 range that drivers >= 580.82 renumbered, so they mean
/// the same for every driver.
pub(super) const FIELD_COUNTERS: [FieldCounter; 10] = [
    field_counter(
        NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
        metric::GPU_ECC_ERRORS_TOTAL,
        &[("type", "corrected"), ("scope", "volatile")],
    ),
    field_counter(
        NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
        metric::GPU_ECC_ERRORS_TOTAL,
        &[("type", "uncorrected"), ("scope", "volatile")],
    ),
    field_counter(
        NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
        metric::GPU_ECC_ERRORS_TOTAL,
        &[("type", "corrected"), ("scope", "aggregate")],
    ),
    field_counter(
        NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
        metric::GPU_ECC_ERRORS_TOTAL,
        &[("type", "uncorrected"), ("scope", "aggregate")],
    ),
    field_counter(
        NVML_FI_DEV_REMAPPED_COR,
        metric::GPU_REMAPPED_ROWS_TOTAL,
        &[("type", "corrected")],
    ),
    field_counter(
        NVML_FI_DEV_REMAPPED_UNC,
        metric::GPU_REMAPPED_ROWS_TOTAL,
        &[("type", "uncorrected")],
    ),
    field_counter(
        NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
        metric::GPU_NVLINK_ERRORS_TOTAL,
        &[("type", "crc_flit")],
    ),
    field_counter(
        NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
        metric::GPU_NVLINK_ERRORS_TOTAL,
        &[("type", "crc_data")],
    ),
    field_counter(
        NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
        metric::GPU_NVLINK_ERRORS_TOTAL,
        &[("type", "replay")],
    ),
    field_counter(
        NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
        metric::GPU_NVLINK_ERRORS_TOTAL,
        &[("type", "recovery")],
    ),
];

/// 0/1 gauges read through the same call.
pub(super) const FIELD_FLAGS: [(u32, &str); 2] = [
    (NVML_FI_DEV_REMAPPED_PENDING, metric::GPU_ROW_REMAP_PENDING),
    (NVML_FI_DEV_REMAPPED_FAILURE, metric::GPU_ROW_REMAP_FAILED),
];
