//! Local storage limits (kubelet's `localStorageEviction` in the eviction manager): a pod whose
//! containers use more ephemeral storage than their `ephemeral-storage` limits is evicted
//! whether or not the node is under pressure.
//!
//! A container's usage is its writable layer (CRI `ContainerStats.writable_layer.used_bytes`)
//! plus its log files; a disk-backed emptyDir's is what `du` counts of its directory (blocks in
//! use, hard links once); a pod's is the sum of its containers' and its disk-backed emptyDirs'.
//! Memory-backed emptyDirs are left out: their tmpfs is already no larger than their
//! `sizeLimit` ([`crate::volume::empty_dir::memory_size`]), and they are memory, not disk.

use k8s_openapi::api::core::v1::Pod;

/// The eviction signal of a pod over the sum of its containers' limits (kubelet's
/// `signalEphemeralPodFsLimit`), as counted in `kubelet_evictions{eviction_signal}`.
pub const POD_LIMIT_SIGNAL: &str = "ephemeralpodfs.limit";
/// The eviction signal of a container over its own limit (`signalEphemeralContainerFsLimit`).
pub const CONTAINER_LIMIT_SIGNAL: &str = "ephemeralcontainerfs.limit";
/// The eviction signal of an emptyDir over its `sizeLimit` (`signalEmptyDirFsLimit`).
pub const EMPTY_DIR_LIMIT_SIGNAL: &str = "emptydirfs.limit";

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

/// The disk-backed emptyDirs of `pod` with a `sizeLimit`: (volume name, limit in bytes, the
/// limit as written).
fn empty_dir_limits(pod: &Pod) -> impl Iterator<Item = (&str, i64, &str)> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| {
            let ed = v.empty_dir.as_ref()?;
            if ed.medium.as_deref() == Some("Memory") {
                return None;
            }
            let q = ed.size_limit.as_ref()?;
            let limit = crate::quantity::parse_amount(&q.0, crate::quantity::Scale::Whole).ok()?;
            (limit > 0).then_some((v.name.as_str(), limit, q.0.as_str()))
        })
}

/// True when `pod` has a disk-backed emptyDir (whose usage counts towards the pod's).
pub fn has_disk_empty_dirs(pod: &Pod) -> bool {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .any(|v| {
            v.empty_dir
                .as_ref()
                .is_some_and(|e| e.medium.as_deref() != Some("Memory"))
        })
}

/// The first local storage limit `pod` exceeds with `usage` (its containers) and `volumes`
/// (its disk-backed emptyDirs: name, bytes), checked in kubelet's order: each emptyDir against
/// its `sizeLimit` (`emptyDirLimitEviction`: "Usage of EmptyDir volume %q exceeds the limit
/// %q. "), the pod's total against the sum of its containers' limits
/// (`podEphemeralStorageLimitEviction`: "Pod ephemeral local storage usage exceeds the total
/// limit of containers %s. "), then each app container against its own limit
/// (`containerEphemeralStorageLimitEviction`: "Container %s exceeded its local ephemeral
/// storage limit %q. "). Usage equal to a limit is within it. Limits are written as
/// apimachinery writes quantities (`10Mi`).
pub fn violation(
    pod: &Pod,
    usage: &[ContainerUsage],
    volumes: &[(String, i64)],
) -> Option<Violation> {
    for (name, limit, written) in empty_dir_limits(pod) {
        let used = volumes.iter().find(|(n, _)| n == name).map_or(0, |v| v.1);
        if used > limit {
            let shown = crate::quantity::parse_amount(written, crate::quantity::Scale::Whole)
                .map_or_else(|_| written.to_owned(), super::manager::format_binary_si);
            return Some(Violation {
                signal: EMPTY_DIR_LIMIT_SIGNAL,
                message: format!("Usage of EmptyDir volume {name:?} exceeds the limit {shown:?}. "),
            });
        }
    }
    let pod_limit = crate::resources::pod_amounts(pod).ephemeral_storage_limit;
    let total: i64 = usage
        .iter()
        .map(|u| u.bytes)
        .chain(volumes.iter().map(|v| v.1))
        .fold(0, i64::saturating_add);
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

/// True when `pod` has an `ephemeral-storage` limit anywhere or a disk-backed emptyDir with a
/// `sizeLimit` (only such pods are measured).
pub fn has_limits(pod: &Pod) -> bool {
    crate::resources::pod_amounts(pod).ephemeral_storage_limit > 0
        || empty_dir_limits(pod).next().is_some()
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
            violation(&p, &[used("a", 10), used("b", 0)], &[]),
            None,
            "equal is within"
        );
        // b has no limit of its own, but counts toward the pod's total (kubelet's PodLimits).
        let v = violation(&p, &[used("a", 5), used("b", 6)], &[]).unwrap();
        assert_eq!(v.signal, POD_LIMIT_SIGNAL);
        assert_eq!(
            v.message,
            "Pod ephemeral local storage usage exceeds the total limit of containers 10Mi. "
        );
        // Each container within the total, one over its own limit.
        let p = pod(&[("a", Some("10Mi")), ("b", Some("30Mi"))]);
        let v = violation(&p, &[used("a", 12), used("b", 1)], &[]).unwrap();
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
        assert_eq!(violation(&p, &[used("a", 1 << 20)], &[]), None);
        assert!(has_limits(&pod(&[("a", Some("1Gi"))])));
    }

    #[test]
    fn an_empty_dir_over_its_size_limit_goes_first_and_counts_towards_the_pod() {
        let p: Pod = serde_yaml::from_str(
            "metadata: {name: p, uid: u}\nspec: {volumes: [{name: scratch, emptyDir: {sizeLimit: 1Mi}}, {name: ram, emptyDir: {medium: Memory, sizeLimit: 1Mi}}, {name: free, emptyDir: {}}], containers: [{name: a, image: b, resources: {limits: {ephemeral-storage: 20Mi}}}]}",
        )
        .unwrap();
        assert!(has_limits(&p) && has_disk_empty_dirs(&p));
        let within = [
            ("scratch".to_owned(), 1 << 20),
            ("free".to_owned(), 1 << 20),
        ];
        assert_eq!(
            violation(&p, &[used("a", 1)], &within),
            None,
            "equal is within"
        );
        let over = [("scratch".to_owned(), 10 << 20)];
        let v = violation(&p, &[used("a", 1)], &over).unwrap();
        assert_eq!(v.signal, EMPTY_DIR_LIMIT_SIGNAL);
        assert_eq!(
            v.message,
            "Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". "
        );
        // An emptyDir without a limit still counts towards the pod's total.
        let v = violation(&p, &[used("a", 15)], &[("free".to_owned(), 10 << 20)]).unwrap();
        assert_eq!(v.signal, POD_LIMIT_SIGNAL);
        // A memory-backed emptyDir alone is not a local storage limit.
        let ram: Pod = serde_yaml::from_str(
            "metadata: {name: p, uid: u}\nspec: {volumes: [{name: ram, emptyDir: {medium: Memory, sizeLimit: 1Mi}}], containers: [{name: a, image: b}]}",
        )
        .unwrap();
        assert!(!has_limits(&ram) && !has_disk_empty_dirs(&ram));
    }
}
