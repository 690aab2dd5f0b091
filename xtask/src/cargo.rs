//! Running cargo for the workspace with the toolchain parts `setup` installed.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

/// The workspace root (the parent of this crate's manifest directory).
pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// A `cargo` command in the workspace, with bpf-linker on PATH.
pub(crate) fn command(tools: &crate::tools::Tools) -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace_root())
        .env("PATH", tools.path_with_bpf_linker());
    cmd
}

/// Runs a command, failing with its rendering when it exits non-zero.
pub(crate) fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("failed to start {cmd:?}"))?;
    if !status.success() {
        bail!("{} failed ({status})", render(cmd));
    }
    Ok(())
}

/// Runs a command and returns its stdout, trimmed; fails with its rendering and stderr.
pub(crate) fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let rendered = render(cmd);
    let out = cmd
        .output()
        .with_context(|| format!("failed to start {rendered}"))?;
    if !out.status.success() {
        bail!(
            "{rendered} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// `program arg arg ...` for messages.
pub(crate) fn render(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|s| s.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Builds `package`'s example `name` (release) and returns its path.
pub(crate) fn build_example(
    tools: &crate::tools::Tools,
    package: &str,
    name: &str,
) -> anyhow::Result<PathBuf> {
    let mut cmd = command(tools);
    cmd.args([
        "build",
        "--release",
        "--package",
        package,
        "--example",
        name,
    ]);
    build_executables(cmd)?
        .into_iter()
        .find(|(built, _)| built == name)
        .map(|(_, path)| path)
        .with_context(|| format!("cargo did not report the {name} example"))
}

/// Builds with `--message-format=json` and returns the executables cargo reports, by target name.
pub(crate) fn build_executables(cmd: Command) -> anyhow::Result<Vec<(String, PathBuf)>> {
    Ok(artifacts(cmd)?
        .into_iter()
        .filter_map(|a| Some((a.name, a.executable?)))
        .collect())
}

/// Builds with `--message-format=json` and returns the file named `file_name` among those
/// cargo reports (a library's `.so`), wherever the target directory is (`CARGO_TARGET_DIR`).
pub(crate) fn build_file(cmd: Command, file_name: &str) -> anyhow::Result<PathBuf> {
    artifacts(cmd)?
        .into_iter()
        .filter(|a| !a.test)
        .flat_map(|a| a.filenames)
        .find(|f| f.file_name().is_some_and(|n| n == file_name))
        .with_context(|| format!("cargo did not report {file_name}"))
}

/// One target cargo built, as its `compiler-artifact` message says.
struct Artifact {
    /// The target's name (`railscope`, `monitor_user`, `nvml_standin`).
    name: String,
    /// Whether it is a test harness (a crate's unit tests, an integration test).
    test: bool,
    /// The target's kinds (`lib`, `cdylib`, `bin`, `test`, `example`).
    kinds: Vec<String>,
    executable: Option<PathBuf>,
    /// What the target produced (a library's `.so`, `.rlib`, ...).
    filenames: Vec<PathBuf>,
    /// The package's manifest (`<workspace>/<package>/Cargo.toml`).
    manifest: PathBuf,
}

/// Builds with `--message-format=json` and returns every artifact cargo reports.
fn artifacts(mut cmd: Command) -> anyhow::Result<Vec<Artifact>> {
    cmd.arg("--message-format=json-render-diagnostics")
        .stdout(std::process::Stdio::piped());
    let rendered = render(&cmd);
    let output = cmd
        .spawn()
        .with_context(|| format!("failed to start {rendered}"))?
        .wait_with_output()?;
    if !output.status.success() {
        bail!("{rendered} failed ({})", output.status);
    }
    let mut artifacts = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" {
            continue;
        }
        let Some(name) = msg["target"]["name"].as_str() else {
            continue;
        };
        artifacts.push(Artifact {
            name: name.to_owned(),
            test: msg["profile"]["test"].as_bool().unwrap_or(false),
            kinds: msg["target"]["kind"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|k| k.as_str().map(str::to_owned))
                .collect(),
            executable: msg["executable"].as_str().map(PathBuf::from),
            filenames: msg["filenames"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| f.as_str().map(PathBuf::from))
                .collect(),
            manifest: msg["manifest_path"]
                .as_str()
                .map(PathBuf::from)
                .unwrap_or_default(),
        });
    }
    Ok(artifacts)
}

/// The workspace's every target built once in release, resolved as `cargo test --release`
/// resolves it, with what cargo reported.
///
/// Why the suite builds this way: `cargo build -p X` resolves the dependencies' features for
/// X alone, not for the workspace, so each `-p` build after the workspace's tests built some
/// fifty crates again with other features (the agent for the collector's tests, the guest
/// init, the agent's unit tests for the guest, the collector, the package's two binaries, the
/// NVML stand-in: about 8 minutes of a CI run on 2 cores). `cargo xtask test` builds once
/// and every later step takes its binaries from here: the testkit through
/// `RAILSCOPE_AGENT_BINARY`, the VM scenarios and the package test through this value.
pub(crate) struct WorkspaceBuild {
    artifacts: Vec<Artifact>,
}

impl WorkspaceBuild {
    /// `cargo build --release --all-targets`: the default members' libraries, binaries,
    /// tests and examples (what `cargo test --release` then runs without building again).
    pub(crate) fn run(tools: &crate::tools::Tools) -> anyhow::Result<Self> {
        crate::progress::step(
            "building the workspace once (cargo build --release --all-targets): the tests, the \
             guests and the package all take their binaries from this build",
        );
        let mut cmd = command(tools);
        cmd.args(["build", "--release", "--all-targets"]);
        Ok(Self {
            artifacts: artifacts(cmd)?,
        })
    }

    /// The binary `name` (not its unit-test harness).
    pub(crate) fn binary(&self, name: &str) -> anyhow::Result<PathBuf> {
        self.artifacts
            .iter()
            .find(|a| a.name == name && !a.test)
            .and_then(|a| a.executable.clone())
            .with_context(|| format!("the workspace build did not report the binary {name}"))
    }

    /// The example `name` of the package in folder `package`.
    pub(crate) fn example(&self, package: &str, name: &str) -> anyhow::Result<PathBuf> {
        self.artifacts
            .iter()
            .find(|a| {
                a.name == name
                    && !a.test
                    && a.manifest.parent().and_then(|d| d.file_name()) == Some(package.as_ref())
            })
            .and_then(|a| a.executable.clone())
            .with_context(|| {
                format!("the workspace build did not report {package}'s example {name}")
            })
    }

    /// The unit-test harness of library `name` (`monitor_user`).
    pub(crate) fn unit_tests(&self, name: &str) -> anyhow::Result<PathBuf> {
        self.artifacts
            .iter()
            .find(|a| a.name == name && a.test && a.kinds.iter().any(|k| k == "lib"))
            .and_then(|a| a.executable.clone())
            .with_context(|| format!("the workspace build did not report {name}'s unit tests"))
    }

    /// The file `file_name` a library target produced (`libnvml_standin.so`).
    pub(crate) fn library_file(&self, file_name: &str) -> anyhow::Result<PathBuf> {
        self.artifacts
            .iter()
            .filter(|a| !a.test)
            .flat_map(|a| &a.filenames)
            .find(|f| f.file_name().is_some_and(|n| n == file_name))
            .cloned()
            .with_context(|| format!("the workspace build did not report {file_name}"))
    }
}
