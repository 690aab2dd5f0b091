//! From raw records and counter keys to what an operator reads: device and enum names,
//! cgroup paths, wall-clock times; and port events folded into state transitions.

use std::collections::HashMap;

use monitor_common::{
    events::{EventRecord, Origin},
    verbs::{DETAIL_USER, NO_STATE_CHANGE, Verb},
};
use serde::Serialize;

use super::{RawCount, names::KernelNames};
use crate::{
    cgroup::CgroupNames,
    jobs::Job,
    time_base::{MonoNs, TimeBase},
};

/// Where an event comes from; serialised as the name the JSON lines and the collector's
/// event kinds carry (`port`, `qp_async`, `cq_async`, `qp_to_err`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventOrigin {
    /// `ib_dispatch_event`: a port or device event.
    Port,
    /// An async event of a user QP.
    QpAsync,
    /// An async event of a user CQ.
    CqAsync,
    /// A QP moved to ERR by `modify_qp`.
    QpToErr,
    /// An origin code this agent does not know (a record from a newer probe object).
    Unknown,
}

impl EventOrigin {
    /// The name it is serialised as.
    pub fn as_str(self) -> &'static str {
        match self {
            EventOrigin::Port => "port",
            EventOrigin::QpAsync => "qp_async",
            EventOrigin::CqAsync => "cq_async",
            EventOrigin::QpToErr => "qp_to_err",
            EventOrigin::Unknown => "unknown",
        }
    }
}

impl From<Option<Origin>> for EventOrigin {
    fn from(origin: Option<Origin>) -> Self {
        match origin {
            Some(Origin::Dispatch) => EventOrigin::Port,
            Some(Origin::QpAsync) => EventOrigin::QpAsync,
            Some(Origin::CqAsync) => EventOrigin::CqAsync,
            Some(Origin::QpToErr) => EventOrigin::QpToErr,
            Some(Origin::NewCgroup) | None => EventOrigin::Unknown,
        }
    }
}

/// One event from the probes, decoded: what the JSON lines and the text output print and what
/// the agent turns into a [`monitor_wire::WireEvent`] for the collector. What it adds over the
/// kernel's [`EventRecord`]: names for what the record holds as numbers (the device, the
/// event from the kernel's BTF, the cgroup's path and its job) and wall-clock time; its
/// origin as a Rust enum.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProbeEvent {
    /// Kernel CLOCK_MONOTONIC nanoseconds when the hook ran.
    pub ktime_ns: u64,
    /// Wall-clock nanoseconds since the Unix epoch, from `ktime_ns` on the agent's time
    /// base ([`TimeBase`]).
    pub unix_ns: u64,
    pub origin: EventOrigin,
    pub device: String,
    /// Port number of port events (0 otherwise).
    pub port: u32,
    /// QP number of QP events (0 otherwise).
    pub qp_num: u32,
    /// The kernel's name: `PORT_ERR`, `QP_FATAL`, ... (`ERR` for a move to ERR).
    pub event: String,
    /// The raw enum value.
    pub code: u32,
    /// cgroup of the task that was running when the hook fired.
    pub cgroup: String,
    /// The job that cgroup belongs to ([`crate::jobs`]), if any.
    #[serde(flatten)]
    pub job: Option<Job>,
    /// True when the probe could not read every field (the record is partial).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub partial: bool,
}

impl ProbeEvent {
    /// `device` is the record's device name, resolved by the caller from the family's
    /// `DEVICE_NAMES` map (see [`super::AttachedFamily::device_name`]).
    pub fn decode(
        record: &EventRecord,
        device: String,
        names: &KernelNames,
        clock: &TimeBase,
        cgroups: &mut CgroupNames,
    ) -> Self {
        let origin = Origin::from_u32(record.origin);
        let event = match origin {
            Some(Origin::QpToErr) => names.qp_state.name(i64::from(record.event_type)),
            _ => names.ib_event.name(i64::from(record.event_type)),
        };
        let (cgroup, job) = cgroups.named(record.cgroup);
        Self {
            ktime_ns: record.timestamp_ns,
            // bpf_ktime_get_ns: CLOCK_MONOTONIC.
            unix_ns: clock.unix_ns(MonoNs(record.timestamp_ns)).0,
            origin: origin.into(),
            device,
            port: record.port,
            qp_num: record.qp_num,
            event,
            code: record.event_type,
            cgroup,
            job,
            partial: record.read_error != 0,
        }
    }
}

