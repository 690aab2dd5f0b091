//! bench-probes (on request; `cargo xtask bench probes` runs it): what each of railscope's eBPF
//! programs costs per event, next to a bpftrace program on the same hook in the same run.
//!
//! With `kernel.bpf_stats_enabled=1` the kernel counts, per program, how often it ran
//! (`run_cnt`) and the time spent in it (`run_time_ns`). The agent attaches its probes, then
//! bpftrace attaches one probe per hook the agent attached, each counting into a map keyed by
//! the cgroup (plus, where the agent's program also reads one field of the hook's argument or
//! record, that field): the same events reach both. Workloads: `ib_send_bw` and `ib_write_bw`
//! with fixed iteration counts, `rping -C` (one long connection, then many short ones for the
//! control path), and link flaps (the only thing that makes `ib_dispatch_event` fire). Then
//! `bpftool prog show --json` gives the statistics and `bpftool perf list --json` which hook
//! each bpftrace program is attached to.
//!
//! Output for xtask: one `BENCH {json}` line per program (tool, program, hook, ids, run_cnt,
//! run_time_ns), one `BENCH-INFO {json}` line (versions, workloads, bpftrace's failure if it
//! had one) and one `BENCH-COUNTS {json}` line (bpftrace's own map totals per hook, a check on
//! `run_cnt`).

use std::{
    collections::{BTreeMap, BTreeSet},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};
use serde_json::{Value, json};

use crate::guest::{self, ADDR_A, ADDR_B, Agent};

/// Messages per perftest run (each `ibv_post_send` is one `write()` doorbell on rxe, so one
/// `ib_uverbs_post_send` per message on the sending side).
const PERFTEST_ITERS: u32 = 10_000;
/// Message size of the perftest runs: small, so that the emulated link is not the limit.
const PERFTEST_SIZE: u32 = 4096;
/// rping round trips in the long rping run.
const RPING_COUNT: u32 = 50;
/// Short rping connections (one round trip each): the control path (contexts, PDs, MRs, CQs,
/// QPs created and destroyed, QP state changes, rdma_cm events) gets tens of events per hook.
const RPING_CONNECTIONS: u32 = 25;
/// Link flaps (each gives PORT_ERR and PORT_ACTIVE on both devices).
const LINK_FLAPS: u32 = 3;
/// Rounds of the workloads, each with a fresh agent and a fresh bpftrace, the two attached in
/// alternating order.
const ROUNDS: u32 = 8;

/// One hook railscope attaches a program to, and the bpftrace probe on the same hook.
struct Hook {
    /// The program's name in monitor-ebpf (what the agent logs as "<program> attached").
    program: &'static str,
    /// The hook, in bpftrace's probe syntax.
    probe: &'static str,
    /// The bpftrace action: a count into a per-hook map, keyed like the agent's counter.
    action: &'static str,
    /// Where bpftrace's program goes when it cannot use `probe` itself (bpftrace 0.17 cannot
    /// attach a raw tracepoint that a module defines): the same kernel event, another kind of
    /// program. `None`: `probe`.
    bpftrace_probe: Option<&'static str>,
}

