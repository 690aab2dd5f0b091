//! The plan of a device: which files it has (ports, their attributes, counter files) and the
//! series each one feeds, from listing its directories when it appears and again now and then.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    time::Instant,
};

use super::{
    PREFIX, SysfsError,
    kept_file::OpenFile,
    link::PortLink,
    listing::{list_dir, list_files},
    saturation::{Limit, pma_limit},
};
use monitor_sampler::Slot;
use monitor_wire::{Kind, Labels, Series, names::metric};

/// How a counter file's number becomes a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Convert {
    Count,
    /// `port_xmit_data` and `port_rcv_data` count 4-byte words.
    Words,
    /// `hw_counters/lifespan`: milliseconds, sent as a gauge in seconds.
    LifespanMs,
}

/// A series this source reads, with the slot its sink keeps for it.
#[derive(Debug)]
pub(super) struct Tracked {
    pub(super) series: Series,
    pub(super) slot: Slot,
}

impl Tracked {
    pub(super) fn new(series: Series) -> Self {
        Self {
            series,
            slot: Slot::default(),
        }
    }
}

#[derive(Debug)]
pub(super) struct CounterFile {
    pub(super) file: OpenFile,
    pub(super) tracked: Tracked,
    pub(super) convert: Convert,
    /// Where the counter stops, for a PMA counter of `counters/` (see `saturation.rs`).
    pub(super) limit: Option<Limit>,
    /// `railscope_ib_counter_saturated` of this counter: made the first time the counter is
    /// found at its maximum, then sent (1 or 0) with each of its values.
    pub(super) saturated: Option<Tracked>,
}

#[derive(Debug)]
pub(super) struct PortPlan {
    pub(super) link: PortLink,
    pub(super) state: OpenFile,
    pub(super) phys_state: OpenFile,
    pub(super) rate: OpenFile,
    pub(super) link_layer: OpenFile,
    pub(super) state_series: Tracked,
    pub(super) phys_state_series: Tracked,
    pub(super) rate_series: Tracked,
    pub(super) width_series: Tracked,
    /// `railscope_ib_port_link_layer_info` with the link layer last read as a label.
    pub(super) link_layer_series: Option<Tracked>,
    pub(super) counters: Vec<CounterFile>,
}

/// One device's files, from listing its directories.
#[derive(Debug)]
pub(super) struct DevicePlan {
    pub(super) dir: PathBuf,
    pub(super) ports: Vec<PortPlan>,
    pub(super) counters: Vec<CounterFile>,
    pub(super) planned_at: Instant,
    /// A file listed in the plan was gone: list the directories again at the next read.
    pub(super) stale: bool,
}

impl DevicePlan {
    /// Every file of the plan.
    fn files_mut(&mut self) -> impl Iterator<Item = &mut OpenFile> {
        self.ports
            .iter_mut()
            .flat_map(|p| {
                [
                    &mut p.state,
                    &mut p.phys_state,
                    &mut p.rate,
                    &mut p.link_layer,
                ]
                .into_iter()
                .chain(p.counters.iter_mut().map(|c| &mut c.file))
            })
            .chain(self.counters.iter_mut().map(|c| &mut c.file))
    }

    /// Takes over the files `old` holds open at the same paths, so that planning a device
    /// again (every `replan_every`, to pick up new files) opens only what is new: reopening
    /// every file of every port each minute was a tenth of the agent's system calls. A file
    /// kept that no longer reads (a device re-registered) is opened again at its next read.
    pub(super) fn keep_open_files(&mut self, old: &mut DevicePlan) {
        let mut kept: std::collections::HashMap<PathBuf, &mut OpenFile> = old
            .files_mut()
            .filter(|f| f.file.is_some())
            .map(|f| (f.path.clone(), f))
            .collect();
        for f in self.files_mut() {
            if let Some(open) = kept.remove(f.path.as_path()) {
                std::mem::swap(f, open);
            }
        }
        drop(kept);
        // A counter once found saturated keeps its flag series.
        let mut flags: std::collections::HashMap<PathBuf, Tracked> = old
            .counters_mut()
            .filter_map(|c| Some((c.file.path.clone(), c.saturated.take()?)))
            .collect();
        for c in self.counters_mut() {
            if let Some(flag) = flags.remove(&c.file.path) {
                c.saturated = Some(flag);
            }
        }
    }

