//! Validation of pod manifests: names, namespaces and the container list.
//!
//! Follows the API server's `ValidatePod` for the parts a node agent depends on: a name that is a
//! DNS-1123 subdomain (so it can never escape a path: no `/`, no `..`), a namespace that is a
//! DNS-1123 label, a UID that is safe in a path, annotations within the API server's size limit,
//! at least one container, container names that are unique DNS-1123 labels, an image for every
//! container, and the enumerated policies and protocols.

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::pod::{is_dns1123_label, is_dns1123_subdomain, is_safe_uid};

/// One validation failure: the field path (`spec.containers[1].name`), the value and the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Field path in the manifest, e.g. `metadata.name`.
    pub field: String,
    /// The offending value (empty when the field is missing).
    pub value: String,
    /// What the value must look like.
    pub reason: String,
}

impl FieldError {
    /// `"<value>": <reason>`, or the reason alone when there is no value.
    pub fn describe(&self) -> String {
        if self.value.is_empty() {
            self.reason.clone()
        } else {
            format!("{:?}: {}", self.value, self.reason)
        }
    }
}

fn err(field: impl Into<String>, value: &str, reason: &str) -> FieldError {
    FieldError {
        field: field.into(),
        value: value.to_owned(),
        reason: reason.to_owned(),
    }
}

/// Largest total size of a pod's annotations, bytes (apimachinery's
/// `TotalAnnotationSizeLimitB`).
pub const MAX_ANNOTATION_BYTES: usize = 256 * 1024;

/// Validates a decoded manifest before defaults are applied. Returns the first failure.
pub fn validate_pod(pod: &Pod) -> Result<(), FieldError> {
    validate_pod_from(pod, false)
}

/// [`validate_pod`] for a pod the API server bound to this node: it may also have projected
/// `serviceAccountToken` sources ([`crate::token`]).
///
/// Errors: the first [`FieldError`].
pub fn validate_api_pod(pod: &Pod) -> Result<(), FieldError> {
    validate_pod_from(pod, true)
}

fn validate_pod_from(pod: &Pod, from_api: bool) -> Result<(), FieldError> {
    validate_metadata(pod)?;
    let Some(spec) = pod.spec.as_ref() else {
        return Err(err("spec", "", "is required"));
    };
    validate_containers(spec)?;
    validate_ephemeral(spec, from_api)?;
    validate_pod_fields(pod, spec, from_api)
}

/// `metadata`: name, UID, annotations' size, namespace, label keys and values, annotation keys,
/// and the length of the pod's log directory name.
fn validate_metadata(pod: &Pod) -> Result<(), FieldError> {
    let name = pod.metadata.name.as_deref().unwrap_or("");
    if name.is_empty() {
        return Err(err("metadata.name", "", "is required"));
    }
    if !is_dns1123_subdomain(name) {
        return Err(err(
            "metadata.name",
            name,
            "must be a DNS-1123 subdomain (lowercase a-z, 0-9, '-', '.'; no '/' or '..')",
        ));
    }
    if let Some(uid) = pod.metadata.uid.as_deref().filter(|u| !u.is_empty()) {
        if !is_safe_uid(uid) {
            return Err(err(
                "metadata.uid",
                uid,
                "must be at most 128 of a-z, A-Z, 0-9, '-', '_', '.', starting alphanumeric, without '..' (it names directories and cgroups)",
            ));
        }
    }
    let annotation_bytes: usize = pod
        .metadata
        .annotations
        .iter()
        .flatten()
        .map(|(k, v)| k.len() + v.len())
        .sum();
    if annotation_bytes > MAX_ANNOTATION_BYTES {
        return Err(err(
            "metadata.annotations",
            &format!("{annotation_bytes} bytes"),
            "must total at most 262144 bytes (the API server's limit)",
        ));
    }
    if let Some(ns) = pod.metadata.namespace.as_deref().filter(|n| !n.is_empty()) {
        if !is_dns1123_label(ns) {
            return Err(err(
                "metadata.namespace",
                ns,
                "must be a DNS-1123 label (lowercase a-z, 0-9, '-', at most 63)",
            ));
        }
    }
    for (k, v) in pod.metadata.labels.iter().flatten() {
        if let Err(reason) = qualified_name(k) {
            return Err(err(
                format!("metadata.labels[{k:?}]"),
                "",
                &format!("key {reason}"),
            ));
        }
        if !is_label_value(v) {
            return Err(err(
                format!("metadata.labels[{k:?}]"),
                v,
                "value must be at most 63 of a-z, A-Z, 0-9, '-', '_', '.', starting and ending alphanumeric (or empty)",
            ));
        }
    }
    for k in pod.metadata.annotations.iter().flatten().map(|(k, _)| k) {
        if let Err(reason) = qualified_name(k) {
            return Err(err(
                format!("metadata.annotations[{k:?}]"),
                "",
                &format!("key {reason}"),
            ));
        }
    }
    validate_log_dir_name(pod)
}

