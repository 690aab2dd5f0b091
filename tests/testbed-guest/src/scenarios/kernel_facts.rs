//! kernel-facts (run on request, never by default): prints what the guest kernel offers the
//! probes — RDMA tracepoints and their formats, the probe-able ib_core/ib_uverbs functions —
//! to check hooks against a new kernel line. Always passes once it has printed.

use crate::guest;

const FUNCTIONS: &[&str] = &[
    "ib_dispatch_event",
    "rdma_restrack_add",
    "rdma_restrack_del",
    "ib_create_qp_user",
    "ib_destroy_qp_user",
    "ib_modify_qp_with_udata",
    "ib_dereg_mr_user",
    "ib_destroy_cq_user",
    "ib_dealloc_pd_user",
    "ib_uverbs_post_send",
    "ib_uverbs_qp_event_handler",
    "ib_uverbs_cq_event_handler",
    "ib_uverbs_async_handler",
    "ib_uverbs_handler_UVERBS_METHOD_REG_DMABUF_MR",
    "ib_uverbs_reg_mr",
    "ib_uverbs_handler_UVERBS_METHOD_CQ_CREATE",
    "ib_uverbs_create_cq",
    "ib_uverbs_alloc_pd",
    "ib_uverbs_handler_UVERBS_METHOD_QP_CREATE",
];

pub(super) fn run() -> anyhow::Result<()> {
    super::ensure_rdma_modules()?;
    let available = std::fs::read_to_string("/sys/kernel/tracing/available_filter_functions")
        .unwrap_or_default();
    for f in FUNCTIONS {
        let found = available
            .lines()
            .find(|l| l.split_whitespace().next() == Some(f))
            .unwrap_or("ABSENT");
        println!("function {f}: {found}");
    }
    for system in ["rdma_core", "rdma_cma", "ib_cma", "ib_mad", "ib_umad"] {
        let dir = format!("/sys/kernel/tracing/events/{system}");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            println!("tracepoints {system}: ABSENT");
            continue;
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n != "enable" && n != "filter")
            .collect();
        names.sort();
        println!("tracepoints {system}: {}", names.join(" "));
        for name in names {
            if let Ok(format) = std::fs::read_to_string(format!("{dir}/{name}/format")) {
                let fields: Vec<&str> = format
                    .lines()
                    .filter(|l| l.trim_start().starts_with("field:") && !l.contains("common_"))
                    .map(str::trim)
                    .collect();
                println!("  {system}:{name}: {}", fields.join(" "));
            }
        }
    }
    let _ = guest::run("/bin/ls", &["/sys/kernel/btf"]);
    Ok(())
}
