//! The IB sysfs source on fixture trees (and, in the test bed, on real rxe devices).

use std::{
    collections::{BTreeSet, HashMap},
    fs, io,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use super::*;
use monitor_testkit::copy_tree;
use monitor_wire::{Kind, Labels, Value};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/sysfs")
        .join(name)
}

/// A copy of a fixture tree that a test may change; removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn of(name: &str, test: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("railscope-ib-sysfs-{}-{test}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        copy_tree(&fixture(name), &dir);
        Self(dir)
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Series name and labels to value, for lookups.
fn by_series(readings: &[Reading]) -> HashMap<(String, String), Reading> {
    readings
        .iter()
        .map(|r| {
            (
                (r.series.name.to_string(), r.series.labels.to_string()),
                r.clone(),
            )
        })
        .collect()
}

fn port_labels(device: &str, port: &str) -> String {
    Labels::new([("device", device), ("port", port)]).to_string()
}

fn value(
    map: &HashMap<(String, String), Reading>,
    name: &str,
    labels: &str,
) -> Option<(Value, Kind)> {
    map.get(&(name.to_string(), labels.to_string()))
        .map(|r| (r.value, r.series.kind))
}

/// Captures what `tracing` prints while `f` runs.
fn logs_of<T>(f: impl FnOnce() -> T) -> (T, String) {
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl io::Write for Sink {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let sink = Sink::default();
    let writer = sink.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let out = tracing::subscriber::with_default(subscriber, f);
    let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
    (out, text)
}

#[test]
fn mlx5_ib_port_counters_and_link() {
    let mut src = IbSysfs::new(fixture("mlx5"));
    let readings = src.read(1_700_000_000_000_000_000);
    assert!(src.problems().is_empty(), "{:?}", src.problems());
    assert!(
        readings
            .iter()
            .all(|r| r.unix_ns == 1_700_000_000_000_000_000)
    );
    let map = by_series(&readings);
    let p = port_labels("mlx5_0", "1");

    // The data counters count 4-byte words; the series are bytes.
    assert_eq!(
        value(&map, "railscope_ib_port_xmit_bytes_total", &p),
        Some((Value::U64(4 * 912_345_678_901), Kind::Counter))
    );
    assert_eq!(
        value(&map, "railscope_ib_port_rcv_bytes_total", &p),
        Some((Value::U64(4 * 887_654_321_098), Kind::Counter))
    );
    assert!(value(&map, "railscope_ib_port_xmit_data_total", &p).is_none());
    assert_eq!(
        value(&map, "railscope_ib_symbol_error_total", &p),
        Some((Value::U64(3), Kind::Counter))
    );
    assert_eq!(
        value(&map, "railscope_ib_vl15_dropped_total", &p),
        Some((Value::U64(0), Kind::Counter))
    );
    assert_eq!(
        value(&map, "railscope_ib_link_downed_total", &p),
        Some((Value::U64(1), Kind::Counter))
    );
    // Every PMA counter file of the port is a series.
    let pma = fs::read_dir(fixture("mlx5").join("class/infiniband/mlx5_0/ports/1/counters"))
        .unwrap()
        .count();
    let port_counters = readings
        .iter()
        .filter(|r| r.series.labels.to_string() == p && r.series.kind == Kind::Counter)
        .count();
    let hw = fs::read_dir(fixture("mlx5").join("class/infiniband/mlx5_0/ports/1/hw_counters"))
        .unwrap()
        .count();
    // lifespan is a gauge, not a counter.
    assert_eq!(port_counters, pma + hw - 1);

    assert_eq!(
        value(&map, "railscope_ib_port_state", &p),
        Some((Value::U64(4), Kind::Gauge))
    );
    assert_eq!(
        value(&map, "railscope_ib_port_phys_state", &p),
        Some((Value::U64(5), Kind::Gauge))
    );
    assert_eq!(
        value(&map, "railscope_ib_port_rate_gbps", &p),
        Some((Value::F64(400.0), Kind::Gauge))
    );
    assert_eq!(
        value(&map, "railscope_ib_port_width_lanes", &p),
        Some((Value::U64(4), Kind::Gauge))
    );
    let info = Labels::new([
        ("device", "mlx5_0"),
        ("port", "1"),
        ("link_layer", "InfiniBand"),
    ])
    .to_string();
    assert_eq!(
        value(&map, "railscope_ib_port_link_layer_info", &info),
        Some((Value::U64(1), Kind::Gauge))
    );
    assert_eq!(
        value(&map, "railscope_ib_hw_counters_lifespan_seconds", &p),
        Some((Value::F64(0.01), Kind::Gauge))
    );

    let link = src.links().iter().find(|l| l.device == "mlx5_0").unwrap();
    assert_eq!(
        link,
        &PortLink {
            device: "mlx5_0".into(),
            port: 1,
            state: Some(CodedState {
                code: 4,
                name: "ACTIVE".into()
            }),
            phys_state: Some(CodedState {
                code: 5,
                name: "LinkUp".into()
            }),
            rate: Some(LinkRate {
                gbps: 400.0,
                width_lanes: Some(4),
                speed: Some("NDR".into())
            }),
            link_layer: Some(LinkLayer::InfiniBand),
        }
    );
}

#[test]
fn mlx5_roce_port_congestion_and_unknown_counters() {
    let mut src = IbSysfs::new(fixture("mlx5"));
    let map = by_series(&src.read(1));
    let p = port_labels("mlx5_1", "1");
    for (name, v) in [
        ("railscope_ib_np_cnp_sent_total", 48_213),
        ("railscope_ib_rp_cnp_handled_total", 47_990),
        ("railscope_ib_np_ecn_marked_roce_packets_total", 51_877),
        ("railscope_ib_rp_cnp_ignored_total", 0),
        // A name this code has never heard of is passed through.
        ("railscope_ib_roce_cc_future_event_total", 17),
    ] {
        assert_eq!(
            value(&map, name, &p),
            Some((Value::U64(v), Kind::Counter)),
            "{name}"
        );
    }
    let info = Labels::new([
        ("device", "mlx5_1"),
        ("port", "1"),
        ("link_layer", "Ethernet"),
    ])
    .to_string();
    assert!(value(&map, "railscope_ib_port_link_layer_info", &info).is_some());
    assert_eq!(
        value(&map, "railscope_ib_port_rate_gbps", &p),
        Some((Value::F64(200.0), Kind::Gauge))
    );
    let link = src.links().iter().find(|l| l.device == "mlx5_1").unwrap();
    assert_eq!(link.link_layer, Some(LinkLayer::Ethernet));
    assert_eq!(link.rate.as_ref().unwrap().speed.as_deref(), Some("HDR"));
}

#[test]
fn device_level_hw_counters_carry_only_the_device_label() {
    let mut src = IbSysfs::new(fixture("mlx5"));
    let map = by_series(&src.read(1));
    let d = Labels::new([("device", "mlx5_0")]).to_string();
    assert_eq!(
        value(&map, "railscope_ib_rx_write_requests_total", &d),
        Some((Value::U64(1_203_334), Kind::Counter))
    );
    assert_eq!(
        value(&map, "railscope_ib_hw_counters_lifespan_seconds", &d),
        Some((Value::F64(0.01), Kind::Gauge))
    );
}

#[test]
fn every_series_is_unique_and_well_named() {
    let mut src = IbSysfs::new(fixture("mlx5"));
    let readings = src.read(1);
    let mut seen = BTreeSet::new();
    for r in &readings {
        assert!(
            seen.insert((r.series.name.clone(), r.series.labels.clone())),
            "duplicate {} {}",
            r.series.name,
            r.series.labels
        );
        let name = &r.series.name;
        assert!(name.starts_with("railscope_ib_"), "{name}");
        assert!(
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
            "{name}"
        );
        assert_eq!(
            r.series.kind == Kind::Counter,
            name.ends_with("_total"),
            "{name}"
        );
    }
}

#[test]
fn rxe_layout_without_pma_counters() {
    let mut src = IbSysfs::new(fixture("rxe"));
    let map = by_series(&src.read(5));
    assert!(src.problems().is_empty(), "{:?}", src.problems());
    for dev in ["rxe0", "rxe1"] {
        let p = port_labels(dev, "1");
        for file in [
            "ack_deferred",
            "completer_retry_err",
            "duplicate_request",
            "link_downed",
            "out_of_seq_request",
            "rcvd_pkts",
            "rcvd_rnr_err",
            "rcvd_seq_err",
            "rdma_recvs",
            "rdma_sends",
            "retry_exceeded_err",
            "retry_rnr_exceeded_err",
            "send_err",
            "send_rnr_err",
            "sent_pkts",
        ] {
            let name = format!("railscope_ib_{file}_total");
            assert!(
                matches!(value(&map, &name, &p), Some((_, Kind::Counter))),
                "{dev} {name}"
            );
        }
        assert!(value(&map, "railscope_ib_hw_counters_lifespan_seconds", &p).is_some());
    }
    // What the test bed saw after ib_write_bw: rxe0 sent what rxe1 received.
    assert_eq!(
        value(
            &map,
            "railscope_ib_sent_pkts_total",
            &port_labels("rxe0", "1")
        ),
        value(
            &map,
            "railscope_ib_rcvd_pkts_total",
            &port_labels("rxe1", "1")
        )
    );
    let rxe0 = src.links().iter().find(|l| l.device == "rxe0").unwrap();
    assert_eq!(rxe0.link_layer, Some(LinkLayer::Ethernet));
    assert!(rxe0.state.as_ref().unwrap().is_active());
}

#[test]
fn degraded_width_is_visible() {
    let tree = Scratch::of("mlx5", "degraded");
    let rate = tree.path("class/infiniband/mlx5_0/ports/1/rate");
    let mut src = IbSysfs::new(tree.0.clone());
    let p = port_labels("mlx5_0", "1");
    let before = by_series(&src.read(1));
    assert_eq!(
        value(&before, "railscope_ib_port_width_lanes", &p).map(|v| v.0),
        Some(Value::U64(4))
    );

    fs::write(&rate, "100 Gb/sec (1X NDR)\n").unwrap();
    let after = by_series(&src.read(2));
    assert!(src.problems().is_empty(), "{:?}", src.problems());
    assert_eq!(
        value(&after, "railscope_ib_port_width_lanes", &p).map(|v| v.0),
        Some(Value::U64(1))
    );
    assert_eq!(
        value(&after, "railscope_ib_port_rate_gbps", &p).map(|v| v.0),
        Some(Value::F64(100.0))
    );
    let link = src.links().iter().find(|l| l.device == "mlx5_0").unwrap();
    assert_eq!(
        link.rate,
        Some(LinkRate {
            gbps: 100.0,
            width_lanes: Some(1),
            speed: Some("NDR".into())
        })
    );
}

#[test]
fn broken_values_cost_only_their_own_series() {
    let mut src = IbSysfs::new(fixture("broken"));
    let map = by_series(&src.read(1));
    let p = port_labels("mlx5_0", "1");

    let mut bad: Vec<String> = src
        .problems()
        .iter()
        .map(|e| {
            e.path()
                .strip_prefix(fixture("broken").join("class/infiniband/mlx5_0"))
                .unwrap()
                .display()
                .to_string()
        })
        .collect();
    bad.sort();
    assert_eq!(
        bad,
        [
            "hw_counters/out_of_buffer",
            "ports/1/counters/port_rcv_errors",
            "ports/1/counters/port_xmit_discards",
            "ports/1/counters/symbol_error",
            "ports/1/hw_counters/rx_icrc_encapsulated",
            "ports/1/link_layer",
            "ports/1/phys_state",
            "ports/1/rate",
            "ports/1/state",
        ]
    );
    // Unknown state name: the code is still sent, and the problem says which file.
    assert_eq!(
        value(&map, "railscope_ib_port_state", &p).map(|v| v.0),
        Some(Value::U64(4))
    );
    let problems = src.problems();
    let state = problems
        .iter()
        .find(|e| e.path().ends_with("ports/1/state"))
        .unwrap();
    assert!(matches!(state, SysfsError::UnknownName { code: 4, name, .. } if name == "WHATEVER"));
    // Garbage phys_state gives no series; garbage counters neither.
    assert!(value(&map, "railscope_ib_port_phys_state", &p).is_none());
    assert!(value(&map, "railscope_ib_symbol_error_total", &p).is_none());
    assert!(value(&map, "railscope_ib_port_rcv_errors_total", &p).is_none());
    // A rate without its width still gives the rate.
    assert_eq!(
        value(&map, "railscope_ib_port_rate_gbps", &p).map(|v| v.0),
        Some(Value::F64(200.0))
    );
    assert!(value(&map, "railscope_ib_port_width_lanes", &p).is_none());
    // Everything else is still read.
    assert_eq!(
        value(&map, "railscope_ib_port_xmit_bytes_total", &p).map(|v| v.0),
        Some(Value::U64(4 * 1000))
    );
    assert_eq!(
        value(&map, "railscope_ib_link_downed_total", &p).map(|v| v.0),
        Some(Value::U64(2))
    );
    assert!(value(&map, "railscope_ib_out_of_sequence_total", &p).is_some());
    // The healthy device next to it is untouched.
    let healthy = port_labels("mlx5_1", "1");
    assert_eq!(
        value(&map, "railscope_ib_port_state", &healthy).map(|v| v.0),
        Some(Value::U64(4))
    );
    assert_eq!(
        value(&map, "railscope_ib_port_width_lanes", &healthy).map(|v| v.0),
        Some(Value::U64(4))
    );
}

#[test]
fn each_broken_file_is_warned_about_once() {
    let mut src = IbSysfs::new(fixture("broken"));
    let (_, first) = logs_of(|| src.read(1));
    let (_, second) = logs_of(|| src.read(2));
    let warnings: Vec<&str> = first.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warnings.len(), src.problems().len(), "{first}");
    for p in src.problems() {
        let path = p.path().display().to_string();
        assert_eq!(
            warnings.iter().filter(|w| w.contains(&path)).count(),
            1,
            "{path} in {first}"
        );
    }
    assert!(!second.contains("WARN"), "warned again: {second}");
    // The problems are still listed on the second scan.
    assert_eq!(src.problems().len(), warnings.len());
}

