//! `cargo xtask run`: the main job on this node — build, load the probes, print the probe
//! table and run the agent until Ctrl-C.

use std::os::unix::process::CommandExt as _;

use anyhow::bail;

use crate::{build, setup};

#[derive(Debug, clap::Args)]
pub struct Options {
    /// Arguments passed to `railscope agent` (e.g. `-- --json`).
    #[arg(last = true)]
    pub agent_args: Vec<String>,
    #[command(flatten)]
    pub setup: setup::Options,
}

pub fn run(options: &Options) -> anyhow::Result<()> {
    setup::require_root("loading eBPF probes")?;
    let tools = setup::run(&options.setup)?;
    let railscope = build::railscope_binary(&tools, true)?;
    setup::step(&format!(
        "starting {} agent (Ctrl-C stops it)",
        railscope.display()
    ));
    // The agent prints the probe table itself, then events. exec() so Ctrl-C and the exit
    // status belong to the agent, not to this wrapper.
    let err = std::process::Command::new(&railscope)
        .arg("agent")
        .args(&options.agent_args)
        .exec();
    bail!("could not start {}: {err}", railscope.display())
}
