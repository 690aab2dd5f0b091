//! Every active finding as an alert to Alertmanager (API v2, `POST /api/v2/alerts`), one
//! thread per Alertmanager URL so that one that hangs or is down delays only its own alerts.
//!
//! Alertmanager forgets an alert that is not sent again: it resolves it at its `endsAt`. So
//! each active finding's alert is sent again every `resend-s` with `endsAt` four resends
//! ahead (as Prometheus does with its evaluation interval): three lost sends in a row do not
//! resolve it, and a collector that stops sending lets its alerts resolve within four
//! resends. When a finding ends its alert is sent once more with `endsAt` = the finding's end,
//! which resolves it at once. A failed send is tried again after a back-off (1 s doubling up
//! to `retry-max-s`) with every alert then due. The audit log gets only an endpoint's changes
//! (failing, accepting again), not every send; `/metrics` counts each.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use serde_json::{Map, Value, json};

use super::{
    Actions,
    alert_stats::Counters,
    audit::Outcome,
    config::AlertmanagerConfig,
    notify::{HttpPoster, view_url},
    state::backoff_ns,
};
use monitor_client::time::format_time;

use monitor_archive::clock::unix_now_ns;
use monitor_findings::{Finding, FindingsStore, store::FindingFilter};

const S: u64 = 1_000_000_000;
const TICK: Duration = Duration::from_secs(1);
/// An alert is resolved by Alertmanager this many resends after its last send.
const RESENDS_AHEAD: u64 = 4;
/// The evidence annotation is cut at this many bytes: an annotation is for reading.
const EVIDENCE_BYTES: usize = 4096;

/// A finding as an Alertmanager alert ending at `ends_at` (Unix ns).
pub(crate) fn alert(f: &Finding, ends_at: u64, external_url: Option<&str>) -> Value {
    let mut labels = Map::new();
    let mut put = |k: &str, v: Option<String>| {
        if let Some(v) = v {
            labels.insert(k.into(), Value::String(v));
        }
    };
    put("alertname", Some(format!("railscope_{}", f.rule)));
    put("rule", Some(f.rule.clone()));
    put("severity", Some(f.severity.as_str().into()));
    put("node", Some(f.node.clone()));
    put("device", f.device.clone());
    put("port", f.port.map(|p| p.to_string()));
    put("gpu", f.gpu.clone());
    put("job_id", f.job_id.clone());
    let mut evidence = f.evidence.to_string();
    if evidence.len() > EVIDENCE_BYTES {
        let mut cut = EVIDENCE_BYTES;
        while !evidence.is_char_boundary(cut) {
            cut -= 1;
        }
        evidence.truncate(cut);
        evidence.push_str("...");
    }
    let link = external_url.map(|base| view_url(base, f));
    let mut annotations = json!({
        "summary": f.summary,
        "evidence": evidence,
        "finding_id": f.id,
    });
    let mut out = json!({
        "labels": labels,
        "startsAt": format_time(f.start),
        "endsAt": format_time(ends_at),
    });
    if let Some(link) = link {
        annotations["dashboard"] = json!(link);
        out["generatorURL"] = json!(link);
    }
    out["annotations"] = annotations;
    out
}

/// What one Alertmanager has been sent.
pub(crate) struct Sender {
    url: String,
    endpoint: String,
    config: AlertmanagerConfig,
    dry_run: bool,
    retry_max_s: u64,
    external_url: Option<String>,
    poster: Result<HttpPoster, String>,
    counters: Arc<Counters>,
    /// The findings whose alert is firing there, and when each was last sent (Unix ns).
    firing: HashMap<String, (u64, Finding)>,
    attempts: u32,
    next_try: u64,
    /// Whether the last send failed; None before the first.
    failing: Option<bool>,
}

