//! A pod's and its containers' resource amounts, read from the spec and checked (kubelet's
//! resource helpers, `PodRequests` / `PodLimits`, and the API server's quantity validation):
//! cpu in millicores, memory and hugepages in bytes. A missing request defaults to the limit, as
//! the API's defaulting does. Shared by QoS, the container manager, admission and eviction.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::quantity::{parse_milli, parse_value};

/// A quantity in a container's resources that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("container {container}: field {field}: {message}")]
pub struct ResourceError {
    /// Container name.
    pub container: String,
    /// Field path, e.g. `resources.limits.memory`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

/// One container's effective cpu (millicores) and memory (bytes) requests and limits, and its
/// hugepage limits; a missing request defaults to the limit (the API's defaulting).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerAmounts {
    /// cpu request, millicores.
    pub cpu_request: i64,
    /// cpu limit, millicores (0: none).
    pub cpu_limit: i64,
    /// memory request, bytes.
    pub memory_request: i64,
    /// memory limit, bytes (0: none).
    pub memory_limit: i64,
    /// hugepage limits by size (`2Mi`), bytes.
    pub hugepages: BTreeMap<String, i64>,
}

fn amount(c: &Container, limits: bool, name: &str, milli: bool) -> Result<i64, ResourceError> {
    let map = c.resources.as_ref().and_then(|r| {
        if limits {
            r.limits.as_ref()
        } else {
            r.requests.as_ref()
        }
    });
    let Some(q) = map.and_then(|m| m.get(name)) else {
        return Ok(0);
    };
    let field = format!(
        "resources.{}.{name}",
        if limits { "limits" } else { "requests" }
    );
    let err = |message: String| ResourceError {
        container: c.name.clone(),
        field: field.clone(),
        message,
    };
    let v = if milli {
        parse_milli(&q.0)
    } else {
        parse_value(&q.0)
    }
    .map_err(|e| err(e.to_string()))?;
    if v < 0 {
        return Err(err(format!("{:?} must not be negative", q.0)));
    }
    i64::try_from(v).map_err(|_| err(format!("{:?} is too large", q.0)))
}

/// Reads and checks a container's cpu, memory and hugepage amounts.
///
/// Errors: [`ResourceError`] naming the container and field for a quantity that does not parse,
/// is negative or too large, or a request above its limit.
pub fn container_amounts(c: &Container) -> Result<ContainerAmounts, ResourceError> {
    let mut a = ContainerAmounts {
        cpu_limit: amount(c, true, "cpu", true)?,
        memory_limit: amount(c, true, "memory", false)?,
        cpu_request: amount(c, false, "cpu", true)?,
        memory_request: amount(c, false, "memory", false)?,
        hugepages: BTreeMap::new(),
    };
    let declared = |limits: bool, name: &str| {
        c.resources
            .as_ref()
            .and_then(|r| {
                if limits {
                    r.limits.as_ref()
                } else {
                    r.requests.as_ref()
                }
            })
            .is_some_and(|m| m.contains_key(name))
    };
    for (res, req, lim) in [
        ("cpu", &mut a.cpu_request, a.cpu_limit),
        ("memory", &mut a.memory_request, a.memory_limit),
    ] {
        if !declared(false, res) && declared(true, res) {
            *req = lim;
        } else if declared(true, res) && *req > lim {
            return Err(ResourceError {
                container: c.name.clone(),
                field: format!("resources.requests.{res}"),
                message: "must be less than or equal to the limit".into(),
            });
        }
    }
    let names: Vec<String> = c
        .resources
        .iter()
        .flat_map(|r| r.limits.iter().flatten())
        .map(|(k, _)| k.clone())
        .collect();
    for name in names {
        if let Some(size) = name.strip_prefix("hugepages-") {
            a.hugepages
                .insert(size.to_owned(), amount(c, true, &name, false)?);
        }
    }
    // Every other quantity must at least parse.
    for limits in [false, true] {
        let map = c.resources.as_ref().and_then(|r| {
            if limits {
                r.limits.as_ref()
            } else {
                r.requests.as_ref()
            }
        });
        for name in map.into_iter().flatten().map(|(k, _)| k) {
            amount(c, limits, name, true)?;
        }
    }
    Ok(a)
}

/// Checks every container's resources (the admission check of the pod's quantities).
///
/// Errors: the first [`ResourceError`], its field prefixed with the container list path.
pub fn validate_pod_resources(pod: &Pod) -> Result<(), ResourceError> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(());
    };
    for (list, cs) in [
        (
            "spec.initContainers",
            spec.init_containers.as_deref().unwrap_or(&[]),
        ),
        ("spec.containers", &spec.containers[..]),
    ] {
        for (i, c) in cs.iter().enumerate() {
            container_amounts(c).map_err(|e| ResourceError {
                field: format!("{list}[{i}].{}", e.field),
                ..e
            })?;
        }
    }
    Ok(())
}

/// A pod's effective requests or limits: for each resource, the larger of the sum over app
/// containers and the largest init container (kubelet's `PodRequests` / `PodLimits`; init
/// containers run one at a time). Unusable quantities count as zero; admission refuses them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodAmounts {
    /// cpu requests, millicores.
    pub cpu_request: i64,
    /// cpu limits, millicores.
    pub cpu_limit: i64,
    /// memory requests, bytes.
    pub memory_request: i64,
    /// memory limits, bytes.
    pub memory_limit: i64,
}

/// Computes [`PodAmounts`].
pub fn pod_amounts(pod: &Pod) -> PodAmounts {
    let Some(spec) = pod.spec.as_ref() else {
        return PodAmounts::default();
    };
    let get = |c: &Container| container_amounts(c).unwrap_or_default();
    let mut sum = PodAmounts::default();
    for a in spec.containers.iter().map(get) {
        // Saturating: each amount fits in an i64, their sum may not.
        sum.cpu_request = sum.cpu_request.saturating_add(a.cpu_request);
        sum.cpu_limit = sum.cpu_limit.saturating_add(a.cpu_limit);
        sum.memory_request = sum.memory_request.saturating_add(a.memory_request);
        sum.memory_limit = sum.memory_limit.saturating_add(a.memory_limit);
    }
    for a in spec.init_containers.iter().flatten().map(get) {
        sum.cpu_request = sum.cpu_request.max(a.cpu_request);
        sum.cpu_limit = sum.cpu_limit.max(a.cpu_limit);
        sum.memory_request = sum.memory_request.max(a.memory_request);
        sum.memory_limit = sum.memory_limit.max(a.memory_limit);
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::pods::with_spec as pod;

    #[test]
    fn bad_quantities_name_container_and_field() {
        for (res, field) in [
            (
                "{limits: {memory: lots}}",
                "spec.containers[0].resources.limits.memory",
            ),
            (
                "{requests: {cpu: '-1'}}",
                "spec.containers[0].resources.requests.cpu",
            ),
            (
                "{requests: {cpu: '2'}, limits: {cpu: '1'}}",
                "spec.containers[0].resources.requests.cpu",
            ),
            (
                "{limits: {hugepages-2Mi: x}}",
                "spec.containers[0].resources.limits.hugepages-2Mi",
            ),
            (
                "{requests: {ephemeral-storage: 1Q}}",
                "spec.containers[0].resources.requests.ephemeral-storage",
            ),
        ] {
            let p = pod(&format!(
                "{{containers: [{{name: web, image: i, resources: {res}}}]}}"
            ));
            let e = validate_pod_resources(&p).unwrap_err();
            assert_eq!(
                (e.container.as_str(), e.field.as_str()),
                ("web", field),
                "{res}"
            );
        }
    }
}