/// The most bytes a file name may have (Linux `NAME_MAX`).
const NAME_MAX: usize = 255;

/// The pod's log directory name, `<namespace>_<name>_<uid>`, fits in a file name (checked once
/// the pod has its UID and final name; a file pod's are given by
/// [`super::manifest::decode_manifest`]): a longer one could never be made, and the pod would be
/// retried forever with `File name too long`. The API server's own limits (253 for the name)
/// allow more than fits.
///
/// Errors: a [`FieldError`] on `metadata.name`.
pub fn validate_log_dir_name(pod: &Pod) -> Result<(), FieldError> {
    let m = &pod.metadata;
    if m.uid.as_deref().is_none_or(str::is_empty) {
        return Ok(());
    }
    let name = m.name.as_deref().unwrap_or("");
    // The name as the log directory is made ([`crate::pod::pod_logs_dir_under`]).
    let len = crate::pod::pod_logs_dir_under(std::path::Path::new(""), pod)
        .as_os_str()
        .len();
    if len > NAME_MAX {
        return Err(err(
            "metadata.name",
            name,
            &format!("is too long: the pod's log directory <namespace>_<name>_<uid> would be a {len}-byte file name, more than {NAME_MAX}; shorten metadata.name by {}", len - NAME_MAX),
        ));
    }
    Ok(())
}

/// A qualified name as the API server checks label and annotation keys (`IsQualifiedName`): an
/// optional DNS-1123 subdomain prefix (at most 253) and `/`, then a name of at most 63 of
/// a-z, A-Z, 0-9, `-`, `_`, `.`, starting and ending alphanumeric. Errors: what is wrong.
fn qualified_name(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        if p.is_empty() || !is_dns1123_subdomain(p) {
            return Err(format!("prefix {p:?} must be a DNS-1123 subdomain"));
        }
    }
    if name.is_empty() || !is_label_value(name) {
        return Err(format!("{key:?} must be a name of at most 63 of a-z, A-Z, 0-9, '-', '_', '.', starting and ending alphanumeric, with an optional DNS subdomain prefix and '/'"));
    }
    Ok(())
}

