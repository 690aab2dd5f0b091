//! The GPU source: NVML through nvml-wrapper, loaded at run time.
//!
//! - [`GpuSource::open`] loads `libnvidia-ml.so.1` (or the library given), lists the GPUs
//!   and does the slow, unchanging queries once: identity, GPM support, NVLink link count.
//!   Without the library it fails with [`GpuError::NotFound`], which reads
//!   "NVML not found: GPU metrics off"; the agent goes on without GPU metrics.
//! - [`GpuSource::read_into`] (and [`GpuSource::read`], which collects) is one sweep over the
//!   GPUs that still answer, each value handed on with its series and sampler slot, both
//!   built once per GPU: utilization (always first: it is also the clock of the test
//!   stand-in, see `docs/nvml-standin.md`), memory,
//!   SM and memory clocks, temperature, power, energy, throttle reasons, PCIe throughput and
//!   replays, one batched field-value call (ECC volatile and aggregate, remapped rows, NVLink
//!   error counters, per-link NVLink data counters), and the GPM metrics of Hopper and newer
//!   GPUs, computed between the sample kept from an earlier sweep at least 100 ms before and
//!   this sweep's.
//! - [`GpuSource::spawn_event_thread`] registers every GPU for XID errors and starts a
//!   dedicated thread blocking in `EventSet::wait`; every XID occurrence becomes a
//!   [`GpuEvent::Xid`], never a gauge. The same channel carries [`GpuEvent::Lost`]: a GPU that
//!   answers `GPU_IS_LOST`, or fails [`LOST_AFTER_FAILED_SWEEPS`] sweeps in a row, is reported
//!   once and no longer read; the other GPUs go on.
//!
//! Series are named `railscope_gpu_*` and labelled `{gpu="<index>", uuid="<uuid>"}`; cumulative
//! counts (energy, ECC errors, remapped rows, PCIe replays, NVLink bytes and errors) are
//! [`Kind::Counter`], everything else [`Kind::Gauge`].

use std::{
    collections::HashSet,
    ffi::OsStr,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc::{self, Sender, SyncSender},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use nvml_wrapper::{
    Device, EventSet, GpmSample, Nvml,
    bitmasks::{device::ThrottleReasons, event::EventTypes},
    enum_wrappers::device::{Clock, PcieUtilCounter, TemperatureSensor},
    enums::{device::SampleValue, event::XidError, gpm::GpmMetricId},
    error::{NvmlError, nvml_try},
    gpm::gpm_metrics_get,
    struct_wrappers::device::FieldValueSample,
    structs::device::FieldId,
    sys_exports::field_id::*,
};
use nvml_wrapper_sys::bindings::{nvmlFieldValue_t, nvmlGpmSample_t};

use railscope_wire::{Kind, Labels, Reading, Series, Value};

use super::{Collect, ReadingSink};
use crate::sampler::Slot;

/// The library an NVIDIA driver installs (`libnvidia-ml.so` without the `.1` only comes with
/// development packages).
pub const SYSTEM_LIBRARY: &str = "libnvidia-ml.so.1";
/// GPM needs its two samples at least this far apart.
pub const GPM_MIN_INTERVAL: Duration = Duration::from_millis(100);
/// Sweeps in a row in which a GPU fails to answer (other than `GPU_IS_LOST`, which counts at
/// once) before it is declared lost.
pub const LOST_AFTER_FAILED_SWEEPS: u32 = 3;
/// How long the event thread blocks in one wait, which bounds how long stopping it takes.
const EVENT_WAIT_MS: u32 = 250;
/// The XID NVML reports when it cannot tell which one occurred.
pub const XID_UNKNOWN: u64 = 999;

/// Why the GPU source is off.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// The NVML library cannot be loaded: no NVIDIA driver on this node.
    #[error("NVML not found: GPU metrics off")]
    NotFound {
        /// The library asked for and the loader's reason, for debug logs.
        library: String,
        reason: String,
    },
    #[error("NVML did not start ({0}): GPU metrics off")]
    Init(NvmlError),
    #[error("NVML sees no GPU: GPU metrics off")]
    NoGpu,
    /// No XID events (the metrics still work).
    #[error("GPU XID events unavailable: {0}")]
    Events(String),
}

/// Something that happened to a GPU once; never sampled away.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuEvent {
    /// One XID error occurrence as the driver reported it (two identical XIDs are two events).
    Xid {
        unix_ns: u64,
        gpu: u32,
        uuid: String,
        /// The XID number; [`XID_UNKNOWN`] when NVML could not tell.
        xid: u64,
    },
    /// The GPU stopped answering; its metrics stop from this sweep on.
    Lost {
        unix_ns: u64,
        gpu: u32,
        uuid: String,
        reason: String,
    },
}

