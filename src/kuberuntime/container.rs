//! The container config handed to CreateContainer (kubelet's `generateContainerConfig` in
//! `kuberuntime_container.go`, `makeEnvironmentVariables` in `kubelet_pods.go` and
//! `third_party/forked/golang/expansion` for `$(VAR)` references).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::labels;
use super::sandbox::namespace_options;
use super::Settings;
use crate::cri::api;

/// A container config that cannot be built (kubelet's `CreateContainerConfigError`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("container {container}: {message}")]
pub struct ConfigError {
    /// Container name.
    pub container: String,
    /// What is missing or unsupported.
    pub message: String,
}

/// Expands `$(VAR)` references in `input` from `vars`; `$$` is a literal `$`; unknown references
/// stay as written (kubelet's expansion rules).
pub fn expand(input: &str, vars: &HashMap<String, String>) -> String {
    let b = input.as_bytes();
    let mut out = String::with_capacity(input.len());
    let mut i = 0;
    let mut lit_start = 0;
    while i < b.len() {
        if b[i] == b'$' && i + 1 < b.len() {
            match b[i + 1] {
                b'$' => {
                    out.push_str(&input[lit_start..i]);
                    out.push('$');
                    i += 2;
                    lit_start = i;
                    continue;
                }
                b'(' => {
                    if let Some(end) = input[i + 2..].find(')') {
                        let name = &input[i + 2..i + 2 + end];
                        out.push_str(&input[lit_start..i]);
                        match vars.get(name) {
                            Some(v) => out.push_str(v),
                            None => out.push_str(&input[i..i + 3 + end]),
                        }
                        i += 3 + end;
                        lit_start = i;
                        continue;
                    }
                }
                _ => {}
            }
        }
        i += 1;
    }
    out.push_str(&input[lit_start..]);
    out
}

/// Values of the downward API field paths a static pod may reference.
fn field_value(pod: &Pod, settings: &Settings, pod_ips: &[String], path: &str) -> Option<String> {
    let spec = pod.spec.as_ref();
    if let Some(v) = crate::fieldpath::metadata_value(pod, path) {
        return Some(v);
    }
    match path {
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()),
        "spec.serviceAccountName" => Some(
            spec.and_then(|s| s.service_account_name.clone())
                .unwrap_or_default(),
        ),
        "status.hostIP" | "status.hostIPs" => Some(settings.node_ip.clone()),
        "status.podIP" => Some(
            pod_ips
                .first()
                .cloned()
                .unwrap_or_else(|| host_ip_if_host_network(pod, settings)),
        ),
        "status.podIPs" => Some(if pod_ips.is_empty() {
            host_ip_if_host_network(pod, settings)
        } else {
            pod_ips.join(",")
        }),
        _ => None,
    }
}

fn host_ip_if_host_network(pod: &Pod, settings: &Settings) -> String {
    let host = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    if host {
        settings.node_ip.clone()
    } else {
        String::new()
    }
}

/// A container's environment and what was left out of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Env {
    /// Name and value, in order (a later entry of the same name replaced the earlier value).
    pub vars: Vec<(String, String)>,
    /// kubelet's `InvalidEnvironmentVariableNames` warnings: keys of an `envFrom` source that
    /// are not valid variable names and were skipped.
    pub skipped: Vec<String>,
}

/// A valid environment variable name (the API server's relaxed rule, on by default since
/// Kubernetes 1.32): printable ASCII without `=`.
fn is_env_var_name(k: &str) -> bool {
    !k.is_empty() && k.bytes().all(|b| (b' '..=b'~').contains(&b) && b != b'=')
}

/// Where a container's environment comes from beyond its pod and the node's settings.
pub struct EnvSources<'a> {
    /// Local ConfigMaps and Secrets.
    pub objects: &'a crate::objects::LocalObjects,
    /// The pod's service variables ([`crate::envvars::Services::env`]), sorted by name; empty
    /// on a standalone node.
    pub services: &'a [(String, String)],
}

