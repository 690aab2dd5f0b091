//! The actions' one place of decision ([`Actions`]): each pass (the worker's, every second)
//! takes the active findings, decides under one lock what to do about each (drain, join a
//! node already drained, hold at the brake, skip), writes each decision to the audit log
//! before anything is done, then asks Slurm outside the lock and records what it said. A node
//! railscope drained is resumed once every finding it was drained for has ended and the node
//! stayed clear for the hold time, and only if it still carries railscope's reason.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    path::Path,
    sync::{Arc, Mutex},
    thread::JoinHandle,
    time::Duration,
};

use serde_json::json;

use super::{
    audit::{Action, AuditError, AuditLog, Outcome, Record},
    config::{ActionRule, ActionsConfig, BRAKE_NODE, BRAKE_RULE},
    notify::{Deliver, Notifier, Target},
    slurm::{Scheduler, SlurmError, sanitize_reason},
    state::{ActionState, Phase},
};
use monitor_archive::lock::lock;
use monitor_findings::{
    Finding, FindingsStore, Observation, Severity, Subject, store::FindingFilter,
};

const S: u64 = 1_000_000_000;
/// Records the API shows (the log keeps them all).
const RECENT: usize = 1000;

/// The fields of a record the caller chooses; [`Actions`] numbers and times it.
struct Step<'a> {
    node: &'a str,
    action: Action,
    outcome: Outcome,
    finding: Option<&'a Finding>,
    finding_id: Option<&'a str>,
    rule: Option<&'a str>,
    dry_run: bool,
    reason: Option<&'a str>,
    detail: String,
    /// A webhook's URL, a command line, an Alertmanager.
    target: Option<&'a str>,
}

struct Inner {
    state: ActionState,
    log: Option<AuditLog>,
    recent: VecDeque<Record>,
    log_errors: u64,
    /// Whether a pass ran since start-up (the first one skips findings older than those
    /// already handled).
    passed: bool,
    /// Findings whose webhook or command is being tried now, on a thread of its own.
    in_flight: HashSet<String>,
}

/// A webhook's or command's try, as its thread hands it back to the next pass.
struct Delivered {
    finding: String,
    node: String,
    action: Action,
    target: String,
    /// Tries before this one, and how many the rule allows.
    attempts: u32,
    max_attempts: u32,
    result: Result<String, String>,
}

/// Something Slurm is to be asked, decided by a pass.
enum Job {
    Drain {
        node: String,
        reason: String,
        finding: String,
    },
    Resume {
        node: String,
        reason: String,
    },
    /// A webhook or a command, run on a thread of its own.
    Notify {
        finding: String,
        node: String,
        action: Action,
        target: Target,
        body: Vec<u8>,
        timeout: Duration,
        attempts: u32,
        max_attempts: u32,
    },
}

pub struct Actions {
    config: ActionsConfig,
    inner: Mutex<Inner>,
    notifier: Arc<dyn Notifier>,
    /// Tries finished since the last pass.
    delivered: Arc<Mutex<Vec<Delivered>>>,
    /// The threads of tries under way (joined by [`Actions::wait_deliveries`]).
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// What the Alertmanager senders counted, by URL (`/metrics`).
    pub alert_stats: super::alert_stats::AlertStats,
    /// The fleet the last pass's brake was a share of (the API shows the same limit).
    fleet: std::sync::atomic::AtomicUsize,
}

impl Actions {
    /// The actions of a data directory: its audit log replayed.
    pub fn open(dir: &Path, config: ActionsConfig) -> Result<Self, AuditError> {
        let (log, records) = AuditLog::open(dir)?;
        if !records.is_empty() {
            tracing::info!("actions audit log: {} records replayed", records.len());
        }
        Ok(Self::with(config, Some(log), records))
    }

    /// Actions without a log (unit tests).
    pub fn in_memory(config: ActionsConfig) -> Self {
        Self::with(config, None, Vec::new())
    }

