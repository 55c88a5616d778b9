//! Pod admission (kubelet's `lifecycle.PodAdmitHandler`s, run by `canAdmitPod` for every new
//! pod): checks that refuse a pod before anything of it runs.
//!
//! A refused pod gets kubelet's `rejectPod` treatment: phase Failed, the handler's reason, the
//! message `Pod was rejected: <message>`, a Warning event with the reason, and a count in
//! `kubelet_admission_rejections_total{reason}`. It stays Failed until its manifest changes.
//!
//! [`PodAdmitter`] runs the handlers in kubelet's order:
//!
//! 1. the eviction manager's pressure check ([`crate::eviction::admission`]);
//! 2. [`host_ports`]: the `NodePorts` predicate (host ports already taken by a running pod).
//!
//! `maxPods` is checked by the sync loop before these.

pub mod host_ports;

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tracing::warn;

use crate::events::Recorder;
use crate::eviction::NodePressure;
use crate::metrics::Metrics;
use crate::pod::{pod_ref, pod_uid};
use crate::status::failed::{FailedPods, Failure};

/// Why a pod is not admitted (kubelet's `PodAdmitResult` when `Admit` is false).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// One word for the status and the event, e.g. `NodePorts`.
    pub reason: String,
    /// What failed, for an operator.
    pub message: String,
}

impl Rejection {
    /// The pod's status message, as kubelet's `rejectPod` writes it.
    pub fn status_message(&self) -> String {
        format!("Pod was rejected: {}", self.message)
    }
}

/// The admission chain as the sync loop runs it, and what a refusal records: the mark that
/// keeps the pod from running until its manifest changes, an event and a metric. The refused
/// pod's status is written by its worker, from the [`Failure`] [`PodAdmitter::reject`] returns.
/// Cheap to clone.
#[derive(Clone)]
pub struct PodAdmitter {
    /// The node's pressure conditions, from the eviction manager.
    pub pressure: NodePressure,
    /// Where a refused pod is marked (with evicted pods: neither runs until its manifest
    /// changes).
    pub failed: FailedPods,
    /// Events.
    pub recorder: Recorder,
    /// `kubelet_admission_rejections_total{reason}`.
    pub metrics: Arc<Metrics>,
    /// `staticPodsAreCritical`.
    pub static_pods_are_critical: bool,
}

impl PodAdmitter {
    /// The first handler's refusal of `pod` (kubelet's `canAdmitPod`), given the pods already
    /// admitted and still running (`running`, without `pod` itself).
    pub fn check<'a>(
        &self,
        pod: &Pod,
        running: impl IntoIterator<Item = &'a Pod>,
    ) -> Option<Rejection> {
        let pressure = crate::eviction::admission::conditions_in_force(&self.pressure);
        crate::eviction::admission::refusal(pod, &pressure, self.static_pods_are_critical)
            .map(|message| Rejection {
                reason: crate::eviction::REASON.into(),
                message,
            })
            .or_else(|| host_ports::admit(pod, running))
    }

    /// Records the refusal of `pod` for `r` as kubelet's `rejectPod` does: the mark, a Warning
    /// event with the reason, the counter and a log line. Returns the failure the pod's worker
    /// writes as its status: phase Failed, the reason, `Pod was rejected: <message>`.
    pub fn reject(&self, pod: &Pod, r: &Rejection) -> Failure {
        warn!(
            pod = pod.metadata.name.as_deref().unwrap_or(""),
            namespace = pod.metadata.namespace.as_deref().unwrap_or(""),
            uid = pod_uid(pod),
            reason = %r.reason,
            "pod rejected at admission: {}",
            r.message
        );
        let failure = Failure::new(&r.reason, r.status_message());
        self.failed.mark(pod, failure.clone());
        self.recorder
            .warning(pod_ref(pod), &r.reason, r.message.clone());
        self.metrics
            .admission_rejections
            .get_or_create(&crate::metrics::ReasonLabel {
                reason: r.reason.clone(),
            })
            .inc();
        failure
    }
}
