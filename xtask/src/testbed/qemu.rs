//! Booting a guest image in QEMU: the accelerator choice, the command line, and a run with a
//! timeout that keeps the serial console as it comes.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::image::GuestImage;
use super::{note, os, secs, spawn_error};

/// The QEMU binary.
const QEMU: &str = "qemu-system-x86_64";

/// The kernel command line before [`BootOptions::cmdline_extra`]: serial console, reboot on
/// panic (which `-no-reboot` turns into QEMU exiting), few kernel messages, our `/init`.
const BASE_CMDLINE: &str = "console=ttyS0 panic=-1 quiet loglevel=4 rdinit=/init";

/// How to boot.
#[derive(Clone, Debug)]
pub(crate) struct BootOptions {
    /// Guest memory, as QEMU's `-m` takes it ("1G").
    pub mem: String,
    /// Virtual CPUs.
    pub smp: u32,
    /// QEMU is killed when the guest has not powered off by then.
    pub timeout: Duration,
    /// Appended to the kernel command line (e.g. parameters the guest's `/init` reads).
    pub cmdline_extra: String,
    /// The serial console is written here as it comes (`\r` removed).
    pub serial_log: PathBuf,
    /// A virtio NIC on QEMU's user network (the host is 10.0.2.2 from the guest), for
    /// scenarios that reach the host; none otherwise.
    pub user_net: bool,
    /// Boot a q35 machine with two NUMA nodes and a PCIe tree of NICs ([`PCIE_NUMA_ARGS`])
    /// instead of the plain PC.
    pub pcie_numa: bool,
}

/// A q35 machine with two NUMA nodes (one vCPU and half the memory each, so `-m` must be
/// 1G) and, on each node's expander bus (`pxb-pcie`), a root port with a virtio NIC: on node
/// 0 behind a PCIe switch (`x3130-upstream`, `xio3130-downstream`) under a root port set to
/// 16 GT/s x16; on node 1 straight on a root port set to 8 GT/s x4 (QEMU 7.2's virtio NICs
/// themselves report 2.5 GT/s x1). The guest's kernel builds its PCI sysfs from this: where
/// a NIC sits, its NUMA node and link, what an HGX node's NICs show.
pub(super) const PCIE_NUMA_ARGS: &[&str] = &[
    "-machine",
    "q35",
    "-object",
    "memory-backend-ram,id=mem0,size=512M",
    "-numa",
    "node,nodeid=0,cpus=0,memdev=mem0",
    "-object",
    "memory-backend-ram,id=mem1,size=512M",
    "-numa",
    "node,nodeid=1,cpus=1,memdev=mem1",
    "-device",
    "pxb-pcie,id=pxb0,bus_nr=64,numa_node=0,bus=pcie.0",
    "-device",
    "pcie-root-port,id=rp0,bus=pxb0,chassis=10,slot=0,x-speed=16,x-width=16",
    "-device",
    "x3130-upstream,id=sw0,bus=rp0",
    "-device",
    "xio3130-downstream,id=sw0port0,bus=sw0,chassis=11,slot=0",
    "-netdev",
    "user,id=nic0",
    "-device",
    "virtio-net-pci,netdev=nic0,bus=sw0port0",
    "-device",
    "pxb-pcie,id=pxb1,bus_nr=128,numa_node=1,bus=pcie.0",
    "-device",
    "pcie-root-port,id=rp1,bus=pxb1,chassis=12,slot=0,x-speed=8,x-width=4",
    "-netdev",
    "user,id=nic1",
    "-device",
    "virtio-net-pci,netdev=nic1,bus=rp1",
];

/// How a boot went.
#[derive(Clone, Debug)]
pub(crate) struct BootOutcome {
    /// The serial console (and QEMU's own messages), `\r` removed.
    pub log: String,
    /// QEMU was killed at [`BootOptions::timeout`].
    pub timed_out: bool,
    /// From QEMU's start to its exit.
    pub wall: Duration,
    pub accel: Accel,
    /// QEMU's exit code (`None` when killed).
    pub exit_code: Option<i32>,
}

/// The accelerator QEMU runs the guest with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Accel {
    /// Hardware virtualisation through /dev/kvm.
    Kvm,
    /// QEMU's emulator (multi-threaded TCG): slow, but runs anywhere.
    Tcg,
}

