//! The probe catalogue and the loading/attaching of railscope's eBPF object.
//!
//! Probes come in families, one per kernel module that owns their hooks (ib_core, ib_uverbs,
//! rdma_cm). A family is loaded as its own instance of the embedded object, with globals
//! resolved from that module's BTF (and tracefs formats) at that moment, so a module loaded
//! after the agent started is probed with its own layout; a module unloaded drops its family.
//! Within a family each probe attaches on its own: a hook missing on one kernel leaves that
//! probe unavailable and the rest working.

pub mod btf_cache;
pub mod decode;
pub(crate) mod families;
pub mod layout;
pub mod names;
pub(crate) mod ring;

use std::{collections::BTreeSet, fmt};

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::{KProbe, ProgramError, RawTracePoint, TracePoint},
};
use monitor_common::{ProbeStat, events::DeviceEntry, maps, verbs::CounterKey};
use serde::Serialize;

use crate::{btf::BtfError, kernel::Kernel, tracefs::Tracefs};
use btf_cache::BtfCache;
use layout::{GlobalValue, Globals};
use names::KernelNames;

/// The eBPF object built from `monitor-ebpf` by build.rs.
pub static PROBES_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/railscope-probes"));

/// Where a program attaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    Kprobe(&'static str),
    Tracepoint {
        system: &'static str,
        event: &'static str,
    },
    /// A tracepoint whose program reads the tracepoint's arguments (kernel pointers) rather
    /// than its record.
    RawTracepoint(&'static str),
}

impl fmt::Display for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Hook::Kprobe(function) => write!(f, "kprobe:{function}"),
            Hook::Tracepoint { system, event } => write!(f, "tracepoint:{system}:{event}"),
            Hook::RawTracepoint(name) => write!(f, "raw_tracepoint:{name}"),
        }
    }
}

/// The kernel module whose code a family hooks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Family {
    IbCore,
    IbUverbs,
    RdmaCm,
}

impl Family {
    pub const ALL: [Family; 3] = [Family::IbCore, Family::IbUverbs, Family::RdmaCm];

    pub fn module(self) -> &'static str {
        match self {
            Family::IbCore => "ib_core",
            Family::IbUverbs => "ib_uverbs",
            Family::RdmaCm => "rdma_cm",
        }
    }

    /// What the operator loses while the family is not attached.
    pub fn feature(self) -> &'static str {
        match self {
            Family::IbCore => "IB event and verb probes",
            Family::IbUverbs => "user verbs probes",
            Family::RdmaCm => "rdma_cm probes",
        }
    }

    pub fn probes(self) -> impl Iterator<Item = &'static ProbeInfo> {
        CATALOGUE.iter().filter(move |p| p.family == self)
    }
}

/// Which layout (set of globals) a program needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Layout {
    IbEvent,
    Restrack,
    ModifyQp,
    Mad,
    Uverbs,
    RdmaCm,
    /// A device's identity and name only (its removal).
    Device,
}

impl Layout {
    pub const ALL: [Layout; 7] = [
        Layout::IbEvent,
        Layout::Restrack,
        Layout::ModifyQp,
        Layout::Mad,
        Layout::Uverbs,
        Layout::RdmaCm,
        Layout::Device,
    ];

