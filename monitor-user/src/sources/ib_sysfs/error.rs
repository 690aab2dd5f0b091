//! Problems with one sysfs file or directory, each reported once and kept while it lasts.

use std::{
    io,
    path::{Path, PathBuf},
};

/// Why one sysfs file gave no value, or not the value expected. Each message is one line and
/// names the file.
#[derive(Debug, thiserror::Error)]
pub enum SysfsError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot list {}: {source}", path.display())]
    List {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: contents are not UTF-8", path.display())]
    NotUtf8 { path: PathBuf },
    #[error("{}: unexpected value {value:?} (expected {expected})", path.display())]
    Malformed {
        path: PathBuf,
        value: String,
        expected: &'static str,
    },
    #[error("{}: unknown name {name:?} for code {code} (code still used)", path.display())]
    UnknownName {
        path: PathBuf,
        code: u32,
        name: String,
    },
    /// A PMA counter at the all-ones value of its field: it stopped counting (see
    /// `saturation.rs`). Its value is still sent.
    #[error(
        "{}: counter saturated at {max} (its {bits}-bit maximum): it no longer counts, so its \
         rate reads as zero from here on until the counter is reset; \
         railscope_ib_counter_saturated is 1 meanwhile. The adapter's extended 64-bit counters \
         (`perfquery -x`) keep counting",
        path.display()
    )]
    Saturated { path: PathBuf, max: u64, bits: u32 },
}

impl SysfsError {
    /// The file or directory the problem is about.
    pub fn path(&self) -> &Path {
        match self {
            SysfsError::Read { path, .. }
            | SysfsError::List { path, .. }
            | SysfsError::NotUtf8 { path }
            | SysfsError::Malformed { path, .. }
            | SysfsError::UnknownName { path, .. }
            | SysfsError::Saturated { path, .. } => path,
        }
    }

    /// A counter stuck at its maximum, not a file that failed.
    pub(super) fn is_saturation(&self) -> bool {
        matches!(self, SysfsError::Saturated { .. })
    }

    pub(super) fn not_found(&self) -> bool {
        matches!(
            self,
            SysfsError::Read { source, .. } | SysfsError::List { source, .. }
                if source.kind() == io::ErrorKind::NotFound
        )
    }
}