    fn with(config: ActionsConfig, log: Option<AuditLog>, records: Vec<Record>) -> Self {
        let mut state = ActionState::default();
        for r in &records {
            state.apply(r, config.retry_max_s);
        }
        let skip = records.len().saturating_sub(RECENT);
        Self {
            inner: Mutex::new(Inner {
                state,
                log,
                recent: records.into_iter().skip(skip).collect(),
                log_errors: 0,
                passed: false,
                in_flight: HashSet::new(),
            }),
            alert_stats: super::alert_stats::AlertStats::new(&config),
            fleet: std::sync::atomic::AtomicUsize::new(0),
            config,
            notifier: Arc::new(Deliver),
            delivered: Arc::default(),
            threads: Mutex::default(),
        }
    }

    /// These actions delivering webhooks and commands through `notifier` (unit tests).
    pub fn with_notifier(mut self, notifier: Arc<dyn Notifier>) -> Self {
        self.notifier = notifier;
        self
    }

    /// Waits for the tries under way to finish (their outcomes are recorded by the next
    /// pass).
    pub fn wait_deliveries(&self) {
        let threads = std::mem::take(&mut *lock(&self.threads));
        for t in threads {
            let _ = t.join();
        }
    }

    pub fn config(&self) -> &ActionsConfig {
        &self.config
    }

    /// One pass at `now` (Unix ns), the collector holding `nodes_seen` nodes: decisions,
    /// then Slurm's calls, then the brake's finding.
    pub fn pass(&self, store: &FindingsStore, nodes_seen: usize, now: u64, slurm: &dyn Scheduler) {
        self.fleet
            .store(nodes_seen, std::sync::atomic::Ordering::Relaxed);
        self.record_deliveries(now);
        let jobs = self.decide(store, nodes_seen, now);
        for job in jobs {
            match job {
                Job::Notify { .. } => self.start_delivery(job),
                _ => self.run(job, now, slurm),
            }
        }
        self.report_brake(store, nodes_seen, now);
    }

    /// Starts a webhook's or command's try on a thread of its own: one that hangs until its
    /// timeout holds up nothing else.
    fn start_delivery(&self, job: Job) {
        let Job::Notify {
            finding,
            node,
            action,
            target,
            body,
            timeout,
            attempts,
            max_attempts,
        } = job
        else {
            return;
        };
        let notifier = self.notifier.clone();
        let delivered = self.delivered.clone();
        let started = std::thread::Builder::new()
            .name("actions-notify".into())
            .spawn(move || {
                let result = notifier.deliver(&target, &body, timeout);
                lock(&delivered).push(Delivered {
                    finding,
                    node,
                    action,
                    target: target.describe(),
                    attempts,
                    max_attempts,
                    result,
                });
            });
        let mut threads = lock(&self.threads);
        threads.retain(|t| !t.is_finished());
        match started {
            Ok(t) => threads.push(t),
            // Not started: tried again on the next pass.
            Err(e) => tracing::warn!("actions: cannot start a thread for a {action:?}: {e}"),
        }
    }

    /// Records the tries finished since the last pass.
    fn record_deliveries(&self, now: u64) {
        let done = std::mem::take(&mut *lock(&self.delivered));
        if done.is_empty() {
            return;
        }
        let mut inner = lock(&self.inner);
        for d in done {
            inner.in_flight.remove(&d.finding);
            let tries = d.attempts + 1;
            let (outcome, detail) = match d.result {
                Ok(said) => (Outcome::Done, format!("delivered ({said})")),
                Err(e) if tries >= d.max_attempts => (
                    Outcome::GaveUp,
                    format!("{e}: given up after {tries} tries"),
                ),
                Err(e) => (
                    Outcome::Failed,
                    format!(
                        "{e}: try {tries} of {}, tried again after a back-off",
                        d.max_attempts
                    ),
                ),
            };
            if outcome != Outcome::Done {
                tracing::warn!("{:?} for {}: {detail}", d.action, d.finding);
            }
            let step = Step {
                node: &d.node,
                target: Some(&d.target),
                action: d.action,
                outcome,
                finding: None,
                finding_id: Some(&d.finding),
                rule: None,
                dry_run: false,
                reason: None,
                detail,
            };
            self.record(&mut inner, step, now);
        }
    }

