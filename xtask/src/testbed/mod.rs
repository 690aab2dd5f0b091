//! The soft-RoCE test bed, host side: build a QEMU guest image from stock Debian packages
//! (a Debian kernel with `rdma_rxe`, busybox, rdma-core userspace) and boot it.
//!
//! The steps, and why each one is there, follow the checked shell reference in
//! `shared/testbed/` (`run.sh` and the README's pitfalls list):
//! - [`debs`]: resolve the kernel package of a [`KernelLine`], download the guest's debs once
//!   into a cache and extract them (with a marker file after each complete step);
//! - [`image`]: stage the initramfs root (busybox applets, the module closure, userspace
//!   binaries with their shared libraries, the caller's files, `/init`) and pack it;
//! - [`qemu`]: pick the accelerator and boot the image with a timeout, keeping the serial log.
//!
//! The guest's `/init` is not built here: the caller hands in a host binary.

mod cpio;
mod debs;
mod extra;
mod image;
mod package_set;
mod qemu;
mod siw;

use std::ffi::OsStr;
use std::io;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

pub(crate) use debs::KernelLine;
pub(crate) use debs::prepare as prepare_debs;
pub(crate) use extra::ExtraDebs;
pub(crate) use image::{GuestFile, GuestImage, ImageSpec, build_image, build_image_with};
pub(crate) use qemu::{Accel, BootOptions, BootOutcome, boot};
pub(crate) use siw::module as siw_module;

/// Host packages the test bed needs, for `cargo xtask setup` to install
/// (`apt-get install --no-install-recommends`): QEMU, a static busybox for the guest's
/// applets, kmod (`modprobe --show-depends`, `depmod`), gzip (the initramfs), xz-utils
/// (6.12's modules are `.ko.xz`; the kernel source), make and gcc-12 (the compiler of Debian
/// 12's kernels, for siw: see [`siw`]). `apt-get`, `dpkg-deb` and `ldd` come with every Debian system.
pub(crate) const HOST_PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "busybox-static",
    "kmod",
    "gzip",
    "xz-utils",
    "make",
    "gcc-12",
];

/// Prints one progress line.
fn note(msg: impl std::fmt::Display) {
    eprintln!("testbed: {msg}");
}

/// Seconds with one decimal, for progress lines.
fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// Megabytes with one decimal, for progress lines.
fn mbytes(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// Times a step.
struct Timer(Instant);

impl Timer {
    fn start() -> Self {
        Self(Instant::now())
    }

    fn took(&self) -> String {
        secs(self.0.elapsed())
    }
}

/// The Debian package that ships a host tool, for "not found" hints.
fn package_of(tool: &str) -> Option<&'static str> {
    Some(match tool {
        "qemu-system-x86_64" => "qemu-system-x86",
        "busybox" => "busybox-static",
        "modprobe" | "depmod" => "kmod",
        "gzip" => "gzip",
        "xz" => "xz-utils",
        "zstd" => "zstd",
        "dpkg-deb" => "dpkg",
        "apt-get" | "apt-cache" => "apt",
        "ldd" => "libc-bin",
        _ => return None,
    })
}

/// Explains a failure to start `tool`.
fn spawn_error(tool: &str, e: io::Error) -> anyhow::Error {
    if e.kind() == io::ErrorKind::NotFound {
        match package_of(tool) {
            Some(pkg) => anyhow::anyhow!(
                "{tool} not found: run `cargo xtask setup` (it installs the Debian package {pkg})"
            ),
            None => anyhow::anyhow!("{tool} not found in PATH"),
        }
    } else {
        anyhow::Error::new(e).context(format!("cannot start {tool}"))
    }
}

/// Runs a command to completion, capturing its output; fails, with its stderr, unless it
/// exits 0.
fn run(cmd: &mut Command) -> Result<Output> {
    let tool = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd.output().map_err(|e| spawn_error(&tool, e))?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            show(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out)
}

/// A command line as one string, for error messages.
fn show(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Total size of the regular files directly in `dir` whose names end with `ext`.
fn dir_size(dir: &Path, ext: &str) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().ends_with(ext))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Removes a directory tree if it exists.
fn remove_dir_if_exists(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("cannot remove {}", dir.display()))
        }
        _ => Ok(()),
    }
}

/// `OsStr` of a `&str`, for argument lists.
fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::sync::Mutex;

    /// The end-to-end checks download and boot: one at a time (the machines have 2 cores).
    static ONE_BOOT_AT_A_TIME: Mutex<()> = Mutex::new(());

    const SELFTEST_INIT: &str = r#"#!/bin/sh
