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

use crate::admission::{host_ports, PodAdmitter};
use crate::events::Recorder;
use crate::pleg::PodLifecycleEvent;
use crate::pod::{pod_ref, pod_uid};
use crate::podworkers::{PodSyncer, PodWorkers, UpdateType, WorkQueue};
use crate::prober::{ProbeKind, ProbeResult};
use crate::source::{PodOp, PodUpdate, SourcesReady};

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
    evicted: crate::eviction::EvictedPods,
    /// Pod admission (kubelet's `PodAdmitHandler`s); none: every pod is admitted.
    pub admission: Option<PodAdmitter>,
    /// Pods the runtime was running when the agent started: adopted, not admitted again.
    adopted: HashSet<String>,
    /// Pods refused for maxPods: their Failed/OutOfpods status stays until the manifest goes.
    out_of_pods: HashSet<String>,
    /// Called after every iteration (the systemd watchdog hook, later); cheap.
    pub on_iteration: Option<Box<dyn Fn() + Send>>,
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
            evicted: Default::default(),
            admission: None,
            adopted: HashSet::new(),
            out_of_pods: HashSet::new(),
            on_iteration: None,
        }
    }

    /// Uses `admission` and its registry of evicted pods.
    pub fn with_admission(mut self, admission: PodAdmitter) -> Self {
        self.evicted = admission.evicted.clone();
        self.admission = Some(admission);
        self
    }

    /// Pods (UIDs) the runtime runs at start-up: when their manifests arrive they are adopted
    /// without admission, so a restart under pressure never fails pods that keep running.
    pub fn with_adopted(mut self, uids: HashSet<String>) -> Self {
        self.adopted = uids;
        self
    }

    /// The pod if it is desired and not failed by eviction.
    fn runnable(&self, uid: &str) -> Option<&Arc<Pod>> {
        self.pods.get(uid).filter(|_| !self.evicted.contains(uid))
    }

    /// Handles one batch of pod updates (kubelet's `HandlePodAdditions` / `Updates` / `Removes`).
    pub fn handle_config(&mut self, update: PodUpdate) {
        for pod in update.pods {
            let uid = pod_uid(&pod).to_owned();
            let (name, namespace) = (
                pod.metadata.name.as_deref().unwrap_or(""),
                pod.metadata.namespace.as_deref().unwrap_or(""),
            );
            // maxPods counts the pods that may run (not those failed by eviction), and holds for
            // a pod first seen in an update as well (the edit of a refused manifest).
            let active = self
                .pods
                .keys()
                .filter(|u| !self.evicted.contains(u))
                .count();
            if update.op != PodOp::Remove
                && !self.pods.contains_key(&uid)
                && active >= self.max_pods
            {
                let msg = format!(
                    "node has reached maxPods ({}); pod not admitted",
                    self.max_pods
                );
                warn!(pod = name, namespace, uid, "{msg}");
                if let Some(a) = &self.admission {
                    a.status.set(
                        pod.clone(),
                        k8s_openapi::api::core::v1::PodStatus {
                            phase: Some("Failed".into()),
                            reason: Some("OutOfpods".into()),
                            message: Some(msg.clone()),
                            ..Default::default()
                        },
                    );
                }
                self.recorder.warning(pod_ref(&pod), "OutOfpods", msg);
                self.out_of_pods.insert(uid);
                continue;
            }
            if self.out_of_pods.remove(&uid) && update.op == PodOp::Remove {
                if let Some(a) = &self.admission {
                    a.status.remove(&uid);
                }
                continue;
            }
            info!(pod = name, namespace, uid, source = update.source, op = ?update.op, "pod config changed");
            if update.op == PodOp::Remove {
                self.evicted.forget(&uid);
                let pod = self.pods.remove(&uid).unwrap_or(pod);
                self.workers.update_pod(pod, UpdateType::Kill(None));
                continue;
            }
            // An evicted pod stays Failed until its manifest changes; a changed one is admitted
            // afresh, like a new pod.
            let was_evicted = self.evicted.contains(&uid);
            if was_evicted && self.evicted.message(&pod).is_some() {
                debug!(
                    pod = name,
                    namespace,
                    uid,
                    "pod was evicted and its manifest is unchanged; not starting it"
                );
                // First seen since the agent started (the record outlives restarts): the worker
                // makes sure nothing of it runs and shows its Failed/Evicted status.
                if self.pods.insert(uid, pod.clone()).is_none() {
                    self.workers.update_pod(pod, UpdateType::Kill(None));
                }
                continue;
            }
            let adopted = self.adopted.remove(&uid);
            let fresh = was_evicted || (!self.pods.contains_key(&uid) && !adopted);
            let previous = self.pods.insert(uid.clone(), pod.clone());
            // An edit that changes the pod's host ports is admitted again for them (kubelet sees
            // an edited manifest as a new pod); other edits of a running pod are not.
            let ports_changed = previous
                .as_ref()
                .is_some_and(|p| host_ports::host_ports(p) != host_ports::host_ports(&pod));
            if let Some(a) = self.admission.as_ref().filter(|_| fresh || ports_changed) {
                let running = self.pods.iter().filter_map(|(u, p)| {
                    let finished = || {
                        a.status
                            .phase(u)
                            .is_some_and(|ph| ph == "Succeeded" || ph == "Failed")
                    };
                    (*u != uid && !self.evicted.contains(u) && !finished()).then_some(&**p)
                });
                let rejection = if fresh {
                    a.check(&pod, running)
                } else {
                    host_ports::admit(&pod, running)
                };
                if let Some(r) = rejection {
                    a.reject(&pod, &r);
                    if !fresh {
                        // Its running containers go, as the old pod would with kubelet.
                        self.workers.update_pod(pod, UpdateType::Kill(None));
                    }
                    continue;
                }
            }
            self.workers.update_pod(pod, UpdateType::Sync);
        }
    }

    /// A PLEG event: sync its pod if it is desired.
    pub fn handle_pleg(&mut self, ev: PodLifecycleEvent) {
        if let Some(pod) = self.runnable(&ev.uid) {
            debug!(uid = %ev.uid, event = ?ev.kind, "PLEG event");
            self.workers.update_pod(pod.clone(), UpdateType::Sync);
        }
    }

    /// A probe result: a liveness or startup failure syncs the pod (which restarts the
    /// container); readiness changes only the pod's status, recomputed at its next sync.
    pub fn handle_probe(&mut self, r: ProbeResult) {
        let restart = !r.success && matches!(r.kind, ProbeKind::Liveness | ProbeKind::Startup);
        if let Some(pod) = self
            .runnable(&r.uid)
            .filter(|_| restart || r.kind == ProbeKind::Readiness)
        {
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

    /// Housekeeping: once every source has reported, hand the desired UIDs to the housekeeper.
    pub fn handle_housekeeping(&mut self) {
        if self.sources_ready.all_ready() {
            // Eviction records and Failed statuses of pods no source wants any more (a pod
            // evicted while its removal was under way) go; a live worker keeps its own status.
            self.evicted.retain(|uid| self.pods.contains_key(uid));
            if let Some(a) = &self.admission {
                for uid in a.status.uids() {
                    if !self.pods.contains_key(&uid)
                        && !self.workers.is_known(&uid)
                        && !self.out_of_pods.contains(&uid)
                    {
                        a.status.remove(&uid);
                    }
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
                recv(sync_tick) -> _ => self.handle_sync_tick(Instant::now()),
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
    use crate::podworkers::{Periods, Requeue};
    use std::sync::Mutex;

    #[derive(Default)]
    struct Rec(Mutex<Vec<String>>);
    impl PodSyncer for Rec {
        async fn sync_pod(&self, pod: Arc<Pod>) -> Result<Requeue, String> {
            self.0
                .lock()
                .unwrap()
                .push(format!("sync {}", pod_uid(&pod)));
            Ok(Requeue::Normal)
        }
        async fn terminate_pod(&self, pod: Arc<Pod>, _: Option<i64>) -> Result<(), String> {
            self.0
                .lock()
                .unwrap()
                .push(format!("kill {}", pod_uid(&pod)));
            Ok(())
        }
    }

    /// Workers over a recording syncer, with no delays.
    fn recording_workers() -> (Arc<Rec>, WorkQueue, PodWorkers<Rec>) {
        let rec = Arc::new(Rec::default());
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
        );
        (rec, queue, workers)
    }

    fn pod(uid: &str) -> Arc<Pod> {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.into());
        Arc::new(p)
    }

    #[tokio::test]
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
        tokio::time::sleep(Duration::from_millis(20)).await;
        l.handle_sync_tick(Instant::now() + Duration::from_secs(1));
        tokio::time::sleep(Duration::from_millis(20)).await;
        let probe = |kind, success| ProbeResult {
            uid: "a".into(),
            container: "c".into(),
            kind,
            success,
        };
        l.handle_probe(probe(ProbeKind::Liveness, true));
        tokio::time::sleep(Duration::from_millis(20)).await;
        l.handle_probe(probe(ProbeKind::Liveness, false));
        tokio::time::sleep(Duration::from_millis(20)).await;
        l.handle_config(PodUpdate {
            op: PodOp::Remove,
            source: "file",
            pods: vec![pod("a")],
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        l.handle_housekeeping();
        assert_eq!(
            *rec.0.lock().unwrap(),
            vec!["sync a", "sync a", "sync a", "kill a"],
            "a liveness success does not sync; a failure does"
        );
        assert_eq!(*seen.lock().unwrap(), vec![0]);
        assert!(workers.is_empty());
    }

    fn hashed(uid: &str, hash: &str) -> Arc<Pod> {
        let mut p = (*pod(uid)).clone();
        p.metadata.annotations = Some(
            [(
                crate::pod::CONFIG_HASH_ANNOTATION.to_string(),
                hash.to_string(),
            )]
            .into(),
        );
        Arc::new(p)
    }

    #[tokio::test]
    async fn evicted_pods_are_not_synced_until_their_manifest_changes_and_admission_refuses_under_pressure(
    ) {
        let (rec, queue, workers) = recording_workers();
        let (tx, _rx) = crossbeam_channel::unbounded();
        let cfg = crate::source::PodConfig::new(tx);
        let admission = PodAdmitter {
            pressure: Default::default(),
            evicted: Default::default(),
            status: Default::default(),
            recorder: Recorder::default(),
            metrics: crate::metrics::Metrics::new(),
            static_pods_are_critical: false,
        };
        let mut l = SyncLoop::new(
            workers,
            queue,
            cfg.readiness(),
            Box::new(|_| {}),
            Recorder::default(),
            10,
        )
        .with_admission(admission.clone());
        let update = |op, p| PodUpdate {
            op,
            source: "file",
            pods: vec![p],
        };
        let settle = || tokio::time::sleep(Duration::from_millis(20));
        l.handle_config(update(PodOp::Add, hashed("a", "h1")));
        settle().await;
        // Evicted: PLEG events and an unchanged manifest do not sync it.
        admission
            .evicted
            .mark(&hashed("a", "h1"), "low on memory".into());
        l.handle_pleg(PodLifecycleEvent {
            uid: "a".into(),
            kind: crate::pleg::PodLifecycleEventType::ContainerDied,
            container_id: String::new(),
        });
        l.handle_config(update(PodOp::Update, hashed("a", "h1")));
        settle().await;
        assert_eq!(*rec.0.lock().unwrap(), vec!["sync a"]);
        // A changed manifest under DiskPressure is refused at admission, with a Failed status.
        admission.pressure.update(
            [("DiskPressure".to_string(), true)].into(),
            Default::default(),
        );
        l.handle_config(update(PodOp::Update, hashed("a", "h2")));
        settle().await;
        assert_eq!(rec.0.lock().unwrap().len(), 1);
        let st = admission.status.get("a").unwrap();
        assert_eq!(
            (st.phase.as_deref(), st.message.as_deref()),
            (
                Some("Failed"),
                Some("Pod was rejected: The node had condition: [DiskPressure]. ")
            )
        );
        // A pod the runtime ran when the agent started is adopted, even under pressure.
        l.adopted.insert("b".into());
        l.handle_config(update(PodOp::Add, hashed("b", "h1")));
        settle().await;
        assert_eq!(*rec.0.lock().unwrap(), vec!["sync a", "sync b"]);
        rec.0.lock().unwrap().pop();
        // Pressure gone and the manifest changed again: it runs.
        admission
            .pressure
            .update(Default::default(), Default::default());
        l.handle_config(update(PodOp::Update, hashed("a", "h3")));
        settle().await;
        l.handle_config(update(PodOp::Remove, hashed("a", "h3")));
        settle().await;
        assert_eq!(*rec.0.lock().unwrap(), vec!["sync a", "sync a", "kill a"]);
        assert!(!admission.evicted.contains("a"));
        // An eviction that lands after the removal leaves nothing behind after housekeeping.
        admission.evicted.mark(&hashed("a", "h3"), "late".into());
        admission.status.set(
            hashed("a", "h3"),
            crate::eviction::evicted_status(&hashed("a", "h3"), "late"),
        );
        l.handle_housekeeping();
        assert!(!admission.evicted.contains("a"));
        assert!(admission.status.get("a").is_none());
    }
}
