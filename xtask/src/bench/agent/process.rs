//! Processes of the bench and their cost: CPU (per thread), peak RSS, over a measured window.

use std::{
    collections::BTreeMap,
    fs,
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, ExitStatus, Stdio},
    thread,
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context as _, bail};
use serde::Serialize;
use serde_json::Value;

use crate::cargo;

/// A child process that is stopped (SIGKILL) if still running when dropped.
pub(in crate::bench) struct Proc {
    pub(in crate::bench) name: String,
    pub(in crate::bench) child: Child,
    pub(in crate::bench) started: Instant,
}

impl Proc {
    /// Starts `cmd` with stdout and stderr to `<dir>/<name>.out` and `.err` (unless the
    /// caller set stdout).
    pub(in crate::bench) fn spawn(
        name: &str,
        cmd: &mut Command,
        dir: &Path,
        stdout: Option<Stdio>,
    ) -> anyhow::Result<Self> {
        let out = match stdout {
            Some(s) => s,
            None => fs::File::create(dir.join(format!("{name}.out")))?.into(),
        };
        let err = fs::File::create(dir.join(format!("{name}.err")))?;
        let child = cmd
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("failed to start {}", cargo::render(cmd)))?;
        Ok(Self {
            name: name.into(),
            child,
            started: Instant::now(),
        })
    }

    /// Starts `cmd` (an `agent_bench` subcommand) and waits for the JSON line with
    /// `"ready": true` it prints on stdout once it is set up; returns that line.
    pub(in crate::bench) fn spawn_ready(
        name: &str,
        cmd: &mut Command,
        dir: &Path,
    ) -> anyhow::Result<(Self, Value)> {
        let mut proc = Self::spawn(name, cmd, dir, Some(Stdio::piped()))?;
        let mut line = String::new();
        BufReader::new(proc.child.stdout.take().context("no stdout")?).read_line(&mut line)?;
        match serde_json::from_str::<Value>(&line) {
            Ok(ready) if ready["ready"] == true => Ok((proc, ready)),
            _ => bail!(
                "{name} did not start: {line:?} (see {})",
                dir.join(format!("{name}.err")).display()
            ),
        }
    }

    pub(in crate::bench) fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub(in crate::bench) fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends `signal`, waits up to `timeout`, then kills.
    pub(in crate::bench) fn stop(
        &mut self,
        signal: i32,
        timeout: Duration,
    ) -> anyhow::Result<ExitStatus> {
        if let Some(status) = self.child.try_wait()? {
            return Ok(status);
        }
        // SAFETY: signalling our own child, which has not been reaped (try_wait said so).
        unsafe { libc::kill(self.pid(), signal) };
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "    warning: {} did not stop within {timeout:?}; killing it",
            self.name
        );
        self.child.kill()?;
        Ok(self.child.wait()?)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub(in crate::bench) fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// CPU time of a process or thread, in clock ticks (for a process: all its threads, those
/// that exited included).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(in crate::bench) struct Ticks {
    pub(in crate::bench) user: u64,
    pub(in crate::bench) system: u64,
    pub(in crate::bench) threads: u64,
}

impl Ticks {
    pub(in crate::bench) fn total(self) -> u64 {
        self.user + self.system
    }
}

/// utime, stime and the thread count from the text of `/proc/<pid>/stat`.
pub(in crate::bench) fn parse_stat(stat: &str) -> Option<Ticks> {
    // The command name (field 2) is in parentheses and may hold spaces: fields after it.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(Ticks {
        user: fields.get(11)?.parse().ok()?,
        system: fields.get(12)?.parse().ok()?,
        threads: fields.get(17)?.parse().ok()?,
    })
}

pub(in crate::bench) fn cpu_ticks(pid: i32) -> anyhow::Result<Ticks> {
    let path = format!("/proc/{pid}/stat");
    let stat = fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    parse_stat(&stat).with_context(|| format!("{path}: unexpected contents"))
}

/// Per thread id, the name and the run time in ns (`/proc/<pid>/task/<tid>/schedstat`, first
/// field) of the process's threads now alive.
pub(in crate::bench) fn thread_run_ns(pid: i32) -> BTreeMap<u64, (String, u64)> {
    let mut out = BTreeMap::new();
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let dir = task.path();
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        let comm = fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let ns = fs::read_to_string(dir.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        out.insert(tid, (comm.trim().to_owned(), ns));
    }
    out
}

/// A counter of the `Udp:` lines of `/proc/net/snmp` (`RcvbufErrors`: datagrams dropped
/// because a socket's receive buffer was full).
pub(in crate::bench) fn udp_counter(name: &str) -> Option<u64> {
    let snmp = fs::read_to_string("/proc/net/snmp").ok()?;
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp: "));
    let (header, values) = (udp.next()?, udp.next()?);
    let i = header.split_whitespace().position(|h| h == name)?;
    values.split_whitespace().nth(i)?.parse().ok()
}

