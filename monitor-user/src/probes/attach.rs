//! Attaching: a family's instance of the object loaded with the globals its module's BTF
//! gives, each of its probes attached where this kernel allows, and its maps (events,
//! counters, device names, losses) read while it stays attached.

use std::collections::BTreeSet;

use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::{KProbe, ProgramError, RawTracePoint, TracePoint},
};
use monitor_common::{ProbeStat, events::DeviceEntry, maps, verbs::CounterKey};

use super::{
    btf_cache::BtfCache,
    catalogue::{Family, Hook, Layout, ProbeInfo},
    layout::{self, Globals},
    names::KernelNames,
    object::load_object,
    status::{ProbeReport, Status},
};
use crate::{btf::BtfError, kernel::Kernel, tracefs::Tracefs};

/// Why a probe (or a whole family) is not attached.
#[derive(Debug, thiserror::Error)]
pub enum Unavailable {
    #[error("{module} not loaded: {feature} inactive")]
    ModuleNotLoaded {
        module: &'static str,
        feature: &'static str,
    },
    #[error("kernel has no kprobe support (CONFIG_KPROBES)")]
    NoKprobes,
    #[error("kernel BTF unusable, so struct offsets are unknown: {0}")]
    Btf(#[from] BtfError),
    #[error("layout unknown: {0}")]
    Layout(String),
    #[error("eBPF object failed to load: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("program {program} not in the eBPF object")]
    MissingProgram { program: &'static str },
    #[error("{0}")]
    Program(String),
    #[error("map {map}: {detail}")]
    Map { map: &'static str, detail: String },
    #[error("no probe of the family attached")]
    NothingAttached,
}

/// A family, loaded, with at least one probe attached.
pub struct AttachedFamily {
    pub family: Family,
    /// Keeps the programs attached: dropping it detaches them.
    _ebpf: Ebpf,
    /// One row per probe of the family (some may be unavailable).
    pub statuses: Vec<ProbeReport>,
    events: Option<RingBuf<MapData>>,
    counts: PerCpuHashMap<MapData, CounterKey, u64>,
    device_names: BpfHashMap<MapData, u64, DeviceEntry>,
    stats: PerCpuArray<MapData, u64>,
    pub names: KernelNames,
}

/// What a family's probes saw but could not deliver, since it attached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeLosses {
    /// Events lost to a full ring buffer.
    pub events: u64,
    /// Verb counts lost to a full `VERB_COUNTS`.
    pub counts: u64,
    /// Devices left unnamed by a full `DEVICE_NAMES`.
    pub device_names: u64,
}

impl std::ops::Add for ProbeLosses {
    type Output = Self;
    fn add(self, o: Self) -> Self {
        Self {
            events: self.events + o.events,
            counts: self.counts + o.counts,
            device_names: self.device_names + o.device_names,
        }
    }
}

/// A device `ib_dealloc_device` freed, still in `DEVICE_NAMES`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemovedDevice {
    pub key: u64,
    pub name: String,
    /// CLOCK_MONOTONIC nanoseconds of the removal.
    pub removed_ns: u64,
}

/// How a device the probes could not name is shown: `dev#<index>`.
pub fn unnamed_device(key: u64) -> String {
    format!("dev#{}", key.wrapping_sub(1))
}

/// Why a family did not attach, with a row per probe.
#[derive(Debug)]
pub struct FamilyUnavailable {
    pub reason: Unavailable,
    pub rows: Vec<ProbeReport>,
}

/// One summed counter with the device's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawCount {
    pub device: String,
    pub key: CounterKey,
    pub value: u64,
}

