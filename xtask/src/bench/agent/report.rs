//! The report: the goals judged on what was measured, `agent.md` and `agent.json`.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

use super::*;

pub(super) struct Facts {
    pub(super) date: String,
    pub(super) command: String,
    pub(super) host_cpu: String,
    pub(super) cores: usize,
    pub(super) kernel: String,
    pub(super) load_before: String,
    pub(super) load_after: String,
    pub(super) node_exporter: String,
    pub(super) railscope_commit: String,
    pub(super) duration_s: f64,
    pub(super) warmup_s: f64,
    pub(super) total_s: f64,
}

pub(super) struct Report {
    pub(super) facts: Facts,
    /// The example's `wire` output, per interval of [`WIRE_SWEEPS`].
    pub(super) wire: Vec<Value>,
    pub(super) traces: Value,
    pub(super) live: Vec<LiveConfig>,
    /// `agent_bench gpu-sweep`, with `nvml_calls` (the stand-in's counts).
    pub(super) gpu_sweep: Value,
    /// `agent_bench gpu-sweep --floor`, with `nvml_calls`.
    pub(super) gpu_floor: Value,
    /// Callgrind's inclusive costs of the agent (`callgrind` section), if it ran.
    pub(super) callgrind: Value,
}

/// NVML functions called once at start (or per event), not per sweep.
const NVML_SETUP_CALLS: [&str; 13] = [
    "nvmlInit_v2",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetIndex",
    "nvmlGpmQueryDeviceSupport",
    "nvmlErrorString",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlEventSetCreate",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetFree",
];

/// One goal, measured.
pub(super) struct Goal {
    pub(super) what: String,
    pub(super) target: String,
    pub(super) measured: String,
    pub(super) pass: Option<bool>,
}

impl Goal {
    pub(super) fn verdict(&self) -> &'static str {
        match self.pass {
            Some(true) => "PASS",
            Some(false) => "FAIL",
            None => "n/a",
        }
    }
}

pub(super) fn f(v: &Value) -> Option<f64> {
    v.as_f64()
}

pub(super) fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "–".into(), |v| format!("{v:.digits$}"))
}

impl Report {
    pub(super) fn wire_at(&self, interval: f64) -> Option<&Value> {
        self.wire
            .iter()
            .find(|w| f(&w["interval_s"]).is_some_and(|i| (i - interval).abs() < 1e-9))
    }

    pub(super) fn goals(&self) -> Vec<Goal> {
        let mut goals = Vec::new();
        if let Some(w) = self.wire_at(1.0) {
            let ours = f(&w["railscope"]["bytes_per_sample"]);
            goals.push(Goal {
                what: "bytes per sample on the wire (1 s reads, 10 s flush, schema included)"
                    .into(),
                target: format!("≤ {GOAL_BYTES_PER_SAMPLE}"),
                measured: fmt_opt(ours, 2),
                pass: ours.map(|b| b <= GOAL_BYTES_PER_SAMPLE),
            });
        }
        // Bytes against the floor a strong compressor leaves of the same frame stream.
        for w in &self.wire {
            let interval = f(&w["interval_s"]).unwrap_or(0.0);
            let ours = f(&w["railscope"]["bytes_per_sample"]);
            let xz = f(&w["railscope_stream_xz"]["bytes_per_sample"]);
            let ratio = ours.zip(xz).map(|(o, x)| o / x);
            goals.push(Goal {
                what: format!(
                    "frames at {} against xz -9e over the same frame stream (the floor)",
                    label(interval)
                ),
                target: format!("≤ {GOAL_VS_XZ_FLOOR}×"),
                measured: format!(
                    "{}× ({} vs {} B/sample)",
                    fmt_opt(ratio, 2),
                    fmt_opt(ours, 2),
                    fmt_opt(xz, 2)
                ),
                pass: ratio.map(|r| r <= GOAL_VS_XZ_FLOOR),
            });
        }
        for l in &self.live {
            let ib_floor = l.subject("floor-railscope").map(|s| s.cost.cpu_pct());
            let gpu_floor = self.gpu_floor_pct(l.interval);
            for name in ["railscope-ib", "railscope"] {
                let Some(s) = l.subject(name) else { continue };
                let floor = if name == "railscope" {
                    ib_floor.zip(gpu_floor).map(|(i, g)| i + g)
                } else {
                    ib_floor
                };
                let ratio = floor.map(|fl| s.cost.cpu_pct() / fl.max(1e-9));
                goals.push(Goal {
                    what: format!(
                        "CPU at {} against the read floor: {}",
                        label(l.interval),
                        s.what
                    ),
                    target: format!("≤ {GOAL_VS_READ_FLOOR:.0}×"),
                    measured: format!(
                        "{}× ({:.3} % vs {} %)",
                        fmt_opt(ratio, 1),
                        s.cost.cpu_pct(),
                        fmt_opt(floor, 3)
                    ),
                    pass: ratio.map(|r| r <= GOAL_VS_READ_FLOOR),
                });
                if l.interval >= 1.0 {
                    goals.push(Goal {
                        what: format!("CPU at 1 s: {}", s.what),
                        target: format!("≤ {GOAL_CPU_PCT_AT_1S} % of a core"),
                        measured: format!("{:.3} %", s.cost.cpu_pct()),
                        pass: Some(s.cost.cpu_pct() <= GOAL_CPU_PCT_AT_1S),
                    });
                }
                goals.push(Goal {
                    what: format!("peak RSS at {}: {}", label(l.interval), s.what),
                    target: format!("≤ {GOAL_RSS_MB:.0} MB"),
                    measured: format!("{:.1} MB", s.cost.hwm_mb()),
                    pass: Some(s.cost.hwm_mb() <= GOAL_RSS_MB),
                });
            }
        }
        if let (Some(calls), Some(min)) = (
            self.nvml_calls_per_gpu_sweep(false),
            self.nvml_calls_per_gpu_sweep(true),
        ) {
            goals.push(Goal {
                what: "NVML calls per GPU per sweep against the fewest the same fields need (the GPU read floor's)".into(),
                target: format!("≤ {GOAL_VS_NVML_MIN}×"),
                measured: format!("{:.2}× ({calls:.1} vs {min:.1})", calls / min.max(1e-9)),
                pass: Some(calls / min.max(1e-9) <= GOAL_VS_NVML_MIN),
            });
        }
        let total = &self.traces["total"];
        let reduction = f(&total["reduction"]);
        goals.push(Goal {
            what: "adaptive sampling: fewer samples than a fixed interval (all traces)".into(),
            target: format!("≥ {:.0} %", GOAL_REDUCTION * 100.0),
            measured: format!("{} %", fmt_opt(reduction.map(|r| r * 100.0), 1)),
            pass: reduction.map(|r| r >= GOAL_REDUCTION),
        });
        let error = f(&total["worst_interval_error"]);
        let inconsistent = total["inconsistent_emits"].as_u64().unwrap_or(0);
        goals.push(Goal {
            what: "adaptive sampling: every sent interval's peak within 10 % (worst interval)"
                .into(),
            target: format!("≤ {:.0} %", GOAL_PEAK_ERROR * 100.0),
            measured: format!(
                "{} %{}",
                fmt_opt(error.map(|e| e * 100.0), 1),
                if inconsistent > 0 {
                    format!(", {inconsistent} inconsistent records")
                } else {
                    String::new()
                }
            ),
            pass: error.map(|e| e <= GOAL_PEAK_ERROR && inconsistent == 0),
        });
        let delay = f(&total["max_step_delay_min_intervals"]);
        goals.push(Goal {
            what: "adaptive sampling: every step change caught (worst delay)".into(),
            target: format!("≤ {GOAL_STEP_DELAY:.0} minimum intervals"),
            measured: delay.map_or_else(|| "never caught".into(), |d| format!("{d:.0}")),
            pass: Some(delay.is_some_and(|d| d <= GOAL_STEP_DELAY)),
        });
        goals
    }

