//! The node agent's main loop: keeps each probe family attached when the kernel allows it,
//! drains their ring buffers, prints events (and port transitions), and, on request, the live
//! verb counters.
//!
//! A source that fails never stops the agent: a family whose module is missing is looked for
//! every `rescan` interval, one that fails to attach is retried with a backoff, and one whose
//! module goes away is dropped and waited for the same way. Attaching runs on a blocking
//! thread, so the loop keeps its pace meanwhile. The families' lifecycle and their ring-buffer
//! readers are `crate::probes::families` and `crate::probes::ring`, which `railscope
//! capture` shares.
//!
//! - `output`: events, transitions, GPU events and counters as text or JSON lines;
//! - `wire_events`: the same events as the collector receives them;
//! - `job_ends`: a job's counters sent a last time and forgotten once its cgroup is gone;
//! - `device_ends`: the same for a device once the kernel freed it;
//! - `state_report`: the agent's own tables, memory and bound hits, sent and logged;
//! - `recorded_counts`: verb counters from a recording in place of the probes'.

mod device_ends;
mod job_ends;
mod output;
mod recorded_counts;
mod state_report;
mod wire_events;

use std::{io::Write, time::Duration};

use tokio::sync::mpsc;

pub use output::{OutputFormat, write_counts, write_event, write_gpu_event, write_transition};

use monitor_common::events::Origin;
use monitor_config::ServiceManager;

use crate::{
    cgroup::CgroupNames,
    jobs::JobRules,
    kernel::Kernel,
    pipeline::{self, Pipeline, PipelineOptions, Polled},
    probes::{
        decode::{self, PortStates, ProbeEvent},
        families::{self, AttachFn, Families},
        ring::RingRecord,
    },
    stop_signals::StopSignals,
    time_base::{TimeBase, monotonic_ns},
};
use state_report::StateReport;
use wire_events::{ib_wire_event, transition_wire_event};

#[derive(Clone, Debug)]
pub struct AgentOptions {
    pub format: OutputFormat,
    /// How often to look for modules that appeared or disappeared.
    pub rescan: Duration,
    /// Print the verb counters this often (None: never).
    pub counters_every: Option<Duration>,
    pub kernel: Kernel,
    /// What names a cgroup's job.
    pub jobs: JobRules,
    /// Send metrics and events to a collector (None: print only).
    pub pipeline: Option<PipelineOptions>,
    /// Send the verb counters of this recording instead of the probes' (see
    /// `recorded_counts`).
    pub verb_counts_from: Option<std::path::PathBuf>,
}

/// How often acknowledgements are taken and resends paced.
const DELIVER_EVERY: Duration = Duration::from_millis(250);
/// How long a stopping agent waits for its last frames to be acknowledged.
const STOP_WAIT: Duration = Duration::from_secs(3);

pub async fn run(options: AgentOptions) -> anyhow::Result<()> {
    let attach = families::kernel_attach(options.kernel.clone());
    run_with(options, attach).await
}