impl GpuEvent {
    /// The generic event kind: `"xid"` or `"gpu_lost"`.
    pub fn kind(&self) -> &'static str {
        match self {
            GpuEvent::Xid { .. } => "xid",
            GpuEvent::Lost { .. } => "gpu_lost",
        }
    }

    pub fn unix_ns(&self) -> u64 {
        match self {
            GpuEvent::Xid { unix_ns, .. } | GpuEvent::Lost { unix_ns, .. } => *unix_ns,
        }
    }

    /// `{gpu, uuid}`, the labels of the GPU's series.
    pub fn labels(&self) -> Labels {
        match self {
            GpuEvent::Xid { gpu, uuid, .. } | GpuEvent::Lost { gpu, uuid, .. } => {
                gpu_labels(*gpu, uuid)
            }
        }
    }

    /// The XID number for an XID event.
    pub fn code(&self) -> Option<u64> {
        match self {
            GpuEvent::Xid { xid, .. } => Some(*xid),
            GpuEvent::Lost { .. } => None,
        }
    }
}

fn gpu_labels(gpu: u32, uuid: &str) -> Labels {
    Labels::new([("gpu", gpu.to_string()), ("uuid", uuid.to_string())])
}

fn now_unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// What [`GpuSource::open`] found about one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuInfo {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    /// GPM metrics available (Hopper and newer).
    pub gpm: bool,
    /// NVLink links (0 for PCIe-only GPUs).
    pub nvlink_links: u32,
}

/// The GPU source; see the module documentation.
pub struct GpuSource {
    nvml: Arc<Nvml>,
    gpus: Vec<Gpu>,
    events: Option<Sender<GpuEvent>>,
    /// Lost events found before a channel was given.
    unsent: Vec<GpuEvent>,
}

struct Gpu {
    info: GpuInfo,
    labels: Labels,
    lost: bool,
    failed_sweeps: u32,
    /// (field id, scope id) of the batched field-value call.
    fields: Vec<(u32, u32)>,
    /// The GPM sample kept for the next sweep, and when it was taken (GPM GPUs only).
    gpm_prev: Option<(RawSample, Instant)>,
    /// Metrics whose failure has been logged already.
    warned: HashSet<&'static str>,
    /// Every series this GPU has given, with its sampler slot, in sweep order: built once,
    /// as the IB source keeps one per file. Building a name and labels for each of a node's
    /// ~400 GPU values per sweep, then hashing them in the sampler, was most of this source's
    /// cost.
    series: Vec<(Series, Slot)>,
}

/// A GPM sample kept across sweeps. `GpmSample` borrows the `Nvml` it came from, which
/// `GpuSource` owns, so the handle is kept raw and rewrapped for each use.
struct RawSample(nvmlGpmSample_t);

// SAFETY: a GPM sample is a heap buffer of the NVML library with no thread affinity;
// nvml-wrapper declares `GpmSample` Send for the same reason. It is used from one thread at a
// time (`GpuSource` is not Sync).
unsafe impl Send for RawSample {}

// The agent may move the source to the thread that polls it.
const _: () = {
    const fn send<T: Send>() {}
    send::<GpuSource>();
};

/// The reason a GPU is declared lost.
struct Lost(String);

