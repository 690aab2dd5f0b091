//! Writes seed inputs for the frame fuzz targets (`cargo xtask fuzz` runs it): frames the
//! agent's own encoder makes for a small node (schema, counters, gauges, an event), and a
//! schema request, in the targets' input layout: a flags byte (bit i: datagram i is sealed
//! with the key by the target), the first datagram's length (u16 LE), then the datagrams
//! without their MAC.
//!
//! `cargo run -p monitor-wire --example frame_fuzz_seeds -- FRAME_DIR REQUEST_DIR`

use std::{path::PathBuf, sync::Arc};

use monitor_wire::{
    EncoderConfig, FrameEncoder, Key, Kind, Labels, MAC_LEN, Reading, SchemaRequest, Series, Value,
    WireEvent, encode_schema_request,
};

/// The key the fuzz targets seal with.
const KEY: [u8; 32] = [7; 32];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args_os().skip(1).map(PathBuf::from);
    let (Some(frames_dir), Some(requests_dir)) = (args.next(), args.next()) else {
        return Err("usage: frame_fuzz_seeds FRAME_DIR REQUEST_DIR".into());
    };
    std::fs::create_dir_all(&frames_dir)?;
    std::fs::create_dir_all(&requests_dir)?;
    let key = Key::from_bytes(KEY);
    let mut encoder = FrameEncoder::new(EncoderConfig::new("gpu-node-0001"), key.clone())?;
    let series = |name: &str, labels: Labels, kind| Series {
        name: Arc::from(name),
        labels,
        kind,
    };
    let t0 = 1_700_000_000_000_000_000_u64;
    let mut frames = Vec::new();
    for step in 0..4u64 {
        let t = t0 + step * 1_000_000_000;
        for port in 1..=2u64 {
            let labels =
                Labels::new([("device", "mlx5_0".to_string()), ("port", port.to_string())]);
            encoder.push_reading(&Reading {
                series: series(
                    "railscope_ib_port_xmit_bytes_total",
                    labels.clone(),
                    Kind::Counter,
                ),
                value: Value::U64(1_000_000 * step * port),
                unix_ns: t,
            })?;
            encoder.push_reading(&Reading {
                series: series("railscope_ib_port_state", labels, Kind::Gauge),
                value: Value::U64(4),
                unix_ns: t,
            })?;
        }
        encoder.push_reading(&Reading {
            series: series(
                "railscope_gpu_power_watts",
                Labels::new([("gpu", "0")]),
                Kind::Gauge,
            ),
            value: Value::F64(612.345 + step as f64),
            unix_ns: t,
        })?;
        if step == 2 {
            encoder.push_event(WireEvent {
                unix_ns: t,
                kind: "ib_port".into(),
                labels: Labels::new([("device", "mlx5_0"), ("port", "1")]),
                code: 1,
                text: "PORT_ERR".into(),
            });
            frames.extend(encoder.flush_events(t));
        }
        if step % 2 == 1 {
            frames.extend(encoder.flush(t));
        }
    }
    let body = |frame: &[u8]| frame[..frame.len().saturating_sub(MAC_LEN)].to_vec();
    let seed = |flags: u8, first: &[u8], second: &[u8]| {
        let mut out = vec![flags];
        out.extend_from_slice(&(first.len() as u16).to_le_bytes());
        out.extend_from_slice(first);
        out.extend_from_slice(second);
        out
    };
    for (i, frame) in frames.iter().enumerate() {
        let next = frames.get(i + 1).map_or(&[][..], Vec::as_slice);
        std::fs::write(
            frames_dir.join(format!("frame-{i}")),
            seed(0b11, &body(frame), &body(next)),
        )?;
        // As received, MAC included: the targets' unsealed path.
        std::fs::write(
            frames_dir.join(format!("datagram-{i}")),
            seed(0, frame, &[]),
        )?;
    }
    let request = encode_schema_request(
        &SchemaRequest {
            node: "gpu-node-0001".into(),
            session: encoder.session(),
        },
        &key,
    )?;
    std::fs::write(requests_dir.join("request"), seed(1, &body(&request), &[]))?;
    println!("{} frame seeds, 1 request seed", 2 * frames.len());
    Ok(())
}
