//! The systemd Debian guest's root: a bookworm system made with debootstrap, with the test
//! bed's kernel package installed in it (so `rdma_rxe` and the rest of its modules are there,
//! and initramfs-tools makes the initrd that mounts the root disk), packed into an ext4 disk
//! image with `mkfs.ext4 -d`.
//!
//! Cached under `<cache>/systemd-guest/<kernel release>/`: `root.img`, `vmlinuz`,
//! `initrd.img`, and `.complete` holding the [`recipe`] they were made from; a different
//! recipe (another package list, another kernel build) makes them anew. Work happens in a
//! `.partial` directory renamed into place at the end, so an interrupted build is redone.
//! Boots use the image with `snapshot=on`: the cached file is never written.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context as _, bail};

use crate::setup;

/// Debian release and mirror of the guest (the test bed's kernels are bookworm's).
const SUITE: &str = "bookworm";
const MIRROR: &str = "http://deb.debian.org/debian";

/// Packages besides debootstrap's minbase: systemd as init, what the kernel package needs
/// (linux-base, initramfs-tools), the RDMA userspace the test bed has (rdma-core with the rxe
/// provider, the verbs tools, perftest, iproute2 for `ip` and `rdma`), and procps.
const PACKAGES: &[&str] = &[
    "systemd",
    "systemd-sysv",
    "udev",
    "kmod",
    "linux-base",
    "initramfs-tools",
    "rdma-core",
    "ibverbs-providers",
    "ibverbs-utils",
    "rdmacm-utils",
    "perftest",
    "iproute2",
    "procps",
];

/// Size of the root disk (a sparse file; the system takes about half of it).
const DISK_SIZE: &str = "2G";

/// Bumped when the steps below change what goes into the image.
const FORMAT: u32 = 1;

/// The unit that runs the host's test script at boot (see [`TEST_RUNNER`]).
pub(super) const TEST_UNIT: &str = "railscope-package-test.service";

const TEST_UNIT_TEXT: &str = "\
[Unit]
Description=railscope package test (runs /payload/test.sh from the second disk)
After=multi-user.target

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/railscope-package-test
StandardOutput=tty
StandardError=tty
TTYPath=/dev/ttyS0
TimeoutStartSec=infinity

[Install]
WantedBy=multi-user.target
";

/// Mounts the payload disk, runs its script, powers off whatever happened.
const TEST_RUNNER: &str = "#!/bin/sh
mkdir -p /payload
if mount -o ro /dev/vdb /payload; then
    sh /payload/test.sh
else
    echo 'PKGTEST-FAIL: payload: cannot mount /dev/vdb'
fi
echo PKGTEST-END
systemctl --no-block poweroff
";

/// A built guest root.
pub(super) struct GuestRoot {
    pub kernel_release: String,
    pub disk: PathBuf,
    pub vmlinuz: PathBuf,
    pub initrd: PathBuf,
}

/// What the image is made from; the cache is reused only for the same recipe.
fn recipe(kernel_deb: &str) -> String {
    format!(
        "format {FORMAT}\nsuite {SUITE}\nkernel {kernel_deb}\npackages {}\n",
        PACKAGES.join(" ")
    )
}

/// Returns the cached guest root for the kernel package `kernel_deb` (a file from the test
/// bed's deb cache), making it first if needed.
pub(super) fn prepare(
    cache_dir: &Path,
    kernel_release: &str,
    kernel_deb: &Path,
) -> anyhow::Result<GuestRoot> {
    let deb_name = kernel_deb
        .file_name()
        .context("the kernel package has no file name")?
        .to_string_lossy()
        .into_owned();
    let recipe = recipe(&deb_name);
    let base = cache_dir.join("systemd-guest");
    let dir = base.join(kernel_release);
    let root = GuestRoot {
        kernel_release: kernel_release.to_owned(),
        disk: dir.join("root.img"),
        vmlinuz: dir.join("vmlinuz"),
        initrd: dir.join("initrd.img"),
    };
    if fs::read_to_string(dir.join(".complete")).ok().as_deref() == Some(recipe.as_str()) {
        eprintln!("    using the cached systemd guest {}", dir.display());
        return Ok(root);
    }
    let start = Instant::now();
    let partial = base.join(format!("{kernel_release}.partial"));
    if partial.exists() {
        unmount_below(&partial);
        fs::remove_dir_all(&partial).with_context(|| format!("removing {}", partial.display()))?;
    }
    let tree = partial.join("root");
    fs::create_dir_all(&tree)?;
    setup::step(&format!(
        "debootstrap {SUITE} (minbase + {} packages) into {} (once per recipe)",
        PACKAGES.len(),
        tree.display()
    ));
    run(Command::new("debootstrap")
        .arg("--variant=minbase")
        .arg(format!("--include={}", PACKAGES.join(",")))
        .arg(SUITE)
        .arg(&tree)
        .arg(MIRROR))
    .context("debootstrap failed (is the Debian archive reachable?)")?;
    eprintln!(
        "    debootstrap done after {:.0} s",
        start.elapsed().as_secs_f64()
    );

    configure(&tree)?;
    setup::step(&format!(
        "installing {deb_name} in the guest root (initramfs-tools makes the initrd)"
    ));
    fs::copy(kernel_deb, tree.join("tmp").join(&deb_name))?;
    with_proc(&tree, || {
        run(Command::new("chroot")
            .arg(&tree)
            .args(["dpkg", "-i"])
            .arg(format!("/tmp/{deb_name}")))
        .map(drop)
    })?;
    fs::remove_file(tree.join("tmp").join(&deb_name))?;
    run(Command::new("chroot").arg(&tree).args(["apt-get", "clean"]))?;
    let lists = tree.join("var/lib/apt/lists");
    if lists.exists() {
        fs::remove_dir_all(&lists)?;
        fs::create_dir_all(lists.join("partial"))?;
    }
    let vmlinuz = tree.join(format!("boot/vmlinuz-{kernel_release}"));
    let initrd = tree.join(format!("boot/initrd.img-{kernel_release}"));
    for f in [&vmlinuz, &initrd] {
        if !f.is_file() {
            bail!(
                "the guest root has no {} after installing the kernel",
                f.display()
            );
        }
    }
    fs::copy(&vmlinuz, partial.join("vmlinuz"))?;
    fs::copy(&initrd, partial.join("initrd.img"))?;

    setup::step("mkfs.ext4 -d: the guest root disk image");
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-L", "railscope-root", "-d"])
        .arg(&tree)
        .arg(partial.join("root.img"))
        .arg(DISK_SIZE))?;
    fs::remove_dir_all(&tree)?;
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    fs::rename(&partial, &dir)?;
    fs::write(dir.join(".complete"), &recipe)?;
    eprintln!(
        "    systemd guest made in {:.0} s: {}",
        start.elapsed().as_secs_f64(),
        dir.display()
    );
    Ok(root)
}

