//! Reading a configuration file and turning what is wrong with it into one line that names
//! the file, the line and column, and the key.

use std::{
    fmt,
    ops::Range,
    path::{Path, PathBuf},
};

use serde::de::DeserializeOwned;
use toml::de::{DeTable, DeValue};

/// A configuration file as read: its path and text, kept to locate keys in messages.
#[derive(Clone, Debug)]
pub struct ConfigFile {
    path: PathBuf,
    text: String,
}

/// A position in a file, 1-based.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    pub line: usize,
    pub column: usize,
}

/// What is wrong with a command's configuration, in one line.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A syntax error, an unknown key or a bad value in the file.
    #[error("{}", InFile { path, at, key: key.as_deref(), message })]
    File {
        path: PathBuf,
        at: Location,
        /// The key, dotted from the top (`remote-write`, `a.b`), when the error is at one.
        key: Option<String>,
        message: String,
    },
    /// A bad value given on the command line.
    #[error("--{key}: {message}")]
    Flag { key: String, message: String },
    /// Settings that cannot go together, or a value only checked once all are known, that
    /// neither the file nor the flags set (a built-in default).
    #[error("{key}: {message}")]
    Setting { key: String, message: String },
}

struct InFile<'a> {
    path: &'a Path,
    at: &'a Location,
    key: Option<&'a str>,
    message: &'a str,
}

impl fmt::Display for InFile<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: ",
            self.path.display(),
            self.at.line,
            self.at.column
        )?;
        if let Some(key) = self.key {
            write!(f, "key `{key}`: ")?;
        }
        f.write_str(self.message)
    }
}

impl ConfigFile {
    /// Reads the file (it must be UTF-8, as TOML is).
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Ok(Self::from_text(path, text))
    }

    /// A file's text as if read from `path` (tests, fuzzing).
    pub fn from_text(path: impl Into<PathBuf>, text: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            text: text.into(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The settings the file holds: unknown keys (with `#[serde(deny_unknown_fields)]`) and
    /// bad values are errors at their line.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, ConfigError> {
        toml::from_str(&self.text).map_err(|e| {
            let span = e.span().unwrap_or(0..0);
            self.error_at(span, e.message())
        })
    }

    /// Where `key` (dotted from the top) is written in the file, if it is.
    pub fn locate(&self, key: &str) -> Option<Location> {
        let document = DeTable::parse(&self.text).ok()?;
        let mut table = document.get_ref();
        let mut parts = key.split('.').peekable();
        while let Some(part) = parts.next() {
            let (name, value) = table.get_key_value(part)?;
            if parts.peek().is_none() {
                return Some(self.location(name.span().start));
            }
            table = value.get_ref().as_table()?;
        }
        None
    }

    /// An error about `key`'s value, at the key's line (or the file's start if the key is
    /// not written there).
    pub fn error_at_key(&self, key: &str, message: impl fmt::Display) -> ConfigError {
        ConfigError::File {
            path: self.path.clone(),
            at: self.locate(key).unwrap_or(Location { line: 1, column: 1 }),
            key: Some(key.to_owned()),
            message: one_line(&message.to_string()),
        }
    }

    fn error_at(&self, span: Range<usize>, message: &str) -> ConfigError {
        let key = DeTable::parse(&self.text)
            .ok()
            .and_then(|document| key_at(document.get_ref(), span.start, ""));
        ConfigError::File {
            path: self.path.clone(),
            at: self.location(span.start),
            key,
            message: one_line(message),
        }
    }

    fn location(&self, offset: usize) -> Location {
        let offset = offset.min(self.text.len());
        let before = self.text.get(..offset).unwrap_or(&self.text);
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        Location {
            line: before.matches('\n').count() + 1,
            column: before[line_start..].chars().count() + 1,
        }
    }
}

/// The dotted key whose name or value holds `offset`, the innermost one. A `[table]`'s value
/// span need not cover its keys' lines, so tables are searched whatever their span.
fn key_at(table: &DeTable<'_>, offset: usize, prefix: &str) -> Option<String> {
    for (name, value) in table {
        let path = if prefix.is_empty() {
            name.get_ref().to_string()
        } else {
            format!("{prefix}.{}", name.get_ref())
        };
        let inner = match value.get_ref() {
            DeValue::Table(inner) => key_at(inner, offset, &path),
            DeValue::Array(items) => items.iter().find_map(|item| match item.get_ref() {
                DeValue::Table(inner) => key_at(inner, offset, &path),
                _ => None,
            }),
            _ => None,
        };
        if inner.is_some() {
            return inner;
        }
        if name.span().contains(&offset) || value.span().contains(&offset) {
            return Some(path);
        }
    }
    None
}

/// Messages from the TOML parser may run over several lines; an error is one line.
fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "kebab-case")]
    #[allow(dead_code)] // read through Debug only
    struct Example {
        interval: Option<crate::Seconds>,
        name: Option<String>,
        limits: Option<Limits>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "kebab-case")]
    #[allow(dead_code)]
    struct Limits {
        max_nodes: Option<u32>,
    }

    fn error(text: &str) -> String {
        ConfigFile::from_text("/etc/railscope/x.toml", text)
            .parse::<Example>()
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn an_unknown_key_is_named_with_its_line() {
        let e = error("name = \"a\"\n\nintervall = 2\n");
        assert!(
            e.starts_with("/etc/railscope/x.toml:3:1: key `intervall`: unknown field `intervall`"),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
    }

    #[test]
    fn a_bad_value_is_named_with_its_key_and_line() {
        let e = error("name = \"a\"\ninterval = -1\n");
        assert!(
            e.starts_with("/etc/railscope/x.toml:2:12: key `interval`: "),
            "{e}"
        );
        assert!(e.contains("positive number of seconds"), "{e}");
        let e = error("interval = \"fast\"\n");
        assert!(
            e.starts_with("/etc/railscope/x.toml:1:12: key `interval`: "),
            "{e}"
        );
    }

    #[test]
    fn keys_in_tables_are_dotted() {
        let e = error("name = \"a\"\n[limits]\nmax-nodes = \"many\"\n");
        assert!(
            e.starts_with("/etc/railscope/x.toml:3:13: key `limits.max-nodes`: "),
            "{e}"
        );
        let e = error("[limits]\nmax_nodes = 3\n");
        assert!(
            e.starts_with("/etc/railscope/x.toml:2:1: key `limits.max_nodes`: unknown field"),
            "{e}"
        );
    }

    #[test]
    fn a_syntax_error_has_its_line() {
        let e = error("name = \"a\"\ninterval = = 2\n");
        assert!(e.starts_with("/etc/railscope/x.toml:2:"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }

    #[test]
    fn locate_finds_a_key_in_the_text() {
        let file = ConfigFile::from_text("f", "# c\nname = \"a\"\n[limits]\n  max-nodes = 3\n");
        assert_eq!(file.locate("name"), Some(Location { line: 2, column: 1 }));
        assert_eq!(
            file.locate("limits.max-nodes"),
            Some(Location { line: 4, column: 3 })
        );
        assert_eq!(file.locate("interval"), None);
        let e = file
            .error_at_key("limits.max-nodes", "too many")
            .to_string();
        assert_eq!(e, "f:4:3: key `limits.max-nodes`: too many");
    }

    #[test]
    fn a_missing_file_is_named() {
        let e = ConfigFile::read(Path::new("/nonexistent/agent.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("/nonexistent/agent.toml: "), "{e}");
    }
}
