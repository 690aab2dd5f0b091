//! The real agent binary on a fixture node: an mlx5- or rxe-modelled sysfs tree
//! (monitor-user/tests/fixtures/sysfs) and the NVML stand-in replaying a script (not a GPU;
//! docs/nvml-standin.md).

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::Command,
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

/// `railscope`, next to another binary of the workspace (`cargo test` of the workspace builds
/// both; `cargo build -p monitor-user` otherwise).
pub fn agent_binary_next_to(binary: &str) -> PathBuf {
    let path = Path::new(binary).with_file_name("railscope");
    assert!(
        path.is_file(),
        "{} is missing: build the agent too (cargo build -p monitor-user, or cargo test for the workspace)",
        path.display()
    );
    path
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

/// `railscope agent --collector ADDR --key KEY --sysfs TREE` and what a test adds
/// (`--node`, `--nvml-lib` or `--no-gpu`, the cadence).
pub struct FixtureAgent {
    args: Vec<OsString>,
}

impl FixtureAgent {
    pub fn new(collector: &str, key: &Path, sysfs: &Path) -> Self {
        let args = vec![
            "agent".into(),
            "--collector".into(),
            collector.into(),
            "--key".into(),
            key.into(),
            "--sysfs".into(),
            sysfs.into(),
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
        Running::spawn(program.as_ref(), &self.args)
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
