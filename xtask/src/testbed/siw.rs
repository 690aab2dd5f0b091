//! siw (soft iWARP), built from Debian's own kernel source for a test bed kernel.
//!
//! Debian builds rdma_rxe but not siw (`CONFIG_RDMA_SIW` is unset), and rxe raises no QP async
//! errors, so the test bed builds siw itself: the `linux-source-<series>` package of the
//! kernel's upstream release (only `drivers/infiniband/sw/siw` is unpacked from its tarball),
//! compiled out of tree against that kernel's `linux-headers` and `linux-kbuild` packages, at
//! the versions [`package_set`] chooses from what the archive offers now.
//! The module is unsigned (Debian does not enforce signatures; the guest logs a taint line)
//! and has no BTF (pahole is not needed; no probe reads siw's types).
//!
//! Cache layout (under `cache_dir`): `siw/<kver>/siw.ko`, complete when `.complete` exists
//! (it holds the package version built from). The build works in `siw/<kver>.partial`, wiped
//! first; the downloads (~150 MB per kernel) are deleted once the module is built.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use super::debs::{self, KernelLine, deb_names};
use super::package_set;
use super::{Timer, note, remove_dir_if_exists, run};

const COMPLETE: &str = ".complete";

/// Where the kernel tree keeps siw's sources.
const SIW_DIR: &str = "drivers/infiniband/sw/siw";

/// The cached `siw.ko` built for the kernel of `line` (built first if it is not cached).
pub(crate) fn module(cache_dir: &Path, line: KernelLine) -> Result<PathBuf> {
    let kernel = debs::prepare(cache_dir, line)?;
    let kver = &kernel.kernel_release;
    let dir = cache_dir.join("siw").join(kver);
    let ko = dir.join("siw.ko");
    if dir.join(COMPLETE).exists() && ko.is_file() {
        note(format!(
            "using the cached siw.ko for {kver}: {}",
            ko.display()
        ));
        return Ok(ko);
    }
    let version = kernel_version(&cache_dir.join("debs").join(kver), kver)?;
    let partial = cache_dir.join("siw").join(format!("{kver}.partial"));
    remove_dir_if_exists(&partial)?;
    fs::create_dir_all(&partial).with_context(|| format!("cannot create {}", partial.display()))?;
    let t = Timer::start();
    note(format!(
        "building siw.ko for {kver} (image {version}) from Debian's kernel source (downloads \
         ~150 MB, a few minutes) in {} ...",
        partial.display()
    ));
    let built = build(&partial, kver, &version)?;
    // Without its debug info the module is a tenth of the size in every guest image.
    run(Command::new("strip")
        .arg("--strip-debug")
        .arg(&built)
        .arg("-o")
        .arg(partial.join("siw.ko")))
    .context("strip --strip-debug siw.ko failed (binutils comes with gcc)")?;
    remove_dir_if_exists(&partial.join("work"))?;
    remove_dir_if_exists(&dir)?;
    fs::rename(&partial, &dir)
        .with_context(|| format!("cannot move {} into place", partial.display()))?;
    fs::write(dir.join(COMPLETE), format!("{version}\n"))?;
    note(format!("built siw.ko for {kver} in {}", t.took()));
    Ok(ko)
}

/// Downloads, unpacks and compiles in `partial/work`; returns the built module.
fn build(partial: &Path, kver: &str, version: &str) -> Result<PathBuf> {
    let work = partial.join("work");
    let debs_dir = work.join("debs");
    fs::create_dir_all(&debs_dir)?;
    let set = build_set(kver, version)?;
    let pinned: Vec<String> = set.picks().map(package_set::Pick::pinned).collect();
    let t = Timer::start();
    note(format!("siw: downloading {}", pinned.join(" ")));
    run(Command::new("apt-get")
        .arg("download")
        .args(&pinned)
        .current_dir(&debs_dir))
    .with_context(|| format!("downloading the kernel source and headers of {kver} failed"))?;
    note(format!("siw: downloaded in {}", t.took()));

    let t = Timer::start();
    let root = work.join("root");
    for name in deb_names(&debs_dir)? {
        run(Command::new("dpkg-deb")
            .arg("-x")
            .arg(debs_dir.join(&name))
            .arg(&root))
        .with_context(|| format!("cannot extract {name}"))?;
    }
    let tarball = root.join(format!("usr/src/linux-source-{}.tar.xz", series(kver)?));
    let top = format!("linux-source-{}", series(kver)?);
    let src = work.join("src");
    fs::create_dir_all(&src)?;
    run(Command::new("tar")
        .arg("-xJf")
        .arg(&tarball)
        .arg("-C")
        .arg(&src)
        .arg(format!("{top}/{SIW_DIR}")))
    .with_context(|| format!("cannot unpack {SIW_DIR} from {}", tarball.display()))?;
    note(format!("siw: unpacked the sources in {}", t.took()));

    let t = Timer::start();
    let siw_src = src.join(&top).join(SIW_DIR);
    let kbuild_dir = root.join(format!("usr/src/linux-headers-{kver}"));
    if !kbuild_dir.is_dir() {
        bail!(
            "the headers of {kver} have no {}: the test bed expects Debian's layout",
            kbuild_dir.display()
        );
    }
    // The arch headers' Makefile includes the common headers' by their absolute installed
    // path; point it at the unpacked copy.
    let makefile = kbuild_dir.join("Makefile");
    let text = fs::read_to_string(&makefile)
        .with_context(|| format!("cannot read {}", makefile.display()))?;
    fs::write(
        &makefile,
        text.replace(" /usr/src/", &format!(" {}/usr/src/", root.display())),
    )?;
    run(Command::new("make")
        .arg("-C")
        .arg(&kbuild_dir)
        .arg(format!("M={}", siw_src.display()))
        .args([
            "CONFIG_RDMA_SIW=m",
            // No BTF for the module: it would need pahole, and nothing reads siw's types.
            "CONFIG_DEBUG_INFO_BTF_MODULES=",
            "-j2",
            "modules",
        ]))
    .context("compiling siw failed (needs make and gcc-12: `cargo xtask setup` installs them)")?;
    note(format!("siw: compiled in {}", t.took()));
    let ko = siw_src.join("siw.ko");
    if !ko.is_file() {
        bail!("make left no {}", ko.display());
    }
    Ok(ko)
}

