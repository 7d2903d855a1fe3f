//! Timestamps as the API writes them (RFC 3339, seconds, UTC; the arithmetic lives in
//! `kumo_apimachinery::time`) and the human durations of the `AGE` column.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Formats seconds since the epoch as `2026-12-02T17:05:00Z`.
pub fn format_rfc3339(secs: i64) -> String {
    kumo_apimachinery::time::format_rfc3339(secs).unwrap_or_default()
}

/// The current time as the API writes it.
pub fn now_rfc3339() -> String {
    format_rfc3339(now_secs())
}

/// Seconds since the epoch.
/// A MicroTime for now: RFC 3339 with six fractional digits.
pub fn now_micro() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = format_rfc3339(i64::try_from(now.as_secs()).unwrap_or(i64::MAX));
    let base = secs.trim_end_matches('Z');
    format!("{base}.{:06}Z", now.subsec_micros())
}

pub fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs() as i64
}

/// Parses an RFC 3339 timestamp into seconds since the epoch.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    kumo_apimachinery::time::parse_rfc3339(s)
}

/// The age of a timestamp as `kubectl get` shows it (upstream's HumanDuration).
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    if secs < 0 {
        return "0s".into();
    }
    let s = secs;
    if s < 60 * 2 {
        return format!("{s}s");
    }
    let m = s / 60;
    if m < 10 {
        let rs = s % 60;
        return if rs == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{rs}s")
        };
    }
    if m < 60 * 3 {
        return format!("{m}m");
    }
    let h = m / 60;
    if h < 8 {
        let rm = m % 60;
        return if rm == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{rm}m")
        };
    }
    if h < 48 {
        return format!("{h}h");
    }
    if h < 24 * 8 {
        let rh = h % 24;
        let d = h / 24;
        return if rh == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{rh}h")
        };
    }
    if h < 24 * 365 * 2 {
        return format!("{}d", h / 24);
    }
    if h < 24 * 365 * 8 {
        let y = h / (24 * 365);
        let dy = (h / 24) % 365;
        return if dy == 0 {
            format!("{y}y")
        } else {
            format!("{y}y{dy}d")
        };
    }
    format!("{}y", h / (24 * 365))
}

/// `AGE` of an RFC 3339 timestamp relative to now; `<unknown>` when absent or unparsable.
pub fn age(timestamp: Option<&str>) -> String {
    match timestamp.and_then(parse_rfc3339) {
        Some(t) => human_duration(now_secs() - t),
        None => "<unknown>".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trip() {
        for secs in [
            0i64,
            1_700_000_000,
            951_782_400,
            4_102_444_800,
            1_798_000_123,
        ] {
            assert_eq!(parse_rfc3339(&format_rfc3339(secs)), Some(secs));
        }
        assert_eq!(format_rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(
            parse_rfc3339("2000-02-29T01:00:00+01:00"),
            Some(951_782_400)
        );
        assert_eq!(
            parse_rfc3339("2000-02-29T00:00:00.123456Z"),
            Some(951_782_400)
        );
        for bad in [
            "",
            "2000-02-29",
            "2000-13-01T00:00:00Z",
            "2000-02-29T00:00:00",
            "x000-02-29T00:00:00Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn human_durations_match_upstream() {
        let cases = [
            (-5, "<invalid>"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (121, "2m1s"),
            (600, "10m"),
            (179 * 60, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 60, "3h1m"),
            (8 * 3600, "8h"),
            (47 * 3600, "47h"),
            (48 * 3600, "2d"),
            (49 * 3600, "2d1h"),
            (8 * 86_400, "8d"),
            (730 * 86_400, "2y"),
            (731 * 86_400, "2y1d"),
            (8 * 365 * 86_400, "8y"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_duration(secs), want, "{secs}");
        }
    }
}
