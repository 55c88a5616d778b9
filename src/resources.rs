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
    /// ephemeral-storage request, bytes (defaults to the limit as cpu and memory do).
    pub ephemeral_storage_request: i64,
    /// ephemeral-storage limit, bytes (0: none).
    pub ephemeral_storage_limit: i64,
    /// hugepage limits, bytes, by page size in bytes (`hugepages-2Mi` and `hugepages-2048Ki`
    /// are the same size: 2097152).
    pub hugepages: BTreeMap<u64, i64>,
}

/// The page size of a `hugepages-<size>` resource name, bytes (kubelet's
/// `HugePageSizeFromResourceName`); `None` for other names.
///
/// Errors: a message when the size is not a positive quantity.
pub fn hugepage_size(resource: &str) -> Option<Result<u64, String>> {
    let size = resource.strip_prefix("hugepages-")?;
    Some(
        parse_value(size)
            .ok()
            .and_then(|v| u64::try_from(v).ok())
            .filter(|v| *v > 0)
            .ok_or_else(|| format!("{size:?} is not a hugepage size")),
    )
}

/// A page size in the kernel's and CRI's spelling (kubelet's `HugePageUnitSizeFromByteSize`):
/// the largest unit of B, KB, MB, GB, TB, PB that divides it (2097152 → `2MB`, 1073741824 →
/// `1GB`); `None` for a size that does not divide into units of at most 1024.
pub fn hugepage_unit_size(bytes: u64) -> Option<String> {
    const UNITS: [&str; 6] = ["B", "KB", "MB", "GB", "TB", "PB"];
    let (mut size, mut idx) = (bytes, 0);
    while size % 1024 == 0 && size > 0 && idx < UNITS.len() - 1 {
        size /= 1024;
        idx += 1;
    }
    (size <= 1024 || idx == UNITS.len() - 1).then(|| format!("{size}{}", UNITS[idx]))
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
    // The field's name is spelt out only for an error: admission sums every admitted pod's
    // amounts for each new pod.
    let err = |message: String| ResourceError {
        container: c.name.clone(),
        field: format!(
            "resources.{}.{name}",
            if limits { "limits" } else { "requests" }
        ),
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
        ephemeral_storage_request: amount(c, false, "ephemeral-storage", false)?,
        ephemeral_storage_limit: amount(c, true, "ephemeral-storage", false)?,
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
        (
            "ephemeral-storage",
            &mut a.ephemeral_storage_request,
            a.ephemeral_storage_limit,
        ),
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
    // Hugepages cannot be overcommitted: a request needs a limit, and they must be equal (the
    // API server's "Limit must be set for non overcommitable resources").
    for (name, q) in c
        .resources
        .iter()
        .flat_map(|r| r.requests.iter().flatten())
        .filter(|(k, _)| k.starts_with("hugepages-"))
    {
        let limit = c
            .resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get(name));
        let same = limit.is_some_and(|l| parse_value(&l.0).ok() == parse_value(&q.0).ok());
        if !same {
            return Err(ResourceError {
                container: c.name.clone(),
                field: format!("resources.requests.{name}"),
                message:
                    "a limit must be set for non overcommitable resources, equal to the request"
                        .into(),
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
        if let Some(size) = hugepage_size(&name) {
            let size = size.map_err(|message| ResourceError {
                container: c.name.clone(),
                field: format!("resources.limits.{name}"),
                message,
            })?;
            let v = amount(c, true, &name, false)?;
            let e = a.hugepages.entry(size).or_insert(0);
            *e = e.saturating_add(v);
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

/// A pod's own `spec.resources` (kubelet's PodLevelResources, beta and on by default as from
/// 1.34): cpu in millicores, memory in bytes, after the API server's defaulting (a pod-level
/// request absent beside a pod-level limit is that limit, `defaultPodRequests`). `None` where
/// the pod level says nothing of a resource. Where it says something, it replaces the sum of
/// the containers in the pod's requests and limits ([`pod_amounts`], kubelet's
/// `PodRequests`/`PodLimits`), decides the QoS class ([`crate::qos::pod_qos_class`]), bounds
/// the pod cgroup, and bounds each container that has no limit of its own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodLevelResources {
    /// cpu request, millicores.
    pub cpu_request: Option<i64>,
    /// cpu limit, millicores.
    pub cpu_limit: Option<i64>,
    /// memory request, bytes.
    pub memory_request: Option<i64>,
    /// memory limit, bytes.
    pub memory_limit: Option<i64>,
}

/// The resources nodelet takes at pod level (the API also takes hugepages there as from 1.34;
/// nodelet refuses a pod that sets them, rather than run it without that bound).
pub const POD_LEVEL_RESOURCES: [&str; 2] = ["cpu", "memory"];

/// The pod's [`PodLevelResources`]; `None` when `spec.resources` sets neither cpu nor memory
/// (kubelet's `IsPodLevelResourcesSet`). Unusable quantities count as absent; validation
/// refuses them ([`validate_pod_resources`]).
pub fn pod_level_resources(pod: &Pod) -> Option<PodLevelResources> {
    let r = pod.spec.as_ref()?.resources.as_ref()?;
    let get = |limits: bool, name: &str| {
        let map = if limits {
            r.limits.as_ref()
        } else {
            r.requests.as_ref()
        }?;
        let q = map.get(name)?;
        let v = if name == "cpu" {
            parse_milli(&q.0)
        } else {
            parse_value(&q.0)
        }
        .ok()?;
        i64::try_from(v).ok().filter(|v| *v >= 0)
    };
    let (cpu_limit, memory_limit) = (get(true, "cpu"), get(true, "memory"));
    let pl = PodLevelResources {
        cpu_request: get(false, "cpu").or(cpu_limit),
        cpu_limit,
        memory_request: get(false, "memory").or(memory_limit),
        memory_limit,
    };
    (pl != PodLevelResources::default()).then_some(pl)
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
    validate_pod_level(pod)?;
    for (name, q) in spec.overhead.iter().flatten() {
        let err = |message: String| ResourceError {
            container: String::new(),
            field: format!("spec.overhead.{name}"),
            message,
        };
        let v = if name == "cpu" {
            parse_milli(&q.0)
        } else {
            parse_value(&q.0)
        }
        .map_err(|e| err(e.to_string()))?;
        if v < 0 || i64::try_from(v).is_err() {
            return Err(err(format!(
                "{:?} must be 0 or more and fit in 64 bits",
                q.0
            )));
        }
    }
    Ok(())
}

/// The API server's checks of `spec.resources` (`validatePodResources`, with what nodelet
/// supports): only cpu and memory; quantities that parse and are not negative; a request no
/// larger than its limit; pod-level requests at least the containers' aggregate request, and
/// no container limit above the pod-level limit.
///
/// Errors: a [`ResourceError`] naming the `spec.resources` field.
fn validate_pod_level(pod: &Pod) -> Result<(), ResourceError> {
    let Some(r) = pod.spec.as_ref().and_then(|s| s.resources.as_ref()) else {
        return Ok(());
    };
    let err = |field: String, message: String| ResourceError {
        container: String::new(),
        field,
        message,
    };
    for (kind, map) in [("requests", &r.requests), ("limits", &r.limits)] {
        for (name, q) in map.iter().flatten() {
            let field = format!("spec.resources.{kind}.{name}");
            if !POD_LEVEL_RESOURCES.contains(&name.as_str()) {
                return Err(err(
                    field,
                    "only cpu and memory may be set at pod level (nodelet does not apply other pod-level resources, and refuses the pod rather than run it without them)".into(),
                ));
            }
            let v = if name == "cpu" {
                parse_milli(&q.0)
            } else {
                parse_value(&q.0)
            }
            .map_err(|e| err(field.clone(), e.to_string()))?;
            if v < 0 || i64::try_from(v).is_err() {
                return Err(err(
                    field,
                    format!("{:?} must be 0 or more and fit in 64 bits", q.0),
                ));
            }
        }
    }
    let Some(pl) = pod_level_resources(pod) else {
        return Ok(());
    };
    let containers = pod_amounts_of_containers(pod);
    for (name, req, lim, aggr_req) in [
        ("cpu", pl.cpu_request, pl.cpu_limit, containers.cpu_request),
        (
            "memory",
            pl.memory_request,
            pl.memory_limit,
            containers.memory_request,
        ),
    ] {
        if let (Some(req), Some(lim)) = (req, lim) {
            if req > lim {
                return Err(err(
                    format!("spec.resources.requests.{name}"),
                    "must be less than or equal to the pod-level limit".into(),
                ));
            }
        }
        if req.is_some_and(|req| req < aggr_req) {
            return Err(err(
                format!("spec.resources.requests.{name}"),
                "must be greater than or equal to the aggregate container requests".into(),
            ));
        }
    }
    let spec = pod.spec.as_ref().map_or(&[][..], |s| &s.containers[..]);
    for (i, c) in spec.iter().enumerate() {
        let a = container_amounts(c).unwrap_or_default();
        for (name, pod_lim, c_lim) in [
            ("cpu", pl.cpu_limit, a.cpu_limit),
            ("memory", pl.memory_limit, a.memory_limit),
        ] {
            if pod_lim.is_some_and(|p| c_lim > p) {
                return Err(err(
                    format!("spec.containers[{i}].resources.limits.{name}"),
                    "must be less than or equal to the pod-level limit".into(),
                ));
            }
        }
    }
    Ok(())
}

/// A pod's effective requests or limits: for each resource, the larger of the sum over app
/// containers and the largest init container (kubelet's `PodRequests` / `PodLimits`; init
/// containers run one at a time), plus `spec.overhead`: added to the requests, and to the limits
/// that are set (a pod without a cpu limit stays without one). Unusable quantities count as
/// zero; admission refuses them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodAmounts {
    /// cpu requests, millicores.
    pub cpu_request: i64,
    /// cpu limits, millicores (0: none).
    pub cpu_limit: i64,
    /// memory requests, bytes.
    pub memory_request: i64,
    /// memory limits, bytes (0: none).
    pub memory_limit: i64,
    /// ephemeral-storage requests, bytes.
    pub ephemeral_storage_request: i64,
    /// ephemeral-storage limits, bytes (0: none).
    pub ephemeral_storage_limit: i64,
    /// hugepage limits (their requests are the same), bytes, by page size in bytes.
    pub hugepages: BTreeMap<u64, i64>,
}

/// One amount of a pod as kubelet's `PodRequests`/`PodLimits` combine it (k8s.io/component-helpers
/// `resource.PodRequests`): the app containers are summed; restartable init containers
/// (sidecars, `restartPolicy: Always`) are added to that sum, and each init container needs its
/// own amount plus the sidecars started before it; the pod needs the larger of the sum and the
/// largest init container's need. Saturating.
fn combine(apps: impl Iterator<Item = i64>, inits: &[(i64, bool)]) -> i64 {
    let mut total = apps.fold(0i64, i64::saturating_add);
    let (mut sidecars, mut init_need) = (0i64, 0i64);
    for &(v, restartable) in inits {
        if restartable {
            total = total.saturating_add(v);
            sidecars = sidecars.saturating_add(v);
            init_need = init_need.max(sidecars);
        } else {
            init_need = init_need.max(v.saturating_add(sidecars));
        }
    }
    total.max(init_need)
}

/// Computes [`PodAmounts`]: kubelet's pod requests and limits (see `combine`), each amount
/// that [`PodLevelResources`] sets replaced by it, plus `overhead`.
pub fn pod_amounts(pod: &Pod) -> PodAmounts {
    let Some(spec) = pod.spec.as_ref() else {
        return PodAmounts::default();
    };
    let mut sum = pod_amounts_of_containers(pod);
    if let Some(pl) = pod_level_resources(pod) {
        for (from, to) in [
            (pl.cpu_request, &mut sum.cpu_request),
            (pl.cpu_limit, &mut sum.cpu_limit),
            (pl.memory_request, &mut sum.memory_request),
            (pl.memory_limit, &mut sum.memory_limit),
        ] {
            if let Some(v) = from {
                *to = v;
            }
        }
    }
    add_overhead(spec, &mut sum);
    sum
}

/// The containers' aggregate requests and limits ([`combine`]), without pod-level resources
/// or overhead.
fn pod_amounts_of_containers(pod: &Pod) -> PodAmounts {
    let Some(spec) = pod.spec.as_ref() else {
        return PodAmounts::default();
    };
    let get = |c: &Container| container_amounts(c).unwrap_or_default();
    let apps: Vec<ContainerAmounts> = spec.containers.iter().map(get).collect();
    let inits: Vec<(ContainerAmounts, bool)> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| (get(c), c.restart_policy.as_deref() == Some("Always")))
        .collect();
    let field = |f: fn(&ContainerAmounts) -> i64| {
        let init: Vec<(i64, bool)> = inits.iter().map(|(a, r)| (f(a), *r)).collect();
        combine(apps.iter().map(f), &init)
    };
    let mut sum = PodAmounts {
        cpu_request: field(|a| a.cpu_request),
        cpu_limit: field(|a| a.cpu_limit),
        memory_request: field(|a| a.memory_request),
        memory_limit: field(|a| a.memory_limit),
        ephemeral_storage_request: field(|a| a.ephemeral_storage_request),
        ephemeral_storage_limit: field(|a| a.ephemeral_storage_limit),
        hugepages: BTreeMap::new(),
    };
    let sizes: std::collections::BTreeSet<u64> = apps
        .iter()
        .chain(inits.iter().map(|(a, _)| a))
        .flat_map(|a| a.hugepages.keys().copied())
        .collect();
    for size in sizes {
        let of = |a: &ContainerAmounts| a.hugepages.get(&size).copied().unwrap_or(0);
        let init: Vec<(i64, bool)> = inits.iter().map(|(a, r)| (of(a), *r)).collect();
        sum.hugepages
            .insert(size, combine(apps.iter().map(of), &init));
    }
    sum
}

/// Adds `spec.overhead` to `sum`: to the requests, and to the limits that are set.
fn add_overhead(spec: &k8s_openapi::api::core::v1::PodSpec, sum: &mut PodAmounts) {
    let overhead = |name: &str, milli: bool| {
        spec.overhead
            .as_ref()
            .and_then(|o| o.get(name))
            .and_then(|q| {
                if milli {
                    parse_milli(&q.0)
                } else {
                    parse_value(&q.0)
                }
                .ok()
            })
            .and_then(|v| i64::try_from(v).ok())
            .filter(|v| *v > 0)
            .unwrap_or(0)
    };
    let (cpu, memory) = (overhead("cpu", true), overhead("memory", false));
    let storage = overhead("ephemeral-storage", false);
    sum.cpu_request = sum.cpu_request.saturating_add(cpu);
    sum.memory_request = sum.memory_request.saturating_add(memory);
    sum.ephemeral_storage_request = sum.ephemeral_storage_request.saturating_add(storage);
    if sum.ephemeral_storage_limit > 0 {
        sum.ephemeral_storage_limit = sum.ephemeral_storage_limit.saturating_add(storage);
    }
    if sum.cpu_limit > 0 {
        sum.cpu_limit = sum.cpu_limit.saturating_add(cpu);
    }
    if sum.memory_limit > 0 {
        sum.memory_limit = sum.memory_limit.saturating_add(memory);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::pods::with_spec as pod;

    #[test]
    fn init_containers_and_sidecars_are_counted_as_kubelet_counts_them() {
        let c = |name: &str, cpu: &str, always: bool| {
            format!(
                "{{name: {name}, image: b, {}resources: {{requests: {{cpu: {cpu}}}}}}}",
                if always {
                    "restartPolicy: Always, "
                } else {
                    ""
                }
            )
        };
        // Plain init containers: the larger of the apps' sum and the largest init container.
        let p = pod(&format!(
            "{{initContainers: [{}], containers: [{}, {}]}}",
            c("i", "900m", false),
            c("a", "300m", false),
            c("b", "200m", false)
        ));
        assert_eq!(pod_amounts(&p).cpu_request, 900);
        // A sidecar (100m) runs beside the apps (500m) and beside every later init container
        // (800m + 100m): max(600, 900).
        let p = pod(&format!(
            "{{initContainers: [{}, {}], containers: [{}, {}]}}",
            c("side", "100m", true),
            c("i", "800m", false),
            c("a", "300m", false),
            c("b", "200m", false)
        ));
        assert_eq!(pod_amounts(&p).cpu_request, 900);
        // An init container before the sidecar does not run beside it: max(600, 700).
        let p = pod(&format!(
            "{{initContainers: [{}, {}], containers: [{}, {}]}}",
            c("i", "700m", false),
            c("side", "100m", true),
            c("a", "300m", false),
            c("b", "200m", false)
        ));
        assert_eq!(pod_amounts(&p).cpu_request, 700);
    }

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

    #[test]
    fn pod_level_resources_replace_the_containers_sums_and_decide_the_qos_class() {
        use crate::qos::{pod_qos_class, QosClass};
        // Limits only at pod level: the requests default to them; containers without any.
        let p = pod("{resources: {limits: {cpu: '1', memory: 1Gi}}, containers: [{name: a, image: b}, {name: c, image: b}]}");
        let a = pod_amounts(&p);
        assert_eq!(
            (a.cpu_request, a.cpu_limit, a.memory_request, a.memory_limit),
            (1000, 1000, 1 << 30, 1 << 30)
        );
        assert_eq!(pod_qos_class(&p), QosClass::Guaranteed);
        // A request below the limit: Burstable; the pod's amounts are the pod level's, not the
        // containers' sum.
        let p = pod("{resources: {requests: {cpu: 500m, memory: 512Mi}, limits: {cpu: '1', memory: 1Gi}}, containers: [{name: a, image: b, resources: {requests: {cpu: 100m, memory: 64Mi}}}]}");
        let a = pod_amounts(&p);
        assert_eq!((a.cpu_request, a.memory_request), (500, 512 << 20));
        assert_eq!(pod_qos_class(&p), QosClass::Burstable);
        // Only memory at pod level: cpu still comes from the containers; no cpu limit at pod
        // level, so not Guaranteed however the containers are set.
        let p = pod("{resources: {limits: {memory: 1Gi}}, containers: [{name: a, image: b, resources: {limits: {cpu: 200m, memory: 1Gi}}}]}");
        let a = pod_amounts(&p);
        assert_eq!((a.cpu_request, a.memory_limit), (200, 1 << 30));
        assert_eq!(pod_qos_class(&p), QosClass::Burstable);
        // Nothing at pod level but an empty map: as without.
        let p = pod("{resources: {}, containers: [{name: a, image: b}]}");
        assert!(pod_level_resources(&p).is_none());
        assert_eq!(pod_qos_class(&p), QosClass::BestEffort);
    }

    #[test]
    fn pod_level_resources_are_validated_as_the_api_server_does() {
        for (spec, field) in [
            ("{resources: {limits: {hugepages-2Mi: 2Mi}}, containers: [{name: a, image: b}]}", "spec.resources.limits.hugepages-2Mi"),
            ("{resources: {limits: {ephemeral-storage: 1Gi}}, containers: [{name: a, image: b}]}", "spec.resources.limits.ephemeral-storage"),
            ("{resources: {requests: {memory: 2Gi}, limits: {memory: 1Gi}}, containers: [{name: a, image: b}]}", "spec.resources.requests.memory"),
            ("{resources: {requests: {cpu: 100m}}, containers: [{name: a, image: b, resources: {requests: {cpu: 200m}}}]}", "spec.resources.requests.cpu"),
            ("{resources: {limits: {memory: 1Gi}}, containers: [{name: a, image: b, resources: {requests: {memory: 100Mi}, limits: {memory: 2Gi}}}]}", "spec.containers[0].resources.limits.memory"),
            ("{resources: {limits: {cpu: lots}}, containers: [{name: a, image: b}]}", "spec.resources.limits.cpu"),
        ] {
            assert_eq!(validate_pod_resources(&pod(spec)).unwrap_err().field, field, "{spec}");
        }
        assert!(validate_pod_resources(&pod("{resources: {requests: {cpu: 300m}, limits: {cpu: '1', memory: 1Gi}}, containers: [{name: a, image: b, resources: {requests: {cpu: 200m}, limits: {memory: 512Mi}}}]}")).is_ok());
    }

    #[test]
    fn hugepage_sizes_are_quantities_in_kernel_units() {
        assert_eq!(hugepage_size("hugepages-2Mi"), Some(Ok(2 << 20)));
        assert_eq!(hugepage_size("hugepages-2048Ki"), Some(Ok(2 << 20)));
        assert_eq!(hugepage_size("hugepages-1Gi"), Some(Ok(1 << 30)));
        assert!(hugepage_size("hugepages-x").unwrap().is_err());
        assert_eq!(hugepage_size("memory"), None);
        assert_eq!(hugepage_unit_size(2 << 20).as_deref(), Some("2MB"));
        assert_eq!(hugepage_unit_size(1 << 30).as_deref(), Some("1GB"));
        assert_eq!(hugepage_unit_size(64 << 10).as_deref(), Some("64KB"));
        assert_eq!(hugepage_unit_size(3000), None, "not divisible into units");
    }
}
