//! `cargo xtask fuzz`: the cargo-fuzz targets in `fuzz/`, one per decoder of outside input,
//! each started from seeds taken from what the tests use (the shipped example configuration
//! files, the NVML stand-in's scripts, the sysfs fixture tree, frames made by the agent's own
//! encoder). `cargo xtask test` runs each for a short bounded time; this command runs them
//! longer. Runs are niced (the machines are shared) and one at a time.
//!
//! A crash, a timeout, an allocation over 64 MB (`-malloc_limit_mb`: no length read from
//! input may size an allocation unchecked) or an RSS over 2 GB fails the run; libFuzzer saves
//! the input under `fuzz/artifacts/<target>/`.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, bail};

use crate::{cargo, setup};

/// Every fuzz target (`fuzz/fuzz_targets/<name>.rs`).
pub(crate) const TARGETS: &[&str] = &[
    "wire_frame",
    "collector_ingest",
    "schema_request",
    "agent_config",
    "collector_config",
    "sysfs_value",
    "nvml_script",
    "capture_file",
];

#[derive(Debug, clap::Args)]
pub(crate) struct Options {
    /// Run only this target (repeatable; default: all of them).
    #[arg(long = "target", value_name = "NAME")]
    pub targets: Vec<String>,
    /// Seconds per target.
    #[arg(long, default_value_t = 600, value_name = "SECONDS")]
    pub time: u64,
    /// Stop a target after this many executions (whichever of --time and --runs comes first).
    #[arg(long, value_name = "N")]
    pub runs: Option<u64>,
    #[command(flatten)]
    pub setup: setup::Options,
}

/// libFuzzer's `-max_len` for targets whose inputs must stay small for an execution to stay
/// cheap (the default is the largest seed's size).
const MAX_LEN: &[(&str, usize)] = &[
    // A capture of a few records; the shipped 21 KB capture is read up to this length.
    ("capture_file", 4096),
];

/// What one run did.
pub(crate) struct Outcome {
    pub target: String,
    pub executions: u64,
    pub seconds: f64,
    /// libFuzzer's coverage figures at the end: edges (`cov:`) and features (`ft:`).
    pub cov: Option<u64>,
    pub ft: Option<u64>,
    /// Stopped early by a SIGINT to the fuzzer.
    pub interrupted: bool,
    /// What the fuzzer found (a crash, a leak, an allocation over the limit), with the end
    /// of its log; the targets after it still run.
    pub failure: Option<String>,
}

/// One line per target that found something, `target: what`.
pub(crate) fn failures(outcomes: &[Outcome]) -> Vec<String> {
    outcomes
        .iter()
        .filter_map(|o| Some(format!("fuzz target {}: {}", o.target, o.failure.as_ref()?)))
        .collect()
}

impl Outcome {
    pub(crate) fn per_second(&self) -> f64 {
        self.executions as f64 / self.seconds.max(1e-9)
    }
}

/// The outcomes as a table: executions, time, rate and coverage per target.
pub(crate) fn summary(outcomes: &[Outcome]) -> String {
    let mut out = format!(
        "{:<18} {:>12} {:>9} {:>9} {:>7} {:>7}\n",
        "target", "executions", "seconds", "exec/s", "cov", "ft"
    );
    let figure = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
    for o in outcomes {
        out.push_str(&format!(
            "{:<18} {:>12} {:>9.0} {:>9.0} {:>7} {:>7}{}\n",
            o.target,
            o.executions,
            o.seconds,
            o.per_second(),
            figure(o.cov),
            figure(o.ft),
            if o.failure.is_some() {
                "  FAILED"
            } else if o.interrupted {
                "  interrupted"
            } else {
                ""
            }
        ));
    }
    out
}

pub(crate) fn run(options: &Options) -> anyhow::Result<()> {
    let tools = setup::run(&options.setup)?;
    let targets: Vec<&str> = if options.targets.is_empty() {
        TARGETS.to_vec()
    } else {
        for t in &options.targets {
            if !TARGETS.contains(&t.as_str()) {
                bail!(
                    "no fuzz target {t:?}; the targets are {}",
                    TARGETS.join(", ")
                );
            }
        }
        options.targets.iter().map(String::as_str).collect()
    };
    let outcomes = run_targets(&tools, &targets, options.time, options.runs)?;
    eprint!("{}", summary(&outcomes));
    let failed = failures(&outcomes);
    if !failed.is_empty() {
        bail!("fuzzing found something:\n  {}", failed.join("\n  "));
    }
    setup::step("fuzzing done, no finding");
    Ok(())
}