    /// Every counter file of the plan, the ports' and the device's.
    fn counters_mut(&mut self) -> impl Iterator<Item = &mut CounterFile> {
        self.ports
            .iter_mut()
            .flat_map(|p| p.counters.iter_mut())
            .chain(self.counters.iter_mut())
    }
}

/// Lists a device's directories: its ports, each port's attributes and counter files, the
/// device-level counters. `None` when the device directory itself is gone.
pub(super) fn plan_device(
    device: &str,
    dir: PathBuf,
    problems: &mut BTreeMap<PathBuf, SysfsError>,
) -> Option<DevicePlan> {
    let ports_dir = dir.join("ports");
    let mut port_names: Vec<(u32, String)> = Vec::new();
    match list_dir(&ports_dir) {
        Ok(names) => {
            for name in names {
                match name.parse::<u32>() {
                    Ok(n) => port_names.push((n, name)),
                    Err(_) => {
                        let path = ports_dir.join(&name);
                        problems.insert(
                            path.clone(),
                            SysfsError::Malformed {
                                path,
                                value: name,
                                expected: PORT_NUMBER,
                            },
                        );
                    }
                }
            }
        }
        Err(e) if !dir.is_dir() => {
            drop(e);
            return None;
        }
        Err(e) => {
            problems.insert(e.path().to_path_buf(), e);
        }
    }
    port_names.sort();
    let mut ports = Vec::new();
    for (port, name) in port_names {
        let pdir = ports_dir.join(name);
        let port_label = port.to_string();
        let labels = Labels::new([("device", device), ("port", port_label.as_str())]);
        let gauge = |name: &'static str| {
            Tracked::new(Series {
                name: name.into(),
                labels: labels.clone(),
                kind: Kind::Gauge,
            })
        };
        let mut counters = counter_files(&pdir.join("counters"), &labels, Pma, problems);
        let taken: BTreeSet<String> = counters
            .iter()
            .map(|c| c.tracked.series.name.to_string())
            .collect();
        counters.extend(counter_files(
            &pdir.join("hw_counters"),
            &labels,
            HwBeside(&taken),
            problems,
        ));
        ports.push(PortPlan {
            link: PortLink {
                device: device.to_string(),
                port,
                state: None,
                phys_state: None,
                rate: None,
                link_layer: None,
            },
            state: OpenFile::new(pdir.join("state")),
            phys_state: OpenFile::new(pdir.join("phys_state")),
            rate: OpenFile::new(pdir.join("rate")),
            link_layer: OpenFile::new(pdir.join("link_layer")),
            state_series: gauge(metric::IB_PORT_STATE),
            phys_state_series: gauge(metric::IB_PORT_PHYS_STATE),
            rate_series: gauge(metric::IB_PORT_RATE_GBPS),
            width_series: gauge(metric::IB_PORT_WIDTH_LANES),
            link_layer_series: None,
            counters,
        });
    }
    let labels = Labels::new([("device", device)]);
    let counters = counter_files(&dir.join("hw_counters"), &labels, DeviceHw, problems);
    Some(DevicePlan {
        dir,
        ports,
        counters,
        planned_at: Instant::now(),
        stale: false,
    })
}

/// Which counter directory a listing is of.
#[derive(Clone, Copy)]
pub(super) enum CounterDir<'a> {
    /// A port's `counters/`: the IB PMA counters, some of which saturate.
    Pma,
    /// A port's `hw_counters/`, beside the series names its `counters/` took (which a
    /// `hw_counters/` file must not reuse).
    HwBeside(&'a BTreeSet<String>),
    /// The device-level `hw_counters/`.
    DeviceHw,
}
use CounterDir::{DeviceHw, HwBeside, Pma};

