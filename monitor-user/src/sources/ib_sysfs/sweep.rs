//! One read of the planned files: each due file read, parsed and handed to the sink, each
//! problem recorded against its file.

use std::{
    collections::BTreeMap,
    io,
    path::{Path, PathBuf},
};

use super::{
    SysfsError,
    counter_value::parse_counter,
    kept_file::OpenFile,
    link::{
        CodedState, LinkLayer, PHYS_STATE_NAMES, STATE_NAMES, parse_coded, parse_link_layer,
        parse_rate,
    },
    plan::{Convert, CounterFile, DevicePlan, PortPlan, Tracked},
};
use crate::sources::ReadingSink;
use monitor_wire::{Kind, Labels, Series, Value, names::metric};

/// What one read of the source touches: where values go (nowhere when only the link facts
/// are read), the buffer and the problem list.
pub(super) struct Sweep<'a, 's> {
    pub(super) sink: Option<&'s mut dyn ReadingSink>,
    pub(super) buf: &'a mut [u8],
    pub(super) problems: &'a mut BTreeMap<PathBuf, SysfsError>,
}

impl Sweep<'_, '_> {
    /// Whether to read the file of `series` (always, when only the link facts are read).
    pub(super) fn due(&mut self, tracked: &mut Tracked) -> bool {
        self.sink
            .as_mut()
            .is_none_or(|sink| sink.due(&tracked.series, &mut tracked.slot))
    }

    /// Reads one device's due files. Returns whether any read failed.
    pub(super) fn device(&mut self, plan: &mut DevicePlan) -> bool {
        let mut failed = false;
        for port in &mut plan.ports {
            failed |= self.port(port, &mut plan.stale);
        }
        if self.sink.is_some() {
            for counter in &mut plan.counters {
                failed |= self.counter(counter, &mut plan.stale);
            }
        }
        failed
    }

    pub(super) fn port(&mut self, port: &mut PortPlan, stale: &mut bool) -> bool {
        let mut failed = false;
        let counting = self.sink.is_some();
        if self.due(&mut port.state_series) {
            port.link.state = self.coded(&mut port.state, &STATE_NAMES, stale);
            failed |= port.link.state.is_none();
            if let Some(s) = &port.link.state {
                self.emit(&mut port.state_series, Value::U64(s.code.into()));
            }
        }
        if self.due(&mut port.phys_state_series) {
            port.link.phys_state = self.coded(&mut port.phys_state, &PHYS_STATE_NAMES, stale);
            failed |= port.link.phys_state.is_none();
            if let Some(s) = &port.link.phys_state {
                self.emit(&mut port.phys_state_series, Value::U64(s.code.into()));
            }
        }
        if self.due(&mut port.rate_series) || self.due(&mut port.width_series) {
            port.link.rate = None;
            if let Some(text) = self.text(&mut port.rate, stale) {
                match parse_rate(&text) {
                    Ok(rate) => {
                        self.ok(&port.rate.path);
                        port.link.rate = Some(rate);
                    }
                    Err(partial) => {
                        port.link.rate = partial;
                        self.problem(SysfsError::Malformed {
                            path: port.rate.path.clone(),
                            value: text,
                            expected: "\"<rate> Gb/sec (<width>X <speed>)\"",
                        });
                    }
                }
            } else {
                failed = true;
            }
            if let Some(r) = &port.link.rate {
                self.emit(&mut port.rate_series, Value::F64(r.gbps));
                if let Some(w) = r.width_lanes {
                    self.emit(&mut port.width_series, Value::U64(w.into()));
                }
            }
        }
        let layer_due = match &mut port.link_layer_series {
            Some(series) => self.due(series),
            None => true,
        };
        if layer_due {
            port.link.link_layer = None;
            if let Some(text) = self.text(&mut port.link_layer, stale) {
                let path = &port.link_layer.path;
                match parse_link_layer(&text) {
                    LinkLayer::Other(s) => {
                        self.problem(SysfsError::Malformed {
                            path: path.clone(),
                            value: text,
                            expected: "InfiniBand or Ethernet",
                        });
                        if !s.is_empty() {
                            port.link.link_layer = Some(LinkLayer::Other(s));
                        }
                    }
                    known => {
                        self.ok(path);
                        port.link.link_layer = Some(known);
                    }
                }
            } else {
                failed = true;
            }
            if let Some(l) = &port.link.link_layer {
                let current = port
                    .link_layer_series
                    .as_ref()
                    .is_some_and(|t| t.series.labels.get("link_layer") == Some(l.as_str()));
                if !current {
                    let series = Series {
                        name: metric::IB_PORT_LINK_LAYER_INFO.into(),
                        labels: Labels::new([
                            ("device", port.link.device.as_str()),
                            ("port", port.link.port.to_string().as_str()),
                            ("link_layer", l.as_str()),
                        ]),
                        kind: Kind::Gauge,
                    };
                    port.link_layer_series = Some(Tracked::new(series));
                }
                if let Some(tracked) = &mut port.link_layer_series {
                    self.emit(tracked, Value::U64(1));
                }
            }
        }
        if counting {
            for counter in &mut port.counters {
                failed |= self.counter(counter, stale);
            }
        }
        failed
    }

