//! Container log rotation (kubelet's `pkg/kubelet/logs/container_log_manager.go`).
//!
//! Every `containerLogMonitorInterval` each running container's log (the CRI `log_path`) is
//! checked. For one larger than `containerLogMaxSize`, the oldest rotated files are removed first
//! (kubelet's `removeExcessLogs`), so that at no moment more than `containerLogMaxFiles` files
//! exist, the current one included; then it is renamed to `<log>.<UTC timestamp>` and the
//! runtime reopens the log (CRI ReopenContainerLog). kubelet also
//! gzips older rotated files; nodelet keeps them plain.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tracing::{info, warn};

use crate::cri::RuntimeService;

/// Rotation policy.
#[derive(Debug, Clone, Copy)]
pub struct LogPolicy {
    /// Rotate above this size, bytes.
    pub max_size: u64,
    /// Files kept per container, the current one included (≥ 2).
    pub max_files: usize,
}

/// Rotated files of `log`, oldest first (names `<log>.<timestamp>` sort by time).
pub fn rotated_files(log: &Path) -> Vec<PathBuf> {
    let Some(dir) = log.parent() else {
        return Vec::new();
    };
    let Some(base) = log.file_name().map(|n| format!("{}.", n.to_string_lossy())) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&base))
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

/// Removes the oldest rotated files beyond `max_files - 1`.
pub fn prune(log: &Path, max_files: usize) {
    let rotated = rotated_files(log);
    let excess = rotated.len().saturating_sub(max_files.saturating_sub(1));
    for old in rotated.into_iter().take(excess) {
        let _ = std::fs::remove_file(old);
    }
}

/// Renames `log` to `<log>.<timestamp>`; returns the new name.
pub fn rename_current(log: &Path) -> std::io::Result<PathBuf> {
    let stamp = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y%m%d-%H%M%S%.6f")
        .to_string();
    let rotated = PathBuf::from(format!("{}.{stamp}", log.display()));
    std::fs::rename(log, &rotated)?;
    Ok(rotated)
}

/// Where log rotation learns a container's log path without asking the runtime (the pod
/// cache's [`crate::container::cache::PodCache::log_path`]): container ID → path.
pub type LogPathLookup = Box<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// One pass over the `running` containers of this node's pods (IDs). `log_paths` keeps each
/// container's log path between passes (a path never changes) and forgets containers that no
/// longer run; a container not seen before takes its path from `known`, else from
/// ContainerStatus (kubelet asks ContainerStatus for every container on every pass).
pub async fn rotate_once(
    cri: &impl RuntimeService,
    running: &[String],
    known: &(dyn Fn(&str) -> Option<String> + Sync),
    policy: LogPolicy,
    log_paths: &mut std::collections::HashMap<String, String>,
) {
    log_paths.retain(|id, _| running.contains(id));
    let mut logs = Vec::new();
    for id in running {
        let path = match log_paths.get(id).cloned().or_else(|| known(id)) {
            Some(p) => {
                log_paths.insert(id.clone(), p.clone());
                p
            }
            None => {
                let Ok(Some(st)) = cri.container_status(id).await else {
                    continue;
                };
                log_paths.insert(id.clone(), st.log_path.clone());
                st.log_path
            }
        };
        if !path.is_empty() {
            logs.push((id.clone(), PathBuf::from(path)));
        }
    }
    if logs.is_empty() {
        return;
    }
    // The logs' sizes, removals and renames on the blocking pool: a hung file system under
    // `podLogsDir` holds this pass (and the next, which waits for it), not the runtime's thread.
    let rotated = crate::blocking::run(move || rotate_files(logs, policy)).await;
    for r in rotated {
        if let Err(e) = cri.reopen_container_log(&r.id).await {
            // The runtime keeps writing to the renamed file; put it back.
            warn!(container = %r.id, error = %e, "cannot reopen container log; undoing the rotation");
            crate::blocking::run(move || {
                let _ = std::fs::rename(&r.rotated, &r.log);
            })
            .await;
            continue;
        }
        info!(container = %r.id, log = %r.log.display(), bytes = r.bytes, "rotated container log");
    }
}

