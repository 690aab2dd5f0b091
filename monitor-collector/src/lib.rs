//! railscope's collector: where a fleet's frames land, stay and are read back. It runs
//! unprivileged on an ordinary server, one per few thousand nodes. It shares only the wire
//! format (`railscope_wire`) with the node agent: the agent never links what only the
//! collector needs, and the collector links no eBPF or NVML.
//!
//! The data's way through the crate:
//! - [`archive`]: every accepted frame, appended to segment files with a per-node time
//!   index; what queries and remote-write read back.
//! - [`remote_write`]: the archive's samples to Prometheus-compatible TSDBs (remote-write
//!   v1), each endpoint following the archive from its own persisted cursor.

pub mod archive;
pub mod remote_write;
