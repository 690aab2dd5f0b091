//! `cargo xtask test`: every test, as CI runs them — the workspace's unit and host tests
//! (including loading the eBPF object into this kernel's verifier), the systemd units'
//! check (`units`), each fuzz target for 20 s (`fuzz`), then the soft-RoCE scenarios in QEMU
//! guests on every kernel line (Debian 6.1 and 6.12), then the Debian package in a systemd
//! Debian guest (`package_test`). Every step runs whatever failed before it, and the suite
//! ends with one list naming each failure (a test, a fuzz target, a VM scenario).

use crate::{cargo, fuzz, package_test, setup, test_report, units, vm_test};

/// Seconds each fuzz target runs in the suite.
const FUZZ_SECONDS: u64 = 20;

#[derive(Debug, clap::Args)]
pub(crate) struct Options {
    /// Skip the QEMU scenarios (unit and host tests only).
    #[arg(long)]
    pub no_vm: bool,
    #[command(flatten)]
    pub vm: vm_test::Options,
}

pub(crate) fn run(options: &Options) -> anyhow::Result<()> {
    setup::require_root("loading eBPF programs in the host tests")?;
    let tools = setup::run(&options.vm.setup)?;
    // Without the workspace's binaries nothing else can run: the one stop before the end.
    let built = cargo::WorkspaceBuild::run(&tools)?;
    let fuzz_build = fuzz::BackgroundBuild::start(&tools)?;
    // Every step runs whatever failed before it; the list names each failure at the end.
    let mut failures: Vec<String> = Vec::new();
    setup::step("unit and host tests (cargo test --no-fail-fast)");
    // The default members: every crate but the eBPF one, which only builds for the bpf target.
    // The remote-write tests skip when Prometheus or VictoriaMetrics is missing under a
    // plain `cargo test`; here setup installed them, so a missing server is a failure. The
    // same for Chromium and the dashboard test, Slurm and the actions' tests, and ethtool and
    // the agent's ethtool test. The collector's end-to-end tests run the agent the build
    // above made, rather than building it again for monitor-user alone.
    let mut cargo_test = cargo::command(&tools);
    cargo_test
        .args(["test", "--release", "--no-fail-fast"])
        .env("RAILSCOPE_REQUIRE_TSDB", "1")
        .env("RAILSCOPE_REQUIRE_SLURM", "1")
        .env("RAILSCOPE_REQUIRE_PROMTOOL", "1")
        .env("RAILSCOPE_REQUIRE_ALERTMANAGER", "1")
        .env("RAILSCOPE_REQUIRE_CHROMIUM", "1")
        .env("RAILSCOPE_REQUIRE_ETHTOOL", "1")
        .env(
            monitor_testkit::fixture_agent::AGENT_BINARY_ENV,
            built.binary("railscope")?,
        );
    match test_report::run_cargo_test(cargo_test) {
        Ok(failed) => failures.extend(failed.into_iter().map(|f| format!("cargo test: {f}"))),
        Err(e) => failures.push(format!("cargo test: {e:#}")),
    }
    if let Err(e) = units::check(&cargo::workspace_root().join("target/release")) {
        failures.push(format!("systemd units: {e:#}"));
    }
    // Every decoder of outside input, fuzzed for a short bounded time (`cargo xtask fuzz`
    // runs them longer).
    match fuzz_targets(&tools, &built, fuzz_build) {
        Ok(found) => failures.extend(found),
        Err(e) => failures.push(format!("fuzzing: {e:#}")),
    }
    if options.no_vm {
        setup::step("skipping the VM scenarios (--no-vm)");
        return verdict(&failures);
    }
    // The full suite proves the probes on every kernel line the test bed knows, unless
    // --kernel narrows it.
    let mut vm = options.vm.clone();
    vm.ci = true;
    if vm.kernel.is_empty() {
        vm.all_kernels = true;
    }
    match vm_test::failed_scenarios(&tools, &vm, Some(&built)) {
        Ok(failed) => failures.extend(failed.into_iter().map(|f| format!("VM scenario {f}"))),
        Err(e) => failures.push(format!("VM scenarios: {e:#}")),
    }
    // The Debian package installed, run and removed in a systemd Debian guest.
    let package = package_test::run_with(
        &tools,
        &package_test::Options {
            kernel: crate::testbed::KernelLine::Bookworm,
            all_kernels: false,
            timeout: package_test::DEFAULT_TIMEOUT,
            setup: options.vm.setup.clone(),
        },
        Some(&built),
    );
    if let Err(e) = package {
        failures.push(format!("package test: {e:#}"));
    }
    verdict(&failures)
}

/// Seeds, the background build's end, then every target for [`FUZZ_SECONDS`]: what each
/// target that found something found.
fn fuzz_targets(
    tools: &setup::Tools,
    built: &cargo::WorkspaceBuild,
    build: fuzz::BackgroundBuild,
) -> anyhow::Result<Vec<String>> {
    let seeds = fuzz::make_seeds(tools, &cargo::workspace_root(), Some(built))?;
    build.wait()?;
    let outcomes = fuzz::run_built_targets(tools, &seeds, fuzz::TARGETS, FUZZ_SECONDS, None)?;
    eprint!("{}", fuzz::summary(&outcomes));
    let found = fuzz::failures(&outcomes);
    if found.is_empty() {
        let total: u64 = outcomes.iter().map(|o| o.executions).sum();
        let each: Vec<String> = outcomes
            .iter()
            .map(|o| format!("{} {}", o.target, o.executions))
            .collect();
        setup::step(&format!(
            "fuzzing: {total} executions, no finding ({})",
            each.join(", ")
        ));
    }
    Ok(found)
}

/// The suite's end: every failure, one a line, or that all passed.
fn verdict(failures: &[String]) -> anyhow::Result<()> {
    if failures.is_empty() {
        setup::step("every test passed");
        return Ok(());
    }
    anyhow::bail!(
        "{} failure{} in the suite (every step ran):\n  {}",
        failures.len(),
        if failures.len() == 1 { "" } else { "s" },
        failures.join("\n  ")
    )
}
