//! Robust statistics shared by the congestion rule and the straggler search: the median, the
//! median absolute deviation (MAD) and the modified z-score of Iglewicz & Hoaglin,
//! `|x - median| / (1.4826 MAD)`, which one outlier cannot move the way it moves a mean.

/// The median and MAD of a group of values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Norm {
    pub median: f64,
    pub mad: f64,
    /// The smallest scale a score is divided by: a group of near-equal values would otherwise
    /// make any small difference a huge score.
    pub floor: f64,
}

impl Norm {
    /// None for an empty group. `floor` bounds 1.4826·MAD from below.
    pub(crate) fn of(values: &[f64], floor: f64) -> Option<Self> {
        let median = median(values)?;
        let deviations: Vec<f64> = values.iter().map(|v| (v - median).abs()).collect();
        let mad = median_of(deviations)?;
        Some(Self { median, mad, floor })
    }

    /// The modified z-score of `x`, an absolute value (above or below the median alike).
    pub(crate) fn score(&self, x: f64) -> f64 {
        (x - self.median).abs() / (1.4826 * self.mad).max(self.floor)
    }
}

pub(crate) fn median(values: &[f64]) -> Option<f64> {
    median_of(values.to_vec())
}

fn median_of(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_outlier_does_not_move_the_norm() {
        let mut v = vec![10.0; 63];
        v.push(1000.0);
        v[0] = 9.0;
        v[1] = 11.0;
        let n = Norm::of(&v, 0.1).unwrap();
        assert_eq!(n.median, 10.0);
        assert_eq!(n.mad, 0.0);
        assert!(n.score(1000.0) > 3.5);
        assert!(n.score(11.0) > 3.5, "floor 0.1 makes 1 a score of 10");
        let n = Norm::of(&v, 2.0).unwrap();
        assert!(n.score(11.0) < 3.5);
    }

    #[test]
    fn median_of_even_and_odd() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }
}
