//! Resource math of kubelet's container manager, as pure functions: cpu shares and CFS quota from
//! millicores, a pod's effective requests and limits, the pod cgroup's values by QoS class
//! (`ResourceConfigForPod` in `cm/helpers_linux.go`), the QoS cgroups' values
//! (`qos_container_manager_linux.go`) and node allocatable (`node_container_manager_linux.go`).
//!
//! Units: cpu in millicores, memory in bytes, CFS quota and period in microseconds.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use crate::qos::{pod_qos_class, QosClass};
use crate::resources::{container_amounts, pod_amounts, ContainerAmounts};

/// Smallest cpu.shares value (kubelet's `MinShares`).
pub const MIN_SHARES: u64 = 2;
/// Largest cpu.shares value (kubelet's `MaxShares`).
pub const MAX_SHARES: u64 = 262_144;
/// Shares of one full cpu.
pub const SHARES_PER_CPU: u64 = 1024;
/// Smallest CFS quota, microseconds (kubelet's `MinQuotaPeriod`).
pub const MIN_QUOTA_PERIOD_US: i64 = 1000;
/// Default CFS period, microseconds (`cpuCFSQuotaPeriod` 100ms).
pub const DEFAULT_CFS_PERIOD_US: u64 = 100_000;

/// cpu.shares for `milli` millicores: `max(2, milli * 1024 / 1000)`, at most 262144; zero gives 2
/// (kubelet's `MilliCPUToShares`).
pub fn milli_cpu_to_shares(milli: i64) -> u64 {
    if milli <= 0 {
        return MIN_SHARES;
    }
    let shares = (milli as u64).saturating_mul(SHARES_PER_CPU) / 1000;
    shares.clamp(MIN_SHARES, MAX_SHARES)
}

/// CFS quota in microseconds for a limit of `milli` millicores over `period_us`:
/// `milli * period / 1000`, never below 1000 µs; zero (no limit) gives 0 (kubelet's
/// `MilliCPUToQuota`).
pub fn milli_cpu_to_quota(milli: i64, period_us: u64) -> i64 {
    if milli <= 0 {
        return 0;
    }
    let quota = milli.saturating_mul(period_us as i64) / 1000;
    quota.max(MIN_QUOTA_PERIOD_US)
}

/// The values of one cgroup; `None` leaves the file alone. A field kubelet's
/// `ResourceConfig` has.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceConfig {
    /// cpu.shares.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_shares: Option<u64>,
    /// cpu.cfs_quota_us; -1 means unlimited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_quota: Option<i64>,
    /// cpu.cfs_period_us.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_period: Option<u64>,
    /// memory.limit_in_bytes, bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<i64>,
    /// pids.max.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pids_limit: Option<i64>,
    /// memory.high, bytes, cgroup v2 only (0 or below: `max`). Set on `kubepods` alone, as the
    /// eviction manager's tripwire ([`crate::cm::ContainerManager::set_kubepods_memory_high`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_high: Option<i64>,
    /// memory.min, bytes, cgroup v2 only: kubelet's MemoryQoS protection of memory requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_min: Option<i64>,
    /// hugetlb limits, bytes, by page size in the kernel's spelling (`2MB`, `1GB`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub hugepage_limits: BTreeMap<String, i64>,
}

/// Knobs of the pod cgroup computation (from the configuration and the node).
#[derive(Debug, Clone, PartialEq)]
pub struct CgroupPolicy {
    /// `cpuCFSQuota`: enforce cpu limits with CFS quota.
    pub cpu_cfs_quota: bool,
    /// `cpuCFSQuotaPeriod`, microseconds.
    pub cpu_cfs_period_us: u64,
    /// `podPidsLimit` (-1 or 0: none).
    pub pod_pids_limit: i64,
    /// The node's hugepage sizes, bytes ([`crate::cm::hugepage_sizes`]): a pod or container
    /// gets a hugetlb limit of 0 for each size it does not ask for.
    pub hugepage_sizes: Vec<u64>,
    /// kubelet's MemoryQoS (`featureGates: {MemoryQoS: true}`, cgroup v2 only): the
    /// `memoryThrottlingFactor` when on. Pods and QoS cgroups then get `memory.min` from memory
    /// requests, containers `memory.min` and `memory.high`
    /// ([`crate::kuberuntime::container::memory_qos`]).
    pub memory_qos_throttling_factor: Option<f64>,
}

