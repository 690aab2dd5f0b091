//! `cargo xtask package`: the two Debian packages, each built with `dpkg-deb` from a staged
//! tree (the binaries are built by cargo here, with the eBPF object embedded; the units,
//! example configs, maintainer scripts and copyright come from `dist/`), then checked with
//! lintian:
//!
//! - `railscope`, the node agent: `/usr/bin/railscope` (the agent, the node tools and the
//!   collector's clients: `query`, `findings`, `actions`, `health`, ...), its unit and
//!   agent.toml. It holds no collector: a node needs none.
//! - `railscope-collector`: `/usr/bin/railscope-collector`, its unit, collector.toml and
//!   `railscope-gen-wire-key` (keys are made where the fleet secret is, and `--node` runs
//!   `railscope-collector node-key`).
//!
//! `dpkg-deb` rather than cargo-deb: the packages hold two crates' binaries, an operator
//! script, units and maintainer scripts of their own, and the eBPF object needs the toolchain
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

/// Debian revision appended to the workspace version: 2 since the split into two packages
/// (a packaging change of the same upstream version).
const DEBIAN_REVISION: &str = "2";

/// The first version of the two packages: the single `railscope` package before it held the
/// collector too, so `railscope-collector` Breaks and Replaces `railscope (<< SPLIT)` (it
/// takes over the collector's files and its conffile, edits kept; apt upgrades such a
/// `railscope` with it, `dpkg -i` when given `railscope` first), and the agent's postinst,
/// upgrading from before it without `railscope-collector`, stops and forgets the collector
/// that package ran (`dist/debian/railscope.postinst` names it too).
const SPLIT: &str = "0.1.0-2";

/// Debian packages this command needs: lintian (dpkg-deb and dpkg-shlibdeps come with dpkg
/// and dpkg-dev).
pub(crate) const PACKAGES: &[&str] = &["lintian", "dpkg-dev"];

/// Lintian tags left, each with why it stays; any other tag of either package fails the
/// build.
const ACCEPTED_LINTIAN_TAGS: &[(&str, &str)] = &[
    (
        "no-manual-page",
        "the commands document themselves (`--help`); the docs are in /usr/share/doc/<package>",
    ),
    (
        "initial-upload-closes-no-bugs",
        "the package is not uploaded to Debian",
    ),
];

/// One of the two packages.
struct Spec {
    /// The package's name, and its directory under `/usr/share/doc`.
    name: &'static str,
    /// Its binary: the file name under /usr/bin (and the cargo binary).
    binary: &'static str,
    /// Its other files: from (relative to the workspace root), to (in the package), mode.
    files: &'static [(&'static str, &'static str, u32)],
    /// Its conffiles (under /etc).
    conffiles: &'static [&'static str],
    /// Control fields after `Depends` (Suggests, Breaks, Replaces), `{split}` for [`SPLIT`].
    relations: &'static str,
    /// The description's synopsis and body (the body's lines start with a space).
    description: &'static str,
}

/// `railscope`: the node agent, and the node tools and clients that `railscope` holds.
const AGENT: Spec = Spec {
    name: "railscope",
    binary: "railscope",
    files: &[
        // Bookworm's systemd and lintian expect packaged units under /lib (usrmerge aliases
        // it).
        (
            "dist/railscope-agent.service",
            "lib/systemd/system/railscope-agent.service",
            0o644,
        ),
        ("dist/agent.toml", "etc/railscope/agent.toml", 0o644),
        // Opt-in: lldpd's group for the agent, where lldpd runs (docs/deployment.md).
        (
            "dist/railscope-agent-lldp.conf",
            "usr/share/doc/railscope/examples/railscope-agent.service.d/lldp.conf",
            0o644,
        ),
    ],
    conffiles: &["/etc/railscope/agent.toml"],
    relations: "",
    description: "monitor for GPU and InfiniBand/RoCE AI training clusters (node agent)
 railscope watches the nodes of an AI training cluster: its node agent
 (railscope, run as the railscope-agent service) attaches eBPF probes to the
 RDMA verbs and IB driver events, reads every IB counter and the GPUs' metrics
 through NVML, and sends them in compact authenticated UDP frames to a
 collector (package railscope-collector). The same command holds the node
 tools and the collector's clients (query, export, findings, stragglers,
 actions, health).
 .
 Configuration: /etc/railscope/agent.toml; the frames' key:
 /etc/railscope/wire.key (made where the fleet secret is, by
 railscope-gen-wire-key of railscope-collector). See
 /usr/share/doc/railscope/deployment.md.
",
};

