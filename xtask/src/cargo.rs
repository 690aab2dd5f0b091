//! Running cargo for the workspace with the toolchain parts `setup` installed.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

/// The workspace root (the parent of this crate's manifest directory).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// A `cargo` command in the workspace, with bpf-linker on PATH.
pub fn command(tools: &crate::tools::Tools) -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace_root())
        .env("PATH", tools.path_with_bpf_linker());
    cmd
}

/// Runs a command, failing with its rendering when it exits non-zero.
pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("failed to start {cmd:?}"))?;
    if !status.success() {
        bail!("{} failed ({status})", render(cmd));
    }
    Ok(())
}

/// Runs a command and returns its stdout, trimmed; fails with its rendering and stderr.
pub fn output(cmd: &mut Command) -> anyhow::Result<String> {
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
pub fn render(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|s| s.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Builds `package`'s example `name` (release) and returns its path.
pub fn build_example(
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
pub fn build_executables(mut cmd: Command) -> anyhow::Result<Vec<(String, PathBuf)>> {
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
    let mut executables = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" {
            continue;
        }
        if let (Some(name), Some(exe)) =
            (msg["target"]["name"].as_str(), msg["executable"].as_str())
        {
            executables.push((name.to_owned(), PathBuf::from(exe)));
        }
    }
    Ok(executables)
}