    /// Records an Alertmanager endpoint's change (failing, or sending again).
    pub fn record_alert(
        &self,
        url: &str,
        outcome: Outcome,
        dry_run: bool,
        detail: String,
        now: u64,
    ) {
        let mut inner = lock(&self.inner);
        let step = Step {
            node: BRAKE_NODE,
            target: Some(url),
            action: Action::Alert,
            outcome,
            finding: None,
            finding_id: None,
            rule: None,
            dry_run,
            reason: None,
            detail,
        };
        self.record(&mut inner, step, now);
    }

    fn decide(&self, store: &FindingsStore, nodes_seen: usize, now: u64) -> Vec<Job> {
        let c = &self.config;
        let mut active = store.active();
        active.sort_by(|a, b| (a.start, &a.id).cmp(&(b.start, &b.id)));
        let mut inner = lock(&self.inner);
        let first = !std::mem::replace(&mut inner.passed, true);
        for f in &active {
            let Some(rule) = c.rule_for(f) else { continue };
            if inner.state.handled.contains(&f.id) {
                continue;
            }
            // A port finding blamed on the fabric never drains its node; one whose port's
            // DOWN transitions are still being grouped waits (docs/actions.md).
            let upstream = f.evidence.get("upstream").and_then(|u| u.as_str());
            if upstream == Some("pending") {
                continue;
            }
            let dry_run = c.dry_run_of(rule);
            let target = notice_target(rule).map(|(_, t)| t.describe());
            let mut step = Step {
                node: &f.node,
                target: target.as_deref(),
                action: notice_target(rule).map_or(Action::Drain, |(a, _)| a),
                outcome: Outcome::Skipped,
                finding: Some(f),
                finding_id: Some(&f.id),
                rule: Some(&f.rule),
                dry_run,
                reason: None,
                detail: String::new(),
            };
            if let Some(id) = upstream {
                step.detail = format!(
                    "blamed on the fabric ({id}): a port of many nodes that went down at once \
                     drains no node"
                );
                self.record(&mut inner, step, now);
                continue;
            }
            if first && f.start < inner.state.watermark {
                step.detail = "older than the findings already handled: only a new finding \
                               acts on this node"
                    .into();
                self.record(&mut inner, step, now);
                continue;
            }
            // A webhook or a command: once per finding, whatever the node.
            if target.is_some() {
                if dry_run {
                    step.outcome = Outcome::Would;
                    step.detail = format!(
                        "dry run: would {} ({})",
                        if rule.action == "webhook" {
                            "POST the finding to it"
                        } else {
                            "run it with the finding on its stdin"
                        },
                        f.summary
                    );
                } else {
                    step.outcome = Outcome::Tried;
                }
                self.record(&mut inner, step, now);
                continue;
            }
            // A node railscope acts on keeps that action, unless that is a dry run and this
            // finding's rule acts for real: then it is drained (the dry run's findings join).
            if let Some(e) = inner
                .state
                .nodes
                .get(&f.node)
                .filter(|e| !e.dry_run || dry_run)
            {
                step.outcome = Outcome::Joined;
                // Said as the node is: a drain held by the brake is no drain yet.
                step.detail = match e.phase {
                    Phase::Drained { .. } => {
                        "the node is already railscope's: it stays drained for this finding too"
                    }
                    Phase::Draining { .. } => {
                        "railscope's drain of the node is under way: it is for this finding too"
                    }
                    Phase::Held { .. } => {
                        "railscope's drain of the node is held by the brake (the node is not \
                         drained): once released it is for this finding too"
                    }
                    Phase::Resuming { .. } => {
                        "railscope's resume of the node was under way: the node is drained \
                         again for this finding (left as it is if it still is)"
                    }
                }
                .into();
                self.record(&mut inner, step, now);
                continue;
            }
            let reason = sanitize_reason(&format!("railscope: {} {}", f.rule, f.id));
            step.reason = Some(&reason);
            let limit = c.brake_limit(nodes_seen);
            let drained = inner.state.drained_in_window(now, c.brake_window_s * S);
            if drained >= limit {
                step.outcome = Outcome::Held;
                step.detail = format!(
                    "brake: {drained} nodes drained by railscope in the last {} s, the limit \
                     is {limit} (brake-max-nodes {}, brake-max-percent {} of {nodes_seen} \
                     nodes): held until `railscope actions release`",
                    c.brake_window_s, c.brake_max_nodes, c.brake_max_percent
                );
            } else if dry_run {
                step.outcome = Outcome::Would;
                step.detail = format!("dry run: would drain {} ({})", f.node, f.summary);
            } else {
                step.outcome = Outcome::Tried;
            }
            self.record(&mut inner, step, now);
        }
        // Resumes: every finding a drained node was drained for has ended, and the hold has
        // passed since the last one ended.
        let ends: Vec<(String, bool, Option<u64>)> = inner
            .state
            .nodes
            .values()
            .filter(|e| matches!(e.phase, Phase::Drained { .. }))
            .map(|e| {
                let listed = store.list(&FindingFilter {
                    start_ns: 0,
                    end_ns: u64::MAX,
                    node: Some(e.node.clone()),
                    ..FindingFilter::default()
                });
                let mut clear_since = Some(0);
                for id in &e.findings {
                    // A finding no longer held in memory ended long ago.
                    let end = listed
                        .iter()
                        .find(|f| &f.id == id)
                        .map_or(Some(0), |f| f.end);
                    clear_since = match (clear_since, end) {
                        (Some(a), Some(b)) => Some(a.max(b)),
                        _ => None,
                    };
                }
                (e.node.clone(), e.dry_run, clear_since)
            })
            .collect();
        for (node, dry_run, clear_since) in ends {
            let Some(clear_since) = clear_since else {
                continue;
            };
            if now < clear_since + c.resume_hold_s * S {
                continue;
            }
            let detail = format!(
                "its findings ended and it stayed clear for {} s",
                c.resume_hold_s
            );
            let step = Step {
                node: &node,
                target: None,
                action: Action::Resume,
                outcome: if dry_run {
                    Outcome::Would
                } else {
                    Outcome::Tried
                },
                finding: None,
                finding_id: None,
                rule: None,
                dry_run,
                reason: None,
                detail: if dry_run {
                    format!("dry run: would resume {node}: {detail}")
                } else {
                    detail
                },
            };
            self.record(&mut inner, step, now);
        }
        // What Slurm is to be asked now: pending drains and resumes whose time has come. A
        // dry-run drain released from the brake is recorded as what it would do.
        let mut jobs = self.notices_due(&mut inner, store, &active, now);
        let pending: Vec<_> = inner.state.nodes.values().cloned().collect();
        for e in pending {
            let first = e.findings.iter().next().cloned().unwrap_or_default();
            match e.phase {
                Phase::Draining { next_try, .. } if next_try <= now => {
                    if e.dry_run {
                        let step = Step {
                            node: &e.node,
                            target: None,
                            action: Action::Drain,
                            outcome: Outcome::Would,
                            finding: None,
                            finding_id: Some(&first),
                            rule: Some(&e.rule),
                            dry_run: true,
                            reason: Some(&e.reason),
                            detail: format!("dry run: would drain {}", e.node),
                        };
                        self.record(&mut inner, step, now);
                    } else {
                        jobs.push(Job::Drain {
                            node: e.node,
                            reason: e.reason,
                            finding: first,
                        });
                    }
                }
                Phase::Resuming { next_try, .. } if next_try <= now => jobs.push(Job::Resume {
                    node: e.node,
                    reason: e.reason,
                }),
                _ => {}
            }
        }
        jobs
    }

