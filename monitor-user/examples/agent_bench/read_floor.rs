//! The read floor: a process that does nothing but read a fixture tree's IB files, the way
//! the agent reads them (each file opened once and kept open, one `pread` per read, the
//! value parsed), with no sampling, encoding or sending. Its CPU is the least that any agent
//! reading those files that often can cost on this machine, so the bench can say how far a
//! CPU goal is from what reading alone allows.

use std::{
    fs,
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::Context as _;

/// Which of the tree's files are read.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum FileSet {
    /// Every file railscope's IB source reads: `counters/` and `hw_counters/` of each port,
    /// the device-level `hw_counters/`, and the port attributes.
    Railscope,
    /// node_exporter 1.5's: `counters/` of each port and the port attributes.
    NodeExporter,
}

const PORT_ATTRIBUTES: [&str; 4] = ["state", "phys_state", "rate", "link_layer"];

/// The files of `set` under `root` (the directory holding `class/infiniband`), sorted.
pub(crate) fn files(root: &Path, set: FileSet) -> anyhow::Result<Vec<PathBuf>> {
    let class = root.join("class/infiniband");
    let mut dirs = Vec::new();
    let mut files = Vec::new();
    for device in entries(&class)? {
        if matches!(set, FileSet::Railscope) {
            dirs.push(device.join("hw_counters"));
        }
        for port in entries(&device.join("ports"))? {
            dirs.push(port.join("counters"));
            if matches!(set, FileSet::Railscope) {
                dirs.push(port.join("hw_counters"));
            }
            files.extend(PORT_ATTRIBUTES.iter().map(|a| port.join(a)));
        }
    }
    for dir in dirs {
        files.extend(entries(&dir)?);
    }
    files.sort();
    Ok(files)
}

fn entries(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .with_context(|| format!("listing {}", dir.display()))?;
    out.sort();
    Ok(out)
}

/// Reads a `1/every` share of `set`'s files every `interval`, rotating, so that each file is
/// read once every `every` intervals; prints one JSON line when ready, then runs until killed.
pub(crate) fn run(root: &Path, set: FileSet, interval: f64, every: usize) -> anyhow::Result<()> {
    let paths = files(root, set)?;
    let open: Vec<fs::File> = paths
        .iter()
        .map(|p| fs::File::open(p).with_context(|| format!("opening {}", p.display())))
        .collect::<Result<_, _>>()?;
    let every = every.max(1);
    println!(
        "{}",
        serde_json::json!({"ready": true, "files": open.len(), "reads_per_interval": open.len().div_ceil(every)})
    );
    let period = Duration::from_secs_f64(interval);
    let start = Instant::now();
    let mut buf = [0u8; 64];
    let mut checksum = 0u64;
    for tick in 0u32.. {
        for (i, file) in open.iter().enumerate() {
            if !(i + tick as usize).is_multiple_of(every) {
                continue;
            }
            let n = file.read_at(&mut buf, 0).unwrap_or(0);
            checksum = checksum.wrapping_add(leading_integer(&buf[..n]));
        }
        std::hint::black_box(checksum);
        std::thread::sleep((start + period * (tick + 1)).saturating_duration_since(Instant::now()));
    }
    Ok(())
}

/// The decimal number a sysfs file starts with (`1234\n`, `4: ACTIVE`, `400 Gb/sec (4X NDR)`).
fn leading_integer(text: &[u8]) -> u64 {
    text.iter()
        .take_while(|b| b.is_ascii_digit())
        .fold(0u64, |acc, b| {
            acc.wrapping_mul(10).wrapping_add(u64::from(b - b'0'))
        })
}