/// A `kB` field of `/proc/<pid>/status` (`VmHWM`, `VmRSS`).
pub(in crate::bench) fn status_kb(pid: i32, field: &str) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| {
        let rest = l.strip_prefix(field)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

pub(in crate::bench) fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// One process's cost over the measured window.
#[derive(Debug, Clone, Default)]
pub(in crate::bench) struct Cost {
    pub(in crate::bench) window_s: f64,
    pub(in crate::bench) cpu_s: f64,
    /// Of `cpu_s`, in the kernel (system calls: here mostly reading files).
    pub(in crate::bench) system_cpu_s: f64,
    /// Since the process started (start-up included).
    pub(in crate::bench) lifetime_s: f64,
    pub(in crate::bench) lifetime_cpu_s: f64,
    pub(in crate::bench) hwm_kb: u64,
    pub(in crate::bench) rss_kb: u64,
    pub(in crate::bench) threads: u64,
    /// Unix ns of the window's start and end.
    pub(in crate::bench) from_ns: u64,
    pub(in crate::bench) to_ns: u64,
    /// The window, on the monotonic clock.
    pub(in crate::bench) window: Option<(Instant, Instant)>,
    /// CPU seconds in the window per thread name (threads alive at its end).
    pub(in crate::bench) per_thread: BTreeMap<String, f64>,
}

impl Cost {
    pub(in crate::bench) fn cpu_pct(&self) -> f64 {
        100.0 * self.cpu_s / self.window_s.max(1e-9)
    }

    pub(in crate::bench) fn hwm_mb(&self) -> f64 {
        self.hwm_kb as f64 / 1024.0
    }

    pub(in crate::bench) fn json(&self) -> CostJson<'_> {
        CostJson {
            window_s: self.window_s,
            cpu_s: self.cpu_s,
            system_cpu_s: self.system_cpu_s,
            cpu_pct_of_one_core: self.cpu_pct(),
            lifetime_s: self.lifetime_s,
            lifetime_cpu_s: self.lifetime_cpu_s,
            peak_rss_kb: self.hwm_kb,
            rss_kb: self.rss_kb,
            threads: self.threads,
            cpu_s_per_thread: &self.per_thread,
        }
    }
}

/// A [`Cost`] in the report.
#[derive(Serialize)]
pub(in crate::bench) struct CostJson<'a> {
    pub(in crate::bench) window_s: f64,
    pub(in crate::bench) cpu_s: f64,
    pub(in crate::bench) system_cpu_s: f64,
    pub(in crate::bench) cpu_pct_of_one_core: f64,
    pub(in crate::bench) lifetime_s: f64,
    pub(in crate::bench) lifetime_cpu_s: f64,
    pub(in crate::bench) peak_rss_kb: u64,
    pub(in crate::bench) rss_kb: u64,
    pub(in crate::bench) threads: u64,
    pub(in crate::bench) cpu_s_per_thread: &'a BTreeMap<String, f64>,
}

/// Lets `proc` warm up, then measures its CPU over `duration`.
pub(in crate::bench) fn measure(
    proc: &mut Proc,
    warmup: Duration,
    duration: Duration,
) -> anyhow::Result<Cost> {
    thread::sleep(warmup.saturating_sub(proc.started.elapsed()));
    if !proc.alive() {
        bail!("{} exited during its warm-up", proc.name);
    }
    let tck = clock_ticks_per_second();
    let t0_ticks = cpu_ticks(proc.pid())?;
    let threads0 = thread_run_ns(proc.pid());
    let (t0, from_ns) = (Instant::now(), unix_ns());
    let end = t0 + duration;
    while Instant::now() < end {
        thread::sleep(
            Duration::from_millis(250).min(end.saturating_duration_since(Instant::now())),
        );
        if !proc.alive() {
            bail!("{} exited while it was measured", proc.name);
        }
    }
    let t1_ticks = cpu_ticks(proc.pid())?;
    let threads1 = thread_run_ns(proc.pid());
    let exited = threads0.keys().any(|tid| !threads1.contains_key(tid));
    let per_thread_ns = threads1.iter().fold(
        BTreeMap::<String, u64>::new(),
        |mut acc, (tid, (name, ns))| {
            let before = threads0.get(tid).map_or(0, |(_, ns)| *ns);
            *acc.entry(name.clone()).or_insert(0) += ns.saturating_sub(before);
            acc
        },
    );
    let window_s = t0.elapsed().as_secs_f64();
    let tick_cpu_s = (t1_ticks.total() - t0_ticks.total()) as f64 / tck;
    // The scheduler's run time of each thread, exact to the ns; clock ticks (10 ms) only when
    // a thread exited during the window (its run time would be missing).
    let cpu_s = if exited {
        tick_cpu_s
    } else {
        per_thread_ns.values().sum::<u64>() as f64 / 1e9
    };
    let per_thread = per_thread_ns
        .into_iter()
        .map(|(name, ns)| (name, ns as f64 / 1e9))
        .collect();
    Ok(Cost {
        window_s,
        cpu_s,
        system_cpu_s: (t1_ticks.system - t0_ticks.system) as f64 / tck,
        lifetime_s: proc.started.elapsed().as_secs_f64(),
        lifetime_cpu_s: t1_ticks.total() as f64 / tck,
        hwm_kb: status_kb(proc.pid(), "VmHWM").unwrap_or(0),
        rss_kb: status_kb(proc.pid(), "VmRSS").unwrap_or(0),
        threads: t1_ticks.threads,
        from_ns,
        to_ns: unix_ns(),
        window: Some((t0, Instant::now())),
        per_thread,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_proc_stat() {
        let stat = "4242 (rail scope) S 1 4242 4242 0 -1 4194560 900 0 0 0 731 129 0 0 20 0 5 0 \
                    12345 123456789 3000 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0";
        let t = parse_stat(stat).unwrap();
        assert_eq!((t.user, t.system, t.threads, t.total()), (731, 129, 5, 860));
        assert_eq!(parse_stat("garbage"), None);
    }
}