    /// Every global the programs of this layout read. A global left unset would silently
    /// keep its compiled-in default, so a test checks that [`layout::resolve`] sets them all.
    pub fn required_globals(self) -> &'static [&'static str] {
        use monitor_common::globals::*;
        match self {
            Layout::IbEvent => &[
                IB_EVENT_DEVICE_OFFSET,
                IB_EVENT_ELEMENT_OFFSET,
                IB_EVENT_PORT_SIZE,
                IB_EVENT_TYPE_OFFSET,
                IB_DEVICE_NAME_SOURCE,
                IB_DEVICE_NAME_OFFSET,
                IB_DEVICE_INDEX_OFFSET,
            ],
            Layout::Restrack => &[
                RESTRACK_TYPE_OFFSET,
                RESTRACK_USER_OFFSET,
                RESTRACK_VALID_OFFSET,
                RESTRACK_TASK_OFFSET,
                TASK_CGROUPS_OFFSET,
                CSS_SET_DFL_CGRP_OFFSET,
                CGROUP_KN_OFFSET,
                KERNFS_NODE_ID_OFFSET,
                RESTRACK_ADD_VERB,
                RESTRACK_DEL_VERB,
                RESTRACK_DEVICE_DELTA,
                IB_PD_DEVICE_OFFSET,
                IB_CQ_DEVICE_OFFSET,
                IB_QP_DEVICE_OFFSET,
                IB_MR_DEVICE_OFFSET,
                IB_SRQ_DEVICE_OFFSET,
                IB_DEVICE_NAME_SOURCE,
                IB_DEVICE_NAME_OFFSET,
                IB_DEVICE_INDEX_OFFSET,
            ],
            Layout::ModifyQp => &[
                IB_QP_DEVICE_OFFSET,
                IB_QP_NUM_OFFSET,
                QP_ATTR_STATE_OFFSET,
                QP_ATTR_MASK_STATE,
                QP_STATE_ERR,
                IB_DEVICE_NAME_SOURCE,
                IB_DEVICE_NAME_OFFSET,
                IB_DEVICE_INDEX_OFFSET,
            ],
            Layout::Mad => &[MAD_WC_STATUS_FIELD_OFFSET],
            Layout::Uverbs => &[
                ATTRS_UFILE_OFFSET,
                UFILE_UCONTEXT_OFFSET,
                UCONTEXT_DEVICE_OFFSET,
                IB_CQ_DEVICE_OFFSET,
                IB_QP_DEVICE_OFFSET,
                IB_QP_NUM_OFFSET,
                IB_CQ_OWNER_OFFSET,
                IB_QP_OWNER_OFFSET,
                TASK_CGROUPS_OFFSET,
                CSS_SET_DFL_CGRP_OFFSET,
                CGROUP_KN_OFFSET,
                KERNFS_NODE_ID_OFFSET,
                IB_EVENT_TYPE_OFFSET,
                IB_EVENT_ELEMENT_OFFSET,
                IB_DEVICE_NAME_SOURCE,
                IB_DEVICE_NAME_OFFSET,
                IB_DEVICE_INDEX_OFFSET,
            ],
            Layout::Device => &[
                IB_DEVICE_NAME_SOURCE,
                IB_DEVICE_NAME_OFFSET,
                IB_DEVICE_INDEX_OFFSET,
            ],
            Layout::RdmaCm => &[
                CM_ID_HANDLER_OFFSET,
                CM_LISTEN_HANDLER,
                CM_EVENT_OFFSET,
                CM_STATUS_OFFSET,
                CM_EVENT_REJECTED,
            ],
        }
    }
}

/// One program of the object and what it needs.
#[derive(Clone, Copy, Debug)]
pub struct ProbeInfo {
    /// The program's name in the object (the function name in monitor-ebpf).
    pub program: &'static str,
    pub hook: Hook,
    pub family: Family,
    pub layout: Layout,
    /// What it observes, for `railscope probes` and docs/probes.md.
    pub observes: &'static str,
}

const fn kprobe(
    program: &'static str,
    function: &'static str,
    family: Family,
    layout: Layout,
    observes: &'static str,
) -> ProbeInfo {
    ProbeInfo {
        program,
        hook: Hook::Kprobe(function),
        family,
        layout,
        observes,
    }
}

const fn tracepoint(
    program: &'static str,
    system: &'static str,
    event: &'static str,
    family: Family,
    layout: Layout,
    observes: &'static str,
) -> ProbeInfo {
    ProbeInfo {
        program,
        hook: Hook::Tracepoint { system, event },
        family,
        layout,
        observes,
    }
}

