//! Grouping redundant metrics and choosing the ones to keep. Metrics within the distance
//! threshold of each other are linked; a group is a connected set of linked metrics. In each
//! group the kept metrics are chosen greedily so that every dropped member is within the
//! threshold of a kept one (a group whose members are all pairwise close keeps one): first
//! those never dropped ([`keep`](super::keep): read by railscope, failure counters,
//! `--keep`), then the member close to the most members not yet covered (on a tie, the first
//! by name). With unique names, nothing here depends on the order they come in:
//! components are order-free and every choice is by name.

use serde::Serialize;

/// Redundant metrics and those of them kept.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Group {
    /// Every member, by name.
    pub members: Vec<String>,
    /// The members kept, by name.
    pub kept: Vec<String>,
    /// Each dropped member, the kept one it is closest to, and their distance.
    pub dropped: Vec<Dropped>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Dropped {
    pub metric: String,
    pub like: String,
    pub distance: f64,
}

/// Groups `names` by `distances` (`[i][j]`, `None`: not comparable) at `max_distance`;
/// `forced[i]` keeps metric `i` whatever. Groups come sorted by their first member.
pub(super) fn group(
    names: &[&str],
    distances: &[Vec<Option<f64>>],
    max_distance: f64,
    forced: &[bool],
) -> Vec<Group> {
    let n = names.len();
    let close = |a: usize, b: usize| distances[a][b].is_some_and(|d| d <= max_distance);
    // Connected components (union-find with path halving).
    let mut parent: Vec<usize> = (0..n).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    for a in 0..n {
        for b in a + 1..n {
            if close(a, b) {
                let (ra, rb) = (root(&mut parent, a), root(&mut parent, b));
                parent[ra.max(rb)] = ra.min(rb);
            }
        }
    }
    let mut components: Vec<Vec<usize>> = Vec::new();
    let mut index_of_root = vec![usize::MAX; n];
    for i in 0..n {
        let r = root(&mut parent, i);
        if index_of_root[r] == usize::MAX {
            index_of_root[r] = components.len();
            components.push(Vec::new());
        }
        components[index_of_root[r]].push(i);
    }
    let mut groups: Vec<Group> = components
        .into_iter()
        .map(|mut members| {
            members.sort_by_key(|&i| names[i]);
            let mut kept: Vec<usize> = members.iter().copied().filter(|&i| forced[i]).collect();
            let covered = |kept: &[usize], i: usize| kept.iter().any(|&k| k == i || close(k, i));
            loop {
                let uncovered: Vec<usize> = members
                    .iter()
                    .copied()
                    .filter(|&i| !covered(&kept, i))
                    .collect();
                if uncovered.is_empty() {
                    break;
                }
                // Members are sorted by name, so max_by_key's last-wins tie is avoided by
                // comparing on (count, reverse position).
                let best = members
                    .iter()
                    .copied()
                    .filter(|i| !kept.contains(i))
                    .enumerate()
                    .max_by_key(|&(pos, i)| {
                        let covers = uncovered.iter().filter(|&&u| u == i || close(i, u)).count();
                        (covers, std::cmp::Reverse(pos))
                    })
                    .map(|(_, i)| i)
                    .expect("an uncovered member is not kept");
                kept.push(best);
            }
            kept.sort_by_key(|&i| names[i]);
            let dropped = members
                .iter()
                .copied()
                .filter(|i| !kept.contains(i))
                .map(|i| {
                    let (like, distance) = kept
                        .iter()
                        .filter_map(|&k| distances[i][k].map(|d| (k, d)))
                        .min_by(|x, y| x.1.total_cmp(&y.1))
                        .expect("a dropped member is close to a kept one");
                    Dropped {
                        metric: names[i].to_owned(),
                        like: names[like].to_owned(),
                        distance,
                    }
                })
                .collect();
            Group {
                members: members.iter().map(|&i| names[i].to_owned()).collect(),
                kept: kept.iter().map(|&i| names[i].to_owned()).collect(),
                dropped,
            }
        })
        .collect();
    groups.sort_by(|a, b| a.members[0].cmp(&b.members[0]));
    groups
}
