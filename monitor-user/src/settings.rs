//! The agent's settings: the flags of `railscope agent` and the keys of
//! `/etc/railscope/agent.toml` are one struct, so every flag can be set in the file under
//! the same name (without `--`), and the flags given override the file
//! (docs/deployment.md, "Configuration files").

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use monitor_config::{
    ConfigError, Layered, Seconds, Sources,
    layers::{is_false, pick},
};
use serde::{Deserialize, Serialize};

use crate::{
    agent::{AgentOptions, OutputFormat},
    jobs::{JobRules, JobSettings},
    kernel::Kernel,
    pipeline::{self, PipelineOptions},
    sender::Target,
    spool::SpoolConfig,
};

/// `collector = "host:port"` or `collector = ["a:7670", "b:7670"]`; a bad address is
/// refused with the address's own error.
fn one_or_more<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Target>, D::Error> {
    struct Visitor;
    impl<'de> serde::de::Visitor<'de> for Visitor {
        type Value = Vec<Target>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a collector address HOST:PORT, or a list of them")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Target::parse(v).map(|t| vec![t]).map_err(E::custom)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(t) = seq.next_element::<Target>()? {
                out.push(t);
            }
            Ok(out)
        }
    }
    d.deserialize_any(Visitor)
}

/// Read when `--config` is not given, if it exists.
pub const DEFAULT_FILE: &str = "/etc/railscope/agent.toml";
pub const DEFAULT_KEY: &str = "/etc/railscope/wire.key";
/// The agent unit's `StateDirectory` (not under the collector's `/var/lib/railscope`, which
/// its unit's `DynamicUser` owns on a host running both).
pub const DEFAULT_SPOOL_DIR: &str = "/var/lib/railscope-agent";
const DEFAULT_RESCAN: Duration = Duration::from_secs(1);
const DEFAULT_SYSFS: &str = "/sys";
const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
const DEFAULT_FLUSH: Duration = Duration::from_secs(10);