/// `railscope-collector`: the collector, and the key tool.
const COLLECTOR: Spec = Spec {
    name: "railscope-collector",
    binary: "railscope-collector",
    files: &[
        // Keys are made where the fleet secret lives, the collector's host; `--node` runs
        // the collector's `node-key` (the binary next to it).
        (
            "scripts/gen-wire-key",
            "usr/sbin/railscope-gen-wire-key",
            0o755,
        ),
        (
            "dist/railscope-collector.service",
            "lib/systemd/system/railscope-collector.service",
            0o644,
        ),
        ("dist/collector.toml", "etc/railscope/collector.toml", 0o644),
        // Opt-in: the collector's user for Slurm actions (docs/actions.md).
        (
            "dist/railscope-collector-slurm-actions.conf",
            "usr/share/doc/railscope-collector/examples/railscope-collector.service.d/slurm-actions.conf",
            0o644,
        ),
    ],
    conffiles: &["/etc/railscope/collector.toml"],
    relations: "Suggests: railscope
Breaks: railscope (<< {split})
Replaces: railscope (<< {split})
",
    description: "monitor for GPU and InfiniBand/RoCE AI training clusters (collector)
 railscope watches the nodes of an AI training cluster: its node agents
 (package railscope) send the RDMA/IB probes' events, the IB counters and the
 GPUs' metrics in compact authenticated UDP frames to a collector
 (railscope-collector, run as the railscope-collector service), which
 archives them, evaluates findings, acts on them (Slurm drains, webhooks) and
 serves /metrics, a query API, a dashboard and remote-write.
 .
 Configuration: /etc/railscope/collector.toml; the frames' key:
 /etc/railscope/wire.key (railscope-gen-wire-key makes one, a fleet secret,
 and the nodes' own keys). See /usr/share/doc/railscope-collector/deployment.md.
",
};

/// The release binaries the packages are made of.
pub(crate) struct Binaries {
    /// `railscope` (monitor-user, the eBPF object embedded).
    pub agent: PathBuf,
    /// `railscope-collector` (monitor-collector).
    pub collector: PathBuf,
}

/// The two `.deb` files.
pub(crate) struct Debs {
    /// `railscope`, the node agent.
    pub agent: PathBuf,
    /// `railscope-collector`.
    pub collector: PathBuf,
}

#[derive(Debug, clap::Args)]
pub(crate) struct Options {
    /// Skip lintian (it takes a while on a busy machine).
    #[arg(long)]
    pub no_lintian: bool,
    #[command(flatten)]
    pub setup: setup::Options,
}

pub(crate) fn run(options: &Options) -> anyhow::Result<()> {
    let tools = setup::run(&options.setup)?;
    if !options.setup.no_apt {
        setup::ensure_debian_packages(PACKAGES)?;
    }
    let debs = build_from(&build_binaries(&tools)?, !options.no_lintian)?;
    println!("{}", debs.agent.display());
    println!("{}", debs.collector.display());
    Ok(())
}

/// Builds the two binaries (release, the eBPF object embedded in `railscope`).
pub(crate) fn build_binaries(tools: &setup::Tools) -> anyhow::Result<Binaries> {
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
    Ok(Binaries {
        agent: binary(AGENT.binary)?,
        collector: binary(COLLECTOR.binary)?,
    })
}

/// The two packages of `binaries`, built already (here, or the suite's workspace build);
/// each checked with lintian when `lintian`.
pub(crate) fn build_from(binaries: &Binaries, lintian: bool) -> anyhow::Result<Debs> {
    let root = cargo::workspace_root();
    let version = format!("{}-{DEBIAN_REVISION}", workspace_version(&root)?);
    let arch = output(Command::new("dpkg").arg("--print-architecture"))?;
    let maintainer = maintainer(&root);
    let debs = Debs {
        agent: build_one(&AGENT, &binaries.agent, &version, &arch, &maintainer)?,
        collector: build_one(
            &COLLECTOR,
            &binaries.collector,
            &version,
            &arch,
            &maintainer,
        )?,
    };
    if lintian {
        check_lintian(&debs.agent)?;
        check_lintian(&debs.collector)?;
    }
    Ok(debs)
}

/// Stages and builds the package `spec` with its binary `binary`; returns the `.deb`'s path.
fn build_one(
    spec: &Spec,
    binary: &Path,
    version: &str,
    arch: &str,
    maintainer: &str,
) -> anyhow::Result<PathBuf> {
    let root = cargo::workspace_root();
    let name = spec.name;
    let out_dir = root.join("target/package");
    let stage = out_dir.join(format!("{name}_{version}_{arch}"));
    setup::step(&format!("staging {}", stage.display()));
    if stage.exists() {
        fs::remove_dir_all(&stage).with_context(|| format!("removing {}", stage.display()))?;
    }
    let doc = format!("usr/share/doc/{name}");
    // (from, to, mode); `from` relative to the workspace root, or absolute (the binary).
    let mut entries: Vec<(PathBuf, String, u32)> = vec![(
        binary.to_path_buf(),
        format!("usr/bin/{}", spec.binary),
        0o755,
    )];
    entries.extend(
        spec.files
            .iter()
            .map(|(from, to, mode)| (PathBuf::from(from), (*to).to_owned(), *mode)),
    );
    entries.push((
        "dist/debian/copyright".into(),
        format!("{doc}/copyright"),
        0o644,
    ));
    entries.push(("README.md".into(), format!("{doc}/README.md"), 0o644));
    // Every document, in each package (a node and a collector host each have them all);
    // the units' `Documentation=` names deployment.md there.
    for file in fs::read_dir(root.join("docs"))? {
        let file = file?.file_name().to_string_lossy().into_owned();
        if file.ends_with(".md") {
            entries.push((
                Path::new("docs").join(&file),
                format!("{doc}/{file}"),
                0o644,
            ));
        }
    }
    for (from, to, mode) in &entries {
        let from = root.join(from);
        let to_path = stage.join(to);
        fs::create_dir_all(to_path.parent().expect("entries are in directories"))?;
        fs::copy(&from, &to_path)
            .with_context(|| format!("copying {} to {}", from.display(), to_path.display()))?;
        fs::set_permissions(&to_path, fs::Permissions::from_mode(*mode))?;
        if to.starts_with("usr/bin/") {
            // The binaries' symbols and debug info (the embedded eBPF object is data, kept).
            run_tool(
                Command::new("strip")
                    .arg("--strip-unneeded")
                    .arg("--remove-section=.comment")
                    .arg("--remove-section=.note")
                    .arg(&to_path),
            )?;
        }
    }
    write_changelog(&root, &stage, name, version, maintainer)?;

    let debian = stage.join("DEBIAN");
    fs::create_dir_all(&debian)?;
    for script in ["postinst", "prerm", "postrm"] {
        let to = debian.join(script);
        fs::copy(
            root.join("dist/debian").join(format!("{name}.{script}")),
            &to,
        )?;
        fs::set_permissions(&to, fs::Permissions::from_mode(0o755))?;
    }
    let conffiles: String = spec.conffiles.iter().map(|c| format!("{c}\n")).collect();
    fs::write(debian.join("conffiles"), conffiles)?;
    let depends = shlib_depends(&out_dir, &stage, spec)?;
    let installed_kib = du_kib(&stage)?;
    let control = control(spec, version, arch, maintainer, &depends, installed_kib);
    fs::write(debian.join("control"), control)?;
    let mut md5 = fs::File::create(debian.join("md5sums"))?;
    md5.write_all(md5sums(&stage)?.as_bytes())?;
    for dir in walk_dirs(&stage)? {
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))?;
    }

    let deb = out_dir.join(format!("{name}_{version}_{arch}.deb"));
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

