//! Pod workers (kubelet's `pod_workers.go`): one tokio task per pod UID that serialises all work
//! on that pod.
//!
//! Each worker has a mailbox of one slot: a new sync replaces a pending one (the latest spec
//! wins), but a kill is never overwritten. Once a kill is accepted the pod is terminating: later
//! syncs for the same UID are held and, if any arrived, the pod is started again only after the
//! termination is complete (kubelet's "restart requested" for static pods that reuse a UID).
//! After a sync the pod is queued for its next periodic sync in the [`WorkQueue`] — soon while it
//! is in motion, after `syncFrequency` otherwise, after a back-off on error.
//!
//! A static pod does not start while another static pod of the same full name (name and
//! namespace) has started and not yet finished terminating (kubelet's `allowStaticPodStart`):
//! a renamed manifest (a new UID) or the second of two files defining one pod waits for the
//! previous pod to be gone, so that the two never share host paths or ports at once. Its first
//! sync is held until then; the previous pod's worker exiting wakes it.
//!
//! Workers are supervised: a panic inside a pod's sync or kill is caught ([`crate::crash`]),
//! logged once with the pod, counted (`nodelet_pod_worker_panics_total`), reported on the pod as
//! a `FailedSync` warning event ([`PodSyncer::sync_panicked`]) and retried after the back-off, as
//! a sync error is. Should a worker's own loop ever unwind, it takes itself out of the routing
//! table on the way, so the next update for that pod starts a fresh worker rather than being
//! delivered to a dead one.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::Notify;
use tracing::{debug, info, warn, Instrument};

use crate::crash;
use crate::pod::{config_hash, pod_uid};
use crate::status::failed::Failure;

/// When a pod wants its next sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requeue {
    /// Sync again after this delay (a container's back-off ends then).
    After(Duration),
    /// Steady state: the next periodic sync (`syncFrequency`).
    Normal,
}

/// What a pod worker needs to know of a sync or kill that did not complete: its message for the
/// log, and whether it is a back-off rather than a failure.
pub trait SyncFailure: std::fmt::Display + Send + 'static {
    /// A container waits out a back-off (`ImagePullBackOff`): nothing new failed, and the
    /// worker logs it at debug level. `false` by default.
    fn is_backoff(&self) -> bool {
        false
    }
}

/// A syncer that never fails (test fakes).
impl SyncFailure for std::convert::Infallible {}

/// What the pod workers call to do the work; implemented by the pod-sync layer
/// ([`crate::podsync::PodSync`]), and by recording fakes in tests.
pub trait PodSyncer: Send + Sync + 'static {
    /// Why a sync or kill did not complete (the pod-sync layer's typed
    /// [`crate::podsync::PodSyncError`]).
    type Error: SyncFailure;
    /// Brings the pod's runtime state to its spec.
    ///
    /// Errors: what kept the sync from completing; the worker syncs the pod again after
    /// [`Periods::backoff`], logging a back-off ([`SyncFailure::is_backoff`]) at debug level and
    /// anything else as a warning.
    fn sync_pod(&self, pod: Arc<Pod>) -> impl Future<Output = Result<Requeue, Self::Error>> + Send;
    /// Stops every container (grace period `opts.grace` seconds, or the pod's own) and removes
    /// the pod's sandboxes, logs and cgroups; writes the pod's last status (Failed with
    /// `opts.failure`, or none for a removed pod).
    fn terminate_pod(
        &self,
        pod: Arc<Pod>,
        opts: KillPodOptions,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
    /// Called after a sync or kill of `pod` panicked with `message` (the panic is already logged
    /// and counted): report it where the pod's owner looks (the runtime manager records a
    /// `FailedSync` warning event, as kubelet does for a sync error). Does nothing by default.
    fn sync_panicked(&self, pod: &Pod, message: &str) {
        let _ = (pod, message);
    }
    /// Called when the sync of static pod `pod` is held until the previous pod of its full name
    /// has terminated (kubelet's `allowStaticPodStart`): the pod is known to the node but has
    /// nothing in the runtime yet, and is listed so (the pod-sync layer writes a Pending status
    /// once, as kubelet's `/pods` lists every pod of its pod manager). Does nothing by default.
    fn sync_held(&self, pod: &Arc<Pod>) {
        let _ = pod;
    }
}

