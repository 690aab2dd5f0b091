//! What one pass of the series rules concluded: the conditions they saw, and the subjects they
//! could judge.
//!
//! A finding ends only on evidence that its condition is gone: a rule must have judged its
//! subject on data enough to tell (a rate over a window that holds two samples a second
//! apart, a fleet large enough to compare against, a gauge with a value) and not seen the
//! condition. A subject a rule could not judge in a pass (its rate could not be computed, its
//! window held too few samples, its series did not come, its fleet was too small) keeps its
//! finding open as it was. Ending a finding on the absence of an observation, as the store
//! did before, ended `roce_congestion` in the middle of a storm in a pass where the fleet's
//! rates could not be computed.
//!
//! Only the subjects of a rule on the nodes where it has an open finding need a verdict, so a
//! rule reports a judgement through [`Verdicts::judged`], which makes the subject only there:
//! a healthy fleet's tick makes none, and a node's open finding of one rule costs the others
//! nothing (at 2,000 simulated nodes with 474 `topology_drift` findings open, judging every
//! rule's subjects on those nodes doubled the tick).

use std::collections::HashMap;

use super::{Observation, Subject};

/// A pass's observations and judgements (see the module documentation).
#[derive(Default)]
pub struct Verdicts {
    /// The conditions seen.
    pub seen: Vec<Observation>,
    /// Node → the rules this pass judges with an open finding there (asked for every series
    /// of the fleet: foldhash, as the tracks).
    open: HashMap<String, Vec<String>, foldhash::fast::RandomState>,
    /// Subject → the rules that judged it on enough data.
    judged: HashMap<Subject, Vec<&'static str>>,
    /// Node → the rules that judged every subject of it (a rule that judges a node as a
    /// whole, as the golden profile does).
    judged_nodes: HashMap<String, Vec<&'static str>>,
}

impl Verdicts {
    /// A pass over the fleet in which the rules have the open findings `open` (node → rules:
    /// [`FindingsStore::open_nodes`](super::FindingsStore::open_nodes)).
    pub fn new(open: HashMap<String, Vec<String>>) -> Self {
        Self {
            open: open.into_iter().collect(),
            ..Self::default()
        }
    }

    /// Whether `rule` has an open finding on `node` (a rule whose judgement costs more than
    /// a lookup asks first).
    pub fn is_open(&self, rule: &str, node: &str) -> bool {
        self.open
            .get(node)
            .is_some_and(|rules| rules.iter().any(|r| r == rule))
    }

    /// A condition seen.
    pub fn push(&mut self, o: Observation) {
        self.seen.push(o);
    }

    /// `rule` judged a subject of `node` on enough data to tell (seen or not): `subject` makes
    /// it, where it may be needed (None: the series does not name one).
    pub fn judged(
        &mut self,
        rule: &'static str,
        node: &str,
        subject: impl FnOnce() -> Option<Subject>,
    ) {
        if !self.is_open(rule, node) {
            return;
        }
        if let Some(subject) = subject() {
            note(self.judged.entry(subject).or_default(), rule);
        }
    }

    /// `rule` judged every subject of `node`.
    pub fn judged_node(&mut self, rule: &'static str, node: &str) {
        if self.is_open(rule, node) {
            note(self.judged_nodes.entry(node.to_owned()).or_default(), rule);
        }
    }

    /// Whether the condition of `rule` on `subject` was judged in this pass.
    pub fn was_judged(&self, rule: &str, subject: &Subject) -> bool {
        let has = |rules: Option<&Vec<&'static str>>| rules.is_some_and(|r| r.contains(&rule));
        has(self.judged_nodes.get(&subject.node)) || has(self.judged.get(subject))
    }
}

fn note(rules: &mut Vec<&'static str>, rule: &'static str) {
    if !rules.contains(&rule) {
        rules.push(rule);
    }
}

/// How a pass may end the active findings of the rules it evaluated that it did not see.
pub enum Ending<'a> {
    /// The event rules: their state holds every event taken, so a condition not seen is gone
    /// (a hold ran out, a port came back).
    NotSeen,
    /// The series rules: only those judged (see the module documentation).
    Judged(&'a Verdicts),
}

impl Ending<'_> {
    pub fn may_end(&self, rule: &str, subject: &Subject) -> bool {
        match self {
            Ending::NotSeen => true,
            Ending::Judged(v) => v.was_judged(rule, subject),
        }
    }
}
