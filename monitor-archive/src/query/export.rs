//! One node's frames over a time range, as a capture file (docs/capture-format.md), so
//! `railscope report` runs on what the fleet recorded with the same code as on a local
//! capture (docs/agent.md, "Capture mode").
//!
//! The frames are decoded from the archive with the cluster key and written again into one
//! new session numbered from 0, each carrying the schema entries of the series it holds (the
//! archive's frames rely on entries sent earlier, in other segments or sessions), with only
//! the samples and events inside the range, sealed with a fresh key that the file carries:
//! the cluster key never leaves the collector.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::ControlFlow;

use monitor_capture::{
    CaptureHeader, CaptureWriter, PortInfo, Trailer,
    format::{MAX_RECORD_LEN, key_hex},
};
use monitor_wire::{
    Frame, Key, SchemaEntry, Series, SeriesData, SeriesSamples, encode_frame, names::metric,
};

use super::engine::{QueryEngine, QueryError};
use crate::archive::NodeSelector;

/// What an export holds.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ExportStats {
    pub frames: u64,
    /// Frames that would not fit one capture record once their schema entries were added.
    pub skipped: u64,
    /// Samples whose series id no schema entry of their session defines, in any frame read:
    /// left out, and said so.
    pub unplaced: u64,
}

/// An in-range frame's samples and events, kept until every frame's schema entries are read:
/// a frame can come before the one that defines its ids.
struct ReadFrame {
    node: String,
    session: u32,
    send_unix_ns: u64,
    time_quantum_ns: u64,
    samples: Vec<SeriesSamples>,
    events: Vec<monitor_wire::WireEvent>,
}

