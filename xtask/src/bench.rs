//! `cargo xtask bench <target>`: benchmarks whose results are kept in the repository, under
//! `bench/results/`, each with the command that produced it.
//!
//! - `probes`: the CPU cost per event of railscope's eBPF programs, measured by the kernel
//!   (`kernel.bpf_stats_enabled=1`: `run_cnt` and `run_time_ns` per program) in the soft-RoCE
//!   guest under `ib_send_bw`, `ib_write_bw`, `rping` and a link flap, next to bpftrace programs
//!   on the same hooks in the same run (the guest scenario `bench-probes` does the measuring;
//!   this command builds a guest image with bpftrace, boots it, and writes
//!   `bench/results/probes.md` and `probes.json` from the guest's `BENCH` lines).
//!   Goals: per hook, railscope's ns/event no more than bpftrace's, and at most 100 ns.
//! - `agent`: the node agent on a fixture node (8 GPUs of the NVML stand-in, 8 mlx5-like HCA
//!   ports whose counters move) on this host: bytes per sample against Prometheus text and
//!   remote-write, CPU and peak RSS at a 1 s and a 100 ms interval next to
//!   prometheus-node-exporter reading the same tree, and adaptive sampling on workload-shaped
//!   traces; writes `bench/results/agent.md` and `agent.json` (module [`agent`]).
//! - `delivery`: what acknowledged delivery costs: acknowledgement bytes against frame bytes,
//!   the agent's memory through a 10-minute collector outage, the time until its backlog is
//!   archived, and a fleet's backlog at one collector; writes `bench/results/delivery.md`
//!   and `delivery.json` (module [`delivery`]).
//! - `fleet`: one collector under a simulated fleet (12,500 nodes by default) sending what
//!   agents send, in real time, with faults injected: CPU per sample, RSS per node, the
//!   findings tick and straggler search, the time from each fault to its finding or
//!   straggler, and the read path next to VictoriaMetrics fed by the collector's own
//!   remote-write in the same run; writes `bench/results/fleet.md` and `fleet.json` (module
//!   [`fleet`]).
//! - `events`: how late IB port events reach the collector over a few hundred link flaps in
//!   the guest (kernel timestamp to frame sent, and to `railscope listen` printing it);
//!   writes `bench/results/events.md` and `events.json` (module [`events`]).

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use anyhow::bail;
use serde::Serialize;
use serde_json::Value;

use crate::{
    build, cargo,
    setup::{self, Tools},
    testbed::{self, Accel, ExtraDebs, GuestFile, ImageSpec, KernelLine},
    vm_test,
};

mod agent;
mod collector;
mod delivery;
mod events;
mod fleet;
mod node_keys;

/// The NVML stand-in library (also what `cargo xtask run --demo` puts in its guest).
pub(crate) use agent::build_standin;

/// `--duration` by default: seconds each process of `bench agent` is measured.
const DEFAULT_DURATION: u64 = 60;