const HOOKS: &[Hook] = &[
    Hook {
        program: "ib_dispatch_event",
        probe: "kprobe:ib_dispatch_event",
        // `event->event`: after the device pointer and the element union.
        action: "@ib_dispatch_event[cgroup, *(uint32 *)(arg0 + 16)] = count();",
        bpftrace_probe: None,
    },
    Hook {
        program: "rdma_restrack_add",
        probe: "kprobe:rdma_restrack_add",
        action: "@rdma_restrack_add[cgroup] = count();",
        bpftrace_probe: None,
    },
    Hook {
        program: "rdma_restrack_del",
        probe: "kprobe:rdma_restrack_del",
        action: "@rdma_restrack_del[cgroup] = count();",
        bpftrace_probe: None,
    },
    Hook {
        program: "ib_dealloc_pd_user",
        probe: "kprobe:ib_dealloc_pd_user",
        action: "@ib_dealloc_pd_user[cgroup] = count();",
        bpftrace_probe: None,
    },
    Hook {
        program: "ib_destroy_cq_user",
        probe: "kprobe:ib_destroy_cq_user",
        action: "@ib_destroy_cq_user[cgroup] = count();",
        bpftrace_probe: None,
    },
    Hook {
        program: "ib_destroy_qp_user",
        probe: "kprobe:ib_destroy_qp_user",
        action: "@ib_destroy_qp_user[cgroup] = count();",
        bpftrace_probe: None,
    },
    Hook {
        program: "ib_dereg_mr_user",
        probe: "kprobe:ib_dereg_mr_user",
        action: "@ib_dereg_mr_user[cgroup] = count();",
        bpftrace_probe: None,
    },
    Hook {
        program: "ib_destroy_srq_user",
        probe: "kprobe:ib_destroy_srq_user",
        action: "@ib_destroy_srq_user[cgroup] = count();",
        bpftrace_probe: None,
    },
    Hook {
        program: "ib_modify_qp_with_udata",
        probe: "kprobe:ib_modify_qp_with_udata",
        // `attr->qp_state`, the first field of `struct ib_qp_attr`.
        action: "@ib_modify_qp_with_udata[cgroup, *(uint32 *)arg1] = count();",
        bpftrace_probe: None,
    },
    Hook {
        program: "ib_mad_send_done_handler",
        probe: "tracepoint:ib_mad:ib_mad_send_done_handler",
        action: "@ib_mad_send_done_handler[cgroup, args->wc_status] = count();",
        bpftrace_probe: None,
    },
    Hook {
        program: "ib_mad_send_done_resend",
        probe: "tracepoint:ib_mad:ib_mad_send_done_resend",
        action: "@ib_mad_send_done_resend[cgroup] = count();",
        bpftrace_probe: None,
    },
    Hook {
        program: "ib_uverbs_post_send",
        probe: "kprobe:ib_uverbs_post_send",
        action: "@ib_uverbs_post_send[cgroup] = count();",
        bpftrace_probe: None,
    },
    Hook {
        program: "ib_uverbs_qp_event_handler",
        probe: "kprobe:ib_uverbs_qp_event_handler",
        action: "@ib_uverbs_qp_event_handler[cgroup] = count();",
        bpftrace_probe: None,
    },
    Hook {
        program: "ib_uverbs_cq_event_handler",
        probe: "kprobe:ib_uverbs_cq_event_handler",
        action: "@ib_uverbs_cq_event_handler[cgroup] = count();",
        bpftrace_probe: None,
    },
    Hook {
        program: "ib_uverbs_reg_dmabuf_mr",
        probe: "kprobe:ib_uverbs_handler_UVERBS_METHOD_REG_DMABUF_MR",
        action: "@ib_uverbs_reg_dmabuf_mr[cgroup] = count();",
        bpftrace_probe: None,
    },
    Hook {
        program: "cm_event_handler",
        // railscope's program is a raw tracepoint (it reads the cm id's handler). bpftrace 0.17
        // cannot attach a module's raw tracepoint, so its program is on the regular tracepoint
        // of the same event (which also formats the record: a cost bpftrace cannot avoid here).
        probe: "rawtracepoint:cm_event_handler",
        action: "@cm_event_handler[cgroup, args->event] = count();",
        bpftrace_probe: Some("tracepoint:rdma_cma:cm_event_handler"),
    },
];

const BPFTRACE: &str = "/usr/bin/bpftrace";
const BPFTOOL: &str = "/usr/bin/bpftool";
const SCRIPT: &str = "/tmp/bench-probes.bt";

