//! `cargo xtask vm-test`: the soft-RoCE scenarios (crate `testbed-guest`, module
//! `scenarios`) run inside QEMU guests booted from stock Debian kernels, against the real
//! rdma_rxe driver, rdma-core and perftest.
//!
//! One boot per kernel line runs the scenarios in order, and each scenario that loads a
//! module the test bed builds itself (siw.ko) boots alone after it ([`boots`]); the guest's
//! init prints a `RAILSCOPE-SCENARIO <name> PASS|FAIL ...` line for each, and this command
//! reports them and saves each boot's serial log (`guest.log`, `guest-<scenario>.log`) plus
//! one log per scenario under `target/vm-test/<kernel>/`. A guest kernel that crashed (Oops,
//! panic) is named in the verdict of the scenario it crashed in ([`kernel_crash`]).
//!
//! Delivery to a collector: `host-collector` and `collector-away` send to a collector on the
//! host ([`host_collector`]: the guest gets a user-network NIC, asks the host to stop and
//! start the collector over a control port, and the host compares VictoriaMetrics with the
//! archive after the boot); `lossy-link` runs a collector in a network namespace of the guest
//! behind `tc netem` (the host kernel needs no netem), so the image then carries
//! `railscope-collector`.

mod host_collector;
mod host_slurm;

use std::{path::PathBuf, time::Duration};

use anyhow::{Context as _, bail};

use crate::{
    build, cargo,
    setup::{self, Tools},
    testbed::{self, GuestFile, ImageSpec, KernelLine},
};

/// Every scenario, in the order one boot runs them. `port-events` comes first: it starts the
/// agent before the RDMA modules are loaded.
pub(crate) const SCENARIOS: &[&str] = &[
    "port-events",
    "probe-table",
    "ib-core-btf",
    "verbs",
    "rdma-cm",
    "cm-ids",
    "cm-wildcard",
    "cgroups-late",
    "qp-errors",
    "async-errors",
    // Needs siw.ko, built from Debian's kernel source (cached) when it is selected.
    SIW_SCENARIO,
    "agent-frames",
    "job-labels",
    // The agent sending to a collector on the host, which remote-writes to VictoriaMetrics
    // (the guest gets a user-network NIC; the host side checks the TSDB after the boot).
    host_collector::SCENARIO,
    // Link flaps while the guest has the host's collector stopped; then the archive's events
    // and the flapping finding (the host side stops and starts it when the guest asks).
    host_collector::AWAY_SCENARIO,
    // A link flapping in the guest drains the guest's node in a Slurm cluster on the host,
    // through the host collector's actions (a boot of its own: see OWN_BOOT).
    host_collector::SLURM_SCENARIO,
    // rxe on virtio NICs under a PCIe switch and a root port of two NUMA nodes: the agent's
    // hardware path and `railscope topology` against lspci and sysfs (a boot of its own).
    PCIE_SCENARIO,
    // 5 % loss and reordering (netem) between the agent and a collector in a network
    // namespace of the guest: every frame archived once.
    LOSSY_SCENARIO,
    "clock-step",
    "perftest",
    "capture-flap",
    "capture-down-at-start",
    "device-reuse",
    "ring-overflow",
    "soak",
    // Last: they unload and reload ib_uverbs and rdma_cm.
    "attach-pace",
    "least-privilege",
];

/// The scenario that runs a collector in the guest (its binary at [`COLLECTOR_GUEST_PATH`]).
const LOSSY_SCENARIO: &str = "lossy-link";
const COLLECTOR_GUEST_PATH: &str = "/usr/bin/railscope-collector";

/// The scenario that loads siw (soft iWARP); the guest finds the module at [`SIW_GUEST_PATH`].
const SIW_SCENARIO: &str = "siw-async-errors";
const SIW_GUEST_PATH: &str = "/opt/siw/siw.ko";

