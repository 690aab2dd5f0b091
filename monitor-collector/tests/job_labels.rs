//! Jobs at the collector: frames whose verb and GPU series carry `job_id` (and `job_step`), as
//! the agent labels them (`monitor-user/src/jobs.rs`), are shown with those labels on
//! `/metrics`, and `railscope-collector query series ... -m job_id=...` answers exactly the
//! series of that job, from the archive.

use std::{
    collections::BTreeMap,
    net::UdpSocket,
    process::Command,
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use monitor_testkit::{CollectorProcess, key_file, wait_for};

use monitor_wire::{
    CounterSample, EncoderConfig, FrameEncoder, GaugeSample, Key, Kind, Labels, Sample, Series,
};

const COLLECTOR: &str = env!("CARGO_BIN_EXE_railscope-collector");
const KEY_HEX: &str = "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a";
const POD: &str = "k8s:0a1b2c3d-4e5f-6789-abcd-ef0123456789";

/// The collector on a scratch archive; fields drop in order: killed, then its files removed.
struct Collector {
    process: CollectorProcess,
    _dir: tempfile::TempDir,
}

impl Collector {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let key = key_file(dir.path(), KEY_HEX);
        let process = CollectorProcess::command(COLLECTOR, &key, &dir.path().join("data"))
            .args(["--sockets", "1"])
            .start();
        Self { process, _dir: dir }
    }

    fn get(&self, path: &str) -> String {
        self.process.get(path)
    }

    /// `railscope-collector query --json series METRIC -m MATCHER...`: each series' labels
    /// (without `node`) and its last value.
    fn query(&self, metric: &str, matchers: &[&str]) -> BTreeMap<String, f64> {
        let mut cmd = Command::new(COLLECTOR);
        cmd.args(["query", "--collector", &self.process.url()])
            .args(["--json", "series", metric, "--start", "-1h"]);
        for m in matchers {
            cmd.args(["-m", m]);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "query: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        json["series"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let labels: Vec<String> = s["labels"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .filter(|(k, _)| *k != "node")
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap()))
                    .collect();
                let last = s["points"].as_array().unwrap().last().unwrap();
                let value = last
                    .get("value")
                    .or_else(|| last.get("max"))
                    .and_then(serde_json::Value::as_f64)
                    .unwrap();
                (labels.join(","), value)
            })
            .collect()
    }
}

fn verbs(cgroup: &str, job: Option<(&str, Option<&str>)>, verb: &str) -> Series {
    let mut labels = vec![
        ("cgroup", cgroup.to_owned()),
        ("device", "mlx5_0".to_owned()),
        ("verb", verb.to_owned()),
        ("detail", String::new()),
    ];
    if let Some((id, step)) = job {
        labels.push(("job_id", id.to_owned()));
        labels.extend(step.map(|s| ("job_step", s.to_owned())));
    }
    Series {
        name: "railscope_rdma_verbs_total".into(),
        labels: Labels::new(labels),
        kind: Kind::Counter,
    }
}

