//! The guest's Debian packages: resolve the kernel of a [`KernelLine`], download the debs once
//! into the cache and extract them into a tree the image is staged from.
//!
//! Cache layout (under `cache_dir`), one set per kernel release so lines coexist:
//! - `debs/<kver>/*.deb`, complete when `debs/<kver>/.complete` exists and lists every
//!   package wanted;
//! - `tree/<kver>/` (all debs extracted, `depmod` run), complete when `.complete` exists and
//!   lists the same debs.
//!
//! Each step works in a `<kver>.partial` directory, wiped first, and renames it into place
//! only when it finished: an interrupted download or extraction is redone, never reused.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use super::{Timer, dir_size, mbytes, note, remove_dir_if_exists, run};

/// Debian kernel lines the test bed can boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum KernelLine {
    /// Debian 12's 6.1 kernel: what `linux-image-amd64` depends on now.
    Bookworm,
    /// Debian 12's 6.12 kernel: what `linux-image-6.12-amd64` depends on now.
    Bookworm612,
}

impl KernelLine {
    /// The meta package that depends on the line's current kernel image package.
    pub(crate) fn meta_package(self) -> &'static str {
        match self {
            KernelLine::Bookworm => "linux-image-amd64",
            KernelLine::Bookworm612 => "linux-image-6.12-amd64",
        }
    }
}

/// Userspace packages of the guest, beside the kernel image: rdma-core (verbs, the rxe
/// provider, rdma_cm), its tools, perftest, iproute2 (`ip`, `rdma`, `tc`), bpftool, pciutils (`lspci`),
/// ethtool (`ethtool -S`, what the agent's ethtool statistics are checked against), and the
/// libraries these link against that a stock busybox system lacks.
const GUEST_PACKAGES: &[&str] = &[
    "rdma-core",
    "ibverbs-providers",
    "libibverbs1",
    "librdmacm1",
    "rdmacm-utils",
    "ibverbs-utils",
    "perftest",
    "iproute2",
    "bpftool",
    // lspci, for pcie-topology's PCI tree.
    "pciutils",
    "ethtool",
    "libpci3",
    "libibumad3",
    "libnl-3-200",
    "libnl-route-3-200",
    "libbpf1",
    "libelf1",
    "libmnl0",
    "libcap2",
    "libbsd0",
    // tc links against it.
    "libxtables12",
];

/// Marker file written into a cache directory once the step that fills it completed.
const COMPLETE: &str = ".complete";

/// The extracted packages of one kernel release.
pub(crate) struct Debs {
    /// The kernel release, e.g. `6.1.0-56-amd64`.
    pub kernel_release: String,
    /// Every deb extracted into one tree, with `depmod` run over its modules.
    pub tree: PathBuf,
}

/// Resolves the kernel of `line`, downloads (once) the guest's debs and extracts them (once).
///
/// Runs `apt-get update` only when apt-cache cannot resolve the kernel package, or when the
/// download fails (the package lists may name a version that has left the archive).
pub(crate) fn prepare(cache_dir: &Path, line: KernelLine) -> Result<Debs> {
    let mut updated = false;
    let kernel_package = match resolve_kernel_package(line) {
        Some(p) => p,
        None => {
            apt_update(&format!("apt-cache cannot resolve {}", line.meta_package()))?;
            updated = true;
            resolve_kernel_package(line).with_context(|| {
                format!(
                    "apt-cache cannot resolve the kernel of {} even after `apt-get update`: \
                     is this a Debian 12 (bookworm) machine with the main archive in its sources?",
                    line.meta_package()
                )
            })?
        }
    };
    let (kernel_package, debs_dir) = match download(cache_dir, &kernel_package) {
        Ok(dir) => (kernel_package, dir),
        Err(e) if !updated => {
            apt_update(&format!("the download failed ({e:#})"))?;
            let p = resolve_kernel_package(line)
                .with_context(|| format!("apt-cache cannot resolve {}", line.meta_package()))?;
            let dir = download(cache_dir, &p)?;
            (p, dir)
        }
        Err(e) => return Err(e),
    };
    let kernel_release = kernel_release_of(&kernel_package)?.to_owned();
    let tree = extract(cache_dir, &debs_dir, &kernel_release)?;
    Ok(Debs {
        kernel_release,
        tree,
    })
}

