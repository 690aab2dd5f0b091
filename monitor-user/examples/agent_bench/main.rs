//! The measuring side of `cargo xtask bench agent` (xtask runs it; it prints JSON on stdout).
//!
//! - `fixture`: creates a fixture node's IB sysfs tree (8 mlx5-like NDR ports) and keeps its
//!   counters moving in real time until its stdin closes, so the agent and node_exporter
//!   read a moving tree.
//! - `gpu-script`: writes a long 8-GPU NVML stand-in script (one step per sweep) next to a
//!   copy of the stand-in library.
//! - `wire`: bytes per sample. Reads the fixture tree (advanced in simulated time between
//!   sweeps) and the stand-in through railscope's real sources for N sweeps, and encodes the
//!   readings as railscope's `FrameEncoder` does (default config, a flush every 10 s), as
//!   Prometheus text exposition (one scrape per sweep) and as remote-write v1 requests
//!   (protobuf + snappy).
//! - `traces`: the adaptive sampler against a fixed interval on the workload-shaped traces
//!   of the `sampler-traces` crate.
//! - `read-floor`: only reads a fixture tree's IB files, as often as asked, until killed: the
//!   least CPU any agent reading those files that often can cost here.

mod fixture;
mod gpu_script;
mod prom;
mod read_floor;

use std::{
    collections::BTreeSet,
    io::{BufRead as _, Write as _},
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use monitor_sampler::{AdaptiveSampler, Emit, SamplerConfig};
use monitor_user::sources::{gpu::GpuSource, ib_sysfs::IbSysfs};
use monitor_wire::{self as wire, EncoderConfig, FrameEncoder, Key, Kind, Reading, Series, Value};
use sampler_traces::{self as traces, Evaluation};
use serde_json::{Value as Json, json};

/// The sampler's seeded generator, so fixtures and traces draw from one implementation.
pub use monitor_sampler::SplitMix64 as Rng;

#[derive(Parser)]
#[command(about = "measurements for `cargo xtask bench agent`")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create the fixture tree and keep its counters moving until stdin closes.
    Fixture {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 8)]
        devices: usize,
        /// Updates per second.
        #[arg(long, default_value_t = 10.0)]
        hz: f64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Write an 8-GPU stand-in script of `steps` steps `interval` seconds apart.
    GpuScript {
        #[arg(long)]
        dir: PathBuf,
        /// The built stand-in library (`libnvml_standin.so`).
        #[arg(long)]
        standin: PathBuf,
        #[arg(long)]
        steps: usize,
        #[arg(long)]
        interval: f64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Bytes per sample: railscope frames vs Prometheus text vs remote-write.
    Wire(WireArgs),
    /// Adaptive sampling on the workload-shaped traces.
    Traces {
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// The GPU source alone on the 8-GPU stand-in: CPU per sweep (this thread's, the
    /// stand-in's work included) and NVML calls per sweep, as the agent sweeps (with its job
    /// attribution). Set `RAILSCOPE_NVML_STANDIN_COUNTS` for the call counts.
    GpuSweep {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        standin: PathBuf,
        #[arg(long, default_value_t = 200)]
        sweeps: usize,
        /// Instead of the GPU source, only the NVML calls the same fields need, handles kept
        /// and fixed values read once: the GPU read floor.
        #[arg(long)]
        floor: bool,
    },
    /// Only read the tree's IB files (kept open, one pread each) until killed.
    ReadFloor {
        /// Directory holding `class/infiniband`.
        #[arg(long)]
        sysfs: PathBuf,
        #[arg(long, value_enum)]
        files: read_floor::FileSet,
        /// Seconds between passes.
        #[arg(long)]
        interval: f64,
        /// Each file is read once every this many passes.
        #[arg(long, default_value_t = 1)]
        every: usize,
    },
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RAILSCOPE_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .init();
    match Cli::parse().command {
        Command::Fixture {
            dir,
            devices,
            hz,
            seed,
        } => run_fixture(dir, devices, hz, seed),
        Command::GpuScript {
            dir,
            standin,
            steps,
            interval,
            seed,
        } => {
            let (lib, bytes) = gpu_script::write(&dir, &standin, 8, steps, interval, seed)?;
            println!(
                "{}",
                json!({"lib": lib, "script_bytes": bytes, "steps": steps, "gpus": 8})
            );
            Ok(())
        }
        Command::Wire(args) => {
            let out = run_wire(&args)?;
            println!("{out}");
            Ok(())
        }
        Command::Traces { seed } => {
            println!("{}", run_traces(seed));
            Ok(())
        }
        Command::GpuSweep {
            dir,
            standin,
            sweeps,
            floor,
        } => {
            println!("{}", run_gpu_sweep(&dir, &standin, sweeps, floor)?);
            Ok(())
        }
        Command::ReadFloor {
            sysfs,
            files,
            interval,
            every,
        } => read_floor::run(&sysfs, files, interval, every),
    }
}

/// This thread's CPU time.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn run_gpu_sweep(
    dir: &std::path::Path,
    standin: &std::path::Path,
    sweeps: usize,
    floor: bool,
) -> anyhow::Result<Json> {
    let (lib, _) = gpu_script::write(dir, standin, 8, sweeps + 2, 1.0, 1)?;
    let mut sweep: Box<dyn FnMut(u64) -> usize> = if floor {
        gpu_floor(&lib)?
    } else {
        let jobs = monitor_user::sources::gpu::ProcessJobs::new(
            "/proc",
            monitor_user::jobs::JobRules::new(&Default::default()),
        );
        let mut gpu = GpuSource::open(Some(&lib))
            .context("opening the NVML stand-in")?
            .with_jobs(jobs);
        Box::new(move |now| gpu.read(monitor_user::time_base::MonoNs(now)).len())
    };
    let mut cpu = Vec::with_capacity(sweeps);
    let mut readings = 0usize;
    let mut last = None::<Instant>;
    for i in 0..sweeps {
        if let Some(last) = last {
            // GPM needs its two samples more than 100 ms apart.
            std::thread::sleep(Duration::from_millis(110).saturating_sub(last.elapsed()));
        }
        last = Some(Instant::now());
        let before = thread_cpu();
        readings += sweep(1_790_000_000_000_000_000 + i as u64 * 1_000_000_000);
        cpu.push((thread_cpu() - before).as_secs_f64() * 1e6);
    }
    drop(sweep);
    // The first sweeps build the series and open GPM: the steady state is the rest.
    let steady: Vec<f64> = cpu.iter().skip(5).copied().collect();
    let mut sorted = steady.clone();
    sorted.sort_by(f64::total_cmp);
    Ok(json!({
        "floor": floor,
        "sweeps": sweeps,
        "gpus": 8,
        "readings_per_sweep": readings as f64 / sweeps.max(1) as f64,
        "cpu_us_per_sweep_mean": steady.iter().sum::<f64>() / steady.len().max(1) as f64,
        "cpu_us_per_sweep_median": sorted.get(sorted.len() / 2).copied().unwrap_or(0.0),
        "cpu_us_first_sweep": cpu.first().copied().unwrap_or(0.0),
    }))
}

