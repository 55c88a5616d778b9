//! The runtime manager against the recording fake runtime: what a sync ([`sync`]) and a kill
//! ([`kill`]) ask of CRI, in which order, and the status the worker writes, on fake time (no
//! sleeping). This module holds the harness.

mod actions;
mod kill;
mod sync;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};

use super::{KubeRuntimeManager, Settings, Shared};
use crate::clock::FakeClock;
use crate::cm::resources::NodeResources;
use crate::cm::ContainerManager;
use crate::container::cache::PodCacheWriter;
use crate::cri::api::ContainerState as Cs;
use crate::events::Recorder;
use crate::podsync::PodSync;
use crate::podworkers::{KillPodOptions, PodSyncer, Requeue};
use crate::status::failed::{FailedPods, Failure};
use crate::status::StatusManager;
use crate::testing::cgroups::MemCgroups;
use crate::testing::runtime::FakeRuntime;

pub(super) struct Harness {
    pub(super) rt: FakeRuntime,
    pub(super) clock: FakeClock,
    /// The pod-sync layer over the runtime manager: what the pod workers call.
    pub(super) mgr: PodSync<FakeRuntime>,
    /// The pod cache, written as the PLEG would.
    pub(super) cache: PodCacheWriter,
    pub(super) status: StatusManager,
    pub(super) recorder: Recorder,
    pub(super) failed: FailedPods,
    pub(super) cgroups: Arc<MemCgroups>,
    pub(super) probes: crate::prober::ProbeManager,
    pub(super) probe_updates: crossbeam_channel::Receiver<crate::prober::ProbeResult>,
    /// The static pods' ConfigMaps and Secrets.
    pub(super) objects: crate::objects::LocalObjects,
    /// `--root-dir`.
    pub(super) root_dir: std::path::PathBuf,
    _tmp: tempfile::TempDir,
}

pub(super) fn harness() -> Harness {
    let tmp = tempfile::tempdir().unwrap();
    let clock = FakeClock::new(1_800_000_000_000_000_000);
    let rt = FakeRuntime::new(clock.clone());
    let mut settings = Settings::example();
    settings.pod_logs_dir = tmp.path().join("logs");
    settings.root_dir = tmp.path().join("root");
    let root_dir = settings.root_dir.clone();
    let cgroups = Arc::new(MemCgroups::default());
    let cm = ContainerManager::new(
        cgroups.clone(),
        crate::testing::cgroups::node_config(NodeResources {
            cpu_milli: 2000,
            memory: 8 << 30,
            pids: 4096,
        }),
    );
    let (status, recorder, failed) = (
        StatusManager::default(),
        Recorder::default(),
        FailedPods::default(),
    );
    let cache = PodCacheWriter::default();
    // The PLEG's part: what the workers hand it is applied.
    let (cache_feed, feed_rx) = crate::pleg::feed::channel();
    let served = cache.another();
    tokio::spawn(async move { feed_rx.serve(&served).await });
    let metrics = crate::metrics::Metrics::new();
    let (probe_tx, probe_rx) = crossbeam_channel::unbounded();
    let probes = crate::prober::ProbeManager::new(crate::prober::manager::ProbeDeps {
        ctx: crate::prober::handlers::HandlerContext::new(crate::prober::handlers::exec_fn(
            rt.clone(),
        ))
        .unwrap(),
        cache: cache.reader(),
        updates: probe_tx,
        recorder: recorder.clone(),
        metrics: metrics.clone(),
        clock: clock.shared(),
    });
    let objects = crate::objects::LocalObjects::default();
    let cm = Arc::new(cm);
    let shared = Shared {
        recorder: recorder.clone(),
        metrics: metrics.clone(),
        cache: cache.reader(),
        clock: clock.shared(),
        probes: probes.clone(),
        objects: objects.clone(),
        api_objects: Default::default(),
    };
    let runtime = Arc::new(KubeRuntimeManager::new(rt.clone(), settings, shared));
    let mgr = PodSync::new(
        runtime,
        crate::podsync::Deps {
            cm,
            status: status.clone(),
            recorder: recorder.clone(),
            metrics,
            cache: cache.reader(),
            cache_feed,
            failed: failed.clone(),
            clock: clock.shared(),
            probes: probes.clone(),
            objects: objects.clone(),
            pod_images: Default::default(),
            dead_containers: Default::default(),
            api_objects: Default::default(),
        },
    );
    Harness {
        rt,
        clock,
        mgr,
        cache,
        status,
        recorder,
        failed,
        cgroups,
        probes,
        probe_updates: probe_rx,
        objects,
        root_dir,
        _tmp: tmp,
    }
}

/// A pod `web-node1` (UID `u1`, manifest version `hash`) with the given spec fields and
/// containers.
pub(super) fn versioned(hash: &str, spec: &str) -> Arc<Pod> {
    Arc::new(
        serde_yaml::from_str(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: web-node1, namespace: default, uid: u1, annotations: {{kubernetes.io/config.hash: {hash}}}}}\nspec: {spec}"
        ))
        .unwrap(),
    )
}

pub(super) fn pod(spec: &str) -> Arc<Pod> {
    versioned("h1", spec)
}

pub(super) fn apps(names: &[&str]) -> String {
    let list: Vec<String> = names
        .iter()
        .map(|n| format!("{{name: {n}, image: 'busybox:1.36'}}"))
        .collect();
    list.join(", ")
}

impl Harness {
    pub(super) async fn sync(&self, pod: &Arc<Pod>) -> Result<Requeue, String> {
        self.mgr
            .sync_pod(pod.clone())
            .await
            .map_err(|e| e.to_string())
    }

    /// A sync of `pod` with the number of hand-offs to the blocking pool it made.
    pub(super) async fn counted_sync(&self, pod: &Arc<Pod>) -> (Result<Requeue, String>, usize) {
        crate::blocking::handoffs::counted(self.sync(pod)).await
    }

    /// The log directory of the pod `web-node1` (`<podLogsDir>/<ns>_<name>_<uid>`).
    pub(super) fn pod_log_dir(&self) -> std::path::PathBuf {
        let logs = self
            .root_dir
            .parent()
            .expect("under the temporary directory");
        logs.join("logs/default_web-node1_u1")
    }

    /// What the PLEG does when the runtime changes: a fresh view of the pod in the cache.
    pub(super) async fn pleg_sees_it(&self) {
        self.clock.advance(Duration::from_millis(1));
        let seen = super::status::get_pod_status(&self.rt, "u1").await.unwrap();
        self.cache
            .set("u1", seen, crate::clock::Clock::now(&self.clock));
    }

    /// Container `name` exits with `code`, and the PLEG sees it.
    pub(super) async fn exit(&self, name: &str, code: i32) {
        self.rt.exit(name, code);
        self.pleg_sees_it().await;
    }

    pub(super) fn status(&self) -> PodStatus {
        self.status.get("u1").unwrap()
    }

    /// The waiting reason of container `name` in the pod's status.
    pub(super) fn waiting(&self, name: &str) -> Option<String> {
        let st = self.status();
        st.container_statuses
            .iter()
            .flatten()
            .chain(st.init_container_statuses.iter().flatten())
            .find(|c| c.name == name)?
            .state
            .as_ref()?
            .waiting
            .as_ref()?
            .reason
            .clone()
    }
}
