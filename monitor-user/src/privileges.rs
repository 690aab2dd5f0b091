//! The capabilities the agent keeps: `CAP_BPF`, `CAP_PERFMON`, `CAP_SYSLOG` and
//! `CAP_DAC_READ_SEARCH`, and `CAP_SYS_ADMIN` only where `kernel.perf_event_paranoid` is
//! above 2 (Debian's and Ubuntu's level 3, whose patch asks `perf_event_open` for
//! `CAP_SYS_ADMIN` where mainline asks for `CAP_PERFMON`). docs/deployment.md,
//! "Privileges", says what each is for. At start, before any other
//! thread exists (capabilities are per thread and inherited by new threads), the agent drops
//! every other one from all its sets, the bounding set included, so started by hand as root
//! it holds what its systemd unit gives it. The three stay for its whole life: a kernel
//! module loaded again is probed anew.

use std::io;

/// Capability numbers (linux/capability.h).
const CAP_DAC_READ_SEARCH: u32 = 2;
const CAP_SETPCAP: u32 = 8;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_SYSLOG: u32 = 34;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// What each kept capability is for, as the agent says when one is missing.
pub const NEEDED: [(u32, &str, &str); 4] = [
    (CAP_BPF, "CAP_BPF", "the probes cannot be loaded"),
    (
        CAP_PERFMON,
        "CAP_PERFMON",
        "the probes cannot be loaded or attached",
    ),
    (
        CAP_SYSLOG,
        "CAP_SYSLOG",
        "/proc/kallsyms hides addresses: the rdma_cm probe cannot attach",
    ),
    (
        CAP_DAC_READ_SEARCH,
        "CAP_DAC_READ_SEARCH",
        "jobs are named by walking /sys/fs/cgroup instead of by handle",
    ),
];

/// Needed besides [`NEEDED`] where `kernel.perf_event_paranoid` is above 2.
pub const PARANOID_NEEDED: (u32, &str, &str) = (
    CAP_SYS_ADMIN,
    "CAP_SYS_ADMIN",
    "kernel.perf_event_paranoid is above 2, where perf_event_open asks for it: no probe attaches (set it to 2 to run without CAP_SYS_ADMIN)",
);

/// Whether this kernel's `perf_event_open` asks for `CAP_SYS_ADMIN` (Debian's and Ubuntu's
/// `kernel.perf_event_paranoid` 3, their default).
pub fn perf_needs_sys_admin() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .is_some_and(|level| level > 2)
}

/// Every capability the agent keeps on this kernel.
fn needed(paranoid: bool) -> Vec<(u32, &'static str, &'static str)> {
    let mut needed = NEEDED.to_vec();
    if paranoid {
        needed.push(PARANOID_NEEDED);
    }
    needed
}

