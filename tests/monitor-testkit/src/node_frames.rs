//! One simulated node's frames as a collector accepts them, for the collector's archive tests,
//! its query tests and its benches (the load generator, the bytes-at-rest measurement).
//!
//! The node is a one-node [`SimulatedFleet`]: 8 GPUs and 8 IB ports with the series names,
//! kinds and labels the agent sends (GPU gauges as floats — SM, tensor and DRAM-bandwidth
//! activity as ratios, `railscope_gpu_utilization_ratio`, temperature, `power_watts`, throttle
//! reasons, row remapping, PCIe link —, the ECC counters, per port state, rate and width
//! gauges and the byte and error counters, and the RDMA verb counters of its job), running a
//! job (so busy, its GPU series labelled with `job_id`), read every second, encoded as the
//! agent encodes (the encoder's default configuration, its schema again every 5 min). By
//! default every
//! reading is sent (the agent with adaptive sampling off); [`adaptive`](NodeSender::adaptive)
//! sends what the agent sends by default (its own sampler: stable series about every 32 s,
//! gauges as envelopes).

use std::collections::{BTreeSet, HashMap};

use monitor_wire::{
    EncoderConfig, Frame, Key, Reading, ReceiverState, SchemaEntry, Series, SeriesData, Value,
    WireEvent, decode, encode_frame,
};

use crate::SimulatedFleet;

const S: u64 = 1_000_000_000;

/// What the collector takes a frame to have arrived after it was sent.
const TRANSIT_NS: u64 = 200_000;

/// One frame as the collector would accept it, with what ingest tells the archive.
pub struct NodeFrame {
    pub bytes: Vec<u8>,
    pub received_ns: u64,
    pub first_ns: u64,
    pub last_ns: u64,
    pub samples: usize,
}

/// A node sending frames: the simulated node, and the schema a receiver has of it.
pub struct NodeSender {
    pub name: String,
    seed: u64,
    key: Key,
    adaptive: bool,
    fleet: Option<SimulatedFleet>,
    flush_s: u64,
    /// The time of the next sweep.
    next_ns: u64,
    session: u32,
    schema: HashMap<u32, Series>,
}

impl NodeSender {
    /// Node `name`, its noise (and its job, `slurm:<seed>`) from `seed`.
    pub fn new(name: &str, seed: u64, key: Key) -> Self {
        Self {
            name: name.to_owned(),
            seed,
            key,
            adaptive: false,
            fleet: None,
            flush_s: 0,
            next_ns: 0,
            session: 0,
            schema: HashMap::new(),
        }
    }

    /// Every series through the agent's adaptive sampler, as the agent sends by default
    /// ([`FleetBuilder::adaptive`](crate::FleetBuilder::adaptive)). Before the first run.
    pub fn adaptive(mut self, on: bool) -> Self {
        assert!(
            self.fleet.is_none(),
            "adaptive is chosen before the first run"
        );
        self.adaptive = on;
        self
    }

    /// Sweeps once a second from `start_ns` for `seconds`, flushing every `flush_s` seconds
    /// and at the end; returns the frames, each with its sample time range. A later run goes
    /// on where the previous one ended, with the same `flush_s`.
    pub fn run(&mut self, start_ns: u64, seconds: u64, flush_s: u64) -> Vec<NodeFrame> {
        self.run_observed(start_ns, seconds, flush_s, &mut |_| {})
    }

    /// [`run`](Self::run), handing every sample the frames carry to `observe`, as a reading
    /// (a gauge sample as its mean at its end: without adaptive sampling, the reading as the
    /// encoder rounded it).
    pub fn run_observed(
        &mut self,
        start_ns: u64,
        seconds: u64,
        flush_s: u64,
        observe: &mut dyn FnMut(&Reading),
    ) -> Vec<NodeFrame> {
        let flush_s = flush_s.max(1);
        let fleet = match &mut self.fleet {
            Some(fleet) => {
                assert_eq!(
                    (start_ns, flush_s),
                    (self.next_ns, self.flush_s),
                    "a run goes on where the previous one ended, flushed as before"
                );
                fleet
            }
            None => {
                self.flush_s = flush_s;
                self.fleet.insert(
                    SimulatedFleet::builder(1)
                        .node_names([self.name.clone()])
                        .job(&format!("slurm:{}", self.seed), 0..1)
                        .seed(self.seed)
                        .adaptive(self.adaptive)
                        .flush_every(flush_s)
                        // The agent's: the encoder's default.
                        .schema_refresh(EncoderConfig::new("").schema_refresh)
                        .start_unix_ns(start_ns)
                        .build(self.key.clone()),
                )
            }
        };
        let mut sent = Vec::new();
        for s in 0..seconds {
            sent.extend(fleet.tick());
            if s + 1 == seconds && !fleet.ticks().is_multiple_of(flush_s) {
                sent.extend(fleet.flush());
            }
        }
        self.next_ns = start_ns + seconds * S;
        sent.into_iter()
            .map(|bytes| self.accept(bytes, observe))
            .collect()
    }

