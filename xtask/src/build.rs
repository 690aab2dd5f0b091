//! `cargo xtask build`: the eBPF object (through monitor-user's build script) and the
//! `railscope` binary that embeds it.

use std::path::PathBuf;

use anyhow::Context as _;

use crate::{cargo, setup};

#[derive(Debug, clap::Args)]
pub(crate) struct Options {
    /// Build with the dev profile instead of release.
    #[arg(long)]
    pub debug: bool,
    #[command(flatten)]
    pub setup: setup::Options,
}

/// Builds and returns the path of the `railscope` binary.
pub(crate) fn run(options: &Options) -> anyhow::Result<PathBuf> {
    let tools = setup::run(&options.setup)?;
    railscope_binary(&tools, !options.debug)
}

pub(crate) fn railscope_binary(tools: &setup::Tools, release: bool) -> anyhow::Result<PathBuf> {
    setup::step("building the eBPF probes and the railscope binary");
    let mut cmd = cargo::command(tools);
    cmd.args(["build", "--package", "monitor-user", "--bin", "railscope"]);
    if release {
        cmd.arg("--release");
    }
    cargo::build_executables(cmd)?
        .into_iter()
        .find(|(name, _)| name == "railscope")
        .map(|(_, path)| path)
        .context("cargo did not report the railscope binary")
}
