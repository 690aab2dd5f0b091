//! One GPU: its identity and unchanging facts, found once, and one sweep of its metrics.

use std::{collections::HashSet, time::Instant};

use nvml_wrapper::{
    Device, GpmSample, Nvml,
    enum_wrappers::device::{Clock, PcieUtilCounter, TemperatureSensor},
    enums::{device::SampleValue, gpm::GpmMetricId},
    error::{NvmlError, nvml_try},
    gpm::gpm_metrics_get,
    struct_wrappers::device::FieldValueSample,
    structs::device::FieldId,
    sys_exports::field_id::{
        NVML_FI_DEV_NVLINK_LINK_COUNT, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
    },
};
use nvml_wrapper_sys::bindings::{nvmlFieldValue_t, nvmlGpmSample_t};

use super::{
    GPM_MIN_INTERVAL, GpuInfo, LOST_AFTER_FAILED_SWEEPS, catalogue::*, gpu_labels,
    jobs::ProcessJobs, series::Out,
};
use crate::{jobs::Job, sources::ReadingSink};
use monitor_sampler::Slot;
use monitor_wire::{Kind, Labels, Series, Value, names::metric};

pub(super) struct Gpu {
    pub(super) info: GpuInfo,
    /// `gpu` and `uuid`, and the job's labels while a job uses the GPU.
    pub(super) labels: Labels,
    /// The job using the GPU (its processes'), as of the last sweep.
    pub(super) job: Option<Job>,
    pub(super) lost: bool,
    pub(super) failed_sweeps: u32,
    /// (field id, scope id) of the batched field-value call.
    pub(super) fields: Vec<(u32, u32)>,
    /// The GPM sample kept for the next sweep, and when it was taken (GPM GPUs only).
    pub(super) gpm_prev: Option<(RawSample, Instant)>,
    /// Metrics whose failure has been logged already.
    pub(super) warned: HashSet<&'static str>,
    /// Every series this GPU has given, with its sampler slot, in sweep order: built once,
    /// as the IB source keeps one per file. Building a name and labels for each of a node's
    /// ~400 GPU values per sweep, then hashing them in the sampler, was most of this source's
    /// cost.
    pub(super) series: Vec<(Series, Slot)>,
}

/// A GPM sample kept across sweeps. `GpmSample` borrows the `Nvml` it came from, which
/// `GpuSource` owns, so the handle is kept raw and rewrapped for each use.
pub(super) struct RawSample(pub(super) nvmlGpmSample_t);

// SAFETY: a GPM sample is a heap buffer of the NVML library with no thread affinity;
// nvml-wrapper declares `GpmSample` Send for the same reason. It is used from one thread at a
// time (`GpuSource` is not Sync).
unsafe impl Send for RawSample {}

/// The reason a GPU is declared lost.
pub(super) struct Lost(pub(super) String);

pub(super) fn sample_u64(v: &SampleValue) -> Option<u64> {
    match *v {
        SampleValue::U32(v) => Some(v.into()),
        SampleValue::U64(v) => Some(v),
        SampleValue::I64(v) => u64::try_from(v).ok(),
        SampleValue::F64(_) => None,
    }
}

