//! Polled sources: each reads what the kernel or a library exposes and hands each value, with
//! its series, to a [`ReadingSink`] (the agent's sampler), or returns
//! [`Reading`]s for tests and benchmarks.

pub mod ethtool;
pub mod hwpath;
pub mod ib_sysfs;
pub mod lldp;

pub mod gpu;

use monitor_sampler::Slot;
use monitor_wire::{Reading, Series, Value};

/// Where the values of a sweep go, and which series it reads: the agent hands them straight
/// to its sampler, so no reading is built for a value the sampler only folds into a window.
///
/// Each series comes with its [`Slot`], kept by the source for as long as it reads the
/// series, for the sink's sampler to find the series' state without hashing it.
pub trait ReadingSink {
    /// Whether to read `series` in this sweep.
    fn due(&mut self, series: &Series, slot: &mut Slot) -> bool;
    /// A value read.
    fn reading(&mut self, series: &Series, slot: &mut Slot, value: Value);
}

/// A sink that keeps every value as a [`Reading`] (what the sources' `read` methods return).
struct Collect<'a, F> {
    out: &'a mut Vec<Reading>,
    unix_ns: u64,
    due: F,
}

impl<'a, F: FnMut(&Series) -> bool> Collect<'a, F> {
    fn new(out: &'a mut Vec<Reading>, unix_ns: u64, due: F) -> Self {
        Self { out, unix_ns, due }
    }
}

impl<F: FnMut(&Series) -> bool> ReadingSink for Collect<'_, F> {
    fn due(&mut self, series: &Series, _: &mut Slot) -> bool {
        (self.due)(series)
    }

    fn reading(&mut self, series: &Series, _: &mut Slot, value: Value) {
        self.out.push(Reading {
            series: series.clone(),
            value,
            unix_ns: self.unix_ns,
        });
    }
}
