//! A fixture node's InfiniBand sysfs tree whose counters move: 8 mlx5-like devices with one
//! NDR port each (`class/infiniband/mlx5_<n>/ports/1/{counters,hw_counters}`, device-level
//! `hw_counters`, the port attributes, and the device files node_exporter requires:
//! `fw_ver`, `board_id`, `hca_type`).
//!
//! Counter files are modelled on the repository's mlx5 fixture: per port about 10 *fast*
//! counters (data, packets, RDMA requests, transmit wait) that grow at training rates whose
//! level changes from second to second by up to ±20 %, about 10 *slow* error and management
//! counters that tick now and then, and the rest constant. [`Fixture::advance`] moves the
//! model on by a time step and rewrites the files that changed in place, as sysfs changes a
//! file's contents but never the file: a reader that keeps a counter file open and reads it
//! again from offset 0 sees each new value. Counter values are written right-aligned in 20
//! characters with one `pwrite` at offset 0, so a file's length never changes and a reader
//! never sees it empty or cut (node_exporter and railscope both trim the spaces; a zero
//! padding would not do: node_exporter reads a leading 0 as octal).

use std::{
    fs,
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
};

use crate::Rng;

/// How a counter file moves.
#[derive(Clone, Copy, Debug)]
enum Motion {
    Constant,
    /// Grows by about `per_s` a second, times the port's traffic level.
    Fast {
        per_s: f64,
    },
    /// Ticks by one now and then: `per_s` events a second on average.
    Slow {
        per_s: f64,
    },
}

struct File {
    path: PathBuf,
    /// Opened at the first rewrite.
    handle: Option<fs::File>,
    value: u64,
    motion: Motion,
    /// Index of the port whose traffic level drives a fast counter.
    port: usize,
}

/// The tree and its model. Time is the model's own (seconds since the fixture was created),
/// so the same fixture serves a real-time writer and a simulated sweep.
pub(crate) struct Fixture {
    root: PathBuf,
    files: Vec<File>,
    devices: usize,
    rng: Rng,
    seed: u64,
    writes: u64,
    now_s: f64,
}

/// Per port counters (`ports/1/counters/`): name, motion, starting value.
const PORT_COUNTERS: &[(&str, Motion, u64)] = &[
    ("VL15_dropped", Motion::Constant, 0),
    ("excessive_buffer_overrun_errors", Motion::Constant, 0),
    ("link_downed", Motion::Constant, 1),
    ("link_error_recovery", Motion::Constant, 0),
    ("local_link_integrity_errors", Motion::Constant, 0),
    ("multicast_rcv_packets", Motion::Slow { per_s: 0.5 }, 6532),
    ("multicast_xmit_packets", Motion::Slow { per_s: 0.5 }, 6532),
    ("port_rcv_constraint_errors", Motion::Constant, 0),
    // 4-byte words: 18 GB/s on a 50 GB/s NDR port.
    (
        "port_rcv_data",
        Motion::Fast { per_s: 4.5e9 },
        887_654_321_098,
    ),
    ("port_rcv_errors", Motion::Slow { per_s: 0.002 }, 0),
    (
        "port_rcv_packets",
        Motion::Fast { per_s: 4.4e6 },
        3_321_098_765,
    ),
    ("port_rcv_remote_physical_errors", Motion::Constant, 0),
    ("port_rcv_switch_relay_errors", Motion::Constant, 0),
    ("port_xmit_constraint_errors", Motion::Constant, 0),
    (
        "port_xmit_data",
        Motion::Fast { per_s: 4.5e9 },
        912_345_678_901,
    ),
    ("port_xmit_discards", Motion::Slow { per_s: 0.01 }, 12),
    (
        "port_xmit_packets",
        Motion::Fast { per_s: 4.4e6 },
        3_419_876_543,
    ),
    ("port_xmit_wait", Motion::Fast { per_s: 2.0e5 }, 48_102_937),
    ("symbol_error", Motion::Slow { per_s: 0.005 }, 3),
    (
        "unicast_rcv_packets",
        Motion::Fast { per_s: 4.4e6 },
        3_321_092_233,
    ),
    (
        "unicast_xmit_packets",
        Motion::Fast { per_s: 4.4e6 },
        3_419_870_011,
    ),
];

