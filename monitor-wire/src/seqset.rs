//! Which sequence numbers of one session are held: a floor below which every number is
//! settled, and the ranges held above it. A receiver uses one to refuse a frame it has
//! (replay protection that still takes a late frame it lacks, however late), a collector to
//! say in an acknowledgement what it holds and what it lacks (docs/wire-format.md,
//! "Acknowledgements").
//!
//! Frames arrive mostly in order and resends fill the gaps, so a session's numbers are a few
//! ranges; the number of ranges is bounded all the same ([`SeqSet::with_max_ranges`]): past
//! the bound, the lowest gap is given up (the floor rises past it) and what it held is
//! counted, never silent.

/// Ranges of sequence numbers held above a floor. Every number below the floor is settled:
/// held, or given up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqSet {
    floor: u64,
    /// Held ranges `[start, end)`, sorted, disjoint, not touching each other, each starting
    /// above the floor (a range that reaches the floor is merged into it).
    ranges: Vec<(u64, u64)>,
    max_ranges: usize,
    /// Numbers given up because the ranges were at their bound.
    given_up: u64,
}

/// Ranges a set holds by default: far more than a session's gaps ever are, while a
/// session's set stays under 64 KiB.
pub const MAX_RANGES: usize = 4096;

/// Whether a floor and held ranges above it (a set's, an acknowledgement's) hold `seq`.
pub(crate) fn holds(floor: u64, ranges: &[(u64, u64)], seq: u64) -> bool {
    seq < floor || range_of(ranges, seq).is_ok()
}

/// One more than the highest number a floor and held ranges above it hold.
pub(crate) fn end(floor: u64, ranges: &[(u64, u64)]) -> u64 {
    ranges.last().map_or(floor, |r| r.1)
}

/// `Ok(i)`: range i holds `seq`; `Err(i)`: it would go before range i.
fn range_of(ranges: &[(u64, u64)], seq: u64) -> Result<usize, usize> {
    let i = ranges.partition_point(|r| r.1 <= seq);
    match ranges.get(i) {
        Some(r) if r.0 <= seq => Ok(i),
        _ => Err(i),
    }
}

impl Default for SeqSet {
    fn default() -> Self {
        Self::with_max_ranges(MAX_RANGES)
    }
}

impl SeqSet {
    /// An empty set (floor 0) of at most `max_ranges` ranges (at least 1).
    pub fn with_max_ranges(max_ranges: usize) -> Self {
        Self {
            floor: 0,
            ranges: Vec::new(),
            max_ranges: max_ranges.max(1),
            given_up: 0,
        }
    }

    /// Every number below this is settled.
    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// The held ranges above the floor, `[start, end)`, in order.
    pub fn ranges(&self) -> &[(u64, u64)] {
        &self.ranges
    }

    /// One more than the highest number held (the floor when nothing above it is).
    pub fn end(&self) -> u64 {
        end(self.floor, &self.ranges)
    }

    /// Numbers given up at the bound.
    pub fn given_up(&self) -> u64 {
        self.given_up
    }

    pub fn contains(&self, seq: u64) -> bool {
        holds(self.floor, &self.ranges, seq)
    }

    fn find(&self, seq: u64) -> Result<usize, usize> {
        range_of(&self.ranges, seq)
    }

    /// Adds `seq`; false if it was held (or settled) already.
    pub fn insert(&mut self, seq: u64) -> bool {
        if seq == u64::MAX {
            // `end` would overflow; no session gets there.
            return false;
        }
        if seq < self.floor {
            return false;
        }
        let i = match self.find(seq) {
            Ok(_) => return false,
            Err(i) => i,
        };
        let joins_before = i > 0 && self.ranges[i - 1].1 == seq;
        let joins_after = self.ranges.get(i).is_some_and(|r| r.0 == seq + 1);
        match (joins_before, joins_after) {
            (true, true) => {
                self.ranges[i - 1].1 = self.ranges[i].1;
                self.ranges.remove(i);
            }
            (true, false) => self.ranges[i - 1].1 = seq + 1,
            (false, true) => self.ranges[i].0 = seq,
            (false, false) => self.ranges.insert(i, (seq, seq + 1)),
        }
        self.settle();
        true
    }

