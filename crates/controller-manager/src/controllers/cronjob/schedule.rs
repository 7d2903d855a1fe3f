//! Cron schedules as upstream's controller parses and steps them (robfig/cron v3's standard
//! parser: five fields with ranges, steps, lists and month/day names, the `@yearly` …
//! `@hourly` and `@every <duration>` descriptors, a `TZ=`/`CRON_TZ=` prefix), with Go's
//! time semantics where they show (the error texts, `time.Date` normalisation and its choice
//! of offset around DST changes, the zero time when nothing matches within five years).
//!
//! Times are nanoseconds since the Unix epoch (i128, so Go's zero time, year 1, fits).

use jiff::tz::TimeZone;
use jiff::Timestamp;

const NS: i128 = 1_000_000_000;

/// Go's zero `time.Time` (0001-01-01T00:00:00Z), what `Next` returns when no time matches.
pub const ZERO: i128 = -62_135_596_800 * NS;

/// A parsed schedule (robfig's `cron.Schedule`).
#[derive(Clone, Debug)]
pub enum Schedule {
    /// Five (six, with seconds defaulted to 0) bit sets and the zone they are read in.
    Spec(Spec),
    /// `@every <duration>`: fixed steps of whole seconds (at least one).
    Every(i128),
}

/// robfig's SpecSchedule.
#[derive(Clone, Debug)]
pub struct Spec {
    second: u64,
    minute: u64,
    hour: u64,
    dom: u64,
    month: u64,
    dow: u64,
    tz: TimeZone,
}

/// Set in a field given as `*` or `?` (without a step above 1): day-of-month and
/// day-of-week then have to match both instead of either.
const STAR_BIT: u64 = 1 << 63;

struct Bounds {
    min: u32,
    max: u32,
    names: &'static [(&'static str, u32)],
}

const SECONDS: Bounds = Bounds {
    min: 0,
    max: 59,
    names: &[],
};
const MINUTES: Bounds = Bounds {
    min: 0,
    max: 59,
    names: &[],
};
const HOURS: Bounds = Bounds {
    min: 0,
    max: 23,
    names: &[],
};
const DOM: Bounds = Bounds {
    min: 1,
    max: 31,
    names: &[],
};
const MONTHS: Bounds = Bounds {
    min: 1,
    max: 12,
    names: &[
        ("jan", 1),
        ("feb", 2),
        ("mar", 3),
        ("apr", 4),
        ("may", 5),
        ("jun", 6),
        ("jul", 7),
        ("aug", 8),
        ("sep", 9),
        ("oct", 10),
        ("nov", 11),
        ("dec", 12),
    ],
};
const DOW: Bounds = Bounds {
    min: 0,
    max: 6,
    names: &[
        ("sun", 0),
        ("mon", 1),
        ("tue", 2),
        ("wed", 3),
        ("thu", 4),
        ("fri", 5),
        ("sat", 6),
    ],
};

/// Go's `strconv.Quote` for the ASCII texts schedules are made of.
pub(super) fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Go's `time.LoadLocation`, with its error texts.
pub fn load_location(name: &str) -> Result<TimeZone, String> {
    match name {
        "" | "UTC" => return Ok(TimeZone::UTC),
        "Local" => return Ok(TimeZone::system()),
        _ => {}
    }
    if name.contains("..") || name.starts_with('/') || name.starts_with('\\') {
        return Err("time: invalid location name".into());
    }
    TimeZone::get(name).map_err(|_| format!("unknown time zone {name}"))
}