    /// Reads one counter file when its series is due. Returns whether the read failed.
    pub(super) fn counter(&mut self, counter: &mut CounterFile, stale: &mut bool) -> bool {
        if !self.due(&mut counter.tracked) {
            return false;
        }
        let parsed = match counter.file.read(self.buf) {
            Ok(bytes) => parse_counter(bytes),
            Err(source) => {
                *stale |= source.kind() == io::ErrorKind::NotFound;
                self.problem(SysfsError::Read {
                    path: counter.file.path.clone(),
                    source,
                });
                return true;
            }
        };
        let raw = match parsed {
            Ok(raw) => raw,
            Err(value) => {
                self.problem(SysfsError::Malformed {
                    path: counter.file.path.clone(),
                    value,
                    expected: match counter.convert {
                        Convert::LifespanMs => "milliseconds",
                        _ => "an unsigned integer",
                    },
                });
                return false;
            }
        };
        self.saturation(counter, raw);
        let value = match counter.convert {
            Convert::Count => Value::U64(raw),
            Convert::Words => Value::U64(raw.saturating_mul(4)),
            Convert::LifespanMs => Value::F64(raw as f64 / 1000.0),
        };
        self.emit(&mut counter.tracked, value);
        false
    }

    /// Records whether `counter`, just read as `raw`, is stuck at its maximum (a problem
    /// warned about once, its value still sent), and sends its saturation flag: 1 while it is,
    /// 0 from the read that finds it below again (the counter was reset).
    fn saturation(&mut self, counter: &mut CounterFile, raw: u64) {
        let path = &counter.file.path;
        let at_max = counter.limit.filter(|l| raw == l.max);
        match at_max {
            Some(limit) => self.problem(SysfsError::Saturated {
                path: path.clone(),
                max: limit.max,
                bits: limit.bits,
            }),
            None => self.ok(path),
        }
        if at_max.is_some() && counter.saturated.is_none() {
            let file = path
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default();
            let labels = counter
                .tracked
                .series
                .labels
                .iter()
                .chain([("counter", file.as_str())]);
            counter.saturated = Some(Tracked::new(Series {
                name: metric::IB_COUNTER_SATURATED.into(),
                labels: Labels::new(labels),
                kind: Kind::Gauge,
            }));
        }
        if let Some(flag) = &mut counter.saturated {
            self.emit(flag, Value::U64(at_max.is_some().into()));
        }
    }

    /// Hands a value read to the sink (nowhere when only the link facts are read).
    pub(super) fn emit(&mut self, tracked: &mut Tracked, value: Value) {
        if let Some(sink) = self.sink.as_mut() {
            sink.reading(&tracked.series, &mut tracked.slot, value);
        }
    }

    pub(super) fn coded(
        &mut self,
        file: &mut OpenFile,
        names: &[&str],
        stale: &mut bool,
    ) -> Option<CodedState> {
        let text = self.text(file, stale)?;
        let path = &file.path;
        let Some(state) = parse_coded(&text) else {
            self.problem(SysfsError::Malformed {
                path: path.clone(),
                value: text,
                expected: "\"<code>: <name>\"",
            });
            return None;
        };
        let known = usize::try_from(state.code)
            .ok()
            .and_then(|i| names.get(i))
            .is_some_and(|n| !n.is_empty() && n.eq_ignore_ascii_case(&state.name));
        if known {
            self.ok(path);
        } else {
            self.problem(SysfsError::UnknownName {
                path: path.clone(),
                code: state.code,
                name: state.name.clone(),
            });
        }
        Some(state)
    }

    /// The contents of one small file as text, or `None` with the problem recorded.
    pub(super) fn text(&mut self, file: &mut OpenFile, stale: &mut bool) -> Option<String> {
        match file.read(self.buf) {
            Ok(bytes) => match std::str::from_utf8(bytes) {
                Ok(s) => Some(s.trim_end_matches('\n').to_string()),
                Err(_) => {
                    self.problem(SysfsError::NotUtf8 {
                        path: file.path.clone(),
                    });
                    None
                }
            },
            Err(source) => {
                *stale |= source.kind() == io::ErrorKind::NotFound;
                self.problem(SysfsError::Read {
                    path: file.path.clone(),
                    source,
                });
                None
            }
        }
    }

    pub(super) fn problem(&mut self, p: SysfsError) {
        self.problems.insert(p.path().to_path_buf(), p);
    }

    /// `path` read normally: it is no longer a problem.
    pub(super) fn ok(&mut self, path: &Path) {
        if !self.problems.is_empty() {
            self.problems.remove(path);
        }
    }
}
