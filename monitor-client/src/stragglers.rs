//! `railscope stragglers`: the GPUs and ports far from their job's median over a window, as
//! the collector finds them (`/api/v1/stragglers`, docs/findings.md).

use crate::query::get_json;

/// `railscope stragglers [--collector URL] [--json] [--job-id J] [--start T] [--end T]`
#[derive(clap::Args, Debug, Clone)]
pub struct StragglerArgs {
    #[arg(long, default_value = "http://127.0.0.1:7671")]
    pub collector: String,
    #[arg(long)]
    pub json: bool,
    /// Only this job (`slurm:42`, `k8s:<pod uid>`, ...).
    #[arg(long)]
    pub job_id: Option<String>,
    /// The window (default: the last 5 minutes, from the 10 s step they begin in).
    #[arg(long, allow_hyphen_values = true)]
    pub start: Option<String>,
    /// (default: now)
    #[arg(long, allow_hyphen_values = true)]
    pub end: Option<String>,
}

pub fn run(args: &StragglerArgs) -> anyhow::Result<()> {
    // The defaults are the collector's own (its 5-minute window begins on a step).
    let mut query: Vec<(&str, String)> = [("start", &args.start), ("end", &args.end)]
        .into_iter()
        .filter_map(|(k, v)| v.clone().map(|v| (k, v)))
        .collect();
    if let Some(j) = &args.job_id {
        query.push(("job_id", j.clone()));
    }
    let json = get_json(&args.collector, "/api/v1/stragglers", &query)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    let jobs = json["jobs"].as_array().cloned().unwrap_or_default();
    if jobs.is_empty() {
        println!("no jobs in the window");
    }
    for j in jobs {
        let list = j["stragglers"].as_array().cloned().unwrap_or_default();
        println!(
            "job {}: {} nodes, {} GPUs, {} stragglers",
            j["job_id"].as_str().unwrap_or("?"),
            j["nodes"],
            j["gpus"],
            list.len()
        );
        for s in list {
            let place = match (s["gpu"].as_str(), s["device"].as_str()) {
                (Some(g), _) => format!("gpu {g}"),
                (None, Some(d)) => format!("{d}/{}", s["port"]),
                _ => "?".into(),
            };
            println!(
                "  {} {place}: {} {:.4} against the job's {:.4} (score {:.1}{}){}",
                s["node"].as_str().unwrap_or("?"),
                s["metric"].as_str().unwrap_or("?"),
                s["value"].as_f64().unwrap_or(f64::NAN),
                s["median"].as_f64().unwrap_or(f64::NAN),
                s["score"].as_f64().unwrap_or(f64::NAN),
                if s["onset"].as_bool() == Some(true) {
                    ", onset: its latest steps"
                } else {
                    ""
                },
                s["cause"]
                    .as_str()
                    .map(|c| format!(", likely cause {c}"))
                    .unwrap_or_default()
            );
        }
    }
    Ok(())
}