#[derive(Debug, clap::Args)]
pub(crate) struct Options {
    /// What to benchmark.
    #[arg(value_enum)]
    pub target: Target,
    /// The kernel line the guest boots.
    #[arg(long, value_enum, default_value_t = KernelLine::Bookworm)]
    pub kernel: KernelLine,
    /// Kill a guest that has not powered off after this many seconds.
    #[arg(long, default_value_t = 900)]
    pub timeout: u64,
    /// Virtual CPUs of the guest. One by default: under TCG a second vCPU thread competes
    /// with the host for its two cores and makes the per-event times noisier.
    #[arg(long, default_value_t = 1)]
    pub smp: u32,
    /// `agent`: seconds each process (railscope agent, node_exporter) is measured, after a
    /// 5 s warm-up.
    #[arg(long, default_value_t = DEFAULT_DURATION)]
    pub duration: u64,
    #[command(flatten)]
    pub collector: collector::CollectorOptions,
    #[command(flatten)]
    pub delivery: delivery::DeliveryOptions,
    #[command(flatten)]
    pub fleet: fleet::FleetOptions,
    #[command(flatten)]
    pub setup: setup::Options,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Target {
    /// Per-event cost of the eBPF probes next to bpftrace on the same hooks (QEMU guest).
    Probes,
    /// The node agent: bytes per sample, CPU and memory next to node_exporter, adaptive
    /// sampling (on this host).
    Agent,
    /// How late port events reach the collector, over a few hundred link flaps (QEMU guest).
    Events,
    /// The collector under simulated agents on loopback, next to VictoriaMetrics (on this
    /// host).
    Collector,
    /// What per-node keys cost the collector's ingest next to one shared key, and floods of
    /// refused datagrams (callgrind, on this host; `--nodes` simulated nodes).
    NodeKeys,
    /// What acknowledged delivery costs: acknowledgement bytes, the agent's memory through a
    /// collector outage, the backlog's time, a fleet's backlog at one collector (on this host).
    Delivery,
    /// One collector under a simulated fleet of real agents' frames with faults injected:
    /// CPU, memory, time to detect, the read path next to VictoriaMetrics (on this host).
    Fleet,
}

/// The guest scenario that measures the probes.
const SCENARIO: &str = "bench-probes";

/// The goal: nanoseconds per event, at most.
const GOAL_NS: f64 = 100.0;

/// bpftrace and the Debian packages of the libraries it links against: LLVM 14, clang 14, bcc,
/// libdw, z3, ICU, libxml2, libedit, libffi (about 60 MB of debs, 200 MB unpacked).
const BPFTRACE: ExtraDebs = ExtraDebs {
    name: "bench-bpftrace",
    packages: &[
        "bpftrace",
        "libbpfcc",
        "libclang1-14",
        "libllvm14",
        "libdw1",
        "libz3-4",
        "libedit2",
        "libxml2",
        "libicu72",
        "libffi8",
    ],
    tools: &["bpftrace"],
};

pub(crate) fn run(options: &Options) -> anyhow::Result<()> {
    setup::require_root(match options.target {
        Target::Probes => "building the guest image",
        Target::Agent => "running the agent (it loads eBPF probes)",
        Target::Events => "building the guest image",
        Target::Collector => "installing VictoriaMetrics (setup)",
        Target::NodeKeys => "installing valgrind",
        Target::Delivery => "running the agent (it loads eBPF probes)",
        Target::Fleet => "installing VictoriaMetrics (setup)",
    })?;
    let tools = setup::run(&options.setup)?;
    match options.target {
        Target::Probes => probes(&tools, options),
        Target::Agent => agent::run(&tools, options),
        Target::Events => events::run(&tools, options),
        Target::Collector => collector::run(&tools, options),
        Target::NodeKeys => node_keys::run(&tools, options.collector.nodes()),
        Target::Delivery => delivery::run(&tools, options),
        Target::Fleet => fleet::run(&tools, options),
    }
}

fn probes(tools: &Tools, options: &Options) -> anyhow::Result<()> {
    let started = Instant::now();
    let work_dir = bench_work_dir("bench", options);
    // The initramfs unpacks into RAM: bpftrace's libraries alone are ~200 MB.
    let (image, outcome, serial_log) =
        boot_bench_scenario(tools, options, &work_dir, SCENARIO, Some(&BPFTRACE), "2G")?;
    std::fs::write(
        work_dir.join(format!("{SCENARIO}.log")),
        vm_test::scenario_section(&outcome.log, SCENARIO),
    )?;
    let verdict = vm_test::scenario_result(&outcome.log, SCENARIO, outcome.timed_out);
    let guest = GuestOutput::parse(&outcome.log);
    if guest.rows.is_empty() {
        bail!(
            "the guest reported no measurements ({}); see {}",
            verdict.err().unwrap_or_else(|| "no error given".into()),
            serial_log.display()
        );
    }
    // A run that stopped part-way measured fewer rounds, one attach order more than the
    // other: keep the last complete report rather than replace it with that.
    if let Err(e) = &verdict {
        bail!(
            "the guest's bench scenario failed ({e}); {} is left as it was; see {}",
            results_path(options.target).display(),
            serial_log.display()
        );
    }
    let run = Run {
        date: utc_now(),
        kernel_release: image.kernel_release.clone(),
        accel: outcome.accel,
        host_cpu: host_cpu(),
        guest_seconds: outcome.wall.as_secs_f64(),
        scenario_error: verdict.err(),
    };
    let comparisons = compare(&guest.rows);
    let md_path = cargo::workspace_root().join(results_path(options.target));
    let json_path = md_path.with_extension("json");
    if let Some(dir) = md_path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&md_path, markdown(&run, &guest, &comparisons))?;
    std::fs::write(&json_path, raw_json(&run, &guest, &comparisons)?)?;
    print_summary(&comparisons);
    setup::step(&format!(
        "wrote {} and {} in {:.0?}",
        md_path.display(),
        json_path.display(),
        started.elapsed()
    ));
    if let Some(e) = &run.scenario_error {
        eprintln!("    note: the guest scenario reported: {e}");
    }
    Ok(())
}

/// What the guest printed: `BENCH`, `BENCH-INFO` and `BENCH-COUNTS` lines.
#[derive(Debug, Default)]
struct GuestOutput {
    rows: Vec<ProgramRow>,
    info: Value,
    bpftrace_counts: BTreeMap<String, u64>,
}