/// [`run`] with the given way to attach a family (a stand-in in tests).
async fn run_with(options: AgentOptions, attach: AttachFn) -> anyhow::Result<()> {
    // Handlers first: a stop request during the first attach must still stop us cleanly.
    let mut stop = StopSignals::install()?;
    let clock = TimeBase::global();
    let mut cgroups = CgroupNames::new(options.kernel.sys_root().join("fs/cgroup"))
        .with_jobs(options.jobs.clone());
    let mut ports = PortStates::default();
    let (records_tx, mut records_rx) = mpsc::channel::<RingRecord>(4096);
    let mut pipeline = options.pipeline.as_ref().map(Pipeline::start).transpose()?;
    let mut jobs = job_ends::JobEnds::default();
    let mut devices = device_ends::DeviceEnds::default();
    let mut recorded = options
        .verb_counts_from
        .as_ref()
        .map(recorded_counts::RecordedCounts::new);
    // The first attempts run on blocking threads; the probe table is printed when they are in.
    let mut families = Families::start(options.kernel.clone(), attach, records_tx);

    let mut rescan = tokio::time::interval(options.rescan);
    let mut last_rescan = std::time::Instant::now();
    let sweeps_pace_rescans = pipeline
        .as_ref()
        .is_some_and(|p| p.interval <= options.rescan);
    rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut counters = tokio::time::interval(options.counters_every.unwrap_or(Duration::MAX / 4));
    counters.tick().await; // the first tick is immediate: skip it
    let flush_every = pipeline
        .as_ref()
        .map_or(Duration::MAX / 4, |p| p.flush_every);
    let mut flush = tokio::time::interval(flush_every);
    flush.tick().await;
    // Acknowledgements taken and what the collectors lack sent again, paced.
    let mut deliver = tokio::time::interval(DELIVER_EVERY);
    deliver.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Under systemd: ready once every family's first attach attempt is in, and a watchdog
    // ping from this loop, so a loop that stops turning gets the agent restarted.
    let mut service = ServiceManager::from_env();
    let mut watchdog = tokio::time::interval(service.ping_every().unwrap_or(Duration::MAX / 4));
    loop {
        tokio::select! {
            _ = stop.recv() => break,
            Some(record) = records_rx.recv() => {
                on_record(&record, &families, &mut cgroups, &mut ports, pipeline.as_mut(), options.format);
            }
            attempt = families.next_attempt() => {
                families.on_attempt(attempt);
                if families.started() && !service.is_ready() {
                    service.ready("probes attached where their modules are loaded");
                }
            }
            _ = watchdog.tick(), if service.ping_every().is_some() => service.alive(),
            // With a pipeline that reads at least as often as the rescan interval, its sweeps
            // pace the rescans (one wake-up a second, not two).
            _ = rescan.tick(), if !sweeps_pace_rescans => {
                last_rescan = std::time::Instant::now();
                clock.refresh();
                families.rescan();
                if pipeline.is_none() {
                    let raw = families.counts();
                    job_ends::end_jobs(&mut jobs, &raw, &mut families, &mut cgroups, None);
                    device_ends::end_devices(&mut devices, &raw, &mut families, None, monotonic_ns());
                }
            }
            polled = next_polled(&mut pipeline) => match polled {
                Polled::Samples(samples) => {
                    if last_rescan.elapsed() >= options.rescan {
                        last_rescan = std::time::Instant::now();
                        families.rescan();
                    }
                    // The sampler runs on the monotonic clock (the poller refreshed the time
                    // base at this sweep); the pipeline converts what it sends.
                    let now = monotonic_ns();
                    let raw = families.counts();
                    let counts = match recorded.as_mut() {
                        Some(recorded) => recorded.read(),
                        None => decode::decode_counts(&raw, &families.names, &mut cgroups),
                    };
                    if let Some(p) = pipeline.as_mut() {
                        p.on_samples(&samples);
                        p.on_readings(&pipeline::verb_readings(&counts, now));
                    }
                    // The counts just read are the final ones of jobs that end now.
                    job_ends::end_jobs(&mut jobs, &raw, &mut families, &mut cgroups, pipeline.as_mut());
                    device_ends::end_devices(&mut devices, &raw, &mut families, pipeline.as_mut(), now);
                    if let Some(p) = pipeline.as_mut() {
                        p.forget_stale();
                        let report = StateReport::take(&families, &jobs, &devices, &cgroups, Some(p));
                        p.on_readings(&report.readings(now));
                    }
                }
                Polled::Ended(series) => {
                    if let Some(p) = pipeline.as_mut() {
                        p.retire(&series);
                    }
                }
                Polled::Gpu(event) => {
                    let mut out = std::io::stdout().lock();
                    let _ = write_gpu_event(&mut out, &event, options.format).and_then(|()| out.flush());
                    if let Some(p) = pipeline.as_mut() {
                        p.on_event(pipeline::gpu_event(&event));
                    }
                }
            },
            _ = flush.tick(), if pipeline.is_some() => {
                if let Some(p) = pipeline.as_mut() {
                    p.flush();
                }
            }
            // Only while frames wait for an acknowledgement (about a second after each flush
            // when the collectors answer): an agent with nothing in flight does not wake up.
            _ = deliver.tick(), if pipeline.as_ref().is_some_and(|p| p.undelivered() > 0) => {
                if let Some(p) = pipeline.as_mut() {
                    p.deliver();
                }
            }
            _ = counters.tick(), if options.counters_every.is_some() => {
                print_counts(&families, &mut cgroups, options.format);
            }
        }
    }
    service.stopping();
    tracing::info!(
        "stopping; state: {}",
        StateReport::take(&families, &jobs, &devices, &cgroups, pipeline.as_ref())
    );
    // What the probes wrote since the last drain is still in the ring buffers: each reader
    // drains its buffer once more and ends, and those events go out like any other.
    families.stop_readers().await;
    while let Ok(record) = records_rx.try_recv() {
        on_record(
            &record,
            &families,
            &mut cgroups,
            &mut ports,
            pipeline.as_mut(),
            options.format,
        );
    }
    if let Some(p) = pipeline.as_mut() {
        p.flush_all();
        // Give the sender a moment to hand the last frames to the kernel, and the collectors
        // a moment to acknowledge them (they do within about a second of receipt).
        tokio::time::sleep(Duration::from_millis(100)).await;
        let waited = std::time::Instant::now();
        while p.undelivered() > 0 && waited.elapsed() < STOP_WAIT {
            tokio::time::sleep(DELIVER_EVERY).await;
            p.deliver();
        }
        if p.undelivered() > 0 {
            tracing::warn!(
                "stopping with {} frames no collector acknowledged yet",
                p.undelivered()
            );
        }
        // They stay in the spool file, for the next start.
        p.persist_spool();
        for (collector, stats) in p.sender_stats() {
            tracing::info!("to {collector}: {stats}");
        }
    }
    if options.counters_every.is_some() {
        // A last snapshot, so a run's totals are on record.
        print_counts(&families, &mut cgroups, options.format);
    }
    families.abort_readers();
    Ok(())
}

