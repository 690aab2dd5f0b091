//! `cargo xtask test`: every test, as CI runs them — the workspace's unit and host tests
//! (including loading the eBPF object into this kernel's verifier), the systemd units'
//! check (`units`), then the soft-RoCE scenarios in QEMU guests on every kernel line (Debian
//! 6.1 and 6.12).

use crate::{cargo, setup, units, vm_test};

#[derive(Debug, clap::Args)]
pub struct Options {
    /// Skip the QEMU scenarios (unit and host tests only).
    #[arg(long)]
    pub no_vm: bool,
    #[command(flatten)]
    pub vm: vm_test::Options,
}

pub fn run(options: &Options) -> anyhow::Result<()> {
    setup::require_root("loading eBPF programs in the host tests")?;
    let tools = setup::run(&options.vm.setup)?;
    setup::step("unit and host tests (cargo test)");
    // The default members: every crate but the eBPF one, which only builds for the bpf target.
    // The remote-write tests skip when Prometheus or VictoriaMetrics is missing under a
    // plain `cargo test`; here setup installed them, so a missing server is a failure.
    cargo::run(
        cargo::command(&tools)
            .args(["test", "--release"])
            .env("RAILSCOPE_REQUIRE_TSDB", "1"),
    )?;
    units::check(&cargo::workspace_root().join("target/release"))?;
    if options.no_vm {
        setup::step("skipping the VM scenarios (--no-vm)");
        return Ok(());
    }
    // The full suite proves the probes on every kernel line the test bed knows, unless
    // --kernel narrows it.
    let mut vm = options.vm.clone();
    if vm.kernel.is_empty() {
        vm.all_kernels = true;
    }
    vm_test::run_with(&tools, &vm)
}