/// Scenarios that boot a guest of their own, after the other scenarios. One that loads a
/// kernel module the test bed builds itself, out of tree (unsigned: it taints the kernel
/// `OE`), so a fault of that module, or a kernel it left in a bad state, takes no other
/// scenario down. And `slurm-drain`, whose host collector drains the guest's node on its
/// first flapping finding: in a shared boot the other host scenarios' flaps would raise that
/// finding first (a few seconds of boot, not of scenarios, is what it costs).
/// (On 6.12 a guest panicked in `linkwatch_event` during `ring-overflow`'s link flaps after
/// `siw-async-errors` had loaded and unloaded siw.ko in the same boot; every later scenario
/// then had no result.)
/// And `pcie-topology`, whose guest is a q35 machine with NUMA nodes and a PCIe tree.
const OWN_BOOT: &[&str] = &[SIW_SCENARIO, host_collector::SLURM_SCENARIO, PCIE_SCENARIO];

/// The scenario whose guest has two NUMA nodes and NICs on a PCIe tree
/// (`PCIE_NUMA_ARGS` of the test bed's QEMU boot): the agent's hardware path from the kernel's own PCI sysfs.
const PCIE_SCENARIO: &str = "pcie-topology";

/// Scenarios that run only when named with `--scenario` (diagnostics, not tests).
pub(crate) const ON_REQUEST: &[&str] =
    &["kernel-facts", "hook-trace", "bench-probes", "bench-events"];

#[derive(Debug, Clone, clap::Args)]
#[group(skip)] // flattened into other commands' options
pub(crate) struct Options {
    /// Kernel lines to boot (repeatable; default: Debian 6.1 for `vm-test`, every line for
    /// `test`).
    #[arg(long, value_enum)]
    pub kernel: Vec<KernelLine>,
    /// Boot every kernel line the test bed knows (Debian 6.1 and 6.12).
    #[arg(long)]
    pub all_kernels: bool,
    /// Scenarios to run (repeatable; default: all).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(SCENARIOS.iter().chain(ON_REQUEST)))]
    pub scenario: Vec<String>,
    /// Kill a guest that has not powered off after this many seconds (plus 4 s per soak job
    /// when `soak` runs).
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Jobs the `soak` scenario runs (default: 300 under `vm-test --all-kernels`, else 40).
    #[arg(long)]
    pub soak_jobs: Option<u32>,
    /// Set by `cargo xtask test`: CI runs the short soak even on every kernel.
    #[arg(skip)]
    pub ci: bool,
    #[command(flatten)]
    pub setup: setup::Options,
}

/// Scenarios CI (`cargo xtask test`) boots on Debian 6.1 only, and why.
const ONE_KERNEL_IN_CI: &[(&str, &str)] = &[
    (
        SIW_SCENARIO,
        "its siw build costs about 4 min cold on another kernel",
    ),
    (
        host_collector::SLURM_SCENARIO,
        "a drain through Slurm does not depend on the guest's kernel; its port events are \
         covered on every kernel by the other scenarios",
    ),
    (
        PCIE_SCENARIO,
        "the PCI sysfs the agent reads is the same on every kernel line; its own boot costs \
         about a minute under TCG",
    ),
    (
        host_collector::SCENARIO,
        "delivery to the host's collector is UDP and the spool, the same on every kernel; the \
         agent's frames are checked on every kernel by agent-frames",
    ),
    (
        host_collector::AWAY_SCENARIO,
        "the spool and the resend to a restarted collector do not depend on the guest's \
         kernel; its port events are covered on every kernel by the other scenarios",
    ),
    (
        LOSSY_SCENARIO,
        "loss and reordering between the agent and a collector do not depend on the kernel \
         the agent runs on",
    ),
    (
        "clock-step",
        "the agent's clocks are read through the same calls on every kernel line",
    ),
    (
        "capture-flap",
        "the capture and its report are the agent's own; the port events they record are \
         checked on every kernel by port-events",
    ),
    (
        "capture-down-at-start",
        "as capture-flap: the ports' states at start come from sysfs, the same on every kernel",
    ),
    (
        "soak",
        "the long run of jobs; the probes it drives are checked on every kernel by verbs, \
         cgroups-late and job-labels",
    ),
];

/// The full soak's length, and the short one CI and single-kernel runs use.
const SOAK_JOBS_FULL: u32 = 300;
const SOAK_JOBS_SHORT: u32 = 40;

