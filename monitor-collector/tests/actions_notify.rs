//! The webhook and command actions (docs/actions.md) with the collector as an operator runs
//! it, fed by a simulated fleet's real frames: HTTP listeners of the test's own take the
//! webhooks (one answers, one refuses its first POST, one never answers) and a shell script
//! takes the command's stdin. Shown: each finding is delivered once, with its id, a refused
//! POST is tried again, an endpoint that hangs holds up no other action and is cut off at its
//! timeout, every step is in the audit log, and a restart sends nothing again.

use std::{
    ffi::OsStr,
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    os::unix::fs::PermissionsExt,
    path::Path,
    sync::{Arc, Mutex},
    thread,
    time::Duration,
};

use monitor_testkit::{
    CollectorCommand, CollectorProcess, SimulatedFleet, key_file, key_from_hex, scratch_dir,
    wait_for,
};
use serde_json::Value;

const COLLECTOR: &str = env!("CARGO_BIN_EXE_railscope-collector");
const KEY_HEX: &str = "5566778899aabbccddeeff00112233445566778899aabbccddeeff0011223344";

/// How a listener answers.
#[derive(Clone, Copy)]
enum Answer {
    /// 503 to the first `n` POSTs, then 200.
    RefuseFirst(usize),
    /// Reads the POST and never answers.
    Hang,
}

/// A webhook endpoint: every POST body it got.
struct Listener {
    port: u16,
    bodies: Arc<Mutex<Vec<String>>>,
}

impl Listener {
    fn start(answer: Answer) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let got = bodies.clone();
        thread::spawn(move || {
            // Hung connections are held open here, not closed by a drop.
            let mut held = Vec::new();
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let Some(body) = read_post(&mut stream) else {
                    continue;
                };
                let n = {
                    let mut got = got.lock().unwrap();
                    got.push(body);
                    got.len()
                };
                match answer {
                    Answer::Hang => held.push(stream),
                    Answer::RefuseFirst(refused) => {
                        let status = if n <= refused {
                            "503 Service Unavailable"
                        } else {
                            "200 OK"
                        };
                        let _ = write!(
                            stream,
                            "HTTP/1.1 {status}\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
                        );
                    }
                }
            }
        });
        Self { port, bodies }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }

    fn bodies(&self) -> Vec<String> {
        self.bodies.lock().unwrap().clone()
    }
}