/// One program's statistics (summed over its loaded instances).
#[derive(Debug, Clone, PartialEq)]
struct ProgramRow {
    tool: String,
    program: String,
    hook: String,
    ids: Vec<u64>,
    run_cnt: u64,
    run_time_ns: u64,
    /// The round of the guest's run (1, 2, ...; 0 for a total over rounds).
    round: u64,
    /// Which tool attached first in that round.
    first: String,
}

impl ProgramRow {
    fn from_json(v: &Value) -> Option<Self> {
        Some(Self {
            tool: v["tool"].as_str()?.to_owned(),
            program: v["program"].as_str()?.to_owned(),
            hook: v["hook"].as_str()?.to_owned(),
            ids: v["ids"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_u64).collect())
                .unwrap_or_default(),
            run_cnt: v["run_cnt"].as_u64()?,
            run_time_ns: v["run_time_ns"].as_u64()?,
            round: v["round"].as_u64().unwrap_or(1),
            first: v["first"].as_str().unwrap_or("railscope").to_owned(),
        })
    }

    fn ns_per_event(&self) -> Option<f64> {
        (self.run_cnt > 0).then(|| self.run_time_ns as f64 / self.run_cnt as f64)
    }
}

impl GuestOutput {
    fn parse(log: &str) -> Self {
        let mut out = Self::default();
        for line in log.lines() {
            let (tag, rest) = line.split_once(' ').unwrap_or((line, ""));
            let parsed = || serde_json::from_str::<Value>(rest.trim());
            match tag {
                "BENCH" => match parsed().ok().as_ref().and_then(ProgramRow::from_json) {
                    Some(row) => out.rows.push(row),
                    None => eprintln!("    warning: unreadable guest line: {line}"),
                },
                "BENCH-INFO" => out.info = parsed().unwrap_or(Value::Null),
                "BENCH-COUNTS" => {
                    if let Ok(Value::Object(m)) = parsed() {
                        out.bpftrace_counts = m
                            .into_iter()
                            .filter_map(|(k, v)| Some((k, v.as_u64()?)))
                            .collect();
                    }
                }
                _ => {}
            }
        }
        out
    }
}

/// railscope's program on a hook next to bpftrace's on the same hook.
#[derive(Debug)]
struct Comparison {
    hook: String,
    /// Totals over the rounds.
    ours: ProgramRow,
    theirs: Option<ProgramRow>,
    /// Per round: (round, which tool attached first, railscope's ns/event over bpftrace's).
    rounds: Vec<(u64, String, Option<f64>)>,
}

/// How one hook fares against one goal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    Pass,
    Fail,
    /// No railscope events on the hook, or nothing to compare with.
    NotJudged,
}

impl Check {
    fn of(holds: Option<bool>) -> Self {
        match holds {
            Some(true) => Check::Pass,
            Some(false) => Check::Fail,
            None => Check::NotJudged,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Check::Pass => "PASS",
            Check::Fail => "FAIL",
            Check::NotJudged => "–",
        }
    }
}

/// `true`, `false`, or `null` when not judged.
impl Serialize for Check {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Check::Pass => s.serialize_bool(true),
            Check::Fail => s.serialize_bool(false),
            Check::NotJudged => s.serialize_none(),
        }
    }
}

impl Comparison {
    /// railscope's ns/event over bpftrace's.
    fn ratio(&self) -> Option<f64> {
        Some(self.ours.ns_per_event()? / self.theirs.as_ref()?.ns_per_event()?)
    }

    /// Goal 1: railscope's cost per event no more than bpftrace's on the same hook.
    fn vs_bpftrace(&self) -> Check {
        Check::of(self.ratio().map(|r| r <= 1.0))
    }

    /// Goal 2: at most [`GOAL_NS`] per event.
    fn vs_goal_ns(&self) -> Check {
        Check::of(self.ours.ns_per_event().map(|ns| ns <= GOAL_NS))
    }

    fn has_events(&self) -> bool {
        self.ours.run_cnt > 0
    }
}

/// One comparison per hook railscope measured (sorted by hook), from totals over the rounds.
fn compare(rows: &[ProgramRow]) -> Vec<Comparison> {
    let ratio = |ours: &ProgramRow, theirs: Option<&ProgramRow>| {
        Some(ours.ns_per_event()? / theirs?.ns_per_event()?)
    };
    let mut totals: BTreeMap<(String, String), ProgramRow> = BTreeMap::new();
    for r in rows {
        let t = totals
            .entry((r.hook.clone(), r.tool.clone()))
            .or_insert_with(|| ProgramRow {
                ids: Vec::new(),
                run_cnt: 0,
                run_time_ns: 0,
                round: 0,
                first: String::new(),
                ..r.clone()
            });
        t.ids.extend(&r.ids);
        t.run_cnt += r.run_cnt;
        t.run_time_ns += r.run_time_ns;
    }
    totals
        .iter()
        .filter(|((_, tool), _)| tool == "railscope")
        .map(|((hook, _), ours)| {
            let rounds = rows
                .iter()
                .filter(|r| r.tool == "railscope" && &r.hook == hook)
                .map(|o| {
                    let t = rows
                        .iter()
                        .find(|t| t.tool == "bpftrace" && &t.hook == hook && t.round == o.round);
                    (o.round, o.first.clone(), ratio(o, t))
                })
                .collect();
            Comparison {
                hook: hook.clone(),
                ours: ours.clone(),
                theirs: totals.get(&(hook.clone(), "bpftrace".into())).cloned(),
                rounds,
            }
        })
        .collect()
}