/// Everything `railscope agent` can be told, from the file or the command line.
#[derive(Clone, Debug, Default, PartialEq, clap::Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct AgentSettings {
    /// Print events as JSON lines instead of text.
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub json: bool,
    /// Seconds between checks for kernel modules that appeared or went away (default 1).
    #[arg(long, value_name = "SECONDS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rescan: Option<Seconds>,
    /// Also print the live verb counters (per device, verb and cgroup) this often.
    #[arg(long, value_name = "SECONDS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counters: Option<Seconds>,
    /// Send the verb counters of this recording (the JSON lines `--counters S --json`
    /// prints; its latest snapshot, read again each sweep) instead of the probes': to check
    /// what the collector makes of a recorded node's verbs. Not for production: a flag
    /// only, never read from agent.toml.
    #[arg(long, value_name = "FILE", hide = true)]
    #[serde(skip)]
    pub verb_counts_from: Option<PathBuf>,
    /// Send metrics and events to this collector (HOST:PORT, UDP); twice for a collector
    /// pair, each of which gets every frame. Without it the agent only prints events. In the
    /// file: one address, or a list of two.
    #[arg(long, value_name = "HOST:PORT")]
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "one_or_more"
    )]
    pub collector: Vec<Target>,
    /// Bytes of frames kept until the collectors acknowledge them (default 16 MiB: hours of
    /// a node of 8 GPUs and 8 ports).
    #[arg(long, value_name = "BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spool_bytes: Option<u64>,
    /// Seconds a frame no collector acknowledged is kept (default 3600, the collector's
    /// `max-frame-age`; in a pair, a frame one collector has leaves the spool after this).
    #[arg(long, value_name = "SECONDS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spool_age: Option<Seconds>,
    /// Directory where the spool is also written, so that an agent restart loses no frame
    /// not yet acknowledged: its session is resumed (default /var/lib/railscope-agent; one
    /// that cannot be used is named in a warning and the spool kept in memory only).
    #[arg(long, value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spool_dir: Option<PathBuf>,
    /// The key sealing this node's frames: its own, derived from the collector's fleet secret
    /// and its name (`railscope-gen-wire-key --node NAME`), or a cluster's shared key; 32 raw
    /// bytes or 64 hex characters (default /etc/railscope/wire.key).
    #[arg(long, value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
    /// This node's name in the frames (default: the host name).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Directory holding `class/infiniband` (default /sys; a fixture tree for tests).
    #[arg(long, value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sysfs: Option<PathBuf>,
    /// The NVML library to load (default: the system's libnvidia-ml.so.1).
    #[arg(long, value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvml_lib: Option<PathBuf>,
    /// Do not read GPUs.
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub no_gpu: bool,
    /// lldpd's control socket: where it exists, each RoCE port's switch neighbour is asked
    /// of lldpd (`lldpcli`) and sent, for the collector's fabric topology (default
    /// /run/lldpd.socket).
    #[arg(long, value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lldp_socket: Option<PathBuf>,
    /// Seconds between reads of the counters: the sampler's minimum interval (default 1).
    #[arg(long, value_name = "SECONDS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval: Option<Seconds>,
    /// Seconds between sends of the batched samples; events are sent at once (default 10).
    #[arg(long, value_name = "SECONDS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flush: Option<Seconds>,
    /// Send every reading (fixed interval) instead of sampling adaptively.
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub no_adaptive: bool,
    /// Sampling of one metric group, `PREFIX:SETTING,...` (repeatable; later ones win, the
    /// file's before the command line's), e.g. `railscope_gpu_:max=60,ground-truth=4` or
    /// `railscope_ib_symbol_error_total:off`. Settings: `off`/`on` (fixed interval or
    /// adaptive), `max=SECONDS` (longest collection interval, default 32 intervals),
    /// `ground-truth=N` (a stable series is read at least every N intervals; IB default 2,
    /// others 1), `window=N`, `tolerance=FRACTION`, `density=FRACTION`, `jitter=FRACTION`,
    /// `floor=VALUE`.
    #[arg(long, value_name = "PREFIX:SETTINGS")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sampling: Vec<String>,
    /// How cgroups name their jobs beyond the built-in rules (Slurm, Kubernetes, systemd):
    /// the file's `[[jobs.patterns]]` (`regex`, `id`, `step`); no flag.
    #[arg(skip)]
    #[serde(skip_serializing_if = "JobSettings::is_empty")]
    pub jobs: JobSettings,
}

impl Layered for AgentSettings {
    fn defaults() -> Self {
        Self {
            rescan: Some(seconds(DEFAULT_RESCAN)),
            key: Some(DEFAULT_KEY.into()),
            spool_dir: Some(DEFAULT_SPOOL_DIR.into()),
            sysfs: Some(DEFAULT_SYSFS.into()),
            interval: Some(seconds(DEFAULT_INTERVAL)),
            flush: Some(seconds(DEFAULT_FLUSH)),
            ..Self::default()
        }
    }

    fn overridden_by(self, over: Self) -> Self {
        // Destructured so that a new setting that is not layered here does not compile.
        let Self {
            json,
            rescan,
            counters,
            verb_counts_from,
            collector,
            spool_bytes,
            spool_age,
            spool_dir,
            key,
            node,
            sysfs,
            nvml_lib,
            no_gpu,
            lldp_socket,
            interval,
            flush,
            no_adaptive,
            mut sampling,
            jobs,
        } = self;
        sampling.extend(over.sampling);
        Self {
            json: json || over.json,
            rescan: pick(rescan, over.rescan),
            counters: pick(counters, over.counters),
            verb_counts_from: pick(verb_counts_from, over.verb_counts_from),
            collector: if over.collector.is_empty() {
                collector
            } else {
                over.collector
            },
            spool_bytes: pick(spool_bytes, over.spool_bytes),
            spool_age: pick(spool_age, over.spool_age),
            spool_dir: pick(spool_dir, over.spool_dir),
            key: pick(key, over.key),
            node: pick(node, over.node),
            sysfs: pick(sysfs, over.sysfs),
            nvml_lib: pick(nvml_lib, over.nvml_lib),
            no_gpu: no_gpu || over.no_gpu,
            lldp_socket: pick(lldp_socket, over.lldp_socket),
            interval: pick(interval, over.interval),
            flush: pick(flush, over.flush),
            no_adaptive: no_adaptive || over.no_adaptive,
            sampling,
            jobs: if over.jobs.is_empty() {
                jobs
            } else {
                over.jobs
            },
        }
    }
}

