//! Appends records to a capture file, each written whole with one `write` so that a kill or a
//! full disk leaves at most one torn record at the end (which the reader recognises).

use std::io::Write;

use crate::{
    error::CaptureError,
    format::{
        CaptureHeader, RECORD_HEADER_LEN, Trailer, encode_header, encode_record, encode_trailer,
    },
};

/// Room kept under the size cap for the trailer, so a capture stopped by its cap still ends
/// cleanly.
const TRAILER_ROOM: u64 = 1024;

/// Writes one capture file.
#[derive(Debug)]
pub struct CaptureWriter<W: Write> {
    out: W,
    written: u64,
    max_size: u64,
    records: u64,
}

impl<W: Write> CaptureWriter<W> {
    /// Writes the header; later records keep the file within `max_size` bytes.
    pub fn new(mut out: W, header: &CaptureHeader, max_size: u64) -> Result<Self, CaptureError> {
        let bytes = encode_header(header);
        if bytes.len() as u64 + TRAILER_ROOM > max_size {
            return Err(CaptureError::SizeCap { cap: max_size });
        }
        out.write_all(&bytes)?;
        out.flush()?;
        Ok(Self {
            out,
            written: bytes.len() as u64,
            max_size,
            records: 0,
        })
    }

    /// Appends one frame (as the encoder made it). Refused with [`CaptureError::SizeCap`],
    /// writing nothing, when it would take the file past its cap.
    pub fn write_frame(&mut self, frame: &[u8]) -> Result<(), CaptureError> {
        let len = (RECORD_HEADER_LEN + frame.len()) as u64;
        if self.written + len + TRAILER_ROOM > self.max_size {
            return Err(CaptureError::SizeCap { cap: self.max_size });
        }
        self.append(&encode_record(frame))
    }

    fn append(&mut self, record: &[u8]) -> Result<(), CaptureError> {
        self.out.write_all(record)?;
        self.out.flush()?;
        self.written += record.len() as u64;
        self.records += 1;
        Ok(())
    }

    /// Bytes in the file so far.
    pub fn bytes_written(&self) -> u64 {
        self.written
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Writes the trailer and hands the output back.
    pub fn finish(mut self, trailer: &Trailer) -> Result<W, CaptureError> {
        let record = encode_record(&encode_trailer(trailer));
        self.append(&record)?;
        Ok(self.out)
    }
}