impl Default for CgroupPolicy {
    fn default() -> Self {
        Self {
            cpu_cfs_quota: true,
            cpu_cfs_period_us: DEFAULT_CFS_PERIOD_US,
            pod_pids_limit: -1,
            hugepage_sizes: Vec::new(),
            memory_qos_throttling_factor: None,
        }
    }
}

/// hugetlb limits in the kernel's spelling (kubelet's `HugePageLimits` and the cgroup manager's
/// zero for every page size not asked for): `asked` (bytes by page size in bytes) for the sizes
/// it has, 0 for the node's other `sizes`. A size without a kernel spelling is left out.
pub fn hugepage_limits(asked: &BTreeMap<u64, i64>, sizes: &[u64]) -> BTreeMap<String, i64> {
    sizes
        .iter()
        .map(|s| (*s, 0))
        .chain(asked.iter().map(|(s, v)| (*s, *v)))
        .filter_map(|(s, v)| Some((crate::resources::hugepage_unit_size(s)?, v)))
        .collect()
}

/// The pod cgroup's values (kubelet's `ResourceConfigForPod`): Guaranteed gets shares, quota and
/// memory limit; Burstable gets shares, and quota or memory limit only when every app container
/// declares that limit or the pod sets it at pod level; BestEffort gets shares 2. Without
/// `cpuCFSQuota` the quota is -1.
pub fn pod_resource_config(pod: &Pod, policy: &CgroupPolicy) -> ResourceConfig {
    let amounts = pod_amounts(pod);
    let containers = pod.spec.as_ref().map(|s| &s.containers[..]).unwrap_or(&[]);
    let all = |f: fn(&ContainerAmounts) -> i64| {
        containers
            .iter()
            .all(|c| container_amounts(c).is_ok_and(|a| f(&a) > 0))
    };
    // A pod-level limit declares the pod's limit whatever its containers say (kubelet's
    // `ResourceConfigForPod` with PodLevelResources).
    let pod_level = crate::resources::pod_level_resources(pod).unwrap_or_default();
    let cpu_limits_declared = all(|a| a.cpu_limit) || pod_level.cpu_limit.is_some();
    let memory_limits_declared = all(|a| a.memory_limit) || pod_level.memory_limit.is_some();
    let shares = milli_cpu_to_shares(amounts.cpu_request);
    let quota = if policy.cpu_cfs_quota {
        milli_cpu_to_quota(amounts.cpu_limit, policy.cpu_cfs_period_us)
    } else {
        -1
    };
    let mut cfg = ResourceConfig::default();
    match pod_qos_class(pod) {
        QosClass::Guaranteed => {
            cfg.cpu_shares = Some(shares);
            cfg.cpu_quota = Some(quota);
            cfg.cpu_period = Some(policy.cpu_cfs_period_us);
            cfg.memory_limit = Some(amounts.memory_limit);
        }
        QosClass::Burstable => {
            cfg.cpu_shares = Some(shares);
            if cpu_limits_declared {
                cfg.cpu_quota = Some(quota);
                cfg.cpu_period = Some(policy.cpu_cfs_period_us);
            }
            if memory_limits_declared {
                cfg.memory_limit = Some(amounts.memory_limit);
            }
        }
        QosClass::BestEffort => cfg.cpu_shares = Some(MIN_SHARES),
    }
    if policy.pod_pids_limit > 0 {
        cfg.pids_limit = Some(policy.pod_pids_limit);
    }
    // MemoryQoS: the pod's memory requests protected (kubelet's `ResourceConfigForPod`).
    if policy.memory_qos_throttling_factor.is_some() && amounts.memory_request > 0 {
        cfg.memory_min = Some(amounts.memory_request);
    }
    cfg.hugepage_limits = hugepage_limits(&amounts.hugepages, &policy.hugepage_sizes);
    cfg
}

/// Node capacity and reservations (bytes, millicores, pids).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeResources {
    /// cpu, millicores.
    pub cpu_milli: i64,
    /// memory, bytes.
    pub memory: i64,
    /// pids (0: not managed).
    pub pids: i64,
}

/// Node allocatable for the `kubepods` cgroup: capacity minus systemReserved minus kubeReserved,
/// never negative (kubelet's `getNodeAllocatableAbsoluteImpl`; the cgroup limit does not subtract
/// eviction thresholds, so that eviction acts before the limit is hit).
pub fn node_allocatable(
    capacity: NodeResources,
    system: NodeResources,
    kube: NodeResources,
) -> NodeResources {
    NodeResources {
        cpu_milli: capacity
            .cpu_milli
            .saturating_sub(system.cpu_milli.saturating_add(kube.cpu_milli))
            .max(0),
        memory: capacity
            .memory
            .saturating_sub(system.memory.saturating_add(kube.memory))
            .max(0),
        pids: capacity
            .pids
            .saturating_sub(system.pids.saturating_add(kube.pids))
            .max(0),
    }
}