/// Whether a port is up or down, as its events last said; serialised `UP`, `DOWN`, `UNKNOWN`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum PortUpDown {
    /// PORT_ACTIVE.
    Up,
    /// PORT_ERR.
    Down,
    /// No event seen on the port yet.
    Unknown,
}

impl PortUpDown {
    /// The name it is serialised as.
    pub fn as_str(self) -> &'static str {
        match self {
            PortUpDown::Up => "UP",
            PortUpDown::Down => "DOWN",
            PortUpDown::Unknown => "UNKNOWN",
        }
    }
}

impl std::fmt::Display for PortUpDown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A port going up or down, de-duplicated from the raw events (rxe sends PORT_ACTIVE twice
/// per link-up; mlx5 may repeat events too).
///
/// Not a copy of a port's [`ProbeEvent`]: [`PortStates`] makes one only when an event changes
/// the port's state, and it carries the state before (`from`), which no single event knows.
/// It is printed and sent (`port_transition`) besides the event itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PortTransition {
    pub ktime_ns: u64,
    pub unix_ns: u64,
    pub device: String,
    pub port: u32,
    /// `Unknown` for the first event seen on a port.
    pub from: PortUpDown,
    /// `Up` or `Down`.
    pub to: PortUpDown,
}

/// Folds port events into transitions, keeping the last state of each port.
#[derive(Debug, Default)]
pub(crate) struct PortStates {
    last: HashMap<(String, u32), PortUpDown>,
}

impl PortStates {
    /// The transition `event` causes, if it changes the port's state.
    pub(crate) fn observe(&mut self, event: &ProbeEvent) -> Option<PortTransition> {
        if event.origin != EventOrigin::Port {
            return None;
        }
        let to = match event.event.as_str() {
            "PORT_ACTIVE" => PortUpDown::Up,
            "PORT_ERR" => PortUpDown::Down,
            _ => return None,
        };
        let key = (event.device.clone(), event.port);
        let from = self.last.insert(key, to).unwrap_or(PortUpDown::Unknown);
        (from != to).then(|| PortTransition {
            ktime_ns: event.ktime_ns,
            unix_ns: event.unix_ns,
            device: event.device.clone(),
            port: event.port,
            from,
            to,
        })
    }
}

/// One verb counter, decoded.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct VerbCount {
    /// Device name, empty for hooks that do not know it (rdma_cm, MAD).
    pub device: String,
    pub verb: &'static str,
    /// Verb-specific detail: QP target state, cm event, reject reason, `user`/`kernel`...
    pub detail: String,
    pub cgroup: String,
    /// The cgroup's job, if any.
    #[serde(flatten)]
    pub job: Option<Job>,
    pub value: u64,
}

