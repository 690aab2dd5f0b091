//! Builds the eBPF probes (`monitor-ebpf`) with the nightly toolchain and bpf-linker, through
//! aya-build, so the `railscope` binary can embed the object. `cargo xtask setup` installs both.

use anyhow::{Context as _, anyhow, bail};
use aya_build::Toolchain;

const EBPF_PACKAGE: &str = "monitor-ebpf";

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=PATH");
    if std::env::var_os("AYA_BUILD_SKIP").is_none() && !on_path("bpf-linker") {
        bail!(
            "bpf-linker is not on PATH: the eBPF probes cannot be built. Run `cargo xtask setup` \
             (or any `cargo xtask` command), which builds it, and use `cargo xtask build`"
        );
    }
    let metadata = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let package = metadata
        .packages
        .into_iter()
        .find(|p| p.name.as_str() == EBPF_PACKAGE)
        .ok_or_else(|| anyhow!("package {EBPF_PACKAGE} not found in the workspace"))?;
    let root_dir = package
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("no parent for {}", package.manifest_path))?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: EBPF_PACKAGE,
            root_dir: root_dir.as_str(),
            ..Default::default()
        }],
        Toolchain::default(),
    )
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
        .unwrap_or(false)
}
