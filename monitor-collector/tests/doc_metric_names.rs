//! Every metric name a newcomer reads is one railscope exports (issue 30): each
//! `railscope_...` token in docs/*.md, README.md, the shipped configuration and dashboard
//! (dist/) and the `--help` of every command of both binaries is
//! - a metric the agent sends (`monitor_wire::names::AGENT_METRICS`, the table the agent's
//!   sources emit from),
//! - or a family a real `railscope-collector run`'s `/metrics` declares (`# TYPE` lines; run
//!   with an archive, a remote-write endpoint and findings, so every family the binary can
//!   expose is there), or the metric the straggler API reports a port under,
//! - or, ending in `_`, the prefix of one of those (`railscope_gpu_`),
//! - or one of the few names listed in [`NOT_METRICS`] with the reason it is not a metric.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
};

use monitor_testkit::{CollectorProcess, KEY_HEX, agent_binary_next_to, key_file, scratch_dir};

const COLLECTOR: &str = env!("CARGO_BIN_EXE_railscope-collector");

/// Tokens that look like metric names but are not, each with where and why.
const NOT_METRICS: &[(&str, &str)] = &[
    (
        "railscope_roles",
        "a key of the web config file (docs/http-api.md, deployment.md, dist/collector.toml)",
    ),
    (
        "railscope_version",
        "a field of a capture file's JSON header (docs/capture-format.md)",
    ),
    (
        "railscope_actions_brake",
        "an alert's name, not a metric: Alertmanager names each finding's alert \
         railscope_RULE, and the brake's rule is actions_brake (docs/actions.md)",
    ),
    (
        "railscope_gpu_temp_celsius",
        "docs/wire-format.md's worked example: a frame printed byte for byte and checked as \
         such by monitor-wire's codec test (worked_example_of_the_spec); any name serves the \
         example, and renaming it moves every offset of the table",
    ),
];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// Each `railscope_[a-z0-9_]+` token of `text` that starts a word (not `metrics_railscope_reads`),
/// with its line number.
fn tokens(text: &str) -> Vec<(usize, String)> {
    const START: &str = "railscope_";
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let bytes = line.as_bytes();
        let mut from = 0;
        while let Some(at) = line[from..].find(START).map(|i| from + i) {
            let end = at
                + START.len()
                + bytes[at + START.len()..]
                    .iter()
                    .take_while(|&&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                    .count();
            if at == 0 || !word(bytes[at - 1]) {
                out.push((n + 1, line[at..end].to_owned()));
            }
            from = end;
        }
    }
    out
}

/// The families a real collector's `/metrics` declares, and the straggler API's port metric.
fn collector_metrics() -> BTreeSet<String> {
    let dir = scratch_dir("doc-metric-names");
    let key = key_file(&dir, KEY_HEX);
    // Nothing listens on port 9: the writer and the alert sender keep retrying, their
    // families are there all the same.
    let config = dir.join("collector.toml");
    std::fs::write(
        &config,
        "[actions.alertmanager]\nurls = [\"http://127.0.0.1:9\"]\n",
    )
    .unwrap();
    let collector = CollectorProcess::command(COLLECTOR, &key, &dir.join("data"))
        .args(["--remote-write", "vm=http://127.0.0.1:9/api/v1/write"])
        .args([std::ffi::OsStr::new("--config"), config.as_os_str()])
        .start();
    let page = collector.get("/metrics");
    let (stopped, _, stderr) = collector.stop();
    assert!(stopped, "{stderr}");
    let mut names: BTreeSet<String> = page
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    for family in [
        "railscope_collector_frames_accepted_total",
        "railscope_collector_archive_frames_total",
        "railscope_collector_remote_write_samples_sent_total",
        "railscope_findings_total",
        "railscope_collector_alerts_sent_total",
    ] {
        assert!(names.contains(family), "/metrics lacks {family}:\n{page}");
    }
    names.insert(monitor_findings::stragglers::PORT_METRIC.to_owned());
    names
}