/// `cron.ParseStandard`: the schedule, or upstream's error text.
pub fn parse_standard(spec: &str) -> Result<Schedule, String> {
    if spec.is_empty() {
        return Err("empty spec string".into());
    }
    let mut spec = spec;
    let mut tz = TimeZone::system();
    if spec.starts_with("TZ=") || spec.starts_with("CRON_TZ=") {
        let eq = spec.find('=').unwrap_or(0);
        let Some(sp) = spec.find(' ') else {
            // robfig slices up to the missing space and panics; upstream recovers the panic.
            return Err(
                "invalid schedule format: runtime error: slice bounds out of range [:-1]".into(),
            );
        };
        if sp < eq + 1 {
            return Err(format!(
                "invalid schedule format: runtime error: slice bounds out of range [{}:{sp}]",
                eq + 1
            ));
        }
        let name = &spec[eq + 1..sp];
        tz = load_location(name).map_err(|e| format!("provided bad location {name}: {e}"))?;
        spec = spec[sp..].trim();
    }
    if spec.starts_with('@') {
        return parse_descriptor(spec, tz);
    }
    let fields: Vec<&str> = spec.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(format!(
            "expected exactly 5 fields, found {}: [{}]",
            fields.len(),
            fields.join(" ")
        ));
    }
    Ok(Schedule::Spec(Spec {
        second: get_field("0", &SECONDS)?,
        minute: get_field(fields[0], &MINUTES)?,
        hour: get_field(fields[1], &HOURS)?,
        dom: get_field(fields[2], &DOM)?,
        month: get_field(fields[3], &MONTHS)?,
        dow: get_field(fields[4], &DOW)?,
        tz,
    }))
}

fn get_field(field: &str, b: &Bounds) -> Result<u64, String> {
    let mut bits = 0;
    for expr in field.split(',').filter(|e| !e.is_empty()) {
        bits |= get_range(expr, b)?;
    }
    Ok(bits)
}

/// Go's `strconv.Atoi` as robfig's mustParseInt uses it.
fn must_parse_int(expr: &str) -> Result<u32, String> {
    let n: i64 = expr.parse().map_err(|e: std::num::ParseIntError| {
        let why = match e.kind() {
            std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow => {
                "value out of range"
            }
            _ => "invalid syntax",
        };
        format!(
            "failed to parse int from {expr}: strconv.Atoi: parsing {}: {why}",
            go_quote(expr)
        )
    })?;
    if n < 0 {
        return Err(format!("negative number ({n}) not allowed: {expr}"));
    }
    // Anything above 63 fails the bounds checks; keep it out of range without wrapping.
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}

fn parse_int_or_name(expr: &str, b: &Bounds) -> Result<u32, String> {
    let lower = expr.to_ascii_lowercase();
    match b.names.iter().find(|(n, _)| *n == lower) {
        Some((_, v)) => Ok(*v),
        None => must_parse_int(expr),
    }
}

fn get_range(expr: &str, b: &Bounds) -> Result<u64, String> {
    let range_and_step: Vec<&str> = expr.split('/').collect();
    let low_high: Vec<&str> = range_and_step[0].split('-').collect();
    let single = low_high.len() == 1;
    let mut extra = 0;
    let (start, mut end) = if low_high[0] == "*" || low_high[0] == "?" {
        extra = STAR_BIT;
        (b.min, b.max)
    } else {
        let start = parse_int_or_name(low_high[0], b)?;
        match low_high.len() {
            1 => (start, start),
            2 => (start, parse_int_or_name(low_high[1], b)?),
            _ => return Err(format!("too many hyphens: {expr}")),
        }
    };
    let step = match range_and_step.len() {
        1 => 1,
        2 => {
            let step = must_parse_int(range_and_step[1])?;
            if single {
                end = b.max;
            }
            if step > 1 {
                extra = 0;
            }
            step
        }
        _ => return Err(format!("too many slashes: {expr}")),
    };
    if start < b.min {
        return Err(format!(
            "beginning of range ({start}) below minimum ({}): {expr}",
            b.min
        ));
    }
    if end > b.max {
        return Err(format!(
            "end of range ({end}) above maximum ({}): {expr}",
            b.max
        ));
    }
    if start > end {
        return Err(format!(
            "beginning of range ({start}) beyond end of range ({end}): {expr}"
        ));
    }
    if step == 0 {
        return Err(format!("step of range should be a positive number: {expr}"));
    }
    let mut bits = 0u64;
    let mut i = start;
    while i <= end {
        bits |= 1 << i;
        i = i.saturating_add(step);
    }
    Ok(bits | extra)
}

fn all(b: &Bounds) -> u64 {
    let mut bits = STAR_BIT;
    for i in b.min..=b.max {
        bits |= 1 << i;
    }
    bits
}