/// A label value (`IsValidLabelValue`): empty, or at most 63 of a-z, A-Z, 0-9, `-`, `_`, `.`,
/// starting and ending alphanumeric.
fn is_label_value(v: &str) -> bool {
    let b = v.as_bytes();
    b.is_empty()
        || (b.len() <= 63
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.')))
}

/// `spec.initContainers` and `spec.containers`: each container, its termination message path,
/// its resource field references, `restartPolicy` (sidecars) and names unique across both lists.
fn validate_containers(spec: &k8s_openapi::api::core::v1::PodSpec) -> Result<(), FieldError> {
    if spec.containers.is_empty() {
        return Err(err(
            "spec.containers",
            "",
            "must hold at least one container",
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    let init = spec.init_containers.as_deref().unwrap_or(&[]);
    let ephemeral = crate::pod::ephemeral_containers(spec);
    let ephemeral: Vec<Container> = ephemeral.into_iter().map(|(c, _)| c).collect();
    for (list, containers) in [
        ("spec.initContainers", init),
        ("spec.containers", &spec.containers[..]),
        ("spec.ephemeralContainers", &ephemeral[..]),
    ] {
        // The API server defaults terminationGracePeriodSeconds to 30, and a negative one to
        // 1, before it validates.
        let grace = spec
            .termination_grace_period_seconds
            .unwrap_or(crate::pod::DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS)
            .max(1);
        for (i, c) in containers.iter().enumerate() {
            validate_container(&format!("{list}[{i}]"), c, grace)?;
            if let Some(p) = c.termination_message_path.as_deref() {
                if !p.is_empty() && !p.starts_with('/') {
                    return Err(err(
                        format!("{list}[{i}].terminationMessagePath"),
                        p,
                        "must be an absolute path",
                    ));
                }
            }
            validate_env(list, i, c, spec)?;
            if let Some(p) = c.restart_policy.as_deref() {
                let field = format!("{list}[{i}].restartPolicy");
                if list != "spec.initContainers" {
                    return Err(err(field, p, "may only be set on init containers"));
                }
                if p != "Always" {
                    return Err(err(field, p, "must be Always (a sidecar) when set"));
                }
            }
            if !seen.insert(c.name.as_str()) {
                return Err(err(
                    format!("{list}[{i}].name"),
                    &c.name,
                    "duplicates another container's name",
                ));
            }
        }
    }
    Ok(())
}

/// `spec.ephemeralContainers`: only in a pod from the API server, which adds them to a running
/// pod through its `ephemeralcontainers` subresource (`kubectl debug`); a manifest may not set
/// them (the API server's `ValidatePodCreate`, which kubelet applies to static pods too). Each
/// `targetContainerName` names an init or app container.
fn validate_ephemeral(
    spec: &k8s_openapi::api::core::v1::PodSpec,
    from_api: bool,
) -> Result<(), FieldError> {
    let ephemeral = spec.ephemeral_containers.as_deref().unwrap_or(&[]);
    if ephemeral.is_empty() {
        return Ok(());
    }
    if !from_api {
        return Err(err(
            "spec.ephemeralContainers",
            "",
            "Forbidden: cannot be set on create (the API server adds ephemeral containers to a running pod, as kubectl debug does; kubelet refuses them in a static pod too)",
        ));
    }
    for (i, e) in ephemeral.iter().enumerate() {
        let Some(target) = e.target_container_name.as_deref() else {
            continue;
        };
        let known = spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
            .any(|c| c.name == target);
        if !known {
            return Err(err(
                format!("spec.ephemeralContainers[{i}].targetContainerName"),
                target,
                "must name an init or app container of the pod",
            ));
        }
    }
    Ok(())
}

/// The `env` of container `i` of `list`: each name valid, and each `valueFrom.resourceFieldRef`
/// a known resource and divisor with a `containerName` that names a container of the pod.
fn validate_env(
    list: &str,
    i: usize,
    c: &k8s_openapi::api::core::v1::Container,
    spec: &k8s_openapi::api::core::v1::PodSpec,
) -> Result<(), FieldError> {
    for (j, e) in c.env.iter().flatten().enumerate() {
        // The API server's rule since Kubernetes 1.32 (RelaxedEnvironmentVariableValidation):
        // printable ASCII, no '='. An empty name or one with '=' would reach the runtime as
        // another variable's text.
        if e.name.is_empty()
            || !e
                .name
                .bytes()
                .all(|b| (b' '..=b'~').contains(&b) && b != b'=')
        {
            return Err(err(
                format!("{list}[{i}].env[{j}].name"),
                &e.name,
                "must be one or more printable ASCII characters other than '='",
            ));
        }
        let Some(r) = e
            .value_from
            .as_ref()
            .and_then(|v| v.resource_field_ref.as_ref())
        else {
            continue;
        };
        let at = format!("{list}[{i}].env[{j}].valueFrom.resourceFieldRef");
        crate::fieldpath::validate_resource_field(
            &r.resource,
            r.divisor.as_ref().map(|d| d.0.as_str()),
        )
        .map_err(|(what, reason)| err(format!("{at}.{what}"), "", &reason))?;
        if let Some(name) = r.container_name.as_deref().filter(|n| !n.is_empty()) {
            let known = spec
                .init_containers
                .iter()
                .flatten()
                .chain(spec.containers.iter())
                .any(|x| x.name == name);
            if !known {
                return Err(err(
                    format!("{at}.containerName"),
                    name,
                    "is not a container of the pod",
                ));
            }
        }
    }
    Ok(())
}

/// The pod-level fields: volumes, AppArmor, security contexts, host ports and namespaces,
/// resources, `restartPolicy`, `activeDeadlineSeconds`, sysctls, `dnsPolicy`, `hostname`.
fn validate_pod_fields(
    pod: &Pod,
    spec: &k8s_openapi::api::core::v1::PodSpec,
    from_api: bool,
) -> Result<(), FieldError> {
    crate::volume::validate(spec, from_api).map_err(|(field, reason)| err(field, "", &reason))?;
    crate::admission::apparmor::validate(pod).map_err(|(field, reason)| err(field, "", &reason))?;
    crate::kuberuntime::security_context::validate(spec)
        .map_err(|(field, reason)| err(field, "", &reason))?;
    validate_host_ports(spec)?;
    validate_host_namespaces(spec)?;
    validate_resource_claims(spec)?;
    crate::resources::validate_pod_resources(pod).map_err(|e| FieldError {
        value: String::new(),
        reason: e.message,
        field: e.field,
    })?;
    if let Some(p) = spec.restart_policy.as_deref() {
        if !matches!(p, "Always" | "OnFailure" | "Never") {
            return Err(err(
                "spec.restartPolicy",
                p,
                "must be Always, OnFailure or Never",
            ));
        }
    }
    // A negative terminationGracePeriodSeconds is admitted and taken as 1 s (the API server's
    // defaulting since Kubernetes 1.27); see `source::manifest`.
    if let Some(d) = spec.active_deadline_seconds {
        if d < 1 {
            return Err(err(
                "spec.activeDeadlineSeconds",
                &d.to_string(),
                "must be greater than or equal to 1",
            ));
        }
    }
    let mut sysctls = std::collections::BTreeSet::new();
    for (i, s) in spec
        .security_context
        .iter()
        .flat_map(|sc| sc.sysctls.iter().flatten())
        .enumerate()
    {
        if !sysctls.insert(crate::admission::sysctls::normalize(&s.name)) {
            return Err(err(
                format!("spec.securityContext.sysctls[{i}].name"),
                &s.name,
                "is a duplicate",
            ));
        }
    }
    if let Some(d) = spec.dns_policy.as_deref() {
        if !matches!(
            d,
            "ClusterFirst" | "ClusterFirstWithHostNet" | "Default" | "None"
        ) {
            return Err(err(
                "spec.dnsPolicy",
                d,
                "must be ClusterFirst, ClusterFirstWithHostNet, Default or None",
            ));
        }
    }
    if let Some(h) = spec.hostname.as_deref() {
        if !is_dns1123_label(h) {
            return Err(err("spec.hostname", h, "must be a DNS-1123 label"));
        }
    }
    validate_host_aliases(spec)
}

/// `spec.hostAliases` as the API server's `ValidateHostAliases`: each `ip` a valid IP address,
/// each of its `hostnames` a DNS-1123 subdomain. They are written into the pod's /etc/hosts
/// line by line, so a newline in either would add entries of the manifest's choosing.
fn validate_host_aliases(spec: &k8s_openapi::api::core::v1::PodSpec) -> Result<(), FieldError> {
    for (i, a) in spec.host_aliases.iter().flatten().enumerate() {
        if a.ip.parse::<std::net::IpAddr>().is_err() {
            return Err(err(
                format!("spec.hostAliases[{i}].ip"),
                &a.ip,
                "must be valid IP address",
            ));
        }
        for (j, h) in a.hostnames.iter().flatten().enumerate() {
            if !is_dns1123_subdomain(h) {
                return Err(err(
                    format!("spec.hostAliases[{i}].hostnames[{j}]"),
                    h,
                    "must be a DNS-1123 subdomain",
                ));
            }
        }
    }
    Ok(())
}

/// Refuses dynamic resource allocation (`spec.resourceClaims`, a container's
/// `resources.claims`): nodelet has no DRA drivers to prepare the devices, and kubelet does not
/// start a pod whose claims it cannot prepare; running it without them would hide the failure.
fn validate_resource_claims(spec: &k8s_openapi::api::core::v1::PodSpec) -> Result<(), FieldError> {
    let why = "dynamic resource allocation is not supported by nodelet yet; the pod is refused rather than run without its devices";
    if spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty()) {
        return Err(err("spec.resourceClaims", "", why));
    }
    let init = spec.init_containers.as_deref().unwrap_or(&[]);
    for (list, containers) in [
        ("spec.initContainers", init),
        ("spec.containers", &spec.containers[..]),
    ] {
        for (i, c) in containers.iter().enumerate() {
            let claims = c.resources.as_ref().and_then(|r| r.claims.as_ref());
            if claims.is_some_and(|c| !c.is_empty()) {
                return Err(err(format!("{list}[{i}].resources.claims"), "", why));
            }
        }
    }
    Ok(())
}

/// Host ports as the API server checks them (`validateHostNetwork`, `checkHostPortConflicts`):
/// on the host network a `hostPort` must equal its `containerPort` (which it defaults to), and no
/// two ports of the pod's containers may claim the same protocol, host IP and host port.
fn validate_host_ports(spec: &k8s_openapi::api::core::v1::PodSpec) -> Result<(), FieldError> {
    let host_network = spec.host_network.unwrap_or(false);
    let init = spec.init_containers.as_deref().unwrap_or(&[]);
    for (list, containers) in [
        ("spec.initContainers", init),
        ("spec.containers", &spec.containers[..]),
    ] {
        for (i, c) in containers.iter().enumerate() {
            for (j, p) in c.ports.iter().flatten().enumerate() {
                let hp = p.host_port.unwrap_or(0);
                if host_network && hp != 0 && hp != p.container_port {
                    return Err(err(
                        format!("{list}[{i}].ports[{j}].hostPort"),
                        &hp.to_string(),
                        "must match `containerPort` when `hostNetwork` is true",
                    ));
                }
            }
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, c) in spec.containers.iter().enumerate() {
        for (j, p) in c.ports.iter().flatten().enumerate() {
            let hp = match p.host_port.unwrap_or(0) {
                0 if host_network => p.container_port,
                hp => hp,
            };
            if hp == 0 {
                continue;
            }
            let key = format!(
                "{}/{}/{hp}",
                p.protocol.as_deref().unwrap_or("TCP"),
                p.host_ip.as_deref().unwrap_or("")
            );
            if !seen.insert(key.clone()) {
                return Err(err(
                    format!("spec.containers[{i}].ports[{j}].hostPort"),
                    &key,
                    "duplicates another port of the pod (protocol/hostIP/hostPort)",
                ));
            }
        }
    }
    Ok(())
}

/// What the API server refuses for pods in the host's namespaces: `shareProcessNamespace` with
/// `hostPID`, and namespaced sysctls of a namespace the pod shares with the host (`net.*` with
/// `hostNetwork`; `kernel.shm*`, `kernel.msg*`, `kernel.sem`, `fs.mqueue.*` with `hostIPC`),
/// which would change the host's own settings.
fn validate_host_namespaces(spec: &k8s_openapi::api::core::v1::PodSpec) -> Result<(), FieldError> {
    if spec.share_process_namespace == Some(true) && spec.host_pid == Some(true) {
        return Err(err(
            "spec.shareProcessNamespace",
            "true",
            "ShareProcessNamespace and HostPID cannot both be enabled",
        ));
    }
    let sysctls = spec
        .security_context
        .as_ref()
        .and_then(|sc| sc.sysctls.as_deref())
        .unwrap_or(&[]);
    for (i, s) in sysctls.iter().enumerate() {
        let name = s.name.replace('/', ".");
        let ipc = ["kernel.shm", "kernel.msg", "kernel.sem", "fs.mqueue."]
            .iter()
            .any(|p| name.starts_with(p));
        let field = format!("spec.securityContext.sysctls[{i}].name");
        if spec.host_network == Some(true) && name.starts_with("net.") {
            return Err(err(
                field,
                &s.name,
                "may not be specified when 'hostNetwork' is true",
            ));
        }
        if spec.host_ipc == Some(true) && ipc {
            return Err(err(
                field,
                &s.name,
                "may not be specified when 'hostIPC' is true",
            ));
        }
    }
    Ok(())
}

/// A lifecycle hook's `sleep` may not outlast the pod's grace period (the API server's
/// `validateSleepAction`, zero allowed as from 1.34): seconds in 0..=`grace`.
fn validate_sleeps(path: &str, c: &Container, grace: i64) -> Result<(), FieldError> {
    let Some(l) = &c.lifecycle else {
        return Ok(());
    };
    for (name, h) in [("postStart", &l.post_start), ("preStop", &l.pre_stop)] {
        let Some(sleep) = h.as_ref().and_then(|h| h.sleep.as_ref()) else {
            continue;
        };
        if !(0..=grace).contains(&sleep.seconds) {
            return Err(err(
                format!("{path}.lifecycle.{name}.sleep"),
                &sleep.seconds.to_string(),
                &format!(
                    "must be non-negative and less than terminationGracePeriodSeconds ({grace})"
                ),
            ));
        }
    }
    Ok(())
}

fn validate_container(path: &str, c: &Container, grace: i64) -> Result<(), FieldError> {
    if !is_dns1123_label(&c.name) {
        return Err(err(
            format!("{path}.name"),
            &c.name,
            "must be a DNS-1123 label (lowercase a-z, 0-9, '-', at most 63)",
        ));
    }
    if c.image.as_deref().is_none_or(|i| i.trim().is_empty()) {
        return Err(err(format!("{path}.image"), "", "is required"));
    }
    crate::prober::spec::validate(path, c).map_err(|(field, reason)| err(field, "", &reason))?;
    validate_sleeps(path, c, grace)?;
    if let Some(p) = c.image_pull_policy.as_deref() {
        if !matches!(p, "Always" | "IfNotPresent" | "Never") {
            return Err(err(
                format!("{path}.imagePullPolicy"),
                p,
                "must be Always, IfNotPresent or Never",
            ));
        }
    }
    for (i, port) in c.ports.iter().flatten().enumerate() {
        if !(1..=65535).contains(&port.container_port) {
            return Err(err(
                format!("{path}.ports[{i}].containerPort"),
                &port.container_port.to_string(),
                "must be 1..65535",
            ));
        }
        if let Some(proto) = port.protocol.as_deref() {
            if !matches!(proto, "TCP" | "UDP" | "SCTP") {
                return Err(err(
                    format!("{path}.ports[{i}].protocol"),
                    proto,
                    "must be TCP, UDP or SCTP",
                ));
            }
        }
        if let Some(hp) = port.host_port {
            if !(0..=65535).contains(&hp) {
                return Err(err(
                    format!("{path}.ports[{i}].hostPort"),
                    &hp.to_string(),
                    "must be 0..65535",
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_yaml::from_str(yaml).unwrap()
    }

    /// Ephemeral containers: refused in a manifest (kubelet's `ValidatePodCreate`), accepted in
    /// a pod from the API server with their names checked as any container's and a target
    /// that names a container of the pod.
    #[test]
    fn ephemeral_containers_only_in_api_pods_with_a_known_target() {
        let with = |eph: &str| {
            pod(&format!(
                "metadata: {{name: ok}}\nspec: {{containers: [{{name: c, image: b}}], ephemeralContainers: [{eph}]}}"
            ))
        };
        let p = with("{name: debug, image: b, targetContainerName: c}");
        let e = validate_pod(&p).unwrap_err();
        assert_eq!(e.field, "spec.ephemeralContainers");
        assert!(
            e.reason.starts_with("Forbidden: cannot be set on create"),
            "{e:?}"
        );
        assert_eq!(validate_api_pod(&p), Ok(()));
        let e = validate_api_pod(&with("{name: debug, image: b, targetContainerName: nope}"))
            .unwrap_err();
        assert_eq!(e.field, "spec.ephemeralContainers[0].targetContainerName");
        let e = validate_api_pod(&with("{name: c, image: b}")).unwrap_err();
        assert_eq!(e.field, "spec.ephemeralContainers[0].name");
        let e = validate_api_pod(&with("{name: Bad, image: b}")).unwrap_err();
        assert_eq!(e.field, "spec.ephemeralContainers[0].name");
    }

    #[test]
    fn host_aliases_with_ip_addresses_and_subdomains_are_valid() {
        let p = pod("metadata: {name: ok}\nspec: {hostAliases: [{ip: 10.1.2.3, hostnames: [foo.local, bar]}, {ip: \"fd00::1\"}], containers: [{name: c, image: b}]}");
        assert_eq!(validate_pod(&p), Ok(()));
    }

    #[test]
    fn validation_names_the_field() {
        let cases = [
            ("metadata: {name: ok}\nspec: {containers: []}", "spec.containers"),
            ("metadata: {name: ok, namespace: ../x}\nspec: {containers: [{name: c, image: busybox}]}", "metadata.namespace"),
            ("metadata: {name: Bad}\nspec: {containers: [{name: c, image: busybox}]}", "metadata.name"),
            ("metadata: {name: ok}\nspec: {containers: [{name: c}]}", "spec.containers[0].image"),
            ("metadata: {name: ok}\nspec: {containers: [{name: c, image: b}, {name: c, image: b}]}", "spec.containers[1].name"),
            ("metadata: {name: ok}\nspec: {initContainers: [{name: c, image: b}], containers: [{name: c, image: b}]}", "spec.containers[0].name"),
            ("metadata: {name: ok}\nspec: {restartPolicy: Sometimes, containers: [{name: c, image: b}]}", "spec.restartPolicy"),
            ("metadata: {name: ok}\nspec: {containers: [{name: c, image: b, imagePullPolicy: Maybe}]}", "spec.containers[0].imagePullPolicy"),
            ("metadata: {}\nspec: {containers: [{name: c, image: b}]}", "metadata.name"),
            ("metadata: {name: ok, uid: x/../../victim}\nspec: {containers: [{name: c, image: b}]}", "metadata.uid"),
            ("metadata: {name: ok, uid: ..}\nspec: {containers: [{name: c, image: b}]}", "metadata.uid"),
            ("metadata: {name: ok}\nspec: {dnsPolicy: Bogus, containers: [{name: c, image: b}]}", "spec.dnsPolicy"),
            ("metadata: {name: ok}\nspec: {hostAliases: [{ip: \"1.2.3.4\\n6.6.6.6\", hostnames: [a]}], containers: [{name: c, image: b}]}", "spec.hostAliases[0].ip"),
            ("metadata: {name: ok}\nspec: {hostAliases: [{ip: 10.0.0.1, hostnames: [a]}, {ip: \"::1\", hostnames: [ok.local, \"evil\\n7.7.7.7 x\"]}], containers: [{name: c, image: b}]}", "spec.hostAliases[1].hostnames[1]"),
            ("metadata: {name: ok}\nspec: {hostAliases: [{ip: 10.0.0.1, hostnames: [UPPER_case]}], containers: [{name: c, image: b}]}", "spec.hostAliases[0].hostnames[0]"),
            ("metadata: {name: ok}\nspec: {initContainers: [{name: s, image: b, restartPolicy: Never}], containers: [{name: c, image: b}]}", "spec.initContainers[0].restartPolicy"),
            ("metadata: {name: ok}\nspec: {containers: [{name: c, image: b, restartPolicy: Always}]}", "spec.containers[0].restartPolicy"),
            ("metadata: {name: ok}\nspec: {containers: [{name: c, image: b, livenessProbe: {periodSeconds: 3}}]}", "spec.containers[0].livenessProbe"),
            ("metadata: {name: ok}\nspec: {containers: [{name: c, image: b, readinessProbe: {exec: {command: [x]}, httpGet: {port: 80}}}]}", "spec.containers[0].readinessProbe"),
            ("metadata: {name: ok}\nspec: {containers: [{name: c, image: b, ports: [{containerPort: 80, protocol: XYZ}]}]}", "spec.containers[0].ports[0].protocol"),
            ("metadata: {name: ok}\nspec: {hostNetwork: true, containers: [{name: c, image: b, ports: [{containerPort: 80, hostPort: 8080}]}]}", "spec.containers[0].ports[0].hostPort"),
            ("metadata: {name: ok}\nspec: {hostNetwork: true, securityContext: {sysctls: [{name: net.ipv4.ip_forward, value: '1'}]}, containers: [{name: c, image: b}]}", "spec.securityContext.sysctls[0].name"),
            ("metadata: {name: ok}\nspec: {hostIPC: true, securityContext: {sysctls: [{name: kernel.shmmax, value: '1'}]}, containers: [{name: c, image: b}]}", "spec.securityContext.sysctls[0].name"),
            ("metadata: {name: ok}\nspec: {hostPID: true, shareProcessNamespace: true, containers: [{name: c, image: b}]}", "spec.shareProcessNamespace"),
            ("metadata: {name: ok}\nspec: {hostNetwork: true, containers: [{name: c, image: b, ports: [{containerPort: 80}]}, {name: d, image: b, ports: [{containerPort: 80}]}]}", "spec.containers[1].ports[0].hostPort"),
            ("metadata: {name: ok}\nspec: {containers: [{name: c, image: b, ports: [{containerPort: 80, hostPort: 9}, {containerPort: 81, hostPort: 9}]}]}", "spec.containers[0].ports[1].hostPort"),
            ("metadata: {name: ok}\nspec: {resourceClaims: [{name: gpu, resourceClaimName: g}], containers: [{name: c, image: b}]}", "spec.resourceClaims"),
            ("metadata: {name: ok, labels: {'bad key!': x}}\nspec: {containers: [{name: c, image: b}]}", "metadata.labels[\"bad key!\"]"),
            ("metadata: {name: ok, labels: {app: 'not ok'}}\nspec: {containers: [{name: c, image: b}]}", "metadata.labels[\"app\"]"),
            ("metadata: {name: ok, labels: {'Bad_Prefix/app': x}}\nspec: {containers: [{name: c, image: b}]}", "metadata.labels[\"Bad_Prefix/app\"]"),
            ("metadata: {name: ok, annotations: {'/x': y}}\nspec: {containers: [{name: c, image: b}]}", "metadata.annotations[\"/x\"]"),
            ("metadata: {name: ok}\nspec: {containers: [{name: c, image: b, env: [{name: '', value: x}]}]}", "spec.containers[0].env[0].name"),
            ("metadata: {name: ok}\nspec: {initContainers: [{name: i, image: b, env: [{name: ok}, {name: 'A=B', value: x}]}], containers: [{name: c, image: b}]}", "spec.initContainers[0].env[1].name"),
            ("metadata: {name: ok}\nspec: {containers: [{name: c, image: b, resources: {claims: [{name: gpu}]}}]}", "spec.containers[0].resources.claims"),
            ("metadata: {name: ok}\nspec: {volumes: [{name: v, emptyDir: {}}], containers: [{name: c, image: b, volumeMounts: [{name: v, mountPath: /v, readOnly: true, recursiveReadOnly: Enabled}]}]}", "spec.containers[0].volumeMounts[0].recursiveReadOnly"),
            ("metadata: {name: ok}\nspec: {volumes: [{name: v, emptyDir: {}}], containers: [{name: c, image: b, volumeMounts: [{name: v, mountPath: /v, recursiveReadOnly: IfPossible}]}]}", "spec.containers[0].volumeMounts[0].recursiveReadOnly"),
            ("metadata: {name: ok}\nspec: {volumes: [{name: v, emptyDir: {}}], containers: [{name: c, image: b, volumeMounts: [{name: v, mountPath: /v, readOnly: true, recursiveReadOnly: Sometimes}]}]}", "spec.containers[0].volumeMounts[0].recursiveReadOnly"),
            ("metadata: {name: ok}\nspec: {securityContext: {fsGroup: 99999999999}, containers: [{name: c, image: b}]}", "spec.securityContext.fsGroup"),
            ("metadata: {name: ok}\nspec: {securityContext: {runAsUser: -1}, containers: [{name: c, image: b}]}", "spec.securityContext.runAsUser"),
            ("metadata: {name: ok}\nspec: {securityContext: {supplementalGroups: [1, 4294967296]}, containers: [{name: c, image: b}]}", "spec.securityContext.supplementalGroups[1]"),
            ("metadata: {name: ok}\nspec: {securityContext: {supplementalGroupsPolicy: Strict}, containers: [{name: c, image: b}]}", "spec.securityContext.supplementalGroupsPolicy"),
            ("metadata: {name: ok}\nspec: {initContainers: [{name: i, image: b, securityContext: {runAsGroup: 2147483648}}], containers: [{name: c, image: b}]}", "spec.initContainers[0].securityContext.runAsGroup"),
            ("metadata: {name: ok}\nspec: {containers: [{name: c, image: b, securityContext: {runAsUser: 4294967296}}]}", "spec.containers[0].securityContext.runAsUser"),
        ];
        for (yaml, field) in cases {
            let full = format!("apiVersion: v1\nkind: Pod\n{yaml}");
            let e = validate_pod(&pod(&full)).unwrap_err();
            assert_eq!(e.field, field, "{yaml}");
        }
    }

    #[test]
    fn the_edges_the_api_server_accepts_are_accepted() {
        for yaml in [
            "metadata: {name: ok}\nspec: {securityContext: {runAsUser: 2147483647, runAsGroup: 0, fsGroup: 2147483647, supplementalGroupsPolicy: Merge}, containers: [{name: c, image: b}]}",
            "metadata: {name: ok}\nspec: {volumes: [{name: v, emptyDir: {}}], containers: [{name: c, image: b, volumeMounts: [{name: v, mountPath: /v, readOnly: true, recursiveReadOnly: IfPossible}, {name: v, mountPath: /w, recursiveReadOnly: Disabled}]}]}",
            "metadata: {name: ok}\nspec: {resourceClaims: [], containers: [{name: c, image: b, resources: {claims: []}}]}",
            "metadata: {name: ok, labels: {app.kubernetes.io/name: web, tier: '', x: A-b_c.9}, annotations: {example.com/note: 'any text: here'}}\nspec: {containers: [{name: c, image: b, env: [{name: my.var-1, value: x}, {name: '1 two', value: y}]}]}",
        ] {
            let full = format!("apiVersion: v1\nkind: Pod\n{yaml}");
            assert_eq!(validate_pod(&pod(&full)).map_err(|e| e.describe()), Ok(()), "{yaml}");
        }
    }

    #[test]
    fn a_service_account_token_is_taken_only_from_the_api_server() {
        let with = |src: &str| {
            pod(&format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: ok}}\nspec: {{volumes: [{{name: v, projected: {{sources: [{src}, {{downwardAPI: {{items: [{{path: token, fieldRef: {{fieldPath: metadata.name}}}}]}}}}]}}}}], containers: [{{name: c, image: b}}]}}"))
        };
        let token =
            with("{serviceAccountToken: {path: tok, audience: vault, expirationSeconds: 600}}");
        assert_eq!(validate_api_pod(&token), Ok(()));
        let e = validate_pod(&token).unwrap_err();
        assert_eq!(
            e.field,
            "spec.volumes[0].projected.sources[0].serviceAccountToken"
        );
        assert!(e.describe().contains("static pod"), "{}", e.describe());
        // The API server's checks: a lifetime of at least 10 minutes, a path of its own.
        let short = with("{serviceAccountToken: {path: tok, expirationSeconds: 599}}");
        assert_eq!(
            validate_api_pod(&short).unwrap_err().field,
            "spec.volumes[0].projected.sources[0].serviceAccountToken.expirationSeconds"
        );
        let clash = with("{serviceAccountToken: {path: token}}");
        assert!(validate_api_pod(&clash).is_err());
        let other = with("{clusterTrustBundle: {path: ca, name: x}}");
        assert!(validate_api_pod(&other)
            .unwrap_err()
            .describe()
            .contains("not implemented"));
    }

    #[test]
    fn a_hook_sleep_longer_than_the_grace_period_is_refused_as_the_api_server_refuses_it() {
        let with = |grace: &str, hook: &str, secs: i64| {
            pod(&format!("metadata: {{name: ok}}\nspec: {{{grace}containers: [{{name: c, image: b, lifecycle: {{{hook}: {{sleep: {{seconds: {secs}}}}}}}}}]}}"))
        };
        let e = validate_pod(&with("", "preStop", 40)).unwrap_err();
        assert_eq!(e.field, "spec.containers[0].lifecycle.preStop.sleep");
        assert_eq!(
            e.describe(),
            "\"40\": must be non-negative and less than terminationGracePeriodSeconds (30)"
        );
        let e =
            validate_pod(&with("terminationGracePeriodSeconds: 5, ", "postStart", 6)).unwrap_err();
        assert_eq!(e.field, "spec.containers[0].lifecycle.postStart.sleep");
        // Equal to the grace period, and zero, are allowed (as from 1.34).
        assert!(validate_pod(&with("terminationGracePeriodSeconds: 5, ", "preStop", 5)).is_ok());
        assert!(validate_pod(&with("", "preStop", 0)).is_ok());
        // A negative grace period is 1 s, as the API server defaults it.
        assert!(validate_pod(&with("terminationGracePeriodSeconds: -3, ", "preStop", 1)).is_ok());
        let ok = pod("apiVersion: v1\nkind: Pod\nmetadata: {name: ok, namespace: '', uid: 6e0de1e7-5a1c-4f0e}\nspec: {containers: [{name: c, image: b}]}");
        assert_eq!(validate_pod(&ok), Ok(()));
        let big = format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: ok, annotations: {{a: {}}}}}\nspec: {{containers: [{{name: c, image: b}}]}}", "x".repeat(MAX_ANNOTATION_BYTES));
        assert_eq!(
            validate_pod(&pod(&big)).unwrap_err().field,
            "metadata.annotations"
        );
    }
}