/// Every probe railscope has, in the order the table shows them.
pub const CATALOGUE: &[ProbeInfo] = &[
    kprobe(
        "ib_dispatch_event",
        "ib_dispatch_event",
        Family::IbCore,
        Layout::IbEvent,
        "port and device events (PORT_ACTIVE, PORT_ERR, DEVICE_FATAL, ...)",
    ),
    kprobe(
        "rdma_restrack_add",
        "rdma_restrack_add",
        Family::IbCore,
        Layout::Restrack,
        "PD/CQ/QP/MR/SRQ/user context/cm_id creation",
    ),
    kprobe(
        "rdma_restrack_del",
        "rdma_restrack_del",
        Family::IbCore,
        Layout::Restrack,
        "user context and cm_id destruction (of added entries only)",
    ),
    kprobe(
        "ib_dealloc_pd_user",
        "ib_dealloc_pd_user",
        Family::IbCore,
        Layout::Restrack,
        "PD deallocation",
    ),
    kprobe(
        "ib_destroy_cq_user",
        "ib_destroy_cq_user",
        Family::IbCore,
        Layout::Restrack,
        "CQ destruction",
    ),
    kprobe(
        "ib_destroy_qp_user",
        "ib_destroy_qp_user",
        Family::IbCore,
        Layout::Restrack,
        "QP destruction",
    ),
    kprobe(
        "ib_dereg_mr_user",
        "ib_dereg_mr_user",
        Family::IbCore,
        Layout::Restrack,
        "MR deregistration",
    ),
    kprobe(
        "ib_destroy_srq_user",
        "ib_destroy_srq_user",
        Family::IbCore,
        Layout::Restrack,
        "SRQ destruction",
    ),
    kprobe(
        "ib_modify_qp_with_udata",
        "ib_modify_qp_with_udata",
        Family::IbCore,
        Layout::ModifyQp,
        "modify_qp by target state; QP moves to ERR",
    ),
    kprobe(
        "ib_dealloc_device",
        "ib_dealloc_device",
        Family::IbCore,
        Layout::Device,
        "devices going away (their names and counters are then released)",
    ),
    tracepoint(
        "ib_mad_send_done_handler",
        "ib_mad",
        "ib_mad_send_done_handler",
        Family::IbCore,
        Layout::Mad,
        "MAD sends completed with an error",
    ),
    tracepoint(
        "ib_mad_send_done_resend",
        "ib_mad",
        "ib_mad_send_done_resend",
        Family::IbCore,
        Layout::Mad,
        "MAD retries",
    ),
    kprobe(
        "ib_uverbs_post_send",
        "ib_uverbs_post_send",
        Family::IbUverbs,
        Layout::Uverbs,
        "post_send doorbells the kernel sees (none on mlx5)",
    ),
    kprobe(
        "ib_uverbs_reg_dmabuf_mr",
        "ib_uverbs_handler_UVERBS_METHOD_REG_DMABUF_MR",
        Family::IbUverbs,
        Layout::Uverbs,
        "dmabuf (GPU memory) MR registrations",
    ),
    kprobe(
        "ib_uverbs_qp_event_handler",
        "ib_uverbs_qp_event_handler",
        Family::IbUverbs,
        Layout::Uverbs,
        "async errors of user QPs (QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR, ...)",
    ),
    kprobe(
        "ib_uverbs_cq_event_handler",
        "ib_uverbs_cq_event_handler",
        Family::IbUverbs,
        Layout::Uverbs,
        "async errors of user CQs (CQ_ERR)",
    ),
    kprobe(
        "uverbs_ib_dealloc_device",
        "ib_dealloc_device",
        Family::IbUverbs,
        Layout::Device,
        "devices going away, for this family's own device names",
    ),
    ProbeInfo {
        program: "cm_event_handler",
        hook: Hook::RawTracepoint("cm_event_handler"),
        family: Family::RdmaCm,
        layout: Layout::RdmaCm,
        observes: "rdma_cm events delivered to consumers, rejects by reason",
    },
];

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

/// A probe's state, as `railscope probes` and the agent report it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "status", content = "reason", rename_all = "lowercase")]
pub enum Status {
    Attached,
    Unavailable(String),
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Status::Attached => f.write_str("attached"),
            Status::Unavailable(reason) => write!(f, "unavailable: {reason}"),
        }
    }
}

/// One row of the probe table.
#[derive(Clone, Debug, Serialize)]
pub struct ProbeReport {
    pub probe: &'static str,
    pub hook: String,
    #[serde(flatten)]
    pub status: Status,
}

impl ProbeReport {
    pub fn new(info: &ProbeInfo, status: Status) -> Self {
        Self {
            probe: info.program,
            hook: info.hook.to_string(),
            status,
        }
    }
}

