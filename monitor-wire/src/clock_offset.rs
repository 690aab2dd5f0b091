//! How far a node's clock is from its collector's, estimated as NTP does from the round trips
//! that acknowledgements make (docs/agent.md, "Clock offset"). One exchange is four times:
//! the agent sent a frame at t1 (its clock), the collector received it at t2 and answered at
//! t3 (its clock, [`crate::AckTiming`]), the agent received the answer at t4 (its clock).
//!
//! **Sign.** The offset is the node's clock minus the collector's, `((t1 - t2) + (t4 - t3)) / 2`
//! (NTP's θ with the opposite sign): positive when the node's clock runs ahead. A node's time
//! minus its offset is on the collector's clock. The collector and its docs use this sign
//! everywhere.
//!
//! **Error bound.** The round-trip delay `(t4 - t1) - (t3 - t2)` is the time the exchange
//! spent on the network both ways; since neither way takes less than nothing, the true offset
//! lies within half of it of the estimate, whatever the asymmetry. To that is added what the
//! two clocks may drift apart while the exchange lasts (`t4 - t1`), at NTP's tolerance of
//! 15 ppm.
//!
//! **Filter.** Queueing (a busy collector, a full socket buffer, an agent's loop) lengthens
//! one way more than the other and biases the estimate, but it also lengthens the delay: as
//! NTP's clock filter does, the estimate is the exchange of least delay among the last
//! [`FILTER_EXCHANGES`], so a burst of slow exchanges is ignored and a clock stepped on
//! either side is followed within that many exchanges (a slower exchange after the step is
//! taken once the last faster one before it leaves the window).

use std::collections::VecDeque;

/// Exchanges the estimate is chosen among: NTP's clock filter has 8 stages. An agent makes
/// one exchange per acknowledgement (about one per flush, every 10 s by default): 80 s.
pub const FILTER_EXCHANGES: usize = 8;
/// An exchange that took longer than this from send to answer is not taken: its clocks may
/// have drifted (or stepped) apart meanwhile, and a collector acknowledges within seconds.
pub const MAX_ROUND_TRIP_NS: u64 = 30_000_000_000;
/// What two clocks may drift apart per second, in parts per million (NTP's PHI).
pub const DRIFT_PPM: u64 = 15;

/// One round trip's four times, Unix ns: t1 and t4 on the node's clock, t2 and t3 on the
/// collector's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exchange {
    /// t1: the agent sent the frame.
    pub sent_ns: u64,
    /// t2: the collector received it.
    pub received_ns: u64,
    /// t3: the collector answered.
    pub answered_ns: u64,
    /// t4: the agent received the answer.
    pub back_ns: u64,
}

/// A clock offset and its error bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockEstimate {
    /// The node's clock minus the collector's, ns.
    pub offset_ns: i64,
    /// The true offset is within this of `offset_ns`, ns.
    pub error_ns: u64,
}

impl ClockEstimate {
    pub fn offset_seconds(&self) -> f64 {
        self.offset_ns as f64 / 1e9
    }

    pub fn error_seconds(&self) -> f64 {
        self.error_ns as f64 / 1e9
    }
}

/// Why an exchange was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExchangeRefused {
    #[error("the agent's times run backwards (a clock stepped back during the exchange?)")]
    Backwards,
    #[error("the collector answered before it received")]
    AnsweredFirst,
    #[error("the collector held it longer than the agent waited for it")]
    NegativeDelay,
    #[error("the round trip took longer than {MAX_ROUND_TRIP_NS} ns")]
    TooLong,
}

impl Exchange {
    /// The round-trip delay (network time, both ways), ns.
    pub fn delay_ns(&self) -> Result<u64, ExchangeRefused> {
        let round_trip = self
            .back_ns
            .checked_sub(self.sent_ns)
            .ok_or(ExchangeRefused::Backwards)?;
        if round_trip > MAX_ROUND_TRIP_NS {
            return Err(ExchangeRefused::TooLong);
        }
        let held = self
            .answered_ns
            .checked_sub(self.received_ns)
            .ok_or(ExchangeRefused::AnsweredFirst)?;
        round_trip
            .checked_sub(held)
            .ok_or(ExchangeRefused::NegativeDelay)
    }

    /// The estimate of this exchange alone.
    pub fn estimate(&self) -> Result<ClockEstimate, ExchangeRefused> {
        let delay = self.delay_ns()?;
        let [t1, t2, t3, t4] = [
            self.sent_ns,
            self.received_ns,
            self.answered_ns,
            self.back_ns,
        ]
        .map(i128::from);
        let offset = ((t1 - t2) + (t4 - t3)) / 2;
        let drift = (self.back_ns - self.sent_ns) / 1_000_000 * DRIFT_PPM;
        Ok(ClockEstimate {
            offset_ns: offset.clamp(i64::MIN.into(), i64::MAX.into()) as i64,
            error_ns: delay / 2 + drift,
        })
    }
}

/// The last [`FILTER_EXCHANGES`] exchanges' estimates; the current estimate is the one of
/// least delay among them.
#[derive(Clone, Debug, Default)]
pub struct ClockFilter {
    /// (delay, estimate), oldest first.
    recent: VecDeque<(u64, ClockEstimate)>,
}

impl ClockFilter {
    /// Takes one exchange; an exchange no clock can make is refused and changes nothing.
    pub fn take(&mut self, exchange: &Exchange) -> Result<(), ExchangeRefused> {
        let delay = exchange.delay_ns()?;
        let estimate = exchange.estimate()?;
        if self.recent.len() == FILTER_EXCHANGES {
            self.recent.pop_front();
        }
        self.recent.push_back((delay, estimate));
        Ok(())
    }