    /// The webhooks and commands to try now: decided, not under way, their back-off passed.
    /// The finding is looked up again (a restart keeps only its id), and so is the rule, so a
    /// URL fixed in the configuration is used by the next try.
    fn notices_due(
        &self,
        inner: &mut Inner,
        store: &FindingsStore,
        active: &[Finding],
        now: u64,
    ) -> Vec<Job> {
        let due: Vec<_> = inner
            .state
            .notices
            .values()
            .filter(|n| n.next_try <= now && !inner.in_flight.contains(&n.finding))
            .cloned()
            .collect();
        let mut jobs = Vec::new();
        let mut by_node: HashMap<String, Vec<Finding>> = HashMap::new();
        for n in due {
            let found = active
                .iter()
                .find(|f| f.id == n.finding)
                .cloned()
                .or_else(|| {
                    by_node
                        .entry(n.node.clone())
                        .or_insert_with(|| {
                            store.list(&FindingFilter {
                                start_ns: 0,
                                end_ns: u64::MAX,
                                node: Some(n.node.clone()),
                                ..FindingFilter::default()
                            })
                        })
                        .iter()
                        .find(|f| f.id == n.finding)
                        .cloned()
                });
            let rule = found.as_ref().and_then(|f| self.config.rule_for(f));
            let target = rule.and_then(notice_target).filter(|(a, _)| *a == n.action);
            let (Some(f), Some(rule), Some((action, target))) = (found, rule, target) else {
                let step = Step {
                    node: &n.node,
                    target: Some(&n.target),
                    action: n.action,
                    outcome: Outcome::GaveUp,
                    finding: None,
                    finding_id: Some(&n.finding),
                    rule: None,
                    dry_run: false,
                    reason: None,
                    detail: "the finding is no longer held, or no rule sends it there any more"
                        .into(),
                };
                self.record(inner, step, now);
                continue;
            };
            inner.in_flight.insert(n.finding.clone());
            jobs.push(Job::Notify {
                body: super::notify::body(&f, self.config.external_url.as_deref()),
                finding: n.finding,
                node: n.node,
                action,
                target,
                timeout: Duration::from_secs(rule.timeout_s),
                attempts: n.attempts,
                max_attempts: rule.attempts,
            });
        }
        jobs
    }