#[test]
fn job_labels_reach_metrics_and_queries_by_job_id() {
    let collector = Collector::start();
    let key = Key::from_bytes([0x5a; 32]);
    let mut encoder = FrameEncoder::new(EncoderConfig::new("node-a"), key).unwrap();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let slurm_cgroup = "/system.slice/slurmstepd.scope/job_42/step_0/user/task_0";
    let pod_cgroup = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0a1b2c3d_4e5f_6789_abcd_ef0123456789.slice/cri-containerd-c1.scope";
    let counters = [
        (
            verbs(slurm_cgroup, Some(("slurm:42", Some("0"))), "post_send"),
            100,
        ),
        (
            verbs(slurm_cgroup, Some(("slurm:42", Some("0"))), "create_qp"),
            1,
        ),
        (verbs(pod_cgroup, Some((POD, None)), "post_send"), 7),
        (verbs("/", None, "post_send"), 3),
    ];
    for (series, value) in &counters {
        encoder
            .push_sample(
                series,
                Sample::Counter(CounterSample {
                    unix_ns: now,
                    value: *value,
                }),
            )
            .unwrap();
    }
    let gpu = Series {
        name: "railscope_gpu_utilization_ratio".into(),
        labels: Labels::new([
            ("gpu", "3"),
            ("uuid", "GPU-3"),
            ("job_id", "slurm:42"),
            ("job_step", "0"),
        ]),
        kind: Kind::Gauge,
    };
    encoder
        .push_sample(&gpu, Sample::Gauge(GaugeSample::reading(now, 0.97)))
        .unwrap();
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    for frame in encoder.flush(now) {
        socket
            .send_to(&frame, collector.process.udp_addr())
            .unwrap();
    }

    // /metrics shows each series with its job (the node first, then the labels sorted).
    let expected = [
        format!(
            "railscope_rdma_verbs_total{{node=\"node-a\",cgroup=\"{slurm_cgroup}\",detail=\"\",device=\"mlx5_0\",job_id=\"slurm:42\",job_step=\"0\",verb=\"post_send\"}} 100 "
        ),
        format!(
            "railscope_rdma_verbs_total{{node=\"node-a\",cgroup=\"{pod_cgroup}\",detail=\"\",device=\"mlx5_0\",job_id=\"{POD}\",verb=\"post_send\"}} 7 "
        ),
        "railscope_gpu_utilization_ratio{node=\"node-a\",gpu=\"3\",job_id=\"slurm:42\",job_step=\"0\",uuid=\"GPU-3\"} 0.97 ".to_owned(),
    ];
    let start = Instant::now();
    let text = loop {
        let text = collector.get("/metrics");
        let lines: Vec<&str> = text.lines().collect();
        let shown = |want: &str| lines.iter().any(|l| l.starts_with(want));
        if expected.iter().all(|w| shown(w)) {
            break text;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "/metrics does not show {expected:#?}:\n{text}"
        );
        thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        text.lines()
            .filter(|l| l.contains("job_id=\"slurm:42\""))
            .count(),
        3,
        "the Slurm job's two verb series and its GPU:\n{text}"
    );

    // A query by job_id answers that job's series, and only them. The archive takes the
    // frames a moment after the live table (its own thread, behind a queue): on a loaded
    // machine the first query can come before it has them, so it is asked until it answers.
    let slurm = wait_for(
        "the archive to answer a query by job_id",
        Duration::from_secs(10),
        || {
            let slurm = collector.query("railscope_rdma_verbs_total", &["job_id=slurm:42"]);
            (!slurm.is_empty()).then_some(slurm)
        },
    );
    assert_eq!(
        slurm,
        BTreeMap::from([
            (
                format!(
                    "cgroup={slurm_cgroup},detail=,device=mlx5_0,job_id=slurm:42,job_step=0,verb=create_qp"
                ),
                1.0
            ),
            (
                format!(
                    "cgroup={slurm_cgroup},detail=,device=mlx5_0,job_id=slurm:42,job_step=0,verb=post_send"
                ),
                100.0
            ),
        ])
    );
    let pod = collector.query("railscope_rdma_verbs_total", &[&format!("job_id={POD}")]);
    assert_eq!(pod.values().copied().collect::<Vec<_>>(), [7.0]);
    // Series without a job have the label empty.
    let none = collector.query("railscope_rdma_verbs_total", &["job_id="]);
    assert_eq!(
        none,
        BTreeMap::from([(
            "cgroup=/,detail=,device=mlx5_0,verb=post_send".to_owned(),
            3.0
        )])
    );
    let gpus = collector.query(
        "railscope_gpu_utilization_ratio",
        &["job_id=~slurm:.*", "job_step=0"],
    );
    assert_eq!(
        gpus,
        BTreeMap::from([(
            "gpu=3,job_id=slurm:42,job_step=0,uuid=GPU-3".to_owned(),
            0.97
        )])
    );
}
