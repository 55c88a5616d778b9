//! Pods refused while the node is under pressure (kubelet's eviction `Admit`).
//!
//! With no pressure condition every pod is admitted, and critical pods always are. With
//! MemoryPressure alone, BestEffort pods are refused unless they tolerate the
//! `node.kubernetes.io/memory-pressure` taint; with any other condition (DiskPressure,
//! PIDPressure) every pod is refused with the message `The node had condition: [<conditions>]. `;
//! [`crate::admission`] fails the pod with it, with reason Evicted.

use k8s_openapi::api::core::v1::Pod;

use super::{is_critical, NodePressure, CONDITIONS};
use crate::qos::{pod_qos_class, QosClass};

/// The taint kubelet's admission lets a BestEffort pod tolerate under MemoryPressure.
pub const MEMORY_PRESSURE_TAINT: &str = "node.kubernetes.io/memory-pressure";

/// Why a pod is refused, or `None` when it is admitted, for the conditions `conditions`.
pub fn refusal(pod: &Pod, conditions: &[&str], static_pods_are_critical: bool) -> Option<String> {
    if conditions.is_empty() || is_critical(pod, static_pods_are_critical) {
        return None;
    }
    let message = format!("The node had condition: [{}]. ", conditions.join(" "));
    if conditions == ["MemoryPressure"] {
        let tolerates = pod
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.as_ref())
            .is_some_and(|ts| {
                ts.iter().any(|t| {
                    let key_ok = match t.key.as_deref() {
                        None | Some("") => t.operator.as_deref() == Some("Exists"),
                        Some(k) => k == MEMORY_PRESSURE_TAINT,
                    };
                    let effect_ok =
                        matches!(t.effect.as_deref(), None | Some("") | Some("NoSchedule"));
                    key_ok && effect_ok
                })
            });
        if pod_qos_class(pod) != QosClass::BestEffort || tolerates {
            return None;
        }
    }
    Some(message)
}

/// The pressure conditions in force now, in the order kubelet reports them.
pub fn conditions_in_force(pressure: &NodePressure) -> Vec<&'static str> {
    CONDITIONS.into_iter().filter(|c| pressure.has(c)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements, Toleration};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn pod(memory_request: Option<&str>) -> Pod {
        let mut p = Pod::default();
        p.metadata.uid = Some("u".into());
        p.spec = Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                resources: memory_request.map(|m| ResourceRequirements {
                    requests: Some([("memory".to_string(), Quantity(m.into()))].into()),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        });
        p
    }

    #[test]
    fn memory_pressure_refuses_besteffort_disk_pressure_refuses_all() {
        let be = pod(None);
        let burstable = pod(Some("64Mi"));
        assert_eq!(refusal(&be, &[], false), None);
        assert_eq!(
            refusal(&be, &["MemoryPressure"], false).as_deref(),
            Some("The node had condition: [MemoryPressure]. ")
        );
        assert_eq!(refusal(&burstable, &["MemoryPressure"], false), None);
        assert!(refusal(&burstable, &["DiskPressure"], false).is_some());
        assert!(refusal(&burstable, &["MemoryPressure", "PIDPressure"], false).is_some());
        let mut tolerant = be.clone();
        tolerant.spec.as_mut().unwrap().tolerations = Some(vec![Toleration {
            key: Some(MEMORY_PRESSURE_TAINT.into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        }]);
        assert_eq!(refusal(&tolerant, &["MemoryPressure"], false), None);
        let mut critical = be;
        critical.spec.as_mut().unwrap().priority_class_name = Some("system-node-critical".into());
        assert_eq!(refusal(&critical, &["DiskPressure"], false), None);
    }
}
