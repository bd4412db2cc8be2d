//! Reading the audit command's times (`--before`, `--since`, `--until`): a
//! time, or an age.

use std::time::SystemTime;

use super::error::FilterError;

/// `spec` as an instant: an RFC 3339 UTC time (`2026-11-01T00:00:00Z`,
/// fractions allowed) or an age before `now` in humantime's units (`7d`,
/// `12h`, `1w 2d`, `90min`).
pub fn parse_before(spec: &str, now: SystemTime) -> Result<SystemTime, FilterError> {
    parse_instant("--before", spec, now)
}

/// As [`parse_before`], naming `flag` in its errors.
pub fn parse_instant(flag: &str, spec: &str, now: SystemTime) -> Result<SystemTime, FilterError> {
    let spec = spec.trim();
    if spec.is_empty() {
        return Err(FilterError::NoTime { flag: flag.into() });
    }
    if let Ok(t) = humantime::parse_rfc3339(spec) {
        return Ok(t);
    }
    let age = humantime::parse_duration(spec).map_err(|source| FilterError::NotATime {
        flag: flag.into(),
        spec: spec.into(),
        source,
    })?;
    now.checked_sub(age)
        .ok_or_else(|| FilterError::BeforeClock {
            flag: flag.into(),
            spec: spec.into(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn times_and_ages() {
        let now = humantime::parse_rfc3339("2026-11-30T12:00:00Z").unwrap();
        let t = |s: &str| humantime::format_rfc3339(parse_before(s, now).unwrap()).to_string();
        assert_eq!(t("2026-11-01T00:00:00Z"), "2026-11-01T00:00:00Z");
        assert_eq!(t("7d"), "2026-11-23T12:00:00Z");
        assert_eq!(t("12h"), "2026-11-30T00:00:00Z");
        assert_eq!(t(" 1w 1d "), "2026-11-22T12:00:00Z");
        assert_eq!(parse_before("0s", now).unwrap(), now);
        assert_eq!(
            parse_before("2026-11-01T00:00:00.250Z", now).unwrap(),
            humantime::parse_rfc3339("2026-11-01T00:00:00Z").unwrap() + Duration::from_millis(250)
        );
        for bad in ["", "yesterday", "2026-11-01", "7 parsecs"] {
            assert!(parse_before(bad, now).is_err(), "{bad}");
        }
        assert!(matches!(
            parse_instant("--since", " ", now),
            Err(FilterError::NoTime { flag }) if flag == "--since"
        ));
        let err = parse_instant("--until", "yesterday", now).unwrap_err();
        assert!(
            matches!(&err, FilterError::NotATime { flag, spec, .. } if flag == "--until" && spec == "yesterday"),
            "{err:?}"
        );
        assert!(err
            .to_string()
            .starts_with("--until \"yesterday\" is neither"));
        assert!(matches!(
            parse_before("10000000000000000000s", std::time::UNIX_EPOCH),
            Err(FilterError::BeforeClock { .. })
        ));
    }
}
