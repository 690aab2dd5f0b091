//! The dashboard in a real browser: Debian's headless Chromium, driven over the DevTools
//! protocol (`headless_chrome`), opens the page of a real `railscope-collector` fed by a
//! simulated fleet (monitor-testkit: 16 nodes of 8 GPUs and 8 IB ports running one job, GPU 3
//! of node-005 slow and throttled, mlx5_2 of node-011 flapping) and the test checks what an
//! operator would see:
//! - fleet: every GPU and port of every node has its cell; exactly the active findings the
//!   API lists are marked, among them the flapping port as `ib_link_flapping`;
//! - job: the slow GPU, and nothing else, is marked as the job's straggler;
//! - node: the GPU utilization chart has one point per sweep sent, 8 series drawn as bands,
//!   and grows by the sweeps sent while the page is open (live update);
//! - events: the flapping port's transitions are all in the list and the timeline;
//! - no JavaScript error, failed request or blocked resource, and the error banner stays
//!   hidden.
//!
//! Screenshots of each view are kept in `target/dashboard-screenshots/`.
//!
//! Skips with a message when Chromium is not installed, unless `RAILSCOPE_REQUIRE_CHROMIUM=1`
//! (set by `cargo xtask test`, whose setup installs it), which makes that a failure.

use std::{
    ffi::OsStr,
    net::{SocketAddr, TcpListener, UdpSocket},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use headless_chrome::{
    Browser, LaunchOptions, Tab,
    protocol::cdp::{Page::CaptureScreenshotFormatOption, types::Event},
};
use monitor_testkit::SimulatedFleet;
use railscope_wire::Key;
use serde_json::Value;

const COLLECTOR: &str = env!("CARGO_BIN_EXE_railscope-collector");
const KEY: [u8; 32] = [0x5a; 32];
const NODES: usize = 16;
const JOB: &str = "slurm:4242";
const SLOW: (usize, usize) = (5, 3);
const FLAPPING: (usize, usize) = (11, 2);
/// Sweeps (1 s each) sent before the page opens, and while it is open.
const HISTORY: u64 = 150;
const LIVE: u64 = 10;

fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("RAILSCOPE_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    if path.exists() {
        return Some(path);
    }
    if std::env::var("RAILSCOPE_REQUIRE_CHROMIUM").is_ok_and(|v| v == "1") {
        panic!(
            "{} is missing: install Debian's chromium (`cargo xtask setup` does)",
            path.display()
        );
    }
    eprintln!(
        "skipped: {} is missing (install Debian's chromium, or set RAILSCOPE_CHROMIUM)",
        path.display()
    );
    None
}

fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

fn free_port() -> u16 {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // The same number must be free for UDP too (the collector's receive port).
    UdpSocket::bind(("127.0.0.1", port)).map_or_else(|_| free_port(), |_| port)
}

/// The collector binary on loopback ports, with a scratch archive; killed on drop.
struct RunningCollector {
    child: Child,
    udp: SocketAddr,
    http: SocketAddr,
    _dir: tempfile::TempDir,
}