/// The GPU read floor: per GPU and sweep, each NVML query of the GPU source's fields once
/// (utilization, memory, two clocks, temperature, power, energy, throttle reasons, PCIe
/// throughput both ways, replays, the link's current generation and width, one batched
/// field-value call of as many entries, a GPM sample and its metrics, the two process
/// lists), handles kept from the start and the fixed maxima read once; values only summed,
/// nothing named, sampled or encoded.
fn gpu_floor(lib: &std::path::Path) -> anyhow::Result<Box<dyn FnMut(u64) -> usize>> {
    use nvml_wrapper::{
        Nvml,
        enum_wrappers::device::{Clock, PcieUtilCounter, TemperatureSensor},
        enums::gpm::GpmMetricId,
        structs::device::FieldId,
        sys_exports::field_id::*,
    };
    let nvml: &'static Nvml =
        Box::leak(Box::new(Nvml::builder().lib_path(lib.as_os_str()).init()?));
    let count = nvml.device_count()?;
    let devices: Vec<_> = (0..count)
        .map(|i| nvml.device_by_index(i))
        .collect::<Result<_, _>>()?;
    let mut maxima = 0u64;
    for d in &devices {
        maxima += u64::from(d.max_pcie_link_gen().unwrap_or(0));
        maxima += u64::from(d.max_pcie_link_width().unwrap_or(0));
    }
    std::hint::black_box(maxima);
    // As many entries as the source's batched call: 12 counters and flags, 2 per NVLink link.
    let fields: Vec<FieldId> = [
        NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
        NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
        NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
        NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
        NVML_FI_DEV_REMAPPED_COR,
        NVML_FI_DEV_REMAPPED_UNC,
        NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
        NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
        NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
        NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
        NVML_FI_DEV_REMAPPED_PENDING,
        NVML_FI_DEV_REMAPPED_FAILURE,
    ]
    .into_iter()
    .chain((0..36).map(|i| {
        if i % 2 == 0 {
            NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
        } else {
            NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
        }
    }))
    .map(FieldId)
    .collect();
    let metrics = [
        GpmMetricId::SmUtil,
        GpmMetricId::SmOccupancy,
        GpmMetricId::IntegerUtil,
        GpmMetricId::AnyTensorUtil,
        GpmMetricId::DfmaTensorUtil,
        GpmMetricId::HmmaTensorUtil,
        GpmMetricId::ImmaTensorUtil,
        GpmMetricId::Fp64Util,
        GpmMetricId::Fp32Util,
        GpmMetricId::Fp16Util,
        GpmMetricId::DramBwUtil,
        GpmMetricId::PcieTxPerSec,
        GpmMetricId::PcieRxPerSec,
        GpmMetricId::NvlinkTotalTxPerSec,
        GpmMetricId::NvlinkTotalRxPerSec,
    ];
    let mut prev: Vec<Option<nvml_wrapper::GpmSample<'static>>> =
        devices.iter().map(|_| None).collect();
    Ok(Box::new(move |_now| {
        let mut values = 0usize;
        let mut sum = 0u64;
        for (d, prev) in devices.iter().zip(prev.iter_mut()) {
            let mut add = |v: Option<u64>| {
                if let Some(v) = v {
                    sum = sum.wrapping_add(v);
                    values += 1;
                }
            };
            let u = d.utilization_rates().ok();
            add(u.as_ref().map(|u| u64::from(u.gpu)));
            add(u.map(|u| u64::from(u.memory)));
            add(d.memory_info().ok().map(|m| m.used));
            add(d.clock_info(Clock::SM).ok().map(u64::from));
            add(d.clock_info(Clock::Memory).ok().map(u64::from));
            add(d.temperature(TemperatureSensor::Gpu).ok().map(u64::from));
            add(d.power_usage().ok().map(u64::from));
            add(d.total_energy_consumption().ok());
            add(d.current_throttle_reasons().ok().map(|r| r.bits()));
            add(d.pcie_throughput(PcieUtilCounter::Send).ok().map(u64::from));
            add(d
                .pcie_throughput(PcieUtilCounter::Receive)
                .ok()
                .map(u64::from));
            add(d.pcie_replay_counter().ok().map(u64::from));
            add(d.current_pcie_link_gen().ok().map(u64::from));
            add(d.current_pcie_link_width().ok().map(u64::from));
            if let Ok(v) = d.field_values_for(&fields) {
                add(Some(v.len() as u64));
            }
            add(d.running_compute_processes().ok().map(|p| p.len() as u64));
            add(d.running_graphics_processes().ok().map(|p| p.len() as u64));
            if let Ok(sample) = d.gpm_sample() {
                if let Some(p) = prev.take()
                    && let Ok(m) = nvml_wrapper::gpm::gpm_metrics_get(nvml, &p, &sample, &metrics)
                {
                    add(Some(m.len() as u64));
                }
                *prev = Some(sample);
            }
        }
        std::hint::black_box(sum);
        values
    }))
}