/// Facts of the run beside the guest's.
#[derive(Debug)]
struct Run {
    date: String,
    kernel_release: String,
    accel: Accel,
    host_cpu: String,
    guest_seconds: f64,
    scenario_error: Option<String>,
}

const COMMAND: &str = "cargo xtask bench probes";

fn fmt_ns(v: Option<f64>) -> String {
    v.map_or_else(|| "–".into(), |v| format!("{v:.0}"))
}

fn markdown(run: &Run, guest: &GuestOutput, comparisons: &[Comparison]) -> String {
    let info = &guest.info;
    let s = |v: &Value| v.as_str().unwrap_or("?").to_owned();
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Probe overhead: railscope vs bpftrace on the same hooks\n"
    );
    let _ = writeln!(
        md,
        "Produced by `{COMMAND}` (run as root) on {}.\n",
        run.date
    );
    let _ = writeln!(md, "| | |\n|---|---|");
    let _ = writeln!(
        md,
        "| guest kernel | {} (`{}`) |",
        run.kernel_release,
        s(&info["kernel_version"])
    );
    let accel_note = match run.accel {
        Accel::Tcg => {
            "**TCG** (QEMU emulates the CPU; KVM is not usable for a stock kernel here), \
             so every nanosecond here is inflated many times over what the same program costs on \
             hardware; the ratio between the two tools, measured in the same run on the same \
             events, is the meaningful figure"
        }
        Accel::Kvm => "**KVM**: hardware virtualisation, figures close to bare metal",
    };
    let _ = writeln!(md, "| accelerator | {accel_note} |");
    let _ = writeln!(md, "| host CPU | {} |", run.host_cpu);
    let _ = writeln!(
        md,
        "| guest | {} vCPU(s), 2 GiB; BPF JIT `{}` |",
        info["cpus"],
        s(&info["bpf_jit_enable"])
    );
    let _ = writeln!(md, "| bpftrace | {} |", s(&info["bpftrace_version"]));
    let _ = writeln!(md, "| bpftool | {} |", s(&info["bpftool_version"]));
    let _ = writeln!(
        md,
        "| guest boot to power-off | {:.0} s |",
        run.guest_seconds
    );
    let _ = writeln!(
        md,
        "| goal | per hook, railscope's ns/event ≤ bpftrace's and ≤ {GOAL_NS:.0} ns |\n"
    );

    let _ = writeln!(md, "## Results\n");
    let _ = writeln!(
        md,
        "`run_cnt` and total ns are the kernel's own statistics \
         (`kernel.bpf_stats_enabled=1`, `bpftool prog show`), for programs attached to the same \
         hook at the same time, so both saw the same events. ns/event = total ns / run_cnt.\n"
    );
    let _ = writeln!(
        md,
        "| hook | railscope program | run_cnt | total ns | ns/event | bpftrace program | run_cnt | total ns | ns/event | ratio | ≤ bpftrace | ≤ {GOAL_NS:.0} ns |"
    );
    let _ = writeln!(md, "|---|---|--:|--:|--:|---|--:|--:|--:|--:|---|---|");
    let tcg = run.accel == Accel::Tcg;
    for c in comparisons {
        let (tp, tc, tt, tn) = match &c.theirs {
            Some(t) => (
                format!("`{}`", t.program),
                t.run_cnt.to_string(),
                t.run_time_ns.to_string(),
                fmt_ns(t.ns_per_event()),
            ),
            None => ("–".into(), "–".into(), "–".into(), "–".into()),
        };
        let goal = match c.vs_goal_ns() {
            Check::Fail if tcg => "FAIL (TCG)",
            other => other.as_str(),
        };
        let _ = writeln!(
            md,
            "| `{}` | `{}` | {} | {} | {} | {tp} | {tc} | {tt} | {tn} | {} | {} | {goal} |",
            c.hook,
            c.ours.program,
            c.ours.run_cnt,
            c.ours.run_time_ns,
            fmt_ns(c.ours.ns_per_event()),
            c.ratio().map_or_else(|| "–".into(), |r| format!("{r:.2}")),
            c.vs_bpftrace().as_str(),
        );
    }
    let with_events = comparisons.iter().filter(|c| c.has_events()).count();
    let count =
        |f: fn(&Comparison) -> Check| comparisons.iter().filter(|c| f(c) == Check::Pass).count();
    let _ = writeln!(
        md,
        "
Of {with_events} hooks with events, {} cost no more per event than bpftrace's program \
         on the same hook, and {} cost at most {GOAL_NS:.0} ns per event{}. Hooks with few events \
         (control-path verbs, port events: tens, against tens of thousands of `post_send`s) give \
         a noisier figure: a single event that meets cold caches, or a vCPU the host preempts \
         while the program runs, weighs on the average. On `cm_event_handler`, bpftrace's \
         program is on the regular tracepoint `rdma_cma:cm_event_handler` (the same event, \
         which the kernel formats into a record first): bpftrace 0.17 cannot attach a raw \
         tracepoint that a module defines, as railscope's program is.\n",
        count(Comparison::vs_bpftrace),
        count(Comparison::vs_goal_ns),
        if tcg {
            " (under TCG: not a hardware figure; the absolute goal needs a run on KVM or bare \
             metal)"
        } else {
            ""
        }
    );
    let rounds: BTreeMap<u64, String> = guest
        .rows
        .iter()
        .map(|r| (r.round, r.first.clone()))
        .collect();
    if rounds.len() > 1 {
        let _ = writeln!(
            md,
            "Ratio (railscope ns/event ÷ bpftrace ns/event) per round. Each round starts a fresh \
             agent and a fresh bpftrace and runs all the workloads; the two are attached in \
             alternating order, because which program comes first on a shared hook moves the \
             figures (under TCG, by tens of percent). The totals above add up all rounds, as \
             many with each order, so they weigh both orders alike:\n"
        );
        let mut header = String::from("| hook |");
        let mut rule = String::from("|---|");
        for (r, first) in &rounds {
            let _ = write!(header, " round {r} ({first} first) |");
            rule.push_str("--:|");
        }
        let _ = writeln!(md, "{header}\n{rule}");
        for c in comparisons.iter().filter(|c| c.has_events()) {
            let mut line = format!("| `{}` |", c.hook);
            for round in rounds.keys() {
                let ratio = c
                    .rounds
                    .iter()
                    .find(|(r, _, _)| r == round)
                    .and_then(|(_, _, ratio)| *ratio);
                let _ = write!(
                    line,
                    " {} |",
                    ratio.map_or_else(|| "–".into(), |r| format!("{r:.2}"))
                );
            }
            let _ = writeln!(md, "{line}");
        }
        md.push('\n');
    }
    if let Some(e) = info.get("bpftrace_error").and_then(Value::as_str) {
        let _ = writeln!(md, "**bpftrace failed**: {e}\n");
    }
    if let Some(e) = &run.scenario_error {
        let _ = writeln!(md, "The guest scenario reported: {e}\n");
    }
    if !guest.bpftrace_counts.is_empty() {
        let _ = writeln!(
            md,
            "bpftrace's own map totals (a check on run_cnt: each bpftrace program counts once per \
             run): {}\n",
            guest
                .bpftrace_counts
                .iter()
                .map(|(k, v)| format!("`@{k}` {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }

    let _ = writeln!(
        md,
        "## Workloads (in the guest, in this order, in each round)\n"
    );
    for w in info["workloads"].as_array().into_iter().flatten() {
        let repeat = match w["repeat"].as_u64() {
            Some(n) if n > 1 => format!(" × {n}"),
            _ => String::new(),
        };
        let _ = writeln!(
            md,
            "- `{}`{repeat} ({:.1} s)",
            s(&w["command"]),
            w["seconds"].as_f64().unwrap_or(0.0)
        );
    }
    let _ = writeln!(
        md,
        "\nrailscope: `railscope agent --json --counters 5`, every probe family attached. \
         Each railscope program counts into a per-CPU hash keyed by device, verb, detail and \
         cgroup (reading its hook's arguments through offsets taken from BTF); \
         `ib_dispatch_event` also writes a record to a ring buffer.\n"
    );
    let _ = writeln!(
        md,
        "bpftrace, on the hooks the agent attached (each probe counts into a map keyed by the \
         cgroup, plus the one field railscope's program also reads where a single read gets it):\n"
    );
    let _ = writeln!(md, "```\n{}```", s(&info["bpftrace_script"]));
    md
}

/// `bench/results/probes.json`.
#[derive(Serialize)]
struct ProbesJson<'a> {
    command: &'static str,
    date: &'a str,
    kernel_release: &'a str,
    accelerator: String,
    host_cpu: &'a str,
    guest_seconds: f64,
    goal_ns_per_event: f64,
    scenario_error: Option<&'a str>,
    /// The guest's `BENCH-INFO` object, as it printed it.
    guest: &'a Value,
    programs: Vec<ProgramJson<'a>>,
    bpftrace_map_totals: &'a BTreeMap<String, u64>,
    comparisons: Vec<ComparisonJson<'a>>,
}

/// One program's row, with its cost per event.
#[derive(Serialize)]
struct ProgramJson<'a> {
    tool: &'a str,
    program: &'a str,
    hook: &'a str,
    ids: &'a [u64],
    run_cnt: u64,
    run_time_ns: u64,
    ns_per_event: Option<f64>,
    round: u64,
    first: &'a str,
}

impl<'a> From<&'a ProgramRow> for ProgramJson<'a> {
    fn from(r: &'a ProgramRow) -> Self {
        Self {
            tool: &r.tool,
            program: &r.program,
            hook: &r.hook,
            ids: &r.ids,
            run_cnt: r.run_cnt,
            run_time_ns: r.run_time_ns,
            ns_per_event: r.ns_per_event(),
            round: r.round,
            first: &r.first,
        }
    }
}

