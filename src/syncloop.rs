//! The sync loop (kubelet's `syncLoop` / `syncLoopIteration`): one thread that selects over the
//! config, PLEG, sync-tick and housekeeping channels and dispatches work to the pod workers.
//!
//! It only dispatches: it never waits on the runtime, so a slow runtime call delays one pod's
//! worker, never the loop. Handlers follow kubelet's: ADD admits and syncs, UPDATE syncs,
//! REMOVE kills and forgets; a PLEG event syncs its pod; a liveness or startup probe failure
//! syncs its pod; the 1 s tick syncs pods whose
//! work-queue entry is due; housekeeping (every 2 s, once all sources are ready) kills pods the
//! runtime runs that no source wants.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, tick, Receiver};
use k8s_openapi::api::core::v1::Pod;
use tracing::{debug, info, warn};

use crate::admission::{PodAdmitter, Rejection};
use crate::events::Recorder;
use crate::pleg::PodLifecycleEvent;
use crate::pod::pod_uid;
use crate::podworkers::{KillPodOptions, PodSyncer, PodWorkers, UpdateType, WorkQueue};
use crate::prober::ProbeResult;
use crate::source::{PodOp, PodUpdate, SourcesReady};
use crate::status::failed::{FailPod, FailedPods, Failure};
use crate::status::StatusManager;

/// Period of the sync tick (kubelet: 1 s).
pub const SYNC_TICK: Duration = Duration::from_secs(1);
/// Period of housekeeping (kubelet: 2 s).
pub const HOUSEKEEPING_PERIOD: Duration = Duration::from_secs(2);

/// Housekeeping work, started from the loop and run elsewhere: given the desired pod UIDs, kill
/// what the runtime runs beyond them. Must not block.
pub type Housekeeper = Box<dyn Fn(HashSet<String>) + Send>;

/// Channels that feed the loop.
pub struct Channels {
    /// Pod updates from the sources.
    pub config: Receiver<PodUpdate>,
    /// PLEG events.
    pub pleg: Receiver<PodLifecycleEvent>,
    /// Probe results.
    pub probes: Receiver<ProbeResult>,
    /// Pods to fail (eviction, node shutdown): the loop is the one writer of the failed-pods
    /// record.
    pub failures: Receiver<FailPod>,
    /// Stop signal (a message or a closed channel ends the loop).
    pub stop: Receiver<()>,
}

/// The loop's state: the desired pods (kubelet's pod manager) and where work goes.
pub struct SyncLoop<S: PodSyncer> {
    pods: HashMap<String, Arc<Pod>>,
    workers: PodWorkers<S>,
    queue: WorkQueue,
    sources_ready: SourcesReady,
    housekeeper: Housekeeper,
    recorder: Recorder,
    max_pods: usize,
    /// Pods failed by eviction or refused at admission; not synced while their manifest stays.
    failed: FailedPods,
    /// Pod statuses, read only (the phase of running pods; statuses left without a worker).
    status: StatusManager,
    /// Pod admission (kubelet's `PodAdmitHandler`s); none: only `maxPods` is checked.
    pub admission: Option<PodAdmitter>,
    /// Pods the runtime was running when the agent started: adopted, not admitted again.
    adopted: HashSet<String>,
    /// Called after every iteration (the systemd watchdog hook, later); cheap.
    pub on_iteration: Option<Box<dyn Fn() + Send>>,
    /// Whether housekeeping has run with every source ready: the first pass runs as soon as
    /// they are (after an agent restart, pods whose manifests went meanwhile are killed without
    /// waiting for the next tick).
    housekept: bool,
}

impl<S: PodSyncer> SyncLoop<S> {
    /// A loop dispatching to `workers`.
    pub fn new(
        workers: PodWorkers<S>,
        queue: WorkQueue,
        sources_ready: SourcesReady,
        housekeeper: Housekeeper,
        recorder: Recorder,
        max_pods: usize,
    ) -> Self {
        Self {
            pods: HashMap::new(),
            workers,
            queue,
            sources_ready,
            housekeeper,
            recorder,
            max_pods,
            failed: Default::default(),
            status: Default::default(),
            admission: None,
            adopted: HashSet::new(),
            on_iteration: None,
            housekept: false,
        }
    }

