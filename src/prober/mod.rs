//! Prober (kubelet's `pkg/kubelet/prober`): liveness, readiness and startup probes of running
//! containers, and their results.
//!
//! - [`spec`]: a container's probe as written, with kubelet's defaults, and its handler.
//! - [`worker`]: one worker per (container, probe kind): initial delay, period, thresholds, the
//!   startup gate, "on hold" after a liveness or startup failure (kubelet's `worker.doProbe`).
//! - [`results`]: the latest result of each worker (kubelet's `results.Manager`), read by the
//!   runtime manager (liveness and startup failures kill) and by status generation (ready,
//!   started).
//! - [`handlers`]: exec (CRI ExecSync), httpGet, tcpSocket and grpc probes; also used by the
//!   lifecycle hooks.
//! - [`manager`]: starts a pod's workers when it syncs, stops them when it goes, and sends each
//!   change of a result to the sync loop on the probe channel.

pub mod handlers;
pub mod manager;
pub mod results;
pub mod spec;
pub mod worker;

pub use manager::ProbeManager;
pub use results::{ProbeResults, ProbeView};

/// Which probe produced a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProbeKind {
    /// Liveness: a failure restarts the container.
    Liveness,
    /// Readiness: changes the Ready condition only.
    Readiness,
    /// Startup: gates the other probes; a failure restarts the container.
    Startup,
}

impl ProbeKind {
    /// kubelet's name in events and metrics (`Liveness`, `Readiness`, `Startup`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Liveness => "Liveness",
            Self::Readiness => "Readiness",
            Self::Startup => "Startup",
        }
    }
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
