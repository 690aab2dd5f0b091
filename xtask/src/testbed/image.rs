//! The guest image: a Debian kernel and a busybox initramfs holding the RDMA modules, the
//! rdma-core userspace, the caller's binaries and `/init`.

use std::collections::BTreeSet;
use std::fs;
use std::io::{BufWriter, Write};
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use super::cpio::{NewcWriter, add_tree};
use super::debs::{self, KernelLine};
use super::extra::{self, ExtraDebs};
use super::{Timer, mbytes, note, remove_dir_if_exists, run, spawn_error};

/// A host file to put into the guest.
#[derive(Clone, Debug)]
pub(crate) struct GuestFile {
    /// The file on the host.
    pub host: PathBuf,
    /// Absolute path in the guest.
    pub guest: String,
    /// Copy the shared libraries it links against (resolved on the host with `ldd`) too.
    pub with_libs: bool,
}

/// What goes into a guest image.
#[derive(Clone, Debug)]
pub(crate) struct ImageSpec {
    /// Which Debian kernel to boot.
    pub kernel: KernelLine,
    /// Host binary placed at `/init` (mode 0755).
    pub init: PathBuf,
    /// Further host files, e.g. the agent built for the host.
    pub files: Vec<GuestFile>,
}

/// A built guest image, ready for [`super::boot`].
#[derive(Clone, Debug)]
pub(crate) struct GuestImage {
    /// The kernel release (`uname -r` in the guest), e.g. `6.1.0-56-amd64`.
    pub kernel_release: String,
    pub vmlinuz: PathBuf,
    pub initramfs: PathBuf,
}

/// Kernel modules loaded in the guest, with their dependencies: soft-RoCE, the verbs and
/// rdma_cm user interfaces, umad, veth for the link rxe runs on, configfs, libcrc32c for
/// siw (which the test bed builds itself, see [`super::siw`], and scenarios insmod), and
/// netem for the scenario that loses and reorders datagrams (`lossy-link`).
const MODULES: &[&str] = &[
    "rdma_rxe",
    "libcrc32c",
    "rdma_ucm",
    "ib_uverbs",
    "ib_umad",
    "veth",
    "configfs",
    "sch_netem",
];

/// Modules that are nice to have: crc32 for rxe's ICRC (built in, or renamed, on some kernels),
/// virtio_pci and virtio_net for the user-network NIC of scenarios that reach the host (built
/// in on some).
const OPTIONAL_MODULES: &[&str] = &["crc32_generic", "crc32_pclmul", "virtio_pci", "virtio_net"];

/// Programs from the debs, put at `/usr/bin/<name>` in the guest (busybox's applets are in
/// `/bin`; its shell prefers its own `ip` applet, so the guest calls `/usr/bin/ip`).
const TOOLS: &[&str] = &[
    "ip",
    "tc",
    "rdma",
    "ib_write_bw",
    "ib_send_bw",
    "ib_read_bw",
    "ibv_devinfo",
    "ibv_devices",
    "ibv_asyncwatch",
    "ibv_rc_pingpong",
    "rping",
    "bpftool",
    "lspci",
    "ethtool",
];

/// Programs from the debs that are added when the packages ship them.
const OPTIONAL_TOOLS: &[&str] = &["ucmatose", "udaddy"];

/// Where programs may sit in the extracted debs.
const BIN_DIRS: &[&str] = &["usr/bin", "usr/sbin", "bin", "sbin"];

/// The multiarch library directory, in the debs and in the guest.
const ARCH_LIB: &str = "usr/lib/x86_64-linux-gnu";

/// The dynamic loader's path, fixed in every x86-64 binary.
const LD_SO: &str = "lib64/ld-linux-x86-64.so.2";

/// Builds the guest image of `spec`: debs from (or into) `cache_dir`, the staged root and the
/// image files in `work_dir`.
pub(crate) fn build_image(
    cache_dir: &Path,
    work_dir: &Path,
    spec: &ImageSpec,
) -> Result<GuestImage> {
    build_image_with(cache_dir, work_dir, spec, None)
}