/// The body of one POST request (None for anything else).
fn read_post(stream: &mut TcpStream) -> Option<String> {
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    if !line.starts_with("POST /hook ") {
        return None;
    }
    let mut length = 0;
    loop {
        line.clear();
        reader.read_line(&mut line).ok()?;
        if line.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            length = v.trim().parse().ok()?;
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    String::from_utf8(body).ok()
}

fn collector(dir: &Path, config: &Path) -> CollectorCommand {
    let key = key_file(dir, KEY_HEX);
    CollectorProcess::command(COLLECTOR, &key, &dir.join("data"))
        .args([OsStr::new("--config"), config.as_os_str()])
        .args(["--sockets", "1"])
        .env("RAILSCOPE_LOG", "info")
}

fn fleet(names: &[&str], ticks: u64) -> monitor_testkit::FleetBuilder {
    SimulatedFleet::builder(names.len())
        .node_names(names.iter().copied())
        .interval(Duration::from_secs(1))
        .flush_every(1)
        .ticks_before_now(ticks)
}

#[test]
fn webhooks_and_commands_deliver_each_finding_once_retry_a_refusal_and_a_hung_endpoint_stalls_nothing()
 {
    let dir = scratch_dir("actions-notify");
    let hung = Listener::start(Answer::Hang);
    let flaky = Listener::start(Answer::RefuseFirst(1));
    let out = dir.join("command-got.jsonl");
    let script = dir.join("take-finding.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncat >> {}\necho >> {}\n",
            out.display(),
            out.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = dir.join("collector.toml");
    std::fs::write(
        &config,
        format!(
            "[findings]\ntick-s = 1\nflap-window-s = 20\nxid-hold-s = 600\n\n\
             [actions]\ndry-run = false\nexternal-url = \"https://rs.example\"\n\n\
             [[actions.rule]]\nrule = \"ib_link_flapping\"\naction = \"webhook\"\n\
             url = \"{}\"\ntimeout-s = 8\nattempts = 1\n\n\
             [[actions.rule]]\nrule = \"gpu_xid\"\naction = \"webhook\"\nurl = \"{}\"\n\n\
             [[actions.rule]]\nrule = \"gpu_lost\"\nseverity = \"warning\"\naction = \"command\"\n\
             command = [\"{}\"]\n",
            hung.url(),
            flaky.url(),
            script.display()
        ),
    )
    .unwrap();
    let c = collector(&dir, &config).start();

    // node01's port flaps: its webhook's endpoint takes the POST and never answers.
    fleet(&["node01"], 16)
        .flapping_port(0, 2)
        .flap_period(4, 1)
        .build(key_from_hex(KEY_HEX))
        .send_ticks(c.udp_addr(), 16)
        .unwrap();
    let flap = wait_for("node01's flap finding", Duration::from_secs(20), || {
        c.active_finding("ib_link_flapping", "node01")
    });
    wait_for("the hung endpoint's POST", Duration::from_secs(10), || {
        (!hung.bodies().is_empty()).then_some(())
    });
    let body: Value = serde_json::from_str(&hung.bodies()[0]).unwrap();
    assert_eq!(body["finding"]["id"], flap["id"]);
    assert_eq!(body["link"], "https://rs.example/#/node/node01");

    // While it hangs: an XID on node02 (a webhook refused once) and a GPU lost on node03
    // (a command).
    fleet(&["node02", "node03"], 8)
        .xid(0, 1, 79, 2)
        .lost_gpu(1, 3, 2)
        .build(key_from_hex(KEY_HEX))
        .send_ticks(c.udp_addr(), 8)
        .unwrap();
    let xid = wait_for("node02's XID finding", Duration::from_secs(20), || {
        c.active_finding("gpu_xid", "node02")
    });
    let lost = wait_for("node03's lost GPU finding", Duration::from_secs(20), || {
        c.active_finding("gpu_lost", "node03")
    });
    wait_for(
        "the XID's webhook and the command done",
        Duration::from_secs(20),
        || {
            (c.action_outcomes("node02").last().map(String::as_str) == Some("webhook done")
                && c.action_outcomes("node03").last().map(String::as_str) == Some("command done"))
            .then_some(())
        },
    );
    // ...and node01's webhook is still hanging, not yet cut off.
    assert_eq!(c.action_outcomes("node01"), ["webhook tried"]);
    assert_eq!(
        c.action_outcomes("node02"),
        ["webhook tried", "webhook failed", "webhook done"]
    );
    assert_eq!(
        c.action_outcomes("node03"),
        ["command tried", "command done"]
    );
    let posts = flaky.bodies();
    assert_eq!(posts.len(), 2, "refused once, then taken");
    for p in &posts {
        let body: Value = serde_json::from_str(p).unwrap();
        assert_eq!(body["finding"]["id"], xid["id"], "{p}");
        assert_eq!(body["finding"]["rule"], "gpu_xid", "{p}");
    }
    let got = std::fs::read_to_string(&out).unwrap();
    let lines: Vec<&str> = got.lines().collect();
    assert_eq!(lines.len(), 1, "{got}");
    let body: Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(body["finding"]["id"], lost["id"], "{got}");
    assert_eq!(body["finding"]["node"], "node03");

    // The hung endpoint is cut off at its timeout (8 s) and, with one attempt, given up.
    let gave_up = wait_for("node01's webhook given up", Duration::from_secs(20), || {
        c.json("/api/v1/actions")["records"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["node"] == "node01" && r["outcome"] == "gave_up")
            .cloned()
    });
    let detail = gave_up["detail"].as_str().unwrap();
    assert!(detail.to_lowercase().contains("timeout"), "{detail}");
    assert_eq!(gave_up["target"], hung.url().as_str());

    // Restarted, the findings still active: nothing is delivered again.
    let (ok, _, err) = c.stop();
    assert!(ok, "{err}");
    let c = collector(&dir, &config).start();
    wait_for(
        "the restarted collector's findings",
        Duration::from_secs(20),
        || c.active_finding("gpu_xid", "node02"),
    );
    thread::sleep(Duration::from_secs(5));
    assert_eq!(flaky.bodies().len(), 2);
    assert_eq!(hung.bodies().len(), 1);
    assert_eq!(std::fs::read_to_string(&out).unwrap().lines().count(), 1);
    assert_eq!(
        c.action_outcomes("node02"),
        ["webhook tried", "webhook failed", "webhook done"]
    );
    let (ok, _, err) = c.stop();
    assert!(ok, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