#[test]
fn unreadable_files_are_reported_and_recover() {
    let tree = Scratch::of("mlx5", "unreadable");
    // A counter listed but gone when opened, and an attribute whose read fails (a
    // directory gives EISDIR, as some mlx5 counters give EINVAL).
    let counter = tree.path("class/infiniband/mlx5_0/ports/1/counters/symbol_error");
    fs::remove_file(&counter).unwrap();
    std::os::unix::fs::symlink(tree.path("nowhere"), &counter).unwrap();
    let rate = tree.path("class/infiniband/mlx5_0/ports/1/rate");
    fs::remove_file(&rate).unwrap();
    fs::create_dir(&rate).unwrap();

    let mut src = IbSysfs::new(tree.0.clone());
    let (readings, logs) = logs_of(|| src.read(1));
    let map = by_series(&readings);
    let p = port_labels("mlx5_0", "1");
    let mut bad: Vec<&Path> = src.problems().iter().map(|p| p.path()).collect();
    bad.sort();
    assert_eq!(bad, [counter.as_path(), rate.as_path()]);
    assert!(
        src.problems()
            .iter()
            .all(|p| matches!(p, SysfsError::Read { .. }))
    );
    for path in [&counter, &rate] {
        assert!(logs.contains(&path.display().to_string()), "{logs}");
    }
    assert!(value(&map, "railscope_ib_symbol_error_total", &p).is_none());
    assert!(value(&map, "railscope_ib_port_rate_gbps", &p).is_none());
    assert!(value(&map, "railscope_ib_port_state", &p).is_some());
    assert!(value(&map, "railscope_ib_link_downed_total", &p).is_some());

    fs::remove_file(&counter).unwrap();
    fs::write(&counter, "5\n").unwrap();
    fs::remove_dir(&rate).unwrap();
    fs::write(&rate, "400 Gb/sec (4X NDR)\n").unwrap();
    let map = by_series(&src.read(2));
    assert!(src.problems().is_empty(), "{:?}", src.problems());
    assert!(value(&map, "railscope_ib_port_rate_gbps", &p).is_some());
    assert_eq!(
        value(&map, "railscope_ib_symbol_error_total", &p).map(|v| v.0),
        Some(Value::U64(5))
    );
}