    /// Sends `event` at once (as the agent does), as a frame of its own received at
    /// `received_ns`. After the first run.
    pub fn event(&mut self, event: WireEvent, received_ns: u64) -> NodeFrame {
        let fleet = self
            .fleet
            .as_mut()
            .expect("events come after the first run");
        let mut frames = fleet.event(0, event, received_ns - TRANSIT_NS);
        assert_eq!(frames.len(), 1, "one event makes one frame");
        self.accept(frames.remove(0), &mut |_| {})
    }

    fn accept(&mut self, bytes: Vec<u8>, observe: &mut dyn FnMut(&Reading)) -> NodeFrame {
        let frame = decode(&bytes, &self.key, &mut ReceiverState::default())
            .expect("the node's own frames decode");
        for e in &frame.schema {
            self.schema.insert(e.id, e.series.clone());
        }
        for s in &frame.samples {
            let series = &self.schema[&s.id];
            let readings: Vec<(u64, Value)> = match &s.data {
                SeriesData::Counter(v) => {
                    v.iter().map(|c| (c.unix_ns, Value::U64(c.value))).collect()
                }
                SeriesData::Gauge(v) => v
                    .iter()
                    .map(|g| (g.end_unix_ns, Value::F64(g.mean)))
                    .collect(),
            };
            for (unix_ns, value) in readings {
                observe(&Reading {
                    series: series.clone(),
                    value,
                    unix_ns,
                });
            }
        }
        self.session = frame.session;
        let received_ns = frame.send_unix_ns + TRANSIT_NS;
        let (first_ns, last_ns) = time_range(&frame).unwrap_or((received_ns, received_ns));
        NodeFrame {
            bytes,
            received_ns,
            first_ns,
            last_ns,
            samples: frame.sample_count(),
        }
    }

    /// Series the node has sent so far.
    pub fn series(&self) -> usize {
        self.schema.len()
    }

    /// Names of the metrics the node has sent so far.
    pub fn metrics(&self) -> BTreeSet<String> {
        self.schema.values().map(|s| s.name.to_string()).collect()
    }

    /// The receiver's schema of this node as a frame of schema entries only, as ingest hands
    /// it to the archive.
    pub fn schema_frame(&self) -> Option<Vec<u8>> {
        if self.schema.is_empty() {
            return None;
        }
        let mut schema: Vec<SchemaEntry> = self
            .schema
            .iter()
            .map(|(&id, series)| SchemaEntry {
                id,
                series: series.clone(),
            })
            .collect();
        schema.sort_by_key(|e| e.id);
        let frame = Frame {
            node: self.name.clone(),
            session: self.session,
            seq: 0,
            send_unix_ns: 0,
            time_quantum_ns: 1_000_000,
            schema,
            samples: Vec::new(),
            events: Vec::new(),
        };
        encode_frame(&frame, &self.key).ok()
    }
}

/// The time range of a frame's samples and events.
pub fn time_range(frame: &Frame) -> Option<(u64, u64)> {
    let sample_times = frame.samples.iter().flat_map(|s| match &s.data {
        SeriesData::Counter(v) => v.iter().map(|c| (c.unix_ns, c.unix_ns)).collect::<Vec<_>>(),
        SeriesData::Gauge(v) => v.iter().map(|g| (g.start_unix_ns, g.end_unix_ns)).collect(),
    });
    let event_times = frame.events.iter().map(|e| (e.unix_ns, e.unix_ns));
    sample_times
        .chain(event_times)
        .fold(None, |acc: Option<(u64, u64)>, (a, b)| match acc {
            None => Some((a, b)),
            Some((lo, hi)) => Some((lo.min(a), hi.max(b))),
        })
}
