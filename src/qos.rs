//! QoS class of a pod (kubelet's `pkg/apis/core/v1/helper/qos.GetPodQOS`).
//!
//! Guaranteed: every container, init containers included, has cpu and memory limits, and its
//! requests equal its limits (a missing request defaults to the limit). BestEffort: no container
//! has a non-zero cpu or memory request or limit. Burstable: everything else.

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

fn amount(c: &Container, limits: bool, resource: &str) -> Option<i128> {
    let r = c.resources.as_ref()?;
    let map = if limits {
        r.limits.as_ref()
    } else {
        r.requests.as_ref()
    }?;
    // Unparsable quantities are refused at admission; here they count as absent.
    map.get(resource)
        .and_then(|q| parse_milli(&q.0).ok())
        .filter(|v| *v != 0)
}

/// The pod's QoS class.
pub fn pod_qos_class(pod: &Pod) -> QosClass {
    let Some(spec) = pod.spec.as_ref() else {
        return QosClass::BestEffort;
    };
    let all = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter());
    let mut any = false;
    let mut guaranteed = true;
    for c in all {
        for res in ["cpu", "memory"] {
            let (req, lim) = (amount(c, false, res), amount(c, true, res));
            any |= req.is_some() || lim.is_some();
            match lim {
                Some(l) if req.is_none_or(|r| r == l) => {}
                _ => guaranteed = false,
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => QosClass::BestEffort,
        (true, true) => QosClass::Guaranteed,
        (true, false) => QosClass::Burstable,
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
}
