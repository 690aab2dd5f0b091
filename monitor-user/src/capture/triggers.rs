//! What starts a recording window, from one snapshot to the next: `link_downed` moving,
//! `state` leaving ACTIVE, `phys_state` leaving LinkUp, the width or rate changing, an error counter rising faster
//! than the threshold. (IB port events trigger on their own, in the capture loop.)

use std::collections::HashMap;

use monitor_wire::{Reading, names::metric};

/// Error counters whose rate is watched.
const ERROR_COUNTERS: [&str; 5] = [
    metric::IB_SYMBOL_ERROR_TOTAL,
    metric::IB_PORT_RCV_ERRORS_TOTAL,
    metric::IB_LINK_ERROR_RECOVERY_TOTAL,
    metric::IB_LOCAL_LINK_INTEGRITY_ERRORS_TOTAL,
    metric::IB_EXCESSIVE_BUFFER_OVERRUN_ERRORS_TOTAL,
];
/// `phys_state` LinkUp.
const LINK_UP: f64 = 5.0;
/// `state` ACTIVE.
const ACTIVE: f64 = 4.0;

/// The previous snapshot's values per port and series.
#[derive(Debug, Default)]
pub(super) struct TriggerWatch {
    last: HashMap<(String, String), (u64, f64)>,
    /// Errors per second above which a counter triggers.
    error_rate: f64,
}

impl TriggerWatch {
    pub(super) fn new(error_rate: f64) -> Self {
        Self {
            last: HashMap::new(),
            error_rate,
        }
    }

    /// The reasons this snapshot triggers (empty: none), each naming the port.
    pub(super) fn check(&mut self, readings: &[Reading]) -> Vec<String> {
        let mut reasons = Vec::new();
        for r in readings {
            let name: &str = &r.series.name;
            let port = format!(
                "{}/{}",
                r.series.labels.get("device").unwrap_or("?"),
                r.series.labels.get("port").unwrap_or("?")
            );
            let value = r.value.as_f64();
            let key = (port, name.to_owned());
            let previous = self.last.insert(key.clone(), (r.unix_ns, value));
            let Some((at, before)) = previous else {
                continue;
            };
            let port = &key.0;
            match name {
                metric::IB_LINK_DOWNED_TOTAL if value != before => {
                    reasons.push(format!("{port}: link_downed {before} -> {value}"));
                }
                metric::IB_PORT_STATE if before == ACTIVE && value != ACTIVE => {
                    reasons.push(format!("{port}: state left ACTIVE ({value})"));
                }
                metric::IB_PORT_PHYS_STATE if before == LINK_UP && value != LINK_UP => {
                    reasons.push(format!("{port}: phys_state left LinkUp ({value})"));
                }
                metric::IB_PORT_WIDTH_LANES | metric::IB_PORT_RATE_GBPS if value != before => {
                    let what = name
                        .trim_start_matches(metric::IB_PREFIX)
                        .trim_start_matches("port_");
                    reasons.push(format!("{port}: {what} {before} -> {value}"));
                }
                _ if ERROR_COUNTERS.contains(&name) && value > before => {
                    let seconds = (r.unix_ns.saturating_sub(at) as f64 / 1e9).max(1e-3);
                    let rate = (value - before) / seconds;
                    if rate > self.error_rate {
                        let short = name
                            .trim_start_matches(metric::IB_PREFIX)
                            .trim_end_matches("_total");
                        reasons.push(format!("{port}: {short} at {rate:.0}/s"));
                    }
                }
                _ => {}
            }
        }
        reasons
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use monitor_wire::{Kind, Labels, Series, Value};

    fn reading(name: &str, value: f64, unix_ns: u64) -> Reading {
        Reading {
            series: Series {
                name: name.into(),
                labels: Labels::new([("device", "mlx5_0"), ("port", "1")]),
                kind: Kind::Gauge,
            },
            value: Value::F64(value),
            unix_ns,
        }
    }

    #[test]
    fn each_rule_triggers_on_its_change_only() {
        let mut w = TriggerWatch::new(10.0);
        let s = 1_000_000_000;
        let snap = |phys, width, downed, symbols, t| {
            vec![
                reading("railscope_ib_port_phys_state", phys, t),
                reading("railscope_ib_port_width_lanes", width, t),
                reading("railscope_ib_link_downed_total", downed, t),
                reading("railscope_ib_symbol_error_total", symbols, t),
            ]
        };
        assert!(w.check(&snap(5.0, 4.0, 0.0, 0.0, 0)).is_empty());
        assert!(
            w.check(&snap(5.0, 4.0, 0.0, 5.0, s)).is_empty(),
            "5/s is under 10/s"
        );
        assert_eq!(
            w.check(&snap(5.0, 4.0, 0.0, 25.0, 2 * s)),
            ["mlx5_0/1: symbol_error at 20/s"]
        );
        assert_eq!(
            w.check(&snap(2.0, 1.0, 1.0, 25.0, 3 * s)),
            [
                "mlx5_0/1: phys_state left LinkUp (2)",
                "mlx5_0/1: width_lanes 4 -> 1",
                "mlx5_0/1: link_downed 0 -> 1"
            ]
        );
        assert!(w.check(&snap(2.0, 1.0, 1.0, 25.0, 4 * s)).is_empty());
    }
}
