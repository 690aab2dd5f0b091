//! The collector's settings: the flags of `railscope-collector run` and the keys of
//! `/etc/railscope/collector.toml` are one struct, so every flag can be set in the file
//! under the same name (without `--`), and the flags given override the file
//! (docs/deployment.md, "Configuration files").

use std::{
    fmt,
    net::SocketAddr,
    num::NonZeroUsize,
    path::{Path, PathBuf},
    str::FromStr,
    sync::Arc,
    time::{Duration, SystemTime},
};

use monitor_config::{
    Age, ConfigError, Layered, Sources,
    layers::{is_false, pick},
};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{CollectorConfig, Limits, config::ConfigError as LimitsError, web::WebAuth};
use monitor_archive::archive::ArchiveConfig;
use monitor_remote_write::{EndpointConfig, EndpointTable, RemoteWriteError};

/// Read when `--config` is not given, if it exists.
pub const DEFAULT_FILE: &str = "/etc/railscope/collector.toml";
const DEFAULT_LISTEN: &str = "0.0.0.0:7670";
const DEFAULT_KEY: &str = "/etc/railscope/wire.key";
const DEFAULT_DATA: &str = "/var/lib/railscope";
const DEFAULT_RETENTION_AGE: Duration = Duration::from_secs(30 * 86_400);

/// Everything `railscope-collector run` can be told, from the file or the command line.
#[derive(Clone, Debug, Default, PartialEq, clap::Args, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct CollectorSettings {
    /// UDP address the agents send to (`railscope agent --collector HOST:PORT`; default
    /// 0.0.0.0:7670).
    #[arg(long, value_name = "ADDR:PORT")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// Receive sockets and threads on that address (default: one per core).
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sockets: Option<NonZeroUsize>,
    /// HTTP address of /metrics, the live view and the query API (default 0.0.0.0:7671 with
    /// a web config file, else 127.0.0.1:7671).
    #[arg(long, value_name = "ADDR:PORT")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http: Option<SocketAddr>,
    /// No HTTP server.
    #[arg(long)]
    #[serde(skip_serializing_if = "is_false")]
    pub no_http: bool,
    /// Prometheus' web config file (YAML): TLS, basic-auth users and railscope's roles of the
    /// HTTP API (docs/http-api.md, "Authentication"); re-read on SIGHUP and POST /-/reload.
    #[arg(long = "web.config.file", value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub web_config_file: Option<PathBuf>,
    /// Serve the HTTP API on a non-loopback address without authentication.
    #[arg(long = "web.allow-unauthenticated")]
    #[serde(skip_serializing_if = "is_false")]
    pub web_allow_unauthenticated: bool,
    /// The cluster's shared key, which every node holds (32 raw bytes or 64 hex characters;
    /// default /etc/railscope/wire.key when no fleet secret is given). With a fleet secret,
    /// accepted only while nodes move to their own keys (docs/deployment.md, "Keys").
    #[arg(long, value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
    /// The fleet secret each node's own key is derived from (`railscope-gen-wire-key`).
    #[arg(long, value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fleet_secret: Option<PathBuf>,
    /// The fleet secret before the last rotation: its node keys are accepted until
    /// `previous-fleet-secret-until`, and archived frames sealed with them stay readable.
    #[arg(long, value_name = "PATH")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_fleet_secret: Option<PathBuf>,
    /// End of the rotation window, RFC 3339 (e.g. 2026-12-01T00:00:00Z): afterwards frames
    /// sealed with the previous secret's keys are refused (`retired_key`).
    #[arg(long, value_name = "TIME")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_fleet_secret_until: Option<Deadline>,
    /// Data directory of the archive (default /var/lib/railscope).
    #[arg(long, value_name = "DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<PathBuf>,
    /// Nodes held at once (memory bound; see docs/collector.md, "Memory bounds"; default 10000).
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_nodes: Option<usize>,
    /// Series one node session may hold (at most 65536; default 20000).
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_series_per_node: Option<usize>,
    /// Series held over all nodes (default 4000000).
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_series: Option<usize>,
    /// Recent events kept for the live view (default 10000).
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_recent_events: Option<usize>,
    /// Frames sent longer ago than this many seconds are dropped, and forgotten nodes'
    /// frames cannot be replayed (default 3600, less than a day).
    #[arg(long, value_name = "SECONDS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_frame_age: Option<u64>,
    /// Archive segments whose newest frame is older than this are deleted (e.g. 30d, 12h;
    /// 0: kept whatever their age; default 30d).
    #[arg(long, value_name = "AGE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention_age: Option<Age>,
    /// The oldest archive segments are deleted to keep the archive under this many bytes.
    #[arg(long, value_name = "BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention_bytes: Option<u64>,
    /// Most points one query answer may hold (a larger one is refused with a message saying
    /// so): bounds a query's memory at about 140 B a point (default 1000000).
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub query_max_points: Option<usize>,
    /// Remote-write the archive's samples to this Prometheus-compatible endpoint, e.g.
    /// vm=http://127.0.0.1:8428/api/v1/write (NAME names its cursor and metrics; an https://
    /// URL is verified against the system's roots). Repeatable; the file's endpoints and the
    /// command line's are all used.
    #[arg(long = "remote-write", value_name = "NAME=URL")]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub remote_write: Vec<RemoteWriteSpec>,
    /// Remote-write endpoints with TLS, authentication or headers: `[[remote-write-endpoint]]`
    /// tables of the file only (docs/deployment.md lists their keys).
    #[arg(skip)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub remote_write_endpoint: Vec<EndpointTable>,
    /// The health findings' thresholds: the `[findings]` table of the file only
    /// (docs/findings.md lists every key, its default and its source).
    #[arg(skip)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub findings: Option<monitor_findings::Thresholds>,
    /// Actions on findings: the `[actions]` table of the file only (docs/actions.md lists
    /// every key, its default and why). Without it the collector acts on nothing.
    #[arg(skip)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actions: Option<monitor_actions::ActionsConfig>,
}

