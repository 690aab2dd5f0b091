//! `cargo xtask package`: the Debian package `railscope`, built with `dpkg-deb` from a staged
//! tree (the binaries are built by cargo here, with the eBPF object embedded; the units,
//! example configs, maintainer scripts and copyright come from `dist/`), then checked with
//! lintian.
//!
//! `dpkg-deb` rather than cargo-deb: the package holds two crates' binaries, an operator
//! script, units and maintainer scripts of its own, and the eBPF object needs the toolchain
//! `setup` prepares; dpkg-deb, present on every Debian system, takes the staged tree as it is,
//! with nothing to install or configure around it.

use std::{
    fs,
    io::Write as _,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::{
    cargo::{self, output},
    setup,
};

/// The package's name, and its directory under `/usr/share/doc`.
const NAME: &str = "railscope";

/// Debian revision appended to the workspace version.
const DEBIAN_REVISION: &str = "1";

/// Debian packages this command needs: lintian (dpkg-deb and dpkg-shlibdeps come with dpkg
/// and dpkg-dev).
pub const PACKAGES: &[&str] = &["lintian", "dpkg-dev"];

/// Lintian tags left, each with why it stays; any other tag fails the build.
const ACCEPTED_LINTIAN_TAGS: &[(&str, &str)] = &[
    (
        "no-manual-page",
        "the commands document themselves (`--help`); the docs are in /usr/share/doc/railscope",
    ),
    (
        "initial-upload-closes-no-bugs",
        "the package is not uploaded to Debian",
    ),
];

/// Files of the package and where they go; `mode` is the installed mode.
struct Entry {
    /// Relative to the workspace root, or an absolute path (built binaries).
    from: PathBuf,
    to: String,
    mode: u32,
}

#[derive(Debug, clap::Args)]
pub struct Options {
    /// Skip lintian (it takes a while on a busy machine).
    #[arg(long)]
    pub no_lintian: bool,
    #[command(flatten)]
    pub setup: setup::Options,
}

pub fn run(options: &Options) -> anyhow::Result<()> {
    let tools = setup::run(&options.setup)?;
    if !options.setup.no_apt {
        setup::ensure_debian_packages(PACKAGES)?;
    }
    let deb = build(&tools, !options.no_lintian)?;
    println!("{}", deb.display());
    Ok(())
}

/// Builds the binaries and the package; returns the path of the `.deb`.
pub fn build(tools: &setup::Tools, lintian: bool) -> anyhow::Result<PathBuf> {
    setup::step("building railscope (eBPF object embedded) and railscope-collector (release)");
    let mut cmd = cargo::command(tools);
    cmd.args([
        "build",
        "--release",
        "--package",
        "monitor-user",
        "--bin",
        "railscope",
        "--package",
        "monitor-collector",
        "--bin",
        "railscope-collector",
    ]);
    let built = cargo::build_executables(cmd)?;
    let binary = |name: &str| {
        built
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| p.clone())
            .with_context(|| format!("cargo did not report the {name} binary"))
    };
    build_from(
        &binary("railscope")?,
        &binary("railscope-collector")?,
        lintian,
    )
}

