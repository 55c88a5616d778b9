//! Local storage limits (kubelet's `localStorageEviction` in the eviction manager): a pod whose
//! containers use more ephemeral storage than their `ephemeral-storage` limits is evicted
//! whether or not the node is under pressure.
//!
//! A container's usage is its writable layer (CRI `ContainerStats.writable_layer.used_bytes`)
//! plus its log files; a pod's is the sum over its containers. kubelet also counts emptyDir
//! volumes and checks each emptyDir's `sizeLimit`; nodelet has no volumes yet (pods with volumes
//! are the volume issue's), so those checks wait for it.

use k8s_openapi::api::core::v1::Pod;

/// The eviction signal of a pod over the sum of its containers' limits (kubelet's
/// `signalEphemeralPodFsLimit`), as counted in `kubelet_evictions{eviction_signal}`.
pub const POD_LIMIT_SIGNAL: &str = "ephemeralpodfs.limit";
/// The eviction signal of a container over its own limit (`signalEphemeralContainerFsLimit`).
pub const CONTAINER_LIMIT_SIGNAL: &str = "ephemeralcontainerfs.limit";

/// One container's ephemeral storage usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerUsage {
    /// The container's name in the spec.
    pub name: String,
    /// Writable layer plus logs, bytes.
    pub bytes: i64,
}

/// A pod over a local storage limit: the signal and kubelet's status message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// [`POD_LIMIT_SIGNAL`] or [`CONTAINER_LIMIT_SIGNAL`].
    pub signal: &'static str,
    /// The eviction message, as kubelet writes it (with its trailing space).
    pub message: String,
}

/// The first local storage limit `pod` exceeds with `usage`, checked in kubelet's order: the
/// pod's total against the sum of its containers' limits (kubelet's
/// `podEphemeralStorageLimitEviction`: "Pod ephemeral local storage usage exceeds the total
/// limit of containers %s. "), then each app container against its own limit
/// (`containerEphemeralStorageLimitEviction`: "Container %s exceeded its local ephemeral
/// storage limit %q. "). Usage equal to a limit is within it. Limits are written as
/// apimachinery writes quantities (`10Mi`).
pub fn violation(pod: &Pod, usage: &[ContainerUsage]) -> Option<Violation> {
    let pod_limit = crate::resources::pod_amounts(pod).ephemeral_storage_limit;
    let total: i64 = usage.iter().map(|u| u.bytes).fold(0, i64::saturating_add);
    if pod_limit > 0 && total > pod_limit {
        return Some(Violation {
            signal: POD_LIMIT_SIGNAL,
            message: format!(
                "Pod ephemeral local storage usage exceeds the total limit of containers {}. ",
                super::manager::format_binary_si(pod_limit)
            ),
        });
    }
    let containers = pod.spec.as_ref().map_or(&[][..], |s| &s.containers[..]);
    containers.iter().find_map(|c| {
        let limit = crate::resources::container_amounts(c)
            .ok()?
            .ephemeral_storage_limit;
        let used = usage.iter().find(|u| u.name == c.name)?.bytes;
        (limit > 0 && used > limit).then(|| Violation {
            signal: CONTAINER_LIMIT_SIGNAL,
            message: format!(
                "Container {} exceeded its local ephemeral storage limit \"{}\". ",
                c.name,
                super::manager::format_binary_si(limit)
            ),
        })
    })
}

/// True when `pod` has an `ephemeral-storage` limit anywhere (only such pods are measured).
pub fn has_limits(pod: &Pod) -> bool {
    crate::resources::pod_amounts(pod).ephemeral_storage_limit > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(limits: &[(&str, Option<&str>)]) -> Pod {
        let containers: Vec<serde_json::Value> = limits
            .iter()
            .map(|(name, limit)| {
                let mut c = serde_json::json!({"name": name, "image": "busybox"});
                if let Some(l) = limit {
                    c["resources"] = serde_json::json!({"limits": {"ephemeral-storage": l}});
                }
                c
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"containers": containers}
        }))
        .unwrap()
    }

    fn used(name: &str, mib: i64) -> ContainerUsage {
        ContainerUsage {
            name: name.into(),
            bytes: mib << 20,
        }
    }

    #[test]
    fn the_pod_total_is_checked_before_each_container_and_messages_are_kubelets() {
        let p = pod(&[("a", Some("10Mi")), ("b", None)]);
        assert_eq!(
            violation(&p, &[used("a", 10), used("b", 0)]),
            None,
            "equal is within"
        );
        // b has no limit of its own, but counts toward the pod's total (kubelet's PodLimits).
        let v = violation(&p, &[used("a", 5), used("b", 6)]).unwrap();
        assert_eq!(v.signal, POD_LIMIT_SIGNAL);
        assert_eq!(
            v.message,
            "Pod ephemeral local storage usage exceeds the total limit of containers 10Mi. "
        );
        // Each container within the total, one over its own limit.
        let p = pod(&[("a", Some("10Mi")), ("b", Some("30Mi"))]);
        let v = violation(&p, &[used("a", 12), used("b", 1)]).unwrap();
        assert_eq!(v.signal, CONTAINER_LIMIT_SIGNAL);
        assert_eq!(
            v.message,
            "Container a exceeded its local ephemeral storage limit \"10Mi\". "
        );
    }

    #[test]
    fn pods_without_limits_are_never_violations() {
        let p = pod(&[("a", None)]);
        assert!(!has_limits(&p));
        assert_eq!(violation(&p, &[used("a", 1 << 20)]), None);
        assert!(has_limits(&pod(&[("a", Some("1Gi"))])));
    }
}
