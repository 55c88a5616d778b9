//! Resource quantities (`resource.Quantity`): `100m`, `1`, `128Mi`, `1G`, `1e3`.
//!
//! Parsed to an exact integer of milli-units (`i128`), enough for every cpu and memory value a
//! pod can carry. Follows apimachinery's `ParseQuantity` grammar: a signed decimal number followed
//! by a binary-SI suffix (`Ki Mi Gi Ti Pi Ei`), a decimal-SI suffix (`n u m k M G T P E`) or a
//! decimal exponent (`e3`, `E-2`).

/// A quantity that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("quantity {value:?} does not parse: {reason}")]
pub struct QuantityError {
    /// The text given.
    pub value: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// Parses a quantity into milli-units (`"100m"` → 100, `"1"` → 1000, `"1Ki"` → 1_024_000).
/// Fractions below one milli-unit round up, as apimachinery's `MilliValue` does.
///
/// Errors: [`QuantityError`] for empty text, a missing number, an unknown suffix or overflow.
pub fn parse_milli(text: &str) -> Result<i128, QuantityError> {
    let err = |reason| QuantityError {
        value: text.to_owned(),
        reason,
    };
    let s = text.trim();
    if s.is_empty() {
        return Err(err("empty"));
    }
    let (neg, s) = match s.as_bytes()[0] {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let num_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(num_end);
    if num.is_empty() || num == "." || num.matches('.').count() > 1 {
        return Err(err("no number"));
    }
    let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
    // value = digits * 10^(exp10) * 2^(exp2), digits an integer.
    let digits: String = format!("{int_part}{frac_part}");
    let digits: i128 = digits.parse().map_err(|_| err("number too large"))?;
    let frac_len = i32::try_from(frac_part.len()).map_err(|_| err("number too long"))?;
    let mut exp10: i32 = -frac_len + 3; // milli-units
    let mut exp2: u32 = 0;
    match suffix {
        "" => {}
        "Ki" => exp2 = 10,
        "Mi" => exp2 = 20,
        "Gi" => exp2 = 30,
        "Ti" => exp2 = 40,
        "Pi" => exp2 = 50,
        "Ei" => exp2 = 60,
        "n" => exp10 -= 9,
        "u" => exp10 -= 6,
        "m" => exp10 -= 3,
        "k" => exp10 += 3,
        "M" => exp10 += 6,
        "G" => exp10 += 9,
        "T" => exp10 += 12,
        "P" => exp10 += 15,
        "E" => exp10 += 18,
        s if s.starts_with(['e', 'E']) => {
            let e: i32 = s[1..].parse().map_err(|_| err("bad exponent"))?;
            exp10 = exp10
                .checked_add(e)
                .ok_or_else(|| err("exponent out of range"))?;
        }
        _ => {
            return Err(err(
                "unknown suffix (use Ki, Mi, Gi, Ti, Pi, Ei, n, u, m, k, M, G, T, P, E or eN)",
            ))
        }
    }
    let mut v = digits
        .checked_mul(1i128 << exp2)
        .ok_or_else(|| err("too large"))?;
    if exp10 >= 0 {
        v = v
            .checked_mul(
                10i128
                    .checked_pow(exp10 as u32)
                    .ok_or_else(|| err("too large"))?,
            )
            .ok_or_else(|| err("too large"))?;
    } else {
        // Round up without overflow; a divisor beyond i128 leaves 1 (a positive fraction).
        match 10i128.checked_pow(exp10.unsigned_abs()) {
            Some(d) if v > 0 => v = (v - 1) / d + 1,
            None if v > 0 => v = 1,
            _ => {}
        }
    }
    // Whole units must fit in an i64 (bytes, millicores ÷ 1000, counts), as apimachinery's do.
    if v > i128::from(i64::MAX) * 1000 {
        return Err(err("too large"));
    }
    Ok(if neg { -v } else { v })
}

/// Parses a quantity into whole units, rounding up (`"128Mi"` → 134217728 bytes).
pub fn parse_value(text: &str) -> Result<i128, QuantityError> {
    parse_milli(text).map(|m| (m + 999).div_euclid(1000))
}

/// The unit an amount is kept in by [`parse_amount`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// Milli-units: cpu in millicores (`"250m"` → 250, `"2"` → 2000).
    Milli,
    /// Whole units, rounded up: bytes, counts (`"128Mi"` → 134217728).
    Whole,
}

/// A quantity that is not a usable amount (see [`parse_amount`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AmountError {
    /// The text is not a quantity.
    #[error(transparent)]
    Parse(#[from] QuantityError),
    /// The quantity is below zero.
    #[error("must not be negative")]
    Negative,
    /// The quantity does not fit in a signed 64-bit integer of its unit; the largest accepted
    /// value is given as a quantity (`9223372036854775807m` for cpu).
    #[error("too large: at most {0} (the largest signed 64-bit integer of its unit)")]
    TooLarge(String),
}

/// Parses a non-negative quantity into an `i64` of `scale` units: cpu as millicores (at most
/// `9223372036854775807m`, about 9.2e15 cpus, so `"1e16"` cpus is refused), memory as bytes,
/// pids as counts (at most `9223372036854775807`).
///
/// Errors: [`AmountError`] when the text is not a quantity, is negative or does not fit.
pub fn parse_amount(text: &str, scale: Scale) -> Result<i64, AmountError> {
    let v = match scale {
        Scale::Milli => parse_milli(text)?,
        Scale::Whole => parse_value(text)?,
    };
    if v < 0 {
        return Err(AmountError::Negative);
    }
    i64::try_from(v).map_err(|_| {
        AmountError::TooLarge(match scale {
            Scale::Milli => format!("{}m", i64::MAX),
            Scale::Whole => i64::MAX.to_string(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubernetes_quantities() {
        for (s, milli) in [
            ("100m", 100),
            ("1", 1000),
            ("0.5", 500),
            ("1Ki", 1_024_000),
            ("1k", 1_000_000),
            ("1e3", 1_000_000),
            ("0", 0),
            ("1m", 1),
            ("0.1m", 1),
            ("250m", 250),
            ("-1", -1000),
        ] {
            assert_eq!(parse_milli(s), Ok(milli), "{s}");
        }
        assert_eq!(parse_value("128Mi"), Ok(134_217_728));
        assert_eq!(parse_value("1G"), Ok(1_000_000_000));
        assert_eq!(
            parse_milli("5e-100"),
            Ok(1),
            "a tiny fraction rounds up to 1m"
        );
        assert_eq!(parse_milli("0.1e-2147483648"), Ok(1));
        assert_eq!(parse_value("7Ei"), Ok(7 << 60));
        for bad in [
            "",
            "abc",
            "1Q",
            "1..2",
            "Mi",
            "1e",
            "1e2147483647",
            "8Ei",
            "9223372036854775808",
        ] {
            assert!(parse_milli(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn amounts_are_non_negative_and_fit_in_an_i64() {
        use Scale::{Milli, Whole};
        let too_large = |s: &str| Err(AmountError::TooLarge(s.into()));
        for (text, scale, want) in [
            ("250m", Milli, Ok(250)),
            ("2", Milli, Ok(2000)),
            ("9223372036854775807m", Milli, Ok(i64::MAX)),
            (
                "9223372036854775808m",
                Milli,
                too_large("9223372036854775807m"),
            ),
            ("1e16", Milli, too_large("9223372036854775807m")),
            ("-1", Milli, Err(AmountError::Negative)),
            ("7Ei", Whole, Ok(7 << 60)),
            ("1e16", Whole, Ok(10_000_000_000_000_000)),
            ("9223372036854775807", Whole, Ok(i64::MAX)),
            ("0", Whole, Ok(0)),
        ] {
            assert_eq!(parse_amount(text, scale), want, "{text}");
        }
        for bad in ["8Ei", "lots", ""] {
            assert!(
                matches!(parse_amount(bad, Whole), Err(AmountError::Parse(_))),
                "{bad}"
            );
        }
    }
}