/// [`build_image`] plus, with `extra`, programs from further Debian packages (an image
/// variant, e.g. the benchmark's with bpftrace).
pub(crate) fn build_image_with(
    cache_dir: &Path,
    work_dir: &Path,
    spec: &ImageSpec,
    extra: Option<&ExtraDebs>,
) -> Result<GuestImage> {
    check_spec(spec)?;
    let debs = debs::prepare(cache_dir, spec.kernel)?;
    let extra_tree = extra.map(|e| extra::prepare(cache_dir, e)).transpose()?;
    let kver = &debs.kernel_release;
    let t = Timer::start();
    fs::create_dir_all(work_dir)
        .with_context(|| format!("cannot create the work directory {}", work_dir.display()))?;
    let root = work_dir.join("initramfs-root");
    remove_dir_if_exists(&root)?;
    let stage = Stage {
        root: root.clone(),
        tree: debs.tree.clone(),
    };
    stage.skeleton()?;
    stage.busybox()?;
    stage.modules(kver)?;
    stage.tools()?;
    stage.soft_providers()?;
    stage.config_files(kver)?;
    for f in &spec.files {
        stage.guest_file(f)?;
    }
    if let (Some(extra), Some(tree)) = (extra, &extra_tree) {
        stage.extra_tools(tree, extra.tools)?;
    }
    stage.install(&spec.init, "init", 0o755)?;

    let initramfs = work_dir.join(format!("initramfs-{kver}.cpio.gz"));
    let (entries, unpacked) = pack(&root, &initramfs)?;
    let vmlinuz = work_dir.join(format!("vmlinuz-{kver}"));
    let src = debs.tree.join(format!("boot/vmlinuz-{kver}"));
    fs::copy(&src, &vmlinuz).with_context(|| format!("cannot copy {}", src.display()))?;
    let size = fs::metadata(&initramfs)?.len();
    note(format!(
        "initramfs {} built in {} ({entries} entries, {} unpacked): {}",
        mbytes(size),
        t.took(),
        mbytes(unpacked),
        initramfs.display()
    ));
    Ok(GuestImage {
        kernel_release: debs.kernel_release,
        vmlinuz,
        initramfs,
    })
}

/// Fails early, before any download, on a spec that cannot be built.
fn check_spec(spec: &ImageSpec) -> Result<()> {
    if !spec.init.is_file() {
        bail!("the guest's /init {} is not a file", spec.init.display());
    }
    for f in &spec.files {
        if !f.host.is_file() {
            bail!(
                "{} (for {} in the guest) is not a file",
                f.host.display(),
                f.guest
            );
        }
        guest_relative(&f.guest)?;
    }
    Ok(())
}

/// `/usr/bin/x` -> `usr/bin/x`; refuses relative paths and `..`.
fn guest_relative(guest: &str) -> Result<PathBuf> {
    let p = Path::new(guest);
    if !p.is_absolute() {
        bail!("guest path {guest:?} is not absolute");
    }
    let mut rel = PathBuf::new();
    for c in p.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => rel.push(n),
            _ => bail!("guest path {guest:?} must not contain `..`"),
        }
    }
    if rel.as_os_str().is_empty() {
        bail!("guest path {guest:?} names no file");
    }
    Ok(rel)
}

/// Packs `root` into a gzip-compressed newc archive at `dest`, adding `/dev/console`.
/// Returns the number of entries and the bytes of content.
fn pack(root: &Path, dest: &Path) -> Result<(usize, u64)> {
    let file =
        fs::File::create(dest).with_context(|| format!("cannot create {}", dest.display()))?;
    let mut gzip = Command::new("gzip")
        .args(["-1", "-n", "-c"])
        .stdin(Stdio::piped())
        .stdout(file)
        .spawn()
        .map_err(|e| spawn_error("gzip", e))?;
    let stdin = gzip.stdin.take().expect("gzip's stdin is piped");
    let mut w = NewcWriter::new(BufWriter::with_capacity(1 << 20, stdin));
    let written = add_tree(&mut w, root).and_then(|()| {
        // The kernel opens /dev/console for /init's stdio before /init mounts devtmpfs.
        w.char_dev("dev/console", 0o600, 5, 1)?;
        Ok((w.entries, w.content_bytes))
    });
    let finished = written.and_then(|counts| {
        w.finish()?
            .into_inner()
            .map_err(|e| e.into_error())?
            .flush()?;
        Ok(counts)
    });
    let status = gzip.wait().context("gzip did not finish")?;
    let counts = finished.with_context(|| format!("cannot pack {}", root.display()))?;
    if !status.success() {
        bail!("gzip failed ({status}) writing {}", dest.display());
    }
    Ok(counts)
}

