//! A GPU's series, built once and found again in sweep order: where the values of one
//! GPU's sweep go, each with its series and sampler slot.

use crate::sources::ReadingSink;
use monitor_sampler::Slot;
use monitor_wire::{Kind, Labels, Series, Value};

/// Where the values of one GPU's sweep go: to the sink, each with its series and slot from
/// the GPU's [`Gpu::series`].
pub(super) struct Out<'a> {
    pub(super) labels: &'a Labels,
    pub(super) series: &'a mut Vec<(Series, Slot)>,
    /// Where the next value's series should be in `series`: sweeps read in the same order,
    /// so it nearly always is, and a metric the GPU stopped giving only costs a search.
    pub(super) next: usize,
    pub(super) sink: &'a mut dyn ReadingSink,
}

impl Out<'_> {
    pub(super) fn push(&mut self, name: &str, kind: Kind, extra: &[(&str, &str)], value: Value) {
        let i = self.position(name, kind, extra);
        let (series, slot) = &mut self.series[i];
        self.sink.reading(series, slot, value);
        self.next = i + 1;
    }

    /// The index of the series `name{gpu labels, extra}` in `self.series`, added if new.
    pub(super) fn position(&mut self, name: &str, kind: Kind, extra: &[(&str, &str)]) -> usize {
        let base = self.labels.len();
        let is = |s: &Series| {
            &*s.name == name
                && s.kind == kind
                && s.labels.len() == base + extra.len()
                && extra.iter().all(|&(k, v)| s.labels.get(k) == Some(v))
        };
        if self.series.get(self.next).is_some_and(|(s, _)| is(s)) {
            return self.next;
        }
        if let Some(i) = self.series.iter().position(|(s, _)| is(s)) {
            return i;
        }
        let labels = if extra.is_empty() {
            self.labels.clone()
        } else {
            Labels::new(self.labels.iter().chain(extra.iter().copied()))
        };
        let series = Series {
            name: name.into(),
            labels,
            kind,
        };
        self.series.push((series, Slot::default()));
        self.series.len() - 1
    }

    pub(super) fn gauge(&mut self, name: &str, value: Value) {
        self.push(name, Kind::Gauge, &[], value);
    }

    pub(super) fn counter(&mut self, name: &str, value: Value) {
        self.push(name, Kind::Counter, &[], value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::gpu::gpu_labels;

    /// A sampler as the agent's sink has, and what each sweep handed on: (series, the slot
    /// it came with, value) per value.
    struct Seen<'s> {
        sampler: &'s mut monitor_sampler::AdaptiveSampler,
        now_ns: u64,
        values: Vec<(Series, Slot, Value)>,
    }

    impl ReadingSink for Seen<'_> {
        fn due(&mut self, _: &Series, _: &mut Slot) -> bool {
            true
        }

        fn reading(&mut self, series: &Series, slot: &mut Slot, value: Value) {
            self.values.push((series.clone(), *slot, value));
            self.sampler.observe_at(series, slot, value, self.now_ns);
        }
    }

    #[test]
    fn each_value_of_a_sweep_reaches_its_own_series_even_when_a_metric_goes_missing() {
        let labels = gpu_labels(0, "GPU-a");
        let mut sampler = monitor_sampler::AdaptiveSampler::new(Default::default());
        let mut series = Vec::new();
        let mut sweep = |series: &mut Vec<(Series, Slot)>, with_power: bool, now_ns: u64| {
            let mut seen = Seen {
                sampler: &mut sampler,
                now_ns,
                values: Vec::new(),
            };
            let mut out = Out {
                labels: &labels,
                series,
                next: 0,
                sink: &mut seen,
            };
            out.gauge("railscope_gpu_utilization_ratio", Value::F64(0.5));
            if with_power {
                out.gauge("railscope_gpu_power_watts", Value::F64(300.0));
            }
            out.push(
                "railscope_gpu_throttle_active",
                Kind::Gauge,
                &[("reason", "hw_slowdown")],
                Value::U64(1),
            );
            out.push(
                "railscope_gpu_throttle_active",
                Kind::Gauge,
                &[("reason", "sw_thermal")],
                Value::U64(0),
            );
            out.counter("railscope_gpu_energy_millijoules_total", Value::U64(9));
            seen.values
        };
        let first = sweep(&mut series, true, 1_000_000_000);
        let name_of = |s: &Series| format!("{}{}", s.name, s.labels);
        let names: Vec<String> = first.iter().map(|(s, _, _)| name_of(s)).collect();
        assert_eq!(
            names,
            [
                "railscope_gpu_utilization_ratio{gpu=\"0\",uuid=\"GPU-a\"}",
                "railscope_gpu_power_watts{gpu=\"0\",uuid=\"GPU-a\"}",
                "railscope_gpu_throttle_active{gpu=\"0\",reason=\"hw_slowdown\",uuid=\"GPU-a\"}",
                "railscope_gpu_throttle_active{gpu=\"0\",reason=\"sw_thermal\",uuid=\"GPU-a\"}",
                "railscope_gpu_energy_millijoules_total{gpu=\"0\",uuid=\"GPU-a\"}",
            ]
        );
        assert_eq!(first[4].0.kind, Kind::Counter);
        assert!(first.iter().all(|(_, slot, _)| *slot == Slot::default()));
        // The next sweep gives no power reading: every other value still goes to its own
        // series, with the slot the sampler gave it, and no series is added.
        let second = sweep(&mut series, false, 2_000_000_000);
        assert_eq!(series.len(), 5);
        let by_name: std::collections::HashMap<String, (Slot, Value)> = second
            .iter()
            .map(|(s, slot, v)| (name_of(s), (*slot, *v)))
            .collect();
        assert_eq!(by_name.len(), 4);
        assert!(!by_name.contains_key(&names[1]));
        for (i, (_, _, value)) in first.iter().enumerate().filter(|(i, _)| *i != 1) {
            let (slot, v) = by_name[&names[i]];
            assert_eq!(v, *value, "{}", names[i]);
            assert_ne!(slot, Slot::default(), "{} lost its slot", names[i]);
        }
    }
}
