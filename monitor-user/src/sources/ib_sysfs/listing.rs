//! Directory listings: sorted entry names, a failure reported as a [`SysfsError`].

use std::{collections::BTreeMap, fs, path::Path};

use super::SysfsError;

/// Entry names of a directory, sorted. Names that are not UTF-8 are reported and skipped.
pub(super) fn list_dir(dir: &Path) -> Result<Vec<String>, SysfsError> {
    list(dir, false)
}

/// Like [`list_dir`], without subdirectories.
pub(super) fn list_files(dir: &Path) -> Result<Vec<String>, SysfsError> {
    list(dir, true)
}

pub(super) fn list(dir: &Path, files_only: bool) -> Result<Vec<String>, SysfsError> {
    let err = |source| SysfsError::List {
        path: dir.to_path_buf(),
        source,
    };
    let mut names = BTreeMap::new();
    for entry in fs::read_dir(dir).map_err(err)? {
        let entry = entry.map_err(err)?;
        if files_only && entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        match entry.file_name().into_string() {
            Ok(name) => {
                names.insert(name, ());
            }
            Err(raw) => tracing::debug!("skipping {raw:?} in {}: not UTF-8", dir.display()),
        }
    }
    Ok(names.into_keys().collect())
}
