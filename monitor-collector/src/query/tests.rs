//! The HTTP API and `railscope query` together: a real server on loopback, the real client.

use std::time::Duration;

use monitor_client::query::{QueryArgs, QueryCommand, RangeArgs, fetch, nodes_text, series_text};
use monitor_wire::{Key, Value};

use super::test_server::serve_on_loopback;
use monitor_archive::{
    archive::{Archive, ArchiveConfig},
    node_archive::{NodeSender, append_node_frames},
};

const T0: u64 = 1_790_000_000_000_000_000;

/// Serves the API of an archive holding one simulated node's minute, on a loopback port.
fn serve() -> (String, Vec<(u64, f64)>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let key = Key::from_bytes([7; 32]);
    let mut archive = Archive::open(ArchiveConfig {
        retention_age: None,
        segment_span: Duration::from_secs(1 << 30),
        ..ArchiveConfig::new(dir.path())
    })
    .unwrap();
    let mut sender = NodeSender::new("gpu-node-007", 7, key.clone());
    let mut temps = Vec::new();
    let frames = sender.run_observed(T0, 60, 10, &mut |r| {
        if &*r.series.name == "railscope_gpu_temperature_celsius"
            && r.series.labels.get("gpu") == Some("2")
        {
            temps.push((r.unix_ns, r.value.as_f64()));
        }
        assert!(!matches!(r.value, Value::F64(v) if v.is_nan()));
    });
    append_node_frames(&mut archive, &sender, &frames).unwrap();
    archive.tick().unwrap();
    let url = serve_on_loopback(archive, key);
    (url, temps, dir)
}

fn range() -> RangeArgs {
    RangeArgs {
        start: "1790000000".into(),
        end: "1790000060".into(),
    }
}

#[test]
fn railscope_query_reads_series_and_nodes_through_the_api() {
    let (url, temps, _dir) = serve();
    let args = QueryArgs {
        collector: url.clone(),
        json: false,
        what: QueryCommand::Series {
            metric: "railscope_gpu_temperature_celsius".into(),
            matchers: vec!["gpu=2".into(), "node=gpu-node-007".into()],
            range: range(),
        },
    };
    let json = fetch(&args).unwrap();
    let series = json["series"].as_array().unwrap();
    assert_eq!(series.len(), 1);
    assert_eq!(series[0]["kind"], "gauge");
    assert_eq!(series[0]["labels"]["node"], "gpu-node-007");
    let got: Vec<(u64, f64)> = series[0]["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["t"].as_u64().unwrap(), p["mean"].as_f64().unwrap()))
        .collect();
    assert_eq!(got, temps);
    let text = series_text(&json);
    let first_line = format!("  2026-09-21T14:13:20.000Z  {:?}", temps[0].1);
    assert!(text.starts_with(
        "railscope_gpu_temperature_celsius{gpu=\"2\",job_id=\"slurm:7\",node=\"gpu-node-007\",uuid="
    ));
    assert!(text.contains(&first_line), "{text}");
    assert_eq!(text.lines().count(), 61);

    let nodes = QueryArgs {
        what: QueryCommand::Nodes { range: range() },
        ..args.clone()
    };
    assert_eq!(nodes_text(&fetch(&nodes).unwrap()), "gpu-node-007\n");
}

#[test]
fn bad_queries_are_refused_with_the_reason() {
    let (url, _, _dir) = serve();
    let query = |matchers: Vec<String>, range: RangeArgs| QueryArgs {
        collector: url.clone(),
        json: false,
        what: QueryCommand::Series {
            metric: "railscope_gpu_power_watts".into(),
            matchers,
            range,
        },
    };
    let err = fetch(&query(vec!["gpu=~(".into()], range())).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("the collector refused the query (400 Bad Request): parameter \"match\": matcher \"gpu=~(\": bad regular expression"),
        "{err}"
    );
    let bad_time = RangeArgs {
        start: "yesterday".into(),
        end: "now".into(),
    };
    let err = fetch(&query(vec![], bad_time)).unwrap_err();
    assert!(
        err.to_string()
            .contains("parameter \"start\": time \"yesterday\""),
        "{err}"
    );
    let reversed = RangeArgs {
        start: "1790000060".into(),
        end: "1790000000".into(),
    };
    let err = fetch(&query(vec![], reversed)).unwrap_err();
    assert!(err.to_string().contains("is after end"), "{err}");
    let nobody = QueryArgs {
        collector: "http://127.0.0.1:1".into(),
        ..query(vec![], range())
    };
    let err = fetch(&nobody).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("asking the collector at http://127.0.0.1:1/api/v1/series"),
        "{err}"
    );
}

