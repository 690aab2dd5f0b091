//! A simulated fleet for tests, benches and the demo (dev-only, never shipped): N nodes of 8
//! GPUs and 8 IB ports each, running jobs labelled with `job_id`, and the faults operators look
//! for — a slow GPU, a degraded port, a flapping port, XIDs — produced as **real frames** by
//! monitor-wire's encoder, with the series names and labels the agent sends
//! (monitor-user/src/sources: `ib_sysfs`, `gpu`; `railscope_rdma_verbs_total`; events as
//! `agent/wire_events.rs` and `pipeline::gpu_event` make them).
//!
//! ```no_run
//! use monitor_testkit::SimulatedFleet;
//! let key = monitor_wire::Key::from_bytes([7; 32]);
//! let mut fleet = SimulatedFleet::builder(64)
//!     .job("slurm:4242", 0..64)
//!     .slow_gpu(17, 3)
//!     .degraded_port(42, 5)
//!     .flapping_port(9, 2)
//!     .build(key);
//! fleet.send_ticks("127.0.0.1:7670".parse().unwrap(), 300).unwrap();
//! ```
//!
//! Time is simulated: each tick is one sweep of every node, `interval` after the previous one,
//! from `start_unix_ns` (by default `ticks_before_now` ticks before the wall clock, so a run of
//! that many ticks ends now and a collector accepts every frame). Values carry seeded noise:
//! a fleet built twice with the same settings produces the same samples.
//!
//! With [`adaptive`](FleetBuilder::adaptive), each node sends what a real agent sends: every
//! series through the agent's own adaptive sampler, so stable series are sent only every ~32 s,
//! out of phase with each other, gauges as envelopes of the reads since their previous sample.
//!
//! Also the set-up the end-to-end tests share, one home each: scratch directories, key
//! files and free ports ([`scratch`]), a child process with its output drained ([`child`]),
//! a collector started and waited for ([`collector_process`]), the real agent on a fixture
//! node with the NVML stand-in ([`fixture_agent`]), the sysfs tree and stand-in script of an
//! 8-GPU HGX H100 node and its variants ([`hgx`]), processes in a job's cgroups whose pids
//! the stand-in lists on a GPU ([`job_processes`]); one node's frames as a collector
//! accepts them, for the collector's archive and query tests and benches ([`node_frames`]);
//! the hardware path a simulated node sends, an [`hgx`] node's ([`sim_hardware`]);
//! a relay that keeps what an agent sent and can answer it ([`relay`]), and what it sent in
//! the forms an archive and a TSDB are compared with ([`sent_frames`]); a real Slurm cluster
//! on loopback for the actions' tests ([`slurm`]).

pub mod child;
pub mod collector_process;
pub mod fixture_agent;
pub mod hgx;
pub mod job_processes;
pub mod node_frames;
pub mod relay;
pub mod scratch;
pub mod sent_frames;
pub mod sim_hardware;
pub mod slurm;

pub use child::{Running, json_output};
pub use collector_process::{
    CollectorCommand, CollectorProcess, http_get, metric_sum, remote_write_caught_up, wait_for,
};
pub use fixture_agent::{
    FixtureAgent, agent_binary_next_to, json_listener_command, spawn_json_listener,
    standin_with_script, sysfs_fixture,
};
pub use hgx::HgxNode;
pub use job_processes::JobProcesses;
pub use node_frames::{NodeFrame, NodeSender};
pub use relay::{Impairment, Relay};
pub use scratch::{
    KEY_HEX, copy_tree, free_tcp_port, free_udp_port, key_file, key_from_hex, scratch_dir,
};

