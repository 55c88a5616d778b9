//! Housekeeping (kubelet's `HandlePodCleanups`): every 2 s, once every source has reported, the
//! sync loop hands over the desired pods, and a pass, run off the sync-loop thread, kills the
//! pods the runtime runs that no source wants, and removes pod cgroups and pod directories that
//! no desired, running or terminating pod owns.
//!
//! At most one pass runs at a time; a tick that comes while one runs is skipped. Each pass is
//! timed in `kubelet_housekeeping_duration_seconds`, and one that takes over
//! [`SLOW_PASS`] is logged, as kubelet does.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::cri::CriRuntime;
use crate::kuberuntime::KubeRuntimeManager;
use crate::metrics::Metrics;
use crate::pod::pod_uid;
use crate::podworkers::{KillPodOptions, PodWorkers, UpdateType};
use crate::syncloop::Housekeeper;

/// A pass slower than this is logged (kubelet's housekeeping warning threshold).
pub const SLOW_PASS: Duration = Duration::from_secs(1);

/// The housekeeper the sync loop calls: it starts a pass on `rt` unless one is running.
pub fn housekeeper<R: CriRuntime>(
    manager: Arc<KubeRuntimeManager<R>>,
    workers: PodWorkers<KubeRuntimeManager<R>>,
    metrics: Arc<Metrics>,
    rt: tokio::runtime::Handle,
) -> Housekeeper {
    let busy = Arc::new(AtomicBool::new(false));
    Box::new(move |desired: HashSet<String>| {
        if busy.swap(true, Ordering::AcqRel) {
            return;
        }
        let (manager, workers, busy, metrics) = (
            manager.clone(),
            workers.clone(),
            busy.clone(),
            metrics.clone(),
        );
        rt.spawn(async move {
            let start = Instant::now();
            pass(&manager, &workers, &desired).await;
            let took = start.elapsed();
            metrics.housekeeping_duration.observe(took.as_secs_f64());
            if took > SLOW_PASS {
                warn!(took = ?took, "housekeeping took longer than expected");
            }
            busy.store(false, Ordering::Release);
        });
    })
}

/// One pass for the `desired` pod UIDs.
pub async fn pass<R: CriRuntime>(
    manager: &KubeRuntimeManager<R>,
    workers: &PodWorkers<KubeRuntimeManager<R>>,
    desired: &HashSet<String>,
) {
    let (pods, foreign) = match manager.runtime_pods().await {
        Ok(r) => (r.ours, r.foreign),
        Err(e) => {
            warn!(error = %e, "housekeeping: cannot list runtime pods");
            return;
        }
    };
    // Pod cgroups and directories that no desired, running or terminating pod owns, nor a
    // sandbox of another agent.
    let mut in_use: HashSet<String> = workers.known_uids();
    in_use.extend(pods.iter().map(|p| pod_uid(p).to_owned()));
    in_use.extend(foreign);
    manager.cm().cleanup_orphans(desired, &in_use);
    in_use.extend(desired.iter().cloned());
    for uid in crate::gc::remove_orphaned_pod_dirs(&manager.settings().root_dir, &in_use) {
        info!(uid, "removed orphaned pod directory");
    }
    for pod in pods {
        let uid = pod_uid(&pod).to_owned();
        if !desired.contains(&uid) && !workers.is_known(&uid) {
            info!(
                pod = pod.metadata.name.as_deref().unwrap_or(""),
                namespace = pod.metadata.namespace.as_deref().unwrap_or(""),
                uid,
                "killing pod that no source wants"
            );
            workers.update_pod(Arc::new(pod), UpdateType::Kill(KillPodOptions::removed()));
        }
    }
}
