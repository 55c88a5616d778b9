//! Time, injected: logic that waits or compares times reads a [`Clock`] instead of the system's,
//! so that its tests run on fake time, with no sleeping.
//!
//! Two readings: a monotonic [`Instant`] (deadlines, periods, "newer than") and the wall clock in
//! nanoseconds since the Unix epoch (the runtime's timestamps: container start and finish times,
//! back-off since a container exited). Threads that wait in `crossbeam_channel::select!` take
//! their timers from [`Clock::after`]. [`SystemClock`] reads the machine's clocks; [`FakeClock`]
//! moves only when a test advances it, and fires the timers then due. Async code waits with
//! tokio's time, which tests pause.
//!
//! This is the one module that reads or waits on the machine's clocks: `clippy.toml` refuses
//! `Instant::now`, `SystemTime::now`, `std::thread::sleep` and `tokio::time::sleep` anywhere else
//! outside test code (`tests/lint_rules.rs` shows it). The few places that truly want the
//! machine's time (a CRI call's duration for a metric, a log file's age) say so by calling
//! [`monotonic_now`], [`wall_now`], [`Stopwatch`], [`sleep`] or [`sleep_blocking`].
#![allow(clippy::disallowed_methods)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, Sender};

/// A source of time.
pub trait Clock: Send + Sync + 'static {
    /// Monotonic time.
    fn now(&self) -> Instant;
    /// Wall-clock time, nanoseconds since the Unix epoch.
    fn epoch_ns(&self) -> i64;
    /// A channel that receives the time once, `d` from now (`crossbeam_channel::after` on this
    /// clock).
    fn after(&self, d: Duration) -> Receiver<Instant>;
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
            .map_or(0, duration_ns)
    }

    fn after(&self, d: Duration) -> Receiver<Instant> {
        crossbeam_channel::after(d)
    }
}

/// The system clock as a [`SharedClock`].
pub fn system() -> SharedClock {
    Arc::new(SystemClock)
}

/// `d` in nanoseconds, saturated at `i64::MAX` (292 years), the unit of the runtime's
/// timestamps.
pub fn duration_ns(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// The machine's monotonic time, for what is measured rather than decided (a call's duration
/// for a metric or a log line). Logic that decides by time takes a [`SharedClock`].
pub fn monotonic_now() -> Instant {
    Instant::now()
}

/// The machine's wall-clock time, for timestamps written out (events, statuses, file times).
pub fn wall_now() -> SystemTime {
    SystemTime::now()
}

/// Waits `d` on tokio's timer (paused and auto-advanced in `start_paused` tests).
pub async fn sleep(d: Duration) {
    tokio::time::sleep(d).await;
}

/// Blocks this thread for `d`. Only for threads that own nothing else to do meanwhile (a
/// retry loop of a dedicated thread); a thread that also waits on channels takes
/// [`Clock::after`].
pub fn sleep_blocking(d: Duration) {
    std::thread::sleep(d);
}

/// Measures elapsed machine time from its start (a CRI call, a relist, a housekeeping pass).
#[derive(Debug, Clone, Copy)]
pub struct Stopwatch(Instant);

impl Stopwatch {
    /// Starts now.
    pub fn start() -> Self {
        Self(Instant::now())
    }

    /// Time since the start.
    pub fn elapsed(&self) -> Duration {
        self.0.elapsed()
    }

    /// Seconds since the start, for a histogram.
    pub fn seconds(&self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
}

#[derive(Debug)]
struct Fake {
    now: Instant,
    epoch_ns: i64,
    timers: Vec<(Instant, Sender<Instant>)>,
}

/// A clock that stands still until [`FakeClock::advance`] moves it. Cheap to clone; clones
/// share the time and the timers.
#[derive(Debug, Clone)]
pub struct FakeClock(Arc<Mutex<Fake>>);

impl FakeClock {
    /// A clock at the real monotonic now and at `epoch_ns` on the wall clock.
    pub fn new(epoch_ns: i64) -> Self {
        Self(Arc::new(Mutex::new(Fake {
            now: Instant::now(),
            epoch_ns,
            timers: Vec::new(),
        })))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Fake> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Moves both readings forward by `d`, and fires the timers due by then.
    pub fn advance(&self, d: Duration) {
        let mut f = self.lock();
        f.now += d;
        f.epoch_ns = f.epoch_ns.saturating_add(duration_ns(d));
        let now = f.now;
        f.timers.retain(|(due, tx)| {
            if *due <= now {
                let _ = tx.send(now);
                false
            } else {
                true
            }
        });
    }

    /// Timers set and not yet due (their receivers may have been dropped since).
    pub fn pending_timers(&self) -> usize {
        self.lock().timers.len()
    }

    /// This clock as a [`SharedClock`].
    pub fn shared(&self) -> SharedClock {
        Arc::new(self.clone())
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Instant {
        self.lock().now
    }

    fn epoch_ns(&self) -> i64 {
        self.lock().epoch_ns
    }

    fn after(&self, d: Duration) -> Receiver<Instant> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let mut f = self.lock();
        let due = f.now + d;
        if d.is_zero() {
            let _ = tx.send(f.now);
        } else {
            f.timers.push((due, tx));
        }
        rx
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

    #[test]
    fn fake_timers_fire_when_the_clock_passes_them() {
        let c = FakeClock::new(0);
        let t0 = c.now();
        let short = c.after(Duration::from_millis(10));
        let long = c.after(Duration::from_secs(10));
        assert!(short.try_recv().is_err());
        c.advance(Duration::from_millis(10));
        assert_eq!(short.try_recv(), Ok(t0 + Duration::from_millis(10)));
        assert!(long.try_recv().is_err());
        assert_eq!(c.pending_timers(), 1);
        c.advance(Duration::from_secs(10));
        assert!(long.try_recv().is_ok());
        assert!(c.after(Duration::ZERO).try_recv().is_ok());
    }
}