use std::{
    collections::BTreeMap,
    io,
    net::{SocketAddr, UdpSocket},
    ops::Range,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use monitor_sampler::{AdaptiveSampler, SamplerConfig, wire_sample};
use monitor_wire::{
    EncoderConfig, FrameEncoder, Key, Kind, Labels, Reading, Series, Value, WireEvent,
    names::{event_kind, metric},
};

/// GPUs per node.
pub const GPUS: usize = 8;
/// IB devices per node, one port each (`mlx5_0`..`mlx5_7`, port 1).
pub const PORTS: usize = 8;

/// Healthy values, and what the faults turn them into.
pub mod values {
    /// SM activity of a busy GPU (0-1) and of the slow one.
    pub const SM_UTIL: f64 = 0.92;
    pub const SLOW_SM_UTIL: f64 = 0.55;
    pub const TENSOR_UTIL: f64 = 0.70;
    pub const SLOW_TENSOR_UTIL: f64 = 0.38;
    pub const DRAM_BW_UTIL: f64 = 0.60;
    pub const SLOW_DRAM_BW_UTIL: f64 = 0.35;
    /// Bytes per second each way on a port of a busy node (about 200 Gb/s).
    pub const PORT_BYTES_PER_S: f64 = 25.0e9;
    pub const DEGRADED_PORT_BYTES_PER_S: f64 = 11.0e9;
    /// A 4X NDR port, and the degraded one trained down to 2 lanes.
    pub const RATE_GBPS: f64 = 400.0;
    pub const WIDTH_LANES: f64 = 4.0;
    pub const DEGRADED_RATE_GBPS: f64 = 200.0;
    pub const DEGRADED_WIDTH_LANES: f64 = 2.0;
    /// A storage port ([`FleetBuilder::storage_ports`](crate::FleetBuilder::storage_ports)):
    /// 100 GbE RoCE, four lanes.
    pub const STORAGE_RATE_GBPS: f64 = 100.0;
    /// Symbol errors per second on the degraded port (healthy ports count none).
    pub const DEGRADED_SYMBOL_ERRORS_PER_S: u64 = 40;
    /// CNPs sent per second by a healthy RoCE port, and by a congested one.
    pub const CNP_PER_S: u64 = 50;
    pub const CONGESTED_CNP_PER_S: u64 = 20_000;
    /// PFC pause frames per second a healthy RoCE port sends and receives on priority 3
    /// (its RoCE traffic class), each pausing for [`PAUSE_US`] microseconds; and the frames a
    /// port in a pause storm sends.
    pub const PAUSE_PER_S: u64 = 20;
    pub const PAUSE_US: u64 = 10;
    pub const STORM_PAUSE_PER_S: u64 = 50_000;
    /// PCIe link of a healthy GPU (Gen5 x16).
    pub const PCIE_GEN: f64 = 5.0;
    pub const PCIE_WIDTH: f64 = 16.0;
}

/// A job running on a range of nodes (all their GPUs).
#[derive(Clone, Debug)]
pub struct SimJob {
    pub job_id: String,
    pub nodes: Range<usize>,
}

/// An XID occurrence at a tick.
#[derive(Clone, Copy, Debug)]
pub struct SimXid {
    pub node: usize,
    pub gpu: usize,
    pub code: u64,
    pub tick: u64,
}

/// A GPU lost (fallen off the bus) at a tick: its series stop from then on.
#[derive(Clone, Copy, Debug)]
pub struct SimLostGpu {
    pub node: usize,
    pub gpu: usize,
    pub tick: u64,
}

/// Builds a [`SimulatedFleet`]; nodes, GPUs and ports are numbered from 0 (a port is its
/// device index: port `p` is `mlx5_<p>`, port 1).
#[derive(Clone, Debug)]
pub struct FleetBuilder {
    nodes: usize,
    node_prefix: String,
    node_names: Vec<String>,
    jobs: Vec<SimJob>,
    /// (node, GPU, the tick it slows down at).
    slow_gpus: Vec<(usize, usize, u64)>,
    /// Slow GPUs whose cause is a thermal slowdown (the throttle flag is up).
    throttled: bool,
    /// (node, port, the tick it trains down at).
    degraded_ports: Vec<(usize, usize, u64)>,
    /// The last ports of every node that are storage ports (RoCE at 100 Gb/s).
    storage_ports: usize,
    /// (node, port, the tick it goes down at, for good).
    down_ports: Vec<(usize, usize, u64)>,
    flapping_ports: Vec<(usize, usize)>,
    flap_every_ticks: u64,
    flap_down_ticks: u64,
    port_event_skew_ns: u64,
    congested_ports: Vec<(usize, usize)>,
    /// Ports whose netdevs send the ethtool PFC counters (see [`FleetBuilder::pfc`]).
    pfc: bool,
    pfc_storms: Vec<(usize, usize)>,
    /// (node, port, fraction of the time paused).
    pfc_paused: Vec<(usize, usize, f64)>,
    xids: Vec<SimXid>,
    lost: Vec<SimLostGpu>,
    ecc_dbe: Vec<(usize, usize)>,
    remap_pending: Vec<(usize, usize)>,
    pcie_degraded: Vec<(usize, usize)>,
    /// GPUs whose link trained at Gen4 but full width.
    pcie_gen_dropped: Vec<(usize, usize)>,
    /// Every node sends its hardware path ([`sim_hardware`]), these nodes' variants of the
    /// HGX layout.
    hardware: Option<BTreeMap<usize, HgxNode>>,
    qp_errors: Vec<(usize, String)>,
    cm_disconnects: Vec<(usize, String)>,
    cm_rejects: Vec<(usize, String)>,
    roce: bool,
    /// (node, port, switch, switch port): LLDP neighbours the node's agent sends.
    neighbours: Vec<(usize, usize, String, String)>,
    adaptive: bool,
    interval: Duration,
    flush_every: u64,
    staggered_flush: bool,
    schema_refresh: Duration,
    start_unix_ns: Option<u64>,
    ticks_before_now: u64,
    seed: u64,
}

impl FleetBuilder {
    /// Node names are `<prefix><index, 3 digits>`; default `node-`.
    pub fn node_prefix(mut self, prefix: &str) -> Self {
        self.node_prefix = prefix.into();
        self
    }

    /// The names of the first nodes, in order, instead of `<prefix><index>`.
    pub fn node_names<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.node_names = names.into_iter().map(Into::into).collect();
        self
    }

    /// A job on `nodes` (its GPU series and verb series carry `job_id`; contract: `slurm:<id>`,
    /// `k8s:<uid>`, `systemd:<unit>`). Nodes in no job are idle (low utilisation).
    pub fn job(mut self, job_id: &str, nodes: Range<usize>) -> Self {
        self.jobs.push(SimJob {
            job_id: job_id.into(),
            nodes,
        });
        self
    }

    /// A GPU whose SM, tensor and memory-bandwidth activity stay well below its peers', with
    /// its `hw_thermal_slowdown` throttle flag up (the cause a findings engine should name).
    pub fn slow_gpu(self, node: usize, gpu: usize) -> Self {
        self.slow_gpu_from(node, gpu, 0)
    }

    /// [`slow_gpu`](Self::slow_gpu) from tick `tick` on (healthy before): a straggler's onset.
    pub fn slow_gpu_from(mut self, node: usize, gpu: usize, tick: u64) -> Self {
        self.slow_gpus.push((node, gpu, tick));
        self.throttled = true;
        self
    }

    /// Slow GPUs without any throttle flag (a cause the collector cannot see).
    pub fn unexplained(mut self) -> Self {
        self.throttled = false;
        self
    }

    /// A port trained down from 4X 400 Gb/s to 2X 200 Gb/s, counting symbol errors and
    /// carrying less than half its peers' traffic.
    pub fn degraded_port(self, node: usize, port: usize) -> Self {
        self.degraded_port_from(node, port, 0)
    }

    /// [`degraded_port`](Self::degraded_port) from tick `tick` on (4X 400 Gb/s before).
    pub fn degraded_port_from(mut self, node: usize, port: usize, tick: u64) -> Self {
        self.degraded_ports.push((node, port, tick));
        self
    }

    /// The last `count` ports of every node are storage ports, as a DGX A100's: RoCE
    /// (`link_layer` Ethernet) at 4X 100 Gb/s beside the InfiniBand compute ports at 400;
    /// every port then sends its `railscope_ib_port_link_layer_info`.
    pub fn storage_ports(mut self, count: usize) -> Self {
        self.storage_ports = count;
        self
    }

    /// A port that goes DOWN at tick `tick` and stays down: a `PORT_ERR` port event and a
    /// `port_transition` to DOWN at that tick's time, state, phys state and `link_downed`
    /// following.
    pub fn port_down(mut self, node: usize, port: usize, tick: u64) -> Self {
        self.down_ports.push((node, port, tick));
        self
    }

    /// A port that goes DOWN and back UP every `flap_every` ticks (default 20, down for 2):
    /// `ib_port` PORT_ERR/PORT_ACTIVE events and `port_transition` events, state, phys state
    /// and `link_downed` following.
    pub fn flapping_port(mut self, node: usize, port: usize) -> Self {
        self.flapping_ports.push((node, port));
        self
    }

    pub fn flap_period(mut self, every_ticks: u64, down_ticks: u64) -> Self {
        assert!(down_ticks < every_ticks && every_ticks > 0);
        self.flap_every_ticks = every_ticks;
        self.flap_down_ticks = down_ticks;
        self
    }

    /// A RoCE port whose CNP and ECN counters run far above the fleet's (makes the fleet
    /// RoCE: every port gets `np_cnp_sent`, `rp_cnp_handled`, `np_ecn_marked_roce_packets`).
    /// Node `n`'s port events come `n * skew` after the tick (default 0: every node's at the
    /// same instant): flapping ports of many nodes then look like a switch dropping its links,
    /// each node's kernel seeing it a little later than the one before.
    pub fn port_event_skew(mut self, skew: Duration) -> Self {
        self.port_event_skew_ns = skew.as_nanos() as u64;
        self
    }

    pub fn congested_port(mut self, node: usize, port: usize) -> Self {
        self.congested_ports.push((node, port));
        self.roce = true;
        self
    }

    /// Port `port` of node `node` (`mlx5_<port>`, netdev `enp<port>s0np0`) is cabled to
    /// `switch_port` of `switch`, as lldpd tells the agent: the node sends
    /// `railscope_ib_port_neighbor_info` for it every tick.
    pub fn lldp_neighbour(
        mut self,
        node: usize,
        port: usize,
        switch: &str,
        switch_port: &str,
    ) -> Self {
        self.neighbours
            .push((node, port, switch.into(), switch_port.into()));
        self
    }

    /// Every port's netdev sends mlx5's PFC counters as the agent's ethtool source names them
    /// (`railscope_ethtool_{rx,tx}_prio{0,3}_pause_total` and `..._pause_duration_total`,
    /// labels `device`, `port`, `netdev`): priority 3 at the healthy rate, priority 0 none.
    pub fn pfc(mut self) -> Self {
        self.pfc = true;
        self
    }

    /// A port in a PFC pause storm: it sends [`values::STORM_PAUSE_PER_S`] pause frames on
    /// priority 3 (makes the fleet send the PFC counters).
    pub fn pfc_storm_port(mut self, node: usize, port: usize) -> Self {
        self.pfc_storms.push((node, port));
        self.pfc = true;
        self
    }

    /// A port the switch keeps paused `fraction` of the time on priority 3, with the healthy
    /// number of pause frames (makes the fleet send the PFC counters).
    pub fn pfc_paused_port(mut self, node: usize, port: usize, fraction: f64) -> Self {
        self.pfc_paused.push((node, port, fraction));
        self.pfc = true;
        self
    }

    /// Every port has the RoCE congestion counters (at the healthy rate unless congested).
    pub fn roce(mut self) -> Self {
        self.roce = true;
        self
    }

    pub fn xid(mut self, node: usize, gpu: usize, code: u64, tick: u64) -> Self {
        self.xids.push(SimXid {
            node,
            gpu,
            code,
            tick,
        });
        self
    }

    /// The GPU falls off the bus at `tick`: a `gpu_lost` event, then no more series of it.
    pub fn lost_gpu(mut self, node: usize, gpu: usize, tick: u64) -> Self {
        self.lost.push(SimLostGpu { node, gpu, tick });
        self
    }

    /// Uncorrected (double-bit) ECC errors counting up on a GPU.
    pub fn ecc_double_bit(mut self, node: usize, gpu: usize) -> Self {
        self.ecc_dbe.push((node, gpu));
        self
    }

    /// A row remapping pending on a GPU.
    pub fn remap_pending(mut self, node: usize, gpu: usize) -> Self {
        self.remap_pending.push((node, gpu));
        self
    }

    /// A GPU whose PCIe link trained at Gen4 x8 instead of Gen5 x16.
    pub fn pcie_degraded(mut self, node: usize, gpu: usize) -> Self {
        self.pcie_degraded.push((node, gpu));
        self
    }

    /// A GPU whose PCIe link trained at Gen4 x16 instead of Gen5 x16 (the generation alone).
    pub fn pcie_gen_dropped(mut self, node: usize, gpu: usize) -> Self {
        self.pcie_gen_dropped.push((node, gpu));
        self
    }

    /// Every node sends its hardware path every tick, an HGX H100's ([`sim_hardware`]): node
    /// `n` as [`HgxNode::new`]`(n)` unless [`Self::hgx_node`] gives it a variant.
    pub fn hardware_path(mut self) -> Self {
        self.hardware.get_or_insert_with(BTreeMap::new);
        self
    }

    /// Node `node`'s hardware path is `hgx`'s (a variant: older NIC firmware, a NIC missing,
    /// PFN's wiring); the hardware path on.
    pub fn hgx_node(mut self, node: usize, hgx: HgxNode) -> Self {
        self.hardware
            .get_or_insert_with(BTreeMap::new)
            .insert(node, hgx);
        self
    }

    /// QPs of `job_id` on `node` moving to ERR (the verb counter, one per tick).
    pub fn qp_errors(mut self, node: usize, job_id: &str) -> Self {
        self.qp_errors.push((node, job_id.into()));
        self
    }

    /// rdma_cm connections of `job_id` on `node` closed (a `DISCONNECTED` event, one per tick):
    /// with [`qp_errors`](Self::qp_errors), the graceful teardown that moves each QP to ERR.
    pub fn cm_disconnects(mut self, node: usize, job_id: &str) -> Self {
        self.cm_disconnects.push((node, job_id.into()));
        self
    }

    /// rdma_cm rejects (`REJ_CONSUMER_DEFINED`) for `job_id` on `node`, one per tick.
    pub fn cm_rejects(mut self, node: usize, job_id: &str) -> Self {
        self.cm_rejects.push((node, job_id.into()));
        self
    }

    /// Each node sends what a real agent sends with adaptive sampling on (its default), instead
    /// of every reading of every tick: each series goes through the agent's own
    /// `AdaptiveSampler` (the crate monitor-sampler) configured as the agent
    /// configures it (monitor-user's `pipeline::sampler_config`): the minimum interval is the
    /// fleet's [`interval`](Self::interval), intervals of stable series double up to 32 s with
    /// ±10% jitter, IB series are read every second minimum interval once stable. So a stable
    /// series is sent about every 32 s; a gauge sample is the envelope (min, max, mean) of the
    /// reads since the series' previous sample, a counter sample its cumulative value.
    ///
    /// The series of agents that have run for long are out of phase with each other (each
    /// interval is jittered on its own): here each series of each node starts at its own tick
    /// within the first 32 s (seeded), so the GPUs of a node, the nodes, and the transmit and
    /// receive counters of one port are sent at different times. Until a series starts
    /// nothing of it is sent. Events are sent at once, as before. Default off.
    pub fn adaptive(mut self, on: bool) -> Self {
        self.adaptive = on;
        self
    }

    /// Time between ticks (default 1 s).
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Ticks per flush (default 10, like the agent's 10 s flush of 1 s sweeps).
    pub fn flush_every(mut self, ticks: u64) -> Self {
        self.flush_every = ticks.max(1);
        self
    }

    /// Node `n` flushes `n` ticks later in the flush cycle than node 0 (modulo the cycle),
    /// as agents started at different times do, instead of every node at the same tick
    /// (default off).
    pub fn staggered_flush(mut self, on: bool) -> Self {
        self.staggered_flush = on;
        self
    }

    /// How often each node's encoder sends its whole schema again (default 60 s, so that a
    /// collector started late learns every series soon; the agent's is the encoder's default,
    /// 5 min).
    pub fn schema_refresh(mut self, every: Duration) -> Self {
        self.schema_refresh = every;
        self
    }

    /// Time of tick 0.
    pub fn start_unix_ns(mut self, t: u64) -> Self {
        self.start_unix_ns = Some(t);
        self
    }

    /// Tick 0 is this many intervals before the wall clock when built (default 300), unless
    /// `start_unix_ns` is given.
    pub fn ticks_before_now(mut self, ticks: u64) -> Self {
        self.ticks_before_now = ticks;
        self
    }

    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    pub fn build(self, key: Key) -> SimulatedFleet {
        let interval_ns = self.interval.as_nanos() as u64;
        let start = self.start_unix_ns.unwrap_or_else(|| {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .expect("clock after 1970")
                .as_nanos() as u64;
            // Whole seconds, so sample times fall on the encoder's time quantum.
            (now - self.ticks_before_now * interval_ns) / 1_000_000_000 * 1_000_000_000
        });
        let nodes = (0..self.nodes)
            .map(|n| {
                let name = self
                    .node_names
                    .get(n)
                    .cloned()
                    .unwrap_or_else(|| format!("{}{n:03}", self.node_prefix));
                let mut config = EncoderConfig::new(name.clone());
                config.schema_refresh = self.schema_refresh;
                SimNode {
                    encoder: FrameEncoder::new(config, key.clone())
                        .expect("a simulated node's name fits a frame"),
                    name,
                    counters: BTreeMap::new(),
                    port_up: [true; PORTS],
                    sampler: self.adaptive.then(|| {
                        agent_sampler(self.interval).with_seed(
                            self.seed ^ (n as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                        )
                    }),
                }
            })
            .collect();
        SimulatedFleet {
            rng: fastrand::Rng::with_seed(self.seed),
            start_unix_ns: start,
            interval_ns,
            tick: 0,
            nodes,
            spec: self,
        }
    }
}

struct SimNode {
    name: String,
    encoder: FrameEncoder,
    /// Cumulative counter values by series.
    counters: BTreeMap<Series, u64>,
    port_up: [bool; PORTS],
    /// The agent's sampler, in an adaptive fleet.
    sampler: Option<AdaptiveSampler>,
}

/// The sampler as the agent configures it with adaptive sampling on (monitor-user's
/// `pipeline::sampler_config`, no `--sampling` settings): `interval` as the minimum, IB series
/// read at least every second minimum interval when stable.
fn agent_sampler(interval: Duration) -> AdaptiveSampler {
    let config = SamplerConfig {
        min_interval: interval,
        ..SamplerConfig::default()
    };
    let ib = SamplerConfig {
        ground_truth_every: 2,
        ..config.clone()
    };
    AdaptiveSampler::new(config)
        .with_group(metric::IB_PREFIX, metric::IB_PREFIX, ib.clone())
        .with_group(metric::ETHTOOL_PREFIX, metric::ETHTOOL_PREFIX, ib)
}

/// FNV-1a of a node, a series and a seed: where in its phase a series of an adaptive fleet
/// starts.
fn series_phase(seed: u64, node: usize, series: &Series) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    };
    eat(&(node as u64).to_le_bytes());
    eat(series.name.as_bytes());
    for (k, v) in series.labels.iter() {
        eat(k.as_bytes());
        eat(v.as_bytes());
    }
    // The low bits of a multiplicative hash are poorly mixed.
    h ^ (h >> 29)
}