fn parse_descriptor(d: &str, tz: TimeZone) -> Result<Schedule, String> {
    let spec = |minute, hour, dom, month, dow| {
        Ok(Schedule::Spec(Spec {
            second: 1,
            minute,
            hour,
            dom,
            month,
            dow,
            tz: tz.clone(),
        }))
    };
    match d {
        "@yearly" | "@annually" => spec(1, 1, 1 << 1, 1 << 1, all(&DOW)),
        "@monthly" => spec(1, 1, 1 << 1, all(&MONTHS), all(&DOW)),
        "@weekly" => spec(1, 1, all(&DOM), all(&MONTHS), 1),
        "@daily" | "@midnight" => spec(1, 1, all(&DOM), all(&MONTHS), all(&DOW)),
        "@hourly" => spec(1, all(&HOURS), all(&DOM), all(&MONTHS), all(&DOW)),
        _ => match d.strip_prefix("@every ") {
            Some(dur) => {
                let ns = parse_go_duration(dur)
                    .map_err(|e| format!("failed to parse duration {d}: {e}"))?;
                // Every: at least a second, whole seconds.
                let ns = ns.max(NS);
                Ok(Schedule::Every(ns - ns % NS))
            }
            None => Err(format!("unrecognized descriptor: {d}")),
        },
    }
}

/// Go's `time.ParseDuration`, in nanoseconds, with its error texts.
pub fn parse_go_duration(orig: &str) -> Result<i128, String> {
    let invalid = || format!("time: invalid duration {}", go_quote(orig));
    let mut s = orig;
    let mut neg = false;
    if let Some(c) = s.chars().next() {
        if c == '-' || c == '+' {
            neg = c == '-';
            s = &s[1..];
        }
    }
    if s == "0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    const MAX: u128 = 1 << 63;
    let mut d: u128 = 0;
    while !s.is_empty() {
        let b = s.as_bytes();
        if !(b[0] == b'.' || b[0].is_ascii_digit()) {
            return Err(invalid());
        }
        let digits = b.iter().take_while(|c| c.is_ascii_digit()).count();
        let pre = digits > 0;
        let mut v: u128 = 0;
        for c in &b[..digits] {
            v = v * 10 + u128::from(c - b'0');
            if v > MAX {
                return Err(invalid());
            }
        }
        s = &s[digits..];
        let (mut f, mut scale, mut post) = (0u128, 1f64, false);
        if s.starts_with('.') {
            s = &s[1..];
            let fd = s.bytes().take_while(|c| c.is_ascii_digit()).count();
            let mut overflow = false;
            for c in s[..fd].bytes() {
                if overflow {
                    continue;
                }
                if f > (MAX - 1) / 10 {
                    overflow = true;
                    continue;
                }
                let y = f * 10 + u128::from(c - b'0');
                if y > MAX {
                    overflow = true;
                    continue;
                }
                f = y;
                scale *= 10.0;
            }
            post = fd > 0;
            s = &s[fd..];
        }
        if !pre && !post {
            return Err(invalid());
        }
        let ulen = s
            .char_indices()
            .find(|(_, c)| *c == '.' || c.is_ascii_digit())
            .map_or(s.len(), |(i, _)| i);
        if ulen == 0 {
            return Err(format!("time: missing unit in duration {}", go_quote(orig)));
        }
        let u = &s[..ulen];
        s = &s[ulen..];
        let unit: u128 = match u {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => {
                return Err(format!(
                    "time: unknown unit {} in duration {}",
                    go_quote(u),
                    go_quote(orig)
                ))
            }
        };
        if v > MAX / unit {
            return Err(invalid());
        }
        v *= unit;
        if f > 0 {
            v += (f as f64 * (unit as f64 / scale)) as u128;
            if v > MAX {
                return Err(invalid());
            }
        }
        d += v;
        if d > MAX {
            return Err(invalid());
        }
    }
    if neg {
        return Ok(-(d as i128));
    }
    if d > MAX - 1 {
        return Err(invalid());
    }
    Ok(d as i128)
}