/// The package of the two binaries `agent` and `collector`, built already (the suite's
/// workspace build); returns the path of the `.deb`.
pub fn build_from(agent: &Path, collector: &Path, lintian: bool) -> anyhow::Result<PathBuf> {
    let root = cargo::workspace_root();

    let version = format!("{}-{DEBIAN_REVISION}", workspace_version(&root)?);
    let arch = output(Command::new("dpkg").arg("--print-architecture"))?;
    let out_dir = root.join("target/package");
    let stage = out_dir.join(format!("{NAME}_{version}_{arch}"));
    setup::step(&format!("staging {}", stage.display()));
    if stage.exists() {
        fs::remove_dir_all(&stage).with_context(|| format!("removing {}", stage.display()))?;
    }
    let mut entries = vec![
        Entry {
            from: agent.to_path_buf(),
            to: "usr/bin/railscope".into(),
            mode: 0o755,
        },
        Entry {
            from: collector.to_path_buf(),
            to: "usr/bin/railscope-collector".into(),
            mode: 0o755,
        },
        Entry {
            from: "scripts/gen-wire-key".into(),
            to: "usr/sbin/railscope-gen-wire-key".into(),
            mode: 0o755,
        },
        // Bookworm's systemd and lintian expect packaged units under /lib (usrmerge aliases it).
        Entry {
            from: "dist/railscope-agent.service".into(),
            to: "lib/systemd/system/railscope-agent.service".into(),
            mode: 0o644,
        },
        Entry {
            from: "dist/railscope-collector.service".into(),
            to: "lib/systemd/system/railscope-collector.service".into(),
            mode: 0o644,
        },
        Entry {
            from: "dist/agent.toml".into(),
            to: "etc/railscope/agent.toml".into(),
            mode: 0o644,
        },
        Entry {
            from: "dist/collector.toml".into(),
            to: "etc/railscope/collector.toml".into(),
            mode: 0o644,
        },
        // Opt-in: the collector's user for Slurm actions (docs/actions.md).
        Entry {
            from: "dist/railscope-collector-slurm-actions.conf".into(),
            to: "usr/share/doc/railscope/examples/railscope-collector.service.d/slurm-actions.conf"
                .into(),
            mode: 0o644,
        },
        // Opt-in: lldpd's group for the agent, where lldpd runs (docs/deployment.md).
        Entry {
            from: "dist/railscope-agent-lldp.conf".into(),
            to: "usr/share/doc/railscope/examples/railscope-agent.service.d/lldp.conf".into(),
            mode: 0o644,
        },
        Entry {
            from: "dist/debian/copyright".into(),
            to: "usr/share/doc/railscope/copyright".into(),
            mode: 0o644,
        },
        Entry {
            from: "README.md".into(),
            to: "usr/share/doc/railscope/README.md".into(),
            mode: 0o644,
        },
    ];
    // Every document; the units' `Documentation=` names deployment.md there.
    for doc in fs::read_dir(root.join("docs"))? {
        let name = doc?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") {
            entries.push(Entry {
                from: Path::new("docs").join(&name),
                to: format!("usr/share/doc/railscope/{name}"),
                mode: 0o644,
            });
        }
    }
    for e in &entries {
        let from = root.join(&e.from);
        let to = stage.join(&e.to);
        fs::create_dir_all(to.parent().expect("entries are in directories"))?;
        fs::copy(&from, &to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        fs::set_permissions(&to, fs::Permissions::from_mode(e.mode))?;
        if e.to.starts_with("usr/bin/") {
            // The binaries' symbols and debug info (the embedded eBPF object is data, kept).
            run_tool(
                Command::new("strip")
                    .arg("--strip-unneeded")
                    .arg("--remove-section=.comment")
                    .arg("--remove-section=.note")
                    .arg(&to),
            )?;
        }
    }
    let maintainer = maintainer(&root);
    write_changelog(&root, &stage, &version, &maintainer)?;

    let debian = stage.join("DEBIAN");
    fs::create_dir_all(&debian)?;
    for script in ["postinst", "prerm", "postrm"] {
        let to = debian.join(script);
        fs::copy(root.join("dist/debian").join(script), &to)?;
        fs::set_permissions(&to, fs::Permissions::from_mode(0o755))?;
    }
    fs::write(
        debian.join("conffiles"),
        "/etc/railscope/agent.toml\n/etc/railscope/collector.toml\n",
    )?;
    let depends = shlib_depends(&out_dir, &stage)?;
    let installed_kib = du_kib(&stage)?;
    let control = control(&version, &arch, &maintainer, &depends, installed_kib);
    fs::write(debian.join("control"), control)?;
    let mut md5 = fs::File::create(debian.join("md5sums"))?;
    md5.write_all(md5sums(&stage)?.as_bytes())?;
    for dir in walk_dirs(&stage)? {
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))?;
    }

    let deb = out_dir.join(format!("{NAME}_{version}_{arch}.deb"));
    setup::step(&format!("dpkg-deb --build -> {}", deb.display()));
    run_tool(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "-Zxz", "--build"])
            .arg(&stage)
            .arg(&deb),
    )?;
    let size = fs::metadata(&deb)?.len();
    eprintln!(
        "    {} ({:.1} MB, installs {:.1} MB; Depends: {depends})",
        deb.display(),
        size as f64 / 1e6,
        installed_kib as f64 / 1024.0
    );
    if lintian {
        check_lintian(&deb)?;
    }
    Ok(deb)
}

