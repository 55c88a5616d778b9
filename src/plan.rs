//! `nodelet plan`: what nodelet would do with each manifest on this node, without touching the
//! runtime or the cgroup tree — QoS class, pod cgroup path and values, and per container the CRI
//! resources and oom_score_adj. Manifests are decoded and validated exactly as the running agent
//! does, so a bad manifest gets the same error.

use std::path::PathBuf;

use serde::Serialize;

use crate::cm::resources::{pod_resource_config, NodeResources, ResourceConfig};
use crate::cm::{ContainerManager, NodeConfig};
use crate::config::KubeletConfiguration;
use crate::kuberuntime::container::linux_resources;
use crate::kuberuntime::Settings;
use crate::qos::pod_qos_class;
use crate::source::manifest::decode_static_pod;

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
    pod_cgroup: Option<CgroupPlan>,
    containers: Vec<ContainerPlan>,
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

/// The plan for `manifests` on node `node_name` with `capacity`, as YAML, and the errors of the
/// manifests that were refused (one message each, as the agent reports them).
pub fn plan(
    config: &KubeletConfiguration,
    node_name: &str,
    capacity: NodeResources,
    manifests: &[PathBuf],
) -> (String, Vec<String>) {
    let node = NodeConfig::from_config(config, capacity);
    let layout = node.layout.clone();
    let policy = node.policy;
    // The manager computes values only; its cgroup writer is never called here.
    let cm = ContainerManager::new(
        std::sync::Arc::new(crate::cm::cgroupfs::Cgroupfs::new(Default::default())),
        node,
    );
    let mut settings = Settings::example();
    settings.node_name = node_name.to_owned();
    settings.cgroup_policy = policy;
    settings.memory_capacity = capacity.memory;
    let mut errors = Vec::new();
    if let Err(e) = cm.validate_reservations() {
        errors.push(e.to_string());
    }
    let mut out = NodePlan {
        node: node_name.to_owned(),
        capacity: capacity.into(),
        allocatable: cm.allocatable().into(),
        kubepods: layout.per_qos.then(|| CgroupPlan {
            path: layout.spell(&layout.kubepods()),
            values: cm.kubepods_config(),
        }),
        pods: Vec::new(),
    };
    for path in manifests {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) => {
                errors.push(format!("manifest {}: cannot read: {e}", path.display()));
                continue;
            }
        };
        let abs = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
        let pod = match decode_static_pod(&abs, &bytes, node_name) {
            Ok(p) => p,
            Err(e) => {
                errors.push(e.to_string());
                continue;
            }
        };
        let uid = crate::pod::pod_uid(&pod).to_owned();
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
            containers,
        });
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
        let (yaml, errors) = plan(&KubeletConfiguration::default(), "n1", cap, &[m, bad]);
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
        assert_eq!(v["kubepods"]["cpuShares"].as_u64(), Some(4096));
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].contains("bad.yaml") && errors[0].contains("resources.limits.memory"),
            "{}",
            errors[0]
        );
    }
}
