//! The node's metric pipeline, from sources to the collector:
//!
//! - a poller thread reads the polled sources (IB sysfs counters, NVML GPU metrics) every
//!   minimum interval — off the async runtime, because sysfs reads and NVML calls block — and
//!   a bridge thread forwards GPU events (XID, GPU lost) the moment NVML reports them;
//! - the adaptive sampler decides, per series, when to read it (the poller asks it before
//!   reading each IB file) and what each reading adds to the next send. The poller owns the
//!   sampler of what it reads; the agent's loop has one for the probes' verb counters;
//! - the frame encoder batches samples until the flush interval and sends events at once;
//! - the sender ships frames over UDP without ever blocking this loop, to each collector
//!   (a pair); the spool keeps every frame until the collectors acknowledge it and sends
//!   again what they lack;
//! - each acknowledgement's timing is a round trip from which the node's clock offset from
//!   its collector's is estimated (`crate::clock_exchange`), sent with every flush.
//!
//! A source that cannot start (no RDMA devices, no NVML) says so in one line and the rest go on.

use std::{
    path::PathBuf,
    sync::mpsc as std_mpsc,
    thread,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use monitor_sampler::{AdaptiveSampler, Emit, SamplerConfig, SamplingSpecError, Slot};
use monitor_wire::{
    self as wire, EncoderConfig, FrameEncoder, GaugeSample, Key, Kind, Labels, Reading, Sample,
    Series, Value, WireEvent, names::metric,
};
use tokio::sync::mpsc;

use crate::{
    clock_exchange::ClockExchanges,
    jobs::{Job, JobRules},
    sender::{Reply, Sender, SenderHandle, SenderStats, Target},
    sources::{
        ReadingSink,
        ethtool::EthtoolStats,
        gpu::{GpuEvent, GpuSource, ProcessJobs},
        hwpath::{HardwarePoll, HardwareSeries},
        ib_sysfs::IbSysfs,
        lldp::NeighbourSeries,
    },
    spool::{Spool, SpoolConfig, SpoolStats},
    spool_file::{Loaded, SessionState, SpoolFile},
    time_base::{MonoNs, TimeBase},
};

/// Where and how the agent sends its metrics.
#[derive(Clone, Debug)]
pub struct PipelineOptions {
    /// One collector, or a pair: each gets every frame and acknowledges on its own.
    pub collectors: Vec<Target>,
    /// What is kept until acknowledged, and how it is sent again.
    pub spool: SpoolConfig,
    /// Where the spool is also kept on disk, so an agent restart loses nothing (None, or a
    /// directory that cannot be used: in memory only).
    pub spool_dir: Option<PathBuf>,
    pub key: PathBuf,
    /// This node's name in every frame.
    pub node: String,
    /// The directory holding `class/infiniband` (`/sys`; a fixture tree in tests).
    pub sysfs_root: PathBuf,
    /// Read GPUs through NVML.
    pub gpu: bool,
    /// The NVML library to load (None: the system's `libnvidia-ml.so.1`).
    pub nvml_lib: Option<PathBuf>,
    /// lldpd's control socket, asked for the RoCE ports' switch neighbours where it exists.
    pub lldp_socket: PathBuf,
    /// How often the sources are read: the sampler's minimum interval.
    pub interval: Duration,
    /// How often batched samples are sent (events are sent at once).
    pub flush_every: Duration,
    /// Adaptive sampling; off = every reading is sent (a fixed interval, for comparison).
    pub adaptive: bool,
    /// Per metric group settings, `PREFIX:SETTING,...` ([`AdaptiveSampler::configure`]),
    /// applied in order after the defaults.
    pub sampling: Vec<String>,
    /// What names a cgroup's job: a GPU's series carry the job of the processes using it.
    pub jobs: JobRules,
}

/// What the poller threads hand to the agent's loop.
pub enum Polled {
    /// What the poller's sampler decided to send after one sweep of the sources.
    Samples(Vec<(Series, Emit)>),
    Gpu(GpuEvent),
    /// Series that ended (a GPU's job changed), after the samples that carry their last
    /// values: the encoder retires them.
    Ended(Vec<Series>),
}

/// A series not read for this long is forgotten by its sampler (a device removed, a GPU
/// lost, a probe family detached), what it still held being sent. Longer than any read
/// interval the sampling settings allow in practice, so a live series is never dropped.
pub const STALE_AFTER: Duration = Duration::from_secs(3600);

/// Asks the poller for what its sampler read but has not sent yet (at shutdown).
type FlushRequest = std_mpsc::SyncSender<Vec<(Series, Emit)>>;

/// The running pipeline, driven by the agent's loop.
pub struct Pipeline {
    /// Samples the readings handed to [`Pipeline::on_readings`] (the verb counters).
    sampler: AdaptiveSampler,
    encoder: FrameEncoder,
    /// One per collector, with what that collector sent back (acknowledgements and their
    /// timings, schema requests).
    senders: Vec<(SenderHandle, mpsc::Receiver<Reply>)>,
    spool: Spool,
    /// When each frame was sent, the acknowledgements' timings: the node's clock offset.
    clock: ClockExchanges,
    polled: mpsc::Receiver<Polled>,
    poller: std_mpsc::Sender<FlushRequest>,
    key: Key,
    /// `railscope_agent_info{version}`: how a collector knows which agent version a node runs.
    info: Series,
    /// `railscope_ib_port_neighbor_info`: the RoCE ports' switch neighbours (lldpd).
    neighbours: NeighbourSeries,
    /// The neighbour series sent at the last flush (one gone is retired).
    neighbours_sent: std::sync::Arc<Vec<Series>>,
    /// The hardware path's series (PCIe places, firmware, counts), read by the poller every
    /// minute and sent with every flush.
    hardware: HardwareSeries,
    /// The hardware series sent at the last flush (one gone is retired).
    hardware_sent: crate::sources::hwpath::Values,
    pub flush_every: Duration,
    pub interval: Duration,
}

/// The series an agent reports its version in, a Prometheus-style `_info` gauge of 1 sent
/// with every flush (a constant: about a byte per flush).
pub fn agent_info_series() -> Series {
    Series {
        name: metric::AGENT_INFO.into(),
        labels: Labels::new([("version", env!("CARGO_PKG_VERSION"))]),
        kind: Kind::Gauge,
    }
}

/// The agent's sampling configuration: `interval` as the minimum, and IB sysfs series read
/// at least every second minimum interval when stable (a changed counter or port attribute is
/// then seen at most two intervals late, and counters lose nothing: their cumulative values
/// are sent). GPU series are read every minimum interval. Then the operator's `--sampling`
/// settings, in order.
pub fn sampler_config(
    interval: Duration,
    adaptive: bool,
    sampling: &[String],
) -> Result<AdaptiveSampler, SamplingSpecError> {
    let config = SamplerConfig {
        min_interval: interval,
        ..SamplerConfig::default()
    };
    let mut sampler = if adaptive {
        let ib = SamplerConfig {
            ground_truth_every: 2,
            ..config.clone()
        };
        // A RoCE port's ethtool statistics are sampled as its IB counters are.
        AdaptiveSampler::new(config)
            .with_group(metric::IB_PREFIX, metric::IB_PREFIX, ib.clone())
            .with_group(metric::ETHTOOL_PREFIX, metric::ETHTOOL_PREFIX, ib)
    } else {
        AdaptiveSampler::new(config.fixed())
    };
    for spec in sampling {
        sampler.configure(spec)?;
    }
    Ok(sampler)
}

impl Pipeline {
    /// Starts the sender, the poller and (when NVML answers) the GPU event bridge. Fails only
    /// on what the operator must fix: an unreadable key file.
    pub fn start(options: &PipelineOptions) -> anyhow::Result<Self> {
        let key = Key::from_file(&options.key)?;
        let file = options.spool_dir.as_deref().and_then(|dir| {
            let now = TimeBase::global().now_unix_ns().0;
            SpoolFile::open(dir, &options.node, &key, options.spool.max_age, now)
                .map_err(|e| {
                    tracing::warn!(
                        "{e}: frames kept in memory only (an agent restart loses those not \
                         yet acknowledged)"
                    );
                })
                .ok()
        });
        let config = EncoderConfig::new(options.node.clone());
        let resume = file.as_ref().and_then(|(_, loaded)| loaded.resume);
        let encoder = match resume {
            Some(s) => {
                FrameEncoder::resume(config, key.clone(), s.session, s.next_seq, s.next_series_id)
            }
            None => FrameEncoder::new(config, key.clone()),
        }
        .context("frame encoder")?;
        let senders = options
            .collectors
            .iter()
            .map(|collector| {
                let (replies_tx, replies) = mpsc::channel(64);
                let (sender, _task) =
                    Sender::spawn_with_replies(collector.clone(), 1024, Some(replies_tx));
                (sender, replies)
            })
            .collect();
        let mut spool = Spool::new(
            &options.node,
            options.collectors.len(),
            options.spool,
            Instant::now(),
        );
        if let Some((file, loaded)) = file {
            attach_file(&mut spool, file, loaded, &encoder);
        }
        let clock = ClockExchanges::new(&options.node, encoder.session(), options.collectors.len());
        let sampler = sampler_config(options.interval, options.adaptive, &options.sampling)?;
        let (tx, polled) = mpsc::channel(64);
        let (poller, requests) = std_mpsc::channel();
        let hardware = HardwareSeries::default();
        spawn_poller(options.clone(), tx, requests, hardware.clone())?;
        tracing::info!(
            "sending to {} as node {:?} (read every {:?}, sent every {:?}, adaptive sampling {})",
            options
                .collectors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" and "),
            options.node,
            options.interval,
            options.flush_every,
            if options.adaptive { "on" } else { "off" }
        );
        Ok(Self {
            sampler,
            encoder,
            senders,
            spool,
            clock,
            polled,
            poller,
            key,
            info: agent_info_series(),
            neighbours: NeighbourSeries::spawn(
                options.sysfs_root.clone(),
                options.lldp_socket.clone(),
            ),
            neighbours_sent: Default::default(),
            hardware,
            hardware_sent: Default::default(),
            flush_every: options.flush_every,
            interval: options.interval,
        })
    }

    /// The next batch of readings or GPU event (pending forever once the pollers stopped).
    pub async fn next(&mut self) -> Polled {
        match self.polled.recv().await {
            Some(polled) => polled,
            None => std::future::pending().await,
        }
    }

    /// Hands what the poller's sampler decided to send to the encoder.
    pub fn on_samples(&mut self, samples: &[(Series, Emit)]) {
        for (series, emit) in samples {
            self.push(series, emit);
        }
    }

    /// Feeds readings taken on the agent's loop (the verb counters) through its sampler into
    /// the encoder.
    pub fn on_readings(&mut self, readings: &[Reading]) {
        for reading in readings {
            let emitted = self
                .sampler
                .observe(&reading.series, reading.value, reading.unix_ns);
            for emit in emitted.iter() {
                self.push(&reading.series, emit);
            }
        }
    }

    fn push(&mut self, series: &Series, emit: &Emit) {
        let sample = wire_sample(&on_wall_clock(emit, TimeBase::global()));
        if let Err(e) = self.encoder.push_sample(series, sample) {
            tracing::debug!("sample of {} not encoded: {e}", series.name);
        }
    }

    /// Ends the series for which `ended` holds (the verb counters of a job whose cgroup is
    /// gone): what the sampler read of them but had not sent goes into the next frames, then
    /// the sampler and the encoder forget them. Returns how many series ended.
    pub fn end_series(&mut self, ended: impl Fn(&Series) -> bool) -> usize {
        let before = self.sampler.len();
        let finals = self.sampler.remove_where(|s, _| ended(s));
        for (series, emit) in &finals {
            self.push(series, emit);
        }
        self.encoder.retire_where(&ended);
        before - self.sampler.len()
    }

    /// Retires series the poller ended (a GPU's job changed): the encoder sends what it holds
    /// of them at the next flush and forgets them.
    pub fn retire(&mut self, series: &[Series]) {
        let ended: std::collections::HashSet<&Series> = series.iter().collect();
        self.encoder.retire_where(|s| ended.contains(s));
    }

    /// Forgets series of the loop's sampler not read for [`STALE_AFTER`] (a family detached
    /// with its counters), sending what they still held.
    pub fn forget_stale(&mut self) {
        // The loop's sampler runs on CLOCK_MONOTONIC, like the poller's.
        let stale = self
            .sampler
            .remove_stale(crate::time_base::monotonic_ns().0, STALE_AFTER);
        for (series, emit) in &stale {
            self.push(series, emit);
        }
    }

    /// Series the loop's sampler and the encoder know.
    pub fn series_counts(&self) -> (usize, usize) {
        (self.sampler.len(), self.encoder.known_series())
    }

    /// What the encoder produced and dropped so far.
    pub fn encoder_stats(&self) -> wire::EncoderStats {
        self.encoder.stats()
    }

    /// Sends an event now (events are never batched or sampled).
    pub fn on_event(&mut self, event: WireEvent) {
        self.encoder.push_event(event);
        let frames = self
            .encoder
            .flush_events(TimeBase::global().now_unix_ns().0);
        self.send(frames);
    }

    /// Sends everything batched since the last flush (with every schema entry again if the
    /// collector asked for them).
    pub fn flush(&mut self) {
        self.take_replies();
        let now = TimeBase::global().now_unix_ns().0;
        if let Err(e) = self
            .encoder
            .push_sample(&self.info, Sample::Gauge(GaugeSample::reading(now, 1.0)))
        {
            tracing::debug!("agent info not encoded: {e}");
        }
        let neighbours = self.neighbours.current();
        if !std::sync::Arc::ptr_eq(&neighbours, &self.neighbours_sent) {
            let gone: std::collections::HashSet<&Series> = self
                .neighbours_sent
                .iter()
                .filter(|s| !neighbours.contains(s))
                .collect();
            if !gone.is_empty() {
                self.encoder.retire_where(|s| gone.contains(s));
            }
        }
        for series in neighbours.iter() {
            if let Err(e) = self
                .encoder
                .push_sample(series, Sample::Gauge(GaugeSample::reading(now, 1.0)))
            {
                tracing::debug!("LLDP neighbour not encoded: {e}");
            }
        }
        self.neighbours_sent = neighbours;
        let hardware = self.hardware.current();
        if !std::sync::Arc::ptr_eq(&hardware, &self.hardware_sent) {
            let now_sent: std::collections::HashSet<&Series> =
                hardware.iter().map(|(s, _)| s).collect();
            let gone: std::collections::HashSet<&Series> = self
                .hardware_sent
                .iter()
                .map(|(s, _)| s)
                .filter(|s| !now_sent.contains(s))
                .collect();
            if !gone.is_empty() {
                self.encoder.retire_where(|s| gone.contains(s));
            }
        }
        for (series, value) in hardware.iter() {
            if let Err(e) = self
                .encoder
                .push_sample(series, Sample::Gauge(GaugeSample::reading(now, *value)))
            {
                tracing::debug!("hardware path series not encoded: {e}");
            }
        }
        self.hardware_sent = hardware;
        for (series, value) in self.clock.gauges() {
            if let Err(e) = self
                .encoder
                .push_sample(series, Sample::Gauge(GaugeSample::reading(now, value)))
            {
                tracing::debug!("clock offset not encoded: {e}");
            }
        }
        let frames = self.encoder.flush(now);
        self.send(frames);
    }

    /// Takes what the collectors sent back: acknowledgements (frames leave the spool, gaps
    /// are sent again), their timings (the node's clock offset) and schema requests (a
    /// collector that restarted asks for the schema of this session); anything else
    /// (another node's, a forged or garbled datagram) is counted or ignored.
    fn take_replies(&mut self) {
        let mut asked = None;
        let now = Instant::now();
        for (i, (sender, replies)) in self.senders.iter_mut().enumerate() {
            while let Ok(Reply { datagram, received }) = replies.try_recv() {
                if datagram.starts_with(&wire::TIMING_MAGIC) {
                    // Counted like an acknowledgement when it is not the collector's (a
                    // wrong MAC); one the agent cannot time is only logged.
                    match wire::decode_timing(&datagram, &self.key) {
                        Ok(timing) => {
                            let back = TimeBase::global().unix_ns(received);
                            let first = self.clock.estimate().is_none();
                            match self.clock.take(i, &timing, back) {
                                Ok(e) if first => tracing::info!(
                                    "clock offset from {}: {:+.6} s within {:.6} s (the node's clock minus the collector's; sent from now on)",
                                    sender.target(),
                                    e.offset_seconds(),
                                    e.error_seconds()
                                ),
                                Ok(e) => tracing::debug!(
                                    "clock offset from {}: {:+.6} s within {:.6} s",
                                    sender.target(),
                                    e.offset_seconds(),
                                    e.error_seconds()
                                ),
                                Err(e) => tracing::debug!(
                                    "acknowledgement timing from {} not taken: {e}",
                                    sender.target()
                                ),
                            }
                        }
                        Err(e) => {
                            self.spool.count_refused();
                            tracing::debug!(
                                "acknowledgement timing from {} refused: {e}",
                                sender.target()
                            );
                        }
                    }
                    continue;
                }
                if datagram.starts_with(&wire::ACK_MAGIC) {
                    // Counted by the spool either way: a wrong MAC (another node's key, a
                    // forgery) here, an acknowledgement that cannot be right there.
                    let taken = match wire::decode_ack(&datagram, &self.key) {
                        Ok(ack) => self.spool.on_ack(i, &ack, now).map_err(|e| e.to_string()),
                        Err(e) => {
                            self.spool.count_refused();
                            Err(e.to_string())
                        }
                    };
                    if let Err(e) = taken {
                        tracing::debug!("acknowledgement from {} refused: {e}", sender.target());
                    }
                    continue;
                }
                match wire::decode_schema_request(&datagram, &self.key) {
                    Ok(r)
                        if r.node == self.encoder.config().node
                            && r.session == self.encoder.session() =>
                    {
                        asked = Some(sender.target().clone());
                    }
                    Ok(r) => tracing::debug!(
                        "schema request for {:?} session {:08x} ignored: not this agent's",
                        r.node,
                        r.session
                    ),
                    Err(e) => tracing::debug!("datagram from {} ignored: {e}", sender.target()),
                }
            }
        }
        if let Some(collector) = asked {
            tracing::info!(
                "{collector} asked for the schema (it restarted?): sending every entry again"
            );
            self.encoder.resend_schema();
        }
    }

    /// Takes the collectors' replies and sends again what they lack, within the pace.
    pub fn deliver(&mut self) {
        self.take_replies();
        for (collector, frame) in self.spool.due(Instant::now()) {
            if let Some((_, seq)) = wire::peek_sequence(&frame) {
                self.clock.resent(seq);
            }
            // A full queue is counted by the sender; the frame stays in the spool.
            let _ = self.senders[collector].0.try_send(frame);
        }
    }

    /// Frames not yet acknowledged by every collector.
    pub fn undelivered(&self) -> usize {
        self.spool.len()
    }

    /// What the spool did.
    pub fn spool_stats(&self) -> SpoolStats {
        self.spool.stats()
    }

    /// Bytes the spool holds.
    pub fn spool_bytes(&self) -> usize {
        self.spool.bytes()
    }

    /// At shutdown: also sends what the sampler read but had not sent yet (the latest value
    /// of every series), so the collector ends with the node's final state.
    pub fn flush_all(&mut self) {
        let (reply, pending) = std_mpsc::sync_channel(1);
        if self.poller.send(reply).is_ok() {
            // The poller answers between two sweeps; a sweep takes milliseconds.
            match pending.recv_timeout(Duration::from_secs(2)) {
                Ok(samples) => self.on_samples(&samples),
                Err(e) => tracing::warn!("the poller's last samples are not sent: {e}"),
            }
        }
        for (series, emit) in self.sampler.flush() {
            self.push(&series, &emit);
        }
        self.flush();
    }

    /// At stop: the spool file keeps only what is still to deliver.
    pub fn persist_spool(&mut self) {
        self.spool.persist();
    }

    fn send(&mut self, frames: Vec<Vec<u8>>) {
        let now = Instant::now();
        self.spool.set_session(session_state(&self.encoder));
        // The spool keeps each frame until it is acknowledged, in its file, synced, before
        // the frame leaves (one sync per batch). A full queue is counted by the sender;
        // sampling never waits for the network.
        for frame in &frames {
            self.spool.push(frame.clone(), now);
        }
        self.spool.sync_file();
        for frame in frames {
            if let Some((_, seq)) = wire::peek_sequence(&frame) {
                self.clock.sent(seq, TimeBase::global().now_unix_ns());
            }
            for (sender, _) in &self.senders {
                let _ = sender.try_send(frame.clone());
            }
        }
    }

    /// Per collector: frames sent and dropped (by reason), send errors.
    pub fn sender_stats(&self) -> Vec<(Target, SenderStats)> {
        self.senders
            .iter()
            .map(|(s, _)| (s.target().clone(), s.stats()))
            .collect()
    }
}