impl Sender {
    pub(crate) fn new(url: &str, actions: &Actions) -> Self {
        let c = actions.config();
        let config = c.alertmanager.clone().unwrap_or_default();
        let endpoint = format!("{}/api/v2/alerts", url.trim_end_matches('/'));
        Self {
            poster: HttpPoster::new(&endpoint, Duration::from_secs(config.timeout_s)),
            url: url.to_owned(),
            endpoint,
            config,
            dry_run: c.alertmanager_dry_run(),
            retry_max_s: c.retry_max_s,
            external_url: c.external_url.clone(),
            counters: actions.alert_stats.counters(url),
            firing: HashMap::new(),
            attempts: 0,
            next_try: 0,
            failing: None,
        }
    }

    /// Sends what is due at `now`: new findings, those whose resend time came, and the
    /// resolution of those that ended.
    pub(crate) fn tick(&mut self, store: &FindingsStore, actions: &Actions, now: u64) {
        if now < self.next_try {
            return;
        }
        let active: Vec<Finding> = store
            .active()
            .into_iter()
            .filter(|f| f.severity >= self.config.severity)
            .collect();
        let ids: HashSet<&str> = active.iter().map(|f| f.id.as_str()).collect();
        let resend_ns = self.config.resend_s * S;
        let due: Vec<&Finding> = active
            .iter()
            .filter(|f| {
                self.firing
                    .get(&f.id)
                    .is_none_or(|(at, _)| now >= at + resend_ns)
            })
            .collect();
        let ended: Vec<Finding> = self
            .firing
            .iter()
            .filter(|(id, _)| !ids.contains(id.as_str()))
            .map(|(_, (_, f))| ended_as_held(store, f, now))
            .collect();
        if due.is_empty() && ended.is_empty() {
            return;
        }
        let ends_at = now + RESENDS_AHEAD * resend_ns;
        let external = self.external_url.as_deref();
        let mut alerts: Vec<Value> = due.iter().map(|f| alert(f, ends_at, external)).collect();
        alerts.extend(
            ended
                .iter()
                .map(|f| alert(f, f.end.unwrap_or(now), external)),
        );
        let new = due.iter().filter(|f| !self.firing.contains_key(&f.id));
        let news: Vec<&str> = new.map(|f| f.id.as_str()).collect();
        let resolved: Vec<&str> = ended.iter().map(|f| f.id.as_str()).collect();
        let result = if self.dry_run {
            if !news.is_empty() || !resolved.is_empty() {
                tracing::info!(
                    "alertmanager {}: dry run: would send firing {:?}, resolved {:?}",
                    self.url,
                    news,
                    resolved
                );
            }
            Ok(String::new())
        } else {
            let body = serde_json::to_vec(&alerts).unwrap_or_default();
            match &self.poster {
                Ok(poster) => poster.post(&self.endpoint, &body),
                Err(e) => Err(e.clone()),
            }
        };
        match result {
            Ok(_) => {
                if !self.dry_run {
                    self.counters
                        .sent
                        .fetch_add(alerts.len() as u64, Ordering::Relaxed);
                    tracing::debug!(
                        "alertmanager {}: {} alerts sent (new {news:?}, resolved {resolved:?})",
                        self.url,
                        alerts.len()
                    );
                }
                if self.failing != Some(false) {
                    let detail = if self.dry_run {
                        "dry run: alerts are logged, not sent".to_owned()
                    } else if self.failing == Some(true) {
                        format!(
                            "accepting alerts again after {} failed sends",
                            self.attempts
                        )
                    } else {
                        format!("accepting alerts ({} sent)", alerts.len())
                    };
                    let outcome = if self.dry_run {
                        Outcome::Would
                    } else {
                        Outcome::Done
                    };
                    actions.record_alert(&self.url, outcome, self.dry_run, detail, now);
                }
                self.failing = Some(false);
                self.attempts = 0;
                let sent: Vec<Finding> = due.into_iter().cloned().collect();
                for f in sent {
                    self.firing.insert(f.id.clone(), (now, f));
                }
                for f in &ended {
                    self.firing.remove(&f.id);
                }
            }
            Err(e) => {
                self.counters.failed.fetch_add(1, Ordering::Relaxed);
                self.attempts += 1;
                self.next_try = now + backoff_ns(self.attempts, self.retry_max_s);
                if self.failing != Some(true) {
                    tracing::warn!(
                        "alertmanager {}: {e}: tried again after a back-off",
                        self.url
                    );
                    let detail = format!("{e}: tried again after a back-off");
                    actions.record_alert(&self.url, Outcome::Failed, false, detail, now);
                }
                self.failing = Some(true);
            }
        }
    }
}