/// A point in time, written as RFC 3339 (`2026-12-01T00:00:00Z`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline(pub SystemTime);

impl FromStr for Deadline {
    type Err = humantime::TimestampError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        humantime::parse_rfc3339_weak(text).map(Self)
    }
}

impl fmt::Display for Deadline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_rfc3339_seconds(self.0))
    }
}

impl Serialize for Deadline {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Deadline {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A remote-write endpoint as `NAME=URL`, with the default settings.
#[derive(Clone, Debug, PartialEq)]
pub struct RemoteWriteSpec(pub EndpointConfig);

impl FromStr for RemoteWriteSpec {
    type Err = RemoteWriteError;
    fn from_str(spec: &str) -> Result<Self, RemoteWriteError> {
        EndpointConfig::parse(spec).map(Self)
    }
}

impl fmt::Display for RemoteWriteSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.0.name, self.0.url)
    }
}

impl Serialize for RemoteWriteSpec {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for RemoteWriteSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl Layered for CollectorSettings {
    fn defaults() -> Self {
        let limits = Limits::default();
        Self {
            listen: DEFAULT_LISTEN.parse().ok(),
            data: Some(DEFAULT_DATA.into()),
            max_nodes: Some(limits.max_nodes),
            max_series_per_node: Some(limits.max_series_per_node),
            max_series: Some(limits.max_series),
            max_recent_events: Some(limits.max_recent_events),
            max_frame_age: Some(limits.max_frame_age.as_secs()),
            retention_age: Some(DEFAULT_RETENTION_AGE.into()),
            query_max_points: Some(monitor_archive::query::engine::DEFAULT_MAX_POINTS),
            ..Self::default()
        }
    }

