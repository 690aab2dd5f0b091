//! `railscope health`: Slurm's health hook (docs/actions.md, "The health hook"). It asks the
//! collector for the node's active findings and answers as NHC does, with an exit status and
//! one line: 0 healthy, 1 unhealthy (the worst finding's rule, id and device, and how many
//! others), so a site can run it as `HealthCheckProgram` or from a prolog or epilog.
//!
//! A collector that cannot be asked (down, slow, refusing, answering something that is not
//! its findings) is not the node's fault: the line says so, naming the URL, and the exit
//! status is `--unreachable-exit` (0 by default), so a collector outage never drains a fleet.

use std::time::Duration;

use serde::Deserialize;

use crate::{query::get_json_within, time::unix_now_ns};

/// How severe a finding is, as the API writes it; ordered from the least.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
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

/// A finding as `/api/v1/findings` lists it: what the check reads of it.
#[derive(Clone, Debug, Deserialize)]
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
}

/// `railscope health [--collector URL] [--node NAME] [--min-severity S] [--unreachable-exit N]
/// [--timeout-s S]`
#[derive(clap::Args, Debug, Clone)]
pub struct HealthArgs {
    /// The collector's HTTP address.
    #[arg(long, default_value = "http://127.0.0.1:7671")]
    pub collector: String,
    /// The node, as its agent names itself (default: this host's name, the agent's default;
    /// `railscope health` passes the `node` of /etc/railscope/agent.toml where it is set).
    #[arg(long)]
    pub node: Option<String>,
    /// The least severity of an active finding that makes the node unhealthy: critical,
    /// warning or info.
    #[arg(long, default_value = "critical", value_parser = parse_severity)]
    pub min_severity: Severity,
    /// The exit status when the collector cannot be asked or answers something else than its
    /// findings (default 0, healthy: a collector outage must not drain the fleet).
    #[arg(long, value_name = "CODE", default_value_t = 0)]
    pub unreachable_exit: u8,
    /// Give up on the collector after this many seconds (Slurm kills a `HealthCheckProgram`
    /// after 60).
    #[arg(long, value_name = "SECONDS", default_value_t = 5)]
    pub timeout_s: u64,
}

fn parse_severity(text: &str) -> Result<Severity, String> {
    Severity::parse(text).ok_or_else(|| format!("{text:?} is not critical, warning or info"))
}

/// What the check found: its exit status and its one line.
#[derive(Debug, PartialEq, Eq)]
pub struct Verdict {
    pub exit: u8,
    pub line: String,
}

/// Asks the collector and judges; never fails (a failure to ask is a verdict too).
pub fn check(args: &HealthArgs) -> Verdict {
    let node = args.node.clone().unwrap_or_else(hostname);
    match active_findings(args, &node) {
        Ok(findings) => judge(&node, &findings, args.min_severity),
        Err(e) => Verdict {
            exit: args.unreachable_exit,
            line: format!(
                "railscope health: cannot ask the collector at {} about {node} ({}); exit {} \
                 (--unreachable-exit)",
                args.collector,
                format!("{e:#}").replace('\n', " "),
                args.unreachable_exit
            ),
        },
    }
}

/// Runs the check: prints its line on stdout and returns its exit status.
pub fn run(args: &HealthArgs) -> u8 {
    let verdict = check(args);
    println!("{}", verdict.line);
    verdict.exit
}

/// The node's active findings, as the collector lists them.
fn active_findings(args: &HealthArgs, node: &str) -> anyhow::Result<Vec<Finding>> {
    // Every finding still active, whenever it started (a node's clock a little ahead of the
    // collector's included).
    let until = unix_now_ns() / 1_000_000_000 + 86_400;
    let json = get_json_within(
        &args.collector,
        "/api/v1/findings",
        &[
            ("node", node.to_owned()),
            ("active", "true".into()),
            ("start", "0".into()),
            ("end", until.to_string()),
        ],
        Duration::from_secs(args.timeout_s.max(1)),
    )?;
    let list = json
        .get("findings")
        .filter(|f| f.is_array())
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("the answer has no \"findings\" list"))?;
    let findings: Vec<Finding> = serde_json::from_value(list)
        .map_err(|e| anyhow::anyhow!("the answer's findings do not read as findings: {e}"))?;
    // The collector filters by node and activity; a node name of another is no finding of
    // this one, whatever answered.
    Ok(findings
        .into_iter()
        .filter(|f| f.node == node && f.end.is_none())
        .collect())
}

/// Unhealthy if a finding is at `min` or above: the worst (most severe, then the oldest)
/// named, with the number of the others.
pub fn judge(node: &str, findings: &[Finding], min: Severity) -> Verdict {
    let mut counted: Vec<&Finding> = findings.iter().filter(|f| f.severity >= min).collect();
    counted.sort_by(|a, b| {
        b.severity
            .cmp(&a.severity)
            .then(a.start.cmp(&b.start))
            .then(a.id.cmp(&b.id))
    });
    let Some(worst) = counted.first() else {
        return Verdict {
            exit: 0,
            line: format!(
                "railscope health: {node} healthy: no active finding of severity {} or above \
                 ({} below)",
                min.as_str(),
                findings.len()
            ),
        };
    };
    let others = match counted.len() - 1 {
        0 => String::new(),
        1 => "; and 1 other finding".into(),
        n => format!("; and {n} other findings"),
    };
    Verdict {
        exit: 1,
        line: format!(
            "railscope health: {node} unhealthy: {} {} on {}: {} (finding {}){others}",
            worst.severity.as_str(),
            worst.rule,
            device(worst),
            worst.summary.replace('\n', " "),
            worst.id,
        ),
    }
}

/// What a finding is about, as `railscope findings` writes it: `mlx5_2/1`, `gpu 3`, `job
/// slurm:42`, or `node`.
fn device(f: &Finding) -> String {
    match (&f.device, f.port, &f.gpu, &f.job_id) {
        (Some(d), Some(p), _, _) => format!("{d}/{p}"),
        (Some(d), None, _, _) => d.clone(),
        (None, _, Some(g), _) => format!("gpu {g}"),
        (None, _, None, Some(j)) => format!("job {j}"),
        _ => "node".into(),
    }
}

/// This machine's host name (the kernel's, as `gethostname` gives it): the agent's default
/// node name.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into())
}
