//! The collector as an operator runs it (`railscope-collector run`, or `railscope collector
//! run` through the agent's binary) on loopback ports with a key and an archive directory,
//! started and waited for until its HTTP port answers.

use std::{
    ffi::OsString,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use crate::{
    child::Running,
    scratch::{free_tcp_port, free_udp_port},
};

/// How long a collector may take to open its HTTP port.
const READY_WITHIN: Duration = Duration::from_secs(10);

/// What to start: built by [`CollectorProcess::command`], started by [`CollectorCommand::start`].
pub struct CollectorCommand {
    program: PathBuf,
    subcommand: Vec<OsString>,
    udp: u16,
    http: u16,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
}

impl CollectorCommand {
    /// Run as `PROGRAM collector run ...` (the agent's binary handing the subcommand over),
    /// not `PROGRAM run ...`.
    pub fn through_agent_binary(mut self) -> Self {
        self.subcommand = vec!["collector".into(), "run".into()];
        self
    }

    /// These ports rather than free ones (a collector started again where it was).
    pub fn ports(mut self, udp: u16, http: u16) -> Self {
        self.udp = udp;
        self.http = http;
        self
    }

    /// More options after the ports, key and data directory.
    pub fn args(mut self, args: impl IntoIterator<Item = impl Into<OsString>>) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Starts it and waits until its HTTP port accepts connections.
    pub fn start(self) -> CollectorProcess {
        let mut command = Command::new(&self.program);
        command
            .args(&self.subcommand)
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.udp))
            .arg("--http")
            .arg(format!("127.0.0.1:{}", self.http))
            .args(crate::scratch::without_host_config(&self.args))
            .env("NO_COLOR", "1")
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        let running = Running::spawn_command(command);
        let http: SocketAddr = ([127, 0, 0, 1], self.http).into();
        let start = Instant::now();
        while TcpStream::connect(http).is_err() {
            assert!(
                start.elapsed() < READY_WITHIN,
                "the collector's HTTP port {http} never opened"
            );
            thread::sleep(Duration::from_millis(50));
        }
        CollectorProcess {
            running,
            udp: self.udp,
            http: self.http,
        }
    }
}

/// A running collector; killed on drop (see [`Running`]).
pub struct CollectorProcess {
    running: Running,
    /// Its receive port and HTTP port on 127.0.0.1.
    pub udp: u16,
    pub http: u16,
}

impl CollectorProcess {
    /// `PROGRAM run --listen 127.0.0.1:UDP --http 127.0.0.1:HTTP --key KEY --data DATA` on
    /// free ports.
    pub fn command(program: impl Into<PathBuf>, key: &Path, data: &Path) -> CollectorCommand {
        CollectorCommand {
            program: program.into(),
            subcommand: vec!["run".into()],
            udp: free_udp_port(),
            http: free_tcp_port(),
            args: vec!["--key".into(), key.into(), "--data".into(), data.into()],
            env: Vec::new(),
        }
    }

    /// [`CollectorProcess::command`] with per-node keys: `--fleet-secret SECRET` and no
    /// shared key.
    pub fn fleet_command(
        program: impl Into<PathBuf>,
        secret: &Path,
        data: &Path,
    ) -> CollectorCommand {
        let mut command = Self::command(program, secret, data);
        command.args[0] = "--fleet-secret".into();
        command
    }

    /// Where agents send.
    pub fn udp_addr(&self) -> SocketAddr {
        ([127, 0, 0, 1], self.udp).into()
    }

    /// `http://127.0.0.1:HTTP`, for `--collector` of the query commands.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.http)
    }

    pub fn id(&self) -> u32 {
        self.running.id()
    }

    /// The body of `GET path`, which must answer 200.
    pub fn get(&self, path: &str) -> String {
        http_get(self.http, path)
    }

    /// The JSON body of `GET path`, which must answer 200.
    pub fn json(&self, path: &str) -> serde_json::Value {
        let body = self.get(path);
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
    }

    /// The active finding of `rule` on `node` (`/api/v1/findings`), if there is one.
    pub fn active_finding(&self, rule: &str, node: &str) -> Option<serde_json::Value> {
        self.json("/api/v1/findings?active=true")["findings"]
            .as_array()?
            .iter()
            .find(|f| f["rule"] == rule && f["node"] == node)
            .cloned()
    }

    /// The audit records of `node` (`/api/v1/actions`), each as "action outcome".
    pub fn action_outcomes(&self, node: &str) -> Vec<String> {
        self.json("/api/v1/actions")["records"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["node"] == node)
            .map(|r| {
                format!(
                    "{} {}",
                    r["action"].as_str().unwrap_or_default(),
                    r["outcome"].as_str().unwrap_or_default()
                )
            })
            .collect()
    }

    /// Sends `signal` and waits: (exited successfully, stdout, stderr).
    pub fn signal(self, signal: libc::c_int) -> (bool, String, String) {
        self.running.signal(signal)
    }

    /// Stops it as systemd does (SIGTERM): (exited successfully, stdout, stderr).
    pub fn stop(self) -> (bool, String, String) {
        self.signal(libc::SIGTERM)
    }
}

/// The body of `GET path` from 127.0.0.1:`port`, which must answer 200.
pub fn http_get(port: u16, path: &str) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(
        response.starts_with("HTTP/1.1 200"),
        "GET {path}: {response}"
    );
    response.split_once("\r\n\r\n").unwrap().1.to_owned()
}

/// A `/metrics` value summed over its label sets (0 when absent).
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with(' ') || r.starts_with('{'))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// Waits until the remote-write of the collector on HTTP port `http` has caught up: nothing
/// pending, something sent, and nothing more sent for 2 s. Fails the test after `within`.
pub fn remote_write_caught_up(http: u16, within: Duration) {
    let started = Instant::now();
    let mut last = (f64::NAN, Instant::now());
    loop {
        let text = http_get(http, "/metrics/collector");
        let sent = metric_sum(&text, "railscope_collector_remote_write_samples_sent_total");
        let pending = metric_sum(&text, "railscope_collector_remote_write_samples_pending");
        if sent != last.0 {
            last = (sent, Instant::now());
        }
        if pending == 0.0 && sent > 0.0 && last.1.elapsed() > Duration::from_secs(2) {
            return;
        }
        assert!(
            started.elapsed() < within,
            "remote-write did not catch up within {within:?}: {text}"
        );
        thread::sleep(Duration::from_millis(200));
    }
}

/// Polls `probe` every 250 ms until it gives a value, and fails the test naming `what` if
/// none came `within`.
pub fn wait_for<T>(what: &str, within: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(start.elapsed() < within, "waited {within:?} for {what}");
        thread::sleep(Duration::from_millis(250));
    }
}
