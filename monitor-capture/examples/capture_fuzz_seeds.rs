//! Writes seed inputs for the `capture_file` fuzz target (`cargo xtask fuzz` runs it): small
//! captures made by the capture writer and the agent's frame encoder, a few records each, so
//! that one execution stays cheap while every part of the report is reached (events, state
//! snapshots, counters that move, width and rate changes, a trailer or none). Each seed is in
//! the target's input layout: a flags byte (bit 0: the target rewrites the checksums and
//! seals the frames again, so that mutations reach the frame parser and the analysis), then
//! the capture's bytes.
//!
//! `cargo run -p monitor-capture --example capture_fuzz_seeds -- DIR`

use std::path::PathBuf;

use monitor_capture::{
    CaptureHeader, CaptureWriter, PortInfo, Rules, Timelines, Trailer, Verdict, analyse,
    format::key_hex, report::load_capture,
};
use monitor_wire::{
    EncoderConfig, FrameEncoder, Key, Kind, Labels, Reading, Series, Value, WireEvent,
};

const MS: u64 = 1_000_000;
const T0: u64 = 1_763_164_800_000_000_000;
/// The key the seeds' frames are sealed with (the header carries it).
const KEY: [u8; 32] = [7; 32];

/// What happens to a port at one snapshot step.
#[derive(Clone, Copy)]
struct Step {
    /// `state` gauge (4 = ACTIVE).
    state: f64,
    width: f64,
    rate: f64,
    link_downed: u64,
    symbol_error: u64,
    /// `hw_counters/` ones.
    link_error_recovery: u64,
    excessive_buffer_overrun: u64,
    /// Raw IB events at this step.
    events: &'static [&'static str],
}

const UP: Step = Step {
    state: 4.0,
    width: 4.0,
    rate: 100.0,
    link_downed: 0,
    symbol_error: 0,
    link_error_recovery: 0,
    excessive_buffer_overrun: 0,
    events: &[],
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        return Err("usage: capture_fuzz_seeds DIR".into());
    };
    std::fs::create_dir_all(&dir)?;
    // A port that flaps (events, as rxe raises them: PORT_ERR once, PORT_ACTIVE twice) with
    // its counters moving; a stable one beside it; a clean end.
    let flapping = [
        UP,
        Step {
            state: 1.0,
            link_downed: 1,
            events: &["PORT_ERR"],
            ..UP
        },
        Step {
            link_downed: 1,
            events: &["PORT_ACTIVE", "PORT_ACTIVE"],
            ..UP
        },
        Step {
            state: 1.0,
            link_downed: 2,
            symbol_error: 40,
            events: &["PORT_ERR", "LID_CHANGE"],
            ..UP
        },
        Step {
            link_downed: 2,
            symbol_error: 45,
            events: &["PORT_ACTIVE"],
            ..UP
        },
    ];
    let stable = [UP; 5];
    // Down and up seen only by the state snapshots; narrower and slower after; error
    // counters rising (link_error_recovery just under its rule), one reset; no trailer (a
    // capture that was killed).
    let degraded = [
        UP,
        Step {
            state: 1.0,
            symbol_error: 30,
            link_error_recovery: 3,
            ..UP
        },
        Step {
            width: 1.0,
            rate: 25.0,
            symbol_error: 60,
            link_error_recovery: 5,
            ..UP
        },
        Step {
            width: 1.0,
            rate: 25.0,
            symbol_error: 2,
            excessive_buffer_overrun: 1,
            ..UP
        },
    ];
    // Down at the end.
    let down = [
        UP,
        Step {
            state: 1.0,
            events: &["PORT_ERR"],
            ..UP
        },
        Step { state: 1.0, ..UP },
    ];
    let captures: [Seed; 3] = [
        (
            "flap",
            vec![("mlx5_0", &flapping), ("mlx5_1", &stable)],
            true,
            &[Verdict::Flapping, Verdict::Stable],
        ),
        (
            "degraded-cut",
            vec![("mlx5_0", &degraded)],
            false,
            &[Verdict::Degraded],
        ),
        ("down", vec![("rxe0", &down)], true, &[Verdict::Down]),
    ];
    for (name, ports, trailer, verdicts) in captures {
        let bytes = capture(&ports, trailer)?;
        // A seed that no longer reads back as meant would fuzz less than it claims.
        let mut timelines = Timelines::default();
        let source = load_capture(name, &bytes, &mut timelines)?;
        timelines.finish();
        let got: Vec<Verdict> = analyse(&timelines, &Rules::default())
            .iter()
            .map(|p| p.verdict)
            .collect();
        if got != verdicts || source.stopped.is_some() {
            return Err(format!(
                "seed {name}: verdicts {got:?}, stopped {:?}; meant {verdicts:?}",
                source.stopped
            )
            .into());
        }
        for flags in [0u8, 1] {
            let mut seed = vec![flags];
            seed.extend_from_slice(&bytes);
            std::fs::write(dir.join(format!("{name}-{flags}")), seed)?;
        }
    }
    Ok(())
}

