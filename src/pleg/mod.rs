//! Pod lifecycle event generator (kubelet's `pkg/kubelet/pleg`): notices container state changes
//! in the runtime and tells the sync loop which pods to sync.
//!
//! The generic PLEG relists: ListPodSandbox and ListContainers (two CRI calls however many pods
//! run), diffed against the previous listing; only pods that changed get status calls (in
//! parallel, at most [`STATUS_CONCURRENCY`] at once), which refresh the [`PodCache`]. The PLEG is the cache's one writer: pod workers hand it
//! their own reads through [`feed`]. Events
//! go out on a bounded channel of [`CHANNEL_CAPACITY`]; what does not fit is dropped and counted
//! (`kubelet_pleg_discard_events`), as kubelet does.
//!
//! The event-driven part ([`events`]) follows containerd's own task events (start, exit, OOM,
//! delete) and triggers a relist at once (relists are coalesced: at most one per
//! [`MIN_RELIST_INTERVAL`], one per up to [`BURST_RELIST_INTERVAL`] while a burst lasts), so a
//! container death reaches the sync loop within milliseconds
//! instead of up to a relist period. While that stream is healthy the relist runs
//! every [`RELIST_PERIOD_WITH_EVENTS`] as a safety net; when it breaks, every [`RELIST_PERIOD`]
//! until it is back.

pub mod events;
pub mod feed;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tracing::{debug, warn};

use crate::container::cache::{PodCache, PodCacheWriter};
use crate::cri::{api, Cri, CriError, RuntimeService};
use crate::kuberuntime::labels;
use crate::kuberuntime::status::{pod_status_from, RuntimePods};
use crate::metrics::Metrics;

/// Capacity of the PLEG channel (kubelet's `plegChannelCapacity`); events beyond it are dropped.
pub const CHANNEL_CAPACITY: usize = 1000;
/// Relist period without the event stream (kubelet's `plegRelistPeriod`).
pub const RELIST_PERIOD: Duration = Duration::from_secs(1);
/// Relist period while the containerd event stream is healthy.
pub const RELIST_PERIOD_WITH_EVENTS: Duration = Duration::from_secs(10);
/// A relist older than this makes `/healthz` fail (kubelet's `relistThreshold`).
pub const RELIST_THRESHOLD: Duration = Duration::from_secs(180);
/// Least time between the starts of two relists: events (and pod workers waiting for a newer
/// status) that arrive within it share the next relist, so a burst of pod starts costs at most
/// ten relists a second. The first relist after a quiet spell runs at once.
pub const MIN_RELIST_INTERVAL: Duration = Duration::from_millis(100);
/// After a relist that events asked for, one more this much later: containerd publishes a task
/// event before its CRI plugin has applied it, so the first relist may still see the old state.
pub const FOLLOW_UP: Duration = Duration::from_millis(100);
/// Longest spacing of relists in a burst: while relists keep finding changes and each was already
/// asked for before its spacing had passed, the spacing doubles from [`MIN_RELIST_INTERVAL`] up
/// to this; a relist that finds nothing, or is asked for after a quiet spell, brings it back. A
/// burst of 110 pod starts then costs well under two relists a second instead of ten (kubelet's
/// generic PLEG relists once a second; at 400 ms it was 2.6 a second, a tenth of the agent's CPU
/// in the burst); a single change is still seen within milliseconds. Pod workers that wait for
/// a newer status wait at most this long, well within [`crate::podsync::status::STATUS_WAIT`].
pub const BURST_RELIST_INTERVAL: Duration = Duration::from_millis(800);
/// Most status calls in flight during one relist.
pub const STATUS_CONCURRENCY: usize = 8;

/// What happened to a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodLifecycleEventType {
    /// A container started running.
    ContainerStarted,
    /// A container exited.
    ContainerDied,
    /// A container was removed.
    ContainerRemoved,
    /// A container changed state otherwise.
    ContainerChanged,
}

/// One event about one pod (kubelet's `PodLifecycleEvent`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodLifecycleEvent {
    /// Pod UID.
    pub uid: String,
    /// Event type.
    pub kind: PodLifecycleEventType,
    /// Container (or sandbox) ID concerned.
    pub container_id: String,
}

/// A container's (or sandbox's) state as a relist sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Exited,
    Created,
    Unknown,
}