    fn overridden_by(self, over: Self) -> Self {
        // Destructured so that a new setting that is not layered here does not compile.
        let Self {
            listen,
            sockets,
            http,
            no_http,
            web_config_file,
            web_allow_unauthenticated,
            key,
            fleet_secret,
            previous_fleet_secret,
            previous_fleet_secret_until,
            data,
            max_nodes,
            max_series_per_node,
            max_series,
            max_recent_events,
            max_frame_age,
            retention_age,
            retention_bytes,
            query_max_points,
            mut remote_write,
            mut remote_write_endpoint,
            findings,
            actions,
        } = self;
        remote_write.extend(over.remote_write);
        remote_write_endpoint.extend(over.remote_write_endpoint);
        Self {
            listen: pick(listen, over.listen),
            sockets: pick(sockets, over.sockets),
            http: pick(http, over.http),
            no_http: no_http || over.no_http,
            web_config_file: pick(web_config_file, over.web_config_file),
            web_allow_unauthenticated: web_allow_unauthenticated || over.web_allow_unauthenticated,
            key: pick(key, over.key),
            fleet_secret: pick(fleet_secret, over.fleet_secret),
            previous_fleet_secret: pick(previous_fleet_secret, over.previous_fleet_secret),
            previous_fleet_secret_until: pick(
                previous_fleet_secret_until,
                over.previous_fleet_secret_until,
            ),
            data: pick(data, over.data),
            max_nodes: pick(max_nodes, over.max_nodes),
            max_series_per_node: pick(max_series_per_node, over.max_series_per_node),
            max_series: pick(max_series, over.max_series),
            max_recent_events: pick(max_recent_events, over.max_recent_events),
            max_frame_age: pick(max_frame_age, over.max_frame_age),
            retention_age: pick(retention_age, over.retention_age),
            retention_bytes: pick(retention_bytes, over.retention_bytes),
            query_max_points: pick(query_max_points, over.query_max_points),
            remote_write,
            remote_write_endpoint,
            findings: pick(findings, over.findings),
            actions: pick(actions, over.actions),
        }
    }
}

/// Reads the settings: `--config FILE`, else [`DEFAULT_FILE`] if it exists, under `flags`.
pub fn load(
    config: Option<&Path>,
    flags: CollectorSettings,
) -> Result<Sources<CollectorSettings>, ConfigError> {
    Sources::load(config, Path::new(DEFAULT_FILE), flags)
}

/// What `railscope-collector run` starts: the collector, its archive and its remote-write
/// endpoints.
#[derive(Debug)]
pub struct RunPlan {
    pub collector: CollectorConfig,
    pub archive: ArchiveConfig,
    pub remote_write: Vec<EndpointConfig>,
    /// Most points one query answer may hold.
    pub query_max_points: usize,
    /// The health findings' thresholds.
    pub findings: monitor_findings::Thresholds,
    /// The actions on findings, where `[actions]` is given.
    pub actions: Option<monitor_actions::ActionsConfig>,
}

/// The memory bounds the settings give, checked; a bound that cannot be used is named with
/// where it was set.
pub fn limits(sources: &Sources<CollectorSettings>) -> Result<Limits, ConfigError> {
    let s = sources.merged();
    let defaults = Limits::default();
    let limits = Limits {
        max_nodes: s.max_nodes.unwrap_or(defaults.max_nodes),
        max_series_per_node: s
            .max_series_per_node
            .unwrap_or(defaults.max_series_per_node),
        max_series: s.max_series.unwrap_or(defaults.max_series),
        max_recent_events: s.max_recent_events.unwrap_or(defaults.max_recent_events),
        max_frame_age: s
            .max_frame_age
            .map_or(defaults.max_frame_age, Duration::from_secs),
        ..defaults
    };
    limits.validate().map_err(|e| {
        let key = match &e {
            LimitsError::SeriesPerNode(_) => "max-series-per-node",
            LimitsError::Zero { what } => match *what {
                "max nodes" => "max-nodes",
                "max series" => "max-series",
                _ => "max-series-per-node",
            },
            LimitsError::NodeTtl => "max-frame-age",
        };
        sources.error(key, e)
    })?;
    Ok(limits)
}

/// The keys frames are accepted with, their files read: the fleet secret's node keys, the
/// previous secret's during a rotation, and the shared key (by default, only on a cluster
/// without a fleet secret).
fn keyring(
    sources: &Sources<CollectorSettings>,
    s: &CollectorSettings,
) -> Result<monitor_wire::Keyring, ConfigError> {
    use monitor_wire::{FleetSecret, Key, Keyring, PreviousSecret};
    let secret = |key: &str, path: &Option<PathBuf>| {
        path.as_ref()
            .map(|p| FleetSecret::from_file(p).map_err(|e| sources.error(key, e)))
            .transpose()
    };
    let current = secret("fleet-secret", &s.fleet_secret)?;
    let previous = secret("previous-fleet-secret", &s.previous_fleet_secret)?;
    if previous.is_some() && current.is_none() {
        return Err(sources.error(
            "previous-fleet-secret",
            "a previous fleet secret needs the current one (fleet-secret)",
        ));
    }
    if s.previous_fleet_secret_until.is_some() && previous.is_none() {
        return Err(sources.error(
            "previous-fleet-secret-until",
            "no previous-fleet-secret to end the window of",
        ));
    }
    let previous = previous.map(|secret| PreviousSecret {
        secret,
        until_unix_ns: s.previous_fleet_secret_until.map(|d| {
            d.0.duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |t| t.as_nanos() as u64)
        }),
    });
    let shared_path = match (&s.key, &current) {
        (Some(path), _) => Some(path.clone()),
        (None, None) => Some(PathBuf::from(DEFAULT_KEY)),
        (None, Some(_)) => None,
    };
    let shared = shared_path
        .map(|p| Key::from_file(&p).map_err(|e| sources.error("key", e)))
        .transpose()?;
    if current.is_some() && shared.is_some() {
        tracing::warn!(
            "frames sealed with the shared key are accepted next to per-node keys: a node \
             holding it can speak for every node not yet on its own key (remove `key` once \
             every node has its own)"
        );
    }
    Keyring::new(current, previous, shared).map_err(|e| sources.error("key", e))
}

