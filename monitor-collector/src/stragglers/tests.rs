//! Stragglers over an archive filled as the collector fills it (frames ingested by a node
//! table, appended with their node's schema), from what agents send: a simulated fleet with
//! the agent's adaptive sampler (monitor-testkit), and hand-made envelopes.

use std::{collections::BTreeSet, net::SocketAddr, sync::Arc};

use monitor_testkit::SimulatedFleet;
use monitor_wire::{EncoderConfig, FrameEncoder, GaugeSample, Key, Kind, Labels, Sample, Series};

use crate::{
    config::Limits,
    nodes::{NodeTable, time_range},
    writer::schema_frame,
};
use monitor_archive::{
    archive::{AcceptedFrame, Archive, ArchiveConfig},
    query::{QueryEngine, QueryError, SeriesQuery},
};
use monitor_findings::stragglers::*;

const T0: u64 = 1_790_000_000_000_000_000;

const S: u64 = 1_000_000_000;

fn key() -> Key {
    Key::from_bytes([5; 32])
}

/// An archive in a scratch directory, appended to as the collector's writer appends.
struct Store {
    _dir: tempfile::TempDir,
    archive: Archive,
    table: NodeTable,
    engine: QueryEngine,
}

impl Store {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let archive = Archive::open(ArchiveConfig {
            retention_age: None,
            ..ArchiveConfig::new(dir.path())
        })
        .unwrap();
        let engine = QueryEngine::new(archive.reader(), key());
        Self {
            _dir: dir,
            archive,
            table: NodeTable::new(key(), Limits::default()),
            engine,
        }
    }

    /// Accepts and appends frames received at `received_ns`.
    fn take(&mut self, frames: &[Vec<u8>], received_ns: u64) {
        let from: SocketAddr = "127.0.0.1:9".parse().unwrap();
        for bytes in frames {
            let accepted = self
                .table
                .ingest(bytes, from, received_ns)
                .expect("accepted");
            let (first_ns, last_ns) = time_range(&accepted.frame);
            let schema = |node: &str| {
                (node == &*accepted.node)
                    .then(|| schema_frame(&accepted.schema, accepted.frame.seq, first_ns, &key()))
                    .flatten()
            };
            self.archive
                .append(
                    &AcceptedFrame {
                        node: &accepted.node,
                        received_ns,
                        first_ns,
                        last_ns,
                        bytes,
                    },
                    &schema,
                )
                .unwrap();
        }
        self.archive.tick().unwrap();
    }

    /// Runs `ticks` ticks of the fleet into the archive.
    fn run(&mut self, fleet: &mut SimulatedFleet, ticks: u64) {
        for _ in 0..ticks {
            let t = fleet.tick_unix_ns(fleet.ticks());
            let frames = fleet.tick();
            self.take(&frames, t + 1_000_000);
        }
    }

    fn find(&self, start_ns: u64, end_ns: u64) -> Vec<JobStragglers> {
        find(
            &self.engine,
            None,
            None,
            None,
            start_ns,
            end_ns,
            &StragglerSettings::default(),
        )
        .unwrap()
        .jobs
    }

    /// One job's stragglers as `/api/v1/stragglers?job_id=` finds them: the live table
    /// rules out the nodes that never carried the job.
    fn find_job(&self, job: &str, start_ns: u64, end_ns: u64) -> Vec<JobStragglers> {
        find(
            &self.engine,
            None,
            Some(&self.table),
            Some(job),
            start_ns,
            end_ns,
            &StragglerSettings::default(),
        )
        .unwrap()
        .jobs
    }
}

/// (node, GPU or device/port) of each straggler of the job.
fn places(job: &JobStragglers) -> BTreeSet<(String, String)> {
    job.stragglers
        .iter()
        .map(|s| {
            let place = match (&s.gpu, &s.device) {
                (Some(g), _) => format!("gpu {g}"),
                (None, Some(d)) => format!("{d}/{}", s.port.unwrap_or(0)),
                _ => "?".into(),
            };
            (s.node.clone(), place)
        })
        .collect()
}