pub(super) fn run() -> anyhow::Result<()> {
    super::ensure_rdma_modules()?;
    guest::ensure_rxe_pair()?;
    guest::write_sysctl("kernel.bpf_stats_enabled", "1")?;
    let gid = guest::ipv4_gid_index("rxe0")?.to_string();
    let mut hooks: Vec<&Hook> = Vec::new();
    let mut info = json!({
        "kernel": read_trimmed("/proc/sys/kernel/osrelease"),
        "kernel_version": read_trimmed("/proc/version"),
        "cpus": thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "bpf_stats_enabled": read_trimmed("/proc/sys/kernel/bpf_stats_enabled"),
        "bpf_jit_enable": read_trimmed("/proc/sys/net/core/bpf_jit_enable"),
        "bpftool_version": version_of(BPFTOOL, "--version"),
        "bpftrace_version": version_of(BPFTRACE, "--version"),
        "rounds": ROUNDS,
    });
    let mut bpftrace_error: Option<String> = None;
    let mut counts = BTreeMap::new();
    let mut rows = Vec::new();
    for round in 1..=ROUNDS {
        // Odd rounds attach railscope first, even rounds bpftrace: on a hook with two programs
        // the first one runs first, and may pay for cache misses the second one then avoids.
        let bpftrace_first = round % 2 == 0 && bpftrace_error.is_none();
        let first = if bpftrace_first {
            "bpftrace"
        } else {
            "railscope"
        };
        println!("bench: round {round} of {ROUNDS}, {first} attached first");
        let before = program_ids()?;
        let mut bpftrace = None;
        let mut start_bpftrace = |hooks: &[&Hook]| {
            if bpftrace_error.is_some() {
                return;
            }
            match Bpftrace::start(hooks) {
                Ok(b) => bpftrace = Some(b),
                Err(e) => {
                    println!("bench: bpftrace did not start: {e:#}");
                    bpftrace_error = Some(format!("{e:#}"));
                }
            }
        };
        if bpftrace_first {
            start_bpftrace(&hooks);
        }
        let before_agent = program_ids()?;
        let mut agent = start_agent()?;
        let agents: BTreeSet<u64> = program_ids()?.difference(&before_agent).copied().collect();
        if round == 1 {
            hooks = attached_hooks(&agent);
            info["bpftrace_script"] = script(&hooks).into();
        }
        if !bpftrace_first {
            start_bpftrace(&hooks);
        }

        let workloads = vec![
            perftest("ib_send_bw", &gid)?,
            perftest("ib_write_bw", &gid)?,
            rping(RPING_COUNT, 1)?,
            rping(1, RPING_CONNECTIONS)?,
            link_flaps(LINK_FLAPS)?,
        ];
        info["workloads"] = workloads.into();
        thread::sleep(Duration::from_secs(1));

        let progs = programs()?;
        let theirs: BTreeSet<u64> = progs
            .iter()
            .filter_map(|p| p["id"].as_u64())
            .filter(|id| !before.contains(id) && !agents.contains(id))
            .collect();
        let perf = guest::run(BPFTOOL, &["perf", "list", "--json"])
            .ok()
            .and_then(|s| serde_json::from_str::<Value>(&s).ok())
            .unwrap_or(Value::Null);
        for mut row in program_rows(&progs, &perf, &hooks, &agents, &theirs) {
            row["round"] = round.into();
            row["first"] = first.into();
            println!("BENCH {row}");
            rows.push(row);
        }
        if let Some(b) = &mut bpftrace
            && let Some(error) = b.exited()
        {
            bpftrace_error = Some(error);
        }
        if let Some(b) = bpftrace.take() {
            for (map, n) in b.stop()? {
                *counts.entry(map).or_insert(0) += n;
            }
        }
        ensure!(agent.is_running(), "the agent died during round {round}");
        agent.stop()?;
    }
    guest::write_sysctl("kernel.bpf_stats_enabled", "0")?;
    if let Some(e) = &bpftrace_error {
        info["bpftrace_error"] = e.as_str().into();
    }
    println!("BENCH-INFO {info}");
    println!("BENCH-COUNTS {}", json!(counts));

    let ran = |tool: &str| {
        rows.iter()
            .any(|r| r["tool"] == tool && r["run_cnt"].as_u64() > Some(0))
    };
    ensure!(ran("railscope"), "no railscope program ran");
    if let Some(error) = bpftrace_error {
        bail!("bpftrace: {error}");
    }
    ensure!(ran("bpftrace"), "no bpftrace program ran");
    Ok(())
}