/// The staging of one initramfs root from one extracted deb tree.
struct Stage {
    root: PathBuf,
    tree: PathBuf,
}

impl Stage {
    fn skeleton(&self) -> Result<()> {
        for d in [
            "bin",
            "sbin",
            "usr/bin",
            "usr/sbin",
            "etc/libibverbs.d",
            "proc",
            "sys",
            "dev",
            "tmp",
            "run",
            "var/run",
            "root",
            "boot",
            "lib64",
            "usr/lib/x86_64-linux-gnu/libibverbs",
        ] {
            fs::create_dir_all(self.root.join(d))
                .with_context(|| format!("cannot create {}", self.root.join(d).display()))?;
        }
        // The other multiarch directory the loader searches (a relative link, valid in the guest).
        fs::create_dir_all(self.root.join("lib"))?;
        symlink(
            "../usr/lib/x86_64-linux-gnu",
            self.root.join("lib/x86_64-linux-gnu"),
        )?;
        Ok(())
    }

    /// The host's static busybox at /bin/busybox, with a link per applet.
    fn busybox(&self) -> Result<()> {
        let host = ["/bin/busybox", "/usr/bin/busybox"]
            .into_iter()
            .map(Path::new)
            .find(|p| p.is_file())
            .context("busybox not found: run `cargo xtask setup` (it installs busybox-static)")?;
        if !ldd(host, None)?.is_empty() {
            bail!(
                "{} is dynamically linked: the guest needs busybox-static \
                 (run `cargo xtask setup`, or `apt-get install busybox-static`)",
                host.display()
            );
        }
        self.install(host, "bin/busybox", 0o755)?;
        let list = run(Command::new(host).arg("--list"))?;
        for applet in String::from_utf8_lossy(&list.stdout).lines() {
            let applet = applet.trim();
            if applet.is_empty() || applet.contains('/') {
                continue;
            }
            let link = self.root.join("bin").join(applet);
            if !link.exists() {
                symlink("busybox", &link)?;
            }
        }
        Ok(())
    }

    /// The module closure of [`MODULES`] (+ the optional ones), with a fresh `depmod`.
    fn modules(&self, kver: &str) -> Result<()> {
        let mut files = BTreeSet::new();
        for (m, required) in MODULES
            .iter()
            .map(|m| (m, true))
            .chain(OPTIONAL_MODULES.iter().map(|m| (m, false)))
        {
            let out = Command::new("modprobe")
                .arg("-d")
                .arg(&self.tree)
                .args(["-S", kver, "--show-depends", m])
                .output()
                .map_err(|e| spawn_error("modprobe", e))?;
            if !out.status.success() {
                let err = String::from_utf8_lossy(&out.stderr);
                if required {
                    bail!("kernel {kver} has no module {m}: {}", err.trim());
                }
                note(format!(
                    "kernel {kver} has no module {m} (optional): skipped"
                ));
                continue;
            }
            files.extend(parse_show_depends(&String::from_utf8_lossy(&out.stdout)));
        }
        for f in &files {
            let rel = f.strip_prefix(&self.tree).with_context(|| {
                format!(
                    "modprobe named {} outside {}",
                    f.display(),
                    self.tree.display()
                )
            })?;
            self.module(f, rel)?;
        }
        let moddir = format!("lib/modules/{kver}");
        for meta in [
            "modules.builtin",
            "modules.builtin.modinfo",
            "modules.order",
        ] {
            let src = self.tree.join(&moddir).join(meta);
            if src.exists() {
                self.copy(&src, &Path::new(&moddir).join(meta))?;
            }
        }
        run(Command::new("depmod").arg("-b").arg(&self.root).arg(kver))
            .context("depmod over the guest's modules failed")?;
        Ok(())
    }

    /// Copies a module, decompressed: the guest gets plain `.ko` files on every kernel line
    /// (6.12's are `.ko.xz`; busybox's modprobe first hands them to the kernel as ELF, which
    /// logs "Invalid ELF header magic" before it falls back), and a plain `finit_module(2)`
    /// loads them.
    fn module(&self, src: &Path, rel: &Path) -> Result<()> {
        let Some((plain, tool)) = decompressed_name(rel) else {
            return self.copy(src, rel);
        };
        let dst = self.root.join(&plain);
        if let Some(parent) = dst.parent() {
            fs::create_dir_all(parent)?;
        }
        let out = fs::File::create(&dst)?;
        let status = Command::new(tool)
            .arg("-dc")
            .arg(src)
            .stdout(out)
            .status()
            .map_err(|e| spawn_error(tool, e))?;
        if !status.success() {
            bail!("`{tool} -dc {}` failed ({status})", src.display());
        }
        Ok(())
    }