#[test]
fn a_hw_counter_named_like_a_pma_counter_is_kept_apart() {
    let tree = Scratch::of("mlx5", "collision");
    fs::write(
        tree.path("class/infiniband/mlx5_0/ports/1/hw_counters/link_downed"),
        "9\n",
    )
    .unwrap();
    let mut src = IbSysfs::new(tree.0.clone());
    let map = by_series(&src.read(1));
    let p = port_labels("mlx5_0", "1");
    assert_eq!(
        value(&map, "railscope_ib_link_downed_total", &p).map(|v| v.0),
        Some(Value::U64(1))
    );
    assert_eq!(
        value(&map, "railscope_ib_hw_link_downed_total", &p).map(|v| v.0),
        Some(Value::U64(9))
    );
}

#[test]
fn devices_that_come_and_go() {
    let tree = Scratch::of("mlx5", "hotplug");
    let class = tree.path("class/infiniband");
    let mut src = IbSysfs::new(tree.0.clone());
    src.read(1);
    assert_eq!(src.devices().collect::<Vec<_>>(), ["mlx5_0", "mlx5_1"]);

    let (readings, logs) = logs_of(|| {
        fs::remove_dir_all(class.join("mlx5_1")).unwrap();
        src.read(2)
    });
    assert!(src.problems().is_empty(), "{:?}", src.problems());
    assert_eq!(src.devices().collect::<Vec<_>>(), ["mlx5_0"]);
    assert!(
        readings
            .iter()
            .all(|r| r.series.labels.get("device") == Some("mlx5_0"))
    );
    assert!(!readings.is_empty());
    assert!(
        logs.contains("disappeared") && logs.contains("mlx5_1"),
        "{logs}"
    );

    let (readings, logs) = logs_of(|| {
        copy_tree(
            &fixture("rxe").join("class/infiniband/rxe0"),
            &class.join("rxe0"),
        );
        src.read(3)
    });
    assert_eq!(src.devices().collect::<Vec<_>>(), ["mlx5_0", "rxe0"]);
    assert!(
        readings
            .iter()
            .any(|r| r.series.labels.get("device") == Some("rxe0"))
    );
    assert!(logs.contains("appeared") && logs.contains("rxe0"), "{logs}");

    // No class directory at all: a node without RDMA.
    fs::remove_dir_all(&class).unwrap();
    assert!(src.read(4).is_empty());
    assert!(src.problems().is_empty());
    assert_eq!(src.devices().count(), 0);
}

