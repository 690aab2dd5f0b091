//! What is read from NVML besides the per-query metrics: GPM metrics, throttle reasons, and
//! the counters and flags of the batched field-value call, each with its series name.

use nvml_wrapper::{
    bitmasks::device::ThrottleReasons, enums::gpm::GpmMetricId, sys_exports::field_id::*,
};

/// GPM utilizations, which NVML gives in percent, reported as 0-1 ratios.
pub(super) const GPM_RATIOS: [(GpmMetricId, &str); 11] = [
    (GpmMetricId::SmUtil, "railscope_gpu_sm_util_ratio"),
    (GpmMetricId::SmOccupancy, "railscope_gpu_sm_occupancy_ratio"),
    (GpmMetricId::IntegerUtil, "railscope_gpu_integer_util_ratio"),
    (
        GpmMetricId::AnyTensorUtil,
        "railscope_gpu_tensor_util_ratio",
    ),
    (
        GpmMetricId::DfmaTensorUtil,
        "railscope_gpu_tensor_dfma_util_ratio",
    ),
    (
        GpmMetricId::HmmaTensorUtil,
        "railscope_gpu_tensor_hmma_util_ratio",
    ),
    (
        GpmMetricId::ImmaTensorUtil,
        "railscope_gpu_tensor_imma_util_ratio",
    ),
    (GpmMetricId::Fp64Util, "railscope_gpu_fp64_util_ratio"),
    (GpmMetricId::Fp32Util, "railscope_gpu_fp32_util_ratio"),
    (GpmMetricId::Fp16Util, "railscope_gpu_fp16_util_ratio"),
    (GpmMetricId::DramBwUtil, "railscope_gpu_dram_bw_util_ratio"),
];

/// GPM bandwidths, which NVML gives in MiB/s, reported in bytes per second.
pub(super) const GPM_RATES: [(GpmMetricId, &str); 4] = [
    (
        GpmMetricId::PcieTxPerSec,
        "railscope_gpu_gpm_pcie_tx_bytes_per_second",
    ),
    (
        GpmMetricId::PcieRxPerSec,
        "railscope_gpu_gpm_pcie_rx_bytes_per_second",
    ),
    (
        GpmMetricId::NvlinkTotalTxPerSec,
        "railscope_gpu_gpm_nvlink_tx_bytes_per_second",
    ),
    (
        GpmMetricId::NvlinkTotalRxPerSec,
        "railscope_gpu_gpm_nvlink_rx_bytes_per_second",
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
        "railscope_gpu_ecc_errors_total",
        &[("type", "corrected"), ("scope", "volatile")],
    ),
    field_counter(
        NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
        "railscope_gpu_ecc_errors_total",
        &[("type", "uncorrected"), ("scope", "volatile")],
    ),
    field_counter(
        NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
        "railscope_gpu_ecc_errors_total",
        &[("type", "corrected"), ("scope", "aggregate")],
    ),
    field_counter(
        NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
        "railscope_gpu_ecc_errors_total",
        &[("type", "uncorrected"), ("scope", "aggregate")],
    ),
    field_counter(
        NVML_FI_DEV_REMAPPED_COR,
        "railscope_gpu_remapped_rows_total",
        &[("type", "corrected")],
    ),
    field_counter(
        NVML_FI_DEV_REMAPPED_UNC,
        "railscope_gpu_remapped_rows_total",
        &[("type", "uncorrected")],
    ),
    field_counter(
        NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
        "railscope_gpu_nvlink_errors_total",
        &[("type", "crc_flit")],
    ),
    field_counter(
        NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
        "railscope_gpu_nvlink_errors_total",
        &[("type", "crc_data")],
    ),
    field_counter(
        NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
        "railscope_gpu_nvlink_errors_total",
        &[("type", "replay")],
    ),
    field_counter(
        NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
        "railscope_gpu_nvlink_errors_total",
        &[("type", "recovery")],
    ),
];

/// 0/1 gauges read through the same call.
pub(super) const FIELD_FLAGS: [(u32, &str); 2] = [
    (
        NVML_FI_DEV_REMAPPED_PENDING,
        "railscope_gpu_row_remap_pending",
    ),
    (
        NVML_FI_DEV_REMAPPED_FAILURE,
        "railscope_gpu_row_remap_failed",
    ),
];
