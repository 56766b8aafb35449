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

/// Whole milliseconds since the epoch, now.
pub fn unix_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The time `secs` seconds after the epoch (`None` for a negative or unrepresentable one).
pub fn from_unix_secs(secs: i64) -> Option<SystemTime> {
    UNIX_EPOCH.checked_add(Duration::from_secs(u64::try_from(secs).ok()?))
}

/// `unix` seconds as RFC 3339 (UTC), as the API writes times; empty for one out of range.
pub fn rfc3339(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}
