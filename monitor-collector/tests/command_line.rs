//! The client commands as a newcomer types them (issue 30): their usage lines name the
//! binary actually run (`railscope query --help` says `Usage: railscope query ...`, though
//! `railscope` hands `query` over to `railscope-collector`), and an option of the whole
//! command is taken wherever it is typed (`query series M --collector URL` as `query
//! --collector URL series M`), on both binaries, against a real collector.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use monitor_testkit::{CollectorProcess, KEY_HEX, agent_binary_next_to, key_file, scratch_dir};

const COLLECTOR: &str = env!("CARGO_BIN_EXE_railscope-collector");

/// `railscope`, next to `railscope-collector`.
fn railscope() -> PathBuf {
    agent_binary_next_to(COLLECTOR)
}

fn run(program: &Path, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", program.display()))
}

/// stdout + stderr as text.
fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The first `Usage:` line of `out`.
fn usage(out: &Output) -> String {
    let all = text(out);
    all.lines()
        .find(|l| l.starts_with("Usage: "))
        .unwrap_or_else(|| panic!("no usage line in:\n{all}"))
        .to_owned()
}

/// Both binaries, each with the name its usage lines must show: `railscope`'s client
/// commands are `railscope-collector`'s, run under the agent's name.
fn binaries() -> [(PathBuf, &'static str); 2] {
    [
        (PathBuf::from(COLLECTOR), "railscope-collector"),
        (railscope(), "railscope"),
    ]
}

#[test]
fn usage_lines_name_the_binary_run() {
    for (program, name) in binaries() {
        for command in [
            &["query"][..],
            &["query", "series"],
            &["query", "events"],
            &["query", "nodes"],
            &["select"],
            &["findings"],
            &["stragglers"],
            &["health"],
            &["actions", "show"],
        ] {
            let mut args = command.to_vec();
            args.push("--help");
            let out = run(&program, &args);
            assert!(out.status.success(), "{name} {args:?}: {}", text(&out));
            let line = usage(&out);
            let want = format!("Usage: {name} {} ", command.join(" "));
            assert!(line.starts_with(&want), "{name} {args:?}: {line:?}");
        }
        // An error's usage line too: `query series` without its metric.
        let out = run(&program, &["query", "series"]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert_eq!(usage(&out), format!("Usage: {name} query series <METRIC>"));
    }
    // `railscope collector ...` runs the collector's own commands: its usage lines say so.
    let agent = railscope();
    for (args, want) in [
        (&["collector", "--help"][..], "Usage: railscope collector "),
        (
            &["collector", "run", "--help"],
            "Usage: railscope collector run ",
        ),
        (
            &["collector", "query", "series", "--help"],
            "Usage: railscope collector query series ",
        ),
    ] {
        let out = run(&agent, args);
        assert!(out.status.success(), "{args:?}: {}", text(&out));
        assert!(usage(&out).starts_with(want), "{args:?}: {}", usage(&out));
    }
    // The agent's own commands are unchanged.
    let out = run(&agent, &["report", "--help"]);
    assert!(usage(&out).starts_with("Usage: railscope report "));
}

/// Runs `args` and returns its stdout, which must come with exit status 0.
fn ok(program: &Path, args: &[&str]) -> String {
    let out = run(program, args);
    assert!(
        out.status.success(),
        "{} {args:?}: {}",
        program.display(),
        text(&out)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn whole_command_options_are_taken_anywhere() {
    let dir = scratch_dir("command-line");
    let key = key_file(&dir, KEY_HEX);
    let collector = CollectorProcess::command(COLLECTOR, &key, &dir.join("data")).start();
    let url = collector.url();
    let url = url.as_str();
    let metric = "railscope_ib_port_xmit_bytes_total";
    for (program, name) in binaries() {
        // Every order of `--collector URL` and `--json` around `query`'s subcommand gives
        // the same answer (an empty collector's: no series, no nodes).
        for (what, orders) in [
            (
                "series",
                [
                    &["query", "--collector", url, "--json", "series", metric][..],
                    &["query", "series", metric, "--collector", url, "--json"],
                    &["query", "--json", "series", "--collector", url, metric],
                    &[
                        "query",
                        "series",
                        "--start",
                        "-5m",
                        metric,
                        "--json",
                        "--collector",
                        url,
                    ],
                ],
            ),
            (
                "nodes",
                [
                    &["query", "--collector", url, "--json", "nodes"][..],
                    &["query", "nodes", "--collector", url, "--json"],
                    &["query", "--json", "nodes", "--collector", url],
                    &[
                        "query",
                        "nodes",
                        "--json",
                        "--start",
                        "-5m",
                        "--collector",
                        url,
                    ],
                ],
            ),
        ] {
            let answers: Vec<serde_json::Value> = orders
                .iter()
                .map(|args| {
                    let out = ok(&program, args);
                    serde_json::from_str(&out)
                        .unwrap_or_else(|e| panic!("{name} {args:?}: {e}: {out}"))
                })
                .collect();
            let list = if what == "series" { "series" } else { "nodes" };
            for (args, answer) in orders.iter().zip(&answers) {
                assert_eq!(
                    answer[list],
                    serde_json::json!([]),
                    "{name} {args:?}: {answer}"
                );
            }
        }
        // As text: the URL after the subcommand is the one asked (not the default port).
        let out = ok(&program, &["query", "nodes", "--collector", url]);
        assert!(!out.contains("7671"), "{name}: {out}");
        // The other client commands have no subcommands: any order, as before.
        for args in [
            &["findings", "--json", "--collector", url][..],
            &["findings", "--collector", url, "--json"],
            &["stragglers", "--collector", url, "--json"],
            &["stragglers", "--json", "--collector", url],
        ] {
            let out = ok(&program, args);
            serde_json::from_str::<serde_json::Value>(&out)
                .unwrap_or_else(|e| panic!("{name} {args:?}: {e}: {out}"));
        }
        // A refused URL is reported with the URL given after the subcommand.
        let out = run(
            &program,
            &[
                "query",
                "series",
                metric,
                "--collector",
                "http://127.0.0.1:9",
            ],
        );
        assert!(!out.status.success());
        assert!(
            text(&out).contains("http://127.0.0.1:9/api/v1/series"),
            "{name}: {}",
            text(&out)
        );
    }
    let (stopped, _, stderr) = collector.stop();
    assert!(stopped, "{stderr}");
}
