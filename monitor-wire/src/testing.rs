//! What the tests of several modules share: a key, series and frames by hand, proptest
//! strategies for arbitrary frames, and a synthetic node of 8 GPUs and 8 HCA ports.

use std::collections::HashMap;

use proptest::prelude::*;

use crate::{
    codec::decode,
    frame::{CounterSample, Frame, GaugeSample, SchemaEntry, SeriesData, SeriesSamples, WireEvent},
    key::Key,
    receiver::ReceiverState,
    samples::quantize,
    series::{Kind, Labels, Reading, Series, Value},
};

pub(crate) fn key() -> Key {
    Key::from_bytes(*b"0123456789abcdef0123456789abcdef")
}

pub(crate) fn series(name: &str, labels: &[(&str, &str)], kind: Kind) -> Series {
    Series {
        name: name.into(),
        labels: Labels::new(labels.iter().copied()),
        kind,
    }
}

/// Frames compared bit for bit (NaN payloads and the sign of zero included).
pub(crate) fn same(a: &Frame, b: &Frame) -> bool {
    fn split(f: &Frame) -> (Frame, Vec<u64>) {
        let mut f = f.clone();
        let mut bits = Vec::new();
        for s in &mut f.samples {
            if let SeriesData::Gauge(v) = &mut s.data {
                for g in v {
                    for x in [&mut g.min, &mut g.max, &mut g.mean] {
                        bits.push(x.to_bits());
                        *x = 0.0;
                    }
                }
            }
        }
        (f, bits)
    }
    split(a) == split(b)
}

pub(crate) fn sample_frame() -> Frame {
    let t = 1_760_000_000_000_000_000u64;
    Frame {
        node: "gpu-node-017".into(),
        session: 0xdead_beef,
        seq: 42,
        send_unix_ns: t + 10_000_000_000,
        time_quantum_ns: 1_000_000,
        schema: vec![
            SchemaEntry {
                id: 0,
                series: series(
                    "railscope_ib_port_xmit_data_total",
                    &[("device", "mlx5_0"), ("port", "1")],
                    Kind::Counter,
                ),
            },
            SchemaEntry {
                id: 1,
                series: series("railscope_gpu_power_watts", &[("gpu", "0")], Kind::Gauge),
            },
        ],
        samples: vec![
            SeriesSamples {
                id: 0,
                data: SeriesData::Counter(
                    (0..10)
                        .map(|i| CounterSample {
                            unix_ns: t + i * 1_000_000_000,
                            value: 1_000_000_000_000 + i * 5_000_000_000,
                        })
                        .collect(),
                ),
            },
            SeriesSamples {
                id: 1,
                data: SeriesData::Gauge(vec![
                    GaugeSample::reading(t, 312.456),
                    GaugeSample {
                        start_unix_ns: t,
                        end_unix_ns: t + 9_000_000_000,
                        min: 300.0,
                        max: 650.5,
                        mean: 512.25,
                    },
                ]),
            },
        ],
        events: vec![WireEvent {
            unix_ns: t + 5_123_456_789,
            kind: "ib_port".into(),
            labels: Labels::new([("device", "mlx5_0"), ("port", "1")]),
            code: 10,
            text: "PORT_ERR".into(),
        }],
    }
}

// ---------------------------------------------------------------------------------------------
// Property tests

pub(crate) fn arb_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<f64>(),
        (-2000i64..2000).prop_map(|i| i as f64),
        (any::<i32>(), 0i32..8).prop_map(|(i, k)| f64::from(i) / 10f64.powi(k)),
        Just(-0.0),
        Just(f64::NAN),
    ]
}

pub(crate) fn arb_labels() -> impl Strategy<Value = Labels> {
    prop::collection::vec(("[a-z_]{1,8}", "[a-zA-Z0-9_. é-]{0,12}"), 0..4).prop_map(Labels::new)
}

pub(crate) fn arb_series() -> impl Strategy<Value = Series> {
    (
        "railscope_[a-z_]{1,24}",
        arb_labels(),
        prop_oneof![Just(Kind::Counter), Just(Kind::Gauge)],
    )
        .prop_map(|(name, labels, kind)| Series {
            name: name.into(),
            labels,
            kind,
        })
}

pub(crate) fn arb_time(q: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        (0..=u64::MAX / q).prop_map(move |t| t * q),
        (0u64..20_000).prop_map(move |t| (1_760_000_000_000_000_000 / q + t) * q),
    ]
}

