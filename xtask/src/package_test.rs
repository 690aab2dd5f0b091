//! `cargo xtask package-test`: the Debian packages proven on a real Debian system. Builds the
//! two `.deb`s (`cargo xtask package`), boots a bookworm guest made with debootstrap (systemd
//! as init, the test bed's kernel and its `rdma_rxe`, rdma-core; [`rootfs`]) in QEMU, and a
//! unit in the guest runs `package_test/test.sh` from a second disk holding the packages.
//! First `railscope` alone (the node agent): `dpkg -i`, no collector installed, the clients
//! (`query nodes`, `findings`, `actions`, `health`) answered by the release collector run from
//! the disk outside the packages; then `railscope-collector`: both units ready, rxe devices,
//! the probes attached, the collector's archive holding the agent's frames and GPU series
//! (the agent loading the NVML stand-in from the payload), the agent's system-call filter as
//! applied, a module reload followed, `systemctl restart`, `kill -9` and `SIGSTOP` (the
//! watchdog) each bringing the agent back, each package upgraded, then `dpkg -r` and `dpkg -P`
//! of each, leaving what the other needs. The script prints one line per check on the serial
//! console; this command reads them.

mod rootfs;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::{
    package, setup,
    testbed::{self, Accel, KernelLine},
};

/// The guest's test script (see its header).
const TEST_SCRIPT: &str = include_str!("package_test/test.sh");

/// Host packages: debootstrap for the guest root (lintian and dpkg-dev for the package).
pub(crate) const PACKAGES: &[&str] = &["debootstrap", "e2fsprogs"];

/// Seconds the guest may take (boot, the checks, the 30 s watchdog wait, poweroff).
pub(crate) const DEFAULT_TIMEOUT: u64 = 900;

#[derive(Debug, Clone, clap::Args)]
#[group(skip)]
pub(crate) struct Options {
    /// The test bed kernel the guest boots.
    #[arg(long, value_enum, default_value = "bookworm")]
    pub kernel: KernelLine,
    /// Run the test on every kernel line in turn (Debian 6.1, then 6.12), one guest at a
    /// time; not part of `cargo xtask test`, which runs it on 6.1.
    #[arg(long, conflicts_with = "kernel")]
    pub all_kernels: bool,
    /// Kill the guest when it has not powered off after this many seconds.
    #[arg(long, default_value_t = DEFAULT_TIMEOUT)]
    pub timeout: u64,
    #[command(flatten)]
    pub setup: setup::Options,
}

pub(crate) fn run(options: &Options) -> anyhow::Result<()> {
    let tools = setup::run(&options.setup)?;
    run_with(&tools, options, None)
}

/// Runs the test; `built` is the suite's workspace build when there is one (the package is
/// made of its binaries, and the stand-in taken from it), else both are built here.
pub(crate) fn run_with(
    tools: &setup::Tools,
    options: &Options,
    built: Option<&crate::cargo::WorkspaceBuild>,
) -> anyhow::Result<()> {
    setup::require_root("debootstrap, mkfs.ext4 -d and the guest's dpkg")?;
    if !options.setup.no_apt {
        setup::ensure_debian_packages(PACKAGES)?;
        setup::ensure_debian_packages(package::PACKAGES)?;
    }
    let (binaries, nvml) = match built {
        Some(built) => (
            package::Binaries {
                agent: built.binary("railscope")?,
                collector: built.binary("railscope-collector")?,
            },
            built.library_file(NVML_STANDIN)?,
        ),
        None => (package::build_binaries(tools)?, build_nvml_standin(tools)?),
    };
    let debs = package::build_from(&binaries, true)?;
    let kernels = if options.all_kernels {
        vec![KernelLine::Bookworm, KernelLine::Bookworm612]
    } else {
        vec![options.kernel]
    };
    for kernel in kernels {
        run_on(
            tools,
            kernel,
            &debs,
            &binaries.collector,
            &nvml,
            options.timeout,
        )?;
    }
    Ok(())
}

