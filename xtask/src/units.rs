//! The systemd units in `dist/`, checked as `cargo xtask test` does: `systemd-analyze verify`
//! accepts both, and the exposure score `systemd-analyze security` gives each is the one
//! docs/deployment.md states (so the document stays true when a unit changes).

use std::{path::Path, process::Command};

use anyhow::{Context as _, bail};

use crate::{cargo, progress};

/// Debian packages the check needs (`systemd-analyze`).
pub(crate) const PACKAGES: &[&str] = &["systemd"];
pub(crate) const UNITS: &[&str] = &["railscope-agent.service", "railscope-collector.service"];
const DOC: &str = "docs/deployment.md";

/// Verifies the units against the binaries in `bin_dir` (their `ExecStart` points there
/// instead of /usr/bin, where `verify` would look for them) and checks the documented scores.
pub(crate) fn check(bin_dir: &Path) -> anyhow::Result<()> {
    progress::step("systemd units: systemd-analyze verify and security");
    let root = cargo::workspace_root();
    let scratch = root.join("target/units-check");
    std::fs::create_dir_all(&scratch)?;
    for unit in UNITS {
        let text = std::fs::read_to_string(root.join("dist").join(unit))
            .with_context(|| format!("reading dist/{unit}"))?;
        let text = text.replace("/usr/bin/", &format!("{}/", bin_dir.display()));
        std::fs::write(scratch.join(unit), text)?;
    }
    let verify = Command::new("systemd-analyze")
        .arg("verify")
        .args(UNITS)
        .current_dir(&scratch)
        .output()
        .context("running systemd-analyze (package systemd)")?;
    let complaints = String::from_utf8_lossy(&verify.stderr);
    if !verify.status.success() || !complaints.trim().is_empty() {
        bail!("systemd-analyze verify: {complaints}");
    }
    let documented = std::fs::read_to_string(root.join(DOC))?;
    let mut wrong = Vec::new();
    for unit in UNITS {
        let score = exposure(&scratch, unit)?;
        eprintln!("    {unit}: exposure {score}");
        let row = format!("| `{unit}` | {score} |");
        if !documented.lines().any(|l| l.starts_with(&row)) {
            wrong.push(format!(
                "{unit}: exposure {score}, not as {DOC} says (expected a row `{row} ...`)"
            ));
        }
    }
    if !wrong.is_empty() {
        bail!("{}", wrong.join("\n"));
    }
    Ok(())
}

/// `systemd-analyze security --offline=true UNIT`'s overall exposure, e.g. `4.0`.
fn exposure(dir: &Path, unit: &str) -> anyhow::Result<String> {
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--no-pager", unit])
        .current_dir(dir)
        .output()
        .context("running systemd-analyze security")?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| {
            let rest = l
                .split(&format!("Overall exposure level for {unit}: "))
                .nth(1)?;
            rest.split_whitespace().next().map(str::to_owned)
        })
        .with_context(|| format!("no exposure level for {unit} in: {text}"))
}
