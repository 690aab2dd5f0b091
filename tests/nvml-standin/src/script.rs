//! The trace the stand-in replays: a JSON script describing N GPUs and, per step, the values
//! NVML would report for each. See `docs/nvml-standin.md` for the format.
//!
//! A step only lists what changes: every value carries over from the previous step (step 0
//! starts from the script's `defaults`). A value never given makes its NVML call answer
//! `NVML_ERROR_NOT_SUPPORTED`, as a GPU without that feature would. Counters (energy, ECC,
//! replays, NVLink bytes and errors) are given as cumulative values.

use std::{collections::HashSet, ffi::CString, path::Path};

use serde::Deserialize;

/// Why a script cannot be replayed.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid stand-in script: {0}")]
    Json(#[from] serde_json::Error),
    #[error("invalid stand-in script: {0}")]
    Invalid(String),
}

/// The script as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    /// What `nvmlSystemGetDriverVersion` answers.
    #[serde(default = "default_driver_version")]
    pub driver_version: String,
    /// Values every GPU starts step 0 with.
    #[serde(default)]
    pub defaults: Step,
    pub gpus: Vec<GpuScript>,
}

fn default_driver_version() -> String {
    "550.90.07".into()
}

/// One GPU of the trace.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuScript {
    pub name: String,
    pub uuid: String,
    /// Whether `nvmlGpmQueryDeviceSupport` says yes (Hopper and newer).
    #[serde(default)]
    pub gpm_supported: bool,
    /// NVLink links (`NVML_FI_DEV_NVLINK_LINK_COUNT`); 0 = no NVLink.
    #[serde(default)]
    pub nvlink_links: u32,
    /// Its PCI address, `DDDD:BB:DD.F` or NVML's `DDDDDDDD:BB:DD.F`
    /// (`nvmlDeviceGetPciInfo_v3`; absent: `NVML_ERROR_NOT_SUPPORTED`).
    #[serde(default)]
    pub pci_bus_id: Option<String>,
    /// `nvmlDeviceGetVbiosVersion` (absent: `NVML_ERROR_NOT_SUPPORTED`).
    #[serde(default)]
    pub vbios_version: Option<String>,
    /// `nvmlDeviceGetSerial` (absent: `NVML_ERROR_NOT_SUPPORTED`).
    #[serde(default)]
    pub serial: Option<String>,
    /// From this step on, every call about this GPU returns `NVML_ERROR_GPU_IS_LOST`.
    #[serde(default)]
    pub lost_at_step: Option<u64>,
    /// From this step on, every call about this GPU returns `NVML_ERROR_UNKNOWN`.
    #[serde(default)]
    pub error_from_step: Option<u64>,
    /// With `error_from_step`: from this step on the GPU answers again (a GPU that fails for
    /// a while and comes back).
    #[serde(default)]
    pub error_until_step: Option<u64>,
    /// XID errors raised when the GPU reaches the given step, in order.
    #[serde(default)]
    pub xids: Vec<XidAt>,
    #[serde(default)]
    pub steps: Vec<Step>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct XidAt {
    pub step: u64,
    pub xid: u64,
}