/// Where `encoder`'s session stands.
fn session_state(encoder: &FrameEncoder) -> SessionState {
    SessionState {
        session: encoder.session(),
        next_seq: encoder.next_seq(),
        next_series_id: encoder.next_series_id(),
    }
}

/// Hands the spool its file, with what a previous run left there, and says what it took.
fn attach_file(spool: &mut Spool, file: SpoolFile, loaded: Loaded, encoder: &FrameEncoder) {
    let path = file.path().to_owned();
    let (frames, too_old) = (loaded.frames.len(), loaded.too_old);
    if loaded.resume.is_some() {
        tracing::info!(
            "resuming session {:08x} at frame {}: {frames} frames from {} still to deliver",
            encoder.session(),
            encoder.next_seq(),
            path.display()
        );
    }
    if too_old > 0 {
        tracing::warn!(
            "{}: {too_old} frames older than the spool's age limit given up",
            path.display()
        );
    }
    spool.attach(file, loaded, session_state(encoder), Instant::now());
}

/// An emit of the sampler, which runs on CLOCK_MONOTONIC, with its times on the wall clock of
/// `time` (the offset in force when each was read, as events get).
pub fn on_wall_clock(emit: &Emit, time: &TimeBase) -> Emit {
    match *emit {
        Emit::Counter { unix_ns, value } => Emit::Counter {
            unix_ns: time.unix_ns(MonoNs(unix_ns)).0,
            value,
        },
        Emit::Gauge(mut e) => {
            e.end_ns = time.unix_ns(MonoNs(e.end_ns)).0;
            // An envelope read across a step of the wall clock back in time would start after
            // it ends: it is kept, as ending where it ends.
            e.start_ns = time.unix_ns(MonoNs(e.start_ns)).0.min(e.end_ns);
            Emit::Gauge(e)
        }
    }
}

