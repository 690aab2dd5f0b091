//! IB events and port transitions as the collector receives them ([`WireEvent`]).

use crate::jobs::Job;
use crate::probes::decode::{EventOrigin, PortTransition, PortUpDown, ProbeEvent};
use monitor_wire::{Labels, WireEvent, names::event_kind};

/// An IB, QP or CQ event for the collector.
pub(super) fn ib_wire_event(event: &ProbeEvent) -> WireEvent {
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
    WireEvent {
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
pub(super) fn transition_wire_event(t: &PortTransition) -> WireEvent {
    WireEvent {
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