    /// [`TOOLS`] and [`OPTIONAL_TOOLS`] from the debs at /usr/bin, with their libraries.
    fn tools(&self) -> Result<()> {
        for (name, required) in TOOLS
            .iter()
            .map(|t| (t, true))
            .chain(OPTIONAL_TOOLS.iter().map(|t| (t, false)))
        {
            let found = BIN_DIRS
                .iter()
                .map(|d| self.tree.join(d).join(name))
                .find(|p| p.is_file());
            let Some(src) = found else {
                if required {
                    bail!("no {name} in the extracted debs ({})", self.tree.display());
                }
                continue;
            };
            self.install(&src, &format!("usr/bin/{name}"), 0o755)?;
            self.libs_of(&src, true)?;
        }
        Ok(())
    }

    /// rdma-core's rxe and siw providers, dlopen()ed from its compiled-in directory once the
    /// driver file names it; and libgcc_s, which glibc dlopen()s for thread exit (rping aborts
    /// without it).
    fn soft_providers(&self) -> Result<()> {
        let dir = self.tree.join(ARCH_LIB).join("libibverbs");
        let mut providers = Vec::new();
        for e in fs::read_dir(&dir).with_context(|| format!("cannot read {}", dir.display()))? {
            let name = e?.file_name().to_string_lossy().into_owned();
            if (name.starts_with("librxe-rdmav") || name.starts_with("libsiw-rdmav"))
                && name.ends_with(".so")
            {
                providers.push(name);
            }
        }
        if providers.len() < 2 {
            bail!(
                "no librxe-rdmav*.so or libsiw-rdmav*.so in {}",
                dir.display()
            );
        }
        for p in providers {
            let src = dir.join(&p);
            self.copy(&src, &Path::new(ARCH_LIB).join("libibverbs").join(&p))?;
            self.libs_of(&src, true)?;
        }
        for driver in ["etc/libibverbs.d/rxe.driver", "etc/libibverbs.d/siw.driver"] {
            self.copy(&self.tree.join(driver), Path::new(driver))?;
        }
        let gcc_s = Path::new("/lib/x86_64-linux-gnu/libgcc_s.so.1");
        self.copy(gcc_s, &Path::new(ARCH_LIB).join("libgcc_s.so.1"))
            .context("the guest needs the host's libgcc_s.so.1 (Debian package libgcc-s1)")?;
        Ok(())
    }

    /// /boot/config-$KVER (feature probes read it), iproute2's tables and a minimal /etc.
    fn config_files(&self, kver: &str) -> Result<()> {
        let config = format!("boot/config-{kver}");
        self.copy(&self.tree.join(&config), Path::new(&config))?;
        for d in ["etc/iproute2", "usr/share/iproute2"] {
            if self.tree.join(d).is_dir() {
                copy_dir(&self.tree.join(d), &self.root.join(d))?;
            }
        }
        fs::write(
            self.root.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\n",
        )?;
        fs::write(self.root.join("etc/group"), "root:x:0:\n")?;
        fs::write(self.root.join("etc/hosts"), "127.0.0.1 localhost\n")?;
        Ok(())
    }

    /// One of the caller's files; its libraries come from the host.
    fn guest_file(&self, f: &GuestFile) -> Result<()> {
        let rel = guest_relative(&f.guest)?;
        self.copy(&f.host, &rel)?;
        if f.with_libs {
            self.libs_of(&f.host, false)?;
        }
        Ok(())
    }

    /// Programs of an extra package set (see [`ExtraDebs`]) at /usr/bin, with their
    /// libraries resolved against that set's tree, then the test bed's debs, then the host.
    fn extra_tools(&self, extra_tree: &Path, tools: &[&str]) -> Result<()> {
        let search = [extra_tree, &self.tree]
            .iter()
            .flat_map(|t| [t.join(ARCH_LIB), t.join("lib/x86_64-linux-gnu")])
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(":");
        for name in tools {
            let src = BIN_DIRS
                .iter()
                .map(|d| extra_tree.join(d).join(name))
                .find(|p| p.is_file())
                .with_context(|| format!("no {name} in {}", extra_tree.display()))?;
            self.install(&src, &format!("usr/bin/{name}"), 0o755)?;
            for lib in ldd(&src, Some(&search))? {
                let rel = guest_lib_path(&lib)?;
                if !self.root.join(&rel).exists() {
                    self.copy(&lib, &rel)?;
                }
            }
        }
        Ok(())
    }