/// The capture file of `node`'s samples and events between `start_ns` and `end_ns`.
pub fn export_capture(
    engine: &QueryEngine,
    node: &str,
    start_ns: u64,
    end_ns: u64,
) -> Result<(Vec<u8>, ExportStats), QueryError> {
    let key_bytes = random_key();
    let key = Key::from_bytes(key_bytes);
    let session = u32::from_le_bytes(key_bytes[..4].try_into().expect("4 bytes"));
    let mut records: Vec<Vec<u8>> = Vec::new();
    let mut stats = ExportStats::default();
    let mut ports: BTreeMap<(String, u32), String> = BTreeMap::new();
    let mut counters = BTreeSet::new();
    let nodes = NodeSelector::Only(BTreeSet::from([node.to_owned()]));
    // The series each session's ids stand for, gathered from every frame read (a frame
    // relies on entries sent earlier, or archived later when frames came out of order).
    let mut schemas: HashMap<u32, HashMap<u32, Series>> = HashMap::new();
    let mut read: Vec<ReadFrame> = Vec::new();
    engine.each_frame(nodes, start_ns, end_ns, |_, frame, in_range| {
        let schema = schemas.entry(frame.session).or_default();
        for e in &frame.schema {
            schema.insert(e.id, e.series.clone());
        }
        if !in_range {
            return ControlFlow::Continue(());
        }
        // The MAC was checked when the frame was opened: a section that does not decode
        // is the archive's damage, and the frame is left out like an undecodable one.
        let (Ok(samples), Ok(events)) = (frame.samples(|_| true), frame.events()) else {
            stats.skipped += 1;
            return ControlFlow::Continue(());
        };
        read.push(ReadFrame {
            node: frame.node.to_owned(),
            session: frame.session,
            send_unix_ns: frame.send_unix_ns,
            time_quantum_ns: frame.time_quantum_ns,
            samples,
            events,
        });
        ControlFlow::Continue(())
    })?;
    for frame in read {
        let schema = schemas.get(&frame.session);
        let mut out = Frame {
            node: frame.node,
            session,
            seq: records.len() as u64,
            send_unix_ns: frame.send_unix_ns,
            time_quantum_ns: frame.time_quantum_ns,
            schema: Vec::new(),
            samples: Vec::new(),
            events: Vec::new(),
        };
        for s in &frame.samples {
            let Some(series) = schema.and_then(|schema| schema.get(&s.id)) else {
                stats.unplaced += s.data.len() as u64;
                continue;
            };
            let data = within(&s.data, start_ns, end_ns);
            if data.is_empty() {
                continue;
            }
            if let (Some(name), Some(device), Some(port)) = (
                series.name.strip_prefix(metric::IB_PREFIX),
                series.labels.get("device"),
                series
                    .labels
                    .get("port")
                    .and_then(|p| p.parse::<u32>().ok()),
            ) {
                let layer = ports.entry((device.to_owned(), port)).or_default();
                if let Some(l) = series.labels.get("link_layer") {
                    *layer = l.to_owned();
                }
                if let Some(counter) = name.strip_suffix("_total") {
                    counters.insert(counter.to_owned());
                }
            }
            out.schema.push(SchemaEntry {
                id: s.id,
                series: series.clone(),
            });
            out.samples.push(SeriesSamples { id: s.id, data });
        }
        out.events = frame
            .events
            .into_iter()
            .filter(|e| (start_ns..=end_ns).contains(&e.unix_ns))
            .collect();
        if out.samples.is_empty() && out.events.is_empty() {
            continue;
        }
        match encode_frame(&out, &key) {
            Ok(bytes) if bytes.len() <= MAX_RECORD_LEN => records.push(bytes),
            _ => stats.skipped += 1,
        }
    }
    stats.frames = records.len() as u64;
    let header = CaptureHeader {
        railscope_version: env!("CARGO_PKG_VERSION").into(),
        host: node.to_owned(),
        kernel: "unknown (exported from a collector's archive)".into(),
        started_unix_ns: start_ns,
        interval_ns: 0,
        pre_trigger_ns: 0,
        post_trigger_ns: 0,
        baseline_ns: 0,
        devices: ports
            .keys()
            .map(|(d, _)| d.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect(),
        ports: ports
            .into_iter()
            .map(|((device, port), link_layer)| PortInfo {
                device,
                port,
                link_layer: if link_layer.is_empty() {
                    "unknown".into()
                } else {
                    link_layer
                },
            })
            .collect(),
        counters: counters.into_iter().collect(),
        frame_key: key_hex(&key_bytes),
    };
    let mut writer = CaptureWriter::new(Vec::new(), &header, u64::MAX).map_err(capture_to_query)?;
    for r in &records {
        writer.write_frame(r).map_err(capture_to_query)?;
    }
    let bytes = writer
        .finish(&Trailer {
            reason: "exported from a collector's archive".into(),
            ended_unix_ns: end_ns,
            events: 0,
            snapshots_written: 0,
            triggers: 0,
        })
        .map_err(capture_to_query)?;
    Ok((bytes, stats))
}

/// Writing to memory fails only on a bug; said as an archive error for the caller.
fn capture_to_query(e: monitor_capture::CaptureError) -> QueryError {
    QueryError::Archive(crate::archive::ArchiveError::Corrupt {
        path: "export".into(),
        what: e.to_string(),
    })
}

/// The samples of `data` within the range.
fn within(data: &SeriesData, start_ns: u64, end_ns: u64) -> SeriesData {
    let range = start_ns..=end_ns;
    match data {
        SeriesData::Counter(v) => SeriesData::Counter(
            v.iter()
                .filter(|s| range.contains(&s.unix_ns))
                .copied()
                .collect(),
        ),
        SeriesData::Gauge(v) => SeriesData::Gauge(
            v.iter()
                .filter(|s| range.contains(&s.end_unix_ns))
                .copied()
                .collect(),
        ),
    }
}

fn random_key() -> [u8; 32] {
    let mut key = [0u8; 32];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut key))
        .is_err()
    {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        key[..8].copy_from_slice(&now.to_le_bytes());
    }
    key
}
