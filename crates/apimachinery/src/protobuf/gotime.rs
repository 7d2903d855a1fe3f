//! The time formats of meta/v1 `Time`, `MicroTime` and `Duration`, as Go prints and parses
//! them: RFC 3339 in UTC (`2006-01-02T15:04:05Z`, with `.000000` for MicroTime) and
//! `time.Duration.String()` / `time.ParseDuration`.

/// Seconds from the Unix epoch to Go's zero time, 0001-01-01T00:00:00Z.
pub(crate) const GO_ZERO_UNIX: i64 = -62_135_596_800;

const NANOS_PER_SEC: i64 = 1_000_000_000;

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// (year, month, day) → days since 1970-01-01.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        _ => 28,
    }
}

/// `secs` (and, for MicroTime, the microseconds) as RFC 3339 in UTC; `None` outside the
/// years 0000–9999 that Go's RFC 3339 parser accepts.
pub(crate) fn format_rfc3339(secs: i64, micros: Option<u32>) -> Option<String> {
    // Keeps the day arithmetic far from overflow; the year check below is the real bound.
    if !(-1_000_000_000_000_000..=1_000_000_000_000_000).contains(&secs) {
        return None;
    }
    let (y, mo, d) = civil_from_days(secs.div_euclid(86_400));
    if !(0..=9999).contains(&y) {
        return None;
    }
    let sod = secs.rem_euclid(86_400);
    let (h, mi, s) = (sod / 3600, sod / 60 % 60, sod % 60);
    Some(match micros {
        None => format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z"),
        Some(us) => format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{us:06}Z"),
    })
}

fn digits(s: &[u8]) -> Option<i64> {
    if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    s.iter().try_fold(0i64, |acc, &b| {
        acc.checked_mul(10)?.checked_add(i64::from(b - b'0'))
    })
}

/// Parses RFC 3339 as Go's `time.Parse(time.RFC3339, s)` does (a fraction after the seconds
/// is accepted): (seconds since the epoch, nanoseconds).
pub(crate) fn parse_rfc3339(s: &str) -> Option<(i64, u32)> {
    let b = s.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let y = digits(&b[0..4])?;
    let mo = u32::try_from(digits(&b[5..7])?).ok()?;
    let d = u32::try_from(digits(&b[8..10])?).ok()?;
    let h = digits(&b[11..13])?;
    let mi = digits(&b[14..16])?;
    let sec = digits(&b[17..19])?;
    if !(1..=12).contains(&mo) || d < 1 || d > days_in_month(y, mo) || h > 23 || mi > 59 || sec > 59
    {
        return None;
    }
    let mut rest = &b[19..];
    let mut nanos: u32 = 0;
    if let Some(frac) = rest.strip_prefix(b".").or_else(|| rest.strip_prefix(b",")) {
        let n = frac.iter().take_while(|c| c.is_ascii_digit()).count();
        if n == 0 {
            return None;
        }
        for (i, &c) in frac[..n].iter().enumerate() {
            if i < 9 {
                nanos += u32::from(c - b'0') * 10u32.pow(8 - i as u32);
            }
        }
        rest = &frac[n..];
    }
    let offset = match rest {
        b"Z" => 0,
        [sign @ (b'+' | b'-'), oh1, oh2, b':', om1, om2] => {
            let oh = digits(&[*oh1, *oh2])?;
            let om = digits(&[*om1, *om2])?;
            if oh > 23 || om > 59 {
                return None;
            }
            let off = oh * 3600 + om * 60;
            if *sign == b'-' {
                -off
            } else {
                off
            }
        }
        _ => return None,
    };
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + sec - offset;
    Some((secs, nanos))
}

/// Go's `time.Duration.String()`.
pub(crate) fn format_duration(d: i64) -> String {
    let neg = d < 0;
    let mut u = d.unsigned_abs();
    // Built backwards, as Go does.
    let mut buf: Vec<u8> = Vec::with_capacity(32);
    fn frac(buf: &mut Vec<u8>, mut v: u64, prec: usize) -> u64 {
        let mut print = false;
        for _ in 0..prec {
            let digit = v % 10;
            print = print || digit != 0;
            if print {
                buf.push(b'0' + digit as u8);
            }
            v /= 10;
        }
        if print {
            buf.push(b'.');
        }
        v
    }
    fn int(buf: &mut Vec<u8>, mut v: u64) {
        if v == 0 {
            buf.push(b'0');
        }
        while v > 0 {
            buf.push(b'0' + (v % 10) as u8);
            v /= 10;
        }
    }
    if u < NANOS_PER_SEC as u64 {
        if u == 0 {
            return "0s".to_string();
        }
        buf.push(b's');
        let prec = if u < 1_000 {
            buf.push(b'n');
            0
        } else if u < 1_000_000 {
            // "µ", U+00B5, reversed.
            buf.extend_from_slice(&[0xb5, 0xc2]);
            3
        } else {
            buf.push(b'm');
            6
        };
        u = frac(&mut buf, u, prec);
        int(&mut buf, u);
    } else {
        buf.push(b's');
        u = frac(&mut buf, u, 9);
        int(&mut buf, u % 60);
        u /= 60;
        if u > 0 {
            buf.push(b'm');
            int(&mut buf, u % 60);
            u /= 60;
            if u > 0 {
                buf.push(b'h');
                int(&mut buf, u);
            }
        }
    }
    if neg {
        buf.push(b'-');
    }
    buf.reverse();
    String::from_utf8(buf).unwrap_or_default()
}

