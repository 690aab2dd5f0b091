//! What a batch of readings costs on the wire, encoded exactly as the agent would: for
//! benchmarks and the size tests.

use std::time::Duration;

use crate::{
    encoder::{EncoderConfig, FrameEncoder},
    error::WireError,
    key::Key,
    series::Reading,
};

/// What a batch of readings costs on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WireCost {
    /// Samples sent (one per reading).
    pub samples: u64,
    pub frames: u64,
    /// All bytes of all frames: headers, schema, samples, MACs.
    pub bytes: u64,
    /// Of those, the schema sections (sent for new series and every `schema_refresh`).
    pub schema_bytes: u64,
    pub largest_frame: usize,
}

impl WireCost {
    pub fn bytes_per_sample(&self) -> f64 {
        self.bytes as f64 / self.samples.max(1) as f64
    }

    /// Steady state, once the receiver knows the series (schema refreshes excluded).
    pub fn bytes_per_sample_without_schema(&self) -> f64 {
        (self.bytes - self.schema_bytes) as f64 / self.samples.max(1) as f64
    }
}

/// Encodes `readings` as an agent would, flushing every `flush_every` of reading time (from
/// the earliest reading; `Duration::MAX` for one flush at the end), and reports the cost.
/// For benchmarks: the frames themselves are discarded.
pub fn measure(
    readings: &[Reading],
    config: EncoderConfig,
    flush_every: Duration,
) -> Result<WireCost, WireError> {
    measure_with(readings, config, flush_every, |_| {})
}

/// [`measure`], handing each frame to `on_frame` in the order it would be sent.
pub fn measure_with(
    readings: &[Reading],
    config: EncoderConfig,
    flush_every: Duration,
    mut on_frame: impl FnMut(&[u8]),
) -> Result<WireCost, WireError> {
    let mut encoder = FrameEncoder::new(config, Key::from_bytes([0; 32]))?;
    let mut sorted: Vec<&Reading> = readings.iter().collect();
    sorted.sort_by_key(|r| r.unix_ns);
    let every = u64::try_from(flush_every.as_nanos())
        .unwrap_or(u64::MAX)
        .max(1);
    let mut boundary = sorted
        .first()
        .map_or(0, |r| r.unix_ns)
        .saturating_add(every);
    let mut largest = 0;
    let mut emit = |frames: Vec<Vec<u8>>| {
        for frame in &frames {
            largest = largest.max(frame.len());
            on_frame(frame);
        }
    };
    for r in sorted {
        while r.unix_ns >= boundary && boundary != u64::MAX {
            emit(encoder.flush(boundary));
            boundary = boundary.saturating_add(every);
        }
        encoder.push_reading(r)?;
    }
    emit(encoder.flush(boundary));
    let stats = encoder.stats();
    Ok(WireCost {
        samples: stats.samples,
        frames: stats.frames,
        bytes: stats.bytes,
        schema_bytes: stats.schema_bytes,
        largest_frame: largest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{frame::DEFAULT_MTU, testing::node_batch};

    #[test]
    fn realistic_node_costs_at_most_two_bytes_per_sample() {
        // 10 one-second sweeps of 8 GPUs x 40 gauges and 8 ports x 50 counters, flushed once:
        // everything counted, headers, MACs and the first schema included.
        let readings = node_batch(10);
        assert_eq!(readings.len(), 7200);
        let config = EncoderConfig::new("gpu-node-017");
        let cost = measure(&readings, config, Duration::from_secs(10)).unwrap();
        assert_eq!(cost.samples, 7200);
        assert!(cost.largest_frame <= DEFAULT_MTU);
        assert!(cost.schema_bytes > 0);
        assert!(
            cost.bytes_per_sample() <= 2.0,
            "{cost:?}: {:.3} bytes/sample",
            cost.bytes_per_sample()
        );
        // Once the collector knows the series, samples alone cost well under that.
        assert!(
            cost.bytes_per_sample_without_schema() <= 1.6,
            "{cost:?}: {:.3} bytes/sample without schema",
            cost.bytes_per_sample_without_schema()
        );
    }
}
