//! `nodelet plan`: what nodelet would do with each manifest on this node, without touching the
//! runtime or the cgroup tree — QoS class, pod cgroup path and values, and per container the CRI
//! resources and oom_score_adj — and whether the agent's admission would take each pod, given
//! the manifests before it (in the order given) as the pods already running, and why not.
//! Manifests are decoded and validated exactly as the running agent does, so a bad manifest gets
//! the same error. The pressure check of admission depends on the live node and is not planned.

use std::path::PathBuf;

use serde::Serialize;

use crate::cm::resources::{pod_resource_config, NodeResources, ResourceConfig};
use crate::cm::ContainerManager;
use crate::config::Config;
use crate::kuberuntime::container::linux_resources;
use crate::kuberuntime::Settings;
use crate::qos::pod_qos_class;
use crate::quantity::{parse_amount, Scale};
use crate::source::manifest::decode_manifest;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NodePlan {
    node: String,
    capacity: Amounts,
    allocatable: Amounts,
    kubepods: Option<CgroupPlan>,
    pods: Vec<PodPlan>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Amounts {
    cpu_millicores: i64,
    memory_bytes: i64,
}

impl From<NodeResources> for Amounts {
    fn from(r: NodeResources) -> Self {
        Self {
            cpu_millicores: r.cpu_milli,
            memory_bytes: r.memory,
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CgroupPlan {
    path: String,
    #[serde(flatten)]
    values: ResourceConfig,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PodPlan {
    manifest: String,
    name: String,
    namespace: String,
    uid: String,
    qos_class: &'static str,
    admission: AdmissionPlan,
    pod_cgroup: Option<CgroupPlan>,
    containers: Vec<ContainerPlan>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AdmissionPlan {
    admitted: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
}

/// The node a plan is for: its name, its labels beyond kubelet's own (`--node-labels`), its
/// cpu and memory capacity, and its ephemeral storage and hugepages.
#[derive(Debug, Clone)]
pub struct PlanNode {
    /// Node name.
    pub name: String,
    /// `--node-labels`.
    pub labels: std::collections::BTreeMap<String, String>,
    /// cpu (millicores), memory (bytes), pids.
    pub capacity: NodeResources,
    /// Ephemeral storage (bytes) and hugepages (bytes by page size).
    pub extra: crate::admission::node_resources::ExtraCapacity,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ContainerPlan {
    name: String,
    init: bool,
    cpu_shares: i64,
    cpu_quota: i64,
    cpu_period: i64,
    memory_limit_in_bytes: i64,
    oom_score_adj: i64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    hugepage_limits: Vec<String>,
}

/// A `--node-memory` or `--node-cpu` value that cannot be a capacity (a positive quantity that
/// fits in an `i64` of bytes or millicores).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{flag} {value:?}: {reason}")]
pub struct CapacityFlagError {
    /// The flag, `--node-memory` or `--node-cpu`.
    pub flag: &'static str,
    /// The value given.
    pub value: String,
    /// Why it cannot be used.
    pub reason: String,
}

/// The node capacity to plan for: `detected` with `--node-memory` (bytes) and `--node-cpu`
/// (millicores) replacing its memory and cpu when given.
///
/// Errors: [`CapacityFlagError`] naming the flag when a value is not a quantity, is not
/// positive, or does not fit in an `i64` of its unit (`--node-cpu 1e17` is 1e20 millicores).
pub fn capacity_from_flags(
    detected: NodeResources,
    memory: Option<&str>,
    cpu: Option<&str>,
) -> Result<NodeResources, CapacityFlagError> {
    let mut capacity = detected;
    for (flag, value, scale) in [
        ("--node-memory", memory, Scale::Whole),
        ("--node-cpu", cpu, Scale::Milli),
    ] {
        let Some(value) = value else { continue };
        let err = |reason: String| CapacityFlagError {
            flag,
            value: value.to_owned(),
            reason,
        };
        let amount = parse_amount(value, scale).map_err(|e| err(e.to_string()))?;
        if amount == 0 {
            return Err(err("must be more than 0".into()));
        }
        match scale {
            Scale::Milli => capacity.cpu_milli = amount,
            Scale::Whole => capacity.memory = amount,
        }
    }
    Ok(capacity)
}

/// The plan for `manifests` on `plan_node`, as YAML, and the errors of the manifests that could
/// not be decoded (one message each, as the agent reports them). A pod that admission would
/// refuse is planned with its reason and message, and is not counted as running for the next.
pub fn plan(config: &Config, plan_node: &PlanNode, manifests: &[PathBuf]) -> (String, Vec<String>) {
    let node_name = plan_node.name.as_str();
    let capacity = plan_node.capacity;
    let mut node = config.node_config(capacity);
    node.policy.hugepage_sizes = crate::cm::hugepage_sizes();
    let layout = node.layout.clone();
    let policy = node.policy.clone();
    // The manager computes values only; its cgroup writer is never called here.
    let cm = ContainerManager::new(
        std::sync::Arc::new(crate::cm::cgroupfs::Cgroupfs::new(Default::default())),
        node,
    );
    let mut settings = Settings::example();
    settings.node_name = node_name.to_owned();
    settings.cgroup_policy = policy.clone();
    settings.memory_capacity = capacity.memory;
    let mut errors = Vec::new();
    if let Err(e) = cm.validate_reservations() {
        errors.push(e.to_string());
    }
    let identity = crate::admission::node_affinity::NodeIdentity::new(node_name, &plan_node.labels);
    let allocatable = crate::admission::node_resources::Allocatable::new(
        capacity,
        &plan_node.extra,
        cm.reserved(),
        &config.eviction.thresholds,
        config.max_pods,
    );
    let mut admitted: Vec<k8s_openapi::api::core::v1::Pod> = Vec::new();
    let requests = crate::admission::node_resources::Requests::default();
    let mut out = NodePlan {
        node: node_name.to_owned(),
        capacity: capacity.into(),
        // kubelet's node allocatable (what admission counts against): the reservations and the
        // hard eviction thresholds taken off; the kubepods cgroup below takes only the former.
        allocatable: Amounts {
            cpu_millicores: allocatable.cpu_milli,
            memory_bytes: allocatable.memory,
        },
        kubepods: layout.per_qos.then(|| CgroupPlan {
            path: layout.spell(&layout.kubepods()),
            values: cm.kubepods_config(),
        }),
        pods: Vec::new(),
    };
    for path in manifests {
        // Read as the agent reads staticPodPath: regular files of at most 4 MiB.
        let bytes = match crate::source::file::read_manifest(path) {
            Ok(Some(b)) => b,
            Ok(None) if path.exists() => {
                errors.push(format!(
                    "manifest {}: cannot read: not a regular file (nodelet reads only regular files)",
                    path.display()
                ));
                continue;
            }
            Ok(None) => {
                errors.push(format!(
                    "manifest {}: cannot read: No such file or directory",
                    path.display()
                ));
                continue;
            }
            Err(e) => {
                errors.push(format!("manifest {}: cannot read: {e}", path.display()));
                continue;
            }
        };
        let abs = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
        // A file of ConfigMaps and Secrets alone defines no pod to plan (their values are never
        // shown).
        let pod = match decode_manifest(&abs, &bytes, node_name) {
            Ok(m) => match m.pod {
                Some(p) => p,
                None => continue,
            },
            Err(e) => {
                errors.push(e.to_string());
                continue;
            }
        };
        let uid = crate::pod::pod_uid(&pod).to_owned();
        let running: Vec<&k8s_openapi::api::core::v1::Pod> = admitted.iter().collect();
        let rejection = crate::admission::admit_on_node(
            &pod,
            &running,
            &identity,
            &allocatable,
            &config.allowed_unsafe_sysctls,
            &requests,
        );
        let admission = AdmissionPlan {
            admitted: rejection.is_none(),
            reason: rejection.as_ref().map(|r| r.reason.clone()),
            message: rejection.as_ref().map(|r| r.status_message()),
        };
        let qos = pod_qos_class(&pod);
        let spec = pod.spec.clone().unwrap_or_default();
        let containers = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| (c, true))
            .chain(spec.containers.iter().map(|c| (c, false)))
            .map(|(c, init)| {
                let r = linux_resources(&settings, &pod, c);
                ContainerPlan {
                    name: c.name.clone(),
                    init,
                    cpu_shares: r.cpu_shares,
                    cpu_quota: r.cpu_quota,
                    cpu_period: r.cpu_period,
                    memory_limit_in_bytes: r.memory_limit_in_bytes,
                    oom_score_adj: r.oom_score_adj,
                    hugepage_limits: r
                        .hugepage_limits
                        .iter()
                        .map(|h| format!("{}={}", h.page_size, h.limit))
                        .collect(),
                }
            })
            .collect();
        out.pods.push(PodPlan {
            manifest: abs.display().to_string(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            pod_cgroup: Some(CgroupPlan {
                path: layout.pod_cgroup_parent(&uid, qos),
                values: if layout.per_qos {
                    pod_resource_config(&pod, &policy)
                } else {
                    ResourceConfig::default()
                },
            }),
            uid,
            qos_class: qos.as_str(),
            admission,
            containers,
        });
        if rejection.is_none() {
            admitted.push(pod);
        }
    }
    (serde_yaml::to_string(&out).unwrap_or_default(), errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_shows_qos_cgroup_and_container_values() {
        let dir = tempfile::tempdir().unwrap();
        let m = dir.path().join("b.yaml");
        std::fs::write(&m, "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec: {containers: [{name: c, image: busybox, resources: {requests: {cpu: 250m, memory: 1Gi}}}]}\n").unwrap();
        let bad = dir.path().join("bad.yaml");
        std::fs::write(&bad, "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: c, image: b, resources: {limits: {memory: lots}}}]}\n").unwrap();
        let cap = NodeResources {
            cpu_milli: 4000,
            memory: 4 << 30,
            pids: 0,
        };
        let config = crate::config::KubeletConfiguration::default()
            .to_config(std::path::Path::new("default"))
            .unwrap();
        let node = PlanNode {
            name: "n1".into(),
            labels: Default::default(),
            capacity: cap,
            extra: Default::default(),
        };
        let (yaml, errors) = plan(&config, &node, &[m, bad]);
        let v: serde_yaml::Value = serde_yaml::from_str(&yaml).unwrap();
        let pod = &v["pods"][0];
        assert_eq!(pod["name"].as_str(), Some("web-n1"));
        assert_eq!(pod["qosClass"].as_str(), Some("Burstable"));
        assert!(pod["podCgroup"]["path"]
            .as_str()
            .unwrap()
            .starts_with("/kubepods/burstable/pod"));
        assert_eq!(pod["podCgroup"]["cpuShares"].as_u64(), Some(256));
        assert_eq!(pod["containers"][0]["oomScoreAdj"].as_i64(), Some(750));
        assert_eq!(pod["admission"]["admitted"].as_bool(), Some(true));
        assert_eq!(v["kubepods"]["cpuShares"].as_u64(), Some(4096));
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].contains("bad.yaml") && errors[0].contains("resources.limits.memory"),
            "{}",
            errors[0]
        );
    }

    #[test]
    fn capacity_flags_must_be_positive_and_fit() {
        let detected = NodeResources {
            cpu_milli: 2000,
            memory: 1 << 30,
            pids: 100,
        };
        let got = capacity_from_flags(detected, Some("16Gi"), Some("3500m")).unwrap();
        assert_eq!(
            got,
            NodeResources {
                cpu_milli: 3500,
                memory: 16 << 30,
                pids: 100
            }
        );
        assert_eq!(capacity_from_flags(detected, None, None), Ok(detected));
        for (memory, cpu, flag, reason) in [
            (
                None,
                Some("1e17"),
                "--node-cpu",
                "at most 9223372036854775807m",
            ),
            (None, Some("9223372036854776"), "--node-cpu", "at most"),
            (None, Some("0"), "--node-cpu", "more than 0"),
            (None, Some("-2"), "--node-cpu", "negative"),
            (Some("8Ei"), None, "--node-memory", "too large"),
            (Some("lots"), None, "--node-memory", "does not parse"),
        ] {
            let e = capacity_from_flags(detected, memory, cpu).unwrap_err();
            assert_eq!(e.flag, flag, "{e}");
            assert!(e.to_string().contains(reason), "{e}");
        }
    }
}
