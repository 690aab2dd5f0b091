//! What can go wrong reading or writing a capture file. Every message names the offset in the
//! file where reading stopped.

/// An error of a capture file.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// Not a capture file, or its header cannot be read: nothing of it is usable.
    #[error("not a readable capture file: {reason} (at offset {offset})")]
    BadHeader { offset: u64, reason: String },
    /// The file ends inside a record (the writer was killed, or the disk was full).
    #[error("torn record at offset {offset}: it needs {needed} bytes, {left} are left")]
    Torn { offset: u64, needed: u64, left: u64 },
    /// A record whose length, checksum or frame is wrong.
    #[error("corrupt record at offset {offset}: {reason}")]
    Corrupt { offset: u64, reason: String },
    /// The capture's size cap would be exceeded by the next record.
    #[error("size cap of {cap} bytes reached")]
    SizeCap { cap: u64 },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl CaptureError {
    /// The file offset a read stopped at, if the error is about the file's contents.
    pub fn offset(&self) -> Option<u64> {
        match self {
            CaptureError::BadHeader { offset, .. }
            | CaptureError::Torn { offset, .. }
            | CaptureError::Corrupt { offset, .. } => Some(*offset),
            CaptureError::SizeCap { .. } | CaptureError::Io(_) => None,
        }
    }
}
