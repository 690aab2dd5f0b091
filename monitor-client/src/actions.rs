//! `railscope actions [--json]`, `railscope actions release` and `railscope actions show ID`:
//! the client of `/api/v1/actions`, `POST /api/v1/actions/release` and (with
//! `actions_show`) `/api/v1/actions/finding`.

use std::{fmt::Write as _, time::Duration};

use anyhow::Context as _;
use serde_json::Value as Json;

use crate::{
    actions_show::{self, record_line},
    client::Client,
    query::get_json,
};

/// `railscope actions [--collector URL] [--json] [release]`
#[derive(clap::Args, Debug, Clone)]
pub struct ActionsArgs {
    /// The collector's HTTP address.
    #[arg(long, default_value = "http://127.0.0.1:7671", global = true)]
    pub collector: String,
    /// Print the API's JSON answer instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Option<ActionsCommand>,
}

#[derive(clap::Subcommand, Debug, Clone)]
pub enum ActionsCommand {
    /// Let the drains the brake holds go ahead (admin role); the brake counts from now.
    Release,
    /// The evidence around an action: the finding, its evidence, the actions about it, the
    /// node's events around it and, for a port, the port's flight-recorder report from the
    /// archive.
    Show {
        /// A finding's id (as `railscope actions` and `railscope findings --json` show it),
        /// or an audit record's `seq`.
        id: String,
    },
}

pub fn run(args: &ActionsArgs) -> anyhow::Result<()> {
    let json = match &args.command {
        None => get_json(&args.collector, "/api/v1/actions", &[])?,
        Some(ActionsCommand::Release) => post_json(&args.collector, "/api/v1/actions/release")?,
        Some(ActionsCommand::Show { id }) => {
            let shown = actions_show::gather(&args.collector, id)?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&shown.to_json())?);
            } else {
                print!("{}", shown.to_text());
            }
            return Ok(());
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else if args.command.is_some() {
        let nodes: Vec<&str> = json["released"]
            .as_array()
            .map(|a| a.iter().filter_map(Json::as_str).collect())
            .unwrap_or_default();
        if nodes.is_empty() {
            println!("released: the brake held nothing");
        } else {
            println!("released: {}", nodes.join(", "));
        }
    } else {
        print!("{}", text(&json));
    }
    Ok(())
}

fn post_json(collector: &str, path: &str) -> anyhow::Result<Json> {
    let url = format!("{}{path}", collector.trim_end_matches('/'));
    let client = Client::from_env(Duration::from_secs(60))?;
    let mut response = client
        .post(&url)
        .send_empty()
        .with_context(|| format!("asking the collector at {url}"))?;
    let status = response.status();
    let body = response
        .body_mut()
        .read_to_string()
        .with_context(|| format!("reading the answer of {url}"))?;
    if !status.is_success() {
        anyhow::bail!("the collector refused ({status}): {}", body.trim());
    }
    serde_json::from_str(&body)
        .with_context(|| format!("{url} answered {status} with something that is not JSON"))
}

/// The mode, the brake, the nodes acted on, and the latest records, one line each.
pub fn text(json: &Json) -> String {
    let mut out = String::new();
    let brake = &json["brake"];
    let _ = writeln!(
        out,
        "mode: {}; brake: {} of {} nodes drained in the last {} s{}",
        if json["dry_run"] == true {
            "dry run (rules may override)"
        } else {
            "acting"
        },
        brake["drained_in_window"],
        brake["limit"],
        brake["window_s"],
        if brake["engaged"] == true {
            format!(
                ", ENGAGED: holding {} (`railscope actions release`)",
                brake["held"]
                    .as_array()
                    .map(|a| a
                        .iter()
                        .filter_map(Json::as_str)
                        .collect::<Vec<_>>()
                        .join(", "))
                    .unwrap_or_default()
            )
        } else {
            String::new()
        }
    );
    let nodes = json["nodes"].as_array().cloned().unwrap_or_default();
    if nodes.is_empty() {
        out.push_str("no node acted on\n");
    }
    for n in nodes {
        let _ = writeln!(
            out,
            "{:<16} {:<9}{} {}",
            n["node"].as_str().unwrap_or("?"),
            n["phase"].as_str().unwrap_or("?"),
            if n["dry_run"] == true {
                " (dry run)"
            } else {
                ""
            },
            n["reason"].as_str().unwrap_or(""),
        );
    }
    let records = json["records"].as_array().cloned().unwrap_or_default();
    if !records.is_empty() {
        out.push_str("recent:\n");
    }
    for r in records.iter().rev().take(20).rev() {
        let _ = writeln!(out, "{}", record_line(r));
    }
    out
}