/// `6.1.0-56-amd64` -> `6.1`, `6.12.117+deb12-amd64` -> `6.12`: the `linux-source-*` name.
fn series(kver: &str) -> Result<String> {
    let mut parts = kver.split(|c: char| !c.is_ascii_digit());
    match (parts.next(), parts.next()) {
        (Some(a), Some(b)) if !a.is_empty() && !b.is_empty() => Ok(format!("{a}.{b}")),
        _ => bail!("kernel release {kver:?} does not start with MAJOR.MINOR"),
    }
}

/// The Debian version of the cached kernel image package of `kver`.
fn kernel_version(debs_dir: &Path, kver: &str) -> Result<String> {
    let prefix = format!("linux-image-{kver}_");
    let name = deb_names(debs_dir)?
        .into_iter()
        .find(|n| n.starts_with(&prefix))
        .with_context(|| format!("no {prefix}*.deb in {}", debs_dir.display()))?;
    let out = run(Command::new("dpkg-deb")
        .args(["-f"])
        .arg(debs_dir.join(&name))
        .arg("Version"))?;
    let version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if version.is_empty() {
        bail!("{name} has no Version field");
    }
    Ok(version)
}

/// The versions siw is built from for `kver`, whose image is at `version`: chosen from
/// `apt-cache show` as apt would ([`package_set`]), with the package lists refreshed once
/// when the archive they describe offers no complete set. Says which versions it chose.
fn build_set(kver: &str, version: &str) -> Result<package_set::BuildSet> {
    let image: debversion::Version = version
        .parse()
        .map_err(|e| anyhow::anyhow!("the image's version {version:?}: {e}"))?;
    let series = series(kver)?;
    let choose = || -> Result<package_set::BuildSet> {
        let mut stanzas = Vec::new();
        for package in package_set::wanted(kver, &series) {
            stanzas.extend(apt_cache_show(&package)?);
        }
        let mut dependencies: Vec<String> = stanzas
            .iter()
            .flat_map(|s| s.depends.iter().flatten())
            .map(|r| r.package.clone())
            .filter(|p| package_set::is_build_dependency(p))
            .collect();
        dependencies.sort();
        dependencies.dedup();
        for package in dependencies {
            stanzas.extend(apt_cache_show(&package)?);
        }
        package_set::choose(kver, &series, &image, &stanzas).map_err(anyhow::Error::msg)
    };
    let set = match choose() {
        Ok(set) => set,
        Err(e) => {
            debs::apt_update(&format!("siw's packages for {kver}: {e:#}"))?;
            choose()
                .with_context(|| format!("siw's packages for {kver}, after `apt-get update`"))?
        }
    };
    let differ: Vec<String> = set
        .picks()
        .filter(|p| p.version != image)
        .map(ToString::to_string)
        .collect();
    note(format!(
        "siw: building for the image {version} from {}{}",
        set.picks()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        if differ.is_empty() {
            String::new()
        } else {
            format!(
                " (not at the image's version, as the archive has it now: {})",
                differ.join(", ")
            )
        }
    ));
    Ok(set)
}

/// Every version of `package` the package lists know (none when they know none).
fn apt_cache_show(package: &str) -> Result<Vec<package_set::Stanza>> {
    let out = Command::new("apt-cache")
        .args(["show", package])
        .output()
        .context("cannot run apt-cache")?;
    // apt-cache exits 100 with "No packages found" for a name no list has.
    let text = String::from_utf8_lossy(&out.stdout);
    package_set::parse_apt_cache_show(&text)
        .map_err(|e| anyhow::anyhow!("`apt-cache show {package}`: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds (or finds cached) siw for both kernel lines and checks what modinfo says.
    #[test]
    #[ignore = "downloads ~150 MB per kernel and compiles siw (a few minutes each)"]
    fn builds_siw_for_every_kernel_line() {
        let home = std::env::var_os("HOME").expect("HOME is set");
        let cache = PathBuf::from(home).join(".cache/railscope/testbed");
        for line in [KernelLine::Bookworm, KernelLine::Bookworm612] {
            let ko = module(&cache, line).expect("siw builds");
            let kver = debs::prepare(&cache, line).unwrap().kernel_release;
            let out = run(Command::new("modinfo").arg(&ko)).unwrap();
            let info = String::from_utf8_lossy(&out.stdout);
            assert!(info.contains(&format!("vermagic:       {kver} ")), "{info}");
            assert!(info.contains("depends:        ib_core"), "{info}");
        }
    }

    #[test]
    fn source_package_series() {
        assert_eq!(series("6.1.0-56-amd64").unwrap(), "6.1");
        assert_eq!(series("6.12.117+deb12-amd64").unwrap(), "6.12");
        assert!(series("amd64").is_err());
    }
}