impl Gpu {
    /// Identity and the queries that do not change: done once, off the hot loop.
    pub(super) fn open(nvml: &Nvml, index: u32) -> Result<Gpu, (String, NvmlError)> {
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
            job: None,
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
    pub(super) fn check<T>(
        &mut self,
        what: &'static str,
        r: Result<T, NvmlError>,
    ) -> Result<Option<T>, Lost> {
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
    pub(super) fn failed(&mut self, what: &str, e: NvmlError) -> Result<(), Lost> {
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

    /// One sweep of this GPU, its values handed to `sink`. With `jobs`, the GPU's series
    /// carry the job of its processes; when that job changes, the series of the old labels
    /// are put in `ended` (their sampler and encoder entries are to be ended) and new ones
    /// start.
    pub(super) fn sweep(
        &mut self,
        nvml: &Nvml,
        sink: &mut dyn ReadingSink,
        jobs: Option<&mut ProcessJobs>,
        ended: &mut Vec<Series>,
    ) -> Result<(), Lost> {
        let device = match nvml.device_by_index(self.info.index) {
            Ok(d) => d,
            Err(e) => return self.failed("device handle", e),
        };
        // First in every sweep: cheap, and it tells whether the GPU answers at all.
        let utilization = match device.utilization_rates() {
            Ok(u) => Some(u),
            Err(NvmlError::NotSupported) => None,
            Err(e) => return self.failed("utilization", e),
        };
        self.failed_sweeps = 0;
        if let Some(jobs) = jobs {
            let job = jobs.job_of(&device);
            if job != self.job {
                tracing::debug!(
                    gpu = self.info.index,
                    "GPU job: {} -> {}",
                    self.job.as_ref().map_or("none".into(), Job::to_string),
                    job.as_ref().map_or("none".into(), Job::to_string)
                );
                ended.extend(self.series.drain(..).map(|(series, _)| series));
                self.labels = Labels::new(
                    gpu_labels(self.info.index, &self.info.uuid)
                        .iter()
                        .map(|(k, v)| (k.to_owned(), v.to_owned()))
                        .chain(
                            job.iter()
                                .flat_map(Job::labels)
                                .map(|(k, v)| (k.to_owned(), v)),
                        ),
                );
                self.job = job;
            }
        }
        // Out of `self` while the sweep runs, which also borrows `self` for its checks.
        let mut series = std::mem::take(&mut self.series);
        let labels = self.labels.clone();
        let mut out = Out {
            labels: &labels,
            series: &mut series,
            next: 0,
            sink,
        };
        if let Some(u) = utilization {
            out.gauge(
                metric::GPU_UTILIZATION_RATIO,
                Value::F64(f64::from(u.gpu) / 100.0),
            );
            out.gauge(
                metric::GPU_MEMORY_UTILIZATION_RATIO,
                Value::F64(f64::from(u.memory) / 100.0),
            );
        }
        let result = self.sweep_into(&device, nvml, &mut out);
        self.series = series;
        result
    }

    /// The sweep's metrics after utilization.
    fn sweep_into(
        &mut self,
        device: &Device<'_>,
        nvml: &Nvml,
        out: &mut Out<'_>,
    ) -> Result<(), Lost> {
        if let Some(m) = self.check("memory", device.memory_info())? {
            out.gauge(metric::GPU_MEMORY_TOTAL_BYTES, Value::U64(m.total));
            out.gauge(metric::GPU_MEMORY_RESERVED_BYTES, Value::U64(m.reserved));
            out.gauge(metric::GPU_MEMORY_USED_BYTES, Value::U64(m.used));
            out.gauge(metric::GPU_MEMORY_FREE_BYTES, Value::U64(m.free));
        }
        if let Some(mhz) = self.check("SM clock", device.clock_info(Clock::SM))? {
            out.gauge(
                metric::GPU_SM_CLOCK_HERTZ,
                Value::U64(u64::from(mhz) * 1_000_000),
            );
        }
        if let Some(mhz) = self.check("memory clock", device.clock_info(Clock::Memory))? {
            out.gauge(
                metric::GPU_MEMORY_CLOCK_HERTZ,
                Value::U64(u64::from(mhz) * 1_000_000),
            );
        }
        if let Some(c) = self.check("temperature", device.temperature(TemperatureSensor::Gpu))? {
            out.gauge(metric::GPU_TEMPERATURE_CELSIUS, Value::U64(c.into()));
        }
        if let Some(mw) = self.check("power", device.power_usage())? {
            out.gauge(metric::GPU_POWER_WATTS, Value::F64(f64::from(mw) / 1000.0));
        }
        if let Some(mj) = self.check("energy", device.total_energy_consumption())? {
            // In NVML's own unit, as dcgm-exporter does: an integer counter travels exactly,
            // where joules would need a fraction the wire does not carry for counters.
            out.counter(metric::GPU_ENERGY_MILLIJOULES_TOTAL, Value::U64(mj));
        }
        if let Some(reasons) = self.check("throttle reasons", device.current_throttle_reasons())? {
            for (flag, reason) in THROTTLE_REASONS {
                let active = u64::from(reasons.contains(flag));
                out.push(
                    metric::GPU_THROTTLE_ACTIVE,
                    Kind::Gauge,
                    &[("reason", reason)],
                    Value::U64(active),
                );
            }
        }
        // NVML reports KB/s over its last 20 ms; taken as KiB/s.
        if let Some(kbps) = self.check("PCIe tx", device.pcie_throughput(PcieUtilCounter::Send))? {
            out.gauge(
                metric::GPU_PCIE_TX_BYTES_PER_SECOND,
                Value::U64(u64::from(kbps) * 1024),
            );
        }
        if let Some(kbps) =
            self.check("PCIe rx", device.pcie_throughput(PcieUtilCounter::Receive))?
        {
            out.gauge(
                metric::GPU_PCIE_RX_BYTES_PER_SECOND,
                Value::U64(u64::from(kbps) * 1024),
            );
        }
        if let Some(n) = self.check("PCIe replays", device.pcie_replay_counter())? {
            out.counter(metric::GPU_PCIE_REPLAYS_TOTAL, Value::U64(n.into()));
        }
        // The link as trained against what it can do (the findings' gpu_pcie_degraded).
        for (what, name, value) in [
            (
                "PCIe generation",
                metric::GPU_PCIE_LINK_GENERATION,
                device.current_pcie_link_gen(),
            ),
            (
                "PCIe max generation",
                metric::GPU_PCIE_LINK_MAX_GENERATION,
                device.max_pcie_link_gen(),
            ),
            (
                "PCIe width",
                metric::GPU_PCIE_LINK_WIDTH_LANES,
                device.current_pcie_link_width(),
            ),
            (
                "PCIe max width",
                metric::GPU_PCIE_LINK_MAX_WIDTH_LANES,
                device.max_pcie_link_width(),
            ),
        ] {
            if let Some(v) = self.check(what, value)? {
                out.gauge(name, Value::U64(v.into()));
            }
        }
        let fields = field_values(nvml, device, &self.fields);
        if let Some(values) = self.check("field values", fields)? {
            self.push_fields(out, &values);
        }
        if self.info.gpm {
            self.gpm(nvml, device, out)?;
        }
        Ok(())
    }

    pub(super) fn push_fields(&self, out: &mut Out<'_>, values: &[Result<SampleValue, NvmlError>]) {
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
                metric::GPU_NVLINK_TX_BYTES_TOTAL,
            ),
            (
                NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
                metric::GPU_NVLINK_RX_BYTES_TOTAL,
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
    pub(super) fn gpm(
        &mut self,
        nvml: &Nvml,
        device: &Device<'_>,
        out: &mut Out<'_>,
    ) -> Result<(), Lost> {
        // The kept sample's time is taken after its call returned and `now` before this
        // one's starts, so the samples NVML took lie at least this far apart.
        let now = Instant::now();
        if self
            .gpm_prev
            .as_ref()
            .is_some_and(|(_, taken)| now.duration_since(*taken) <= GPM_MIN_INTERVAL)
        {
            return Ok(());
        }
        let Some(sample) = self.check("GPM sample", device.gpm_sample())? else {
            return Ok(());
        };
        let taken = Instant::now();
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
        self.gpm_prev = Some((RawSample(sample.into_handle()), taken));
        Ok(())
    }
}

/// One batched `nvmlDeviceGetFieldValues` call with per-entry scope ids (the NVLink link for
/// the data counters), which nvml-wrapper's `field_values_for` cannot set. Each entry
/// answers on its own.
pub(super) fn field_values(
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