impl Options {
    /// Whether `scenario` boots on `kernel`. CI covers each capability once: the scenarios of
    /// [`ONE_KERNEL_IN_CI`] run there on Debian 6.1 only; `vm-test --all-kernels` (and a
    /// chosen `--kernel`) runs them on every line.
    fn runs_on(&self, scenario: &str, kernel: KernelLine) -> bool {
        !(self.ci
            && ONE_KERNEL_IN_CI.iter().any(|(s, _)| *s == scenario)
            && kernel != KernelLine::Bookworm)
    }

    /// How many jobs the `soak` scenario runs: the full length only when every kernel line is
    /// booted on request (not in CI), unless `--soak-jobs` says.
    pub(crate) fn soak_jobs(&self) -> u32 {
        self.soak_jobs.unwrap_or(if self.all_kernels && !self.ci {
            SOAK_JOBS_FULL
        } else {
            SOAK_JOBS_SHORT
        })
    }
}

pub(crate) fn run(options: &Options) -> anyhow::Result<()> {
    setup::require_root("building the guest image")?;
    let tools = setup::run(&options.setup)?;
    run_with(&tools, options, None)
}

/// The host binaries that go into the guest.
pub(crate) struct GuestBinaries {
    pub(crate) init: PathBuf,
    pub(crate) railscope: PathBuf,
    pub(crate) unit_tests: PathBuf,
}

impl GuestBinaries {
    /// The binaries `built` already holds (`cargo xtask test`).
    fn from_workspace(built: &cargo::WorkspaceBuild) -> anyhow::Result<Self> {
        Ok(Self {
            init: built.binary("railscope-guest-init")?,
            railscope: built.binary("railscope")?,
            unit_tests: built.unit_tests("monitor_user")?,
        })
    }
}

pub(crate) fn build_guest_binaries(tools: &Tools) -> anyhow::Result<GuestBinaries> {
    let railscope = build::railscope_binary(tools, true)?;
    let init = build_guest_init(tools)?;
    setup::step("building the agent's unit tests for the guest (they read ib_core's BTF there)");
    let mut cmd = cargo::command(tools);
    cmd.args([
        "test",
        "--release",
        "--package",
        "monitor-user",
        "--lib",
        "--no-run",
    ]);
    let unit_tests = cargo::build_executables(cmd)?
        .into_iter()
        .find(|(name, _)| name == "monitor_user")
        .map(|(_, p)| p)
        .context("cargo did not report the monitor-user unit test binary")?;
    Ok(GuestBinaries {
        init,
        railscope,
        unit_tests,
    })
}

/// The guest's `/init` (crate `testbed-guest`), built for the host.
pub(crate) fn build_guest_init(tools: &Tools) -> anyhow::Result<PathBuf> {
    setup::step("building the guest init (testbed-guest)");
    let mut cmd = cargo::command(tools);
    cmd.args([
        "build",
        "--release",
        "--package",
        "testbed-guest",
        "--bin",
        "railscope-guest-init",
    ]);
    cargo::build_executables(cmd)?
        .into_iter()
        .find(|(name, _)| name == "railscope-guest-init")
        .map(|(_, p)| p)
        .context("cargo did not report railscope-guest-init")
}

/// Runs the scenarios; `built` is the suite's workspace build when there is one (the guest's
/// binaries and the collector come from it), else they are built here.
pub(crate) fn run_with(
    tools: &Tools,
    options: &Options,
    built: Option<&cargo::WorkspaceBuild>,
) -> anyhow::Result<()> {
    let failures = failed_scenarios(tools, options, built)?;
    if !failures.is_empty() {
        bail!("VM scenarios failed:\n  {}", failures.join("\n  "));
    }
    setup::step("all VM scenarios passed");
    Ok(())
}

