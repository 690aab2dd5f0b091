//! Embeds the dashboard's charting library, dygraphs, taken from Debian's `libjs-dygraphs`
//! package at build time (`cargo xtask setup` installs it): the collector serves it from its
//! binary, so the dashboard works on an air-gapped cluster, and no copy of another project's
//! file is kept in this repository. `RAILSCOPE_DYGRAPHS_DIR` names another directory holding
//! `dygraph.min.js` and `dygraph.min.css` (e.g. from the npm package's `dist/`).

use std::path::PathBuf;

const DEFAULT_DIR: &str = "/usr/share/javascript/dygraphs";
const FILES: [&str; 2] = ["dygraph.min.js", "dygraph.min.css"];

fn main() {
    println!("cargo:rerun-if-env-changed=RAILSCOPE_DYGRAPHS_DIR");
    let dir = std::env::var_os("RAILSCOPE_DYGRAPHS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DIR));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    for file in FILES {
        let from = dir.join(file);
        println!("cargo:rerun-if-changed={}", from.display());
        if let Err(e) = std::fs::copy(&from, out.join(file)) {
            eprintln!(
                "error: the dashboard's charting library {} is missing ({e}): install Debian's \
                 libjs-dygraphs (`cargo xtask setup` does), or set RAILSCOPE_DYGRAPHS_DIR to a \
                 directory holding dygraph.min.js and dygraph.min.css",
                from.display()
            );
            std::process::exit(1);
        }
    }
}