    /// The estimate of least delay among the recent exchanges (the newest of equals); None
    /// before the first exchange.
    pub fn estimate(&self) -> Option<ClockEstimate> {
        self.recent
            .iter()
            .rev()
            .min_by_key(|(delay, _)| *delay)
            .map(|(_, e)| *e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_790_000_000_000_000_000;
    const MS: u64 = 1_000_000;

    /// An exchange between a node whose clock is `offset_ns` ahead of the collector's and
    /// the collector, starting at `start` (collector clock): `out` and `back` ns on the
    /// network each way, `held` ns at the collector.
    fn exchange(start: u64, offset_ns: i64, out: u64, held: u64, back: u64) -> Exchange {
        let node = |t: u64| t.checked_add_signed(offset_ns).unwrap();
        Exchange {
            sent_ns: node(start),
            received_ns: start + out,
            answered_ns: start + out + held,
            back_ns: node(start + out + held + back),
        }
    }

    #[test]
    fn symmetric_delays_give_the_offset_exactly() {
        for offset in [0, 3_000 * MS as i64, -1_500 * MS as i64, 7] {
            let e = exchange(T0, offset, 2 * MS, 900 * MS, 2 * MS)
                .estimate()
                .unwrap();
            assert_eq!(e.offset_ns, offset);
            // Half of 4 ms, and 15 ppm of 904 ms.
            assert_eq!(e.error_ns, 2 * MS + 904 * DRIFT_PPM);
        }
    }

    #[test]
    fn asymmetric_delays_err_within_the_bound() {
        let offset = 3_000 * MS as i64;
        for (out, back) in [(10 * MS, 0), (0, 10 * MS), (7 * MS, MS), (1, 9 * MS)] {
            let e = exchange(T0, offset, out, 500 * MS, back)
                .estimate()
                .unwrap();
            let off_by = (e.offset_ns - offset).unsigned_abs();
            assert!(off_by > 0 || out == back);
            assert!(
                off_by <= e.error_ns,
                "{out} out, {back} back: off by {off_by}, bound {}",
                e.error_ns
            );
        }
    }

    #[test]
    fn the_exchange_of_least_delay_wins_and_slow_ones_are_ignored() {
        let offset = -250 * MS as i64;
        let mut filter = ClockFilter::default();
        assert_eq!(filter.estimate(), None, "nothing before a first exchange");
        // One quick exchange among slow ones whose delay is all on the way in (a queue at
        // the collector): each alone would be 100 ms off.
        filter
            .take(&exchange(T0, offset, MS / 2, 800 * MS, MS / 2))
            .unwrap();
        for i in 1..FILTER_EXCHANGES as u64 {
            filter
                .take(&exchange(
                    T0 + i * 10_000 * MS,
                    offset,
                    200 * MS,
                    800 * MS,
                    0,
                ))
                .unwrap();
        }
        let e = filter.estimate().unwrap();
        assert_eq!(e.offset_ns, offset);
        assert!(e.error_ns < MS, "{e:?}");
        // Once the quick one has left the window, the best of the slow ones, within its
        // (wide) bound.
        filter
            .take(&exchange(T0 + 90_000 * MS, offset, 200 * MS, 800 * MS, 0))
            .unwrap();
        let e = filter.estimate().unwrap();
        assert_eq!(e.offset_ns, offset - 100 * MS as i64);
        assert!((e.offset_ns - offset).unsigned_abs() <= e.error_ns);
    }

    #[test]
    fn a_clock_stepped_midway_is_followed_within_the_window() {
        let mut filter = ClockFilter::default();
        // The node's clock 40 ms ahead, exchanges of 1 ms; then stepped to 2 s behind, with
        // exchanges a little slower (2 ms) than the best before the step.
        filter
            .take(&exchange(T0, 40 * MS as i64, MS / 2, 300 * MS, MS / 2))
            .unwrap();
        let stepped = -2_000 * MS as i64;
        let mut followed_after = None;
        for i in 1..=FILTER_EXCHANGES as u64 + 2 {
            filter
                .take(&exchange(T0 + i * 10_000 * MS, stepped, MS, 300 * MS, MS))
                .unwrap();
            let e = filter.estimate().unwrap();
            if e.offset_ns == stepped && followed_after.is_none() {
                followed_after = Some(i);
            }
        }
        assert_eq!(
            followed_after,
            Some(FILTER_EXCHANGES as u64),
            "the step is followed once the last exchange before it leaves the window"
        );
    }

    #[test]
    fn exchanges_no_clock_makes_are_refused_and_change_nothing() {
        let mut filter = ClockFilter::default();
        let good = exchange(T0, 0, MS, 100 * MS, MS);
        filter.take(&good).unwrap();
        let before = filter.estimate();
        let backwards = Exchange {
            back_ns: good.sent_ns - 1,
            ..good
        };
        let answered_first = Exchange {
            answered_ns: good.received_ns - 1,
            ..good
        };
        // Held at the collector for longer than the agent waited.
        let negative = Exchange {
            answered_ns: good.received_ns + 500 * MS,
            ..good
        };
        let too_long = Exchange {
            back_ns: good.sent_ns + MAX_ROUND_TRIP_NS + 1,
            ..good
        };
        for (e, why) in [
            (backwards, ExchangeRefused::Backwards),
            (answered_first, ExchangeRefused::AnsweredFirst),
            (negative, ExchangeRefused::NegativeDelay),
            (too_long, ExchangeRefused::TooLong),
        ] {
            assert_eq!(filter.take(&e), Err(why));
        }
        assert_eq!(filter.estimate(), before);
    }
}
