//! Reads a capture file up to its last complete record. A torn or corrupt record does not
//! lose what precedes it: [`read_capture`] returns every frame before it, and the error that
//! stopped it, naming its offset.

use monitor_wire::{Frame, Key, MAGIC as FRAME_MAGIC, ReceiverState, decode};

use crate::{
    error::CaptureError,
    format::{
        CaptureHeader, FILE_MAGIC, FILE_VERSION, MAX_HEADER_LEN, MAX_RECORD_LEN, PREAMBLE_LEN,
        RECORD_HEADER_LEN, TRAILER_MAGIC, Trailer, parse_key_hex,
    },
};

/// What a capture file holds, as far as it could be read.
#[derive(Debug)]
pub struct ReadCapture {
    pub header: CaptureHeader,
    /// Frames read up to the first bad record.
    pub frames: u64,
    /// Present when the capture ended cleanly.
    pub trailer: Option<Trailer>,
    /// Why reading stopped before the end of the file: a torn or corrupt record. `None` when
    /// every byte was read.
    pub stopped: Option<CaptureError>,
    /// Bytes of the file that were read as complete records (header included).
    pub complete_bytes: u64,
}

/// Reads a capture from its bytes, handing each frame in file order to `visit` with its bytes
/// and the decoder's state (which knows the series of its sample ids). Only an unreadable
/// header is an error; a bad record ends the reading there, and is in
/// [`ReadCapture::stopped`].
pub fn read_capture(
    bytes: &[u8],
    mut visit: impl FnMut(&[u8], &Frame, &ReceiverState),
) -> Result<ReadCapture, CaptureError> {
    let (header, key, mut offset) = read_header(bytes)?;
    let mut state = ReceiverState::default();
    let mut frames = 0;
    let mut trailer = None;
    let mut stopped = None;
    while offset < bytes.len() {
        match read_record(bytes, offset) {
            Ok(payload) => {
                let at = offset as u64;
                match decode_payload(payload, &key, &mut state, at) {
                    Ok(Payload::Frame(frame)) => {
                        frames += 1;
                        visit(payload, &frame, &state);
                    }
                    Ok(Payload::Trailer(t)) => trailer = Some(t),
                    Err(e) => {
                        stopped = Some(e);
                        break;
                    }
                }
                offset += RECORD_HEADER_LEN + payload.len();
            }
            Err(e) => {
                stopped = Some(e);
                break;
            }
        }
        if trailer.is_some() && offset < bytes.len() {
            stopped = Some(CaptureError::Corrupt {
                offset: offset as u64,
                reason: "bytes after the trailer".into(),
            });
            break;
        }
    }
    Ok(ReadCapture {
        header,
        frames,
        trailer,
        stopped,
        complete_bytes: offset as u64,
    })
}

fn read_header(bytes: &[u8]) -> Result<(CaptureHeader, Key, usize), CaptureError> {
    let bad = |offset: usize, reason: String| CaptureError::BadHeader {
        offset: offset as u64,
        reason,
    };
    if bytes.len() < PREAMBLE_LEN {
        return Err(bad(
            0,
            format!(
                "{} bytes, shorter than the {PREAMBLE_LEN}-byte preamble",
                bytes.len()
            ),
        ));
    }
    if bytes[..4] != FILE_MAGIC {
        return Err(bad(0, "no RSCF magic".into()));
    }
    if bytes[4] != FILE_VERSION {
        return Err(bad(
            4,
            format!(
                "version {} (this railscope reads version {FILE_VERSION})",
                bytes[4]
            ),
        ));
    }
    let len = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes"));
    if len > MAX_HEADER_LEN {
        return Err(bad(
            8,
            format!("header length {len} is beyond {MAX_HEADER_LEN}"),
        ));
    }
    let end = PREAMBLE_LEN + len;
    let Some(json) = bytes.get(PREAMBLE_LEN..end) else {
        return Err(bad(
            PREAMBLE_LEN,
            format!(
                "the header needs {len} bytes, {} are left",
                bytes.len() - PREAMBLE_LEN
            ),
        ));
    };
    if crc32fast::hash(json) != crc {
        return Err(bad(PREAMBLE_LEN, "header checksum mismatch".into()));
    }
    let header: CaptureHeader =
        serde_json::from_slice(json).map_err(|e| bad(PREAMBLE_LEN, format!("header: {e}")))?;
    let key = parse_key_hex(&header.frame_key)
        .ok_or_else(|| bad(PREAMBLE_LEN, "frame_key is not 64 hex digits".into()))?;
    Ok((header, Key::from_bytes(key), end))
}

/// The payload of the record at `offset`, checked against its length and checksum.
fn read_record(bytes: &[u8], offset: usize) -> Result<&[u8], CaptureError> {
    let left = bytes.len() - offset;
    if left < RECORD_HEADER_LEN {
        return Err(CaptureError::Torn {
            offset: offset as u64,
            needed: RECORD_HEADER_LEN as u64,
            left: left as u64,
        });
    }
    let len = u32::from_le_bytes(bytes[offset..offset + 4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(bytes[offset + 4..offset + 8].try_into().expect("4 bytes"));
    if len == 0 || len > MAX_RECORD_LEN {
        return Err(CaptureError::Corrupt {
            offset: offset as u64,
            reason: format!("record length {len} outside 1..={MAX_RECORD_LEN}"),
        });
    }
    if left < RECORD_HEADER_LEN + len {
        return Err(CaptureError::Torn {
            offset: offset as u64,
            needed: (RECORD_HEADER_LEN + len) as u64,
            left: left as u64,
        });
    }
    let payload = &bytes[offset + RECORD_HEADER_LEN..offset + RECORD_HEADER_LEN + len];
    if crc32fast::hash(payload) != crc {
        return Err(CaptureError::Corrupt {
            offset: offset as u64,
            reason: "checksum mismatch".into(),
        });
    }
    Ok(payload)
}

enum Payload {
    Frame(Box<Frame>),
    Trailer(Trailer),
}

fn decode_payload(
    payload: &[u8],
    key: &Key,
    state: &mut ReceiverState,
    offset: u64,
) -> Result<Payload, CaptureError> {
    let corrupt = |reason: String| CaptureError::Corrupt { offset, reason };
    if payload.starts_with(&FRAME_MAGIC) {
        decode(payload, key, state)
            .map(|f| Payload::Frame(Box::new(f)))
            .map_err(|e| corrupt(format!("frame: {e}")))
    } else if payload.starts_with(&TRAILER_MAGIC) {
        serde_json::from_slice(&payload[4..])
            .map(Payload::Trailer)
            .map_err(|e| corrupt(format!("trailer: {e}")))
    } else {
        Err(corrupt("neither a frame nor the trailer".into()))
    }
}