/// Every value checked and the key file read; a setting that cannot be used is named with
/// where it was set.
pub fn run_plan(sources: &Sources<CollectorSettings>) -> Result<RunPlan, ConfigError> {
    let limits = limits(sources)?;
    let s = sources.merged();
    let remote_write = remote_write_endpoints(sources, &s)?;
    let (http, web) = web_plan(sources, &s)?;
    let keys = keyring(sources, &s)?;
    let data = s.data.unwrap_or_else(|| DEFAULT_DATA.into());
    let sockets = s.sockets.map_or_else(
        || std::thread::available_parallelism().map_or(1, NonZeroUsize::get),
        NonZeroUsize::get,
    );
    let mut archive = ArchiveConfig::new(&data);
    let retention_age = s.retention_age.map_or(DEFAULT_RETENTION_AGE, Age::duration);
    archive.retention_age = (!retention_age.is_zero()).then_some(retention_age);
    archive.retention_bytes = s.retention_bytes;
    Ok(RunPlan {
        collector: CollectorConfig {
            listen: s
                .listen
                .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 7670))),
            sockets,
            http,
            web,
            data_dir: data,
            keys,
            limits,
        },
        archive,
        remote_write,
        query_max_points: match s.query_max_points {
            Some(0) => return Err(sources.error("query-max-points", "must be at least 1")),
            Some(n) => n,
            None => monitor_archive::query::engine::DEFAULT_MAX_POINTS,
        },
        findings: {
            let th = s.findings.unwrap_or_default();
            th.validate().map_err(|e| sources.error("findings", e))?;
            th
        },
        actions: match s.actions {
            Some(a) => {
                a.validate().map_err(|e| sources.error("actions", e))?;
                Some(a)
            }
            None => None,
        },
    })
}

/// The endpoints of both forms (`remote-write` and `[[remote-write-endpoint]]`), their names
/// unique and their CA, certificate and secret files read, so that the collector (and
/// `--check-config`) stops at start-up with the file named rather than failing every request.
fn remote_write_endpoints(
    sources: &Sources<CollectorSettings>,
    s: &CollectorSettings,
) -> Result<Vec<EndpointConfig>, ConfigError> {
    let short = s.remote_write.iter().map(|r| ("remote-write", &r.0));
    let tables = s
        .remote_write_endpoint
        .iter()
        .map(|t| ("remote-write-endpoint", &t.0));
    let mut names = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (key, endpoint) in short.chain(tables) {
        if !names.insert(endpoint.name.clone()) {
            return Err(sources.error(
                key,
                format!(
                    "two endpoints are named {:?} (the name names the cursor file)",
                    endpoint.name
                ),
            ));
        }
        monitor_remote_write::client::Client::new(endpoint).map_err(|e| sources.error(key, e))?;
        out.push(endpoint.clone());
    }
    Ok(out)
}