/// `version` of `[workspace.package]` in the root Cargo.toml.
fn workspace_version(root: &Path) -> anyhow::Result<String> {
    let manifest = fs::read_to_string(root.join("Cargo.toml"))?;
    let mut in_section = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_section = line == "[workspace.package]";
        } else if in_section && let Some(v) = line.strip_prefix("version") {
            let v = v
                .trim_start()
                .trim_start_matches('=')
                .trim()
                .trim_matches('"');
            return Ok(v.to_owned());
        }
    }
    bail!("no version in [workspace.package] of Cargo.toml")
}

/// The package's maintainer, as Debian's tools take it: `DEBFULLNAME <DEBEMAIL>` when both
/// are set, else the author of the last commit.
fn maintainer(root: &Path) -> String {
    if let (Ok(name), Ok(mail)) = (std::env::var("DEBFULLNAME"), std::env::var("DEBEMAIL")) {
        return format!("{name} <{mail}>");
    }
    output(
        Command::new("git")
            .args(["log", "-1", "--format=%an <%ae>"])
            .current_dir(root),
    )
    .unwrap_or_else(|_| "railscope maintainers <maintainers@invalid>".into())
}

/// The control file.
fn control(
    version: &str,
    arch: &str,
    maintainer: &str,
    depends: &str,
    installed_kib: u64,
) -> String {
    format!(
        "Package: {NAME}
Version: {version}
Architecture: {arch}
Maintainer: {maintainer}
Installed-Size: {installed_kib}
Depends: {depends}, init-system-helpers (>= 1.52)
Section: admin
Priority: optional
Description: monitor for GPU and InfiniBand/RoCE AI training clusters
 railscope watches the nodes of an AI training cluster: its node agent
 (railscope, run as the railscope-agent service) attaches eBPF probes to the
 RDMA verbs and IB driver events, reads every IB counter and the GPUs' metrics
 through NVML, and sends them in compact authenticated UDP frames to a
 collector (railscope-collector, the railscope-collector service), which
 archives them and serves /metrics, a query API and remote-write.
 .
 Configuration: /etc/railscope/agent.toml and collector.toml; the frames' key:
 /etc/railscope/wire.key (railscope-gen-wire-key makes one). See
 /usr/share/doc/railscope/deployment.md.
"
    )
}

/// `Depends` for the binaries' shared libraries, from dpkg-shlibdeps (which wants a
/// `debian/control` in its working directory).
fn shlib_depends(out_dir: &Path, stage: &Path) -> anyhow::Result<String> {
    let work = out_dir.join("shlibdeps");
    fs::create_dir_all(work.join("debian"))?;
    fs::write(
        work.join("debian/control"),
        format!("Source: {NAME}\n\nPackage: {NAME}\nArchitecture: any\n"),
    )?;
    let out = output(
        Command::new("dpkg-shlibdeps")
            .arg("-O")
            .arg(stage.join("usr/bin/railscope"))
            .arg(stage.join("usr/bin/railscope-collector"))
            .current_dir(&work),
    )?;
    out.lines()
        .find_map(|l| l.strip_prefix("shlibs:Depends="))
        .map(str::to_owned)
        .with_context(|| format!("dpkg-shlibdeps printed no shlibs:Depends: {out}"))
}