/// Per port driver counters (`ports/1/hw_counters/`).
const PORT_HW_COUNTERS: &[(&str, Motion, u64)] = &[
    ("duplicate_request", Motion::Slow { per_s: 0.02 }, 0),
    ("implied_nak_seq_err", Motion::Slow { per_s: 0.005 }, 0),
    ("lifespan", Motion::Constant, 10),
    ("local_ack_timeout_err", Motion::Slow { per_s: 0.01 }, 2),
    ("out_of_buffer", Motion::Constant, 0),
    ("out_of_sequence", Motion::Slow { per_s: 0.05 }, 0),
    ("packet_seq_err", Motion::Slow { per_s: 0.01 }, 0),
    ("req_cqe_error", Motion::Constant, 0),
    ("req_cqe_flush_error", Motion::Constant, 0),
    ("req_remote_access_errors", Motion::Constant, 0),
    ("req_remote_invalid_request", Motion::Constant, 0),
    ("req_rnr_retries_exceeded", Motion::Constant, 0),
    ("req_transport_retries_exceeded", Motion::Constant, 0),
    ("resp_cqe_error", Motion::Constant, 0),
    ("resp_cqe_flush_error", Motion::Constant, 0),
    ("resp_local_length_error", Motion::Constant, 0),
    ("resp_remote_access_errors", Motion::Constant, 0),
    ("rnr_nak_retry_err", Motion::Constant, 0),
    ("rx_atomic_requests", Motion::Constant, 0),
    ("rx_dct_connect", Motion::Constant, 0),
    ("rx_read_requests", Motion::Fast { per_s: 2.0e4 }, 48_211),
    (
        "rx_write_requests",
        Motion::Fast { per_s: 2.0e5 },
        1_203_334,
    ),
];

/// Device-level driver counters (`hw_counters/`).
const DEVICE_HW_COUNTERS: &[(&str, Motion, u64)] = &[
    ("lifespan", Motion::Constant, 10),
    ("out_of_buffer", Motion::Slow { per_s: 0.02 }, 0),
    ("rx_atomic_requests", Motion::Constant, 0),
    ("rx_read_requests", Motion::Fast { per_s: 2.0e4 }, 48_211),
    (
        "rx_write_requests",
        Motion::Fast { per_s: 2.0e5 },
        1_203_334,
    ),
];

/// What the tree holds, for the report.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub(crate) struct Shape {
    pub devices: usize,
    pub ports: usize,
    pub counter_files: usize,
    pub fast: usize,
    pub slow: usize,
    pub constant: usize,
}