/// The test in the systemd guest booting `kernel`'s line; `collector` is the release
/// collector the script runs from outside the packages before it installs
/// `railscope-collector`.
fn run_on(
    tools: &setup::Tools,
    kernel: KernelLine,
    packages: &package::Debs,
    collector: &Path,
    nvml: &Path,
    timeout: u64,
) -> anyhow::Result<()> {
    setup::step("the systemd Debian guest");
    let testbed_cache = tools.cache_dir.join("testbed");
    let debs = testbed::prepare_debs(&testbed_cache, kernel)?;
    let kver = debs.kernel_release;
    let kernel_deb = find_kernel_deb(&testbed_cache.join("debs").join(&kver), &kver)?;
    let guest = rootfs::prepare(&tools.cache_dir, &kver, &kernel_deb)?;

    let work = crate::cargo::workspace_root()
        .join("target/package-test")
        .join(&kver);
    let payload = make_payload(&work, packages, collector, nvml)?;
    let log_path = work.join("serial.log");
    let outcome = boot(&guest, &payload, &log_path, Duration::from_secs(timeout))?;
    let log = fs::read_to_string(&log_path).unwrap_or_default();
    let log = script_lines(&log.replace('\r', ""));
    for line in log.lines() {
        eprintln!("    {line}");
    }
    eprintln!(
        "    guest ran {:.0} s ({}); serial log {}",
        outcome.wall.as_secs_f64(),
        match outcome.test_started {
            Some(t) => format!("booted to the test unit in {:.0} s", t.as_secs_f64()),
            None => "the test never started".into(),
        },
        log_path.display()
    );
    match verdict(&log, outcome.timed_out) {
        Ok(checks) => {
            setup::step(&format!(
                "package test on {kver}: pass ({checks} checks, {:.0} s in the guest)",
                outcome.wall.as_secs_f64()
            ));
            Ok(())
        }
        Err(why) => bail!(
            "package test on {kver}: {why} (serial log {})",
            log_path.display()
        ),
    }
}

/// The kernel image package in the test bed's deb cache.
fn find_kernel_deb(dir: &Path, kver: &str) -> anyhow::Result<PathBuf> {
    let prefix = format!("linux-image-{kver}_");
    for e in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let name = e?.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) && name.ends_with(".deb") {
            return Ok(dir.join(name));
        }
    }
    bail!("no {prefix}*.deb in {}", dir.display())
}

/// The stand-in's file name as cargo builds it.
const NVML_STANDIN: &str = "libnvml_standin.so";

/// The NVML stand-in (docs/nvml-standin.md; not a GPU, not NVIDIA's library), built for the
/// guest's agent to load as its NVML so the GPU source runs under the unit's sandbox.
fn build_nvml_standin(tools: &setup::Tools) -> anyhow::Result<PathBuf> {
    setup::step("building the NVML stand-in (release) for the guest's GPU source");
    let mut cmd = crate::cargo::command(tools);
    cmd.args(["build", "--release", "--package", "nvml-standin"]);
    crate::cargo::build_file(cmd, NVML_STANDIN)
}