fn seconds(d: Duration) -> Seconds {
    Seconds::new(d.as_secs_f64()).expect("the built-in defaults are positive")
}

/// Reads the settings: `--config FILE`, else [`DEFAULT_FILE`] if it exists, under `flags`.
pub fn load(
    config: Option<&Path>,
    flags: AgentSettings,
) -> Result<Sources<AgentSettings>, ConfigError> {
    Sources::load(config, Path::new(DEFAULT_FILE), flags)
}

/// What the agent runs with, every value checked (a sampling setting that cannot be used
/// is named with where it was set). Reads nothing but the host name.
pub fn agent_options(sources: &Sources<AgentSettings>) -> Result<AgentOptions, ConfigError> {
    let s = sources.merged();
    let interval = s.interval.map_or(DEFAULT_INTERVAL, Seconds::duration);
    let adaptive = !s.no_adaptive;
    pipeline::sampler_config(interval, adaptive, &s.sampling)
        .map_err(|e| sources.error("sampling", e))?;
    if s.collector.len() > crate::spool::MAX_COLLECTORS {
        return Err(sources.error(
            "collector",
            format!(
                "{} collectors given: at most {}",
                s.collector.len(),
                crate::spool::MAX_COLLECTORS
            ),
        ));
    }
    let defaults = SpoolConfig::default();
    let spool = SpoolConfig {
        max_bytes: s.spool_bytes.map_or(defaults.max_bytes, |b| {
            usize::try_from(b).unwrap_or(usize::MAX)
        }),
        max_age: s.spool_age.map_or(defaults.max_age, Seconds::duration),
        ..defaults
    };
    let pipeline = (!s.collector.is_empty()).then(|| PipelineOptions {
        collectors: s.collector.clone(),
        spool,
        spool_dir: Some(
            s.spool_dir
                .clone()
                .unwrap_or_else(|| DEFAULT_SPOOL_DIR.into()),
        ),
        key: s.key.clone().unwrap_or_else(|| DEFAULT_KEY.into()),
        node: s.node.clone().unwrap_or_else(pipeline::hostname),
        sysfs_root: s.sysfs.clone().unwrap_or_else(|| DEFAULT_SYSFS.into()),
        gpu: !s.no_gpu,
        nvml_lib: s.nvml_lib.clone(),
        lldp_socket: s
            .lldp_socket
            .clone()
            .unwrap_or_else(|| crate::sources::lldp::DEFAULT_SOCKET.into()),
        interval,
        flush_every: s.flush.map_or(DEFAULT_FLUSH, Seconds::duration),
        adaptive,
        sampling: s.sampling.clone(),
        jobs: JobRules::new(&s.jobs),
    });
    Ok(AgentOptions {
        format: if s.json {
            OutputFormat::Json
        } else {
            OutputFormat::Text
        },
        rescan: s.rescan.map_or(DEFAULT_RESCAN, Seconds::duration),
        counters_every: s.counters.map(Seconds::duration),
        kernel: Kernel::default(),
        jobs: JobRules::new(&s.jobs),
        pipeline,
        verb_counts_from: s.verb_counts_from.clone(),
    })
}