impl Fixture {
    /// Creates the tree under `root` (emptied first): `root/class/infiniband/...`.
    pub(crate) fn create(root: &Path, devices: usize, seed: u64) -> std::io::Result<Self> {
        if root.exists() {
            fs::remove_dir_all(root)?;
        }
        let mut rng = Rng::new(seed);
        let mut files = Vec::new();
        for d in 0..devices {
            let dev = root.join(format!("class/infiniband/mlx5_{d}"));
            let port = dev.join("ports/1");
            fs::create_dir_all(port.join("counters"))?;
            fs::create_dir_all(port.join("hw_counters"))?;
            fs::create_dir_all(dev.join("hw_counters"))?;
            for (name, text) in [
                ("fw_ver", "28.39.1002".to_string()),
                ("board_id", "MT_0000000838".into()),
                ("hca_type", "MT4129".into()),
                ("node_type", "1: CA".into()),
                (
                    "node_guid",
                    format!("a088:c203:00{:02x}:{:04x}", d, rng.below(0x10000)),
                ),
            ] {
                fs::write(dev.join(name), format!("{text}\n"))?;
            }
            for (name, text) in [
                ("state", "4: ACTIVE"),
                ("phys_state", "5: LinkUp"),
                ("rate", "400 Gb/sec (4X NDR)"),
                ("link_layer", "InfiniBand"),
            ] {
                fs::write(port.join(name), format!("{text}\n"))?;
            }
            for (dir, table) in [
                (port.join("counters"), PORT_COUNTERS),
                (port.join("hw_counters"), PORT_HW_COUNTERS),
                (dev.join("hw_counters"), DEVICE_HW_COUNTERS),
            ] {
                for &(name, motion, start) in table {
                    // Devices differ: the big counters start at different points.
                    let value = match motion {
                        Motion::Fast { .. } => start / 2 + rng.below(start.max(1)),
                        _ => start,
                    };
                    let path = dir.join(name);
                    fs::write(&path, counter_text(value))?;
                    files.push(File {
                        path,
                        handle: None,
                        value,
                        motion,
                        port: d,
                    });
                }
            }
        }
        Ok(Self {
            root: root.to_path_buf(),
            files,
            devices,
            rng,
            seed,
            writes: 0,
            now_s: 0.0,
        })
    }

    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    pub(crate) fn shape(&self) -> Shape {
        let count = |f: fn(&Motion) -> bool| self.files.iter().filter(|x| f(&x.motion)).count();
        Shape {
            devices: self.devices,
            ports: self.devices,
            counter_files: self.files.len(),
            fast: count(|m| matches!(m, Motion::Fast { .. })),
            slow: count(|m| matches!(m, Motion::Slow { .. })),
            constant: count(|m| matches!(m, Motion::Constant)),
        }
    }

    /// Files rewritten so far.
    pub(crate) fn writes(&self) -> u64 {
        self.writes
    }

    /// A port's traffic level at model time `t`: one value per second and port in
    /// [0.8, 1.2], so per-second rates vary by up to ±20 % as they do between training steps.
    fn level(&self, port: usize, t: f64) -> f64 {
        let second = t.max(0.0) as u64;
        let mut h = Rng::new(self.seed ^ ((port as u64) << 40) ^ second.wrapping_mul(0x9e37));
        0.8 + 0.4 * h.next_f64()
    }

    /// Moves the model on by `dt` seconds and rewrites the files whose value changed.
    pub(crate) fn advance(&mut self, dt: f64) -> std::io::Result<()> {
        let t = self.now_s + dt;
        let levels: Vec<f64> = (0..self.devices).map(|p| self.level(p, t)).collect();
        for i in 0..self.files.len() {
            let f = &self.files[i];
            let add = match f.motion {
                Motion::Constant => 0,
                Motion::Fast { per_s } => {
                    let noise = 1.0 + 0.05 * (2.0 * self.rng.next_f64() - 1.0);
                    (per_s * levels[f.port] * dt * noise).round() as u64
                }
                Motion::Slow { per_s } => {
                    u64::from(self.rng.next_f64() < per_s * dt) * (1 + self.rng.below(3))
                }
            };
            if add == 0 {
                continue;
            }
            self.files[i].value = self.files[i].value.wrapping_add(add);
            self.write(i)?;
        }
        self.now_s = t;
        Ok(())
    }

    fn write(&mut self, i: usize) -> std::io::Result<()> {
        self.writes += 1;
        let f = &mut self.files[i];
        let text = counter_text(f.value);
        let handle = match &mut f.handle {
            Some(h) => h,
            slot => slot.insert(fs::OpenOptions::new().write(true).open(&f.path)?),
        };
        handle.write_all_at(text.as_bytes(), 0)
    }
}

/// A counter file's contents: fixed width, so rewriting in place never changes the length.
fn counter_text(value: u64) -> String {
    format!("{value:>20}\n")
}
