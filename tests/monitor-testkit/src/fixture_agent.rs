//! The real agent binary on a fixture node: an mlx5- or rxe-modelled sysfs tree
//! (monitor-user/tests/fixtures/sysfs) and the NVML stand-in replaying a script (not a GPU;
//! docs/nvml-standin.md).

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        OnceLock,
        atomic::{AtomicU32, Ordering},
    },
};

use crate::child::Running;

/// The stand-in's file name as cargo builds it.
const STANDIN: &str = "libnvml_standin.so";

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The fixture sysfs tree `name` (`mlx5`, `rxe`, ...).
pub fn sysfs_fixture(name: &str) -> PathBuf {
    workspace_root()
        .join("monitor-user/tests/fixtures/sysfs")
        .join(name)
}

/// The environment variable naming an agent binary built already: `cargo xtask test` sets
/// it to the one its workspace build made (the NVML stand-in's library lies beside it), so
/// no test builds the agent again.
pub const AGENT_BINARY_ENV: &str = "RAILSCOPE_AGENT_BINARY";

/// `railscope`, next to another binary of the workspace (`binary`, the calling test's
/// `CARGO_BIN_EXE_...`), built first; or the binary [`AGENT_BINARY_ENV`] names.
///
/// The collector's end-to-end tests run the agent's binary, which cargo builds for a test of
/// the whole workspace but not for `cargo test -p monitor-collector`, and cargo cannot name
/// another package's binary as a test's dependency on stable. So the first call of a test
/// process builds it (`cargo build -p monitor-user --bin railscope`, same profile and target
/// directory; a no-op when it is up to date): the test never runs a missing or stale agent.
/// That build resolves the dependencies' features for monitor-user alone, so after a
/// workspace build it builds some fifty crates again (minutes): the suite, which built the
/// agent with the workspace, names it instead.
pub fn agent_binary_next_to(binary: &str) -> PathBuf {
    if let Some(built) = std::env::var_os(AGENT_BINARY_ENV) {
        let path = PathBuf::from(built);
        assert!(
            path.is_file(),
            "{AGENT_BINARY_ENV}={} names no file",
            path.display()
        );
        return path;
    }
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    if let Err(why) = BUILT.get_or_init(|| build_agent_next_to(Path::new(binary))) {
        panic!("the agent binary could not be built: {why}");
    }
    let path = Path::new(binary).with_file_name("railscope");
    assert!(
        path.is_file(),
        "{} is missing after its build",
        path.display()
    );
    path
}

/// Builds `railscope` into the profile directory `binary` lies in (`<target>/<profile>/`).
fn build_agent_next_to(binary: &Path) -> Result<(), String> {
    let profile_dir = binary
        .parent()
        .ok_or_else(|| format!("{} has no directory", binary.display()))?;
    let target_dir = profile_dir
        .parent()
        .ok_or_else(|| format!("{} has no target directory", profile_dir.display()))?;
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev".to_string(),
        Some(name) => name.to_string(),
        None => return Err(format!("{} names no profile", profile_dir.display())),
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(&cargo)
        .args([
            "build",
            "--quiet",
            "--package",
            "monitor-user",
            "--bin",
            "railscope",
        ])
        .arg("--profile")
        .arg(&profile)
        .arg("--target-dir")
        .arg(target_dir)
        .current_dir(workspace_root())
        .status()
        .map_err(|e| format!("{}: {e}", Path::new(&cargo).display()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "cargo build -p monitor-user --bin railscope --profile {profile}: {status}"
        ))
    }
}

/// The stand-in library (a dev-dependency of the calling test, built next to it) copied into
/// `dir` with the shipped 8-GPU script, so the test has its own replay. Returns the library.
pub fn standin_with_script(dir: &Path) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let built = [deps.join(STANDIN), deps.join("..").join(STANDIN)]
        .into_iter()
        .find(|p| p.exists())
        .expect(
            "the NVML stand-in is built as a dev-dependency; run `cargo build -p nvml-standin`",
        );
    let lib = dir.join(STANDIN);
    std::fs::copy(built, &lib).unwrap();
    let script = workspace_root().join("tests/nvml-standin/scripts/h100x8.json");
    std::fs::copy(script, dir.join("nvml-standin.json")).unwrap();
    lib
}

/// `railscope agent --collector ADDR --key KEY --sysfs TREE --spool-dir DIR` and what a test
/// adds (`--node`, `--nvml-lib` or `--no-gpu`, the cadence). The spool directory is this
/// agent's own (every start of it shares it, as a restarted agent does), so that tests never
/// resume each other's sessions from the default one.
pub struct FixtureAgent {
    args: Vec<OsString>,
}

impl FixtureAgent {
    pub fn new(collector: &str, key: &Path, sysfs: &Path) -> Self {
        static AGENTS: AtomicU32 = AtomicU32::new(0);
        let spool = std::env::temp_dir().join(format!(
            "railscope-spool-{}-{}",
            std::process::id(),
            AGENTS.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&spool);
        let args = vec![
            "agent".into(),
            "--collector".into(),
            collector.into(),
            "--key".into(),
            key.into(),
            "--sysfs".into(),
            sysfs.into(),
            "--spool-dir".into(),
            spool.into(),
        ];
        Self { args }
    }

    pub fn node(self, node: &str) -> Self {
        self.args(["--node", node])
    }

    /// GPUs read through this NVML library (the stand-in from [`standin_with_script`]).
    pub fn nvml_lib(self, lib: &Path) -> Self {
        self.args([OsString::from("--nvml-lib"), lib.into()])
    }

    /// Sampling every `interval` and flushing every `flush` (seconds, as on the command line).
    pub fn cadence(self, interval: &str, flush: &str) -> Self {
        self.args(["--interval", interval, "--flush", flush])
    }

    pub fn args(mut self, args: impl IntoIterator<Item = impl Into<OsString>>) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Starts `railscope` (at `program`) with these arguments.
    pub fn spawn(&self, program: impl AsRef<Path>) -> Running {
        Running::spawn(
            program.as_ref(),
            crate::scratch::without_host_config(&self.args),
        )
    }

    /// Starts `railscope` (at `program`) with these arguments in the network namespace
    /// `netns` (`ip netns exec`, which runs it in its own place: signals reach the agent).
    pub fn spawn_in_netns(&self, program: impl AsRef<Path>, netns: &str) -> Running {
        let mut args: Vec<OsString> = vec!["netns".into(), "exec".into(), netns.into()];
        args.push(program.as_ref().into());
        args.extend(crate::scratch::without_host_config(&self.args));
        Running::spawn("ip", &args)
    }
}

/// `railscope listen` (at `program`) on 127.0.0.1:`port`, printing each frame it decodes as
/// a JSON line: what the agent tests read as the collector's side.
pub fn spawn_json_listener(program: impl AsRef<Path>, port: u16, key: &Path) -> Running {
    Running::spawn_command(json_listener_command(program, port, key))
}

/// The command [`spawn_json_listener`] starts, for a test that changes how it starts.
pub fn json_listener_command(program: impl AsRef<Path>, port: u16, key: &Path) -> Command {
    let mut command = Running::command(program.as_ref());
    command
        .args(["listen", "--port", &port.to_string(), "--bind", "127.0.0.1"])
        .arg("--key")
        .arg(key)
        .arg("--json");
    command
}