#[test]
fn an_export_is_a_capture_file_holding_exactly_the_archived_samples_of_the_node() {
    let (url, _, dir) = serve();
    let out = dir.path().join("export.rscap");
    monitor_client::export::run(&monitor_client::export::ExportArgs {
        collector: url.clone(),
        node: "gpu-node-007".into(),
        range: range(),
        out: out.clone(),
    })
    .unwrap();
    let bytes = std::fs::read(&out).unwrap();
    let mut timelines = monitor_capture::Timelines::default();
    let read =
        monitor_capture::read_capture(&bytes, |_, frame, state| timelines.add_frame(frame, state))
            .unwrap();
    assert!(read.stopped.is_none(), "{:?}", read.stopped);
    assert_eq!(read.header.host, "gpu-node-007");
    assert_eq!(read.header.ports.len(), 8);
    assert!(read.trailer.is_some());
    let mut exported: Vec<(String, String, u64, u64)> = timelines
        .ports
        .iter()
        .flat_map(|(id, t)| {
            t.counters["port_xmit_bytes"]
                .iter()
                .map(|&(at, v)| (id.device.clone(), id.port.to_string(), at, v))
        })
        .collect();
    exported.sort();

    let json = fetch(&QueryArgs {
        collector: url,
        json: true,
        what: QueryCommand::Series {
            metric: "railscope_ib_port_xmit_bytes_total".into(),
            matchers: vec![],
            range: range(),
        },
    })
    .unwrap();
    let mut archived: Vec<(String, String, u64, u64)> = json["series"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| {
            let (device, port) = (
                s["labels"]["device"].as_str().unwrap().to_owned(),
                s["labels"]["port"].as_str().unwrap().to_owned(),
            );
            s["points"]
                .as_array()
                .unwrap()
                .iter()
                .map(move |p| {
                    (
                        device.clone(),
                        port.clone(),
                        p["t"].as_u64().unwrap(),
                        p["value"].as_u64().unwrap(),
                    )
                })
                .collect::<Vec<_>>()
        })
        .collect();
    archived.sort();
    assert!(!archived.is_empty());
    assert_eq!(exported, archived);
}

/// The first frame of the node's session (schema entries only) archived after the three that
/// carry its first samples, as when that datagram came late: the export still holds every
/// port counter value the node sent.
#[test]
fn an_export_holds_samples_archived_before_the_frame_defining_their_ids() {
    let dir = tempfile::tempdir().unwrap();
    let key = Key::from_bytes([7; 32]);
    let mut archive = Archive::open(ArchiveConfig {
        retention_age: None,
        segment_span: Duration::from_secs(1 << 30),
        ..ArchiveConfig::new(dir.path())
    })
    .unwrap();
    let mut sender = NodeSender::new("gpu-node-007", 7, key.clone());
    let mut sent = Vec::new();
    let mut frames = sender.run_observed(T0, 60, 10, &mut |r| {
        if let (Some(device), Value::U64(v)) = (r.series.labels.get("device"), r.value)
            && &*r.series.name == "railscope_ib_port_xmit_bytes_total"
        {
            sent.push((device.to_owned(), r.unix_ns, v));
        }
    });
    frames[..4].rotate_left(1);
    monitor_archive::node_archive::append_frames_as_they_came(&mut archive, &sender.name, &frames)
        .unwrap();
    archive.tick().unwrap();
    let url = serve_on_loopback(archive, key);
    let out = dir.path().join("export.rscap");
    monitor_client::export::run(&monitor_client::export::ExportArgs {
        collector: url,
        node: "gpu-node-007".into(),
        range: range(),
        out: out.clone(),
    })
    .unwrap();
    let bytes = std::fs::read(&out).unwrap();
    let mut timelines = monitor_capture::Timelines::default();
    monitor_capture::read_capture(&bytes, |_, frame, state| timelines.add_frame(frame, state))
        .unwrap();
    let mut exported: Vec<(String, u64, u64)> = timelines
        .ports
        .iter()
        .flat_map(|(id, t)| {
            t.counters["port_xmit_bytes"]
                .iter()
                .map(|&(at, v)| (id.device.clone(), at, v))
        })
        .collect();
    exported.sort();
    sent.sort();
    assert_eq!(sent.len(), 8 * 60);
    assert_eq!(exported, sent, "every value the node sent");
}

#[test]
fn an_export_without_a_node_is_refused_naming_the_parameter() {
    let (url, _, dir) = serve();
    let err = monitor_client::export::run(&monitor_client::export::ExportArgs {
        collector: url,
        node: String::new(),
        range: range(),
        out: dir.path().join("x.rscap"),
    })
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the collector refused the export (400 Bad Request): parameter \"node\" is required (a node name)"
    );
}

/// A route this collector does not serve (no `[actions]` here) is named in one line that says
/// why, not as "not JSON".
#[test]
fn a_route_the_collector_does_not_serve_is_named_with_why() {
    let (url, _, _dir) = serve();
    let err = monitor_client::query::get_json(&url, "/api/v1/actions", &[])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("does not serve /api/v1/actions (404)")
            && err.contains("[actions]")
            && !err.contains('\n'),
        "{err}"
    );
}
