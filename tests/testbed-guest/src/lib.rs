//! railscope's soft-RoCE test bed, guest side.
//!
//! `cargo xtask vm-test` boots a stock Debian kernel in QEMU with
//! `railscope-guest-init` as `/init`. The init mounts the kernel's filesystems and runs the
//! [`scenarios`] named on the kernel command line against the real rdma_rxe driver, rdma-core
//! and perftest, printing a verdict line per scenario on the serial console.
//!
//! The same binary is also the scenarios' own verbs program: run as `/init cq-overflow ...`
//! (not as PID 1) it is [`cq_overflow`], which drives libibverbs through [`ibverbs`]; run as
//! `/init iwarp-errors ...` it is [`iwarp_errors`], over siw through [`rdmacm`] too.

pub mod capabilities;
pub mod cq_overflow;
pub mod guest;
pub mod http;
pub mod ibverbs;
pub mod iwarp_errors;
pub mod rdmacm;
pub mod scenarios;
