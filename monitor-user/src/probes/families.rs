//! The probe families at run time (in the agent and in `railscope capture`): each attached when its kernel module is present, retried
//! while it is not, detached when the module goes away, with a reader task per attached family
//! draining its ring buffer.
//!
//! Attaching (BTF, loading the object, the verifier) blocks for a while, so it runs on a
//! blocking thread and its result comes back to the loop through a channel: the loop, the
//! event readers and the sender keep their pace meanwhile. A family whose module is present
//! but that fails to attach is retried after 1 s, then 2 s, 4 s, ... up to a minute; one whose
//! module appears or is loaded again is retried at the next rescan.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::{
    sync::{mpsc, oneshot},
    task::JoinHandle,
};

use super::{
    AttachedFamily, Family, FamilyUnavailable, ProbeLosses, ProbeReport, RawCount, RemovedDevice,
    Status, Unavailable,
    btf_cache::BtfCache,
    decode::ProbeEvent,
    names::KernelNames,
    render_table,
    ring::{DrainPace, RingRecord, read_events},
    unnamed_device,
};
use crate::{
    cgroup::CgroupNames,
    kernel::{FileIdentity, Kernel},
    time_base::TimeBase,
};

/// The first wait before a family that failed to attach is tried again; it doubles at each
/// failure up to [`RETRY_CAP`].
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_CAP: Duration = Duration::from_secs(60);

/// Attaches a family (blocking): [`AttachedFamily::attach`] in the agent, a stand-in in tests.
pub(crate) type AttachFn =
    Arc<dyn Fn(Family) -> Result<AttachedFamily, Box<FamilyUnavailable>> + Send + Sync>;

/// The attach the agent uses: the real kernel, BTF parsed once and shared by every attempt.
pub(crate) fn kernel_attach(kernel: Kernel) -> AttachFn {
    let btfs = BtfCache::new(kernel.clone());
    Arc::new(move |family| AttachedFamily::attach(family, &kernel, &btfs))
}

/// The result of one attempt to attach a family, handed back to the loop.
pub(crate) struct Attempt {
    family: Family,
    /// Which load of the module the attempt saw.
    module: Option<FileIdentity>,
    result: Result<AttachedFamily, Box<FamilyUnavailable>>,
}

/// When a family that failed to attach is tried again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Backoff {
    delay: Duration,
    next: Option<Instant>,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            delay: RETRY_FIRST,
            next: None,
        }
    }
}

impl Backoff {
    /// An attempt failed at `now`: the next one waits the current delay, which then doubles.
    pub(crate) fn failed(&mut self, now: Instant) {
        self.next = Some(now + self.delay);
        self.delay = (self.delay * 2).min(RETRY_CAP);
    }

    pub(crate) fn due(&self, now: Instant) -> bool {
        self.next.is_none_or(|at| now >= at)
    }

    pub(crate) fn delay(&self) -> Duration {
        self.delay
    }
}

/// A family's state in the agent.
pub(crate) enum FamilyState {
    Unavailable {
        reason: String,
        /// The load of the module the last attempt saw (None: not loaded): another load is
        /// tried at once.
        module: Option<FileIdentity>,
        retry: Backoff,
    },
    /// An attempt runs on a blocking thread.
    Attaching {
        /// What the family was before, to log only what changed.
        reason: Option<String>,
        retry: Backoff,
    },
    Attached {
        attached: Box<AttachedFamily>,
        module: Option<FileIdentity>,
        reader: JoinHandle<()>,
        /// Tells the reader to drain its ring buffer one last time and end.
        stop: Option<oneshot::Sender<()>>,
        drains: Arc<DrainPace>,
        reported_losses: ProbeLosses,
    },
}

/// Every probe family, its state, and the names their BTF gave.
pub(crate) struct Families {
    kernel: Kernel,
    attach: AttachFn,
    records: mpsc::Sender<RingRecord>,
    attempts_tx: mpsc::Sender<Attempt>,
    attempts: mpsc::Receiver<Attempt>,
    states: Vec<(Family, FamilyState)>,
    /// Enum names (event types, QP states, ...) from every attached family's BTF.
    pub names: KernelNames,
    /// The probe table's rows while the first attempts are still running.
    table: Option<Vec<ProbeReport>>,
}

