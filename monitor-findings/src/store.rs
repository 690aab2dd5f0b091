//! The findings in memory (every active one and the recent ended ones) and their log: the
//! rules' observations open, keep and end findings here.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::Path,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use super::{
    Finding, Observation, Severity, Subject,
    log::{Entry, FindingsLog, LogError},
    verdicts::{Ending, Verdicts},
};

use monitor_archive::lock::lock;

/// Ended findings kept in memory at most (the oldest go first; the log keeps them all).
const MAX_HELD: usize = 100_000;

/// Which findings to list.
#[derive(Clone, Debug, Default)]
pub struct FindingFilter {
    pub start_ns: u64,
    pub end_ns: u64,
    pub node: Option<String>,
    pub severity: Option<Severity>,
    pub active: Option<bool>,
}

struct Inner {
    findings: Vec<Finding>,
    /// (rule, subject) → index in `findings` of the active finding.
    active: HashMap<(String, Subject), usize>,
    /// Active findings reloaded from the log and not seen again yet.
    reloaded: HashSet<String>,
    /// Findings opened, by rule and severity (reloaded ones included).
    totals: BTreeMap<(String, Severity), u64>,
    /// Ended findings whose evidence still waits for the fabric's verdict (`upstream:
    /// "pending"`): judged once their burst is ([`FindingsStore::revise_ended`]).
    ended_pending: HashSet<String>,
    /// Nodes silent now, with when a frame last came ([`FindingsStore::set_silent`]).
    silent: HashMap<String, u64>,
    log: Option<FindingsLog>,
    log_errors: u64,
}

pub struct FindingsStore {
    inner: Mutex<Inner>,
    /// Reloaded active findings not seen again are ended after this (ns since the epoch).
    grace_until_ns: u64,
    ticks: TickTimes,
}

/// How long the findings ticks took (the series rules over the live view, on the tick
/// thread), for `/metrics`: the tick must stay well under `tick-s` as the fleet grows.
#[derive(Default)]
pub struct TickTimes {
    count: AtomicU64,
    sum_ns: AtomicU64,
    max_ns: AtomicU64,
    last_ns: AtomicU64,
}

impl TickTimes {
    pub fn record(&self, took: Duration) {
        let ns = took.as_nanos().min(u128::from(u64::MAX)) as u64;
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
        self.max_ns.fetch_max(ns, Ordering::Relaxed);
        self.last_ns.store(ns, Ordering::Relaxed);
    }

    /// Ticks, and their total, longest and last duration in seconds.
    pub fn snapshot(&self) -> (u64, f64, f64, f64) {
        let s = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 / 1e9;
        (
            self.count.load(Ordering::Relaxed),
            s(&self.sum_ns),
            s(&self.max_ns),
            s(&self.last_ns),
        )
    }
}

impl FindingsStore {
    /// A store without a log (tests, a collector without an archive).
    pub fn in_memory() -> Self {
        Self::with(Vec::new(), None, 0)
    }

    /// The store of a data directory: its log reloaded (findings ended before
    /// `keep_after_ns` dropped); active ones stay active until `grace_until_ns` unless their
    /// condition is seen again.
    pub fn open(dir: &Path, keep_after_ns: u64, grace_until_ns: u64) -> Result<Self, LogError> {
        let (log, findings) = FindingsLog::open(dir, keep_after_ns)?;
        let active = findings.iter().filter(|f| f.is_active()).count();
        if !findings.is_empty() {
            tracing::info!(
                "findings log: {} findings reloaded, {active} of them active",
                findings.len()
            );
        }
        Ok(Self::with(findings, Some(log), grace_until_ns))
    }

    fn with(findings: Vec<Finding>, log: Option<FindingsLog>, grace_until_ns: u64) -> Self {
        let mut inner = Inner {
            findings,
            active: HashMap::new(),
            reloaded: HashSet::new(),
            totals: BTreeMap::new(),
            ended_pending: HashSet::new(),
            silent: HashMap::new(),
            log,
            log_errors: 0,
        };
        for f in &inner.findings {
            *inner
                .totals
                .entry((f.rule.clone(), f.severity))
                .or_default() += 1;
        }
        inner.reindex();
        inner.reloaded = inner
            .active
            .values()
            .map(|&i| inner.findings[i].id.clone())
            .collect();
        Self {
            inner: Mutex::new(inner),
            grace_until_ns,
            ticks: TickTimes::default(),
        }
    }

    /// The nodes with an active finding of one of `rules`, each with those rules (where a pass
    /// of the series rules must judge subjects: see [`super::verdicts`]).
    pub fn open_nodes(&self, rules: &[&str]) -> HashMap<String, Vec<String>> {
        let inner = lock(&self.inner);
        let mut open: HashMap<String, Vec<String>> = HashMap::new();
        for (rule, subject) in inner.active.keys() {
            if rules.contains(&rule.as_str()) {
                let of_node = open.entry(subject.node.clone()).or_default();
                if !of_node.contains(rule) {
                    of_node.push(rule.clone());
                }
            }
        }
        open
    }

