//! Bytes at rest per sample: frames of simulated nodes (`monitor_testkit::NodeSender`: a busy
//! node of 8 GPUs and 8 IB ports sending the agent's own series, 236 of them, read every
//! second through the agent's encoder, flushed every 10 s) appended to an archive as the
//! collector appends them, then sealed. Every reading is sent (the agent with adaptive
//! sampling off), or with `--adaptive` what the agent's adaptive sampler sends (its default:
//! stable series about every 32 s, gauges as envelopes). Prints one JSON line: samples, and
//! frame bytes and bytes at rest (sealed), each per sample.
//!
//! `cargo run --release -p monitor-collector --example archive_size -- [--nodes N]
//! [--seconds S] [--level L] [--block-kib K] [--segment-mib M] [--span-s S] [--flush-s F]
//! [--adaptive] [--data DIR --key FILE]`
//!
//! With `--data` the archive is kept in DIR (frames made with the key of FILE), for a
//! collector to open: `cargo xtask bench collector` feeds VictoriaMetrics from it.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use monitor_archive::archive::{AcceptedFrame, Archive, ArchiveConfig};
use monitor_testkit::NodeSender;
use monitor_wire::Key;

fn arg(args: &[String], name: &str, default: u64) -> anyhow::Result<u64> {
    match args.iter().position(|a| a == name) {
        Some(i) => args
            .get(i + 1)
            .with_context(|| format!("{name} needs a value"))?
            .parse()
            .with_context(|| format!("{name}: not a number")),
        None => Ok(default),
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let nodes = arg(&args, "--nodes", 4)?;
    let seconds = arg(&args, "--seconds", 3600)?;
    let level = arg(&args, "--level", 3)? as i32;
    let block_kib = arg(&args, "--block-kib", 1024)? as usize;
    let segment_mib = arg(&args, "--segment-mib", 64)?;
    // The open segment is also sealed once its first record is this old (on the clock: the
    // run's data ends now); a large value leaves one seal, at the end, to time.
    let span_s = arg(&args, "--span-s", 3600)?;
    // The agent's flush interval: each flush starts every series' coding afresh.
    let flush_s = arg(&args, "--flush-s", 10)?.max(1);
    let adaptive = args.iter().any(|a| a == "--adaptive");
    let kept = args
        .iter()
        .position(|a| a == "--data")
        .and_then(|i| args.get(i + 1))
        .map(std::path::PathBuf::from);
    let key = match args.iter().position(|a| a == "--key") {
        Some(i) => Key::from_file(args.get(i + 1).context("--key needs a file")?)?,
        None => Key::from_bytes([7; 32]),
    };
    // The run ends now: the archive seals a segment once its span has passed on the clock.
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let t0: u64 = (now_s - seconds) * 1_000_000_000;

    let mut senders: Vec<NodeSender> = (0..nodes)
        .map(|n| {
            NodeSender::new(&format!("gpu-node-{n:04}"), n + 1, key.clone()).adaptive(adaptive)
        })
        .collect();
    let temp = tempfile::tempdir()?;
    let dir = kept.as_deref().unwrap_or(temp.path());
    let mut archive = Archive::open(ArchiveConfig {
        segment_bytes: segment_mib << 20,
        segment_span: Duration::from_secs(span_s),
        block_bytes: block_kib << 10,
        compression_level: level,
        retention_age: None,
        ..ArchiveConfig::new(dir)
    })?;
    let (mut samples, mut frame_bytes, mut frames) = (0u64, 0u64, 0u64);
    let started = Instant::now();
    // One flush interval of every node at a time, as frames arrive at a collector.
    for chunk in 0..seconds.div_ceil(flush_s) {
        let start = t0 + chunk * flush_s * 1_000_000_000;
        let len = (seconds - chunk * flush_s).min(flush_s);
        for s in senders.iter_mut() {
            let batch = s.run(start, len, flush_s);
            for f in &batch {
                let accepted = AcceptedFrame {
                    node: &s.name,
                    received_ns: f.received_ns,
                    first_ns: f.first_ns,
                    last_ns: f.last_ns,
                    bytes: &f.bytes,
                };
                archive.append(&accepted, &|_| s.schema_frame())?;
                samples += f.samples as u64;
                frame_bytes += f.bytes.len() as u64;
                frames += 1;
            }
        }
        archive.tick()?;
    }
    // The last seal (of what the open segment holds at the end) is timed: wall and CPU.
    let before_seal = archive.stats().bytes_on_disk;
    let (seal_started, seal_cpu0) = (Instant::now(), thread_cpu_s());
    archive.seal()?;
    let (seal_s, seal_cpu_s) = (
        seal_started.elapsed().as_secs_f64(),
        thread_cpu_s() - seal_cpu0,
    );
    let sealed = archive.stats();
    let per = |b: u64| b as f64 / samples.max(1) as f64;
    println!(
        "{}",
        serde_json::json!({
            "nodes": nodes,
            "seconds": seconds,
            "zstd_level": level,
            "block_kib": block_kib,
            "segment_mib": segment_mib,
            "flush_s": flush_s,
            "adaptive": adaptive,
            "series_per_node": senders.first().map_or(0, NodeSender::series),
            "samples": samples,
            "frames": frames,
            "frame_bytes_per_sample": per(frame_bytes),
            "sealed_segments": sealed.segments - 1,
            "bytes_at_rest_per_sample": per(sealed.bytes_on_disk),
            "elapsed_s": started.elapsed().as_secs_f64(),
            "last_seal": {
                "archive_bytes_before": before_seal,
                "wall_s": seal_s,
                "cpu_s": seal_cpu_s,
            },
        })
    );
    Ok(())
}

/// CPU time of the calling thread (user + system), in seconds.
fn thread_cpu_s() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}