/// The container's environment (kubelet's `makeEnvironmentVariables`): first each `envFrom`
/// source (a ConfigMap's or Secret's keys, with `prefix`), then `env` in spec order, each value
/// with `$(VAR)` expanded against what came before, `valueFrom` resolved: `fieldRef` (the
/// downward API), `resourceFieldRef`, `configMapKeyRef` and `secretKeyRef` (local objects of the
/// pod's namespace). A missing optional object or key leaves the variable out. Then the
/// service variables ([`crate::envvars`]) of names the container did not set, by name; a
/// `$(VAR)` may name one of them.
///
/// Errors: [`ConfigError`] with kubelet's message for a missing object
/// (`configmap "x" not found`) or key (`couldn't find key k in ConfigMap ns/x`), naming the
/// variable otherwise. Never a Secret's value.
pub fn make_env(
    pod: &Pod,
    c: &Container,
    settings: &Settings,
    pod_ips: &[String],
    sources: &EnvSources<'_>,
) -> Result<Env, ConfigError> {
    use crate::objects::{not_found, ObjectKind};
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    // What `$(VAR)` reads: the service variables, under what the container sets.
    let mut vars: HashMap<String, String> = sources.services.iter().cloned().collect();
    let mut env = Env::default();
    let err = |message: String| ConfigError {
        container: c.name.clone(),
        message,
    };
    let set = |env: &mut Env, vars: &mut HashMap<String, String>, k: String, v: String| {
        vars.insert(k.clone(), v.clone());
        match env.vars.iter_mut().find(|(n, _)| *n == k) {
            Some(slot) => slot.1 = v,
            None => env.vars.push((k, v)),
        }
    };
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    for from in c.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or_default();
        let (kind, name, optional) = match (&from.config_map_ref, &from.secret_ref) {
            (Some(r), None) => (ObjectKind::ConfigMap, &r.name, r.optional),
            (None, Some(r)) => (ObjectKind::Secret, &r.name, r.optional),
            _ => {
                return Err(err(
                    "envFrom: exactly one of configMapRef and secretRef must be set".into(),
                ))
            }
        };
        let Some(data) = sources.objects.get(kind, namespace, name) else {
            if optional == Some(true) {
                continue;
            }
            return Err(err(not_found(kind, name)));
        };
        let mut invalid = Vec::new();
        for (k, v) in data.iter() {
            let key = format!("{prefix}{k}");
            if !is_env_var_name(&key) {
                invalid.push(key);
                continue;
            }
            set(&mut env, &mut vars, key, text(v));
        }
        if !invalid.is_empty() {
            env.skipped.push(format!(
                "Keys [{}] from the EnvFrom {} {namespace}/{name} were skipped since they are considered invalid environment variable names.",
                invalid.join(", "),
                if kind == ObjectKind::Secret { "secret" } else { "configMap" },
            ));
        }
    }
    for e in c.env.iter().flatten() {
        let value = if let Some(src) = &e.value_from {
            if let Some(f) = &src.field_ref {
                field_value(pod, settings, pod_ips, &f.field_path).ok_or_else(|| {
                    err(format!(
                        "env {}: unsupported fieldRef {:?}",
                        e.name, f.field_path
                    ))
                })?
            } else if let Some(r) = &src.resource_field_ref {
                let container = r.container_name.as_deref().filter(|n| !n.is_empty());
                crate::fieldpath::resource_field_value(
                    pod,
                    container.unwrap_or(&c.name),
                    &r.resource,
                    r.divisor.as_ref().map(|d| d.0.as_str()),
                    &settings.allocatable,
                )
                .map_err(|m| err(format!("env {}: {m}", e.name)))?
            } else {
                let (kind, name, key, optional) =
                    match (&src.config_map_key_ref, &src.secret_key_ref) {
                        (Some(r), None) => (ObjectKind::ConfigMap, &r.name, &r.key, r.optional),
                        (None, Some(r)) => (ObjectKind::Secret, &r.name, &r.key, r.optional),
                        _ => {
                            return Err(err(format!(
                                "env {}: valueFrom must set exactly one source",
                                e.name
                            )))
                        }
                    };
                let Some(data) = sources.objects.get(kind, namespace, name) else {
                    if optional == Some(true) {
                        continue;
                    }
                    return Err(err(not_found(kind, name)));
                };
                match data.get(key.as_str()) {
                    Some(v) => text(v),
                    None if optional == Some(true) => continue,
                    None => {
                        return Err(err(format!(
                            "couldn't find key {key} in {} {namespace}/{name}",
                            kind.as_str()
                        )))
                    }
                }
            }
        } else {
            expand(e.value.as_deref().unwrap_or(""), &vars)
        };
        set(&mut env, &mut vars, e.name.clone(), value);
    }
    let set_by_container: std::collections::HashSet<&str> =
        env.vars.iter().map(|(n, _)| n.as_str()).collect();
    let services: Vec<(String, String)> = sources
        .services
        .iter()
        .filter(|(n, _)| !set_by_container.contains(n.as_str()))
        .cloned()
        .collect();
    env.vars.extend(services);
    Ok(env)
}

