//! Times as queries write them: `now`, a duration before now (`-15m`, `-2h`, `-1d`), an
//! RFC 3339 time (`2026-09-21T10:00:00Z`) or Unix seconds (`1790000000`, `1790000000.25`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("time {text:?}: expected now, -DURATION (e.g. -15m), an RFC 3339 time or Unix seconds")]
pub struct TimeError {
    pub text: String,
}

/// Now, in Unix ns (0 for a clock before 1970).
pub fn unix_now_ns() -> u64 {
    unix_ns(SystemTime::now())
}

pub fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Parses a query time relative to `now` (Unix ns).
pub fn parse_time(text: &str, now_ns: u64) -> Result<u64, TimeError> {
    let err = || TimeError {
        text: text.to_owned(),
    };
    let t = text.trim();
    if t == "now" {
        return Ok(now_ns);
    }
    if let Some(ago) = t.strip_prefix("now-").or_else(|| t.strip_prefix('-')) {
        let d = humantime::parse_duration(ago).map_err(|_| err())?;
        return Ok(now_ns.saturating_sub(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)));
    }
    if t.starts_with(|c: char| c.is_ascii_digit()) && !t.contains(['-', ':']) {
        return unix_seconds(t).ok_or_else(err);
    }
    humantime::parse_rfc3339_weak(t)
        .map(unix_ns)
        .map_err(|_| err())
}

/// `1790000000` or `1790000000.25`, exactly (no float rounding), to the ns.
fn unix_seconds(t: &str) -> Option<u64> {
    let (whole, frac) = t.split_once('.').unwrap_or((t, ""));
    if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let ns: u64 = format!("{frac:0<9}").parse().ok()?;
    whole
        .parse::<u64>()
        .ok()?
        .checked_mul(1_000_000_000)?
        .checked_add(ns)
}

/// Unix ns as the API's Unix seconds, exact to the ns (what [`parse_time`] reads back).
pub fn api_seconds(ns: u64) -> String {
    format!("{}.{:09}", ns / 1_000_000_000, ns % 1_000_000_000)
}

/// Formats Unix ns as RFC 3339 with milliseconds (UTC).
pub fn format_time(ns: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_nanos(ns)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_in_every_accepted_form() {
        let now = 1_790_000_000_000_000_000;
        assert_eq!(parse_time("now", now), Ok(now));
        assert_eq!(parse_time("-15m", now), Ok(now - 900_000_000_000));
        assert_eq!(parse_time("now-1h", now), Ok(now - 3_600_000_000_000));
        assert_eq!(
            parse_time("1790000000.25", now),
            Ok(1_790_000_000_250_000_000)
        );
        assert_eq!(
            parse_time("2026-09-21T14:13:20Z", now),
            Ok(1_790_000_000_000_000_000)
        );
        assert_eq!(parse_time("1790000000", now), Ok(now));
        assert!(parse_time("1790000000.1234567891", now).is_err());
        assert_eq!(
            format_time(1_790_000_000_250_000_000),
            "2026-09-21T14:13:20.250Z"
        );
        assert_eq!(
            parse_time("yesterday", now).unwrap_err().to_string(),
            "time \"yesterday\": expected now, -DURATION (e.g. -15m), an RFC 3339 time or Unix seconds"
        );
    }
}