/// Builds the targets and the seeds, then runs each target for `seconds` (or `runs`
/// executions), one after the other, every one even after a finding (see [`failures`]).
pub(crate) fn run_targets(
    tools: &setup::Tools,
    targets: &[&str],
    seconds: u64,
    runs: Option<u64>,
) -> anyhow::Result<Vec<Outcome>> {
    ensure_cargo_fuzz(None)?;
    let root = cargo::workspace_root();
    let seeds = make_seeds(tools, &root, None)?;
    setup::step("building the fuzz targets (cargo +nightly fuzz build)");
    cargo::run(fuzz_command(tools, &root).args(["build"]))?;
    run_built_targets(tools, &seeds, targets, seconds, runs)
}

/// The fuzz targets' build (cargo-fuzz's install where it is missing, then `cargo +nightly
/// fuzz build`), in a thread of its own with its output in `target/fuzz/build.log`.
///
/// Why in the background: `cargo xtask test` starts it before the host tests, which spend most
/// of their minutes waiting on agents, collectors and servers they started (collector_outage:
/// 70 s of wall time, 0.7 s of CPU), while the fuzz build is some ten minutes of CPU on 2
/// cores that has no other work to wait behind. Niced like every fuzz run, it takes the CPU
/// the tests leave; its own target directory (`fuzz/target`) holds no lock the tests' cargo
/// needs.
///
/// Dropped before [`BackgroundBuild::wait`] (the tests failed), it stops the build.
pub(crate) struct BackgroundBuild {
    thread: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
    log: PathBuf,
    cancel: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl BackgroundBuild {
    pub(crate) fn start(tools: &setup::Tools) -> anyhow::Result<Self> {
        let root = cargo::workspace_root();
        let log = root.join("target/fuzz/build.log");
        std::fs::create_dir_all(log.parent().expect("the log is in a directory"))?;
        let out =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        setup::step(&format!(
            "building the fuzz targets in the background, niced (log: {})",
            log.display()
        ));
        let mut build = fuzz_command(tools, &root);
        build
            .args(["build"])
            .stdout(out.try_clone()?)
            .stderr(out.try_clone()?);
        let cancel = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cancelled = cancel.clone();
        let thread = std::thread::Builder::new()
            .name("fuzz-build".into())
            .spawn(move || {
                ensure_cargo_fuzz(Some(&out))?;
                let rendered = cargo::render(&build);
                let mut child = build
                    .spawn()
                    .with_context(|| format!("failed to start {rendered}"))?;
                loop {
                    if let Some(status) = child.try_wait()? {
                        if !status.success() {
                            bail!("{rendered} failed ({status})");
                        }
                        return Ok(());
                    }
                    if cancelled.load(std::sync::atomic::Ordering::Relaxed) {
                        let _ = child.kill();
                        let _ = child.wait();
                        bail!("{rendered}: stopped");
                    }
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
            })?;
        Ok(Self {
            thread: Some(thread),
            log,
            cancel,
        })
    }

    /// Waits for the build; its failure carries the log's last lines.
    pub(crate) fn wait(mut self) -> anyhow::Result<()> {
        setup::step("the fuzz targets' build: waiting for it to finish");
        let result = self
            .thread
            .take()
            .expect("waited once")
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the fuzz build's thread panicked")));
        if let Err(e) = result {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            bail!(
                "building the fuzz targets failed: {e:#}; the end of {}:\n{}",
                self.log.display(),
                last_lines(&text, 40)
            );
        }
        Ok(())
    }
}

impl Drop for BackgroundBuild {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            self.cancel
                .store(true, std::sync::atomic::Ordering::Relaxed);
            let _ = thread.join();
        }
    }
}

