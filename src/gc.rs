//! Garbage collection of dead containers and sandboxes (kubelet's `kuberuntime_gc.go`), run after
//! each pod sync: at most one dead container is kept per (pod, container name), the one whose
//! exit the status shows as `lastState`; sandboxes that are not ready are removed once a newer
//! one exists and nothing runs in them. Orphaned pod cgroups are collected by housekeeping
//! ([`crate::cm::ContainerManager::cleanup_orphans`]).

use tracing::warn;

use crate::cri::Cri;
use crate::kuberuntime::runtime_status::{ContainerState, RuntimePodStatus};

/// Removes exited containers beyond the newest one per container name, and sandboxes that
/// are not ready once a newer one exists (kubelet's container GC, one dead container kept
/// per (pod, container)).
pub async fn remove_dead_containers(cri: &Cri, rt: &RuntimePodStatus) {
    let mut seen_dead = std::collections::HashSet::new();
    for c in &rt.containers {
        if c.state() != ContainerState::Exited {
            continue;
        }
        if !seen_dead.insert(c.name.clone()) {
            if let Err(e) = cri.remove_container(&c.id).await {
                warn!(container = %c.name, id = %c.id, error = %e, "cannot remove dead container");
            }
        }
    }
    for s in rt.sandboxes.iter().skip(1).filter(|s| !s.ready) {
        if rt
            .containers
            .iter()
            .any(|c| c.sandbox_id == s.id && c.state() == ContainerState::Running)
        {
            continue;
        }
        if let Err(e) = cri.remove_pod_sandbox(&s.id).await {
            warn!(sandbox = %s.id, error = %e, "cannot remove old sandbox");
        }
    }
}
