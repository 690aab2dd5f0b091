//! The probe catalogue and the loading/attaching of railscope's eBPF object.
//!
//! Probes come in families that share load-time globals and maps (today: the IB event family).
//! A family is loaded as its own instance of the embedded object, with globals resolved from
//! BTF at that moment, so a family whose kernel module appears later (ib_core loaded after the
//! agent started) is loaded and attached then, with that module's layout.

pub mod ib_event;

use std::fmt;

use aya::{
    Ebpf, EbpfLoader,
    maps::{MapData, PerCpuArray, RingBuf},
    programs::{KProbe, ProgramError},
};
use monitor_common::{ProbeStat, maps};
use serde::Serialize;

use crate::{
    btf::{Btf, BtfError},
    kernel::Kernel,
};
use ib_event::{IbEventLayout, IbEventNames};

/// The eBPF object built from `monitor-ebpf` by build.rs.
pub static PROBES_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/railscope-probes"));

/// Where a program attaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    Kprobe(&'static str),
}

impl fmt::Display for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Hook::Kprobe(function) => write!(f, "kprobe:{function}"),
        }
    }
}

/// One program of the object and what it needs.
#[derive(Clone, Copy, Debug)]
pub struct ProbeInfo {
    /// The program's name in the object (the function name in monitor-ebpf).
    pub program: &'static str,
    pub hook: Hook,
    /// The kernel module that defines the hooked function.
    pub module: &'static str,
    /// What the operator loses while it is not attached, for status lines.
    pub feature: &'static str,
}

/// Every probe railscope has, in the order the table shows them.
pub const CATALOGUE: &[ProbeInfo] = &[ProbeInfo {
    program: "ib_dispatch_event",
    hook: Hook::Kprobe("ib_dispatch_event"),
    module: "ib_core",
    feature: "IB event probes",
}];

