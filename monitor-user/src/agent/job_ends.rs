//! The end of a job's counters. A job is a cgroup; once its cgroup is gone no task can count
//! in it again, so after a grace period (for a resource an exiting task still frees) its
//! verb counters hold their final values. The agent then sends them, deletes the job's keys
//! from `VERB_COUNTS`, and forgets the job in the samplers, the encoder and the cgroup names.
//!
//! An ended job is remembered (bounded, for [`crate::cgroup::GONE_LIFETIME`]): keys of it that
//! show up again were counted after its end; they are deleted and counted as late, never sent
//! as a new series.

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use crate::probes::families::Families;
use crate::{
    cgroup::{CgroupNames, GONE_LIFETIME, MAX_GONE},
    pipeline::{Pipeline, VERB_SERIES},
    probes::RawCount,
};

/// How long a cgroup must have been gone before its counters are final: a task that is
/// exiting may still free its RDMA resources (counted in its cgroup) for a moment.
pub(super) const GRACE: Duration = Duration::from_secs(2);

/// Jobs whose cgroup is gone, waiting for the grace period, and jobs that ended.
#[derive(Debug, Default)]
pub(super) struct JobEnds {
    gone_since: HashMap<u64, Instant>,
    ended: HashMap<u64, Instant>,
    stats: JobEndStats,
}

/// What [`JobEnds`] did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct JobEndStats {
    /// Jobs whose final counters were sent and keys deleted.
    pub ended: u64,
    /// Verb counts made in a job's cgroup after its end (deleted, not sent).
    pub late_counts: u64,
}

/// What a sweep found.
#[derive(Debug, Default)]
pub(super) struct Sweep {
    /// Jobs that end now: their counters as just read are final.
    pub ended: HashSet<u64>,
    /// Jobs that had ended before and counted again: their keys are to be deleted.
    pub late: HashSet<u64>,
}

impl Sweep {
    pub(super) fn is_empty(&self) -> bool {
        self.ended.is_empty() && self.late.is_empty()
    }

    /// Every cgroup whose keys are to be deleted.
    pub(super) fn to_delete(&self) -> HashSet<u64> {
        self.ended.union(&self.late).copied().collect()
    }
}

impl JobEnds {
    pub(super) fn stats(&self) -> JobEndStats {
        self.stats
    }

    /// Looks at the cgroups of the counters just read: which are gone, which have been gone
    /// for [`GRACE`] (ended now), which had ended before (late counts).
    pub(super) fn sweep(&mut self, counts: &[RawCount], cgroups: &mut CgroupNames) -> Sweep {
        let now = Instant::now();
        let mut sweep = Sweep::default();
        let mut late_counts = 0;
        let ids: HashSet<u64> = counts.iter().map(|c| c.key.cgroup).collect();
        for &id in &ids {
            if self.ended.contains_key(&id) {
                sweep.late.insert(id);
                late_counts += counts
                    .iter()
                    .filter(|c| c.key.cgroup == id)
                    .map(|c| c.value)
                    .sum::<u64>();
                continue;
            }
            if cgroups.is_gone(id) {
                let since = *self.gone_since.entry(id).or_insert(now);
                if now.duration_since(since) >= GRACE {
                    sweep.ended.insert(id);
                }
            }
        }
        if late_counts > 0 {
            self.stats.late_counts += late_counts;
            tracing::warn!(
                "{late_counts} verb counts made in {} job(s) after their cgroup was gone for \
                 {GRACE:?} are not sent ({} in total)",
                sweep.late.len(),
                self.stats.late_counts
            );
        }
        self.gone_since
            .retain(|id, _| ids.contains(id) && !sweep.ended.contains(id));
        if self.ended.len() + sweep.ended.len() > MAX_GONE {
            self.ended
                .retain(|_, t| now.duration_since(*t) < GONE_LIFETIME);
        }
        for &id in &sweep.ended {
            self.ended.insert(id, now);
        }
        self.stats.ended += sweep.ended.len() as u64;
        sweep
    }