fn place(node: &str, what: &str) -> (String, String) {
    (node.into(), what.into())
}

/// Sixteen nodes sampled as agents sample (stable series sent every ~32 s, out of phase, the
/// two directions of a port at different times), one port trained down to 2X carrying less
/// than half its peers' traffic, one slow GPU: the stragglers of a live 5-minute window, asked
/// every 5 s for a minute, are always exactly those two, the port's score steady.
#[test]
fn an_adaptive_fleet_has_the_same_stragglers_in_every_window() {
    let mut fleet = SimulatedFleet::builder(16)
        .job("slurm:77", 0..16)
        .degraded_port(5, 5)
        .slow_gpu(9, 2)
        .adaptive(true)
        .start_unix_ns(T0)
        .build(key());
    let mut store = Store::new();
    store.run(&mut fleet, 360);
    let mut port_scores = Vec::new();
    for i in 0..13 {
        if i > 0 {
            store.run(&mut fleet, 5);
        }
        let end = fleet.tick_unix_ns(fleet.ticks() - 1);
        let jobs = store.find(end - 300 * S, end);
        assert_eq!(jobs.len(), 1, "{jobs:#?}");
        let job = &jobs[0];
        assert_eq!((job.nodes, job.gpus), (16, 128), "{job:#?}");
        assert_eq!(
            places(job),
            BTreeSet::from([place("node-005", "mlx5_5/1"), place("node-009", "gpu 2")]),
            "window ending at +{} s: {job:#?}",
            (end - T0) / S
        );
        let port = job.stragglers.iter().find(|s| s.device.is_some()).unwrap();
        assert_eq!(port.metric, PORT_METRIC);
        // 2 x 11 GB/s against 2 x 25 GB/s, scaled by the floor (2% of the median).
        assert!(
            (port.value / 22.0e9 - 1.0).abs() < 0.05 && (port.median / 50.0e9 - 1.0).abs() < 0.05,
            "{port:?}"
        );
        assert!(port.fraction >= 0.9, "{port:?}");
        port_scores.push(port.score);
        let gpu = job.stragglers.iter().find(|s| s.gpu.is_some()).unwrap();
        assert!(gpu.value < 0.6 && gpu.median > 0.85, "{gpu:?}");
    }
    let (lo, hi) = port_scores
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &s| (lo.min(s), hi.max(s)));
    assert!(lo > 20.0 && hi - lo < 0.01 * lo, "{port_scores:?}");
}

/// Two jobs of one fleet, each with its straggler: asked for one job, the search reads only
/// the nodes the live table cannot rule out of it (the other job's are), and finds for it
/// exactly what the search of every job finds.
#[test]
fn a_job_asked_alone_has_the_stragglers_the_search_of_every_job_gives_it() {
    let mut fleet = SimulatedFleet::builder(24)
        .job("slurm:1", 0..16)
        .job("slurm:2", 16..24)
        .slow_gpu(9, 2)
        .degraded_port(20, 3)
        .adaptive(true)
        .start_unix_ns(T0)
        .build(key());
    let mut store = Store::new();
    store.run(&mut fleet, 360);
    let end = fleet.tick_unix_ns(fleet.ticks() - 1);
    // A window the table has seen whole, its look-back included (the fleet began at T0).
    let start = end - 120 * S;
    assert!(start - LOOKBACK_NS > T0 + 60 * S);
    let every = store.find(start, end);
    assert_eq!(every.len(), 2, "{every:#?}");
    for (job, others) in [("slurm:1", 16..24), ("slurm:2", 0..16)] {
        let ruled_out = store
            .table
            .ruled_out(GPU_METRICS, "job_id", job, start - LOOKBACK_NS);
        let want: std::collections::HashSet<Arc<str>> =
            others.map(|i| Arc::from(fleet.node_name(i))).collect();
        assert_eq!(ruled_out, want, "{job}");
        let alone = store.find_job(job, start, end);
        assert_eq!(alone.len(), 1, "{alone:#?}");
        let from_every = every.iter().find(|j| j.job_id == job).unwrap();
        assert_eq!(
            (alone[0].nodes, alone[0].gpus, places(&alone[0])),
            (from_every.nodes, from_every.gpus, places(from_every)),
            "{job}"
        );
    }
    assert!(
        places(&every[0]).contains(&place("node-009", "gpu 2")),
        "{every:#?}"
    );
    assert!(
        places(&every[1]).contains(&place("node-020", "mlx5_3/1")),
        "{every:#?}"
    );
}