impl AttachedFamily {
    /// Loads the family's instance and attaches each of its probes that this kernel allows.
    /// Blocks (BTF, object load, verifier): the agent calls it on a blocking thread.
    pub fn attach(
        family: Family,
        kernel: &Kernel,
        btfs: &BtfCache,
    ) -> Result<Self, Box<FamilyUnavailable>> {
        let fail_all = |reason: Unavailable| {
            let rows = family
                .probes()
                .map(|p| ProbeReport::new(p, Status::Unavailable(reason.to_string())))
                .collect();
            Box::new(FamilyUnavailable { reason, rows })
        };
        if !kernel.module_present(family.module()) {
            return Err(fail_all(Unavailable::ModuleNotLoaded {
                module: family.module(),
                feature: family.feature(),
            }));
        }
        // A module built into the kernel has its types in vmlinux; a loaded one, in its split BTF.
        let btf = btfs
            .module(family.module())
            .map_err(|e| fail_all(e.into()))?;
        let mut names = KernelNames::from_btf(&btf);
        if family == Family::RdmaCm
            && kernel.module_btf("ib_cm").is_some()
            && let Ok(cm) = btfs.module("ib_cm")
        {
            names.merge(&KernelNames::from_btf(&cm));
        }
        let tracefs = Tracefs::find_or_mount(kernel.sys_root()).map_err(|e| e.to_string());

        let layouts: BTreeSet<Layout> = family.probes().map(|p| p.layout).collect();
        let resolved: Vec<(Layout, Result<Globals, String>)> = layouts
            .into_iter()
            .map(|l| {
                let result = layout::resolve(
                    l,
                    &btf,
                    tracefs.as_ref().map_err(String::as_str),
                    &kernel.kallsyms(),
                );
                (l, result.map_err(|e| e.to_string()))
            })
            .collect();
        let mut globals: Globals = Vec::new();
        for (_, result) in &resolved {
            for (name, value) in result.iter().flatten() {
                globals.retain(|(n, _)| n != name);
                globals.push((name, value.clone()));
            }
        }
        tracing::debug!(?family, ?globals, "load-time globals");
        let mut ebpf = load_object(&globals).map_err(|e| fail_all(e.into()))?;

        let mut statuses = Vec::new();
        for probe in family.probes() {
            let layout_result = resolved
                .iter()
                .find(|(l, _)| *l == probe.layout)
                .map(|(_, r)| r.as_ref().map(drop));
            let status = match layout_result {
                Some(Err(reason)) => Status::Unavailable(format!("layout unknown: {reason}")),
                _ => match attach_probe(&mut ebpf, probe, kernel, tracefs.as_ref().ok()) {
                    Ok(()) => Status::Attached,
                    Err(e) => Status::Unavailable(e.to_string()),
                },
            };
            statuses.push(ProbeReport::new(probe, status));
        }
        if !statuses.iter().any(|s| s.status == Status::Attached) {
            return Err(Box::new(FamilyUnavailable {
                reason: Unavailable::NothingAttached,
                rows: statuses,
            }));
        }
        let take = |ebpf: &mut Ebpf, map: &'static str| {
            ebpf.take_map(map).ok_or_else(|| Unavailable::Map {
                map,
                detail: "not in the eBPF object".into(),
            })
        };
        let maps = (|| -> Result<_, Unavailable> {
            let events =
                RingBuf::try_from(take(&mut ebpf, maps::EVENTS)?).map_err(map_err(maps::EVENTS))?;
            let counts = PerCpuHashMap::try_from(take(&mut ebpf, maps::VERB_COUNTS)?)
                .map_err(map_err(maps::VERB_COUNTS))?;
            let device_names = BpfHashMap::try_from(take(&mut ebpf, maps::DEVICE_NAMES)?)
                .map_err(map_err(maps::DEVICE_NAMES))?;
            let stats = PerCpuArray::try_from(take(&mut ebpf, maps::PROBE_STATS)?)
                .map_err(map_err(maps::PROBE_STATS))?;
            Ok((events, counts, device_names, stats))
        })();
        let (events, counts, device_names, stats) = maps.map_err(fail_all)?;
        Ok(Self {
            family,
            _ebpf: ebpf,
            statuses,
            events: Some(events),
            counts,
            device_names,
            stats,
            names,
        })
    }

    /// The ring buffer of events, for a reader task (taken once).
    pub fn take_events(&mut self) -> Option<RingBuf<MapData>> {
        self.events.take()
    }

    /// What the probes saw but could not deliver.
    pub fn losses(&self) -> ProbeLosses {
        ProbeLosses {
            events: self.stat(ProbeStat::EventsDropped),
            counts: self.stat(ProbeStat::CountsDropped),
            device_names: self.stat(ProbeStat::DeviceNamesFull),
        }
    }

    fn stat(&self, stat: ProbeStat) -> u64 {
        self.stats
            .get(&(stat as u32), 0)
            .map(|per_cpu| per_cpu.iter().sum())
            .unwrap_or(0)
    }

    /// The name of the device a counter key or event record names by its key: empty for 0,
    /// [`unnamed_device`] if the probes could not read its name (or had no room for it).
    pub fn device_name(&self, device: u64) -> String {
        if device == 0 {
            return String::new();
        }
        self.device_names
            .get(&device, 0)
            .map(|e| monitor_common::events::name_str(&e.name).to_owned())
            .unwrap_or_else(|_| unnamed_device(device))
    }

    /// Devices that `ib_dealloc_device` freed: (key, name, kernel time of the removal).
    pub fn removed_devices(&self) -> Vec<RemovedDevice> {
        self.device_names
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, e)| e.removed_ns != 0)
            .map(|(key, e)| RemovedDevice {
                key,
                name: monitor_common::events::name_str(&e.name).to_owned(),
                removed_ns: e.removed_ns,
            })
            .collect()
    }

    /// Forgets a removed device: deletes its counters from `VERB_COUNTS` and its entry from
    /// `DEVICE_NAMES`; returns how many counter keys went.
    pub fn remove_device(&mut self, device: u64) -> usize {
        let keys: Vec<CounterKey> = self
            .counts
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.device == device)
            .collect();
        let removed = keys
            .iter()
            .filter(|k| self.counts.remove(k).is_ok())
            .count();
        let _ = self.device_names.remove(&device);
        removed
    }

    /// Entries in `DEVICE_NAMES` now.
    pub fn device_entries(&self) -> usize {
        self.device_names.keys().filter(Result::is_ok).count()
    }

    /// Deletes the counters of the given cgroups from `VERB_COUNTS` (their jobs ended and
    /// their final values are sent) and returns how many keys went.
    pub fn remove_counts(&mut self, cgroups: &std::collections::HashSet<u64>) -> usize {
        let keys: Vec<CounterKey> = self
            .counts
            .keys()
            .filter_map(Result::ok)
            .filter(|k| cgroups.contains(&k.cgroup))
            .collect();
        keys.iter()
            .filter(|k| self.counts.remove(k).is_ok())
            .count()
    }

    /// Keys in `VERB_COUNTS` now.
    pub fn count_keys(&self) -> usize {
        self.counts.keys().filter(Result::is_ok).count()
    }

    /// Every counter, summed over CPUs, with device names resolved.
    pub fn counts(&self) -> Vec<RawCount> {
        let mut out = Vec::new();
        for entry in self.counts.iter() {
            let Ok((key, per_cpu)) = entry else { continue };
            out.push(RawCount {
                device: self.device_name(key.device),
                key,
                value: per_cpu.iter().sum(),
            });
        }
        out
    }
}

