//! The node's clock against its collectors' (docs/agent.md, "Clock offset"): the agent notes
//! when it sent each frame (t1, on its one time base: the clock its events and samples are
//! stamped on), takes each acknowledgement's timing (the collector's t2 and t3 for the newest
//! frame it answers for) with the time it came off the socket (t4), and keeps NTP's clock
//! filter per collector ([`monitor_wire::clock_offset`]). The estimate is sent with every
//! flush as two gauges, from the first exchange on.
//!
//! A frame sent again (a gap the collector named, a frame from the spool file of an earlier
//! run) has two send times, and the collector's receive time may be either's: its exchange is
//! not taken. With a collector pair, frames go to both and are the same bytes, so one estimate
//! is sent to both: the first collector's (the one named first), the second's while the first
//! has none yet. The pair's two clocks should agree; each collector's own exchanges say how
//! far the node is from it in the agent's log at debug level.

use std::collections::BTreeMap;

use monitor_wire::{
    AckTiming, Kind, Labels, Series,
    clock_offset::{ClockEstimate, ClockFilter, Exchange, ExchangeRefused},
    names::metric,
};

use crate::time_base::UnixNs;

/// Send times kept, of the newest frames sent once: a collector acknowledges within a few
/// seconds, and a flush is a few frames.
const SENT_KEPT: usize = 256;

/// Why a timing was not taken.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum TimingRefused {
    #[error("timing for {node:?} session {session:08x}: not this agent's")]
    NotOurs { node: String, session: u32 },
    #[error("timing for frame {0}, which was sent more than once or too long ago")]
    NotSentOnce(u64),
    #[error("timing for frame {seq}: {why}")]
    Exchange { seq: u64, why: ExchangeRefused },
}

/// Send times, and one clock filter per collector.
pub(crate) struct ClockExchanges {
    node: String,
    session: u32,
    /// seq → when it was sent (t1), of frames of `session` sent once.
    sent: BTreeMap<u64, u64>,
    filters: Vec<ClockFilter>,
    offset: Series,
    error: Series,
}

impl ClockExchanges {
    pub(crate) fn new(node: &str, session: u32, collectors: usize) -> Self {
        let gauge = |name: &str| Series {
            name: name.into(),
            labels: Labels::default(),
            kind: Kind::Gauge,
        };
        Self {
            node: node.to_owned(),
            session,
            sent: BTreeMap::new(),
            filters: vec![ClockFilter::default(); collectors],
            offset: gauge(metric::AGENT_CLOCK_OFFSET_SECONDS),
            error: gauge(metric::AGENT_CLOCK_OFFSET_ERROR_SECONDS),
        }
    }

    /// Frame `seq` of the session is sent for the first time, at `at`.
    pub(crate) fn sent(&mut self, seq: u64, at: UnixNs) {
        self.sent.insert(seq, at.0);
        while self.sent.len() > SENT_KEPT {
            self.sent.pop_first();
        }
    }

    /// Frame `seq` is sent again: its exchange cannot be timed.
    pub(crate) fn resent(&mut self, seq: u64) {
        self.sent.remove(&seq);
    }

    /// Takes collector `collector`'s timing, which came off the socket at `back` (t4).
    pub(crate) fn take(
        &mut self,
        collector: usize,
        timing: &AckTiming,
        back: UnixNs,
    ) -> Result<ClockEstimate, TimingRefused> {
        if timing.node != self.node || timing.session != self.session {
            return Err(TimingRefused::NotOurs {
                node: timing.node.clone(),
                session: timing.session,
            });
        }
        let Some(&sent_ns) = self.sent.get(&timing.seq) else {
            return Err(TimingRefused::NotSentOnce(timing.seq));
        };
        let exchange = Exchange {
            sent_ns,
            received_ns: timing.received_ns,
            answered_ns: timing.sent_ns,
            back_ns: back.0,
        };
        let filter = self
            .filters
            .get_mut(collector)
            .expect("one filter per collector");
        let exchanged = exchange.estimate().map_err(|why| TimingRefused::Exchange {
            seq: timing.seq,
            why,
        })?;
        filter
            .take(&exchange)
            .map_err(|why| TimingRefused::Exchange {
                seq: timing.seq,
                why,
            })?;
        Ok(exchanged)
    }