/// Runs every scenario asked for on every kernel asked for, each whatever failed before it;
/// returns one line per failed scenario (`Bookworm/port-events: why`).
pub(crate) fn failed_scenarios(
    tools: &Tools,
    options: &Options,
    built: Option<&cargo::WorkspaceBuild>,
) -> anyhow::Result<Vec<String>> {
    let binaries = match built {
        Some(built) => GuestBinaries::from_workspace(built)?,
        None => build_guest_binaries(tools)?,
    };
    let kernels: Vec<KernelLine> = if options.all_kernels {
        vec![KernelLine::Bookworm, KernelLine::Bookworm612]
    } else if options.kernel.is_empty() {
        vec![KernelLine::Bookworm]
    } else {
        options.kernel.clone()
    };
    let scenarios: Vec<&str> = if options.scenario.is_empty() {
        SCENARIOS.to_vec()
    } else {
        SCENARIOS
            .iter()
            .chain(ON_REQUEST)
            .copied()
            .filter(|s| options.scenario.iter().any(|o| o == s))
            .collect()
    };
    // The collector, for the host side of the host scenarios and for the guest's own.
    let collector = scenarios
        .iter()
        .any(|s| *s == LOSSY_SCENARIO || host_collector::SCENARIOS.contains(s))
        .then(|| match built {
            Some(built) => built.binary("railscope-collector"),
            None => host_collector::collector_binary(tools),
        })
        .transpose()?;
    let mut failures = Vec::new();
    for kernel in kernels {
        let here: Vec<&str> = scenarios
            .iter()
            .copied()
            .filter(|s| options.runs_on(s, kernel))
            .collect();
        for (skipped, why) in ONE_KERNEL_IN_CI
            .iter()
            .filter(|(s, _)| scenarios.contains(s) && !here.contains(s))
        {
            setup::step(&format!(
                "{skipped}: on Debian 6.1 only in CI, not on {kernel:?} ({why}); \
                 `cargo xtask vm-test --all-kernels` runs it there"
            ));
        }
        // A kernel whose guest cannot be made fails its scenarios; the next kernel still runs.
        let results = run_kernel(
            tools,
            &binaries,
            collector.as_deref(),
            kernel,
            &here,
            options,
        )
        .unwrap_or_else(|e| {
            let reason = format!("the {kernel:?} guest could not be made: {e:#}");
            eprintln!("    {reason}");
            here.iter()
                .map(|s| (s.to_string(), Err(reason.clone())))
                .collect()
        });
        for (scenario, result) in results {
            if let Err(reason) = result {
                failures.push(format!("{kernel:?}/{scenario}: {reason}"));
            }
        }
    }
    Ok(failures)
}

pub(crate) type ScenarioResult = Result<(), String>;

fn run_kernel(
    tools: &Tools,
    binaries: &GuestBinaries,
    collector: Option<&std::path::Path>,
    kernel: KernelLine,
    scenarios: &[&str],
    options: &Options,
) -> anyhow::Result<Vec<(String, ScenarioResult)>> {
    let name = format!("{kernel:?}").to_lowercase();
    let work_dir = cargo::workspace_root().join("target/vm-test").join(&name);
    std::fs::create_dir_all(&work_dir)?;
    setup::step(&format!("building the {name} guest image"));
    let mut spec = ImageSpec {
        kernel,
        init: binaries.init.clone(),
        files: vec![
            GuestFile {
                host: binaries.railscope.clone(),
                guest: "/usr/bin/railscope".into(),
                with_libs: true,
            },
            GuestFile {
                host: binaries.unit_tests.clone(),
                guest: "/usr/bin/railscope-unit-tests".into(),
                with_libs: true,
            },
        ],
    };
    if let Some(collector) = collector.filter(|_| scenarios.contains(&LOSSY_SCENARIO)) {
        spec.files.push(GuestFile {
            host: collector.to_owned(),
            guest: COLLECTOR_GUEST_PATH.into(),
            with_libs: true,
        });
    }
    let mut results = Vec::new();
    let mut scenarios = scenarios.to_vec();
    if scenarios.contains(&SIW_SCENARIO) {
        // siw built from Debian's kernel source: where it cannot be, its scenario fails and
        // the others run.
        match testbed::siw_module(&tools.cache_dir.join("testbed"), kernel) {
            Ok(ko) => spec.files.push(GuestFile {
                host: ko,
                guest: SIW_GUEST_PATH.into(),
                with_libs: false,
            }),
            Err(e) => {
                let reason = format!("siw.ko could not be built: {e:#}");
                eprintln!("    {SIW_SCENARIO}: {reason}");
                results.push((SIW_SCENARIO.to_owned(), Err(reason)));
                scenarios.retain(|s| *s != SIW_SCENARIO);
            }
        }
    }
    let image = testbed::build_image(&tools.cache_dir.join("testbed"), &work_dir, &spec)?;
    for boot in boots(&scenarios) {
        // The shared boot's log keeps its name; a scenario booted alone has its own.
        let serial_log = match boot.as_slice() {
            [only] if OWN_BOOT.contains(only) => work_dir.join(format!("guest-{only}.log")),
            _ => work_dir.join("guest.log"),
        };
        match run_boot(
            collector, &image, &work_dir, &name, &boot, serial_log, options,
        ) {
            Ok(done) => results.extend(done),
            // A boot that could not run fails its scenarios; the next boot still runs.
            Err(e) => {
                let reason = format!("the guest's boot failed: {e:#}");
                eprintln!("    {}: {reason}", boot.join(", "));
                results.extend(boot.iter().map(|s| (s.to_string(), Err(reason.clone()))));
            }
        }
    }
    // In the order the scenarios were asked for.
    results.sort_by_key(|(s, _)| scenarios.iter().position(|o| o == s));
    Ok(results)
}