/// How a pod is killed (kubelet's `KillPodOptions`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KillPodOptions {
    /// Grace period override, seconds (eviction); `None`: the pod's own.
    pub grace: Option<i64>,
    /// Why the pod fails (eviction, admission refusal): it ends Failed with this reason and
    /// message, and stays down until its manifest changes. `None`: the pod is removed.
    pub failure: Option<Failure>,
}

impl KillPodOptions {
    /// A kill with the pod's own grace period, for a pod that is removed.
    pub fn removed() -> Self {
        Self::default()
    }

    /// A kill that fails the pod with `failure`, with an optional grace override.
    pub fn failed(failure: Failure, grace: Option<i64>) -> Self {
        Self {
            grace,
            failure: Some(failure),
        }
    }
}

/// An update for a pod worker (kubelet's `UpdatePodOptions.UpdateType`).
#[derive(Debug, Clone)]
pub enum UpdateType {
    /// Create or sync the pod.
    Sync,
    /// Kill the pod.
    Kill(KillPodOptions),
}

enum Work {
    Sync(Arc<Pod>),
    Kill(Arc<Pod>, KillPodOptions),
}

#[derive(Default)]
struct WorkerState {
    pending: Option<Work>,
    terminating: bool,
    restart_after_kill: Option<Arc<Pod>>,
    /// The manifest version (`config.hash`) a failing kill was for: syncs of that version are
    /// dropped, so the pod stays down until its manifest changes.
    failed_version: Option<String>,
}

struct Worker {
    state: Mutex<WorkerState>,
    notify: Notify,
}

/// Pods due for a periodic sync (kubelet's `queue.WorkQueue`): UID → time it is due.
#[derive(Clone, Default)]
pub struct WorkQueue(Arc<Mutex<HashMap<String, Instant>>>);

impl WorkQueue {
    /// Queues `uid` to be due at `at` (replacing an earlier entry).
    pub fn enqueue(&self, uid: &str, at: Instant) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uid.to_owned(), at);
    }

    /// Removes and returns the UIDs due at `now`.
    pub fn take_due(&self, now: Instant) -> Vec<String> {
        let mut q = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let due: Vec<String> = q
            .iter()
            .filter(|(_, t)| **t <= now)
            .map(|(u, _)| u.clone())
            .collect();
        for u in &due {
            q.remove(u);
        }
        due
    }

    fn forget(&self, uid: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(uid);
    }
}

/// Delays after a sync.
#[derive(Debug, Clone, Copy)]
pub struct Periods {
    /// `syncFrequency`: after a successful sync of a steady pod.
    pub resync: Duration,
    /// After a failed sync or kill (kubelet's worker back-off, 10 s).
    pub backoff: Duration,
}

/// Which static pod holds each full name, and the workers waiting for it (kubelet's
/// `startedStaticPodsByFullname` and `waitingToStartStaticPodsByFullname`).
#[derive(Default)]
struct StaticPods {
    /// Full name → UID of the static pod that has started under it and not yet terminated.
    started: HashMap<String, String>,
    /// Full name → workers (UID, worker) whose first sync waits for the name to be free.
    waiting: HashMap<String, Vec<(String, Arc<Worker>)>>,
}

/// kubelet's `GetPodFullName`: `<name>_<namespace>`.
fn full_name(pod: &Pod) -> String {
    format!(
        "{}_{}",
        pod.metadata.name.as_deref().unwrap_or(""),
        pod.metadata.namespace.as_deref().unwrap_or("")
    )
}

struct Inner<S> {
    syncer: Arc<S>,
    workers: Mutex<HashMap<String, Arc<Worker>>>,
    /// Taken after `workers` when both are held.
    statics: Mutex<StaticPods>,
    queue: WorkQueue,
    periods: Periods,
    rt: tokio::runtime::Handle,
    /// `nodelet_pod_worker_panics_total`.
    panics: Counter,
}

/// The set of pod workers. Cheap to clone; safe to call from the sync-loop thread (never blocks
/// on the runtime).
pub struct PodWorkers<S: PodSyncer> {
    inner: Arc<Inner<S>>,
}