/// Decodes and sums counters (several families or CPUs may report the same decoded key).
pub(crate) fn decode_counts(
    raw: &[RawCount],
    names: &KernelNames,
    cgroups: &mut CgroupNames,
) -> Vec<VerbCount> {
    let mut summed: HashMap<(String, &'static str, String, String), u64> = HashMap::new();
    let mut jobs: HashMap<String, Option<Job>> = HashMap::new();
    for count in raw {
        let Some(verb) = Verb::from_u32(count.key.verb) else {
            continue;
        };
        let detail = detail_name(verb, count.key.detail, names);
        let (cgroup, job) = cgroups.named(count.key.cgroup);
        jobs.entry(cgroup.clone()).or_insert(job);
        *summed
            .entry((count.device.clone(), verb.name(), detail, cgroup))
            .or_default() += count.value;
    }
    let mut out: Vec<VerbCount> = summed
        .into_iter()
        .map(|((device, verb, detail, cgroup), value)| VerbCount {
            device,
            verb,
            detail,
            job: jobs.get(&cgroup).cloned().flatten(),
            cgroup,
            value,
        })
        .collect();
    out.sort();
    out
}

fn detail_name(verb: Verb, detail: u32, names: &KernelNames) -> String {
    match verb {
        Verb::QpModify if detail == NO_STATE_CHANGE => "no_state_change".into(),
        Verb::QpModify => names.qp_state.name(i64::from(detail)),
        Verb::CmEvent => names.cm_event.name(i64::from(detail)),
        Verb::CmReject => names.cm_reject.name(i64::from(detail as i32)),
        Verb::MadSendError => names.wc_status.name(i64::from(detail)),
        Verb::PostSend | Verb::MadRetry | Verb::MrRegDmabuf | Verb::None => String::new(),
        _ if detail == DETAIL_USER => "user".into(),
        _ => "kernel".into(),
    }
}

/// Renders counters as an aligned table.
pub(crate) fn render_counts(counts: &[VerbCount]) -> String {
    let w = |f: fn(&VerbCount) -> usize, min: usize| {
        counts.iter().map(f).chain([min]).max().unwrap_or(min)
    };
    let (dw, vw, tw) = (
        w(|c| c.device.len(), 6),
        w(|c| c.verb.len(), 4),
        w(|c| c.detail.len(), 6),
    );
    let mut out = format!(
        "{:dw$}  {:vw$}  {:tw$}  {:>10}  CGROUP (JOB)\n",
        "DEVICE", "VERB", "DETAIL", "COUNT"
    );
    for c in counts {
        let device = if c.device.is_empty() { "-" } else { &c.device };
        let detail = if c.detail.is_empty() { "-" } else { &c.detail };
        let job = c
            .job
            .as_ref()
            .map_or_else(String::new, |job| format!(" ({job})"));
        out += &format!(
            "{device:dw$}  {:vw$}  {detail:tw$}  {:>10}  {}{job}\n",
            c.verb, c.value, c.cgroup
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probes::names::EnumNames;
    use monitor_common::verbs::CounterKey;

    fn names() -> KernelNames {
        KernelNames {
            ib_event: EnumNames::from_pairs([
                (9, "PORT_ACTIVE"),
                (10, "PORT_ERR"),
                (1, "QP_FATAL"),
            ]),
            qp_state: EnumNames::from_pairs([(3, "RTS"), (6, "ERR")]),
            cm_event: EnumNames::from_pairs([(8, "REJECTED")]),
            cm_reject: EnumNames::from_pairs([(8, "INVALID_SERVICE_ID")]),
            wc_status: EnumNames::default(),
        }
    }

    fn event(name: &str, device: &str, port: u32) -> ProbeEvent {
        ProbeEvent {
            ktime_ns: 1,
            unix_ns: 1,
            origin: EventOrigin::Port,
            device: device.into(),
            port,
            qp_num: 0,
            event: name.into(),
            code: 0,
            cgroup: "/".into(),
            job: None,
            partial: false,
        }
    }

    #[test]
    fn duplicate_port_events_make_one_transition() {
        let mut states = PortStates::default();
        let seq = [
            "PORT_ACTIVE",
            "PORT_ERR",
            "PORT_ACTIVE",
            "PORT_ACTIVE",
            "PORT_ERR",
            "PORT_ERR",
        ];
        let transitions: Vec<(&str, &str)> = seq
            .iter()
            .filter_map(|e| states.observe(&event(e, "rxe0", 1)))
            .map(|t| (t.from.as_str(), t.to.as_str()))
            .collect();
        assert_eq!(
            transitions,
            [
                ("UNKNOWN", "UP"),
                ("UP", "DOWN"),
                ("DOWN", "UP"),
                ("UP", "DOWN")
            ]
        );
        // Ports are tracked separately.
        assert!(states.observe(&event("PORT_ERR", "rxe1", 1)).is_some());
        assert!(states.observe(&event("PORT_ERR", "rxe0", 2)).is_some());
    }

    #[test]
    fn counters_are_named_and_summed() {
        let raw = |verb: Verb, detail: u32, value| RawCount {
            device: "rxe0".into(),
            key: CounterKey {
                device: 1,
                cgroup: u64::MAX,
                verb: verb as u32,
                detail,
            },
            value,
        };
        let mut cgroups = CgroupNames::new("/nonexistent");
        let counts = decode_counts(
            &[
                raw(Verb::QpModify, 3, 2),
                raw(Verb::QpModify, 3, 1),
                raw(Verb::QpCreate, DETAIL_USER, 1),
                raw(Verb::CmReject, 8, 1),
                raw(Verb::QpModify, NO_STATE_CHANGE, 4),
            ],
            &names(),
            &mut cgroups,
        );
        let find = |verb: &str, detail: &str| {
            counts
                .iter()
                .find(|c| c.verb == verb && c.detail == detail)
                .map(|c| c.value)
        };
        assert_eq!(find("modify_qp", "RTS"), Some(3));
        assert_eq!(find("modify_qp", "no_state_change"), Some(4));
        assert_eq!(find("create_qp", "user"), Some(1));
        assert_eq!(find("cm_reject", "INVALID_SERVICE_ID"), Some(1));
        assert!(counts.iter().all(|c| c.cgroup.starts_with("cgroup:")));
        let table = render_counts(&counts);
        assert!(table.lines().next().unwrap().starts_with("DEVICE"));
        assert_eq!(table.lines().count(), counts.len() + 1);
    }
}