/// What the accelerator choice depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HostFacts {
    /// `/sys/module/kvm_pvm` exists: /dev/kvm is a nested PVM hypervisor, which runs only
    /// PVM-enabled guest kernels (a stock Debian kernel hangs after "Probing EDD").
    pub kvm_pvm: bool,
    /// /dev/kvm can be opened for reading and writing.
    pub kvm_usable: bool,
}

impl HostFacts {
    /// The facts of this machine.
    pub(crate) fn probe() -> Self {
        Self {
            kvm_pvm: Path::new("/sys/module/kvm_pvm").exists(),
            kvm_usable: OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/kvm")
                .is_ok(),
        }
    }
}

impl Accel {
    /// KVM when /dev/kvm is usable and is not PVM; TCG otherwise.
    pub(crate) fn choose(facts: HostFacts) -> Self {
        if facts.kvm_usable && !facts.kvm_pvm {
            Accel::Kvm
        } else {
            Accel::Tcg
        }
    }

    /// The choice for this machine.
    pub(crate) fn detect() -> Self {
        Self::choose(HostFacts::probe())
    }

    /// QEMU's arguments selecting the accelerator.
    pub(crate) fn qemu_args(self) -> &'static [&'static str] {
        match self {
            Accel::Kvm => &["-enable-kvm", "-cpu", "host"],
            Accel::Tcg => &["-accel", "tcg,thread=multi", "-cpu", "max"],
        }
    }
}

/// Boots `image` with the accelerator this machine supports (see [`Accel::choose`]).
pub(crate) fn boot(image: &GuestImage, opts: &BootOptions) -> Result<BootOutcome> {
    boot_with_accel(image, opts, Accel::detect())
}

/// QEMU's arguments for a boot.
fn qemu_args(image: &GuestImage, opts: &BootOptions, accel: Accel) -> Vec<OsString> {
    let mut args: Vec<OsString> = accel.qemu_args().iter().map(OsString::from).collect();
    let mut cmdline = BASE_CMDLINE.to_owned();
    let extra = opts.cmdline_extra.trim();
    if !extra.is_empty() {
        cmdline.push(' ');
        cmdline.push_str(extra);
    }
    for a in [
        "-m",
        &opts.mem,
        "-smp",
        &opts.smp.to_string(),
        "-nographic",
        "-no-reboot",
        "-nic",
        if opts.user_net {
            "user,model=virtio-net-pci"
        } else {
            "none"
        },
        "-monitor",
        "none",
        "-serial",
        "stdio",
    ] {
        args.push(a.into());
    }
    if opts.pcie_numa {
        args.extend(PCIE_NUMA_ARGS.iter().map(OsString::from));
    }
    args.push(os("-kernel").into());
    args.push(image.vmlinuz.clone().into());
    args.push(os("-initrd").into());
    args.push(image.initramfs.clone().into());
    args.push(os("-append").into());
    args.push(cmdline.into());
    args
}

/// Kills QEMU if the boot is left early (an error or a panic in the caller's thread).
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Boots `image` with `accel`.
pub(super) fn boot_with_accel(
    image: &GuestImage,
    opts: &BootOptions,
    accel: Accel,
) -> Result<BootOutcome> {
    for f in [&image.vmlinuz, &image.initramfs] {
        if !f.is_file() {
            bail!("{} is missing: build the image first", f.display());
        }
    }
    if let Some(dir) = opts.serial_log.parent() {
        fs::create_dir_all(dir)?;
    }
    let log_file = File::create(&opts.serial_log)
        .with_context(|| format!("cannot create {}", opts.serial_log.display()))?;

    // QEMU's stdout (the serial console) and stderr (its own errors) go to one pipe.
    let (reader, writer) = std::io::pipe().context("cannot create a pipe for QEMU's output")?;
    let mut cmd = Command::new(QEMU);
    cmd.args(qemu_args(image, opts, accel))
        .stdin(Stdio::null())
        .stdout(writer.try_clone()?)
        .stderr(writer);
    note(format!(
        "booting {} under {accel:?} ({} vCPU, {}), timeout {}; serial log {}",
        image.kernel_release,
        opts.smp,
        opts.mem,
        secs(opts.timeout),
        opts.serial_log.display()
    ));
    let start = Instant::now();
    let child = cmd.spawn().map_err(|e| spawn_error(QEMU, e))?;
    // The pipe's write ends live in `cmd` until it is dropped: the reader sees EOF only when
    // QEMU has exited and no copy is left here.
    drop(cmd);
    let mut child = KillOnDrop(child);
    let pump = thread::spawn(move || pump_log(reader, log_file));

    let deadline = start + opts.timeout;
    let mut timed_out = false;
    let status = loop {
        if let Some(status) = child.0.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            timed_out = true;
            let _ = child.0.kill();
            break child.0.wait()?;
        }
        thread::sleep(Duration::from_millis(50));
    };
    let wall = start.elapsed();
    let log = pump
        .join()
        .map_err(|_| anyhow::anyhow!("the serial log reader panicked"))?
        .with_context(|| format!("cannot write {}", opts.serial_log.display()))?;
    let log = String::from_utf8_lossy(&log).into_owned();
    let exit_code = if timed_out { None } else { status.code() };
    if timed_out {
        note(format!(
            "guest killed after {} (timeout); partial log in {}",
            secs(wall),
            opts.serial_log.display()
        ));
    } else {
        note(format!("guest ran {} (qemu {status})", secs(wall)));
    }
    Ok(BootOutcome {
        log,
        timed_out,
        wall,
        accel,
        exit_code,
    })
}