impl<S: PodSyncer> Clone for PodWorkers<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<S: PodSyncer> PodWorkers<S> {
    /// Workers spawned on `rt`, calling `syncer`, queueing periodic syncs in `queue`; each
    /// panic caught in a worker increments `panics` (`nodelet_pod_worker_panics_total`).
    pub fn new(
        syncer: Arc<S>,
        queue: WorkQueue,
        periods: Periods,
        rt: tokio::runtime::Handle,
        panics: Counter,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                syncer,
                workers: Mutex::new(HashMap::new()),
                statics: Mutex::new(StaticPods::default()),
                queue,
                periods,
                rt,
                panics,
            }),
        }
    }

    /// Delivers an update to the pod's worker, starting one if needed (kubelet's `UpdatePod`).
    pub fn update_pod(&self, pod: Arc<Pod>, update: UpdateType) {
        let uid = pod_uid(&pod).to_owned();
        let mut workers = self.inner.workers.lock().unwrap_or_else(|e| e.into_inner());
        let worker = match workers.get(&uid) {
            Some(w) => w.clone(),
            None => {
                let w = Arc::new(Worker {
                    state: Mutex::new(WorkerState::default()),
                    notify: Notify::new(),
                });
                workers.insert(uid.clone(), w.clone());
                let span = tracing::info_span!("pod_worker", pod = %pod.metadata.name.as_deref().unwrap_or(""), namespace = %pod.metadata.namespace.as_deref().unwrap_or(""), uid = %uid);
                self.inner
                    .rt
                    .spawn(run_worker(self.inner.clone(), uid.clone(), w.clone()).instrument(span));
                w
            }
        };
        drop(workers);
        let mut st = worker.state.lock().unwrap_or_else(|e| e.into_inner());
        match update {
            UpdateType::Sync => {
                if st.failed_version.as_deref() == Some(config_hash(&pod)) {
                    debug!(uid, "pod failed with this manifest; sync dropped");
                } else if st.terminating {
                    st.restart_after_kill = Some(pod);
                } else {
                    st.pending = Some(Work::Sync(pod));
                }
            }
            UpdateType::Kill(opts) => {
                if !st.terminating {
                    st.terminating = true;
                    st.restart_after_kill = None;
                    st.failed_version =
                        opts.failure.is_some().then(|| config_hash(&pod).to_owned());
                    st.pending = Some(Work::Kill(pod, opts));
                } else {
                    // A kill is never overwritten; a later sync request is dropped by this kill.
                    st.restart_after_kill = None;
                }
            }
        }
        drop(st);
        worker.notify.notify_one();
    }

    /// True when the pod has a worker (syncing or terminating).
    pub fn is_known(&self, uid: &str) -> bool {
        self.inner
            .workers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(uid)
    }

    /// True while the pod's worker has a kill pending or in progress.
    pub fn is_terminating(&self, uid: &str) -> bool {
        let w = self
            .inner
            .workers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .cloned();
        w.is_some_and(|w| {
            w.state
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .terminating
        })
    }

    /// UIDs of every live worker (syncing or terminating).
    pub fn known_uids(&self) -> std::collections::HashSet<String> {
        self.inner
            .workers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// Number of live workers.
    pub fn len(&self) -> usize {
        self.inner
            .workers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// True when no worker is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Takes a worker out of the routing table if its loop unwinds, so that the next update for the
/// pod starts a new worker (a normal exit removes the worker itself, under the lock).
struct Deregister<'a, S: PodSyncer> {
    inner: &'a Inner<S>,
    uid: &'a str,
    worker: &'a Arc<Worker>,
}

impl<S: PodSyncer> Drop for Deregister<'_, S> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        self.inner.panics.inc();
        let mut workers = self.inner.workers.lock().unwrap_or_else(|e| e.into_inner());
        if workers
            .get(self.uid)
            .is_some_and(|w| Arc::ptr_eq(w, self.worker))
        {
            workers.remove(self.uid);
            self.inner.release_static(self.uid);
        }
    }
}

