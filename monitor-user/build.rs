//! Builds the eBPF probes (`monitor-ebpf`) with the nightly toolchain and bpf-linker, through
//! aya-build, so the `railscope` binary can embed the object. `cargo xtask setup` installs both.
//!
//! aya-build relays every line the nested cargo prints on stderr as a `cargo:warning`, so a
//! clean build used to show some fifty "warning: monitor-user@...: Compiling core ..." lines
//! that were only progress. The nested cargo runs quiet instead: its status lines are gone,
//! while rustc's diagnostics (which aya-build reads from the JSON messages on stdout) and any
//! error still come through as before. A build that goes well prints nothing (issue 30: the
//! one "eBPF probes built" line left was a warning on every build of the agent).

use anyhow::{Context as _, anyhow, bail};
use aya_build::Toolchain;

const EBPF_PACKAGE: &str = "monitor-ebpf";
/// The eBPF object, the package's binary (`include_bytes_aligned!` in `probes` reads it).
const EBPF_OBJECT: &str = "railscope-probes";

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=PATH");
    if std::env::var_os("CARGO_CFG_FUZZING").is_some() {
        // Built by cargo-fuzz (`cfg(fuzzing)`): the fuzz targets read configurations, sysfs
        // values and NVML scripts and never load the probes, so their object is left empty
        // rather than built with the nightly toolchain for the bpf target (a minute or two
        // of CI's 2 cores).
        let out_dir =
            std::path::PathBuf::from(std::env::var_os("OUT_DIR").context("OUT_DIR not set")?);
        std::fs::write(out_dir.join(EBPF_OBJECT), b"")
            .context("writing the fuzz build's empty eBPF object")?;
        return Ok(());
    }
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
    // SAFETY: the build script is single-threaded here; the nested cargo inherits these.
    unsafe {
        std::env::set_var("CARGO_TERM_QUIET", "true");
        std::env::set_var("CARGO_TERM_PROGRESS_WHEN", "never");
    }
    aya_build::build_ebpf(
        [aya_build::Package {
            name: EBPF_PACKAGE,
            root_dir: root_dir.as_str(),
            ..Default::default()
        }],
        Toolchain::default(),
    )?;
    let out_dir = std::path::PathBuf::from(std::env::var_os("OUT_DIR").context("OUT_DIR not set")?);
    let object = out_dir.join(EBPF_OBJECT);
    let size = std::fs::metadata(&object)
        .with_context(|| format!("the eBPF object {} was not built", object.display()))?
        .len();
    // Not a `cargo:warning` (which cargo shows as "warning: monitor-user@...": on every build
    // of the agent, for a build that went well): a plain line, kept in the build script's
    // output file and shown by `cargo build -vv`.
    println!(
        "eBPF probes built: {EBPF_OBJECT} from {EBPF_PACKAGE} ({} KiB, nightly + bpf-linker)",
        size.div_ceil(1024)
    );
    Ok(())
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
        .unwrap_or(false)
}
