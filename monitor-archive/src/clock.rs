//! The collector's wall clock, in one place: receive times, the live view's ages, findings'
//! passes and the archive's retention all read it here.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in Unix ns (0 for a clock before 1970).
pub fn unix_now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