/// Why a probe is not attached.
#[derive(Debug, thiserror::Error)]
pub enum Unavailable {
    #[error("{module} not loaded: {feature} inactive")]
    ModuleNotLoaded {
        module: &'static str,
        feature: &'static str,
    },
    #[error("kernel has no kprobe support (CONFIG_KPROBES): {feature} inactive")]
    NoKprobes { feature: &'static str },
    #[error("kernel BTF unusable, so struct offsets are unknown: {0}")]
    Btf(#[from] BtfError),
    #[error("eBPF object failed to load: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("program {program} not in the eBPF object")]
    MissingProgram { program: &'static str },
    #[error("program {program} rejected: {source}")]
    Program {
        program: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("map {map}: {detail}")]
    Map { map: &'static str, detail: String },
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

/// Loads a fresh instance of the object with the given load-time globals.
fn load_object(globals: &[(&'static str, u32)]) -> Result<Ebpf, aya::EbpfError> {
    let mut loader = EbpfLoader::new();
    for (name, value) in globals {
        loader.override_global(name, value, true);
    }
    loader.load(PROBES_OBJECT)
}

fn kprobe<'a>(ebpf: &'a mut Ebpf, program: &'static str) -> Result<&'a mut KProbe, Unavailable> {
    ebpf.program_mut(program)
        .ok_or(Unavailable::MissingProgram { program })?
        .try_into()
        .map_err(|source| Unavailable::Program { program, source })
}

/// The IB event family, attached: the loaded object, its ring buffer and the names to decode.
pub struct IbEventProbe {
    /// Holds the attachment: dropping it detaches the kprobe.
    pub attachment: Attachment,
    pub events: RingBuf<MapData>,
    pub names: IbEventNames,
}

/// A loaded, attached object and its self-monitoring counters.
pub struct Attachment {
    _ebpf: Ebpf,
    stats: PerCpuArray<MapData, u64>,
}

impl Attachment {
    /// Events the probes saw but could not deliver because the ring buffer was full.
    pub fn dropped_ib_events(&self) -> u64 {
        self.stats
            .get(&(ProbeStat::IbEventsDropped as u32), 0)
            .map(|per_cpu| per_cpu.iter().sum())
            .unwrap_or(0)
    }
}

impl IbEventProbe {
    pub const INFO: &'static ProbeInfo = &CATALOGUE[0];

    /// Loads and attaches the kprobe on `ib_dispatch_event` if this kernel can have it now.
    pub fn attach(kernel: &Kernel) -> Result<Self, Unavailable> {
        let info = Self::INFO;
        if !kernel.module_present(info.module) {
            return Err(Unavailable::ModuleNotLoaded {
                module: info.module,
                feature: info.feature,
            });
        }
        if !kernel.has_kprobes() {
            return Err(Unavailable::NoKprobes {
                feature: info.feature,
            });
        }
        // ib_core built into the kernel has its types in vmlinux; as a module, in its split BTF.
        let btf = Btf::from_files(
            &kernel.vmlinux_btf(),
            kernel.module_btf(info.module).as_deref(),
        )?;
        let layout = IbEventLayout::from_btf(&btf)?;
        let names = IbEventNames::from_btf(&btf)?;
        tracing::debug!(?layout, "resolved struct ib_event from BTF");

        let mut ebpf = load_object(&layout.globals())?;
        let program = kprobe(&mut ebpf, info.program)?;
        let Hook::Kprobe(function) = info.hook;
        program
            .load()
            .and_then(|()| program.attach(function, 0).map(drop))
            .map_err(|source| Unavailable::Program {
                program: info.program,
                source,
            })?;
        let events = take_map(&mut ebpf, maps::IB_EVENTS)?;
        let stats = take_map(&mut ebpf, maps::PROBE_STATS)?;
        Ok(Self {
            attachment: Attachment { _ebpf: ebpf, stats },
            events,
            names,
        })
    }
}

fn take_map<T>(ebpf: &mut Ebpf, map: &'static str) -> Result<T, Unavailable>
where
    T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let raw = ebpf.take_map(map).ok_or_else(|| Unavailable::Map {
        map,
        detail: "not in the eBPF object".into(),
    })?;
    T::try_from(raw).map_err(|e| Unavailable::Map {
        map,
        detail: e.to_string(),
    })
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
    let mut ebpf = load_object(&[])?;
    let mut results = Vec::new();
    for (name, program) in ebpf.programs_mut() {
        let result = match program {
            aya::programs::Program::KProbe(p) => p.load(),
            other => Err(ProgramError::UnexpectedProgramType).inspect_err(|_| {
                tracing::warn!(program = name, kind = ?other.prog_type(), "unexpected program type")
            }),
        };
        results.push(VerifierResult {
            program: name.to_owned(),
            result,
        });
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_lists_every_probe_with_its_reason() {
        let rows = vec![ProbeReport::new(
            &CATALOGUE[0],
            Status::Unavailable(
                Unavailable::ModuleNotLoaded {
                    module: "ib_core",
                    feature: "IB event probes",
                }
                .to_string(),
            ),
        )];
        let table = render_table(&rows);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("PROBE") && lines[0].contains("HOOK"));
        assert!(lines[1].contains("ib_dispatch_event"));
        assert!(lines[1].contains("kprobe:ib_dispatch_event"));
        assert!(lines[1].ends_with("unavailable: ib_core not loaded: IB event probes inactive"));
    }

    #[test]
    fn catalogue_programs_exist_in_the_object() {
        let ebpf = aya_obj_programs();
        for info in CATALOGUE {
            assert!(
                ebpf.contains(&info.program.to_owned()),
                "{} missing",
                info.program
            );
        }
    }

    /// Program names in the embedded object, read without loading anything into the kernel.
    fn aya_obj_programs() -> Vec<String> {
        let ebpf = EbpfLoader::new().load(PROBES_OBJECT);
        match ebpf {
            Ok(ebpf) => ebpf.programs().map(|(n, _)| n.to_owned()).collect(),
            // Without privileges maps cannot be created; the object still parses.
            Err(e) => panic!("embedded eBPF object does not load its maps: {e}"),
        }
    }
}