/// The guest's own settings: root on the first virtio disk, a host name, the test unit
/// enabled, and nothing else that would start at boot and get in the way under emulation
/// (gettys, apt's timers).
fn configure(tree: &Path) -> anyhow::Result<()> {
    fs::write(
        tree.join("etc/fstab"),
        "/dev/vda / ext4 rw,errors=remount-ro 0 1\n",
    )?;
    fs::write(tree.join("etc/hostname"), "railscope-node\n")?;
    fs::write(
        tree.join("etc/hosts"),
        "127.0.0.1 localhost\n127.0.1.1 railscope-node\n",
    )?;
    // The initrd needs only the root disk's modules (the default, `most`, takes minutes
    // under a loaded machine and makes a 30 MB initrd).
    let conf = tree.join("etc/initramfs-tools/initramfs.conf");
    let text = fs::read_to_string(&conf).with_context(|| format!("reading {}", conf.display()))?;
    let text = text
        .replace("MODULES=most", "MODULES=list")
        .replace("COMPRESS=zstd", "COMPRESS=gzip");
    fs::write(&conf, text)?;
    let modules = tree.join("etc/initramfs-tools/modules");
    let mut list = fs::read_to_string(&modules).unwrap_or_default();
    list.push_str("virtio_pci\nvirtio_blk\next4\n");
    fs::write(&modules, list)?;

    let sbin = tree.join("usr/local/sbin/railscope-package-test");
    fs::write(&sbin, TEST_RUNNER)?;
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(&sbin, fs::Permissions::from_mode(0o755))?;
    fs::write(
        tree.join("etc/systemd/system").join(TEST_UNIT),
        TEST_UNIT_TEXT,
    )?;
    let root = tree.to_string_lossy().into_owned();
    run(Command::new("systemctl").args(["--root", &root, "enable", TEST_UNIT]))?;
    run(Command::new("systemctl").args([
        "--root",
        &root,
        "mask",
        "getty@tty1.service",
        "serial-getty@ttyS0.service",
        "apt-daily.timer",
        "apt-daily-upgrade.timer",
        "e2scrub_all.timer",
        "fstrim.timer",
    ]))?;
    Ok(())
}

/// Runs `f` with /proc, /sys and /dev mounted in `tree` (the kernel package's scripts read
/// them), unmounting them afterwards whatever happened.
fn with_proc<T>(tree: &Path, f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
    let mounts = [("proc", "proc"), ("sysfs", "sys"), ("devtmpfs", "dev")];
    for (fstype, dir) in mounts {
        run(Command::new("mount")
            .args(["-t", fstype, fstype])
            .arg(tree.join(dir)))?;
    }
    let result = f();
    unmount_below(tree);
    result
}

/// Unmounts whatever is mounted in a guest tree (after an interrupted build too).
fn unmount_below(dir: &Path) {
    let Ok(mounts) = fs::read_to_string("/proc/self/mounts") else {
        return;
    };
    let dir = dir.to_string_lossy();
    let mut points: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|p| p.starts_with(dir.as_ref()))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let _ = Command::new("umount").arg("-l").arg(p).status();
    }
}

/// Runs a command; fails with its stderr.
fn run(cmd: &mut Command) -> anyhow::Result<std::process::Output> {
    let rendered = crate::cargo::render(cmd);
    let out = cmd
        .output()
        .with_context(|| format!("failed to start {rendered}"))?;
    if !out.status.success() {
        bail!(
            "{rendered} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out)
}