    /// Takes one pass's observations: `rules` are the rules the pass evaluated, whose active
    /// findings not observed end at `now_ns` (rules whose state holds every event they took:
    /// a condition not seen is gone).
    pub fn apply(&self, seen: &[Observation], rules: &[&str], now_ns: u64) {
        self.apply_ending(seen, rules, Ending::NotSeen, now_ns);
    }

    /// Takes one pass of the series rules: their active findings end where the pass judged
    /// the subject and did not see the condition (see [`super::verdicts`]).
    pub fn apply_judged(&self, verdicts: &Verdicts, rules: &[&str], now_ns: u64) {
        self.apply_ending(&verdicts.seen, rules, Ending::Judged(verdicts), now_ns);
    }

    fn apply_ending(&self, seen: &[Observation], rules: &[&str], ending: Ending, now_ns: u64) {
        let mut inner = lock(&self.inner);
        let mut observed: HashSet<(String, Subject)> = HashSet::new();
        for o in seen {
            let key = (o.rule.to_string(), o.subject.clone());
            observed.insert(key.clone());
            if let Some(&i) = inner.active.get(&key) {
                let f = &mut inner.findings[i];
                f.severity = f.severity.max(o.severity);
                f.summary.clone_from(&o.summary);
                f.evidence.clone_from(&o.evidence);
                if f.job_id.is_none() {
                    f.job_id.clone_from(&o.job_id);
                }
                let id = f.id.clone();
                inner.reloaded.remove(&id);
                continue;
            }
            let i = inner.open(Finding::open(o));
            inner.active.insert(key, i);
        }
        let ended: Vec<(String, Subject)> = inner
            .active
            .iter()
            .filter(|(key, _)| rules.contains(&key.0.as_str()) && !observed.contains(*key))
            .filter(|(key, _)| ending.may_end(&key.0, &key.1))
            .filter(|(_, i)| {
                let f = &inner.findings[**i];
                !(inner.reloaded.contains(&f.id)
                    && (now_ns < self.grace_until_ns
                        || f.holds_until_ns().is_some_and(|until| now_ns < until)))
            })
            .map(|(key, _)| key.clone())
            .collect();
        // A silent node's findings are not seen because nothing came, not because their
        // condition is gone: they stay open until the node is heard again, and every one of
        // them (those judged on its last values too) is marked stale meanwhile.
        let ended: Vec<(String, Subject)> = ended
            .into_iter()
            .filter(|(rule, subject)| {
                rule == super::silence::RULE || !inner.silent.contains_key(&subject.node)
            })
            .collect();
        if !inner.silent.is_empty() {
            let Inner {
                findings,
                active,
                silent,
                ..
            } = &mut *inner;
            for (key, &i) in active.iter() {
                let Some(heard) = silent.get(&key.1.node) else {
                    continue;
                };
                if key.0 == super::silence::RULE {
                    continue;
                }
                if let Some(map) = findings[i].evidence.as_object_mut() {
                    map.insert("stale".into(), serde_json::json!({ "last_heard": heard }));
                }
            }
        }
        for key in ended {
            let i = inner.active.remove(&key).expect("listed above");
            inner.end(i, now_ns);
        }
        if inner.findings.len() > MAX_HELD {
            let excess = inner.findings.len() - MAX_HELD;
            let mut dropped = 0;
            inner.findings.retain(|f| {
                let drop = dropped < excess && !f.is_active();
                dropped += usize::from(drop);
                !drop
            });
            inner.reindex();
        }
    }

    /// Findings whose condition came and went between two passes (`(observation, end)`: a
    /// port down and up again, taken at once): each opened at its own start and ended at
    /// `end`, or, where the pass before had opened it, ended at `end` rather than at the pass
    /// that found it gone. So the same events give the same findings, starts and ends
    /// whatever pace they arrive at.
    pub fn record_closed(&self, closed: &[(Observation, u64)]) {
        let mut inner = lock(&self.inner);
        for (o, end) in closed {
            let key = (o.rule.to_string(), o.subject.clone());
            let i = match inner.active.get(&key) {
                Some(&i) if inner.findings[i].start == o.at_ns => {
                    inner.active.remove(&key);
                    i
                }
                _ => {
                    let finding = Finding::open(o);
                    if inner.findings.iter().any(|f| f.id == finding.id) {
                        continue; // recorded already (the same events taken again)
                    }
                    inner.open(finding)
                }
            };
            inner.findings[i].evidence.clone_from(&o.evidence);
            inner.end(i, *end);
        }
    }

    /// The nodes silent now, each with when a frame last came (Unix ns): their findings are
    /// kept open, marked stale, while they are.
    pub fn set_silent(&self, silent: HashMap<String, u64>) {
        lock(&self.inner).silent = silent;
    }