/// `railscope agent --json --counters 5`, once its families have attached.
fn start_agent() -> anyhow::Result<Agent> {
    let agent = Agent::start(&["--json", "--counters", "5"])?;
    for program in [
        "ib_dispatch_event",
        "ib_uverbs_post_send",
        "cm_event_handler",
    ] {
        agent.wait_for_log(&format!("{program} attached"), Duration::from_secs(30))?;
    }
    thread::sleep(Duration::from_secs(1));
    Ok(agent)
}

/// The hooks whose programs the agent reports attached.
fn attached_hooks(agent: &Agent) -> Vec<&'static Hook> {
    let logs = agent.stderr_lines();
    let hooks: Vec<&Hook> = HOOKS
        .iter()
        .filter(|h| {
            let needle = format!(" {} attached", h.program);
            logs.iter().any(|l| l.ends_with(&needle))
        })
        .collect();
    println!(
        "bench: the agent attached {} of {} hooks: {}",
        hooks.len(),
        HOOKS.len(),
        hooks
            .iter()
            .map(|h| h.program)
            .collect::<Vec<_>>()
            .join(" ")
    );
    hooks
}

/// The bpftrace script: one probe per hook, with its action.
fn script(hooks: &[&Hook]) -> String {
    hooks
        .iter()
        .map(|h| {
            format!(
                "{} {{ {} }}\n",
                h.bpftrace_probe.unwrap_or(h.probe),
                h.action
            )
        })
        .collect()
}