/// GPM utilizations, which NVML gives in percent, reported as 0-1 ratios.
const GPM_RATIOS: [(GpmMetricId, &str); 11] = [
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
const GPM_RATES: [(GpmMetricId, &str); 4] = [
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
enum GpmUnit {
    Percent,
    MibPerSec,
}

/// Clock event (throttle) reasons, one 0/1 gauge each.
const THROTTLE_REASONS: [(ThrottleReasons, &str); 9] = [
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
struct FieldCounter {
    id: u32,
    name: &'static str,
    /// The labels that tell the counters of one series apart.
    labels: &'static [(&'static str, &'static str)],
}

const fn field_counter(
    id: u32,
    name: &'static str,
    labels: &'static [(&'static str, &'static str)],
) -> FieldCounter {
    FieldCounter { id, name, labels }
}

/// None of these ids is in the 251-273 range that drivers >= 580.82 renumbered, so they mean
/// the same for every driver.
const FIELD_COUNTERS: [FieldCounter; 10] = [
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
const FIELD_FLAGS: [(u32, &str); 2] = [
    (
        NVML_FI_DEV_REMAPPED_PENDING,
        "railscope_gpu_row_remap_pending",
    ),
    (
        NVML_FI_DEV_REMAPPED_FAILURE,
        "railscope_gpu_row_remap_failed",
    ),
];

impl GpuSource {
    /// Load NVML (`None`: the system's [`SYSTEM_LIBRARY`]) and list the GPUs.
    pub fn open(lib_path: Option<&Path>) -> Result<GpuSource, GpuError> {
        let library = lib_path.map_or(OsStr::new(SYSTEM_LIBRARY), Path::as_os_str);
        let nvml = Nvml::builder()
            .lib_path(library)
            .init()
            .map_err(|e| match e {
                NvmlError::LibloadingError(err) => {
                    let library = library.to_string_lossy().into_owned();
                    tracing::debug!(%library, "cannot load NVML: {err}");
                    GpuError::NotFound {
                        library,
                        reason: err.to_string(),
                    }
                }
                e => GpuError::Init(e),
            })?;
        let count = nvml.device_count().map_err(GpuError::Init)?;
        if count == 0 {
            return Err(GpuError::NoGpu);
        }
        let mut gpus = Vec::new();
        let mut unsent = Vec::new();
        for index in 0..count {
            match Gpu::open(&nvml, index) {
                Ok(gpu) => gpus.push(gpu),
                Err((uuid, e)) => {
                    tracing::warn!(gpu = index, "GPU does not answer: {e}");
                    unsent.push(GpuEvent::Lost {
                        unix_ns: now_unix_ns(),
                        gpu: index,
                        uuid,
                        reason: format!("does not answer NVML: {e}"),
                    });
                }
            }
        }
        tracing::info!(
            driver = %nvml.sys_driver_version().unwrap_or_default(),
            gpus = gpus.len(),
            gpm = gpus.iter().filter(|g| g.info.gpm).count(),
            "NVML: GPU metrics on"
        );
        Ok(GpuSource {
            nvml: Arc::new(nvml),
            gpus,
            events: None,
            unsent,
        })
    }

    /// The GPUs found at open, lost ones included.
    pub fn gpus(&self) -> impl Iterator<Item = &GpuInfo> {
        self.gpus.iter().map(|g| &g.info)
    }

    /// One sweep over the GPUs that still answer, every reading stamped `unix_ns`. A GPU
    /// found lost in this sweep contributes nothing to it and sends one [`GpuEvent::Lost`].
    pub fn read(&mut self, unix_ns: u64) -> Vec<Reading> {
        let mut readings = Vec::new();
        self.read_into(unix_ns, &mut Collect::new(&mut readings, unix_ns, |_| true));
        readings
    }

    /// [`read`](Self::read), handing each value to `sink` with its series and slot. Every
    /// metric is read at each sweep (NVML answers several in one call; the sink's `due` is
    /// not asked).
    pub fn read_into(&mut self, unix_ns: u64, sink: &mut dyn ReadingSink) {
        let mut lost = Vec::new();
        for gpu in self.gpus.iter_mut().filter(|g| !g.lost) {
            match gpu.sweep(&self.nvml, sink) {
                Ok(()) => {}
                Err(Lost(reason)) => {
                    let (index, uuid) = (gpu.info.index, &gpu.info.uuid);
                    tracing::warn!(gpu = index, %uuid, "GPU lost: {reason}");
                    gpu.lost = true;
                    if let Some((sample, _)) = gpu.gpm_prev.take() {
                        // SAFETY: allocated by this NVML instance and owned only here.
                        drop(unsafe { GpmSample::from_handle(&self.nvml, sample.0) });
                    }
                    lost.push(GpuEvent::Lost {
                        unix_ns,
                        gpu: gpu.info.index,
                        uuid: gpu.info.uuid.clone(),
                        reason,
                    });
                }
            }
        }
        for event in lost {
            self.emit(event);
        }
    }

    fn emit(&mut self, event: GpuEvent) {
        match &self.events {
            Some(tx) => {
                if tx.send(event).is_err() {
                    tracing::debug!("GPU event receiver gone");
                }
            }
            None => self.unsent.push(event),
        }
    }

    /// Route [`GpuEvent`]s to `tx`: lost GPUs from [`read`](Self::read) (including any found
    /// before this call), and XIDs from a dedicated thread blocking in NVML's event wait.
    /// Registration is done before this returns, so no XID raised after it is missed. An
    /// error means no XID events (lost-GPU events still go to `tx`).
    pub fn spawn_event_thread(&mut self, tx: Sender<GpuEvent>) -> Result<EventThread, GpuError> {
        for event in self.unsent.drain(..) {
            let _ = tx.send(event);
        }
        self.events = Some(tx.clone());
        let nvml = Arc::clone(&self.nvml);
        let gpus: Vec<(u32, String)> = self
            .gpus
            .iter()
            .filter(|g| !g.lost)
            .map(|g| (g.info.index, g.info.uuid.clone()))
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let handle = thread::Builder::new()
            .name("railscope-gpu-xid".into())
            .spawn({
                let stop = Arc::clone(&stop);
                move || xid_thread(&nvml, &gpus, &tx, &stop, ready_tx)
            })
            .map_err(|e| GpuError::Events(format!("cannot start the event thread: {e}")))?;
        let registered = ready_rx
            .recv()
            .unwrap_or_else(|_| Err(GpuError::Events("the event thread ended".into())));
        match registered {
            Ok(n) => {
                tracing::info!(gpus = n, "GPU XID events on");
                Ok(EventThread {
                    stop,
                    handle: Some(handle),
                })
            }
            Err(e) => {
                let _ = handle.join();
                Err(e)
            }
        }
    }
}

impl Drop for GpuSource {
    fn drop(&mut self) {
        for gpu in &mut self.gpus {
            if let Some((sample, _)) = gpu.gpm_prev.take() {
                // SAFETY: allocated by this NVML instance and owned only here.
                drop(unsafe { GpmSample::from_handle(&self.nvml, sample.0) });
            }
        }
    }
}

/// Where the values of one GPU's sweep go: to the sink, each with its series and slot from
/// the GPU's [`Gpu::series`].
struct Out<'a> {
    labels: &'a Labels,
    series: &'a mut Vec<(Series, Slot)>,
    /// Where the next value's series should be in `series`: sweeps read in the same order,
    /// so it nearly always is, and a metric the GPU stopped giving only costs a search.
    next: usize,
    sink: &'a mut dyn ReadingSink,
}

impl Out<'_> {
    fn push(&mut self, name: &str, kind: Kind, extra: &[(&str, &str)], value: Value) {
        let i = self.position(name, kind, extra);
        let (series, slot) = &mut self.series[i];
        self.sink.reading(series, slot, value);
        self.next = i + 1;
    }

    /// The index of the series `name{gpu labels, extra}` in `self.series`, added if new.
    fn position(&mut self, name: &str, kind: Kind, extra: &[(&str, &str)]) -> usize {
        let base = self.labels.len();
        let is = |s: &Series| {
            &*s.name == name
                && s.kind == kind
                && s.labels.len() == base + extra.len()
                && extra.iter().all(|&(k, v)| s.labels.get(k) == Some(v))
        };
        if self.series.get(self.next).is_some_and(|(s, _)| is(s)) {
            return self.next;
        }
        if let Some(i) = self.series.iter().position(|(s, _)| is(s)) {
            return i;
        }
        let labels = if extra.is_empty() {
            self.labels.clone()
        } else {
            Labels::new(self.labels.iter().chain(extra.iter().copied()))
        };
        let series = Series {
            name: name.into(),
            labels,
            kind,
        };
        self.series.push((series, Slot::default()));
        self.series.len() - 1
    }

    fn gauge(&mut self, name: &str, value: Value) {
        self.push(name, Kind::Gauge, &[], value);
    }

    fn counter(&mut self, name: &str, value: Value) {
        self.push(name, Kind::Counter, &[], value);
    }
}

fn sample_u64(v: &SampleValue) -> Option<u64> {
    match *v {
        SampleValue::U32(v) => Some(v.into()),
        SampleValue::U64(v) => Some(v),
        SampleValue::I64(v) => u64::try_from(v).ok(),
        SampleValue::F64(_) => None,
    }
}

impl Gpu {
    /// Identity and the queries that do not change: done once, off the hot loop.
    fn open(nvml: &Nvml, index: u32) -> Result<Gpu, (String, NvmlError)> {
        let device = nvml
            .device_by_index(index)
            .map_err(|e| (String::new(), e))?;
        let uuid = device.uuid().map_err(|e| (String::new(), e))?;
        let name = device.name().map_err(|e| (uuid.clone(), e))?;
        // Not supported, or a driver too old to have the function: no GPM.
        let gpm = device.gpm_support().unwrap_or(false);
        let nvlink_links = device
            .field_values_for(&[FieldId(NVML_FI_DEV_NVLINK_LINK_COUNT)])
            .ok()
            .and_then(|v| v.into_iter().next())
            .and_then(Result::ok)
            .and_then(|s| s.value.ok())
            .and_then(|v| sample_u64(&v))
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0);
        let mut fields: Vec<(u32, u32)> = FIELD_COUNTERS
            .iter()
            .map(|f| f.id)
            .chain(FIELD_FLAGS.iter().map(|f| f.0))
            .map(|id| (id, 0))
            .collect();
        for link in 0..nvlink_links {
            fields.push((NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link));
            fields.push((NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link));
        }
        tracing::debug!(gpu = index, %uuid, %name, gpm, nvlink_links, "GPU found");
        Ok(Gpu {
            labels: gpu_labels(index, &uuid),
            info: GpuInfo {
                index,
                uuid,
                name,
                gpm,
                nvlink_links,
            },
            lost: false,
            failed_sweeps: 0,
            fields,
            gpm_prev: None,
            warned: HashSet::new(),
            series: Vec::new(),
        })
    }

    /// `Some(v)`, or `None` for a metric this GPU does not give (logged once if it failed
    /// for another reason than not being supported); `Err` if the GPU is gone.
    fn check<T>(&mut self, what: &'static str, r: Result<T, NvmlError>) -> Result<Option<T>, Lost> {
        match r {
            Ok(v) => Ok(Some(v)),
            Err(NvmlError::GpuLost) => Err(Lost(format!("{what}: GPU is lost (fell off the bus)"))),
            Err(NvmlError::NotSupported) => Ok(None),
            Err(e) => {
                if self.warned.insert(what) {
                    tracing::warn!(gpu = self.info.index, "{what}: {e}");
                }
                Ok(None)
            }
        }
    }

    /// A sweep in which the GPU did not answer its first calls.
    fn failed(&mut self, what: &str, e: NvmlError) -> Result<(), Lost> {
        if matches!(e, NvmlError::GpuLost) {
            return Err(Lost(format!("{what}: GPU is lost (fell off the bus)")));
        }
        self.failed_sweeps += 1;
        tracing::debug!(
            gpu = self.info.index,
            failed = self.failed_sweeps,
            "{what}: {e}"
        );
        if self.failed_sweeps >= LOST_AFTER_FAILED_SWEEPS {
            return Err(Lost(format!(
                "{what}: {e} ({} sweeps in a row)",
                self.failed_sweeps
            )));
        }
        Ok(())
    }

    /// One sweep of this GPU, its values handed to `sink`.
    fn sweep(&mut self, nvml: &Nvml, sink: &mut dyn ReadingSink) -> Result<(), Lost> {
        // Out of `self` while the sweep runs, which also borrows `self` for its checks.
        let mut series = std::mem::take(&mut self.series);
        let labels = self.labels.clone();
        let mut out = Out {
            labels: &labels,
            series: &mut series,
            next: 0,
            sink,
        };
        let result = self.sweep_into(nvml, &mut out);
        self.series = series;
        result
    }

    fn sweep_into(&mut self, nvml: &Nvml, out: &mut Out<'_>) -> Result<(), Lost> {
        let device = match nvml.device_by_index(self.info.index) {
            Ok(d) => d,
            Err(e) => return self.failed("device handle", e),
        };
        // First in every sweep: cheap, and it tells whether the GPU answers at all.
        match device.utilization_rates() {
            Ok(u) => {
                out.gauge(
                    "railscope_gpu_utilization_ratio",
                    Value::F64(f64::from(u.gpu) / 100.0),
                );
                out.gauge(
                    "railscope_gpu_memory_utilization_ratio",
                    Value::F64(f64::from(u.memory) / 100.0),
                );
            }
            Err(NvmlError::NotSupported) => {}
            Err(e) => return self.failed("utilization", e),
        }
        self.failed_sweeps = 0;

        if let Some(m) = self.check("memory", device.memory_info())? {
            out.gauge("railscope_gpu_memory_total_bytes", Value::U64(m.total));
            out.gauge(
                "railscope_gpu_memory_reserved_bytes",
                Value::U64(m.reserved),
            );
            out.gauge("railscope_gpu_memory_used_bytes", Value::U64(m.used));
            out.gauge("railscope_gpu_memory_free_bytes", Value::U64(m.free));
        }
        if let Some(mhz) = self.check("SM clock", device.clock_info(Clock::SM))? {
            out.gauge(
                "railscope_gpu_sm_clock_hertz",
                Value::U64(u64::from(mhz) * 1_000_000),
            );
        }
        if let Some(mhz) = self.check("memory clock", device.clock_info(Clock::Memory))? {
            out.gauge(
                "railscope_gpu_memory_clock_hertz",
                Value::U64(u64::from(mhz) * 1_000_000),
            );
        }
        if let Some(c) = self.check("temperature", device.temperature(TemperatureSensor::Gpu))? {
            out.gauge("railscope_gpu_temperature_celsius", Value::U64(c.into()));
        }
        if let Some(mw) = self.check("power", device.power_usage())? {
            out.gauge(
                "railscope_gpu_power_watts",
                Value::F64(f64::from(mw) / 1000.0),
            );
        }
        if let Some(mj) = self.check("energy", device.total_energy_consumption())? {
            // In NVML's own unit, as dcgm-exporter does: an integer counter travels exactly,
            // where joules would need a fraction the wire does not carry for counters.
            out.counter("railscope_gpu_energy_millijoules_total", Value::U64(mj));
        }
        if let Some(reasons) = self.check("throttle reasons", device.current_throttle_reasons())? {
            for (flag, reason) in THROTTLE_REASONS {
                let active = u64::from(reasons.contains(flag));
                out.push(
                    "railscope_gpu_throttle_active",
                    Kind::Gauge,
                    &[("reason", reason)],
                    Value::U64(active),
                );
            }
        }
        // NVML reports KB/s over its last 20 ms; taken as KiB/s.
        if let Some(kbps) = self.check("PCIe tx", device.pcie_throughput(PcieUtilCounter::Send))? {
            out.gauge(
                "railscope_gpu_pcie_tx_bytes_per_second",
                Value::U64(u64::from(kbps) * 1024),
            );
        }
        if let Some(kbps) =
            self.check("PCIe rx", device.pcie_throughput(PcieUtilCounter::Receive))?
        {
            out.gauge(
                "railscope_gpu_pcie_rx_bytes_per_second",
                Value::U64(u64::from(kbps) * 1024),
            );
        }
        if let Some(n) = self.check("PCIe replays", device.pcie_replay_counter())? {
            out.counter("railscope_gpu_pcie_replays_total", Value::U64(n.into()));
        }
        let fields = field_values(nvml, &device, &self.fields);
        if let Some(values) = self.check("field values", fields)? {
            self.push_fields(out, &values);
        }
        if self.info.gpm {
            self.gpm(nvml, &device, out)?;
        }
        Ok(())
    }

    fn push_fields(&self, out: &mut Out<'_>, values: &[Result<SampleValue, NvmlError>]) {
        let value = |i: usize| {
            values
                .get(i)
                .and_then(|v| v.as_ref().ok())
                .and_then(sample_u64)
        };
        for (i, counter) in FIELD_COUNTERS.iter().enumerate() {
            if let Some(v) = value(i) {
                out.push(counter.name, Kind::Counter, counter.labels, Value::U64(v));
            }
        }
        for (i, (_, name)) in FIELD_FLAGS.iter().enumerate() {
            if let Some(v) = value(FIELD_COUNTERS.len() + i) {
                out.gauge(name, Value::U64(u64::from(v != 0)));
            }
        }
        // Per-link data counters, summed; a direction with any link not answering is left
        // out rather than reported short (a counter must not go back).
        let links = FIELD_COUNTERS.len() + FIELD_FLAGS.len();
        for (direction, name) in [
            (
                NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                "railscope_gpu_nvlink_tx_bytes_total",
            ),
            (
                NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
                "railscope_gpu_nvlink_rx_bytes_total",
            ),
        ] {
            let kib: Option<u64> = self.fields[links..]
                .iter()
                .enumerate()
                .filter(|(_, (id, _))| *id == direction)
                .map(|(i, _)| value(links + i))
                .sum();
            if let Some(kib) = kib.filter(|_| self.info.nvlink_links > 0) {
                out.counter(name, Value::U64(kib.saturating_mul(1024)));
            }
        }
    }

    /// Take this sweep's GPM sample if the kept one is old enough, and report the metrics
    /// between the two.
    fn gpm(&mut self, nvml: &Nvml, device: &Device<'_>, out: &mut Out<'_>) -> Result<(), Lost> {
        let now = Instant::now();
        if self
            .gpm_prev
            .as_ref()
            .is_some_and(|(_, taken)| now.duration_since(*taken) < GPM_MIN_INTERVAL)
        {
            return Ok(());
        }
        let Some(sample) = self.check("GPM sample", device.gpm_sample())? else {
            return Ok(());
        };
        if let Some((prev, _)) = self.gpm_prev.take() {
            // SAFETY: allocated by this NVML instance, owned only by `gpm_prev`, which gave it
            // up above; the wrapper frees it when dropped at the end of this block.
            let prev = unsafe { GpmSample::from_handle(nvml, prev.0) };
            let metrics: Vec<(GpmMetricId, &str, GpmUnit)> = GPM_RATIOS
                .iter()
                .map(|&(id, name)| (id, name, GpmUnit::Percent))
                .chain(
                    GPM_RATES
                        .iter()
                        .map(|&(id, name)| (id, name, GpmUnit::MibPerSec)),
                )
                .collect();
            let ids: Vec<GpmMetricId> = metrics.iter().map(|m| m.0).collect();
            let results = gpm_metrics_get(nvml, &prev, &sample, &ids);
            if let Some(results) = self.check("GPM metrics", results)? {
                for ((_, name, unit), result) in metrics.iter().zip(results) {
                    // Per metric: one this GPU does not measure is left out.
                    let Ok(m) = result else { continue };
                    let value = match unit {
                        GpmUnit::Percent => m.value / 100.0,
                        GpmUnit::MibPerSec => m.value * 1_048_576.0,
                    };
                    out.gauge(name, Value::F64(value));
                }
            }
        }
        self.gpm_prev = Some((RawSample(sample.into_handle()), now));
        Ok(())
    }
}

/// One batched `nvmlDeviceGetFieldValues` call with per-entry scope ids (the NVLink link for
/// the data counters), which nvml-wrapper's `field_values_for` cannot set. Each entry
/// answers on its own.
fn field_values(
    nvml: &Nvml,
    device: &Device<'_>,
    fields: &[(u32, u32)],
) -> Result<Vec<Result<SampleValue, NvmlError>>, NvmlError> {
    let sym = nvml
        .lib()
        .nvmlDeviceGetFieldValues
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let mut values: Vec<nvmlFieldValue_t> = fields
        .iter()
        .map(|&(field, scope)| {
            // SAFETY: nvmlFieldValue_t is plain C data (integers and a union of numbers), for
            // which all-zero is a valid value.
            let mut v: nvmlFieldValue_t = unsafe { std::mem::zeroed() };
            v.fieldId = field;
            v.scopeId = scope;
            v
        })
        .collect();
    let count = i32::try_from(values.len()).map_err(|_| NvmlError::InvalidArg)?;
    // SAFETY: the device handle comes from this NVML instance, and `values` holds `count`
    // initialised entries that NVML fills in place.
    nvml_try(unsafe { sym(device.handle(), count, values.as_mut_ptr()) })?;
    Ok(values
        .into_iter()
        .map(|v| FieldValueSample::try_from(v).and_then(|s| s.value))
        .collect())
}

/// The XID event thread; stops (within a quarter second) when stopped or dropped, or by
/// itself when the receiver of its channel is gone.
pub struct EventThread {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl EventThread {
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

impl Drop for EventThread {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A GPU registered for XIDs, recognised in event data by its NVML handle.
struct Watched {
    handle: usize,
    gpu: u32,
    uuid: String,
}

fn xid_thread(
    nvml: &Nvml,
    gpus: &[(u32, String)],
    tx: &Sender<GpuEvent>,
    stop: &AtomicBool,
    ready: SyncSender<Result<usize, GpuError>>,
) {
    let (set, watched) = match register_xids(nvml, gpus) {
        Ok(registered) => registered,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let _ = ready.send(Ok(watched.len()));
    let mut failing = false;
    while !stop.load(Ordering::Relaxed) {
        match set.wait(EVENT_WAIT_MS) {
            Ok(data) => {
                failing = false;
                let unix_ns = now_unix_ns();
                // SAFETY: only the handle's address is read, to compare it.
                let handle = unsafe { data.device.handle() }.addr();
                let (Some(w), Some(xid)) =
                    (watched.iter().find(|w| w.handle == handle), data.event_data)
                else {
                    tracing::debug!(?data.event_type, "event for no watched GPU");
                    continue;
                };
                let xid = match xid {
                    XidError::Value(v) => v,
                    XidError::Unknown => XID_UNKNOWN,
                };
                let event = GpuEvent::Xid {
                    unix_ns,
                    gpu: w.gpu,
                    uuid: w.uuid.clone(),
                    xid,
                };
                if tx.send(event).is_err() {
                    return;
                }
            }
            Err(NvmlError::Timeout) => failing = false,
            Err(e) => {
                if !failing {
                    tracing::warn!("waiting for GPU XID events: {e}");
                }
                failing = true;
                thread::sleep(Duration::from_millis(EVENT_WAIT_MS.into()));
            }
        }
    }
}

/// One event set with every GPU that can report XIDs. NVML frees the set when a
/// registration fails, so a GPU that refuses is dropped and the set built again without it.
fn register_xids<'n>(
    nvml: &'n Nvml,
    gpus: &[(u32, String)],
) -> Result<(EventSet<'n>, Vec<Watched>), GpuError> {
    let mut candidates: Vec<(Device<'n>, Watched)> = Vec::new();
    for (gpu, uuid) in gpus {
        let device = match nvml.device_by_index(*gpu) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(gpu, "no XID events: {e}");
                continue;
            }
        };
        match device.supported_event_types() {
            Ok(types) if types.contains(EventTypes::CRITICAL_XID_ERROR) => {
                // SAFETY: only the handle's address is read, to recognise event data.
                let handle = unsafe { device.handle() }.addr();
                let watched = Watched {
                    handle,
                    gpu: *gpu,
                    uuid: uuid.clone(),
                };
                candidates.push((device, watched));
            }
            Ok(_) => tracing::warn!(gpu, "no XID events: not supported"),
            Err(e) => tracing::warn!(gpu, "no XID events: {e}"),
        }
    }
    loop {
        if candidates.is_empty() {
            return Err(GpuError::Events("no GPU reports XID errors".into()));
        }
        let mut set = Some(
            nvml.create_event_set()
                .map_err(|e| GpuError::Events(e.to_string()))?,
        );
        let mut refused = None;
        for (i, (device, _)) in candidates.iter().enumerate() {
            let Some(s) = set.take() else { break };
            match device.register_events(EventTypes::CRITICAL_XID_ERROR, s) {
                Ok(s) => set = Some(s),
                Err(e) => {
                    refused = Some((i, e.error));
                    break;
                }
            }
        }
        match (set, refused) {
            (Some(set), None) => {
                return Ok((set, candidates.into_iter().map(|(_, w)| w).collect()));
            }
            (_, Some((i, e))) => {
                tracing::warn!(gpu = candidates[i].1.gpu, "no XID events: {e}");
                candidates.remove(i);
            }
            (None, None) => return Err(GpuError::Events("event set lost".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_events_map_to_a_kind_labels_and_a_code() {
        let xid = GpuEvent::Xid {
            unix_ns: 7,
            gpu: 3,
            uuid: "GPU-x".into(),
            xid: 79,
        };
        assert_eq!(xid.kind(), "xid");
        assert_eq!(xid.code(), Some(79));
        assert_eq!(xid.unix_ns(), 7);
        assert_eq!(xid.labels().get("gpu"), Some("3"));
        assert_eq!(xid.labels().get("uuid"), Some("GPU-x"));
        let lost = GpuEvent::Lost {
            unix_ns: 8,
            gpu: 5,
            uuid: "GPU-y".into(),
            reason: "gone".into(),
        };
        assert_eq!(lost.kind(), "gpu_lost");
        assert_eq!(lost.code(), None);
        assert_eq!(lost.labels(), gpu_labels(5, "GPU-y"));
    }

    /// A sampler as the agent's sink has, and what each sweep handed on: (series, the slot
    /// it came with, value) per value.
    struct Seen<'s> {
        sampler: &'s mut crate::sampler::AdaptiveSampler,
        now_ns: u64,
        values: Vec<(Series, Slot, Value)>,
    }

    impl ReadingSink for Seen<'_> {
        fn due(&mut self, _: &Series, _: &mut Slot) -> bool {
            true
        }

        fn reading(&mut self, series: &Series, slot: &mut Slot, value: Value) {
            self.values.push((series.clone(), *slot, value));
            self.sampler.observe_at(series, slot, value, self.now_ns);
        }
    }

    #[test]
    fn each_value_of_a_sweep_reaches_its_own_series_even_when_a_metric_goes_missing() {
        let labels = gpu_labels(0, "GPU-a");
        let mut sampler = crate::sampler::AdaptiveSampler::new(Default::default());
        let mut series = Vec::new();
        let mut sweep = |series: &mut Vec<(Series, Slot)>, with_power: bool, now_ns: u64| {
            let mut seen = Seen {
                sampler: &mut sampler,
                now_ns,
                values: Vec::new(),
            };
            let mut out = Out {
                labels: &labels,
                series,
                next: 0,
                sink: &mut seen,
            };
            out.gauge("railscope_gpu_utilization_ratio", Value::F64(0.5));
            if with_power {
                out.gauge("railscope_gpu_power_watts", Value::F64(300.0));
            }
            out.push(
                "railscope_gpu_throttle_active",
                Kind::Gauge,
                &[("reason", "hw_slowdown")],
                Value::U64(1),
            );
            out.push(
                "railscope_gpu_throttle_active",
                Kind::Gauge,
                &[("reason", "sw_thermal")],
                Value::U64(0),
            );
            out.counter("railscope_gpu_energy_millijoules_total", Value::U64(9));
            seen.values
        };
        let first = sweep(&mut series, true, 1_000_000_000);
        let name_of = |s: &Series| format!("{}{}", s.name, s.labels);
        let names: Vec<String> = first.iter().map(|(s, _, _)| name_of(s)).collect();
        assert_eq!(
            names,
            [
                "railscope_gpu_utilization_ratio{gpu=\"0\",uuid=\"GPU-a\"}",
                "railscope_gpu_power_watts{gpu=\"0\",uuid=\"GPU-a\"}",
                "railscope_gpu_throttle_active{gpu=\"0\",reason=\"hw_slowdown\",uuid=\"GPU-a\"}",
                "railscope_gpu_throttle_active{gpu=\"0\",reason=\"sw_thermal\",uuid=\"GPU-a\"}",
                "railscope_gpu_energy_millijoules_total{gpu=\"0\",uuid=\"GPU-a\"}",
            ]
        );
        assert_eq!(first[4].0.kind, Kind::Counter);
        assert!(first.iter().all(|(_, slot, _)| *slot == Slot::default()));
        // The next sweep gives no power reading: every other value still goes to its own
        // series, with the slot the sampler gave it, and no series is added.
        let second = sweep(&mut series, false, 2_000_000_000);
        assert_eq!(series.len(), 5);
        let by_name: std::collections::HashMap<String, (Slot, Value)> = second
            .iter()
            .map(|(s, slot, v)| (name_of(s), (*slot, *v)))
            .collect();
        assert_eq!(by_name.len(), 4);
        assert!(!by_name.contains_key(&names[1]));
        for (i, (_, _, value)) in first.iter().enumerate().filter(|(i, _)| *i != 1) {
            let (slot, v) = by_name[&names[i]];
            assert_eq!(v, *value, "{}", names[i]);
            assert_ne!(slot, Slot::default(), "{} lost its slot", names[i]);
        }
    }

    #[test]
    fn a_missing_library_says_nvml_not_found_in_one_line() {
        let err = GpuSource::open(Some(Path::new("/nonexistent/libnvidia-ml.so.1")))
            .err()
            .expect("no library there");
        assert!(matches!(err, GpuError::NotFound { .. }));
        assert_eq!(err.to_string(), "NVML not found: GPU metrics off");
    }
}