#[test]
fn device_vanishing_mid_scan_is_not_a_broken_file() {
    // Listed, then gone when its files are read: what a device unregistered during a scan
    // looks like (sysfs entries are symlinks to the device's directory).
    let tree = Scratch::of("mlx5", "vanish");
    std::os::unix::fs::symlink(
        tree.path("devices/gone"),
        tree.path("class/infiniband/mlx5_2"),
    )
    .unwrap();
    let mut src = IbSysfs::new(tree.0.clone());
    let (readings, logs) = logs_of(|| src.read(1));
    assert!(src.problems().is_empty(), "{:?}", src.problems());
    assert!(!logs.contains("WARN"), "{logs}");
    assert_eq!(src.devices().collect::<Vec<_>>(), ["mlx5_0", "mlx5_1"]);
    assert!(
        readings
            .iter()
            .any(|r| r.series.labels.get("device") == Some("mlx5_1"))
    );
}

#[test]
fn files_kept_open_show_values_written_in_place() {
    // sysfs files change contents, never identity: the source keeps them open and reads
    // each again from offset 0.
    let tree = Scratch::of("mlx5", "in-place");
    let data = tree.path("class/infiniband/mlx5_0/ports/1/counters/port_xmit_data");
    let state = tree.path("class/infiniband/mlx5_0/ports/1/state");
    let mut src = IbSysfs::new(tree.0.clone());
    let p = port_labels("mlx5_0", "1");
    let before = by_series(&src.read(1));
    let Some((Value::U64(bytes), _)) = value(&before, "railscope_ib_port_xmit_bytes_total", &p)
    else {
        panic!("no xmit bytes");
    };
    fs::write(&data, format!("{}\n", bytes / 4 + 1000)).unwrap();
    fs::write(&state, "1: DOWN\n").unwrap();
    let after = by_series(&src.read(2));
    assert_eq!(
        value(&after, "railscope_ib_port_xmit_bytes_total", &p).map(|v| v.0),
        Some(Value::U64(bytes + 4000))
    );
    assert_eq!(
        value(&after, "railscope_ib_port_state", &p).map(|v| v.0),
        Some(Value::U64(1))
    );
    assert!(!src.links()[0].state.as_ref().unwrap().is_active());
}

