//! `cargo xtask setup`: everything the build and the tests need, installed idempotently.
//!
//! - the nightly toolchain's `rust-src` (eBPF programs are built with `-Z build-std=core`);
//! - `bpf-linker`, built against the nightly toolchain's own libLLVM so its LLVM always matches
//!   rustc's (no prebuilt binary can be downloaded here), cached per nightly version;
//! - the Debian packages the test bed needs on the host, and the TSDBs the collector's
//!   remote-write tests write to (Prometheus and VictoriaMetrics, started by the tests
//!   themselves on loopback ports, never as system services), and Slurm's controller, node
//!   daemon, client and munge for the actions' tests (started the same way); dygraphs, which the collector
//!   embeds for its dashboard, and Chromium, which the dashboard test drives headless.
//!
//! Each step checks first and says what it found, so a second run takes about a second.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, bail};

use crate::{cargo::output, testbed};

const BPF_LINKER_VERSION: &str = "0.13.0";
const NIGHTLY: &str = "nightly";

/// The Prometheus-compatible servers the collector's remote-write tests start.
pub(crate) const TSDB_PACKAGES: &[&str] = &["prometheus", "victoria-metrics"];

/// The Slurm cluster the actions' tests and the test bed's `slurm-drain` start on loopback
/// (monitor-testkit's `slurm`): the controller, a node daemon, `scontrol`, and munge (its
/// authentication). Installed as packages only: the tests start the daemons themselves, with
/// their own configuration.
pub(crate) const SLURM_PACKAGES: &[&str] = &["slurmctld", "slurmd", "slurm-client", "munge"];

/// The Alertmanager the alert actions' test starts on loopback with its own configuration
/// and storage (the package's own service is not used).
pub(crate) const ALERTMANAGER_PACKAGES: &[&str] = &["prometheus-alertmanager"];

/// The dashboard's charting library, compiled into the collector (its build.rs reads it), and
/// the browser its test drives headless.
pub(crate) const DASHBOARD_PACKAGES: &[&str] = &["libjs-dygraphs", "chromium"];

/// The tools the agent's ethtool test runs (monitor-user/tests/ethtool_netns.rs): `ip` for its
/// network namespace and veth pair, `ethtool -S` for what the agent must match.
pub(crate) const ETHTOOL_TEST_PACKAGES: &[&str] = &["iproute2", "ethtool"];

pub(crate) use crate::{progress::step, tools::Tools};

#[derive(Debug, Clone, clap::Args)]
#[group(skip)] // flattened into other commands' options
pub(crate) struct Options {
    /// Skip installing Debian packages (when the caller has no root or manages them itself).
    #[arg(long)]
    pub no_apt: bool,
}

/// railscope's cache: `$RAILSCOPE_CACHE`, else `$XDG_CACHE_HOME/railscope`, else
/// `~/.cache/railscope`. Downloads and toolchain builds live here, so they survive `cargo clean`
/// and fresh clones.
pub(crate) fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("RAILSCOPE_CACHE") {
        return dir.into();
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/var/cache"));
    base.join("railscope")
}

pub(crate) fn require_root(why: &str) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("{why} needs root: run it as root (e.g. `sudo -E cargo xtask ...`)");
    }
    Ok(())
}

pub(crate) fn run(options: &Options) -> anyhow::Result<Tools> {
    let cache_dir = cache_dir();
    std::fs::create_dir_all(&cache_dir)
        .with_context(|| format!("creating the cache directory {}", cache_dir.display()))?;
    ensure_rust_src()?;
    let bpf_linker_dir = ensure_bpf_linker(&cache_dir)?;
    if !options.no_apt {
        ensure_debian_packages(testbed::HOST_PACKAGES)?;
        ensure_debian_packages(TSDB_PACKAGES)?;
        ensure_debian_packages(SLURM_PACKAGES)?;
        ensure_debian_packages(ALERTMANAGER_PACKAGES)?;
        ensure_debian_packages(DASHBOARD_PACKAGES)?;
        ensure_debian_packages(ETHTOOL_TEST_PACKAGES)?;
        ensure_debian_packages(crate::units::PACKAGES)?;
    }
    Ok(Tools {
        bpf_linker_dir,
        cache_dir,
    })
}

fn ensure_rust_src() -> anyhow::Result<()> {
    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        NIGHTLY,
    ]))
    .context(
        "the nightly toolchain is needed to build eBPF programs: install it with \
         `rustup toolchain install nightly --profile minimal`",
    )?;
    if installed.lines().any(|l| l.starts_with("rust-src")) {
        step("rust-src for nightly: present");
        return Ok(());
    }
    step("installing rust-src for the nightly toolchain");
    crate::cargo::run(Command::new("rustup").args([
        "component",
        "add",
        "rust-src",
        "--toolchain",
        NIGHTLY,
    ]))
}