#[derive(Serialize)]
struct ComparisonJson<'a> {
    hook: &'a str,
    railscope_ns_per_event: Option<f64>,
    bpftrace_ns_per_event: Option<f64>,
    ratio: Option<f64>,
    no_more_than_bpftrace: Check,
    at_most_goal_ns: Check,
    ratio_per_round: Vec<RoundJson<'a>>,
}

#[derive(Serialize)]
struct RoundJson<'a> {
    round: u64,
    first: &'a str,
    ratio: Option<f64>,
}

/// The JSON written next to the markdown. Its objects' keys come out sorted, as they always
/// were (see [`sorted_json`]).
fn raw_json(run: &Run, guest: &GuestOutput, comparisons: &[Comparison]) -> anyhow::Result<String> {
    sorted_json(&ProbesJson {
        command: COMMAND,
        date: &run.date,
        kernel_release: &run.kernel_release,
        accelerator: format!("{:?}", run.accel),
        host_cpu: &run.host_cpu,
        guest_seconds: run.guest_seconds,
        goal_ns_per_event: GOAL_NS,
        scenario_error: run.scenario_error.as_deref(),
        guest: &guest.info,
        programs: guest.rows.iter().map(ProgramJson::from).collect(),
        bpftrace_map_totals: &guest.bpftrace_counts,
        comparisons: comparisons
            .iter()
            .map(|c| ComparisonJson {
                hook: &c.hook,
                railscope_ns_per_event: c.ours.ns_per_event(),
                bpftrace_ns_per_event: c.theirs.as_ref().and_then(ProgramRow::ns_per_event),
                ratio: c.ratio(),
                no_more_than_bpftrace: c.vs_bpftrace(),
                at_most_goal_ns: c.vs_goal_ns(),
                ratio_per_round: c
                    .rounds
                    .iter()
                    .map(|(round, first, ratio)| RoundJson {
                        round: *round,
                        first,
                        ratio: *ratio,
                    })
                    .collect(),
            })
            .collect(),
    })
}