    /// The GPU read floor at `interval`, in % of a core: the floor process's CPU per sweep
    /// of 8 GPUs (`agent_bench gpu-sweep --floor`), one sweep per interval.
    pub(super) fn gpu_floor_pct(&self, interval: f64) -> Option<f64> {
        let us = f(&self.gpu_floor["cpu_us_per_sweep_mean"])?;
        Some(us / 1e6 / interval * 100.0)
    }

    /// NVML calls per GPU per sweep of the GPU source (or the floor), from the stand-in's
    /// counts; sweeps are its utilization calls (one per GPU and sweep).
    pub(super) fn nvml_calls_per_gpu_sweep(&self, floor: bool) -> Option<f64> {
        let v = if floor {
            &self.gpu_floor
        } else {
            &self.gpu_sweep
        };
        let calls = v["nvml_calls"].as_object()?;
        let sweeps = calls.get("nvmlDeviceGetUtilizationRates")?.as_f64()?;
        let per_sweep: f64 = calls
            .iter()
            .filter(|(k, _)| !NVML_SETUP_CALLS.contains(&k.as_str()))
            .filter_map(|(_, n)| n.as_f64())
            .sum();
        Some(per_sweep / sweeps.max(1.0))
    }

    fn information_markdown(&self, md: &mut String) {
        let _ = writeln!(md, "| information | measured |\n|---|---|");
        if let Some(w) = self.wire_at(1.0) {
            let ours = f(&w["railscope"]["bytes_per_sample"]);
            for (key, name) in [
                (
                    "remote_write_grouped",
                    "remote-write, each series once per 10 s request",
                ),
                (
                    "remote_write_as_prometheus",
                    "remote-write as Prometheus sends it (one TimeSeries per sample)",
                ),
            ] {
                let ratio = ours.zip(f(&w[key]["bytes_per_sample"])).map(|(o, t)| t / o);
                let _ = writeln!(
                    md,
                    "| {name}, at 1 s: × railscope's bytes | {}× |",
                    fmt_opt(ratio, 1)
                );
            }
        }
        for l in &self.live {
            let Some(ne) = l.subject("node_exporter") else {
                continue;
            };
            for name in ["railscope", "railscope-ib"] {
                let Some(s) = l.subject(name) else { continue };
                let _ = writeln!(
                    md,
                    "| node_exporter's CPU at {} ÷ {} | {:.1}× |",
                    label(l.interval),
                    s.what,
                    ne.cost.cpu_s / s.cost.cpu_s.max(1e-9)
                );
            }
            if let Some(fl) = l.subject("floor-node-exporter") {
                let _ = writeln!(
                    md,
                    "| node_exporter's CPU at {} ÷ reading its own files alone | {:.1}× |",
                    label(l.interval),
                    ne.cost.cpu_s / fl.cost.cpu_s.max(1e-9)
                );
            }
        }
        for (what, v) in [
            (
                "the GPU source (as the agent sweeps, jobs included)",
                &self.gpu_sweep,
            ),
            ("the GPU read floor", &self.gpu_floor),
        ] {
            let _ = writeln!(
                md,
                "| a sweep of 8 stand-in GPUs, {what}: CPU (median) | {} µs |",
                fmt_opt(f(&v["cpu_us_per_sweep_median"]), 0)
            );
        }
        let _ = writeln!(md);
        self.nvml_calls_markdown(md);
    }

