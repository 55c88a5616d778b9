//! Labels and annotations on sandboxes and containers, as kubelet writes them
//! (kubelet's `kuberuntime/labels.go`), so crictl users and log shippers find what they know.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::cri::BriefKeys;

/// Pod name label.
pub const POD_NAME: &str = "io.kubernetes.pod.name";
/// Pod namespace label.
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// Pod UID label.
pub const POD_UID: &str = "io.kubernetes.pod.uid";
/// Container name label.
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// Container spec hash annotation (decides whether a running container matches its spec).
pub const CONTAINER_HASH: &str = "io.kubernetes.container.hash";
/// Restart count annotation.
pub const CONTAINER_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
/// Termination message path annotation.
pub const CONTAINER_TERMINATION_MESSAGE_PATH: &str =
    "io.kubernetes.container.terminationMessagePath";
/// Termination message policy annotation.
pub const CONTAINER_TERMINATION_MESSAGE_POLICY: &str =
    "io.kubernetes.container.terminationMessagePolicy";
/// Container ports annotation (JSON list of the spec's ports).
pub const CONTAINER_PORTS: &str = "io.kubernetes.container.ports";
/// Pod's termination grace period annotation, seconds.
pub const POD_TERMINATION_GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
/// Label naming the node a sandbox was created for. Housekeeping only ever removes sandboxes of
/// its own node, so two agents (or a test and a running agent) sharing one runtime never remove
/// each other's pods. kubelet has no such label: it assumes the runtime is its alone.
pub const NODE_NAME: &str = "nodelet.io/node-name";
/// Annotation set by nodelet on init containers, so that status can tell them apart.
pub const CONTAINER_IS_INIT: &str = "nodelet.io/init-container";
/// Hash of the pod-level fields that shape the sandbox; a change recreates the sandbox.
pub const SANDBOX_HASH: &str = "nodelet.io/sandbox-hash";
/// Hash of the pod-level fields that shape the containers when they are made (volumes, the pod's
/// security context, every container's resources and so the QoS class); a change recreates the
/// sandbox. Absent on sandboxes made before nodelet wrote it: those are not recreated for it.
pub const POD_SPEC_HASH: &str = "nodelet.io/pod-spec-hash";
/// Annotation carrying the pod's start time (nanoseconds since the epoch) onto a sandbox that
/// replaces an earlier one, so that `status.startTime` and `activeDeadlineSeconds` count from
/// the pod's first sandbox, also across agent restarts (kubelet keeps the start time in its
/// API status; a node without an API server keeps it in the runtime).
pub const POD_START_TIME: &str = "nodelet.io/pod-start-time";

/// What nodelet's readers of the runtime's listings (the PLEG's relist, housekeeping,
/// GetPodStatus, the eviction manager) take from a sandbox's or container's labels and
/// annotations; a brief listing ([`crate::cri::brief`]) carries only these. A reader of another
/// key adds it here.
pub const BRIEF: BriefKeys = BriefKeys {
    labels: &[POD_UID, POD_NAME, POD_NAMESPACE, CONTAINER_NAME, NODE_NAME],
    annotations: &[
        CONTAINER_HASH,
        CONTAINER_IS_INIT,
        POD_TERMINATION_GRACE_PERIOD,
        SANDBOX_HASH,
        POD_SPEC_HASH,
        POD_START_TIME,
    ],
};

fn insert_pod_identity(labels: &mut HashMap<String, String>, pod: &Pod) {
    let m = &pod.metadata;
    labels.insert(POD_NAME.into(), m.name.clone().unwrap_or_default());
    labels.insert(
        POD_NAMESPACE.into(),
        m.namespace.clone().unwrap_or_default(),
    );
    labels.insert(POD_UID.into(), m.uid.clone().unwrap_or_default());
}