/// What the sampler emits, as a wire sample (one function for the agent and the testkit).
pub use monitor_sampler::wire_sample;

/// The metric the probes' verb counters are sent as.
pub const VERB_SERIES: &str = metric::RDMA_VERBS_TOTAL;

/// Verb counters from the probes as readings ([`VERB_SERIES`], labelled with the device, verb,
/// detail, cgroup and, when the cgroup names one, `job_id` and `job_step`), read at `now` (the
/// sampler's clock: the readings' `unix_ns` is monotonic until the pipeline converts what it sends).
pub fn verb_readings(counts: &[crate::probes::decode::VerbCount], now: MonoNs) -> Vec<Reading> {
    let unix_ns = now.0;
    counts
        .iter()
        .map(|c| Reading {
            series: Series {
                name: VERB_SERIES.into(),
                labels: Labels::new(
                    [
                        ("device", c.device.clone()),
                        ("verb", c.verb.to_owned()),
                        ("detail", c.detail.clone()),
                        ("cgroup", c.cgroup.clone()),
                    ]
                    .into_iter()
                    .chain(c.job.iter().flat_map(Job::labels)),
                ),
                kind: Kind::Counter,
            },
            value: Value::U64(c.value),
            unix_ns,
        })
        .collect()
}

/// A GPU event as a wire event.
pub fn gpu_event(event: &GpuEvent) -> WireEvent {
    let text = match event {
        GpuEvent::Xid { xid, .. } => format!("XID {xid}"),
        GpuEvent::Lost { reason, .. } => reason.clone(),
    };
    WireEvent {
        unix_ns: event.unix_ns().0,
        kind: event.kind().into(),
        labels: event.labels(),
        code: event.code().map_or(0, |c| c as i64),
        text,
    }
}

