//! A realistic node's frames, made by the agent's own encoder (`monitor_wire::FrameEncoder`,
//! default configuration): 8 GPUs x 40 metrics and 8 IB ports x 40 counters, read every
//! second (each GPU and each port at its own instant of the sweep), flushed every 10 s. The
//! archive's tests and its bytes-at-rest measurement use it; the collector bench can too.
//!
//! The metrics are modelled on the agent bench's fixture node (monitor-user/examples/
//! agent_bench/): GPU utilisation, clocks, temperatures, power in mW, memory, PCIe and NVLink
//! throughput as integers that move, 12 GPM ratios as full-precision doubles, energy and ECC
//! counters; per port about 8 fast counters (data, packets, waits) whose rate changes by up to
//! 20 % from second to second, 6 slow ones that tick now and then, the rest constant.

use std::collections::HashMap;

use monitor_wire::{
    EncoderConfig, Frame, FrameEncoder, Key, Kind, Labels, Reading, ReceiverState, SchemaEntry,
    Series, SeriesData, Value, decode, encode_frame,
};

/// A small deterministic generator (splitmix64), so runs are comparable.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A factor in [1 - spread, 1 + spread].
    fn around(&mut self, spread: f64) -> f64 {
        1.0 + spread * (2.0 * self.unit() - 1.0)
    }
}

#[derive(Clone, Copy)]
enum Model {
    /// A gauge that keeps its value.
    Constant(f64),
    /// An integer gauge around a level, moving by up to `spread` of it each reading.
    Noisy { level: f64, spread: f64 },
    /// An integer gauge that moves by at most 1 now and then (temperatures).
    Drift { level: f64 },
    /// A ratio in [0, 1] as a full-precision double (GPM metrics).
    Ratio { level: f64 },
    /// A counter growing by about `per_s` a second, its rate changing by up to 20 %.
    Fast { per_s: f64 },
    /// A counter ticking by one, `per_s` times a second on average.
    Slow { per_s: f64 },
    /// A counter that never moves.
    Still,
}

struct Metric {
    series: Series,
    model: Model,
    value: f64,
    count: u64,
}

const GPU_GAUGES: &[(&str, Model)] = &[
    (
        "railscope_gpu_utilization_percent",
        Model::Noisy {
            level: 95.0,
            spread: 0.05,
        },
    ),
    (
        "railscope_gpu_memory_utilization_percent",
        Model::Noisy {
            level: 60.0,
            spread: 0.15,
        },
    ),
    ("railscope_gpu_sm_clock_hertz", Model::Constant(1.98e9)),
    ("railscope_gpu_memory_clock_hertz", Model::Constant(2.619e9)),
    (
        "railscope_gpu_temperature_celsius",
        Model::Drift { level: 64.0 },
    ),
    (
        "railscope_gpu_memory_temperature_celsius",
        Model::Drift { level: 71.0 },
    ),
    (
        "railscope_gpu_power_milliwatts",
        Model::Noisy {
            level: 650_000.0,
            spread: 0.05,
        },
    ),
    (
        "railscope_gpu_power_limit_milliwatts",
        Model::Constant(700_000.0),
    ),
    (
        "railscope_gpu_memory_used_bytes",
        Model::Noisy {
            level: 7.1e10,
            spread: 0.0005,
        },
    ),
    (
        "railscope_gpu_memory_free_bytes",
        Model::Noisy {
            level: 1.0e10,
            spread: 0.003,
        },
    ),
    ("railscope_gpu_memory_total_bytes", Model::Constant(8.1e10)),
    (
        "railscope_gpu_pcie_tx_bytes_per_second",
        Model::Noisy {
            level: 2.1e9,
            spread: 0.2,
        },
    ),
    (
        "railscope_gpu_pcie_rx_bytes_per_second",
        Model::Noisy {
            level: 1.9e9,
            spread: 0.2,
        },
    ),
    (
        "railscope_gpu_nvlink_tx_bytes_per_second",
        Model::Noisy {
            level: 1.1e11,
            spread: 0.2,
        },
    ),
    (
        "railscope_gpu_nvlink_rx_bytes_per_second",
        Model::Noisy {
            level: 1.1e11,
            spread: 0.2,
        },
    ),
    ("railscope_gpu_performance_state", Model::Constant(0.0)),
    ("railscope_gpu_throttle_reasons", Model::Constant(0.0)),
    (
        "railscope_gpu_encoder_utilization_percent",
        Model::Constant(0.0),
    ),
    (
        "railscope_gpu_decoder_utilization_percent",
        Model::Constant(0.0),
    ),
    ("railscope_gpu_pcie_link_generation", Model::Constant(5.0)),
];