    /// Asks Slurm (outside the lock) and records what it said.
    fn run(&self, job: Job, now: u64, slurm: &dyn Scheduler) {
        let (node, action, reason, finding) = match &job {
            Job::Drain {
                node,
                reason,
                finding,
            } => (node, Action::Drain, reason, Some(finding.as_str())),
            Job::Resume { node, reason } => (node, Action::Resume, reason, None),
            Job::Notify { .. } => return,
        };
        let (outcome, detail) = match slurm.show(node) {
            Err(e) => failure(&e),
            Ok(s) => match (
                action,
                s.drained,
                s.reason.as_deref() == Some(reason.as_str()),
            ) {
                (Action::Drain, true, true) => (
                    Outcome::Done,
                    "already drained with railscope's reason (a try before a restart)".into(),
                ),
                (Action::Drain, true, false) => (
                    Outcome::Skipped,
                    format!(
                        "drained by someone else ({}): railscope leaves it to them",
                        s.reason.as_deref().unwrap_or("no reason")
                    ),
                ),
                // DOWN (or FAIL) with a reason someone wrote: a drain would replace it, and an
                // undrain later leave the node down under railscope's word for a finding
                // that ended. A reason railscope did not write is never overwritten.
                (Action::Drain, false, false) if s.reason.is_some() => (
                    Outcome::Skipped,
                    format!(
                        "{} with a reason railscope did not write ({}): railscope leaves it to \
                         them",
                        s.state,
                        s.reason.as_deref().unwrap_or_default()
                    ),
                ),
                (Action::Drain, false, _) => match slurm.drain(node, reason) {
                    Ok(()) => (Outcome::Done, format!("drained: {reason}")),
                    Err(e) => failure(&e),
                },
                (_, false, _) => (
                    Outcome::Left,
                    format!(
                        "resumed by someone else (State={}): left alone until a new finding",
                        s.state
                    ),
                ),
                (_, true, false) => (
                    Outcome::Left,
                    format!(
                        "drained again by someone else ({}): left to them",
                        s.reason.as_deref().unwrap_or("no reason")
                    ),
                ),
                (_, true, true) => match slurm.undrain(node) {
                    Ok(()) => (Outcome::Done, "resumed (State=UNDRAIN)".into()),
                    Err(e) => failure(&e),
                },
            },
        };
        if outcome == Outcome::Failed || outcome == Outcome::GaveUp {
            tracing::warn!("{action:?} of {node}: {detail}");
        }
        let mut inner = lock(&self.inner);
        let step = Step {
            node,
            target: None,
            action,
            outcome,
            finding: None,
            finding_id: finding,
            rule: None,
            dry_run: false,
            reason: Some(reason),
            detail,
        };
        self.record(&mut inner, step, now);
    }