#[test]
fn planning_a_device_again_keeps_its_files_open() {
    // Every `replan_every` a device's directories are listed again for new files; the files
    // already open stay open (and keep reading), only new ones are opened.
    use std::os::fd::AsRawFd as _;
    let tree = Scratch::of("mlx5", "replan-keeps-files");
    let mut src = IbSysfs::new(tree.0.clone()).with_replan_every(Duration::ZERO);
    let open_fds = |src: &IbSysfs| -> Vec<(PathBuf, i32)> {
        let plan = &src.devices["mlx5_0"];
        plan.ports[0]
            .counters
            .iter()
            .chain(&plan.counters)
            .filter_map(|c| Some((c.file.path.clone(), c.file.file.as_ref()?.as_raw_fd())))
            .collect()
    };
    src.read(1);
    let before = open_fds(&src);
    assert!(before.len() > 10, "{before:?}");
    fs::write(
        tree.path("class/infiniband/mlx5_0/ports/1/hw_counters/new_firmware_counter"),
        "7\n",
    )
    .unwrap();
    let p = port_labels("mlx5_0", "1");
    let readings = by_series(&src.read(2));
    assert!(value(&readings, "railscope_ib_new_firmware_counter_total", &p).is_some());
    let after: HashMap<PathBuf, i32> = open_fds(&src).into_iter().collect();
    for (path, fd) in &before {
        assert_eq!(after.get(path), Some(fd), "{}", path.display());
    }
}

#[test]
fn only_due_series_are_read() {
    let tree = Scratch::of("broken", "due");
    let mut src = IbSysfs::new(tree.0.clone());
    let all = src.read(1);
    let broken = src.problems().len();
    assert!(broken > 0);
    let wanted = |s: &Series| {
        &*s.name == "railscope_ib_port_xmit_bytes_total" || &*s.name == "railscope_ib_port_state"
    };
    let some = src.read_due(2, wanted);
    assert_eq!(
        some.len(),
        all.iter().filter(|r| wanted(&r.series)).count(),
        "{some:?}"
    );
    assert!(some.iter().all(|r| wanted(&r.series)));
    assert!(
        some.iter()
            .any(|r| &*r.series.name == "railscope_ib_port_state")
    );
    // Broken files that were not read stay reported: not read is not fixed.
    assert_eq!(src.problems().len(), broken);
    // Links keep what was read before for attributes not read now.
    assert!(
        src.links()
            .iter()
            .all(|l| l.link_layer.is_some() || l.device == "mlx5_0")
    );
}