#[repr(C)]
struct Header {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Data {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The calling thread's effective, permitted and inheritable sets, as 64-bit masks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CapSets {
    pub effective: u64,
    pub permitted: u64,
    pub inheritable: u64,
}

impl CapSets {
    pub fn current() -> io::Result<Self> {
        let mut header = Header {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        let mut data = [Data::default(); 2];
        // SAFETY: capget writes two `Data` (version 3) through a valid pointer.
        let rc = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        let join = |lo: u32, hi: u32| u64::from(lo) | (u64::from(hi) << 32);
        Ok(Self {
            effective: join(data[0].effective, data[1].effective),
            permitted: join(data[0].permitted, data[1].permitted),
            inheritable: join(data[0].inheritable, data[1].inheritable),
        })
    }

    fn set(self) -> io::Result<()> {
        let mut header = Header {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        let split = |mask: u64| (mask as u32, (mask >> 32) as u32);
        let (e, e_hi) = split(self.effective);
        let (p, p_hi) = split(self.permitted);
        let (i, i_hi) = split(self.inheritable);
        let data = [
            Data {
                effective: e,
                permitted: p,
                inheritable: i,
            },
            Data {
                effective: e_hi,
                permitted: p_hi,
                inheritable: i_hi,
            },
        ];
        // SAFETY: capset reads the header and two `Data` (version 3) through valid pointers.
        let rc = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    pub fn has(&self, cap: u32) -> bool {
        self.effective & (1 << cap) != 0
    }
}

fn needed_mask(paranoid: bool) -> u64 {
    needed(paranoid)
        .iter()
        .fold(0, |m, &(cap, ..)| m | (1 << cap))
}

/// The needed capabilities the agent does not hold, one line each: which, and what goes
/// without it.
pub fn missing(sets: &CapSets, paranoid: bool) -> Vec<String> {
    needed(paranoid)
        .iter()
        .filter(|&&(cap, ..)| !sets.has(cap))
        .map(|&(_, name, without)| format!("{name} missing: {without}"))
        .collect()
}

/// Drops every capability but the needed ones (with `paranoid`, `CAP_SYS_ADMIN` too) from the
/// bounding, ambient, inheritable, permitted and effective sets of the calling thread. Call
/// it before any other thread exists. Returns how many were dropped from the permitted set.
pub fn keep_only_needed(paranoid: bool) -> io::Result<u32> {
    let keep = needed_mask(paranoid);
    let before = CapSets::current()?;
    // The bounding set first, while CAP_SETPCAP (which it needs) is still held.
    if before.has(CAP_SETPCAP) {
        let last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .unwrap_or(40)
            .min(63);
        for cap in (0..=last).filter(|cap| keep & (1 << cap) == 0) {
            // SAFETY: prctl with integer arguments only.
            unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) };
        }
    }
    // SAFETY: prctl with integer arguments only. EINVAL on kernels without ambient sets.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    let after = CapSets {
        effective: before.effective & keep,
        permitted: before.permitted & keep,
        inheritable: 0,
    };
    after.set()?;
    Ok((before.permitted & !keep).count_ones())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_capabilities_are_named_one_line_each() {
        let none = CapSets::default();
        let lines = missing(&none, false);
        assert_eq!(lines.len(), 4);
        assert_eq!(
            lines[1],
            "CAP_PERFMON missing: the probes cannot be loaded or attached"
        );
        let paranoid = missing(&none, true);
        assert_eq!(paranoid.len(), 5);
        assert!(paranoid[4].starts_with("CAP_SYS_ADMIN missing: "));
        let all = CapSets {
            effective: needed_mask(false),
            ..CapSets::default()
        };
        assert!(missing(&all, false).is_empty());
        assert_eq!(missing(&all, true).len(), 1);
    }

    /// In a thread of its own (capabilities are per thread), so the other tests keep theirs.
    #[test]
    fn only_the_needed_capabilities_stay() {
        std::thread::spawn(|| {
            let before = CapSets::current().unwrap();
            keep_only_needed(false).unwrap();
            let after = CapSets::current().unwrap();
            assert_eq!(after.permitted, before.permitted & needed_mask(false));
            assert_eq!(after.effective & !needed_mask(false), 0);
            assert_eq!(after.inheritable, 0);
            // SAFETY: prctl with integer arguments only.
            let in_bounding = |cap: u32| unsafe {
                libc::prctl(libc::PR_CAPBSET_READ, libc::c_ulong::from(cap), 0, 0, 0)
            };
            // Only a holder of CAP_SETPCAP trims the bounding set (a user without it keeps
            // the full one, CAP_BPF included, and has nothing permitted to use it with).
            if before.has(CAP_SETPCAP) {
                assert_eq!(in_bounding(0), 0, "CAP_CHOWN still in the bounding set");
                assert_eq!(
                    in_bounding(CAP_SYS_ADMIN),
                    0,
                    "CAP_SYS_ADMIN still in the bounding set"
                );
                assert_eq!(
                    in_bounding(CAP_BPF),
                    i32::from(before.permitted & (1 << CAP_BPF) != 0)
                );
            }
        })
        .join()
        .unwrap();
    }
}