/// Which scenarios boot together: every scenario in one boot, in order, except those of
/// [`OWN_BOOT`], which boot one by one after it.
fn boots<'a>(scenarios: &[&'a str]) -> Vec<Vec<&'a str>> {
    let (alone, shared): (Vec<&str>, Vec<&str>) =
        scenarios.iter().partition(|s| OWN_BOOT.contains(s));
    let mut out = Vec::new();
    if !shared.is_empty() {
        out.push(shared);
    }
    out.extend(alone.into_iter().map(|s| vec![s]));
    out
}

/// One boot of `image` running `scenarios`, and their verdicts.
fn run_boot(
    collector: Option<&std::path::Path>,
    image: &testbed::GuestImage,
    work_dir: &std::path::Path,
    name: &str,
    scenarios: &[&str],
    serial_log: PathBuf,
    options: &Options,
) -> anyhow::Result<Vec<(String, ScenarioResult)>> {
    let host = match collector {
        Some(binary)
            if scenarios
                .iter()
                .any(|s| host_collector::SCENARIOS.contains(s)) =>
        {
            Some(host_collector::start(
                binary,
                work_dir,
                scenarios.contains(&host_collector::SLURM_SCENARIO),
            )?)
        }
        _ => None,
    };
    setup::step(&format!(
        "booting {} with scenarios {} (serial log: {})",
        image.kernel_release,
        scenarios.join(","),
        serial_log.display()
    ));
    let soak_jobs = options.soak_jobs();
    let soak_time = if scenarios.contains(&"soak") {
        4 * u64::from(soak_jobs)
    } else {
        0
    };
    let outcome = boot_scenarios(
        image,
        scenarios,
        testbed::BootOptions {
            mem: "1G".into(),
            smp: 2,
            timeout: Duration::from_secs(options.timeout + soak_time),
            cmdline_extra: [
                format!("railscope.soak_jobs={soak_jobs}"),
                host.as_ref().map(|h| h.cmdline()).unwrap_or_default(),
            ]
            .join(" "),
            serial_log: serial_log.clone(),
            user_net: host.is_some(),
            pcie_numa: scenarios.contains(&PCIE_SCENARIO),
        },
    )?;
    let host_result = host.map(host_collector::HostCollector::verify);
    let mut results = Vec::new();
    for scenario in scenarios {
        let section = scenario_section(&outcome.log, scenario);
        std::fs::write(work_dir.join(format!("{scenario}.log")), &section)?;
        let mut result = scenario_result(&outcome.log, scenario, outcome.timed_out);
        // The comparison after the boot covers what every host scenario sent.
        if host_collector::SCENARIOS.contains(scenario) && result.is_ok() {
            result = host_result.clone().unwrap_or(Ok(()));
        }
        match &result {
            Ok(()) => eprintln!("    PASS  {name}/{scenario}"),
            Err(reason) => eprintln!(
                "    FAIL  {name}/{scenario}: {reason} [{}]",
                serial_log.display()
            ),
        }
        results.push((scenario.to_string(), result));
    }
    Ok(results)
}

