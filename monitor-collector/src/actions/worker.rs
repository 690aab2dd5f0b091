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
use crate::{clock::unix_now_ns, findings::FindingsStore, nodes::NodeTable};

const TICK: Duration = Duration::from_secs(1);

pub struct ActionsThread {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<()>,
    alerts: AlertThreads,
}

impl ActionsThread {
    pub fn spawn(
        actions: Arc<Actions>,
        store: Arc<FindingsStore>,
        table: Arc<NodeTable>,
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
        let handle = std::thread::Builder::new()
            .name("actions".into())
            .spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    actions.pass(&store, table.node_count(), unix_now_ns(), &slurm);
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
