//! The dashboard in a real browser: Debian's headless Chromium, driven over the DevTools
//! protocol (`headless_chrome`), opens the page of a real `railscope-collector` fed by a
//! simulated fleet (monitor-testkit: 16 nodes of 8 GPUs and 8 IB ports running one job, GPU 3
//! of node-005 slow and throttled, mlx5_2 of node-011 flapping, mlx5_5 of node-007 trained
//! down to 2X, GPU 6 of node-002 lost) and the test checks what an operator would see
//! (issue 28, "Where operators look"):
//! - fleet: every GPU and port of every node has its cell, under the headings node / GPUs /
//!   IB ports / job; port cells are labelled by device (`mlx5_2`); each node shows its job;
//!   exactly the active findings the API lists are marked, among them the flapping port as
//!   `ib_link_flapping`; the degraded port, measured against its class's nominal rate (400
//!   Gb/s, not its own 200), has a lower load and another colour than its healthy peers and
//!   is marked degraded; the lost GPU's cell is marked lost (hatched, "lost" in its label and
//!   title), and no other is;
//! - jobs: two loads ask the same aligned straggler window (its end on a 10 s step) and show
//!   the same answer, the one the API gives for that window;
//! - job: the slow GPU is marked as a straggler (and nothing else but the degraded port, or
//!   the flapping port while its latest steps were down, may be); the job's findings list the degraded port's, the lost GPU's and the flapping port's
//!   findings; its degraded port and lost GPU are marked in its grid;
//! - node: the GPU utilization chart has one point per sweep sent, 8 series drawn as bands,
//!   a legend naming GPU 0..7 without the pointer on it, whole `HH:MM[:SS]` time labels, and
//!   grows by the sweeps sent while the page is open (live update);
//! - events: the flapping port's transitions are all in the list and the timeline; the
//!   timeline spans the last hour, its ticks read `HH:MM`, and its dots are coloured by
//!   severity (critical, warning, info: one colour each, three colours), with a legend;
//! - a soft-RoCE node (packet counters, no byte counters): its IB charts show packets, titled
//!   so;
//! - no JavaScript error, failed request or blocked resource, and the error banner stays
//!   hidden.
//!
//! A second test runs 1,000 nodes (35 sweeps 2 s apart, then live; a port trained down and a
//! GPU lost among them): `/api/v1/live/latest?format=columns` holds what its series form
//! holds; the fleet view draws its heat map (a canvas above 500 nodes) with every node's 8
//! GPU and 8 port cells coloured but the lost GPU's, the lost GPU dark, the degraded port
//! marked and exactly the active findings' cells outlined, as its canvas' pixels and hover
//! line show; a click zooms to a rack of 64 nodes, a click there opens the node; the jobs list
//! and the job view answer, no error shows, and no series answer holds more than 200 k points
//! (the page asks per chunk of 200 nodes). A third, ignored, measures 12,500 nodes.
//!
//! Screenshots of each view are kept in `target/dashboard-screenshots/`.
//!
//! Skips with a message when Chromium is not installed, unless `RAILSCOPE_REQUIRE_CHROMIUM=1`
//! (set by `cargo xtask test`, whose setup installs it), which makes that a failure.

mod browser;