/// The files of a counter directory, with their series; an absent directory is normal (rxe
/// has no `counters/`, IB-only drivers no `hw_counters/`).
pub(super) fn counter_files(
    dir: &Path,
    labels: &Labels,
    kind_of_dir: CounterDir<'_>,
    problems: &mut BTreeMap<PathBuf, SysfsError>,
) -> Vec<CounterFile> {
    let taken = match kind_of_dir {
        HwBeside(taken) => Some(taken),
        Pma | DeviceHw => None,
    };
    let names = match list_files(dir) {
        Ok(names) => names,
        Err(e) if e.not_found() => return Vec::new(),
        Err(e) => {
            problems.insert(dir.to_path_buf(), e);
            return Vec::new();
        }
    };
    names
        .into_iter()
        .map(|file| {
            let (name, kind, convert) = match file.as_str() {
                "lifespan" => (
                    metric::IB_HW_COUNTERS_LIFESPAN_SECONDS.to_string(),
                    Kind::Gauge,
                    Convert::LifespanMs,
                ),
                "port_xmit_data" => (
                    metric::IB_PORT_XMIT_BYTES_TOTAL.to_string(),
                    Kind::Counter,
                    Convert::Words,
                ),
                "port_rcv_data" => (
                    metric::IB_PORT_RCV_BYTES_TOTAL.to_string(),
                    Kind::Counter,
                    Convert::Words,
                ),
                _ => (
                    format!("{PREFIX}{}_total", metric_stem(&file)),
                    Kind::Counter,
                    Convert::Count,
                ),
            };
            let mut name = name;
            if kind == Kind::Counter && taken.is_some_and(|t| t.contains(&name)) {
                name = format!("{PREFIX}hw_{}", &name[PREFIX.len()..]);
            }
            let limit = match kind_of_dir {
                Pma => pma_limit(&file),
                HwBeside(_) | DeviceHw => None,
            };
            CounterFile {
                file: OpenFile::new(dir.join(&file)),
                tracked: Tracked::new(Series {
                    name: name.into(),
                    labels: labels.clone(),
                    kind,
                }),
                convert,
                limit,
                saturated: None,
            }
        })
        .collect()
}

/// What a `ports/` entry should be; a problem with it comes from listing, not from reading.
pub(super) const PORT_NUMBER: &str = "a port number";

/// Drops the directory-listing problems under `dir` (they are found again when it is listed).
pub(super) fn forget_listing_problems(problems: &mut BTreeMap<PathBuf, SysfsError>, dir: &Path) {
    problems.retain(|path, p| {
        !(path.starts_with(dir)
            && matches!(
                p,
                SysfsError::List { .. }
                    | SysfsError::Malformed {
                        expected: PORT_NUMBER,
                        ..
                    }
            ))
    });
}

/// Drops every problem under `dir`: the device went away, and its files with it.
pub(super) fn forget_problems_under(problems: &mut BTreeMap<PathBuf, SysfsError>, dir: &Path) {
    problems.retain(|path, _| !path.starts_with(dir));
}

/// A counter file name as a metric name part: lowercase, `[a-z0-9_]` only, no `_total` suffix
/// (it is added back once).
pub fn metric_stem(file: &str) -> String {
    let mut s: String = file
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '_') => c,
            _ => '_',
        })
        .collect();
    if let Some(stripped) = s.strip_suffix("_total") {
        s.truncate(stripped.len());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_names_from_file_names() {
        assert_eq!(metric_stem("VL15_dropped"), "vl15_dropped");
        assert_eq!(metric_stem("rdma_tx_bytes"), "rdma_tx_bytes");
        assert_eq!(metric_stem("fw.event-count"), "fw_event_count");
        assert_eq!(metric_stem("packets_total"), "packets");
    }
}