/// A report as pretty JSON with every object's keys sorted (through `serde_json::Value`,
/// whose maps are sorted), so a result file keeps the layout of the earlier ones whatever
/// the order of the struct's fields.
pub(crate) fn sorted_json(report: &impl Serialize) -> anyhow::Result<String> {
    Ok(serde_json::to_string_pretty(&serde_json::to_value(report)?)? + "\n")
}

fn print_summary(comparisons: &[Comparison]) {
    eprintln!(
        "    {:48} {:>9} {:>10} {:>10} {:>6}  {:10} <= {GOAL_NS:.0} ns",
        "hook", "events", "ours ns", "bpftrace", "ratio", "<= bpftrace"
    );
    for c in comparisons {
        eprintln!(
            "    {:48} {:>9} {:>10} {:>10} {:>6}  {:10} {}",
            c.hook,
            c.ours.run_cnt,
            fmt_ns(c.ours.ns_per_event()),
            fmt_ns(c.theirs.as_ref().and_then(ProgramRow::ns_per_event)),
            c.ratio().map_or_else(|| "–".into(), |r| format!("{r:.2}")),
            c.vs_bpftrace().as_str(),
            c.vs_goal_ns().as_str(),
        );
    }
}

/// `target/DIR/KERNEL`, created: where a bench keeps its guest image and logs.
fn bench_work_dir(dir: &str, options: &Options) -> PathBuf {
    let name = format!("{:?}", options.kernel).to_lowercase();
    cargo::workspace_root().join("target").join(dir).join(name)
}

