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
}

impl SysfsError {
    /// The file or directory the problem is about.
    pub fn path(&self) -> &Path {
        match self {
            SysfsError::Read { path, .. }
            | SysfsError::List { path, .. }
            | SysfsError::NotUtf8 { path }
            | SysfsError::Malformed { path, .. }
            | SysfsError::UnknownName { path, .. } => path,
        }
    }

    pub(super) fn not_found(&self) -> bool {
        matches!(
            self,
            SysfsError::Read { source, .. } | SysfsError::List { source, .. }
                if source.kind() == io::ErrorKind::NotFound
        )
    }
}