    /// Writes a step to the audit log and applies it; a record the log cannot take is kept
    /// in memory (and counted): acting on a finding matters more than its record.
    fn record(&self, inner: &mut Inner, step: Step<'_>, now: u64) {
        let record = Record {
            seq: inner.state.seq + 1,
            at: now,
            node: step.node.to_owned(),
            action: step.action,
            outcome: step.outcome,
            finding: step.finding_id.map(str::to_owned),
            finding_start: step.finding.map(|f| f.start),
            rule: step.rule.map(str::to_owned),
            dry_run: step.dry_run,
            reason: step.reason.map(str::to_owned),
            detail: step.detail,
            target: step.target.map(str::to_owned),
        };
        let word = |v: serde_json::Value| v.as_str().unwrap_or("?").to_owned();
        tracing::info!(
            "action {} {} on {}{}: {}",
            word(serde_json::to_value(record.action).unwrap_or_default()),
            word(serde_json::to_value(record.outcome).unwrap_or_default()),
            record.node,
            record
                .finding
                .as_deref()
                .map(|f| format!(" for {f}"))
                .unwrap_or_default(),
            record.detail
        );
        if let Some(log) = &mut inner.log
            && let Err(e) = log.append(&record)
        {
            inner.log_errors += 1;
            tracing::error!("{e}: the record is kept in memory only");
        }
        inner.state.apply(&record, self.config.retry_max_s);
        inner.recent.push_back(record);
        if inner.recent.len() > RECENT {
            inner.recent.pop_front();
        }
    }

    /// `railscope actions release`: the drains the brake holds go ahead (the brake counts
    /// from now); returns the nodes released.
    pub fn release(&self, now: u64) -> Vec<String> {
        let mut inner = lock(&self.inner);
        let held: Vec<String> = inner.state.held().iter().map(|e| e.node.clone()).collect();
        let step = Step {
            node: "-",
            target: None,
            action: Action::Release,
            outcome: Outcome::Released,
            finding: None,
            finding_id: None,
            rule: None,
            dry_run: self.config.dry_run,
            reason: None,
            detail: if held.is_empty() {
                "nothing was held".into()
            } else {
                format!("released: {}", held.join(", "))
            },
        };
        self.record(&mut inner, step, now);
        held
    }