/// The kernel image package `meta` depends on, from `apt-cache depends` output.
fn parse_kernel_dependency(apt_cache_depends: &str) -> Option<String> {
    apt_cache_depends.lines().find_map(|l| {
        // "  Depends: linux-image-6.1.0-56-amd64"; "|Depends:" starts a list of alternatives;
        // "<name>" is a virtual package, which cannot be downloaded.
        let dep = l
            .trim()
            .trim_start_matches('|')
            .strip_prefix("Depends:")?
            .trim();
        (dep.starts_with("linux-image-") && !dep.contains(['<', ' '])).then(|| dep.to_owned())
    })
}

/// `linux-image-6.1.0-56-amd64` -> `6.1.0-56-amd64`.
fn kernel_release_of(kernel_package: &str) -> Result<&str> {
    match kernel_package.strip_prefix("linux-image-") {
        Some(r) if r.starts_with(|c: char| c.is_ascii_digit()) => Ok(r),
        _ => bail!("{kernel_package} does not look like a kernel image package"),
    }
}

/// What the line's meta package depends on now, or `None` when apt-cache cannot tell.
fn resolve_kernel_package(line: KernelLine) -> Option<String> {
    let out = Command::new("apt-cache")
        .args(["depends", line.meta_package()])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    parse_kernel_dependency(&String::from_utf8_lossy(&out.stdout))
}

/// Refreshes the package lists, saying why.
pub(super) fn apt_update(why: &str) -> Result<()> {
    let t = Timer::start();
    note(format!("{why}: running `apt-get update` ..."));
    run(Command::new("apt-get").args(["update", "-qq"])).context(
        "`apt-get update` failed: it needs root (or run `sudo apt-get update` first) \
         and access to the Debian archive",
    )?;
    note(format!("package lists updated in {}", t.took()));
    Ok(())
}

/// Downloads the kernel package and the guest packages into `debs/<kver>/`, unless a
/// complete download of every one of them is there already (a cache made before a package
/// was added to [`GUEST_PACKAGES`] is downloaded again).
fn download(cache_dir: &Path, kernel_package: &str) -> Result<PathBuf> {
    let kver = kernel_release_of(kernel_package)?;
    let base = cache_dir.join("debs");
    let dir = base.join(kver);
    let mut packages = vec![kernel_package];
    packages.extend_from_slice(GUEST_PACKAGES);
    let cached = fs::read_to_string(dir.join(COMPLETE)).ok();
    if cached.is_some_and(|listed| lists_all(&listed, &packages)) {
        note(format!(
            "using {} cached debs for {kver} ({}) in {}",
            packages.len(),
            mbytes(dir_size(&dir, ".deb")),
            dir.display()
        ));
        return Ok(dir);
    }
    let partial = base.join(format!("{kver}.partial"));
    remove_dir_if_exists(&partial)?;
    fs::create_dir_all(&partial)
        .with_context(|| format!("cannot create the deb cache {}", partial.display()))?;
    let t = Timer::start();
    note(format!(
        "downloading {} debs for {kver} into {} ...",
        packages.len(),
        dir.display()
    ));
    run(Command::new("apt-get")
        .arg("download")
        .args(&packages)
        .current_dir(&partial))
    .context("downloading the guest's debs failed (is the Debian archive reachable?)")?;
    let names = deb_names(&partial)?;
    for p in &packages {
        if !names.iter().any(|n| n.starts_with(&format!("{p}_"))) {
            bail!(
                "`apt-get download` left no {p}_*.deb in {}",
                partial.display()
            );
        }
    }
    remove_dir_if_exists(&dir)?;
    fs::rename(&partial, &dir)
        .with_context(|| format!("cannot move {} into place", partial.display()))?;
    fs::write(dir.join(COMPLETE), packages.join("\n") + "\n")?;
    note(format!(
        "downloaded {} debs ({}) in {}",
        packages.len(),
        mbytes(dir_size(&dir, ".deb")),
        t.took()
    ));
    Ok(dir)
}

/// Whether a `.complete` file's lines name every package of `packages`.
fn lists_all(listed: &str, packages: &[&str]) -> bool {
    packages
        .iter()
        .all(|p| listed.lines().any(|l| l.trim() == *p))
}