/// A fleet of simulated nodes; see the crate's documentation.
pub struct SimulatedFleet {
    spec: FleetBuilder,
    rng: fastrand::Rng,
    start_unix_ns: u64,
    interval_ns: u64,
    tick: u64,
    nodes: Vec<SimNode>,
}

impl SimulatedFleet {
    /// A fleet of `nodes` nodes, each 8 GPUs and 8 ports, no job and no fault yet.
    pub fn builder(nodes: usize) -> FleetBuilder {
        FleetBuilder {
            nodes,
            node_prefix: "node-".into(),
            node_names: Vec::new(),
            jobs: Vec::new(),
            slow_gpus: Vec::new(),
            throttled: false,
            degraded_ports: Vec::new(),
            storage_ports: 0,
            down_ports: Vec::new(),
            flapping_ports: Vec::new(),
            flap_every_ticks: 20,
            flap_down_ticks: 2,
            port_event_skew_ns: 0,
            congested_ports: Vec::new(),
            pfc: false,
            pfc_storms: Vec::new(),
            pfc_paused: Vec::new(),
            xids: Vec::new(),
            lost: Vec::new(),
            ecc_dbe: Vec::new(),
            remap_pending: Vec::new(),
            pcie_degraded: Vec::new(),
            pcie_gen_dropped: Vec::new(),
            hardware: None,
            qp_errors: Vec::new(),
            cm_disconnects: Vec::new(),
            cm_rejects: Vec::new(),
            roce: false,
            neighbours: Vec::new(),
            adaptive: false,
            interval: Duration::from_secs(1),
            flush_every: 10,
            staggered_flush: false,
            schema_refresh: Duration::from_secs(60),
            start_unix_ns: None,
            ticks_before_now: 300,
            seed: 0x5eed,
        }
    }