fn run_fixture(dir: PathBuf, devices: usize, hz: f64, seed: u64) -> anyhow::Result<()> {
    let mut fixture = fixture::Fixture::create(&dir, devices, seed)
        .with_context(|| format!("creating the fixture tree under {}", dir.display()))?;
    // Stop when the parent closes our stdin (or goes away).
    std::thread::spawn(|| {
        let stdin = std::io::stdin();
        for _ in stdin.lock().lines() {}
        std::process::exit(0);
    });
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{}",
        json!({"ready": true, "root": fixture.root(), "shape": fixture.shape()})
    )?;
    out.flush()?;
    drop(out);
    let period = Duration::from_secs_f64(1.0 / hz.max(0.1));
    let start = Instant::now();
    let mut last = start;
    let mut tick = 1u32;
    loop {
        let next = start + period * tick;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        let now = Instant::now();
        fixture.advance((now - last).as_secs_f64())?;
        last = now;
        tick += 1;
    }
}

#[derive(clap::Args)]
struct WireArgs {
    /// Scratch directory (the tree and the stand-in go under it).
    #[arg(long)]
    dir: PathBuf,
    #[arg(long)]
    standin: PathBuf,
    /// Seconds between sweeps (of the node's time; the sweeps themselves run at least
    /// 100 ms apart, as GPM needs).
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
    #[arg(long, default_value_t = 300)]
    sweeps: usize,
    /// Seconds between flushes of the encoder.
    #[arg(long, default_value_t = 10.0)]
    flush: f64,
    #[arg(long, default_value = "bench-node")]
    node: String,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also write railscope's frames (the default config's), back to back, to this file.
    #[arg(long)]
    frames_out: Option<PathBuf>,
}