    fn nvml_calls_markdown(&self, md: &mut String) {
        let (Some(a), Some(b)) = (
            self.gpu_sweep["nvml_calls"].as_object(),
            self.gpu_floor["nvml_calls"].as_object(),
        ) else {
            return;
        };
        let sweeps = |m: &serde_json::Map<String, Value>| {
            m.get("nvmlDeviceGetUtilizationRates")
                .and_then(Value::as_f64)
                .unwrap_or(1.0)
                .max(1.0)
        };
        let (sa, sb) = (sweeps(a), sweeps(b));
        let _ = writeln!(
            md,
            "NVML calls per GPU per sweep, counted by the stand-in (`RAILSCOPE_NVML_STANDIN_COUNTS`) \
             over {} sweeps of 8 GPUs: the GPU source as the agent runs it (`agent_bench gpu-sweep`) \
             and the GPU read floor (`agent_bench gpu-sweep --floor`: each query of the same \
             fields once, handles kept, the fixed link maxima read once). Calls made once at \
             start (init, handles, names, GPM support) are left out of the totals.\n",
            sa / 8.0
        );
        let _ = writeln!(md, "| NVML function | GPU source | floor |\n|---|--:|--:|");
        let names: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
        for name in names {
            let per = |m: &serde_json::Map<String, Value>, s: f64| {
                m.get(name.as_str())
                    .and_then(Value::as_f64)
                    .map_or(0.0, |n| n / s)
            };
            let setup = if NVML_SETUP_CALLS.contains(&name.as_str()) {
                " (start-up)"
            } else {
                ""
            };
            let _ = writeln!(
                md,
                "| `{name}`{setup} | {:.2} | {:.2} |",
                per(a, sa),
                per(b, sb)
            );
        }
        let _ = writeln!(
            md,
            "| **total per sweep** | **{}** | **{}** |\n",
            fmt_opt(self.nvml_calls_per_gpu_sweep(false), 2),
            fmt_opt(self.nvml_calls_per_gpu_sweep(true), 2)
        );
    }

    fn callgrind_markdown(&self, md: &mut String) {
        let c = &self.callgrind;
        let _ = writeln!(md, "## Where the agent's CPU goes (callgrind)\n");
        if let Some(e) = c["error"].as_str() {
            let _ = writeln!(md, "The profile did not run: {e}\n");
            return;
        }
        let _ = writeln!(
            md,
            "`railscope agent` (IB + 8 stand-in GPUs, 1 s interval, adaptive sampling on) under \
             `valgrind --tool=callgrind --instr-atstart=no` on the moving fixture tree; \
             instructions collected for {} s (so about {} sweeps) after a {} s warm-up \
             (`callgrind_control -i on`), every thread; {} instructions in all. The functions \
             with the largest inclusive share (`callgrind_annotate --inclusive=yes`; the \
             stand-in's own work counts, as it does in the CPU figures above):\n",
            c["window_s"], c["window_s"], c["warmup_s"], c["total_ir"]
        );
        let _ = writeln!(md, "| inclusive Ir | share | function |\n|--:|--:|---|");
        for row in c["top"].as_array().into_iter().flatten() {
            let _ = writeln!(
                md,
                "| {} | {:.1} % | `{}` |",
                row["ir"],
                f(&row["share_pct"]).unwrap_or(0.0),
                row["function"]
                    .as_str()
                    .unwrap_or_default()
                    .replace('|', "\\|")
            );
        }
        let _ = writeln!(md);
    }

    pub(super) fn markdown(&self, goals: &[Goal]) -> String {
        let mut md = String::new();
        let fa = &self.facts;
        let _ = writeln!(
            md,
            "# Node agent: wire size, CPU and memory, adaptive sampling\n"
        );
        let _ = writeln!(
            md,
            "Produced by `{}` (run as root) on {}; the whole run took {:.0} s.\n",
            fa.command, fa.date, fa.total_s
        );
        let _ = writeln!(md, "| | |\n|---|---|");
        let _ = writeln!(md, "| CPU | {} |", fa.host_cpu);
        let _ = writeln!(
            md,
            "| cores | {} (shared with other work: load average {} before, {} after) |",
            fa.cores, fa.load_before, fa.load_after
        );
        let _ = writeln!(md, "| kernel | {} |", fa.kernel);
        let _ = writeln!(
            md,
            "| railscope | commit {}, release build |",
            fa.railscope_commit
        );
        let _ = writeln!(
            md,
            "| node_exporter | {} (Debian package `{NODE_EXPORTER_PACKAGE}`) |",
            fa.node_exporter
        );
        let _ = writeln!(
            md,
            "| measured | each process {:.0} s after a warm-up of {:.0} s at 1 s (30 intervals, at least 5 s), one process at a time |\n",
            fa.duration_s, fa.warmup_s
        );

        let _ = writeln!(md, "## Goals\n");
        let _ = writeln!(md, "| goal | target | measured | |\n|---|---|---|---|");
        for g in goals {
            let _ = writeln!(
                md,
                "| {} | {} | {} | **{}** |",
                g.what,
                g.target,
                g.measured,
                g.verdict()
            );
        }
        let passed = goals.iter().filter(|g| g.pass == Some(true)).count();
        let _ = writeln!(md, "\n{passed} of {} goals met.\n", goals.len());
        let _ = writeln!(
            md,
            "Two earlier goals are retired: \"≥ 10× less CPU than node_exporter\" (node_exporter \
             itself spends about 10× what merely reading its files costs, so no agent reading \
             those files could meet it; the goal is now against that read floor) and \"≥ 20× \
             smaller than remote-write\" (lossless, self-contained frames already sit near the \
             floor xz -9e leaves of the whole stream; the goal is now against that floor). Those \
             comparisons stay as information:\n"
        );
        self.information_markdown(&mut md);
        let _ = writeln!(
            md,
            "Why the two floor goals are not met, what was cut to get closer and what is left \
             (measured by hand, with the commands): [agent-floors.md](agent-floors.md).\n"
        );
        let _ = writeln!(
            md,
            "Two references show how far the goals are from what is possible here: the bytes \
             that xz -9e leaves of railscope's whole frame stream (section 1), and the CPU of a \
             process that does nothing but read the files (section 2, \"Reading alone\").\n"
        );

        self.wire_markdown(&mut md);
        self.live_markdown(&mut md);
        self.callgrind_markdown(&mut md);
        self.traces_markdown(&mut md);
        md
    }

