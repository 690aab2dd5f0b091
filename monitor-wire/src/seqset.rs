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
        self.ranges.last().map_or(self.floor, |r| r.1)
    }

    /// Numbers given up at the bound.
    pub fn given_up(&self) -> u64 {
        self.given_up
    }

    pub fn contains(&self, seq: u64) -> bool {
        seq < self.floor || self.find(seq).is_ok()
    }

    /// Whether `seq` is below the floor: settled, held or not.
    pub fn is_settled(&self, seq: u64) -> bool {
        seq < self.floor
    }

    /// `Ok(i)`: range i holds `seq`; `Err(i)`: it would go before range i.
    fn find(&self, seq: u64) -> Result<usize, usize> {
        let i = self.ranges.partition_point(|r| r.1 <= seq);
        match self.ranges.get(i) {
            Some(r) if r.0 <= seq => Ok(i),
            _ => Err(i),
        }
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

    /// Raises the floor to `floor` (numbers below it are given up if not held); a floor at or
    /// below the present one changes nothing.
    pub fn raise_floor(&mut self, floor: u64) {
        if floor <= self.floor {
            return;
        }
        let mut missing = floor - self.floor;
        let keep = self.ranges.partition_point(|r| r.1 <= floor);
        for r in &self.ranges[..keep] {
            missing -= r.1 - r.0;
        }
        self.ranges.drain(..keep);
        let mut floor = floor;
        if let Some(first) = self.ranges.first_mut()
            && first.0 < floor
        {
            missing -= floor - first.0;
            first.0 = floor;
        }
        if let Some(&(start, end)) = self.ranges.first()
            && start == floor
        {
            floor = end;
            self.ranges.remove(0);
        }
        self.given_up += missing;
        self.floor = floor;
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

    /// The gaps above the floor, `[start, end)`, up to the highest number held.
    pub fn gaps(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let mut from = self.floor;
        self.ranges.iter().map(move |&(start, end)| {
            let gap = (from, start);
            from = end;
            gap
        })
    }

    /// Numbers missing between the floor and the highest held.
    pub fn missing(&self) -> u64 {
        self.gaps().map(|(s, e)| e - s).sum()
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
        assert_eq!(s.gaps().collect::<Vec<_>>(), vec![(0, 3)]);
        assert!(s.insert(0) && s.insert(2) && s.insert(1));
        assert_eq!((s.floor(), s.ranges()), (6, &[][..]));
        assert!(s.contains(5) && !s.contains(6) && !s.insert(2));
        s.insert(9);
        s.insert(10);
        s.insert(11);
        s.remove(10);
        assert_eq!(s.ranges(), &[(9, 10), (11, 12)]);
        assert_eq!(s.missing(), 4);
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
        s.raise_floor(6);
        assert_eq!((s.floor(), s.ranges(), s.given_up()), (7, &[][..], 4));
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