/// Sweeps of the fixture node through railscope's real sources.
fn sweep_fixture_node(args: &WireArgs) -> anyhow::Result<(Vec<Vec<Reading>>, Json)> {
    let mut fixture = fixture::Fixture::create(&args.dir.join("sys"), 8, args.seed)?;
    let (lib, script_bytes) = gpu_script::write(
        &args.dir.join("nvml"),
        &args.standin,
        8,
        args.sweeps + 2,
        args.interval,
        args.seed,
    )?;
    let mut ib = IbSysfs::new(fixture.root().to_path_buf());
    let mut gpu = GpuSource::open(Some(&lib)).context("opening the NVML stand-in")?;
    // Sweep times: whole seconds of a fixed day, so runs are comparable.
    let t0: u64 = 1_790_000_000_000_000_000;
    let step_ns = (args.interval * 1e9).round() as u64;
    let mut sweeps = Vec::with_capacity(args.sweeps);
    let mut last = None::<Instant>;
    for i in 0..args.sweeps {
        if i > 0 {
            fixture.advance(args.interval)?;
        }
        if let Some(last) = last {
            // GPM needs its two samples at least 100 ms apart in real time.
            std::thread::sleep(Duration::from_millis(110).saturating_sub(last.elapsed()));
        }
        last = Some(Instant::now());
        let now = t0 + i as u64 * step_ns;
        let mut readings = ib.read(now);
        // The sweep's instant as the sampler takes it (a synthetic clock here).
        readings.extend(gpu.read(monitor_user::time_base::MonoNs(now)));
        sweeps.push(readings);
    }
    let problems = ib.problems().len();
    let facts = json!({
        "fixture": fixture.shape(),
        "fixture_writes": fixture.writes(),
        "ib_problems": problems,
        "standin_script_bytes": script_bytes,
    });
    Ok((sweeps, facts))
}

fn composition(readings: &[Reading]) -> Json {
    let mut series: BTreeSet<&Series> = BTreeSet::new();
    for r in readings {
        series.insert(&r.series);
    }
    let count = |prefix: &str, kind: Kind| {
        series
            .iter()
            .filter(|s| s.name.starts_with(prefix) && s.kind == kind)
            .count()
    };
    json!({
        "series": series.len(),
        "ib_counters": count("railscope_ib_", Kind::Counter),
        "ib_gauges": count("railscope_ib_", Kind::Gauge),
        "gpu_counters": count("railscope_gpu_", Kind::Counter),
        "gpu_gauges": count("railscope_gpu_", Kind::Gauge),
    })
}

fn push_emit(encoder: &mut FrameEncoder, series: &Series, emit: &Emit) {
    let sample = monitor_user::pipeline::wire_sample(emit);
    let _ = encoder.push_sample(series, sample);
}