fn map_err(map: &'static str) -> impl Fn(aya::maps::MapError) -> Unavailable {
    move |e| Unavailable::Map {
        map,
        detail: e.to_string(),
    }
}

fn attach_probe(
    ebpf: &mut Ebpf,
    probe: &ProbeInfo,
    kernel: &Kernel,
    tracefs: Option<&Tracefs>,
) -> Result<(), Unavailable> {
    let program = ebpf
        .program_mut(probe.program)
        .ok_or(Unavailable::MissingProgram {
            program: probe.program,
        })?;
    let rejected =
        |e: ProgramError| Unavailable::Program(format!("{}: {}", probe.hook, with_causes(&e)));
    match probe.hook {
        Hook::Kprobe(function) => {
            if !kernel.has_kprobes() {
                return Err(Unavailable::NoKprobes);
            }
            let p: &mut KProbe = program.try_into().map_err(rejected)?;
            p.load().map_err(rejected)?;
            p.attach(function, 0).map_err(rejected)?;
        }
        Hook::Tracepoint { system, event } => {
            let Some(tracefs) = tracefs else {
                return Err(Unavailable::Layout("tracefs is not mounted".into()));
            };
            if !tracefs.has_event(system, event) {
                return Err(Unavailable::Program(format!(
                    "tracepoint {system}:{event} does not exist on this kernel"
                )));
            }
            let p: &mut TracePoint = program.try_into().map_err(rejected)?;
            p.load().map_err(rejected)?;
            p.attach(system, event).map_err(rejected)?;
        }
        Hook::RawTracepoint(name) => {
            let p: &mut RawTracePoint = program.try_into().map_err(rejected)?;
            p.load().map_err(rejected)?;
            p.attach(name).map_err(rejected)?;
        }
    }
    Ok(())
}

/// An error with the errors beneath it (aya's "`perf_event_open` failed" carries the errno
/// only as its source: "Operation not permitted" is what tells a refused call from others).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let next = c.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use aya::programs::ProgramError;

    #[test]
    fn a_refused_system_call_names_its_errno() {
        let refused = ProgramError::SyscallError(aya::sys::SyscallError {
            call: "perf_event_open",
            io_error: std::io::Error::from_raw_os_error(libc::EPERM),
        });
        let text = super::with_causes(&refused);
        assert!(text.starts_with("`perf_event_open` failed: "), "{text}");
        assert!(text.contains("Operation not permitted"), "{text}");
    }
}