/// bpftrace running the script, its output collected.
struct Bpftrace {
    child: Child,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Bpftrace {
    fn start(hooks: &[&Hook]) -> anyhow::Result<Self> {
        std::fs::write(SCRIPT, script(hooks))?;
        println!("+ {BPFTRACE} {SCRIPT}");
        let started = Instant::now();
        let mut child = Command::new(BPFTRACE)
            .arg(SCRIPT)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting bpftrace")?;
        let stdout = guest::collect(child.stdout.take().expect("piped"), "bpftrace> ");
        let stderr = guest::collect(child.stderr.take().expect("piped"), "bpftrace! ");
        let mut b = Self {
            child,
            stdout,
            stderr,
        };
        // LLVM compiles the script first: slow under emulation.
        let deadline = Duration::from_secs(300);
        while started.elapsed() < deadline {
            if let Some(error) = b.exited() {
                bail!("{error}");
            }
            if b.lines().iter().any(|l| l.starts_with("Attaching ")) {
                // "Attaching N probes..." comes before the attachment itself.
                thread::sleep(Duration::from_secs(3));
                if let Some(error) = b.exited() {
                    bail!("{error}");
                }
                println!(
                    "bench: bpftrace attached in {:.1} s",
                    started.elapsed().as_secs_f64()
                );
                return Ok(b);
            }
            thread::sleep(Duration::from_millis(200));
        }
        b.kill();
        bail!("bpftrace did not attach within {deadline:?}")
    }

    fn lines(&self) -> Vec<String> {
        let mut all = self.stdout.lock().expect("no poison").clone();
        all.extend(self.stderr.lock().expect("no poison").iter().cloned());
        all
    }

    /// Why bpftrace stopped, if it did: its exit status and its last error lines.
    fn exited(&mut self) -> Option<String> {
        let status = self.child.try_wait().ok()??;
        thread::sleep(Duration::from_millis(200));
        let stderr = self.stderr.lock().expect("no poison").clone();
        let tail: Vec<&str> = stderr
            .iter()
            .rev()
            .take(8)
            .rev()
            .map(String::as_str)
            .collect();
        Some(format!("bpftrace exited ({status}): {}", tail.join(" | ")))
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Stops bpftrace with SIGINT; returns the totals of its maps (it prints them on exit).
    fn stop(mut self) -> anyhow::Result<BTreeMap<String, u64>> {
        // SAFETY: kill with a pid we own.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(60) {
            if self.child.try_wait()?.is_some() {
                thread::sleep(Duration::from_millis(300));
                return Ok(map_totals(&self.stdout.lock().expect("no poison")));
            }
            thread::sleep(Duration::from_millis(100));
        }
        self.kill();
        bail!("bpftrace did not exit within 60 s of SIGINT")
    }
}

/// Sums of bpftrace's printed maps: `@name[key]: 12` lines, by map name.
fn map_totals(lines: &[String]) -> BTreeMap<String, u64> {
    let mut totals = BTreeMap::new();
    for line in lines {
        let Some(rest) = line.strip_prefix('@') else {
            continue;
        };
        let Some((name_key, value)) = rest.rsplit_once(':') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<u64>() else {
            continue;
        };
        let name = name_key.split('[').next().unwrap_or(name_key);
        *totals.entry(name.to_owned()).or_insert(0) += value;
    }
    totals
}

/// The ids of the programs loaded now.
fn program_ids() -> anyhow::Result<BTreeSet<u64>> {
    Ok(programs()?
        .iter()
        .filter_map(|p| p["id"].as_u64())
        .collect())
}

/// `bpftool prog show --json`.
fn programs() -> anyhow::Result<Vec<Value>> {
    let out = Command::new(BPFTOOL)
        .args(["prog", "show", "--json"])
        .output()
        .context("starting bpftool")?;
    ensure!(
        out.status.success(),
        "bpftool prog show failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).context("bpftool's JSON")?;
    Ok(v.as_array().cloned().unwrap_or_default())
}

/// One row per (tool, program): railscope's programs by name among those the agent loaded
/// (it loads one instance of the object per family: rows add them up), bpftrace's among those
/// it loaded, each with its hook from `bpftool perf list`.
fn program_rows(
    progs: &[Value],
    perf: &Value,
    hooks: &[&Hook],
    ours: &BTreeSet<u64>,
    theirs: &BTreeSet<u64>,
) -> Vec<Value> {
    let perf_hook: BTreeMap<u64, String> = perf
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            let id = p["prog_id"].as_u64()?;
            let hook = match p["fd_type"].as_str()? {
                "kprobe" => format!("kprobe:{}", p["func"].as_str()?),
                "tracepoint" => {
                    let event = p["tracepoint"].as_str()?;
                    hooks
                        .iter()
                        .map(|h| h.probe)
                        .find(|probe| probe.ends_with(&format!(":{event}")))
                        .map_or_else(|| format!("tracepoint:{event}"), str::to_owned)
                }
                "raw_tracepoint" => format!("rawtracepoint:{}", p["tracepoint"].as_str()?),
                _ => return None,
            };
            Some((id, hook))
        })
        .collect();
    // (tool, hook, program) -> (program ids, run_cnt, run_time_ns)
    type Sums = BTreeMap<(String, String, String), (Vec<u64>, u64, u64)>;
    let mut sums = Sums::new();
    for p in progs {
        let Some(id) = p["id"].as_u64() else { continue };
        let name = p["name"].as_str().unwrap_or_default();
        let (tool, program, hook) = if ours.contains(&id) {
            // The kernel keeps 15 characters of a name; bpftool shows the full one from BTF.
            let Some(h) = hooks.iter().find(|h| h.program == name).or_else(|| {
                hooks
                    .iter()
                    .find(|h| name.len() == 15 && h.program.starts_with(name))
            }) else {
                continue;
            };
            ("railscope", h.program.to_owned(), h.probe.to_owned())
        } else if theirs.contains(&id) {
            let hook = perf_hook
                .get(&id)
                .cloned()
                .unwrap_or_else(|| format!("unknown (program {name})"));
            ("bpftrace", name.to_owned(), hook)
        } else {
            continue;
        };
        let e = sums
            .entry((tool.to_owned(), hook, program))
            .or_insert((Vec::new(), 0, 0));
        e.0.push(id);
        e.1 += p["run_cnt"].as_u64().unwrap_or(0);
        e.2 += p["run_time_ns"].as_u64().unwrap_or(0);
    }
    sums.into_iter()
        .map(|((tool, hook, program), (ids, run_cnt, run_time_ns))| {
            json!({
                "tool": tool,
                "program": program,
                "hook": hook,
                "ids": ids,
                "run_cnt": run_cnt,
                "run_time_ns": run_time_ns,
            })
        })
        .collect()
}