/// The control file of `spec`.
fn control(
    spec: &Spec,
    version: &str,
    arch: &str,
    maintainer: &str,
    depends: &str,
    installed_kib: u64,
) -> String {
    format!(
        "Package: {name}
Version: {version}
Architecture: {arch}
Maintainer: {maintainer}
Installed-Size: {installed_kib}
Depends: {depends}, init-system-helpers (>= 1.52)
{relations}Section: admin
Priority: optional
Description: {description}",
        name = spec.name,
        relations = spec.relations.replace("{split}", SPLIT),
        description = spec.description,
    )
}

/// `Depends` for the package's binary's shared libraries, from dpkg-shlibdeps (which wants a
/// `debian/control` in its working directory).
fn shlib_depends(out_dir: &Path, stage: &Path, spec: &Spec) -> anyhow::Result<String> {
    let name = spec.name;
    let work = out_dir.join(format!("shlibdeps-{name}"));
    fs::create_dir_all(work.join("debian"))?;
    fs::write(
        work.join("debian/control"),
        format!("Source: {name}\n\nPackage: {name}\nArchitecture: any\n"),
    )?;
    let out = output(
        Command::new("dpkg-shlibdeps")
            .arg("-O")
            .arg(stage.join("usr/bin").join(spec.binary))
            .current_dir(&work),
    )?;
    out.lines()
        .find_map(|l| l.strip_prefix("shlibs:Depends="))
        .map(str::to_owned)
        .with_context(|| format!("dpkg-shlibdeps printed no shlibs:Depends: {out}"))
}