fn container_state(s: i32) -> State {
    match api::ContainerState::try_from(s) {
        Ok(api::ContainerState::ContainerRunning) => State::Running,
        Ok(api::ContainerState::ContainerExited) => State::Exited,
        Ok(api::ContainerState::ContainerCreated) => State::Created,
        _ => State::Unknown,
    }
}

/// One relist's view: container or sandbox ID → (pod UID, state).
pub type Snapshot = HashMap<String, (String, StateView)>;

/// A state as recorded in a [`Snapshot`] (opaque outside this module).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateView(State);

/// Events between two snapshots (kubelet's `generateEvents`): a container that is running now and
/// was not → Started; was running and is exited or gone → Died; gone → Removed; any other change
/// → Changed. Sandboxes count as containers.
pub fn diff(old: &Snapshot, new: &Snapshot) -> Vec<PodLifecycleEvent> {
    use PodLifecycleEventType::*;
    let mut out = Vec::new();
    // What is listed now, then what is gone: one lookup per ID (a relist with no change at 300
    // pods compares 600 IDs).
    let now = new
        .iter()
        .map(|(id, (uid, s))| (id, uid, old.get(id).map(|(_, s)| s.0), Some(s.0)));
    let gone = old
        .iter()
        .filter(|(id, _)| !new.contains_key(*id))
        .map(|(id, (uid, s))| (id, uid, Some(s.0), None));
    for (id, uid, before, after) in now.chain(gone) {
        if before == after {
            continue;
        }
        let ev = |kind| PodLifecycleEvent {
            uid: uid.clone(),
            kind,
            container_id: id.clone(),
        };
        match (before, after) {
            (_, Some(State::Running)) => out.push(ev(ContainerStarted)),
            (Some(State::Running), Some(State::Exited)) => out.push(ev(ContainerDied)),
            (Some(State::Running), None) => {
                out.push(ev(ContainerDied));
                out.push(ev(ContainerRemoved));
            }
            (Some(_), None) => out.push(ev(ContainerRemoved)),
            _ => out.push(ev(ContainerChanged)),
        }
    }
    out
}

/// The last relist's listings, turned into [`RuntimePods`] when housekeeping first asks (a
/// burst relists several times a second; housekeeping reads them every 2 s).
enum Listed {
    Raw(Vec<api::PodSandbox>, Vec<api::Container>),
    Built(Arc<RuntimePods>),
}

/// The generic (and event-driven) PLEG, over any CRI runtime service (the socket client by
/// default).
pub struct Pleg<R: RuntimeService = Cri> {
    cri: R,
    node_name: String,
    cache: PodCacheWriter,
    feed: feed::CacheFeed,
    feed_rx: Mutex<Option<feed::FeedReceiver>>,
    tx: crossbeam_channel::Sender<PodLifecycleEvent>,
    metrics: Arc<Metrics>,
    snapshot: Mutex<Snapshot>,
    runtime_pods: Mutex<Option<Listed>>,
    last_relist: Mutex<Option<Instant>>,
    trigger: Notify,
    stream_healthy: AtomicBool,
}

impl<R: RuntimeService> Pleg<R> {
    /// A PLEG for the pods of `node_name`, sending on `tx` and refreshing `cache`, which it
    /// owns from now on (readers: [`Pleg::cache`]; pod workers hand it their reads through
    /// [`Pleg::cache_feed`]).
    pub fn new(
        cri: R,
        node_name: String,
        cache: PodCacheWriter,
        tx: crossbeam_channel::Sender<PodLifecycleEvent>,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        let (feed, feed_rx) = feed::channel();
        let pleg = Arc::new(Self {
            cri,
            node_name,
            cache,
            feed,
            feed_rx: Mutex::new(Some(feed_rx)),
            tx,
            metrics,
            snapshot: Mutex::new(HashMap::new()),
            runtime_pods: Mutex::new(None),
            last_relist: Mutex::new(None),
            trigger: Notify::new(),
            stream_healthy: AtomicBool::new(false),
        });
        // A pod worker that needs a status newer than its last sync asks for a relist (shared
        // by every worker waiting) rather than reading the pod itself.
        let weak = Arc::downgrade(&pleg);
        pleg.cache.set_relist_requester(Box::new(move || {
            if let Some(p) = weak.upgrade() {
                p.trigger();
            }
        }));
        pleg
    }