export PATH=/usr/bin:/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
echo /bin/modprobe > /proc/sys/kernel/modprobe
echo "kernel: $(uname -r)"
modprobe veth && modprobe rdma_rxe && echo "MODPROBE-OK"
lsmod
/usr/bin/ip link add vethA type veth peer name vethB
/usr/bin/ip link set vethA up
/usr/bin/ip link set vethB up
/usr/bin/rdma link add rxe0 type rxe netdev vethA && echo "RXE-ADD-OK"
echo "infiniband: $(ls /sys/class/infiniband)"
/usr/bin/ibv_devices
/usr/bin/ibv_devinfo -d rxe0 | grep -q PORT_ACTIVE && echo "IBV-DEVINFO-OK"
echo "host-id: $(/opt/selftest/id -u)"
echo TESTBED-OK
poweroff -f
"#;

    /// Builds an image for `line` with the shell script `init` as `/init`, in a work
    /// directory of its own (`name`); returns the image and boot options with `timeout`.
    fn selftest_image(
        line: KernelLine,
        name: &str,
        init: &str,
        timeout: Duration,
    ) -> (GuestImage, BootOptions) {
        let home = std::env::var_os("HOME").expect("HOME is set");
        let cache = PathBuf::from(home).join(".cache/railscope/testbed");
        let work = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../target/testbed-selftest")
            .join(name);
        std::fs::create_dir_all(&work).unwrap();
        let init_path = work.join("selftest-init.sh");
        std::fs::write(&init_path, init).unwrap();
        let spec = ImageSpec {
            kernel: line,
            init: init_path,
            files: vec![GuestFile {
                host: PathBuf::from("/usr/bin/id"),
                guest: "/opt/selftest/id".into(),
                with_libs: true,
            }],
        };
        let image = build_image(&cache, &work, &spec).expect("image builds");
        let opts = BootOptions {
            user_net: false,
            pcie_numa: false,
            mem: "1G".into(),
            smp: 2,
            timeout,
            cmdline_extra: "railscope.selftest=1".into(),
            serial_log: work.join("serial.log"),
        };
        (image, opts)
    }

    /// Builds an image for `line` with a shell `/init` and boots it to poweroff.
    fn end_to_end(line: KernelLine) {
        let _one = ONE_BOOT_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let name = format!("{line:?}").to_lowercase();
        let (image, opts) = selftest_image(line, &name, SELFTEST_INIT, Duration::from_secs(300));
        let out = boot(&image, &opts).expect("qemu runs");
        eprintln!("{}", out.log);
        eprintln!(
            "boot of {} under {:?}: {} (timed out: {})",
            image.kernel_release,
            out.accel,
            secs(out.wall),
            out.timed_out
        );
        assert!(!out.timed_out, "the guest did not power off in time");
        for marker in [
            "MODPROBE-OK",
            "RXE-ADD-OK",
            "infiniband: rxe0",
            "IBV-DEVINFO-OK",
            "host-id: 0",
            "TESTBED-OK",
        ] {
            assert!(out.log.contains(marker), "serial log lacks {marker}");
        }
        let saved = std::fs::read_to_string(&opts.serial_log).unwrap();
        assert_eq!(saved, out.log, "the serial log file holds the returned log");
    }

    #[test]
    #[ignore = "downloads ~75 MB of debs and boots a guest (about a minute under TCG)"]
    fn testbed_boots_6_1_kernel() {
        end_to_end(KernelLine::Bookworm);
    }

    #[test]
    #[ignore = "downloads ~110 MB of debs and boots a guest (about a minute under TCG)"]
    fn testbed_boots_6_12_kernel() {
        end_to_end(KernelLine::Bookworm612);
    }

    #[test]
    #[ignore = "boots a guest that hangs, to check the timeout (about 20 s)"]
    fn testbed_kills_a_hung_guest() {
        let _one = ONE_BOOT_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let init = "#!/bin/sh\nmount -t proc proc /proc\necho \"HANGING $(cat /proc/cmdline)\"\nexec sleep 1000\n";
        let (image, opts) =
            selftest_image(KernelLine::Bookworm, "hang", init, Duration::from_secs(20));
        let out = boot(&image, &opts).expect("qemu runs");
        eprintln!("{}", out.log);
        assert!(out.timed_out, "the guest cannot have powered off");
        assert_eq!(out.exit_code, None);
        assert!(out.wall >= Duration::from_secs(20) && out.wall < Duration::from_secs(30));
        assert!(out.log.contains("HANGING"), "the partial log is returned");
        assert!(
            out.log.contains("rdinit=/init railscope.selftest=1"),
            "cmdline_extra reaches the guest"
        );
        let saved = std::fs::read_to_string(&opts.serial_log).unwrap();
        assert!(saved.contains("HANGING"), "the partial log is kept on disk");
    }

    #[test]
    fn missing_tool_says_how_to_fix() {
        let e = spawn_error(
            "qemu-system-x86_64",
            io::Error::from(io::ErrorKind::NotFound),
        );
        assert!(e.to_string().contains("cargo xtask setup"), "{e}");
        let e = run(&mut Command::new("/nonexistent/railscope-tool")).unwrap_err();
        assert!(e.to_string().contains("not found"), "{e}");
    }

    #[test]
    fn failing_command_reports_stderr() {
        let e = run(Command::new("sh").args(["-c", "echo boom >&2; exit 3"])).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("boom") && msg.contains("sh -c"), "{msg}");
    }
}
