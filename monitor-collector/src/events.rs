//! The live view's recent events (all nodes): a ring bounded in count and in bytes, oldest
//! out first. Every event is also archived with its frame; this is what is shown at once.

use std::{collections::VecDeque, sync::Mutex};

use monitor_wire::WireEvent;

use monitor_archive::lock::lock;

/// One event as the live view shows it (`/api/v1/live/events`, the dashboard).
///
/// What it adds over the [`WireEvent`] it is made from: the node that sent it (a frame names
/// its node once, not per event) and when the collector received it; its labels are a map,
/// which serialises as a JSON object.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LiveEvent {
    pub node: String,
    pub unix_ns: u64,
    pub kind: String,
    pub labels: std::collections::BTreeMap<String, String>,
    pub code: i64,
    pub text: String,
    pub received_unix_ns: u64,
}

impl LiveEvent {
    pub fn new(node: &str, event: &WireEvent, received_unix_ns: u64) -> Self {
        Self {
            node: node.to_owned(),
            unix_ns: event.unix_ns,
            kind: event.kind.clone(),
            labels: event
                .labels
                .iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            code: event.code,
            text: event.text.clone(),
            received_unix_ns,
        }
    }

    /// What it holds in memory, about (its strings and their headers).
    fn bytes(&self) -> usize {
        let strings = self.node.len()
            + self.kind.len()
            + self.text.len()
            + self
                .labels
                .iter()
                .map(|(k, v)| k.len() + v.len() + 64)
                .sum::<usize>();
        std::mem::size_of::<Self>() + strings
    }
}

/// Which events to show.
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct EventFilter {
    pub node: Option<String>,
    pub kind: Option<String>,
    /// At most this many, the newest (default 100).
    pub limit: Option<usize>,
}

#[derive(Debug)]
pub struct RecentEvents {
    ring: Mutex<(VecDeque<(LiveEvent, usize)>, usize)>,
    max_events: usize,
    max_bytes: usize,
}

impl RecentEvents {
    pub fn new(max_events: usize, max_bytes: usize) -> Self {
        Self {
            ring: Mutex::new((VecDeque::new(), 0)),
            max_events,
            max_bytes,
        }
    }

    pub fn push(&self, event: LiveEvent) {
        let size = event.bytes();
        let mut guard = lock(&self.ring);
        let (ring, bytes) = &mut *guard;
        ring.push_back((event, size));
        *bytes += size;
        while ring.len() > self.max_events || (*bytes > self.max_bytes && ring.len() > 1) {
            let (_, size) = ring.pop_front().expect("not empty");
            *bytes -= size;
        }
    }

    /// The newest events that match, oldest first.
    pub fn matching(&self, filter: &EventFilter) -> Vec<LiveEvent> {
        let limit = filter.limit.unwrap_or(100);
        let guard = lock(&self.ring);
        let mut out: Vec<LiveEvent> = guard
            .0
            .iter()
            .rev()
            .map(|(e, _)| e)
            .filter(|e| filter.node.as_ref().is_none_or(|n| *n == e.node))
            .filter(|e| filter.kind.as_ref().is_none_or(|k| *k == e.kind))
            .take(limit)
            .cloned()
            .collect();
        out.reverse();
        out
    }

    /// (events held, bytes they take).
    pub fn held(&self) -> (usize, usize) {
        let guard = lock(&self.ring);
        (guard.0.len(), guard.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use monitor_wire::Labels;

    fn event(i: u64, text: &str) -> LiveEvent {
        LiveEvent::new(
            if i.is_multiple_of(2) { "even" } else { "odd" },
            &WireEvent {
                unix_ns: i,
                kind: "xid".into(),
                labels: Labels::new([("gpu", "0")]),
                code: 79,
                text: text.into(),
            },
            i,
        )
    }

    #[test]
    fn the_ring_keeps_the_newest_within_its_bounds() {
        let events = RecentEvents::new(5, 1 << 20);
        for i in 0..12 {
            events.push(event(i, "x"));
        }
        let all = events.matching(&EventFilter::default());
        assert_eq!(
            all.iter().map(|e| e.unix_ns).collect::<Vec<_>>(),
            [7, 8, 9, 10, 11]
        );
        let odd = events.matching(&EventFilter {
            node: Some("odd".into()),
            limit: Some(2),
            ..EventFilter::default()
        });
        assert_eq!(odd.iter().map(|e| e.unix_ns).collect::<Vec<_>>(), [9, 11]);

        // Large events: the byte bound decides.
        let events = RecentEvents::new(1000, 10_000);
        for i in 0..100 {
            events.push(event(i, &"y".repeat(1000)));
        }
        let (held, bytes) = events.held();
        assert!(bytes <= 10_000 && held < 10, "{held} events, {bytes} bytes");
        assert_eq!(
            events
                .matching(&EventFilter::default())
                .last()
                .unwrap()
                .unix_ns,
            99
        );
    }
}
