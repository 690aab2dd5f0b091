//! The counts of the alerts sent to each configured Alertmanager (by its sender thread,
//! [`super::alertmanager`]) and their `/metrics` families; [`super::Actions`] holds them.

use std::{
    fmt::Write as _,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use super::ActionsConfig;

/// One Alertmanager's counts.
#[derive(Debug, Default)]
pub struct Counters {
    /// Alerts (firing or resolved) Alertmanager accepted.
    pub sent: AtomicU64,
    /// POSTs that failed (no answer in time, refused, not 2xx).
    pub failed: AtomicU64,
}

/// A metric family of [`Counters`]: name, help, value.
type Family = (&'static str, &'static str, fn(&Counters) -> u64);

/// The counts of every configured Alertmanager, by URL.
#[derive(Debug, Default)]
pub struct AlertStats {
    by_url: Vec<(String, Arc<Counters>)>,
}

impl AlertStats {
    pub fn new(config: &ActionsConfig) -> Self {
        let urls = config.alertmanager.as_ref().map(|a| a.urls.as_slice());
        Self {
            by_url: urls
                .unwrap_or_default()
                .iter()
                .map(|u| (u.clone(), Arc::default()))
                .collect(),
        }
    }

    /// The counters of the Alertmanager at `url` (fresh ones, on no page, for a URL not
    /// configured).
    pub(super) fn counters(&self, url: &str) -> Arc<Counters> {
        self.by_url
            .iter()
            .find(|(u, _)| u == url)
            .map(|(_, c)| c.clone())
            .unwrap_or_default()
    }

    /// `railscope_collector_alerts_sent_total` and `_failed_total`, one line per URL.
    pub fn write_metrics(&self, out: &mut String) {
        if self.by_url.is_empty() {
            return;
        }
        let families: [Family; 2] = [
            (
                "railscope_collector_alerts_sent_total",
                "Alerts (firing or resolved) the Alertmanager at this URL accepted.",
                |c| c.sent.load(Ordering::Relaxed),
            ),
            (
                "railscope_collector_alerts_failed_total",
                "Sends of alerts to the Alertmanager at this URL that failed (each is tried again).",
                |c| c.failed.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, value) in families {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            for (url, c) in &self.by_url {
                let mut labels = String::from("{");
                crate::metrics::label(&mut labels, "alertmanager", url, true);
                let _ = writeln!(out, "{name}{labels}}} {}", value(c));
            }
        }
    }
}