/// The values of one step; absent fields carry over from the step before.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    pub gpu_util_pct: Option<u32>,
    pub mem_util_pct: Option<u32>,
    pub memory_total_bytes: Option<u64>,
    pub memory_reserved_bytes: Option<u64>,
    pub memory_used_bytes: Option<u64>,
    pub sm_clock_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    pub temperature_c: Option<u32>,
    pub power_mw: Option<u32>,
    pub energy_mj: Option<u64>,
    pub ecc_corrected_volatile: Option<u64>,
    pub ecc_uncorrected_volatile: Option<u64>,
    pub ecc_corrected_aggregate: Option<u64>,
    pub ecc_uncorrected_aggregate: Option<u64>,
    pub remapped_rows_corrected: Option<u32>,
    pub remapped_rows_uncorrected: Option<u32>,
    pub remap_pending: Option<bool>,
    pub remap_failure: Option<bool>,
    /// Active clock-event (throttle) reasons by name, see [`THROTTLE_REASONS`].
    pub throttle_reasons: Option<Vec<String>>,
    /// PCIe throughput as NVML reports it, KB/s over its last 20 ms window.
    pub pcie_tx_kbps: Option<u32>,
    pub pcie_rx_kbps: Option<u32>,
    pub pcie_replays: Option<u32>,
    /// PCIe link: current and maximum generation and width (lanes).
    pub pcie_link_gen: Option<u32>,
    pub pcie_link_max_gen: Option<u32>,
    pub pcie_link_width: Option<u32>,
    pub pcie_link_max_width: Option<u32>,
    /// Cumulative NVLink data KiB over all links (split evenly per link for per-link reads).
    pub nvlink_tx_kib: Option<u64>,
    pub nvlink_rx_kib: Option<u64>,
    pub nvlink_crc_flit_errors: Option<u64>,
    pub nvlink_crc_data_errors: Option<u64>,
    pub nvlink_replay_errors: Option<u64>,
    pub nvlink_recovery_errors: Option<u64>,
    /// GPM metrics over the interval ending at this step; replaces the previous step's set.
    pub gpm: Option<GpmValues>,
    /// The processes running on the GPU (`nvmlDeviceGet{Compute,Graphics}RunningProcesses_v3`);
    /// replaces the previous step's list as a whole (`[]`: none).
    pub processes: Option<Vec<GpuProcess>>,
}

/// A process using a GPU, as NVML lists it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuProcess {
    pub pid: u32,
    /// GPU memory it uses (`usedGpuMemory`); absent: NVML's "not available".
    #[serde(default)]
    pub memory_bytes: Option<u64>,
    /// Listed by the graphics call instead of the compute call.
    #[serde(default)]
    pub graphics: bool,
}

/// GPM metric values as `nvmlGpmMetricsGet` reports them: utilizations in percent (0-100),
/// bandwidths in MiB/s.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpmValues {
    pub graphics_util: Option<f64>,
    pub sm_util: Option<f64>,
    pub sm_occupancy: Option<f64>,
    pub integer_util: Option<f64>,
    pub any_tensor_util: Option<f64>,
    pub dfma_tensor_util: Option<f64>,
    pub hmma_tensor_util: Option<f64>,
    pub imma_tensor_util: Option<f64>,
    pub dram_bw_util: Option<f64>,
    pub fp64_util: Option<f64>,
    pub fp32_util: Option<f64>,
    pub fp16_util: Option<f64>,
    pub pcie_tx_per_sec: Option<f64>,
    pub pcie_rx_per_sec: Option<f64>,
    pub nvlink_total_rx_per_sec: Option<f64>,
    pub nvlink_total_tx_per_sec: Option<f64>,
}

impl GpmValues {
    /// The value scripted for an `nvmlGpmMetricId_t`, if any.
    pub fn get(&self, metric_id: u32) -> Option<f64> {
        match metric_id {
            1 => self.graphics_util,
            2 => self.sm_util,
            3 => self.sm_occupancy,
            4 => self.integer_util,
            5 => self.any_tensor_util,
            6 => self.dfma_tensor_util,
            7 => self.hmma_tensor_util,
            9 => self.imma_tensor_util,
            10 => self.dram_bw_util,
            11 => self.fp64_util,
            12 => self.fp32_util,
            13 => self.fp16_util,
            20 => self.pcie_tx_per_sec,
            21 => self.pcie_rx_per_sec,
            60 => self.nvlink_total_rx_per_sec,
            61 => self.nvlink_total_tx_per_sec,
            _ => None,
        }
    }
}

/// Throttle (clock event) reason names and their `nvmlClocksEventReason*` bits.
pub const THROTTLE_REASONS: [(&str, u64); 9] = [
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
];