/// The readings through the adaptive sampler (default config at this minimum interval) and
/// the encoder, as the agent sends them by default.
fn adaptive_cost(sweeps: &[Vec<Reading>], args: &WireArgs) -> anyhow::Result<Json> {
    let mut sampler = AdaptiveSampler::new(SamplerConfig {
        min_interval: Duration::from_secs_f64(args.interval),
        ..SamplerConfig::default()
    });
    let mut encoder = FrameEncoder::new(EncoderConfig::new(&args.node), Key::from_bytes([7; 32]))?;
    let every = (args.flush * 1e9) as u64;
    let first = sweeps
        .iter()
        .flatten()
        .map(|r| r.unix_ns)
        .min()
        .unwrap_or(0);
    let mut boundary = first + every;
    let (mut readings, mut emitted) = (0u64, 0u64);
    for sweep in sweeps {
        for r in sweep {
            while r.unix_ns >= boundary {
                encoder.flush(boundary);
                boundary += every;
            }
            readings += 1;
            for e in sampler.observe(&r.series, r.value, r.unix_ns).iter() {
                emitted += 1;
                push_emit(&mut encoder, &r.series, e);
            }
        }
    }
    for (series, e) in sampler.flush() {
        emitted += 1;
        push_emit(&mut encoder, &series, &e);
    }
    encoder.flush(boundary);
    let stats = encoder.stats();
    Ok(json!({
        "readings": readings,
        "samples_sent": emitted,
        "frames": stats.frames,
        "bytes": stats.bytes,
        "schema_bytes": stats.schema_bytes,
        "bytes_per_reading": stats.bytes as f64 / readings.max(1) as f64,
    }))
}

fn gzip_len(text: &str) -> anyhow::Result<u64> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(text.as_bytes())?;
    Ok(gz.finish()?.len() as u64)
}

fn run_wire(args: &WireArgs) -> anyhow::Result<Json> {
    let started = Instant::now();
    let (sweeps, facts) = sweep_fixture_node(args)?;
    let flat: Vec<Reading> = sweeps.iter().flatten().cloned().collect();
    let n = flat.len() as u64;
    let per = |bytes: u64| bytes as f64 / n.max(1) as f64;
    let flush = Duration::from_secs_f64(args.flush);

    // The agent sends a counter read as a float (GPU energy in joules, from NVML's mJ) as
    // the integer part (pipeline.rs); `measure` takes readings as they are, so convert first.
    let as_sent_one = |r: &Reading| match (r.series.kind, r.value) {
        (Kind::Counter, Value::F64(v)) => Reading {
            value: Value::U64(v.max(0.0) as u64),
            ..r.clone()
        },
        _ => r.clone(),
    };
    let as_sent: Vec<Reading> = flat.iter().map(as_sent_one).collect();
    let mut stream = Vec::new();
    let ours = wire::measure_with(&as_sent, EncoderConfig::new(&args.node), flush, |f| {
        stream.extend_from_slice(f)
    })?;
    if let Some(path) = &args.frames_out {
        std::fs::write(path, &stream).with_context(|| format!("writing {}", path.display()))?;
    }
    // The same per source, and the schema of every series sent once (one sweep, one flush).
    let mut by_source = serde_json::Map::new();
    for prefix in ["railscope_ib_", "railscope_gpu_"] {
        let part: Vec<Reading> = as_sent
            .iter()
            .filter(|r| r.series.name.starts_with(prefix))
            .cloned()
            .collect();
        let cost = wire::measure(&part, EncoderConfig::new(&args.node), flush)?;
        by_source.insert(
            prefix
                .trim_start_matches("railscope_")
                .trim_end_matches('_')
                .to_owned(),
            json!({
                "samples": cost.samples,
                "bytes": cost.bytes,
                "schema_bytes": cost.schema_bytes,
                "bytes_per_sample": cost.bytes_per_sample(),
                "bytes_per_sample_without_schema": cost.bytes_per_sample_without_schema(),
            }),
        );
    }
    let first: Vec<Reading> = sweeps[0].iter().map(as_sent_one).collect();
    let one_sweep = wire::measure(&first, EncoderConfig::new(&args.node), Duration::MAX)?;
    let adaptive = adaptive_cost(&sweeps, args)?;

    let (mut text_bytes, mut gzip_bytes) = (0u64, 0u64);
    for sweep in &sweeps {
        let text = prom::text_exposition(sweep);
        text_bytes += text.len() as u64;
        gzip_bytes += gzip_len(&text)?;
    }
    let every_ns = (args.flush * 1e9) as u64;
    let grouped = prom::remote_write_grouped(&flat, every_ns, &args.node);
    let as_prometheus = prom::remote_write_as_prometheus(&flat, 2000, &args.node);
    let gpm_sweeps = sweeps
        .iter()
        .filter(|s| {
            s.iter()
                .any(|r| &*r.series.name == "railscope_gpu_sm_util_ratio")
        })
        .count();

    Ok(json!({
        "interval_s": args.interval,
        "sweeps": args.sweeps,
        "flush_s": args.flush,
        "node": args.node,
        "facts": facts,
        "readings": n,
        "readings_per_sweep": n as f64 / sweeps.len().max(1) as f64,
        "sweeps_with_gpm": gpm_sweeps,
        "composition": composition(&flat),
        "railscope": {
            "samples": ours.samples,
            "frames": ours.frames,
            "bytes": ours.bytes,
            "schema_bytes": ours.schema_bytes,
            "largest_frame": ours.largest_frame,
            "bytes_per_sample": ours.bytes_per_sample(),
            "bytes_per_sample_without_schema": ours.bytes_per_sample_without_schema(),
            "by_source": by_source,
            "schema_bytes_one_flush": one_sweep.schema_bytes,
        },
        "railscope_adaptive": adaptive,
        "prometheus_text": {
            "scrapes": sweeps.len(),
            "bytes": text_bytes,
            "bytes_per_sample": per(text_bytes),
            "gzip_bytes": gzip_bytes,
            "gzip_bytes_per_sample": per(gzip_bytes),
        },
        "remote_write_grouped": {
            "requests": grouped.requests,
            "protobuf_bytes": grouped.protobuf_bytes,
            "bytes": grouped.snappy_bytes,
            "bytes_per_sample": per(grouped.snappy_bytes),
        },
        "remote_write_as_prometheus": {
            "requests": as_prometheus.requests,
            "protobuf_bytes": as_prometheus.protobuf_bytes,
            "bytes": as_prometheus.snappy_bytes,
            "bytes_per_sample": per(as_prometheus.snappy_bytes),
            "max_samples_per_send": 2000,
        },
        "elapsed_s": started.elapsed().as_secs_f64(),
    }))
}

