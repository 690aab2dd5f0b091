//! The host side of the guest scenario `slurm-drain`: a real Slurm cluster on the host's
//! loopback (monitor-testkit's `slurm`: munge, `slurmctld`, from Debian's packages) with one
//! node, `guest`, the name the guest's agent sends as. Its `slurmd` runs on the host in the
//! guest's stead: the guest runs no Slurm, and the controller only needs the node to answer
//! so that it is IDLE, as a node in service is. The host's collector gets an `[actions]`
//! table that drains on `ib_link_flapping` for real through that cluster's `scontrol`
//! (`SLURM_CONF` in its environment). After the guest powered off, [`SlurmHost::check`]
//! reads the node back as an operator would: `scontrol show node guest` drained with
//! railscope's reason naming the guest's flapping finding, the controller's log with exactly
//! one drain, and the collector's `/api/v1/actions` with exactly one drain done.

use std::{
    net::SocketAddr,
    panic::{AssertUnwindSafe, catch_unwind},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, bail};
use monitor_testkit::slurm::{self, SlurmCluster};
use serde_json::Value;

use crate::http::http_get;

/// The Slurm node standing in for the guest: the guest agent's node name.
const NODE: &str = "guest";

/// The longest path of a Unix socket (`sun_path`): munge's socket lives in the cluster's
/// directory.
const SOCKET_PATH_MAX: usize = 107;

/// collector.toml of a collector that acts: findings judged every second, and a drain for
/// real on a flapping port (the finding's other settings at their defaults: 3 downs within
/// the hour).
const COLLECTOR_TOML: &str = "[findings]\ntick-s = 1\n\n\
    [actions]\ndry-run = false\n\n\
    [[actions.rule]]\nrule = \"ib_link_flapping\"\naction = \"slurm-drain\"\n";

/// The cluster, running until dropped, and the collector's configuration for it.
pub(crate) struct SlurmHost {
    cluster: SlurmCluster,
    config: PathBuf,
}

impl SlurmHost {
    /// Starts the cluster under `dir/slurm` (every node IDLE) and writes `dir/collector.toml`.
    pub(crate) fn start(dir: &Path) -> anyhow::Result<Self> {
        if let Some(what) = slurm::missing() {
            bail!("slurm-drain needs Slurm: {what}");
        }
        let slurm_dir = dir.join("slurm");
        let socket = slurm_dir.join("munge.sock");
        if socket.as_os_str().len() > SOCKET_PATH_MAX {
            bail!(
                "slurm-drain: munge's socket {} is longer than a Unix socket's {SOCKET_PATH_MAX} \
                 bytes; run from a checkout with a shorter path",
                socket.display()
            );
        }
        // The test kit's cluster panics with the daemons' logs when one does not come up.
        let cluster = catch_unwind(AssertUnwindSafe(|| {
            SlurmCluster::start(&slurm_dir, &[NODE])
        }))
        .map_err(|panic| {
            let why = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)");
            anyhow::anyhow!(
                "starting the Slurm cluster under {}: {why}",
                slurm_dir.display()
            )
        })?;
        let config = dir.join("collector.toml");
        std::fs::write(&config, COLLECTOR_TOML)
            .with_context(|| format!("writing {}", config.display()))?;
        Ok(Self { cluster, config })
    }

    /// The collector's `--config`.
    pub(crate) fn collector_config(&self) -> &Path {
        &self.config
    }

    /// `SLURM_CONF` for the collector's `scontrol`.
    pub(crate) fn slurm_conf(&self) -> &Path {
        self.cluster.conf()
    }

    /// After the boot: node `guest` drained by railscope for the guest's flapping finding,
    /// once. `http` is the collector's HTTP API.
    pub(crate) fn check(&self, http: SocketAddr) -> anyhow::Result<()> {
        let (ok, shown) = self.cluster.scontrol(&["show", "node", NODE]);
        if !ok {
            bail!("scontrol show node {NODE}: {shown}");
        }
        let view = self.cluster.show(NODE);
        let drains = done_drains(&get_json(http, "/api/v1/actions")?);
        let [drain] = drains.as_slice() else {
            bail!(
                "{} drains of node {NODE} done in /api/v1/actions, expected 1: {drains:?}",
                drains.len()
            );
        };
        let id = drain["finding"].as_str().unwrap_or_default();
        let findings = get_json(http, &format!("/api/v1/findings?node={NODE}"))?;
        let flapping = findings["findings"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|f| f["id"] == id && f["rule"] == "ib_link_flapping" && f["node"] == NODE);
        if !flapping {
            bail!("the drain names finding {id:?}, not a flapping finding of {NODE}: {findings}");
        }
        let reason = format!("railscope: ib_link_flapping {id}");
        if !view.drained() || view.reason.as_deref() != Some(reason.as_str()) {
            bail!(
                "scontrol show node {NODE}: State={} Reason={:?}, expected drained with \
                 Reason={reason:?}:\n{shown}",
                view.state,
                view.reason
            );
        }
        let logged = self.cluster.drains_logged(NODE);
        if logged != 1 {
            bail!("slurmctld logged {logged} drains of {NODE}, expected 1");
        }
        eprintln!(
            "    slurm-drain: scontrol shows {NODE} {} ({reason})",
            view.state
        );
        Ok(())
    }
}

/// The audit records of a drain of [`NODE`] Slurm made.
fn done_drains(actions: &Value) -> Vec<Value> {
    actions["records"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["node"] == NODE && r["action"] == "drain" && r["outcome"] == "done")
        .cloned()
        .collect()
}

fn get_json(http: SocketAddr, path: &str) -> anyhow::Result<Value> {
    let (status, body) = http_get(http, path)?;
    if status != 200 {
        bail!("GET {path}: {status} {body}");
    }
    serde_json::from_str(&body).with_context(|| format!("GET {path}: not JSON"))
}