    /// A reading handle on the pod cache.
    pub fn cache(&self) -> PodCache {
        self.cache.reader()
    }

    /// Where pod workers hand the PLEG their own reads of a pod's status, and the pods they
    /// removed (served by [`Pleg::run`]).
    pub fn cache_feed(&self) -> feed::CacheFeed {
        self.feed.clone()
    }

    /// The runtime's pods as the last successful relist listed them (this node's and other
    /// agents' sandboxes); `None` before the first. Housekeeping reads this instead of listing:
    /// containerd's events bring a relist within [`BURST_RELIST_INTERVAL`] of every change, and
    /// the periodic relist covers a broken stream.
    pub fn runtime_pods(&self) -> Option<Arc<RuntimePods>> {
        let mut listed = self.runtime_pods.lock().unwrap_or_else(|e| e.into_inner());
        let pods = match listed.as_ref()? {
            Listed::Built(pods) => return Some(pods.clone()),
            Listed::Raw(sandboxes, containers) => Arc::new(RuntimePods::from_listings(
                sandboxes,
                containers,
                &self.node_name,
            )),
        };
        *listed = Some(Listed::Built(pods.clone()));
        Some(pods)
    }

    /// Asks for a relist now (the event stream calls this).
    pub fn trigger(&self) {
        self.trigger.notify_one();
    }

    /// Whether the containerd event stream is trusted (see [`Pleg::set_stream_healthy`]).
    pub fn stream_healthy(&self) -> bool {
        self.stream_healthy.load(Ordering::Acquire)
    }

    /// Marks the containerd event stream healthy or broken; the relist period follows.
    pub fn set_stream_healthy(&self, healthy: bool) {
        self.stream_healthy.store(healthy, Ordering::Release);
        if !healthy {
            self.trigger();
        }
    }

    /// The relist period now in force.
    pub fn period(&self) -> Duration {
        if self.stream_healthy.load(Ordering::Acquire) {
            RELIST_PERIOD_WITH_EVENTS
        } else {
            RELIST_PERIOD
        }
    }

    /// `Ok` while the last relist is at most [`RELIST_THRESHOLD`] old, else a message naming its
    /// age; before the first successful relist, `pleg has yet to be successful` (kubelet's PLEG
    /// `Healthy`).
    pub fn healthy(&self, now: Instant) -> Result<(), String> {
        match *self.last_relist.lock().unwrap_or_else(|e| e.into_inner()) {
            None => Err("pleg has yet to be successful".into()),
            Some(t) if now.saturating_duration_since(t) > RELIST_THRESHOLD => Err(format!(
                "pleg was last seen active {:.0}s ago; threshold is {:.0}s",
                now.saturating_duration_since(t).as_secs_f64(),
                RELIST_THRESHOLD.as_secs_f64()
            )),
            Some(_) => Ok(()),
        }
    }

    /// The kernel OOM-killed a process of the container (containerd's task OOM event, before
    /// or after the task exit): its exit is OOMKilled whatever its code (a shell may exit 0
    /// after its child was killed). The pod cache keeps the mark; when the exit is already in
    /// it, the pod gets a ContainerDied event again so that its worker sees the OOM kill.
    pub fn container_oom(&self, container_id: &str) {
        if let Some(uid) = self.cache.mark_oom_killed(container_id) {
            self.send_died(uid, container_id);
        }
    }

    /// Sends ContainerDied for `container_id` of pod `uid` (counted when the channel is full).
    fn send_died(&self, uid: String, container_id: &str) {
        let ev = PodLifecycleEvent {
            uid,
            kind: PodLifecycleEventType::ContainerDied,
            container_id: container_id.to_owned(),
        };
        if self.tx.try_send(ev).is_err() {
            self.metrics.pleg_discard_events.inc();
        }
    }

    /// True once containerd has reported the container OOM-killed.
    pub fn is_oom_killed(&self, container_id: &str) -> bool {
        self.cache.is_oom_killed(container_id)
    }