/// The values of `kubepods`: cpu shares from allocatable cpu, memory limit and pids limit from
/// allocatable (when enforced), else from capacity.
pub fn kubepods_config(allocatable: NodeResources) -> ResourceConfig {
    ResourceConfig {
        cpu_shares: Some(milli_cpu_to_shares(allocatable.cpu_milli)),
        memory_limit: Some(allocatable.memory),
        pids_limit: (allocatable.pids > 0).then_some(allocatable.pids),
        ..Default::default()
    }
}

/// Sums over the pods on the node, for the QoS cgroups.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QosTotals {
    /// cpu requests of Burstable pods, millicores.
    pub burstable_cpu_request: i64,
    /// memory requests of Guaranteed pods, bytes.
    pub guaranteed_memory_request: i64,
    /// memory requests of Burstable pods, bytes.
    pub burstable_memory_request: i64,
}

impl QosTotals {
    /// Adds the totals of other pods (saturating).
    pub fn merge(&mut self, other: &QosTotals) {
        self.burstable_cpu_request = self
            .burstable_cpu_request
            .saturating_add(other.burstable_cpu_request);
        self.guaranteed_memory_request = self
            .guaranteed_memory_request
            .saturating_add(other.guaranteed_memory_request);
        self.burstable_memory_request = self
            .burstable_memory_request
            .saturating_add(other.burstable_memory_request);
    }

    /// Adds one pod.
    pub fn add(&mut self, pod: &Pod) {
        let a = pod_amounts(pod);
        match pod_qos_class(pod) {
            QosClass::Guaranteed => {
                self.guaranteed_memory_request = self
                    .guaranteed_memory_request
                    .saturating_add(a.memory_request)
            }
            QosClass::Burstable => {
                self.burstable_cpu_request =
                    self.burstable_cpu_request.saturating_add(a.cpu_request);
                self.burstable_memory_request = self
                    .burstable_memory_request
                    .saturating_add(a.memory_request);
            }
            QosClass::BestEffort => {}
        }
    }
}

