//! Layering: built-in defaults, then the configuration file, then the flags given on the
//! command line, each replacing what the one before set.

use std::{fmt, path::Path};

use serde::{Serialize, de::DeserializeOwned};

use crate::{ConfigError, ConfigFile};

/// A command's settings, every one optional so a layer can leave it unset.
///
/// Implementations serialize an unset setting as nothing (`skip_serializing_if`), so the
/// serialized form of a layer holds exactly what it sets.
pub trait Layered: Serialize + DeserializeOwned + Sized {
    /// The built-in defaults (a setting without one stays unset).
    fn defaults() -> Self;
    /// `self` with every setting `over` sets replacing its own; lists are appended to
    /// (`over`'s entries last, so they win where later entries win).
    fn overridden_by(self, over: Self) -> Self;
}

/// Where a command's settings come from: a file (if any) and the flags.
#[derive(Debug)]
pub struct Sources<T> {
    file: Option<(ConfigFile, T)>,
    flags: T,
}

impl<T: Layered + Clone> Sources<T> {
    /// Reads the file `explicit` names (`--config`: it must exist), else `default_path` when
    /// it exists (a node without one runs on flags and defaults).
    pub fn load(
        explicit: Option<&Path>,
        default_path: &Path,
        flags: T,
    ) -> Result<Self, ConfigError> {
        let path = match explicit {
            Some(path) => Some(path),
            None => default_path.exists().then_some(default_path),
        };
        let file = match path {
            Some(path) => {
                let file = ConfigFile::read(path)?;
                let settings = file.parse()?;
                Some((file, settings))
            }
            None => None,
        };
        Ok(Self { file, flags })
    }

    /// Settings from the given file text and flags (tests, fuzzing).
    pub fn from_file(file: ConfigFile, flags: T) -> Result<Self, ConfigError> {
        let settings = file.parse()?;
        Ok(Self {
            file: Some((file, settings)),
            flags,
        })
    }

    /// Settings from flags alone.
    pub fn flags_only(flags: T) -> Self {
        Self { file: None, flags }
    }

    /// The file read, if any.
    pub fn file(&self) -> Option<&ConfigFile> {
        self.file.as_ref().map(|(file, _)| file)
    }

    /// Defaults, then the file, then the flags.
    pub fn merged(&self) -> T {
        let mut settings = T::defaults();
        if let Some((_, from_file)) = &self.file {
            settings = settings.overridden_by(from_file.clone());
        }
        settings.overridden_by(self.flags.clone())
    }

    /// [`Sources::merged`] as TOML: the settings in effect, as `--check-config` prints them.
    pub fn merged_toml(&self) -> String {
        toml::to_string(&self.merged()).unwrap_or_else(|e| format!("# (not shown: {e})\n"))
    }

    /// An error about the setting `key` (as named in the file and, with `--`, as a flag),
    /// pointing where it was set: the flag if given, else its line in the file, else the
    /// built-in default.
    pub fn error(&self, key: &str, message: impl fmt::Display) -> ConfigError {
        if sets(&self.flags, key) {
            return ConfigError::Flag {
                key: key.to_owned(),
                message: message.to_string(),
            };
        }
        match &self.file {
            Some((file, settings)) if sets(settings, key) => file.error_at_key(key, message),
            _ => ConfigError::Setting {
                key: key.to_owned(),
                message: message.to_string(),
            },
        }
    }
}

/// Whether the layer sets `key` (a top-level key).
fn sets<T: Serialize>(layer: &T, key: &str) -> bool {
    toml::Table::try_from(layer).is_ok_and(|table| table.contains_key(key))
}

/// `over` if set, else `base`: the usual [`Layered::overridden_by`] for one setting.
pub fn pick<V>(base: Option<V>, over: Option<V>) -> Option<V> {
    over.or(base)
}

/// For `skip_serializing_if` on switches: an unset switch is `false`.
pub fn is_false(value: &bool) -> bool {
    !*value
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Seconds;

    #[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
    struct Settings {
        #[serde(skip_serializing_if = "Option::is_none")]
        interval: Option<Seconds>,
        #[serde(skip_serializing_if = "Option::is_none")]
        node: Option<String>,
        #[serde(skip_serializing_if = "is_false")]
        json: bool,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        sampling: Vec<String>,
    }

    impl Layered for Settings {
        fn defaults() -> Self {
            Self {
                interval: Some(Seconds::new(1.0).unwrap()),
                ..Self::default()
            }
        }
        fn overridden_by(self, over: Self) -> Self {
            let Self {
                interval,
                node,
                json,
                mut sampling,
            } = self;
            sampling.extend(over.sampling);
            Self {
                interval: pick(interval, over.interval),
                node: pick(node, over.node),
                json: json || over.json,
                sampling,
            }
        }
    }

    fn sources(text: &str, flags: Settings) -> Sources<Settings> {
        Sources::from_file(ConfigFile::from_text("a.toml", text), flags).unwrap()
    }

    #[test]
    fn flags_override_the_file_which_overrides_the_defaults() {
        let s = sources(
            "node = \"n1\"\ninterval = 5\nsampling = [\"a:off\"]\n",
            Settings::default(),
        );
        assert_eq!(s.merged().interval, Some(Seconds::new(5.0).unwrap()));
        assert_eq!(s.merged().node.as_deref(), Some("n1"));
        let flags = Settings {
            interval: Some(Seconds::new(0.5).unwrap()),
            sampling: vec!["a:on".into()],
            ..Settings::default()
        };
        let merged = sources(
            "node = \"n1\"\ninterval = 5\nsampling = [\"a:off\"]\n",
            flags,
        )
        .merged();
        assert_eq!(merged.interval, Some(Seconds::new(0.5).unwrap()));
        assert_eq!(merged.node.as_deref(), Some("n1"));
        // The flag's entry comes last, so it wins over the file's for the same group.
        assert_eq!(merged.sampling, ["a:off", "a:on"]);
        assert_eq!(
            Sources::flags_only(Settings::default()).merged().interval,
            Some(Seconds::new(1.0).unwrap())
        );
    }

    #[test]
    fn an_error_points_where_the_setting_came_from() {
        let s = sources("\nnode = \"n1\"\n", Settings::default());
        assert_eq!(
            s.error("node", "bad").to_string(),
            "a.toml:2:1: key `node`: bad"
        );
        assert_eq!(s.error("interval", "bad").to_string(), "interval: bad");
        let flags = Settings {
            node: Some("n2".into()),
            ..Settings::default()
        };
        let s = sources("\nnode = \"n1\"\n", flags);
        assert_eq!(s.error("node", "bad").to_string(), "--node: bad");
    }

    #[test]
    fn an_explicit_file_must_exist_the_default_one_may_not() {
        let missing = Path::new("/nonexistent/railscope/agent.toml");
        assert!(Sources::load(Some(missing), missing, Settings::default()).is_err());
        let s = Sources::load(None, missing, Settings::default()).unwrap();
        assert!(s.file().is_none());
    }
}
