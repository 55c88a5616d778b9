//! Resource fit at admission (the scheduler's `NodeResourcesFit` filter, which kubelet's
//! `GeneralPredicates` runs for every new pod): the pod's requests must fit in what the node's
//! allocatable leaves after the requests of the pods already admitted.
//!
//! Requests are kubelet's `PodRequests` ([`crate::resources::pod_amounts`]: app containers
//! summed, the largest init container, the overhead). The pod count is checked first (`maxPods`),
//! then cpu (millicores), memory and ephemeral storage (bytes), then each hugepage size; the first
//! shortfall is the refusal: reason `OutOf<resource>` and kubelet's message
//! `Node didn't have enough resource: <resource>, requested: <n>, used: <n>, capacity: <n>`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

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

/// Each admitted pod's requests ([`pod_amounts`]) kept by UID and `kubernetes.io/config.hash`
/// (the spec's hash, stamped by every source): admitting a pod sums the requests of every
/// other, and working each out again from its quantities made a burst of n pods cost n² of
/// them (kubelet's `PodRequests` is recomputed on each admission; the values are the same).
/// A pod without a config hash is worked out each time. Cheap to clone (shared).
#[derive(Clone, Default)]
pub struct Requests(Arc<Mutex<HashMap<String, (String, PodAmounts)>>>);

impl Requests {
    /// `pod`'s requests, from the memo while its UID and config hash are the ones kept.
    pub fn of(&self, pod: &Pod) -> PodAmounts {
        let hash = crate::pod::config_hash(pod);
        if hash.is_empty() {
            return pod_amounts(pod);
        }
        let uid = crate::pod::pod_uid(pod);
        let mut memo = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match memo.get(uid) {
            Some((h, a)) if h == hash => a.clone(),
            _ => {
                let a = pod_amounts(pod);
                memo.insert(uid.to_owned(), (hash.to_owned(), a.clone()));
                a
            }
        }
    }

    /// Forgets the pods not in `keep` (by UID) once the memo holds more than twice as many
    /// entries as `keep` has pods, and 16 more: pods removed do not accumulate.
    pub fn forget_others<'a>(&self, keep: impl IntoIterator<Item = &'a Pod> + Clone) {
        let n = keep.clone().into_iter().count();
        let mut memo = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if memo.len() > 2 * n + 16 {
            let uids: HashSet<&str> = keep.into_iter().map(crate::pod::pod_uid).collect();
            memo.retain(|uid, _| uids.contains(uid.as_str()));
        }
    }

    /// How many pods the memo holds.
    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// True when the memo holds no pod.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Refuses `pod` when its requests do not fit in `alloc` beside `running` (the pods already
