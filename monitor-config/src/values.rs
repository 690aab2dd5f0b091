//! Value types of settings, checked when parsed from the file or from a flag.

use std::{fmt, str::FromStr, time::Duration};

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

/// A positive number of seconds, whole or not (`1`, `0.1`): intervals and periods.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Seconds(Duration);

/// Why a value cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ValueError(String);

impl Seconds {
    pub fn new(seconds: f64) -> Result<Self, ValueError> {
        Duration::try_from_secs_f64(seconds)
            .ok()
            .filter(|d| !d.is_zero())
            .map(Self)
            .ok_or_else(|| {
                ValueError(format!(
                    "must be a positive number of seconds, not {seconds}"
                ))
            })
    }

    pub fn duration(self) -> Duration {
        self.0
    }
}

impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.as_secs_f64())
    }
}

impl FromStr for Seconds {
    type Err = ValueError;
    fn from_str(text: &str) -> Result<Self, ValueError> {
        let seconds: f64 = text.trim().parse().map_err(|_| {
            ValueError(format!(
                "must be a positive number of seconds, not {text:?}"
            ))
        })?;
        Self::new(seconds)
    }
}

impl Serialize for Seconds {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(self.0.as_secs_f64())
    }
}

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = Seconds;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a positive number of seconds")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Seconds, E> {
                Seconds::new(v).map_err(E::custom)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Seconds, E> {
                Seconds::new(v as f64).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Seconds, E> {
                Seconds::new(v as f64).map_err(E::custom)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// An age such as `30d`, `12h` or `90min` (humantime's units); `0` is allowed and means
/// "no limit" where the setting says so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Age(Duration);

impl Age {
    pub fn duration(self) -> Duration {
        self.0
    }
}

impl From<Duration> for Age {
    fn from(d: Duration) -> Self {
        Self(d)
    }
}

impl fmt::Display for Age {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_zero() {
            f.write_str("0s")
        } else {
            write!(f, "{}", humantime::format_duration(self.0))
        }
    }
}

impl FromStr for Age {
    type Err = ValueError;
    fn from_str(text: &str) -> Result<Self, ValueError> {
        humantime::parse_duration(text.trim())
            .map(Self)
            .map_err(|e| ValueError(format!("{text:?} is not an age such as 30d or 12h: {e}")))
    }
}

impl Serialize for Age {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Age {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_positive_and_finite() {
        assert_eq!(
            "0.1".parse::<Seconds>().unwrap().duration(),
            Duration::from_millis(100)
        );
        assert_eq!(
            "2".parse::<Seconds>().unwrap().duration(),
            Duration::from_secs(2)
        );
        for bad in ["0", "-1", "nan", "inf", "fast", ""] {
            let e = bad.parse::<Seconds>().unwrap_err().to_string();
            assert!(e.contains("positive number of seconds"), "{bad}: {e}");
        }
    }

    #[test]
    fn ages_read_and_write_humantime() {
        let age: Age = "30d".parse().unwrap();
        assert_eq!(age.duration(), Duration::from_secs(30 * 86_400));
        assert_eq!(age.to_string().parse::<Age>().unwrap(), age);
        assert_eq!("0".parse::<Age>().unwrap().duration(), Duration::ZERO);
        assert!(
            "soon"
                .parse::<Age>()
                .unwrap_err()
                .to_string()
                .contains("\"soon\"")
        );
    }
}
