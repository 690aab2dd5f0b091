//! IB events and port transitions as the collector receives them ([`wire::Event`]).

use crate::{
    metrics::Labels,
    probes::decode::{Event, PortTransition},
    wire,
};

/// An IB, QP or CQ event for the collector.
pub(super) fn ib_wire_event(event: &Event) -> wire::Event {
    let mut labels = vec![
        ("device", event.device.clone()),
        ("cgroup", event.cgroup.clone()),
    ];
    match event.origin {
        "port" => labels.push(("port", event.port.to_string())),
        "cq_async" => {}
        _ => labels.push(("qp", event.qp_num.to_string())),
    }
    wire::Event {
        unix_ns: event.unix_ns,
        kind: match event.origin {
            "port" => "ib_port".into(),
            origin => origin.into(),
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
        kind: "port_transition".into(),
        labels: Labels::new([
            ("device", t.device.clone()),
            ("port", t.port.to_string()),
            ("from", t.from.to_owned()),
        ]),
        code: i64::from(t.to == "UP"),
        text: t.to.into(),
    }
}