    pub(super) fn wire_markdown(&self, md: &mut String) {
        let _ = writeln!(md, "## 1. Bytes per sample\n");
        if let Some(w) = self.wire.first() {
            let c = &w["composition"];
            let fx = &w["facts"]["fixture"];
            let _ = writeln!(
                md,
                "The fixture node: 8 GPUs of the NVML stand-in (H100-like, in steady training, one \
                 scripted step per sweep) and 8 mlx5-like NDR ports ({} counter files: {} fast, \
                 {} slow, {} constant), read through railscope's own sources (`IbSysfs`, \
                 `GpuSource`): {} series ({} IB counters, {} IB gauges, {} GPU counters, {} GPU \
                 gauges), {} readings per sweep. Between sweeps the tree is advanced by the \
                 sweep interval of the node's time (fast counters at training rates whose level \
                 changes by up to ±20 % from one second to the next, error counters ticking now \
                 and then).\n",
                fx["counter_files"],
                fx["fast"],
                fx["slow"],
                fx["constant"],
                c["series"],
                c["ib_counters"],
                c["ib_gauges"],
                c["gpu_counters"],
                c["gpu_gauges"],
                fmt_opt(f(&w["readings_per_sweep"]), 0),
            );
        }
        let _ = writeln!(
            md,
            "Every reading is one sample. railscope: `FrameEncoder` with its default config \
             (1400-byte frames, 6 significant digits for non-integer gauges, schema sent in the \
             first two flushes and every 5 min, or when a collector asks), flushed every 10 s as the agent does; every byte \
             of every frame counted (headers, schema, MAC). Prometheus text: one scrape per \
             sweep, `# HELP` and `# TYPE` per family, `name{{labels}} value timestamp` per \
             series, values as Go writes them. Remote-write v1: `WriteRequest` protobuf, \
             snappy block-compressed (the HTTP body), labels `__name__`, the series' labels, \
             `instance` and `job`; either one request per 10 s with each series once, or as \
             Prometheus' queue sends it (one `TimeSeries` per sample, labels repeated, 2000 \
             samples per request, its `max_samples_per_send` default). Transport headers \
             (UDP/IP, HTTP/TCP) are not counted for any format.\n"
        );
        let _ = writeln!(
            md,
            "| interval | sweeps | samples | format | bytes | B/sample | ÷ railscope |\n|---|--:|--:|---|--:|--:|--:|"
        );
        for w in &self.wire {
            let interval = f(&w["interval_s"]).unwrap_or(0.0);
            let ours = f(&w["railscope"]["bytes_per_sample"]);
            let rows: [(&str, &Value); 7] = [
                ("railscope frames", &w["railscope"]),
                ("railscope frames, schema excluded", &w["railscope"]),
                (
                    "railscope's whole frame stream through xz -9e (across frames: not \
                     sendable as UDP frames, which decode alone)",
                    &w["railscope_stream_xz"],
                ),
                ("Prometheus text exposition", &w["prometheus_text"]),
                (
                    "Prometheus text, gzip (as a scrape travels)",
                    &w["prometheus_text"],
                ),
                (
                    "remote-write, each series once per 10 s request",
                    &w["remote_write_grouped"],
                ),
                (
                    "remote-write as Prometheus sends it",
                    &w["remote_write_as_prometheus"],
                ),
            ];
            for (i, (name, v)) in rows.iter().enumerate() {
                let (bytes, per) = match i {
                    1 => (
                        v["bytes"]
                            .as_u64()
                            .zip(v["schema_bytes"].as_u64())
                            .map(|(b, s)| b - s),
                        f(&v["bytes_per_sample_without_schema"]),
                    ),
                    4 => (v["gzip_bytes"].as_u64(), f(&v["gzip_bytes_per_sample"])),
                    _ => (v["bytes"].as_u64(), f(&v["bytes_per_sample"])),
                };
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {name} | {} | {} | {} |",
                    label(interval),
                    w["sweeps"],
                    w["readings"],
                    bytes.map_or_else(|| "–".into(), |b| b.to_string()),
                    fmt_opt(per, 2),
                    fmt_opt(per.zip(ours).map(|(p, o)| p / o), 1),
                );
            }
            let a = &w["railscope_adaptive"];
            let _ = writeln!(
                md,
                "| {} | {} | {} | railscope frames with adaptive sampling (the agent's default): {} records for {} readings | {} | {} per reading | {} |",
                label(interval),
                w["sweeps"],
                w["readings"],
                a["samples_sent"],
                a["readings"],
                a["bytes"],
                fmt_opt(f(&a["bytes_per_reading"]), 2),
                fmt_opt(f(&a["bytes_per_reading"]).zip(ours).map(|(p, o)| p / o), 1),
            );
        }
        if let Some(w) = self.wire_at(1.0) {
            let r = &w["railscope"];
            let bytes = r["bytes"].as_u64().unwrap_or(0);
            let schema = r["schema_bytes"].as_u64().unwrap_or(0);
            let src = |k: &str, field: &str| fmt_opt(f(&r["by_source"][k][field]), 2);
            let _ = writeln!(
                md,
                "\nWhere railscope's bytes go at 1 s: {} frames; the schema (series names and \
                 labels) is {schema} of the {bytes} bytes ({:.0} %). Every series' entry once \
                 takes {} bytes; it is sent in the first two flushes and again every 5 min (the \
                 encoder's `schema_refresh`), and each frame repeats the strings its entries use. \
                 IB series alone: {} B/sample ({} without schema); GPU series alone: {} ({}). \
                 With adaptive sampling the agent sends fewer records, but a gauge envelope \
                 carries three values and the schema costs the same, so the bytes shrink less \
                 than the record count.\n",
                r["frames"],
                100.0 * schema as f64 / bytes.max(1) as f64,
                r["schema_bytes_one_flush"],
                src("ib", "bytes_per_sample"),
                src("ib", "bytes_per_sample_without_schema"),
                src("gpu", "bytes_per_sample"),
                src("gpu", "bytes_per_sample_without_schema"),
            );
        }
        for w in &self.wire {
            let xz = f(&w["railscope_stream_xz"]["bytes_per_sample"]);
            let rw = f(&w["remote_write_as_prometheus"]["bytes_per_sample"]);
            let _ = writeln!(
                md,
                "- At {}, xz -9e over railscope's whole frame stream (a compressor that sees every \
                 earlier frame, which a receiver of lossy UDP cannot rely on) leaves {} B/sample: \
                 remote-write as Prometheus sends it is {}× that. That is how far a lossless coding \
                 of these samples gets with every redundancy a strong general-purpose compressor \
                 finds, cross-frame included.",
                label(f(&w["interval_s"]).unwrap_or(0.0)),
                fmt_opt(xz, 2),
                fmt_opt(rw.zip(xz).map(|(r, x)| r / x), 1),
            );
        }
        let _ = writeln!(md);
    }

    pub(super) fn live_markdown(&self, md: &mut String) {
        let _ = writeln!(md, "## 2. CPU and memory\n");
        let _ = writeln!(
            md,
            "A moving copy of the fixture tree on tmpfs (`/dev/shm`, in memory as sysfs is; 8 \
             mlx5-like ports, counters rewritten in place 10 times a second by a separate writer \
             process, as sysfs changes a file's contents but never the file) is read by:\n\n\
             - `railscope agent --collector 127.0.0.1:<port> --key <file> --node {NODE} --sysfs <tree> \
             --nvml-lib <stand-in> --interval <1|0.1>` (flush every 10 s, adaptive sampling on: \
             the defaults), sending to `railscope listen --json`; and the same with `--no-gpu` \
             instead of `--nvml-lib` (IB only: the same work as node_exporter's). The agent also \
             tries to load its eBPF probes: on this host they are unavailable (no `ib_core`), so it \
             reports them once and checks again every second, as it would on a node without RDMA \
             drivers loaded;\n\
             - `prometheus-node-exporter --path.sysfs <tree> --collector.disable-defaults \
             --collector.infiniband --web.disable-exporter-metrics`, scraped over loopback at the \
             same interval as Prometheus scrapes (one kept-alive connection, `Accept-Encoding: \
             gzip`, Prometheus' `Accept` header).\n\n\
             CPU: the scheduler's run time of each thread of the process \
             (`/proc/<pid>/task/<tid>/schedstat`, exact to the ns) over the measured window, in % \
             of one core, after a warm-up of 30 intervals (so the agent's sampler has filled its \
             windows). The % system shown comes from utime and stime in `/proc/<pid>/stat`, \
             sampled at {:.0} Hz clock ticks: only indicative. Peak RSS: `VmHWM` from \
             `/proc/<pid>/status` at the end of the window.\n",
            clock_ticks_per_second(),
        );
        let _ = writeln!(
            md,
            "| interval | process | CPU, % of one core | CPU per read or scrape | CPU incl. start-up | peak RSS | threads | on the wire | CPU ÷ railscope's (IB + GPUs) |\n|---|---|--:|--:|--:|--:|--:|---|--:|"
        );
        for l in &self.live {
            let ours = l.subject("railscope").map(|s| s.cost.cpu_s);
            for s in &l.subjects {
                let t = &s.traffic;
                let wire = if is_floor(s.name) {
                    format!(
                        "nothing sent; {} preads an interval of {} open files",
                        t["reads_per_interval"], t["files"]
                    )
                } else if s.name == "node_exporter" {
                    format!(
                        "{} scrapes of {} expected, {:.0} B/s gzip ({:.0} B per scrape, {:.0} B uncompressed)",
                        t["scrapes_in_window"],
                        t["scrapes_expected"],
                        f(&t["bytes_per_second"]).unwrap_or(0.0),
                        f(&t["gzip_bytes_per_scrape"]).unwrap_or(0.0),
                        f(&t["body_bytes_per_scrape"]).unwrap_or(0.0),
                    )
                } else {
                    format!(
                        "{:.0} B/s; {} samples of {} IB and {} GPU series in {} frames, {} lost",
                        f(&t["bytes_per_second"]).unwrap_or(0.0),
                        t["samples"],
                        t["ib_series"],
                        t["gpu_series"],
                        t["frames"],
                        t["lost_frames"],
                    )
                };
                let _ = writeln!(
                    md,
                    "| {} | {} | {:.3} % ({:.0} % system) | {:.2} ms | {:.2} s in {:.0} s | {:.1} MB | {} | {wire} | {} |",
                    label(l.interval),
                    s.what,
                    s.cost.cpu_pct(),
                    100.0 * s.cost.system_cpu_s / s.cost.cpu_s.max(1e-9),
                    1000.0 * s.cost.cpu_s * l.interval / s.cost.window_s.max(1e-9),
                    s.cost.lifetime_cpu_s,
                    s.cost.lifetime_s,
                    s.cost.hwm_mb(),
                    s.cost.threads,
                    fmt_opt(ours.map(|o| s.cost.cpu_s / o.max(1e-9)), 1),
                );
            }
        }
        let _ = writeln!(md);
        for l in &self.live {
            for s in l
                .subjects
                .iter()
                .filter(|s| s.name != "node_exporter" && !is_floor(s.name))
            {
                let threads: Vec<String> = s
                    .cost
                    .per_thread
                    .iter()
                    .map(|(name, cpu)| {
                        format!("`{name}` {:.3} %", 100.0 * cpu / s.cost.window_s.max(1e-9))
                    })
                    .collect();
                let t = &s.traffic;
                let lost = match (t["lost_frames"].as_u64(), t["udp_rcvbuf_errors"].as_u64()) {
                    (Some(0) | None, _) => String::new(),
                    (Some(n), Some(e)) => format!(
                        " {n} frames were lost on the way to `railscope listen` (the host \
                         counted {e} UDP datagrams dropped for a full receive buffer meanwhile: \
                         a flush sends its frames back to back, and the listener, printing \
                         JSON, falls behind); the agent itself reports: {}.",
                        t["agent_sent_line"].as_str().unwrap_or("?")
                    ),
                    (Some(n), None) => {
                        format!(" {n} frames were lost on the way to `railscope listen`.")
                    }
                };
                let _ = writeln!(
                    md,
                    "- {}, {}: CPU by thread: {} (`railscope-poll` reads the sources; the main \
                     thread samples, encodes, sends and checks for the probes' kernel modules).{lost}",
                    label(l.interval),
                    s.what,
                    threads.join(", "),
                );
            }
            if let Some(ne) = l.subject("node_exporter") {
                let t = &ne.traffic;
                let _ = writeln!(
                    md,
                    "- {}: node_exporter's scrape holds {} samples ({} of them `node_infiniband_*`; \
                     collector success {}; port data counters moved between the checks before and \
                     after: {}); {} scrape errors. The fixture writer used {:.2} % of a core. The \
                     stand-in script has {} steps ({} bytes).",
                    label(l.interval),
                    t["check_after"]["samples"],
                    t["check_after"]["infiniband_samples"],
                    t["check_after"]["collector_success"],
                    t["counters_moved"],
                    t["scrape_errors"],
                    l.fixture_cpu_pct,
                    l.standin_script["steps"],
                    l.standin_script["script_bytes"],
                );
            }
        }
        let _ = writeln!(
            md,
            "\nWhat differs between the processes: railscope reads more per port than node_exporter \
             1.5 (every file of `counters/` and `hw_counters/`, the device-level `hw_counters/`, \
             and the port attributes, against node_exporter's `counters/` and attributes), but \
             reads each file only when the sampler says its series is due: a stable series every \
             second interval, one whose rate moves (the data and packet counters of a training \
             job) every interval; it keeps the files open and reads each with one `pread`, where \
             node_exporter opens, reads and closes each file at every scrape; the GPU \
             figures are railscope reading the stand-in library through nvml-wrapper (the \
             stand-in's own work and its parsed script count in the agent's CPU and RSS; a real \
             NVML's calls cost differently); node_exporter does not read GPUs at all. The numbers \
             come from one machine with two cores shared with other work, so a few hundredths of \
             a percent are noise.\n"
        );
        self.floor_markdown(md);
    }

    /// What reading alone costs, against node_exporter: the most less CPU than node_exporter
    /// any agent reading those files that often could show on this machine.
    pub(super) fn floor_markdown(&self, md: &mut String) {
        let _ = writeln!(
            md,
            "**Reading alone.** The rows \"reads alone\" are `agent_bench read-floor`, a process \
             that only reads the tree: every file opened once and kept open, one `pread` and an integer parse per \
             read, nothing sampled, encoded or sent. A stable series must be read at least every \
             2nd interval for a step in it to be caught within 2 minimum intervals (the adaptive \
             sampling goal), which is what the first floor reads; the second reads \
             node_exporter's own files as often as node_exporter is scraped.\n"
        );
        for l in &self.live {
            let Some(ne) = l.subject("node_exporter") else {
                continue;
            };
            let parts: Vec<String> = FLOORS
                .iter()
                .filter_map(|floor| l.subject(floor.name))
                .map(|s| {
                    format!(
                        "{} costs {:.3} % of a core, so node_exporter ({:.3} %) uses {:.1}× as much",
                        s.what,
                        s.cost.cpu_pct(),
                        ne.cost.cpu_pct(),
                        ne.cost.cpu_s / s.cost.cpu_s.max(1e-9),
                    )
                })
                .collect();
            if !parts.is_empty() {
                let _ = writeln!(md, "- {}: {}.", label(l.interval), parts.join("; "));
            }
        }
        let _ = writeln!(
            md,
            "\nAn agent that reads these files that often cannot use less CPU than its reads: \
             node_exporter spends about 10× its floor, which is why \"10× less CPU than \
             node_exporter\" was retired for \"at most {GOAL_VS_READ_FLOOR:.0}× the read floor\". \
             With GPUs, the floor adds the GPU read floor (`agent_bench gpu-sweep --floor`, its \
             CPU per sweep of 8 GPUs times the sweeps a second).\n"
        );
    }

    pub(super) fn traces_markdown(&self, md: &mut String) {
        let t = &self.traces;
        let _ = writeln!(md, "## 3. Adaptive sampling on workload-shaped traces\n");
        let _ = writeln!(
            md,
            "`sampler_traces::standard({})` (one tick per second, about two hours \
             each: training steps with compute and communication phases, data-loader stalls, \
             evaluation and checkpoint pauses, idle gaps, a thermal throttle, a link trained \
             down, error bursts), each through `evaluate` with the trace's default sampler \
             config (window {}, tolerance {}, density {}, cap {} s, every minimum interval \
             read). Samples are the records sent (a counter value or a gauge envelope); the peak \
             error is, over every interval the adaptive run sent, its envelope's max against the \
             true max of the trace over the time it covers (counters: the derived rate against \
             the true mean rate); a step's delay counts minimum intervals from the last tick \
             before the step until the sampler is at its minimum interval and has sent a record \
             showing the new level (a fixed-interval reader scores 1).\n",
            t["seed"],
            t["config"]["window"],
            t["config"]["peak_tolerance"],
            t["config"]["density_threshold"],
            t["config"]["max_interval_s"],
        );
        let _ = writeln!(
            md,
            "| trace | kind | samples adaptive / fixed | reduction | worst interval peak error | steps | worst step delay (min intervals) |\n|---|---|--:|--:|--:|--:|--:|"
        );
        let row = |md: &mut String, e: &Value| {
            let _ = writeln!(
                md,
                "| {} | {} | {} / {} | {} % | {} % | {} | {} |",
                e["trace"].as_str().unwrap_or("?"),
                e["kind"].as_str().unwrap_or("all"),
                e["samples_adaptive"],
                e["samples_fixed"],
                fmt_opt(f(&e["reduction"]).map(|r| r * 100.0), 1),
                fmt_opt(f(&e["worst_interval_error"]).map(|r| r * 100.0), 1),
                e["steps"],
                match (e["steps"].as_u64(), f(&e["max_step_delay_min_intervals"])) {
                    (Some(0), _) => "–".to_owned(),
                    (_, Some(d)) => format!("{d:.0}"),
                    (_, None) => "never".to_owned(),
                },
            );
        };
        for e in t["traces"].as_array().into_iter().flatten() {
            row(md, e);
        }
        row(md, &t["total"]);
        row(md, &t["other_seeds"]);
        let _ = writeln!(
            md,
            "\nThe last row repeats the five traces with seeds {} to {}, for robustness.\n",
            t["seed"].as_u64().unwrap_or(1) + 1,
            t["seed"].as_u64().unwrap_or(1) + 5
        );
    }

    /// `bench/results/agent.json`, keys sorted as they always were.
    pub(super) fn json(&self, goals: &[Goal]) -> anyhow::Result<String> {
        let fa = &self.facts;
        crate::bench::sorted_json(&AgentJson {
            command: &fa.command,
            date: &fa.date,
            machine: MachineJson {
                cpu: &fa.host_cpu,
                cores: fa.cores,
                kernel: &fa.kernel,
                load_average_before: &fa.load_before,
                load_average_after: &fa.load_after,
            },
            railscope_commit: &fa.railscope_commit,
            node_exporter: &fa.node_exporter,
            duration_s: fa.duration_s,
            warmup_s: fa.warmup_s,
            total_s: fa.total_s,
            goals: goals
                .iter()
                .map(|g| GoalJson {
                    goal: &g.what,
                    target: &g.target,
                    measured: &g.measured,
                    pass: g.pass,
                })
                .collect(),
            bytes_per_sample: &self.wire,
            gpu_sweep: &self.gpu_sweep,
            gpu_floor: &self.gpu_floor,
            callgrind: &self.callgrind,
            live: self
                .live
                .iter()
                .map(|l| LiveJson {
                    interval_s: l.interval,
                    fixture_writer_cpu_pct: l.fixture_cpu_pct,
                    standin_script: &l.standin_script,
                    processes: l
                        .subjects
                        .iter()
                        .map(|s| ProcessJson {
                            name: s.name,
                            what: s.what,
                            cost: s.cost.json(),
                            traffic: &s.traffic,
                        })
                        .collect(),
                })
                .collect(),
            adaptive_sampling: &self.traces,
        })
    }
}

