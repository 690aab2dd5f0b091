//! What a selection found, as text for the operator, as JSON, and as the agent's `--sampling`
//! settings: `NAME:drop` for every metric dropped (constant or redundant), `NAME:on,max=S`
//! for every kept one with its learned cap (`on` so that a shorter dropped name that is a
//! prefix of a kept one does not turn the kept one off: the agent takes the longest prefix),
//! `NAME:on` for a kept metric that keeps the agent's default cap: one railscope reads (its
//! readers were written for the default), or one constant in the range but kept (a failure
//! counter, `--keep`: the range says nothing of how fast it moves when it does).

use std::fmt::Write as _;

use serde::Serialize;

use super::{grouping::Group, interval_cap::MetricCap, keep::Protected};
use crate::time::format_time;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Selection {
    pub start_ns: u64,
    pub end_ns: u64,
    pub step_ns: u64,
    pub min_variance: f64,
    pub max_distance: f64,
    /// Metrics with readings in the range, and their series.
    pub metrics: usize,
    pub series: usize,
    /// The metrics in the range never dropped whatever the data, and why, by name.
    pub protected: Vec<Protected>,
    /// Metrics dropped as constant, by name.
    pub constant: Vec<String>,
    /// Metrics constant in the range but kept (protected), by name.
    pub kept_constant: Vec<String>,
    /// The varying metrics, grouped (a metric alone is a group of one).
    pub groups: Vec<Group>,
    /// The kept metrics' learned caps, by name (not those of `default_cap`).
    pub caps: Vec<MetricCap>,
    /// The kept metrics left at the agent's default cap (`NAME:on`), by name: those railscope
    /// reads and those constant in the range.
    pub default_cap: Vec<String>,
}

impl Selection {
    /// The kept metrics, by name.
    pub fn kept(&self) -> Vec<&str> {
        let mut kept: Vec<&str> = self
            .groups
            .iter()
            .flat_map(|g| g.kept.iter().map(String::as_str))
            .chain(self.kept_constant.iter().map(String::as_str))
            .collect();
        kept.sort_unstable();
        kept
    }

    /// The dropped metrics (constant or redundant), by name.
    pub fn dropped(&self) -> Vec<&str> {
        let mut dropped: Vec<&str> = self
            .constant
            .iter()
            .map(String::as_str)
            .chain(
                self.groups
                    .iter()
                    .flat_map(|g| g.dropped.iter().map(|d| d.metric.as_str())),
            )
            .collect();
        dropped.sort_unstable();
        dropped
    }

    /// The agent's settings, one `PREFIX:SETTINGS` a line.
    pub fn sampling_settings(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .dropped()
            .into_iter()
            .map(|m| format!("{m}:drop"))
            .collect();
        out.extend(
            self.caps
                .iter()
                .map(|c| format!("{}:on,max={}", c.metric, c.max_s)),
        );
        out.extend(self.default_cap.iter().map(|m| format!("{m}:on")));
        out
    }

    /// Why `metric` is never dropped, if it is protected.
    pub fn protected_reason(&self, metric: &str) -> Option<&str> {
        self.protected
            .iter()
            .find(|p| p.metric == metric)
            .map(|p| p.reason.as_str())
    }

    /// The report as text: the range, the constant metrics, the groups (with what each
    /// dropped metric is like), the caps, and the settings as agent flags.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} metrics ({} series) from {} to {}, compared on a {} s grid",
            self.metrics,
            self.series,
            format_time(self.start_ns),
            format_time(self.end_ns),
            self.step_ns as f64 / 1e9
        );
        let _ = writeln!(
            out,
            "\nnever dropped (read by railscope, failure counters, --keep): {}",
            self.protected.len()
        );
        for p in &self.protected {
            let _ = writeln!(out, "  keep {} (kept: {})", p.metric, p.reason);
        }
        let _ = writeln!(
            out,
            "\nconstant (max-normalised variance < {}): {}",
            self.min_variance,
            self.constant.len() + self.kept_constant.len()
        );
        for m in &self.constant {
            let _ = writeln!(out, "  drop {m}");
        }
        for m in &self.kept_constant {
            let _ = writeln!(out, "  keep {m} (never dropped, above)");
        }
        let redundant: Vec<&Group> = self.groups.iter().filter(|g| g.members.len() > 1).collect();
        let _ = writeln!(
            out,
            "\nredundant groups (max-normalised distance <= {}): {}",
            self.max_distance,
            redundant.len()
        );
        for g in redundant {
            let _ = writeln!(out, "  keep {}", g.kept.join(", "));
            for d in &g.dropped {
                let _ = writeln!(
                    out,
                    "    drop {} (like {}, distance {:.4})",
                    d.metric, d.like, d.distance
                );
            }
        }
        let _ = writeln!(
            out,
            "\nkept {} of {} metrics; interval caps (5th percentile of stable periods):",
            self.kept().len(),
            self.metrics
        );
        for c in &self.caps {
            let _ = writeln!(
                out,
                "  {} max={} s (p5 {:.1} s of {} periods)",
                c.metric, c.max_s, c.p5_s, c.periods
            );
        }
        for m in &self.default_cap {
            let why = if self.kept_constant.contains(m) {
                "constant here"
            } else {
                "read by railscope"
            };
            let _ = writeln!(out, "  {m} the agent's default cap ({why})");
        }
        let _ = writeln!(out, "\nagent settings:");
        for s in self.sampling_settings() {
            let _ = writeln!(out, "  --sampling {s}");
        }
        out
    }
}