/// Runs `tool` (ib_send_bw or ib_write_bw) from rxe0 to rxe1 for [`PERFTEST_ITERS`] messages.
fn perftest(tool: &str, gid: &str) -> anyhow::Result<Value> {
    let path = format!("/usr/bin/{tool}");
    let iters = PERFTEST_ITERS.to_string();
    let size = PERFTEST_SIZE.to_string();
    let common = ["-x", gid, "-F", "-n", &iters, "-s", &size, "--report_gbits"];
    let started = Instant::now();
    let mut server = Command::new(&path);
    server.args(["-d", "rxe1"]).args(common);
    let server = guest::spawn_output(server)?;
    thread::sleep(Duration::from_secs(1));
    let mut client_args = vec!["-d", "rxe0"];
    client_args.extend(common);
    client_args.push(ADDR_B);
    guest::run(&path, &client_args).with_context(|| format!("{tool} client"))?;
    guest::check_output(&format!("{tool} server"), server.join().expect("no panic"))?;
    Ok(json!({
        "command": format!("{tool} {}", client_args.join(" ")),
        "repeat": 1,
        "seconds": started.elapsed().as_secs_f64(),
    }))
}

/// `times` rping connections between the two devices, of `count` round trips each.
fn rping(count: u32, times: u32) -> anyhow::Result<Value> {
    let count = count.to_string();
    let client = ["-c", "-I", ADDR_A, "-a", ADDR_B, "-C", &count, "-p", "7481"];
    let started = Instant::now();
    for _ in 0..times {
        let mut server = Command::new("/usr/bin/rping");
        server.args(["-s", "-a", ADDR_B, "-C", &count, "-p", "7481"]);
        let server = guest::spawn_output(server)?;
        // The server listens once rdma_cm has its id bound: wait for it rather than guess (a
        // client that came too early exited with 255), then allow a refused connect or two
        // (the server is still waiting for its one connection).
        guest::wait_for(
            Duration::from_secs(10),
            "the rping server to listen",
            || rdma_cm_listening("7481"),
        )?;
        let mut attempt = 1;
        while let Err(e) = guest::run("/usr/bin/rping", &client) {
            if attempt == 3 {
                return Err(e.context("rping client, 3 attempts"));
            }
            attempt += 1;
            thread::sleep(Duration::from_millis(300));
        }
        guest::check_output("rping server", server.join().expect("no panic"))?;
    }
    Ok(json!({
        "command": format!("rping {}", client.join(" ")),
        "repeat": times,
        "seconds": started.elapsed().as_secs_f64(),
    }))
}

/// Whether an rdma_cm id listens on `port` (`rdma resource show cm_id`).
fn rdma_cm_listening(port: &str) -> bool {
    Command::new("/usr/bin/rdma")
        .args(["resource", "show", "cm_id"])
        .output()
        .is_ok_and(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l.contains("LISTEN") && l.contains(&format!(":{port} ")))
        })
}

