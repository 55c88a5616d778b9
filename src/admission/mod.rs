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
use crate::eviction::{EvictedPods, NodePressure};
use crate::metrics::Metrics;
use crate::pod::{pod_ref, pod_uid};
use crate::status::StatusManager;

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

/// The admission chain as the sync loop runs it, and what a refusal touches: the record that
/// keeps the pod from running until its manifest changes, its status, an event and a metric.
/// Cheap to clone.
#[derive(Clone)]
pub struct PodAdmitter {
    /// The node's pressure conditions, from the eviction manager.
    pub pressure: NodePressure,
    /// Where a refused pod is recorded (with evicted pods: neither runs until its manifest
    /// changes).
    pub evicted: EvictedPods,
    /// Where its status goes.
    pub status: StatusManager,
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
        crate::eviction::admission::admit(pod, &self.pressure, self.static_pods_are_critical)
            .or_else(|| host_ports::admit(pod, running))
    }

    /// True when the pod may run; otherwise fails it as kubelet's `rejectPod` does and returns
    /// false.
    pub fn admit<'a>(&self, pod: &Arc<Pod>, running: impl IntoIterator<Item = &'a Pod>) -> bool {
        match self.check(pod, running) {
            None => true,
            Some(r) => {
                self.reject(pod, &r);
                false
            }
        }
    }

    /// Fails `pod` for `r`: phase Failed with the reason and `Pod was rejected: <message>`, a
    /// Warning event, the counter, and the record that keeps it from running.
    pub fn reject(&self, pod: &Arc<Pod>, r: &Rejection) {
        warn!(
            pod = pod.metadata.name.as_deref().unwrap_or(""),
            namespace = pod.metadata.namespace.as_deref().unwrap_or(""),
            uid = pod_uid(pod),
            reason = %r.reason,
            "pod rejected at admission: {}",
            r.message
        );
        let message = r.status_message();
        self.evicted.mark_failed(pod, &r.reason, message.clone());
        self.status.set(
            pod.clone(),
            crate::eviction::failed_status(pod, &r.reason, &message),
        );
        self.recorder
            .warning(pod_ref(pod), &r.reason, r.message.clone());
        self.metrics
            .admission_rejections
            .get_or_create(&crate::metrics::ReasonLabel {
                reason: r.reason.clone(),
            })
            .inc();
    }
}