    /// A container that the last relist saw running has exited (from containerd's task exit
    /// event, ahead of the CRI state): its pod's cached status gets the exit (OOMKilled after
    /// [`Pleg::container_oom`]), and a ContainerDied event goes out now. The snapshot is left alone, so the relist that later
    /// sees the CRI state reports the death again with the runtime's own reason (OOMKilled...),
    /// and the pod is synced once more with it.
    pub fn container_exited(&self, container_id: &str, exit_code: i32, exited_at_ns: i64) {
        let uid = {
            let snap = self.snapshot.lock().unwrap_or_else(|e| e.into_inner());
            match snap.get(container_id) {
                Some((uid, StateView(State::Running))) => uid.clone(),
                _ => return,
            }
        };
        if let Some(st) = self.cache.latest(&uid) {
            let mut st = (*st).clone();
            if let Some(c) = st.containers.iter_mut().find(|c| c.id == container_id) {
                c.state = Some(crate::container::ContainerState::Exited);
                c.exit_code = exit_code;
                c.finished_at = exited_at_ns;
                // The cache marks it OOMKilled when containerd reported the OOM kill.
                self.cache.set(&uid, st, crate::clock::monotonic_now());
            }
        }
        debug!(uid = %uid, container = %container_id, exit_code, "PLEG event from containerd task exit");
        self.send_died(uid, container_id);
    }

    /// Container ID → pod UID of the last relist (for mapping runtime events to pods).
    pub fn pod_of(&self, container_id: &str) -> Option<String> {
        self.snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(container_id)
            .map(|(u, _)| u.clone())
    }

    /// One relist: list, diff, refresh the cache for changed pods, send events. Returns the
    /// events sent (or dropped).
    ///
    /// Errors: a failed list call (the previous snapshot is kept; the next relist retries).
    pub async fn relist(&self) -> Result<Vec<PodLifecycleEvent>, CriError> {
        let start = crate::clock::monotonic_now();
        // Unfiltered, so that housekeeping can take the runtime's pods (other agents' too)
        // from this listing instead of listing again.
        let (sandboxes, containers) = tokio::try_join!(
            self.cri
                .list_pod_sandbox_brief(HashMap::new(), &labels::BRIEF),
            self.cri
                .list_containers_brief(HashMap::new(), &labels::BRIEF)
        )?;
        let mut new: Snapshot = HashMap::with_capacity(sandboxes.len() + containers.len());
        // The listings of each pod, for the status of those that changed.
        let mut listed: HashMap<&str, (Vec<&api::PodSandbox>, Vec<&api::Container>)> =
            HashMap::new();
        for s in &sandboxes {
            let Some(uid) = s.labels.get(labels::POD_UID) else {
                continue;
            };
            if s.labels.get(labels::NODE_NAME) != Some(&self.node_name) {
                continue;
            }
            let st = if s.state == api::PodSandboxState::SandboxReady as i32 {
                State::Running
            } else {
                State::Exited
            };
            new.insert(s.id.clone(), (uid.clone(), StateView(st)));
            listed.entry(uid).or_default().0.push(s);
        }
        for c in &containers {
            let Some(uid) = c.labels.get(labels::POD_UID) else {
                continue;
            };
            let Some(entry) = listed.get_mut(uid.as_str()) else {
                continue;
            };
            new.insert(
                c.id.clone(),
                (uid.clone(), StateView(container_state(c.state))),
            );
            entry.1.push(c);
        }
        let events = {
            let old = self.snapshot.lock().unwrap_or_else(|e| e.into_inner());
            diff(&old, &new)
        };
        // Status only for pods that changed, a few at a time, from this relist's listings and
        // what the cache already holds (status calls only for what changed).
        let changed: HashSet<String> = events.iter().map(|e| e.uid.clone()).collect();
        let sem = Arc::new(tokio::sync::Semaphore::new(STATUS_CONCURRENCY));
        let reads = changed.iter().map(|uid| {
            let sem = sem.clone();
            let (sbs, cs) = listed
                .remove(uid.as_str())
                .map_or_else(Default::default, |(s, c)| {
                    (
                        s.into_iter().cloned().collect(),
                        c.into_iter().cloned().collect(),
                    )
                });
            let previous = self.cache.latest(uid);
            async move {
                let _permit = sem.acquire().await;
                let st = pod_status_from(
                    &self.cri,
                    uid,
                    sbs,
                    cs,
                    previous.as_deref(),
                    Some(&self.cache),
                )
                .await;
                // Written as soon as it is read: a worker waiting for this pod need not wait
                // for the other pods' reads.
                match st {
                    Ok(st) => self.cache.set(uid, st, start),
                    Err(e) => {
                        warn!(uid = %uid, error = %e, "PLEG: cannot read pod status");
                        // Its entry shows what it was before this change: no sync may take it
                        // as current as of this relist.
                        self.cache.mark_unverified(uid);
                    }
                }
            }
        });
        futures::future::join_all(reads).await;
        self.cache.update_time(start);
        *self.snapshot.lock().unwrap_or_else(|e| e.into_inner()) = new;
        drop(listed);
        *self.runtime_pods.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(Listed::Raw(sandboxes, containers));
        for ev in &events {
            debug!(uid = %ev.uid, container = %ev.container_id, event = ?ev.kind, "PLEG event");
            if self.tx.try_send(ev.clone()).is_err() {
                self.metrics.pleg_discard_events.inc();
            }
        }
        self.metrics
            .pleg_relist_duration
            .observe(start.elapsed().as_secs_f64());
        let mut last = self.last_relist.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(prev) = *last {
            self.metrics
                .pleg_relist_interval
                .observe(start.saturating_duration_since(prev).as_secs_f64());
        }
        *last = Some(start);
        Ok(events)
    }

