//! Go-style durations (`"20s"`, `"1m30s"`, `"100ms"`), as kubelet's `metav1.Duration` writes them
//! in the configuration file: [`GoDuration`] with its parser and printer.
//!
//! A module of its own so that the configuration and the eviction thresholds (which parse
//! `evictionSoftGracePeriod`) share it without importing each other.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A Go-style duration as kubelet's `metav1.Duration` writes it; (de)serializes as its string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct GoDuration(pub Duration);

impl TryFrom<String> for GoDuration {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        parse_go_duration(&s).map(GoDuration)
    }
}

impl From<GoDuration> for String {
    fn from(d: GoDuration) -> String {
        format_go_duration(d.0)
    }
}

/// Longest duration accepted in the configuration: one year (8760h).
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Parses a Go duration string: a sequence of `<number><unit>` with units `ns`, `us`, `ms`, `s`,
/// `m`, `h` (fractions allowed, e.g. `1.5s`). A bare `0` is zero.
///
/// Errors: a message naming the string when it is empty, negative, has an unknown or missing
/// unit, or is longer than [`MAX_DURATION`].
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    if t.is_empty() || t.starts_with('-') {
        return Err(format!(
            "{s:?} is not a duration (want e.g. \"20s\", \"1m30s\")"
        ));
    }
    // Integer nanoseconds, as Go's time.ParseDuration counts: no float rounding, so what
    // format_go_duration prints parses back to the same value.
    let too_large = || format!("{s:?} is too large (at most 8760h)");
    let mut total_ns: u128 = 0;
    let mut rest = t;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (int_part, frac_part) = rest[..num_len]
            .split_once('.')
            .unwrap_or((&rest[..num_len], ""));
        if num_len == 0 || (int_part.is_empty() && frac_part.is_empty()) {
            return Err(format!(
                "{s:?} is not a duration (want e.g. \"20s\", \"1m30s\")"
            ));
        }
        if frac_part.contains('.') {
            return Err(format!("{s:?}: bad number"));
        }
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit_ns: u128 = match &rest[..unit_len] {
            "ns" => 1,
            "us" | "µs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(format!("{s:?}: missing unit (ns, us, ms, s, m, h)")),
            u => return Err(format!("{s:?}: unknown unit {u:?} (ns, us, ms, s, m, h)")),
        };
        rest = &rest[unit_len..];
        let int: u128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| too_large())?
        };
        // Digits past the 20th cannot reach a nanosecond of an hour; Go truncates the same way.
        let frac_digits = &frac_part[..frac_part.len().min(20)];
        let frac: u128 = if frac_digits.is_empty() {
            0
        } else {
            frac_digits
                .parse()
                .map_err(|_| format!("{s:?}: bad number"))?
        };
        let part = int
            .checked_mul(unit_ns)
            .and_then(|v| {
                let scale = u32::try_from(frac_digits.len())
                    .ok()
                    .and_then(|n| 10u128.checked_pow(n))?;
                v.checked_add(frac * unit_ns / scale)
            })
            .ok_or_else(too_large)?;
        total_ns = total_ns.checked_add(part).ok_or_else(too_large)?;
    }
    let secs = u64::try_from(total_ns / 1_000_000_000).map_err(|_| too_large())?;
    match Duration::new(secs, (total_ns % 1_000_000_000) as u32) {
        d if d <= MAX_DURATION => Ok(d),
        _ => Err(format!("{s:?} is too large (at most 8760h)")),
    }
}

/// Formats a duration the way Go prints it for whole units (`"1m0s"`, `"20s"`, `"100ms"`).
pub fn format_go_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if d.is_zero() {
        return "0s".into();
    }
    if ms == 0 {
        return format!("{}ns", d.as_nanos());
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = d.as_secs();
    let frac = d.subsec_millis();
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    let sec = if frac > 0 {
        format!("{s}.{frac:03}s")
    } else {
        format!("{s}s")
    };
    match (h, m) {
        (0, 0) => sec,
        (0, m) => format!("{m}m{sec}"),
        (h, m) => format!("{h}h{m}m{sec}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse_like_go() {
        for (s, ms) in [
            ("20s", 20_000),
            ("1m", 60_000),
            ("1m30s", 90_000),
            ("100ms", 100),
            ("1.5s", 1500),
            ("2h", 7_200_000),
            ("0", 0),
        ] {
            assert_eq!(parse_go_duration(s).unwrap().as_millis(), ms, "{s}");
        }
        for bad in [
            "",
            "20",
            "-1s",
            "1x",
            "s",
            "99999999999999999999999s",
            "99999999999999h",
        ] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(format_go_duration(Duration::from_secs(60)), "1m0s");
        assert_eq!(format_go_duration(Duration::from_secs(20)), "20s");
    }

    #[test]
    fn parses_in_integer_nanoseconds_as_go_does() {
        // Float seconds gave 19688954.706999999s for this one (found by tests/properties.rs).
        let d = Duration::from_millis(19_688_954_707);
        assert_eq!(parse_go_duration(&format_go_duration(d)), Ok(d));
        assert_eq!(parse_go_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_go_duration(".5s"), Ok(Duration::from_millis(500)));
        assert_eq!(
            parse_go_duration("1.000000000000000000000001s"),
            Ok(Duration::from_secs(1))
        );
        assert!(parse_go_duration(".s").is_err());
        assert!(parse_go_duration("1..5s").is_err());
        assert!(parse_go_duration("99999999999999999999999999999999999999999h").is_err());
    }
}