    /// Ended findings whose evidence still waits for the fabric's verdict.
    pub fn ended_pending_upstream(&self) -> Vec<Finding> {
        let inner = lock(&self.inner);
        if inner.ended_pending.is_empty() {
            return Vec::new(); // every events pass asks: most find none
        }
        inner
            .findings
            .iter()
            .filter(|f| inner.ended_pending.contains(&f.id))
            .cloned()
            .collect()
    }

    /// Gives an ended finding the evidence the fabric's verdict made of it (the verdict came
    /// after the finding ended), logged as its end again: the API, the log and a restart read
    /// the verdict, never "pending" for ever.
    pub fn revise_ended(&self, id: &str, evidence: serde_json::Value) {
        let mut inner = lock(&self.inner);
        let Some(f) = inner.findings.iter_mut().find(|f| f.id == id) else {
            return;
        };
        let Some(end) = f.end else {
            return;
        };
        f.evidence = evidence;
        let entry = Entry::End {
            id: f.id.clone(),
            end,
            summary: f.summary.clone(),
            evidence: f.evidence.clone(),
        };
        tracing::info!(
            "finding {id}: upstream judged after it ended: {}",
            f.evidence["upstream"].as_str().unwrap_or("the node's own")
        );
        let pending = super::is_pending(&f.evidence);
        if !pending {
            inner.ended_pending.remove(id);
        }
        inner.write(&entry);
    }

    /// The findings that match, oldest first.
    pub fn list(&self, filter: &FindingFilter) -> Vec<Finding> {
        let inner = lock(&self.inner);
        let mut out: Vec<Finding> = inner
            .findings
            .iter()
            .filter(|f| f.start <= filter.end_ns && f.end.is_none_or(|e| e >= filter.start_ns))
            .filter(|f| filter.node.as_ref().is_none_or(|n| *n == f.node))
            .filter(|f| filter.severity.is_none_or(|s| s == f.severity))
            .filter(|f| filter.active.is_none_or(|a| a == f.is_active()))
            .cloned()
            .collect();
        out.sort_by(|a, b| (a.start, &a.id).cmp(&(b.start, &b.id)));
        out
    }

    /// The finding with this id, active or ended (while it is held in memory).
    pub fn get(&self, id: &str) -> Option<Finding> {
        lock(&self.inner)
            .findings
            .iter()
            .find(|f| f.id == id)
            .cloned()
    }

    pub fn active(&self) -> Vec<Finding> {
        let inner = lock(&self.inner);
        let mut out: Vec<Finding> = inner
            .active
            .values()
            .map(|&i| inner.findings[i].clone())
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// Findings opened by rule and severity.
    pub fn totals(&self) -> BTreeMap<(String, Severity), u64> {
        lock(&self.inner).totals.clone()
    }

    /// Entries the log could not take.
    /// The findings ticks' durations.
    pub fn ticks(&self) -> &TickTimes {
        &self.ticks
    }

    pub fn log_errors(&self) -> u64 {
        lock(&self.inner).log_errors
    }
}

impl Inner {
    /// Holds a new finding, logged and counted; its index.
    fn open(&mut self, finding: Finding) -> usize {
        tracing::info!(
            "finding {} ({}): {} on {}",
            finding.id,
            finding.severity.as_str(),
            finding.summary,
            finding.node
        );
        self.write(&Entry::Open(finding.clone()));
        *self
            .totals
            .entry((finding.rule.clone(), finding.severity))
            .or_default() += 1;
        self.findings.push(finding);
        self.findings.len() - 1
    }

    /// Ends finding `i` at `end_ns` (not before its start), logged; one still waiting for the
    /// fabric's verdict is judged later ([`FindingsStore::revise_ended`]).
    fn end(&mut self, i: usize, end_ns: u64) {
        let f = &mut self.findings[i];
        let end = end_ns.max(f.start);
        f.end = Some(end);
        let entry = Entry::End {
            id: f.id.clone(),
            end,
            summary: f.summary.clone(),
            evidence: f.evidence.clone(),
        };
        tracing::info!("finding {} ended", f.id);
        let id = f.id.clone();
        if super::is_pending(&f.evidence) {
            self.ended_pending.insert(id.clone());
        }
        self.reloaded.remove(&id);
        self.write(&entry);
    }

    fn reindex(&mut self) {
        self.active = self
            .findings
            .iter()
            .enumerate()
            .filter(|(_, f)| f.is_active())
            .map(|(i, f)| (f.key(), i))
            .collect();
        self.ended_pending = self
            .findings
            .iter()
            .filter(|f| !f.is_active() && super::is_pending(&f.evidence))
            .map(|f| f.id.clone())
            .collect();
    }

    fn write(&mut self, entry: &Entry) {
        if let Some(log) = &mut self.log
            && let Err(e) = log.append(entry)
        {
            self.log_errors += 1;
            tracing::error!("{e}: the finding is kept in memory only");
        }
    }
}