/// Renders the probe table as aligned text columns.
pub fn render_table(rows: &[ProbeReport]) -> String {
    let probe_w = rows
        .iter()
        .map(|r| r.probe.len())
        .chain([5])
        .max()
        .unwrap_or(5);
    let hook_w = rows
        .iter()
        .map(|r| r.hook.len())
        .chain([4])
        .max()
        .unwrap_or(4);
    let mut out = format!("{:probe_w$}  {:hook_w$}  STATUS\n", "PROBE", "HOOK");
    for row in rows {
        out += &format!(
            "{:probe_w$}  {:hook_w$}  {}\n",
            row.probe, row.hook, row.status
        );
    }
    out
}

/// Overrides the size of each family's event ring buffer (bytes; a power of two, at least a
/// page): a test knob, to overflow it on purpose (the `ring-overflow` scenario). Not a
/// setting: the built-in 256 KiB holds thousands of events, far more than a node raises
/// between two drains.
pub const EVENT_RING_BYTES_ENV: &str = "RAILSCOPE_EVENT_RING_BYTES";

/// The event ring size [`EVENT_RING_BYTES_ENV`] asks for, if it is a valid one.
fn event_ring_override() -> Option<u32> {
    let text = std::env::var(EVENT_RING_BYTES_ENV).ok()?;
    match text.trim().parse::<u32>() {
        Ok(bytes) if bytes.is_power_of_two() && bytes >= 4096 => Some(bytes),
        _ => {
            tracing::warn!(
                "{EVENT_RING_BYTES_ENV}={text:?} ignored: not a power of two of at least 4096"
            );
            None
        }
    }
}

/// Loads a fresh instance of the object with the given load-time globals.
fn load_object(globals: &Globals) -> Result<Ebpf, aya::EbpfError> {
    let mut loader = EbpfLoader::new();
    if let Some(bytes) = event_ring_override() {
        loader.map_max_entries("EVENTS", bytes);
    }
    for (name, value) in globals {
        match value {
            GlobalValue::U32(v) => loader.override_global(name, v, true),
            GlobalValue::U64(v) => loader.override_global(name, v, true),
            GlobalValue::U32s(v) => loader.override_global(name, v, true),
            GlobalValue::I32s(v) => loader.override_global(name, v, true),
        };
    }
    loader.load(PROBES_OBJECT)
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

/// Result of asking the kernel's verifier about one program.
#[derive(Debug)]
pub struct VerifierResult {
    pub program: String,
    pub result: Result<(), ProgramError>,
}

/// Loads every program of the object into the kernel (without attaching), with default
/// globals, and reports what the verifier said about each. Used by the host tests and by
/// `railscope probes --verify`.
pub fn verify_all() -> Result<Vec<VerifierResult>, aya::EbpfError> {
    let mut ebpf = load_object(&Vec::new())?;
    let mut results = Vec::new();
    for (name, program) in ebpf.programs_mut() {
        let result = match program {
            aya::programs::Program::KProbe(p) => p.load(),
            aya::programs::Program::TracePoint(p) => p.load(),
            aya::programs::Program::RawTracePoint(p) => p.load(),
            _ => Err(ProgramError::UnexpectedProgramType),
        };
        results.push(VerifierResult {
            program: name.to_owned(),
            result,
        });
    }
    results.sort_by(|a, b| a.program.cmp(&b.program));
    Ok(results)
}

#[cfg(test)]
mod tests {
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

    use super::*;

    #[test]
    fn table_lists_every_probe_with_its_reason() {
        let rows = vec![ProbeReport::new(
            &CATALOGUE[0],
            Status::Unavailable(
                Unavailable::ModuleNotLoaded {
                    module: "ib_core",
                    feature: "IB event and verb probes",
                }
                .to_string(),
            ),
        )];
        let table = render_table(&rows);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("PROBE") && lines[0].contains("HOOK"));
        assert!(lines[1].contains("ib_dispatch_event"));
        assert!(lines[1].contains("kprobe:ib_dispatch_event"));
        assert!(
            lines[1]
                .ends_with("unavailable: ib_core not loaded: IB event and verb probes inactive")
        );
    }

    #[test]
    fn every_family_has_probes_and_names_are_unique() {
        for family in Family::ALL {
            assert!(family.probes().count() > 0, "{family:?}");
        }
        let names: BTreeSet<&str> = CATALOGUE.iter().map(|p| p.program).collect();
        assert_eq!(names.len(), CATALOGUE.len());
    }
}