/// `times` down/up of vethA: port events on both devices (`ib_dispatch_event`).
fn link_flaps(times: u32) -> anyhow::Result<Value> {
    let started = Instant::now();
    for _ in 0..times {
        guest::run("/usr/bin/ip", &["link", "set", "vethA", "down"])?;
        guest::wait_for(Duration::from_secs(10), "rxe0 port 1 DOWN", || {
            guest::port_state("rxe0").contains("DOWN")
        })?;
        guest::run("/usr/bin/ip", &["link", "set", "vethA", "up"])?;
        guest::wait_for(Duration::from_secs(10), "rxe0 port 1 ACTIVE", || {
            guest::port_state("rxe0").contains("ACTIVE")
        })?;
        thread::sleep(Duration::from_millis(500));
    }
    Ok(json!({
        "command": "ip link set vethA down; ip link set vethA up",
        "repeat": times,
        "seconds": started.elapsed().as_secs_f64(),
    }))
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// The first line `program flag` prints, or why there is none.
fn version_of(program: &str, flag: &str) -> String {
    match Command::new(program).arg(flag).output() {
        Ok(out) => String::from_utf8_lossy(&out.stdout)
            .lines()
            .chain(String::from_utf8_lossy(&out.stderr).lines())
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned(),
        Err(e) => format!("cannot run {program}: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bpftrace_map_totals() {
        let lines = [
            "Attaching 3 probes...",
            "",
            "@ib_uverbs_post_send[1]: 10",
            "@ib_uverbs_post_send[4242]: 5000",
            "@ib_modify_qp_with_udata[1, 3]: 2",
            "@cm_event_handler[1, 9]: 1",
        ]
        .map(String::from);
        let t = map_totals(&lines);
        assert_eq!(t["ib_uverbs_post_send"], 5010);
        assert_eq!(t["ib_modify_qp_with_udata"], 2);
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn rows_split_tools_and_sum_instances() {
        let hooks: Vec<&Hook> = HOOKS.iter().collect();
        let progs: Vec<Value> = serde_json::from_str(
            r#"[{"id":10,"name":"ib_uverbs_post_send","run_cnt":100,"run_time_ns":5000},
                {"id":11,"name":"ib_uverbs_post_send"},
                {"id":12,"name":"ib_modify_qp_wi","run_cnt":4,"run_time_ns":400},
                {"id":20,"name":"kprobe_ib_uverb","run_cnt":100,"run_time_ns":4000},
                {"id":21,"name":"tracepoint_rdma","run_cnt":3,"run_time_ns":300}]"#,
        )
        .unwrap();
        let perf: Value = serde_json::from_str(
            r#"[{"pid":7,"fd":3,"prog_id":20,"fd_type":"kprobe","func":"ib_uverbs_post_send","offset":0},
                {"pid":7,"fd":4,"prog_id":21,"fd_type":"tracepoint","tracepoint":"cm_event_handler"}]"#,
        )
        .unwrap();
        let ours = BTreeSet::from([10, 11, 12]);
        let theirs = BTreeSet::from([20, 21]);
        let rows = program_rows(&progs, &perf, &hooks, &ours, &theirs);
        let find = |tool: &str, hook: &str| {
            rows.iter()
                .find(|r| r["tool"] == tool && r["hook"] == hook)
                .unwrap_or_else(|| panic!("no {tool} row for {hook}: {rows:?}"))
        };
        let ours = find("railscope", "kprobe:ib_uverbs_post_send");
        assert_eq!(ours["run_cnt"], 100);
        assert_eq!(ours["ids"], json!([10, 11]));
        assert_eq!(
            find("railscope", "kprobe:ib_modify_qp_with_udata")["program"],
            "ib_modify_qp_with_udata"
        );
        assert_eq!(
            find("bpftrace", "kprobe:ib_uverbs_post_send")["run_time_ns"],
            4000
        );
        assert_eq!(
            find("bpftrace", "rawtracepoint:cm_event_handler")["run_cnt"],
            3
        );
    }

    #[test]
    fn script_has_one_probe_per_hook() {
        let s = script(&HOOKS.iter().collect::<Vec<_>>());
        assert_eq!(s.lines().count(), HOOKS.len());
        assert!(s.contains(
            "tracepoint:rdma_cma:cm_event_handler { @cm_event_handler[cgroup, args->event] = count(); }"
        ));
    }
}
