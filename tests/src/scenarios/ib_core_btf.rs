//! ib-core-btf: the agent's BTF resolver, unit-tested against the real split BTF of ib_core
//! (`/sys/kernel/btf/ib_core` on top of vmlinux), which only exists where ib_core is loaded.

use anyhow::ensure;

use crate::guest;

pub fn run() -> anyhow::Result<()> {
    super::ensure_rdma_modules()?;
    let out = guest::run(
        "/usr/bin/railscope-unit-tests",
        &[
            "--ignored",
            "--exact",
            "btf::tests::ib_core_ib_event_layout",
            "--nocapture",
        ],
    )?;
    ensure!(out.contains("1 passed"), "the ib_core BTF test did not run");
    Ok(())
}