// ---------------------------------------------------------------------------------------
// Civil time in a zone, as Go's time package computes it.

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// The zone's UTC offset in seconds at `secs` since the epoch.
fn offset_at(tz: &TimeZone, secs: i64) -> i64 {
    Timestamp::from_second(secs)
        .map(|ts| i64::from(tz.to_offset(ts).seconds()))
        .unwrap_or(0)
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Civil {
    year: i64,
    month: i64,
    day: i64,
    hour: i64,
    minute: i64,
    second: i64,
    weekday: i64,
}

fn civil(tz: &TimeZone, secs: i64) -> Civil {
    let local = secs + offset_at(tz, secs);
    let days = local.div_euclid(86_400);
    let rem = local.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    Civil {
        year,
        month,
        day,
        hour: rem / 3600,
        minute: rem % 3600 / 60,
        second: rem % 60,
        // 1970-01-01 was a Thursday.
        weekday: (days + 4).rem_euclid(7),
    }
}

/// Go's `time.Date`: fields out of range are normalised, and a wall time that does not
/// exist or exists twice gets one of the offsets around the change, as Go chooses it.
fn date(tz: &TimeZone, y: i64, mon: i64, d: i64, h: i64, mi: i64, s: i64) -> i64 {
    let m0 = mon - 1;
    let (y, m) = (y + m0.div_euclid(12), m0.rem_euclid(12) + 1);
    let local = (days_from_civil(y, m, 1) + d - 1) * 86_400 + h * 3600 + mi * 60 + s;
    let off = offset_at(tz, local);
    let utc = local - off;
    let off2 = offset_at(tz, utc);
    if off2 != off {
        local - off2
    } else {
        utc
    }
}

impl Spec {
    fn day_matches(&self, c: &Civil) -> bool {
        let dom = 1u64 << c.day & self.dom > 0;
        let dow = 1u64 << c.weekday & self.dow > 0;
        if self.dom & STAR_BIT > 0 || self.dow & STAR_BIT > 0 {
            dom && dow
        } else {
            dom || dow
        }
    }

    /// robfig's SpecSchedule.Next on whole seconds.
    fn next_secs(&self, t: i64) -> Option<i64> {
        let tz = &self.tz;
        let mut t = t + 1;
        let mut added = false;
        let year_limit = civil(tz, t).year + 5;
        'wrap: loop {
            if civil(tz, t).year > year_limit {
                return None;
            }
            loop {
                let c = civil(tz, t);
                if 1u64 << c.month & self.month != 0 {
                    break;
                }
                if !added {
                    added = true;
                    t = date(tz, c.year, c.month, 1, 0, 0, 0);
                }
                let c = civil(tz, t);
                t = date(tz, c.year, c.month + 1, c.day, c.hour, c.minute, c.second);
                if civil(tz, t).month == 1 {
                    continue 'wrap;
                }
            }
            loop {
                let c = civil(tz, t);
                if self.day_matches(&c) {
                    break;
                }
                if !added {
                    added = true;
                    t = date(tz, c.year, c.month, c.day, 0, 0, 0);
                }
                let c = civil(tz, t);
                t = date(tz, c.year, c.month, c.day + 1, c.hour, c.minute, c.second);
                // Around a DST change midnight may have moved: back to it.
                let h = civil(tz, t).hour;
                if h != 0 {
                    if h > 12 {
                        t += (24 - h) * 3600;
                    } else {
                        t -= h * 3600;
                    }
                }
                if civil(tz, t).day == 1 {
                    continue 'wrap;
                }
            }
            loop {
                let c = civil(tz, t);
                if 1u64 << c.hour & self.hour != 0 {
                    break;
                }
                if !added {
                    added = true;
                    t = date(tz, c.year, c.month, c.day, c.hour, 0, 0);
                }
                t += 3600;
                if civil(tz, t).hour == 0 {
                    continue 'wrap;
                }
            }
            loop {
                let c = civil(tz, t);
                if 1u64 << c.minute & self.minute != 0 {
                    break;
                }
                if !added {
                    added = true;
                    t = t.div_euclid(60) * 60;
                }
                t += 60;
                if civil(tz, t).minute == 0 {
                    continue 'wrap;
                }
            }
            loop {
                let c = civil(tz, t);
                if 1u64 << c.second & self.second != 0 {
                    break;
                }
                added = true;
                t += 1;
                if civil(tz, t).second == 0 {
                    continue 'wrap;
                }
            }
            return Some(t);
        }
    }
}

