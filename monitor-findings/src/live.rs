//! How the tick reads the live view (the node table's latest values) into the engine's
//! [`Tracks`]: node by node, through a list per node of the schema ids of the series the rules
//! read, each with the handle of its track. The list is made again only when the node's schema
//! changed, and a node that sent nothing since the last tick is not read again (its tracks
//! are only marked seen): at 12,500 nodes a tick would otherwise hash every series of the
//! fleet, millions of them, to find its track.

use std::{collections::HashMap, sync::Arc};

use monitor_wire::{Kind, Series, names::metric};

use super::{
    hardware,
    topology::PortKey,
    view::{GpuJobs, Track, TrackHandle, Tracks, note_gpu_job},
};
use crate::live_table::{Latest, LatestValue, LiveTable, NodeLatest};

type FoldHashMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// One watched series of a node.
struct Watched {
    id: u32,
    counter: bool,
    hardware: bool,
    /// Its GPU and job (`gpu` and `job_id` labels of a GPU series), as an index into
    /// [`NodeRead::jobs`].
    job: Option<u32>,
    /// Its track, once it has one.
    handle: Option<TrackHandle>,
    /// It had a latest value when the node was last read.
    present: bool,
}

/// A port's LLDP neighbour series of a node.
struct Neighbour {
    id: u32,
    port: PortKey,
    switch: (String, String),
    present: bool,
}

/// What the tick knows of one node between ticks.
struct NodeRead {
    schema_stamp: u64,
    grown_stamp: u64,
    session: u32,
    /// Its schema's ids when last read, sorted.
    known: Vec<u32>,
    latest_stamp: Option<u64>,
    /// The tick that last saw the node in the table.
    pass: u64,
    /// When the collector last accepted a frame of the node (Unix ns).
    last_seen_ns: u64,
    watched: Vec<Watched>,
    neighbours: Vec<Neighbour>,
    /// (GPU, job, one of its series has a latest value).
    jobs: Vec<(String, String, bool)>,
}

/// The tick's reading of the live view, kept between ticks.
#[derive(Default)]
pub(super) struct LiveReader {
    nodes: FoldHashMap<Arc<str>, NodeRead>,
}

/// What a reading found beyond the tracks.
pub(super) struct Read {
    /// The nodes of which a hardware-path series appeared or changed value.
    pub hardware_nodes: Vec<Arc<str>>,
    /// The ports' LLDP neighbours, if they may have changed since the last reading.
    pub neighbours: Option<HashMap<PortKey, (String, String)>>,
    /// A GPU's job changed (or a GPU was noted for the first time).
    pub gpu_jobs_changed: bool,
}

/// A `railscope_ib_port_neighbor_info` series as (port, (switch, the switch's port)); None
/// if a label is missing.
fn neighbour(node: &Arc<str>, series: &Series) -> Option<(PortKey, (String, String))> {
    let l = &series.labels;
    let port = l.get("port")?.parse().ok()?;
    Some((
        (node.to_string(), l.get("device")?.to_owned(), port),
        (
            l.get("switch")?.to_owned(),
            l.get("switch_port")?.to_owned(),
        ),
    ))
}

impl NodeRead {
    fn empty() -> Self {
        Self {
            schema_stamp: 0,
            grown_stamp: 0,
            session: 0,
            latest_stamp: None,
            pass: 0,
            last_seen_ns: 0,
            known: Vec::new(),
            watched: Vec::new(),
            neighbours: Vec::new(),
            jobs: Vec::new(),
        }
    }

    /// The node's watched series and neighbours, from its schema; the handles of the tracks
    /// `old` (the node's previous list, if of the same session) had are kept.
    fn of(
        node: &NodeLatest,
        old: Option<NodeRead>,
        tracks: &Tracks,
        watched: impl Fn(&str) -> bool,
    ) -> Self {
        let held: FoldHashMap<u32, TrackHandle> = old
            .filter(|old| old.session == node.schema.session)
            .map(|old| {
                old.watched
                    .into_iter()
                    .filter_map(|w| Some((w.id, w.handle?)))
                    .collect()
            })
            .unwrap_or_default();
        let mut read = Self {
            schema_stamp: node.schema_stamp,
            grown_stamp: node.grown_stamp,
            session: node.schema.session,
            ..Self::empty()
        };
        for (&id, series) in &node.schema.entries {
            // Kept only if its track is still this series' (an id given another series
            // within a session is the sender's bug, but then its track is another's).
            let handle = held.get(&id).copied().filter(|&h| {
                tracks
                    .key(h)
                    .is_some_and(|(n, s)| n == node.name && s == series)
            });
            read.add(node.name, id, series, handle, &watched);
        }
        read.known = node.schema.entries.keys().copied().collect();
        read.known.sort_unstable();
        read
    }