const GPM_RATIOS: &[&str] = &[
    "railscope_gpu_sm_active_ratio",
    "railscope_gpu_sm_occupancy_ratio",
    "railscope_gpu_tensor_active_ratio",
    "railscope_gpu_dram_active_ratio",
    "railscope_gpu_fp64_active_ratio",
    "railscope_gpu_fp32_active_ratio",
    "railscope_gpu_fp16_active_ratio",
    "railscope_gpu_integer_active_ratio",
    "railscope_gpu_graphics_active_ratio",
    "railscope_gpu_pcie_tx_ratio",
    "railscope_gpu_pcie_rx_ratio",
    "railscope_gpu_nvlink_ratio",
];

const GPU_COUNTERS: &[(&str, Model)] = &[
    (
        "railscope_gpu_energy_joules_total",
        Model::Fast { per_s: 650.0 },
    ),
    ("railscope_gpu_ecc_corrected_errors_total", Model::Still),
    ("railscope_gpu_ecc_uncorrected_errors_total", Model::Still),
    ("railscope_gpu_retired_pages_single_bit_total", Model::Still),
    ("railscope_gpu_retired_pages_double_bit_total", Model::Still),
    (
        "railscope_gpu_remapped_rows_correctable_total",
        Model::Still,
    ),
    (
        "railscope_gpu_remapped_rows_uncorrectable_total",
        Model::Still,
    ),
    (
        "railscope_gpu_pcie_replays_total",
        Model::Slow { per_s: 0.01 },
    ),
];

const PORT_FAST: &[(&str, f64)] = &[
    ("railscope_ib_port_xmit_data_bytes_total", 1.8e10),
    ("railscope_ib_port_rcv_data_bytes_total", 1.8e10),
    ("railscope_ib_port_xmit_packets_total", 4.4e6),
    ("railscope_ib_port_rcv_packets_total", 4.4e6),
    ("railscope_ib_port_unicast_xmit_packets_total", 4.4e6),
    ("railscope_ib_port_unicast_rcv_packets_total", 4.4e6),
    ("railscope_ib_port_xmit_wait_total", 2.0e5),
    ("railscope_ib_rx_write_requests_total", 1.1e6),
];

const PORT_SLOW: &[(&str, f64)] = &[
    ("railscope_ib_multicast_xmit_packets_total", 0.5),
    ("railscope_ib_multicast_rcv_packets_total", 0.5),
    ("railscope_ib_port_rcv_errors_total", 0.002),
    ("railscope_ib_out_of_sequence_total", 0.05),
    ("railscope_ib_packet_seq_err_total", 0.02),
    ("railscope_ib_local_ack_timeout_err_total", 0.01),
];

/// Constant port counters (to 40 per port with the fast and slow ones).
const PORT_STILL: usize = 40 - PORT_FAST.len() - PORT_SLOW.len();

/// One node: its metrics and their state.
pub struct FixtureNode {
    metrics: Vec<Metric>,
    rng: Rng,
}

impl FixtureNode {
    pub fn new(seed: u64) -> Self {
        let mut rng = Rng(seed);
        let mut metrics = Vec::new();
        let mut add = |name: &str, labels: &Labels, kind: Kind, model: Model, rng: &mut Rng| {
            let value = match model {
                Model::Constant(v) => v,
                Model::Noisy { level, .. } | Model::Drift { level } | Model::Ratio { level } => {
                    level
                }
                _ => 0.0,
            };
            metrics.push(Metric {
                series: Series {
                    name: name.into(),
                    labels: labels.clone(),
                    kind,
                },
                model,
                value,
                count: rng.next_u64() >> 24,
            });
        };
        for g in 0..8 {
            let uuid = format!("GPU-{:016x}-{:08x}", rng.next_u64(), rng.next_u64() as u32);
            let labels = Labels::new([("gpu", g.to_string()), ("uuid", uuid)]);
            for &(name, model) in GPU_GAUGES {
                add(name, &labels, Kind::Gauge, model, &mut rng);
            }
            for &name in GPM_RATIOS {
                let level = 0.2 + 0.7 * rng.unit();
                add(name, &labels, Kind::Gauge, Model::Ratio { level }, &mut rng);
            }
            for &(name, model) in GPU_COUNTERS {
                add(name, &labels, Kind::Counter, model, &mut rng);
            }
        }
        for p in 0..8 {
            let labels = Labels::new([("device", format!("mlx5_{p}")), ("port", "1".into())]);
            for &(name, per_s) in PORT_FAST {
                add(
                    name,
                    &labels,
                    Kind::Counter,
                    Model::Fast { per_s },
                    &mut rng,
                );
            }
            for &(name, per_s) in PORT_SLOW {
                add(
                    name,
                    &labels,
                    Kind::Counter,
                    Model::Slow { per_s },
                    &mut rng,
                );
            }
            for i in 0..PORT_STILL {
                let name = format!("railscope_ib_hw_counter_{i:02}_total");
                add(&name, &labels, Kind::Counter, Model::Still, &mut rng);
            }
        }
        Self { metrics, rng }
    }