/// The values of `kubepods/burstable` and `kubepods/besteffort` (kubelet's
/// `setCPUCgroupConfig` and `setMemoryReserve`): burstable shares = its pods' cpu requests as
/// shares, besteffort shares = 2; with `qosReserved` memory percent `p`, burstable limit =
/// allocatable - p% of Guaranteed requests, besteffort limit = burstable limit - p% of Burstable
/// requests (never below 0).
pub fn qos_configs(
    totals: &QosTotals,
    allocatable_memory: i64,
    qos_reserved_memory_percent: Option<i64>,
    memory_qos: bool,
) -> (ResourceConfig, ResourceConfig) {
    let mut burstable = ResourceConfig {
        cpu_shares: Some(milli_cpu_to_shares(totals.burstable_cpu_request)),
        ..Default::default()
    };
    let mut besteffort = ResourceConfig {
        cpu_shares: Some(MIN_SHARES),
        ..Default::default()
    };
    if let Some(p) = qos_reserved_memory_percent {
        let pct = |v: i64| i64::try_from(i128::from(v) * i128::from(p) / 100).unwrap_or(i64::MAX);
        let b = allocatable_memory
            .saturating_sub(pct(totals.guaranteed_memory_request))
            .max(0);
        let e = b
            .saturating_sub(pct(totals.burstable_memory_request))
            .max(0);
        burstable.memory_limit = Some(b);
        besteffort.memory_limit = Some(e);
    }
    // MemoryQoS: the Burstable pods' memory requests protected in their QoS cgroup (kubelet's
    // `setMemoryQoS`).
    if memory_qos && totals.burstable_memory_request > 0 {
        burstable.memory_min = Some(totals.burstable_memory_request);
    }
    (burstable, besteffort)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::pods::with_spec as pod;

    #[test]
    fn shares_and_quota_follow_kubelet() {
        for (milli, shares) in [
            (0, 2),
            (1, 2),
            (2, 2),
            (3, 3),
            (100, 102),
            (250, 256),
            (1000, 1024),
            (500_000, 262_144),
        ] {
            assert_eq!(milli_cpu_to_shares(milli), shares, "{milli}m");
        }
        for (milli, quota) in [
            (0, 0),
            (1, 1000),
            (5, 1000),
            (10, 1000),
            (11, 1100),
            (100, 10_000),
            (1500, 150_000),
        ] {
            assert_eq!(milli_cpu_to_quota(milli, 100_000), quota, "{milli}m");
        }
    }

    #[test]
    fn pod_cgroup_values_by_qos() {
        let policy = CgroupPolicy::default();
        // Guaranteed: shares, quota, period and memory limit.
        let g = pod(
            "{containers: [{name: a, image: i, resources: {limits: {cpu: 500m, memory: 128Mi}}}]}",
        );
        let c = pod_resource_config(&g, &policy);
        assert_eq!(
            (c.cpu_shares, c.cpu_quota, c.cpu_period, c.memory_limit),
            (Some(512), Some(50_000), Some(100_000), Some(134_217_728))
        );
        // Burstable with every limit declared: like Guaranteed but shares from requests.
        let b = pod("{containers: [{name: a, image: i, resources: {requests: {cpu: 100m, memory: 64Mi}, limits: {cpu: '1', memory: 128Mi}}}]}");
        let c = pod_resource_config(&b, &policy);
        assert_eq!(
            (c.cpu_shares, c.cpu_quota, c.memory_limit),
            (Some(102), Some(100_000), Some(134_217_728))
        );
        // Burstable where one container has no limits: no quota, no memory limit.
        let b2 = pod("{containers: [{name: a, image: i, resources: {requests: {cpu: 100m}, limits: {cpu: 200m, memory: 1Gi}}}, {name: b, image: i}]}");
        let c = pod_resource_config(&b2, &policy);
        assert_eq!(
            (c.cpu_shares, c.cpu_quota, c.memory_limit),
            (Some(102), None, None)
        );
        // Limits without requests: requests default to limits.
        let l = pod("{containers: [{name: a, image: i, resources: {limits: {memory: 256Mi}}}]}");
        assert_eq!(pod_amounts(&l).memory_request, 268_435_456);
        // BestEffort: shares 2.
        let e = pod("{containers: [{name: a, image: i}]}");
        assert_eq!(
            pod_resource_config(&e, &policy),
            ResourceConfig {
                cpu_shares: Some(2),
                ..Default::default()
            }
        );
        // cpuCFSQuota off: quota -1.
        let off = CgroupPolicy {
            cpu_cfs_quota: false,
            ..policy.clone()
        };
        assert_eq!(pod_resource_config(&g, &off).cpu_quota, Some(-1));
        // podPidsLimit.
        let pids = CgroupPolicy {
            pod_pids_limit: 1024,
            ..policy
        };
        assert_eq!(pod_resource_config(&e, &pids).pids_limit, Some(1024));
    }

    #[test]
    fn init_containers_larger_than_app_containers_win() {
        let p = pod("{initContainers: [{name: i, image: i, resources: {limits: {cpu: '2', memory: 1Gi}}}], containers: [{name: a, image: i, resources: {limits: {cpu: 500m, memory: 128Mi}}}, {name: b, image: i, resources: {limits: {cpu: 500m, memory: 128Mi}}}]}");
        let a = pod_amounts(&p);
        assert_eq!((a.cpu_request, a.memory_limit), (2000, 1 << 30));
        let c = pod_resource_config(&p, &CgroupPolicy::default());
        assert_eq!(
            (c.cpu_shares, c.cpu_quota, c.memory_limit),
            (Some(2048), Some(200_000), Some(1 << 30))
        );
        // Smaller init containers do not change the sums of the app containers.
        let p = pod("{initContainers: [{name: i, image: i, resources: {limits: {cpu: 100m, memory: 1Mi}}}], containers: [{name: a, image: i, resources: {limits: {cpu: 500m, memory: 128Mi}}}, {name: b, image: i, resources: {limits: {cpu: 500m, memory: 128Mi}}}]}");
        assert_eq!(pod_amounts(&p).cpu_request, 1000);
    }

    #[test]
    fn node_allocatable_and_qos_cgroups() {
        let cap = NodeResources {
            cpu_milli: 2000,
            memory: 8 << 30,
            pids: 0,
        };
        let alloc = node_allocatable(
            cap,
            NodeResources {
                cpu_milli: 100,
                memory: 1 << 30,
                pids: 0,
            },
            NodeResources {
                cpu_milli: 100,
                memory: 512 << 20,
                pids: 0,
            },
        );
        assert_eq!(
            alloc,
            NodeResources {
                cpu_milli: 1800,
                memory: (8 << 30) - (1 << 30) - (512 << 20),
                pids: 0
            }
        );
        let k = kubepods_config(alloc);
        assert_eq!(
            (k.cpu_shares, k.memory_limit),
            (Some(1843), Some(alloc.memory))
        );
        // Over-reserved: allocatable is zero, not negative.
        assert_eq!(
            node_allocatable(
                cap,
                NodeResources {
                    cpu_milli: 5000,
                    memory: 0,
                    pids: 0
                },
                NodeResources::default()
            )
            .cpu_milli,
            0
        );

        let mut t = QosTotals::default();
        t.add(&pod(
            "{containers: [{name: a, image: i, resources: {limits: {cpu: '1', memory: 1Gi}}}]}",
        ));
        t.add(&pod("{containers: [{name: a, image: i, resources: {requests: {cpu: 250m, memory: 512Mi}}}]}"));
        t.add(&pod("{containers: [{name: a, image: i}]}"));
        assert_eq!(
            t,
            QosTotals {
                burstable_cpu_request: 250,
                guaranteed_memory_request: 1 << 30,
                burstable_memory_request: 512 << 20
            }
        );
        let (b, e) = qos_configs(&t, 4 << 30, None, false);
        assert_eq!(
            (b.cpu_shares, b.memory_limit, e.cpu_shares, e.memory_limit),
            (Some(256), None, Some(2), None)
        );
        let (b, e) = qos_configs(&t, 4 << 30, Some(50), false);
        assert_eq!(b.memory_limit, Some((4 << 30) - (512 << 20)));
        assert_eq!(e.memory_limit, Some((4 << 30) - (512 << 20) - (256 << 20)));
    }

    /// The resource inputs of the fidelity issue, with kubelet's values.
    #[test]
    fn zero_requests_overhead_and_hugepage_sizes_as_kubelet_counts_them() {
        // An explicit zero request is a request of zero: Burstable, oom_score_adj 999.
        let p = pod("{containers: [{name: c, image: b, resources: {limits: {cpu: 300m, memory: 300Mi}, requests: {memory: '0'}}}]}");
        assert_eq!(pod_qos_class(&p), QosClass::Burstable);
        let c = &p.spec.as_ref().unwrap().containers[0];
        assert_eq!(crate::qos::container_oom_score_adj(&p, c, 8 << 30), 999);
        // Overhead counts toward the pod cgroup, not the QoS class.
        let p = pod("{overhead: {cpu: 50m, memory: 32Mi}, containers: [{name: c, image: b, resources: {requests: {cpu: 250m, memory: 128Mi}, limits: {cpu: 500m, memory: 256Mi}}}]}");
        let cfg = pod_resource_config(&p, &CgroupPolicy::default());
        assert_eq!(
            (
                cfg.cpu_shares,
                cfg.cpu_quota,
                cfg.cpu_period,
                cfg.memory_limit
            ),
            (Some(307), Some(55_000), Some(100_000), Some(301_989_888))
        );
        let g = pod("{overhead: {cpu: 50m, memory: 32Mi}, containers: [{name: c, image: b, resources: {limits: {cpu: 500m, memory: 256Mi}}}]}");
        assert_eq!(pod_qos_class(&g), QosClass::Guaranteed);
        // A pod without a cpu limit gets none from its overhead.
        let b = pod("{overhead: {cpu: 50m}, containers: [{name: c, image: b, resources: {requests: {cpu: 250m}}}]}");
        assert_eq!(crate::resources::pod_amounts(&b).cpu_limit, 0);
        // hugepages-2Mi and hugepages-2048Ki are one size; the node's other sizes get 0.
        let p = pod("{containers: [{name: a, image: b, resources: {limits: {cpu: '1', memory: 1Gi, hugepages-2Mi: 4Mi}}}, {name: b, image: b, resources: {limits: {cpu: '1', memory: 1Gi, hugepages-2048Ki: 2Mi}}}]}");
        let policy = CgroupPolicy {
            hugepage_sizes: vec![2 << 20, 1 << 30],
            ..CgroupPolicy::default()
        };
        let cfg = pod_resource_config(&p, &policy);
        assert_eq!(
            cfg.hugepage_limits,
            [("2MB".to_string(), 6_291_456), ("1GB".to_string(), 0)].into()
        );
    }
}
