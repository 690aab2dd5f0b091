//! The agent's own state, reported: how many entries each bounded table holds, the agent's
//! resident memory, and how often a bound was hit. Sent with the samples (so a collector sees
//! a node whose agent grows or drops) and logged at stop.
//!
//! - `railscope_agent_entries{table}` (gauge): `verb_keys` (keys in the probes'
//!   `VERB_COUNTS`), `verb_series` and `encoder_series` (series the loop's sampler and the
//!   frame encoder know), `device_names` (entries in the probes' `DEVICE_NAMES`),
//!   `cgroup_names`, `cgroup_gone`, `jobs_ending` (gone, in the grace period),
//!   `spool_frames` and `spool_bytes` (frames kept until the collectors acknowledge them);
//! - `railscope_agent_rss_bytes` (gauge);
//! - `railscope_agent_bound_hits_total{bound}` (counter): `verb_counts_map_full`,
//!   `event_ring_full`, `device_names_map_full` (from the probes' `PROBE_STATS`),
//!   `cgroup_names_evicted`,
//!   `encoder_series_limit`, `encoder_pending_limit` (samples dropped), `late_verb_counts`
//!   (counted in a job's cgroup after its end), `spool_full` and `spool_age` (frames the
//!   spool evicted unacknowledged, at its byte bound or its age limit), `acks_refused`
//!   (acknowledgements that could not be right: forged, another node's, of frames never
//!   sent), and `jobs_ended`, `devices_removed`, `frames_resent`, `resend_slowdowns` and
//!   `frames_restored` (not bounds: the jobs and devices whose state was released, the frames
//!   sent again, the times resends were lost again and their pace halved, the frames a
//!   previous run left in the spool file, taken back at start).

use std::{fmt, sync::LazyLock};

use monitor_wire::{Kind, Labels, Reading, Series, Value, names::metric};

use super::{device_ends::DeviceEnds, job_ends::JobEnds};
use crate::probes::families::Families;
use crate::{cgroup::CgroupNames, pipeline::Pipeline, time_base::MonoNs};

/// One look at the agent's state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct StateReport {
    pub verb_keys: u64,
    pub verb_series: u64,
    pub encoder_series: u64,
    pub device_names: u64,
    pub cgroup_names: u64,
    pub cgroup_gone: u64,
    pub jobs_ending: u64,
    pub spool_frames: u64,
    pub spool_bytes: u64,
    pub rss_bytes: u64,
    pub verb_counts_map_full: u64,
    pub event_ring_full: u64,
    pub device_names_map_full: u64,
    pub cgroup_names_evicted: u64,
    pub encoder_series_limit: u64,
    pub encoder_pending_limit: u64,
    pub late_verb_counts: u64,
    pub jobs_ended: u64,
    pub devices_removed: u64,
    pub spool_full: u64,
    pub spool_age: u64,
    pub acks_refused: u64,
    pub frames_resent: u64,
    pub resend_slowdowns: u64,
    pub frames_restored: u64,
}

impl StateReport {
    pub(super) fn take(
        families: &Families,
        jobs: &JobEnds,
        devices: &DeviceEnds,
        cgroups: &CgroupNames,
        pipeline: Option<&Pipeline>,
    ) -> Self {
        let verb_keys = families.count_keys();
        let losses = families.losses();
        let names = cgroups.stats();
        let (verb_series, encoder_series) = pipeline.map_or((0, 0), Pipeline::series_counts);
        let encoder = pipeline.map(Pipeline::encoder_stats).unwrap_or_default();
        let spool = pipeline.map(Pipeline::spool_stats).unwrap_or_default();
        Self {
            verb_keys,
            verb_series: verb_series as u64,
            encoder_series: encoder_series as u64,
            device_names: families.device_entries(),
            cgroup_names: names.names as u64,
            cgroup_gone: names.gone as u64,
            jobs_ending: jobs.pending() as u64,
            spool_frames: pipeline.map_or(0, |p| p.undelivered() as u64),
            spool_bytes: pipeline.map_or(0, |p| p.spool_bytes() as u64),
            rss_bytes: rss_bytes().unwrap_or(0),
            verb_counts_map_full: losses.counts,
            event_ring_full: losses.events,
            device_names_map_full: losses.device_names,
            cgroup_names_evicted: names.evicted,
            encoder_series_limit: encoder.refused_series_samples,
            encoder_pending_limit: encoder.dropped_samples,
            late_verb_counts: jobs.stats().late_counts,
            jobs_ended: jobs.stats().ended,
            devices_removed: devices.ended,
            spool_full: spool.evicted_full,
            spool_age: spool.evicted_age,
            acks_refused: spool.acks_refused,
            frames_resent: spool.resent,
            resend_slowdowns: spool.resend_slowdowns,
            frames_restored: spool.restored,
        }
    }

    /// The report as readings taken at `now` (the sampler's clock).
    pub(super) fn readings(&self, now: MonoNs) -> Vec<Reading> {
        SERIES
            .iter()
            .zip(self.values())
            .map(|(series, value)| Reading {
                series: series.clone(),
                value: Value::U64(value),
                unix_ns: now.0,
            })
            .collect()
    }