fn evaluation_json(e: &Evaluation, kind: Option<Kind>, ticks: Option<usize>) -> Json {
    let delay = e.max_step_detection_delay_in_min_intervals;
    json!({
        "trace": e.trace,
        "kind": kind.map(|k| match k { Kind::Counter => "counter", Kind::Gauge => "gauge" }),
        "ticks": ticks,
        "samples_adaptive": e.samples_adaptive,
        "samples_fixed": e.samples_fixed,
        "reads_adaptive": e.reads_adaptive,
        "reads_fixed": e.reads_fixed,
        "reduction": e.reduction,
        "worst_interval_error": e.worst_interval_error,
        "worst_interval_error_tick": e.worst_interval_error_tick,
        "inconsistent_emits": e.inconsistent_emits,
        "worst_window_peak_error": e.worst_window_peak_error,
        "unobserved_windows": e.unobserved_windows,
        "steps": e.steps,
        // JSON has no infinity: a step never caught is null.
        "max_step_delay_min_intervals": delay.is_finite().then_some(delay),
    })
}

fn run_traces(seed: u64) -> Json {
    let mut rows = Vec::new();
    let mut all = Vec::new();
    for t in traces::standard(seed) {
        let e = traces::evaluate(&t, &t.sampler_config());
        rows.push(evaluation_json(&e, Some(t.kind), Some(t.values.len())));
        all.push(e);
    }
    let total = Evaluation::combine("all traces", &all);
    let mut others = Vec::new();
    for s in (seed + 1)..=(seed + 5) {
        for t in traces::standard(s) {
            others.push(traces::evaluate(&t, &t.sampler_config()));
        }
    }
    let other_total = Evaluation::combine(&format!("seeds {}-{}", seed + 1, seed + 5), &others);
    let default = SamplerConfig::default();
    json!({
        "seed": seed,
        "config": {
            "window": default.window,
            "peak_tolerance": default.peak_tolerance,
            "density_threshold": default.density_threshold,
            "max_interval_s": default.max_interval.as_secs_f64(),
            "jitter": default.jitter,
            "ground_truth_every": default.ground_truth_every,
        },
        "traces": rows,
        "total": evaluation_json(&total, None, None),
        "other_seeds": evaluation_json(&other_total, None, None),
        "other_seeds_worst_per_trace_interval_error": others
            .iter()
            .map(|e| e.worst_interval_error)
            .fold(0.0, f64::max),
        "other_seeds_inconsistent_emits": others.iter().map(|e| e.inconsistent_emits).sum::<usize>(),
    })
}
