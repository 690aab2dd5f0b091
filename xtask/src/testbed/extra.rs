//! Extra Debian packages for image variants that need more than the test bed's own tools, such
//! as the benchmark's bpftrace (whose LLVM and clang libraries add some 200 MB unpacked: too much
//! for the image every scenario boots).
//!
//! They do not depend on the kernel, so they are cached apart from the kernel's debs, one set
//! per variant name (under `cache_dir`):
//! - `extra-debs/<name>/*.deb`, complete when `.complete` exists and lists the same packages;
//! - `extra-tree/<name>/` (all of them extracted), complete when `.complete` does.
//!
//! As in [`super::debs`], each step works in a `<name>.partial` directory and renames it into
//! place only once it finished.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use super::debs::deb_names;
use super::{Timer, dir_size, mbytes, note, remove_dir_if_exists, run};

/// Programs from Debian packages beyond the test bed's own, for one image variant.
#[derive(Clone, Debug)]
pub(crate) struct ExtraDebs {
    /// Names the variant's cache directories (`[a-z0-9-]`).
    pub name: &'static str,
    /// Packages to download and extract: the programs' packages and those of every library
    /// they link against (libraries found in none of them are taken from the host, as for the
    /// test bed's tools).
    pub packages: &'static [&'static str],
    /// Programs from these packages, put at `/usr/bin/<name>` with their shared libraries.
    pub tools: &'static [&'static str],
}

const COMPLETE: &str = ".complete";

/// Downloads (once) and extracts (once) the packages of `extra`; returns the extracted tree.
pub(crate) fn prepare(cache_dir: &Path, extra: &ExtraDebs) -> Result<PathBuf> {
    if extra.name.is_empty()
        || !extra
            .name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        bail!("extra package set name {:?} is not [a-z0-9-]+", extra.name);
    }
    let listing = extra.packages.join("\n") + "\n";
    let debs = cache_dir.join("extra-debs").join(extra.name);
    let tree = cache_dir.join("extra-tree").join(extra.name);
    let cached = fs::read_to_string(debs.join(COMPLETE)).is_ok_and(|l| l == listing);
    if cached {
        note(format!(
            "using {} cached extra debs ({}) in {}",
            extra.packages.len(),
            mbytes(dir_size(&debs, ".deb")),
            debs.display()
        ));
    } else {
        download(&debs, extra.packages)?;
        fs::write(debs.join(COMPLETE), &listing)?;
        // A tree extracted from another package list is stale.
        remove_dir_if_exists(&tree)?;
    }
    if !tree.join(COMPLETE).exists() {
        extract(&debs, &tree)?;
    }
    Ok(tree)
}

/// `dir` with `.partial` appended to its last component.
fn partial_of(dir: &Path) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    dir.with_file_name(name)
}

fn download(dir: &Path, packages: &[&str]) -> Result<()> {
    let partial = partial_of(dir);
    remove_dir_if_exists(&partial)?;
    fs::create_dir_all(&partial)
        .with_context(|| format!("cannot create the deb cache {}", partial.display()))?;
    let t = Timer::start();
    note(format!(
        "downloading {} extra debs into {} ...",
        packages.len(),
        dir.display()
    ));
    let fetch = |partial: &Path| {
        run(Command::new("apt-get")
            .arg("download")
            .args(packages)
            .current_dir(partial))
    };
    if fetch(&partial).is_err() {
        // The package lists may name versions that have left the archive.
        note("`apt-get download` failed: running `apt-get update` and trying again");
        run(Command::new("apt-get").args(["update", "-qq"]))
            .context("`apt-get update` failed (it needs root and the Debian archive)")?;
        fetch(&partial).context("downloading the extra debs failed")?;
    }
    let names = deb_names(&partial)?;
    for p in packages {
        if !names.iter().any(|n| n.starts_with(&format!("{p}_"))) {
            bail!(
                "`apt-get download` left no {p}_*.deb in {}",
                partial.display()
            );
        }
    }
    remove_dir_if_exists(dir)?;
    fs::rename(&partial, dir)
        .with_context(|| format!("cannot move {} into place", partial.display()))?;
    note(format!(
        "downloaded {} extra debs ({}) in {}",
        packages.len(),
        mbytes(dir_size(dir, ".deb")),
        t.took()
    ));
    Ok(())
}

fn extract(debs: &Path, tree: &Path) -> Result<()> {
    let partial = partial_of(tree);
    remove_dir_if_exists(&partial)?;
    fs::create_dir_all(&partial).with_context(|| format!("cannot create {}", partial.display()))?;
    let t = Timer::start();
    let names = deb_names(debs)?;
    for name in &names {
        run(Command::new("dpkg-deb")
            .arg("-x")
            .arg(debs.join(name))
            .arg(&partial))
        .with_context(|| format!("cannot extract {name}"))?;
    }
    remove_dir_if_exists(tree)?;
    fs::rename(&partial, tree)
        .with_context(|| format!("cannot move {} into place", partial.display()))?;
    fs::write(tree.join(COMPLETE), "")?;
    note(format!(
        "extracted {} extra debs in {}",
        names.len(),
        t.took()
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_directory_sits_beside() {
        assert_eq!(
            partial_of(Path::new("/c/extra-debs/bench")),
            Path::new("/c/extra-debs/bench.partial")
        );
    }

    #[test]
    fn bad_names_are_refused() {
        let extra = ExtraDebs {
            name: "../x",
            packages: &[],
            tools: &[],
        };
        let e = prepare(Path::new("/nonexistent"), &extra).unwrap_err();
        assert!(e.to_string().contains("[a-z0-9-]"), "{e}");
    }
}
