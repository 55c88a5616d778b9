//! QoS class of a pod (kubelet's `pkg/apis/core/v1/helper/qos.GetPodQOS`).
//!
//! Guaranteed: every container, init containers included, has cpu and memory limits, and the
//! requests equal the limits (a missing request defaults to the limit; an explicit zero request
//! is a request of zero). BestEffort: no container has a non-zero cpu or memory request or limit.
//! Burstable: everything else. Also the
//! oom_score_adj policy by QoS class (kubelet's `pkg/kubelet/qos/policy.go`).

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::quantity::parse_milli;

/// The three QoS classes, spelled as in `status.qosClass`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QosClass {
    /// Requests equal limits for cpu and memory in every container.
    Guaranteed,
    /// Some requests or limits, not Guaranteed.
    Burstable,
    /// No cpu or memory requests or limits at all.
    BestEffort,
}

impl QosClass {
    /// The API spelling (`Guaranteed`, `Burstable`, `BestEffort`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Guaranteed => "Guaranteed",
            Self::Burstable => "Burstable",
            Self::BestEffort => "BestEffort",
        }
    }
}

/// A container's cpu or memory request or limit as the API server leaves it after defaulting:
/// an absent request is the limit, an explicit zero stays zero (millicores of the quantity).
fn amount(c: &Container, limits: bool, resource: &str) -> i128 {
    let Some(r) = c.resources.as_ref() else {
        return 0;
    };
    let value = |m: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >| {
        m.and_then(|m| m.get(resource)).map(|q| {
            // Unparsable quantities are refused at admission; here they count as zero.
            parse_milli(&q.0).unwrap_or(0)
        })
    };
    let limit = value(r.limits.as_ref());
    if limits {
        return limit.unwrap_or(0);
    }
    value(r.requests.as_ref()).or(limit).unwrap_or(0)
}

/// The pod's QoS class (kubelet's `GetPodQOS`): the cpu and memory requests and limits of all
/// containers (init containers included) are summed, counting only values above zero. No
/// request and no limit: BestEffort. Guaranteed when every container has cpu and memory
/// limits, the summed requests equal the summed limits for each resource requested, and the
/// same resources are requested as limited. Burstable otherwise. `spec.overhead` does not count.
///
/// A pod with pod-level resources ([`crate::resources::pod_level_resources`]) is classed by
/// them alone (kubelet's `ComputePodQOS` with PodLevelResources): BestEffort without a non-zero
/// pod-level request or limit, Guaranteed with cpu and memory limits that equal the requests,
/// Burstable otherwise.
pub fn pod_qos_class(pod: &Pod) -> QosClass {
    let Some(spec) = pod.spec.as_ref() else {
        return QosClass::BestEffort;
    };
    if let Some(pl) = crate::resources::pod_level_resources(pod) {
        let positive = |v: Option<i64>| v.filter(|v| *v > 0);
        let requests = [positive(pl.cpu_request), positive(pl.memory_request)];
        let limits = [positive(pl.cpu_limit), positive(pl.memory_limit)];
        if requests.iter().chain(&limits).all(Option::is_none) {
            return QosClass::BestEffort;
        }
        let guaranteed = limits.iter().all(Option::is_some) && requests == limits;
        return if guaranteed {
            QosClass::Guaranteed
        } else {
            QosClass::Burstable
        };
    }
    let all = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter());
    let (mut requests, mut limits) = (
        std::collections::BTreeMap::<&str, i128>::new(),
        std::collections::BTreeMap::<&str, i128>::new(),
    );
    let mut guaranteed = true;
    for c in all {
        let mut limited = 0;
        for res in ["cpu", "memory"] {
            let req = amount(c, false, res);
            if req > 0 {
                *requests.entry(res).or_default() += req;
            }
            let lim = amount(c, true, res);
            if lim > 0 {
                *limits.entry(res).or_default() += lim;
                limited += 1;
            }
        }
        guaranteed &= limited == 2;
    }
    if requests.is_empty() && limits.is_empty() {
        return QosClass::BestEffort;
    }
    guaranteed &= requests.iter().all(|(r, v)| limits.get(r) == Some(v));
    if guaranteed && requests.len() == limits.len() {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

/// oom_score_adj of the agent itself (`oomScoreAdj` default).
pub const KUBELET_OOM_SCORE_ADJ: i64 = -999;
/// oom_score_adj of pod sandboxes (pause).
pub const SANDBOX_OOM_SCORE_ADJ: i64 = -998;
/// oom_score_adj of Guaranteed and node-critical containers (-997 in current kubelet; releases
/// before v1.28 used -998).
pub const GUARANTEED_OOM_SCORE_ADJ: i64 = -997;
/// oom_score_adj of BestEffort containers.
pub const BESTEFFORT_OOM_SCORE_ADJ: i64 = 1000;
/// Priority from which a pod is critical (`scheduling.SystemCriticalPriority`).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// The pod's priority: `spec.priority`, else resolved from the built-in priority classes
/// (`system-node-critical` 2000001000, `system-cluster-critical` 2000000000), else 0.
pub fn pod_priority(pod: &Pod) -> i32 {
    let spec = pod.spec.as_ref();
    if let Some(p) = spec.and_then(|s| s.priority) {
        return p;
    }
    match spec.and_then(|s| s.priority_class_name.as_deref()) {
        Some("system-node-critical") => SYSTEM_CRITICAL_PRIORITY + 1000,
        Some("system-cluster-critical") => SYSTEM_CRITICAL_PRIORITY,
        _ => 0,
    }
}

/// True for a node-critical pod (kubelet's `IsNodeCriticalPod`): priorityClassName
/// `system-node-critical` with a critical priority (≥ 2000000000, which the class resolves to
/// unless `spec.priority` says otherwise). The same rule as eviction's critical pods, so a pod
/// never gets the node-critical oom_score_adj while eviction treats it as ordinary.
pub fn is_node_critical(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.priority_class_name.as_deref())
        == Some("system-node-critical")
        && pod_priority(pod) >= SYSTEM_CRITICAL_PRIORITY
}