/// Boots `image` with the guest's init running `scenarios` (appended to the kernel command
/// line), and says how the guest ended.
pub(crate) fn boot_scenarios(
    image: &testbed::GuestImage,
    scenarios: &[&str],
    mut options: testbed::BootOptions,
) -> anyhow::Result<testbed::BootOutcome> {
    options.cmdline_extra = format!(
        "{} railscope.scenarios={}",
        options.cmdline_extra,
        scenarios.join(",")
    )
    .trim()
    .to_owned();
    let outcome = testbed::boot(image, &options)?;
    let ended = match (outcome.timed_out, outcome.exit_code) {
        (true, _) => ", TIMED OUT".to_owned(),
        (false, Some(0)) => String::new(),
        (false, Some(code)) => format!(", QEMU exited with {code}"),
        (false, None) => ", QEMU killed by a signal".to_owned(),
    };
    setup::step(&format!(
        "guest finished in {:.0?} ({:?}{ended})",
        outcome.wall, outcome.accel
    ));
    Ok(outcome)
}

/// The scenario's verdict from the guest's `RAILSCOPE-SCENARIO` line; without one, the guest
/// kernel's crash if the log shows one ([`kernel_crash`]), else why none came.
pub(crate) fn scenario_result(log: &str, scenario: &str, timed_out: bool) -> ScenarioResult {
    let prefix = format!("RAILSCOPE-SCENARIO {scenario} ");
    match log.lines().find_map(|l| l.strip_prefix(&prefix)) {
        Some("PASS") => Ok(()),
        Some(other) => Err(other.trim_start_matches("FAIL").trim().to_owned()),
        None => Err(match kernel_crash(log) {
            Some(crash) => crash.verdict(scenario),
            None if timed_out => "no result: the guest timed out".into(),
            None => "no result: the guest never reported it (see the serial log)".into(),
        }),
    }
}

/// How a kernel message that ends the guest (or the task it hit) begins: an x86 `die()`
/// (`Oops: ...` on 6.12, `<trap>: 0000 [#1]` before), a panic, a `BUG()`.
const CRASH_MESSAGES: &[&str] = &[
    "Oops:",
    "Kernel panic - not syncing",
    "BUG: ",
    "kernel BUG at",
    "general protection fault",
    "double fault:",
    "stack guard page was hit",
];

/// The first kernel crash of a serial log.
#[derive(Debug, PartialEq)]
pub(crate) struct KernelCrash {
    /// Its line in the log, from 1.
    pub(crate) line: usize,
    /// The kernel's message (after its timestamp).
    pub(crate) message: String,
    /// The scenario under way (begun, no result yet), if any.
    pub(crate) during: Option<String>,
}

impl KernelCrash {
    /// The verdict of `scenario`, which has no result in a log with this crash.
    fn verdict(&self, scenario: &str) -> String {
        let at = format!("serial log line {}: {}", self.line, self.message);
        match self.during.as_deref() {
            Some(during) if during == scenario => {
                format!("the guest kernel panicked during {scenario} ({at})")
            }
            Some(during) => format!("not run: the guest kernel panicked during {during} ({at})"),
            None => format!("not run: the guest kernel panicked outside any scenario ({at})"),
        }
    }
}

/// The first kernel crash ([`CRASH_MESSAGES`]) in a serial log, with the scenario under way.
/// Kernel lines are told from the programs' output by their `[   12.345678] ` timestamp
/// (which may follow a program's unfinished line on the shared console).
pub(crate) fn kernel_crash(log: &str) -> Option<KernelCrash> {
    let mut under_way: Option<&str> = None;
    for (i, line) in log.lines().enumerate() {
        if let Some(name) = line.strip_prefix("RAILSCOPE-SCENARIO-BEGIN ") {
            under_way = Some(name.trim());
            continue;
        }
        if let Some(rest) = line.strip_prefix("RAILSCOPE-SCENARIO ") {
            if under_way == rest.split_whitespace().next() {
                under_way = None;
            }
            continue;
        }
        if let Some(message) =
            kernel_messages(line).find(|m| CRASH_MESSAGES.iter().any(|start| m.starts_with(start)))
        {
            return Some(KernelCrash {
                line: i + 1,
                message: message.trim_end().to_owned(),
                during: under_way.map(str::to_owned),
            });
        }
    }
    None
}

