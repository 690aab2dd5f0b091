//! The schema section: which series each compact id stands for (docs/wire-format.md,
//! "Schema section").

use std::{collections::HashMap, sync::Arc};

use crate::{
    budget::Budget,
    error::WireError,
    frame::{MAX_FRAME_SAMPLES, SchemaEntry},
    prim::{Reader, put_varint, unzigzag, zigzag},
    series::{Kind, Labels, Series},
};

/// Schema section: a string table (sorted, front-coded), label sets, name groups (a list of
/// metric names with their kinds) and runs. A run gives consecutive ids to one label set
/// crossed with one group: the 40 series of a GPU are one run, and the other GPUs' runs
/// reuse the same group.
pub(crate) fn encode_schema(entries: &[(u32, &Series)]) -> Vec<u8> {
    // The encoder codes several cuts of a batch of entries to find what fits a frame, so
    // this avoids per-entry hashing and tree nodes: a sorted vector, binary-searched.
    let mut strings: Vec<&str> = Vec::with_capacity(entries.len() * 3);
    let mut prev_labels = None;
    for (_, series) in entries {
        strings.push(&series.name);
        // Consecutive entries mostly share their labels (a source's series).
        if prev_labels != Some(&series.labels) {
            for (k, v) in series.labels.iter() {
                strings.push(k);
                strings.push(v);
            }
        }
        prev_labels = Some(&series.labels);
    }
    strings.sort_unstable();
    strings.dedup();
    let mut out = Vec::new();
    put_varint(&mut out, strings.len() as u64);
    let mut prev: &[u8] = &[];
    for s in &strings {
        let s = s.as_bytes();
        let shared = prev.iter().zip(s).take_while(|(a, b)| a == b).count();
        put_varint(&mut out, shared as u64);
        put_varint(&mut out, (s.len() - shared) as u64);
        out.extend_from_slice(&s[shared..]);
        prev = s;
    }
    let index = |s: &str| strings.binary_search(&s).expect("string in table") as u64;

    // Runs: maximal stretches of consecutive ids with one label set.
    let mut runs: Vec<&[(u32, &Series)]> = Vec::new();
    let mut start = 0;
    for i in 1..=entries.len() {
        let ends = i == entries.len()
            || entries[i - 1].0.checked_add(1) != Some(entries[i].0)
            || entries[i].1.labels != entries[i - 1].1.labels;
        if ends {
            runs.push(&entries[start..i]);
            start = i;
        }
    }
    let hasher = foldhash::fast::FixedState::default();
    let mut label_sets: Vec<&Labels> = Vec::new();
    let mut label_set_index: HashMap<&Labels, u64, _> = HashMap::with_hasher(hasher.clone());
    let mut groups: Vec<Vec<u64>> = Vec::new();
    let mut group_index: HashMap<Vec<u64>, u64, _> = HashMap::with_hasher(hasher);
    let mut run_refs = Vec::with_capacity(runs.len());
    for run in &runs {
        let labels = &run[0].1.labels;
        let l = *label_set_index.entry(labels).or_insert_with(|| {
            label_sets.push(labels);
            label_sets.len() as u64 - 1
        });
        let group: Vec<u64> = run
            .iter()
            .map(|(_, s)| index(&s.name) << 1 | u64::from(s.kind == Kind::Gauge))
            .collect();
        let g = match group_index.get(&group) {
            Some(&g) => g,
            None => {
                let g = groups.len() as u64;
                groups.push(group.clone());
                group_index.insert(group, g);
                g
            }
        };
        run_refs.push((run[0].0, l, g));
    }
    put_varint(&mut out, label_sets.len() as u64);
    for labels in &label_sets {
        put_varint(&mut out, labels.iter().count() as u64);
        for (k, v) in labels.iter() {
            put_varint(&mut out, index(k));
            put_varint(&mut out, index(v));
        }
    }
    put_varint(&mut out, groups.len() as u64);
    for group in &groups {
        put_varint(&mut out, group.len() as u64);
        for &name in group {
            put_varint(&mut out, name);
        }
    }
    put_varint(&mut out, run_refs.len() as u64);
    let mut expected = 0i64;
    for ((first, l, g), run) in run_refs.into_iter().zip(&runs) {
        put_varint(&mut out, zigzag(i64::from(first) - expected));
        put_varint(&mut out, l);
        put_varint(&mut out, g);
        expected = i64::from(first) + run.len() as i64;
    }
    out
}

