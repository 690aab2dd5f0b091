//! Prometheus and VictoriaMetrics as the tests run them: started from their Debian packages
//! on a free port and a fresh directory, stopped and started again, and everything they hold
//! of railscope read back through their HTTP query API. Shared by the test files that compare
//! a TSDB's content with what was sent (`mod tsdb;` in each).

#![allow(dead_code)]

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

/// A series as `name{k=v,...}` with labels sorted (the key both sides are compared by).
pub(crate) use monitor_testkit::sent_frames::canonical;

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

pub(crate) struct Server {
    pub kind: Tsdb,
    pub port: u16,
    data: PathBuf,
    child: Option<Child>,
    web: Option<Web>,
    /// Prometheus only: its `scrape_configs` (YAML, a list), none by default.
    scrape_configs: String,
}

/// A Prometheus whose HTTP API is behind TLS and basic auth (`--web.config.file`), and how
/// the test itself reaches it: an agent trusting the test CA (with the client certificate if
/// the server asks for one) and the `Authorization` header.
pub(crate) struct Web {
    pub config_file: PathBuf,
    pub agent: ureq::Agent,
    pub authorization: String,
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum Tsdb {
    Prometheus,
    VictoriaMetrics,
}

impl Tsdb {
    pub(crate) fn binary(self) -> &'static str {
        match self {
            Tsdb::Prometheus => "prometheus",
            Tsdb::VictoriaMetrics => "victoria-metrics",
        }
    }

    pub(crate) fn package(self) -> &'static str {
        self.binary()
    }
}

pub(crate) fn find_binary(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .chain([Path::new("/usr/bin").join(name)])
        .find(|p| p.is_file())
}

/// The server binary, or None (test skipped) when it is absent and not required.
pub(crate) fn tsdb_binary(kind: Tsdb) -> Option<PathBuf> {
    let found = find_binary(kind.binary());
    if found.is_none() {
        let msg = format!(
            "{} not found: install the Debian package `{}` (cargo xtask setup does)",
            kind.binary(),
            kind.package()
        );
        if std::env::var("RAILSCOPE_REQUIRE_TSDB").is_ok_and(|v| v == "1") {
            panic!("{msg}");
        }
        eprintln!("SKIPPED: {msg}");
    }
    found
}

impl Server {
    pub(crate) fn start(kind: Tsdb, binary: &Path, port: u16, data: &Path) -> Self {
        Self::start_with(kind, binary, port, data, None)
    }

    /// Prometheus only: with `web`, its API (remote-write receiver included) is https with
    /// basic auth.
    pub(crate) fn start_with(
        kind: Tsdb,
        binary: &Path,
        port: u16,
        data: &Path,
        web: Option<Web>,
    ) -> Self {
        let mut server = Server {
            kind,
            port,
            data: data.to_owned(),
            child: None,
            web,
            scrape_configs: "[]".into(),
        };
        server.spawn(binary);
        server
    }

    /// A Prometheus that scrapes: `scrape_configs` is its config's list (YAML, indented as
    /// the list's items under `scrape_configs:`).
    pub(crate) fn start_scraping(
        binary: &Path,
        port: u16,
        data: &Path,
        scrape_configs: &str,
    ) -> Self {
        std::fs::create_dir_all(data).unwrap();
        let mut server = Server {
            kind: Tsdb::Prometheus,
            port,
            data: data.to_owned(),
            child: None,
            web: None,
            scrape_configs: format!("\n{scrape_configs}"),
        };
        server.spawn(binary);
        server
    }

    /// The answer of an instant PromQL query at the server's now: `data.result`.
    pub(crate) fn instant(&self, promql: &str) -> Vec<serde_json::Value> {
        self.instant_at(promql, None)
    }

    /// An instant PromQL query at `time` (Unix seconds; the server's now if None).
    fn instant_at(&self, promql: &str, time: Option<&str>) -> Vec<serde_json::Value> {
        let url = format!("{}/api/v1/query", self.base());
        let mut request = self.get(&url).query("query", promql);
        if let Some(time) = time {
            request = request.query("time", time);
        }
        let text = request
            .call()
            .unwrap()
            .into_body()
            .read_to_string()
            .unwrap();
        let body: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(body["status"], "success", "{promql}: {body}");
        body["data"]["result"].as_array().unwrap().clone()
    }