/// The window the dashboard asks (5 minutes ending on a 10 s step, one step behind the
/// clock), of a fleet sampled as agents sample: every node the live table held whole over it
/// is answered from the steps kept at ingest, and every job (and each job asked alone) has
/// the nodes, GPUs and stragglers, with the values, that the archive gives. So has the
/// API's default window (from a step to the present). After a collector restart (a table
/// that has not held the nodes whole since before the window), the same window is read from
/// the archive again, with the same answer.
#[test]
fn an_aligned_window_is_answered_from_the_steps_kept_at_ingest_as_from_the_archive() {
    let mut fleet = SimulatedFleet::builder(24)
        .job("slurm:1", 0..16)
        .job("slurm:2", 16..24)
        .slow_gpu(9, 2)
        .degraded_port(20, 3)
        .adaptive(true)
        .ticks_before_now(600)
        .build(key());
    let mut store = Store::new();
    let aligned_window = |fleet: &SimulatedFleet| {
        let now = fleet.tick_unix_ns(fleet.ticks() - 1);
        let end = now / (10 * S) * (10 * S) - 10 * S;
        (end - 300 * S, end)
    };
    let answered_by_table = |store: &Store, start: u64| {
        store
            .table
            .visit_recent_steps(start - LOOKBACK_NS, start / (10 * S), &mut |_, _, _| {})
            .len()
    };
    // Asks every job and each job alone with and without the table; returns how many
    // nodes the table answered for from its steps (the archive read none of them).
    let same = |store: &Store, start: u64, end: u64| -> Vec<usize> {
        let mut answered = Vec::new();
        for job in [None, Some("slurm:1"), Some("slurm:2")] {
            let ask = |live: Option<&NodeTable>| {
                find(
                    &store.engine,
                    None,
                    live.map(|t| t as &dyn LiveSteps),
                    job,
                    start,
                    end,
                    &StragglerSettings::default(),
                )
                .unwrap()
            };
            let (kept, archived) = (ask(Some(&store.table)), ask(None));
            assert_eq!(archived.read.steps, 0);
            answered.push(if kept.read.archive == 0 {
                kept.read.steps
            } else {
                0
            });
            let (kept, archived) = (kept.jobs, archived.jobs);
            assert_eq!(kept.len(), archived.len(), "{job:?}: {kept:#?}");
            assert_eq!(kept.len(), if job.is_some() { 1 } else { 2 });
            for (k, a) in kept.iter().zip(&archived) {
                assert_eq!(
                    (&k.job_id, k.nodes, k.gpus, places(k)),
                    (&a.job_id, a.nodes, a.gpus, places(a)),
                    "{job:?}"
                );
                for (ks, as_) in k.stragglers.iter().zip(&a.stragglers) {
                    let close = |x: f64, y: f64| (x - y).abs() <= 1e-9 * x.abs().max(1.0);
                    assert!(
                        close(ks.value, as_.value)
                            && close(ks.median, as_.median)
                            && close(ks.score, as_.score)
                            && ks.fraction == as_.fraction
                            && ks.onset == as_.onset,
                        "{ks:?} against {as_:?}"
                    );
                }
            }
            let one = |j: &str| kept.iter().find(|x| x.job_id == j).map(places);
            if job != Some("slurm:2") {
                assert!(
                    one("slurm:1")
                        .unwrap()
                        .contains(&place("node-009", "gpu 2"))
                );
            }
            if job != Some("slurm:1") {
                assert!(
                    one("slurm:2")
                        .unwrap()
                        .contains(&place("node-020", "mlx5_3/1"))
                );
            }
        }
        answered
    };
    // The table took every node's session from its first frame, and the archive held none
    // before: it vouches for every window from the start.
    store.run(&mut fleet, 340);
    let (start, end) = aligned_window(&fleet);
    assert_eq!(answered_by_table(&store, start), 24);
    assert_eq!(same(&store, start, end), [24, 24, 24]);
    // The default window: from the step the last 5 minutes begin in, to the present (the
    // fleet's frames are older: nothing past `end` to tell the two apart).
    let end = monitor_archive::clock::unix_now_ns();
    let start = (end - 300 * S) / (10 * S) * (10 * S);
    assert_eq!(same(&store, start, end), [24, 24, 24]);
    // Not on a step: read from the archive.
    assert_eq!(same(&store, start + S, end - S), [0, 0, 0]);

    // The collector restarts (the archive stays): its table learns the nodes anew from their
    // next frames and schema refreshes, and vouches for none of them over this window.
    store.table = NodeTable::new(key(), Limits::default());
    store.run(&mut fleet, 70);
    let (start, end) = aligned_window(&fleet);
    assert_eq!(answered_by_table(&store, start), 0);
    assert_eq!(same(&store, start, end), [0, 0, 0]);
}