/// Builds a bench's guest image in `work_dir` (the release agent, the guest init and the
/// tools of `extra`) for the chosen kernel, and boots it with `scenario` alone and `mem` of
/// RAM: the image, the boot's outcome and the serial log's path.
fn boot_bench_scenario(
    tools: &Tools,
    options: &Options,
    work_dir: &Path,
    scenario: &str,
    extra: Option<&ExtraDebs>,
    mem: &str,
) -> anyhow::Result<(testbed::GuestImage, testbed::BootOutcome, PathBuf)> {
    let railscope = build::railscope_binary(tools, true)?;
    let init = vm_test::build_guest_init(tools)?;
    std::fs::create_dir_all(work_dir)?;
    let name = format!("{:?}", options.kernel).to_lowercase();
    let with = extra.map_or(String::new(), |e| format!(" with {}", e.tools.join(", ")));
    setup::step(&format!("building the {name} guest image{with}"));
    let spec = ImageSpec {
        kernel: options.kernel,
        init,
        files: vec![GuestFile {
            host: railscope,
            guest: "/usr/bin/railscope".into(),
            with_libs: true,
        }],
    };
    let image =
        testbed::build_image_with(&tools.cache_dir.join("testbed"), work_dir, &spec, extra)?;
    let serial_log = work_dir.join("guest.log");
    setup::step(&format!(
        "booting {} with scenario {scenario} (serial log: {})",
        image.kernel_release,
        serial_log.display()
    ));
    let outcome = vm_test::boot_scenarios(
        &image,
        &[scenario],
        testbed::BootOptions {
            user_net: false,
            pcie_numa: false,
            mem: mem.into(),
            smp: options.smp,
            timeout: Duration::from_secs(options.timeout),
            cmdline_extra: String::new(),
            serial_log: serial_log.clone(),
        },
    )?;
    Ok((image, outcome, serial_log))
}

/// The host CPU's model name.
pub(crate) fn host_cpu() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Now, as `YYYY-MM-DD HH:MM UTC`.
pub(crate) fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    utc(secs)
}

/// Seconds since the epoch as `YYYY-MM-DD HH:MM UTC` (proleptic Gregorian calendar).
fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let (hour, minute) = ((secs % 86_400) / 3600, (secs % 3600) / 60);
    // Civil date from days since 1970-01-01, by 400-year eras starting on March 1st.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {hour:02}:{minute:02} UTC")
}

