//! The progress lines every command prints (`==> ...`), in one place below the commands.

/// Prints a progress line.
pub(crate) fn step(what: &str) {
    eprintln!("==> {what}");
}