/// Runs each target, built already, for `seconds` (or `runs` executions) from `seeds`, one
/// after the other, every one even after a finding (see [`failures`]); fails only where a
/// target cannot be started.
pub(crate) fn run_built_targets(
    tools: &setup::Tools,
    seeds: &Path,
    targets: &[&str],
    seconds: u64,
    runs: Option<u64>,
) -> anyhow::Result<Vec<Outcome>> {
    let root = cargo::workspace_root();
    let mut outcomes = Vec::new();
    for target in targets {
        let corpus = root.join("target/fuzz/corpus").join(target);
        std::fs::create_dir_all(&corpus)?;
        let log = root.join("target/fuzz").join(format!("{target}.log"));
        setup::step(&format!(
            "fuzzing {target} for {seconds} s{} (log: {})",
            runs.map(|r| format!(" or {r} executions"))
                .unwrap_or_default(),
            log.display()
        ));
        let mut cmd = fuzz_command(tools, &root);
        cmd.args(["run", target])
            .arg(&corpus)
            .arg(seeds.join(target))
            .args([
                "--",
                &format!("-max_total_time={seconds}"),
                "-malloc_limit_mb=64",
                "-rss_limit_mb=2048",
                "-timeout=10",
                "-print_final_stats=1",
            ]);
        if let Some(runs) = runs {
            cmd.arg(format!("-runs={runs}"));
        }
        if let Some((_, len)) = MAX_LEN.iter().find(|(t, _)| t == target) {
            cmd.arg(format!("-max_len={len}"));
        }
        let started = Instant::now();
        let output = cmd
            .stderr(std::fs::File::create(&log)?)
            .stdout(std::process::Stdio::null())
            .status()
            .with_context(|| format!("running {}", cargo::render(&cmd)))?;
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        // SIGINT to the fuzzer alone (not to this command) stops that target early: its
        // executions so far are reported and the next target runs.
        let interrupted = text.contains("libFuzzer: run interrupted");
        let failure = (!output.success() && !interrupted).then(|| {
            format!(
                "failed ({output}); the input is under fuzz/artifacts/{target}/, the log is {}",
                log.display(),
            )
        });
        let executions = text
            .lines()
            .find_map(|l| l.strip_prefix("stat::number_of_executed_units:"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0);
        let (cov, ft) = final_coverage(&text);
        let outcome = Outcome {
            target: target.to_string(),
            executions,
            seconds: started.elapsed().as_secs_f64(),
            cov,
            ft,
            interrupted,
            failure,
        };
        match &outcome.failure {
            Some(failure) => eprintln!(
                "    {target}: {failure}; its end:\n{}",
                last_lines(&text, 40)
            ),
            None => eprintln!(
                "    {target}: {} executions in {:.0} s{}, no crash, no allocation over 64 MB",
                outcome.executions,
                outcome.seconds,
                if interrupted { " (interrupted)" } else { "" }
            ),
        }
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

/// The last `n` lines of a log, in order.
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The `cov:` and `ft:` figures of libFuzzer's last status line (`#N DONE cov: 812 ft: 2904
/// ...`).
fn final_coverage(log: &str) -> (Option<u64>, Option<u64>) {
    let Some(line) = log
        .lines()
        .rev()
        .find(|l| l.starts_with('#') && l.contains(" cov: "))
    else {
        return (None, None);
    };
    let figure = |name: &str| {
        let mut words = line.split_whitespace();
        words.find(|w| *w == name)?;
        words.next()?.parse().ok()
    };
    (figure("cov:"), figure("ft:"))
}

/// `nice -n 19 cargo +nightly fuzz ...` in the workspace, with bpf-linker on PATH (the agent's
/// library embeds the probes).
fn fuzz_command(tools: &setup::Tools, root: &Path) -> Command {
    let mut cmd = Command::new("nice");
    cmd.args(["-n", "19", "cargo", "+nightly", "fuzz"])
        .current_dir(root)
        .env("PATH", tools.path_with_bpf_linker());
    cmd
}

/// Installs cargo-fuzz if `cargo fuzz` is missing. With `log`, what it does and cargo's
/// output go there (the background build); else to the terminal.
fn ensure_cargo_fuzz(log: Option<&std::fs::File>) -> anyhow::Result<()> {
    let say = |line: &str| match log {
        Some(mut file) => {
            use std::io::Write as _;
            let _ = writeln!(file, "==> {line}");
        }
        None => setup::step(line),
    };
    let present = Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if present {
        say("cargo-fuzz: installed");
        return Ok(());
    }
    say("cargo-fuzz: installing (cargo install cargo-fuzz --locked, a few minutes)");
    let mut install = Command::new("nice");
    install.args(["-n", "19", "cargo", "install", "cargo-fuzz", "--locked"]);
    if let Some(file) = log {
        install.stdout(file.try_clone()?).stderr(file.try_clone()?);
    }
    cargo::run(&mut install).context("installing cargo-fuzz failed; see cargo's output")
}

/// Runs `package`'s seed example `example`, which writes seeds made by the crate's own writer
/// into `dirs`: the one `built` holds, else through `cargo run`.
fn run_seed_example(
    tools: &setup::Tools,
    built: Option<&cargo::WorkspaceBuild>,
    (package, example): (&str, &str),
    dirs: &[PathBuf],
) -> anyhow::Result<()> {
    match built {
        Some(built) => cargo::run(Command::new(built.example(package, example)?).args(dirs)),
        None => cargo::run(
            cargo::command(tools)
                .args(["run", "--quiet", "-p", package, "--example", example, "--"])
                .args(dirs),
        ),
    }
}

/// Seeds for every target under `target/fuzz/seeds/<target>/`, from what the tests use.
///
/// `built`: the suite's workspace build, which holds the seed examples already.
pub(crate) fn make_seeds(
    tools: &setup::Tools,
    root: &Path,
    built: Option<&cargo::WorkspaceBuild>,
) -> anyhow::Result<PathBuf> {
    setup::step("fuzz seeds from the tests' inputs");
    let seeds = root.join("target/fuzz/seeds");
    let dir = |t: &str| -> anyhow::Result<PathBuf> {
        let d = seeds.join(t);
        std::fs::create_dir_all(&d)?;
        Ok(d)
    };
    std::fs::copy(
        root.join("dist/agent.toml"),
        dir("agent_config")?.join("agent.toml"),
    )?;
    std::fs::copy(
        root.join("dist/collector.toml"),
        dir("collector_config")?.join("collector.toml"),
    )?;
    let scripts = dir("nvml_script")?;
    for entry in std::fs::read_dir(root.join("tests/nvml-standin/scripts"))? {
        let path = entry?.path();
        if let Some(name) = path.file_name() {
            std::fs::copy(&path, scripts.join(name))?;
        }
    }
    // Every distinct file content of the sysfs fixture tree (counters, states, rates,
    // and the broken node's garbage).
    let sysfs = dir("sysfs_value")?;
    let mut files = vec![root.join("monitor-user/tests/fixtures/sysfs")];
    let mut n = 0;
    while let Some(path) = files.pop() {
        if path.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                files.push(entry?.path());
            }
        } else if let Ok(bytes) = std::fs::read(&path) {
            std::fs::write(sysfs.join(format!("{:016x}", fnv1a(&bytes))), bytes)?;
            n += 1;
        }
    }
    if n == 0 {
        bail!("no sysfs fixture files found");
    }
    // Frames and a schema request made by the agent's encoder.
    run_seed_example(
        tools,
        built,
        ("monitor-wire", "frame_fuzz_seeds"),
        &[dir("wire_frame")?, dir("schema_request")?],
    )?;
    // Small captures made by the capture writer (monitor-capture/examples/capture_fuzz_seeds.rs), and
    // the shipped example capture (docs/examples, made by `railscope capture` in the test
    // bed), read as it is: the target's flags byte 0 before it.
    let captures = dir("capture_file")?;
    run_seed_example(
        tools,
        built,
        ("monitor-capture", "capture_fuzz_seeds"),
        std::slice::from_ref(&captures),
    )?;
    let mut shipped = vec![0u8];
    shipped.extend(std::fs::read(
        root.join("docs/examples/capture-flap.rscap"),
    )?);
    std::fs::write(captures.join("capture-flap.rscap"), shipped)?;
    let frames = dir("collector_ingest")?;
    for entry in std::fs::read_dir(seeds.join("wire_frame"))? {
        let path = entry?.path();
        if let Some(name) = path.file_name() {
            std::fs::copy(&path, frames.join(name))?;
        }
    }
    Ok(seeds)
}

/// A name for a seed file from its content, so equal contents make one seed.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