/// `usr/share/doc/railscope/changelog.Debian.gz`, one entry for this version, dated by the
/// last commit (so two builds of one commit are the same).
fn write_changelog(
    root: &Path,
    stage: &Path,
    version: &str,
    maintainer: &str,
) -> anyhow::Result<()> {
    let date = output(
        Command::new("git")
            .args(["log", "-1", "--format=%aD"])
            .current_dir(root),
    )
    .unwrap_or_else(|_| "Thu, 01 Jan 2026 00:00:00 +0000".into());
    let text = format!(
        "{NAME} ({version}) unstable; urgency=medium\n\n  * Built from the railscope workspace by `cargo xtask package`.\n\n -- {maintainer}  {date}\n"
    );
    let path = stage.join("usr/share/doc/railscope/changelog.Debian");
    fs::write(&path, text)?;
    run_tool(Command::new("gzip").args(["-9nf"]).arg(&path))?;
    fs::set_permissions(
        path.with_extension("Debian.gz"),
        fs::Permissions::from_mode(0o644),
    )?;
    Ok(())
}

/// `md5sum` lines of every file outside `DEBIAN/`, paths relative to the root.
fn md5sums(stage: &Path) -> anyhow::Result<String> {
    let mut files: Vec<String> = walk_files(stage)?
        .into_iter()
        .filter_map(|p| {
            let rel = p.strip_prefix(stage).ok()?.to_string_lossy().into_owned();
            (!rel.starts_with("DEBIAN/")).then_some(rel)
        })
        .collect();
    files.sort();
    output(Command::new("md5sum").args(&files).current_dir(stage))
}

/// Installed size in KiB, as dpkg-gencontrol counts it (`du -sk` without `DEBIAN/`).
fn du_kib(stage: &Path) -> anyhow::Result<u64> {
    let mut total = 0;
    for f in walk_files(stage)? {
        if !f.strip_prefix(stage)?.starts_with("DEBIAN") {
            total += fs::metadata(&f)?.len().div_ceil(1024);
        }
    }
    Ok(total)
}

fn walk_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            out.extend(walk_files(&e.path())?);
        } else {
            out.push(e.path());
        }
    }
    Ok(out)
}

fn walk_dirs(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = vec![dir.to_path_buf()];
    for e in fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            out.extend(walk_dirs(&e.path())?);
        }
    }
    Ok(out)
}

/// Runs lintian; fails on any tag not in [`ACCEPTED_LINTIAN_TAGS`] and prints the ones kept.
fn check_lintian(deb: &Path) -> anyhow::Result<()> {
    setup::step("lintian");
    let out = Command::new("lintian")
        .args(["--no-tag-display-limit", "--info"])
        .arg(deb)
        .output()
        .context("running lintian (Debian package lintian)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut unexplained = Vec::new();
    for line in text.lines() {
        // "W: railscope: no-manual-page [usr/bin/railscope]"; `N:` lines explain a tag.
        let Some((kind, rest)) = line.split_once(": ") else {
            continue;
        };
        if !matches!(kind, "E" | "W" | "I" | "P" | "X") {
            continue;
        }
        let tag = rest
            .split(": ")
            .nth(1)
            .and_then(|t| t.split_whitespace().next())
            .unwrap_or(rest);
        match ACCEPTED_LINTIAN_TAGS.iter().find(|(t, _)| *t == tag) {
            Some((_, why)) => eprintln!("    lintian {kind}: {tag} (kept: {why})"),
            None => unexplained.push(line.to_owned()),
        }
    }
    if !unexplained.is_empty() {
        bail!("lintian: {}", unexplained.join("\n"));
    }
    eprintln!("    lintian: no other tag");
    Ok(())
}

/// Runs a command, failing with its stderr.
fn run_tool(cmd: &mut Command) -> anyhow::Result<()> {
    output(cmd).map(drop)
}
