//! A real Slurm cluster on loopback for the actions' tests, from Debian's packages
//! (`slurmctld`, `slurmd`, `slurm-client`, `munge`; `cargo xtask setup` installs them): its
//! own munge key and socket, its own `slurm.conf`, state and logs in a scratch directory, a
//! controller on a free port and one `slurmd -N NAME` per node (each on its own port), so the
//! nodes register and are IDLE, as a cluster's are. Nothing is installed as a service and
//! nothing outside the directory is touched: `scontrol` finds this cluster through
//! `SLURM_CONF`, which [`SlurmCluster::conf`] names and a collector's environment carries.
//! Every daemon is this cluster's child, killed when it is dropped.

use std::{
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use crate::{child::Running, scratch::free_tcp_port};

/// How long the controller and the nodes may take to come up.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// A program of the packages, found in `PATH` or in /usr/sbin (root's `PATH` only).
fn program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/usr/bin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Whether `test` can start a cluster: true if the packages are there; if not, the test says
/// why it does nothing, or fails where `RAILSCOPE_REQUIRE_SLURM=1` (set by `cargo xtask
/// test`, which installs them first).
pub fn installed_for(test: &str) -> bool {
    match missing() {
        None => true,
        Some(what) => {
            assert!(
                !std::env::var("RAILSCOPE_REQUIRE_SLURM").is_ok_and(|v| v == "1"),
                "{test}: {what}, and RAILSCOPE_REQUIRE_SLURM=1"
            );
            eprintln!("SKIPPED {test}: {what}");
            false
        }
    }
}

/// The installed `scontrol` (for a test's wrapper around it).
pub fn scontrol_program() -> Option<PathBuf> {
    program("scontrol")
}

/// What is missing to start a cluster (the packages not installed), or None.
pub fn missing() -> Option<String> {
    let absent: Vec<&str> = ["slurmctld", "slurmd", "scontrol", "munged"]
        .into_iter()
        .filter(|p| program(p).is_none())
        .collect();
    (!absent.is_empty()).then(|| {
        format!(
            "{} not installed (Debian packages slurmctld, slurmd, slurm-client, munge; \
             `cargo xtask setup` installs them)",
            absent.join(", ")
        )
    })
}

/// A node as `scontrol show node` describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeView {
    /// `State=`, e.g. `IDLE+DRAIN`.
    pub state: String,
    /// `Reason=` without Slurm's `[user@time]` suffix.
    pub reason: Option<String>,
}

impl NodeView {
    pub fn drained(&self) -> bool {
        self.state.split('+').any(|f| f.starts_with("DRAIN"))
    }
}

pub struct SlurmCluster {
    dir: PathBuf,
    conf: PathBuf,
    nodes: Vec<String>,
    // Dropped (killed) in reverse: nodes, controller, munge.
    slurmds: Vec<Running>,
    slurmctld: Option<Running>,
    _munged: Running,
}

