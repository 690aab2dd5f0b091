//! The progress lines every command prints (`==> ...`), in one place below the commands.

/// Prints a progress line.
pub fn step(what: &str) {
    eprintln!("==> {what}");
}
