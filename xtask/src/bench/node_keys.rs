//! `cargo xtask bench node-keys`: what per-node keys cost the collector's ingest, next to one
//! shared key, counted in instructions by callgrind (exact and repeatable, where CPU time on
//! this shared machine is not): the same simulated fleet's frames through `NodeTable::ingest`
//! sealed with one shared key and with each node's own key, and floods of refused datagrams
//! (random node names; forgeries of held nodes from the fleet's own address) against each.
//! The load is `monitor-collector/examples/node_keys_cost.rs`; the report goes to
//! `bench/results/node-keys.md`.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Context as _;
use serde_json::{Value, json};

use crate::{cargo, setup, setup::Tools};

/// Most the CPU per sample may grow with per-node keys (issue 24).
const GOAL_PERCENT: f64 = 5.0;

/// Rounds of 10 s of every node (the first carries each node's schema).
const ROUNDS: u64 = 2;

/// What each run measures, and the function callgrind counts in it.
const RUNS: [(&str, &str); 5] = [
    ("shared", "ingest_all"),
    ("node", "ingest_all"),
    ("flood-shared", "ingest_flood"),
    ("flood", "ingest_flood"),
    ("flood-neighbour", "ingest_flood"),
];

pub(super) fn run(tools: &Tools, nodes: usize) -> anyhow::Result<()> {
    let rounds = ROUNDS;
    setup::ensure_debian_packages(&["valgrind"])?;
    let root = cargo::workspace_root();
    setup::step("building monitor-collector's node_keys_cost example (release)");
    let mut build = cargo::command(tools);
    build.args([
        "build",
        "--release",
        "-p",
        "monitor-collector",
        "--example",
        "node_keys_cost",
    ]);
    let example = cargo::build_executables(build)?
        .into_iter()
        .find(|(name, _)| name == "node_keys_cost")
        .map(|(_, p)| p)
        .context("cargo did not report the node_keys_cost example")?;
    let work = root.join("target/bench/node-keys");
    std::fs::create_dir_all(&work)?;
    let mut rows = Vec::new();
    for (mode, function) in RUNS {
        setup::step(&format!(
            "{mode}: {nodes} nodes x {rounds} rounds under callgrind"
        ));
        rows.push(measure(&example, &work, mode, function, nodes, rounds)?);
    }
    let report = json!({
        "command": command_line(nodes),
        "date": super::utc_now(),
        "nodes": nodes,
        "rounds": rounds,
        "runs": rows,
    });
    let md = markdown(&report)?;
    let out = root.join("bench/results/node-keys.md");
    std::fs::write(&out, &md)?;
    std::fs::write(
        out.with_extension("json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    print!("{md}");
    eprintln!("==> wrote {}", out.display());
    Ok(())
}

fn command_line(nodes: usize) -> String {
    format!("cargo xtask bench node-keys --nodes {nodes}")
}

/// One run under callgrind: the example's JSON line with the instructions of `function`.
fn measure(
    example: &Path,
    work: &Path,
    mode: &str,
    function: &str,
    nodes: usize,
    rounds: u64,
) -> anyhow::Result<Value> {
    let out_file: PathBuf = work.join(format!("callgrind.{mode}"));
    let output = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out_file.display()))
        .arg("--collect-atstart=no")
        .arg(format!("--toggle-collect=node_keys_cost::{function}"))
        .arg(example)
        .args([mode, "--nodes", &nodes.to_string(), "--rounds"])
        .arg(rounds.to_string())
        .output()
        .context("running valgrind")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    anyhow::ensure!(
        output.status.success(),
        "node_keys_cost {mode} under callgrind failed: {stderr}"
    );
    let mut line: Value = stdout
        .lines()
        .find_map(|l| serde_json::from_str(l).ok())
        .with_context(|| format!("node_keys_cost {mode} printed no JSON line: {stdout}"))?;
    let collected: u64 = stderr
        .lines()
        .find_map(|l| l.split("Collected :").nth(1))
        .and_then(|n| n.trim().parse().ok())
        .with_context(|| format!("callgrind reported no count for {mode}: {stderr}"))?;
    anyhow::ensure!(collected > 0, "callgrind counted nothing in {function}");
    line["instructions"] = collected.into();
    Ok(line)
}

