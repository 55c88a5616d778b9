//! What one runtime sync did (kubelet's `kubecontainer.PodSyncResult`): one [`SyncResult`] per
//! action taken on a container or the sandbox, with kubelet's reason when it failed, and the
//! error that stopped the sync early, if any. The pod-sync layer ([`crate::podsync`]) reads it
//! to update each container's waiting reason (kubelet's `reasonCache.Update`) and to tell the
//! pod worker a back-off from a failure.

use std::time::Duration;

use super::SyncError;

/// An action on a container or the sandbox (kubelet's `SyncAction`, those nodelet reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncAction {
    /// Create and start a container (or hold it back in a back-off).
    StartContainer,
    /// Create the pod's sandbox.
    CreatePodSandbox,
}

/// Why an action failed: kubelet's waiting reason (`ErrImagePull`, `ImagePullBackOff`,
/// `CrashLoopBackOff`, `CreateContainerConfigError`, `CreateContainerError`,
/// `RunContainerError`, `PostStartHookError`, `CreatePodSandboxError`) and the message shown
/// with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartFailure {
    /// kubelet's reason.
    pub reason: &'static str,
    /// Details (Secret values taken out).
    pub message: String,
}

impl StartFailure {
    /// Whether this is a back-off (the container waits its delay; not a new failure).
    pub fn is_backoff(&self) -> bool {
        matches!(self.reason, "CrashLoopBackOff" | "ImagePullBackOff")
    }
}

/// One action's outcome (kubelet's `SyncResult`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncResult {
    /// What was done.
    pub action: SyncAction,
    /// The container's name; empty for the sandbox.
    pub target: String,
    /// `None`: done.
    pub error: Option<StartFailure>,
}

/// Everything one runtime sync did.
#[derive(Debug, Default)]
pub struct PodSyncResult {
    /// Each action's outcome, in the order taken.
    pub results: Vec<SyncResult>,
    /// The failure that stopped the sync before it was done (a CRI call outside a start: a
    /// kill, a status read), if any.
    pub error: Option<SyncError>,
    /// The pod's IPs once it has a sandbox (the node's for a host-network pod); `None` when it
    /// has none (a finished pod, or a sandbox that could not be made).
    pub pod_ips: Option<Vec<String>>,
    /// The shortest back-off a held container waits, after which the pod wants a sync.
    pub backoff: Option<Duration>,
    /// A sandbox was created by this sync.
    pub sandbox_created: bool,
}

impl PodSyncResult {
    /// Records `action` on `target` and its outcome.
    pub fn add(&mut self, action: SyncAction, target: &str, error: Option<StartFailure>) {
        self.results.push(SyncResult {
            action,
            target: target.to_owned(),
            error,
        });
    }

    /// The error a pod worker sees: the one that stopped the sync, else the first failed
    /// action (as [`SyncError::Start`]); `None` when everything was done.
    pub fn first_error(&self) -> Option<SyncError> {
        if let Some(e) = &self.error {
            return Some(e.clone());
        }
        self.results.iter().find_map(|r| {
            let f = r.error.as_ref()?;
            // A container held back in CrashLoopBackOff is not an error of this sync: the pod
            // is synced again when its delay is over.
            (f.reason != "CrashLoopBackOff").then(|| SyncError::Start {
                container: r.target.clone(),
                reason: f.reason,
                message: f.message.clone(),
            })
        })
    }

    /// Whether the sandbox could not be made.
    pub fn sandbox_failed(&self) -> bool {
        self.results
            .iter()
            .any(|r| r.action == SyncAction::CreatePodSandbox && r.error.is_some())
    }
}