/// What the live table may rule out of a job over a window, from frames as an agent sends
/// them: a node whose GPUs left the job within the window (its session goes on, with new
/// series carrying the next job) was in it and is read; so is a node first heard after the
/// window began in the middle of a session (it may have carried the job before, unseen); a
/// node that carried only another job while the table saw all it sent is ruled out, and so
/// is one whose first session the table took from its first frame.
#[test]
fn the_live_table_rules_out_of_a_job_only_the_nodes_it_saw_never_carry_it() {
    let mut store = Store::new();
    let series = |job: &str| Series {
        name: "railscope_gpu_sm_util_ratio".into(),
        labels: Labels::new([("gpu", "0".to_owned()), ("job_id", job.to_owned())]),
        kind: Kind::Gauge,
    };
    let config = |n: &str| EncoderConfig::new(n.to_owned());
    let mut encoders: Vec<FrameEncoder> = ["node-a", "node-b", "node-d"]
        .iter()
        .map(|n| FrameEncoder::new(config(n), key()).unwrap())
        .collect();
    // node-c is first heard in the middle of a session (its earlier frames went elsewhere).
    encoders.insert(
        2,
        FrameEncoder::resume(config("node-c"), key(), 0x5e55_0c0c, 1_000, 100).unwrap(),
    );
    for sec in 0..=400u64 {
        let t = T0 + sec * S;
        // node-a: job A until 200 s, then job B; node-b: job B; node-c: job B from 350 s;
        // node-d: a new session from 350 s, job B.
        let jobs = [
            if sec <= 200 { "A" } else { "B" },
            "B",
            if sec >= 350 { "B" } else { "" },
            if sec >= 350 { "B" } else { "" },
        ];
        for (encoder, job) in encoders.iter_mut().zip(jobs) {
            if job.is_empty() {
                continue;
            }
            let sample = Sample::Gauge(GaugeSample {
                start_unix_ns: t,
                end_unix_ns: t,
                min: 0.9,
                max: 0.9,
                mean: 0.9,
            });
            encoder.push_sample(&series(job), sample).unwrap();
            if sec % 10 == 9 || sec == 400 {
                let frames = encoder.flush(t);
                store.take(&frames, t + 1_000_000);
            }
        }
    }
    let ruled_out = |job: &str, since_s: u64| -> BTreeSet<String> {
        store
            .table
            .ruled_out(GPU_METRICS, "job_id", job, T0 + since_s * S)
            .iter()
            .map(|n| n.to_string())
            .collect()
    };
    let set =
        |nodes: &[&str]| -> BTreeSet<String> { nodes.iter().map(|n| n.to_string()).collect() };
    // From 100 s: node-a carried A until 200 s; node-c, first heard at 350 s in the middle of
    // a session, may have; node-d's session began at 350 s, all of it seen.
    assert_eq!(ruled_out("A", 100), set(&["node-b", "node-d"]));
    // From 250 s: node-a's last sample of A is older.
    assert_eq!(ruled_out("A", 250), set(&["node-a", "node-b", "node-d"]));
    // Every node carried B since 250 s, node-c only heard since 350 s: none ruled out.
    assert_eq!(ruled_out("B", 250), set(&[]));
    // From 420 s on (beyond the table's minute of slack after 350 s), node-c is known.
    assert_eq!(
        ruled_out("A", 420),
        set(&["node-a", "node-b", "node-c", "node-d"])
    );
}