    /// Adds the series the node's schema gained since it was read (new ids only: the
    /// node table says when an id was given another series, and the list is made again).
    fn grow(&mut self, node: &NodeLatest, watched: impl Fn(&str) -> bool) {
        let mut added = Vec::new();
        for (&id, series) in &node.schema.entries {
            if self.known.binary_search(&id).is_err() {
                self.add(node.name, id, series, None, &watched);
                added.push(id);
            }
        }
        self.known.extend(added);
        self.known.sort_unstable();
        self.grown_stamp = node.grown_stamp;
        self.latest_stamp = None;
    }

    fn add(
        &mut self,
        node: &Arc<str>,
        id: u32,
        series: &Series,
        handle: Option<TrackHandle>,
        watched: impl Fn(&str) -> bool,
    ) {
        if &*series.name == metric::IB_PORT_NEIGHBOR_INFO {
            if let Some((port, switch)) = neighbour(node, series) {
                self.neighbours.push(Neighbour {
                    id,
                    port,
                    switch,
                    present: false,
                });
            }
            return;
        }
        if !watched(&series.name) {
            return;
        }
        let job = if series.name.starts_with(metric::GPU_PREFIX)
            && let (Some(gpu), Some(job)) = (series.labels.get("gpu"), series.labels.get("job_id"))
        {
            let at = self
                .jobs
                .iter()
                .position(|(g, j, _)| g == gpu && j == job)
                .unwrap_or_else(|| {
                    self.jobs.push((gpu.to_owned(), job.to_owned(), false));
                    self.jobs.len() - 1
                });
            Some(at as u32)
        } else {
            None
        };
        self.watched.push(Watched {
            id,
            counter: series.kind == Kind::Counter,
            hardware: hardware::is_hardware_series(&series.name),
            job,
            handle,
            present: false,
        });
    }
}

impl LiveReader {
    /// The hardware-path series of `node` that have a track, each with its latest value, as
    /// its last reading found them.
    pub(super) fn hardware_series(&self, node: &str, tracks: &Tracks) -> Vec<(Series, Latest)> {
        let Some(read) = self.nodes.get(node) else {
            return Vec::new();
        };
        read.watched
            .iter()
            .filter(|w| w.hardware)
            .filter_map(|w| {
                let h = w.handle?;
                Some((tracks.key(h)?.1.clone(), tracks.get(h)?.latest))
            })
            .collect()
    }

    /// The nodes the table still holds (those read at tick `pass`) from which no frame came
    /// since `before` (Unix ns), with the time one last came.
    pub(super) fn silent_since(&self, pass: u64, before: u64) -> Vec<(Arc<str>, u64)> {
        self.nodes
            .iter()
            .filter(|(_, r)| r.pass == pass && r.last_seen_ns < before)
            .map(|(n, r)| (n.clone(), r.last_seen_ns))
            .collect()
    }

    /// Every node the last reading found.
    pub(super) fn node_names(&self) -> impl Iterator<Item = &Arc<str>> {
        self.nodes.keys()
    }

    /// Whether the last reading found `node`.
    pub(super) fn knows(&self, node: &str) -> bool {
        self.nodes.contains_key(node)
    }

