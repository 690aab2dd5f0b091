//! Starting a program the way the agent's systemd unit (dist/railscope-agent.service) starts
//! the agent: uid 0, but holding only a given set of capabilities, with
//! `CapabilityBoundingSet=`, `AmbientCapabilities=`, `SecureBits=noroot-locked` and
//! `NoNewPrivileges=yes` applied before `execve` — so uid 0 gains nothing more at exec
//! (`noroot`) and the ambient set is all the process gets.

use std::{io, os::unix::process::CommandExt as _, process::Command};

pub const CAP_DAC_READ_SEARCH: u32 = 2;
pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_SYSLOG: u32 = 34;
pub const CAP_PERFMON: u32 = 38;
pub const CAP_BPF: u32 = 39;

/// The capabilities docs/deployment.md ("Privileges") documents for the agent, by name, and
/// `CAP_SYS_ADMIN` where `kernel.perf_event_paranoid` is above 2 (Debian's default 3).
pub fn agent_capabilities() -> Vec<(u32, &'static str)> {
    let mut caps = vec![
        (CAP_BPF, "CAP_BPF"),
        (CAP_PERFMON, "CAP_PERFMON"),
        (CAP_SYSLOG, "CAP_SYSLOG"),
        (CAP_DAC_READ_SEARCH, "CAP_DAC_READ_SEARCH"),
    ];
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .is_some_and(|level| level > 2);
    if paranoid {
        caps.push((CAP_SYS_ADMIN, "CAP_SYS_ADMIN"));
    }
    caps
}

/// The mask of `caps`, as `/proc/PID/status` shows `CapEff`.
pub fn mask(caps: &[u32]) -> u64 {
    caps.iter().fold(0, |m, &c| m | (1 << c))
}

/// A process's effective set, from `/proc/PID/status`.
pub fn effective_of(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .ok_or_else(|| anyhow::anyhow!("no CapEff in /proc/{pid}/status"))?;
    Ok(u64::from_str_radix(hex.trim(), 16)?)
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

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
const SECBIT_NOROOT: libc::c_ulong = 1 << 0;
const SECBIT_NOROOT_LOCKED: libc::c_ulong = 1 << 1;

fn check(rc: libc::c_long) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// In the child, before exec: what systemd does for the unit's settings.
fn restrict_to(keep: u64) -> io::Result<()> {
    // SAFETY (all calls): prctl and capget/capset with integer arguments or pointers to
    // valid, properly sized structures; async-signal-safe, as code after fork must be.
    unsafe {
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0).into())?;
        for cap in 0..=63u32 {
            if keep & (1 << cap) == 0
                && libc::prctl(libc::PR_CAPBSET_READ, cap as libc::c_ulong, 0, 0, 0) == 1
            {
                check(libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0).into())?;
            }
        }
        check(
            libc::prctl(
                libc::PR_SET_SECUREBITS,
                SECBIT_NOROOT | SECBIT_NOROOT_LOCKED,
                0,
                0,
                0,
            )
            .into(),
        )?;
        let mut header = Header {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        let mut data = [Data::default(); 2];
        check(libc::syscall(
            libc::SYS_capget,
            &mut header,
            data.as_mut_ptr(),
        ))?;
        data[0].inheritable = keep as u32;
        data[1].inheritable = (keep >> 32) as u32;
        check(libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()))?;
        for cap in (0..=63u32).filter(|c| keep & (1 << c) != 0) {
            check(
                libc::prctl(
                    libc::PR_CAP_AMBIENT,
                    libc::PR_CAP_AMBIENT_RAISE as libc::c_ulong,
                    cap as libc::c_ulong,
                    0,
                    0,
                )
                .into(),
            )?;
        }
    }
    Ok(())
}

/// Makes `cmd` run (as uid 0) with the capabilities `caps` only, as the agent's unit does.
pub fn restrict(cmd: &mut Command, caps: &[u32]) {
    let keep = mask(caps);
    // SAFETY: the closure makes only async-signal-safe system calls.
    unsafe { cmd.pre_exec(move || restrict_to(keep)) };
}