    /// Copies `src` to `rel` in the root (following symlinks), with mode `mode`.
    fn install(&self, src: &Path, rel: &str, mode: u32) -> Result<()> {
        self.copy(src, Path::new(rel))?;
        fs::set_permissions(self.root.join(rel), fs::Permissions::from_mode(mode))?;
        Ok(())
    }

    /// Copies `src` to `rel` in the root, following symlinks, creating parent directories.
    fn copy(&self, src: &Path, rel: &Path) -> Result<()> {
        let dst = self.root.join(rel);
        if let Some(parent) = dst.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::copy(src, &dst)
            .with_context(|| format!("cannot copy {} to {}", src.display(), dst.display()))?;
        Ok(())
    }

    /// Copies the shared libraries `bin` needs, each once: the loader to /lib64, the others to
    /// the multiarch directory. With `from_debs`, libraries are resolved against the extracted
    /// debs before the host's.
    fn libs_of(&self, bin: &Path, from_debs: bool) -> Result<()> {
        let search = from_debs.then(|| {
            format!(
                "{}:{}",
                self.tree.join(ARCH_LIB).display(),
                self.tree.join("lib/x86_64-linux-gnu").display()
            )
        });
        for lib in ldd(bin, search.as_deref())? {
            let rel = guest_lib_path(&lib)?;
            if !self.root.join(&rel).exists() {
                self.copy(&lib, &rel)?;
            }
        }
        Ok(())
    }
}

/// Where a library found on the host goes in the guest.
fn guest_lib_path(lib: &Path) -> Result<PathBuf> {
    let name = lib
        .file_name()
        .with_context(|| format!("ldd named {}", lib.display()))?;
    if name == "ld-linux-x86-64.so.2" {
        Ok(PathBuf::from(LD_SO))
    } else {
        Ok(Path::new(ARCH_LIB).join(name))
    }
}

/// The shared libraries `bin` loads, as `ldd` resolves them (with `LD_LIBRARY_PATH` set to
/// `search` when given); empty for a static binary.
fn ldd(bin: &Path, search: Option<&str>) -> Result<Vec<PathBuf>> {
    let mut cmd = Command::new("ldd");
    cmd.arg(bin);
    if let Some(s) = search {
        cmd.env("LD_LIBRARY_PATH", s);
    }
    // ldd exits 1 for a static binary: judge by what it printed.
    let out = cmd.output().map_err(|e| spawn_error("ldd", e))?;
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    parse_ldd(&text).with_context(|| format!("ldd {}", bin.display()))
}

/// Parses `ldd` output: the absolute paths of the libraries, the loader included; an empty
/// list for a static binary; an error naming any library not found.
fn parse_ldd(out: &str) -> Result<Vec<PathBuf>> {
    let mut libs = Vec::new();
    let mut missing = Vec::new();
    for line in out.lines().map(str::trim) {
        if line.contains("not a dynamic executable") || line == "statically linked" {
            return Ok(Vec::new());
        }
        if let Some((name, rest)) = line.split_once("=>") {
            let target = rest.trim();
            if target.starts_with("not found") {
                missing.push(name.trim().to_owned());
            } else if let Some(path) = target
                .split_whitespace()
                .next()
                .filter(|p| p.starts_with('/'))
            {
                libs.push(PathBuf::from(path));
            }
            // "name => (0x...)" (a vDSO on some systems): nothing to copy.
        } else if let Some(path) = line
            .split_whitespace()
            .next()
            .filter(|p| p.starts_with('/'))
        {
            libs.push(PathBuf::from(path));
        }
        // "linux-vdso.so.1 (0x...)": provided by the kernel.
    }
    if !missing.is_empty() {
        bail!("libraries not found: {}", missing.join(", "));
    }
    if libs.is_empty() {
        bail!("cannot read ldd's output: {:?}", out.trim());
    }
    Ok(libs)
}

