//! `railscope export`: a node's range of a collector's archive as a capture file
//! (docs/capture-format.md), for `railscope report`; the collector makes it
//! (`/api/v1/export`), this asks for it and writes it.

use std::time::Duration;

use anyhow::Context as _;

use crate::{client::Client, query::RangeArgs};

/// `railscope export --node N [--start T] [--end T] --out FILE`: asks a collector
/// for a node's range as a capture file.
#[derive(clap::Args, Debug, Clone)]
pub struct ExportArgs {
    /// The collector's HTTP address.
    #[arg(long, default_value = "http://127.0.0.1:7671")]
    pub collector: String,
    /// The node.
    #[arg(long)]
    pub node: String,
    #[command(flatten)]
    pub range: RangeArgs,
    /// Where to write the capture file.
    #[arg(long, value_name = "FILE")]
    pub out: std::path::PathBuf,
}

/// Runs `railscope export`.
pub fn run(args: &ExportArgs) -> anyhow::Result<()> {
    let body = fetch_export(
        &args.collector,
        &args.node,
        &args.range.start,
        &args.range.end,
    )?;
    std::fs::write(&args.out, &body).with_context(|| format!("writing {}", args.out.display()))
}

/// The capture file of `node` between `start` and `end` (as `/api/v1/export` takes them) from
/// the collector at `collector`: what `railscope report --collector` reports on, and
/// `railscope actions show` for a port's finding.
pub fn fetch_export(
    collector: &str,
    node: &str,
    start: &str,
    end: &str,
) -> anyhow::Result<Vec<u8>> {
    let url = format!("{}/api/v1/export", collector.trim_end_matches('/'));
    let client = Client::from_env(Duration::from_secs(300))?;
    let mut response = client
        .get(&url)
        .query("node", node)
        .query("start", start)
        .query("end", end)
        .call()
        .with_context(|| format!("asking the collector at {url}"))?;
    let status = response.status();
    let body = response
        .body_mut()
        .with_config()
        .limit(4 << 30)
        .read_to_vec()
        .with_context(|| format!("reading the answer of {url}"))?;
    if !status.is_success() {
        let reason = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|j| j["error"].as_str().map(str::to_owned))
            .unwrap_or_else(|| "no reason given".into());
        anyhow::bail!("the collector refused the export ({status}): {reason}");
    }
    Ok(body)
}