pub(crate) fn arb_samples(q: u64) -> impl Strategy<Value = SeriesData> {
    let counters = prop::collection::vec(
        (
            arb_time(q),
            prop_oneof![any::<u64>(), 0u64..1000, Just(123_456_789)],
        ),
        0..12,
    )
    .prop_map(|v| {
        SeriesData::Counter(
            v.into_iter()
                .map(|(unix_ns, value)| CounterSample { unix_ns, value })
                .collect(),
        )
    });
    let gauge = (
        arb_time(q),
        0u64..5000,
        arb_f64(),
        arb_f64(),
        arb_f64(),
        any::<bool>(),
    )
        .prop_map(move |(end, dur, a, b, c, single)| {
            let start = end.saturating_sub(dur * q);
            if single {
                GaugeSample {
                    start_unix_ns: start,
                    ..GaugeSample::reading(end, a)
                }
            } else {
                GaugeSample {
                    start_unix_ns: start,
                    end_unix_ns: end,
                    min: a,
                    max: b,
                    mean: c,
                }
            }
        });
    let gauges = prop::collection::vec(gauge, 0..12).prop_map(SeriesData::Gauge);
    prop_oneof![counters, gauges]
}

pub(crate) fn arb_event() -> impl Strategy<Value = WireEvent> {
    (
        any::<u64>(),
        "[a-z_]{0,10}",
        arb_labels(),
        any::<i64>(),
        ".{0,40}",
    )
        .prop_map(|(unix_ns, kind, labels, code, text)| WireEvent {
            unix_ns,
            kind,
            labels,
            code,
            text,
        })
}

pub(crate) fn arb_frame() -> impl Strategy<Value = Frame> {
    prop_oneof![Just(1u64), Just(1000), Just(1_000_000)].prop_flat_map(|q| {
        (
            "[a-z0-9-]{0,20}",
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            prop::collection::vec(
                (prop_oneof![0u32..40, any::<u32>()], arb_series())
                    .prop_map(|(id, series)| SchemaEntry { id, series }),
                0..5,
            ),
            prop::collection::vec(
                (prop_oneof![0u32..40, any::<u32>()], arb_samples(q))
                    .prop_map(|(id, data)| SeriesSamples { id, data }),
                0..6,
            ),
            prop::collection::vec(arb_event(), 0..3),
        )
            .prop_map(
                move |(node, session, seq, send_unix_ns, schema, samples, events)| Frame {
                    node,
                    session,
                    seq,
                    send_unix_ns,
                    time_quantum_ns: q,
                    schema,
                    samples,
                    events,
                },
            )
    })
}

pub(crate) const T0: u64 = 1_760_000_000_000_000_000;

/// What a pushed sample becomes after the trip (times rounded to the quantum).
pub(crate) fn quantized(s: &SeriesData, q: u64) -> Vec<(u64, u64, [u64; 3])> {
    let r = |t: u64| quantize(t, q) * q;
    match s {
        SeriesData::Counter(v) => v
            .iter()
            .map(|c| (r(c.unix_ns), r(c.unix_ns), [c.value; 3]))
            .collect(),
        SeriesData::Gauge(v) => v
            .iter()
            .map(|g| {
                (
                    r(g.start_unix_ns),
                    r(g.end_unix_ns),
                    [g.min.to_bits(), g.max.to_bits(), g.mean.to_bits()],
                )
            })
            .collect(),
    }
}

pub(crate) fn decode_all(frames: &[Vec<u8>], state: &mut ReceiverState) -> Vec<Frame> {
    frames
        .iter()
        .map(|f| decode(f, &key(), state).unwrap())
        .collect()
}

