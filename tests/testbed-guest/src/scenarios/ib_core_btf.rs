//! ib-core-btf: the agent's BTF reader and probe layouts, unit-tested against the real split
//! BTF of ib_core, ib_uverbs and rdma_cm (`/sys/kernel/btf/<module>` on top of vmlinux),
//! which only exists where those modules are loaded; and the IB sysfs source on the real
//! rxe devices. Also the BTF reader's own tests on this kernel's vmlinux (cuts, bit flips):
//! they must hold on every kernel, not only the host's.

use anyhow::ensure;

use crate::guest;

pub(super) fn run() -> anyhow::Result<()> {
    super::ensure_rdma_modules()?;
    guest::ensure_rxe_pair()?;
    // The agent's tests that need the real modules are `#[ignore]`d on the host and carry
    // `ib_core` in their names: the BTF reader on ib_core's split BTF, every probe layout
    // resolving all the globals its programs read, and the sysfs source on real rxe devices.
    let out = guest::run(
        "/usr/bin/railscope-unit-tests",
        &["--ignored", "ib_core", "--nocapture"],
    )?;
    ensure!(
        out.contains("test result: ok. 3 passed"),
        "expected the 3 ib_core tests to run and pass"
    );
    let out = guest::run("/usr/bin/railscope-unit-tests", &["btf::tests::"])?;
    ensure!(
        out.contains("truncations_and_bit_flips_never_panic ... ok")
            && out.contains("test result: ok.")
            && out.contains(" 0 failed"),
        "the BTF reader's tests on this kernel's vmlinux: {}",
        out.lines()
            .rev()
            .find(|l| l.contains("test result"))
            .unwrap_or("no result")
    );
    Ok(())
}