/// `bench/results/agent.json`. The parts the bench's example measured (bytes per sample, the
/// stand-in script, traffic, adaptive sampling) are passed on as the example printed them.
#[derive(Serialize)]
pub(super) struct AgentJson<'a> {
    pub(super) command: &'a str,
    pub(super) date: &'a str,
    pub(super) machine: MachineJson<'a>,
    pub(super) railscope_commit: &'a str,
    pub(super) node_exporter: &'a str,
    pub(super) duration_s: f64,
    pub(super) warmup_s: f64,
    pub(super) total_s: f64,
    pub(super) goals: Vec<GoalJson<'a>>,
    pub(super) bytes_per_sample: &'a [Value],
    pub(super) live: Vec<LiveJson<'a>>,
    pub(super) adaptive_sampling: &'a Value,
    pub(super) gpu_sweep: &'a Value,
    pub(super) gpu_floor: &'a Value,
    pub(super) callgrind: &'a Value,
}

#[derive(Serialize)]
pub(super) struct MachineJson<'a> {
    pub(super) cpu: &'a str,
    pub(super) cores: usize,
    pub(super) kernel: &'a str,
    pub(super) load_average_before: &'a str,
    pub(super) load_average_after: &'a str,
}

#[derive(Serialize)]
pub(super) struct GoalJson<'a> {
    pub(super) goal: &'a str,
    pub(super) target: &'a str,
    pub(super) measured: &'a str,
    pub(super) pass: Option<bool>,
}

