//! ib-core-btf: the agent's BTF reader and probe layouts, unit-tested against the real split
//! BTF of ib_core, ib_uverbs and rdma_cm (`/sys/kernel/btf/<module>` on top of vmlinux),
//! which only exists where those modules are loaded.

use anyhow::ensure;

use crate::guest;

pub fn run() -> anyhow::Result<()> {
    super::ensure_rdma_modules()?;
    // The agent's tests that need the real modules are `#[ignore]`d on the host and carry
    // `ib_core` in their names: the BTF reader on ib_core's split BTF, and every probe
    // layout resolving all the globals its programs read.
    let out = guest::run(
        "/usr/bin/railscope-unit-tests",
        &["--ignored", "ib_core", "--nocapture"],
    )?;
    ensure!(
        out.contains("test result: ok. 2 passed"),
        "expected the 2 ib_core tests to run and pass"
    );
    Ok(())
}