    /// Uses `admission` and its record of failed pods, and reads pod statuses from `status`.
    pub fn with_admission(mut self, admission: PodAdmitter, status: StatusManager) -> Self {
        self.failed = admission.failed.clone();
        self.admission = Some(admission);
        self.status = status;
        self
    }

    /// Pods (UIDs) the runtime runs at start-up: when their manifests arrive they are adopted
    /// without admission, so a restart under pressure never fails pods that keep running.
    pub fn with_adopted(mut self, uids: HashSet<String>) -> Self {
        self.adopted = uids;
        self
    }

    /// The pod if it is desired and not failed.
    fn runnable(&self, uid: &str) -> Option<&Arc<Pod>> {
        self.pods.get(uid).filter(|_| !self.failed.contains(uid))
    }

    /// The refusal of a pod that is new (or whose manifest changed after it failed), by the
    /// admit handlers; without them (tests), by `maxPods` alone (kubelet's `pods` resource).
    fn admission_refusal(&self, pod: &Pod, uid: &str) -> Option<Rejection> {
        let running: Vec<&Pod> = self.running_pods(uid).collect();
        match &self.admission {
            Some(a) => a.check(pod, &running),
            None => (running.len() >= self.max_pods).then(|| Rejection {
                reason: "OutOfpods".into(),
                message: format!(
                    "Node didn't have enough resource: pods, requested: 1, used: {}, capacity: {}",
                    running.len(),
                    self.max_pods
                ),
            }),
        }
    }

