//! `railscope select`: reads a stored time range through the collector's query API (the
//! metric names, then each metric's series), runs the selection and prints it.

use std::collections::BTreeMap;

use anyhow::Context as _;
use serde_json::Value as Json;

use super::{MetricTrace, Reading, SelectConfig, SeriesTrace, select};
use crate::{
    query::get_json,
    time::{api_seconds, parse_time, unix_ns},
};

/// `railscope select [--collector URL] [--start T] [--end T] ...`
#[derive(clap::Args, Debug, Clone)]
pub struct SelectArgs {
    /// The collector's HTTP address.
    #[arg(long, default_value = "http://127.0.0.1:7671")]
    pub collector: String,
    /// Start of the range: `now`, `-15m`, an RFC 3339 time or Unix seconds.
    #[arg(long, default_value = "-1h", allow_hyphen_values = true)]
    pub start: String,
    /// End of the range.
    #[arg(long, default_value = "now", allow_hyphen_values = true)]
    pub end: String,
    /// Only series matching this label matcher (`node=gpu-node-017`, `gpu=~[0-3]`); repeat
    /// for several.
    #[arg(long = "match", short = 'm', value_name = "MATCHER")]
    pub matchers: Vec<String>,
    /// Only metrics whose name starts with this (e.g. `railscope_gpu_`); repeat for several.
    #[arg(long, value_name = "PREFIX")]
    pub only: Vec<String>,
    /// Grid step the series are compared on (e.g. `1s`, `10s`).
    #[arg(long, default_value = "1s")]
    pub step: humantime::Duration,
    /// A metric whose every series has a max-normalised variance below this is constant.
    #[arg(long, default_value_t = super::variance::DEFAULT_MIN_VARIANCE)]
    pub min_variance: f64,
    /// Two metrics at most this max-normalised RMS distance apart are redundant.
    #[arg(long, default_value_t = super::distance::DEFAULT_MAX_DISTANCE)]
    pub max_distance: f64,
    /// Never drop metrics whose name starts with this; repeat for several. (What a finding
    /// rule, the straggler search or a dashboard view reads is never dropped, nor are failure
    /// counters, constant until something fails.)
    #[arg(long, value_name = "PREFIX")]
    pub keep: Vec<String>,
    /// Let failure counters (names with `error`, `err`, `downed`, `discards`, `dropped`,
    /// `replays`, `ecc`, `remap`, ...) be dropped like any metric; those railscope reads are
    /// kept whatever.
    #[arg(long)]
    pub no_keep_failures: bool,
    /// Print the selection as JSON (with the settings under `sampling`).
    #[arg(long)]
    pub json: bool,
}

/// One series of a `/api/v1/series` answer as readings: a gauge's means over their
/// envelopes' spans, a counter's rates since its previous point (its first point, whose rate
/// comes from before the range, stands for its own instant).
pub fn series_trace(series: &Json) -> Option<SeriesTrace> {
    let labels: BTreeMap<String, String> = series["labels"]
        .as_object()?
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
        .collect();
    let counter = series["kind"] == "counter";
    let mut readings = Vec::new();
    let mut prev_t: Option<u64> = None;
    for p in series["points"].as_array()? {
        let t = p["t"].as_u64()?;
        let reading = if counter {
            p["rate"].as_f64().map(|rate| Reading {
                start_ns: prev_t.unwrap_or(t),
                t_ns: t,
                value: rate,
            })
        } else {
            Some(Reading {
                start_ns: p["start"].as_u64().unwrap_or(t),
                t_ns: t,
                value: p["mean"].as_f64()?,
            })
        };
        readings.extend(reading);
        prev_t = Some(t);
    }
    Some(SeriesTrace { labels, readings })
}

/// What the collector at `collector` reads, and what reads it (`/api/v1/reads`): the finding
/// rules, the straggler search and the dashboard's views of the collector asked, which the
/// selection never drops.
pub fn read_by(collector: &str) -> anyhow::Result<BTreeMap<String, Vec<String>>> {
    let answer = get_json(collector, "/api/v1/reads", &[])?;
    serde_json::from_value(answer["reads"].clone())
        .context("the collector's /api/v1/reads has no \"reads\" map of metric to readers")
}

/// Reads every metric (of the `--only` prefixes) over the range from the collector.
pub fn fetch(args: &SelectArgs, start_ns: u64, end_ns: u64) -> anyhow::Result<Vec<MetricTrace>> {
    let mut range = vec![
        ("start", api_seconds(start_ns)),
        ("end", api_seconds(end_ns)),
    ];
    range.extend(args.matchers.iter().map(|m| ("match", m.clone())));
    let names = get_json(&args.collector, "/api/v1/metric-names", &range)?;
    let mut metrics = Vec::new();
    for m in names["metrics"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[])
    {
        let Some(name) = m["name"].as_str() else {
            continue;
        };
        if !args.only.is_empty() && !args.only.iter().any(|p| name.starts_with(p.as_str())) {
            continue;
        }
        let mut query = vec![("metric", name.to_owned())];
        query.extend(range.iter().cloned());
        let answer = get_json(&args.collector, "/api/v1/series", &query)
            .with_context(|| format!("reading {name}"))?;
        let series: Vec<SeriesTrace> = answer["series"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[])
            .iter()
            .filter_map(series_trace)
            .collect();
        metrics.push(MetricTrace {
            name: name.to_owned(),
            series,
        });
    }
    Ok(metrics)
}

/// Runs `railscope select ...`: prints the report (or JSON) on stdout.
pub fn run(args: &SelectArgs) -> anyhow::Result<()> {
    let now = unix_ns(std::time::SystemTime::now());
    let start_ns =
        parse_time(&args.start, now).with_context(|| format!("--start {}", args.start))?;
    let end_ns = parse_time(&args.end, now).with_context(|| format!("--end {}", args.end))?;
    anyhow::ensure!(
        start_ns < end_ns,
        "--start {} is not before --end {}",
        args.start,
        args.end
    );
    for (flag, v) in [
        ("--min-variance", args.min_variance),
        ("--max-distance", args.max_distance),
    ] {
        anyhow::ensure!(
            v.is_finite() && v >= 0.0,
            "{flag} {v}: not a non-negative number"
        );
    }
    let metrics = fetch(args, start_ns, end_ns)?;
    anyhow::ensure!(
        metrics
            .iter()
            .any(|m| m.series.iter().any(|s| !s.readings.is_empty())),
        "the collector at {} holds no samples from {} to {}",
        args.collector,
        args.start,
        args.end
    );
    let config = SelectConfig {
        step_ns: (args.step.as_nanos() as u64).max(1_000_000),
        min_variance: args.min_variance,
        max_distance: args.max_distance,
        keep: args.keep.clone(),
        keep_failures: !args.no_keep_failures,
        ..SelectConfig::new(start_ns, end_ns, read_by(&args.collector)?)
    };
    let selection = select(&metrics, &config);
    if args.json {
        let mut json = serde_json::to_value(&selection)?;
        json["sampling"] = serde_json::to_value(selection.sampling_settings())?;
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        print!("{}", selection.text());
    }
    Ok(())
}
