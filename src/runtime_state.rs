//! The container runtime's health (kubelet's `runtimeState` and `updateRuntimeUp`): the agent
//! asks the runtime every [`CHECK_PERIOD`] (CRI `Version`, within [`CHECK_TIMEOUT`]) whether it
//! answers. While it does not, the runtime is down: `/healthz` fails with `container runtime is
//! down`, the node's Ready condition on `/node` is False (kubelet's reason `KubeletNotReady`),
//! and `nodelet_container_runtime_up` is 0. Nothing else changes: pod workers retry their calls,
//! the PLEG relists again once the runtime answers, and no pod is touched meanwhile.
//!
//! One difference from kubelet, which reports the runtime down only after 30 s without an
//! answer: nodelet reports it at the first failed check, so an operator sees a runtime restart.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{info, warn};

/// How often the runtime is asked (kubelet: 5 s).
pub const CHECK_PERIOD: Duration = Duration::from_secs(2);
/// How long one check waits for the answer.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// The runtime's last known health, and whether the node is shutting down (the other source
/// of kubelet's `KubeletNotReady`). Cheap to clone; starts up (the agent waits for the runtime
/// before it starts checking).
#[derive(Clone, Default)]
pub struct RuntimeState(
    Arc<Mutex<Option<String>>>,
    crate::nodeshutdown::ShutdownState,
);

impl RuntimeState {
    /// The node's Ready condition: `Ok`, or why not (`container runtime is down: <error>`;
    /// `node is shutting down` during a graceful node shutdown). `/healthz` follows
    /// [`RuntimeState::health`] alone.
    pub fn ready(&self) -> Result<(), String> {
        self.health()?;
        if self.1.is_shutting_down() {
            return Err(crate::nodeshutdown::NOT_READY_MESSAGE.to_owned());
        }
        Ok(())
    }

    /// The shutdown flag the graceful node shutdown manager sets.
    pub fn shutdown(&self) -> crate::nodeshutdown::ShutdownState {
        self.1.clone()
    }

    /// `Ok`, or `container runtime is down: <error>`.
    pub fn health(&self) -> Result<(), String> {
        match &*self.0.lock().unwrap_or_else(|e| e.into_inner()) {
            None => Ok(()),
            Some(e) => Err(format!("container runtime is down: {e}")),
        }
    }

    /// Records one check's outcome; returns true when the health changed.
    pub fn record(&self, outcome: Result<(), String>) -> bool {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let was_up = g.is_none();
        *g = outcome.err();
        was_up != g.is_none()
    }
}

/// Checks `cri` every [`CHECK_PERIOD`] until the task is dropped, recording into `state` and
/// `up` (the `nodelet_container_runtime_up` gauge), logging each change.
pub async fn run(
    cri: crate::cri::Cri,
    state: RuntimeState,
    up: prometheus_client::metrics::gauge::Gauge,
) {
    use crate::cri::RuntimeService;
    loop {
        let outcome = match tokio::time::timeout(CHECK_TIMEOUT, cri.version()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {CHECK_TIMEOUT:?}")),
        };
        up.set(i64::from(outcome.is_ok()));
        let error = outcome.clone().err();
        if state.record(outcome) {
            match error {
                Some(e) => warn!(error = %e, "container runtime is down"),
                None => info!("container runtime is up again"),
            }
        }
        crate::clock::sleep(CHECK_PERIOD).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_follows_the_last_check_and_reports_changes() {
        let s = RuntimeState::default();
        assert!(s.health().is_ok());
        assert!(!s.record(Ok(())), "no change");
        assert!(s.record(Err("connection refused".into())));
        assert_eq!(
            s.health().unwrap_err(),
            "container runtime is down: connection refused"
        );
        assert!(!s.record(Err("again".into())));
        assert!(s.record(Ok(())));
        assert!(s.health().is_ok());
    }

    #[test]
    fn a_node_shutting_down_is_not_ready_but_healthy() {
        let s = RuntimeState::default();
        s.shutdown().set(true);
        assert_eq!(s.ready().unwrap_err(), "node is shutting down");
        assert!(s.health().is_ok(), "/healthz does not fail for it");
        s.shutdown().set(false);
        assert!(s.ready().is_ok());
    }
}