    /// Series of this node (640).
    pub fn series(&self) -> usize {
        self.metrics.len()
    }

    /// One sweep at `now_ns`, one second after the previous one: each GPU and each port is
    /// read at its own instant (1 ms apart).
    pub fn sweep(&mut self, now_ns: u64) -> Vec<Reading> {
        let rng = &mut self.rng;
        let mut out = Vec::with_capacity(self.metrics.len());
        for (i, m) in self.metrics.iter_mut().enumerate() {
            let source = (i / 40) as u64;
            let unix_ns = now_ns + source * 1_000_000;
            let value = match m.model {
                Model::Constant(v) => Value::F64(v),
                Model::Noisy { level, spread } => Value::F64((level * rng.around(spread)).round()),
                Model::Drift { level } => {
                    if rng.unit() < 0.1 {
                        m.value += if m.value > level { -1.0 } else { 1.0 };
                    }
                    Value::F64(m.value)
                }
                Model::Ratio { level } => Value::F64((level * rng.around(0.05)).min(1.0)),
                Model::Fast { per_s } => {
                    m.count = m.count.wrapping_add((per_s * rng.around(0.2)) as u64);
                    Value::U64(m.count)
                }
                Model::Slow { per_s } => {
                    if rng.unit() < per_s {
                        m.count += 1;
                    }
                    Value::U64(m.count)
                }
                Model::Still => Value::U64(m.count),
            };
            out.push(Reading {
                series: m.series.clone(),
                value,
                unix_ns,
            });
        }
        out
    }
}

/// One frame as the collector would accept it, with what ingest tells the archive.
pub struct FixtureFrame {
    pub bytes: Vec<u8>,
    pub received_ns: u64,
    pub first_ns: u64,
    pub last_ns: u64,
    pub samples: usize,
}

/// A node sending frames: the node, its encoder, and the schema a receiver has of it.
pub struct FixtureSender {
    pub name: String,
    node: FixtureNode,
    encoder: FrameEncoder,
    key: Key,
    schema: HashMap<u32, Series>,
}

impl FixtureSender {
    pub fn new(name: &str, seed: u64, key: Key) -> Self {
        let encoder = FrameEncoder::new(EncoderConfig::new(name), key.clone())
            .expect("the default encoder configuration is valid");
        Self {
            name: name.to_owned(),
            node: FixtureNode::new(seed),
            encoder,
            key,
            schema: HashMap::new(),
        }
    }

    /// Sweeps once a second from `start_ns` for `seconds`, flushing every `flush_s` seconds;
    /// returns the frames, each with its sample time range.
    pub fn run(&mut self, start_ns: u64, seconds: u64, flush_s: u64) -> Vec<FixtureFrame> {
        self.run_observed(start_ns, seconds, flush_s, &mut |_| {})
    }

    /// [`run`](Self::run), handing every reading to `observe` as it is sent.
    pub fn run_observed(
        &mut self,
        start_ns: u64,
        seconds: u64,
        flush_s: u64,
        observe: &mut dyn FnMut(&Reading),
    ) -> Vec<FixtureFrame> {
        let mut frames = Vec::new();
        for s in 0..seconds {
            let now = start_ns + s * 1_000_000_000;
            for r in self.node.sweep(now) {
                observe(&r);
                self.encoder
                    .push_reading(&r)
                    .expect("fixture readings fit the format");
            }
            if (s + 1) % flush_s == 0 || s + 1 == seconds {
                let send_ns = now + 500_000_000;
                for bytes in self.encoder.flush(send_ns) {
                    frames.push(self.accept(bytes, send_ns + 200_000));
                }
            }
        }
        frames
    }

    /// Sends `event` at once (as the agent does), as a frame of its own.
    pub fn event(&mut self, event: monitor_wire::WireEvent, received_ns: u64) -> FixtureFrame {
        self.encoder.push_event(event);
        let mut frames = self.encoder.flush_events(received_ns - 100_000);
        assert_eq!(frames.len(), 1, "one event makes one frame");
        self.accept(frames.remove(0), received_ns)
    }

    fn accept(&mut self, bytes: Vec<u8>, received_ns: u64) -> FixtureFrame {
        let frame = decode(&bytes, &self.key, &mut ReceiverState::default())
            .expect("the fixture's own frames decode");
        for e in &frame.schema {
            self.schema.insert(e.id, e.series.clone());
        }
        let (first_ns, last_ns) = time_range(&frame).unwrap_or((received_ns, received_ns));
        FixtureFrame {
            bytes,
            received_ns,
            first_ns,
            last_ns,
            samples: frame.sample_count(),
        }
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
            session: self.encoder.session(),
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