#[test]
fn counter_files_that_appear_are_found_at_the_next_listing() {
    let tree = Scratch::of("mlx5", "new-file");
    let mut src = IbSysfs::new(tree.0.clone()).with_replan_every(Duration::ZERO);
    let p = port_labels("mlx5_0", "1");
    assert!(
        value(
            &by_series(&src.read(1)),
            "railscope_ib_new_firmware_counter_total",
            &p
        )
        .is_none()
    );
    fs::write(
        tree.path("class/infiniband/mlx5_0/ports/1/hw_counters/new_firmware_counter"),
        "7\n",
    )
    .unwrap();
    assert_eq!(
        value(
            &by_series(&src.read(2)),
            "railscope_ib_new_firmware_counter_total",
            &p
        )
        .map(|v| v.0),
        Some(Value::U64(7))
    );
}

#[test]
fn with_a_relist_interval_devices_that_go_are_dropped_at_once() {
    let tree = Scratch::of("mlx5", "relist");
    let class = tree.path("class/infiniband");
    let mut src = IbSysfs::new(tree.0.clone()).with_relist_every(Duration::from_secs(3600));
    src.read(1);
    fs::remove_dir_all(class.join("mlx5_1")).unwrap();
    let readings = src.read(2);
    assert_eq!(src.devices().collect::<Vec<_>>(), ["mlx5_0"]);
    assert!(src.problems().is_empty(), "{:?}", src.problems());
    assert!(
        readings
            .iter()
            .all(|r| r.series.labels.get("device") == Some("mlx5_0"))
    );
    // A device that appears waits for the next listing (here: the one the vanished
    // device asked for).
    copy_tree(
        &fixture("rxe").join("class/infiniband/rxe0"),
        &class.join("rxe0"),
    );
    src.read(3);
    assert_eq!(src.devices().collect::<Vec<_>>(), ["mlx5_0", "rxe0"]);
    copy_tree(
        &fixture("rxe").join("class/infiniband/rxe0"),
        &class.join("rxe1"),
    );
    src.read(4);
    assert_eq!(src.devices().collect::<Vec<_>>(), ["mlx5_0", "rxe0"]);
}

#[test]
fn read_links_reads_only_the_port_attributes() {
    let mut src = IbSysfs::new(fixture("mlx5"));
    let links = src.read_links().to_vec();
    assert_eq!(links.len(), 2);
    assert!(
        links
            .iter()
            .all(|l| l.state.as_ref().is_some_and(CodedState::is_active))
    );
    assert_eq!(links[1].rate.as_ref().unwrap().gbps, 200.0);
}

/// Against this machine's `/sys`: meant for the soft-RoCE test bed guest (run with
/// `--exact sources::ib_sysfs::tests::real_rxe_devices`); on a machine without rxe
/// devices it has nothing to check and says so.
#[test]
#[ignore = "needs rxe devices: runs inside the soft-RoCE test bed"]
fn ib_core_real_rxe_devices() {
    let mut src = IbSysfs::default();
    let readings = src.read(1);
    let rxe: Vec<String> = src
        .devices()
        .filter(|d| d.starts_with("rxe"))
        .map(str::to_string)
        .collect();
    assert!(!rxe.is_empty(), "no rxe device under /sys/class/infiniband");
    assert!(src.problems().is_empty(), "{:?}", src.problems());
    let map = by_series(&readings);
    for dev in &rxe {
        let p = port_labels(dev, "1");
        for name in ["sent_pkts", "rcvd_pkts", "rdma_sends", "link_downed"] {
            let name = format!("railscope_ib_{name}_total");
            assert!(value(&map, &name, &p).is_some(), "{dev}: no {name}");
        }
        let link = src.links().iter().find(|l| &l.device == dev).unwrap();
        assert_eq!(link.link_layer, Some(LinkLayer::Ethernet), "{link:?}");
        assert!(
            link.state.is_some() && link.phys_state.is_some(),
            "{link:?}"
        );
        assert!(
            link.rate.as_ref().is_some_and(|r| r.width_lanes.is_some()),
            "{link:?}"
        );
    }
}

