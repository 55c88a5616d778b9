//! Pod identity, shared by every module so that no two modules import each other for it: the
//! UID, the reference events and logs use, the config annotations, the names that are safe in
//! paths, the pod's log directory, and timestamps.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;

/// Annotation naming the source of a pod (`file`, `http`).
pub const CONFIG_SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
/// Annotation holding the hash of the pod's manifest content.
pub const CONFIG_HASH_ANNOTATION: &str = "kubernetes.io/config.hash";
/// Annotation holding the time (RFC 3339) the agent first saw this version of the pod.
pub const CONFIG_SEEN_ANNOTATION: &str = "kubernetes.io/config.seen";
/// Annotation holding the mirror pod's hash (mirror pods are not created by nodelet yet).
pub const CONFIG_MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Default `terminationGracePeriodSeconds` (the API default), seconds.
pub const DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS: i64 = 30;

/// UID of a pod (empty when unset).
pub fn pod_uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or("")
}

/// `pod/<namespace>/<name>`: how events and logs name a pod.
pub fn pod_ref(pod: &Pod) -> String {
    format!(
        "pod/{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

/// `<name>_<namespace>(<uid>)`: how kubelet's messages name a pod (`format.Pod`).
pub fn format_pod(pod: &Pod) -> String {
    format!(
        "{}_{}({})",
        pod.metadata.name.as_deref().unwrap_or(""),
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod_uid(pod)
    )
}

/// The containers that run side by side: the sidecars (init containers with `restartPolicy:
/// Always`), then the app containers.
pub fn long_running_containers(
    spec: &k8s_openapi::api::core::v1::PodSpec,
) -> impl Iterator<Item = &k8s_openapi::api::core::v1::Container> {
    spec.init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .chain(spec.containers.iter())
}

/// The spec of the container (app or init) named `name`.
pub fn container_spec<'a>(
    pod: &'a Pod,
    name: &str,
) -> Option<&'a k8s_openapi::api::core::v1::Container> {
    let spec = pod.spec.as_ref()?;
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == name)
}

/// Prefix of the deprecated per-container AppArmor annotation
/// (`container.apparmor.security.beta.kubernetes.io/<container>`).
pub const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

/// The source name of pods from the API server (kubelet's `ApiserverSource`).
pub const API_SOURCE: &str = "api";

/// Whether `pod` came from the API source (its `kubernetes.io/config.source` is `api`).
pub fn is_api_pod(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONFIG_SOURCE_ANNOTATION))
        .is_some_and(|s| s == API_SOURCE)
}

/// A Kubernetes timestamp for `now` (whole seconds since the epoch, as the API keeps them).
pub fn api_time(
    now: std::time::SystemTime,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    let secs = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::from_second(secs).unwrap_or_default(),
    )
}

/// Whether `pod` is a static pod: its `kubernetes.io/config.source` is a source other than the
/// API (kubelet's `IsStaticPod`).
pub fn is_static_pod(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONFIG_SOURCE_ANNOTATION))
        .is_some_and(|s| s != API_SOURCE)
}

/// Whether `pod` is a mirror pod: it carries `kubernetes.io/config.mirror` (kubelet's
/// `IsMirrorPod`).
pub fn is_mirror_pod(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(CONFIG_MIRROR_ANNOTATION))
}

/// A pod spec's ephemeral containers (`spec.ephemeralContainers`, the debugging containers
/// `kubectl debug` adds to a running API pod), each as the [`Container`] it is made from, with
/// its `targetContainerName` beside it: kubelet runs an ephemeral container as a container of
/// the pod (`EphemeralContainerCommon` converted to `v1.Container`), never restarted.
///
/// [`Container`]: k8s_openapi::api::core::v1::Container
pub fn ephemeral_containers(
    spec: &k8s_openapi::api::core::v1::PodSpec,
) -> Vec<(k8s_openapi::api::core::v1::Container, Option<String>)> {
    spec.ephemeral_containers
        .iter()
        .flatten()
        .filter_map(|e| {
            // The two types share every field but the target; the conversion is the API's own.
            let mut v = serde_json::to_value(e).ok()?;
            if let Some(m) = v.as_object_mut() {
                m.remove("targetContainerName");
            }
            let c = serde_json::from_value(v).ok()?;
            Some((c, e.target_container_name.clone()))
        })
        .collect()
}

/// The pod's `kubernetes.io/config.hash` annotation (its manifest version), empty when absent.
pub fn config_hash(pod: &Pod) -> &str {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONFIG_HASH_ANNOTATION))
        .map_or("", String::as_str)
}

/// True when `s` is a DNS-1123 label: 1..=63 of `[a-z0-9-]`, starting and ending alphanumeric.
pub fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// True when `s` is a DNS-1123 subdomain: at most 253 characters of dot-separated labels
/// (each `[a-z0-9]([-a-z0-9]*[a-z0-9])?`); rejects `/`, `..`, upper case and empty labels.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    // Each label as in a DNS-1123 label but without its 63-character limit (the API server's
    // `IsDNS1123Subdomain` checks only the whole length).
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

/// True when a UID is safe to use in paths and cgroup names: 1..=128 of `[A-Za-z0-9._-]`,
/// starting alphanumeric, without `..`. Generated UIDs (UUIDs) always are.
pub fn is_safe_uid(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && !s.contains("..")
}

/// `<base>/<namespace>_<name>_<uid>`: the pod's log directory under a podLogsDir `base`
/// (kubelet's `BuildPodLogsDirectory`).
pub fn pod_logs_dir_under(base: &Path, pod: &Pod) -> PathBuf {
    let m = &pod.metadata;
    base.join(format!(
        "{}_{}_{}",
        m.namespace.as_deref().unwrap_or(""),
        m.name.as_deref().unwrap_or(""),
        m.uid.as_deref().unwrap_or("")
    ))
}

/// Current time in RFC 3339 with nanoseconds, UTC (the `config.seen` format).
pub fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_could_escape_a_path_are_refused() {
        for bad in [
            "../etc", "a/b", "a..b", "..", ".", "A", "-a", "a-", "", "a_b",
        ] {
            assert!(!is_dns1123_subdomain(bad), "{bad:?}");
        }
        for good in ["a", "web-1", "a.b.c", "0abc"] {
            assert!(is_dns1123_subdomain(good), "{good:?}");
        }
        assert!(!is_dns1123_label("a.b"));
        assert!(!is_dns1123_label(&"a".repeat(64)));
        assert!(is_dns1123_label(&"a".repeat(63)));
        for bad in ["", "../x", "a/b", "a..b", "-a", &"a".repeat(129)] {
            assert!(!is_safe_uid(bad), "{bad:?}");
        }
        assert!(is_safe_uid("6e0de1e7-5a1c-4f0e_x.y"));
    }
}