/// Go's `time.ParseDuration`.
pub(crate) fn parse_duration(s: &str) -> Option<i64> {
    let mut rest = s;
    let mut neg = false;
    if let Some(r) = rest.strip_prefix('-') {
        neg = true;
        rest = r;
    } else if let Some(r) = rest.strip_prefix('+') {
        rest = r;
    }
    if rest == "0" {
        return Some(0);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let mut v: u64 = 0;
        for c in rest[..int_len].bytes() {
            v = v.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
        }
        rest = &rest[int_len..];
        let mut f: u64 = 0;
        let mut scale: f64 = 1.0;
        let mut frac_len = 0;
        if let Some(r) = rest.strip_prefix('.') {
            frac_len = r.bytes().take_while(u8::is_ascii_digit).count();
            let mut overflow = false;
            for c in r[..frac_len].bytes() {
                if overflow {
                    continue;
                }
                match f
                    .checked_mul(10)
                    .and_then(|x| x.checked_add(u64::from(c - b'0')))
                {
                    Some(x) if x < (1 << 63) => {
                        f = x;
                        scale *= 10.0;
                    }
                    _ => overflow = true,
                }
            }
            rest = &r[frac_len..];
        }
        if int_len == 0 && frac_len == 0 {
            return None;
        }
        let unit_len = rest
            .char_indices()
            .find(|(_, c)| *c == '.' || c.is_ascii_digit())
            .map_or(rest.len(), |(i, _)| i);
        let unit: u64 = match &rest[..unit_len] {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        rest = &rest[unit_len..];
        v = v.checked_mul(unit)?;
        if f > 0 {
            v = v.checked_add((f as f64 * (unit as f64 / scale)) as u64)?;
        }
        total = total.checked_add(v)?;
        if total > 1 << 63 {
            return None;
        }
    }
    if neg {
        Some((total as i64).wrapping_neg())
    } else if total > i64::MAX as u64 {
        None
    } else {
        Some(total as i64)
    }
}

/// Splits seconds and nanoseconds as Go's `time.Unix(secs, nanos)` normalises them.
pub(crate) fn normalise(secs: i64, nanos: i64) -> (i64, i64) {
    (
        secs.saturating_add(nanos.div_euclid(NANOS_PER_SEC)),
        nanos.rem_euclid(NANOS_PER_SEC),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339() {
        assert_eq!(
            format_rfc3339(0, None).as_deref(),
            Some("1970-01-01T00:00:00Z")
        );
        assert_eq!(
            format_rfc3339(1_700_000_000, Some(123_456)).as_deref(),
            Some("2023-11-14T22:13:20.123456Z")
        );
        assert_eq!(
            format_rfc3339(GO_ZERO_UNIX, None).as_deref(),
            Some("0001-01-01T00:00:00Z")
        );
        assert_eq!(format_rfc3339(253_402_300_800, None), None, "year 10000");
        assert_eq!(format_rfc3339(i64::MIN, None), None);
        assert_eq!(
            parse_rfc3339("2023-11-14T22:13:20Z"),
            Some((1_700_000_000, 0))
        );
        assert_eq!(
            parse_rfc3339("2023-11-14T23:13:20.5+01:00"),
            Some((1_700_000_000, 500_000_000))
        );
        assert_eq!(
            parse_rfc3339("2024-02-29T00:00:00Z").map(|t| t.0),
            Some(1_709_164_800)
        );
        for bad in [
            "",
            "2023-11-14 22:13:20Z",
            "2023-13-14T22:13:20Z",
            "2023-02-29T22:13:20Z",
            "2023-11-14T22:13:20",
            "2023-11-14T22:13:20.Z",
            "2023-11-14T22:13:20+0100",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
        for secs in [
            -62_135_596_800i64,
            -1,
            0,
            86_399,
            951_782_400,
            253_402_300_799,
        ] {
            let s = format_rfc3339(secs, None).expect("formats");
            assert_eq!(parse_rfc3339(&s), Some((secs, 0)), "{s}");
        }
    }

    #[test]
    fn durations() {
        for (d, s) in [
            (0, "0s"),
            (1, "1ns"),
            (1_100, "1.1µs"),
            (2_200_000, "2.2ms"),
            (1_000_000_000, "1s"),
            (90_000_000_000, "1m30s"),
            (3_600_000_000_000, "1h0m0s"),
            (-5_400_000_000_000, "-1h30m0s"),
            (3_723_500_000_000, "1h2m3.5s"),
            (i64::MIN, "-2562047h47m16.854775808s"),
            (i64::MAX, "2562047h47m16.854775807s"),
        ] {
            assert_eq!(format_duration(d), s);
            assert_eq!(parse_duration(s), Some(d), "{s}");
        }
        assert_eq!(parse_duration("1.5h"), Some(5_400_000_000_000));
        assert_eq!(parse_duration("300ms"), Some(300_000_000));
        assert_eq!(parse_duration("1us"), Some(1_000));
        assert_eq!(parse_duration("+2m"), Some(120_000_000_000));
        for bad in [
            "",
            "1",
            "h",
            "1x",
            "-",
            ".s",
            "9999999999999999999h",
            "3000000h",
        ] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }
}