use std::{
    ffi::OsStr,
    net::{SocketAddr, TcpListener, UdpSocket},
    process::{Child, Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use browser::{Page, assert_no_problem, chromium, eval, open, screenshot, wait_until};
use headless_chrome::Tab;
use monitor_testkit::{HgxNode, SimulatedFleet, hgx};
use monitor_wire::Key;
use serde_json::Value;

const COLLECTOR: &str = env!("CARGO_BIN_EXE_railscope-collector");
const KEY: [u8; 32] = [0x5a; 32];
const NODES: usize = 16;
const JOB: &str = "slurm:4242";
const SLOW: (usize, usize) = (5, 3);
const FLAPPING: (usize, usize) = (11, 2);
/// A port trained down to 2X (half its peers' traffic), and a GPU fallen off the bus.
const DEGRADED: (usize, usize) = (7, 5);
const LOST: (usize, usize) = (2, 6);
/// A node wired like PFN's servers whose NIC 2 runs older firmware (every node sends its
/// hardware path, an HGX H100's).
const PFN: usize = 9;
/// Sweeps (1 s each) sent before the page opens, and while it is open.
const HISTORY: u64 = 150;
const LIVE: u64 = 10;

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
        Self::start_with(&[])
    }

    /// [`start`](Self::start) with more command-line arguments.
    fn start_with(extra: &[&str]) -> Self {
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
            .args(extra)
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

#[test]
fn the_dashboard_shows_the_straggler_the_flapping_port_and_live_data() {
    let Some(chromium) = chromium() else { return };
    let collector = RunningCollector::start();
    let mut fleet = SimulatedFleet::builder(NODES)
        .job(JOB, 0..NODES)
        .slow_gpu(SLOW.0, SLOW.1)
        .flapping_port(FLAPPING.0, FLAPPING.1)
        .degraded_port(DEGRADED.0, DEGRADED.1)
        .lost_gpu(LOST.0, LOST.1, HISTORY - 60)
        .hardware_path()
        .hgx_node(
            PFN,
            HgxNode::new(PFN as u32)
                .pfn_wired()
                .nic_with_old_firmware(2),
        )
        .ticks_before_now(HISTORY)
        .build(Key::from_bytes(KEY));
    fleet.send_ticks(collector.udp, HISTORY).unwrap();
    let pfn_node = fleet.node_name(PFN).to_owned();
    let slow_node = fleet.node_name(SLOW.0).to_owned();
    let flapping_node = fleet.node_name(FLAPPING.0).to_owned();
    let flapping_device = format!("mlx5_{}", FLAPPING.1);
    let degraded_node = fleet.node_name(DEGRADED.0).to_owned();
    let degraded_device = format!("mlx5_{}", DEGRADED.1);
    let lost_node = fleet.node_name(LOST.0).to_owned();

    // What the collector concluded, to compare the page with.
    let findings = collector.wait_for(
        "/api/v1/findings?active=true",
        "the flapping port's, the degraded port's and the lost GPU's findings",
        |v| {
            let list = v["findings"].as_array().unwrap();
            let has = |rule: &str, node: &str, device: Option<&str>| {
                list.iter().any(|f| {
                    f["rule"] == rule
                        && f["node"] == node
                        && device.is_none_or(|d| f["device"] == d)
                })
            };
            has("ib_link_flapping", &flapping_node, Some(&flapping_device))
                && has("ib_port_degraded", &degraded_node, Some(&degraded_device))
                && has("gpu_lost", &lost_node, None)
                && has("topology_drift", &pfn_node, None)
                && has("firmware_drift", &pfn_node, Some("mlx5_2"))
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

    let page = Page::open(
        chromium,
        &format!("http://{}/?refresh=1#/fleet", collector.http),
    );
    let (tab, problems) = (&*page.tab, &*page.problems);

    // Fleet: every node's GPUs and ports, and the findings marked where they are.
    wait_until(
        tab,
        "the fleet grid",
        "return window.railscope.updates >= 1 && !!document.querySelector('#fleet-grid .grid')",
    );
    let cells = eval(
        tab,
        "return [document.querySelectorAll('.cell.gpu').length, \
                 document.querySelectorAll('.cell.port').length, \
                 document.querySelector('.grid').dataset.nodes]",
    );
    assert_eq!(
        cells,
        serde_json::json!([NODES * 8, NODES * 8, NODES.to_string()])
    );
    let flapping_cell = eval(
        tab,
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
            // A device-wide finding (firmware) marks its ports' cells: the simulated devices
            // have port 1.
            format!("{node} port {device}/{}", f["port"].as_u64().unwrap_or(1))
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
            tab,
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
        let seen = eval(tab, "return window.railscope.updates")
            .as_u64()
            .unwrap();
        wait_until(
            tab,
            "the next update",
            &format!("return window.railscope.updates > {seen}"),
        );
        findings = collector.json("/api/v1/findings?active=true")["findings"]
            .as_array()
            .unwrap()
            .clone();
    }
    let rows = eval(
        tab,
        "return document.querySelectorAll('#fleet-findings tr[data-finding-id]').length",
    );
    assert_eq!(rows, serde_json::json!(findings.len()));
    // The degraded port (2X: half its line rate, and about half its peers' traffic) is
    // measured against its class's nominal rate: its load and colour are not its peers'.
    let ports = eval(
        tab,
        &format!(
            "return [...document.querySelectorAll('#fleet-grid .cell.port[data-node=\"{degraded_node}\"]')].map(c => \
               ({{ device: c.dataset.device, text: c.textContent, load: Number(c.dataset.load), \
                  colour: c.style.background, degraded: c.classList.contains('degraded'), \
                  rate: c.dataset.rateGbps, nominal: c.dataset.nominalGbps }}))"
        ),
    );
    let ports = ports.as_array().unwrap();
    assert_eq!(ports.len(), 8, "{ports:?}");
    let degraded = ports
        .iter()
        .find(|p| p["device"] == degraded_device.as_str())
        .unwrap();
    assert_eq!(
        (
            &degraded["degraded"],
            &degraded["rate"],
            &degraded["nominal"]
        ),
        (&Value::Bool(true), &Value::from("200"), &Value::from("400")),
        "the degraded port's cell: {degraded}"
    );
    for peer in ports
        .iter()
        .filter(|p| p["device"] != degraded_device.as_str())
    {
        assert_eq!(peer["degraded"], Value::Bool(false), "{peer}");
        assert!(
            degraded["load"].as_f64().unwrap() < 0.7 * peer["load"].as_f64().unwrap(),
            "the degraded port's load {degraded} is not below its healthy peer's {peer}"
        );
        assert_ne!(
            degraded["colour"], peer["colour"],
            "the degraded port is coloured like its peer {peer}"
        );
    }
    // Port cells are labelled by device, under headings; every node shows its job.
    let labels = eval(
        tab,
        "return [...document.querySelectorAll('#fleet-grid .cell.port')].every(c => c.textContent === c.dataset.device)",
    );
    assert_eq!(labels, Value::Bool(true), "port cells labelled by device");
    let headings = eval(
        tab,
        "return [...document.querySelectorAll('#fleet-grid .row.head > span')].map(s => s.textContent)",
    );
    assert_eq!(
        headings,
        serde_json::json!(["node", "GPUs", "IB ports", "job"])
    );
    let jobs = eval(
        tab,
        "return [...document.querySelectorAll('#fleet-grid .jobs[data-node]')].map(j => j.dataset.jobs)",
    );
    assert_eq!(jobs, serde_json::json!(vec![JOB; NODES]), "each node's job");
    // The lost GPU is drawn lost (not idle), and says so.
    let lost_cell = |tab: &Tab, grid: &str| {
        eval(
            tab,
            &format!(
                "const c = document.querySelector('{grid} .cell.gpu[data-node=\"{lost_node}\"][data-gpu=\"{}\"]'); \
                 return c && [c.dataset.lost, c.classList.contains('lost'), c.getAttribute('aria-label'), \
                              /LOST/.test(c.title), c.dataset.findingRule.split(' ').includes('gpu_lost'), \
                              getComputedStyle(c).backgroundImage.startsWith('repeating-linear-gradient')]",
                LOST.1
            ),
        )
    };
    assert_eq!(
        lost_cell(tab, "#fleet-grid"),
        serde_json::json!([
            "true",
            true,
            format!("GPU {} lost", LOST.1),
            true,
            true,
            true
        ]),
        "the lost GPU's cell"
    );
    let marked_lost = eval(
        tab,
        "return document.querySelectorAll('#fleet-grid .cell.gpu[data-lost]').length",
    );
    assert_eq!(
        marked_lost,
        serde_json::json!(1),
        "only the lost GPU is lost"
    );
    screenshot(tab, "fleet");
    assert_no_problem(tab, problems, "the fleet view");

    // Jobs: the job, with the stragglers the API finds over the same window; two loads
    // asking within one straggler step ask the same question and show the same answer.
    open(tab, "#/jobs", "jobs");
    let jobs_shown = |tab: &Tab| {
        eval(
            tab,
            "return [document.getElementById('jobs-list').dataset.window, window.railscope.stragglerQuery, \
                     [...document.querySelectorAll('#jobs-list tr[data-job]')].map(r => [r.dataset.job, r.dataset.stragglers])]",
        )
    };
    let mut tries = 0;
    let (first_load, second_load) = loop {
        let first = jobs_shown(tab);
        let seen = eval(tab, "return window.railscope.updates")
            .as_u64()
            .unwrap();
        wait_until(
            tab,
            "the jobs list's next update",
            &format!("return window.railscope.updates > {seen}"),
        );
        let second = jobs_shown(tab);
        // A load just past a step boundary asks about the next window: tried again.
        if first[0] == second[0] || tries == 3 {
            break (first, second);
        }
        tries += 1;
    };
    assert_eq!(first_load, second_load, "two loads of the jobs list");
    let window = first_load[0].as_str().unwrap();
    let (start, end) = window.split_once('-').unwrap();
    let (start, end): (u64, u64) = (start.parse().unwrap(), end.parse().unwrap());
    assert_eq!(
        (end % 10, end - start),
        (0, 300),
        "the straggler window {window}"
    );
    let query = first_load[1].as_str().unwrap();
    let api = collector.json(query);
    let expected: Vec<Value> = api["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            serde_json::json!([
                j["job_id"],
                j["stragglers"].as_array().unwrap().len().to_string()
            ])
        })
        .collect();
    assert_eq!(first_load[2], serde_json::json!(expected), "{query}: {api}");
    assert_eq!(
        first_load[2][0][0],
        Value::from(JOB),
        "the job is listed: {first_load}"
    );
    screenshot(tab, "jobs");

    // Job: the slow GPU is its straggler, and nothing else is.
    open(tab, &format!("#/job/{JOB}"), "job");
    wait_until(
        tab,
        "the job's stragglers",
        "return !!document.querySelector('#job-stragglers [data-stragglers]')",
    );
    // The slow GPU is marked, and only it, the degraded port (half its peers' traffic) or
    // the flapping port (no traffic while down: an onset when its latest steps were down).
    let stragglers = eval(
        tab,
        "return [...document.querySelectorAll('#job-grid [data-straggler]')].map(c => \
           [c.dataset.node, c.dataset.gpu || null, c.dataset.device || null])",
    );
    let slow_gpu = serde_json::json!([slow_node, SLOW.1.to_string(), null]);
    let degraded_port = serde_json::json!([degraded_node, null, degraded_device]);
    let flapping_port = serde_json::json!([flapping_node, null, flapping_device]);
    let stragglers = stragglers.as_array().unwrap();
    assert!(
        stragglers.contains(&slow_gpu)
            && stragglers
                .iter()
                .all(|s| *s == slow_gpu || *s == degraded_port || *s == flapping_port),
        "cells marked as stragglers: {stragglers:?}"
    );
    // The job's findings: the degraded port's and the lost GPU's are listed, their cells
    // marked, the lost GPU drawn lost.
    let job_findings = eval(
        tab,
        "return [...document.querySelectorAll('#job-findings tr[data-finding-rule]')].map(r => \
           [r.dataset.findingRule, r.dataset.node, r.dataset.device || r.dataset.gpu || null])",
    );
    let job_findings = job_findings.as_array().unwrap();
    for expected in [
        serde_json::json!(["ib_port_degraded", degraded_node, degraded_device]),
        serde_json::json!(["gpu_lost", lost_node, LOST.1.to_string()]),
        serde_json::json!(["ib_link_flapping", flapping_node, flapping_device]),
    ] {
        assert!(
            job_findings.contains(&expected),
            "the job view lists {expected}: {job_findings:?}"
        );
    }
    let degraded_cell = eval(
        tab,
        &format!(
            "const c = document.querySelector('#job-grid .cell.port[data-node=\"{degraded_node}\"][data-device=\"{degraded_device}\"]'); \
             return c && [c.classList.contains('degraded'), (c.dataset.findingRule || '').split(' ').includes('ib_port_degraded')]"
        ),
    );
    assert_eq!(degraded_cell, serde_json::json!([true, true]));
    assert_eq!(
        lost_cell(tab, "#job-grid"),
        serde_json::json!([
            "true",
            true,
            format!("GPU {} lost", LOST.1),
            true,
            true,
            true
        ]),
        "the lost GPU's cell in the job view"
    );
    let job_cells = eval(
        tab,
        "return document.querySelectorAll('#job-grid .cell.gpu').length",
    );
    assert_eq!(job_cells, serde_json::json!(NODES * 8));
    let ranked = eval(
        tab,
        "return [...document.querySelectorAll('[data-straggler-row]')].map(r => [r.dataset.node, r.dataset.gpu || null])",
    );
    assert!(
        ranked
            .as_array()
            .unwrap()
            .contains(&serde_json::json!([slow_node, SLOW.1.to_string()])),
        "the slow GPU ranked among the stragglers: {ranked}"
    );
    screenshot(tab, "job");
    assert_no_problem(tab, problems, "the job view");

    // Node: one point per sweep, the 8 GPUs drawn as bands; then a live update.
    open(tab, &format!("#/node/{slow_node}"), "node");
    let chart = "document.querySelector('.chart[data-metric=\"railscope_gpu_utilization_ratio\"]')";
    let drawn = eval(
        tab,
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
        tab,
        "return document.querySelector('.chart[data-metric=\"railscope_ib_port_xmit_bytes_total\"]').dataset.series",
    );
    assert_eq!(ports, serde_json::json!("8"));
    // The legend names every GPU without the pointer on the chart; the time labels are whole.
    let legend = eval(
        tab,
        "const l = document.querySelector('.chart-legend[data-legend-for=\"railscope_gpu_utilization_ratio\"]'); \
         return l && l.textContent",
    );
    let legend = legend.as_str().unwrap_or_default();
    for gpu in 0..8 {
        assert!(
            legend.contains(&format!("GPU {gpu}")),
            "the node's legend lists GPU {gpu}: {legend:?}"
        );
    }
    let x_labels = eval(
        tab,
        &format!(
            "return [...{chart}.querySelectorAll('.dygraph-axis-label-x')].map(l => \
               [l.textContent, l.scrollWidth <= l.parentElement.clientWidth + 1])"
        ),
    );
    let x_labels = x_labels.as_array().unwrap();
    assert!(!x_labels.is_empty());
    for l in x_labels {
        let text = l[0].as_str().unwrap();
        assert!(
            is_time_of_day(text, true) && l[1] == Value::Bool(true),
            "an x label of the node's chart: {l}"
        );
    }
    screenshot(tab, "node");
    // The history ended when it was sent; the live sweeps are sent once their times are past.
    let due = fleet.tick_unix_ns(HISTORY + LIVE);
    while unix_now_ns() < due {
        std::thread::sleep(Duration::from_millis(100));
    }
    fleet.send_ticks(collector.udp, LIVE).unwrap();
    wait_until(
        tab,
        "the sweeps sent while it was open",
        &format!(
            "return {chart}.dataset.points === '{}' && \
             window.railscope.charts['node:railscope_gpu_utilization_ratio'].numRows() === {}",
            HISTORY + LIVE,
            HISTORY + LIVE
        ),
    );
    screenshot(tab, "node-live");
    assert_no_problem(tab, problems, "the node view");

    // The PFN-wired node's hardware path: 8 GPUs and 8 NICs with their places and links, the
    // older firmware marked with the class's, each GPU's two NICs under its switch marked as
    // through the CPU (NODE) where the class has them under one switch (PIX), and the
    // golden profile's findings marked on the firmware's row and the matrix.
    open(tab, &format!("#/node/{pfn_node}"), "node");
    wait_until(
        tab,
        "the hardware path",
        "return !!document.querySelector('#node-hardware table[data-hardware=\"distances\"]')",
    );
    let hardware = eval(
        tab,
        "const h = document.getElementById('node-hardware');          const m = h.querySelector('table[data-hardware=\"distances\"]');          const fw = h.querySelector('tr[data-hw-device=\"mlx5_2\"]');          const drift = [...m.querySelectorAll('td[data-drift]')];          return { gpus: h.querySelectorAll('tr[data-hw-gpu]').length,                   nics: h.querySelectorAll('tr[data-hw-device]').length,                   link: h.querySelector('tr[data-hw-gpu=\"0\"]').children[5].textContent,                   cells: m.querySelectorAll('td').length,                   drift: drift.map(c => `${c.dataset.gpu}-${c.dataset.nic} ${c.textContent}/${c.dataset.classValue}`),                   fwRule: fw.dataset.findingRule,                   fwDrift: [...fw.querySelectorAll('td[data-drift]')].map(c => [c.textContent, c.dataset.classValue]),                   matrixRule: h.querySelector('h3').dataset.findingRule,                   otherDrift: h.querySelectorAll('table[data-hardware=\"devices\"] td[data-drift]').length }",
    );
    let pix_pairs: Vec<String> = (0..8)
        .flat_map(|g| {
            let switch = g / 2;
            [2 * switch, 2 * switch + 1].map(|n| format!("{g}-mlx5_{n} NODE/PIX"))
        })
        .collect();
    assert_eq!(
        hardware,
        serde_json::json!({
            "gpus": 8, "nics": 8, "link": "Gen5 x16", "cells": 64,
            "drift": pix_pairs,
            "fwRule": "firmware_drift",
            "fwDrift": [[hgx::OLD_FIRMWARE, hgx::FIRMWARE]],
            "matrixRule": "topology_drift",
            "otherDrift": 1,
        }),
        "the PFN node's hardware path"
    );
    screenshot(tab, "node-hardware");
    assert_no_problem(tab, problems, "the node's hardware path");

    // A soft-RoCE node (rxe has packet counters, no byte counters): its IB charts show packets.
    send_rxe_node(collector.udp, RXE_NODE, 30);
    open(tab, &format!("#/node/{RXE_NODE}"), "node");
    wait_until(
        tab,
        "the rxe node's transmit chart drawn from its packet counters",
        "const c = document.querySelector('.chart[data-metric=\"railscope_ib_port_xmit_bytes_total\"]'); \
         return c && c.dataset.shows === 'railscope_ib_sent_pkts_total' && c.dataset.series === '2' \
           && !!c.querySelector('canvas')",
    );
    let titles = eval(
        tab,
        "return [...document.querySelectorAll('h3[data-title-for]')].map(h => h.textContent).slice(-2)",
    );
    assert_eq!(
        titles,
        serde_json::json!([
            "IB transmit (packets/s; no byte counters)",
            "IB receive (packets/s; no byte counters)"
        ])
    );
    screenshot(tab, "node-rxe");
    assert_no_problem(tab, problems, "the rxe node's view");

    // Events: every transition of the flapping port, listed and on the timeline.
    let transitions = collector.json(&format!(
        "/api/v1/events?kind=port_transition&node={flapping_node}&start=-15m"
    ));
    let transitions = transitions["events"].as_array().unwrap().len();
    assert!(
        transitions >= 2 * (HISTORY as usize / 20),
        "the fleet flapped: {transitions} transitions"
    );
    open(tab, "#/events", "events");
    let shown = eval(
        tab,
        &format!(
            "return document.querySelectorAll('#events-list tr[data-event-kind=\"port_transition\"][data-node=\"{flapping_node}\"][data-device=\"{flapping_device}\"]').length"
        ),
    );
    assert_eq!(shown, serde_json::json!(transitions));
    let timeline = eval(
        tab,
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
    // The timeline spans the hour its legend names, with times of day on its axis, and its
    // dots are coloured by severity (the lost GPU critical, a port going down a warning, one
    // coming back up information), one colour per severity.
    let span = eval(
        tab,
        "const r = window.railscope.charts['events'].xAxisRange(); return [r[0], r[1], Date.now()]",
    );
    let (from, to, now) = (
        span[0].as_f64().unwrap(),
        span[1].as_f64().unwrap(),
        span[2].as_f64().unwrap(),
    );
    assert!(
        (to - from - 3_600_000.0).abs() < 1_000.0 && (now - to).abs() < 30_000.0,
        "the timeline's x range: {span}"
    );
    let ticks = eval(
        tab,
        "return [...document.querySelectorAll('#timeline .dygraph-axis-label-x')].map(l => l.textContent)",
    );
    let ticks = ticks.as_array().unwrap();
    assert!(ticks.len() >= 3, "the timeline's ticks: {ticks:?}");
    assert!(
        ticks
            .iter()
            .all(|t| is_time_of_day(t.as_str().unwrap(), false)),
        "the timeline's ticks are HH:MM: {ticks:?}"
    );
    let dots = eval(
        tab,
        "const by = {}; for (const d of window.railscope.timelineDots) (by[d.severity] ??= new Set()).add(d.colour); \
         return Object.fromEntries(Object.entries(by).map(([s, c]) => [s, [...c]]))",
    );
    let by_severity = dots.as_object().unwrap();
    for severity in ["critical", "warning", "info"] {
        let colours = by_severity.get(severity).and_then(Value::as_array);
        assert_eq!(
            colours.map(Vec::len),
            Some(1),
            "the {severity} dots' colours: {dots}"
        );
    }
    let colours: std::collections::BTreeSet<String> = by_severity
        .values()
        .map(|c| c[0].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(colours.len(), 3, "one colour per severity: {dots}");
    let legend = eval(
        tab,
        "return [...document.querySelectorAll('#view .legend .swatch.dot')].map(s => [s.dataset.severity, s.style.background])",
    );
    assert_eq!(
        legend.as_array().map(Vec::len),
        Some(3),
        "the severity legend: {legend}"
    );
    screenshot(tab, "events");
    assert_no_problem(tab, problems, "the events view");
}

/// Where a finding is, as the fleet view names it: `NODE gpu G`, `NODE port DEVICE/PORT`,
/// `NODE node`.
fn finding_place(f: &Value) -> String {
    let node = f["node"].as_str().unwrap();
    if let Some(gpu) = f["gpu"].as_str() {
        format!("{node} gpu {gpu}")
    } else if let Some(device) = f["device"].as_str() {
        format!("{node} port {device}/{}", f["port"])
    } else {
        format!("{node} node")
    }
}

/// `HH:MM` (or, with `seconds`, also `HH:MM:SS`).
/// A node without GPUs whose two rxe ports count packets only (as soft-RoCE's hw_counters do):
/// `seconds` of 1 s sweeps ending now, sent as the agent names them.
const RXE_NODE: &str = "rxe-node";

fn send_rxe_node(udp: SocketAddr, node: &str, seconds: u64) {
    use monitor_wire::{CounterSample, EncoderConfig, FrameEncoder, Kind, Labels, Sample, Series};
    let mut encoder = FrameEncoder::new(EncoderConfig::new(node), Key::from_bytes(KEY)).unwrap();
    let now = unix_now_ns();
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    for s in 0..seconds {
        let t = now - (seconds - 1 - s) * 1_000_000_000;
        for device in ["rxe0", "rxe1"] {
            for name in [
                "railscope_ib_sent_pkts_total",
                "railscope_ib_rcvd_pkts_total",
            ] {
                let series = Series {
                    name: name.into(),
                    labels: Labels::new([("device", device), ("port", "1")]),
                    kind: Kind::Counter,
                };
                let sample = Sample::Counter(CounterSample {
                    unix_ns: t,
                    value: s * 25_000,
                });
                encoder.push_sample(&series, sample).unwrap();
            }
        }
    }
    for frame in encoder.flush(now) {
        socket.send_to(&frame, udp).unwrap();
    }
}

fn is_time_of_day(text: &str, seconds: bool) -> bool {
    let parts: Vec<&str> = text.split(':').collect();
    (parts.len() == 2 || (seconds && parts.len() == 3))
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_digit()))
}

/// A fleet of 1,000 nodes (the size at which the fleet view's port queries used to be
/// refused): 70 s of history, sweeps 2 s apart (as adaptive sampling stretches them), then
/// a sweep every 2 s while the page is open, as a live fleet would send. The fleet view
/// draws every node's GPU and port cells, coloured, the jobs list and the job view answer,
/// and no error shows (what the heat map drew, read from `window.railscope.fleet` and its
/// pixels: see the module's doc). The fleet and job views colour their cells from the live table
/// (`/api/v1/live/latest`, one answer of every GPU and port series) rather than a minute of
/// the archive; no series answer the page asked for holds more than 200 k points.
///
/// The sweeps are 2 s apart because the straggler analysis (`/api/v1/stragglers`, behind the
/// jobs list) asks the archive for every GPU series of the 5-minute window in one query: at
/// 1 s sweeps, 1,000 nodes x 8 GPUs x 300 s = 2.4 M points, over the default limit.
#[test]
fn the_dashboard_shows_a_fleet_of_1000_nodes() {
    const BIG: usize = 1_000;
    const BIG_HISTORY: u64 = 35;
    const BIG_INTERVAL: Duration = Duration::from_secs(2);
    // A port trained down to 2X and a GPU fallen off the bus, in the 4th and 11th racks.
    const BIG_DEGRADED: (usize, usize) = (200, 5);
    const BIG_LOST: (usize, usize) = (650, 6);
    let Some(chromium) = chromium() else { return };
    let collector = RunningCollector::start();
    let mut fleet = SimulatedFleet::builder(BIG)
        .job(JOB, 0..BIG)
        .degraded_port(BIG_DEGRADED.0, BIG_DEGRADED.1)
        .lost_gpu(BIG_LOST.0, BIG_LOST.1, 10)
        .interval(BIG_INTERVAL)
        .ticks_before_now(BIG_HISTORY)
        .build(Key::from_bytes(KEY));
    let sent = Instant::now();
    fleet.send_ticks(collector.udp, BIG_HISTORY).unwrap();
    eprintln!(
        "{BIG} nodes x {BIG_HISTORY} sweeps sent in {:?}",
        sent.elapsed()
    );
    let last_node = fleet.node_name(BIG - 1).to_owned();
    let names: Vec<String> = (0..BIG).map(|i| fleet.node_name(i).to_owned()).collect();
    let fleet_node = |i: usize| names[i].clone();
    collector.wait_for("/api/v1/live/nodes", "every node", |v| {
        v.as_array().map(Vec::len) == Some(BIG)
    });
    collector.wait_for(
        &format!(
            "/api/v1/series?metric=railscope_ib_port_xmit_bytes_total&match=node={last_node}&start=-1m"
        ),
        "the last node's ports in the archive",
        |v| v["series"].as_array().map(Vec::len) == Some(8),
    );
    // The columns form of the latest values holds what the series form holds (asked until
    // both agree: the collector may still be taking in the last sweeps).
    let ask = |format: &str| {
        collector.json(&format!(
            "/api/v1/live/latest?metric=railscope_gpu_utilization_ratio&metric=railscope_ib_port_xmit_bytes_total&match=node={last_node}{format}"
        ))
    };
    let as_series = || {
        let mut out: Vec<String> = ask("")["series"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                format!(
                    "{} {} {} {}",
                    s["metric"], s["kind"], s["labels"], s["points"][0]
                )
            })
            .collect();
        out.sort();
        out
    };
    let as_columns = || {
        let mut out: Vec<String> = Vec::new();
        for c in ask("&format=columns")["metrics"].as_array().unwrap() {
            let (names, fields) = (
                c["labels"].as_array().unwrap(),
                c["fields"].as_array().unwrap(),
            );
            for row in c["rows"].as_array().unwrap() {
                let row = row.as_array().unwrap();
                let labels: serde_json::Map<String, Value> = names
                    .iter()
                    .zip(row)
                    .filter(|(_, v)| !v.is_null())
                    .map(|(n, v)| (n.as_str().unwrap().to_owned(), v.clone()))
                    .collect();
                let point: serde_json::Map<String, Value> = fields
                    .iter()
                    .zip(&row[names.len()..])
                    .map(|(n, v)| (n.as_str().unwrap().to_owned(), v.clone()))
                    .collect();
                out.push(format!(
                    "{} {} {} {}",
                    c["metric"],
                    c["kind"],
                    Value::Object(labels),
                    Value::Object(point)
                ));
            }
        }
        out.sort();
        out
    };
    // The compact form: each series' labels as indexes into the answer's dictionary, its
    // value (a counter's rate, a gauge's mean) as f32; against the series form's, so.
    let value_of = |kind: &Value, point: &Value| -> Option<f32> {
        let v = if kind == "counter" {
            &point["rate"]
        } else {
            &point["mean"]
        };
        v.as_f64().map(|v| v as f32)
    };
    let series_values = || {
        let mut out: Vec<String> = ask("")["series"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                format!(
                    "{} {} {} {:?}",
                    s["metric"],
                    s["kind"],
                    s["labels"],
                    value_of(&s["kind"], &s["points"][0])
                )
            })
            .collect();
        out.sort();
        out
    };
    let as_compact = || {
        let answer = ask("&format=compact");
        let dictionary = &answer["dictionary"];
        let mut out: Vec<String> = Vec::new();
        for m in answer["metrics"].as_array().unwrap() {
            let labels = m["labels"].as_object().unwrap();
            for (i, v) in m["values"].as_array().unwrap().iter().enumerate() {
                let named: serde_json::Map<String, Value> = labels
                    .iter()
                    .filter_map(|(name, at)| {
                        let at = at[i].as_u64()? as usize;
                        Some((name.clone(), dictionary[name][at].clone()))
                    })
                    .collect();
                out.push(format!(
                    "{} {} {} {:?}",
                    m["metric"],
                    m["kind"],
                    Value::Object(named),
                    v.as_f64().map(|v| v as f32)
                ));
            }
        }
        out.sort();
        out
    };
    for tries in 0.. {
        let (before, columns, after) = (as_series(), as_columns(), as_series());
        let (values_before, compact, values_after) =
            (series_values(), as_compact(), series_values());
        assert_eq!(before.len(), 16, "{before:?}");
        if before == after && values_before == values_after {
            assert_eq!(columns, before, "the columns form against the series form");
            assert_eq!(
                compact, values_before,
                "the compact form against the series form"
            );
            break;
        }
        assert!(tries < 40, "the latest values never settled");
        std::thread::sleep(Duration::from_millis(500));
    }
    // `label=` keeps a compact answer to the labels asked for (and `node`): the GPUs'
    // numbers without their uuids.
    let only_gpu = ask("&format=compact&label=gpu");
    let names: Vec<&String> = only_gpu["dictionary"].as_object().unwrap().keys().collect();
    assert_eq!(names, ["gpu", "node"], "{only_gpu}");
    assert_eq!(
        only_gpu["dictionary"]["gpu"].as_array().map(Vec::len),
        Some(8),
        "{only_gpu}"
    );
    for refused in ["format=rows", "format=columns&label=gpu"] {
        let answer = ureq::get(&format!(
            "http://{}/api/v1/live/latest?metric=railscope_gpu_utilization_ratio&{refused}",
            collector.http
        ))
        .call();
        assert!(
            matches!(answer, Err(ureq::Error::StatusCode(400))),
            "{refused}: {answer:?}"
        );
    }

    // The fleet goes on sending, a sweep every 2 s, until the test ends.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let live = {
        let stop = stop.clone();
        let udp = collector.udp;
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if unix_now_ns() >= fleet.tick_unix_ns(fleet.ticks()) {
                    fleet.send_ticks(udp, 1).unwrap();
                } else {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        })
    };
    struct StopOnDrop(Arc<std::sync::atomic::AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let stopper = StopOnDrop(stop);

    // What the collector concluded, to compare the heat map with.
    let lost_node = fleet_node(BIG_LOST.0);
    let degraded_node = fleet_node(BIG_DEGRADED.0);
    let degraded_port = format!("mlx5_{}/1", BIG_DEGRADED.1);
    collector.wait_for(
        "/api/v1/findings?active=true",
        "the degraded port's and the lost GPU's findings",
        |v| {
            let list = v["findings"].as_array().unwrap();
            let has = |rule: &str, node: &str| {
                list.iter().any(|f| f["rule"] == rule && f["node"] == node)
            };
            has("ib_port_degraded", &degraded_node) && has("gpu_lost", &lost_node)
        },
    );

    let page = Page::open(
        chromium,
        &format!("http://{}/?refresh=5#/fleet", collector.http),
    );
    let (tab, problems) = (&*page.tab, &*page.problems);
    let started = Instant::now();
    wait_until(
        tab,
        "the fleet heat map",
        "return window.railscope.updates >= 1 && !!document.querySelector('#fleet-grid canvas.heat-map')",
    );
    eprintln!("fleet view of {BIG} nodes drawn in {:?}", started.elapsed());
    // Above 500 nodes the fleet is one canvas, not a DOM cell per GPU and port.
    let cells = eval(
        tab,
        "const f = window.railscope.fleet;          return [f.mode, f.zoom, f.nodes, f.gpuCells, f.portCells, f.colouredGpus, f.colouredPorts, f.nodesColoured,                  f.lost, f.degraded, document.querySelectorAll('#fleet-grid .cell').length]",
    );
    assert_eq!(
        cells,
        serde_json::json!([
            "canvas",
            "fleet",
            BIG,
            BIG * 8,
            BIG * 8,
            BIG * 8 - 1,
            BIG * 8,
            BIG - 1,
            [format!("{lost_node} gpu {}", BIG_LOST.1)],
            [format!("{degraded_node} port {degraded_port}")],
            0
        ]),
        "mode, zoom, nodes drawn, GPU and port cells, coloured GPU and port cells, nodes fully \
         coloured (all but the lost GPU's), lost GPUs, degraded ports, DOM cells"
    );
    // Every active finding outlines its cell (or its node), and nothing else is outlined.
    let mut tries = 0;
    loop {
        let findings = collector.json("/api/v1/findings?active=true")["findings"]
            .as_array()
            .unwrap()
            .clone();
        let mut expected: Vec<String> = findings.iter().map(finding_place).collect();
        expected.sort();
        expected.dedup();
        let marked = eval(tab, "return window.railscope.fleet.marked");
        if marked == serde_json::json!(expected) {
            break;
        }
        tries += 1;
        assert!(
            tries < 10,
            "cells outlined by findings: {marked}, expected {expected:?}"
        );
        let seen = eval(tab, "return window.railscope.updates")
            .as_u64()
            .unwrap();
        wait_until(
            tab,
            "the next update",
            &format!("return window.railscope.updates > {seen}"),
        );
    }
    // What is on the canvas: a busy GPU in its colour (not the page's white or no-data
    // grey), the lost GPU dark, the degraded port's load below its healthy peer's.
    let drawn = eval(
        tab,
        &format!(
            "const f = window.railscope.fleet; \
             return [f.pixelOf('{first}', 'gpu', 0), f.cellOf('{first}', 'gpu', 0).colour, \
                     f.pixelOf('{lost_node}', 'gpu', {lost_gpu}), \
                     f.cellOf('{degraded_node}', 'port', '{degraded_port}').value, \
                     f.cellOf('{degraded_node}', 'port', 'mlx5_0/1').value]",
            first = fleet_node(0),
            lost_gpu = BIG_LOST.1,
        ),
    );
    let rgb = |v: &Value| -> Vec<u64> {
        v.as_array().unwrap()[..3]
            .iter()
            .map(|c| c.as_u64().unwrap())
            .collect()
    };
    assert_ne!(rgb(&drawn[0]), vec![255, 255, 255], "{drawn}");
    assert_ne!(rgb(&drawn[0]), vec![0xe4, 0xe4, 0xe4], "{drawn}");
    assert!(drawn[1].as_str().unwrap().starts_with("hsl(212"), "{drawn}");
    assert_eq!(
        rgb(&drawn[2]),
        vec![0x3a, 0x3f, 0x4b],
        "the lost GPU: {drawn}"
    );
    assert!(
        drawn[3].as_f64().unwrap() < 0.7 * drawn[4].as_f64().unwrap(),
        "the degraded port's load is not below its healthy peer's: {drawn}"
    );
    // Pointing at a cell names it.
    let hover = eval(
        tab,
        &format!(
            "const c = document.querySelector('#fleet-grid canvas'); const r = c.getBoundingClientRect(); \
             const [x, y] = window.railscope.fleet.centreOf('{lost_node}', 'gpu', {lost_gpu}); \
             c.dispatchEvent(new MouseEvent('mousemove', {{ clientX: r.left + x, clientY: r.top + y, bubbles: true }})); \
             return document.getElementById('fleet-hover').textContent",
            lost_gpu = BIG_LOST.1,
        ),
    );
    assert_eq!(
        hover
            .as_str()
            .map(|t| t.starts_with(&format!("{lost_node} GPU {}: LOST", BIG_LOST.1))),
        Some(true),
        "the hover line over the lost GPU: {hover}"
    );
    let rows = eval(
        tab,
        "return document.querySelectorAll('#fleet-findings tr[data-finding-id]').length",
    );
    assert!(
        rows.as_u64().unwrap() >= 2,
        "the active findings table: {rows}"
    );
    screenshot(tab, "fleet-1000");
    assert_no_problem(tab, problems, "the fleet view of 1,000 nodes");

    // Zoom: a click on the lost GPU's rack opens that rack (64 nodes by name), a click on
    // a cell there opens its node.
    let rack = BIG_LOST.0 / 64 + 1;
    let click = |tab: &Tab, node: &str| {
        eval(
            tab,
            &format!(
                "const c = document.querySelector('#fleet-grid canvas'); const r = c.getBoundingClientRect(); \
                 const [x, y] = window.railscope.fleet.centreOf('{node}', 'gpu', 0); \
                 c.dispatchEvent(new MouseEvent('click', {{ clientX: r.left + x, clientY: r.top + y, bubbles: true }})); \
                 return location.hash"
            ),
        )
    };
    assert_eq!(
        click(tab, &lost_node),
        Value::from(format!("#/fleet/rack/{rack}"))
    );
    wait_until(
        tab,
        "the rack",
        &format!("return window.railscope.fleet && window.railscope.fleet.zoom === 'rack {rack}'"),
    );
    let rack_view = eval(
        tab,
        &format!(
            "const f = window.railscope.fleet; return [f.nodes, f.colouredPorts, f.lost, !!f.cellOf('{lost_node}', 'gpu', 0)]"
        ),
    );
    assert_eq!(
        rack_view,
        serde_json::json!([
            64,
            64 * 8,
            [format!("{lost_node} gpu {}", BIG_LOST.1)],
            true
        ]),
        "the rack's nodes, coloured ports, lost GPUs, the lost GPU's node"
    );
    screenshot(tab, "fleet-1000-rack");
    assert_eq!(
        click(tab, &lost_node),
        Value::from(format!("#/node/{lost_node}"))
    );
    assert_no_problem(tab, problems, "a rack of the fleet view of 1,000 nodes");

    open(tab, "#/jobs", "jobs");
    let jobs = eval(
        tab,
        "return [...document.querySelectorAll('#jobs-list tr[data-job]')].map(r => r.dataset.job)",
    );
    assert_eq!(jobs, serde_json::json!([JOB]));
    assert_no_problem(tab, problems, "the jobs list of 1,000 nodes");

    open(tab, &format!("#/job/{JOB}"), "job");
    let job_cells = eval(
        tab,
        "return [document.querySelectorAll('#job-grid .cell.gpu').length, \
                 document.querySelectorAll('#job-grid .cell.port').length]",
    );
    assert_eq!(job_cells, serde_json::json!([BIG * 8, BIG * 8]));
    screenshot(tab, "job-1000");
    assert_no_problem(tab, problems, "the job view of 1,000 nodes");

    // The fleet and job views read the live table: one answer of every node's GPU and port
    // series, no scan of the archive (the jobs list's straggler query is the archive's).
    let most = eval(tab, "return window.railscope.maxLatestSeries")
        .as_u64()
        .unwrap();
    assert!(
        most >= (BIG * 8 * 3) as u64,
        "the fleet view's latest values held {most} series, not every GPU and port of {BIG} nodes"
    );
    let points = eval(tab, "return window.railscope.maxSeriesPoints")
        .as_u64()
        .unwrap();
    assert!(
        points <= 200_000,
        "the largest series answer held {points} points (the limit is 1,000,000)"
    );
    drop(stopper);
    live.join().unwrap();
}