/// `usr/share/doc/NAME/changelog.Debian.gz`, one entry for this version, dated by the last
/// commit (so two builds of one commit are the same).
fn write_changelog(
    root: &Path,
    stage: &Path,
    name: &str,
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
        "{name} ({version}) unstable; urgency=medium\n\n  * Built from the railscope workspace by `cargo xtask package`.\n\n -- {maintainer}  {date}\n"
    );
    let path = stage.join(format!("usr/share/doc/{name}/changelog.Debian"));
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
    setup::step(&format!("lintian {}", deb.display()));
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

#[cfg(test)]
mod tests {
    use super::{AGENT, COLLECTOR, SPLIT, Spec, control};

    /// Every file a package installs from `spec`: its binary and its other files.
    fn paths(spec: &Spec) -> Vec<String> {
        let mut paths = vec![format!("usr/bin/{}", spec.binary)];
        paths.extend(spec.files.iter().map(|(_, to, _)| (*to).to_owned()));
        paths
    }

    #[test]
    fn the_packages_share_no_file_and_the_agents_holds_no_collector() {
        let agent = paths(&AGENT);
        let collector = paths(&COLLECTOR);
        for p in &agent {
            assert!(!collector.contains(p), "{p} is in both packages");
            assert!(!p.contains("collector"), "the agent's package holds {p}");
        }
        assert!(collector.contains(&"usr/sbin/railscope-gen-wire-key".to_owned()));
        // Each package's documents are under its own name.
        for (spec, paths) in [(&AGENT, &agent), (&COLLECTOR, &collector)] {
            for p in paths.iter().filter(|p| p.starts_with("usr/share/doc/")) {
                assert!(
                    p.starts_with(&format!("usr/share/doc/{}/", spec.name)),
                    "{p} of {}",
                    spec.name
                );
            }
        }
    }

    #[test]
    fn conffiles_are_the_packages_files_under_etc() {
        for spec in [&AGENT, &COLLECTOR] {
            let etc: Vec<String> = paths(spec)
                .into_iter()
                .filter(|p| p.starts_with("etc/"))
                .map(|p| format!("/{p}"))
                .collect();
            assert_eq!(etc, spec.conffiles, "{}", spec.name);
        }
    }

    #[test]
    fn each_package_has_its_maintainer_scripts_for_its_own_unit() {
        let root = crate::cargo::workspace_root();
        for (spec, unit, other) in [
            (
                &AGENT,
                "railscope-agent.service",
                "railscope-collector.service",
            ),
            (
                &COLLECTOR,
                "railscope-collector.service",
                "railscope-agent.service",
            ),
        ] {
            assert!(
                paths(spec).contains(&format!("lib/systemd/system/{unit}")),
                "{}",
                spec.name
            );
            for script in ["postinst", "prerm", "postrm"] {
                let file = root.join(format!("dist/debian/{}.{script}", spec.name));
                let text = std::fs::read_to_string(&file).unwrap();
                assert!(text.starts_with("#!/bin/sh\n"), "{}", file.display());
                assert!(text.contains(unit), "{} names no {unit}", file.display());
                // The agent's postinst names the collector's unit only to stop what the
                // single package before SPLIT left running.
                if !(spec.name == "railscope" && script == "postinst") {
                    assert!(!text.contains(other), "{} names {other}", file.display());
                }
            }
        }
        let postinst =
            std::fs::read_to_string(root.join("dist/debian/railscope.postinst")).unwrap();
        assert!(postinst.contains(&format!("\nSPLIT={SPLIT}\n")), "{SPLIT}");
    }

    #[test]
    fn control_files_are_well_formed() {
        for spec in [&AGENT, &COLLECTOR] {
            let text = control(spec, "0.1.0-2", "amd64", "M <m@example.org>", "libc6", 1);
            assert!(text.starts_with(&format!("Package: {}\n", spec.name)));
            assert!(text.ends_with(".\n"), "{text}");
            for line in text.lines() {
                assert!(
                    line.starts_with(' ') || line.split_once(": ").is_some(),
                    "{}: {line:?}",
                    spec.name
                );
            }
            assert!(text.contains(&format!("/usr/share/doc/{}/deployment.md", spec.name)));
        }
        let collector = control(&COLLECTOR, "0.1.0-2", "amd64", "M <m@x>", "libc6", 1);
        assert!(collector.contains(&format!(
            "\nBreaks: railscope (<< {SPLIT})\nReplaces: railscope (<< {SPLIT})\n"
        )));
        assert!(!control(&AGENT, "0.1.0-2", "amd64", "M <m@x>", "libc6", 1).contains("Breaks"));
    }
}
