//! The status table: one row per probe, attached or why not, as `railscope probes`, the
//! agent at start and `railscope capture` print it.

use std::fmt;

use serde::Serialize;

use super::catalogue::ProbeInfo;

/// A probe's state, as `railscope probes` and the agent report it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "status", content = "reason", rename_all = "lowercase")]
pub enum Status {
    Attached,
    Unavailable(String),
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Status::Attached => f.write_str("attached"),
            Status::Unavailable(reason) => write!(f, "unavailable: {reason}"),
        }
    }
}

/// One row of the probe table.
#[derive(Clone, Debug, Serialize)]
pub struct ProbeReport {
    pub probe: &'static str,
    pub hook: String,
    #[serde(flatten)]
    pub status: Status,
}

impl ProbeReport {
    pub fn new(info: &ProbeInfo, status: Status) -> Self {
        Self {
            probe: info.program,
            hook: info.hook.to_string(),
            status,
        }
    }
}

/// Renders the probe table as aligned text columns.
pub fn render_table(rows: &[ProbeReport]) -> String {
    let probe_w = rows
        .iter()
        .map(|r| r.probe.len())
        .chain([5])
        .max()
        .unwrap_or(5);
    let hook_w = rows
        .iter()
        .map(|r| r.hook.len())
        .chain([4])
        .max()
        .unwrap_or(4);
    let mut out = format!("{:probe_w$}  {:hook_w$}  STATUS\n", "PROBE", "HOOK");
    for row in rows {
        out += &format!(
            "{:probe_w$}  {:hook_w$}  {}\n",
            row.probe, row.hook, row.status
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probes::{CATALOGUE, Unavailable};

    #[test]
    fn table_lists_every_probe_with_its_reason() {
        let rows = vec![ProbeReport::new(
            &CATALOGUE[0],
            Status::Unavailable(
                Unavailable::ModuleNotLoaded {
                    module: "ib_core",
                    feature: "IB event and verb probes",
                }
                .to_string(),
            ),
        )];
        let table = render_table(&rows);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("PROBE") && lines[0].contains("HOOK"));
        assert!(lines[1].contains("ib_dispatch_event"));
        assert!(lines[1].contains("kprobe:ib_dispatch_event"));
        assert!(
            lines[1]
                .ends_with("unavailable: ib_core not loaded: IB event and verb probes inactive")
        );
    }
}
