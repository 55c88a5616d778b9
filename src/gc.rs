//! Garbage collection of dead containers and sandboxes (kubelet's `kuberuntime_gc.go`), run after
//! each pod sync: at most one dead container is kept per (pod, container name), the one whose
//! exit the status shows as `lastState`; sandboxes that are not ready are removed once a newer
//! one exists and nothing runs in them. Orphaned pod cgroups are collected by housekeeping
//! ([`crate::cm::ContainerManager::cleanup_orphans`]), and orphaned pod directories by
//! [`remove_orphaned_pod_dirs`].

use tracing::warn;

use crate::container::{ContainerState, RuntimePodStatus};
use crate::cri::RuntimeService;

/// Removes exited containers beyond the newest one per container name, and sandboxes that
/// are not ready once a newer one exists (kubelet's container GC, one dead container kept
/// per (pod, container)).
pub async fn remove_dead_containers(cri: &impl RuntimeService, rt: &RuntimePodStatus) {
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

/// Removes `<root-dir>/pods/<uid>` of every pod not in `in_use` (kubelet's
/// `cleanupOrphanedPodDirs`); housekeeping passes the desired, running and terminating pods.
/// Entries whose name is not a safe UID are left alone. Returns the UIDs removed.
pub fn remove_orphaned_pod_dirs(
    root_dir: &std::path::Path,
    in_use: &std::collections::HashSet<String>,
) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(root_dir.join("pods")) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for e in entries.flatten() {
        let uid = e.file_name().to_string_lossy().into_owned();
        if in_use.contains(&uid) || !crate::pod::is_safe_uid(&uid) {
            continue;
        }
        // Volumes first: a tmpfs emptyDir is unmounted before its directory goes.
        crate::volume::tear_down_pod(&e.path());
        match std::fs::remove_dir_all(e.path()) {
            Ok(()) => removed.push(uid),
            Err(err) => {
                warn!(uid, path = %e.path().display(), error = %err, "cannot remove orphaned pod directory")
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orphaned_pod_dirs_go_and_pods_in_use_keep_theirs() {
        let tmp = tempfile::tempdir().unwrap();
        for uid in ["keep", "gone"] {
            std::fs::create_dir_all(tmp.path().join("pods").join(uid)).unwrap();
            std::fs::write(tmp.path().join("pods").join(uid).join("etc-hosts"), "x").unwrap();
        }
        let in_use = ["keep".to_string()].into();
        assert_eq!(remove_orphaned_pod_dirs(tmp.path(), &in_use), vec!["gone"]);
        assert!(tmp.path().join("pods/keep/etc-hosts").exists());
        assert!(!tmp.path().join("pods/gone").exists());
    }
}