impl<S: PodSyncer> Inner<S> {
    /// Whether `pod` (UID `uid`, worker `w`) may sync now: any pod that is not static, and a
    /// static pod whose full name is free or already its own (then claimed for it). Otherwise
    /// the worker is queued to be woken when the name is released.
    fn static_start_allowed(&self, pod: &Pod, uid: &str, w: &Arc<Worker>) -> bool {
        if !crate::pod::is_static_pod(pod) {
            return true;
        }
        let name = full_name(pod);
        let mut st = self.statics.lock().unwrap_or_else(|e| e.into_inner());
        match st.started.get(&name) {
            Some(owner) if owner != uid => {
                let owner = owner.clone();
                let waiting = st.waiting.entry(name).or_default();
                if !waiting.iter().any(|(u, _)| u == uid) {
                    info!(
                        previous_uid = %owner,
                        "static pod waits for the previous pod of the same name to terminate"
                    );
                    waiting.push((uid.to_owned(), w.clone()));
                }
                false
            }
            Some(_) => true,
            None => {
                st.started.insert(name.clone(), uid.to_owned());
                if let Some(waiting) = st.waiting.get_mut(&name) {
                    waiting.retain(|(u, _)| u != uid);
                }
                true
            }
        }
    }

    /// The pod `uid`'s worker has exited: the full name it held (if any) is free, and the
    /// workers waiting for it are woken (the first to sync claims it); it waits for no name.
    fn release_static(&self, uid: &str) {
        let mut st = self.statics.lock().unwrap_or_else(|e| e.into_inner());
        let freed: Vec<String> = st
            .started
            .iter()
            .filter(|(_, u)| *u == uid)
            .map(|(n, _)| n.clone())
            .collect();
        for name in freed {
            st.started.remove(&name);
            for (_, w) in st.waiting.remove(&name).into_iter().flatten() {
                w.notify.notify_one();
            }
        }
        for waiting in st.waiting.values_mut() {
            waiting.retain(|(u, _)| u != uid);
        }
        st.waiting.retain(|_, w| !w.is_empty());
    }

    /// Reports a caught panic of `pod`'s `what` ("sync" or "kill"): the counter and the
    /// syncer's report. The panic itself was logged once, at `ERROR` with its location, by the
    /// panic hook ([`crash::install_hook`]) inside this worker's span (pod, namespace, UID).
    fn panicked(&self, pod: &Pod, what: &str, p: &crash::Panic) {
        debug!(panic = %p.0, work = what, "pod worker panicked; retrying after the back-off");
        self.panics.inc();
        self.syncer.sync_panicked(pod, &p.0);
    }
}

