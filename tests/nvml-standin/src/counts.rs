//! Call counts: with `RAILSCOPE_NVML_STANDIN_COUNTS=PATH` in the environment when the library
//! is loaded, every exported function counts its calls, and the last `nvmlShutdown` (and the
//! program's exit) writes them to PATH as one JSON object (`{"nvmlDeviceGetUtilizationRates": 80, ...}`). The bench
//! (`cargo xtask bench agent`) reads it to set the NVML calls per sweep against the fewest
//! the same fields need. Without the variable, counting costs one relaxed load per call.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{
        Mutex, OnceLock,
        atomic::{AtomicBool, Ordering},
    },
};

/// The environment variable naming the file the counts are written to.
pub const COUNTS_ENV: &str = "RAILSCOPE_NVML_STANDIN_COUNTS";

static ENABLED: AtomicBool = AtomicBool::new(false);
static TARGET: OnceLock<Option<PathBuf>> = OnceLock::new();
static COUNTS: Mutex<BTreeMap<&'static str, u64>> = Mutex::new(BTreeMap::new());

fn target() -> Option<&'static PathBuf> {
    TARGET
        .get_or_init(|| {
            let path = std::env::var_os(COUNTS_ENV).map(PathBuf::from);
            ENABLED.store(path.is_some(), Ordering::Relaxed);
            if path.is_some() {
                // Also at exit, for a program that ends without shutting NVML down.
                // SAFETY: registers a plain function with no arguments.
                unsafe {
                    libc::atexit(write_at_exit);
                }
            }
            path
        })
        .as_ref()
}

/// Counts one call of `function` (when counting is on).
pub fn count(function: &'static str) {
    if TARGET.get().is_none() {
        target();
    }
    if ENABLED.load(Ordering::Relaxed) {
        let mut counts = COUNTS.lock().unwrap_or_else(|e| e.into_inner());
        *counts.entry(function).or_default() += 1;
    }
}

extern "C" fn write_at_exit() {
    write();
}

/// Writes the counts so far (the last `nvmlShutdown` calls it).
pub fn write() {
    let Some(path) = target() else { return };
    let counts = COUNTS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let json = serde_json::to_string(&counts).unwrap_or_default();
    if let Err(e) = std::fs::write(path, json + "\n") {
        tracing::warn!(
            "nvml stand-in: writing the call counts to {}: {e}",
            path.display()
        );
    }
}