/// One node's SM activity as an agent sends a stable series: an envelope every 32 s, of the
/// reads of each second since the previous one; GPU `g`'s samples end at `phase(g)` + 32 s i.
fn stable_gpus(
    store: &mut Store,
    node: &str,
    job: &str,
    seconds: u64,
    sm: impl Fn(usize) -> f64,
    phase: impl Fn(usize) -> u64,
) {
    let mut encoder = FrameEncoder::new(EncoderConfig::new(node.to_owned()), key()).unwrap();
    let series = |g: usize| Series {
        name: "railscope_gpu_sm_util_ratio".into(),
        labels: Labels::new([("gpu", g.to_string()), ("job_id", job.to_owned())]),
        kind: Kind::Gauge,
    };
    let mut last: Vec<Option<u64>> = vec![None; 8];
    for sec in 0..=seconds {
        let t = T0 + sec * S;
        for (g, prev) in last.iter_mut().enumerate() {
            if sec < phase(g) || !(sec - phase(g)).is_multiple_of(32) {
                continue;
            }
            let v = sm(g);
            let start = prev.map_or(t, |p| p + S);
            encoder
                .push_sample(
                    &series(g),
                    Sample::Gauge(GaugeSample {
                        start_unix_ns: start,
                        end_unix_ns: t,
                        min: v - 0.01,
                        max: v + 0.01,
                        mean: v,
                    }),
                )
                .unwrap();
            *prev = Some(t);
        }
        if sec % 10 == 9 {
            let frames = encoder.flush(t);
            store.take(&frames, t + 1_000_000);
        }
    }
}

/// A slow GPU whose SM activity is stable (0.54 against its peers' 0.93) is sent every 32 s,
/// never within 10 s of its peers' samples: over any 120 s window its envelopes cover every
/// step, so it is scored at every step and is the job's straggler.
#[test]
fn a_stable_slow_gpu_sent_every_32_s_is_a_straggler_over_120_s() {
    let mut store = Store::new();
    stable_gpus(
        &mut store,
        "node-000",
        "slurm:8",
        400,
        |g| {
            if g == 3 {
                0.54
            } else {
                0.93 + 0.001 * g as f64
            }
        },
        // GPU 3 at 0 s (mod 32), the others 13 to 19 s after it.
        |g| if g == 3 { 0 } else { 12 + g as u64 },
    );
    for i in 0..8 {
        let end = T0 + (300 + 5 * i) * S;
        let jobs = store.find(end - 120 * S, end);
        assert_eq!(jobs.len(), 1, "{jobs:#?}");
        let job = &jobs[0];
        assert_eq!(job.gpus, 8);
        assert_eq!(
            places(job),
            BTreeSet::from([place("node-000", "gpu 3")]),
            "window ending at +{} s: {job:#?}",
            300 + 5 * i
        );
        let s = &job.stragglers[0];
        assert_eq!(s.metric, "railscope_gpu_sm_util_ratio");
        assert!((s.value - 0.54).abs() < 1e-9, "{s:?}");
        assert!((s.median - 0.9335).abs() < 0.01, "{s:?}");
        // Scored at every step (12 of 10 s), far at each: 0.39 over the 0.02 floor.
        assert_eq!(s.fraction, 1.0, "{s:?}");
        assert!(s.score > 19.0, "{s:?}");
    }
}

