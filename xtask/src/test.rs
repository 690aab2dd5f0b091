//! `cargo xtask test`: every test, as CI runs them — the workspace's unit and host tests
//! (including loading the eBPF object into this kernel's verifier), the systemd units'
//! check (`units`), each fuzz target for 20 s (`fuzz`), then the soft-RoCE scenarios in QEMU
//! guests on every kernel line (Debian 6.1 and 6.12), then the Debian package in a systemd
//! Debian guest (`package_test`).

use crate::{cargo, fuzz, package_test, setup, units, vm_test};

/// Seconds each fuzz target runs in the suite.
const FUZZ_SECONDS: u64 = 20;

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
    let built = cargo::WorkspaceBuild::run(&tools)?;
    let fuzz_build = fuzz::BackgroundBuild::start(&tools)?;
    setup::step("unit and host tests (cargo test)");
    // The default members: every crate but the eBPF one, which only builds for the bpf target.
    // The remote-write tests skip when Prometheus or VictoriaMetrics is missing under a
    // plain `cargo test`; here setup installed them, so a missing server is a failure. The
    // same for Chromium and the dashboard test, Slurm and the actions' tests, and ethtool and
    // the agent's ethtool test. The collector's end-to-end tests run the agent the build
    // above made, rather than building it again for monitor-user alone.
    cargo::run(
        cargo::command(&tools)
            .args(["test", "--release"])
            .env("RAILSCOPE_REQUIRE_TSDB", "1")
            .env("RAILSCOPE_REQUIRE_SLURM", "1")
            .env("RAILSCOPE_REQUIRE_PROMTOOL", "1")
            .env("RAILSCOPE_REQUIRE_ALERTMANAGER", "1")
            .env("RAILSCOPE_REQUIRE_CHROMIUM", "1")
            .env("RAILSCOPE_REQUIRE_ETHTOOL", "1")
            .env(
                monitor_testkit::fixture_agent::AGENT_BINARY_ENV,
                built.binary("railscope")?,
            ),
    )?;
    units::check(&cargo::workspace_root().join("target/release"))?;
    // Every decoder of outside input, fuzzed for a short bounded time (`cargo xtask fuzz`
    // runs them longer).
    let seeds = fuzz::make_seeds(&tools, &cargo::workspace_root(), Some(&built))?;
    fuzz_build.wait()?;
    let outcomes = fuzz::run_built_targets(&tools, &seeds, fuzz::TARGETS, FUZZ_SECONDS, None)?;
    eprint!("{}", fuzz::summary(&outcomes));
    let total: u64 = outcomes.iter().map(|o| o.executions).sum();
    let each: Vec<String> = outcomes
        .iter()
        .map(|o| format!("{} {}", o.target, o.executions))
        .collect();
    setup::step(&format!(
        "fuzzing: {total} executions, no finding ({})",
        each.join(", ")
    ));
    if options.no_vm {
        setup::step("skipping the VM scenarios (--no-vm)");
        return Ok(());
    }
    // The full suite proves the probes on every kernel line the test bed knows, unless
    // --kernel narrows it.
    let mut vm = options.vm.clone();
    vm.ci = true;
    if vm.kernel.is_empty() {
        vm.all_kernels = true;
    }
    vm_test::run_with(&tools, &vm, Some(&built))?;
    // The Debian package installed, run and removed in a systemd Debian guest.
    package_test::run_with(
        &tools,
        &package_test::Options {
            kernel: crate::testbed::KernelLine::Bookworm,
            all_kernels: false,
            timeout: package_test::DEFAULT_TIMEOUT,
            setup: options.vm.setup.clone(),
        },
        Some(&built),
    )
}
