//! Label matchers, as Prometheus writes them: `label=value`, `label!=value`, `label=~regex`,
//! `label!~regex` (regular expressions match the whole value). The node a series comes from
//! is its `node` label.

use std::fmt;

use regex::Regex;

/// One condition on a label. A series without the label has it empty, as in Prometheus.
#[derive(Clone, Debug)]
pub struct Matcher {
    pub label: String,
    op: Op,
}

#[derive(Clone, Debug)]
enum Op {
    Equal(String),
    NotEqual(String),
    Matches(Regex),
    NotMatches(Regex),
}

/// A matcher that could not be read; names it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MatcherError {
    #[error("matcher {0:?}: expected label=value, label!=value, label=~regex or label!~regex")]
    Syntax(String),
    #[error("matcher {matcher:?}: {label:?} is not a label name")]
    Label { matcher: String, label: String },
    #[error("matcher {matcher:?}: bad regular expression: {error}")]
    Regex { matcher: String, error: String },
}

fn valid_label(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl Matcher {
    /// Parses `label=value`, `label!=value`, `label=~regex` or `label!~regex`; the value may
    /// be in double quotes.
    pub fn parse(text: &str) -> Result<Self, MatcherError> {
        let (at, len) = ["!=", "=~", "!~", "="]
            .iter()
            .filter_map(|op| text.find(op).map(|at| (at, op.len())))
            .min_by_key(|&(at, len)| (at, std::cmp::Reverse(len)))
            .ok_or_else(|| MatcherError::Syntax(text.to_owned()))?;
        let label = text[..at].trim();
        let op = &text[at..at + len];
        let raw = text[at + len..].trim();
        let value = raw
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(raw);
        if !valid_label(label) {
            return Err(MatcherError::Label {
                matcher: text.to_owned(),
                label: label.to_owned(),
            });
        }
        let regex = || {
            Regex::new(&format!("^(?:{value})$")).map_err(|e| MatcherError::Regex {
                matcher: text.to_owned(),
                error: e.to_string(),
            })
        };
        let op = match op {
            "=" => Op::Equal(value.to_owned()),
            "!=" => Op::NotEqual(value.to_owned()),
            "=~" => Op::Matches(regex()?),
            _ => Op::NotMatches(regex()?),
        };
        Ok(Matcher {
            label: label.to_owned(),
            op,
        })
    }

    pub fn matches(&self, value: Option<&str>) -> bool {
        let v = value.unwrap_or("");
        match &self.op {
            Op::Equal(want) => v == want,
            Op::NotEqual(want) => v != want,
            Op::Matches(re) => re.is_match(v),
            Op::NotMatches(re) => !re.is_match(v),
        }
    }

    /// The one value this matcher accepts, if it is an equality.
    pub fn equal_value(&self) -> Option<&str> {
        match &self.op {
            Op::Equal(v) => Some(v),
            _ => None,
        }
    }
}

impl fmt::Display for Matcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.op {
            Op::Equal(v) => write!(f, "{}={v:?}", self.label),
            Op::NotEqual(v) => write!(f, "{}!={v:?}", self.label),
            Op::Matches(r) => write!(f, "{}=~{:?}", self.label, strip_anchors(r.as_str())),
            Op::NotMatches(r) => write!(f, "{}!~{:?}", self.label, strip_anchors(r.as_str())),
        }
    }
}

fn strip_anchors(r: &str) -> &str {
    r.strip_prefix("^(?:")
        .and_then(|r| r.strip_suffix(")$"))
        .unwrap_or(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matchers_parse_and_match_as_in_prometheus() {
        let m = Matcher::parse("gpu=0").unwrap();
        assert!(m.matches(Some("0")) && !m.matches(Some("1")) && !m.matches(None));
        assert_eq!(m.equal_value(), Some("0"));
        let m = Matcher::parse("device!=\"mlx5_0\"").unwrap();
        assert!(m.matches(Some("mlx5_1")) && !m.matches(Some("mlx5_0")) && m.matches(None));
        let m = Matcher::parse("node=~gpu-node-0[12]").unwrap();
        assert!(m.matches(Some("gpu-node-01")) && !m.matches(Some("gpu-node-013")));
        let m = Matcher::parse("port!~1|2").unwrap();
        assert!(!m.matches(Some("1")) && m.matches(Some("3")));
        assert_eq!(m.to_string(), "port!~\"1|2\"");
        assert_eq!(
            Matcher::parse("gpu").unwrap_err(),
            MatcherError::Syntax("gpu".into())
        );
        assert!(matches!(
            Matcher::parse("9x=1").unwrap_err(),
            MatcherError::Label { .. }
        ));
        assert!(matches!(
            Matcher::parse("gpu=~(").unwrap_err(),
            MatcherError::Regex { .. }
        ));
    }
}