    /// The name of node `index`.
    pub fn node_name(&self, index: usize) -> &str {
        &self.nodes[index].name
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Ticks done so far.
    pub fn ticks(&self) -> u64 {
        self.tick
    }

    /// Time of tick `tick`.
    pub fn tick_unix_ns(&self, tick: u64) -> u64 {
        self.start_unix_ns + tick * self.interval_ns
    }

    pub fn jobs(&self) -> &[SimJob] {
        &self.spec.jobs
    }

    /// The job a node runs, if any.
    pub fn job_of(&self, node: usize) -> Option<&str> {
        self.spec
            .jobs
            .iter()
            .find(|j| j.nodes.contains(&node))
            .map(|j| j.job_id.as_str())
    }

    /// One sweep of every node; returns the frames due (every `flush_every` ticks, and the
    /// events of this tick at once, as the agent sends them).
    pub fn tick(&mut self) -> Vec<Vec<u8>> {
        self.tick_by_node().into_iter().map(|(_, f)| f).collect()
    }

    /// [`tick`](Self::tick), each frame with the index of the node that sends it.
    pub fn tick_by_node(&mut self) -> Vec<(usize, Vec<u8>)> {
        let tick = self.tick;
        let t = self.tick_unix_ns(tick);
        let mut frames = Vec::new();
        for n in 0..self.nodes.len() {
            let readings = self.node_readings(n, tick, t);
            let events = self.node_events(n, tick, t);
            let phase_ticks = self.phase_ticks();
            let seed = self.spec.seed;
            let node = &mut self.nodes[n];
            match &mut node.sampler {
                None => {
                    for r in &readings {
                        node.encoder
                            .push_reading(r)
                            .expect("simulated readings are valid");
                    }
                }
                Some(sampler) => {
                    // Read when due, as the agent reads, and send what the sampler says.
                    for r in &readings {
                        if tick < series_phase(seed, n, &r.series) % phase_ticks
                            || !sampler.due(&r.series, t)
                        {
                            continue;
                        }
                        for emit in sampler.observe(&r.series, r.value, t) {
                            node.encoder
                                .push_sample(&r.series, wire_sample(&emit))
                                .expect("the sampler's samples are valid");
                        }
                    }
                }
            }
            let has_events = !events.is_empty();
            for e in events {
                node.encoder.push_event(e);
            }
            let stagger = if self.spec.staggered_flush {
                n as u64
            } else {
                0
            };
            if (tick + 1 + stagger).is_multiple_of(self.spec.flush_every) {
                frames.extend(node.encoder.flush(t).into_iter().map(|f| (n, f)));
            } else if has_events {
                frames.extend(node.encoder.flush_events(t).into_iter().map(|f| (n, f)));
            }
        }
        self.tick += 1;
        frames
    }

    /// The frames of every node's pending samples, sent at the last tick's time.
    pub fn flush(&mut self) -> Vec<Vec<u8>> {
        let t = self.tick_unix_ns(self.tick.saturating_sub(1));
        self.nodes
            .iter_mut()
            .flat_map(|n| n.encoder.flush(t))
            .collect()
    }

    /// Node `node` sends `event` at once, as the agent sends events: its frame, sent at
    /// `send_unix_ns`.
    pub fn event(&mut self, node: usize, event: WireEvent, send_unix_ns: u64) -> Vec<Vec<u8>> {
        let encoder = &mut self.nodes[node].encoder;
        encoder.push_event(event);
        encoder.flush_events(send_unix_ns)
    }

    /// Runs `ticks` ticks and sends their frames (and a last flush) to a collector's UDP
    /// address, pausing briefly every few frames so a local receive buffer keeps up.
    pub fn send_ticks(&mut self, collector: SocketAddr, ticks: u64) -> io::Result<usize> {
        let socket = UdpSocket::bind("127.0.0.1:0")?;
        let mut sent = 0;
        for _ in 0..ticks {
            let frames = self.tick();
            sent += send_paced(&socket, collector, &frames)?;
        }
        let frames = self.flush();
        sent += send_paced(&socket, collector, &frames)?;
        Ok(sent)
    }

    /// Ticks over which the series of an adaptive fleet start: the agent's longest interval.
    fn phase_ticks(&self) -> u64 {
        (SamplerConfig::default().max_interval.as_nanos() as u64)
            .div_ceil(self.interval_ns.max(1))
            .max(1)
    }

    fn gpu_fault(&self, list: &[(usize, usize)], node: usize, gpu: usize) -> bool {
        list.contains(&(node, gpu))
    }

    fn lost_at(&self, node: usize, gpu: usize) -> Option<u64> {
        self.spec
            .lost
            .iter()
            .find(|l| l.node == node && l.gpu == gpu)
            .map(|l| l.tick)
    }

    /// Multiplicative noise within ±`pct` percent.
    fn noisy(&mut self, value: f64, pct: f64) -> f64 {
        value * (1.0 + pct / 100.0 * (2.0 * self.rng.f64() - 1.0))
    }

    /// Whether a port is down at `tick`: flapping, or gone down for good.
    fn port_down_at(&self, node: usize, port: usize, tick: u64) -> bool {
        let flapping = self.spec.flapping_ports.contains(&(node, port)) && {
            let phase = tick % self.spec.flap_every_ticks;
            phase >= self.spec.flap_every_ticks - self.spec.flap_down_ticks
        };
        flapping || from_tick(&self.spec.down_ports, node, port, tick)
    }

    fn node_readings(&mut self, n: usize, tick: u64, t: u64) -> Vec<Reading> {
        let job = self.job_of(n).map(str::to_owned);
        let busy = job.is_some();
        let dt = self.interval_ns as f64 / 1e9;
        let mut out = Vec::new();
        let mut counters: Vec<(Series, u64)> = Vec::new();
        for g in 0..GPUS {
            if self.lost_at(n, g).is_some_and(|lost| tick >= lost) {
                continue;
            }
            let gpu = g.to_string();
            let uuid = format!("GPU-{n:04x}{g:04x}-sim");
            let mut base: Vec<(&str, String)> = vec![("gpu", gpu), ("uuid", uuid)];
            if let Some(job) = &job {
                base.push(("job_id", job.clone()));
            }
            let labels = |extra: &[(&str, &str)]| {
                Labels::new(
                    base.iter()
                        .map(|(k, v)| (*k, v.as_str()))
                        .chain(extra.iter().copied()),
                )
            };
            let slow = from_tick(&self.spec.slow_gpus, n, g, tick);
            let (sm, tensor, dram) = match (busy, slow) {
                (false, _) => (0.02, 0.0, 0.01),
                (true, false) => (values::SM_UTIL, values::TENSOR_UTIL, values::DRAM_BW_UTIL),
                (true, true) => (
                    values::SLOW_SM_UTIL,
                    values::SLOW_TENSOR_UTIL,
                    values::SLOW_DRAM_BW_UTIL,
                ),
            };
            let gauges = [
                (metric::GPU_SM_UTIL_RATIO, self.noisy(sm, 3.0)),
                (metric::GPU_TENSOR_UTIL_RATIO, self.noisy(tensor, 3.0)),
                (metric::GPU_DRAM_BW_UTIL_RATIO, self.noisy(dram, 3.0)),
                (metric::GPU_UTILIZATION_RATIO, if busy { 1.0 } else { 0.0 }),
                (
                    metric::GPU_TEMPERATURE_CELSIUS,
                    self.noisy(if slow { 88.0 } else { 62.0 }, 2.0).round(),
                ),
                (
                    metric::GPU_POWER_WATTS,
                    self.noisy(if busy { 640.0 } else { 90.0 }, 3.0),
                ),
            ];
            for (name, v) in gauges {
                out.push(gauge(name, labels(&[]), v, t));
            }
            for reason in [
                "hw_thermal_slowdown",
                "sw_thermal_slowdown",
                "sw_power_cap",
                "hw_power_brake_slowdown",
                "hw_slowdown",
            ] {
                let on = slow && self.spec.throttled && reason == "hw_thermal_slowdown";
                out.push(gauge(
                    metric::GPU_THROTTLE_ACTIVE,
                    labels(&[("reason", reason)]),
                    f64::from(u8::from(on)),
                    t,
                ));
            }
            let pending = self.gpu_fault(&self.spec.remap_pending, n, g);
            out.push(gauge(
                metric::GPU_ROW_REMAP_PENDING,
                labels(&[]),
                f64::from(u8::from(pending)),
                t,
            ));
            out.push(gauge(metric::GPU_ROW_REMAP_FAILED, labels(&[]), 0.0, t));
            let pcie_bad = self.gpu_fault(&self.spec.pcie_degraded, n, g);
            let gen_dropped = self.gpu_fault(&self.spec.pcie_gen_dropped, n, g);
            for (name, v) in [
                (
                    metric::GPU_PCIE_LINK_GENERATION,
                    if pcie_bad || gen_dropped {
                        4.0
                    } else {
                        values::PCIE_GEN
                    },
                ),
                (metric::GPU_PCIE_LINK_MAX_GENERATION, values::PCIE_GEN),
                (
                    metric::GPU_PCIE_LINK_WIDTH_LANES,
                    if pcie_bad { 8.0 } else { values::PCIE_WIDTH },
                ),
                (metric::GPU_PCIE_LINK_MAX_WIDTH_LANES, values::PCIE_WIDTH),
            ] {
                out.push(gauge(name, labels(&[]), v, t));
            }
            let dbe = u64::from(self.gpu_fault(&self.spec.ecc_dbe, n, g) && tick > 0);
            counters.push((
                counter(
                    metric::GPU_ECC_ERRORS_TOTAL,
                    labels(&[("type", "uncorrected"), ("scope", "volatile")]),
                ),
                dbe,
            ));
            counters.push((
                counter(
                    metric::GPU_ECC_ERRORS_TOTAL,
                    labels(&[("type", "corrected"), ("scope", "volatile")]),
                ),
                0,
            ));
        }
        if let Some(variants) = &self.spec.hardware {
            let node = variants
                .get(&n)
                .cloned()
                .unwrap_or_else(|| HgxNode::new(n as u32));
            for (name, labels, v) in sim_hardware::series(n, &node) {
                out.push(gauge(name, labels, v, t));
            }
        }
        for (_, p, switch, switch_port) in self.spec.neighbours.iter().filter(|x| x.0 == n) {
            out.push(gauge(
                metric::IB_PORT_NEIGHBOR_INFO,
                Labels::new([
                    ("device", format!("mlx5_{p}")),
                    ("port", "1".into()),
                    ("netdev", format!("enp{p}s0np0")),
                    ("switch", switch.clone()),
                    ("switch_port", switch_port.clone()),
                ]),
                1.0,
                t,
            ));
        }
        for p in 0..PORTS {
            let labels = Labels::new([("device", format!("mlx5_{p}")), ("port", "1".into())]);
            let degraded = from_tick(&self.spec.degraded_ports, n, p, tick);
            let down = self.port_down_at(n, p, tick);
            let storage = p >= PORTS - self.spec.storage_ports.min(PORTS);
            let (rate, width) = if degraded {
                (values::DEGRADED_RATE_GBPS, values::DEGRADED_WIDTH_LANES)
            } else if storage {
                (values::STORAGE_RATE_GBPS, values::WIDTH_LANES)
            } else {
                (values::RATE_GBPS, values::WIDTH_LANES)
            };
            if self.spec.storage_ports > 0 {
                let layer = if storage { "Ethernet" } else { "InfiniBand" };
                let mut info = vec![("device", format!("mlx5_{p}")), ("port", "1".into())];
                info.push(("link_layer", layer.into()));
                out.push(gauge(
                    metric::IB_PORT_LINK_LAYER_INFO,
                    Labels::new(info),
                    1.0,
                    t,
                ));
            }
            out.push(gauge(
                metric::IB_PORT_STATE,
                labels.clone(),
                if down { 1.0 } else { 4.0 },
                t,
            ));
            out.push(gauge(
                metric::IB_PORT_PHYS_STATE,
                labels.clone(),
                if down { 2.0 } else { 5.0 },
                t,
            ));
            out.push(gauge(metric::IB_PORT_RATE_GBPS, labels.clone(), rate, t));
            out.push(gauge(metric::IB_PORT_WIDTH_LANES, labels.clone(), width, t));
            let bytes = match (busy, degraded, down) {
                (_, _, true) | (false, _, _) => 1.0e3,
                (true, false, false) => values::PORT_BYTES_PER_S,
                (true, true, false) => values::DEGRADED_PORT_BYTES_PER_S,
            };
            let xmit = (self.noisy(bytes, 3.0) * dt) as u64;
            let rcv = (self.noisy(bytes, 3.0) * dt) as u64;
            let symbol = if degraded {
                values::DEGRADED_SYMBOL_ERRORS_PER_S * (dt as u64).max(1)
            } else {
                0
            };
            let was_up = self.nodes[n].port_up[p];
            let downed = u64::from(was_up && down);
            self.nodes[n].port_up[p] = !down;
            for (name, inc) in [
                (metric::IB_PORT_XMIT_BYTES_TOTAL, xmit),
                (metric::IB_PORT_RCV_BYTES_TOTAL, rcv),
                (metric::IB_SYMBOL_ERROR_TOTAL, symbol),
                (metric::IB_LINK_ERROR_RECOVERY_TOTAL, 0),
                (metric::IB_LINK_DOWNED_TOTAL, downed),
                (metric::IB_PORT_RCV_ERRORS_TOTAL, 0),
            ] {
                counters.push((counter(name, labels.clone()), inc));
            }
            if self.spec.roce {
                let cnp = if self.spec.congested_ports.contains(&(n, p)) {
                    values::CONGESTED_CNP_PER_S
                } else {
                    self.noisy(values::CNP_PER_S as f64, 20.0) as u64
                } * (dt as u64).max(1);
                for name in [
                    metric::IB_NP_CNP_SENT_TOTAL,
                    metric::IB_RP_CNP_HANDLED_TOTAL,
                    metric::IB_NP_ECN_MARKED_ROCE_PACKETS_TOTAL,
                ] {
                    counters.push((counter(name, labels.clone()), cnp));
                }
            }
            if self.spec.pfc {
                let secs = (dt as u64).max(1);
                let netdev = Labels::new([
                    ("device", format!("mlx5_{p}")),
                    ("port", "1".into()),
                    ("netdev", format!("enp{p}s0np0")),
                ]);
                let mut frames = || self.noisy(values::PAUSE_PER_S as f64, 20.0) as u64 * secs;
                let (rx, tx) = (frames(), frames());
                let tx = if self.spec.pfc_storms.contains(&(n, p)) {
                    values::STORM_PAUSE_PER_S * secs
                } else {
                    tx
                };
                let rx_us = match self.spec.pfc_paused.iter().find(|x| (x.0, x.1) == (n, p)) {
                    Some(&(_, _, fraction)) => (fraction * 1e6) as u64 * secs,
                    None => rx * values::PAUSE_US,
                };
                for (name, inc) in [
                    (metric::ETHTOOL_RX_PRIO3_PAUSE_TOTAL, rx),
                    (metric::ETHTOOL_TX_PRIO3_PAUSE_TOTAL, tx),
                    (metric::ETHTOOL_RX_PRIO3_PAUSE_DURATION_TOTAL, rx_us),
                    (
                        metric::ETHTOOL_TX_PRIO3_PAUSE_DURATION_TOTAL,
                        tx * values::PAUSE_US,
                    ),
                    (metric::ETHTOOL_RX_PRIO0_PAUSE_TOTAL, 0),
                    (metric::ETHTOOL_TX_PRIO0_PAUSE_TOTAL, 0),
                    (metric::ETHTOOL_RX_PRIO0_PAUSE_DURATION_TOTAL, 0),
                    (metric::ETHTOOL_TX_PRIO0_PAUSE_DURATION_TOTAL, 0),
                ] {
                    counters.push((counter(name, netdev.clone()), inc));
                }
            }
        }
        if let Some(job) = &job {
            let qp_err = self.spec.qp_errors.iter().any(|(m, j)| *m == n && j == job);
            let disconnects = self
                .spec
                .cm_disconnects
                .iter()
                .any(|(m, j)| *m == n && j == job);
            let rejects = self
                .spec
                .cm_rejects
                .iter()
                .any(|(m, j)| *m == n && j == job);
            let cgroup = format!("/system.slice/slurmstepd.scope/job_{}", job_number(job));
            for (verb, detail, inc) in [
                ("modify_qp", "ERR", u64::from(qp_err)),
                ("modify_qp", "RTS", 1),
                ("cm_reject", "REJ_CONSUMER_DEFINED", u64::from(rejects)),
                ("cm_event", "DISCONNECTED", u64::from(disconnects)),
            ] {
                let device = if verb.starts_with("cm_") {
                    ""
                } else {
                    "mlx5_0"
                };
                counters.push((
                    counter(
                        metric::RDMA_VERBS_TOTAL,
                        Labels::new([
                            ("device", device),
                            ("verb", verb),
                            ("detail", detail),
                            ("cgroup", cgroup.as_str()),
                            ("job_id", job.as_str()),
                        ]),
                    ),
                    inc,
                ));
            }
        }
        let node = &mut self.nodes[n];
        for (series, inc) in counters {
            let value = node.counters.entry(series.clone()).or_insert(0);
            *value += inc;
            out.push(Reading {
                series,
                value: Value::U64(*value),
                unix_ns: t,
            });
        }
        out
    }

    fn node_events(&self, n: usize, tick: u64, t: u64) -> Vec<WireEvent> {
        let mut out = Vec::new();
        for x in self
            .spec
            .xids
            .iter()
            .filter(|x| x.node == n && x.tick == tick)
        {
            out.push(WireEvent {
                unix_ns: t,
                kind: event_kind::XID.into(),
                labels: gpu_labels(n, x.gpu),
                code: x.code as i64,
                text: format!("XID {}", x.code),
            });
        }
        for l in self
            .spec
            .lost
            .iter()
            .filter(|l| l.node == n && l.tick == tick)
        {
            out.push(WireEvent {
                unix_ns: t,
                kind: event_kind::GPU_LOST.into(),
                labels: gpu_labels(n, l.gpu),
                code: 0,
                text: "GPU is lost".into(),
            });
        }
        for p in 0..PORTS {
            let down = self.port_down_at(n, p, tick);
            let was_down = tick > 0 && self.port_down_at(n, p, tick - 1);
            if down == was_down {
                continue;
            }
            let device = format!("mlx5_{p}");
            let t = t + n as u64 * self.spec.port_event_skew_ns;
            let (code, text, from, to_up) = if down {
                (10, "PORT_ERR", "UP", false)
            } else {
                (9, "PORT_ACTIVE", "DOWN", true)
            };
            out.push(WireEvent {
                unix_ns: t,
                kind: event_kind::IB_PORT.into(),
                labels: Labels::new([("device", device.as_str()), ("cgroup", ""), ("port", "1")]),
                code,
                text: text.into(),
            });
            out.push(WireEvent {
                unix_ns: t + 1_000_000,
                kind: event_kind::PORT_TRANSITION.into(),
                labels: Labels::new([("device", device.as_str()), ("port", "1"), ("from", from)]),
                code: i64::from(to_up),
                text: if to_up { "UP" } else { "DOWN" }.into(),
            });
        }
        out
    }
}

/// Whether `(node, index)` has a fault of `list` (node, index, onset tick) at `tick`.
fn from_tick(list: &[(usize, usize, u64)], node: usize, index: usize, tick: u64) -> bool {
    list.iter()
        .any(|&(n, i, from)| n == node && i == index && tick >= from)
}

fn send_paced(socket: &UdpSocket, to: SocketAddr, frames: &[Vec<u8>]) -> io::Result<usize> {
    for (i, f) in frames.iter().enumerate() {
        socket.send_to(f, to)?;
        if i % 64 == 63 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    Ok(frames.len())
}

fn gpu_labels(node: usize, gpu: usize) -> Labels {
    Labels::new([
        ("gpu", gpu.to_string()),
        ("uuid", format!("GPU-{node:04x}{gpu:04x}-sim")),
    ])
}

fn job_number(job_id: &str) -> &str {
    job_id.rsplit(':').next().unwrap_or(job_id)
}

fn gauge(name: &str, labels: Labels, value: f64, t: u64) -> Reading {
    Reading {
        series: Series {
            name: name.into(),
            labels,
            kind: Kind::Gauge,
        },
        value: Value::F64(value),
        unix_ns: t,
    }
}

fn counter(name: &str, labels: Labels) -> Series {
    Series {
        name: name.into(),
        labels,
        kind: Kind::Counter,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use monitor_wire::{Frame, ReceiverState, SeriesData, decode};

    fn decode_all(frames: &[Vec<u8>], key: &Key) -> Vec<Frame> {
        let mut state = ReceiverState::default();
        frames
            .iter()
            .map(|f| decode(f, key, &mut state).expect("a simulated frame decodes"))
            .collect()
    }

    #[test]
    fn frames_decode_with_the_faults_in_them() {
        let key = Key::from_bytes([3; 32]);
        let mut fleet = SimulatedFleet::builder(4)
            .job("slurm:42", 0..4)
            .slow_gpu(1, 3)
            .degraded_port(2, 5)
            .flapping_port(3, 0)
            .xid(0, 2, 79, 4)
            .start_unix_ns(1_790_000_000_000_000_000)
            .build(key.clone());
        let mut frames = Vec::new();
        for _ in 0..20 {
            frames.extend(fleet.tick());
        }
        let frames = decode_all(&frames, &key);
        let mut names = BTreeMap::new();
        for f in &frames {
            for e in &f.schema {
                names.insert((f.node.clone(), e.id), e.series.clone());
            }
        }
        let mut sm_of_slow = Vec::new();
        let mut width_of_degraded = Vec::new();
        for f in &frames {
            for s in &f.samples {
                let series = &names[&(f.node.clone(), s.id)];
                assert_eq!(
                    !series.name.starts_with("railscope_ib_"),
                    series.labels.get("job_id") == Some("slurm:42"),
                    "{series}"
                );
                if let SeriesData::Gauge(v) = &s.data {
                    if f.node == "node-001"
                        && &*series.name == "railscope_gpu_sm_util_ratio"
                        && series.labels.get("gpu") == Some("3")
                    {
                        sm_of_slow.extend(v.iter().map(|g| g.mean));
                    }
                    if f.node == "node-002"
                        && &*series.name == "railscope_ib_port_width_lanes"
                        && series.labels.get("device") == Some("mlx5_5")
                    {
                        width_of_degraded.extend(v.iter().map(|g| g.mean));
                    }
                }
            }
        }
        assert_eq!(sm_of_slow.len(), 20);
        assert!(sm_of_slow.iter().all(|&v| v < 0.6), "{sm_of_slow:?}");
        assert!(width_of_degraded.iter().all(|&v| v == 2.0));
        let events: Vec<_> = frames.iter().flat_map(|f| &f.events).collect();
        assert!(
            events
                .iter()
                .any(|e| e.kind == "xid" && e.code == 79 && e.labels.get("gpu") == Some("2"))
        );
        // Down at ticks 18 and 19 of a 20-tick period: one PORT_ERR and one DOWN transition.
        let downs = events
            .iter()
            .filter(|e| e.kind == "port_transition" && e.text == "DOWN")
            .count();
        assert_eq!(downs, 1);
    }

    /// Samples of each series of an adaptive fleet: (node, series) -> [(start, end)] (a
    /// counter's start is its end).
    fn spans(frames: &[Frame]) -> BTreeMap<(String, Series), Vec<(u64, u64)>> {
        let mut names = BTreeMap::new();
        let mut out: BTreeMap<(String, Series), Vec<(u64, u64)>> = BTreeMap::new();
        for f in frames {
            for e in &f.schema {
                names.insert((f.node.clone(), e.id), e.series.clone());
            }
            for s in &f.samples {
                let series = names[&(f.node.clone(), s.id)].clone();
                let times: Vec<(u64, u64)> = match &s.data {
                    SeriesData::Gauge(v) => {
                        v.iter().map(|g| (g.start_unix_ns, g.end_unix_ns)).collect()
                    }
                    SeriesData::Counter(v) => v.iter().map(|c| (c.unix_ns, c.unix_ns)).collect(),
                };
                out.entry((f.node.clone(), series))
                    .or_default()
                    .extend(times);
            }
        }
        out
    }

    #[test]
    fn an_adaptive_fleet_sends_stable_series_every_32_s_out_of_phase() {
        let key = Key::from_bytes([3; 32]);
        let t0 = 1_790_000_000_000_000_000;
        let s = 1_000_000_000;
        let mut fleet = SimulatedFleet::builder(2)
            .job("slurm:42", 0..2)
            .slow_gpu(1, 3)
            .adaptive(true)
            .start_unix_ns(t0)
            .build(key.clone());
        let mut frames = Vec::new();
        for _ in 0..400 {
            frames.extend(fleet.tick());
        }
        frames.extend(fleet.flush());
        let spans = spans(&decode_all(&frames, &key));
        let of = |node: &str, name: &str, label: (&str, &str)| {
            spans
                .iter()
                .find(|((n, s), _)| {
                    n == node && &*s.name == name && s.labels.get(label.0) == Some(label.1)
                })
                .map(|(_, v)| v.clone())
                .unwrap()
        };
        // After the first 200 s every series is stable: sent every 32 s ± 10%, each gauge
        // sample the envelope of the reads since the previous one (read every second).
        let mut last_sm = Vec::new();
        for node in ["node-000", "node-001"] {
            for g in 0..GPUS {
                let sm = of(node, "railscope_gpu_sm_util_ratio", ("gpu", &g.to_string()));
                for w in sm.windows(2).filter(|w| w[0].1 >= t0 + 200 * s) {
                    let gap = w[1].1 - w[0].1;
                    assert!((28 * s..=36 * s).contains(&gap), "{node} gpu {g}: {w:?}");
                    assert_eq!(w[1].0, w[0].1 + s, "{node} gpu {g}: {w:?}");
                }
                last_sm.push(sm.last().unwrap().1);
            }
        }
        // Out of phase: the GPUs' last samples are spread over the 32 s.
        last_sm.sort_unstable();
        last_sm.dedup();
        assert!(last_sm.len() >= 8, "{last_sm:?}");
        assert!(
            last_sm.last().unwrap() - last_sm[0] >= 16 * s,
            "{last_sm:?}"
        );
        // The two directions of a port are sent at different times, each every ~32 s.
        let device = ("device", "mlx5_5");
        let tx = of("node-000", "railscope_ib_port_xmit_bytes_total", device);
        let rx = of("node-000", "railscope_ib_port_rcv_bytes_total", device);
        let late = |v: &[(u64, u64)]| -> Vec<u64> {
            v.iter()
                .map(|p| p.1)
                .filter(|&t| t >= t0 + 200 * s)
                .collect()
        };
        let (tx, rx) = (late(&tx), late(&rx));
        assert!((5..=8).contains(&tx.len()), "{tx:?}");
        assert!((5..=8).contains(&rx.len()), "{rx:?}");
        assert!(tx.iter().all(|t| !rx.contains(t)), "{tx:?} {rx:?}");
    }

    #[test]
    fn same_settings_same_frames_content() {
        let key = Key::from_bytes([3; 32]);
        let make = || {
            let mut f = SimulatedFleet::builder(2)
                .job("k8s:abc", 0..2)
                .start_unix_ns(1_790_000_000_000_000_000)
                .build(key.clone());
            let mut frames = Vec::new();
            for _ in 0..10 {
                frames.extend(f.tick());
            }
            decode_all(&frames, &key)
                .into_iter()
                .map(|f| f.samples)
                .collect::<Vec<_>>()
        };
        assert_eq!(make(), make());
    }
}