/// The finding `f` as the store holds it now (with its end); one the store no longer holds
/// ended by `now` at the latest.
fn ended_as_held(store: &FindingsStore, f: &Finding, now: u64) -> Finding {
    let held = store.list(&FindingFilter {
        start_ns: 0,
        end_ns: u64::MAX,
        node: Some(f.node.clone()),
        ..FindingFilter::default()
    });
    let mut out = held
        .into_iter()
        .find(|h| h.id == f.id)
        .unwrap_or_else(|| f.clone());
    if out.end.is_none() {
        out.end = Some(now);
    }
    out
}

/// The senders' threads, one per Alertmanager URL.
pub(crate) struct AlertThreads {
    stop: Arc<AtomicBool>,
    handles: Vec<JoinHandle<()>>,
}

impl AlertThreads {
    pub(crate) fn spawn(actions: Arc<Actions>, store: Arc<FindingsStore>) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::new();
        let urls = actions
            .config()
            .alertmanager
            .as_ref()
            .map(|a| a.urls.clone())
            .unwrap_or_default();
        for url in urls {
            let mut sender = Sender::new(&url, &actions);
            tracing::info!(
                "actions: alerts to Alertmanager {url}{}",
                if sender.dry_run {
                    " (dry run: logged, not sent)"
                } else {
                    ""
                }
            );
            let (actions, store, stopped) = (actions.clone(), store.clone(), stop.clone());
            handles.push(
                std::thread::Builder::new()
                    .name("alertmanager".into())
                    .spawn(move || {
                        while !stopped.load(Ordering::Relaxed) {
                            sender.tick(&store, &actions, unix_now_ns());
                            std::thread::sleep(TICK);
                        }
                    })?,
            );
        }
        Ok(Self { stop, handles })
    }

    pub(crate) fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.handles {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use monitor_findings::Severity;

    #[test]
    fn an_alert_carries_the_findings_labels_evidence_and_link() {
        let f = Finding {
            id: "ib_link_flapping/n1/mlx5_2/1/1790000000000000000".into(),
            rule: "ib_link_flapping".into(),
            severity: Severity::Critical,
            node: "n1".into(),
            device: Some("mlx5_2".into()),
            port: Some(1),
            gpu: None,
            job_id: Some("42".into()),
            start: 1_790_000_000 * S,
            end: None,
            summary: "mlx5_2 port 1 went down 3 times in 20 s".into(),
            evidence: json!({"downs": 3}),
        };
        let a = alert(&f, 1_790_000_240 * S, Some("https://rs.example"));
        assert_eq!(a["labels"]["alertname"], "railscope_ib_link_flapping");
        assert_eq!(a["labels"]["port"], "1");
        assert_eq!(a["labels"]["job_id"], "42");
        assert!(a["labels"].get("gpu").is_none());
        assert_eq!(a["annotations"]["evidence"], "{\"downs\":3}");
        assert_eq!(
            a["annotations"]["dashboard"],
            "https://rs.example/#/node/n1"
        );
        assert_eq!(a["startsAt"], "2026-09-21T14:13:20.000Z");
        assert_eq!(a["endsAt"], "2026-09-21T14:17:20.000Z");
        let a = alert(&f, 0, None);
        assert!(a["annotations"].get("dashboard").is_none());
        assert!(a.get("generatorURL").is_none());
    }
}