/// The container's cgroup resources and oom_score_adj in CreateContainer (kubelet's
/// `generateLinuxContainerResources`): cpu.shares from the cpu request (or the limit when only
/// that is set), CFS quota and period from the cpu limit when `cpuCFSQuota`, the memory limit,
/// hugepage limits, and the QoS oom_score_adj; a container without a cpu or memory limit gets
/// the pod-level one ([`crate::resources::PodLevelResources`]),
/// ([`crate::qos::container_oom_score_adj`]). Units: bytes, microseconds.
pub fn linux_resources(
    settings: &Settings,
    pod: &Pod,
    c: &Container,
) -> api::LinuxContainerResources {
    let mut a = crate::resources::container_amounts(c).unwrap_or_default();
    // A container without a limit of its own is bounded by the pod-level limit (kubelet's
    // `getMemoryLimit`/`getCPULimit` with PodLevelResources).
    if let Some(pl) = crate::resources::pod_level_resources(pod) {
        if a.memory_limit == 0 {
            a.memory_limit = pl.memory_limit.unwrap_or(0);
        }
        if a.cpu_limit == 0 {
            a.cpu_limit = pl.cpu_limit.unwrap_or(0);
        }
    }
    let policy = &settings.cgroup_policy;
    let mut r = api::LinuxContainerResources {
        cpu_shares: crate::cm::resources::milli_cpu_to_shares(a.cpu_request) as i64,
        memory_limit_in_bytes: a.memory_limit,
        oom_score_adj: crate::qos::container_oom_score_adj(pod, c, settings.memory_capacity),
        hugepage_limits: crate::cm::resources::hugepage_limits(
            &a.hugepages,
            &settings.cgroup_policy.hugepage_sizes,
        )
        .into_iter()
        .map(|(page_size, limit)| api::HugepageLimit {
            page_size,
            limit: limit.max(0) as u64,
        })
        .collect(),
        ..Default::default()
    };
    if policy.cpu_cfs_quota {
        r.cpu_period = policy.cpu_cfs_period_us as i64;
        r.cpu_quota =
            crate::cm::resources::milli_cpu_to_quota(a.cpu_limit, policy.cpu_cfs_period_us);
    }
    if let Some(factor) = policy.memory_qos_throttling_factor {
        r.unified.extend(memory_qos(
            a.memory_request,
            a.memory_limit,
            settings.allocatable.memory,
            factor,
        ));
    }
    r
}

/// Page size `memory.high` is rounded down to, bytes (kubelet's `defaultPageSize`).
const PAGE_SIZE: i64 = 4096;