/// (where, text) of every doc, README and dist file that names metrics.
fn documents() -> Vec<(String, String)> {
    let root = workspace_root();
    let mut files = vec![root.join("README.md")];
    for dir in ["docs", "dist", "dist/grafana"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            let keep = match dir {
                "docs" => path.extension().is_some_and(|e| e == "md"),
                _ => path
                    .extension()
                    .is_some_and(|e| e == "toml" || e == "json" || e == "yml" || e == "yaml"),
            };
            if keep {
                files.push(path);
            }
        }
    }
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let shown = path.strip_prefix(&root).unwrap().display().to_string();
            (shown, text)
        })
        .collect()
}

/// The subcommands a `--help` lists under `Commands:` (without `help`).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter(|l| !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect()
}

/// (command line, `--help` text) of `program` and every subcommand below it.
fn help_texts(program: &Path, name: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut todo = vec![Vec::<String>::new()];
    while let Some(args) = todo.pop() {
        assert!(args.len() < 5, "{name} {args:?}: nested too deep");
        let run = Command::new(program)
            .args(&args)
            .arg("--help")
            .env("NO_COLOR", "1")
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&run.stdout).into_owned();
        let shown = format!("{name} {} --help", args.join(" "));
        assert!(run.status.success(), "{shown}: {help}");
        for sub in subcommands(&help) {
            let mut next = args.clone();
            next.push(sub);
            todo.push(next);
        }
        out.push((shown, help));
    }
    out
}

#[test]
fn metric_names_in_docs_and_help_are_exported() {
    let agent: BTreeSet<String> = monitor_wire::names::AGENT_METRICS
        .iter()
        .map(|n| n.to_string())
        .collect();
    let collector = collector_metrics();
    let exported: BTreeSet<&String> = agent.iter().chain(&collector).collect();
    let not_metrics: BTreeSet<&str> = NOT_METRICS.iter().map(|(n, _)| *n).collect();

    let mut sources = documents();
    let railscope = agent_binary_next_to(COLLECTOR);
    let helps = [
        help_texts(Path::new(COLLECTOR), "railscope-collector"),
        help_texts(&railscope, "railscope"),
    ];
    for (name, helps) in ["railscope-collector", "railscope"].iter().zip(&helps) {
        let shown: Vec<&str> = helps.iter().map(|(s, _)| s.as_str()).collect();
        // The walk found the commands (a change in clap's layout would find none).
        for must in ["query series --help", "select --help", "findings --help"] {
            assert!(
                shown.iter().any(|s| s.ends_with(must)),
                "{name}: no `{must}` among {shown:?}"
            );
        }
    }
    sources.extend(helps.into_iter().flatten());

    let mut wrong = Vec::new();
    let mut seen = BTreeSet::new();
    for (source, text) in &sources {
        for (line, token) in tokens(text) {
            seen.insert(token.clone());
            let known = if token.ends_with('_') {
                exported.iter().any(|n| n.starts_with(&token))
            } else {
                exported.contains(&token) || not_metrics.contains(token.as_str())
            };
            if !known {
                wrong.push(format!("{source}:{line}: {token}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "names no agent or collector exports:\n  {}",
        wrong.join("\n  ")
    );
    // Every exception is still needed.
    for (name, why) in NOT_METRICS {
        assert!(seen.contains(*name), "{name} ({why}) is named nowhere now");
    }
    // The help texts name metrics at all (the query's example).
    assert!(seen.contains("railscope_ib_port_xmit_bytes_total"));
}

#[test]
fn tokens_start_at_a_word() {
    assert_eq!(
        tokens(
            "a `railscope_ib_x_total{port=\"1\"}` and reads::metrics_railscope_reads()\n\
                railscope_gpu_, (railscope_roles)"
        ),
        [
            (1, "railscope_ib_x_total".to_owned()),
            (2, "railscope_gpu_".to_owned()),
            (2, "railscope_roles".to_owned()),
        ]
    );
}