/// Copies QEMU's output to the log file as it comes, `\r` removed; returns all of it.
fn pump_log(mut from: impl Read, mut to: File) -> std::io::Result<Vec<u8>> {
    let mut all = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let start = all.len();
        all.extend(buf[..n].iter().copied().filter(|&b| b != b'\r'));
        to.write_all(&all[start..])?;
    }
    to.flush()?;
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accel_choice() {
        let f = |kvm_pvm, kvm_usable| {
            Accel::choose(HostFacts {
                kvm_pvm,
                kvm_usable,
            })
        };
        assert_eq!(f(false, true), Accel::Kvm);
        assert_eq!(f(true, true), Accel::Tcg, "PVM cannot run a stock kernel");
        assert_eq!(f(false, false), Accel::Tcg);
        assert_eq!(f(true, false), Accel::Tcg);
    }

    fn image() -> GuestImage {
        GuestImage {
            kernel_release: "6.1.0-56-amd64".into(),
            vmlinuz: "/w/vmlinuz".into(),
            initramfs: "/w/initramfs.cpio.gz".into(),
        }
    }

    fn opts(extra: &str) -> BootOptions {
        BootOptions {
            user_net: false,
            pcie_numa: false,
            mem: "1G".into(),
            smp: 2,
            timeout: Duration::from_secs(60),
            cmdline_extra: extra.into(),
            serial_log: "/w/serial.log".into(),
        }
    }

    fn joined(args: &[OsString]) -> String {
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn qemu_command_line() {
        let args = qemu_args(&image(), &opts(" railscope.scenario=smoke "), Accel::Tcg);
        let s = joined(&args);
        assert!(
            s.starts_with("-accel tcg,thread=multi -cpu max -m 1G -smp 2 "),
            "{s}"
        );
        assert!(
            s.contains("-nographic -no-reboot -nic none -monitor none -serial stdio"),
            "{s}"
        );
        assert!(
            s.contains("-kernel /w/vmlinuz -initrd /w/initramfs.cpio.gz"),
            "{s}"
        );
        // The command line stays one argument.
        assert_eq!(
            args.last().unwrap(),
            "console=ttyS0 panic=-1 quiet loglevel=4 rdinit=/init railscope.scenario=smoke"
        );
        let s = joined(&qemu_args(&image(), &opts(""), Accel::Kvm));
        assert!(s.starts_with("-enable-kvm -cpu host "), "{s}");
        assert!(s.ends_with("rdinit=/init"), "{s}");
    }

    #[test]
    fn log_pump_strips_carriage_returns() {
        let path = std::env::temp_dir().join(format!("railscope-pump-{}.log", std::process::id()));
        let file = File::create(&path).unwrap();
        let all = pump_log(&b"a\r\nb\r\n"[..], file).unwrap();
        assert_eq!(all, b"a\nb\n");
        assert_eq!(fs::read(&path).unwrap(), b"a\nb\n");
        let _ = fs::remove_file(&path);
    }

    /// A stand-in for QEMU is not worth it; a missing QEMU must say how to get one.
    #[test]
    fn missing_image_is_reported() {
        let e = boot_with_accel(&image(), &opts(""), Accel::Tcg).unwrap_err();
        assert!(e.to_string().contains("build the image first"), "{e}");
    }
}