fn markdown(r: &Value) -> anyhow::Result<String> {
    let runs = r["runs"].as_array().context("runs")?;
    let get = |mode: &str| {
        runs.iter()
            .find(|x| x["mode"] == mode)
            .with_context(|| format!("no {mode} run"))
    };
    let per = |x: &Value, of: &str| {
        x["instructions"].as_f64().unwrap_or(f64::NAN) / x[of].as_f64().unwrap_or(f64::NAN)
    };
    let (shared, node) = (get("shared")?, get("node")?);
    let growth = (per(node, "samples") / per(shared, "samples") - 1.0) * 100.0;
    let mut md = String::new();
    writeln!(md, "# Per-node keys: what they cost ingest\n")?;
    writeln!(md, "Command: `{}`  ", r["command"].as_str().unwrap_or(""))?;
    writeln!(
        md,
        "Date: {}; instructions counted by callgrind (exact; this machine's CPU time is shared).\n",
        r["date"].as_str().unwrap_or("")
    )?;
    writeln!(
        md,
        "The frames of {} simulated nodes over {} rounds of 10 s (`monitor_testkit::NodeSender`: \
         the agent's own 236 series of a busy node, every reading of every second, flushed \
         every 10 s by the agent's encoder, as `bench collector` sends them) go through \
         `NodeTable::ingest` (MAC, decode, receiver state, live values), sealed with one \
         shared key and with each node's own key (`monitor-collector/examples/node_keys_cost.rs`).\n",
        r["nodes"], r["rounds"]
    )?;
    writeln!(md, "## Goal\n")?;
    writeln!(md, "| goal | value | |\n|---|---|---|")?;
    writeln!(
        md,
        "| CPU per sample with per-node keys at most {GOAL_PERCENT} % above one shared key | {growth:+.2} % | {} |\n",
        if growth <= GOAL_PERCENT {
            "met"
        } else {
            "**not met**"
        }
    )?;
    writeln!(md, "## Accepted traffic\n")?;
    writeln!(
        md,
        "| keys | frames | accepted | samples | instructions | per frame | per sample |\n|---|---|---|---|---|---|---|"
    )?;
    for x in [shared, node] {
        writeln!(
            md,
            "| {} | {} | {} | {} | {} | {:.0} | {:.1} |",
            x["mode"].as_str().unwrap_or(""),
            x["frames"],
            x["accepted"],
            x["samples"],
            x["instructions"],
            per(x, "frames"),
            per(x, "samples"),
        )?;
    }
    writeln!(md, "\n## Floods of refused datagrams\n")?;
    writeln!(
        md,
        "As many datagrams as the fleet's frames, after them: `flood-shared` and `flood` name \
         random nodes (a fleet frame renamed, with a random MAC), from an address no node sent \
         from, against the shared-key and the per-node table; `flood-neighbour` is the worst \
         case for per-node keys: fleet frames with a random MAC, each naming a node the table \
         holds, from the one address every node sent from (a refused frame naming a held node \
         may be tried with the keys of the 8 nodes remembered for its address, at most once a \
         second per named node and 100 times a second in all). Nodes held and resident memory before and after the flood: no \
         state is kept for a refused datagram.\n"
    )?;
    writeln!(
        md,
        "| flood | datagrams | refused by reason | instructions per datagram | nodes before / after | RSS before / after (KiB) |\n|---|---|---|---|---|---|"
    )?;
    for mode in ["flood-shared", "flood", "flood-neighbour"] {
        let x = get(mode)?;
        writeln!(
            md,
            "| {mode} | {} | {} | {:.0} | {} / {} | {} / {} |",
            x["flood_datagrams"],
            x["flood_outcomes"],
            per(x, "flood_datagrams"),
            x["nodes_before"],
            x["nodes_after"],
            x["rss_kib_before"],
            x["rss_kib_after"],
        )?;
    }
    Ok(md)
}
