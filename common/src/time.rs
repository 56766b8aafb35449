//! Unix time as the labels, records and logs of the service write it. A clock before 1970
//! reads as 0; a time past `i64` seconds saturates.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Whole seconds since the epoch of `t`.
pub fn unix_secs(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Whole seconds since the epoch, now.
pub fn unix_now() -> i64 {
    unix_secs(SystemTime::now())
}

/// The time `secs` seconds after the epoch (`None` for a negative or unrepresentable one).
pub fn from_unix_secs(secs: i64) -> Option<SystemTime> {
    UNIX_EPOCH.checked_add(Duration::from_secs(u64::try_from(secs).ok()?))
}
