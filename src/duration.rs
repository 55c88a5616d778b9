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
    let mut total = 0f64;
    let mut rest = t;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return Err(format!(
                "{s:?} is not a duration (want e.g. \"20s\", \"1m30s\")"
            ));
        }
        let value: f64 = rest[..num_len]
            .parse()
            .map_err(|_| format!("{s:?}: bad number"))?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let secs = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => return Err(format!("{s:?}: missing unit (ns, us, ms, s, m, h)")),
            u => return Err(format!("{s:?}: unknown unit {u:?} (ns, us, ms, s, m, h)")),
        };
        total += value * secs;
        rest = &rest[unit_len..];
    }
    match Duration::try_from_secs_f64(total) {
        Ok(d) if d <= MAX_DURATION => Ok(d),
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
}
