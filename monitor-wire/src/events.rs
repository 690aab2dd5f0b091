//! The events section: every event in full, its time exact to the ns
//! (docs/wire-format.md, "Events section").

use crate::{
    budget::Budget,
    error::WireError,
    frame::WireEvent,
    prim::{Reader, put_str, put_varint, unzigzag, zigzag},
    series::Labels,
};

pub(crate) fn encode_events(events: &[&WireEvent], send_ns: u64) -> Vec<u8> {
    let mut out = Vec::new();
    put_varint(&mut out, events.len() as u64);
    for e in events {
        put_event(&mut out, e, send_ns);
    }
    out
}

fn put_event(out: &mut Vec<u8>, e: &WireEvent, send_ns: u64) {
    put_varint(out, send_ns.wrapping_sub(e.unix_ns));
    put_str(out, &e.kind);
    put_varint(out, e.labels.iter().count() as u64);
    for (k, v) in e.labels.iter() {
        put_str(out, k);
        put_str(out, v);
    }
    put_varint(out, zigzag(e.code));
    put_str(out, &e.text);
}

pub(crate) fn parse_events(
    r: &mut Reader<'_>,
    send_ns: u64,
    budget: &mut Budget,
) -> Result<Vec<WireEvent>, WireError> {
    const EVENT: &str = "event";
    // Every string of an event is copied from the section once: together, at most its bytes.
    budget.charge(r.remaining(), EVENT)?;
    let n = r.count("event count")?;
    budget.charge_items::<WireEvent>(n, EVENT)?;
    let mut events = Vec::with_capacity(n);
    for _ in 0..n {
        let unix_ns = send_ns.wrapping_sub(r.varint("event time")?);
        let kind = r.str("event kind")?;
        let n_labels = r.count("event label count")?;
        // The pairs' vector, and the shared block that holds it.
        budget.charge_items::<(String, String)>(n_labels, EVENT)?;
        budget.charge(
            2 * size_of::<usize>() + size_of::<Vec<(String, String)>>(),
            EVENT,
        )?;
        let mut pairs = Vec::with_capacity(n_labels);
        for _ in 0..n_labels {
            pairs.push((r.str("event label")?, r.str("event label")?));
        }
        let code = unzigzag(r.varint("event code")?);
        let text = r.str("event text")?;
        events.push(WireEvent {
            unix_ns,
            kind,
            labels: Labels::new(pairs),
            code,
            text,
        });
    }
    r.finish("events section length")?;
    Ok(events)
}
