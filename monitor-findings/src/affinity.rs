//! GPU–NIC affinity per job (`nic_affinity`): for each job on a node, the GPUs its processes
//! use (the `job_id` its GPU series carry, from NVML's process lists) and the RDMA devices
//! its QPs were created on (the probes' `create_qp` counts of its cgroup,
//! `railscope_rdma_verbs_total{verb="create_qp", job_id}`), against the node's hardware
//! path ([`super::hardware`]). A job whose GPU drives a NIC farther away on the PCIe tree
//! while the NIC nearest that GPU carries no QP of any job is a finding: its traffic crosses
//! the CPU (or the sockets) where it could turn round inside the GPU's own switch. NCCL
//! picks NICs by this distance when it sees the topology; a wrong `NCCL_IB_HCA`, a container
//! that hides devices or a mis-set `CUDA_VISIBLE_DEVICES` defeat it.
//!
//! Nothing else knows both halves: NVML knows the GPU's processes, not their QPs; the
//! fabric sees the NIC's traffic, not whose it is.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
};

use monitor_wire::{names::metric, pci::Distance};
use serde_json::json;

use super::{
    Observation, Severity, Subject, hardware::NodeHardware, verdicts::Verdicts, view::GpuJobs,
    view::View,
};

pub(crate) const RULES: &[&str] = &["nic_affinity"];

/// What the rule reads: the QPs' devices, the GPUs' jobs (the `job_id` of their series; the
/// engine notes it from any GPU series it watches, utilization always among them) and the
/// places of GPUs and NICs.
pub(crate) const SERIES: &[&str] = &[
    metric::RDMA_VERBS_TOTAL,
    metric::GPU_UTILIZATION_RATIO,
    metric::GPU_PCI_INFO,
    metric::RDMA_DEVICE_INFO,
];

/// The verb whose count says a QP was created on a device.
const CREATE_QP: &str = "create_qp";

/// Per node: device → (jobs with QPs on it, when the first was counted).
type QpsByDevice = HashMap<Arc<str>, BTreeMap<String, (BTreeSet<String>, u64)>>;

/// The devices each job on each node created QPs on.
fn qps_by_device(view: &View) -> QpsByDevice {
    let mut out: QpsByDevice = HashMap::new();
    for ((node, series), track) in view.named(metric::RDMA_VERBS_TOTAL) {
        let labels = &series.labels;
        if labels.get("verb") != Some(CREATE_QP) || track.counter().unwrap_or(0) == 0 {
            continue;
        }
        let (Some(device), Some(job)) = (labels.get("device"), labels.get("job_id")) else {
            continue;
        };
        let entry = out
            .entry(node.clone())
            .or_default()
            .entry(device.to_owned())
            .or_insert_with(|| (BTreeSet::new(), track.latest.unix_ns));
        entry.0.insert(job.to_owned());
        entry.1 = entry.1.min(track.latest.unix_ns);
    }
    out
}

/// Evaluates the rule on every node whose hardware path is known.
pub(crate) fn evaluate(
    view: &View,
    gpu_jobs: &GpuJobs,
    hardware: &HashMap<Arc<str>, Arc<NodeHardware>>,
    out: &mut Verdicts,
) {
    // A node whose hardware path and GPUs' jobs are known is judged whole: with no QP counted
    // on it, no job drives a far NIC.
    for node in hardware.keys() {
        if gpu_jobs.contains_key(node) {
            out.judged_node(RULES[0], node);
        }
    }
    let qps = qps_by_device(view);
    for (node, devices) in &qps {
        let (Some(hw), Some(gpu_jobs)) = (hardware.get(node), gpu_jobs.get(node)) else {
            continue;
        };
        evaluate_node(node, hw, gpu_jobs, devices, out);
    }
}

fn evaluate_node(
    node: &str,
    hw: &NodeHardware,
    gpu_jobs: &HashMap<String, String>,
    devices: &BTreeMap<String, (BTreeSet<String>, u64)>,
    out: &mut Verdicts,
) {
    let distances = hw.distances();
    let nic = |i: usize| hw.rdma[i].device.as_str();
    for (row, gpu) in hw.gpus.iter().enumerate() {
        let Some(job) = gpu_jobs.get(&gpu.gpu) else {
            continue;
        };
        let Some(to) = distances.get(row).filter(|d| !d.is_empty()) else {
            continue;
        };
        // The job's NICs, nearest to this GPU first.
        let mut used: Vec<(Distance, usize, u64)> = (0..hw.rdma.len())
            .filter_map(|i| {
                let (jobs, since) = devices.get(nic(i))?;
                jobs.contains(job).then_some((to[i], i, *since))
            })
            .collect();
        used.sort();
        let Some(&(used_distance, used_nic, since)) = used.first() else {
            continue;
        };
        let nearest = to.iter().copied().min().expect("not empty");
        // Judged on known places only: an unknown one would read as the sockets' link.
        if used_distance <= nearest || !used_distance.is_known() || !nearest.is_known() {
            continue;
        }
        // A NIC at the nearest distance that no job has a QP on: the one it should use.
        let Some(idle) =
            (0..hw.rdma.len()).find(|&i| to[i] == nearest && !devices.contains_key(nic(i)))
        else {
            continue;
        };
        out.push(Observation {
            rule: "nic_affinity",
            severity: Severity::Warning,
            subject: Subject::gpu(node, &gpu.gpu),
            job_id: Some(job.clone()),
            at_ns: since,
            summary: format!(
                "job {job} drives {} from GPU {} ({used_distance}) while {} ({nearest}) is idle",
                nic(used_nic),
                gpu.gpu,
                nic(idle)
            ),
            evidence: json!({
                "job_id": job,
                "gpu": gpu.gpu,
                "gpu_pci": gpu.pci,
                "uses": nic(used_nic),
                "uses_distance": used_distance.as_str(),
                "should_use": nic(idle),
                "should_use_distance": nearest.as_str(),
                "job_nics": used.iter().map(|&(_, i, _)| nic(i)).collect::<Vec<_>>(),
            }),
        });
    }
}
