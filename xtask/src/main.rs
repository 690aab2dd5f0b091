//! `cargo xtask`: railscope's developer tasks, one module per subcommand, each owning its
//! options (the layout of aya's own xtask).

mod bench;
mod build;
mod cargo;
mod demo;
mod fuzz;
mod gpu_check;
mod http;
mod lint;
mod package;
mod package_test;
mod progress;
mod run;
mod scratch;
mod setup;
mod test;
mod test_report;
mod testbed;
mod tools;
mod units;
mod vm_test;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "railscope developer tasks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Install what the build and the tests need (idempotent; every other command runs it).
    Setup(setup::Options),
    /// Build the eBPF probes and the `railscope` binary that embeds them.
    Build(build::Options),
    /// Build, start a local collector and the agent sending to it (probes loaded) until Ctrl-C
    /// (needs root).
    Run(run::Options),
    /// Run every test: unit tests, host eBPF load tests and the soft-RoCE VM scenarios.
    Test(test::Options),
    /// Check formatting, refuse import circles among a crate's modules and run clippy with
    /// warnings denied, as CI does.
    Lint(lint::Options),
    /// Build the Debian package (binaries with the eBPF object, units, example configs, key
    /// tool, docs) and check it with lintian; prints the path of the .deb.
    Package(package::Options),
    /// Prove the Debian package in a systemd Debian guest (debootstrap, cached): install,
    /// units ready, probes attached, frames archived, the agent's syscall filter, a module
    /// reload, restarts and watchdog, remove, purge.
    PackageTest(package_test::Options),
    /// Check the systemd units in dist/ as `test` does: `systemd-analyze verify`, and each
    /// unit's exposure score as docs/deployment.md gives it (after a release build).
    Units,
    /// Run the soft-RoCE scenarios in QEMU guests booted from stock Debian kernels.
    VmTest(vm_test::Options),
    /// Fuzz every decoder of outside input (frames, schema requests, configuration files,
    /// sysfs values, the NVML stand-in's script) with cargo-fuzz, longer than CI does.
    Fuzz(fuzz::Options),
    /// Benchmark and write the results under bench/results/ (`probes`: eBPF cost per event vs
    /// bpftrace, in the QEMU guest; `agent`: the node agent's wire size, CPU and memory next to
    /// node_exporter, and adaptive sampling).
    Bench(bench::Options),
    /// On a machine with an NVIDIA driver: run the agent against the real libnvidia-ml for a
    /// minute (idle, then under `--load`) and compare every GPU metric with nvidia-smi (and
    /// dcgmi where present); writes bench/results/gpu-check.md. Exits 0 saying so where
    /// there is no GPU.
    GpuCheck(gpu_check::Options),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Setup(options) => setup::run(&options).map(drop),
        Command::Build(options) => build::run(&options).map(drop),
        Command::Run(options) => run::run(&options),
        Command::Test(options) => test::run(&options),
        Command::Lint(options) => lint::run(&options),
        Command::Package(options) => package::run(&options),
        Command::PackageTest(options) => package_test::run(&options),
        Command::Units => units::check(&cargo::workspace_root().join("target/release")),
        Command::VmTest(options) => vm_test::run(&options),
        Command::Bench(options) => bench::run(&options),
        Command::Fuzz(options) => fuzz::run(&options),
        Command::GpuCheck(options) => gpu_check::run(&options),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    #[test]
    fn command_line_is_well_formed() {
        super::Cli::command().debug_assert();
    }
}
