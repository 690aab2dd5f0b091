//! The findings' series sent to the remote-write endpoints: every `tick-s`, one request per
//! endpoint holding `railscope_finding_active{...} 1` for each active finding and
//! `railscope_findings_total{rule,severity}`, stamped now. These are current state, not
//! archived samples: a request that fails is not sent again (the next tick carries the state
//! again), as a scrape of `/metrics` that fails leaves a gap.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use super::FindingsStore;
use monitor_archive::clock::unix_now_ns;
use monitor_remote_write::{
    EndpointConfig,
    client::{Client, Outcome},
    naming::millis,
    prompb::{Label, Sample, TimeSeries, WriteRequest, encode_body},
};

/// The request body of the findings' series at `now_ns`.
pub fn write_request(store: &FindingsStore, now_ns: u64) -> WriteRequest {
    let sample = |value: f64| Sample {
        value,
        timestamp: millis(now_ns),
    };
    let mut timeseries = Vec::new();
    for f in store.active() {
        let mut labels = vec![Label {
            name: "__name__".into(),
            value: "railscope_finding_active".into(),
        }];
        labels.extend(f.labels().into_iter().map(|(k, v)| Label {
            name: k.into(),
            value: v,
        }));
        labels.sort_by(|a, b| a.name.cmp(&b.name));
        timeseries.push(TimeSeries {
            labels,
            samples: vec![sample(1.0)],
        });
    }
    for ((rule, severity), n) in store.totals() {
        timeseries.push(TimeSeries {
            labels: vec![
                Label {
                    name: "__name__".into(),
                    value: "railscope_findings_total".into(),
                },
                Label {
                    name: "rule".into(),
                    value: rule,
                },
                Label {
                    name: "severity".into(),
                    value: severity.as_str().into(),
                },
            ],
            samples: vec![sample(n as f64)],
        });
    }
    WriteRequest { timeseries }
}

/// The thread that sends them.
pub struct FindingsSender {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl FindingsSender {
    pub fn start(
        store: Arc<FindingsStore>,
        endpoints: &[EndpointConfig],
        every: Duration,
    ) -> std::io::Result<Option<Self>> {
        if endpoints.is_empty() {
            return Ok(None);
        }
        // The endpoints' files were read (and checked) when their writers started; one that
        // cannot be read now is left out of the findings, with a warning.
        let clients: Vec<(String, Client)> = endpoints
            .iter()
            .filter_map(|e| match Client::new(e) {
                Ok(c) => Some((e.name.clone(), c)),
                Err(err) => {
                    tracing::warn!("findings' series not sent: {err}");
                    None
                }
            })
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let handle = std::thread::Builder::new()
            .name("findings-remote-write".into())
            .spawn({
                let stop = stop.clone();
                move || {
                    let mut next = Instant::now();
                    while !stop.load(Ordering::Relaxed) {
                        if Instant::now() >= next {
                            next += every;
                            let body = encode_body(&write_request(&store, unix_now_ns()));
                            for (name, client) in &clients {
                                if let Outcome::Retry { reason, .. }
                                | Outcome::Rejected { reason, .. } = client.send(&body)
                                {
                                    tracing::debug!(
                                        "remote-write {name}: findings' series not sent: {reason}"
                                    );
                                }
                            }
                        }
                        std::thread::sleep(Duration::from_millis(200));
                    }
                }
            })?;
        Ok(Some(Self {
            stop,
            handle: Some(handle),
        }))
    }

    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