/// Names of the `.deb` files in `dir`, sorted.
pub(super) fn deb_names(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for e in fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let name = e?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".deb") {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// Extracts every deb of `debs_dir` into `tree/<kver>/` and runs `depmod` over it, unless a
/// complete tree of the same debs is there already (its `.complete` lists them).
fn extract(cache_dir: &Path, debs_dir: &Path, kver: &str) -> Result<PathBuf> {
    let base = cache_dir.join("tree");
    let tree = base.join(kver);
    let names = deb_names(debs_dir)?;
    let listing = names.join("\n") + "\n";
    if fs::read_to_string(tree.join(COMPLETE)).is_ok_and(|done| done == listing) {
        return Ok(tree);
    }
    let partial = base.join(format!("{kver}.partial"));
    remove_dir_if_exists(&partial)?;
    fs::create_dir_all(&partial).with_context(|| format!("cannot create {}", partial.display()))?;
    let t = Timer::start();
    for name in &names {
        run(Command::new("dpkg-deb")
            .arg("-x")
            .arg(debs_dir.join(name))
            .arg(&partial))
        .with_context(|| format!("cannot extract {name}"))?;
    }
    for needed in [
        format!("boot/vmlinuz-{kver}"),
        format!("lib/modules/{kver}"),
    ] {
        if !partial.join(&needed).exists() {
            bail!(
                "the kernel package of {kver} has no /{needed}: the test bed expects \
                 Debian's layout"
            );
        }
    }
    run(Command::new("depmod").arg("-b").arg(&partial).arg(kver))
        .with_context(|| format!("depmod over the extracted modules of {kver} failed"))?;
    remove_dir_if_exists(&tree)?;
    fs::rename(&partial, &tree)
        .with_context(|| format!("cannot move {} into place", partial.display()))?;
    fs::write(tree.join(COMPLETE), listing)?;
    note(format!(
        "extracted {} debs for {kver} in {}",
        names.len(),
        t.took()
    ));
    Ok(tree)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_dependency_from_apt_cache_depends() {
        let out = "linux-image-amd64\n  Depends: linux-image-6.1.0-56-amd64\n";
        assert_eq!(
            parse_kernel_dependency(out).as_deref(),
            Some("linux-image-6.1.0-56-amd64")
        );
        let out = "linux-image-6.12-amd64\n  Depends: linux-image-6.12.117+deb12-amd64\n";
        assert_eq!(
            parse_kernel_dependency(out).as_deref(),
            Some("linux-image-6.12.117+deb12-amd64")
        );
    }

    #[test]
    fn kernel_dependency_skips_other_and_virtual_packages() {
        let out = "linux-image-amd64\n  Depends: firmware-linux-free\n |Depends: <linux-image-virtual>\n    linux-image-6.1.0-1-amd64\n  Depends: linux-image-6.1.0-9-amd64\n  Recommends: apparmor\n";
        assert_eq!(
            parse_kernel_dependency(out).as_deref(),
            Some("linux-image-6.1.0-9-amd64")
        );
        assert_eq!(parse_kernel_dependency(""), None);
        assert_eq!(
            parse_kernel_dependency("linux-image-amd64\n  Recommends: linux-image-6.1.0-9-amd64\n"),
            None
        );
    }

    #[test]
    fn a_cache_without_a_package_added_since_is_not_complete() {
        let listed = "linux-image-6.1.0-56-amd64\nrdma-core\niproute2\n";
        assert!(lists_all(listed, &["rdma-core", "iproute2"]));
        assert!(!lists_all(listed, &["rdma-core", "libxtables12"]));
        assert!(!lists_all("rdma-core-extra\n", &["rdma-core"]));
    }

    #[test]
    fn kernel_release_from_package_name() {
        assert_eq!(
            kernel_release_of("linux-image-6.1.0-56-amd64").unwrap(),
            "6.1.0-56-amd64"
        );
        assert_eq!(
            kernel_release_of("linux-image-6.12.117+deb12-amd64").unwrap(),
            "6.12.117+deb12-amd64"
        );
        assert!(kernel_release_of("linux-image-amd64").is_err());
        assert!(kernel_release_of("linux-headers-6.1.0-56-amd64").is_err());
    }
}