/// The fleet view of a 100,000-GPU fleet: 12,500 nodes of 8 GPUs and 8 IB ports, sweeps 10 s
/// apart (as agents flush), the page polling every 5 s. Every node is drawn on the heat map
/// with its 8 GPU cells coloured, and every port the collector has a rate for (all, or nearly:
/// see the wait below), and the page's JavaScript heap (after a garbage collection) does not
/// grow across a minute of updates. Prints the size and time of the collector's answer in
/// each shape, the time to the first drawing (from the page's start), each update's time
/// (and where it went) and the heap: the figures for issue 29's goal (drawn in under 2 s,
/// updated every 5 s without growing memory), which this test reports but does not assert
/// (on the shared 2-core development machine the collector's answer alone takes 1.6-9 s,
/// as loaded; bench/results/fleet-view.md).
///
/// Ignored in `cargo xtask test` (sending 12,500 nodes' sweeps takes most of a core): run it
/// with `cargo test --release -p monitor-collector --test dashboard -- --ignored 12500 --nocapture`.
#[test]
#[ignore = "12,500 nodes: a measurement, run by hand (see its doc)"]
fn the_fleet_view_of_12500_nodes() {
    use headless_chrome::protocol::cdp::{HeapProfiler, Performance};
    const HUGE: usize = 12_500;
    const INTERVAL: Duration = Duration::from_secs(10);
    let Some(chromium) = chromium() else { return };
    // Past the default 10,000 nodes.
    let collector = RunningCollector::start_with(&["--max-nodes", "20000"]);
    let mut fleet = SimulatedFleet::builder(HUGE)
        .job(JOB, 0..HUGE)
        .interval(INTERVAL)
        .flush_every(1)
        .ticks_before_now(2)
        .build(Key::from_bytes(KEY));
    // The first sweeps (every node's schema, every series new): the collector meets 12,500
    // nodes at once, on a machine shared with the sender and Chromium, and its receive
    // buffer overflows; a node whose frames did not all arrive is sent them again (the
    // collector counts a frame it has as a duplicate) until every node has all of its.
    let sent = Instant::now();
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut frames: Vec<Vec<Vec<u8>>> = vec![Vec::new(); HUGE];
    for _ in 0..2 {
        for (node, frame) in fleet.tick_by_node() {
            frames[node].push(frame);
        }
    }
    let index: std::collections::HashMap<String, usize> = (0..HUGE)
        .map(|i| (fleet.node_name(i).to_owned(), i))
        .collect();
    let mut missing: Vec<usize> = (0..HUGE).collect();
    for round in 0.. {
        assert!(
            round < 20,
            "{} nodes never got all their frames",
            missing.len()
        );
        for (k, frame) in missing.iter().flat_map(|&n| &frames[n]).enumerate() {
            socket.send_to(frame, collector.udp).unwrap();
            if k % 32 == 31 {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        std::thread::sleep(Duration::from_secs(2));
        let mut complete = vec![false; HUGE];
        for n in collector.json("/api/v1/live/nodes").as_array().unwrap() {
            let i = index[n["node"].as_str().unwrap()];
            complete[i] = n["frames"].as_u64() == Some(frames[i].len() as u64);
        }
        missing = (0..HUGE).filter(|&i| !complete[i]).collect();
        eprintln!("round {round}: {} nodes incomplete", missing.len());
        if missing.is_empty() {
            break;
        }
    }
    eprintln!("{HUGE} nodes x 2 sweeps sent in {:?}", sent.elapsed());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let live = {
        let stop = stop.clone();
        let udp = collector.udp;
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if unix_now_ns() >= fleet.tick_unix_ns(fleet.ticks()) {
                    fleet.send_ticks(udp, 1).unwrap();
                } else {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        })
    };
    // The fleet view's question in each shape (compact with the labels the page asks for
    // below): how large, how long the collector takes.
    let metrics = "metric=railscope_gpu_sm_util_ratio&metric=railscope_gpu_utilization_ratio&metric=railscope_ib_port_xmit_bytes_total&metric=railscope_ib_port_rcv_bytes_total&metric=railscope_ib_port_rate_gbps";
    let fetch = |format: &str| {
        let started = Instant::now();
        let answer = ureq::get(&format!(
            "http://{}/api/v1/live/latest?format={format}&{metrics}",
            collector.http
        ))
        .call()
        .unwrap()
        .into_body()
        .with_config()
        .limit(1 << 30)
        .read_to_string()
        .unwrap();
        eprintln!(
            "/api/v1/live/latest?format={format} of the fleet view's 5 metrics: {} bytes in {:?}",
            answer.len(),
            started.elapsed()
        );
        answer
    };
    fetch("columns");
    fetch("compact");
    // Every port's byte counters have a rate (a sample before the latest), or nearly: a
    // node whose sweeps came in out of order has none until its next sweep, and on a loaded
    // machine the collector's receive buffer overflows at about the same place of every
    // sweep, so a few nodes may go without one for long.
    let mut rated = 0;
    for _ in 0..20 {
        let answer: Value = serde_json::from_str(&fetch(
            "compact&label=gpu&label=job_id&label=device&label=port",
        ))
        .unwrap();
        rated = answer["metrics"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["metric"] == "railscope_ib_port_xmit_bytes_total")
            .flat_map(|m| m["values"].as_array().unwrap())
            .filter(|v| v.is_number())
            .count();
        if rated == HUGE * 8 {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    eprintln!("{rated} of {} ports have a transmit rate", HUGE * 8);
    assert!(
        rated >= HUGE * 8 * 99 / 100,
        "{rated} ports with a transmit rate"
    );

    let page = Page::open(
        chromium,
        &format!("http://{}/?refresh=5#/fleet", collector.http),
    );
    let (tab, problems) = (&*page.tab, &*page.problems);
    wait_until(
        tab,
        "the fleet heat map",
        "return window.railscope.updates >= 1 && !!document.querySelector('#fleet-grid canvas.heat-map')",
    );
    let drawn = eval(
        tab,
        "const s = window.railscope, f = s.fleet; \
         return [f.nodes, f.colouredGpus, f.colouredPorts, f.nodesColoured, Math.round(s.firstUpdateMs), Math.round(s.updateMs), f.timings]",
    );
    eprintln!(
        "{HUGE} nodes: first drawn {} ms after the page began loading (its update: {} ms, {})",
        drawn[4], drawn[5], drawn[6]
    );
    let count = |i: usize| drawn[i].as_u64().unwrap() as usize;
    // Every node and GPU, and every port the collector had a rate for (a node's ports without
    // one spoil that node alone).
    assert!(
        count(0) == HUGE
            && count(1) == HUGE * 8
            && count(2) >= rated
            && count(3) >= HUGE - (HUGE * 8 - rated),
        "nodes drawn, coloured GPU and port cells, nodes fully coloured: {drawn} \
         ({rated} ports with a rate)"
    );
    tab.call_method(Performance::Enable { time_domain: None })
        .unwrap();
    let heap = || {
        tab.call_method(HeapProfiler::CollectGarbage(None)).unwrap();
        let metrics = tab.call_method(Performance::GetMetrics(None)).unwrap();
        let of = |name: &str| {
            metrics
                .metrics
                .iter()
                .find(|m| m.name == name)
                .map_or(0.0, |m| m.value)
        };
        (of("JSHeapUsedSize"), of("Nodes"))
    };
    let after = |n: u64| {
        wait_until(
            tab,
            "the next update",
            &format!("return window.railscope.updates >= {n}"),
        )
    };
    after(2);
    let (first_heap, first_nodes) = heap();
    let mut last = (first_heap, first_nodes);
    for n in 3..=14 {
        after(n);
        last = heap();
        let ms = eval(
            tab,
            "return [Math.round(window.railscope.updateMs), window.railscope.fleet.timings]",
        );
        eprintln!(
            "update {n}: {ms} ms, JS heap {:.1} MB, {} DOM nodes",
            last.0 / 1e6,
            last.1
        );
    }
    assert!(
        last.0 < 1.25 * first_heap && last.1 <= first_nodes + 100.0,
        "the page grew over a minute of updates: JS heap {first_heap} -> {}, DOM nodes {first_nodes} -> {}",
        last.0,
        last.1
    );
    screenshot(tab, "fleet-12500");
    assert_no_problem(tab, problems, "the fleet view of 12,500 nodes");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    live.join().unwrap();
}
