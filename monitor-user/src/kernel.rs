//! Facts about the running kernel that decide whether a probe can attach: loaded modules,
//! kprobe support, BTF. Read from sysfs each time they are asked for, because modules come and
//! go while the agent runs.

use std::path::{Path, PathBuf};

/// Where the kernel exposes what we look at. Tests may point it elsewhere.
#[derive(Clone, Debug)]
pub struct Kernel {
    sys: PathBuf,
}

impl Default for Kernel {
    fn default() -> Self {
        Self::at("/sys")
    }
}

impl Kernel {
    pub fn at(sys: impl Into<PathBuf>) -> Self {
        Self { sys: sys.into() }
    }

    /// A module is usable when sysfs lists it, loaded or built in.
    pub fn module_present(&self, module: &str) -> bool {
        self.sys.join("module").join(module).is_dir()
    }

    /// Kprobes can be created through the `kprobe` perf PMU (what aya uses) or, on older
    /// kernels, through tracefs `kprobe_events`.
    pub fn has_kprobes(&self) -> bool {
        self.sys.join("bus/event_source/devices/kprobe").exists()
            || self.sys.join("kernel/tracing/kprobe_events").exists()
            || self.sys.join("kernel/debug/tracing/kprobe_events").exists()
    }

    /// The split BTF of a module, if the kernel exposes one (CONFIG_DEBUG_INFO_BTF_MODULES).
    pub fn module_btf(&self, module: &str) -> Option<PathBuf> {
        let path = self.sys.join("kernel/btf").join(module);
        path.is_file().then_some(path)
    }

    pub fn vmlinux_btf(&self) -> PathBuf {
        self.sys.join("kernel/btf/vmlinux")
    }

    pub fn sys_root(&self) -> &Path {
        &self.sys
    }
}

/// The kernel's CLOCK_MONOTONIC, which `bpf_ktime_get_ns` reads, in nanoseconds.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// Wall-clock time in nanoseconds since the Unix epoch.
pub fn realtime_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; these clocks always exist on Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// Converts kernel monotonic timestamps to wall-clock time, with the offset taken once: the
/// events of one run keep their exact spacing even if NTP steps the wall clock meanwhile.
#[derive(Clone, Copy, Debug)]
pub struct WallClock {
    realtime_minus_monotonic: i128,
}

impl WallClock {
    pub fn now() -> Self {
        let mono = monotonic_ns();
        let real = realtime_ns();
        Self {
            realtime_minus_monotonic: i128::from(real) - i128::from(mono),
        }
    }

    /// Unix nanoseconds for a kernel monotonic timestamp.
    pub fn unix_ns(&self, monotonic_ns: u64) -> u64 {
        (i128::from(monotonic_ns) + self.realtime_minus_monotonic).max(0) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_presence_follows_sysfs() {
        let dir = std::env::temp_dir().join(format!("railscope-kernel-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("module/ib_core")).unwrap();
        let kernel = Kernel::at(&dir);
        assert!(kernel.module_present("ib_core"));
        assert!(!kernel.module_present("mlx5_ib"));
        assert!(!kernel.has_kprobes());
        std::fs::create_dir_all(dir.join("bus/event_source/devices/kprobe")).unwrap();
        assert!(kernel.has_kprobes());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn wall_clock_keeps_event_spacing() {
        let clock = WallClock::now();
        let a = clock.unix_ns(1_000_000_000);
        let b = clock.unix_ns(1_000_000_500);
        assert_eq!(b - a, 500);
        // A monotonic timestamp of now maps to about now on the wall clock.
        let now = clock.unix_ns(monotonic_ns());
        let real = realtime_ns();
        assert!(now.abs_diff(real) < 1_000_000_000, "{now} vs {real}");
    }
}
