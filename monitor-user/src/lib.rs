//! railscope's node agent as a library: the `railscope` binary is a thin CLI over it, and the
//! integration tests drive the same code.
//!
//! - `btf`: reads the running kernel's type information, so no struct offset is hard-coded.
//! - [`jobs`]: which job a cgroup belongs to (Slurm, Kubernetes, systemd, configured patterns).
//! - [`kernel`]: what the running kernel offers (modules, kprobes).
//! - [`time_base`]: one conversion from CLOCK_MONOTONIC to wall-clock time for everything.
//! - [`probes`]: the probe catalogue, loading and attaching the eBPF object, draining and
//!   decoding what the probes send.
//! - [`sources`]: polled sources (IB sysfs counters, NVML GPU metrics) producing
//!   [`monitor_wire::Reading`]s.
//! - the crate `monitor_sampler` (`monitor-sampler/`): Moneo-style adaptive sampling of
//!   those readings.
//! - [`sender`]: the UDP sender; a bounded queue that never blocks sampling.
//! - `clock_exchange`: the node's clock offset from its collector's, from the
//!   acknowledgements' round trips.
//! - [`listen`]: `railscope listen`, prints decoded frames.
//! - [`replay`]: `railscope replay`, a capture file's frames sent to a collector.
//! - [`pipeline`]: sources -> sampler -> encoder -> sender, for `agent --collector`.
//! - [`agent`]: the daemon's loop that keeps probes attached and prints what they see.
//! - [`capture`]: `railscope capture`, the flight recorder of IB port events and counters.
//! - [`privileges`]: the capabilities the agent keeps, every other one dropped.
//! - [`settings`]: `railscope agent`'s flags and `/etc/railscope/agent.toml`, one struct.
//! - [`topology`]: `railscope topology`, the node's GPU–NIC tree and distances.
//!
//! The series model and the frame format (encoder, decoder, receiver state) are the crate
//! `monitor_wire` (`monitor-wire/`), which `railscope listen` and the collector share.

pub mod agent;
mod btf;
pub mod capture;
mod cgroup;
mod clock_exchange;
pub mod jobs;
pub mod kernel;
pub mod listen;
pub mod pipeline;
pub mod privileges;
pub mod probes;
pub mod replay;
pub mod sender;
pub mod settings;
pub mod sources;
pub mod spool;
mod spool_file;
mod stop_signals;
pub mod time_base;
pub mod topology;
mod tracefs;
