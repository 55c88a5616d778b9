//! The pod-sync layer (kubelet's `Kubelet.SyncPod`, `SyncTerminatingPod` and
//! `SyncTerminatedPod` in `pkg/kubelet/kubelet.go`): what one sync or kill of a pod does above
//! the runtime. The pod workers call it through [`PodSyncer`]; it calls the runtime manager
//! ([`crate::kuberuntime`]) for "compute pod actions → CRI calls" and does the rest itself:
//!
//! - [`sync`]: read the pod's runtime status (the pod cache once newer than its last sync),
//!   the failed-pods record and the active deadline, the pod cgroup, the API objects and
//!   volumes, then the runtime's sync; the containers' waiting reasons from its
//!   [`PodSyncResult`](crate::kuberuntime::result::PodSyncResult), the probe workers, and the
//!   pod's status;
//! - [`terminate`]: the runtime's kill, the pod's last status, its probe workers, directories,
//!   volumes and cgroups, and everything kept about it;
//! - [`status`]: the status written from the runtime's view, and the cache reads.
//!
//! Errors are typed ([`PodSyncError`]), so a pod worker tells a back-off from a failure.

pub mod status;
pub mod sync;
pub mod terminate;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;

use crate::clock::SharedClock;
use crate::cm::ContainerManager;
use crate::container::cache::PodCache;
use crate::cri::{Cri, CriRuntime};
use crate::events::Recorder;
use crate::kuberuntime::{KubeRuntimeManager, SyncError};
use crate::metrics::Metrics;
use crate::objects::LocalObjects;
use crate::pleg::feed::CacheFeed;
use crate::podworkers::{KillPodOptions, PodSyncer, Requeue, SyncFailure};
use crate::prober::ProbeManager;
use crate::status::failed::FailedPods;
use crate::status::generate::StartErrors;
use crate::status::StatusManager;
use crate::volume::VolumeError;

