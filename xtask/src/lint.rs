//! `cargo xtask lint`: rustfmt, the import-circle guard (`circles`) and clippy as CI runs
//! them (clippy needs bpf-linker on PATH because building monitor-user builds the probes).

mod circles;

use crate::{cargo, setup};

#[derive(Debug, clap::Args)]
pub(crate) struct Options {
    #[command(flatten)]
    pub setup: setup::Options,
}

pub(crate) fn run(options: &Options) -> anyhow::Result<()> {
    let tools = setup::run(&options.setup)?;
    setup::step("cargo fmt --all --check");
    cargo::run(cargo::command(&tools).args(["fmt", "--all", "--check"]))?;
    setup::step("no import circle among any crate's modules");
    circles::check_workspace(&cargo::workspace_root())?;
    // `--release`: the same code and lints (no code of the workspace depends on
    // `debug_assertions`), and the release profile's build scripts' runs (the eBPF object,
    // zstd's and ring's C) and proc macros that `cargo xtask test` built are taken as they
    // are: 2 min 17 s here against 4 min 22 s in the dev profile, after the suite.
    setup::step("cargo clippy --release --all-targets -- -D warnings");
    cargo::run(cargo::command(&tools).args([
        "clippy",
        "--release",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    Ok(())
}