async fn next_polled(pipeline: &mut Option<Pipeline>) -> Polled {
    match pipeline {
        Some(p) => p.next().await,
        None => std::future::pending().await,
    }
}

fn print_counts(families: &Families, cgroups: &mut CgroupNames, format: OutputFormat) {
    let counts = decode::decode_counts(&families.counts(), &families.names, cgroups);
    if counts.is_empty() {
        return;
    }
    let snapshot = TimeBase::global().now_unix_ns().0;
    let mut out = std::io::stdout().lock();
    let _ = write_counts(&mut out, &counts, snapshot, format).and_then(|()| out.flush());
}

/// A record from a family's ring buffer: a new cgroup's notice (named now, while it exists)
/// or an event, printed and sent.
fn on_record(
    record: &RingRecord,
    families: &Families,
    cgroups: &mut CgroupNames,
    ports: &mut PortStates,
    pipeline: Option<&mut Pipeline>,
    format: OutputFormat,
) {
    if Origin::from_u32(record.record.origin) == Some(Origin::NewCgroup) {
        let name = cgroups.name(record.record.cgroup);
        tracing::trace!(cgroup = record.record.cgroup, %name, "new cgroup named");
        return;
    }
    let event = families.decode(record, TimeBase::global(), cgroups);
    report_event(&event, ports, pipeline, format);
}

/// Prints an event (and the port transition it makes, if any) and sends both to the
/// collector.
fn report_event(
    event: &ProbeEvent,
    ports: &mut PortStates,
    pipeline: Option<&mut Pipeline>,
    format: OutputFormat,
) {
    let transition = ports.observe(event);
    if let Some(p) = pipeline {
        p.on_event(ib_wire_event(event));
        if let Some(t) = &transition {
            p.on_event(transition_wire_event(t));
        }
    }
    let mut out = std::io::stdout().lock();
    // A closed stdout (the reader went away) is not a reason to stop monitoring.
    let _ = write_event(&mut out, event, format)
        .and_then(|()| match &transition {
            Some(t) => write_transition(&mut out, t, format),
            None => Ok(()),
        })
        .and_then(|()| out.flush());
}