    /// Relists every [`Pleg::period`], and when triggered: at once after a quiet spell, else
    /// one spacing after the previous relist started (every trigger until then is served by that
    /// one relist), then once more [`FOLLOW_UP`] later. The spacing is [`MIN_RELIST_INTERVAL`],
    /// growing in a burst up to [`BURST_RELIST_INTERVAL`] (see [`next_relist_interval`]). Runs
    /// until the task is dropped.
    ///
    /// On the same task, it applies what pod workers hand it ([`feed`]), during relists too.
    pub async fn run(self: Arc<Self>) {
        let rx = self
            .feed_rx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let serve = async {
            match rx {
                Some(rx) => rx.serve(&self.cache).await,
                // A second run: the first serves the feed.
                None => std::future::pending().await,
            }
        };
        tokio::join!(self.relist_loop(), serve);
    }

    /// The relists of [`Pleg::run`].
    async fn relist_loop(&self) {
        let mut last_start: Option<tokio::time::Instant> = None;
        let mut follow_up: Option<tokio::time::Instant> = None;
        let mut triggered = false;
        let mut interval = MIN_RELIST_INTERVAL;
        loop {
            // Asked for again before the spacing had passed: the relists are back to back.
            let back_to_back =
                last_start.is_some_and(|t| tokio::time::Instant::now() < t + interval);
            if let Some(t) = last_start {
                tokio::time::sleep_until(t + interval).await;
            }
            let start = tokio::time::Instant::now();
            last_start = Some(start);
            let changed = match self.relist().await {
                Ok(events) => !events.is_empty(),
                Err(e) => {
                    warn!(error = %e, "PLEG relist failed");
                    false
                }
            };
            interval = next_relist_interval(interval, back_to_back, changed);
            follow_up = match (triggered, follow_up) {
                (true, _) => Some(start + FOLLOW_UP),
                (false, Some(t)) if t > start => Some(t),
                _ => None,
            };
            triggered = false;
            let periodic = tokio::time::Instant::now() + self.period();
            let next = follow_up.map_or(periodic, |t| t.min(periodic));
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {}
                _ = self.trigger.notified() => triggered = true,
            }
        }
    }
}

