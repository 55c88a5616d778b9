//! Resource fit at admission (the scheduler's `NodeResourcesFit` filter, which kubelet's
//! `GeneralPredicates` runs for every new pod): the pod's requests must fit in what the node's
//! allocatable leaves after the requests of the pods already admitted.
//!
//! Requests are kubelet's `PodRequests` ([`crate::resources::pod_amounts`]: app containers
//! summed, the largest init container, the overhead). The pod count is checked first (`maxPods`),
//! then cpu (millicores), memory and ephemeral storage (bytes), then each hugepage size; the first
//! shortfall is the refusal: reason `OutOf<resource>` and kubelet's message
//! `Node didn't have enough resource: <resource>, requested: <n>, used: <n>, capacity: <n>`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

use super::Rejection;
use crate::resources::{pod_amounts, PodAmounts};

/// What the node offers pods (kubelet's `node.status.allocatable`): capacity minus
/// `systemReserved`, `kubeReserved` and the hard eviction thresholds of memory and nodefs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Allocatable {
    /// cpu, millicores.
    pub cpu_milli: i64,
    /// memory, bytes.
    pub memory: i64,
    /// ephemeral storage (the filesystem of the root directory), bytes; 0: unknown, not checked.
    pub ephemeral_storage: i64,
    /// Pods (`maxPods`).
    pub pods: i64,
    /// Pre-allocated hugepages, bytes, by page size in bytes.
    pub hugepages: BTreeMap<u64, i64>,
}

/// The node's capacity beside cpu and memory: its ephemeral storage (bytes) and pre-allocated
/// hugepages (bytes by page size in bytes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtraCapacity {
    /// The filesystem of the root directory, bytes (0: unknown).
    pub ephemeral_storage: i64,
    /// Pre-allocated hugepages, bytes by page size.
    pub hugepages: BTreeMap<u64, i64>,
}

impl Allocatable {
    /// kubelet's allocatable (`GetNodeAllocatableReservation`): `capacity` minus `reserved`
    /// (systemReserved + kubeReserved), minus the hard eviction thresholds of
    /// `memory.available` and `nodefs.available` (`thresholds`), minus the hugepages from
    /// memory; pods up to `max_pods`. Never negative.
    pub fn new(
        capacity: crate::cm::resources::NodeResources,
        extra: &ExtraCapacity,
        reserved: crate::cm::resources::NodeResources,
        thresholds: &[crate::eviction::threshold::Threshold],
        max_pods: usize,
    ) -> Self {
        let hard = |signal: &str, cap: i64| {
            thresholds
                .iter()
                .filter(|t| t.signal == signal && t.grace_period.is_zero())
                .map(|t| t.value.amount(cap))
                .max()
                .unwrap_or(0)
        };
        let hugepages_total: i64 = extra.hugepages.values().sum();
        Self {
            cpu_milli: capacity.cpu_milli.saturating_sub(reserved.cpu_milli).max(0),
            memory: capacity
                .memory
                .saturating_sub(reserved.memory)
                .saturating_sub(hard("memory.available", capacity.memory))
                .saturating_sub(hugepages_total)
                .max(0),
            ephemeral_storage: extra
                .ephemeral_storage
                .saturating_sub(hard("nodefs.available", extra.ephemeral_storage))
                .max(0),
            pods: i64::try_from(max_pods).unwrap_or(i64::MAX),
            hugepages: extra.hugepages.clone(),
        }
    }
}

/// The resource name of a hugepage size (`hugepages-2Mi`, `hugepages-1Gi`).
pub fn hugepage_resource(size: u64) -> String {
    let name = match size {
        s if s % (1 << 30) == 0 => format!("{}Gi", s >> 30),
        s if s % (1 << 20) == 0 => format!("{}Mi", s >> 20),
        s if s % (1 << 10) == 0 => format!("{}Ki", s >> 10),
        s => s.to_string(),
    };
    format!("hugepages-{name}")
}

fn insufficient(resource: &str, requested: i64, used: i64, capacity: i64) -> Rejection {
    Rejection {
        reason: format!("OutOf{resource}"),
        message: format!(
            "Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {capacity}"
        ),
    }
}