/// Everything the frames carry, per series, as (start, end, values) sorted.
pub(crate) fn received(
    frames: &[Frame],
    state: &ReceiverState,
) -> HashMap<Series, Vec<(u64, u64, [u64; 3])>> {
    let mut out: HashMap<Series, Vec<_>> = HashMap::new();
    for f in frames {
        let node = state.node(&f.node).unwrap();
        for s in &f.samples {
            let series = node.series(s.id).expect("every id has its entry").clone();
            out.entry(series)
                .or_default()
                .extend(quantized(&s.data, f.time_quantum_ns));
        }
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Size on a realistic node

/// xorshift64*: deterministic noise for the synthetic node.
pub(crate) struct Noise(pub u64);

impl Noise {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub(crate) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

const IB_COUNTERS: [&str; 50] = [
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_packets",
    "port_rcv_packets",
    "unicast_xmit_packets",
    "unicast_rcv_packets",
    "port_xmit_wait",
    "rx_write_requests",
    "np_ecn_marked_roce_packets",
    "rp_cnp_handled",
    "np_cnp_sent",
    "out_of_sequence",
    "local_ack_timeout_err",
    "multicast_rcv_packets",
    "excessive_buffer_overrun_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "multicast_xmit_packets",
    "port_rcv_constraint_errors",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_xmit_discards",
    "symbol_error",
    "vl15_dropped",
    "duplicate_request",
    "implied_nak_seq_err",
    "lifespan",
    "out_of_buffer",
    "packet_seq_err",
    "req_cqe_error",
    "req_cqe_flush_error",
    "req_remote_access_errors",
    "req_remote_invalid_request",
    "resp_cqe_error",
    "resp_cqe_flush_error",
    "resp_local_length_error",
    "resp_remote_access_errors",
    "rnr_nak_retry_err",
    "rp_cnp_ignored",
    "rx_atomic_requests",
    "rx_dct_connect",
    "rx_icrc_encapsulated",
    "rx_read_requests",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
];

/// How a synthetic GPU gauge moves from one second to the next.
#[derive(Clone, Copy)]
enum Gauge {
    Const(f64),
    /// Integer, uniform in [lo, hi).
    Int(u64, u64),
    /// Integer random walk of +-1 with probability 1/3.
    Walk(f64),
    /// Milliwatts as watts: 3 decimals.
    MilliWatts,
    /// Free-running double (GPM metrics): a ratio in percent or a bandwidth in bytes/s.
    Double(f64),
}

const GPU_GAUGES: [(&str, Gauge); 40] = [
    ("utilization_gpu_percent", Gauge::Int(95, 101)),
    ("utilization_memory_percent", Gauge::Int(30, 60)),
    ("utilization_encoder_percent", Gauge::Const(0.0)),
    ("utilization_decoder_percent", Gauge::Const(0.0)),
    ("clock_sm_mhz", Gauge::Const(1980.0)),
    ("clock_graphics_mhz", Gauge::Const(1980.0)),
    ("clock_memory_mhz", Gauge::Const(2619.0)),
    ("clock_video_mhz", Gauge::Const(1545.0)),
    ("clock_sm_max_mhz", Gauge::Const(1980.0)),
    ("temperature_gpu_celsius", Gauge::Walk(64.0)),
    ("temperature_memory_celsius", Gauge::Walk(71.0)),
    ("temperature_slowdown_celsius", Gauge::Const(90.0)),
    ("power_usage_watts", Gauge::MilliWatts),
    ("power_limit_watts", Gauge::Const(700.0)),
    ("memory_used_bytes", Gauge::Const(76_235_669_504.0)),
    ("memory_free_bytes", Gauge::Const(9_663_676_416.0)),
    ("memory_total_bytes", Gauge::Const(85_899_345_920.0)),
    ("bar1_used_bytes", Gauge::Const(16_777_216.0)),
    (
        "pcie_tx_kilobytes_per_second",
        Gauge::Int(900_000, 2_100_000),
    ),
    (
        "pcie_rx_kilobytes_per_second",
        Gauge::Int(900_000, 2_100_000),
    ),
    ("pcie_link_gen", Gauge::Const(5.0)),
    ("pcie_link_width", Gauge::Const(16.0)),
    (
        "nvlink_tx_kibibytes_per_second",
        Gauge::Int(100_000_000, 300_000_000),
    ),
    (
        "nvlink_rx_kibibytes_per_second",
        Gauge::Int(100_000_000, 300_000_000),
    ),
    ("fan_speed_percent", Gauge::Const(0.0)),
    ("performance_state", Gauge::Const(0.0)),
    ("clocks_event_reasons", Gauge::Const(0.0)),
    ("ecc_mode", Gauge::Const(1.0)),
    ("gpm_sm_active_percent", Gauge::Double(85.0)),
    ("gpm_sm_occupancy_percent", Gauge::Double(40.0)),
    ("gpm_tensor_active_percent", Gauge::Double(60.0)),
    ("gpm_dram_active_percent", Gauge::Double(45.0)),
    ("gpm_fp64_active_percent", Gauge::Double(0.5)),
    ("gpm_fp32_active_percent", Gauge::Double(12.0)),
    ("gpm_fp16_active_percent", Gauge::Double(35.0)),
    ("gpm_integer_active_percent", Gauge::Double(8.0)),
    ("gpm_pcie_tx_mebibytes_per_second", Gauge::Double(1430.0)),
    ("gpm_pcie_rx_mebibytes_per_second", Gauge::Double(1430.0)),
    (
        "gpm_nvlink_tx_mebibytes_per_second",
        Gauge::Double(190_000.0),
    ),
    (
        "gpm_nvlink_rx_mebibytes_per_second",
        Gauge::Double(190_000.0),
    ),
];

/// A node of 8 GPUs (40 gauges each) and 8 HCA ports (50 counters each), read every second
/// for `sweeps` seconds. Each GPU and each port is read at its own time within the sweep.
pub(crate) fn node_batch(sweeps: u64) -> Vec<Reading> {
    let mut noise = Noise(0x9e37_79b9_7f4a_7c15);
    let mut out = Vec::new();
    let mut walks = [[0f64; 40]; 8];
    let uuids: Vec<String> = (0..8)
        .map(|_| {
            let (a, b) = (noise.next(), noise.next());
            format!(
                "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
                a >> 32,
                (a >> 16) & 0xffff,
                a & 0xffff,
                b >> 48,
                b & 0xffff_ffff_ffff
            )
        })
        .collect();
    let mut counters = [[0u64; 50]; 8];
    for (p, port) in counters.iter_mut().enumerate() {
        port[0] = 4_000_000_000_000_000 + p as u64 * 1_000_000_007;
        port[1] = port[0] - 12_345_678;
        port[2] = 900_000_000_000_000;
        port[3] = 890_000_000_000_000;
        port[4] = port[2] - 77;
        port[5] = port[3] - 99;
        port[6] = 31_000_000_000_000;
        port[7] = 450_000_000_000;
        for (i, c) in port.iter_mut().enumerate().skip(8) {
            *c = match i {
                8..=13 => 10_000 + noise.below(100_000),
                15 => 1,
                16 => 3,
                25 => 12,
                29 => 10,
                _ => 0,
            };
        }
    }
    for s in 0..sweeps {
        let sweep = T0 + s * 1_000_000_000 + noise.below(3_000_000);
        for (g, walk) in walks.iter_mut().enumerate() {
            let t = sweep + g as u64 * 1_500_000 + noise.below(200_000);
            let labels = Labels::new([("gpu", g.to_string()), ("uuid", uuids[g].clone())]);
            for (i, (name, how)) in GPU_GAUGES.iter().enumerate() {
                let value = match *how {
                    Gauge::Const(v) => v,
                    Gauge::Int(lo, hi) => (lo + noise.below(hi - lo)) as f64,
                    Gauge::Walk(start) => {
                        if s == 0 {
                            walk[i] = start;
                        } else if noise.below(3) == 0 {
                            walk[i] += if noise.below(2) == 0 { 1.0 } else { -1.0 };
                        }
                        walk[i]
                    }
                    Gauge::MilliWatts => (550_000 + noise.below(150_000)) as f64 / 1000.0,
                    Gauge::Double(center) => center * (0.9 + 0.2 * noise.unit()),
                };
                out.push(Reading {
                    series: Series {
                        name: format!("railscope_gpu_{name}").into(),
                        labels: labels.clone(),
                        kind: Kind::Gauge,
                    },
                    value: Value::F64(value),
                    unix_ns: t,
                });
            }
        }
        for (p, port) in counters.iter_mut().enumerate() {
            let t = sweep + 12_000_000 + p as u64 * 400_000 + noise.below(100_000);
            let labels = Labels::new([("device", format!("mlx5_{p}")), ("port", "1".into())]);
            for (i, name) in IB_COUNTERS.iter().enumerate() {
                if s > 0 {
                    port[i] += match i {
                        0 | 1 => 4_500_000_000 + noise.below(1_000_000_000),
                        2..=5 => 1_100_000 + noise.below(250_000),
                        6 => noise.below(2_000_000),
                        7 => 550_000 + noise.below(100_000),
                        8..=10 | 13 => noise.below(3) * noise.below(50),
                        11 | 12 => u64::from(noise.below(20) == 0),
                        _ => 0,
                    };
                }
                out.push(Reading {
                    series: Series {
                        name: format!("railscope_ib_port_{name}_total").into(),
                        labels: labels.clone(),
                        kind: Kind::Counter,
                    },
                    value: Value::U64(port[i]),
                    unix_ns: t,
                });
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Allocation accounting

/// The system allocator, counting what each thread has allocated and not yet freed, so a test
/// can measure the peak of one call ([`peak_allocation`]). Memory freed by another thread than
/// the one that allocated it skews that thread's count; the calls measured here are
/// single-threaded.
struct CountingAllocator;

thread_local! {
    static LIVE: std::cell::Cell<isize> = const { std::cell::Cell::new(0) };
    static PEAK: std::cell::Cell<isize> = const { std::cell::Cell::new(0) };
}

fn count(delta: isize) {
    // try_with: the counters may be gone while the thread ends.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: every call is passed on to the system allocator unchanged; only counters change.
unsafe impl std::alloc::GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: as the caller promised for this layout.
        let p = unsafe { std::alloc::System.alloc(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: as the caller promised: `ptr` came from `alloc` with this layout.
        unsafe { std::alloc::System.dealloc(ptr, layout) };
        count(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as the caller promised for `ptr`, `layout` and `new_size`.
        let p = unsafe { std::alloc::System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Runs `f` and returns its result with the most memory it had allocated at once on this
/// thread (beyond what was allocated before it started), in bytes.
pub(crate) fn peak_allocation<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let start = LIVE.with(|l| l.get());
    PEAK.with(|p| p.set(start));
    let result = f();
    let peak = PEAK.with(|p| p.get());
    (result, (peak - start).max(0) as usize)
}