    /// The values of [`REPORTED`]'s series, in its order.
    fn values(&self) -> [u64; REPORTED.len()] {
        [
            self.verb_keys,
            self.verb_series,
            self.encoder_series,
            self.device_names,
            self.cgroup_names,
            self.cgroup_gone,
            self.jobs_ending,
            self.spool_frames,
            self.spool_bytes,
            self.rss_bytes,
            self.verb_counts_map_full,
            self.event_ring_full,
            self.device_names_map_full,
            self.cgroup_names_evicted,
            self.encoder_series_limit,
            self.encoder_pending_limit,
            self.late_verb_counts,
            self.jobs_ended,
            self.devices_removed,
            self.spool_full,
            self.spool_age,
            self.acks_refused,
            self.frames_resent,
            self.resend_slowdowns,
            self.frames_restored,
        ]
    }
}

/// A series of the report: metric, label, kind.
type Reported = (&'static str, Option<(&'static str, &'static str)>, Kind);

const fn entries(table: &'static str) -> Reported {
    (metric::AGENT_ENTRIES, Some(("table", table)), Kind::Gauge)
}

const fn hits(bound: &'static str) -> Reported {
    (
        metric::AGENT_BOUND_HITS_TOTAL,
        Some(("bound", bound)),
        Kind::Counter,
    )
}

/// The series of the report.
const REPORTED: [Reported; 25] = [
    entries("verb_keys"),
    entries("verb_series"),
    entries("encoder_series"),
    entries("device_names"),
    entries("cgroup_names"),
    entries("cgroup_gone"),
    entries("jobs_ending"),
    entries("spool_frames"),
    entries("spool_bytes"),
    (metric::AGENT_RSS_BYTES, None, Kind::Gauge),
    hits("verb_counts_map_full"),
    hits("event_ring_full"),
    hits("device_names_map_full"),
    hits("cgroup_names_evicted"),
    hits("encoder_series_limit"),
    hits("encoder_pending_limit"),
    hits("late_verb_counts"),
    hits("jobs_ended"),
    hits("devices_removed"),
    hits("spool_full"),
    hits("spool_age"),
    hits("acks_refused"),
    hits("frames_resent"),
    hits("resend_slowdowns"),
    hits("frames_restored"),
];

/// [`REPORTED`] as series, built once: the agent reports every second, and building them
/// anew each time was a good share of its allocations.
static SERIES: LazyLock<Vec<Series>> = LazyLock::new(|| {
    REPORTED
        .iter()
        .map(|&(name, label, kind)| Series {
            name: name.into(),
            labels: Labels::new(label),
            kind,
        })
        .collect()
});

/// `verb_keys=3 verb_series=12 ...`: the line the agent logs at stop, each value named as
/// its series' label names it (`rss_bytes` for the one without).
impl fmt::Display for StateReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, ((_, label, _), value)) in REPORTED.iter().zip(self.values()).enumerate() {
            let name = label.map_or("rss_bytes", |(_, name)| name);
            write!(f, "{}{name}={value}", if i == 0 { "" } else { " " })?;
        }
        Ok(())
    }
}

/// The agent's resident memory, from `/proc/self/statm` (kept open: it is read every
/// second, and one `pread` costs less than opening, reading and closing it).
fn rss_bytes() -> Option<u64> {
    static STATM: LazyLock<Option<std::fs::File>> =
        LazyLock::new(|| std::fs::File::open("/proc/self/statm").ok());
    let mut buf = [0u8; 128];
    let n = std::os::unix::fs::FileExt::read_at(STATM.as_ref()?, &mut buf, 0).ok()?;
    let statm = std::str::from_utf8(&buf[..n]).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no memory effects.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use monitor_wire::names::AGENT_METRICS;

    #[test]
    fn the_state_report_sends_only_names_of_agent_metrics() {
        assert!(rss_bytes().is_some_and(|b| b > 0));
        let names: std::collections::BTreeSet<String> = StateReport::default()
            .readings(MonoNs(1))
            .into_iter()
            .map(|r| r.series.name.to_string())
            .collect();
        for n in &names {
            assert!(AGENT_METRICS.contains(&n.as_str()), "{n}");
        }
        // Each value goes with its own series.
        let report = StateReport {
            spool_bytes: 3,
            rss_bytes: 5,
            frames_restored: 7,
            ..StateReport::default()
        };
        let value_of = |name: &str, label: Option<(&str, &str)>| {
            let series = Series {
                name: name.into(),
                labels: Labels::new(label),
                kind: Kind::Gauge,
            };
            report
                .readings(MonoNs(1))
                .into_iter()
                .find(|r| r.series.name == series.name && r.series.labels == series.labels)
                .map(|r| r.value)
        };
        assert_eq!(
            value_of(metric::AGENT_ENTRIES, Some(("table", "spool_bytes"))),
            Some(Value::U64(3))
        );
        assert_eq!(value_of(metric::AGENT_RSS_BYTES, None), Some(Value::U64(5)));
        // The line logged at stop names each value as its series does.
        let line = report.to_string();
        assert!(line.starts_with("verb_keys=0 verb_series=0 "), "{line}");
        for named in ["spool_bytes=3", "rss_bytes=5", "frames_restored=7"] {
            assert!(line.split(' ').any(|w| w == named), "{named}: {line}");
        }
        assert_eq!(
            value_of(
                metric::AGENT_BOUND_HITS_TOTAL,
                Some(("bound", "frames_restored"))
            ),
            Some(Value::U64(7))
        );
        for n in [
            metric::AGENT_ENTRIES,
            metric::AGENT_RSS_BYTES,
            metric::AGENT_BOUND_HITS_TOTAL,
        ] {
            assert!(names.contains(n), "{n}");
        }
    }
}
