//! Time, injected: logic that waits or compares times reads a [`Clock`] instead of the system's,
//! so that its tests run on fake time, with no sleeping.
//!
//! Two readings: a monotonic [`Instant`] (deadlines, periods, "newer than") and the wall clock in
//! nanoseconds since the Unix epoch (the runtime's timestamps: container start and finish times,
//! back-off since a container exited). [`SystemClock`] reads the machine's clocks; [`FakeClock`]
//! moves only when a test advances it. Async code waits with tokio's time, which tests pause.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of time.
pub trait Clock: Send + Sync + 'static {
    /// Monotonic time.
    fn now(&self) -> Instant;
    /// Wall-clock time, nanoseconds since the Unix epoch.
    fn epoch_ns(&self) -> i64;
}

/// The clock handle components keep.
pub type SharedClock = Arc<dyn Clock>;

/// The machine's clocks.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn epoch_ns(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64)
    }
}

/// The system clock as a [`SharedClock`].
pub fn system() -> SharedClock {
    Arc::new(SystemClock)
}

/// A clock that stands still until [`FakeClock::advance`] moves it. Cheap to clone; clones
/// share the time.
#[derive(Debug, Clone)]
pub struct FakeClock(Arc<Mutex<(Instant, i64)>>);

impl FakeClock {
    /// A clock at the real monotonic now and at `epoch_ns` on the wall clock.
    pub fn new(epoch_ns: i64) -> Self {
        Self(Arc::new(Mutex::new((Instant::now(), epoch_ns))))
    }

    /// Moves both readings forward by `d`.
    pub fn advance(&self, d: Duration) {
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        t.0 += d;
        t.1 += d.as_nanos() as i64;
    }

    /// This clock as a [`SharedClock`].
    pub fn shared(&self) -> SharedClock {
        Arc::new(self.clone())
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Instant {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    fn epoch_ns(&self) -> i64 {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fake_clock_moves_only_when_advanced_and_clones_share_it() {
        let c = FakeClock::new(1_000);
        let (t0, e0) = (c.now(), c.epoch_ns());
        let shared = c.shared();
        c.advance(Duration::from_millis(1500));
        assert_eq!(shared.now() - t0, Duration::from_millis(1500));
        assert_eq!(shared.epoch_ns() - e0, 1_500_000_000);
        assert!(SystemClock.epoch_ns() > 1_700_000_000_000_000_000);
    }
}
