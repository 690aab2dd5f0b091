//! The counts of the alerts sent to each configured Alertmanager (by its sender thread,
//! `alertmanager`); [`crate::Actions`] holds them, the collector's `/metrics` shows
//! them.

use std::sync::{Arc, atomic::AtomicU64};

use crate::ActionsConfig;

/// One Alertmanager's counts.
#[derive(Debug, Default)]
pub struct Counters {
    /// Alerts (firing or resolved) Alertmanager accepted.
    pub sent: AtomicU64,
    /// POSTs that failed (no answer in time, refused, not 2xx).
    pub failed: AtomicU64,
}

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

    /// Each configured Alertmanager's URL and counts (the collector's `/metrics` writes
    /// them).
    pub fn by_url(&self) -> impl Iterator<Item = (&str, &Counters)> {
        self.by_url.iter().map(|(u, c)| (u.as_str(), &**c))
    }
}
