//! The test bed's scenarios, one module per feature, each proving railscope against the real
//! soft-RoCE stack inside the guest. A scenario returns `Err` with the reason it failed.

mod agent_frames;
mod async_errors;
mod attach_pace;
mod bench_events;
mod bench_probes;
mod capture_down_at_start;
mod capture_flap;
mod cgroups_late;
mod clock_step;
mod cm_ids;
mod cm_wildcard;
mod collector_away;
mod demo;
mod device_reuse;
mod hook_trace;
mod host_collector;
mod ib_core_btf;
mod job_labels;
mod kernel_facts;
mod least_privilege;
mod lossy_link;
mod pcie_topology;
mod perftest;
mod port_events;
mod probe_table;
mod qp_errors;
mod rdma_cm;
mod ring_overflow;
mod siw_async_errors;
mod slurm_drain;
mod soak;
mod verbs;

/// Runs the scenario called `name`.
pub fn run(name: &str) -> anyhow::Result<()> {
    match name {
        "port-events" => port_events::run(),
        "ib-core-btf" => ib_core_btf::run(),
        "probe-table" => probe_table::run(),
        "kernel-facts" => kernel_facts::run(),
        "verbs" => verbs::run(),
        "hook-trace" => hook_trace::run(),
        "bench-probes" => bench_probes::run(),
        "qp-errors" => qp_errors::run(),
        "async-errors" => async_errors::run(),
        "siw-async-errors" => siw_async_errors::run(),
        "agent-frames" => agent_frames::run(),
        "job-labels" => job_labels::run(),
        "host-collector" => host_collector::run(),
        "collector-away" => collector_away::run(),
        "slurm-drain" => slurm_drain::run(),
        "lossy-link" => lossy_link::run(),
        "perftest" => perftest::run(),
        "capture-flap" => capture_flap::run(),
        "capture-down-at-start" => capture_down_at_start::run(),
        "rdma-cm" => rdma_cm::run(),
        "cm-ids" => cm_ids::run(),
        "cm-wildcard" => cm_wildcard::run(),
        "cgroups-late" => cgroups_late::run(),
        "attach-pace" => attach_pace::run(),
        "clock-step" => clock_step::run(),
        "bench-events" => bench_events::run(),
        "device-reuse" => device_reuse::run(),
        "soak" => soak::run(),
        "demo" => demo::run(),
        "least-privilege" => least_privilege::run(),
        "ring-overflow" => ring_overflow::run(),
        "pcie-topology" => pcie_topology::run(),
        other => anyhow::bail!("unknown scenario {other:?}"),
    }
}

/// Loads the RDMA modules unless an earlier scenario of this boot already did.
fn ensure_rdma_modules() -> anyhow::Result<()> {
    if std::path::Path::new("/sys/module/rdma_rxe").is_dir() {
        return Ok(());
    }
    crate::guest::load_rdma_modules()
}