impl SlurmCluster {
    /// Starts munge, the controller and a `slurmd` per node under `dir` (which must be short:
    /// the munge socket's path is limited to 108 bytes), and waits until every node is IDLE.
    pub fn start(dir: &Path, nodes: &[&str]) -> SlurmCluster {
        if let Some(what) = missing() {
            panic!("no Slurm: {what}");
        }
        std::fs::create_dir_all(dir.join("state")).unwrap();
        std::fs::create_dir_all(dir.join("spool")).unwrap();
        let key = dir.join("munge.key");
        let bytes: Vec<u8> = (0..1024).map(|_| fastrand::u8(..)).collect();
        std::fs::write(&key, bytes).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400)).unwrap();
        let socket = dir.join("munge.sock");
        let munged = Running::spawn(
            program("munged").unwrap(),
            [
                "--foreground".into(),
                "--force".into(),
                format!("--key-file={}", key.display()),
                format!("--socket={}", socket.display()),
                format!("--pid-file={}", dir.join("munged.pid").display()),
                format!("--log-file={}", dir.join("munged.log").display()),
                format!("--seed-file={}", dir.join("munged.seed").display()),
            ],
        );
        wait_until(
            "munged's socket",
            || socket.exists(),
            || read(&dir.join("munged.log")),
        );

        let user = current_user();
        let ctld_port = free_tcp_port();
        let mut conf = format!(
            "# railscope's test cluster (monitor-testkit/src/slurm.rs)\n\
             ClusterName=railscope\n\
             SlurmctldHost=localhost(127.0.0.1)\n\
             SlurmctldPort={ctld_port}\n\
             SlurmUser={user}\n\
             SlurmdUser={user}\n\
             AuthType=auth/munge\n\
             CredType=cred/munge\n\
             AuthInfo=socket={socket}\n\
             StateSaveLocation={dir}/state\n\
             SlurmdSpoolDir={dir}/spool/%n\n\
             SlurmctldPidFile={dir}/slurmctld.pid\n\
             SlurmdPidFile={dir}/slurmd-%n.pid\n\
             SlurmctldLogFile={dir}/slurmctld.log\n\
             SlurmdLogFile={dir}/slurmd-%n.log\n\
             SlurmctldDebug=info\n\
             ProctrackType=proctrack/linuxproc\n\
             TaskPlugin=task/none\n\
             JobAcctGatherType=jobacct_gather/none\n\
             SchedulerType=sched/builtin\n\
             SelectType=select/linear\n\
             MpiDefault=none\n\
             ReturnToService=2\n\
             SlurmdTimeout=300\n",
            socket = socket.display(),
            dir = dir.display(),
        );
        for node in nodes {
            conf.push_str(&format!(
                "NodeName={node} NodeAddr=127.0.0.1 Port={} CPUs=1 RealMemory=1\n",
                free_tcp_port()
            ));
        }
        conf.push_str("PartitionName=all Nodes=ALL Default=YES State=UP\n");
        let conf_path = dir.join("slurm.conf");
        std::fs::write(&conf_path, conf).unwrap();

        let mut cluster = SlurmCluster {
            dir: dir.to_owned(),
            conf: conf_path.clone(),
            nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
            slurmds: Vec::new(),
            slurmctld: None,
            _munged: munged,
        };
        cluster.start_controller();
        for node in nodes {
            let mut command = Running::command(program("slurmd").unwrap());
            command
                .args(["-D", "-N", node, "-f"])
                .arg(&conf_path)
                .env("SLURM_CONF", &conf_path);
            cluster.slurmds.push(Running::spawn_command(command));
        }
        wait_until(
            "every node IDLE",
            || {
                cluster
                    .nodes
                    .iter()
                    .all(|n| cluster.try_show(n).is_some_and(|v| v.state == "IDLE"))
            },
            || cluster.logs(),
        );
        cluster
    }

    fn start_controller(&mut self) {
        let mut command = Running::command(program("slurmctld").unwrap());
        command
            .args(["-D", "-f"])
            .arg(&self.conf)
            .env("SLURM_CONF", &self.conf);
        self.slurmctld = Some(Running::spawn_command(command));
        wait_until(
            "slurmctld answering",
            || self.scontrol(&["ping"]).0 && self.try_show(&self.nodes[0]).is_some(),
            || self.logs(),
        );
    }

    /// Kills the controller (the nodes and their state stay): Slurm down.
    pub fn stop_controller(&mut self) {
        if let Some(ctld) = self.slurmctld.take() {
            let _ = ctld.signal(libc::SIGKILL);
        }
    }

    /// Starts the controller again on the same state.
    pub fn restart_controller(&mut self) {
        self.stop_controller();
        self.start_controller();
    }

    /// The `slurm.conf` this cluster runs on: `SLURM_CONF` for `scontrol`.
    pub fn conf(&self) -> &Path {
        &self.conf
    }

    /// `scontrol ARGS` on this cluster: (succeeded, stdout and stderr).
    pub fn scontrol(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(program("scontrol").unwrap())
            .args(args)
            .env("SLURM_CONF", &self.conf)
            .output()
            .unwrap();
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    }

    fn try_show(&self, node: &str) -> Option<NodeView> {
        let (ok, text) = self.scontrol(&["show", "node", node]);
        if !ok {
            return None;
        }
        let state = text
            .split_whitespace()
            .find_map(|w| w.strip_prefix("State="))?
            .to_owned();
        let reason = text
            .lines()
            .find_map(|l| l.trim_start().strip_prefix("Reason="))
            .map(|r| match r.trim_end().rfind(" [") {
                Some(i) => r[..i].to_owned(),
                None => r.trim_end().to_owned(),
            });
        Some(NodeView { state, reason })
    }

    /// What Slurm says of `node` now.
    pub fn show(&self, node: &str) -> NodeView {
        self.try_show(node)
            .unwrap_or_else(|| panic!("scontrol show node {node} failed:\n{}", self.logs()))
    }

    /// Drains `node` as an operator does, with their own reason.
    pub fn drain_by_hand(&self, node: &str, reason: &str) {
        let (ok, text) = self.scontrol(&[
            "update",
            &format!("NodeName={node}"),
            "State=DRAIN",
            &format!("Reason={reason}"),
        ]);
        assert!(ok, "scontrol drain {node}: {text}");
    }

    /// Resumes `node` as an operator does.
    pub fn resume_by_hand(&self, node: &str) {
        let (ok, text) = self.scontrol(&["update", &format!("NodeName={node}"), "State=RESUME"]);
        assert!(ok, "scontrol resume {node}: {text}");
    }

    /// How many times the controller set a drain reason on `node` (its log's
    /// `update_node: node NODE reason set to: ...` lines): each is one drain made.
    pub fn drains_logged(&self, node: &str) -> usize {
        let needle = format!("update_node: node {node} reason set to:");
        read(&self.dir.join("slurmctld.log"))
            .lines()
            .filter(|l| l.contains(&needle))
            .count()
    }

    /// The controller's log and the first node's, for a failing test's message.
    pub fn logs(&self) -> String {
        let tail = |p: &Path| {
            let text = read(p);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(30)..].join("\n")
        };
        format!(
            "--- slurmctld.log\n{}\n--- slurmd-{}.log\n{}",
            tail(&self.dir.join("slurmctld.log")),
            self.nodes[0],
            tail(&self.dir.join(format!("slurmd-{}.log", self.nodes[0])))
        )
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The name of the user the tests run as (the cluster's SlurmUser: it may do everything).
fn current_user() -> String {
    let out = Command::new("id").arg("-un").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn wait_until(what: &str, mut ready: impl FnMut() -> bool, logs: impl Fn() -> String) {
    let start = Instant::now();
    while !ready() {
        assert!(
            start.elapsed() < READY_WITHIN,
            "Slurm test cluster: no {what} after {READY_WITHIN:?}:\n{}",
            logs()
        );
        thread::sleep(Duration::from_millis(200));
    }
}