/// A container's MemoryQoS values (kubelet's MemoryQoS, cgroup v2, given to the runtime as CRI
/// `unified` entries): `memory.min` = its memory request, when there is one; `memory.high` =
/// `floor((request + factor × (limit − request)) / 4096) × 4096`, the node's allocatable memory
/// standing for a missing limit, when the request is not the limit (a Guaranteed container gets
/// none) and the result is above the request. Bytes, as decimal strings.
pub fn memory_qos(
    request: i64,
    limit: i64,
    allocatable: i64,
    factor: f64,
) -> std::collections::HashMap<String, String> {
    let mut out = std::collections::HashMap::new();
    if request != 0 {
        out.insert("memory.min".to_owned(), request.to_string());
    }
    if request != limit {
        let top = if limit != 0 { limit } else { allocatable };
        if top > 0 {
            // `as` from f64 saturates: the value is at most `top`, an i64.
            #[allow(clippy::cast_possible_truncation)]
            let high = ((request as f64 + (top - request) as f64 * factor) / PAGE_SIZE as f64)
                .floor() as i64
                * PAGE_SIZE;
            if high > request {
                out.insert("memory.high".to_owned(), high.to_string());
            }
        }
    }
    out
}

/// Inputs of one container's config beyond the pod spec.
pub struct ContainerInputs<'a> {
    /// Restart count (CRI attempt).
    pub restart_count: u32,
    /// The resolved image reference from the image service.
    pub image_ref: &'a str,
    /// The pod's IPs from its sandbox.
    pub pod_ips: &'a [String],
    /// Started as an init container.
    pub is_init: bool,
    /// Local ConfigMaps and Secrets for the env.
    pub env_sources: EnvSources<'a>,
}

/// An ephemeral container's process namespace: that of its target container `target_id` (CRI
/// `NamespaceMode::TARGET`), where the pod gives each container its own; in a pod that shares one
/// process namespace, or the host's, it keeps that (kubelet's `generateLinuxContainerConfig`
/// with a namespace target).
pub fn join_target_pid_namespace(config: &mut api::ContainerConfig, target_id: &str) {
    let ns = config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut());
    if let Some(ns) = ns.filter(|ns| ns.pid == api::NamespaceMode::Container as i32) {
        ns.pid = api::NamespaceMode::Target as i32;
        ns.target_id = target_id.to_owned();
    }
}