    pub(crate) fn base(&self) -> String {
        let scheme = if self.web.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    fn get(&self, url: &str) -> ureq::RequestBuilder<ureq::typestate::WithoutBody> {
        match &self.web {
            Some(web) => web
                .agent
                .get(url)
                .header("Authorization", &web.authorization),
            None => ureq::get(url),
        }
    }

    pub(crate) fn spawn(&mut self, binary: &Path) {
        let addr = format!("127.0.0.1:{}", self.port);
        let mut cmd = Command::new(binary);
        match self.kind {
            Tsdb::Prometheus => {
                let config = self.data.join("prometheus.yml");
                // As docs/deployment.md says to run it: delivery is at least once, and a
                // resent sample older than its series' newest is out of order, which
                // Prometheus refuses (the whole request) without this window.
                std::fs::write(
                    &config,
                    format!(
                        "global:\n  scrape_interval: 1m\nstorage:\n  tsdb:\n    \
                         out_of_order_time_window: 1h\nscrape_configs: {}\n",
                        self.scrape_configs
                    ),
                )
                .unwrap();
                cmd.arg(format!("--config.file={}", config.display()))
                    .arg(format!(
                        "--storage.tsdb.path={}",
                        self.data.join("tsdb").display()
                    ))
                    .arg(format!("--web.listen-address={addr}"))
                    .arg("--web.enable-remote-write-receiver");
                if let Some(web) = &self.web {
                    cmd.arg(format!("--web.config.file={}", web.config_file.display()));
                }
            }
            Tsdb::VictoriaMetrics => {
                cmd.arg(format!(
                    "-storageDataPath={}",
                    self.data.join("vm").display()
                ))
                .arg(format!("-httpListenAddr={addr}"))
                .arg("-retentionPeriod=1y")
                // As docs/deployment.md says to run it: delivery is at least once.
                .arg("-dedup.minScrapeInterval=1ms");
            }
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.data.join("server.log"))
            .unwrap();
        cmd.stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .stdin(Stdio::null());
        self.child = Some(cmd.spawn().unwrap());
        let ready = match self.kind {
            Tsdb::Prometheus => "/-/ready",
            Tsdb::VictoriaMetrics => "/health",
        };
        let url = format!("{}{ready}", self.base());
        let start = Instant::now();
        loop {
            if self.get(&url).call().is_ok_and(|r| r.status() == 200) {
                return;
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "{} exited ({status}) at start-up; its log: {}",
                    self.kind.binary(),
                    self.data.join("server.log").display()
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{} not ready after 60 s; its log: {}",
                self.kind.binary(),
                self.data.join("server.log").display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM and wait: the server shuts down cleanly, as an operator stops it.
    pub(crate) fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let start = Instant::now();
            while child.try_wait().unwrap().is_none() {
                if start.elapsed() > Duration::from_secs(30) {
                    let _ = child.kill();
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Every `railscope_` sample the server holds: (series, ms, value); not the collector's
    /// findings' series (docs/findings.md), which it sends besides the archive's samples.
    pub(crate) fn read_back(&self) -> Vec<(String, i64, f64)> {
        let mut out = self.read_back_all();
        out.retain(|(key, ..)| !key.starts_with("railscope_finding"));
        out
    }

    fn read_back_all(&self) -> Vec<(String, i64, f64)> {
        let mut out = Vec::new();
        match self.kind {
            Tsdb::Prometheus => {
                // A range selector returns the raw samples with their own timestamps.
                let query = "{__name__=~\"railscope_.+\"}[3h]";
                let time = (now_ms() / 1000 + 60).to_string();
                for series in &self.instant_at(query, Some(&time)) {
                    let key = key_of(&series["metric"]);
                    for pair in series["values"].as_array().unwrap() {
                        let ms = (pair[0].as_f64().unwrap() * 1000.0).round() as i64;
                        let v: f64 = pair[1].as_str().unwrap().parse().unwrap();
                        out.push((key.clone(), ms, v));
                    }
                }
            }
            Tsdb::VictoriaMetrics => {
                // Recent samples are buffered in memory for a second or so: flush first.
                ureq::get(&format!("{}/internal/force_flush", self.base()))
                    .call()
                    .unwrap();
                let text = ureq::get(&format!("{}/api/v1/export", self.base()))
                    .query("match[]", "{__name__=~\"railscope_.+\"}")
                    .call()
                    .unwrap()
                    .into_body()
                    .read_to_string()
                    .unwrap();
                for line in text.lines().filter(|l| !l.is_empty()) {
                    let series: serde_json::Value = serde_json::from_str(line).unwrap();
                    let key = key_of(&series["metric"]);
                    let values = series["values"].as_array().unwrap();
                    let times = series["timestamps"].as_array().unwrap();
                    for (v, t) in values.iter().zip(times) {
                        out.push((key.clone(), t.as_i64().unwrap(), v.as_f64().unwrap()));
                    }
                }
            }
        }
        out
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub(crate) fn key_of(metric: &serde_json::Value) -> String {
    let m = metric.as_object().unwrap();
    let name = m["__name__"].as_str().unwrap();
    let labels: Vec<(&str, &str)> = m
        .iter()
        .filter(|(k, _)| *k != "__name__")
        .map(|(k, v)| (k.as_str(), v.as_str().unwrap()))
        .collect();
    canonical(name, &labels)
}