/// The HTTP address and who may use it: the web config file read and checked; without one
/// the default address is loopback, and a non-loopback one without authentication needs
/// `--web.allow-unauthenticated` (an API open to the network is a choice, not a default).
fn web_plan(
    sources: &Sources<CollectorSettings>,
    s: &CollectorSettings,
) -> Result<(Option<SocketAddr>, Arc<WebAuth>), ConfigError> {
    let web = match &s.web_config_file {
        Some(path) => {
            WebAuth::load(path).map_err(|e| match sources.error("web-config-file", e) {
                // The flag is Prometheus' dotted one.
                ConfigError::Flag { message, .. } => ConfigError::Flag {
                    key: "web.config.file".into(),
                    message,
                },
                e => e,
            })?
        }
        None => WebAuth::open(),
    };
    if s.no_http {
        return Ok((None, Arc::new(web)));
    }
    let any = if web.path().is_some() {
        [0, 0, 0, 0]
    } else {
        [127, 0, 0, 1]
    };
    let http = s.http.unwrap_or_else(|| SocketAddr::from((any, 7671)));
    if !http.ip().is_loopback() && !web.current().authenticates() && !s.web_allow_unauthenticated {
        return Err(sources.error(
            "http",
            format!(
                "{http} is not a loopback address and the HTTP API would answer anyone: give a \
                 web config file with basic_auth_users or client_auth_type \
                 RequireAndVerifyClientCert (--web.config.file, docs/deployment.md), or pass \
                 --web.allow-unauthenticated"
            ),
        ));
    }
    Ok((Some(http), Arc::new(web)))
}

