//! What setup found or installed, handed to the commands that follow (below `setup`, which
//! makes it, and `cargo`, which runs cargo with it).

use std::{ffi::OsString, path::PathBuf};

/// What setup found or installed, for the commands that follow.
#[derive(Debug, Clone)]
pub(crate) struct Tools {
    pub bpf_linker_dir: PathBuf,
    pub cache_dir: PathBuf,
}

impl Tools {
    /// PATH with bpf-linker's directory first.
    pub(crate) fn path_with_bpf_linker(&self) -> OsString {
        let mut paths = vec![self.bpf_linker_dir.clone()];
        if let Some(path) = std::env::var_os("PATH") {
            paths.extend(std::env::split_paths(&path));
        }
        std::env::join_paths(paths).expect("PATH entries contain no separator")
    }
}