/// The second disk: the two packages, the release collector (`collector/`, for the checks
/// of the agent's package alone), the test script and `nvml/` (the NVML stand-in as
/// `libnvidia-ml.so.1` beside its script, 8 H100s), an ext4 image made with `mkfs.ext4 -d`.
fn make_payload(
    work: &Path,
    debs: &package::Debs,
    collector: &Path,
    nvml_standin: &Path,
) -> anyhow::Result<PathBuf> {
    let dir = work.join("payload");
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    fs::create_dir_all(&dir)?;
    fs::copy(&debs.agent, dir.join("railscope.deb"))?;
    fs::copy(&debs.collector, dir.join("railscope-collector.deb"))?;
    fs::create_dir_all(dir.join("collector"))?;
    fs::copy(collector, dir.join("collector/railscope-collector"))?;
    fs::write(dir.join("test.sh"), TEST_SCRIPT)?;
    let nvml = dir.join("nvml");
    fs::create_dir_all(&nvml)?;
    fs::copy(nvml_standin, nvml.join("libnvidia-ml.so.1"))?;
    fs::copy(
        crate::cargo::workspace_root().join("tests/nvml-standin/scripts/h100x8.json"),
        nvml.join("nvml-standin.json"),
    )?;
    let image = work.join("payload.img");
    let _ = fs::remove_file(&image);
    let mut bytes = 0;
    for f in [&debs.agent, &debs.collector, collector, nvml_standin] {
        bytes += fs::metadata(f)?.len();
    }
    let mib = bytes / (1 << 20) + 32;
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-L", "payload", "-d"])
        .arg(&dir)
        .arg(&image)
        .arg(format!("{mib}M"))
        .output()
        .context("running mkfs.ext4 (package e2fsprogs)")?;
    if !out.status.success() {
        bail!(
            "mkfs.ext4 -d {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(image)
}

struct Outcome {
    wall: Duration,
    timed_out: bool,
    /// When the test unit's first line appeared: the boot time.
    test_started: Option<Duration>,
}

/// The script's lines of the serial log (`PKGTEST...`), without what precedes them on their
/// line (the console's escape sequences).
fn script_lines(log: &str) -> String {
    log.lines()
        .filter_map(|l| l.find("PKGTEST").map(|i| &l[i..]))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// Boots the guest with its root disk (a snapshot: the cached image is never written) and the
/// payload disk, the serial console going to `log`, until it powers off or `timeout`.
fn boot(
    guest: &rootfs::GuestRoot,
    payload: &Path,
    log: &Path,
    timeout: Duration,
) -> anyhow::Result<Outcome> {
    let accel = Accel::detect();
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args(accel.qemu_args())
        .args(["-m", "2G", "-smp", "2", "-nographic", "-no-reboot"])
        .args(["-nic", "none", "-monitor", "none", "-serial", "stdio"])
        .arg("-kernel")
        .arg(&guest.vmlinuz)
        .arg("-initrd")
        .arg(&guest.initrd)
        .args([
            "-append",
            "console=ttyS0 root=/dev/vda rw panic=-1 quiet loglevel=4",
        ])
        .arg("-drive")
        .arg(format!(
            "file={},if=virtio,format=raw,snapshot=on",
            guest.disk.display()
        ))
        .arg("-drive")
        .arg(format!(
            "file={},if=virtio,format=raw,readonly=on",
            payload.display()
        ))
        .stdin(Stdio::null())
        .stdout(fs::File::create(log)?)
        .stderr(Stdio::inherit());
    setup::step(&format!(
        "booting {} with systemd under {accel:?} (2 vCPU, 2G), timeout {} s; serial log {}",
        guest.kernel_release,
        timeout.as_secs(),
        log.display()
    ));
    let start = Instant::now();
    let mut child = cmd.spawn().context("starting qemu-system-x86_64")?;
    let mut test_started = None;
    loop {
        if test_started.is_none()
            && fs::read_to_string(log).is_ok_and(|l| l.contains("PKGTEST: kernel"))
        {
            test_started = Some(start.elapsed());
        }
        let timed_out = start.elapsed() >= timeout;
        if timed_out {
            let _ = child.kill();
            let _ = child.wait();
        }
        if timed_out || child.try_wait()?.is_some() {
            return Ok(Outcome {
                wall: start.elapsed(),
                timed_out,
                test_started,
            });
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The test's verdict from the serial log: the number of passed checks, or what failed.
fn verdict(log: &str, timed_out: bool) -> Result<usize, String> {
    let failures: Vec<&str> = log
        .lines()
        .filter_map(|l| l.strip_prefix("PKGTEST-FAIL: "))
        .collect();
    let passed = log
        .lines()
        .filter(|l| l.starts_with("PKGTEST: ok "))
        .count();
    let result = log.lines().find_map(|l| l.strip_prefix("PKGTEST-RESULT "));
    if !failures.is_empty() {
        return Err(format!(
            "{} failed: {}",
            failures.len(),
            failures.join("; ")
        ));
    }
    match result {
        Some("pass") if passed > 0 => Ok(passed),
        Some(r) => Err(format!("the script ended with `{r}` after {passed} checks")),
        None if timed_out => Err(format!("timed out after {passed} checks")),
        None => Err(format!(
            "the guest powered off without a result after {passed} checks"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::{script_lines, verdict};

    #[test]
    fn script_lines_drop_the_consoles_escapes() {
        let log = "SeaBIOS\nc\x1b[?7l\x1b[2JPKGTEST: kernel 6.1\nsystemd noise\nPKGTEST: ok x\n";
        assert_eq!(script_lines(log), "PKGTEST: kernel 6.1\nPKGTEST: ok x\n");
    }

    #[test]
    fn verdict_reads_the_scripts_lines() {
        let log = "boot\nPKGTEST: ok dpkg -i\nPKGTEST: ok agent ready\nPKGTEST-RESULT pass\n";
        assert_eq!(verdict(log, false), Ok(2));
        let log =
            "PKGTEST: ok dpkg -i\nPKGTEST-FAIL: kill -9 12: inactive/dead\nPKGTEST-RESULT fail\n";
        let e = verdict(log, false).unwrap_err();
        assert!(e.contains("kill -9 12: inactive/dead"), "{e}");
        assert!(
            verdict("PKGTEST: ok dpkg -i\n", true)
                .unwrap_err()
                .contains("timed out after 1 checks")
        );
        assert!(verdict("", false).unwrap_err().contains("without a result"));
        assert!(
            verdict("PKGTEST-RESULT pass\n", false).is_err(),
            "no check passed"
        );
    }
}
