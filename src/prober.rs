//! Prober (kubelet's `pkg/kubelet/prober`): results of liveness, readiness and startup probes,
//! delivered to the sync loop.
//!
//! The skeleton defines the result and its channel; probe workers arrive with the probes issue.

/// Which probe produced a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    /// Liveness: a failure restarts the container.
    Liveness,
    /// Readiness: changes the Ready condition only.
    Readiness,
    /// Startup: gates the other probes; a failure restarts the container.
    Startup,
}

/// One probe result that changed (kubelet's `proberesults.Update`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeResult {
    /// Pod UID.
    pub uid: String,
    /// Container name.
    pub container: String,
    /// Probe kind.
    pub kind: ProbeKind,
    /// True for success.
    pub success: bool,
}