/// One seed: its file name, each port's steps, whether it ends with a trailer, and the
/// verdicts the report must give its ports.
type Seed<'a> = (&'a str, Vec<Port<'a>>, bool, &'a [Verdict]);
/// A device (port 1) and its steps.
type Port<'a> = (&'a str, &'a [Step]);

/// A capture of the given ports' steps, one snapshot per 100 ms, frames flushed every two
/// steps and events as they happen.
fn capture(ports: &[Port], trailer: bool) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    let header = CaptureHeader {
        railscope_version: "0.1.0".into(),
        host: "node1".into(),
        kernel: "6.1.0-test".into(),
        started_unix_ns: T0,
        interval_ns: 100 * MS,
        pre_trigger_ns: 1000 * MS,
        post_trigger_ns: 1000 * MS,
        baseline_ns: 1000 * MS,
        devices: ports.iter().map(|(d, _)| d.to_string()).collect(),
        ports: ports
            .iter()
            .map(|(d, _)| PortInfo {
                device: d.to_string(),
                port: 1,
                link_layer: "InfiniBand".into(),
            })
            .collect(),
        counters: vec![
            "link_downed".into(),
            "symbol_error".into(),
            "hw_counters/link_error_recovery".into(),
        ],
        frame_key: key_hex(&KEY),
    };
    let mut encoder = FrameEncoder::new(EncoderConfig::new("node1"), Key::from_bytes(KEY))?;
    let mut bytes = Vec::new();
    let mut writer = CaptureWriter::new(&mut bytes, &header, 1 << 20)?;
    let steps = ports.iter().map(|(_, s)| s.len()).max().unwrap_or(0);
    for i in 0..steps {
        let t = T0 + i as u64 * 100 * MS;
        for &(device, port_steps) in ports {
            let Some(step) = port_steps.get(i) else {
                continue;
            };
            let labels = Labels::new([("device", device), ("port", "1")]);
            for (n, event) in step.events.iter().enumerate() {
                encoder.push_event(WireEvent {
                    unix_ns: t + n as u64 * MS,
                    kind: "ib_port".into(),
                    labels: labels.clone(),
                    code: 0,
                    text: (*event).into(),
                });
            }
            let readings = [
                (
                    "railscope_ib_port_state",
                    Kind::Gauge,
                    Value::F64(step.state),
                ),
                (
                    "railscope_ib_port_phys_state",
                    Kind::Gauge,
                    Value::F64(if step.state == 4.0 { 5.0 } else { 3.0 }),
                ),
                (
                    "railscope_ib_port_width_lanes",
                    Kind::Gauge,
                    Value::F64(step.width),
                ),
                (
                    "railscope_ib_port_rate_gbps",
                    Kind::Gauge,
                    Value::F64(step.rate),
                ),
                (
                    "railscope_ib_link_downed_total",
                    Kind::Counter,
                    Value::U64(step.link_downed),
                ),
                (
                    "railscope_ib_symbol_error_total",
                    Kind::Counter,
                    Value::U64(step.symbol_error),
                ),
                (
                    "railscope_ib_port_rcv_data_bytes_total",
                    Kind::Counter,
                    Value::U64(i as u64 * 4096),
                ),
                (
                    "railscope_ib_hw_link_error_recovery_total",
                    Kind::Counter,
                    Value::U64(step.link_error_recovery),
                ),
                (
                    "railscope_ib_excessive_buffer_overrun_errors_total",
                    Kind::Counter,
                    Value::U64(step.excessive_buffer_overrun),
                ),
            ];
            for (name, kind, value) in readings {
                encoder.push_reading(&Reading {
                    series: Series {
                        name: name.into(),
                        labels: labels.clone(),
                        kind,
                    },
                    value,
                    unix_ns: t,
                })?;
            }
        }
        for frame in encoder.flush_events(t + 5 * MS) {
            writer.write_frame(&frame)?;
        }
        if i % 2 == 1 {
            for frame in encoder.flush(t + 10 * MS) {
                writer.write_frame(&frame)?;
            }
        }
    }
    let end = T0 + steps as u64 * 100 * MS;
    for frame in encoder.flush(end) {
        writer.write_frame(&frame)?;
    }
    // Without a trailer: what a capture killed before its end leaves.
    if trailer {
        writer.finish(&Trailer {
            reason: "duration".into(),
            ended_unix_ns: end,
            events: 0,
            snapshots_written: steps as u64,
            triggers: 1,
        })?;
    }
    Ok(bytes)
}