async fn run_worker<S: PodSyncer>(inner: Arc<Inner<S>>, uid: String, w: Arc<Worker>) {
    let _deregister = Deregister {
        inner: &inner,
        uid: &uid,
        worker: &w,
    };
    // A sync the pod asked for at a given time (a back-off ending): the worker's own timer, so
    // the restart is on time rather than on the next 1 s tick.
    let mut wake: Option<(tokio::time::Instant, Arc<Pod>)> = None;
    loop {
        let work = loop {
            let next = w
                .state
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pending
                .take();
            match (next, wake.clone()) {
                (Some(work), _) => break work,
                (None, None) => w.notify.notified().await,
                (None, Some((at, pod))) => {
                    tokio::select! {
                        _ = w.notify.notified() => {}
                        _ = tokio::time::sleep_until(at) => break Work::Sync(pod),
                    }
                }
            }
        };
        match work {
            Work::Sync(pod) => {
                if !inner.static_start_allowed(&pod, &uid, &w) {
                    inner.syncer.sync_held(&pod);
                    // Held, unless a newer update took its place; woken when the name is free.
                    {
                        let mut st = w.state.lock().unwrap_or_else(|e| e.into_inner());
                        if st.pending.is_none() {
                            st.pending = Some(Work::Sync(pod));
                        }
                    }
                    wake = None;
                    w.notify.notified().await;
                    continue;
                }
                debug!("syncing pod");
                wake = None;
                // Boxed, here and for the kill: the sync's state (about 20 KB) is held only while
                // it runs, not by every idle worker between syncs.
                let due = match crash::catch(Box::pin(inner.syncer.sync_pod(pod.clone()))).await {
                    Ok(Ok(Requeue::After(d))) => {
                        wake = Some((tokio::time::Instant::now() + d, pod));
                        d.min(inner.periods.resync)
                    }
                    Ok(Ok(Requeue::Normal)) => inner.periods.resync,
                    Ok(Err(e)) if e.is_backoff() => {
                        debug!(reason = %e, "pod waits out a back-off");
                        inner.periods.backoff
                    }
                    Ok(Err(e)) => {
                        warn!(error = %e, "pod sync failed; will retry");
                        inner.periods.backoff
                    }
                    Err(p) => {
                        inner.panicked(&pod, "sync", &p);
                        inner.periods.backoff
                    }
                };
                // tokio's time, so that tests on paused time see the queue move with it.
                inner
                    .queue
                    .enqueue(&uid, tokio::time::Instant::now().into_std() + due);
            }
            Work::Kill(pod, opts) => {
                wake = None;
                inner.queue.forget(&uid);
                let killed = crash::catch(Box::pin(
                    inner.syncer.terminate_pod(pod.clone(), opts.clone()),
                ))
                .await;
                let failed = match killed {
                    Ok(Ok(())) => false,
                    Ok(Err(e)) => {
                        warn!(error = %e, "killing pod failed; will retry");
                        true
                    }
                    Err(p) => {
                        inner.panicked(&pod, "kill", &p);
                        true
                    }
                };
                if failed {
                    crate::clock::sleep(inner.periods.backoff).await;
                    let mut st = w.state.lock().unwrap_or_else(|e| e.into_inner());
                    if st.pending.is_none() {
                        st.pending = Some(Work::Kill(pod, opts));
                    }
                    continue;
                }
                let mut workers = inner.workers.lock().unwrap_or_else(|e| e.into_inner());
                let mut st = w.state.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(p) = st.restart_after_kill.take() {
                    debug!("pod terminated; starting it again as requested");
                    st.terminating = false;
                    st.failed_version = None;
                    st.pending = Some(Work::Sync(p));
                    continue;
                }
                if st.pending.is_none() {
                    workers.remove(&uid);
                    inner.release_static(&uid);
                    debug!("pod terminated; worker exits");
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::syncer::RecordingSyncer;

    fn pod(uid: &str, version: &str) -> Arc<Pod> {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.into());
        p.metadata.name = Some(version.into());
        Arc::new(p)
    }

    fn workers<S: PodSyncer>(rec: &Arc<S>) -> PodWorkers<S> {
        let periods = Periods {
            resync: Duration::from_secs(60),
            backoff: Duration::from_millis(10),
        };
        PodWorkers::new(
            rec.clone(),
            WorkQueue::default(),
            periods,
            tokio::runtime::Handle::current(),
            Counter::default(),
        )
    }

    /// Lets `n` calls through and returns the calls once the workers are idle (on paused time,
    /// a sleep returns as soon as every task waits).
    async fn settle(rec: &RecordingSyncer, n: usize) -> Vec<String> {
        rec.release(n);
        tokio::time::sleep(Duration::from_millis(10)).await;
        rec.calls()
    }

    fn kill(grace: Option<i64>) -> UpdateType {
        UpdateType::Kill(KillPodOptions {
            grace,
            failure: None,
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_sync_is_caught_counted_reported_and_the_pod_synced_again() {
        let rec = RecordingSyncer::new();
        let panics = Counter::default();
        let queue = WorkQueue::default();
        let periods = Periods {
            resync: Duration::from_secs(60),
            backoff: Duration::from_secs(10),
        };
        let w = PodWorkers::new(
            rec.clone(),
            queue.clone(),
            periods,
            tokio::runtime::Handle::current(),
            panics.clone(),
        );
        rec.panic_next();
        w.update_pod(pod("u", "v1"), UpdateType::Sync);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(
            rec.calls(),
            vec!["sync v1", "panicked v1: injected panic in the sync of v1"]
        );
        assert_eq!(panics.get(), 1);
        assert!(w.is_known("u"), "the worker lives on");
        // Retried after the back-off, through the work queue, not before.
        let now = tokio::time::Instant::now().into_std();
        assert!(queue.take_due(now + Duration::from_secs(9)).is_empty());
        assert_eq!(queue.take_due(now + Duration::from_secs(10)), vec!["u"]);
        // The next version is synced by the same worker.
        w.update_pod(pod("u", "v2"), UpdateType::Sync);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(rec.calls().last().map(String::as_str), Some("sync v2"));
        assert_eq!(panics.get(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn latest_sync_wins_while_busy() {
        let rec = RecordingSyncer::gated();
        let w = workers(&rec);
        w.update_pod(pod("u", "v1"), UpdateType::Sync);
        tokio::time::sleep(Duration::from_millis(10)).await; // v1 is in progress, blocked
        w.update_pod(pod("u", "v2"), UpdateType::Sync);
        w.update_pod(pod("u", "v3"), UpdateType::Sync);
        assert_eq!(settle(&rec, 2).await, vec!["sync v1", "sync v3"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_kill_is_never_overwritten_and_the_worker_exits() {
        let rec = RecordingSyncer::gated();
        let w = workers(&rec);
        w.update_pod(pod("u", "v1"), UpdateType::Sync);
        tokio::time::sleep(Duration::from_millis(10)).await;
        w.update_pod(pod("u", "v1"), kill(Some(5)));
        w.update_pod(pod("u", "v2"), UpdateType::Sync);
        w.update_pod(pod("u", "v1"), kill(None));
        assert_eq!(settle(&rec, 2).await, vec!["sync v1", "kill v1 Some(5)"]);
        assert!(!w.is_known("u"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_sync_after_a_kill_restarts_the_pod_once_terminated() {
        let rec = RecordingSyncer::gated();
        let w = workers(&rec);
        w.update_pod(pod("u", "v1"), UpdateType::Sync);
        tokio::time::sleep(Duration::from_millis(10)).await;
        w.update_pod(pod("u", "v1"), kill(None));
        w.update_pod(pod("u", "v2"), UpdateType::Sync);
        assert_eq!(
            settle(&rec, 3).await,
            vec!["sync v1", "kill v1 None", "sync v2"]
        );
        assert!(w.is_known("u"));
    }

    fn versioned(uid: &str, name: &str, hash: &str) -> Arc<Pod> {
        let mut p = crate::testing::pods::versioned(uid, hash);
        p.metadata.name = Some(name.into());
        Arc::new(p)
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_killed_for_a_failure_stays_down_until_its_manifest_changes() {
        let rec = RecordingSyncer::gated();
        let w = workers(&rec);
        w.update_pod(versioned("u", "v1", "h1"), UpdateType::Sync);
        tokio::time::sleep(Duration::from_millis(10)).await;
        let failure = Failure::new("Evicted", "low on memory");
        w.update_pod(
            versioned("u", "v1", "h1"),
            UpdateType::Kill(KillPodOptions::failed(failure, Some(1))),
        );
        // A PLEG event of the dying container, same manifest: dropped (a third call could run).
        w.update_pod(versioned("u", "v1", "h1"), UpdateType::Sync);
        assert_eq!(
            settle(&rec, 3).await,
            vec!["sync v1", "kill v1 Some(1) Evicted: low on memory"]
        );
        assert!(!w.is_known("u"));
        // While a failing kill runs, a new manifest version is started after it.
        rec.clear();
        w.update_pod(versioned("w", "v2", "h2"), UpdateType::Sync);
        tokio::time::sleep(Duration::from_millis(10)).await;
        w.update_pod(
            versioned("w", "v2", "h2"),
            UpdateType::Kill(KillPodOptions::failed(
                Failure::new("NodePorts", "taken"),
                None,
            )),
        );
        w.update_pod(versioned("w", "v3", "h3"), UpdateType::Sync);
        assert_eq!(
            settle(&rec, 2).await,
            vec!["sync v2", "kill v2 None NodePorts: taken", "sync v3"]
        );
    }

    /// A static pod (source `file`) `name` in namespace `default` with UID `uid`, version `tag`
    /// in its recorded name (`<name>.<tag>`, so the calls tell the two apart).
    fn static_pod(uid: &str, name: &str, namespace: &str) -> Arc<Pod> {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.into());
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some(namespace.into());
        p.metadata.annotations = Some(
            [(
                crate::pod::CONFIG_SOURCE_ANNOTATION.to_owned(),
                "file".to_owned(),
            )]
            .into(),
        );
        Arc::new(p)
    }

    #[tokio::test(start_paused = true)]
    async fn a_static_pod_waits_for_the_previous_pod_of_its_full_name_to_terminate() {
        let rec = RecordingSyncer::gated();
        let w = workers(&rec);
        w.update_pod(static_pod("old", "web", "default"), UpdateType::Sync);
        assert_eq!(settle(&rec, 1).await, vec!["sync web"]);
        // A second file defines the pod (a new UID): its sync is asked for first, the old pod's
        // kill after it. Both wait for the gate; the gate lets calls through in the order they
        // asked, so one permit would go to the new pod's sync were it not held.
        w.update_pod(static_pod("new", "web", "default"), UpdateType::Sync);
        tokio::time::sleep(Duration::from_millis(10)).await;
        w.update_pod(static_pod("old", "web", "default"), kill(Some(30)));
        assert_eq!(settle(&rec, 1).await, vec!["sync web", "kill web Some(30)"]);
        assert!(!w.is_known("old"));
        assert!(rec.held().iter().all(|u| u == "new") && !rec.held().is_empty());
        // The old worker has exited: the new pod starts.
        assert_eq!(
            settle(&rec, 1).await,
            vec!["sync web", "kill web Some(30)", "sync web"]
        );
        // The new pod holds the name now: a third static pod of it waits, while an API pod of
        // the same name and a static pod of the same name in another namespace do not.
        rec.clear();
        w.update_pod(static_pod("third", "web", "default"), UpdateType::Sync);
        tokio::time::sleep(Duration::from_millis(10)).await;
        let mut api = (*static_pod("api", "web", "default")).clone();
        api.metadata.annotations = None;
        w.update_pod(Arc::new(api), UpdateType::Sync);
        w.update_pod(static_pod("ns2", "web", "other"), UpdateType::Sync);
        assert_eq!(settle(&rec, 3).await, vec!["sync web", "sync web"]);
        // Removing the waiting pod releases nothing and leaves no waiter behind.
        w.update_pod(static_pod("third", "web", "default"), kill(None));
        assert_eq!(
            settle(&rec, 1).await,
            vec!["sync web", "sync web", "kill web None"]
        );
        assert!(!w.is_known("third"));
        assert!(w.inner.statics.lock().unwrap().waiting.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn pods_are_worked_on_independently() {
        let rec = RecordingSyncer::gated();
        let w = workers(&rec);
        w.update_pod(pod("a", "a1"), UpdateType::Sync);
        w.update_pod(pod("b", "b1"), UpdateType::Sync);
        let mut calls = settle(&rec, 2).await;
        calls.sort();
        assert_eq!(calls, vec!["sync a1", "sync b1"]);
        assert_eq!(w.len(), 2);
    }

    /// Asks to be synced again 30 ms later, once.
    #[derive(Default)]
    struct Later(Mutex<u32>);

    impl PodSyncer for Later {
        type Error = std::convert::Infallible;
        async fn sync_pod(&self, _: Arc<Pod>) -> Result<Requeue, Self::Error> {
            let mut n = self.0.lock().unwrap();
            *n += 1;
            Ok(if *n == 1 {
                Requeue::After(Duration::from_millis(30))
            } else {
                Requeue::Normal
            })
        }
        async fn terminate_pod(&self, _: Arc<Pod>, _: KillPodOptions) -> Result<(), Self::Error> {
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_requested_resync_comes_from_the_workers_own_timer() {
        let rec = Arc::new(Later::default());
        let w = workers(&rec);
        w.update_pod(pod("u", "v1"), UpdateType::Sync);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(*rec.0.lock().unwrap(), 1);
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert_eq!(
            *rec.0.lock().unwrap(),
            2,
            "synced again when the delay ended, with no tick"
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(*rec.0.lock().unwrap(), 2, "and not again");
    }

    #[test]
    fn work_queue_returns_due_pods_once() {
        let q = WorkQueue::default();
        let t0 = Instant::now();
        q.enqueue("a", t0);
        q.enqueue("b", t0 + Duration::from_secs(10));
        assert_eq!(
            q.take_due(t0 + Duration::from_secs(1)),
            vec!["a".to_string()]
        );
        assert!(q.take_due(t0 + Duration::from_secs(1)).is_empty());
        assert_eq!(
            q.take_due(t0 + Duration::from_secs(10)),
            vec!["b".to_string()]
        );
    }
}
