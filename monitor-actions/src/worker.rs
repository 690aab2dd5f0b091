//! The actions' own thread: a pass of [`Actions`] every second. Slurm's calls are made here,
//! each bounded by its timeout, so a Slurm that is down or slow delays actions and nothing
//! else: ingest and the findings thread never wait for it. Webhooks and commands run on
//! threads the pass starts, and alerts on their own ([`super::alertmanager`]), so neither
//! holds up a drain.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use super::{Actions, alertmanager::AlertThreads, slurm::Scontrol};
use monitor_archive::{clock::unix_now_ns, query::QueryEngine};
use monitor_findings::FindingsStore;

const TICK: Duration = Duration::from_secs(1);

/// How often the archive is asked which nodes it holds over the brake's window.
const FLEET_COUNT_EVERY: Duration = Duration::from_secs(30);

/// The fleet the brake's `brake-max-percent` is a share of (docs/actions.md, "The brake"):
/// the nodes the archive holds data of within the brake's window, or the live table's count
/// where that is more (no archive; nodes new since the last count). The live table alone is
/// empty right after a restart and fills as nodes send again, so a finding judged in the
/// first seconds would be braked against a fleet of one or none.
pub(crate) struct Fleet {
    archive: Option<Arc<QueryEngine>>,
    window_ns: u64,
    counted: usize,
    next: Option<std::time::Instant>,
}

impl Fleet {
    pub(crate) fn new(archive: Option<Arc<QueryEngine>>, window_s: u64) -> Self {
        Self {
            archive,
            window_ns: window_s.saturating_mul(1_000_000_000),
            counted: 0,
            next: None,
        }
    }

    /// The fleet's size at `now` (Unix ns), the live table holding `live` nodes.
    pub(crate) fn size(&mut self, live: usize, now: u64) -> usize {
        let due = self.next.is_none_or(|t| std::time::Instant::now() >= t);
        if let (Some(archive), true) = (&self.archive, due) {
            match archive.nodes(now.saturating_sub(self.window_ns), now) {
                Ok(nodes) => self.counted = nodes.len(),
                Err(e) => tracing::warn!(
                    "actions: the archive cannot say which nodes it holds ({e}): the brake's \
                     share is of the {} nodes counted before or the live table's {live}",
                    self.counted
                ),
            }
            self.next = Some(std::time::Instant::now() + FLEET_COUNT_EVERY);
        }
        self.counted.max(live)
    }
}

pub struct ActionsThread {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<()>,
    alerts: AlertThreads,
}

impl ActionsThread {
    /// Starts the passes over `store`'s findings; `live_nodes` counts the nodes the
    /// collector's live table holds (one of the brake's measures of the fleet, `Fleet`).
    pub fn spawn(
        actions: Arc<Actions>,
        store: Arc<FindingsStore>,
        live_nodes: impl Fn() -> usize + Send + 'static,
        archive: Option<Arc<QueryEngine>>,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let config = actions.config();
        let slurm = Scontrol {
            program: config.scontrol.clone(),
            timeout: Duration::from_secs(config.scontrol_timeout_s),
        };
        if config.rule.is_empty() {
            tracing::info!("actions: no [[actions.rule]]: no finding is acted on");
        } else {
            tracing::info!(
                "actions: {} rules{}",
                config.rule.len(),
                if config.dry_run {
                    ", dry run (each action logged as what it would do)"
                } else {
                    ""
                }
            );
        }
        let alerts = AlertThreads::spawn(actions.clone(), store.clone())?;
        let mut fleet = Fleet::new(archive, config.brake_window_s);
        let handle = std::thread::Builder::new()
            .name("actions".into())
            .spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    let now = unix_now_ns();
                    let nodes = fleet.size(live_nodes(), now);
                    actions.pass(&store, nodes, now, &slurm);
                    std::thread::sleep(TICK);
                }
            })?;
        Ok(Self {
            stop,
            handle,
            alerts,
        })
    }

    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.handle.join();
        self.alerts.stop();
    }
}