impl Schedule {
    /// The first activation strictly after `t` (ns since the epoch), or [`ZERO`] when none
    /// comes within five years.
    pub fn next(&self, t: i128) -> i128 {
        let secs = t.div_euclid(NS);
        match self {
            Schedule::Every(d) => secs * NS + d,
            Schedule::Spec(s) => match i64::try_from(secs).ok().and_then(|t| s.next_secs(t)) {
                Some(n) => i128::from(n) * NS,
                None => ZERO,
            },
        }
    }
}

/// A timestamp as nanoseconds since the epoch.
pub fn ns_of(t: Timestamp) -> i128 {
    t.as_nanosecond()
}

/// Nanoseconds since the epoch as a timestamp (clamped to jiff's range).
pub fn ts_of(ns: i128) -> Timestamp {
    Timestamp::from_nanosecond(ns).unwrap_or(if ns < 0 {
        Timestamp::MIN
    } else {
        Timestamp::MAX
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> i128 {
        ns_of(s.parse::<Timestamp>().expect("timestamp"))
    }

    fn next_in(spec: &str, from: &str) -> String {
        let s = parse_standard(spec).expect("valid");
        ts_of(s.next(at(from))).to_string()
    }

    #[test]
    fn fields_ranges_steps_lists_and_names() {
        // In UTC (the zone given explicitly, so the host's does not matter).
        let n = |spec: &str, from: &str| next_in(&format!("TZ=UTC {spec}"), from);
        assert_eq!(
            n("*/5 * * * *", "2026-03-01T10:02:30Z"),
            "2026-03-01T10:05:00Z"
        );
        assert_eq!(
            n("*/5 * * * *", "2026-03-01T10:05:00Z"),
            "2026-03-01T10:10:00Z"
        );
        assert_eq!(
            n("0 9-17/4 * * *", "2026-03-01T10:00:00Z"),
            "2026-03-01T13:00:00Z"
        );
        assert_eq!(
            n("15,45 * * * *", "2026-03-01T10:20:00Z"),
            "2026-03-01T10:45:00Z"
        );
        // 2026-03-01 is a Sunday: the next Monday at midnight.
        assert_eq!(
            n("0 0 * * MON", "2026-03-01T10:00:00Z"),
            "2026-03-02T00:00:00Z"
        );
        assert_eq!(
            n("0 0 1 jan-mar *", "2026-03-01T10:00:00Z"),
            "2027-01-01T00:00:00Z"
        );
        // Day of month and day of week both restricted: either matches.
        assert_eq!(
            n("0 0 13 * fri", "2026-03-01T00:00:00Z"),
            "2026-03-06T00:00:00Z"
        );
        // One of them `*`: both must match (Friday the 13th).
        assert_eq!(
            n("0 0 13 * */1", "2026-03-01T00:00:00Z"),
            "2026-03-13T00:00:00Z"
        );
        assert_eq!(
            n("0 0 29 2 *", "2026-03-01T00:00:00Z"),
            "2028-02-29T00:00:00Z"
        );
        // Never (February 30th): the zero time.
        assert_eq!(
            parse_standard("0 0 30 2 *")
                .expect("valid")
                .next(at("2026-01-01T00:00:00Z")),
            ZERO
        );
    }

    #[test]
    fn descriptors() {
        let n = |spec: &str| next_in(&format!("CRON_TZ=UTC {spec}"), "2026-03-04T10:20:30Z");
        assert_eq!(n("@hourly"), "2026-03-04T11:00:00Z");
        assert_eq!(n("@daily"), "2026-03-05T00:00:00Z");
        assert_eq!(n("@midnight"), "2026-03-05T00:00:00Z");
        assert_eq!(n("@weekly"), "2026-03-08T00:00:00Z");
        assert_eq!(n("@monthly"), "2026-04-01T00:00:00Z");
        assert_eq!(n("@yearly"), "2027-01-01T00:00:00Z");
        assert_eq!(n("@annually"), "2027-01-01T00:00:00Z");
        // @every: fixed steps from the (whole-second) time given.
        let every = parse_standard("@every 1m30s").expect("valid");
        assert_eq!(
            ts_of(every.next(at("2026-03-04T10:20:30.7Z"))).to_string(),
            "2026-03-04T10:22:00Z"
        );
        let short = parse_standard("@every 10ms").expect("valid");
        assert_eq!(short.next(0), NS);
    }

    #[test]
    fn time_zones() {
        // 09:00 in Tokyo (UTC+9, no DST) is 00:00 UTC.
        assert_eq!(
            next_in("TZ=Asia/Tokyo 0 9 * * *", "2026-03-01T01:00:00Z"),
            "2026-03-02T00:00:00Z"
        );
        // New York: 09:00 EST is 14:00Z; after the spring change (2026-03-08) 13:00Z.
        let ny = "TZ=America/New_York 0 9 * * *";
        assert_eq!(next_in(ny, "2026-03-06T15:00:00Z"), "2026-03-07T14:00:00Z");
        assert_eq!(next_in(ny, "2026-03-07T15:00:00Z"), "2026-03-08T13:00:00Z");
        // 02:30 does not exist on the day of the spring change: robfig steps hours from
        // 01:00 EST to 03:00 EDT and skips that day.
        assert_eq!(
            next_in("TZ=America/New_York 30 2 * * *", "2026-03-08T05:00:00Z"),
            "2026-03-09T06:30:00Z"
        );
        // 01:30 happens twice on the autumn change (2026-11-01): the first one.
        assert_eq!(
            next_in("TZ=America/New_York 30 1 * * *", "2026-11-01T04:00:00Z"),
            "2026-11-01T05:30:00Z"
        );
    }

    #[test]
    fn invalid_schedules_have_upstreams_errors() {
        let e = |s: &str| parse_standard(s).expect_err("invalid");
        assert_eq!(e(""), "empty spec string");
        assert_eq!(e("hello"), "expected exactly 5 fields, found 1: [hello]");
        assert_eq!(
            e("* * * *"),
            "expected exactly 5 fields, found 4: [* * * *]"
        );
        assert_eq!(e("61 * * * *"), "end of range (61) above maximum (59): 61");
        assert_eq!(
            e("* * 0 * *"),
            "beginning of range (0) below minimum (1): 0"
        );
        assert_eq!(
            e("5-1 * * * *"),
            "beginning of range (5) beyond end of range (1): 5-1"
        );
        assert_eq!(
            e("*/0 * * * *"),
            "step of range should be a positive number: */0"
        );
        assert_eq!(e("1-2-3 * * * *"), "too many hyphens: 1-2-3");
        assert_eq!(e("*/2/3 * * * *"), "too many slashes: */2/3");
        assert_eq!(
            e("a * * * *"),
            "failed to parse int from a: strconv.Atoi: parsing \"a\": invalid syntax"
        );
        assert_eq!(
            e("* * * foo *"),
            "failed to parse int from foo: strconv.Atoi: parsing \"foo\": invalid syntax"
        );
        assert_eq!(e("@often"), "unrecognized descriptor: @often");
        assert_eq!(
            e("@every 5x"),
            "failed to parse duration @every 5x: time: unknown unit \"x\" in duration \"5x\""
        );
        assert_eq!(
            e("@every 5"),
            "failed to parse duration @every 5: time: missing unit in duration \"5\""
        );
        assert_eq!(
            e("TZ=Mars/Olympus * * * * *"),
            "provided bad location Mars/Olympus: unknown time zone Mars/Olympus"
        );
        assert_eq!(
            e("TZ=UTC"),
            "invalid schedule format: runtime error: slice bounds out of range [:-1]"
        );
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("1h30m"), Ok(5_400 * NS));
        assert_eq!(parse_go_duration("1.5s"), Ok(1_500_000_000));
        assert_eq!(parse_go_duration("-2ms"), Ok(-2_000_000));
        assert_eq!(parse_go_duration("0"), Ok(0));
        assert_eq!(
            parse_go_duration(""),
            Err("time: invalid duration \"\"".to_string())
        );
        assert_eq!(
            parse_go_duration(".s"),
            Err("time: invalid duration \".s\"".to_string())
        );
    }

    #[test]
    fn civil_round_trip() {
        for days in [-719_162, -1, 0, 365, 10_957, 20_513, 2_932_896] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(date(&TimeZone::UTC, 2026, 13, 1, 0, 0, 0), 1_798_761_600);
    }
}