/// One interval of the live runs.
#[derive(Serialize)]
pub(super) struct LiveJson<'a> {
    pub(super) interval_s: f64,
    pub(super) fixture_writer_cpu_pct: f64,
    pub(super) standin_script: &'a Value,
    pub(super) processes: Vec<ProcessJson<'a>>,
}

#[derive(Serialize)]
pub(super) struct ProcessJson<'a> {
    pub(super) name: &'a str,
    pub(super) what: &'a str,
    pub(super) cost: CostJson<'a>,
    pub(super) traffic: &'a Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(cpu_s: f64, hwm_kb: u64) -> Cost {
        Cost {
            window_s: 60.0,
            cpu_s,
            hwm_kb,
            ..Cost::default()
        }
    }

    fn subject(name: &'static str, cpu_s: f64, hwm_kb: u64) -> Subject {
        Subject {
            name,
            what: name,
            cost: cost(cpu_s, hwm_kb),
            traffic: json!({}),
        }
    }

    #[test]
    fn goals_are_judged_honestly() {
        let report = Report {
            facts: Facts {
                date: "2026-01-01 00:00 UTC".into(),
                command: "cargo xtask bench agent".into(),
                host_cpu: "cpu".into(),
                cores: 2,
                kernel: "6.1".into(),
                load_before: "0 0 0".into(),
                load_after: "0 0 0".into(),
                node_exporter: "node_exporter 1.5.0".into(),
                railscope_commit: "abc".into(),
                duration_s: 60.0,
                warmup_s: 5.0,
                total_s: 500.0,
            },
            wire: vec![json!({
                "interval_s": 1.0, "sweeps": 300, "readings": 1000,
                "composition": {}, "facts": {"fixture": {}},
                "railscope": {"bytes_per_sample": 1.5, "bytes": 1500, "schema_bytes": 100, "bytes_per_sample_without_schema": 1.4},
                "railscope_adaptive": {"bytes_per_reading": 1.0},
                "prometheus_text": {"bytes_per_sample": 110.0, "gzip_bytes_per_sample": 9.0},
                "remote_write_grouped": {"bytes_per_sample": 4.5},
                "remote_write_as_prometheus": {"bytes_per_sample": 31.5},
                "railscope_stream_xz": {"bytes_per_sample": 1.0},
            })],
            traces: json!({
                "seed": 1, "config": {}, "traces": [],
                "total": {"reduction": 0.78, "worst_interval_error": 0.0, "inconsistent_emits": 0, "max_step_delay_min_intervals": 1.0, "steps": 21},
                "other_seeds": {"steps": 0},
            }),
            live: vec![LiveConfig {
                interval: 1.0,
                subjects: vec![
                    subject("railscope", 0.24, 20 * 1024),
                    subject("railscope-ib", 0.12, 12 * 1024),
                    subject("node_exporter", 1.8, 25 * 1024),
                    subject("floor-railscope", 0.1, 4 * 1024),
                ],
                fixture_cpu_pct: 1.0,
                standin_script: json!({}),
            }],
            // 500 µs a sweep at 1 s: 0.05 % of a core; with IB's 0.1 %, a floor of 0.15 %.
            gpu_sweep: json!({"cpu_us_per_sweep_median": 900.0, "nvml_calls": {
                "nvmlInit_v2": 1, "nvmlDeviceGetUtilizationRates": 80,
                "nvmlDeviceGetHandleByIndex_v2": 88, "nvmlDeviceGetPowerUsage": 80}}),
            gpu_floor: json!({"cpu_us_per_sweep_mean": 500.0, "nvml_calls": {
                "nvmlInit_v2": 1, "nvmlDeviceGetUtilizationRates": 80,
                "nvmlDeviceGetHandleByIndex_v2": 8, "nvmlDeviceGetPowerUsage": 80}}),
            callgrind: json!({"error": "not run"}),
        };
        let goals = report.goals();
        let verdict = |what: &str| {
            goals
                .iter()
                .find(|g| g.what.contains(what))
                .unwrap_or_else(|| panic!("no goal {what}"))
                .verdict()
        };
        assert_eq!(verdict("bytes per sample"), "PASS");
        assert_eq!(verdict("against xz -9e"), "FAIL"); // 1.5x
        assert_eq!(verdict("CPU at 1 s: railscope-ib"), "PASS"); // 0.12 %
        // IB only: 0.12 % against 0.1 %.
        assert_eq!(verdict("read floor: railscope-ib"), "PASS");
        // With GPUs: 0.24 % against 0.1 + 0.05 %: 1.6x.
        assert_eq!(verdict("read floor: railscope"), "PASS");
        // (80 + 88 + 80) / 80 = 3.1 calls against (80 + 8 + 80) / 80 = 2.1: 1.48x.
        assert_eq!(verdict("NVML calls per GPU"), "FAIL");
        assert!(!goals.iter().any(|g| g.what.contains("node_exporter")));
        assert!(!goals.iter().any(|g| g.what.contains("remote-write")));
        assert_eq!(verdict("fewer samples"), "PASS");
        assert_eq!(verdict("step change"), "PASS");
        let md = report.markdown(&goals);
        assert!(md.contains("`cargo xtask bench agent`"), "{md}");
        assert!(md.contains("| **FAIL** |"), "{md}");
        assert!(md.contains("Two earlier goals are retired"), "{md}");
        assert!(md.contains("| node_exporter's CPU at 1 s ÷"), "{md}");
        let json: Value = serde_json::from_str(&report.json(&goals).unwrap()).unwrap();
        assert_eq!(json["goals"].as_array().unwrap().len(), goals.len());
        let first = &report.live[0].subjects[0];
        let process = &json["live"][0]["processes"][0];
        assert_eq!(process["name"], first.name);
        assert_eq!(process["cost"]["peak_rss_kb"], first.cost.hwm_kb);
    }
}