/// Why a sync or a kill of a pod did not complete.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PodSyncError {
    /// The runtime's part failed: a CRI call, or a container or the sandbox that did not start
    /// (with kubelet's reason).
    #[error(transparent)]
    Runtime(#[from] SyncError),
    /// The pod cgroup could not be made.
    #[error("pod cgroup: {0}")]
    Cgroup(String),
    /// A volume could not be set up: the pod stays in ContainerCreating with a `FailedMount`
    /// event.
    #[error("FailedMount: {0}")]
    Mount(#[from] VolumeError),
}

impl SyncFailure for PodSyncError {
    /// A container waits out a back-off (`ImagePullBackOff`): the pod is synced again when it
    /// ends; nothing new failed.
    fn is_backoff(&self) -> bool {
        matches!(
            self,
            Self::Runtime(SyncError::Start {
                reason: "ImagePullBackOff" | "CrashLoopBackOff",
                ..
            })
        )
    }
}

impl From<crate::cri::CriError> for PodSyncError {
    fn from(e: crate::cri::CriError) -> Self {
        Self::Runtime(SyncError::Cri(e))
    }
}

/// What the pod-sync layer works with besides the runtime manager.
pub struct Deps {
    /// The container manager (pod cgroups).
    pub cm: Arc<ContainerManager>,
    /// Where pod statuses go (written only by the pod workers, through this layer).
    pub status: StatusManager,
    /// Events.
    pub recorder: Recorder,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The pod cache (read; the PLEG writes it).
    pub cache: PodCache,
    /// Where the pod's own status reads and its removal are handed to the PLEG.
    pub cache_feed: CacheFeed,
    /// Pods failed by eviction or refused at admission.
    pub failed: FailedPods,
    /// Time.
    pub clock: SharedClock,
    /// Probe workers and their results.
    pub probes: ProbeManager,
    /// Local ConfigMaps and Secrets (volumes of static pods).
    pub objects: LocalObjects,
    /// The apiserver's ConfigMaps and Secrets (volumes of API pods).
    pub api_objects: crate::objects::ApiObjects,
    /// Where each pod's images are registered as in use, for image garbage collection.
    pub pod_images: crate::gc::images::PodImages,
    /// Where a pod with more dead containers than the garbage collection policy keeps is
    /// reported.
    pub dead_containers: crate::gc::DeadContainers,
}

/// The pod-sync layer: one per agent, shared by all pod workers, over the runtime manager.
pub struct PodSync<R: CriRuntime = Cri> {
    runtime: Arc<KubeRuntimeManager<R>>,
    cm: Arc<ContainerManager>,
    status: StatusManager,
    recorder: Recorder,
    metrics: Arc<Metrics>,
    cache: PodCache,
    cache_feed: CacheFeed,
    failed: FailedPods,
    clock: SharedClock,
    probes: ProbeManager,
    objects: LocalObjects,
    api_objects: crate::objects::ApiObjects,
    pod_images: crate::gc::images::PodImages,
    dead_containers: crate::gc::DeadContainers,
    /// Each pod's containers' last start failures (kubelet's `ReasonCache`), by pod UID.
    reasons: Mutex<HashMap<String, StartErrors>>,
    /// When each pod was last synced: its next sync acts on a status read after it.
    last_sync: Mutex<HashMap<String, Instant>>,
    /// Pods whose start duration has been observed.
    started: Mutex<HashSet<String>>,
    /// When this agent started, nanoseconds since the epoch.
    agent_start_ns: i64,
}

impl<R: CriRuntime> PodSync<R> {
    /// The layer over `runtime` with `deps`.
    pub fn new(runtime: Arc<KubeRuntimeManager<R>>, deps: Deps) -> Self {
        Self {
            runtime,
            cm: deps.cm,
            status: deps.status,
            recorder: deps.recorder,
            metrics: deps.metrics,
            cache: deps.cache,
            cache_feed: deps.cache_feed,
            failed: deps.failed,
            agent_start_ns: deps.clock.epoch_ns(),
            clock: deps.clock,
            probes: deps.probes,
            objects: deps.objects,
            api_objects: deps.api_objects,
            pod_images: deps.pod_images,
            dead_containers: deps.dead_containers,
            reasons: Mutex::new(HashMap::new()),
            last_sync: Mutex::new(HashMap::new()),
            started: Mutex::new(HashSet::new()),
        }
    }

    /// The runtime manager.
    pub fn runtime(&self) -> &Arc<KubeRuntimeManager<R>> {
        &self.runtime
    }

    /// The container manager.
    pub fn cm(&self) -> &Arc<ContainerManager> {
        &self.cm
    }

    /// Where `pod` reads its ConfigMaps and Secrets: the apiserver's for a pod from the API,
    /// else the local documents.
    fn objects_for(&self, pod: &Pod) -> &LocalObjects {
        if crate::pod::is_api_pod(pod) {
            self.api_objects.store()
        } else {
            &self.objects
        }
    }
}

impl<R: CriRuntime> PodSyncer for PodSync<R> {
    type Error = PodSyncError;

    async fn sync_pod(&self, pod: Arc<Pod>) -> Result<Requeue, PodSyncError> {
        let t = self.clock.now();
        let r = self.sync(&pod).await;
        let secs = self.clock.now().duration_since(t).as_secs_f64();
        Metrics::observe(&self.metrics.pod_worker_duration, "sync", secs);
        r
    }

    async fn terminate_pod(&self, pod: Arc<Pod>, opts: KillPodOptions) -> Result<(), PodSyncError> {
        let t = self.clock.now();
        let r = self.terminate(&pod, opts).await;
        let secs = self.clock.now().duration_since(t).as_secs_f64();
        Metrics::observe(&self.metrics.pod_worker_duration, "kill", secs);
        r
    }

    /// A held static pod gets the status of a pod with nothing in the runtime (Pending, each
    /// container `ContainerCreating`), once: a status already written stands.
    fn sync_held(&self, pod: &Arc<Pod>) {
        if !self.status.has(crate::pod::pod_uid(pod)) {
            self.record_status(pod, &crate::container::RuntimePodStatus::default());
        }
    }

    /// A `FailedSync` warning event on the pod, as kubelet records for a sync error
    /// (`events.FailedSync`, "error syncing pod").
    fn sync_panicked(&self, pod: &Pod, message: &str) {
        self.recorder.warning(
            crate::events::Involved::pod(pod),
            "FailedSync",
            format!("error syncing pod: panic: {message}"),
        );
    }
}