/// This machine's host name, the default node name.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn spawn_poller(
    options: PipelineOptions,
    tx: mpsc::Sender<Polled>,
    requests: std_mpsc::Receiver<FlushRequest>,
    hardware: HardwareSeries,
) -> anyhow::Result<()> {
    thread::Builder::new()
        .name("railscope-poll".into())
        .spawn(move || poll(options, tx, requests, hardware))
        .context("starting the poller thread")?;
    Ok(())
}

fn poll(
    options: PipelineOptions,
    tx: mpsc::Sender<Polled>,
    requests: std_mpsc::Receiver<FlushRequest>,
    hardware: HardwareSeries,
) {
    let Ok(mut sampler) = sampler_config(options.interval, options.adaptive, &options.sampling)
    else {
        return; // refused by Pipeline::start already
    };
    // Devices that appear are found within 5 s; one that goes away at its next read.
    let mut ib = IbSysfs::new(options.sysfs_root.clone()).with_relist_every(Duration::from_secs(5));
    let mut ethtool = EthtoolStats::new(options.sysfs_root.clone());
    let class = options.sysfs_root.join("class/infiniband");
    if !class.is_dir() {
        tracing::warn!(
            "no RDMA devices ({} absent): IB counters off until a device appears",
            class.display()
        );
    }
    let mut gpu = None;
    let mut _gpu_events = None;
    if options.gpu {
        match GpuSource::open(options.nvml_lib.as_deref()) {
            Ok(source) => {
                let mut source = source.with_jobs(ProcessJobs::new("/proc", options.jobs.clone()));
                tracing::info!("NVML: {} GPUs", source.gpus().count());
                let (event_tx, event_rx) = std_mpsc::channel();
                match source.spawn_event_thread(event_tx) {
                    Ok(thread) => {
                        _gpu_events = Some(thread);
                        bridge_gpu_events(event_rx, tx.clone());
                    }
                    Err(e) => tracing::warn!("{e}"),
                }
                gpu = Some(source);
            }
            Err(e) => tracing::warn!("{e}"),
        }
    }
    // Read at start and every minute, through the GPU source's NVML: never every sweep.
    let mut hardware = HardwarePoll::new(options.sysfs_root.clone(), hardware);
    let mut samples = Vec::new();
    let mut last_stale_check = Instant::now();
    loop {
        hardware.poll(gpu.as_ref().map(GpuSource::nvml));
        let started = Instant::now();
        // The sampler runs on CLOCK_MONOTONIC, so a step of the wall clock neither stalls nor
        // rushes it; what it emits is converted when encoded (`on_wall_clock`). Each sweep
        // measures the wall clock's offset again.
        let now = TimeBase::global().refresh();
        if last_stale_check.elapsed() >= Duration::from_secs(60) {
            last_stale_check = started;
            samples.extend(sampler.remove_stale(now.0, STALE_AFTER));
        }
        let mut sink = SamplingSink {
            sampler: &mut sampler,
            now,
            samples: &mut samples,
        };
        ib.read_into(&mut sink);
        ethtool.read_into(&mut sink);
        let mut ended = Vec::new();
        if let Some(source) = gpu.as_mut() {
            source.read_into(now, &mut sink);
            ended = source.take_ended_series();
            if !ended.is_empty() {
                // What the sampler still held of them goes out as their last samples.
                let ended: std::collections::HashSet<&Series> = ended.iter().collect();
                samples.extend(sampler.remove_where(|s, _| ended.contains(s)));
            }
        }
        let capacity = samples.len();
        // Sent even when empty: each sweep is also the agent loop's cue to read the verb
        // counters.
        if tx
            .blocking_send(Polled::Samples(std::mem::replace(
                &mut samples,
                Vec::with_capacity(capacity),
            )))
            .is_err()
        {
            return; // the agent stopped
        }
        if !ended.is_empty() && tx.blocking_send(Polled::Ended(ended)).is_err() {
            return;
        }
        match requests.recv_timeout(options.interval.saturating_sub(started.elapsed())) {
            Ok(reply) => {
                let _ = reply.send(sampler.flush());
            }
            Err(std_mpsc::RecvTimeoutError::Timeout) => {}
            Err(std_mpsc::RecvTimeoutError::Disconnected) => return, // the agent stopped
        }
    }
}

/// Hands each value the poller reads straight to its sampler, and keeps what it says to send.
struct SamplingSink<'a> {
    sampler: &'a mut AdaptiveSampler,
    /// The sweep's instant; the sampler runs on CLOCK_MONOTONIC.
    now: MonoNs,
    samples: &'a mut Vec<(Series, Emit)>,
}

impl ReadingSink for SamplingSink<'_> {
    fn due(&mut self, series: &Series, slot: &mut Slot) -> bool {
        self.sampler.due_at(series, slot, self.now.0)
    }

    fn reading(&mut self, series: &Series, slot: &mut Slot, value: Value) {
        let emitted = self.sampler.observe_at(series, slot, value, self.now.0);
        self.samples
            .extend(emitted.into_iter().map(|e| (series.clone(), e)));
    }
}

fn bridge_gpu_events(events: std_mpsc::Receiver<GpuEvent>, tx: mpsc::Sender<Polled>) {
    let spawned = thread::Builder::new()
        .name("railscope-gpu-events".into())
        .spawn(move || {
            for event in events {
                if tx.blocking_send(Polled::Gpu(event)).is_err() {
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("GPU events off: cannot start their thread: {e}");
    }
}