    /// Takes `seq` back out (a frame accepted, then not stored): a later copy is taken again.
    pub fn remove(&mut self, seq: u64) {
        if seq < self.floor {
            if seq + 1 < self.floor {
                self.ranges.insert(0, (seq + 1, self.floor));
            }
            self.floor = seq;
            self.settle();
            return;
        }
        let Ok(i) = self.find(seq) else {
            return;
        };
        let (start, end) = self.ranges[i];
        match (start == seq, end == seq + 1) {
            (true, true) => {
                self.ranges.remove(i);
            }
            (true, false) => self.ranges[i].0 = seq + 1,
            (false, true) => self.ranges[i].1 = seq,
            (false, false) => {
                self.ranges[i].1 = seq;
                self.ranges.insert(i + 1, (seq + 1, end));
            }
        }
        self.settle();
    }

    /// Merges a range that reaches the floor into it, and gives up the lowest gap while the
    /// ranges are over their bound.
    fn settle(&mut self) {
        if let Some(&(start, end)) = self.ranges.first()
            && start == self.floor
        {
            self.floor = end;
            self.ranges.remove(0);
        }
        while self.ranges.len() > self.max_ranges {
            let (start, end) = self.ranges.remove(0);
            self.given_up += start - self.floor;
            self.floor = end;
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn ranges_merge_split_and_settle_into_the_floor() {
        let mut s = SeqSet::default();
        assert!(s.insert(3) && s.insert(5) && s.insert(4));
        assert_eq!((s.floor(), s.ranges()), (0, &[(3, 6)][..]));
        assert!(!s.insert(4), "held already");
        assert!(!s.contains(0) && !s.contains(2), "the gap below the range");
        assert!(s.insert(0) && s.insert(2) && s.insert(1));
        assert_eq!((s.floor(), s.ranges()), (6, &[][..]));
        assert!(s.contains(5) && !s.contains(6) && !s.insert(2));
        s.insert(9);
        s.insert(10);
        s.insert(11);
        s.remove(10);
        assert_eq!(s.ranges(), &[(9, 10), (11, 12)]);
        assert!(
            !s.contains(10) && (6..9).all(|n| !s.contains(n)),
            "4 missing"
        );
        assert!(s.insert(10), "taken out, so taken again");
        s.remove(3);
        assert!(!s.contains(3) && s.contains(2) && s.contains(4));
        assert_eq!((s.floor(), s.ranges()), (3, &[(4, 6), (9, 12)][..]));
    }

    #[test]
    fn the_lowest_gap_is_given_up_at_the_bound_and_counted() {
        let mut s = SeqSet::with_max_ranges(2);
        s.insert(2);
        s.insert(4);
        s.insert(6);
        // Three ranges: the gap [0, 2) is given up, the floor rises past range (2, 3).
        assert_eq!(
            (s.floor(), s.ranges(), s.given_up()),
            (3, &[(4, 5), (6, 7)][..], 2)
        );
        assert!(!s.insert(1), "settled");
    }

    proptest! {
        /// The set answers exactly what a plain set of the same numbers does, while no gap
        /// had to be given up.
        #[test]
        fn agrees_with_a_plain_set(ops in proptest::collection::vec((any::<bool>(), 0u64..200), 0..400)) {
            let mut s = SeqSet::default();
            let mut plain = std::collections::BTreeSet::new();
            for (add, n) in ops {
                if add {
                    prop_assert_eq!(s.insert(n), plain.insert(n));
                } else {
                    s.remove(n);
                    plain.remove(&n);
                }
                for n in 0..200 {
                    prop_assert_eq!(s.contains(n), plain.contains(&n), "{}", n);
                }
                let mut from = s.floor();
                for &(a, b) in s.ranges() {
                    prop_assert!(a > from && a < b, "{:?}", s.ranges());
                    from = b;
                }
            }
        }
    }
}
