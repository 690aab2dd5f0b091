//! The capabilities the agent keeps: `CAP_BPF`, `CAP_PERFMON` and `CAP_DAC_READ_SEARCH`
//! (docs/deployment.md, "Privileges", says what each is for). At start, before any other
//! thread exists (capabilities are per thread and inherited by new threads), the agent drops
//! every other one from all its sets, the bounding set included, so started by hand as root
//! it holds what its systemd unit gives it. The three stay for its whole life: a kernel
//! module loaded again is probed anew.

use std::io;

/// `CAP_DAC_READ_SEARCH`, `CAP_SETPCAP`, `CAP_PERFMON`, `CAP_BPF` (linux/capability.h).
const CAP_DAC_READ_SEARCH: u32 = 2;
const CAP_SETPCAP: u32 = 8;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// What each kept capability is for, as the agent says when one is missing.
pub const NEEDED: [(u32, &str, &str); 3] = [
    (CAP_BPF, "CAP_BPF", "the probes cannot be loaded"),
    (
        CAP_PERFMON,
        "CAP_PERFMON",
        "the probes cannot be loaded or attached",
    ),
    (
        CAP_DAC_READ_SEARCH,
        "CAP_DAC_READ_SEARCH",
        "jobs are named by walking /sys/fs/cgroup instead of by handle",
    ),
];

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

fn needed_mask() -> u64 {
    NEEDED.iter().fold(0, |m, &(cap, ..)| m | (1 << cap))
}

/// The needed capabilities the agent does not hold, one line each: which, and what goes
/// without it.
pub fn missing(sets: &CapSets) -> Vec<String> {
    NEEDED
        .iter()
        .filter(|&&(cap, ..)| !sets.has(cap))
        .map(|&(_, name, without)| format!("{name} missing: {without}"))
        .collect()
}

/// Drops every capability but [`NEEDED`] from the bounding, ambient, inheritable, permitted
/// and effective sets of the calling thread. Call it before any other thread exists.
/// Returns how many were dropped from the permitted set.
pub fn keep_only_needed() -> io::Result<u32> {
    let keep = needed_mask();
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
        let lines = missing(&none);
        assert_eq!(lines.len(), 3);
        assert_eq!(
            lines[1],
            "CAP_PERFMON missing: the probes cannot be loaded or attached"
        );
        let all = CapSets {
            effective: needed_mask(),
            ..CapSets::default()
        };
        assert!(missing(&all).is_empty());
    }

    /// In a thread of its own (capabilities are per thread), so the other tests keep theirs.
    #[test]
    fn only_the_needed_capabilities_stay() {
        std::thread::spawn(|| {
            let before = CapSets::current().unwrap();
            keep_only_needed().unwrap();
            let after = CapSets::current().unwrap();
            assert_eq!(after.permitted, before.permitted & needed_mask());
            assert_eq!(after.effective & !needed_mask(), 0);
            assert_eq!(after.inheritable, 0);
            // SAFETY: prctl with integer arguments only.
            let in_bounding = |cap: u32| unsafe {
                libc::prctl(libc::PR_CAPBSET_READ, libc::c_ulong::from(cap), 0, 0, 0)
            };
            if before.has(CAP_SETPCAP) {
                assert_eq!(in_bounding(0), 0, "CAP_CHOWN still in the bounding set");
                assert_eq!(
                    in_bounding(21),
                    0,
                    "CAP_SYS_ADMIN still in the bounding set"
                );
            }
            assert_eq!(
                in_bounding(CAP_BPF),
                i32::from(before.permitted & (1 << CAP_BPF) != 0)
            );
        })
        .join()
        .unwrap();
    }
}