impl RunningCollector {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("wire.key");
        let hex: String = KEY.iter().map(|b| format!("{b:02x}")).collect();
        std::fs::write(&key, format!("{hex}\n")).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let udp: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let child = Command::new(COLLECTOR)
            .args([
                OsStr::new("run"),
                OsStr::new("--listen"),
                OsStr::new(&udp.to_string()),
                OsStr::new("--http"),
                OsStr::new(&http.to_string()),
                OsStr::new("--key"),
                key.as_os_str(),
                OsStr::new("--data"),
                dir.path().join("data").as_os_str(),
            ])
            .env("RAILSCOPE_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting railscope-collector");
        let running = Self {
            child,
            udp,
            http,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while running.get("/metrics/collector").is_err() {
            assert!(
                Instant::now() < deadline,
                "the collector never answered HTTP"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        running
    }

    fn get(&self, path: &str) -> Result<String, ureq::Error> {
        ureq::get(&format!("http://{}{path}", self.http))
            .call()?
            .into_body()
            .read_to_string()
    }

    fn json(&self, path: &str) -> Value {
        let body = self.get(path).unwrap_or_else(|e| panic!("GET {path}: {e}"));
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
    }

    /// Waits until `ok` holds for the answer of `path`.
    fn wait_for(&self, path: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let v = self.json(path);
            if ok(&v) {
                return v;
            }
            assert!(Instant::now() < deadline, "{what} never came: {v}");
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for RunningCollector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the page reported that an operator would call broken.
#[derive(Default)]
struct PageProblems(Mutex<Vec<String>>);

impl PageProblems {
    fn record(&self, event: &Event) {
        let problem = match event {
            Event::RuntimeExceptionThrown(e) => Some(format!(
                "exception: {}",
                e.params
                    .exception_details
                    .exception
                    .as_ref()
                    .and_then(|x| x.description.clone())
                    .unwrap_or_else(|| e.params.exception_details.text.clone())
            )),
            Event::LogEntryAdded(e)
                if format!("{:?}", e.params.entry.level).to_lowercase() == "error" =>
            {
                Some(format!(
                    "log: {} {}",
                    e.params.entry.text,
                    e.params.entry.url.clone().unwrap_or_default()
                ))
            }
            Event::RuntimeConsoleAPICalled(e)
                if format!("{:?}", e.params.Type).to_lowercase() == "error"
                    || format!("{:?}", e.params.Type).to_lowercase() == "warning" =>
            {
                Some(format!(
                    "console: {}",
                    e.params
                        .args
                        .iter()
                        .map(|a| a
                            .value
                            .as_ref()
                            .map(|v| v.to_string())
                            .or_else(|| a.description.clone())
                            .unwrap_or_default())
                        .collect::<Vec<_>>()
                        .join(" ")
                ))
            }
            _ => None,
        };
        if let Some(p) = problem {
            self.0.lock().unwrap().push(p);
        }
    }

    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// Evaluates `expression` in the page; its JSON value.
fn eval(tab: &Tab, expression: &str) -> Value {
    let wrapped = format!("JSON.stringify((() => {{ {expression} }})() ?? null)");
    let result = tab
        .evaluate(&wrapped, false)
        .unwrap_or_else(|e| panic!("evaluating {expression}: {e}"));
    match result.value {
        Some(Value::String(s)) => serde_json::from_str(&s).unwrap(),
        other => panic!("evaluating {expression}: {other:?}"),
    }
}

/// Waits until `expression` gives true in the page (it re-renders every poll).
fn wait_until(tab: &Tab, what: &str, expression: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if eval(tab, expression) == Value::Bool(true) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the page never showed {what} ({expression})"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Opens a view and waits for a completed update of it after it was opened.
fn open(tab: &Tab, hash: &str, view: &str) {
    eval(
        tab,
        &format!("location.hash = {}; return true", Value::from(hash)),
    );
    let before = eval(tab, "return window.railscope.updates")
        .as_u64()
        .unwrap();
    wait_until(
        tab,
        &format!("the {view} view updated"),
        &format!(
            "return document.getElementById('view').dataset.view === '{view}' \
             && window.railscope.updates >= {}",
            before + 1
        ),
    );
}

fn screenshot(tab: &Tab, name: &str) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("../dashboard-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    let png = tab
        .capture_screenshot(CaptureScreenshotFormatOption::Png, None, None, true)
        .unwrap();
    std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
}

fn assert_no_problem(tab: &Tab, problems: &PageProblems, after: &str) {
    let banner = eval(
        tab,
        "const p = document.getElementById('problem'); return p.hidden ? null : p.textContent",
    );
    assert_eq!(banner, Value::Null, "the error banner showed after {after}");
    let seen = problems.take();
    assert!(
        seen.is_empty(),
        "after {after}, the page reported: {seen:#?}"
    );
}

#[test]
fn the_dashboard_shows_the_straggler_the_flapping_port_and_live_data() {
    let Some(chromium) = chromium() else { return };
    let collector = RunningCollector::start();
    let mut fleet = SimulatedFleet::builder(NODES)
        .job(JOB, 0..NODES)
        .slow_gpu(SLOW.0, SLOW.1)
        .flapping_port(FLAPPING.0, FLAPPING.1)
        .ticks_before_now(HISTORY)
        .build(Key::from_bytes(KEY));
    fleet.send_ticks(collector.udp, HISTORY).unwrap();
    let slow_node = fleet.node_name(SLOW.0).to_owned();
    let flapping_node = fleet.node_name(FLAPPING.0).to_owned();
    let flapping_device = format!("mlx5_{}", FLAPPING.1);

    // What the collector concluded, to compare the page with.
    let findings = collector.wait_for(
        "/api/v1/findings?active=true",
        "the flapping port's finding",
        |v| {
            v["findings"].as_array().unwrap().iter().any(|f| {
                f["rule"] == "ib_link_flapping"
                    && f["node"] == flapping_node.as_str()
                    && f["device"] == flapping_device.as_str()
            })
        },
    );
    let findings = findings["findings"].as_array().unwrap().clone();
    let gpu_points = collector.wait_for(
        &format!(
            "/api/v1/series?metric=railscope_gpu_utilization_ratio&match=node={slow_node}&start=-15m"
        ),
        "every sweep in the archive",
        |v| v["series"][0]["points"].as_array().map(Vec::len) == Some(HISTORY as usize),
    );
    assert_eq!(gpu_points["series"].as_array().unwrap().len(), 8);

    let profile = tempfile::tempdir().unwrap();
    let browser = Browser::new(
        LaunchOptions::default_builder()
            .path(Some(chromium))
            .headless(true)
            .sandbox(false)
            .window_size(Some((1500, 1100)))
            .user_data_dir(Some(profile.path().to_owned()))
            .args(vec![
                OsStr::new("--disable-quic"),
                OsStr::new("--disable-component-update"),
                OsStr::new("--no-first-run"),
            ])
            .idle_browser_timeout(Duration::from_secs(300))
            .build()
            .unwrap(),
    )
    .expect("starting headless Chromium");
    let tab = browser.new_tab().unwrap();
    tab.set_default_timeout(Duration::from_secs(60));
    let problems = Arc::new(PageProblems::default());
    let recorder = problems.clone();
    tab.add_event_listener(Arc::new(move |event: &Event| recorder.record(event)))
        .unwrap();
    tab.enable_log().unwrap().enable_runtime().unwrap();
    tab.navigate_to(&format!("http://{}/?refresh=1#/fleet", collector.http))
        .unwrap()
        .wait_until_navigated()
        .unwrap();

    // Fleet: every node's GPUs and ports, and the findings marked where they are.
    wait_until(
        &tab,
        "the fleet grid",
        "return window.railscope.updates >= 1 && !!document.querySelector('#fleet-grid .grid')",
    );
    let cells = eval(
        &tab,
        "return [document.querySelectorAll('.cell.gpu').length, \
                 document.querySelectorAll('.cell.port').length, \
                 document.querySelector('.grid').dataset.nodes]",
    );
    assert_eq!(
        cells,
        serde_json::json!([NODES * 8, NODES * 8, NODES.to_string()])
    );
    let flapping_cell = eval(
        &tab,
        &format!(
            "const c = document.querySelector('.cell.port[data-node=\"{flapping_node}\"][data-device=\"{flapping_device}\"][data-port=\"1\"]'); \
             return c && c.dataset.findingRule"
        ),
    );
    assert!(
        flapping_cell
            .as_str()
            .is_some_and(|rules| rules.split(' ').any(|r| r == "ib_link_flapping")),
        "the flapping port's cell: {flapping_cell}"
    );
    // Every active finding has its cell marked (or its node, for a node-wide finding), and no
    // cell is marked without one. Findings can start or end meanwhile: compared again after the
    // page's next update until both agree, for a while.
    let where_of = |f: &Value| {
        let node = f["node"].as_str().unwrap();
        if let Some(gpu) = f["gpu"].as_str() {
            format!("{node} gpu {gpu}")
        } else if let Some(device) = f["device"].as_str() {
            format!("{node} port {device}/{}", f["port"])
        } else {
            format!("{node} node")
        }
    };
    let mut findings = findings;
    let mut tries = 0;
    loop {
        let mut expected: Vec<String> = findings.iter().map(where_of).collect();
        expected.sort();
        expected.dedup();
        let marked = eval(
            &tab,
            "return [...document.querySelectorAll('#fleet-grid [data-finding-rule]')].map(c => \
               c.dataset.gpu !== undefined ? `${c.dataset.node} gpu ${c.dataset.gpu}` \
               : c.dataset.device !== undefined ? `${c.dataset.node} port ${c.dataset.device}/${c.dataset.port}` \
               : `${c.dataset.node} node`).sort()",
        );
        if marked == serde_json::json!(expected) {
            break;
        }
        tries += 1;
        assert!(
            tries < 10,
            "cells marked by findings: {marked}, expected {expected:?}"
        );
        let seen = eval(&tab, "return window.railscope.updates")
            .as_u64()
            .unwrap();
        wait_until(
            &tab,
            "the next update",
            &format!("return window.railscope.updates > {seen}"),
        );
        findings = collector.json("/api/v1/findings?active=true")["findings"]
            .as_array()
            .unwrap()
            .clone();
    }
    let rows = eval(
        &tab,
        "return document.querySelectorAll('#fleet-findings tr[data-finding-id]').length",
    );
    assert_eq!(rows, serde_json::json!(findings.len()));
    screenshot(&tab, "fleet");
    assert_no_problem(&tab, &problems, "the fleet view");

    // Jobs: the job, with one straggler.
    open(&tab, "#/jobs", "jobs");
    let jobs = eval(
        &tab,
        "return [...document.querySelectorAll('#jobs-list tr[data-job]')].map(r => [r.dataset.job, r.dataset.stragglers])",
    );
    assert_eq!(jobs, serde_json::json!([[JOB, "1"]]));

    // Job: the slow GPU is its straggler, and nothing else is.
    open(&tab, &format!("#/job/{JOB}"), "job");
    wait_until(
        &tab,
        "the job's stragglers",
        "return !!document.querySelector('#job-stragglers [data-stragglers]')",
    );
    let stragglers = eval(
        &tab,
        "return [...document.querySelectorAll('#job-grid [data-straggler]')].map(c => \
           [c.dataset.node, c.dataset.gpu || null, c.dataset.device || null])",
    );
    assert_eq!(
        stragglers,
        serde_json::json!([[slow_node, SLOW.1.to_string(), null]]),
        "cells marked as stragglers"
    );
    let job_cells = eval(
        &tab,
        "return document.querySelectorAll('#job-grid .cell.gpu').length",
    );
    assert_eq!(job_cells, serde_json::json!(NODES * 8));
    let first = eval(
        &tab,
        "const r = document.querySelector('[data-straggler-row=\"1\"]'); \
         return r && [r.dataset.node, r.dataset.gpu]",
    );
    assert_eq!(first, serde_json::json!([slow_node, SLOW.1.to_string()]));
    screenshot(&tab, "job");
    assert_no_problem(&tab, &problems, "the job view");

    // Node: one point per sweep, the 8 GPUs drawn as bands; then a live update.
    open(&tab, &format!("#/node/{slow_node}"), "node");
    let chart = "document.querySelector('.chart[data-metric=\"railscope_gpu_utilization_ratio\"]')";
    let drawn = eval(
        &tab,
        &format!(
            "const c = {chart}; const g = window.railscope.charts['node:railscope_gpu_utilization_ratio']; \
             return [c.dataset.points, c.dataset.series, g.numRows(), g.getOption('customBars'), \
                     !!c.querySelector('canvas')]"
        ),
    );
    assert_eq!(
        drawn,
        serde_json::json!([HISTORY.to_string(), "8", HISTORY, true, true])
    );
    let ports = eval(
        &tab,
        "return document.querySelector('.chart[data-metric=\"railscope_ib_port_xmit_bytes_total\"]').dataset.series",
    );
    assert_eq!(ports, serde_json::json!("8"));
    screenshot(&tab, "node");
    // The history ended when it was sent; the live sweeps are sent once their times are past.
    let due = fleet.tick_unix_ns(HISTORY + LIVE);
    while unix_now_ns() < due {
        std::thread::sleep(Duration::from_millis(100));
    }
    fleet.send_ticks(collector.udp, LIVE).unwrap();
    wait_until(
        &tab,
        "the sweeps sent while it was open",
        &format!(
            "return {chart}.dataset.points === '{}' && \
             window.railscope.charts['node:railscope_gpu_utilization_ratio'].numRows() === {}",
            HISTORY + LIVE,
            HISTORY + LIVE
        ),
    );
    screenshot(&tab, "node-live");
    assert_no_problem(&tab, &problems, "the node view");

    // Events: every transition of the flapping port, listed and on the timeline.
    let transitions = collector.json(&format!(
        "/api/v1/events?kind=port_transition&node={flapping_node}&start=-15m"
    ));
    let transitions = transitions["events"].as_array().unwrap().len();
    assert!(
        transitions >= 2 * (HISTORY as usize / 20),
        "the fleet flapped: {transitions} transitions"
    );
    open(&tab, "#/events", "events");
    let shown = eval(
        &tab,
        &format!(
            "return document.querySelectorAll('#events-list tr[data-event-kind=\"port_transition\"][data-node=\"{flapping_node}\"][data-device=\"{flapping_device}\"]').length"
        ),
    );
    assert_eq!(shown, serde_json::json!(transitions));
    let timeline = eval(
        &tab,
        "const g = window.railscope.charts['events']; \
         const lane = g.getLabels().indexOf('port transitions'); let dots = 0; \
         for (let r = 0; r < g.numRows(); r++) if (g.getValue(r, lane) !== null) dots++; \
         return [dots, document.querySelectorAll('#events-list tr[data-event-kind=\"finding\"]').length > 0]",
    );
    assert_eq!(
        timeline,
        serde_json::json!([transitions, true]),
        "the timeline's port transition dots, and a finding listed"
    );
    screenshot(&tab, "events");
    assert_no_problem(&tab, &problems, "the events view");
}