    /// Reads every node of `table` into `tracks` for tick `pass`: a watched gauge's latest
    /// value (a track made for a series new to the tick), every watched series with a latest
    /// value marked seen; each GPU's job noted in `gpu_jobs`.
    pub(super) fn read(
        &mut self,
        table: &dyn LiveTable,
        tracks: &mut Tracks,
        gpu_jobs: &mut GpuJobs,
        pass: u64,
        watched: impl Fn(&str) -> bool + Copy,
    ) -> Read {
        let mut hardware_nodes = Vec::new();
        let mut gpu_jobs_changed = false;
        let mut neighbours_changed = false;
        table.visit_nodes(&mut |node| {
            let read = match self.nodes.get_mut(&**node.name) {
                Some(read) if read.schema_stamp == node.schema_stamp => {
                    if read.grown_stamp != node.grown_stamp {
                        read.grow(node, watched);
                    }
                    read
                }
                Some(read) => {
                    neighbours_changed |= !read.neighbours.is_empty();
                    let old = std::mem::replace(read, NodeRead::empty());
                    *read = NodeRead::of(node, Some(old), tracks, watched);
                    neighbours_changed |= !read.neighbours.is_empty();
                    read
                }
                None => {
                    let read = NodeRead::of(node, None, tracks, watched);
                    neighbours_changed |= !read.neighbours.is_empty();
                    self.nodes.entry(node.name.clone()).or_insert(read)
                }
            };
            read.pass = pass;
            read.last_seen_ns = node.last_seen_unix_ns;
            if read.latest_stamp == Some(node.latest_stamp) {
                // Nothing came since the last reading: the same series are still there. A
                // counter's track may have been made since (its samples come apart from the
                // live view, and may come after the reading that found its series): found
                // by its key, or it would be forgotten as gone.
                for w in read.watched.iter_mut().filter(|w| w.present) {
                    let handle = w
                        .handle
                        .filter(|&h| tracks.get_mut(h).is_some())
                        .or_else(|| {
                            let series = node.schema.entries.get(&w.id)?;
                            tracks.handle(&(node.name.clone(), series.clone()))
                        });
                    w.handle = handle;
                    if let Some(track) = handle.and_then(|h| tracks.get_mut(h)) {
                        track.seen_pass = pass;
                    }
                }
                return;
            }
            read.latest_stamp = Some(node.latest_stamp);
            for n in &mut read.neighbours {
                let present = node.latest(n.id).is_some();
                neighbours_changed |= present != n.present;
                n.present = present;
            }
            for job in &mut read.jobs {
                job.2 = false;
            }
            let mut hardware_changed = false;
            for w in &mut read.watched {
                let Some(latest) = node.latest(w.id) else {
                    w.present = false;
                    continue;
                };
                w.present = true;
                if let Some(job) = w.job {
                    read.jobs[job as usize].2 = true;
                }
                let held = w
                    .handle
                    .and_then(|h| tracks.get_mut(h).is_some().then_some(h));
                if w.counter {
                    // Counters come as samples through the inbox (see the engine's module
                    // documentation): the live view only says the series is still there.
                    let handle = held.or_else(|| {
                        let series = node.schema.entries.get(&w.id)?;
                        tracks.handle(&(node.name.clone(), series.clone()))
                    });
                    w.handle = handle;
                    if let Some(track) = handle.and_then(|h| tracks.get_mut(h)) {
                        track.seen_pass = pass;
                    }
                    continue;
                }
                let (track, new) = match held {
                    Some(h) => (tracks.get_mut(h).expect("checked"), false),
                    None => {
                        let Some(series) = node.schema.entries.get(&w.id) else {
                            continue;
                        };
                        let (h, track, new) = tracks
                            .get_or_insert(&(node.name.clone(), series.clone()), || {
                                Track::new(*latest, pass)
                            });
                        w.handle = Some(h);
                        (track, new)
                    }
                };
                track.seen_pass = pass;
                if latest.unix_ns < track.latest.unix_ns {
                    continue;
                }
                let mut changed = new;
                if let (LatestValue::Gauge { mean: a, .. }, LatestValue::Gauge { mean: b, .. }) =
                    (track.latest.value, latest.value)
                    && a.to_bits() != b.to_bits()
                {
                    track.changed_ns = latest.unix_ns;
                    changed = true;
                }
                if changed && w.hardware {
                    hardware_changed = true;
                }
                track.latest = *latest;
            }
            if hardware_changed {
                hardware_nodes.push(node.name.clone());
            }
            for (gpu, job, present) in &read.jobs {
                if *present {
                    gpu_jobs_changed |= note_gpu_job(gpu_jobs, node.name, gpu, job);
                }
            }
        });
        let before = self.nodes.len();
        self.nodes.retain(|_, read| read.pass == pass);
        neighbours_changed |= self.nodes.len() != before;
        let neighbours = neighbours_changed.then(|| {
            self.nodes
                .values()
                .flat_map(|read| read.neighbours.iter().filter(|n| n.present))
                .map(|n| (n.port.clone(), n.switch.clone()))
                .collect()
        });
        Read {
            hardware_nodes,
            neighbours,
            gpu_jobs_changed,
        }
    }
}