/// The kernel messages of a console line: what follows each `[ SECONDS.MICROS] ` in it.
fn kernel_messages(line: &str) -> impl Iterator<Item = &str> {
    line.match_indices('[').filter_map(move |(at, _)| {
        let rest = &line[at + 1..];
        let close = rest.find("] ")?;
        let stamp = rest[..close].trim_start();
        let (secs, micros) = stamp.split_once('.')?;
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        (digits(secs) && digits(micros)).then(|| &rest[close + 2..])
    })
}

/// The lines between the scenario's BEGIN marker and its result line.
pub(crate) fn scenario_section(log: &str, scenario: &str) -> String {
    let begin = format!("RAILSCOPE-SCENARIO-BEGIN {scenario}");
    let end = format!("RAILSCOPE-SCENARIO {scenario} ");
    let mut out = String::new();
    let mut inside = false;
    for line in log.lines() {
        if line.starts_with(&begin) {
            inside = true;
        }
        if inside {
            out.push_str(line);
            out.push('\n');
        }
        if line.starts_with(&end) {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "boot\nRAILSCOPE-SCENARIO-BEGIN port-events\nagent up\n\
                       RAILSCOPE-SCENARIO port-events PASS\n\
                       RAILSCOPE-SCENARIO-BEGIN ib-core-btf\n\
                       RAILSCOPE-SCENARIO ib-core-btf FAIL test exited 101\n";

    #[test]
    fn ci_runs_siw_and_slurm_drain_on_one_kernel_and_the_long_variant_on_every_one() {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            vm: Options,
        }
        let mut options = Cli::parse_from(["vm-test", "--all-kernels"]).vm;
        assert!(options.runs_on(SIW_SCENARIO, KernelLine::Bookworm612));
        options.ci = true;
        assert!(options.runs_on(SIW_SCENARIO, KernelLine::Bookworm));
        assert!(!options.runs_on(SIW_SCENARIO, KernelLine::Bookworm612));
        assert!(options.runs_on("verbs", KernelLine::Bookworm612));
        let slurm = host_collector::SLURM_SCENARIO;
        assert!(options.runs_on(slurm, KernelLine::Bookworm));
        assert!(!options.runs_on(slurm, KernelLine::Bookworm612));
    }

    #[test]
    fn reads_each_scenarios_verdict() {
        assert_eq!(scenario_result(LOG, "port-events", false), Ok(()));
        assert_eq!(
            scenario_result(LOG, "ib-core-btf", false),
            Err("test exited 101".into())
        );
        assert!(
            scenario_result(LOG, "other", true)
                .unwrap_err()
                .contains("timed out")
        );
    }

    /// The end of a 6.12 guest's serial log as issue 30 reported it: `ring-overflow` flapping
    /// links after `siw-async-errors` had loaded the test bed's siw.ko in the same boot. (Put
    /// together from the report's lines, in the layout of the guest's console: the kernel's
    /// timestamped lines among the scenarios' output, one cut short by the kernel's.)
    const PANIC_LOG: &str = "\
RAILSCOPE-SCENARIO-BEGIN siw-async-errors
[  301.512210] siw: loading out-of-tree module taints kernel.
[  301.513004] siw: module verification failed: signature and/or required key missing - tainting kernel
RAILSCOPE-SCENARIO siw-async-errors PASS
RAILSCOPE-SCENARIO-BEGIN ring-overflow
+ railscope agent --json
ring-overflow: BUG: reports are the agent's, not the kernel's
ring-overflow: flapping vethR 4000 ti[  412.118012] Oops: double fault: 0000 [#1] PREEMPT SMP NOPTI
[  412.118400] CPU: 1 UID: 0 PID: 61 Comm: kworker/u8:3 Tainted: G           OE      6.12.117+deb12-amd64 #1  Debian 6.12.117-1~bpo12+1
[  412.118950] Tainted: [O]=OOT_MODULE, [E]=UNSIGNED_MODULE
[  412.119600] Workqueue: events linkwatch_event
[  412.119800] RIP: 0010:__kmalloc_node_track_caller_noprof+0x5c/0x3d0
[  412.121500] Call Trace:
[  412.121700]  netlink_trim+0x5a/0xb0
[  412.121800]  linkwatch_event+0x30/0x40
[  412.130000] Kernel panic - not syncing: Fatal exception in interrupt
[  412.130500] Kernel Offset: 0x1a000000 from 0xffffffff81000000 (relocation range: 0xffffffff80000000-0xffffffffbfffffff)
";

    #[test]
    fn finds_the_guest_kernels_crash_and_the_scenario_under_way() {
        let crash = kernel_crash(PANIC_LOG).expect("a crash");
        assert_eq!(
            crash,
            KernelCrash {
                line: 8,
                message: "Oops: double fault: 0000 [#1] PREEMPT SMP NOPTI".into(),
                during: Some("ring-overflow".into()),
            }
        );
        // The scenario under way, and those the boot never reached.
        assert_eq!(
            scenario_result(PANIC_LOG, "ring-overflow", false),
            Err(
                "the guest kernel panicked during ring-overflow (serial log line 8: Oops: \
                 double fault: 0000 [#1] PREEMPT SMP NOPTI)"
                    .into()
            )
        );
        assert_eq!(
            scenario_result(PANIC_LOG, "soak", false),
            Err(
                "not run: the guest kernel panicked during ring-overflow (serial log line 8: \
                 Oops: double fault: 0000 [#1] PREEMPT SMP NOPTI)"
                    .into()
            )
        );
        // A verdict the guest gave stands.
        assert_eq!(
            scenario_result(PANIC_LOG, "siw-async-errors", false),
            Ok(())
        );
        // 6.1's die() line has no `Oops:`; a panic alone is found too.
        let old = "RAILSCOPE-SCENARIO-BEGIN verbs\n[    9.000001] double fault: 0000 [#1] SMP\n";
        assert_eq!(kernel_crash(old).unwrap().line, 2);
        let panic = "[    1.5] Kernel panic - not syncing: VFS: Unable to mount root fs\n";
        assert_eq!(kernel_crash(panic).unwrap().during, None);
        assert!(
            scenario_result(panic, "verbs", false)
                .unwrap_err()
                .contains("panicked outside any scenario (serial log line 1")
        );
        // The programs' own words and harmless kernel lines are no crash.
        assert_eq!(kernel_crash(LOG), None);
        let taint = "[  301.512210] siw: loading out-of-tree module taints kernel.\n\
                     BUG: the agent's words\n[bad] Oops: not a timestamp\n";
        assert_eq!(kernel_crash(taint), None);
        assert!(
            scenario_result(LOG, "other", false)
                .unwrap_err()
                .contains("never reported")
        );
    }

    #[test]
    fn a_scenario_that_loads_an_own_module_boots_alone_after_the_others() {
        assert_eq!(
            boots(&["port-events", SIW_SCENARIO, "ring-overflow", "soak"]),
            [
                vec!["port-events", "ring-overflow", "soak"],
                vec![SIW_SCENARIO]
            ]
        );
        assert_eq!(boots(&[SIW_SCENARIO]), [vec![SIW_SCENARIO]]);
        assert_eq!(boots(&["verbs"]), [vec!["verbs"]]);
        // The other host scenarios' flaps would drain the guest's node before slurm-drain's.
        let slurm = host_collector::SLURM_SCENARIO;
        assert_eq!(
            boots(&["host-collector", slurm, "collector-away"]),
            [vec!["host-collector", "collector-away"], vec![slurm]]
        );
        // Every scenario of a full run boots exactly once.
        let all: Vec<&str> = boots(SCENARIOS).into_iter().flatten().collect();
        assert_eq!(all.len(), SCENARIOS.len());
        assert!(SCENARIOS.iter().all(|s| all.contains(s)));
    }

    #[test]
    fn splits_the_log_per_scenario() {
        let section = scenario_section(LOG, "port-events");
        assert!(section.starts_with("RAILSCOPE-SCENARIO-BEGIN port-events"));
        assert!(section.contains("agent up"));
        assert!(!section.contains("ib-core-btf"));
    }
}