/// Where the report of `target` goes, relative to the workspace (the raw JSON beside it).
fn results_path(target: Target) -> PathBuf {
    let name = match target {
        Target::Probes => "probes",
        Target::Agent => "agent",
        Target::Events => "events",
        Target::Collector => "collector",
        Target::NodeKeys => "node-keys",
        Target::Delivery => "delivery",
        Target::Fleet => "fleet",
    };
    Path::new("bench/results").join(format!("{name}.md"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "noise\n\
        BENCH {\"tool\":\"railscope\",\"program\":\"ib_uverbs_post_send\",\"hook\":\"kprobe:ib_uverbs_post_send\",\"ids\":[4,9],\"run_cnt\":1000,\"run_time_ns\":80000}\n\
        BENCH {\"tool\":\"bpftrace\",\"program\":\"kprobe_ib_uverb\",\"hook\":\"kprobe:ib_uverbs_post_send\",\"ids\":[30],\"run_cnt\":1000,\"run_time_ns\":90000}\n\
        BENCH {\"tool\":\"railscope\",\"program\":\"ib_dispatch_event\",\"hook\":\"kprobe:ib_dispatch_event\",\"ids\":[3],\"run_cnt\":4,\"run_time_ns\":4000}\n\
        BENCH {\"tool\":\"bpftrace\",\"program\":\"kprobe_ib_dispa\",\"hook\":\"kprobe:ib_dispatch_event\",\"ids\":[31],\"run_cnt\":4,\"run_time_ns\":2000}\n\
        BENCH {\"tool\":\"railscope\",\"program\":\"ib_uverbs_post_send\",\"hook\":\"kprobe:ib_uverbs_post_send\",\"ids\":[40],\"run_cnt\":1000,\"run_time_ns\":100000,\"round\":2,\"first\":\"bpftrace\"}\n\
        BENCH {\"tool\":\"bpftrace\",\"program\":\"kprobe_ib_uverb\",\"hook\":\"kprobe:ib_uverbs_post_send\",\"ids\":[41],\"run_cnt\":1000,\"run_time_ns\":110000,\"round\":2,\"first\":\"bpftrace\"}\n\
        BENCH {\"tool\":\"railscope\",\"program\":\"ib_destroy_srq_user\",\"hook\":\"kprobe:ib_destroy_srq_user\",\"ids\":[5],\"run_cnt\":0,\"run_time_ns\":0}\n\
        BENCH {broken\n\
        BENCH-INFO {\"kernel\":\"6.1.0-56-amd64\",\"workloads\":[{\"command\":\"rping -c\",\"seconds\":3.5}],\"bpftrace_script\":\"kprobe:x { }\\n\"}\n\
        BENCH-COUNTS {\"ib_uverbs_post_send\":1000}\n";

    #[test]
    fn reads_the_guest_lines() {
        let g = GuestOutput::parse(LOG);
        assert_eq!(g.rows.len(), 7);
        assert_eq!(g.rows[0].ids, [4, 9]);
        assert_eq!(
            (g.rows[0].round, g.rows[0].first.as_str()),
            (1, "railscope")
        );
        assert_eq!((g.rows[4].round, g.rows[4].first.as_str()), (2, "bpftrace"));
        assert_eq!(g.info["kernel"], "6.1.0-56-amd64");
        assert_eq!(g.bpftrace_counts["ib_uverbs_post_send"], 1000);
    }

    #[test]
    fn judges_each_hook_against_both_goals() {
        let g = GuestOutput::parse(LOG);
        let c = compare(&g.rows);
        assert_eq!(c.len(), 3);
        let post = c.iter().find(|c| c.hook.contains("post_send")).unwrap();
        assert_eq!(post.vs_bpftrace(), Check::Pass);
        assert_eq!(post.vs_goal_ns(), Check::Pass);
        assert!((post.ratio().unwrap() - 0.9).abs() < 1e-9);
        assert_eq!(
            (post.ours.run_cnt, post.ours.ids.clone()),
            (2000, vec![4, 9, 40])
        );
        assert_eq!(post.rounds.len(), 2);
        assert!((post.rounds[1].2.unwrap() - 100.0 / 110.0).abs() < 1e-9);
        let dispatch = c.iter().find(|c| c.hook.contains("dispatch")).unwrap();
        assert_eq!(dispatch.ratio(), Some(2.0));
        assert_eq!(dispatch.vs_bpftrace(), Check::Fail);
        assert_eq!(dispatch.vs_goal_ns(), Check::Fail);
        let srq = c.iter().find(|c| c.hook.contains("srq")).unwrap();
        assert!(!srq.has_events());
        assert_eq!(srq.vs_bpftrace(), Check::NotJudged);
        assert_eq!(srq.vs_goal_ns(), Check::NotJudged);
    }

    #[test]
    fn report_names_the_command_and_the_accelerator() {
        let g = GuestOutput::parse(LOG);
        let run = Run {
            date: utc(0),
            kernel_release: "6.1.0-56-amd64".into(),
            accel: Accel::Tcg,
            host_cpu: "cpu".into(),
            guest_seconds: 60.0,
            scenario_error: None,
        };
        let c = compare(&g.rows);
        let md = markdown(&run, &g, &c);
        assert!(md.contains("`cargo xtask bench probes`"));
        assert!(md.contains("TCG"));
        assert!(md.contains(
            "| `kprobe:ib_uverbs_post_send` | `ib_uverbs_post_send` | 2000 | 180000 | 90 | \
             `kprobe_ib_uverb` | 2000 | 200000 | 100 | 0.90 | PASS | PASS |"
        ));
        assert!(md.contains("| 2.00 | FAIL | FAIL (TCG) |"), "{md}");
        assert!(
            md.contains("Of 2 hooks with events, 1 cost no more"),
            "{md}"
        );
        let text = raw_json(&run, &g, &c).unwrap();
        let raw: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(raw["command"], COMMAND);
        assert_eq!(raw["programs"].as_array().unwrap().len(), 7);
        let post_send = raw["comparisons"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["hook"] == "kprobe:ib_uverbs_post_send")
            .unwrap();
        assert_eq!(post_send["no_more_than_bpftrace"], true);
        assert_eq!(post_send["at_most_goal_ns"], true);
        assert!(
            text.starts_with("{\n  \"accelerator\": \"Tcg\",\n  \"bpftrace_map_totals\""),
            "keys sorted as before: {text}"
        );
        assert!(md.contains("| hook | round 1 (railscope first) | round 2 (bpftrace first) |"));
        assert!(
            md.contains("| `kprobe:ib_uverbs_post_send` | 0.89 | 0.91 |"),
            "{md}"
        );
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00 UTC");
        assert_eq!(utc(1_700_000_000), "2023-11-14 22:13 UTC");
    }

    #[test]
    fn results_live_under_bench_results() {
        assert_eq!(
            results_path(Target::Probes),
            Path::new("bench/results/probes.md")
        );
    }
}