/// `railscope-collector run --check-config`: [`run_plan`]; returns the settings in effect,
/// as TOML.
pub fn check(sources: &Sources<CollectorSettings>) -> Result<String, ConfigError> {
    run_plan(sources)?;
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
        settings: CollectorSettings,
    }

    fn key_file() -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), [7u8; 32]).unwrap();
        file
    }

    fn sources(text: &str, args: &[&str]) -> Result<Sources<CollectorSettings>, ConfigError> {
        let flags = Cli::try_parse_from(std::iter::once("run").chain(args.iter().copied()))
            .unwrap()
            .settings;
        Sources::from_file(
            ConfigFile::from_text("/etc/railscope/collector.toml", text),
            flags,
        )
    }

    #[test]
    fn flags_override_the_file() {
        let key = key_file();
        let text = format!(
            "key = {:?}\nmax-nodes = 50\nretention-age = \"12h\"\nremote-write = [\"vm=http://h:8428/api/v1/write\"]\n",
            key.path()
        );
        let plan =
            run_plan(&sources(&text, &["--max-nodes", "60", "--sockets", "3"]).unwrap()).unwrap();
        assert_eq!(plan.collector.limits.max_nodes, 60);
        assert_eq!(plan.collector.sockets, 3);
        assert_eq!(
            plan.archive.retention_age,
            Some(Duration::from_secs(12 * 3600))
        );
        assert_eq!(plan.remote_write.len(), 1);
        assert_eq!(plan.remote_write[0].url, "http://h:8428/api/v1/write");
        assert_eq!(plan.collector.listen, DEFAULT_LISTEN.parse().unwrap());
        let plan =
            run_plan(&sources(&text, &["--retention-age", "0", "--no-http"]).unwrap()).unwrap();
        assert_eq!(plan.archive.retention_age, None);
        assert_eq!(plan.collector.http, None);
    }

    #[test]
    fn findings_thresholds_come_from_the_file() {
        let key = key_file();
        let text = format!(
            "key = {:?}\n[findings]\nflap-downs = 5\nexpected-width-lanes = 4\n",
            key.path()
        );
        let plan = run_plan(&sources(&text, &[]).unwrap()).unwrap();
        assert_eq!(plan.findings.flap_downs, 5);
        assert_eq!(plan.findings.expected_width_lanes, Some(4.0));
        assert_eq!(plan.findings.symbol_errors_per_hour, 120, "a default");
        let e = sources("[findings]\nflap-down = 5\n", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `flap-down`"), "{e}");
        let text = format!("key = {:?}\n[findings]\ntick-s = 0\n", key.path());
        let e = run_plan(&sources(&text, &[]).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("findings.tick-s must be at least 1"), "{e}");
    }

    #[test]
    fn actions_come_from_the_file_and_a_bad_rule_is_refused_naming_it() {
        let key = key_file();
        let plan = run_plan(&sources(&format!("key = {:?}\n", key.path()), &[]).unwrap()).unwrap();
        assert!(plan.actions.is_none(), "no [actions]: no actions");
        let text = format!(
            "key = {:?}\n[actions]\nresume-hold-s = 30\n[[actions.rule]]\nrule = \"gpu_xid\"\naction = \"slurm-drain\"\n",
            key.path()
        );
        let actions = run_plan(&sources(&text, &[]).unwrap())
            .unwrap()
            .actions
            .unwrap();
        assert!(actions.dry_run, "a dry run unless the file says otherwise");
        assert_eq!(actions.resume_hold_s, 30);
        assert_eq!(actions.rule[0].rule, "gpu_xid");
        let text = format!(
            "key = {:?}\n[actions]\n[[actions.rule]]\nrule = \"gpu_xid\"\naction = \"reboot\"\n",
            key.path()
        );
        let e = run_plan(&sources(&text, &[]).unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("collector.toml") && e.contains("actions") && e.contains("\"reboot\""),
            "{e}"
        );
    }

    #[test]
    fn bad_values_name_the_file_line_and_key() {
        let e = sources("\nlisten = \"nowhere\"\n", &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("/etc/railscope/collector.toml:2:10: key `listen`: "),
            "{e}"
        );
        let e = sources("sockets = 0\n", &[]).unwrap_err().to_string();
        assert!(
            e.starts_with("/etc/railscope/collector.toml:1:11: key `sockets`: "),
            "{e}"
        );
        let e = sources("remote-write = [\"vm=ftp://h/api/v1/write\"]\n", &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("/etc/railscope/collector.toml:1:16: key `remote-write`: "),
            "{e}"
        );
        assert!(e.contains("https://"), "{e}");
        let e = sources("retention = \"30d\"\n", &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("/etc/railscope/collector.toml:1:1: key `retention`: unknown field"),
            "{e}"
        );
        let key = key_file();
        let text = format!("key = {:?}\n\nmax-series-per-node = 70000\n", key.path());
        let e = run_plan(&sources(&text, &[]).unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("/etc/railscope/collector.toml:3:1: key `max-series-per-node`: "),
            "{e}"
        );
        let text = format!("key = {:?}\n", key.path());
        let e = run_plan(&sources(&text, &["--max-frame-age", "90000"]).unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--max-frame-age: node ttl must be longer"),
            "{e}"
        );
        let e = run_plan(&sources("key = \"/nonexistent/wire.key\"\n", &[]).unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("/etc/railscope/collector.toml:1:1: key `key`: "),
            "{e}"
        );
    }

    #[test]
    fn an_endpoint_name_is_used_once() {
        let key = key_file();
        let text = format!(
            "key = {:?}\nremote-write = [\"a=http://h:1/w\"]\n",
            key.path()
        );
        let e = run_plan(&sources(&text, &["--remote-write", "a=http://h:2/w"]).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("two endpoints are named \"a\""), "{e}");
    }

    /// A `[[remote-write-endpoint]]` over https with a CA file, basic auth and a Mimir tenant
    /// header, next to the short form; the secret stays out of `--check-config`'s output.
    #[test]
    fn remote_write_tables_take_tls_auth_and_headers() {
        let key = key_file();
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        let ca_cert = rcgen::generate_simple_self_signed(vec!["mimir.example".into()]).unwrap();
        std::fs::write(&ca, ca_cert.cert.pem()).unwrap();
        let password = dir.path().join("password");
        std::fs::write(&password, "s3cret-Pa55\n").unwrap();
        let text = format!(
            "key = {key:?}\nremote-write = [\"vm=http://h:8428/api/v1/write\"]\n\n\
             [[remote-write-endpoint]]\nname = \"mimir\"\n\
             url = \"https://mimir.example/api/v1/push\"\nca-file = {ca:?}\n\
             basic-auth-user = \"railscope\"\nbasic-auth-password-file = {password:?}\n\
             headers = {{ \"X-Scope-OrgID\" = \"fleet-a\" }}\n",
            key = key.path(),
        );
        let all = sources(
            &text,
            &["--remote-write", "prom=https://p:9090/api/v1/write"],
        )
        .unwrap();
        let plan = run_plan(&all).unwrap();
        let names: Vec<&str> = plan.remote_write.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["vm", "prom", "mimir"]);
        let mimir = &plan.remote_write[2];
        assert_eq!(mimir.tls.ca_file.as_deref(), Some(ca.as_path()));
        assert_eq!(
            mimir.auth,
            monitor_remote_write::Auth::Basic {
                username: "railscope".into(),
                password_file: password.clone()
            }
        );
        assert_eq!(
            mimir.headers,
            [("X-Scope-OrgID".to_owned(), "fleet-a".to_owned())]
        );
        let shown = check(&all).unwrap();
        assert!(shown.contains("[[remote-write-endpoint]]"), "{shown}");
        assert!(!shown.contains("s3cret"), "{shown}");
        // The file form read back as --check-config prints it.
        let again = sources(&shown, &[]).unwrap();
        assert_eq!(run_plan(&again).unwrap().remote_write.len(), 3);
    }

    #[test]
    fn remote_write_table_errors_name_the_file_or_the_key() {
        let key = key_file();
        let table = |rest: &str| {
            format!(
                "key = {:?}\n[[remote-write-endpoint]]\nname = \"mimir\"\n\
                 url = \"https://mimir.example/api/v1/push\"\n{rest}",
                key.path()
            )
        };
        // An unreadable secret file: one line, naming the file and the endpoint.
        let missing = "/nonexistent/mimir.password";
        let text = table(&format!(
            "basic-auth-user = \"u\"\nbasic-auth-password-file = {missing:?}\n"
        ));
        let e = run_plan(&sources(&text, &[]).unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("/etc/railscope/collector.toml:")
                && e.contains("key `remote-write-endpoint`")
                && e.contains("remote-write endpoint mimir: basic-auth-password-file")
                && e.contains(missing)
                && !e.contains('\n'),
            "{e}"
        );
        let e = run_plan(&sources(&table("ca-file = \"/nonexistent/ca.pem\"\n"), &[]).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("ca-file /nonexistent/ca.pem"), "{e}");
        // Mistakes in the table itself, at its line.
        for (rest, needle) in [
            ("password-file = \"/x\"\n", "unknown field `password-file`"),
            (
                "bearer-token-file = \"/t\"\nbasic-auth-user = \"u\"\nbasic-auth-password-file = \"/p\"\n",
                "exclude each other",
            ),
            ("basic-auth-user = \"u\"\n", "go together"),
            (
                "cert-file = \"/c.pem\"\n",
                "cert-file and key-file go together",
            ),
            (
                "headers = { Authorization = \"Bearer x\" }\n",
                "bearer-token-file",
            ),
        ] {
            let e = sources(&table(rest), &[]).unwrap_err().to_string();
            assert!(
                e.starts_with("/etc/railscope/collector.toml:") && e.contains(needle),
                "{rest}: {e}"
            );
        }
        let text = format!(
            "key = {:?}\n[[remote-write-endpoint]]\nname = \"m\"\nurl = \"http://h/w\"\n\
             ca-file = \"/ca.pem\"\n",
            key.path()
        );
        let e = sources(&text, &[]).unwrap_err().to_string();
        assert!(e.contains("need an https:// URL"), "{e}");
        let text = format!(
            "key = {:?}\nremote-write = [\"a=http://h:1/w\"]\n[[remote-write-endpoint]]\n\
             name = \"a\"\nurl = \"http://h:2/w\"\n",
            key.path()
        );
        let e = run_plan(&sources(&text, &[]).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("two endpoints are named \"a\""), "{e}");
    }

    #[test]
    fn the_http_api_leaves_loopback_only_with_authentication_or_the_operators_word() {
        let key = key_file();
        let text = format!("key = {:?}\n", key.path());
        let plan = run_plan(&sources(&text, &[]).unwrap()).unwrap();
        assert_eq!(plan.collector.http, "127.0.0.1:7671".parse().ok());
        let e = run_plan(&sources(&text, &["--http", "0.0.0.0:7671"]).unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--http: 0.0.0.0:7671 is not a loopback address")
                && e.contains("--web.allow-unauthenticated")
                && !e.contains('\n'),
            "{e}"
        );
        let e = run_plan(&sources(&format!("{text}http = \"[::]:7671\"\n"), &[]).unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "/etc/railscope/collector.toml:2:1: key `http`: [::]:7671 is not a loopback"
            ),
            "{e}"
        );
        let plan = run_plan(
            &sources(
                &text,
                &["--http", "10.1.2.3:7671", "--web.allow-unauthenticated"],
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(plan.collector.http, "10.1.2.3:7671".parse().ok());
        // With users: every address by default.
        let web = tempfile::NamedTempFile::new().unwrap();
        let hash = bcrypt::hash("pw", 4).unwrap();
        std::fs::write(web.path(), format!("basic_auth_users:\n  alice: {hash}\n")).unwrap();
        let with_web = format!("{text}web-config-file = {:?}\n", web.path());
        let plan = run_plan(&sources(&with_web, &[]).unwrap()).unwrap();
        assert_eq!(plan.collector.http, "0.0.0.0:7671".parse().ok());
        assert!(plan.collector.web.current().authenticates());
        // A web config without users nor verified client certificates authenticates no one.
        std::fs::write(web.path(), "").unwrap();
        let e = run_plan(&sources(&with_web, &[]).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("0.0.0.0:7671 is not a loopback address"), "{e}");
        // A bad web config is named with the key or flag that names it, and its own field.
        std::fs::write(web.path(), "basic_auth_users:\n  alice: x\n").unwrap();
        let flag = web.path().to_str().unwrap();
        let e = run_plan(&sources(&text, &["--web.config.file", flag]).unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!(
                "--web.config.file: {flag}: basic_auth_users.alice: "
            )),
            "{e}"
        );
        let e = run_plan(&sources(&with_web, &[]).unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("/etc/railscope/collector.toml:2:1: key `web-config-file`: ")
                && e.contains("basic_auth_users.alice: not a bcrypt hash"),
            "{e}"
        );
    }

    /// `key = value`, as the example shows a setting commented out (`#key = value`), unlike
    /// its prose (`# text`).
    fn is_setting(line: &str) -> bool {
        (line.starts_with(|c: char| c.is_ascii_lowercase()) && line.contains(" = "))
            || line.starts_with('[')
    }

    /// The example installed with the package parses as it is, and with every commented
    /// setting switched on; and it shows every setting the command line has.
    #[test]
    fn the_example_file_documents_every_setting() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../dist/collector.toml"
        ))
        .expect("dist/collector.toml");
        let key = key_file();
        let key_flag = key.path().to_str().unwrap();
        run_plan(&sources(&text, &["--key", key_flag]).unwrap()).unwrap();
        // The secrets' example paths do not exist here: the flags point them at a key file.
        let flags = [
            "--key",
            key_flag,
            "--fleet-secret",
            key_flag,
            "--previous-fleet-secret",
            key_flag,
        ];
        // The files the example's remote-write table names, made here.
        let dir = tempfile::tempdir().unwrap();
        let certified =
            rcgen::generate_simple_self_signed(vec!["mimir.example.com".into()]).unwrap();
        for (name, text) in [
            ("ca.pem", certified.cert.pem()),
            ("client.pem", certified.cert.pem()),
            ("client.key", certified.signing_key.serialize_pem()),
            ("mimir.password", "secret\n".into()),
            // The example's web config, which a test machine has not: one with a user.
            (
                "web-config.yml",
                format!(
                    "basic_auth_users:\n  alice: {}\n",
                    bcrypt::hash("pw", 4).unwrap()
                ),
            ),
        ] {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        let here = format!("{}/", dir.path().display());
        let uncommented: String = text
            .lines()
            .map(|l| l.strip_prefix('#').filter(|l| is_setting(l)).unwrap_or(l))
            .map(|l| {
                let l = l
                    .replace("/etc/railscope/", &here)
                    .replace("/run/credentials/railscope-collector.service/", &here);
                format!("{l}\n")
            })
            .collect();
        assert!(uncommented.contains("\n[[remote-write-endpoint]]\n"));
        assert!(uncommented.contains("\n[[actions.rule]]\n"));
        let all = sources(&uncommented, &flags).expect("every commented setting parses");
        run_plan(&all).expect("every commented setting is valid");
        for arg in Cli::command().get_arguments() {
            let Some(flag) = arg.get_long() else { continue };
            // Prometheus' dotted flags (`--web.config.file`) are dashed keys.
            let flag = flag.replace('.', "-");
            assert!(
                uncommented
                    .lines()
                    .any(|l| l.starts_with(&format!("{flag} = "))),
                "dist/collector.toml does not show `{flag}`"
            );
        }
    }
}