/// Builds the ContainerConfig: metadata, image, command/args with `$(VAR)` expanded, env,
/// working dir, kubelet's labels and annotations, log path `<name>/<restart>.log` (relative to the
/// sandbox log directory) and namespace options.
pub fn container_config(
    settings: &Settings,
    pod: &Pod,
    c: &Container,
    inputs: &ContainerInputs<'_>,
) -> Result<api::ContainerConfig, ConfigError> {
    let env = make_env(pod, c, settings, inputs.pod_ips, &inputs.env_sources)?;
    let vars: HashMap<String, String> = env.vars.iter().cloned().collect();
    let expand_all = |v: &Option<Vec<String>>| {
        v.iter()
            .flatten()
            .map(|s| expand(s, &vars))
            .collect::<Vec<_>>()
    };
    let sc = c.security_context.as_ref();
    let pod_sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let run_as_user = sc
        .and_then(|s| s.run_as_user)
        .or_else(|| pod_sc.and_then(|s| s.run_as_user));
    let run_as_group = sc
        .and_then(|s| s.run_as_group)
        .or_else(|| pod_sc.and_then(|s| s.run_as_group));
    Ok(api::ContainerConfig {
        metadata: Some(api::ContainerMetadata {
            name: c.name.clone(),
            attempt: inputs.restart_count,
        }),
        image: Some(api::ImageSpec {
            image: inputs.image_ref.to_owned(),
            user_specified_image: c.image.clone().unwrap_or_default(),
            ..Default::default()
        }),
        command: expand_all(&c.command),
        args: expand_all(&c.args),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs: env
            .vars
            .into_iter()
            .map(|(key, value)| api::KeyValue { key, value })
            .collect(),
        labels: labels::container_labels(pod, c),
        annotations: labels::container_annotations(pod, c, inputs.restart_count, inputs.is_init),
        log_path: format!("{}/{}.log", c.name, inputs.restart_count),
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        linux: Some(api::LinuxContainerConfig {
            resources: Some(linux_resources(settings, pod, c)),
            security_context: Some(api::LinuxContainerSecurityContext {
                namespace_options: Some(namespace_options(pod)),
                privileged: sc.and_then(|s| s.privileged).unwrap_or(false),
                readonly_rootfs: sc
                    .and_then(|s| s.read_only_root_filesystem)
                    .unwrap_or(false),
                run_as_user: run_as_user.map(|value| api::Int64Value { value }),
                run_as_group: run_as_group.map(|value| api::Int64Value { value }),
                ..Default::default()
            })
            .map(|mut sc| {
                super::security_context::apply(pod, c, &settings.root_dir.join("seccomp"), &mut sc);
                sc.apparmor = super::security_context::apparmor_profile(pod, c, settings.apparmor);
                sc
            }),
        }),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expansion_follows_kubelet_rules() {
        let vars: HashMap<String, String> = [("A".to_string(), "x".to_string())].into();
        assert_eq!(expand("$(A)-$(B)-$$(A)-$", &vars), "x-$(B)-$(A)-$");
        assert_eq!(expand("no refs", &vars), "no refs");
        assert_eq!(expand("$(A", &vars), "$(A");
    }

    fn pod() -> Pod {
        serde_yaml::from_str(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p-n, namespace: ns, uid: u1, labels: {app: web}}\nspec:\n  nodeName: n\n  containers:\n  - name: c\n    image: busybox\n    command: [sh, -c, 'echo $(GREETING)']\n    workingDir: /tmp\n    env:\n    - {name: NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}\n    - {name: NS, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}\n    - {name: IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}\n    - {name: APP, valueFrom: {fieldRef: {fieldPath: \"metadata.labels['app']\"}}}\n    - {name: GREETING, value: 'hi $(NAME)'}\n",
        )
        .unwrap()
    }

    #[test]
    fn service_variables_follow_the_containers_own_and_expand() {
        let p: Pod = serde_yaml::from_str(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: ns}\nspec:\n  containers:\n  - name: c\n    image: busybox\n    env:\n    - {name: API, value: 'https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)'}\n    - {name: DB_SERVICE_HOST, value: mine}\n",
        )
        .unwrap();
        let c = &p.spec.as_ref().unwrap().containers[0];
        let objects = crate::objects::LocalObjects::default();
        let services: Vec<(String, String)> = [
            ("DB_SERVICE_HOST", "10.96.0.3"),
            ("DB_SERVICE_PORT", "5432"),
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        let sources = EnvSources {
            objects: &objects,
            services: &services,
        };
        let env = make_env(&p, c, &Settings::example(), &[], &sources).unwrap();
        let names: Vec<&str> = env.vars.iter().map(|(n, _)| n.as_str()).collect();
        // The container's own first, then the service variables it did not set, by name.
        assert_eq!(
            names,
            [
                "API",
                "DB_SERVICE_HOST",
                "DB_SERVICE_PORT",
                "KUBERNETES_SERVICE_HOST",
                "KUBERNETES_SERVICE_PORT"
            ]
        );
        assert_eq!(env.vars[0].1, "https://10.96.0.1:443");
        assert_eq!(env.vars[1].1, "mine", "the container's value wins");
    }

    #[test]
    fn env_resolves_field_refs_and_expands() {
        let p = pod();
        let c = &p.spec.as_ref().unwrap().containers[0];
        let s = Settings::example();
        let objects = crate::objects::LocalObjects::default();
        let sources = EnvSources {
            objects: &objects,
            services: &[],
        };
        let env = make_env(&p, c, &s, &["10.88.0.5".into()], &sources).unwrap();
        let get = |k: &str| {
            env.vars
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
                .unwrap()
        };
        assert_eq!(get("NAME"), "p-n");
        assert_eq!(get("NS"), "ns");
        assert_eq!(get("IP"), "10.88.0.5");
        assert_eq!(get("APP"), "web");
        assert_eq!(get("GREETING"), "hi p-n");
        let cfg = container_config(
            &s,
            &p,
            c,
            &ContainerInputs {
                restart_count: 3,
                image_ref: "sha256:abc",
                pod_ips: &[],
                is_init: false,
                env_sources: EnvSources {
                    objects: &objects,
                    services: &[],
                },
            },
        )
        .unwrap();
        assert_eq!(cfg.command, vec!["sh", "-c", "echo hi p-n"]);
        assert_eq!(cfg.log_path, "c/3.log");
        assert_eq!(cfg.metadata.unwrap().attempt, 3);
        assert_eq!(cfg.labels[labels::CONTAINER_NAME], "c");
        assert_eq!(cfg.annotations[labels::CONTAINER_RESTART_COUNT], "3");
        assert_eq!(cfg.working_dir, "/tmp");
        assert_eq!(cfg.image.unwrap().user_specified_image, "busybox");
    }

    #[test]
    fn memory_qos_values_follow_kubelet() {
        let mi = 1i64 << 20;
        // A Burstable container: min = request, high 90 % of the way to its limit, in pages.
        let v = memory_qos(100 * mi, 200 * mi, 8 << 30, 0.9);
        assert_eq!(v["memory.min"], (100 * mi).to_string());
        let high = ((100.0 * mi as f64 + 100.0 * mi as f64 * 0.9) / 4096.0).floor() as i64 * 4096;
        assert_eq!(v["memory.high"], high.to_string());
        // No limit: node allocatable stands for it.
        let v = memory_qos(100 * mi, 0, 1 << 30, 0.5);
        assert_eq!(v["memory.high"], (562 * mi).to_string());
        // Neither request nor limit (BestEffort): nothing (the request is the limit, 0).
        assert!(memory_qos(0, 0, 1 << 30, 0.9).is_empty());
        // Guaranteed (request = limit): memory.min only.
        let v = memory_qos(64 * mi, 64 * mi, 8 << 30, 0.9);
        assert_eq!(v.len(), 1);
        assert_eq!(v["memory.min"], (64 * mi).to_string());
    }

    #[test]
    fn container_resources_follow_kubelet() {
        let p: Pod = serde_yaml::from_str("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: g, image: b, resources: {limits: {cpu: 250m, memory: 64Mi, hugepages-2Mi: 4Mi}}}, {name: b, image: b, resources: {requests: {memory: 2Gi}}}]}").unwrap();
        let s = Settings::example();
        let spec = p.spec.as_ref().unwrap();
        // The pod is Burstable (b has no limits): g's own values, Burstable oom score.
        let g = linux_resources(&s, &p, &spec.containers[0]);
        assert_eq!(
            (
                g.cpu_shares,
                g.cpu_quota,
                g.cpu_period,
                g.memory_limit_in_bytes
            ),
            (256, 25_000, 100_000, 64 << 20)
        );
        assert_eq!(g.hugepage_limits[0].page_size, "2MB");
        assert_eq!(g.hugepage_limits[0].limit, 4 << 20);
        // The same size spelled in Ki, and a zero limit for the node's other size.
        let k: Pod = serde_yaml::from_str("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: k, image: b, resources: {limits: {cpu: 1, memory: 1Gi, hugepages-2048Ki: 2Mi}}}]}").unwrap();
        let mut node = Settings::example();
        node.cgroup_policy.hugepage_sizes = vec![2 << 20, 1 << 30];
        let r = linux_resources(&node, &k, &k.spec.as_ref().unwrap().containers[0]);
        let limits: Vec<(String, u64)> = r
            .hugepage_limits
            .iter()
            .map(|h| (h.page_size.clone(), h.limit))
            .collect();
        assert_eq!(limits, vec![("1GB".into(), 0), ("2MB".into(), 2 << 20)]);
        // One page size written two ways is one limit, the sum (kubelet's `HugePageLimits`).
        let two: Pod = serde_yaml::from_str("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: k, image: b, resources: {limits: {cpu: 1, memory: 1Gi, hugepages-1Gi: 1Gi, hugepages-1073741824: 1Gi}}}]}").unwrap();
        let r = linux_resources(&node, &two, &two.spec.as_ref().unwrap().containers[0]);
        let limits: Vec<(String, u64)> = r
            .hugepage_limits
            .iter()
            .map(|h| (h.page_size.clone(), h.limit))
            .collect();
        assert_eq!(limits, vec![("1GB".into(), 2 << 30), ("2MB".into(), 0)]);
        let pod_cgroup = crate::cm::resources::pod_resource_config(&two, &node.cgroup_policy);
        assert_eq!(
            pod_cgroup.hugepage_limits,
            [("1GB".to_owned(), 2 << 30), ("2MB".to_owned(), 0)].into()
        );
        let b = linux_resources(&s, &p, &spec.containers[1]);
        assert_eq!(
            (b.cpu_shares, b.cpu_quota, b.memory_limit_in_bytes),
            (2, 0, 0)
        );
        // Pod-level limits bound a container without limits of its own; one with its own
        // keeps them.
        let pl: Pod = serde_yaml::from_str("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {resources: {limits: {cpu: 500m, memory: 256Mi}}, containers: [{name: free, image: b}, {name: own, image: b, resources: {limits: {memory: 64Mi}}}]}").unwrap();
        let cs = &pl.spec.as_ref().unwrap().containers;
        let free = linux_resources(&s, &pl, &cs[0]);
        assert_eq!(
            (free.cpu_quota, free.memory_limit_in_bytes),
            (50_000, 256 << 20)
        );
        let own = linux_resources(&s, &pl, &cs[1]);
        assert_eq!(
            (own.cpu_quota, own.memory_limit_in_bytes),
            (50_000, 64 << 20)
        );
        let cgroup = crate::cm::resources::pod_resource_config(&pl, &s.cgroup_policy);
        assert_eq!(
            (cgroup.cpu_quota, cgroup.memory_limit),
            (Some(50_000), Some(256 << 20)),
            "the pod cgroup has the pod-level limits (Guaranteed: requests default to them)"
        );
        // 1000 - 1000 * 2Gi / 8Gi.
        assert_eq!(b.oom_score_adj, 750);
        let mut off = Settings::example();
        off.cgroup_policy.cpu_cfs_quota = false;
        assert_eq!(linux_resources(&off, &p, &spec.containers[0]).cpu_quota, 0);
    }

    fn objects() -> crate::objects::LocalObjects {
        use crate::objects::{ObjectKind, ObjectRef};
        let o = crate::objects::LocalObjects::default();
        let r = |kind, name: &str| ObjectRef {
            kind,
            namespace: "ns".into(),
            name: name.into(),
        };
        let d = |kv: &[(&str, &str)]| {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .collect()
        };
        o.replace(
            [
                (
                    r(ObjectKind::ConfigMap, "cfg"),
                    d(&[("MODE", "fast"), ("bad=key", "x"), ("LEVEL", "3")]),
                ),
                (r(ObjectKind::Secret, "db"), d(&[("password", "s3cret")])),
            ]
            .into(),
        );
        o
    }

    #[test]
    fn env_from_objects_key_refs_and_resource_fields() {
        let p: Pod = serde_yaml::from_str(
            "metadata: {name: p, namespace: ns}
spec:
  containers:
  - name: c
    image: b
    resources: {requests: {cpu: 250m, memory: 64Mi}, limits: {memory: 128Mi}}
    envFrom: [{configMapRef: {name: cfg}, prefix: CFG_}, {secretRef: {name: gone, optional: true}}]
    env:
    - {name: PW, valueFrom: {secretKeyRef: {name: db, key: password}}}
    - {name: LEVEL, valueFrom: {configMapKeyRef: {name: cfg, key: LEVEL}}}
    - {name: MISSING, valueFrom: {configMapKeyRef: {name: cfg, key: nope, optional: true}}}
    - {name: CPU_M, valueFrom: {resourceFieldRef: {resource: requests.cpu, divisor: 1m}}}
    - {name: CPU, valueFrom: {resourceFieldRef: {resource: requests.cpu}}}
    - {name: MEM_MI, valueFrom: {resourceFieldRef: {resource: limits.memory, divisor: 1Mi}}}
    - {name: CPU_LIMIT, valueFrom: {resourceFieldRef: {resource: limits.cpu}}}
    - {name: URL, value: 'db://$(CFG_MODE)'}
",
        )
        .unwrap();
        let c = &p.spec.as_ref().unwrap().containers[0];
        let objects = objects();
        let env = make_env(
            &p,
            c,
            &Settings::example(),
            &[],
            &EnvSources {
                objects: &objects,
                services: &[],
            },
        )
        .unwrap();
        let names: Vec<(&str, &str)> = env
            .vars
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("CFG_LEVEL", "3"),
                ("CFG_MODE", "fast"),
                ("PW", "s3cret"),
                ("LEVEL", "3"),
                ("CPU_M", "250"),
                // 250m rounded up to whole cores; no cpu limit: the node's allocatable (2 cores).
                ("CPU", "1"),
                ("MEM_MI", "128"),
                ("CPU_LIMIT", "2"),
                ("URL", "db://fast"),
            ]
        );
        assert_eq!(env.skipped.len(), 1);
        assert!(env.skipped[0].contains("CFG_bad=key"), "{:?}", env.skipped);
    }

    #[test]
    fn missing_objects_and_keys_get_kubelets_messages_never_a_value() {
        let objects = objects();
        let cases = [
            (
                "{name: A, valueFrom: {secretKeyRef: {name: nope, key: k}}}",
                "secret \"nope\" not found",
            ),
            (
                "{name: A, valueFrom: {secretKeyRef: {name: db, key: user}}}",
                "couldn't find key user in Secret ns/db",
            ),
            (
                "{name: A, valueFrom: {configMapKeyRef: {name: cfg, key: X}}}",
                "couldn't find key X in ConfigMap ns/cfg",
            ),
        ];
        for (env, want) in cases {
            let p: Pod = serde_yaml::from_str(&format!(
                "metadata: {{name: p, namespace: ns}}\nspec: {{containers: [{{name: c, image: b, env: [{env}]}}]}}"
            ))
            .unwrap();
            let c = &p.spec.as_ref().unwrap().containers[0];
            let e = make_env(
                &p,
                c,
                &Settings::example(),
                &[],
                &EnvSources {
                    objects: &objects,
                    services: &[],
                },
            )
            .unwrap_err();
            assert_eq!(e.message, want);
            assert!(!e.to_string().contains("s3cret"));
        }
        let p: Pod = serde_yaml::from_str("metadata: {name: p, namespace: other}\nspec: {containers: [{name: c, image: b, envFrom: [{configMapRef: {name: cfg}}]}]}").unwrap();
        let c = &p.spec.as_ref().unwrap().containers[0];
        let e = make_env(
            &p,
            c,
            &Settings::example(),
            &[],
            &EnvSources {
                objects: &objects,
                services: &[],
            },
        )
        .unwrap_err();
        assert_eq!(
            e.message, "configmap \"cfg\" not found",
            "another namespace's object"
        );
    }
}
