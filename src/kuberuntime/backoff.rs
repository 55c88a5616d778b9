//! Back-off per key (kubelet's `flowcontrol.Backoff`), for container restarts (CrashLoopBackOff)
//! and image pulls (ImagePullBackOff).
//!
//! The first failure sets the delay to `initial`; each failure within the window doubles it up to
//! `max`; an entry whose last failure is more than `2 * max` old starts over (so a container that
//! ran cleanly for 10 minutes under the default 5-minute cap is back to 10 s). Times are
//! wall-clock nanoseconds passed in by the caller (from its injected clock), so tests need no
//! clock.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// Invalid back-off bounds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("back-off initial {initial:?} must be greater than 0 and at most max {max:?}")]
pub struct BackoffError {
    /// The initial delay given.
    pub initial: Duration,
    /// The cap given.
    pub max: Duration,
}

/// Validated back-off bounds: the first delay and the cap, with `0 < initial <= max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffPolicy {
    initial: Duration,
    max: Duration,
}

impl BackoffPolicy {
    /// kubelet's container restart and image pull back-off: 10s doubling to 300s.
    pub const KUBELET: Self = Self {
        initial: Duration::from_secs(10),
        max: Duration::from_secs(300),
    };

    /// Bounds from `initial` doubling to `max`.
    ///
    /// Errors: [`BackoffError`] when `initial` is zero or above `max`.
    pub fn try_new(initial: Duration, max: Duration) -> Result<Self, BackoffError> {
        if initial.is_zero() || initial > max {
            return Err(BackoffError { initial, max });
        }
        Ok(Self { initial, max })
    }

    /// The first delay.
    pub fn initial(&self) -> Duration {
        self.initial
    }

    /// The longest delay.
    pub fn max(&self) -> Duration {
        self.max
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    delay: Duration,
    last_update_ns: i64,
}

/// Delays per key.
#[derive(Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    entries: Mutex<HashMap<String, Entry>>,
}

fn ns(d: Duration) -> i64 {
    crate::clock::duration_ns(d)
}

impl Backoff {
    /// Back-off within validated bounds.
    pub fn new(policy: BackoffPolicy) -> Self {
        Self {
            initial: policy.initial,
            max: policy.max,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// Back-off from `initial` doubling to `max`.
    ///
    /// Errors: [`BackoffError`] when `initial` is zero or above `max`.
    pub fn try_new(initial: Duration, max: Duration) -> Result<Self, BackoffError> {
        BackoffPolicy::try_new(initial, max).map(Self::new)
    }

    fn expired(&self, e: &Entry, at_ns: i64) -> bool {
        at_ns - e.last_update_ns > 2 * ns(self.max)
    }

    /// Records a failure at `event_ns` and returns the delay now in force for `key`.
    pub fn next(&self, key: &str, event_ns: i64) -> Duration {
        let mut m = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let delay = match m.get(key) {
            Some(e) if !self.expired(e, event_ns) => (e.delay * 2).min(self.max),
            _ => self.initial,
        };
        m.insert(
            key.to_owned(),
            Entry {
                delay,
                last_update_ns: event_ns,
            },
        );
        delay
    }

    /// How much longer `key` must wait after a failure at `event_ns`, seen at `now_ns`; `None`
    /// when it need not wait (kubelet's `IsInBackOffSince`).
    pub fn remaining(&self, key: &str, event_ns: i64, now_ns: i64) -> Option<Duration> {
        let m = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let e = m.get(key)?;
        if self.expired(e, now_ns) {
            return None;
        }
        let left = ns(e.delay) - (now_ns - event_ns);
        (left > 0).then(|| Duration::from_nanos(left as u64))
    }

    /// How much longer `key` must wait counting from its last recorded failure, seen at
    /// `now_ns` (kubelet's `IsInBackOffSinceUpdate`, used for image pulls).
    pub fn remaining_since_update(&self, key: &str, now_ns: i64) -> Option<Duration> {
        let last = self
            .entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)?
            .last_update_ns;
        self.remaining(key, last, now_ns)
    }

    /// The delay currently recorded for `key`.
    pub fn current(&self, key: &str) -> Option<Duration> {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .map(|e| e.delay)
    }

    /// Forgets every key starting with `prefix` (a pod that is gone).
    pub fn forget_prefix(&self, prefix: &str) {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| !k.starts_with(prefix));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;

    #[test]
    fn delays_double_to_the_cap_and_reset_after_twice_the_cap() {
        let b = Backoff::try_new(Duration::from_secs(10), Duration::from_secs(300)).unwrap();
        // First failure: no wait yet, delay 10s from now on.
        assert_eq!(b.remaining("c", 0, 0), None);
        assert_eq!(b.next("c", 0), Duration::from_secs(10));
        assert_eq!(b.remaining("c", 0, 4 * S), Some(Duration::from_secs(6)));
        assert_eq!(b.remaining("c", 0, 10 * S), None);
        let mut t = 10 * S;
        let mut seen = vec![];
        for _ in 0..7 {
            seen.push(b.next("c", t).as_secs());
            t += 5 * S;
        }
        assert_eq!(seen, vec![20, 40, 80, 160, 300, 300, 300]);
        // Ten clean minutes (> 2 * 300s) later: back to the initial delay.
        assert_eq!(b.next("c", t + 601 * S), Duration::from_secs(10));
        assert_eq!(b.remaining("other", 0, 0), None);
        b.forget_prefix("c");
        assert_eq!(b.current("c"), None);
    }

    #[test]
    fn bounds_are_validated() {
        assert!(Backoff::try_new(Duration::ZERO, Duration::from_secs(1)).is_err());
        assert!(Backoff::try_new(Duration::from_secs(2), Duration::from_secs(1)).is_err());
        assert!(Backoff::try_new(Duration::from_secs(1), Duration::from_secs(1)).is_ok());
        let kubelet = BackoffPolicy::KUBELET;
        assert_eq!(
            (kubelet.initial(), kubelet.max()),
            (Duration::from_secs(10), Duration::from_secs(300))
        );
    }
}
