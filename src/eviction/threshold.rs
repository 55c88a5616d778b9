//! Eviction thresholds (kubelet's `ParseThresholdConfig` in `eviction/helpers.go`).
//!
//! The configuration gives maps from signal to value: `evictionHard`, `evictionSoft` (each soft
//! threshold needs an `evictionSoftGracePeriod`), `evictionMinimumReclaim`. A value is a quantity
//! (`100Mi`, a count for inodes and pids) or a percentage of capacity (`10%`). The operator is
//! always "less than". `0%` and `100%` disable a threshold; a zero or negative quantity is an
//! error, as is an unknown signal or a malformed value.

use std::collections::BTreeMap;
use std::time::Duration;

/// The signals nodelet knows (kubelet's names).
pub const SIGNALS: &[&str] = &[
    "memory.available",
    "allocatableMemory.available",
    "nodefs.available",
    "nodefs.inodesFree",
    "imagefs.available",
    "imagefs.inodesFree",
    "pid.available",
];

/// kubelet's default `evictionHard`.
pub fn default_hard() -> BTreeMap<String, String> {
    [
        ("memory.available", "100Mi"),
        ("nodefs.available", "10%"),
        ("nodefs.inodesFree", "5%"),
        ("imagefs.available", "15%"),
        ("imagefs.inodesFree", "5%"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// A threshold value: an absolute amount (bytes, inodes or pids) or a fraction of capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ThresholdValue {
    /// Absolute amount.
    Quantity(i64),
    /// Fraction of capacity, 0 < f < 1.
    Percentage(f64),
}

impl ThresholdValue {
    /// The amount for a resource with `capacity`.
    pub fn amount(self, capacity: i64) -> i64 {
        match self {
            Self::Quantity(q) => q,
            // `as` from f64 saturates (and NaN is 0): a percentage of an i64 capacity fits.
            #[allow(clippy::cast_possible_truncation)]
            Self::Percentage(p) => (capacity as f64 * p) as i64,
        }
    }
}

/// One threshold: met when the signal's available amount is strictly below `value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    /// Signal name.
    pub signal: String,
    /// The value.
    pub value: ThresholdValue,
    /// Zero for hard thresholds; how long a soft one must hold before it acts.
    pub grace_period: Duration,
    /// Extra amount to reclaim beyond the threshold.
    pub min_reclaim: Option<ThresholdValue>,
}

/// A threshold that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {signal}={value:?}: {reason}")]
pub struct ThresholdError {
    /// `evictionHard`, `evictionSoft`, `evictionSoftGracePeriod` or `evictionMinimumReclaim`.
    pub field: &'static str,
    /// The signal.
    pub signal: String,
    /// The value given.
    pub value: String,
    /// What is wrong.
    pub reason: String,
}

/// Parses a value; `Ok(None)` for a disabled threshold (`0%`, `100%`).
fn parse_value(
    field: &'static str,
    signal: &str,
    value: &str,
    allow_zero: bool,
) -> Result<Option<ThresholdValue>, ThresholdError> {
    let err = |reason: &str| ThresholdError {
        field,
        signal: signal.into(),
        value: value.into(),
        reason: reason.into(),
    };
    if !SIGNALS.contains(&signal) {
        return Err(err(&format!(
            "unknown signal; known: {}",
            SIGNALS.join(", ")
        )));
    }
    let v = value.trim();
    if let Some(p) = v.strip_suffix('%') {
        let p: f64 = p.parse().map_err(|_| err("not a percentage"))?;
        if !(0.0..=100.0).contains(&p) {
            return Err(err("a percentage must be between 0% and 100%"));
        }
        if !allow_zero && (p == 0.0 || p == 100.0) {
            return Ok(None);
        }
        return Ok(Some(ThresholdValue::Percentage(p / 100.0)));
    }
    let q = crate::quantity::parse_value(v).map_err(|e| err(&e.to_string()))?;
    if q < 0 || (q == 0 && !allow_zero) {
        return Err(err("must be positive"));
    }
    let q = i64::try_from(q).map_err(|_| err("too large"))?;
    Ok(Some(ThresholdValue::Quantity(q)))
}

/// Builds the thresholds from the configuration maps.
///
/// Errors: the first [`ThresholdError`] (unknown signal, malformed or non-positive value, soft
/// threshold without a grace period, grace period that is not a duration).
pub fn parse_thresholds(
    hard: &BTreeMap<String, String>,
    soft: &BTreeMap<String, String>,
    soft_grace: &BTreeMap<String, String>,
    min_reclaim: &BTreeMap<String, String>,
) -> Result<Vec<Threshold>, ThresholdError> {
    let mut reclaim = BTreeMap::new();
    for (signal, v) in min_reclaim {
        if let Some(val) = parse_value("evictionMinimumReclaim", signal, v, true)? {
            reclaim.insert(signal.clone(), val);
        }
    }
    // The amount to reclaim to is the threshold plus its minimum reclaim: both absolute, their
    // sum must fit (percentages are fractions of a capacity that fits).
    let checked_reclaim = |field: &str, signal: &String, value: ThresholdValue| {
        let r = reclaim.get(signal).copied();
        if let (ThresholdValue::Quantity(q), Some(ThresholdValue::Quantity(m))) = (value, r) {
            if q.checked_add(m).is_none() {
                return Err(ThresholdError {
                    field: "evictionMinimumReclaim",
                    signal: signal.clone(),
                    value: min_reclaim[signal].clone(),
                    reason: format!(
                        "added to the {field} threshold it is more than {} in all",
                        i64::MAX
                    ),
                });
            }
        }
        Ok(r)
    };
    let mut out = Vec::new();
    for (signal, v) in hard {
        if let Some(value) = parse_value("evictionHard", signal, v, false)? {
            out.push(Threshold {
                signal: signal.clone(),
                value,
                grace_period: Duration::ZERO,
                min_reclaim: checked_reclaim("evictionHard", signal, value)?,
            });
        }
    }
    for (signal, v) in soft {
        let Some(value) = parse_value("evictionSoft", signal, v, false)? else {
            continue;
        };
        let grace = soft_grace.get(signal).ok_or_else(|| ThresholdError {
            field: "evictionSoft",
            signal: signal.clone(),
            value: v.clone(),
            reason: format!("a soft threshold needs an evictionSoftGracePeriod for {signal}"),
        })?;
        let grace_period =
            crate::duration::parse_go_duration(grace).map_err(|reason| ThresholdError {
                field: "evictionSoftGracePeriod",
                signal: signal.clone(),
                value: grace.clone(),
                reason,
            })?;
        out.push(Threshold {
            signal: signal.clone(),
            value,
            grace_period,
            min_reclaim: checked_reclaim("evictionSoft", signal, value)?,
        });
    }
    for signal in soft_grace.keys() {
        if !soft.contains_key(signal) {
            return Err(ThresholdError {
                field: "evictionSoftGracePeriod",
                signal: signal.clone(),
                value: soft_grace[signal].clone(),
                reason: "no evictionSoft threshold for this signal".into(),
            });
        }
    }
    Ok(out)
}

/// True when `available` is strictly below the threshold for a resource of `capacity`.
pub fn is_met(t: &Threshold, available: i64, capacity: i64) -> bool {
    available < t.value.amount(capacity)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn kubelets_defaults_parse() {
        let t = parse_thresholds(
            &default_hard(),
            &BTreeMap::new(),
            &BTreeMap::new(),
            &BTreeMap::new(),
        )
        .unwrap();
        assert_eq!(t.len(), 5);
        let mem = t.iter().find(|t| t.signal == "memory.available").unwrap();
        assert_eq!(mem.value, ThresholdValue::Quantity(100 << 20));
        let nodefs = t.iter().find(|t| t.signal == "nodefs.available").unwrap();
        assert_eq!(nodefs.value.amount(1000), 100);
    }

    #[test]
    fn zero_and_hundred_percent_disable_and_bad_values_are_errors() {
        let t = parse_thresholds(
            &map(&[("memory.available", "0%"), ("nodefs.available", "100%")]),
            &BTreeMap::new(),
            &BTreeMap::new(),
            &BTreeMap::new(),
        )
        .unwrap();
        assert!(t.is_empty());
        for (signal, value) in [
            ("memory.available", "0"),
            ("memory.available", "-1Mi"),
            ("memory.available", "lots"),
            ("memory.available", "150%"),
            ("cpu.available", "1"),
        ] {
            let e = parse_thresholds(
                &map(&[(signal, value)]),
                &BTreeMap::new(),
                &BTreeMap::new(),
                &BTreeMap::new(),
            )
            .unwrap_err();
            assert_eq!(
                (e.field, e.signal.as_str()),
                ("evictionHard", signal),
                "{value}: {e}"
            );
        }
    }

    #[test]
    fn soft_thresholds_need_a_grace_period_and_carry_min_reclaim() {
        let soft = map(&[("memory.available", "500Mi")]);
        let e = parse_thresholds(&BTreeMap::new(), &soft, &BTreeMap::new(), &BTreeMap::new())
            .unwrap_err();
        assert_eq!((e.field, e.value.as_str()), ("evictionSoft", "500Mi"));
        let e = parse_thresholds(
            &BTreeMap::new(),
            &soft,
            &map(&[("memory.available", "soon")]),
            &BTreeMap::new(),
        )
        .unwrap_err();
        assert_eq!(e.value, "soon");
        let e = parse_thresholds(
            &BTreeMap::new(),
            &BTreeMap::new(),
            &map(&[("memory.available", "1m")]),
            &BTreeMap::new(),
        )
        .unwrap_err();
        assert_eq!(e.field, "evictionSoftGracePeriod");
        let t = parse_thresholds(
            &BTreeMap::new(),
            &soft,
            &map(&[("memory.available", "1m30s")]),
            &map(&[("memory.available", "0.5Gi")]),
        )
        .unwrap();
        assert_eq!(t[0].grace_period, Duration::from_secs(90));
        assert_eq!(t[0].min_reclaim, Some(ThresholdValue::Quantity(512 << 20)));
        // A threshold and its minimum reclaim whose sum does not fit in an i64.
        let big = map(&[("memory.available", "7Ei")]);
        let grace = map(&[("memory.available", "1m")]);
        for (hard, soft, grace) in [
            (&big, &BTreeMap::new(), &BTreeMap::new()),
            (&BTreeMap::new(), &big, &grace),
        ] {
            let e = parse_thresholds(hard, soft, grace, &big).unwrap_err();
            assert_eq!(
                (e.field, e.signal.as_str(), e.value.as_str()),
                ("evictionMinimumReclaim", "memory.available", "7Ei"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_threshold_is_met_only_strictly_below() {
        let t = Threshold {
            signal: "memory.available".into(),
            value: ThresholdValue::Quantity(100),
            grace_period: Duration::ZERO,
            min_reclaim: None,
        };
        assert!(is_met(&t, 99, 1000));
        assert!(!is_met(&t, 100, 1000));
    }
}
