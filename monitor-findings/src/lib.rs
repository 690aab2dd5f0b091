//! Health findings (docs/findings.md): what the collector concludes from the frames it
//! receives, each a [`Finding`] with severity, node, device and port or GPU, job, start, end,
//! rule and evidence.
//!
//! - [`engine`]: the findings threads: the events thread takes events and port states as they
//!   arrive (from ingest, through a bounded channel: nothing is evaluated on the receive
//!   threads) and runs the event rules at once; the tick thread reads the live view's latest
//!   values on a short tick (`live`: node by node, skipping nodes unchanged since the last
//!   tick; `view`: the tracks the rules read) and runs the series rules; a finding opens
//!   when a rule's condition appears and ends when a pass judged it gone ([`verdicts`]);
//! - the rule families, one module each: `ib_links`, `gpus` (with the XID table,
//!   `xid`), `verbs`; [`fabric`]: port DOWN transitions of many nodes at once blamed on
//!   the fabric, naming the switch from the `topology` (Slurm's hostlists: `hostlist`);
//! - the golden profile: [`hardware`] reads each node's hardware path from its series,
//!   [`profile`] learns what each hardware class's majority has and finds the nodes unlike
//!   it (`learner`: off the tick thread, reading again only the nodes whose hardware
//!   changed); `affinity`: a job whose GPU drives a far NIC while a near one is idle;
//! - `silence`: a node whose agent stopped sending (`node_silent`); its other findings are
//!   kept open, marked stale, meanwhile;
//! - `clock_skew`: each node's clock offset from the collector's, as its agent estimates it
//!   (the fabric grouping puts DOWN transitions on the collector's clock with it), and a
//!   node whose clock is certainly off (`clock_skew`);
//! - [`reads`]: which series each rule reads (what `railscope select` never drops);
//! - [`Thresholds`]: every rule's threshold, its default and where that default comes from
//!   (the `[findings]` table of collector.toml);
//! - [`store`]: the findings held in memory and the findings log in the data directory
//!   (`log`), reloaded at start-up;
//! - [`remote`]: the findings' series to the remote-write endpoints; in the collector,
//!   `findings::hardware_api`: `/api/v1/nodes/{node}/hardware`, the hardware path and its
//!   class; `findings::api`: `/api/v1/findings`, the `/metrics` families; in monitor-client,
//!   `findings`: `railscope findings`.

mod affinity;
mod clock_skew;
pub mod engine;
pub mod fabric;
mod gpus;
pub mod hardware;
mod hostlist;
mod ib_links;
mod learner;
mod live;
pub mod live_table;
mod log;
mod pfc;
pub mod profile;
pub mod reads;
pub mod remote;
mod robust;
mod silence;
pub mod store;
pub mod stragglers;
mod thresholds;
mod topology;
mod verbs;
pub mod verdicts;
mod view;
mod xid;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use engine::{FindingsEngine, FindingsInbox};
pub use reads::metrics_read;
pub use store::FindingsStore;
pub use thresholds::Thresholds;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warning,
    Critical,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "info" => Some(Severity::Info),
            "warning" => Some(Severity::Warning),
            "critical" => Some(Severity::Critical),
            _ => None,
        }
    }
}

/// What a finding is about: a node, and on it a port, an RDMA device (no port), a GPU or a
/// job (none: the node).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Subject {
    pub node: String,
    pub device: Option<String>,
    pub port: Option<u32>,
    pub gpu: Option<String>,
    /// Set for verb rules, whose subject is a job's use of a node.
    pub job: Option<String>,
}

impl Subject {
    pub fn port(node: &str, device: &str, port: u32) -> Self {
        Self {
            node: node.into(),
            device: Some(device.into()),
            port: Some(port),
            gpu: None,
            job: None,
        }
    }

    pub fn gpu(node: &str, gpu: &str) -> Self {
        Self {
            node: node.into(),
            device: None,
            port: None,
            gpu: Some(gpu.into()),
            job: None,
        }
    }

    /// An RDMA device as a whole (its PCIe link, its firmware), not one of its ports.
    pub fn device(node: &str, device: &str) -> Self {
        Self {
            node: node.into(),
            device: Some(device.into()),
            port: None,
            gpu: None,
            job: None,
        }
    }

    /// The node as a whole (its counts, its driver, its PCIe layout).
    pub fn node(node: &str) -> Self {
        Self {
            node: node.into(),
            device: None,
            port: None,
            gpu: None,
            job: None,
        }
    }

    pub fn job(node: &str, job: &str) -> Self {
        Self {
            node: node.into(),
            device: None,
            port: None,
            gpu: None,
            job: Some(job.into()),
        }
    }