/// Facts about the nightly toolchain that bpf-linker must link against.
struct NightlyLlvm {
    /// `rustc +nightly --version`, the cache key.
    version: String,
    /// The sysroot's lib directory, holding `libLLVM-<major>-rust-<ver>-nightly.so`.
    lib_dir: PathBuf,
    /// The library's link name, e.g. `LLVM-22-rust-1.97.0-nightly`.
    lib_name: String,
    major: String,
}

fn nightly_llvm() -> anyhow::Result<NightlyLlvm> {
    let verbose = output(Command::new("rustc").args([&format!("+{NIGHTLY}"), "-vV"]))?;
    let field = |key: &str| {
        verbose
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(str::trim)
            .map(str::to_owned)
    };
    let version = verbose.lines().next().unwrap_or_default().trim().to_owned();
    let llvm = field("LLVM version:").context("rustc +nightly -vV shows no LLVM version")?;
    let major = llvm.split('.').next().unwrap_or_default().to_owned();
    let sysroot =
        output(Command::new("rustc").args([&format!("+{NIGHTLY}"), "--print", "sysroot"]))?;
    let lib_dir = Path::new(sysroot.trim()).join("lib");
    let prefix = format!("libLLVM-{major}-");
    let lib_name = std::fs::read_dir(&lib_dir)
        .with_context(|| format!("reading {}", lib_dir.display()))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .find(|n| n.starts_with(&prefix) && n.ends_with(".so"))
        .and_then(|n| Some(n.strip_prefix("lib")?.strip_suffix(".so")?.to_owned()))
        .with_context(|| {
            format!(
                "no {prefix}*.so in {}: the nightly toolchain lacks its LLVM library \
                 (reinstall it with `rustup toolchain install nightly`)",
                lib_dir.display()
            )
        })?;
    Ok(NightlyLlvm {
        version,
        lib_dir,
        lib_name,
        major,
    })
}

fn ensure_bpf_linker(cache_dir: &Path) -> anyhow::Result<PathBuf> {
    let llvm = nightly_llvm()?;
    let key: String = llvm
        .version
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let root = cache_dir.join(format!("bpf-linker-{BPF_LINKER_VERSION}-{key}"));
    let bin_dir = root.join("bin");
    let binary = bin_dir.join("bpf-linker");
    if binary.is_file()
        && Command::new(&binary)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    {
        step(&format!(
            "bpf-linker {BPF_LINKER_VERSION}: {}",
            binary.display()
        ));
        return Ok(bin_dir);
    }
    step(&format!(
        "building bpf-linker {BPF_LINKER_VERSION} against {} (LLVM {}; about a minute)",
        llvm.version, llvm.major
    ));
    let started = Instant::now();
    let rustflags = format!(
        "-L {dir} -l dylib={lib} -C link-arg=-Wl,-rpath,{dir}",
        dir = llvm.lib_dir.display(),
        lib = llvm.lib_name
    );
    crate::cargo::run(
        Command::new("cargo")
            .args([
                "install",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
                "--no-default-features",
                "--features",
                &format!("llvm-{},no-llvm-linking", llvm.major),
                "--root",
            ])
            .arg(&root)
            .env("RUSTFLAGS", rustflags)
            // The workspace's own cargo config must not leak into this install.
            .current_dir(cache_dir),
    )
    .context("building bpf-linker failed; see cargo's output above")?;
    step(&format!("bpf-linker built in {:.0?}", started.elapsed()));
    Ok(bin_dir)
}

fn dpkg_installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .is_ok_and(|o| o.status.success() && o.stdout.ends_with(b"install ok installed"))
}

pub(crate) fn ensure_debian_packages(packages: &[&str]) -> anyhow::Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| !dpkg_installed(p))
        .collect();
    if missing.is_empty() {
        step(&format!("Debian packages: {} present", packages.join(", ")));
        return Ok(());
    }
    require_root(&format!("installing {}", missing.join(", ")))?;
    step(&format!(
        "installing Debian packages: {}",
        missing.join(" ")
    ));
    crate::cargo::run(Command::new("apt-get").args(["update", "-qq"]))
        .context("apt-get update failed")?;
    crate::cargo::run(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .with_context(|| format!("could not install {}", missing.join(" ")))
}