/// A counter that read fine turns to garbage mid-run, then comes back; later it disappears:
/// each time one warning naming the file, the other series read on, and the counter is read
/// again as soon as it is sane.
#[test]
fn a_counter_turning_to_garbage_or_vanishing_mid_run_costs_only_its_series() {
    let tree = Scratch::of("mlx5", "garbage-mid-run");
    let counter = tree.path("class/infiniband/mlx5_0/ports/1/counters/symbol_error");
    let path = counter.display().to_string();
    let mut src = IbSysfs::new(tree.0.clone()).with_replan_every(Duration::ZERO);
    let p = port_labels("mlx5_0", "1");
    let symbol_errors = |readings: &[Reading]| {
        value(&by_series(readings), "railscope_ib_symbol_error_total", &p).map(|v| v.0)
    };
    let others = |readings: &[Reading]| {
        value(&by_series(readings), "railscope_ib_link_downed_total", &p).is_some()
            && value(&by_series(readings), "railscope_ib_port_state", &p).is_some()
    };
    let warnings = |logs: &str| -> Vec<String> {
        logs.lines()
            .filter(|l| l.contains("WARN"))
            .map(str::to_owned)
            .collect()
    };
    assert!(symbol_errors(&src.read(1)).is_some());

    // In place, as sysfs changes a value (the source keeps the file open).
    fs::write(&counter, "\u{1}garbage\n").unwrap();
    let (readings, logs) = logs_of(|| src.read(2));
    assert_eq!(symbol_errors(&readings), None);
    assert!(others(&readings), "the other series stopped too");
    let warned = warnings(&logs);
    assert!(
        warned.len() == 1 && warned[0].contains(&path),
        "expected one warning naming {path}: {logs}"
    );
    let (_, logs) = logs_of(|| src.read(3));
    assert!(warnings(&logs).is_empty(), "warned again: {logs}");

    fs::write(&counter, "7\n").unwrap();
    let readings = src.read(4);
    assert_eq!(symbol_errors(&readings), Some(Value::U64(7)));
    assert!(src.problems().is_empty(), "{:?}", src.problems());

    fs::remove_file(&counter).unwrap();
    let (readings, logs) = logs_of(|| src.read(5));
    assert_eq!(symbol_errors(&readings), None);
    assert!(others(&readings), "the other series stopped too");
    let warned = warnings(&logs);
    assert!(
        warned.len() == 1 && warned[0].contains(&path),
        "expected one warning naming {path}: {logs}"
    );
    let (readings, logs) = logs_of(|| src.read(6));
    assert!(others(&readings));
    assert!(warnings(&logs).is_empty(), "warned again: {logs}");
}

/// An older HCA's 32-bit `port_xmit_data` stops at 4294967295 and stays there: one warning
/// naming the file and what it means, the counter still sent as read, and
/// `railscope_ib_counter_saturated` = 1 for it at every read (across a replan, too); after a
/// reset, the flag goes to 0 and one info line says it counts again.
#[test]
fn a_pma_counter_stuck_at_its_maximum_is_flagged_and_warned_about_once() {
    let tree = Scratch::of("mlx5", "saturated");
    let counter = tree.path("class/infiniband/mlx5_0/ports/1/counters/port_xmit_data");
    let path = counter.display().to_string();
    let mut src = IbSysfs::new(tree.0.clone()).with_replan_every(Duration::ZERO);
    let p = port_labels("mlx5_0", "1");
    let flag_labels = Labels::new([
        ("device", "mlx5_0"),
        ("port", "1"),
        ("counter", "port_xmit_data"),
    ])
    .to_string();
    let flag = |readings: &[Reading]| {
        value(
            &by_series(readings),
            "railscope_ib_counter_saturated",
            &flag_labels,
        )
    };
    let bytes = |readings: &[Reading]| {
        value(
            &by_series(readings),
            "railscope_ib_port_xmit_bytes_total",
            &p,
        )
        .map(|v| v.0)
    };
    let lines = |logs: &str, level: &str| -> Vec<String> {
        logs.lines()
            .filter(|l| l.contains(level))
            .map(str::to_owned)
            .collect()
    };
    // Below the maximum: no flag series at all.
    let readings = src.read(1);
    assert_eq!(flag(&readings), None);
    assert!(
        !readings
            .iter()
            .any(|r| r.series.name.as_ref() == "railscope_ib_counter_saturated")
    );

    fs::write(&counter, "4294967295\n").unwrap();
    let (readings, logs) = logs_of(|| src.read(2));
    assert_eq!(flag(&readings), Some((Value::U64(1), Kind::Gauge)));
    assert_eq!(bytes(&readings), Some(Value::U64(4 * 4_294_967_295)));
    let warned = lines(&logs, "WARN");
    assert!(
        warned.len() == 1
            && warned[0].contains(&path)
            && warned[0].contains("saturated at 4294967295")
            && warned[0].contains("rate reads as zero")
            && warned[0].contains("perfquery -x"),
        "expected one warning naming {path}: {logs}"
    );
    for t in 3..6 {
        let (readings, logs) = logs_of(|| src.read(t));
        assert_eq!(
            flag(&readings),
            Some((Value::U64(1), Kind::Gauge)),
            "read {t}"
        );
        assert_eq!(bytes(&readings), Some(Value::U64(4 * 4_294_967_295)));
        assert!(lines(&logs, "WARN").is_empty(), "warned again: {logs}");
        assert!(lines(&logs, "INFO").is_empty(), "{logs}");
    }

    // Reset (perfquery -R, a driver reload): counting again.
    fs::write(&counter, "12\n").unwrap();
    let (readings, logs) = logs_of(|| src.read(6));
    assert_eq!(flag(&readings), Some((Value::U64(0), Kind::Gauge)));
    assert_eq!(bytes(&readings), Some(Value::U64(48)));
    assert!(lines(&logs, "WARN").is_empty(), "{logs}");
    let info = lines(&logs, "INFO");
    assert!(
        info.len() == 1 && info[0].contains(&path) && info[0].contains("counts again"),
        "expected one info line naming {path}: {logs}"
    );
    assert!(src.problems().is_empty(), "{:?}", src.problems());
    let (readings, logs) = logs_of(|| src.read(7));
    assert_eq!(flag(&readings), Some((Value::U64(0), Kind::Gauge)));
    assert!(!logs.contains("INFO") && !logs.contains("WARN"), "{logs}");
}