/// Refuses `pod` when its requests do not fit in `alloc` beside `running` (the pods already
/// admitted and not finished, without `pod`).
pub fn admit<'a>(
    pod: &Pod,
    running: impl IntoIterator<Item = &'a Pod>,
    alloc: &Allocatable,
) -> Option<Rejection> {
    let mut used = PodAmounts::default();
    let mut count = 0i64;
    for p in running {
        count += 1;
        let a = pod_amounts(p);
        used.cpu_request = used.cpu_request.saturating_add(a.cpu_request);
        used.memory_request = used.memory_request.saturating_add(a.memory_request);
        used.ephemeral_storage_request = used
            .ephemeral_storage_request
            .saturating_add(a.ephemeral_storage_request);
        for (size, v) in a.hugepages {
            let e = used.hugepages.entry(size).or_insert(0);
            *e = e.saturating_add(v);
        }
    }
    if count + 1 > alloc.pods {
        return Some(insufficient("pods", 1, count, alloc.pods));
    }
    let want = pod_amounts(pod);
    let short = |requested: i64, used: i64, capacity: i64| {
        requested > 0 && requested > capacity.saturating_sub(used)
    };
    // Ephemeral storage is checked only when the node's is known (0: unknown).
    for (name, requested, u, cap, known) in [
        (
            "cpu",
            want.cpu_request,
            used.cpu_request,
            alloc.cpu_milli,
            true,
        ),
        (
            "memory",
            want.memory_request,
            used.memory_request,
            alloc.memory,
            true,
        ),
        (
            "ephemeral-storage",
            want.ephemeral_storage_request,
            used.ephemeral_storage_request,
            alloc.ephemeral_storage,
            alloc.ephemeral_storage > 0,
        ),
    ] {
        if known && short(requested, u, cap) {
            return Some(insufficient(name, requested, u, cap));
        }
    }
    for (size, requested) in &want.hugepages {
        let u = used.hugepages.get(size).copied().unwrap_or(0);
        let cap = alloc.hugepages.get(size).copied().unwrap_or(0);
        if short(*requested, u, cap) {
            return Some(insufficient(&hugepage_resource(*size), *requested, u, cap));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::pods::with_spec as pod;

    fn alloc() -> Allocatable {
        Allocatable {
            cpu_milli: 2000,
            memory: 4 << 30,
            ephemeral_storage: 10 << 30,
            pods: 3,
            hugepages: [(2 << 20, 4 << 20)].into(),
        }
    }

    #[test]
    fn requests_fit_beside_the_admitted_pods_or_are_refused_as_kubelet_words_it() {
        let a = alloc();
        let big = pod("{containers: [{name: c, image: b, resources: {requests: {cpu: '100'}}}]}");
        let r = admit(&big, [], &a).unwrap();
        assert_eq!(r.reason, "OutOfcpu");
        assert_eq!(
            r.message,
            "Node didn't have enough resource: cpu, requested: 100000, used: 0, capacity: 2000"
        );
        let third = pod("{containers: [{name: c, image: b, resources: {requests: {cpu: 700m}}}]}");
        let (x, y) = (third.clone(), third.clone());
        let r = admit(&third, [&x, &y], &a).unwrap();
        assert_eq!(
            r.message,
            "Node didn't have enough resource: cpu, requested: 700, used: 1400, capacity: 2000"
        );
        let small = pod("{containers: [{name: c, image: b, resources: {requests: {cpu: 500m}}}]}");
        assert_eq!(admit(&small, [&x, &y], &a), None, "600m are left");
        let mem = pod("{containers: [{name: c, image: b, resources: {limits: {memory: 5Gi}}}]}");
        assert_eq!(admit(&mem, [], &a).unwrap().reason, "OutOfmemory");
        let disk = pod(
            "{containers: [{name: c, image: b, resources: {requests: {ephemeral-storage: 11Gi}}}]}",
        );
        assert_eq!(
            admit(&disk, [], &a).unwrap().reason,
            "OutOfephemeral-storage"
        );
        let huge = pod("{containers: [{name: c, image: b, resources: {limits: {cpu: '1', memory: 1Gi, hugepages-2048Ki: 6Mi}}}]}");
        assert_eq!(admit(&huge, [], &a).unwrap().reason, "OutOfhugepages-2Mi");
        let none = pod("{containers: [{name: c, image: b}]}");
        let r = admit(&none, [&x, &y, &small], &a).unwrap();
        assert_eq!(
            (r.reason.as_str(), r.message.as_str()),
            (
                "OutOfpods",
                "Node didn't have enough resource: pods, requested: 1, used: 3, capacity: 3"
            )
        );
        // Init containers count at their largest, with the overhead.
        let init = pod("{overhead: {cpu: 100m}, initContainers: [{name: i, image: b, resources: {requests: {cpu: 1950m}}}], containers: [{name: c, image: b, resources: {requests: {cpu: 100m}}}]}");
        assert_eq!(admit(&init, [], &a).unwrap().reason, "OutOfcpu");
    }
}