impl Families {
    /// Starts a first attempt for every family; the probe table is printed (to stderr) when
    /// all of them are in.
    pub(crate) fn start(
        kernel: Kernel,
        attach: AttachFn,
        records: mpsc::Sender<RingRecord>,
    ) -> Self {
        let (attempts_tx, attempts) = mpsc::channel(Family::ALL.len());
        let mut families = Self {
            kernel,
            attach,
            records,
            attempts_tx,
            attempts,
            states: Vec::new(),
            names: KernelNames::default(),
            table: Some(Vec::new()),
        };
        for family in Family::ALL {
            let module = families.kernel.module_identity(family.module());
            families.spawn_attempt(family, module);
            families.states.push((
                family,
                FamilyState::Attaching {
                    reason: None,
                    retry: Backoff::default(),
                },
            ));
        }
        families
    }

    /// Whether every family's first attempt is in (the probe table is printed).
    pub(crate) fn started(&self) -> bool {
        self.table.is_none()
    }

    fn spawn_attempt(&self, family: Family, module: Option<FileIdentity>) {
        let (attach, done) = (Arc::clone(&self.attach), self.attempts_tx.clone());
        tokio::task::spawn_blocking(move || {
            let result = attach(family);
            // The loop stopped meanwhile: dropping the result detaches the family.
            let _ = done.blocking_send(Attempt {
                family,
                module,
                result,
            });
        });
    }

    /// The next attempt that finished.
    pub(crate) async fn next_attempt(&mut self) -> Attempt {
        match self.attempts.recv().await {
            Some(attempt) => attempt,
            // Never: `self` holds a sender.
            None => std::future::pending().await,
        }
    }

    /// Takes an attempt's result: the family attached (its reader started), or unavailable
    /// with the reason and a time for the next try.
    pub(crate) fn on_attempt(&mut self, attempt: Attempt) {
        let Attempt {
            family,
            module,
            result,
        } = attempt;
        let Some(index) = self.states.iter().position(|(f, _)| *f == family) else {
            return;
        };
        let (previous, mut retry) = match &self.states[index].1 {
            FamilyState::Attaching { reason, retry } => (reason.clone(), *retry),
            _ => return, // not asked for (cannot happen): dropping it detaches it
        };
        let at_start = self.table.is_some();
        let now_loaded = self.kernel.module_identity(family.module());
        let (state, rows) = match result {
            Ok(attached) if now_loaded == module => {
                self.names.merge(&attached.names);
                start_reader(family, attached, module, &self.records)
            }
            Ok(attached) => {
                // The module went away or was loaded again while we attached: drop this
                // one (it detaches), the next rescan attaches to the new load at once.
                let reason = format!("{} changed while attaching", family.module());
                let rows = attached.statuses.clone();
                detach_off_loop(attached);
                (
                    FamilyState::Unavailable {
                        reason,
                        module: None,
                        retry: Backoff::default(),
                    },
                    rows,
                )
            }
            Err(unavailable) => {
                let FamilyUnavailable { reason, rows } = *unavailable;
                if module.is_some() {
                    retry.failed(Instant::now());
                }
                (
                    FamilyState::Unavailable {
                        reason: unavailable_reason(reason, &rows),
                        module,
                        retry,
                    },
                    rows,
                )
            }
        };
        match &state {
            FamilyState::Unavailable { reason, .. } if previous.as_ref() == Some(reason) => {
                tracing::debug!(
                    "{} still unavailable, next try in {:?}: {reason}",
                    family.module(),
                    retry.delay()
                );
            }
            _ => log_state(family, &state, &rows, at_start),
        }
        self.states[index].1 = state;
        if let Some(table) = self.table.as_mut() {
            table.extend(rows);
            if self
                .states
                .iter()
                .all(|(_, s)| !matches!(s, FamilyState::Attaching { .. }))
            {
                let mut table = self.table.take().unwrap_or_default();
                // In the catalogue's order, whatever order the attempts finished in.
                table.sort_by_key(|row| {
                    super::CATALOGUE.iter().position(|p| p.program == row.probe)
                });
                eprint!("{}", render_table(&table));
            }
        }
    }