/// The spacing before the next relist, after one that came `back_to_back` (asked for before the
/// `current` spacing had passed) and found pods `changed`: doubled, up to
/// [`BURST_RELIST_INTERVAL`], while both hold; else [`MIN_RELIST_INTERVAL`].
pub fn next_relist_interval(current: Duration, back_to_back: bool, changed: bool) -> Duration {
    if back_to_back && changed {
        (current * 2).min(BURST_RELIST_INTERVAL)
    } else {
        MIN_RELIST_INTERVAL
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use PodLifecycleEventType::*;

    /// A PLEG of node `n` on the fake runtime, its events dropped.
    fn pleg_on(
        rt: &crate::testing::runtime::FakeRuntime,
    ) -> Arc<Pleg<crate::testing::runtime::FakeRuntime>> {
        let (tx, _rx) = crossbeam_channel::bounded(10_000);
        Pleg::new(
            rt.clone(),
            "n".into(),
            PodCacheWriter::default(),
            tx,
            Metrics::new(),
        )
    }

    #[test]
    fn the_relist_spacing_grows_in_a_burst_and_falls_back_after_it() {
        let ms = Duration::from_millis;
        let mut i = MIN_RELIST_INTERVAL;
        let mut seen = Vec::new();
        for _ in 0..4 {
            i = next_relist_interval(i, true, true);
            seen.push(i);
        }
        assert_eq!(seen, [ms(200), ms(400), ms(800), ms(800)]);
        assert_eq!(next_relist_interval(i, true, false), MIN_RELIST_INTERVAL);
        assert_eq!(next_relist_interval(i, false, true), MIN_RELIST_INTERVAL);
    }

    /// With the run loop on paused time: changes that keep coming cost about three relists a
    /// second, and once they stop, a single change is relisted at once again.
    #[tokio::test(start_paused = true)]
    async fn a_burst_is_relisted_at_the_burst_spacing() {
        use crate::testing::runtime::FakeRuntime;
        let rt = FakeRuntime::new(crate::clock::FakeClock::new(1));
        let p = pleg_on(&rt);
        let new_sandbox = |i: usize| {
            let rt = rt.clone();
            async move {
                let labels: HashMap<String, String> = [
                    (labels::POD_UID.to_string(), format!("u{i}")),
                    (labels::NODE_NAME.to_string(), "n".to_string()),
                ]
                .into();
                rt.run_pod_sandbox(
                    api::PodSandboxConfig {
                        labels,
                        ..Default::default()
                    },
                    "",
                )
                .await
                .unwrap();
            }
        };
        let relists = || rt.calls_of("ListPodSandbox").len();
        let runner = tokio::spawn(p.clone().run());
        tokio::time::sleep(Duration::from_millis(1)).await;
        let first = relists();
        // A new sandbox every 20 ms for 4 s, each announced as containerd's event would.
        for i in 0..200 {
            new_sandbox(i).await;
            p.trigger();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let burst = relists() - first;
        assert!(
            (6..=9).contains(&burst),
            "{burst} relists in 4 s (at the minimum spacing it would be 40)"
        );
        // Quiet: a relist finds nothing and the spacing falls back; one change is seen at once.
        tokio::time::sleep(Duration::from_secs(11)).await;
        let before = relists();
        new_sandbox(1000).await;
        p.trigger();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(relists(), before + 1, "relisted at once");
        runner.abort();
    }

    fn snap(entries: &[(&str, &str, State)]) -> Snapshot {
        entries
            .iter()
            .map(|(id, uid, s)| (id.to_string(), (uid.to_string(), StateView(*s))))
            .collect()
    }

    fn kinds(mut evs: Vec<PodLifecycleEvent>) -> Vec<(String, PodLifecycleEventType)> {
        evs.sort_by(|a, b| {
            (&a.container_id, format!("{:?}", a.kind))
                .cmp(&(&b.container_id, format!("{:?}", b.kind)))
        });
        evs.into_iter().map(|e| (e.container_id, e.kind)).collect()
    }

    #[test]
    fn diff_emits_kubelets_events() {
        let old = snap(&[
            ("a", "u", State::Running),
            ("b", "u", State::Running),
            ("c", "u", State::Exited),
            ("d", "u", State::Running),
            ("e", "u", State::Created),
        ]);
        let new = snap(&[
            ("a", "u", State::Running),
            ("b", "u", State::Exited),
            ("d2", "u", State::Running),
            ("e", "u", State::Exited),
            ("f", "u", State::Created),
        ]);
        assert_eq!(
            kinds(diff(&old, &new)),
            vec![
                ("b".to_string(), ContainerDied),
                ("c".to_string(), ContainerRemoved),
                ("d".to_string(), ContainerDied),
                ("d".to_string(), ContainerRemoved),
                ("d2".to_string(), ContainerStarted),
                ("e".to_string(), ContainerChanged),
                ("f".to_string(), ContainerChanged),
            ]
        );
        assert!(diff(&new, &new).is_empty(), "no change, no event");
    }

    /// An OOM event before the task exit makes the exit OOMKilled, whatever its code.
    #[tokio::test]
    async fn an_exit_after_an_oom_event_is_oom_killed_at_once() {
        use crate::testing::runtime::FakeRuntime;
        let rt = FakeRuntime::new(crate::clock::FakeClock::new(1));
        let labels: HashMap<String, String> = [
            (labels::POD_UID.to_string(), "u".to_string()),
            (labels::NODE_NAME.to_string(), "n".to_string()),
        ]
        .into();
        let sb = rt
            .run_pod_sandbox(
                api::PodSandboxConfig {
                    labels: labels.clone(),
                    ..Default::default()
                },
                "",
            )
            .await
            .unwrap();
        let config = api::ContainerConfig {
            metadata: Some(api::ContainerMetadata {
                name: "init".into(),
                attempt: 0,
            }),
            labels,
            ..Default::default()
        };
        let id = rt
            .create_container(&sb, config, Default::default())
            .await
            .unwrap();
        rt.start_container(&id).await.unwrap();
        let (tx, rx) = crossbeam_channel::bounded(10);
        let p = Pleg::new(
            rt,
            "n".into(),
            PodCacheWriter::default(),
            tx,
            Metrics::new(),
        );
        let cache = p.cache();
        p.relist().await.unwrap();
        while rx.try_recv().is_ok() {}
        p.container_oom(&id);
        p.container_exited(&id, 0, 5);
        let c = cache.latest("u").unwrap().containers[0].clone();
        assert_eq!(
            (c.state(), c.exit_code, c.reason.as_str()),
            (crate::container::ContainerState::Exited, 0, "OOMKilled")
        );
        assert_eq!(rx.try_recv().unwrap().kind, ContainerDied);
    }

    /// Housekeeping's view of the runtime is built from the last relist's listings once, when
    /// first asked, and again only after a relist.
    #[tokio::test]
    async fn runtime_pods_are_built_from_the_last_listing_when_asked() {
        use crate::testing::runtime::FakeRuntime;
        let rt = FakeRuntime::new(crate::clock::FakeClock::new(1));
        let sandbox = |uid: &str, node: &str| api::PodSandboxConfig {
            labels: [
                (labels::POD_UID.to_string(), uid.to_string()),
                (labels::NODE_NAME.to_string(), node.to_string()),
                (labels::POD_NAME.to_string(), format!("p-{uid}")),
            ]
            .into(),
            ..Default::default()
        };
        rt.run_pod_sandbox(sandbox("u1", "n"), "").await.unwrap();
        rt.run_pod_sandbox(sandbox("other", "m"), "").await.unwrap();
        let p = pleg_on(&rt);
        assert!(p.runtime_pods().is_none(), "nothing listed yet");
        p.relist().await.unwrap();
        let first = p.runtime_pods().unwrap();
        let names: Vec<_> = first.ours.iter().map(|p| p.name.clone()).collect();
        assert_eq!(names, [Some("p-u1".to_string())]);
        assert!(
            Arc::ptr_eq(&first, &p.runtime_pods().unwrap()),
            "built once"
        );
        rt.run_pod_sandbox(sandbox("u2", "n"), "").await.unwrap();
        assert_eq!(
            p.runtime_pods().unwrap().ours.len(),
            1,
            "as of the last relist"
        );
        p.relist().await.unwrap();
        assert_eq!(p.runtime_pods().unwrap().ours.len(), 2);
    }

    #[test]
    fn health_fails_after_the_threshold_and_names_the_age() {
        let (tx, _rx) = crossbeam_channel::bounded(1);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let cri = rt.block_on(async {
            Cri::new(
                std::path::Path::new("/nonexistent.sock"),
                std::path::Path::new("/nonexistent.sock"),
                Duration::from_secs(1),
                Metrics::new(),
            )
        });
        let p = Pleg::new(
            cri,
            "n".into(),
            PodCacheWriter::default(),
            tx,
            Metrics::new(),
        );
        let t0 = Instant::now();
        assert_eq!(
            p.healthy(t0),
            Err("pleg has yet to be successful".to_string()),
            "no relist yet"
        );
        *p.last_relist.lock().unwrap() = Some(t0);
        assert!(p.healthy(t0 + Duration::from_secs(179)).is_ok());
        let e = p.healthy(t0 + Duration::from_secs(200)).unwrap_err();
        assert!(e.contains("200s"), "{e}");
        assert_eq!(p.period(), RELIST_PERIOD);
        p.set_stream_healthy(true);
        assert_eq!(p.period(), RELIST_PERIOD_WITH_EVENTS);
    }
}