    /// The estimate the agent sends: the first collector's that has one.
    pub(crate) fn estimate(&self) -> Option<ClockEstimate> {
        self.filters.iter().find_map(ClockFilter::estimate)
    }

    /// The gauges to send now: (series, value) of the offset and its error bound, seconds;
    /// none before a first exchange.
    pub(crate) fn gauges(&self) -> Vec<(&Series, f64)> {
        self.estimate()
            .map(|e| {
                vec![
                    (&self.offset, e.offset_seconds()),
                    (&self.error, e.error_seconds()),
                ]
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_790_000_000_000_000_000;
    const MS: u64 = 1_000_000;

    fn timing(seq: u64, received_ns: u64, sent_ns: u64) -> AckTiming {
        AckTiming {
            node: "n1".into(),
            session: 7,
            seq,
            received_ns,
            sent_ns,
        }
    }

    #[test]
    fn nothing_is_sent_before_a_first_exchange_then_the_offset_and_its_bound() {
        let mut clock = ClockExchanges::new("n1", 7, 1);
        assert!(clock.gauges().is_empty());
        // The node 3 s ahead: sent at T0 + 3 s (its clock), received 1 ms later, answered
        // 800 ms after that, back 1 ms later.
        clock.sent(5, UnixNs(T0 + 3000 * MS));
        let e = clock
            .take(
                0,
                &timing(5, T0 + MS, T0 + 801 * MS),
                UnixNs(T0 + 3802 * MS),
            )
            .unwrap();
        assert_eq!(e.offset_ns, 3000 * MS as i64);
        let gauges: Vec<(&str, f64)> = clock
            .gauges()
            .into_iter()
            .map(|(s, v)| (&*s.name, v))
            .collect();
        assert_eq!(gauges[0], (metric::AGENT_CLOCK_OFFSET_SECONDS, 3.0));
        assert_eq!(gauges[1].0, metric::AGENT_CLOCK_OFFSET_ERROR_SECONDS);
        assert!(gauges[1].1 > 0.001 && gauges[1].1 < 0.0011, "{gauges:?}");
    }

    #[test]
    fn frames_sent_again_and_other_agents_timings_are_not_taken() {
        let mut clock = ClockExchanges::new("n1", 7, 2);
        clock.sent(5, UnixNs(T0));
        clock.sent(6, UnixNs(T0));
        clock.resent(6);
        let t = timing(6, T0 + MS, T0 + 2 * MS);
        assert_eq!(
            clock.take(0, &t, UnixNs(T0 + 3 * MS)),
            Err(TimingRefused::NotSentOnce(6))
        );
        let other = AckTiming {
            session: 8,
            ..timing(5, T0 + MS, T0 + 2 * MS)
        };
        assert!(matches!(
            clock.take(0, &other, UnixNs(T0 + 3 * MS)),
            Err(TimingRefused::NotOurs { .. })
        ));
        assert!(matches!(
            clock.take(0, &timing(5, T0 + MS, T0 + 9 * MS), UnixNs(T0 + 3 * MS)),
            Err(TimingRefused::Exchange {
                why: ExchangeRefused::NegativeDelay,
                ..
            })
        ));
        assert_eq!(clock.estimate(), None);
        // The second collector's, while the first has none.
        clock
            .take(1, &timing(5, T0 + MS, T0 + 2 * MS), UnixNs(T0 + 3 * MS))
            .unwrap();
        assert_eq!(clock.estimate().map(|e| e.offset_ns), Some(0));
        // Then the first's.
        clock
            .take(0, &timing(5, T0 - 4 * MS, T0 - 3 * MS), UnixNs(T0 + 3 * MS))
            .unwrap();
        assert_eq!(clock.estimate().map(|e| e.offset_ns), Some(5 * MS as i64));
    }

    #[test]
    fn only_the_newest_send_times_are_kept() {
        let mut clock = ClockExchanges::new("n1", 7, 1);
        for seq in 0..SENT_KEPT as u64 + 10 {
            clock.sent(seq, UnixNs(T0));
        }
        assert_eq!(clock.sent.len(), SENT_KEPT);
        assert_eq!(clock.sent.keys().next(), Some(&10));
    }
}
