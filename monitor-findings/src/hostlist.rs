//! Slurm's hostlist expressions, as topology.conf writes node and switch names:
//! `node[01-16]`, `n[1-4,7]`, `rack[1-2]-n[1-2]`, `a1,b[2-3]` (commas outside brackets
//! separate names; a range keeps the width of its first bound's zero padding).

/// Names at most one expression expands to: a typo such as `n[1-99999999]` is refused rather
/// than filling memory.
const MAX_NAMES: usize = 1_000_000;

/// Every name of `expr`, in order; the error says what is wrong.
pub(crate) fn expand(expr: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for item in split_top_level(expr)? {
        if item.is_empty() {
            return Err(format!("empty name in {expr:?}"));
        }
        let mut names = vec![String::new()];
        let mut rest = item;
        while let Some(open) = rest.find('[') {
            let close = rest[open..]
                .find(']')
                .map(|c| open + c)
                .ok_or_else(|| format!("unclosed '[' in {item:?}"))?;
            let prefix = &rest[..open];
            let parts = range_values(&rest[open + 1..close], item)?;
            let mut next = Vec::with_capacity(names.len() * parts.len());
            for n in &names {
                for p in &parts {
                    next.push(format!("{n}{prefix}{p}"));
                }
            }
            if next.len() + out.len() > MAX_NAMES {
                return Err(format!("{item:?} names more than {MAX_NAMES} hosts"));
            }
            names = next;
            rest = &rest[close + 1..];
        }
        if rest.contains(']') {
            return Err(format!("']' without '[' in {item:?}"));
        }
        out.extend(names.into_iter().map(|n| n + rest));
    }
    Ok(out)
}

/// Splits at the commas outside brackets.
fn split_top_level(expr: &str) -> Result<Vec<&str>, String> {
    let mut items = Vec::new();
    let (mut depth, mut from) = (0u32, 0);
    for (i, c) in expr.char_indices() {
        match c {
            '[' if depth > 0 => return Err(format!("nested '[' in {expr:?}")),
            '[' => depth = 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                items.push(&expr[from..i]);
                from = i + 1;
            }
            _ => {}
        }
    }
    items.push(&expr[from..]);
    Ok(items)
}

/// The values of one bracket's body: `1-4,7,09-10`.
fn range_values(body: &str, item: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for part in body.split(',') {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let number = |s: &str| {
            (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse::<u64>().ok())
                .flatten()
                .ok_or_else(|| format!("{part:?} in {item:?} is not a number or a range a-b"))
        };
        let (a, b) = (number(lo)?, number(hi)?);
        if a > b {
            return Err(format!("range {part:?} in {item:?} runs backwards"));
        }
        if (b - a) as usize >= MAX_NAMES {
            return Err(format!("{item:?} names more than {MAX_NAMES} hosts"));
        }
        let width = if lo.starts_with('0') { lo.len() } else { 0 };
        out.extend((a..=b).map(|v| format!("{v:0width$}")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::expand;

    #[test]
    fn ranges_lists_padding_and_several_brackets_expand_as_slurm_does() {
        assert_eq!(expand("n1").unwrap(), ["n1"]);
        assert_eq!(
            expand("node[01-03]").unwrap(),
            ["node01", "node02", "node03"]
        );
        assert_eq!(
            expand("n[1-2,7,9-10]").unwrap(),
            ["n1", "n2", "n7", "n9", "n10"]
        );
        assert_eq!(expand("n[8-10]x").unwrap(), ["n8x", "n9x", "n10x"]);
        assert_eq!(
            expand("r[1-2]-n[1-2]").unwrap(),
            ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]
        );
        assert_eq!(expand("a,b[2-3],c").unwrap(), ["a", "b2", "b3", "c"]);
        assert_eq!(expand("node[001-016]").unwrap().len(), 16);
    }

    #[test]
    fn malformed_expressions_are_refused_with_what_is_wrong() {
        for (expr, what) in [
            ("n[1-4", "unclosed"),
            ("n1-4]", "without '['"),
            ("n[4-1]", "backwards"),
            ("n[a-b]", "not a number"),
            ("n[1-]", "not a number"),
            ("n[[1]]", "nested"),
            ("a,,b", "empty name"),
            ("n[1-99999999]", "more than"),
        ] {
            let e = expand(expr).unwrap_err();
            assert!(e.contains(what), "{expr}: {e}");
        }
    }
}
