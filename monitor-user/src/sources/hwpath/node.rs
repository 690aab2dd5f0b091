//! The node's class and software: kernel release, NVIDIA driver, and what the GPUs and RDMA
//! devices found make of it (their models and counts).

use super::{gpu::GpuPath, rdma::RdmaDevice};

/// The node as a whole.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeFacts {
    /// `uname -r`.
    pub kernel: String,
    /// NVIDIA's driver version (empty without NVML).
    pub driver: String,
    /// The GPUs' model names, distinct, sorted, joined by `,` (one on a uniform node).
    pub gpu_model: String,
    /// The RDMA devices' `hca_type`s, the same way.
    pub nic_model: String,
    /// GPUs NVML sees; `None` without NVML.
    pub gpus: Option<usize>,
    pub rdma_devices: usize,
    /// RDMA ports whose state is ACTIVE.
    pub active_ports: usize,
}

/// The running kernel's release (`uname -r`), empty if uname fails.
pub(super) fn kernel_release() -> String {
    // SAFETY: utsname is plain C data; uname fills it, NUL-terminating each field.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    if unsafe { libc::uname(&mut uts) } != 0 {
        return String::new();
    }
    // SAFETY: NUL-terminated by uname within the array.
    unsafe { std::ffi::CStr::from_ptr(uts.release.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// Distinct non-empty names, sorted, joined by `,`.
fn models<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let set: std::collections::BTreeSet<&str> = names.filter(|n| !n.is_empty()).collect();
    set.into_iter().collect::<Vec<_>>().join(",")
}

impl NodeFacts {
    /// The facts of a node with these GPUs (`None`: NVML off) and RDMA devices.
    pub fn of(driver: String, gpus: Option<&[GpuPath]>, rdma: &[RdmaDevice]) -> Self {
        Self {
            kernel: kernel_release(),
            driver,
            gpu_model: models(gpus.unwrap_or_default().iter().map(|g| g.model.as_str())),
            nic_model: models(rdma.iter().map(|d| d.hca_type.as_str())),
            gpus: gpus.map(<[GpuPath]>::len),
            rdma_devices: rdma.len(),
            active_ports: rdma
                .iter()
                .flat_map(|d| &d.ports)
                .filter(|p| p.is_active())
                .count(),
        }
    }
}