impl Step {
    /// This step laid over `base`: a field given here replaces the base's.
    fn over(&self, base: &Step) -> Step {
        macro_rules! pick {
            ($($f:ident),* $(,)?) => {
                Step { $($f: self.$f.clone().or_else(|| base.$f.clone()),)* }
            };
        }
        pick!(
            gpu_util_pct,
            mem_util_pct,
            memory_total_bytes,
            memory_reserved_bytes,
            memory_used_bytes,
            sm_clock_mhz,
            mem_clock_mhz,
            temperature_c,
            power_mw,
            energy_mj,
            ecc_corrected_volatile,
            ecc_uncorrected_volatile,
            ecc_corrected_aggregate,
            ecc_uncorrected_aggregate,
            remapped_rows_corrected,
            remapped_rows_uncorrected,
            remap_pending,
            remap_failure,
            throttle_reasons,
            pcie_tx_kbps,
            pcie_rx_kbps,
            pcie_replays,
            pcie_link_gen,
            pcie_link_max_gen,
            pcie_link_width,
            pcie_link_max_width,
            nvlink_tx_kib,
            nvlink_rx_kib,
            nvlink_crc_flit_errors,
            nvlink_crc_data_errors,
            nvlink_replay_errors,
            nvlink_recovery_errors,
            gpm,
            processes,
        )
    }

    /// The throttle reasons as NVML's bitmask.
    pub fn throttle_mask(&self) -> Option<u64> {
        self.throttle_reasons.as_ref().map(|names| {
            names
                .iter()
                .filter_map(|n| THROTTLE_REASONS.iter().find(|(r, _)| r == n))
                .fold(0, |mask, (_, bit)| mask | bit)
        })
    }
}

/// A script ready to replay: every step complete, strings as C strings.
#[derive(Debug)]
pub struct Trace {
    pub driver_version: CString,
    pub gpus: Vec<GpuTrace>,
}

#[derive(Debug)]
pub struct GpuTrace {
    pub name: CString,
    pub uuid: CString,
    pub gpm_supported: bool,
    pub nvlink_links: u32,
    pub pci: Option<PciBusId>,
    pub vbios_version: Option<CString>,
    pub serial: Option<CString>,
    pub lost_at_step: Option<u64>,
    pub error_from_step: Option<u64>,
    pub error_until_step: Option<u64>,
    pub xids: Vec<XidAt>,
    /// At least one step; steps past the end repeat the last one.
    steps: Vec<Step>,
}

impl GpuTrace {
    pub fn at(&self, step: u64) -> &Step {
        let last = self.steps.len() - 1;
        &self.steps[usize::try_from(step).map_or(last, |s| s.min(last))]
    }
}

/// A PCI address, as `nvmlPciInfo_t` holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PciBusId {
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub function: u32,
}

impl PciBusId {
    /// `DDDD:BB:DD.F`, the domain of up to 8 hex digits.
    pub fn parse(text: &str) -> Option<Self> {
        let (domain, rest) = text.split_once(':')?;
        let (bus, rest) = rest.split_once(':')?;
        let (device, function) = rest.split_once('.')?;
        let hex = |s: &str, max: usize| {
            (!s.is_empty() && s.len() <= max)
                .then(|| u32::from_str_radix(s, 16).ok())
                .flatten()
        };
        Some(Self {
            domain: hex(domain, 8)?,
            bus: hex(bus, 2)?,
            device: hex(device, 2)?,
            function: hex(function, 1)?,
        })
    }