    /// The desired pods that run or may run, but `uid`: not failed, not finished.
    fn running_pods<'a>(&'a self, uid: &'a str) -> impl Iterator<Item = &'a Pod> + 'a {
        self.pods.iter().filter_map(move |(u, p)| {
            let finished = || {
                self.status
                    .phase(u)
                    .is_some_and(|ph| ph == "Succeeded" || ph == "Failed")
            };
            (u != uid && !self.failed.contains(u) && !finished()).then_some(&**p)
        })
    }

    /// Fails `pod` for `r` (the mark, an event, the counter) and hands it to its worker, which
    /// stops anything of it that runs and writes its Failed status.
    fn reject(&self, pod: Arc<Pod>, r: &Rejection) {
        let failure = match &self.admission {
            Some(a) => a.reject(&pod, r),
            None => {
                warn!(uid = pod_uid(&pod), reason = %r.reason, "pod rejected at admission: {}", r.message);
                let f = Failure::new(&r.reason, r.status_message());
                self.failed.mark(&pod, f.clone());
                self.recorder.warning(
                    crate::events::Involved::pod(&pod),
                    &r.reason,
                    r.message.clone(),
                );
                f
            }
        };
        self.workers
            .update_pod(pod, UpdateType::Kill(KillPodOptions::failed(failure, None)));
    }

    /// Fails a running pod for the eviction manager or node shutdown ([`FailPod`]): marks it in
    /// the failed-pods record (until the agent restarts, for a shutdown) and hands its worker the
    /// kill with the grace override; the worker writes its Failed status. A pod no source wants
    /// any more is being removed already: the request is dropped.
    pub fn handle_fail(&mut self, req: FailPod) {
        let uid = pod_uid(&req.pod).to_owned();
        if !self.pods.contains_key(&uid) {
            debug!(uid, reason = %req.failure.reason, "pod to fail is no longer wanted; dropped");
            return;
        }
        if req.until_restart {
            self.failed
                .mark_until_restart(&req.pod, req.failure.clone());
        } else {
            self.failed.mark(&req.pod, req.failure.clone());
        }
        self.workers.update_pod(
            req.pod,
            UpdateType::Kill(KillPodOptions::failed(req.failure, req.grace)),
        );
    }

    /// Handles one batch of pod updates (kubelet's `HandlePodAdditions` / `Updates` / `Removes`).
    pub fn handle_config(&mut self, update: PodUpdate) {
        for pod in update.pods {
            let uid = pod_uid(&pod).to_owned();
            let (name, namespace) = (
                pod.metadata.name.as_deref().unwrap_or(""),
                pod.metadata.namespace.as_deref().unwrap_or(""),
            );
            info!(pod = name, namespace, uid, source = update.source, op = ?update.op, "pod config changed");
            if update.op == PodOp::Reconcile {
                // The spec is unchanged: a sync of the pod the loop has.
                if let Some(pod) = self.runnable(&uid) {
                    self.workers.update_pod(pod.clone(), UpdateType::Sync);
                }
                continue;
            }
            if update.op == PodOp::Remove {
                self.failed.forget(&uid);
                let pod = self.pods.remove(&uid).unwrap_or(pod);
                self.workers
                    .update_pod(pod, UpdateType::Kill(KillPodOptions::removed()));
                continue;
            }
            // A failed pod stays Failed until its manifest changes; a changed one is admitted
            // afresh, like a new pod.
            let was_failed = self.failed.contains(&uid);
            if was_failed {
                if let Some(failure) = self.failed.failure(&pod) {
                    debug!(
                        pod = name,
                        namespace, uid, "pod failed and its manifest is unchanged; not starting it"
                    );
                    // First seen since the agent started (the record outlives restarts): the
                    // worker makes sure nothing of it runs and shows its Failed status.
                    if self.pods.insert(uid, pod.clone()).is_none() {
                        self.workers.update_pod(
                            pod,
                            UpdateType::Kill(KillPodOptions::failed(failure, None)),
                        );
                    }
                    continue;
                }
                self.failed.forget(&uid);
            }
            let adopted = self.adopted.remove(&uid);
            let fresh = was_failed || (!self.pods.contains_key(&uid) && !adopted);
            // An edited manifest goes through admission again, the other pods counted as
            // running: kubelet sees an edited static pod as a new pod (a new UID), which its
            // admit handlers check afresh; nodelet keeps the UID (see the README) but not the
            // exemption. A refused edit stops the running pod, as kubelet's would.
            let edited = self
                .pods
                .get(&uid)
                .is_some_and(|p| crate::pod::config_hash(p) != crate::pod::config_hash(&pod));
            let rejection = if fresh || edited {
                self.admission_refusal(&pod, &uid)
            } else {
                None
            };
            self.pods.insert(uid, pod.clone());
            match rejection {
                Some(r) => self.reject(pod, &r),
                None => self.workers.update_pod(pod, UpdateType::Sync),
            }
        }
        if !self.housekept {
            self.handle_housekeeping();
        }
    }

    /// A PLEG event: sync its pod if it is desired.
    pub fn handle_pleg(&mut self, ev: PodLifecycleEvent) {
        if let Some(pod) = self.runnable(&ev.uid) {
            debug!(uid = %ev.uid, event = ?ev.kind, "PLEG event");
            self.workers.update_pod(pod.clone(), UpdateType::Sync);
        }
    }

    /// A probe result that changed: the pod is synced (kubelet's `handleProbeSync`), which
    /// kills a container whose liveness or startup probe failed and writes the new readiness
    /// into the pod's status.
    pub fn handle_probe(&mut self, r: ProbeResult) {
        if let Some(pod) = self.runnable(&r.uid) {
            debug!(uid = %r.uid, container = %r.container, kind = ?r.kind, success = r.success, "probe result");
            self.workers.update_pod(pod.clone(), UpdateType::Sync);
        }
    }

    /// The sync tick: sync every desired pod whose work-queue entry is due at `now`.
    pub fn handle_sync_tick(&mut self, now: Instant) {
        for uid in self.queue.take_due(now) {
            if let Some(pod) = self.runnable(&uid) {
                self.workers.update_pod(pod.clone(), UpdateType::Sync);
            }
        }
    }

    /// Housekeeping: once every source has reported, forget the failure records of pods no
    /// source wants, have a worker clear the statuses no worker owns any more (a pod failed
    /// while its removal was under way), and hand the desired UIDs to the housekeeper.
    pub fn handle_housekeeping(&mut self) {
        if self.sources_ready.all_ready() {
            self.housekept = true;
            self.failed.retain(|uid| self.pods.contains_key(uid));
            for uid in self.status.uids() {
                if !self.pods.contains_key(&uid) && !self.workers.is_known(&uid) {
                    let mut p = Pod::default();
                    p.metadata.uid = Some(uid);
                    self.workers
                        .update_pod(Arc::new(p), UpdateType::Kill(KillPodOptions::removed()));
                }
            }
            (self.housekeeper)(self.pods.keys().cloned().collect());
        }
    }

    /// Runs the loop on the calling thread until `stop` fires or the config channel closes.
    pub fn run(mut self, ch: Channels) {
        let sync_tick = tick(SYNC_TICK);
        let housekeeping = tick(HOUSEKEEPING_PERIOD);
        loop {
            select! {
                recv(ch.config) -> u => match u {
                    Ok(u) => self.handle_config(u),
                    Err(_) => return,
                },
                recv(ch.pleg) -> ev => if let Ok(ev) = ev { self.handle_pleg(ev) },
                recv(ch.probes) -> r => if let Ok(r) = r { self.handle_probe(r) },
                recv(ch.failures) -> f => if let Ok(f) = f { self.handle_fail(f) },
                recv(sync_tick) -> _ => self.handle_sync_tick(crate::clock::monotonic_now()),
                recv(housekeeping) -> _ => self.handle_housekeeping(),
                recv(ch.stop) -> _ => return,
            }
            if let Some(f) = &self.on_iteration {
                f();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::podworkers::Periods;
    use crate::prober::ProbeKind;
    use crate::testing::syncer::RecordingSyncer;
    use std::sync::Mutex;

    /// Workers over a recording syncer, with no delays.
    fn recording_workers() -> (Arc<RecordingSyncer>, WorkQueue, PodWorkers<RecordingSyncer>) {
        let rec = RecordingSyncer::new();
        let queue = WorkQueue::default();
        let periods = Periods {
            resync: Duration::ZERO,
            backoff: Duration::ZERO,
        };
        let workers = PodWorkers::new(
            rec.clone(),
            queue.clone(),
            periods,
            tokio::runtime::Handle::current(),
            prometheus_client::metrics::counter::Counter::default(),
        );
        (rec, queue, workers)
    }

    fn pod(uid: &str) -> Arc<Pod> {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.into());
        Arc::new(p)
    }

    /// Lets the workers run (paused time: returns once every task waits).
    async fn settle() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    fn calls_of(rec: &RecordingSyncer, uid: &str) -> Vec<String> {
        rec.calls()
            .into_iter()
            .filter(|c| c.split(' ').nth(1) == Some(uid))
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn add_update_remove_and_housekeeping_dispatch_in_order() {
        let (rec, queue, workers) = recording_workers();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let seen2 = seen.clone();
        let hk: Housekeeper = Box::new(move |desired| seen2.lock().unwrap().push(desired.len()));
        let (tx, _rx) = crossbeam_channel::unbounded();
        let mut cfg = crate::source::PodConfig::new(tx);
        let ready = cfg.register("file");
        let mut l = SyncLoop::new(
            workers.clone(),
            queue,
            cfg.readiness(),
            hk,
            Recorder::default(),
            1,
        );
        l.handle_housekeeping();
        assert!(
            seen.lock().unwrap().is_empty(),
            "housekeeping waits for sources"
        );
        ready.store(true, std::sync::atomic::Ordering::Release);
        l.handle_config(PodUpdate {
            op: PodOp::Add,
            source: "file",
            pods: vec![pod("a"), pod("b")],
        });
        assert_eq!(
            l.recorder.list()[0].reason,
            "OutOfpods",
            "maxPods=1 refuses the second pod"
        );
        settle().await;
        assert_eq!(
            calls_of(&rec, "b"),
            vec!["kill b None OutOfpods: Pod was rejected: Node didn't have enough resource: pods, requested: 1, used: 1, capacity: 1"],
            "its worker writes its Failed status"
        );
        l.handle_sync_tick(Instant::now() + Duration::from_secs(1));
        settle().await;
        let probe = |kind, success| ProbeResult {
            uid: "a".into(),
            container: "c".into(),
            kind,
            success,
        };
        l.handle_probe(probe(ProbeKind::Liveness, true));
        settle().await;
        l.handle_probe(probe(ProbeKind::Liveness, false));
        settle().await;
        l.handle_config(PodUpdate {
            op: PodOp::Remove,
            source: "file",
            pods: vec![pod("a")],
        });
        settle().await;
        l.handle_housekeeping();
        assert_eq!(
            calls_of(&rec, "a"),
            vec!["sync a", "sync a", "sync a", "sync a", "kill a None"],
            "every change of a probe result syncs the pod"
        );
        assert_eq!(
            *seen.lock().unwrap(),
            vec![2, 1],
            "a first pass as soon as every source reported (a and b), then b stays desired (Failed)"
        );
        assert!(workers.is_empty());
    }

    fn hashed(uid: &str, hash: &str) -> Arc<Pod> {
        Arc::new(crate::testing::pods::versioned(uid, hash))
    }

    #[tokio::test(start_paused = true)]
    async fn evicted_pods_are_not_synced_until_their_manifest_changes_and_admission_refuses_under_pressure(
    ) {
        let (rec, queue, workers) = recording_workers();
        let (tx, _rx) = crossbeam_channel::unbounded();
        let cfg = crate::source::PodConfig::new(tx);
        let admission = PodAdmitter {
            shutdown: Default::default(),
            pressure: Default::default(),
            failed: Default::default(),
            recorder: Recorder::default(),
            metrics: crate::metrics::Metrics::new(),
            static_pods_are_critical: false,
            node: crate::admission::node_affinity::NodeIdentity::new("node", &Default::default()),
            allocatable: crate::admission::node_resources::Allocatable {
                cpu_milli: 4000,
                memory: 8 << 30,
                ephemeral_storage: 0,
                pods: 110,
                hugepages: Default::default(),
            },
            allowed_unsafe_sysctls: Vec::new(),
            requests: Default::default(),
        };
        let status = StatusManager::default();
        let mut l = SyncLoop::new(
            workers.clone(),
            queue,
            cfg.readiness(),
            Box::new(|_| {}),
            Recorder::default(),
            10,
        )
        .with_admission(admission.clone(), status.clone());
        let update = |op, p| PodUpdate {
            op,
            source: "file",
            pods: vec![p],
        };
        l.handle_config(update(PodOp::Add, hashed("a", "h1")));
        settle().await;
        // Evicted: the eviction manager's request marks it and hands its worker the kill with the
        // grace override; PLEG events and an unchanged manifest do not sync it.
        let evict = |p, message| FailPod {
            pod: p,
            failure: Failure::new("Evicted", message),
            grace: Some(1),
            until_restart: false,
        };
        l.handle_fail(evict(hashed("a", "h1"), "low on memory"));
        assert!(admission.failed.contains("a"));
        l.handle_pleg(PodLifecycleEvent {
            uid: "a".into(),
            kind: crate::pleg::PodLifecycleEventType::ContainerDied,
            container_id: String::new(),
        });
        l.handle_config(update(PodOp::Update, hashed("a", "h1")));
        settle().await;
        assert_eq!(
            rec.calls(),
            vec!["sync a", "kill a Some(1) Evicted: low on memory"]
        );
        rec.clear();
        // A changed manifest under DiskPressure is refused at admission: its worker gets the
        // kill with kubelet's reason and message, and writes the Failed status.
        admission.pressure.update(
            [("DiskPressure".to_string(), true)].into(),
            Default::default(),
        );
        l.handle_config(update(PodOp::Update, hashed("a", "h2")));
        settle().await;
        assert_eq!(
            rec.calls(),
            vec!["kill a None Evicted: Pod was rejected: The node had condition: [DiskPressure]. "]
        );
        assert_eq!(admission.recorder.list()[0].reason, "Evicted");
        // A pod the runtime ran when the agent started is adopted, even under pressure.
        l.adopted.insert("b".into());
        l.handle_config(update(PodOp::Add, hashed("b", "h1")));
        settle().await;
        assert_eq!(calls_of(&rec, "b"), vec!["sync b"]);
        rec.clear();
        // Pressure gone and the manifest changed again: it runs.
        admission
            .pressure
            .update(Default::default(), Default::default());
        l.handle_config(update(PodOp::Update, hashed("a", "h3")));
        settle().await;
        l.handle_config(update(PodOp::Remove, hashed("a", "h3")));
        settle().await;
        assert_eq!(rec.calls(), vec!["sync a", "kill a None"]);
        assert!(!admission.failed.contains("a"));
        // An eviction that lands after the removal is dropped, and housekeeping has a worker
        // clear the status no worker owns any more.
        l.handle_fail(evict(hashed("a", "h3"), "late"));
        assert!(!admission.failed.contains("a"));
        status.set(
            hashed("a", "h3"),
            Failure::new("Evicted", "late").status(&hashed("a", "h3")),
        );
        rec.clear();
        l.handle_housekeeping();
        settle().await;
        assert!(!admission.failed.contains("a"));
        assert_eq!(rec.calls(), vec!["kill a None"]);
    }
}
