//! The containers' writable layers for the summary's `rootfs`, from the runtime's
//! `ListContainerStats` (kubelet's CRI stats provider asks the same), kept at most [`MAX_AGE`]
//! old: the call costs the runtime a round to every container's shim (90 ms at 110 pods on the
//! test machines, 150 ms at p99), too slow to make on every scrape.
//!
//! The first summary reads it inline and starts a refresher, which reads it again every
//! [`REFRESH`] while summaries keep being asked for, and stops [`IDLE`] after the last one (a
//! node nobody scrapes pays nothing). A summary finding the reading older than [`MAX_AGE`]
//! (the refresher stopped, or a refresh is late) reads it inline again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::clock::SharedClock;
use crate::cri::RuntimeService;

/// Oldest reading a summary answers with.
pub const MAX_AGE: Duration = Duration::from_secs(10);
/// How often the refresher reads again.
pub const REFRESH: Duration = Duration::from_secs(8);
/// How long after the last summary the refresher goes on.
pub const IDLE: Duration = Duration::from_secs(60);

/// A container's writable layer: when the runtime measured it (ns since the epoch) and its
/// bytes.
pub type Layer = (i64, u64);

#[derive(Default)]
struct State {
    /// When the last reading was taken, and what it gave by container ID.
    taken: Option<Instant>,
    layers: Arc<HashMap<String, Layer>>,
    /// When a summary last asked.
    asked: Option<Instant>,
    refresher: bool,
}

/// The cache; clones share it.
#[derive(Clone)]
pub struct RootfsCache<R> {
    runtime: R,
    clock: SharedClock,
    state: Arc<Mutex<State>>,
}

impl<R: RuntimeService + Clone + Send + Sync + 'static> RootfsCache<R> {
    /// An empty cache reading from `runtime`, deciding ages by `clock`.
    pub fn new(runtime: R, clock: SharedClock) -> Self {
        Self {
            runtime,
            clock,
            state: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Each container's writable layer by ID, read at most [`MAX_AGE`] ago; empty when the
    /// runtime cannot say (the summary then has no `rootfs`). Starts the refresher when it is
    /// not running (needs a tokio runtime).
    pub async fn get(&self) -> Arc<HashMap<String, Layer>> {
        let now = self.clock.now();
        let (fresh, spawn) = {
            let mut st = self.lock();
            st.asked = Some(now);
            let fresh = st
                .taken
                .filter(|t| now.saturating_duration_since(*t) <= MAX_AGE)
                .map(|_| st.layers.clone());
            let spawn = !st.refresher;
            st.refresher = true;
            (fresh, spawn)
        };
        if spawn {
            let me = self.clone();
            tokio::spawn(async move { me.refresh_loop().await });
        }
        match fresh {
            Some(l) => l,
            None => self.refresh().await,
        }
    }

    /// Reads the layers now and keeps them (an error keeps nothing and gives an empty map).
    async fn refresh(&self) -> Arc<HashMap<String, Layer>> {
        let taken = self.clock.now();
        let Ok(stats) = self.runtime.list_container_stats(HashMap::new()).await else {
            return Arc::default();
        };
        let layers: HashMap<String, Layer> = stats
            .into_iter()
            .filter_map(|s| {
                let id = s.attributes?.id;
                let w = s.writable_layer?;
                Some((id, (w.timestamp, w.used_bytes?.value)))
            })
            .collect();
        let layers = Arc::new(layers);
        let mut st = self.lock();
        st.taken = Some(taken);
        st.layers = layers.clone();
        layers
    }

    async fn refresh_loop(self) {
        loop {
            crate::clock::sleep(REFRESH).await;
            {
                let mut st = self.lock();
                let now = self.clock.now();
                if st
                    .asked
                    .is_none_or(|a| now.saturating_duration_since(a) > IDLE)
                {
                    st.refresher = false;
                    return;
                }
            }
            self.refresh().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::FakeClock;
    use crate::testing::runtime::FakeRuntime;

    /// Both clocks on: the fake one the cache decides by, tokio's the refresher sleeps on.
    async fn advance(clock: &FakeClock, d: Duration) {
        clock.advance(d);
        tokio::time::sleep(d).await;
        tokio::task::yield_now().await;
    }

    #[tokio::test(start_paused = true)]
    async fn summaries_read_the_runtime_at_most_every_refresh_and_never_when_unasked() {
        let clock = FakeClock::new(0);
        let rt = FakeRuntime::new(clock.clone());
        let cache = RootfsCache::new(rt.clone(), Arc::new(clock.clone()));
        let calls = || rt.calls_of("ListContainerStats").len();
        cache.get().await;
        assert_eq!(calls(), 1, "the first summary reads inline");
        cache.get().await;
        assert_eq!(calls(), 1, "a second one within MAX_AGE does not");
        advance(&clock, REFRESH).await;
        assert_eq!(calls(), 2, "the refresher read again");
        cache.get().await;
        assert_eq!(calls(), 2, "from the refresher's reading");
        // Nobody asks any more: the refresher stops after IDLE.
        for _ in 0..20 {
            advance(&clock, REFRESH).await;
        }
        let stopped_at = calls();
        assert!(stopped_at <= 2 + 9, "{stopped_at} readings");
        for _ in 0..5 {
            advance(&clock, REFRESH).await;
        }
        assert_eq!(calls(), stopped_at, "no reading while nobody asks");
        // The reading is old now: the next summary reads inline and starts a refresher again.
        cache.get().await;
        assert_eq!(calls(), stopped_at + 1);
        advance(&clock, REFRESH).await;
        assert_eq!(calls(), stopped_at + 2);
    }
}
