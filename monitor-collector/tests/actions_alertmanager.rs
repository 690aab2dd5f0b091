//! Alerts to a **real Alertmanager** (docs/actions.md, "Alertmanager"): two
//! `prometheus-alertmanager` processes from Debian's package (an HA pair, gossip off), each
//! started by the test on a loopback port with its own configuration and storage, and the
//! collector as an operator runs it with `[actions.alertmanager]` naming both, fed by a
//! simulated fleet's real frames. What is checked is what an operator checks: Alertmanager's
//! own API (`GET /api/v2/alerts`) shows the finding's alert with its labels and annotations,
//! sent again while the finding lasts, and resolved (gone from the list, long before its
//! `endsAt` would have lapsed) once the finding ends; `/metrics` counts the sends.
//!
//! Skipped, saying so, where the package is not installed (`cargo xtask setup` installs it),
//! unless `RAILSCOPE_REQUIRE_ALERTMANAGER=1` (set by `cargo xtask test`).

use std::{
    ffi::OsStr,
    io::{Read, Write},
    net::TcpStream,
    path::Path,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use monitor_testkit::{
    CollectorProcess, Running, SimulatedFleet, free_tcp_port, key_file, key_from_hex, scratch_dir,
    wait_for,
};
use serde_json::Value;

const COLLECTOR: &str = env!("CARGO_BIN_EXE_railscope-collector");
const ALERTMANAGER: &str = "/usr/bin/prometheus-alertmanager";
const KEY_HEX: &str = "5566778899aabbccddeeff00112233445566778899aabbccddeeff0011223344";
const EXTERNAL_URL: &str = "https://railscope.example:9091";

fn alertmanager_installed(test: &str) -> bool {
    if Path::new(ALERTMANAGER).is_file() {
        return true;
    }
    assert!(
        !std::env::var("RAILSCOPE_REQUIRE_ALERTMANAGER").is_ok_and(|v| v == "1"),
        "{test}: {ALERTMANAGER} is missing, and RAILSCOPE_REQUIRE_ALERTMANAGER=1"
    );
    eprintln!(
        "SKIPPED {test}: {ALERTMANAGER} is missing (Debian package prometheus-alertmanager; \
         `cargo xtask setup` installs it)"
    );
    false
}

/// An Alertmanager of its own: configuration, storage and a loopback port, no cluster.
struct Alertmanager {
    port: u16,
    _running: Running,
}

impl Alertmanager {
    fn start(dir: &Path) -> Self {
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let config = dir.join("alertmanager.yml");
        std::fs::write(
            &config,
            "route:\n  receiver: \"null\"\nreceivers:\n  - name: \"null\"\n",
        )
        .unwrap();
        let port = free_tcp_port();
        let running = Running::spawn(
            ALERTMANAGER,
            [
                format!("--config.file={}", config.display()),
                format!("--storage.path={}", dir.join("data").display()),
                format!("--web.listen-address=127.0.0.1:{port}"),
                "--cluster.listen-address=".into(),
            ],
        );
        let am = Self {
            port,
            _running: running,
        };
        wait_for("Alertmanager ready", Duration::from_secs(30), || {
            get(am.port, "/-/ready").filter(|(status, _)| *status == 200)
        });
        am
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `GET /api/v2/alerts`: the alerts Alertmanager holds as not resolved.
    fn alerts(&self) -> Vec<Value> {
        let (status, body) = get(self.port, "/api/v2/alerts").expect("Alertmanager answers");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
    }

    /// The alert of `rule` on `node`, if Alertmanager holds it.
    fn alert(&self, rule: &str, node: &str) -> Option<Value> {
        self.alerts().into_iter().find(|a| {
            a["labels"]["alertname"] == format!("railscope_{rule}").as_str()
                && a["labels"]["node"] == node
        })
    }
}

/// (status, body) of an HTTP/1.0 GET (so the answer is not chunked), or None when nothing
/// listens yet.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split(' ').nth(1)?.parse().ok()?;
    Some((status, response.split_once("\r\n\r\n")?.1.to_owned()))
}

/// An RFC 3339 time of Alertmanager's answer as Unix seconds.
fn unix_s(v: &Value) -> f64 {
    let text = v.as_str().unwrap();
    let t = humantime::parse_rfc3339_weak(text.trim_end_matches('Z').split('+').next().unwrap())
        .unwrap_or_else(|e| panic!("{text}: {e}"));
    t.duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[test]
fn a_finding_is_an_alert_in_both_alertmanagers_sent_again_while_it_lasts_and_resolved_when_it_ends()
{
    const TEST: &str = "a_finding_is_an_alert_in_both_alertmanagers";
    if !alertmanager_installed(TEST) {
        return;
    }
    let dir = scratch_dir("actions-alertmanager");
    let ams = [
        Alertmanager::start(&dir.join("am1")),
        Alertmanager::start(&dir.join("am2")),
    ];
    let key = key_file(&dir, KEY_HEX);
    let config = dir.join("collector.toml");
    // Sent again every 5 s: endsAt 20 s ahead, so a resolution is told from a lapse. The
    // flap window is long enough for the finding to outlast a resend: it opens only once the
    // fabric grouping has judged its downs (`fabric-settle-s`, 5 s after they arrived).
    std::fs::write(
        &config,
        format!(
            "[findings]\ntick-s = 1\nflap-window-s = 30\n\n[actions]\ndry-run = false\n\
             external-url = \"{EXTERNAL_URL}\"\n\n[actions.alertmanager]\n\
             urls = [\"{}\", \"{}\"]\nresend-s = 5\n",
            ams[0].url(),
            ams[1].url()
        ),
    )
    .unwrap();
    let c = CollectorProcess::command(COLLECTOR, &key, &dir.join("data"))
        .args([OsStr::new("--config"), config.as_os_str()])
        .args(["--sockets", "1"])
        .env("RAILSCOPE_LOG", "info")
        .start();

    // node01's mlx5_2 goes down every 4 s for 16 s, ending now; node02 is quiet.
    let names = ["node01", "node02"];
    SimulatedFleet::builder(names.len())
        .node_names(names)
        .interval(Duration::from_secs(1))
        .flush_every(1)
        .ticks_before_now(16)
        .flapping_port(0, 2)
        .flap_period(4, 1)
        .build(key_from_hex(KEY_HEX))
        .send_ticks(c.udp_addr(), 16)
        .unwrap();
    let finding = wait_for("node01's flapping finding", Duration::from_secs(20), || {
        c.active_finding("ib_link_flapping", "node01")
    });
    let id = finding["id"].as_str().unwrap();

    // Each Alertmanager of the pair holds the alert, with the finding's labels and
    // annotations.
    for am in &ams {
        let a = wait_for("the alert in Alertmanager", Duration::from_secs(10), || {
            am.alert("ib_link_flapping", "node01")
        });
        let labels = &a["labels"];
        assert_eq!(labels["rule"], "ib_link_flapping", "{a}");
        assert_eq!(labels["severity"], finding["severity"], "{a}");
        assert_eq!(labels["device"], finding["device"], "{a}");
        assert_eq!(labels["port"], finding["port"].to_string().as_str(), "{a}");
        assert!(labels.get("gpu").is_none(), "{a}");
        let notes = &a["annotations"];
        assert_eq!(notes["summary"], finding["summary"], "{a}");
        assert_eq!(notes["finding_id"], id, "{a}");
        let evidence: Value = serde_json::from_str(notes["evidence"].as_str().unwrap()).unwrap();
        assert_eq!(evidence, finding["evidence"], "{a}");
        assert_eq!(
            notes["dashboard"],
            format!("{EXTERNAL_URL}/#/node/node01").as_str(),
            "{a}"
        );
        assert_eq!(a["status"]["state"], "active", "{a}");
        let start_s = finding["start"].as_u64().unwrap() as f64 / 1e9;
        assert!((unix_s(&a["startsAt"]) - start_s).abs() < 0.01, "{a}");
        assert!(unix_s(&a["endsAt"]) > now_s() + 10.0, "{a}");
    }
    assert!(
        ams[0].alert("ib_link_flapping", "node02").is_none(),
        "node02 had no finding"
    );

    // Sent again while the finding lasts: its end moves on.
    let first_end = unix_s(&ams[0].alert("ib_link_flapping", "node01").unwrap()["endsAt"]);
    let mut last_end = wait_for("the alert sent again", Duration::from_secs(15), || {
        let a = ams[0].alert("ib_link_flapping", "node01")?;
        let end = unix_s(&a["endsAt"]);
        (end > first_end + 2.0).then_some(end)
    });

    // The flap ends (fewer than 3 downs in 30 s): the alert is resolved in both, well before
    // the end of the last send would have let it lapse.
    for am in &ams {
        wait_for("the alert resolved", Duration::from_secs(60), || {
            match am.alert("ib_link_flapping", "node01") {
                Some(a) => {
                    last_end = last_end.max(unix_s(&a["endsAt"]));
                    None
                }
                None => Some(()),
            }
        });
    }
    assert!(
        now_s() < last_end - 5.0,
        "resolved by the collector, not lapsed (endsAt {last_end}, now {})",
        now_s()
    );
    let ended = c.json("/api/v1/findings?active=false")["findings"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["id"] == id);
    assert!(ended, "the finding ended");

    // Counted per Alertmanager; the audit log has each one's first acceptance, no failure.
    let metrics = c.get("/metrics/collector");
    for am in &ams {
        let line = metrics
            .lines()
            .find(|l| {
                l.starts_with(&format!(
                    "railscope_collector_alerts_sent_total{{alertmanager=\"{}\"}}",
                    am.url()
                ))
            })
            .unwrap_or_else(|| panic!("{metrics}"));
        let sent: u64 = line.rsplit_once(' ').unwrap().1.parse().unwrap();
        assert!(sent >= 3, "firing, sent again, resolved: {line}");
    }
    assert!(
        metrics.contains("# HELP railscope_collector_alerts_failed_total "),
        "{metrics}"
    );
    let records = c.json("/api/v1/actions")["records"].clone();
    let alerts: Vec<&Value> = records
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["action"] == "alert")
        .collect();
    assert_eq!(alerts.len(), 2, "{records}");
    assert!(alerts.iter().all(|r| r["outcome"] == "done"), "{records}");

    let (ok, _, err) = c.stop();
    assert!(ok, "{err}");
    drop(ams);
    let _ = std::fs::remove_dir_all(&dir);
}
