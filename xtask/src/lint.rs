//! `cargo xtask lint`: rustfmt and clippy as CI runs them (clippy needs bpf-linker on PATH
//! because building monitor-user builds the probes).

use crate::{cargo, setup};

#[derive(Debug, clap::Args)]
pub struct Options {
    #[command(flatten)]
    pub setup: setup::Options,
}

pub fn run(options: &Options) -> anyhow::Result<()> {
    let tools = setup::run(&options.setup)?;
    setup::step("cargo fmt --all --check");
    cargo::run(cargo::command(&tools).args(["fmt", "--all", "--check"]))?;
    setup::step("cargo clippy --all-targets -- -D warnings");
    cargo::run(cargo::command(&tools).args(["clippy", "--all-targets", "--", "-D", "warnings"]))?;
    Ok(())
}