    /// Looks at every family's module: one that appeared or was loaded again is attached at
    /// once, one that failed is retried when its backoff is due, one whose module went away
    /// is detached. Reports what the attached ones lost to full maps.
    pub(crate) fn rescan(&mut self) {
        let now = Instant::now();
        let mut attempts = Vec::new();
        for (family, state) in &mut self.states {
            let family = *family;
            let loaded = self.kernel.module_identity(family.module());
            match state {
                FamilyState::Unavailable {
                    reason,
                    module,
                    retry,
                } => {
                    let Some(present) = loaded else {
                        *module = None; // still missing: nothing new to say
                        continue;
                    };
                    if *module != Some(present) {
                        *retry = Backoff::default(); // appeared, or loaded again
                    } else if !retry.due(now) {
                        continue;
                    }
                    attempts.push((family, loaded));
                    *state = FamilyState::Attaching {
                        reason: Some(std::mem::take(reason)),
                        retry: *retry,
                    };
                }
                FamilyState::Attaching { .. } => {}
                FamilyState::Attached {
                    attached,
                    module,
                    reader,
                    drains,
                    reported_losses,
                    ..
                } => {
                    if loaded != *module || reader.is_finished() {
                        reader.abort();
                        drains.log(family);
                        let reason = match loaded {
                            None => format!(
                                "{} unloaded: {} inactive",
                                family.module(),
                                family.feature()
                            ),
                            Some(_) => format!("{} loaded again: attaching anew", family.module()),
                        };
                        tracing::warn!("{reason}");
                        let next = if loaded.is_some() {
                            attempts.push((family, loaded));
                            FamilyState::Attaching {
                                reason: Some(reason),
                                retry: Backoff::default(),
                            }
                        } else {
                            FamilyState::Unavailable {
                                reason,
                                module: None,
                                retry: Backoff::default(),
                            }
                        };
                        detach_off_loop(std::mem::replace(state, next));
                        continue;
                    }
                    report_losses(family, attached, reported_losses);
                }
            }
        }
        for (family, module) in attempts {
            self.spawn_attempt(family, module);
        }
    }

    /// Every attached family's raw counters.
    pub(crate) fn counts(&self) -> Vec<RawCount> {
        self.attached().flat_map(|(_, a)| a.counts()).collect()
    }

    /// What every attached family's probes could not deliver.
    pub(crate) fn losses(&self) -> ProbeLosses {
        self.attached()
            .map(|(_, a)| a.losses())
            .fold(ProbeLosses::default(), |sum, l| sum + l)
    }

    /// Devices freed in the kernel that some family still names, with the family.
    pub(crate) fn removed_devices(&self) -> Vec<(Family, RemovedDevice)> {
        self.attached()
            .flat_map(|(f, a)| a.removed_devices().into_iter().map(move |d| (f, d)))
            .collect()
    }

    /// Forgets a removed device in one family (its counters and its name); returns how many
    /// counter keys went.
    pub(crate) fn remove_device(&mut self, family: Family, device: u64) -> usize {
        self.states
            .iter_mut()
            .filter(|(f, _)| *f == family)
            .filter_map(|(_, s)| match s {
                FamilyState::Attached { attached, .. } => Some(attached.remove_device(device)),
                _ => None,
            })
            .sum()
    }

    /// Entries in every attached family's `DEVICE_NAMES`.
    pub(crate) fn device_entries(&self) -> u64 {
        self.attached()
            .map(|(_, a)| a.device_entries() as u64)
            .sum()
    }

    /// Keys in every attached family's `VERB_COUNTS`.
    pub(crate) fn count_keys(&self) -> u64 {
        self.attached().map(|(_, a)| a.count_keys() as u64).sum()
    }

    /// Deletes the counter keys of these cgroups from every attached family's `VERB_COUNTS`;
    /// returns how many keys went.
    pub(crate) fn remove_counts(&mut self, cgroups: &std::collections::HashSet<u64>) -> usize {
        self.states
            .iter_mut()
            .filter_map(|(_, s)| match s {
                FamilyState::Attached { attached, .. } => Some(attached.remove_counts(cgroups)),
                _ => None,
            })
            .sum()
    }

    fn attached(&self) -> impl Iterator<Item = (Family, &AttachedFamily)> {
        self.states.iter().filter_map(|(f, s)| match s {
            FamilyState::Attached { attached, .. } => Some((*f, attached.as_ref())),
            _ => None,
        })
    }

    /// A record as an event, its device named from the `DEVICE_NAMES` map of the family that
    /// sent it.
    pub(crate) fn decode(
        &self,
        RingRecord { family, record }: &RingRecord,
        clock: &TimeBase,
        cgroups: &mut CgroupNames,
    ) -> ProbeEvent {
        let device = self
            .attached()
            .find(|(f, _)| f == family)
            .map(|(_, a)| a.device_name(record.device))
            .unwrap_or_else(|| unnamed_device(record.device));
        ProbeEvent::decode(record, device, &self.names, clock, cgroups)
    }

    /// Asks every reader to drain its ring buffer once more and end, and waits (at most a
    /// second each) for them.
    pub(crate) async fn stop_readers(&mut self) {
        for (family, state) in &mut self.states {
            if let FamilyState::Attached {
                reader,
                stop,
                drains,
                ..
            } = state
            {
                if let Some(stop) = stop.take() {
                    let _ = stop.send(());
                }
                if tokio::time::timeout(Duration::from_secs(1), &mut *reader)
                    .await
                    .is_err()
                {
                    tracing::warn!("an event reader did not finish: its last events are lost");
                }
                drains.log(*family);
            }
        }
    }

