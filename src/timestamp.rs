//! Instants as RFC 3339 UTC text with milliseconds
//! (`YYYY-MM-DDTHH:MM:SS.mmmZ`), the one time format of the audit trail,
//! the claims' times and the admin views. Written here, not taken from
//! `humantime`, because that crate refuses instants before 1970, which a
//! skewed clock or a claim time of 0 can give.

use std::time::{SystemTime, UNIX_EPOCH};

/// Format `t` as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC). Instants before 1970 are
/// handled too, so a skewed clock still yields a valid timestamp.
pub fn format_rfc3339_millis(t: SystemTime) -> String {
    let millis: i128 = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_millis() as i128,
        Err(e) => -(e.duration().as_millis() as i128),
    };
    let days = millis.div_euclid(86_400_000);
    let ms_of_day = millis.rem_euclid(86_400_000);
    let (year, month, day) = civil_from_days(days as i64);
    let secs = ms_of_day / 1000;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        secs / 3600,
        (secs / 60) % 60,
        secs % 60,
        ms_of_day % 1000
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day).
/// Howard Hinnant's `civil_from_days`; exact for the whole i64 day range we
/// can meet here, and free of any calendar-crate dependency.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11]
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32; // [1, 31]
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32; // [1, 12]
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(millis_since_epoch: u64) -> String {
        format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(millis_since_epoch))
    }

    #[test]
    fn formats_known_instants() {
        assert_eq!(at(0), "1970-01-01T00:00:00.000Z");
        // `date -u -d @1000000000`
        assert_eq!(at(1_000_000_000_000), "2001-09-09T01:46:40.000Z");
        // `date -u -d @1234567890.123`
        assert_eq!(at(1_234_567_890_123), "2009-02-13T23:31:30.123Z");
        // Leap day and the last millisecond of a day.
        assert_eq!(at(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(at(951_868_799_999), "2000-02-29T23:59:59.999Z");
        // Century non-leap year: 2100-02-28 is followed by 2100-03-01.
        assert_eq!(at(4_107_542_400_000), "2100-03-01T00:00:00.000Z");
        // Year boundary: `date -u -d @1735689599`
        assert_eq!(at(1_735_689_599_500), "2024-12-31T23:59:59.500Z");
        assert_eq!(at(1_735_689_600_000), "2025-01-01T00:00:00.000Z");
    }

    #[test]
    fn formats_instants_before_epoch() {
        let t = UNIX_EPOCH - Duration::from_millis(1);
        assert_eq!(format_rfc3339_millis(t), "1969-12-31T23:59:59.999Z");
        let t = UNIX_EPOCH - Duration::from_secs(86_400 * 365);
        assert_eq!(format_rfc3339_millis(t), "1969-01-01T00:00:00.000Z");
    }
}
