//! A capture file as `railscope report` reads it: header, records, frames (with the key the
//! header carries), trailer; then the flap analysis, both report forms and each port's SVG
//! timeline over what was read.
//!
//! Input layout (monitor-capture/examples/capture_fuzz_seeds.rs makes seeds of it): a flags byte, then
//! the capture's bytes. With bit 0 set the target first rewrites the header's and every
//! record's checksum and seals each frame again with the header's key, so that mutations get
//! past those checks to the frame parser and the analysis; with it clear the bytes are read
//! as they are (the checks themselves are fuzzed).
#![no_main]

use libfuzzer_sys::fuzz_target;
use monitor_capture::{
    CaptureHeader, Rules, Timelines, analyse,
    format::{PREAMBLE_LEN, RECORD_HEADER_LEN, parse_key_hex},
    report::{Report, load_capture},
};
use monitor_wire::{Key, MAC_LEN, MAGIC as FRAME_MAGIC, seal_for_fuzzing};

fuzz_target!(|data: &[u8]| {
    let Some((&flags, capture)) = data.split_first() else {
        return;
    };
    let mut bytes = capture.to_vec();
    if flags & 1 != 0 {
        fix_checks(&mut bytes);
    }
    let mut timelines = Timelines::default();
    let Ok(source) = load_capture("fuzz.rscap", &bytes, &mut timelines) else {
        return;
    };
    timelines.finish();
    let rules = Rules::default();
    let ports = analyse(&timelines, &rules);
    let report = Report {
        sources: vec![source],
        rules,
        ports,
    };
    let _ = report.to_text();
    let _ = report.to_json();
    for port in &report.ports {
        if let Some(timeline) = timelines.ports.get(&port.port) {
            let _ = monitor_capture::svg::port_timeline(port, timeline);
        }
    }
});

/// Rewrites the header's checksum and, while the records' lengths fit, each record's
/// checksum, after sealing a frame's body again with the header's key.
fn fix_checks(bytes: &mut [u8]) {
    if bytes.len() < PREAMBLE_LEN {
        return;
    }
    let len = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize;
    let Some(json) = bytes.get(PREAMBLE_LEN..PREAMBLE_LEN.saturating_add(len)) else {
        return;
    };
    let crc = crc32fast::hash(json);
    let key = serde_json::from_slice::<CaptureHeader>(json)
        .ok()
        .and_then(|h| parse_key_hex(&h.frame_key))
        .map(Key::from_bytes);
    bytes[12..16].copy_from_slice(&crc.to_le_bytes());
    let mut offset = PREAMBLE_LEN + len;
    while let Some(head) = bytes.get(offset..offset + RECORD_HEADER_LEN) {
        let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
        let start = offset + RECORD_HEADER_LEN;
        let Some(payload) = bytes.get_mut(start..start.saturating_add(len)) else {
            return;
        };
        if let Some(key) = &key
            && payload.starts_with(&FRAME_MAGIC)
            && payload.len() > MAC_LEN
        {
            let mut body = payload[..payload.len() - MAC_LEN].to_vec();
            seal_for_fuzzing(&mut body, key);
            payload.copy_from_slice(&body);
        }
        let crc = crc32fast::hash(payload);
        bytes[offset + 4..start].copy_from_slice(&crc.to_le_bytes());
        offset = start + len;
    }
}