/// The oom_score_adj kubelet gives a container (`GetContainerOOMScoreAdjust` in
/// `pkg/kubelet/qos/policy.go`): node-critical and Guaranteed -997, BestEffort 1000, Burstable
/// `1000 - 1000 * memoryRequest / memoryCapacity`, raised to at least 3 (1000 + -997) and, if it
/// came out 1000, lowered to 999 so that BestEffort is always killed first. A sidecar (an init
/// container with `restartPolicy: Always`) gets no more than the score of the regular container
/// with the smallest non-zero memory request, so it is not killed before the containers it
/// serves. `memory_capacity` is the node's memory in bytes.
pub fn container_oom_score_adj(pod: &Pod, container: &Container, memory_capacity: i64) -> i64 {
    if is_node_critical(pod) {
        return GUARANTEED_OOM_SCORE_ADJ;
    }
    match pod_qos_class(pod) {
        QosClass::Guaranteed => GUARANTEED_OOM_SCORE_ADJ,
        QosClass::BestEffort => BESTEFFORT_OOM_SCORE_ADJ,
        QosClass::Burstable => {
            let request = crate::resources::container_amounts(container)
                .map(|a| a.memory_request)
                .unwrap_or(0);
            let capacity = memory_capacity.max(1);
            let score = |request: i64| {
                1000 - i64::try_from(1000 * i128::from(request) / i128::from(capacity))
                    .unwrap_or(i64::MAX)
            };
            let mut adj = score(request);
            let sidecar = container.restart_policy.as_deref() == Some("Always")
                && pod.spec.as_ref().is_some_and(|s| {
                    s.init_containers
                        .iter()
                        .flatten()
                        .any(|c| c.name == container.name)
                });
            if sidecar {
                let min_regular = pod
                    .spec
                    .iter()
                    .flat_map(|s| s.containers.iter())
                    .filter_map(|c| crate::resources::container_amounts(c).ok())
                    .map(|a| a.memory_request)
                    .filter(|r| *r > 0)
                    .min();
                if let Some(r) = min_regular {
                    adj = adj.min(score(r));
                }
            }
            if adj < 1000 + GUARANTEED_OOM_SCORE_ADJ {
                1000 + GUARANTEED_OOM_SCORE_ADJ
            } else if adj == BESTEFFORT_OOM_SCORE_ADJ {
                adj - 1
            } else {
                adj
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(containers: &str) -> Pod {
        serde_yaml::from_str(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec: {{containers: {containers}}}"
        ))
        .unwrap()
    }

    #[test]
    fn classes_follow_kubelet() {
        let cases = [
            ("[{name: a, image: i}]", QosClass::BestEffort),
            ("[{name: a, image: i, resources: {requests: {cpu: '0'}}}]", QosClass::BestEffort),
            ("[{name: a, image: i, resources: {limits: {cpu: '1', memory: 1Gi}}}]", QosClass::Guaranteed),
            ("[{name: a, image: i, resources: {limits: {cpu: '1', memory: 1Gi}, requests: {cpu: 1000m, memory: 1Gi}}}]", QosClass::Guaranteed),
            ("[{name: a, image: i, resources: {limits: {cpu: '1', memory: 1Gi}, requests: {cpu: 500m}}}]", QosClass::Burstable),
            ("[{name: a, image: i, resources: {requests: {memory: 1Gi}}}]", QosClass::Burstable),
            ("[{name: a, image: i, resources: {limits: {cpu: '1', memory: 1Gi}}}, {name: b, image: i}]", QosClass::Burstable),
        ];
        for (c, want) in cases {
            assert_eq!(pod_qos_class(&pod(c)), want, "{c}");
        }
    }

    #[test]
    fn a_sidecar_scores_no_higher_than_the_regular_container_with_the_smallest_request() {
        let p: Pod = serde_yaml::from_str(
            "metadata: {name: p}\nspec: {initContainers: [{name: side, image: i, restartPolicy: Always, resources: {requests: {memory: '500000000'}}}], containers: [{name: app, image: i, resources: {requests: {memory: '2000000000'}}}]}",
        )
        .unwrap();
        let spec = p.spec.as_ref().unwrap();
        let cap = 10_000_000_000;
        assert_eq!(container_oom_score_adj(&p, &spec.containers[0], cap), 800);
        let side = &spec.init_containers.as_ref().unwrap()[0];
        assert_eq!(container_oom_score_adj(&p, side, cap), 800, "not 950");
    }

    #[test]
    fn oom_score_adj_follows_kubelet() {
        const GI: i64 = 1 << 30;
        let cap = 8 * GI;
        let cases = [
            ("[{name: a, image: i}]", 1000),
            (
                "[{name: a, image: i, resources: {limits: {cpu: '1', memory: 1Gi}}}]",
                -997,
            ),
            // Burstable: 1000 - 1000 * 2Gi / 8Gi = 750.
            (
                "[{name: a, image: i, resources: {requests: {memory: 2Gi}}}]",
                750,
            ),
            // A tiny request rounds to 1000, lowered to 999 below BestEffort.
            (
                "[{name: a, image: i, resources: {requests: {cpu: 100m}}}]",
                999,
            ),
            // A request at or above capacity is clamped to 3.
            (
                "[{name: a, image: i, resources: {requests: {memory: 8Gi}}}]",
                3,
            ),
            (
                "[{name: a, image: i, resources: {requests: {memory: 16Gi}}}]",
                3,
            ),
        ];
        for (c, want) in cases {
            let p = pod(c);
            let container = &p.spec.as_ref().unwrap().containers[0];
            assert_eq!(container_oom_score_adj(&p, container, cap), want, "{c}");
        }
        // Node-critical static pods get the Guaranteed score whatever their QoS.
        let p: Pod = serde_yaml::from_str("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {priorityClassName: system-node-critical, containers: [{name: a, image: i}]}").unwrap();
        assert_eq!(
            container_oom_score_adj(&p, &p.spec.as_ref().unwrap().containers[0], cap),
            -997
        );
        assert_eq!(pod_priority(&p), 2_000_001_000);
        // The class with a non-critical spec.priority is not node-critical (nor critical for
        // eviction): BestEffort's 1000.
        let p: Pod = serde_yaml::from_str("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {priorityClassName: system-node-critical, priority: 0, containers: [{name: a, image: i}]}").unwrap();
        assert!(!is_node_critical(&p));
        assert_eq!(
            container_oom_score_adj(&p, &p.spec.as_ref().unwrap().containers[0], cap),
            1000
        );
        // Cluster-critical BestEffort keeps 1000.
        let p: Pod = serde_yaml::from_str("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {priorityClassName: system-cluster-critical, containers: [{name: a, image: i}]}").unwrap();
        assert_eq!(
            container_oom_score_adj(&p, &p.spec.as_ref().unwrap().containers[0], cap),
            1000
        );
    }
}