/// admitted and not finished, without `pod`); each running pod's requests from `requests`.
pub fn admit<'a>(
    pod: &Pod,
    running: impl IntoIterator<Item = &'a Pod>,
    alloc: &Allocatable,
    requests: &Requests,
) -> Option<Rejection> {
    let mut used = PodAmounts::default();
    let mut count = 0i64;
    for p in running {
        count += 1;
        let a = requests.of(p);
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

    /// A pod of UID `uid` and config hash `hash` requesting `cpu`.
    fn stamped(uid: &str, hash: &str, cpu: &str) -> Pod {
        let mut p = pod(&format!(
            "{{containers: [{{name: c, image: b, resources: {{requests: {{cpu: {cpu}}}}}}}]}}"
        ));
        let v = crate::testing::pods::versioned(uid, hash);
        p.metadata.uid = v.metadata.uid;
        p.metadata.annotations = v.metadata.annotations;
        p
    }

    #[test]
    fn requests_are_worked_out_once_per_spec_and_forgotten_with_their_pods() {
        let r = Requests::default();
        let a = stamped("u1", "h1", "300m");
        assert_eq!(r.of(&a).cpu_request, 300);
        // The memo answers for the same UID and hash (a stale value shows it was used).
        r.0.lock().unwrap().get_mut("u1").unwrap().1.cpu_request = 1;
        assert_eq!(r.of(&a).cpu_request, 1);
        // An edit (new hash) is worked out again; a pod without a hash is never kept.
        assert_eq!(r.of(&stamped("u1", "h2", "400m")).cpu_request, 400);
        let unstamped =
            pod("{containers: [{name: c, image: b, resources: {requests: {cpu: 50m}}}]}");
        assert_eq!(r.of(&unstamped).cpu_request, 50);
        assert_eq!(r.len(), 1);
        // Removed pods go once the memo is past twice the pods kept and 16.
        let many: Vec<Pod> = (0..20)
            .map(|i| stamped(&format!("m{i}"), "h", "1m"))
            .collect();
        for p in &many {
            r.of(p);
        }
        assert_eq!(r.len(), 21);
        r.forget_others(many[..3].iter());
        assert_eq!(r.len(), 21, "21 is not past 2 × 3 + 16");
        r.forget_others(many[..2].iter());
        assert_eq!(r.len(), 2, "only the pods kept");
        // Admission adds what the memo holds.
        let alloc = alloc();
        let (x, y) = (stamped("x", "h", "900m"), stamped("y", "h", "900m"));
        let third = stamped("z", "h", "300m");
        assert_eq!(
            admit(&third, [&x, &y], &alloc, &r).map(|e| e.reason),
            Some("OutOfcpu".into())
        );
        assert!(admit(&stamped("z", "h", "200m"), [&x, &y], &alloc, &r).is_none());
    }

    #[test]
    fn requests_fit_beside_the_admitted_pods_or_are_refused_as_kubelet_words_it() {
        let a = alloc();
        let big = pod("{containers: [{name: c, image: b, resources: {requests: {cpu: '100'}}}]}");
        let r = admit(&big, [], &a, &Requests::default()).unwrap();
        assert_eq!(r.reason, "OutOfcpu");
        assert_eq!(
            r.message,
            "Node didn't have enough resource: cpu, requested: 100000, used: 0, capacity: 2000"
        );
        let third = pod("{containers: [{name: c, image: b, resources: {requests: {cpu: 700m}}}]}");
        let (x, y) = (third.clone(), third.clone());
        let r = admit(&third, [&x, &y], &a, &Requests::default()).unwrap();
        assert_eq!(
            r.message,
            "Node didn't have enough resource: cpu, requested: 700, used: 1400, capacity: 2000"
        );
        let small = pod("{containers: [{name: c, image: b, resources: {requests: {cpu: 500m}}}]}");
        assert_eq!(
            admit(&small, [&x, &y], &a, &Requests::default()),
            None,
            "600m are left"
        );
        let mem = pod("{containers: [{name: c, image: b, resources: {limits: {memory: 5Gi}}}]}");
        assert_eq!(
            admit(&mem, [], &a, &Requests::default()).unwrap().reason,
            "OutOfmemory"
        );
        let disk = pod(
            "{containers: [{name: c, image: b, resources: {requests: {ephemeral-storage: 11Gi}}}]}",
        );
        assert_eq!(
            admit(&disk, [], &a, &Requests::default()).unwrap().reason,
            "OutOfephemeral-storage"
        );
        let huge = pod("{containers: [{name: c, image: b, resources: {limits: {cpu: '1', memory: 1Gi, hugepages-2048Ki: 6Mi}}}]}");
        assert_eq!(
            admit(&huge, [], &a, &Requests::default()).unwrap().reason,
            "OutOfhugepages-2Mi"
        );
        let none = pod("{containers: [{name: c, image: b}]}");
        let r = admit(&none, [&x, &y, &small], &a, &Requests::default()).unwrap();
        assert_eq!(
            (r.reason.as_str(), r.message.as_str()),
            (
                "OutOfpods",
                "Node didn't have enough resource: pods, requested: 1, used: 3, capacity: 3"
            )
        );
        // Init containers count at their largest, with the overhead.
        let init = pod("{overhead: {cpu: 100m}, initContainers: [{name: i, image: b, resources: {requests: {cpu: 1950m}}}], containers: [{name: c, image: b, resources: {requests: {cpu: 100m}}}]}");
        assert_eq!(
            admit(&init, [], &a, &Requests::default()).unwrap().reason,
            "OutOfcpu"
        );
    }
}