    /// The part of a finding's id after the node: `mlx5_2/1`, `3` (a GPU), `slurm:42`.
    fn id_part(&self) -> String {
        match (&self.device, self.port, &self.gpu, &self.job) {
            (Some(d), Some(p), _, _) => format!("{d}/{p}"),
            (Some(d), None, _, _) => d.clone(),
            (None, _, Some(g), _) => g.clone(),
            (None, _, None, Some(j)) => j.clone(),
            _ => "-".into(),
        }
    }
}

/// A rule's condition as one evaluation saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    pub rule: &'static str,
    pub severity: Severity,
    pub subject: Subject,
    pub job_id: Option<String>,
    /// When the condition was first seen in the data (a sample's or an event's time).
    pub at_ns: u64,
    pub summary: String,
    pub evidence: serde_json::Value,
}

/// One finding, as the API serves it and the log keeps it (docs/http-api.md).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub id: String,
    pub rule: String,
    pub severity: Severity,
    pub node: String,
    pub device: Option<String>,
    pub port: Option<u32>,
    pub gpu: Option<String>,
    pub job_id: Option<String>,
    /// Unix ns.
    pub start: u64,
    /// Unix ns; `None` while active.
    pub end: Option<u64>,
    pub summary: String,
    pub evidence: serde_json::Value,
}

/// The evidence key under which [`fabric`] names the fabric's verdict on a port's finding:
/// [`PENDING`] while the burst it may belong to is still being judged, else the upstream
/// finding's id. Kept here, below both, because the [`store`] keeps a pending finding open.
const UPSTREAM: &str = "upstream";
const PENDING: &str = "pending";

/// Whether a finding's evidence waits for the fabric's verdict.
pub(crate) fn is_pending(evidence: &serde_json::Value) -> bool {
    evidence[UPSTREAM] == PENDING
}

impl Finding {
    pub fn open(o: &Observation) -> Self {
        Self {
            id: format!(
                "{}/{}/{}/{}",
                o.rule,
                o.subject.node,
                o.subject.id_part(),
                o.at_ns
            ),
            rule: o.rule.into(),
            severity: o.severity,
            node: o.subject.node.clone(),
            device: o.subject.device.clone(),
            port: o.subject.port,
            gpu: o.subject.gpu.clone(),
            job_id: o.job_id.clone(),
            start: o.at_ns,
            end: None,
            summary: o.summary.clone(),
            evidence: o.evidence.clone(),
        }
    }

    pub fn is_active(&self) -> bool {
        self.end.is_none()
    }

    /// Until when an event rule's finding holds by its own evidence (Unix ns): an XID or a
    /// lost GPU `hold_s` after its last occurrence, a flapping port `window_s` after its
    /// last DOWN. A restarted collector has lost the events behind a reloaded finding: it
    /// keeps the finding until then rather than end it (and resume its node) for want of
    /// them.
    pub fn holds_until_ns(&self) -> Option<u64> {
        let e = &self.evidence;
        let at = |k: &str| e.get(k).and_then(serde_json::Value::as_u64);
        let s = |k: &str| at(k).map(|v| v.saturating_mul(1_000_000_000));
        match (
            at("last").or(at("lost_at")),
            s("hold_s"),
            at("last_down"),
            s("window_s"),
        ) {
            (Some(last), Some(hold), _, _) => Some(last.saturating_add(hold)),
            (_, _, Some(last), Some(window)) => Some(last.saturating_add(window)),
            _ => None,
        }
    }

    /// The (rule, subject) key the engine tracks it by.
    pub fn key(&self) -> (String, Subject) {
        let job = if self.device.is_none() && self.gpu.is_none() {
            self.job_id.clone()
        } else {
            None
        };
        (
            self.rule.clone(),
            Subject {
                node: self.node.clone(),
                device: self.device.clone(),
                port: self.port,
                gpu: self.gpu.clone(),
                job,
            },
        )
    }

    /// Labels of `railscope_finding_active`: those that apply.
    pub fn labels(&self) -> BTreeMap<&'static str, String> {
        let mut labels = BTreeMap::new();
        labels.insert("rule", self.rule.clone());
        labels.insert("severity", self.severity.as_str().into());
        labels.insert("node", self.node.clone());
        if let Some(d) = &self.device {
            labels.insert("device", d.clone());
        }
        if let Some(p) = self.port {
            labels.insert("port", p.to_string());
        }
        if let Some(g) = &self.gpu {
            labels.insert("gpu", g.clone());
        }
        if let Some(j) = &self.job_id {
            labels.insert("job_id", j.clone());
        }
        labels
    }
}