    /// Jobs whose cgroup is gone and that wait for the grace period.
    pub(super) fn pending(&self) -> usize {
        self.gone_since.len()
    }
}

/// At a sweep, right after the counters were read and handed to the pipeline: ends the jobs
/// whose cgroup has been gone for [`GRACE`] (their last values, just read, are sent and their
/// series forgotten), deletes their keys and those of late counts from every family's
/// `VERB_COUNTS`, and forgets their names.
pub(super) fn end_jobs(
    jobs: &mut JobEnds,
    counts: &[RawCount],
    families: &mut Families,
    cgroups: &mut CgroupNames,
    pipeline: Option<&mut Pipeline>,
) {
    let sweep = jobs.sweep(counts, cgroups);
    if sweep.is_empty() {
        return;
    }
    let delete = sweep.to_delete();
    if let Some(p) = pipeline
        && !sweep.ended.is_empty()
    {
        // A path that a live cgroup also has (a job's cgroup made again under the same name)
        // keeps its series: its counters go on.
        let live: HashSet<String> = counts
            .iter()
            .map(|c| c.key.cgroup)
            .filter(|id| !delete.contains(id))
            .collect::<HashSet<u64>>()
            .into_iter()
            .map(|id| cgroups.name(id))
            .collect();
        let ended: HashSet<String> = sweep
            .ended
            .iter()
            .map(|&id| cgroups.name(id))
            .filter(|name| !live.contains(name))
            .collect();
        let series = p.end_series(|s| {
            s.name.as_ref() == VERB_SERIES
                && s.labels.get("cgroup").is_some_and(|c| ended.contains(c))
        });
        tracing::debug!(
            "{} job(s) ended: {series} series sent a last time",
            ended.len()
        );
    }
    let keys = families.remove_counts(&delete);
    for id in delete {
        cgroups.forget(id);
    }
    tracing::debug!("{keys} verb counter keys of ended jobs deleted");
}

#[cfg(test)]
mod tests {
    use super::*;
    use monitor_common::verbs::CounterKey;

    fn count(cgroup: u64, value: u64) -> RawCount {
        RawCount {
            device: "rxe0".into(),
            key: CounterKey {
                device: 1,
                cgroup,
                verb: 5,
                detail: 1,
            },
            value,
        }
    }

    /// On a directory that is not a cgroup2 mount the names are walked: an inode that is not
    /// a directory of it is a gone cgroup.
    #[test]
    fn a_gone_cgroup_ends_after_the_grace_period_and_late_counts_are_counted() {
        let dir = std::env::temp_dir().join(format!("railscope-jobs-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("live")).unwrap();
        let live =
            std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(dir.join("live")).unwrap());
        let gone = u64::MAX - 1;
        let mut cgroups = CgroupNames::new(&dir);
        let mut jobs = JobEnds::default();
        let counts = [count(live, 3), count(gone, 4)];
        let first = jobs.sweep(&counts, &mut cgroups);
        assert!(first.is_empty(), "gone, but within the grace period");
        assert_eq!(jobs.pending(), 1);
        // Pretend the grace period has passed.
        for t in jobs.gone_since.values_mut() {
            *t -= GRACE;
        }
        let second = jobs.sweep(&counts, &mut cgroups);
        assert_eq!(second.ended, HashSet::from([gone]));
        assert!(second.late.is_empty());
        assert_eq!(jobs.pending(), 0);
        // Its keys were deleted; one comes back: late, not a new job.
        let third = jobs.sweep(&[count(live, 3), count(gone, 2)], &mut cgroups);
        assert!(third.ended.is_empty());
        assert_eq!(third.late, HashSet::from([gone]));
        assert_eq!(
            jobs.stats(),
            JobEndStats {
                ended: 1,
                late_counts: 2
            }
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
