//! Wall-clock helpers shared by the corridor, the stores' callers and the CLI: unix milliseconds, and
//! RFC 3339 for what people read. Kept here (not in an adapter) because approval expiry and budget
//! windows are policy facts, and core must not need a date crate for one conversion.

use std::time::{SystemTime, UNIX_EPOCH};

/// Unix milliseconds now (0 before 1970, saturating far in the future).
#[must_use]
pub fn now_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

/// `2026-11-30T09:52:58Z` from unix milliseconds (civil-from-days, proleptic Gregorian).
#[must_use]
pub fn rfc3339(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::rfc3339;

    #[test]
    fn rfc3339_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_796_032_378_000), "2026-11-30T09:52:58Z");
        assert_eq!(rfc3339(-1_000), "1969-12-31T23:59:59Z");
    }
}