/// A log renamed by [`rotate_files`], for the runtime to reopen.
struct Rotated {
    id: String,
    log: PathBuf,
    rotated: PathBuf,
    bytes: u64,
}

/// The file-system half of a pass over `logs` (container ID, log path): each log larger than
/// the policy's size gets room first, as kubelet's `removeExcessLogs` before its rotation (at
/// no moment more than `containerLogMaxFiles` files, the current one included), then is
/// renamed.
fn rotate_files(logs: Vec<(String, PathBuf)>, policy: LogPolicy) -> Vec<Rotated> {
    let mut out = Vec::new();
    for (id, log) in logs {
        let Ok(meta) = std::fs::metadata(&log) else {
            continue;
        };
        if meta.len() <= policy.max_size {
            continue;
        }
        prune(&log, policy.max_files.saturating_sub(1).max(1));
        match rename_current(&log) {
            Ok(rotated) => out.push(Rotated {
                id,
                log,
                rotated,
                bytes: meta.len(),
            }),
            Err(e) => warn!(log = %log.display(), error = %e, "cannot rotate container log"),
        }
    }
    out
}

/// Rotates every `interval` until the task is dropped, over the running containers the PLEG
/// last `listed` (no listing of its own; a pass before the PLEG's first relist does nothing),
/// their log paths from `known` where it has them.
pub async fn run(
    cri: impl RuntimeService,
    listed: super::status::RuntimePodsView,
    known: LogPathLookup,
    policy: LogPolicy,
    interval: Duration,
) {
    let mut tick = tokio::time::interval(interval);
    let mut log_paths = std::collections::HashMap::new();
    loop {
        tick.tick().await;
        if let Some(pods) = listed() {
            rotate_once(
                &cri,
                &pods.running_containers,
                &*known,
                policy,
                &mut log_paths,
            )
            .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rename_and_prune_keep_max_files() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        for i in 0..5 {
            std::fs::write(&log, format!("generation {i}")).unwrap();
            rename_current(&log).unwrap();
            std::thread::sleep(Duration::from_millis(2));
        }
        std::fs::write(&log, "current").unwrap();
        assert_eq!(rotated_files(&log).len(), 5);
        prune(&log, 3);
        let left = rotated_files(&log);
        assert_eq!(left.len(), 2, "3 files in all with the current one");
        assert_eq!(
            std::fs::read_to_string(&left[1]).unwrap(),
            "generation 4",
            "the newest are kept"
        );
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "current");
    }

    /// A log path the pod cache knows costs no ContainerStatus (issue 14: log rotation asked
    /// every new container once, a third ContainerStatus per pod start).
    #[tokio::test]
    async fn a_known_log_path_is_rotated_without_asking_the_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        std::fs::write(&log, vec![b'x'; 2048]).unwrap();
        let rt = crate::testing::runtime::FakeRuntime::new(crate::clock::FakeClock::new(0));
        let known_path = log.to_string_lossy().into_owned();
        let known = move |id: &str| (id == "c1").then(|| known_path.clone());
        let mut paths = std::collections::HashMap::new();
        let policy = LogPolicy {
            max_size: 1024,
            max_files: 3,
        };
        rotate_once(&rt, &["c1".into()], &known, policy, &mut paths).await;
        assert_eq!(rt.calls(), ["ReopenContainerLog c1"]);
        assert_eq!(rotated_files(&log).len(), 1);
        // A container nothing knows of is asked for.
        rotate_once(&rt, &["c1".into(), "c7".into()], &known, policy, &mut paths).await;
        assert_eq!(rt.calls_of("ContainerStatus"), ["ContainerStatus c7"]);
    }
}