/// A fleet larger than one query's chunk, read every second, against a points limit that one
/// query of all its GPUs would pass: the answer still comes (each query asks a chunk of
/// nodes), with the slow GPU found among all the nodes.
#[test]
fn a_fleet_larger_than_one_query_is_read_a_chunk_of_nodes_at_a_time() {
    let nodes = NODES_PER_QUERY + 50;
    let mut fleet = SimulatedFleet::builder(nodes)
        .job("slurm:78", 0..nodes)
        .slow_gpu(nodes - 3, 4)
        .start_unix_ns(T0)
        .build(key());
    let mut store = Store::new();
    store.run(&mut fleet, 60);
    let end = fleet.tick_unix_ns(fleet.ticks() - 1);
    // One metric of every GPU over the window: 8 x 60 points a node.
    let per_node = 8 * 60;
    let limit = per_node * (NODES_PER_QUERY + 20);
    assert!(limit < per_node * nodes);
    let limited = QueryEngine::new(store.archive.reader(), key()).with_max_points(limit);
    let whole_fleet = limited.series(&SeriesQuery {
        metric: GPU_METRICS[0].into(),
        matchers: Vec::new(),
        start_ns: end - 60 * S,
        end_ns: end,
    });
    assert!(
        matches!(whole_fleet, Err(QueryError::TooManyPoints { .. })),
        "the limit must refuse one query of the whole fleet"
    );
    let jobs = find(
        &limited,
        None,
        None,
        None,
        end - 60 * S,
        end,
        &StragglerSettings::default(),
    )
    .unwrap()
    .jobs;
    assert_eq!(jobs.len(), 1, "{jobs:#?}");
    assert_eq!((jobs[0].nodes, jobs[0].gpus), (nodes, nodes * 8));
    assert!(
        places(&jobs[0]).contains(&place(&format!("node-{:03}", nodes - 3), "gpu 4")),
        "{:#?}",
        jobs[0]
    );
}

/// A GPU that slows down in a job whose history is longer than the window (16 nodes as agents
/// sample them, healthy for 400 s): the live 5-minute window, asked every second as the
/// frames arrive (every 5 s before), flags it as an onset within 30 s of the sample time it slowed at (its
/// latest two 10 s steps far, long before 75% of the window is), and from then on in every
/// window; nothing else is flagged at any time, before or after.
#[test]
fn a_gpu_that_slows_down_is_flagged_within_30_s_as_an_onset() {
    const ONSET_TICK: u64 = 400;
    let mut fleet = SimulatedFleet::builder(16)
        .job("slurm:78", 0..16)
        .slow_gpu_from(9, 2, ONSET_TICK)
        .adaptive(true)
        .start_unix_ns(T0)
        .build(key());
    let mut store = Store::new();
    store.run(&mut fleet, 330);
    let slowed_ns = fleet.tick_unix_ns(ONSET_TICK);
    let mut flagged_at = None;
    while fleet.ticks() < ONSET_TICK + 60 {
        // Every 5 s while healthy, then every second.
        let ticks = if fleet.ticks() < ONSET_TICK { 5 } else { 1 };
        store.run(&mut fleet, ticks);
        let end = fleet.tick_unix_ns(fleet.ticks() - 1);
        let jobs = store.find(end - 300 * S, end);
        let found = jobs.first().map(places).unwrap_or_default();
        if end < slowed_ns {
            assert!(
                found.is_empty(),
                "+{} s, healthy: {jobs:#?}",
                (end - T0) / S
            );
            continue;
        }
        match flagged_at {
            None if found.is_empty() => continue,
            None => flagged_at = Some(end),
            Some(_) => {}
        }
        assert_eq!(
            found,
            BTreeSet::from([place("node-009", "gpu 2")]),
            "+{} s: {jobs:#?}",
            (end - T0) / S
        );
        let s = &jobs[0].stragglers[0];
        if s.fraction < 0.75 {
            assert!(s.onset, "{s:?}");
            assert!(s.value < s.median - 0.1 && s.score > 3.5, "{s:?}");
        }
    }
    let flagged_at = flagged_at.expect("the slow GPU was never flagged");
    let after = (flagged_at - slowed_ns) as f64 / S as f64;
    eprintln!("flagged {after} s after it slowed down");
    assert!(
        after <= 30.0,
        "flagged {after} s after it slowed down (the goal: 30 s)"
    );
}
