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

/// An RFC 3339 time (the engine's, a client's), `None` when it is not one.
pub fn parse_rfc3339(t: &str) -> Option<time::OffsetDateTime> {
    time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips_and_refuses_what_is_not_one() {
        let t = rfc3339(1_700_000_000);
        assert_eq!(t, "2023-11-14T22:13:20Z");
        assert_eq!(
            parse_rfc3339(&t).map(|t| t.unix_timestamp()),
            Some(1_700_000_000)
        );
        let offset = parse_rfc3339("2023-11-14T23:13:20.5+01:00").expect("an offset time");
        assert_eq!(
            (offset.unix_timestamp(), offset.millisecond()),
            (1_700_000_000, 500)
        );
        for bad in ["", "yesterday", "2023-11-14", "22:13:20Z"] {
            assert!(parse_rfc3339(bad).is_none(), "{bad}");
        }
    }
}