pub(crate) fn parse_schema(
    r: &mut Reader<'_>,
    budget: &mut Budget,
) -> Result<Vec<SchemaEntry>, WireError> {
    parse_schema_where(r, budget, &mut |_| true).map(|(entries, _)| entries)
}

/// [`parse_schema`], making entries only of the series whose name `keep` accepts (the rest
/// are checked and skipped). A reader of the archive asks about one or a few metrics, while
/// a node's schema record names every series it sends: the strings are kept in one buffer
/// and a label set is made only for an entry kept, so a skipped entry allocates nothing.
/// Budget charges are those of the whole schema, kept or not. Also returns the id ranges the
/// section defines, kept or not: a reader that meets samples before their entries can tell
/// an id it chose not to keep from one it has not been told of yet.
pub(crate) fn parse_schema_where(
    r: &mut Reader<'_>,
    budget: &mut Budget,
    keep: &mut dyn FnMut(&str) -> bool,
) -> Result<(Vec<SchemaEntry>, Vec<std::ops::Range<u32>>), WireError> {
    const STRING: &str = "schema string";
    let n = r.count("schema string count")?;
    budget.charge_items::<String>(n, STRING)?;
    // Every string, rebuilt from its front coding, one after the other in one buffer, made
    // once at its full size (measured, and charged, first: a buffer that grew would hold
    // twice its bytes while it moved); where each is, and where on the wire it was (for
    // the error when it is not UTF-8).
    let mut measure = r.clone();
    let mut rebuilt = 0usize;
    let mut prev = 0usize;
    for _ in 0..n {
        let shared = measure.varint(STRING)?;
        if shared > prev as u64 {
            return Err(measure.malformed(STRING));
        }
        let len = measure.count(STRING)?;
        measure.bytes(len, STRING)?;
        // Each string is rebuilt in full: what front coding saves on the wire is charged here.
        prev = shared as usize + len;
        budget.charge(prev, STRING)?;
        rebuilt += prev;
    }
    let mut text: Vec<u8> = Vec::with_capacity(rebuilt);
    let mut spans: Vec<(usize, usize, usize)> = Vec::with_capacity(n);
    for _ in 0..n {
        let offset = r.offset();
        let prev = spans.last().map_or(0..0, |&(at, len, _)| at..at + len);
        let shared = r.varint(STRING)? as usize;
        let len = r.count(STRING)?;
        let at = text.len();
        text.extend_from_within(prev.start..prev.start + shared);
        text.extend_from_slice(r.bytes(len, STRING)?);
        spans.push((at, shared + len, offset));
    }
    let strings = spans
        .iter()
        .map(|&(at, len, offset)| {
            std::str::from_utf8(&text[at..at + len]).map_err(|_| WireError::Malformed {
                what: STRING,
                offset,
            })
        })
        .collect::<Result<Vec<&str>, _>>()?;
    let index = |r: &mut Reader<'_>, len: usize, what: &'static str| -> Result<usize, WireError> {
        let offset = r.offset();
        usize::try_from(r.varint(what)?)
            .ok()
            .filter(|&i| i < len)
            .ok_or(WireError::Malformed { what, offset })
    };

    const LABELS: &str = "label set";
    let n = r.count("label set count")?;
    budget.charge_items::<Labels>(n, LABELS)?;
    // Each label set's pairs (string indexes), one set after the other.
    let mut pairs: Vec<(usize, usize)> = Vec::new();
    let mut label_sets: Vec<std::ops::Range<usize>> = Vec::with_capacity(n);
    for _ in 0..n {
        let count = r.count("label count")?;
        // The pairs' vector, and the shared block that holds it.
        budget.charge_items::<(String, String)>(count, LABELS)?;
        budget.charge(ARC_HEADER + size_of::<Vec<(String, String)>>(), LABELS)?;
        let from = pairs.len();
        for _ in 0..count {
            let k = index(r, strings.len(), "label string index")?;
            let v = index(r, strings.len(), "label string index")?;
            budget.charge(strings[k].len() + strings[v].len(), LABELS)?;
            pairs.push((k, v));
        }
        label_sets.push(from..pairs.len());
    }

    const GROUP: &str = "name group";
    let n = r.count("name group count")?;
    budget.charge_items::<Vec<(usize, Kind)>>(n, GROUP)?;
    let mut groups = Vec::with_capacity(n);
    for _ in 0..n {
        let len = r.count("name group length")?;
        budget.charge_items::<(usize, Kind)>(len, GROUP)?;
        let mut group = Vec::with_capacity(len);
        for _ in 0..len {
            let offset = r.offset();
            let code = r.varint("name group entry")?;
            let name = usize::try_from(code >> 1)
                .ok()
                .filter(|&i| i < strings.len())
                .ok_or(WireError::Malformed {
                    what: "name group entry",
                    offset,
                })?;
            let kind = if code & 1 != 0 {
                Kind::Gauge
            } else {
                Kind::Counter
            };
            group.push((name, kind));
        }
        groups.push(group);
    }

    // The runs first, so the entries are counted (and charged) before any is made.
    const RUN: &str = "schema run";
    let n = r.count("schema run count")?;
    budget.charge_items::<(u32, usize, usize)>(n, RUN)?;
    let mut runs = Vec::with_capacity(n);
    let mut expected = 0i64;
    let mut total = 0usize;
    for _ in 0..n {
        let offset = r.offset();
        let first = expected.wrapping_add(unzigzag(r.varint("schema run id")?));
        let labels = index(r, label_sets.len(), "label set index")?;
        let group = index(r, groups.len(), "name group index")?;
        let len = groups[group].len();
        let last = first.checked_add(len as i64 - 1);
        if first < 0 || last.is_none_or(|l| l > i64::from(u32::MAX)) {
            return Err(WireError::Malformed {
                what: "schema run id",
                offset,
            });
        }
        total += len;
        if total > MAX_FRAME_SAMPLES {
            return Err(r.malformed("schema entry count"));
        }
        runs.push((first as u32, labels, group));
        expected = first + len as i64;
    }
    r.finish("schema section length")?;

    // The entries are bounded by their count, as samples are (see `crate::budget`); a name
    // is allocated once per frame and shared by every entry that has it, a label set made
    // once, for the first entry kept that has it.
    const ENTRY: &str = "schema entry";
    budget.charge_items::<Option<Arc<str>>>(strings.len(), ENTRY)?;
    let mut names: Vec<Option<Option<Arc<str>>>> = vec![None; strings.len()];
    let mut made: Vec<Option<Labels>> = vec![None; label_sets.len()];
    let mut entries = Vec::with_capacity(total);
    let defined = runs
        .iter()
        .map(|&(first, _, group)| first..first + groups[group].len() as u32)
        .collect();
    for (first, labels, group) in runs {
        for (i, &(name, kind)) in groups[group].iter().enumerate() {
            let name = match &names[name] {
                Some(kept) => kept.clone(),
                None => {
                    budget.charge(ARC_HEADER + strings[name].len(), ENTRY)?;
                    let kept = keep(strings[name]).then(|| Arc::<str>::from(strings[name]));
                    names[name] = Some(kept.clone());
                    kept
                }
            };
            let Some(name) = name else {
                continue;
            };
            let labels = made[labels]
                .get_or_insert_with(|| {
                    Labels::new(
                        pairs[label_sets[labels].clone()]
                            .iter()
                            .map(|&(k, v)| (strings[k], strings[v])),
                    )
                })
                .clone();
            entries.push(SchemaEntry {
                id: first + i as u32,
                series: Series { name, labels, kind },
            });
        }
    }
    Ok((entries, defined))
}

/// The two reference counts in front of an `Arc`'s value.
const ARC_HEADER: usize = 2 * size_of::<usize>();