    /// Ends what is left of the readers.
    pub(crate) fn abort_readers(self) {
        for (_, state) in self.states {
            if let FamilyState::Attached { reader, .. } = state {
                reader.abort();
            }
        }
    }

    /// Whether a family is attached now, or why not (`None` while an attempt runs).
    pub(crate) fn status(&self, family: Family) -> Option<Result<(), String>> {
        match self.state(family)? {
            FamilyState::Attached { .. } => Some(Ok(())),
            FamilyState::Unavailable { reason, .. } => Some(Err(reason.clone())),
            FamilyState::Attaching { .. } => None,
        }
    }

    pub(crate) fn state(&self, family: Family) -> Option<&FamilyState> {
        self.states
            .iter()
            .find(|(f, _)| *f == family)
            .map(|(_, s)| s)
    }
}

/// The reason to report for a family that did not attach: when no probe attached, the first
/// probe's own reason says more than "nothing attached".
fn unavailable_reason(reason: Unavailable, rows: &[ProbeReport]) -> String {
    match reason {
        Unavailable::NothingAttached => rows
            .iter()
            .find_map(|r| match &r.status {
                Status::Unavailable(why) => Some(why.clone()),
                Status::Attached => None,
            })
            .unwrap_or_else(|| reason.to_string()),
        other => other.to_string(),
    }
}

fn report_losses(family: Family, attached: &AttachedFamily, reported: &mut ProbeLosses) {
    let losses = attached.losses();
    if losses.events > reported.events {
        tracing::warn!(
            "ring buffer full: {} events lost ({} in total, {})",
            losses.events - reported.events,
            losses.events,
            family.module()
        );
    }
    if losses.counts > reported.counts {
        tracing::warn!(
            "counter map full: {} verb counts lost ({} in total, {})",
            losses.counts - reported.counts,
            losses.counts,
            family.module()
        );
    }
    if losses.device_names > reported.device_names {
        tracing::warn!(
            "device name map full: {} device(s) left unnamed ({} in total, {})",
            losses.device_names - reported.device_names,
            losses.device_names,
            family.module()
        );
    }
    *reported = losses;
}

fn log_state(family: Family, state: &FamilyState, rows: &[ProbeReport], at_start: bool) {
    match state {
        FamilyState::Unavailable { reason, .. } => {
            let probes: Vec<&str> = rows.iter().map(|r| r.probe).collect();
            let when = if at_start {
                " (will attach when possible)"
            } else {
                ""
            };
            tracing::warn!("{} unavailable: {reason}{when}", probes.join(", "));
        }
        FamilyState::Attached { .. } => {
            for row in rows {
                match &row.status {
                    Status::Attached => tracing::info!("{} attached", row.probe),
                    Status::Unavailable(reason) => {
                        tracing::warn!("{} unavailable: {reason}", row.probe)
                    }
                }
            }
            tracing::debug!(?family, "family attached");
        }
        FamilyState::Attaching { .. } => {}
    }
}

/// Drops a detached family (its programs, links and maps) on a blocking thread. Closing a
/// kprobe's link unregisters it, which waits for RCU grace periods: hundreds of milliseconds
/// on a busy or emulated machine (the `attach-pace` scenario saw ib_core's drain pause 811 ms
/// on 6.12 while ib_uverbs' family was dropped on the loop), time the other families'
/// readers must not lose.
fn detach_off_loop(detached: impl Send + 'static) {
    tokio::task::spawn_blocking(move || drop(detached));
}

/// An attached family with its reader task started on the loop's runtime.
fn start_reader(
    family: Family,
    mut attached: AttachedFamily,
    module: Option<FileIdentity>,
    records: &mpsc::Sender<RingRecord>,
) -> (FamilyState, Vec<ProbeReport>) {
    let rows = attached.statuses.clone();
    let Some(ring) = attached.take_events() else {
        let state = FamilyState::Unavailable {
            reason: "event ring buffer missing".into(),
            module,
            retry: Backoff::default(),
        };
        return (state, rows);
    };
    let (stop, stopped) = oneshot::channel();
    let drains = Arc::new(DrainPace::default());
    let reader = tokio::spawn(read_events(
        family,
        ring,
        records.clone(),
        stopped,
        Arc::clone(&drains),
    ));
    let state = FamilyState::Attached {
        attached: Box::new(attached),
        module,
        reader,
        stop: Some(stop),
        drains,
        reported_losses: ProbeLosses::default(),
    };
    (state, rows)
}

#[cfg(test)]
mod tests;