/// For a compressed module, its plain name and the tool that decompresses it.
fn decompressed_name(rel: &Path) -> Option<(PathBuf, &'static str)> {
    let name = rel.to_str()?;
    [(".ko.xz", "xz"), (".ko.zst", "zstd"), (".ko.gz", "gzip")]
        .into_iter()
        .find_map(|(ext, tool)| {
            let stem = name.strip_suffix(ext)?;
            Some((PathBuf::from(format!("{stem}.ko")), tool))
        })
}

/// The `.ko` files `modprobe --show-depends` would insert (built-in modules have none).
fn parse_show_depends(out: &str) -> Vec<PathBuf> {
    out.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some("insmod")).then(|| w.next().map(PathBuf::from))?
        })
        .collect()
}

/// Copies a directory tree (files followed through symlinks).
fn copy_dir(src: &Path, dst: &Path) -> Result<()> {
    fs::create_dir_all(dst)?;
    for e in fs::read_dir(src).with_context(|| format!("cannot read {}", src.display()))? {
        let e = e?;
        let (from, to) = (e.path(), dst.join(e.file_name()));
        if from.is_dir() {
            copy_dir(&from, &to)?;
        } else {
            fs::copy(&from, &to).with_context(|| format!("cannot copy {}", from.display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_dynamic() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd5b3f2000)\n\
                   \tlibibverbs.so.1 => /x/usr/lib/x86_64-linux-gnu/libibverbs.so.1 (0x00007f1)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f2)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f3)\n";
        assert_eq!(
            parse_ldd(out).unwrap(),
            [
                "/x/usr/lib/x86_64-linux-gnu/libibverbs.so.1",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
    }

    #[test]
    fn ldd_static() {
        assert!(
            parse_ldd("\tnot a dynamic executable\n")
                .unwrap()
                .is_empty()
        );
        assert!(parse_ldd("\tstatically linked\n").unwrap().is_empty());
    }

    #[test]
    fn ldd_missing_library_is_an_error() {
        let out =
            "\tlibpci.so.3 => not found\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x1)\n";
        let e = parse_ldd(out).unwrap_err().to_string();
        assert!(e.contains("libpci.so.3"), "{e}");
    }

    #[test]
    fn ldd_unreadable_output_is_an_error() {
        assert!(parse_ldd("ldd: ./x: No such file or directory\n").is_err());
    }

    #[test]
    fn libraries_land_where_the_loader_looks() {
        assert_eq!(
            guest_lib_path(Path::new("/lib64/ld-linux-x86-64.so.2")).unwrap(),
            Path::new("lib64/ld-linux-x86-64.so.2")
        );
        assert_eq!(
            guest_lib_path(Path::new("/x/usr/lib/x86_64-linux-gnu/libnl-3.so.200")).unwrap(),
            Path::new("usr/lib/x86_64-linux-gnu/libnl-3.so.200")
        );
    }

    #[test]
    fn show_depends_lists_insmod_files() {
        let out = "builtin crc32_generic\n\
                   insmod /c/lib/modules/6.1.0-56-amd64/kernel/drivers/infiniband/core/ib_core.ko \n\
                   insmod /c/lib/modules/6.1.0-56-amd64/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko opt=1\n";
        assert_eq!(
            parse_show_depends(out),
            [
                "/c/lib/modules/6.1.0-56-amd64/kernel/drivers/infiniband/core/ib_core.ko",
                "/c/lib/modules/6.1.0-56-amd64/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko"
            ]
            .map(PathBuf::from)
        );
        assert!(parse_show_depends("builtin configfs\n").is_empty());
    }

    #[test]
    fn compressed_modules_are_renamed() {
        assert_eq!(
            decompressed_name(Path::new("lib/modules/k/kernel/a/veth.ko.xz")),
            Some((PathBuf::from("lib/modules/k/kernel/a/veth.ko"), "xz"))
        );
        assert_eq!(
            decompressed_name(Path::new("m/x.ko.zst")),
            Some((PathBuf::from("m/x.ko"), "zstd"))
        );
        assert_eq!(
            decompressed_name(Path::new("lib/modules/k/kernel/a/veth.ko")),
            None
        );
    }

    #[test]
    fn guest_paths() {
        assert_eq!(
            guest_relative("/usr/bin/railscope").unwrap(),
            Path::new("usr/bin/railscope")
        );
        assert!(guest_relative("usr/bin/x").is_err());
        assert!(guest_relative("/usr/../etc/x").is_err());
        assert!(guest_relative("/").is_err());
    }
}