    /// NVML's `busId`: `%08X:%02X:%02X.%X`.
    pub fn bus_id(&self) -> String {
        format!(
            "{:08X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }

    /// NVML's `busIdLegacy`: `%04X:%02X:%02X.%X`.
    pub fn bus_id_legacy(&self) -> String {
        format!(
            "{:04X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

/// GPUs one script may describe (NVML handles at most 64 per node in practice).
pub const MAX_GPUS: usize = 64;

impl Script {
    pub fn load(path: &Path) -> Result<Trace, ScriptError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScriptError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text)
    }

    pub fn parse(text: &str) -> Result<Trace, ScriptError> {
        let script: Script = serde_json::from_str(text)?;
        script.resolve()
    }

    fn resolve(self) -> Result<Trace, ScriptError> {
        let invalid = |m: String| ScriptError::Invalid(m);
        if self.gpus.is_empty() || self.gpus.len() > MAX_GPUS {
            return Err(invalid(format!(
                "{} GPUs; a script describes 1 to {MAX_GPUS}",
                self.gpus.len()
            )));
        }
        let c_string = |what: &str, s: &str| {
            // nvml-wrapper reads names and UUIDs into 96-byte buffers.
            if s.len() >= 96 {
                return Err(invalid(format!("{what} {s:?} is longer than 95 bytes")));
            }
            CString::new(s).map_err(|_| invalid(format!("{what} {s:?} contains a NUL byte")))
        };
        let mut uuids = HashSet::new();
        let mut gpus = Vec::with_capacity(self.gpus.len());
        for (i, gpu) in self.gpus.into_iter().enumerate() {
            if gpu.uuid.is_empty() || !uuids.insert(gpu.uuid.clone()) {
                return Err(invalid(format!("GPU {i}: empty or repeated uuid")));
            }
            let mut steps: Vec<Step> = Vec::with_capacity(gpu.steps.len().max(1));
            let mut prev = self.defaults.clone();
            for step in gpu.steps.iter() {
                prev = step.over(&prev);
                steps.push(prev.clone());
            }
            if steps.is_empty() {
                steps.push(prev);
            }
            for (s, step) in steps.iter().enumerate() {
                for name in step.throttle_reasons.iter().flatten() {
                    if !THROTTLE_REASONS.iter().any(|(r, _)| r == name) {
                        return Err(invalid(format!(
                            "GPU {i} step {s}: unknown throttle reason {name:?}"
                        )));
                    }
                }
            }
            if let Some(until) = gpu.error_until_step
                && gpu.error_from_step.is_none_or(|from| until <= from)
            {
                return Err(invalid(format!(
                    "GPU {i}: error_until_step {until} needs an error_from_step before it"
                )));
            }
            let pci = gpu
                .pci_bus_id
                .as_deref()
                .map(|id| {
                    PciBusId::parse(id).ok_or_else(|| {
                        invalid(format!("GPU {i}: pci_bus_id {id:?} is not DDDD:BB:DD.F"))
                    })
                })
                .transpose()?;
            // nvml-wrapper reads them into NVML's buffers: 32 bytes, 30 for the serial.
            let sized = |what: &str, s: &Option<String>, room: usize| {
                s.as_deref()
                    .map(|s| {
                        if s.len() >= room {
                            return Err(invalid(format!(
                                "GPU {i}: {what} {s:?} is longer than {} bytes",
                                room - 1
                            )));
                        }
                        c_string(what, s)
                    })
                    .transpose()
            };
            gpus.push(GpuTrace {
                name: c_string("name", &gpu.name)?,
                uuid: c_string("uuid", &gpu.uuid)?,
                gpm_supported: gpu.gpm_supported,
                nvlink_links: gpu.nvlink_links,
                pci,
                vbios_version: sized("vbios_version", &gpu.vbios_version, 32)?,
                serial: sized("serial", &gpu.serial, 30)?,
                lost_at_step: gpu.lost_at_step,
                error_from_step: gpu.error_from_step,
                error_until_step: gpu.error_until_step,
                xids: gpu.xids,
                steps,
            });
        }
        Ok(Trace {
            driver_version: c_string("driver_version", &self.driver_version)?,
            gpus,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_bus_ids_are_read_in_either_form_and_answered_in_nvml_s() {
        let trace = Script::parse(
            r#"{"gpus": [{"name": "n", "uuid": "GPU-a", "pci_bus_id": "0000:1b:00.0",
                          "vbios_version": "96.00.99.00.01", "serial": "1654922001234"},
                         {"name": "n", "uuid": "GPU-b", "pci_bus_id": "00000001:9A:00.0"},
                         {"name": "n", "uuid": "GPU-c"}]}"#,
        )
        .unwrap();
        let id = |i: usize| trace.gpus[i].pci.map(|p| p.bus_id());
        assert_eq!(id(0).as_deref(), Some("00000000:1B:00.0"));
        assert_eq!(trace.gpus[0].pci.unwrap().bus_id_legacy(), "0000:1B:00.0");
        assert_eq!(id(1).as_deref(), Some("00000001:9A:00.0"));
        assert_eq!(id(2), None);
        assert_eq!(trace.gpus[0].serial.as_deref(), Some(c"1654922001234"));
        assert_eq!(trace.gpus[1].vbios_version, None);
        let e =
            Script::parse(r#"{"gpus": [{"name": "n", "uuid": "GPU-a", "pci_bus_id": "1b:00.0"}]}"#)
                .unwrap_err()
                .to_string();
        assert!(e.contains("pci_bus_id \"1b:00.0\""), "{e}");
    }

    #[test]
    fn a_step_carries_over_what_it_does_not_change() {
        let trace = Script::parse(
            r#"{"defaults": {"temperature_c": 40, "power_mw": 100000},
                "gpus": [{"name": "n", "uuid": "GPU-a", "steps": [
                    {"gpu_util_pct": 10},
                    {"temperature_c": 55, "gpm": {"sm_util": 50.0}},
                    {"gpm": {"fp16_util": 3.0}}]}]}"#,
        )
        .unwrap();
        let gpu = &trace.gpus[0];
        assert_eq!(gpu.at(0).temperature_c, Some(40));
        assert_eq!(gpu.at(0).gpu_util_pct, Some(10));
        assert_eq!(gpu.at(1).temperature_c, Some(55));
        assert_eq!(gpu.at(1).gpu_util_pct, Some(10));
        assert_eq!(gpu.at(1).power_mw, Some(100000));
        assert_eq!(gpu.at(0).memory_used_bytes, None);
        // A step's GPM set replaces the previous one as a whole.
        assert_eq!(gpu.at(2).gpm.as_ref().unwrap().sm_util, None);
        assert_eq!(gpu.at(2).gpm.as_ref().unwrap().get(13), Some(3.0));
        // Past the end the trace holds its last step.
        assert_eq!(gpu.at(1000).temperature_c, Some(55));
    }

    #[test]
    fn throttle_reason_names_become_nvml_bits() {
        let trace = Script::parse(
            r#"{"gpus": [{"name": "n", "uuid": "GPU-a",
                "steps": [{"throttle_reasons": ["sw_power_cap", "hw_thermal_slowdown"]}]}]}"#,
        )
        .unwrap();
        assert_eq!(trace.gpus[0].at(0).throttle_mask(), Some(0x44));
    }

    #[test]
    fn mistakes_in_a_script_are_refused_with_the_reason() {
        let cases = [
            (r#"{"gpus": []}"#, "0 GPUs"),
            (
                r#"{"gpus": [{"name": "n", "uuid": "GPU-a"}, {"name": "n", "uuid": "GPU-a"}]}"#,
                "repeated uuid",
            ),
            (
                r#"{"gpus": [{"name": "n", "uuid": "GPU-a", "steps": [{"temp": 3}]}]}"#,
                "unknown field `temp`",
            ),
            (
                r#"{"gpus": [{"name": "n", "uuid": "GPU-a",
                    "steps": [{"throttle_reasons": ["too_hot"]}]}]}"#,
                "unknown throttle reason \"too_hot\"",
            ),
        ];
        for (text, reason) in cases {
            let err = Script::parse(text).unwrap_err().to_string();
            assert!(err.contains(reason), "{err:?} should mention {reason:?}");
        }
    }

    #[test]
    fn the_shipped_8_gpu_script_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/h100x8.json");
        let trace = Script::load(&path).unwrap();
        assert_eq!(trace.gpus.len(), 8);
        assert!(trace.gpus.iter().all(|g| g.gpm_supported));
    }
}