    /// The brake's own finding, active while it holds drains.
    fn report_brake(&self, store: &FindingsStore, nodes_seen: usize, now: u64) {
        let inner = lock(&self.inner);
        let held = inner.state.held();
        let mut seen = Vec::new();
        if !held.is_empty() {
            let nodes: Vec<&str> = held.iter().map(|e| e.node.as_str()).collect();
            let since = held
                .iter()
                .filter_map(|e| match e.phase {
                    Phase::Held { since } => Some(since),
                    _ => None,
                })
                .min()
                .unwrap_or(now);
            seen.push(Observation {
                rule: BRAKE_RULE,
                severity: Severity::Critical,
                subject: Subject {
                    node: BRAKE_NODE.into(),
                    device: None,
                    port: None,
                    gpu: None,
                    job: None,
                },
                job_id: None,
                at_ns: since,
                summary: format!(
                    "the actions brake holds {} ({}): `railscope actions release` lets {} go",
                    match nodes.len() {
                        1 => "1 drain".to_owned(),
                        n => format!("{n} drains"),
                    },
                    nodes.join(", "),
                    if nodes.len() == 1 { "it" } else { "them" }
                ),
                evidence: json!({
                    "held": nodes,
                    "drained_in_window": inner.state.drained_in_window(now, self.config.brake_window_s * S),
                    "limit": self.config.brake_limit(nodes_seen),
                    "window_s": self.config.brake_window_s,
                }),
            });
        }
        drop(inner);
        store.apply(&seen, &[BRAKE_RULE], now);
    }

    /// Every record written, oldest first: read back from the audit log (the API keeps only
    /// the latest in memory); the latest alone where there is no log or it cannot be read.
    pub fn records(&self) -> Vec<Record> {
        let inner = lock(&self.inner);
        // Read under the lock: no record is half-appended meanwhile.
        match inner.log.as_ref().map(AuditLog::records) {
            Some(Ok(records)) => records,
            Some(Err(e)) => {
                tracing::warn!("{e}: showing the latest records only");
                inner.recent.iter().cloned().collect()
            }
            None => inner.recent.iter().cloned().collect(),
        }
    }

    /// What `/api/v1/actions` answers, the live table holding `nodes_seen` nodes (the brake's
    /// fleet is the larger of that and the last pass's).
    pub fn view(&self, nodes_seen: usize, now: u64) -> serde_json::Value {
        let nodes_seen = nodes_seen.max(self.fleet.load(std::sync::atomic::Ordering::Relaxed));
        let inner = lock(&self.inner);
        let c = &self.config;
        json!({
            "dry_run": c.dry_run,
            "rules": c.rule,
            "resume_hold_s": c.resume_hold_s,
            "brake": {
                "engaged": !inner.state.held().is_empty(),
                "held": inner.state.held().iter().map(|e| e.node.clone()).collect::<Vec<_>>(),
                "drained_in_window": inner.state.drained_in_window(now, c.brake_window_s * S),
                "limit": c.brake_limit(nodes_seen),
                "fleet": nodes_seen,
                "window_s": c.brake_window_s,
            },
            "nodes": inner.state.nodes.values().collect::<Vec<_>>(),
            "notices": inner.state.notices.values().collect::<Vec<_>>(),
            "alertmanager": c.alertmanager.as_ref().map(|a| json!({
                "urls": a.urls,
                "dry_run": c.alertmanager_dry_run(),
                "resend_s": a.resend_s,
            })),
            "records": inner.recent.iter().collect::<Vec<_>>(),
            "log_errors": inner.log_errors,
        })
    }
}

/// A failed call's outcome: retried, or given up on where trying again cannot help.
fn failure(e: &SlurmError) -> (Outcome, String) {
    if e.retryable() {
        (
            Outcome::Failed,
            format!("{e}: tried again after a back-off"),
        )
    } else {
        (Outcome::GaveUp, format!("{e}: not retried"))
    }
}

/// A webhook's or command's action and target; None for a Slurm drain.
fn notice_target(rule: &ActionRule) -> Option<(Action, Target)> {
    match rule.action.as_str() {
        "webhook" => Some((
            Action::Webhook,
            Target::Webhook {
                url: rule.url.clone().unwrap_or_default(),
            },
        )),
        "command" => Some((
            Action::Command,
            Target::Command {
                argv: rule.command.clone(),
            },
        )),
        _ => None,
    }
}