/// Labels of a pod sandbox: the pod's labels plus name, namespace and UID (`newPodLabels`), and
/// the node name ([`NODE_NAME`]).
pub fn sandbox_labels(pod: &Pod) -> HashMap<String, String> {
    let mut labels: HashMap<String, String> = pod
        .metadata
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    insert_pod_identity(&mut labels, pod);
    if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
        labels.insert(NODE_NAME.into(), node);
    }
    labels
}

/// Annotations of a pod sandbox: the pod's annotations (`newPodAnnotations`).
pub fn sandbox_annotations(pod: &Pod) -> HashMap<String, String> {
    pod.metadata
        .annotations
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect()
}

/// Labels of a container: container name, pod name, namespace and UID (`newContainerLabels`).
pub fn container_labels(pod: &Pod, container: &Container) -> HashMap<String, String> {
    let mut labels = HashMap::with_capacity(4);
    labels.insert(CONTAINER_NAME.into(), container.name.clone());
    insert_pod_identity(&mut labels, pod);
    labels
}

/// Annotations of a container (`newContainerAnnotations`): spec hash, restart count,
/// termination message path/policy, grace period and ports.
pub fn container_annotations(
    pod: &Pod,
    container: &Container,
    restart_count: u32,
    is_init: bool,
) -> HashMap<String, String> {
    let mut a = HashMap::new();
    a.insert(CONTAINER_HASH.into(), container_hash(container));
    a.insert(CONTAINER_RESTART_COUNT.into(), restart_count.to_string());
    a.insert(
        CONTAINER_TERMINATION_MESSAGE_PATH.into(),
        container
            .termination_message_path
            .clone()
            .unwrap_or_default(),
    );
    a.insert(
        CONTAINER_TERMINATION_MESSAGE_POLICY.into(),
        container
            .termination_message_policy
            .clone()
            .unwrap_or_default(),
    );
    if let Some(g) = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
    {
        a.insert(POD_TERMINATION_GRACE_PERIOD.into(), g.to_string());
    }
    if let Some(ports) = container.ports.as_ref().filter(|p| !p.is_empty()) {
        if let Ok(json) = serde_json::to_string(ports) {
            a.insert(CONTAINER_PORTS.into(), json);
        }
    }
    if is_init {
        a.insert(CONTAINER_IS_INIT.into(), "true".into());
    }
    a
}

/// Hash of a container's spec (kubelet's `HashContainer`): a change means the running container
/// no longer matches and is restarted. Resources are left out, as kubelet does since in-place
/// resize: they are in the pod-level [`super::actions::pod_spec_hash`], whose change makes the
/// whole pod again (nodelet does not resize running containers).
pub fn container_hash(container: &Container) -> String {
    let mut c = container.clone();
    c.resources = None;
    crate::hash::object_hash(&c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_ignores_resources_but_not_image_or_command() {
        let c: Container =
            serde_yaml::from_str("{name: c, image: busybox, command: [sleep, '1']}").unwrap();
        let mut r = c.clone();
        r.resources = Some(serde_yaml::from_str("{limits: {cpu: '1'}}").unwrap());
        assert_eq!(container_hash(&c), container_hash(&r));
        let mut i = c.clone();
        i.image = Some("busybox:1.36".into());
        assert_ne!(container_hash(&c), container_hash(&i));
        let mut cmd = c.clone();
        cmd.command = Some(vec!["sleep".into(), "2".into()]);
        assert_ne!(container_hash(&c), container_hash(&cmd));
    }

    #[test]
    fn sandbox_labels_carry_pod_identity() {
        let pod: Pod =
            serde_yaml::from_str("metadata: {name: p, namespace: ns, uid: u1, labels: {app: web}}")
                .unwrap();
        let l = sandbox_labels(&pod);
        assert_eq!(l[POD_NAME], "p");
        assert_eq!(l[POD_NAMESPACE], "ns");
        assert_eq!(l[POD_UID], "u1");
        assert_eq!(l["app"], "web");
    }
}
