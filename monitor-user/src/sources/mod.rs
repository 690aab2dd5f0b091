//! Polled sources: each reads what the kernel or a library exposes and returns
//! [`Reading`](crate::metrics::Reading)s for the sampler.

pub mod ib_sysfs;

pub mod gpu;
