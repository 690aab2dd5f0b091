//! What railscope's two daemons share as services: their configuration files
//! (`/etc/railscope/agent.toml` and `collector.toml`) and their notifications to systemd.
//!
//! A command's settings are one serde + clap struct (each binary keeps its own), so a key of
//! the file and a flag of the command line are the same name and cannot drift apart. The
//! settings are layered: built-in defaults, then the file, then the flags given.
//!
//! - `file` ([`ConfigFile`], [`ConfigError`]): reading a file and errors that name the file,
//!   line, column and key.
//! - [`layers`]: the defaults < file < flags layering, and which layer set a key.
//! - `values` ([`Age`], [`Seconds`]): value types shared by both binaries, checked when
//!   parsed (so a bad value in the file is reported at its line, and on the command line by
//!   its flag).
//! - `service` ([`ServiceManager`]): `Type=notify` readiness, watchdog pings and stopping,
//!   for systemd.

mod file;
pub mod layers;
mod service;
mod values;

pub use file::{ConfigError, ConfigFile};
pub use layers::{Layered, Sources};
pub use service::ServiceManager;
pub use values::{Age, Seconds};
