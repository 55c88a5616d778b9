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
//! 2. [`sysctls`]: only safe sysctls and `allowedUnsafeSysctls`;
//! 3. kubelet's predicates: the pod's OS ([`node_affinity`]), resource fit against allocatable
//!    ([`node_resources`]: pods, cpu, memory, ephemeral storage, hugepages), node selector and
//!    required affinity, node name ([`node_affinity`]), host ports ([`host_ports`]);
//! 4. [`apparmor`]: a confining profile needs AppArmor on the host.

pub mod apparmor;
pub mod host_ports;
pub mod node_affinity;
pub mod node_resources;
pub mod sysctls;

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tracing::warn;

use crate::events::Recorder;
use crate::eviction::NodePressure;
use crate::metrics::Metrics;
use crate::pod::pod_uid;
use crate::status::failed::{FailedPods, Failure};
use node_affinity::NodeIdentity;
use node_resources::Allocatable;

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
    /// The node's name and labels.
    pub node: NodeIdentity,
    /// What the node offers pods (pods: `maxPods`).
    pub allocatable: Allocatable,
    /// `allowedUnsafeSysctls`.
    pub allowed_unsafe_sysctls: Vec<String>,
    /// Whether the node is shutting down (graceful node shutdown).
    pub shutdown: crate::nodeshutdown::ShutdownState,
    /// The admitted pods' requests, worked out once per spec.
    pub requests: node_resources::Requests,
}

/// The handlers after the pressure check, which depend on the node and the pods already
/// admitted only (what `nodelet plan` can tell without a running agent): sysctls, the pod's OS,
/// resource fit, node selector and affinity, node name, host ports, AppArmor, in kubelet's
/// order. The
/// first refusal, `None` when `pod` is admitted.
pub fn admit_on_node(
    pod: &Pod,
    running: &[&Pod],
    node: &NodeIdentity,
    allocatable: &Allocatable,
    allowed_unsafe_sysctls: &[String],
    requests: &node_resources::Requests,
) -> Option<Rejection> {
    sysctls::admit(pod, allowed_unsafe_sysctls)
        .or_else(|| node_affinity::admit(pod, node))
        .or_else(|| node_resources::admit(pod, running.iter().copied(), allocatable, requests))
        .or_else(|| node_affinity::admit_placement(pod, node))
        .or_else(|| host_ports::admit(pod, running.iter().copied()))
        .or_else(|| apparmor::admit(pod, apparmor::host_enabled()))
}

impl PodAdmitter {
    /// The first handler's refusal of `pod` (kubelet's `canAdmitPod`), given the pods already
    /// admitted and still running (`running`, without `pod` itself). Handlers in kubelet's
    /// order: pressure (eviction), sysctls, then the predicates: the pod's OS, resource fit
    /// (pods, cpu, memory, ephemeral storage, hugepages), node selector and affinity, node
    /// name, host ports.
    ///
    /// Critical pods are checked like any other: where kubelet would preempt lower-priority
    /// pods to make room for one, nodelet refuses it (a node fed by manifests has no scheduler
    /// to place the preempted pods elsewhere).
    pub fn check(&self, pod: &Pod, running: &[&Pod]) -> Option<Rejection> {
        // kubelet's shutdown admit handler: nothing new while the node shuts down.
        if self.shutdown.is_shutting_down() {
            return Some(Rejection {
                reason: crate::nodeshutdown::ADMISSION_REASON.into(),
                message: crate::nodeshutdown::ADMISSION_MESSAGE.into(),
            });
        }
        let pressure = crate::eviction::admission::conditions_in_force(&self.pressure);
        crate::eviction::admission::refusal(pod, &pressure, self.static_pods_are_critical)
            .map(|message| Rejection {
                reason: crate::eviction::REASON.into(),
                message,
            })
            .or_else(|| {
                self.requests.forget_others(running.iter().copied());
                admit_on_node(
                    pod,
                    running,
                    &self.node,
                    &self.allocatable,
                    &self.allowed_unsafe_sysctls,
                    &self.requests,
                )
            })
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
        if r.reason == crate::nodeshutdown::ADMISSION_REASON {
            // Refused because the node goes down: it runs when the node is back.
            self.failed.mark_until_restart(pod, failure.clone());
        } else {
            self.failed.mark(pod, failure.clone());
        }
        self.recorder.warning(
            crate::events::Involved::pod(pod),
            &r.reason,
            r.message.clone(),
        );
        self.metrics
            .admission_rejections
            .get_or_create(&crate::metrics::ReasonLabel {
                reason: r.reason.clone(),
            })
            .inc();
        failure
    }
}
