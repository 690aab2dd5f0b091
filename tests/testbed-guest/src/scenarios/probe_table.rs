//! probe-table: with the RDMA modules loaded, `railscope probes` shows the IB event probe
//! attached, and every program passes the guest kernel's verifier.

use anyhow::ensure;

use crate::guest;

pub(super) fn run() -> anyhow::Result<()> {
    super::ensure_rdma_modules()?;
    let table = guest::run("/usr/bin/railscope", &["probes", "--verify"])?;
    let row = table
        .lines()
        .find(|l| l.starts_with("ib_dispatch_event"))
        .unwrap_or_default();
    ensure!(
        row.contains("kprobe:ib_dispatch_event")
            && row.split_whitespace().last() == Some("attached")
            && !row.contains("unavailable"),
        "ib_dispatch_event is not shown attached: {row:?}"
    );
    ensure!(
        table.contains("verifier: ib_dispatch_event accepted"),
        "no verifier verdict for ib_dispatch_event"
    );
    Ok(())
}