/// Each PMA counter stops at the maximum of its own field: a 16-bit `symbol_error` at 65535,
/// an 8-bit `link_downed` at 255; 4294967295 in a 16-bit or 64-bit counter, or in a
/// `hw_counters/` file, is just a value.
#[test]
fn each_counter_saturates_at_its_own_width() {
    let tree = Scratch::of("mlx5", "widths");
    let port = "class/infiniband/mlx5_0/ports/1";
    let write = |file: &str, v: &str| fs::write(tree.path(&format!("{port}/{file}")), v).unwrap();
    write("counters/symbol_error", "65535\n");
    write("counters/link_downed", "255\n");
    // Above a 16-bit field's maximum: not where this counter stops.
    write("counters/port_rcv_errors", "4294967295\n");
    write("counters/unicast_xmit_packets", "4294967295\n");
    write("counters/port_xmit_discards", "65534\n");
    let hw = fs::read_dir(tree.path(&format!("{port}/hw_counters")))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .find(|f| f != "lifespan")
        .unwrap();
    write(&format!("hw_counters/{hw}"), "4294967295\n");

    let mut src = IbSysfs::new(tree.0.clone());
    let (readings, logs) = logs_of(|| src.read(1));
    let mut flagged: Vec<(String, Value)> = readings
        .iter()
        .filter(|r| r.series.name.as_ref() == "railscope_ib_counter_saturated")
        .map(|r| (r.series.labels.get("counter").unwrap().to_owned(), r.value))
        .collect();
    flagged.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        flagged,
        [
            ("link_downed".to_owned(), Value::U64(1)),
            ("symbol_error".to_owned(), Value::U64(1)),
        ]
    );
    let warned: Vec<&str> = logs.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warned.len(), 2, "{logs}");
    assert!(warned.iter().any(
        |w| w.contains("symbol_error") && w.contains("saturated at 65535 (its 16-bit maximum)")
    ));
    assert!(
        warned.iter().any(
            |w| w.contains("link_downed") && w.contains("saturated at 255 (its 8-bit maximum)")
        )
    );
    // The saturated counters' own series are still sent, as read.
    let map = by_series(&readings);
    let p = port_labels("mlx5_0", "1");
    assert_eq!(
        value(&map, "railscope_ib_symbol_error_total", &p).map(|v| v.0),
        Some(Value::U64(65535))
    );
    assert_eq!(
        value(&map, "railscope_ib_link_downed_total", &p).map(|v| v.0),
        Some(Value::U64(255))
    );
}

/// MLNX_OFED prints "0 GB/sec" for a port without a link (an empty cage): a rate of 0, no
/// width, no warning.
#[test]
fn a_rate_of_0_gb_per_sec_is_a_rate_of_zero() {
    let tree = Scratch::of("mlx5", "empty-cage");
    fs::write(
        tree.path("class/infiniband/mlx5_1/ports/1/rate"),
        "0 GB/sec\n",
    )
    .unwrap();
    let mut src = IbSysfs::new(tree.0.clone());
    let (readings, logs) = logs_of(|| src.read(1));
    assert!(!logs.contains("WARN"), "{logs}");
    assert!(src.problems().is_empty(), "{:?}", src.problems());
    let map = by_series(&readings);
    let p = port_labels("mlx5_1", "1");
    assert_eq!(
        value(&map, "railscope_ib_port_rate_gbps", &p),
        Some((Value::F64(0.0), Kind::Gauge))
    );
    assert!(value(&map, "railscope_ib_port_width_lanes", &p).is_none());
    let link = src.links().iter().find(|l| l.device == "mlx5_1").unwrap();
    assert_eq!(link.rate.as_ref().map(|r| r.gbps), Some(0.0));
}
