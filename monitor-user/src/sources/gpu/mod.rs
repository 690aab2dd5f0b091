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
//! Series are named `railscope_gpu_*` and labelled `{gpu="<index>", uuid="<uuid>"}`, plus
//! `job_id` (and `job_step`) while a job's processes use the GPU (`jobs`,
//! [`GpuSource::with_jobs`]); when the GPU's job changes, its series end
//! ([`GpuSource::take_ended_series`]) and new ones start under the new labels; cumulative
//! counts (energy, ECC errors, remapped rows, PCIe replays, NVLink bytes and errors) are
//! [`Kind::Counter`](monitor_wire::Kind::Counter), everything else
//! [`Kind::Gauge`](monitor_wire::Kind::Gauge).
//!
//! Modules: `device` reads one GPU, with the metric tables of `catalogue` and the series
//! kept by `series`; `events` is the XID thread and the events it sends.

mod catalogue;
mod device;
mod events;
mod jobs;
mod series;

use std::{
    ffi::OsStr,
    path::Path,
    sync::{Arc, mpsc::Sender},
    time::Duration,
};

use nvml_wrapper::{GpmSample, Nvml, error::NvmlError};

pub use events::{EventThread, GpuEvent};
pub use jobs::ProcessJobs;

use super::{Collect, ReadingSink};
use crate::time_base::{MonoNs, TimeBase, UnixNs};
use device::{Gpu, Lost};
use monitor_wire::{Labels, Reading, Series};

/// The library an NVIDIA driver installs (`libnvidia-ml.so` without the `.1` only comes with
/// development packages).
pub const SYSTEM_LIBRARY: &str = "libnvidia-ml.so.1";
/// GPM needs its two samples more than this far apart (NVML's documentation of
/// `nvmlGpmMetricsGet`: "should be greater than 100ms due to the internal sample refresh
/// rate"); a sweep that comes sooner reports no GPM metrics and keeps the older sample.
pub const GPM_MIN_INTERVAL: Duration = Duration::from_millis(100);
/// Sweeps in a row in which a GPU fails to answer (other than `GPU_IS_LOST`, which counts at
/// once) before it is declared lost.
pub const LOST_AFTER_FAILED_SWEEPS: u32 = 3;
/// A lost GPU is asked again every this many sweeps (one NVML call while it still does not
/// answer): a GPU that failed for a while and answers again is read again, with no restart.
pub const LOST_RETRY_EVERY_SWEEPS: u64 = 10;
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

pub(super) fn gpu_labels(gpu: u32, uuid: &str) -> Labels {
    Labels::new([("gpu", gpu.to_string()), ("uuid", uuid.to_string())])
}

/// Now, on the agent's time base (what its events and samples use).
pub(super) fn now_unix_ns() -> UnixNs {
    TimeBase::global().now_unix_ns()
}

/// Loads NVML (`None`: the system's [`SYSTEM_LIBRARY`]) and initialises it.
pub fn load_nvml(lib_path: Option<&Path>) -> Result<Nvml, GpuError> {
    let library = lib_path.map_or(OsStr::new(SYSTEM_LIBRARY), Path::as_os_str);
    Nvml::builder()
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
        })
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
    /// Names the job using each GPU (None: GPU series carry no job).
    jobs: Option<ProcessJobs>,
    /// Series whose GPU's job changed since the last [`GpuSource::take_ended_series`].
    ended: Vec<Series>,
    /// Sweeps so far, to pace the retries of lost GPUs.
    sweeps: u64,
}

// The agent may move the source to the thread that polls it.
const _: () = {
    const fn send<T: Send>() {}
    send::<GpuSource>();
};

impl GpuSource {
    /// Load NVML (`None`: the system's [`SYSTEM_LIBRARY`]) and list the GPUs.
    pub fn open(lib_path: Option<&Path>) -> Result<GpuSource, GpuError> {
        let nvml = load_nvml(lib_path)?;
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
            jobs: None,
            ended: Vec::new(),
            sweeps: 0,
        })
    }

    /// Labels each GPU's series with the job of the processes using it (see `jobs`).
    pub fn with_jobs(mut self, jobs: ProcessJobs) -> Self {
        self.jobs = Some(jobs);
        self
    }

    /// The series that ended because their GPU's job changed (or a job started or stopped
    /// using it): the caller sends what its sampler still holds of them and retires them.
    pub fn take_ended_series(&mut self) -> Vec<Series> {
        std::mem::take(&mut self.ended)
    }

    /// The NVML instance the source reads through (the hardware path reads the GPUs' PCI
    /// places through it too).
    pub fn nvml(&self) -> &Nvml {
        &self.nvml
    }

    /// The GPUs found at open, lost ones included.
    pub fn gpus(&self) -> impl Iterator<Item = &GpuInfo> {
        self.gpus.iter().map(|g| &g.info)
    }

    /// One sweep over the GPUs that still answer, at `now`, every reading stamped with it (on
    /// CLOCK_MONOTONIC, the sampler's clock). A GPU found lost in this sweep contributes nothing
    /// to it and sends one [`GpuEvent::Lost`], stamped with `now` on the wall clock.
    pub fn read(&mut self, now: MonoNs) -> Vec<Reading> {
        let mut readings = Vec::new();
        self.read_into(now, &mut Collect::new(&mut readings, now.0, |_| true));
        readings
    }

    /// [`read`](Self::read), handing each value to `sink` with its series and slot. Every
    /// metric is read at each sweep (NVML answers several in one call; the sink's `due` is
    /// not asked).
    pub fn read_into(&mut self, now: MonoNs, sink: &mut dyn ReadingSink) {
        self.sweeps += 1;
        // GPUs that answered again in this sweep's retry, read there already.
        let mut recovered = Vec::new();
        if self.sweeps.is_multiple_of(LOST_RETRY_EVERY_SWEEPS) {
            for gpu in self.gpus.iter_mut().filter(|g| g.lost) {
                // One failure more keeps it lost (no second event); an answer resets it.
                gpu.failed_sweeps = LOST_AFTER_FAILED_SWEEPS - 1;
                match gpu.sweep(&self.nvml, sink, self.jobs.as_mut(), &mut self.ended) {
                    Ok(()) => {
                        let (index, uuid) = (gpu.info.index, &gpu.info.uuid);
                        tracing::info!(gpu = index, %uuid, "GPU answers again: read again");
                        gpu.lost = false;
                        recovered.push(index);
                    }
                    Err(Lost(reason)) => {
                        tracing::debug!(gpu = gpu.info.index, "lost GPU still silent: {reason}");
                    }
                }
            }
        }
        let mut lost = Vec::new();
        for gpu in self
            .gpus
            .iter_mut()
            .filter(|g| !g.lost && !recovered.contains(&g.info.index))
        {
            match gpu.sweep(&self.nvml, sink, self.jobs.as_mut(), &mut self.ended) {
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
                        unix_ns: TimeBase::global().unix_ns(now),
                        gpu: gpu.info.index,
                        uuid: gpu.info.uuid.clone(),
                        reason,
                    });
                }
            }
        }
        if let Some(jobs) = self.jobs.as_mut() {
            jobs.end_sweep();
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
        EventThread::start(nvml, gpus, tx)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_says_nvml_not_found_in_one_line() {
        let err = GpuSource::open(Some(Path::new("/nonexistent/libnvidia-ml.so.1")))
            .err()
            .expect("no library there");
        assert!(matches!(err, GpuError::NotFound { .. }));
        assert_eq!(err.to_string(), "NVML not found: GPU metrics off");
    }
}