/// `railscope agent --check-config`: [`agent_options`], and the key file read when the agent
/// sends. Returns the settings in effect, as TOML.
pub fn check(sources: &Sources<AgentSettings>) -> Result<String, ConfigError> {
    let options = agent_options(sources)?;
    if let Some(pipeline) = &options.pipeline {
        monitor_wire::Key::from_file(&pipeline.key).map_err(|e| sources.error("key", e))?;
    }
    Ok(sources.merged_toml())
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory as _, Parser};
    use monitor_config::ConfigFile;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        settings: AgentSettings,
    }

    fn flags(args: &[&str]) -> AgentSettings {
        Cli::try_parse_from(std::iter::once("agent").chain(args.iter().copied()))
            .unwrap()
            .settings
    }

    fn sources(text: &str, args: &[&str]) -> Result<Sources<AgentSettings>, ConfigError> {
        Sources::from_file(
            ConfigFile::from_text("/etc/railscope/agent.toml", text),
            flags(args),
        )
    }

    fn example() -> String {
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../dist/agent.toml"))
            .expect("dist/agent.toml")
    }

    #[test]
    fn flags_override_the_file() {
        let text = "collector = \"c1:7670\"\ninterval = 2\nflush = 30\nno-gpu = true\n";
        let options = agent_options(&sources(text, &["--interval", "0.5"]).unwrap()).unwrap();
        let pipeline = options.pipeline.unwrap();
        assert_eq!(pipeline.interval, Duration::from_millis(500));
        assert_eq!(pipeline.flush_every, Duration::from_secs(30));
        assert_eq!(pipeline.collectors, vec![Target::parse("c1:7670").unwrap()]);
        assert_eq!(pipeline.spool, SpoolConfig::default());
        assert_eq!(
            pipeline.spool_dir.as_deref(),
            Some(Path::new(DEFAULT_SPOOL_DIR))
        );
        assert!(!pipeline.gpu);
        assert_eq!(pipeline.key, Path::new(DEFAULT_KEY));
        let options = agent_options(&sources(text, &["--collector", "c2:1"]).unwrap()).unwrap();
        assert_eq!(options.pipeline.unwrap().collectors[0].to_string(), "c2:1");
        // A pair, from the file or the flags; the spool's bounds.
        let pair = "collector = [\"a:7670\", \"b:7670\"]\nspool-bytes = 1000000\nspool-age = 600\nspool-dir = \"/srv/spool\"\n";
        let pipeline = agent_options(&sources(pair, &[]).unwrap())
            .unwrap()
            .pipeline
            .unwrap();
        let names: Vec<String> = pipeline
            .collectors
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(names, ["a:7670", "b:7670"]);
        assert_eq!(pipeline.spool.max_bytes, 1_000_000);
        assert_eq!(pipeline.spool.max_age, Duration::from_secs(600));
        assert_eq!(pipeline.spool_dir.as_deref(), Some(Path::new("/srv/spool")));
        let flags = ["--collector", "c:1", "--collector", "d:2"];
        let pipeline = agent_options(&sources(pair, &flags).unwrap())
            .unwrap()
            .pipeline
            .unwrap();
        assert_eq!(pipeline.collectors.len(), 2);
        assert_eq!(pipeline.collectors[1].to_string(), "d:2");
    }

    #[test]
    fn without_a_file_the_defaults_hold() {
        let options = agent_options(&Sources::flags_only(flags(&[]))).unwrap();
        assert_eq!(options.rescan, DEFAULT_RESCAN);
        assert!(options.pipeline.is_none());
        assert_eq!(options.format, OutputFormat::Text);
    }

    #[test]
    fn bad_values_name_the_file_line_and_key() {
        let e = sources("json = true\ninterval = 0\n", &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("/etc/railscope/agent.toml:2:12: key `interval`: "),
            "{e}"
        );
        let e = sources("collector = \"nohost\"\n", &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("/etc/railscope/agent.toml:1:13: key `collector`: "),
            "{e}"
        );
        assert!(e.contains("HOST:PORT"), "{e}");
        let e = sources("\ncolector = \"h:1\"\n", &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("/etc/railscope/agent.toml:2:1: key `colector`: unknown field"),
            "{e}"
        );
        let e = sources("json = \"yes\"\n", &[]).unwrap_err().to_string();
        assert!(
            e.starts_with("/etc/railscope/agent.toml:1:8: key `json`: "),
            "{e}"
        );
    }

    #[test]
    fn a_bad_sampling_setting_is_named_where_it_was_set() {
        let text = "\nsampling = [\"railscope_gpu_:max=fast\"]\n";
        let e = agent_options(&sources(text, &[]).unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("/etc/railscope/agent.toml:2:1: key `sampling`: "),
            "{e}"
        );
        assert!(e.contains("max=fast"), "{e}");
        let e = agent_options(&sources("", &["--sampling", "nocolon"]).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--sampling: "), "{e}");
    }

    #[test]
    fn a_bad_job_pattern_is_named_at_its_line() {
        let text = "json = true\n\n[[jobs.patterns]]\nregex = '^/run-(\\d+)'\nid = \"run:$1\"\n\n[[jobs.patterns]]\nregex = '^/x-(\\d+'\nid = \"x:$1\"\n";
        let e = sources(text, &[]).unwrap_err().to_string();
        assert!(
            e.starts_with("/etc/railscope/agent.toml:8:9: key `jobs.patterns.regex`: bad regular expression \"^/x-(\\\\d+\": "),
            "{e}"
        );
        assert!(!e.contains('\n'), "one line: {e}");
        // The good one alone is taken, and names its jobs.
        let good: String = text.lines().take(5).map(|l| format!("{l}\n")).collect();
        let options = agent_options(&sources(&good, &[]).unwrap()).unwrap();
        assert_eq!(
            options
                .jobs
                .job_of("/run-17/rank0")
                .map(|j| j.id)
                .as_deref(),
            Some("run:17")
        );
        // --check-config shows it as written.
        let shown = check(&sources(&good, &[]).unwrap()).unwrap();
        assert!(
            shown.contains("[[jobs.patterns]]")
                && shown.contains("regex = '^/run-(\\d+)'")
                && shown.contains("id = \"run:$1\""),
            "{shown}"
        );
    }

    #[test]
    fn check_names_an_unreadable_key_file() {
        let text = "collector = \"c:1\"\nkey = \"/nonexistent/wire.key\"\n";
        let e = check(&sources(text, &[]).unwrap()).unwrap_err().to_string();
        assert!(
            e.starts_with("/etc/railscope/agent.toml:2:1: key `key`: "),
            "{e}"
        );
        let shown = check(&sources("json = true\n", &[]).unwrap()).unwrap();
        assert!(
            shown.contains("json = true") && shown.contains("interval = 1.0"),
            "{shown}"
        );
    }

    /// `key = value`, as the example shows a setting commented out (`#key = value`), unlike
    /// its prose (`# text`).
    fn is_setting(line: &str) -> bool {
        line.starts_with(|c: char| c.is_ascii_lowercase()) && line.contains(" = ")
    }

    /// The example installed with the package parses as it is, and with every commented
    /// setting switched on; and it shows every setting the command line has (hidden flags
    /// aside).
    #[test]
    fn the_example_file_documents_every_setting() {
        let text = example();
        agent_options(&sources(&text, &[]).unwrap()).unwrap();
        let uncommented: String = text
            .lines()
            .map(|l| l.strip_prefix('#').filter(|l| is_setting(l)).unwrap_or(l))
            .map(|l| format!("{l}\n"))
            .collect();
        let all = sources(&uncommented, &[]).expect("every commented setting parses");
        agent_options(&all).expect("every commented setting is valid");
        // A hidden flag (a test's, like `--verb-counts-from`) is not a setting of the file.
        for arg in Cli::command().get_arguments().filter(|a| !a.is_hide_set()) {
            let Some(flag) = arg.get_long() else { continue };
            assert!(
                uncommented
                    .lines()
                    .any(|l| l.starts_with(&format!("{flag} = "))),
                "dist/agent.toml does not show `{flag}`"
            );
        }
    }
}
