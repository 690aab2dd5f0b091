//! IB events and port transitions as the collector receives them ([`wire::Event`]).

use crate::jobs::Job;
use crate::probes::decode::{Event, EventOrigin, PortTransition, PortUpDown};
use monitor_wire::{self as wire, Labels, names::event_kind};

/// An IB, QP or CQ event for the collector.
pub(super) fn ib_wire_event(event: &Event) -> wire::Event {
    let mut labels = vec![
        ("device", event.device.clone()),
        ("cgroup", event.cgroup.clone()),
    ];
    labels.extend(event.job.iter().flat_map(Job::labels));
    match event.origin {
        EventOrigin::Port => labels.push(("port", event.port.to_string())),
        EventOrigin::CqAsync => {}
        EventOrigin::QpAsync | EventOrigin::QpToErr | EventOrigin::Unknown => {
            labels.push(("qp", event.qp_num.to_string()))
        }
    }
    wire::Event {
        unix_ns: event.unix_ns,
        kind: match event.origin {
            EventOrigin::Port => event_kind::IB_PORT.into(),
            origin => origin.as_str().into(),
        },
        labels: Labels::new(labels),
        code: i64::from(event.code),
        text: event.event.clone(),
    }
}

/// A port going UP or DOWN, for the collector.
pub(super) fn transition_wire_event(t: &PortTransition) -> wire::Event {
    wire::Event {
        unix_ns: t.unix_ns,
        kind: event_kind::PORT_TRANSITION.into(),
        labels: Labels::new([
            ("device", t.device.clone()),
            ("port", t.port.to_string()),
            ("from", t.from.as_str().to_owned()),
        ]),
        code: i64::from(t.to == PortUpDown::Up),
        text: t.to.as_str().into(),
    }
}
