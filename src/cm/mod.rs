//! Container manager (kubelet's `pkg/kubelet/cm`): the QoS cgroup hierarchy, node allocatable,
//! pod cgroups.
//!
//! With `cgroupsPerQOS` the tree is `<cgroupRoot>/kubepods` (node allocatable),
//! `kubepods/burstable` and `kubepods/besteffort` (QoS cgroups), and `pod<UID>` under the pod's
//! QoS cgroup (Guaranteed pods directly under `kubepods`). The pod cgroup is created with kubelet's
//! values before RunPodSandbox and handed to it as `cgroup_parent`; runc places the sandbox and
//! containers below it. It is destroyed in every hierarchy once the pod is gone; housekeeping also
//! removes `pod<UID>` cgroups that no pod owns (after an agent restart, say).
//! The systemd driver spells the same tree as slices ([`name::CgroupName::to_systemd`]).
//! [`cgroupfs`] writes the values through cgroups-rs, over the hierarchies of [`hierarchy`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use tracing::{debug, info, warn};

use crate::qos::{pod_qos_class, QosClass};

pub mod cgroupfs;
pub mod hierarchy;
pub mod name;
pub mod orphans;
pub mod resources;
pub mod runtime_driver;
pub mod systemd;

use cgroupfs::{CgroupError, CgroupManager};
use name::CgroupName;
use resources::{CgroupPolicy, NodeResources, QosTotals, ResourceConfig};

/// Name of the top-level pod cgroup.
pub const KUBEPODS: &str = "kubepods";

/// How pod cgroups are named.
#[derive(Debug, Clone)]
pub struct CgroupLayout {
    /// `cgroupRoot` (absolute, `/` by default).
    pub root: String,
    /// `cgroupsPerQOS`.
    pub per_qos: bool,
    /// `cgroupDriver == "systemd"`.
    pub systemd: bool,
}

fn qos_component(qos: QosClass) -> Option<&'static str> {
    match qos {
        QosClass::Guaranteed => None,
        QosClass::Burstable => Some("burstable"),
        QosClass::BestEffort => Some("besteffort"),
    }
}

impl CgroupLayout {
    /// `<root>/kubepods`.
    pub fn kubepods(&self) -> CgroupName {
        CgroupName::new(&self.root, &[KUBEPODS])
    }

    /// `<root>/kubepods/burstable` or `.../besteffort`; Guaranteed pods have no QoS cgroup.
    pub fn qos_cgroup(&self, qos: QosClass) -> Option<CgroupName> {
        qos_component(qos).map(|q| CgroupName::new(&self.root, &[KUBEPODS, q]))
    }

    /// `<root>/kubepods[/<qos>]/pod<uid>`.
    pub fn pod_cgroup(&self, uid: &str, qos: QosClass) -> CgroupName {
        let pod = format!("pod{uid}");
        match qos_component(qos) {
            Some(q) => CgroupName::new(&self.root, &[KUBEPODS, q, &pod]),
            None => CgroupName::new(&self.root, &[KUBEPODS, &pod]),
        }
    }

    /// The cgroup a name refers to, as the driver spells it (a path, or nested slices).
    pub fn spell(&self, name: &CgroupName) -> String {
        name.for_driver(self.systemd)
    }

    /// The pod's cgroup parent as handed to RunPodSandbox (kubelet's `GetPodContainerName`):
    /// `/kubepods/burstable/pod<uid>` with cgroupfs, the slice path with systemd; without
    /// `cgroupsPerQOS`, the cgroup root.
    pub fn pod_cgroup_parent(&self, uid: &str, qos: QosClass) -> String {
        if !self.per_qos {
            return self.spell(&CgroupName::new(&self.root, &[]));
        }
        self.spell(&self.pod_cgroup(uid, qos))
    }

    /// Every path at which the pod's cgroup may exist, whatever its QoS class was.
    pub fn pod_cgroup_candidates(&self, uid: &str) -> Vec<String> {
        [
            QosClass::Guaranteed,
            QosClass::Burstable,
            QosClass::BestEffort,
        ]
        .into_iter()
        .map(|q| self.pod_cgroup_parent(uid, q))
        .collect()
    }
}

/// Start-up failures of the container manager.
#[derive(Debug, thiserror::Error)]
pub enum CmError {
    /// `cgroupRoot` does not exist (kubelet refuses to start then too).
    #[error("cgroupRoot {0:?} does not exist in the cpu and memory hierarchies; create it or fix the configuration")]
    RootMissing(String),
    /// systemReserved + kubeReserved exceed the node's capacity.
    #[error("resource {resource} has a reservation of {reserved} (systemReserved + kubeReserved) but a capacity of {capacity}; expected capacity >= reservation")]
    OverReserved {
        /// `cpu` (millicores), `memory` (bytes) or `pid`.
        resource: &'static str,
        /// Reserved amount.
        reserved: i64,
        /// Capacity.
        capacity: i64,
    },
    /// A cgroup could not be written.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
}

/// Node capacity: cpu from the online cpus (millicores), memory from `/proc/meminfo` MemTotal
/// (bytes), pids from `kernel.pid_max`, both through procfs; what cannot be read is 0.
pub fn detect_capacity() -> NodeResources {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as i64;
    let memory = procfs::Current::current()
        .map(|m: procfs::Meminfo| m.mem_total as i64)
        .unwrap_or(0);
    let pids = procfs::sys::kernel::pid_max().map_or(0, i64::from);
    NodeResources {
        cpu_milli: cpus * 1000,
        memory,
        pids,
    }
}

/// The node's hugepage sizes, bytes, ascending (from `/sys/kernel/mm/hugepages`, as runc's
/// `HugePageSizes`); empty when the kernel has none.
pub fn hugepage_sizes() -> Vec<u64> {
    hugepage_sizes_in(std::path::Path::new("/sys/kernel/mm/hugepages"))
}

/// [`hugepage_sizes`] read from `dir` (entries `hugepages-<n>kB`).
pub fn hugepage_sizes_in(dir: &std::path::Path) -> Vec<u64> {
    let mut sizes: Vec<u64> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let kb: u64 = name
                .strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse()
                .ok()?;
            kb.checked_mul(1024)
        })
        .collect();
    sizes.sort_unstable();
    sizes
}

/// The node's pre-allocated hugepages: bytes by page size in bytes (`nr_hugepages` × size of
/// each `/sys/kernel/mm/hugepages/hugepages-<n>kB`); sizes with none are left out.
pub fn hugepage_capacity() -> std::collections::BTreeMap<u64, i64> {
    let dir = std::path::Path::new("/sys/kernel/mm/hugepages");
    hugepage_sizes_in(dir)
        .into_iter()
        .filter_map(|size| {
            let n: i64 = std::fs::read_to_string(
                dir.join(format!("hugepages-{}kB/nr_hugepages", size / 1024)),
            )
            .ok()?
            .trim()
            .parse()
            .ok()?;
            (n > 0).then(|| (size, n.saturating_mul(size as i64)))
        })
        .collect()
}

/// Node-level settings of the container manager, built from the typed configuration
/// (`Config::node_config`); this module does not read the configuration file.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Names.
    pub layout: CgroupLayout,
    /// Pod cgroup knobs.
    pub policy: CgroupPolicy,
    /// Node capacity.
    pub capacity: NodeResources,
    /// `systemReserved` (millicores, bytes, pids).
    pub system_reserved: NodeResources,
    /// `kubeReserved` (millicores, bytes, pids).
    pub kube_reserved: NodeResources,
    /// `enforceNodeAllocatable` contains `pods`.
    pub enforce_pods: bool,
    /// `qosReserved.memory` percent.
    pub qos_reserved_memory: Option<i64>,
}

/// The container manager: one per agent.
pub struct ContainerManager {
    cgroups: Arc<dyn CgroupManager>,
    cfg: NodeConfig,
    /// The pods known, each with its share of the QoS totals (computed once per pod object: the
    /// QoS cgroups are summed over every pod for each pod that comes or goes).
    pods: Mutex<HashMap<String, (Arc<Pod>, QosTotals)>>,
    /// The values last written to each QoS cgroup (by cgroupfs path). Held while the QoS
    /// cgroups are computed and written, so that the last computation is the last write.
    qos_written: Mutex<HashMap<String, ResourceConfig>>,
    metrics: Option<Arc<crate::metrics::Metrics>>,
    recorder: Option<crate::events::Recorder>,
    clock: crate::clock::SharedClock,
    /// Orphaned pod cgroups that could not be removed yet.
    orphans: Mutex<orphans::StuckMap>,
    /// Pod UID → the pod's cgroups under a QoS class it has left (its resources were edited),
    /// removed at its syncs once its old containers are gone.
    left_qos: Mutex<HashMap<String, Vec<String>>>,
    /// The `memory.high` last written to `kubepods` (0: `max`).
    kubepods_memory_high: Mutex<Option<i64>>,
}

impl ContainerManager {
    /// A manager writing through `cgroups`.
    pub fn new(cgroups: Arc<dyn CgroupManager>, cfg: NodeConfig) -> Self {
        Self {
            cgroups,
            cfg,
            pods: Mutex::new(HashMap::new()),
            qos_written: Mutex::new(HashMap::new()),
            metrics: None,
            recorder: None,
            clock: crate::clock::system(),
            orphans: Mutex::new(HashMap::new()),
            left_qos: Mutex::new(HashMap::new()),
            kubepods_memory_high: Mutex::new(None),
        }
    }

    /// The node's capacity (cpu millicores, memory bytes, pids).
    pub fn capacity(&self) -> NodeResources {
        self.cfg.capacity
    }

    /// systemReserved + kubeReserved (cpu millicores, memory bytes, pids), saturating.
    pub fn reserved(&self) -> NodeResources {
        let (s, k) = (self.cfg.system_reserved, self.cfg.kube_reserved);
        NodeResources {
            cpu_milli: s.cpu_milli.saturating_add(k.cpu_milli),
            memory: s.memory.saturating_add(k.memory),
            pids: s.pids.saturating_add(k.pids),
        }
    }

    /// Records events (an orphaned pod cgroup that cannot be removed) in `recorder`.
    pub fn with_recorder(mut self, recorder: crate::events::Recorder) -> Self {
        self.recorder = Some(recorder);
        self
    }

    /// Reads time (retries of orphaned cgroups) from `clock`.
    pub fn with_clock(mut self, clock: crate::clock::SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// Times cgroup operations in `kubelet_cgroup_manager_duration_seconds`.
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    fn timed<T>(&self, operation: &str, f: impl FnOnce() -> T) -> T {
        let t = crate::clock::monotonic_now();
        let r = f();
        if let Some(m) = &self.metrics {
            crate::metrics::Metrics::observe(
                &m.cgroup_manager_duration,
                operation,
                t.elapsed().as_secs_f64(),
            );
        }
        r
    }

    /// The naming layout.
    pub fn layout(&self) -> &CgroupLayout {
        &self.cfg.layout
    }

    /// Node memory capacity, bytes (for Burstable oom_score_adj).
    pub fn memory_capacity(&self) -> i64 {
        self.cfg.capacity.memory
    }

    /// Pod cgroup knobs.
    pub fn policy(&self) -> &CgroupPolicy {
        &self.cfg.policy
    }

    /// Node allocatable: capacity minus reservations.
    pub fn allocatable(&self) -> NodeResources {
        resources::node_allocatable(
            self.cfg.capacity,
            self.cfg.system_reserved,
            self.cfg.kube_reserved,
        )
    }

    /// The values of `kubepods`: allocatable when `enforceNodeAllocatable` has `pods`, else
    /// capacity.
    pub fn kubepods_config(&self) -> ResourceConfig {
        resources::kubepods_config(if self.cfg.enforce_pods {
            self.allocatable()
        } else {
            self.cfg.capacity
        })
    }

    /// Checks `cgroupRoot` and creates `kubepods` and the QoS cgroups with their values
    /// (kubelet's `setupNode` + `qosContainerManager.Start`), then records kubelet's Normal event
    /// `NodeAllocatableEnforced` on the node. Without `cgroupsPerQOS`, only checks the root.
    ///
    /// Errors: [`CmError::RootMissing`], or the failed cgroup write.
    pub fn start(&self) -> Result<(), CmError> {
        self.validate_reservations()?;
        let l = &self.cfg.layout;
        let root = l.spell(&CgroupName::new(&l.root, &[]));
        if !self.cgroups.exists(&root) {
            return Err(CmError::RootMissing(l.root.clone()));
        }
        if !l.per_qos {
            return Ok(());
        }
        let kubepods = l.spell(&l.kubepods());
        self.cgroups.create(&kubepods, &self.kubepods_config())?;
        info!(cgroup = %kubepods, allocatable = ?self.allocatable(), "node allocatable cgroup ready");
        // kubelet's `enforceNodeAllocatableCgroups`, once `kubepods` has its values.
        if let Some(r) = &self.recorder {
            r.normal(
                "node",
                "NodeAllocatableEnforced",
                "Updated Node Allocatable limit across pods",
            );
        }
        self.update_qos()
    }

    /// Sets `memory.high` of `kubepods` (cgroup v2; `None`: `max`), the eviction manager's
    /// tripwire: cgroup v2 has no usage threshold to be notified of (v1's
    /// `cgroup.event_control`), so the pods' cgroup is given a `memory.high` at the usage where a
    /// hard memory threshold is met. Crossing it increments `memory.events` `high`, which wakes
    /// the eviction manager, and the kernel reclaims and slows the allocating tasks meanwhile, so
    /// the eviction comes before the `memory.max` that would OOM-kill. (kubelet has no kernel
    /// notification on v2; its MemoryQoS puts `memory.high` on pods and containers, not here.)
    /// Written only when it changes; nothing on v1 or without `cgroupsPerQOS`.
    ///
    /// Errors: the cgroup write that failed.
    pub fn set_kubepods_memory_high(&self, high: Option<i64>) -> Result<(), CmError> {
        let l = &self.cfg.layout;
        if !l.per_qos {
            return Ok(());
        }
        let value = high.unwrap_or(0).max(0);
        let mut last = self
            .kubepods_memory_high
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if *last == Some(value) {
            return Ok(());
        }
        let cfg = ResourceConfig {
            memory_high: Some(value),
            ..Default::default()
        };
        self.timed("update", || {
            self.cgroups.update(&l.spell(&l.kubepods()), &cfg)
        })?;
        *last = Some(value);
        Ok(())
    }

    /// Refuses reservations above capacity (kubelet's `validateNodeAllocatable`). A sum of
    /// reservations beyond `i64` counts as `i64::MAX`, above any capacity (the configuration
    /// refuses such sums before this).
    ///
    /// Errors: [`CmError::OverReserved`] naming the resource.
    pub fn validate_reservations(&self) -> Result<(), CmError> {
        let (c, s, k) = (
            self.cfg.capacity,
            self.cfg.system_reserved,
            self.cfg.kube_reserved,
        );
        for (resource, cap, reserved) in [
            ("cpu", c.cpu_milli, s.cpu_milli.saturating_add(k.cpu_milli)),
            ("memory", c.memory, s.memory.saturating_add(k.memory)),
            ("pid", c.pids, s.pids.saturating_add(k.pids)),
        ] {
            if reserved > 0 && cap > 0 && reserved > cap {
                return Err(CmError::OverReserved {
                    resource,
                    reserved,
                    capacity: cap,
                });
            }
        }
        Ok(())
    }

    /// Updates the QoS cgroups for the pods known now (kubelet's `UpdateCgroups`), writing only
    /// the cgroups whose values changed since the last write (a burst of pods would otherwise
    /// rewrite both QoS cgroups in every hierarchy for each pod).
    ///
    /// Errors: the failed cgroup write (that cgroup is written in full the next time).
    pub fn update_qos(&self) -> Result<(), CmError> {
        self.write_qos(false)
    }

    /// [`ContainerManager::update_qos`] writing every value again, whatever was written before
    /// (kubelet's periodic QoS update, once a minute: a value changed behind nodelet's back is
    /// put back).
    ///
    /// Errors: the failed cgroup write.
    pub fn resync_qos(&self) -> Result<(), CmError> {
        self.write_qos(true)
    }

    fn write_qos(&self, all: bool) -> Result<(), CmError> {
        let l = &self.cfg.layout;
        if !l.per_qos {
            return Ok(());
        }
        let mut written = self.qos_written.lock().unwrap_or_else(|e| e.into_inner());
        if all {
            written.clear();
        }
        let mut totals = QosTotals::default();
        for (_, share) in self.pods.lock().unwrap_or_else(|e| e.into_inner()).values() {
            totals.merge(share);
        }
        let memory = if self.cfg.enforce_pods {
            self.allocatable().memory
        } else {
            self.cfg.capacity.memory
        };
        let memory_qos = self.cfg.policy.memory_qos_throttling_factor.is_some();
        let (burstable, besteffort) =
            resources::qos_configs(&totals, memory, self.cfg.qos_reserved_memory, memory_qos);
        // MemoryQoS: the Guaranteed and Burstable pods' memory requests protected in kubepods
        // (kubelet's `setMemoryQoS`: a child's protection is capped by its parent's); only that
        // value, the rest of kubepods is allocatable's.
        let guaranteed = memory_qos.then(|| ResourceConfig {
            memory_min: Some(
                totals
                    .guaranteed_memory_request
                    .saturating_add(totals.burstable_memory_request),
            ),
            ..Default::default()
        });
        for (qos, cfg) in [
            (QosClass::Guaranteed, guaranteed),
            (QosClass::Burstable, Some(burstable)),
            (QosClass::BestEffort, Some(besteffort)),
        ] {
            let Some(cfg) = cfg else { continue };
            let Some(name) = l
                .qos_cgroup(qos)
                .or_else(|| (qos == QosClass::Guaranteed).then(|| l.kubepods()))
            else {
                continue;
            };
            let path = l.spell(&name);
            // Created earlier by nodelet: only the values; else (or when that fails: removed
            // behind nodelet's back) the directories too.
            let created = match written.remove(&path) {
                Some(before) if before == cfg => {
                    written.insert(path, before);
                    continue;
                }
                before => before.is_some(),
            };
            self.timed("update", || {
                if created && self.cgroups.update(&path, &cfg).is_ok() {
                    return Ok(());
                }
                self.cgroups.create(&path, &cfg)
            })?;
            written.insert(path, cfg);
        }
        Ok(())
    }

    /// Makes the pod's cgroup exist with kubelet's values, after updating the QoS cgroups for it
    /// (kubelet's `podContainerManager.EnsureExists`). Returns the cgroup parent for
    /// RunPodSandbox.
    ///
    /// Errors: the failed cgroup write.
    pub fn ensure_pod(&self, pod: &Arc<Pod>) -> Result<String, CmError> {
        let uid = crate::pod::pod_uid(pod).to_owned();
        let l = &self.cfg.layout;
        let qos = pod_qos_class(pod);
        let parent = l.pod_cgroup_parent(&uid, qos);
        if !l.per_qos {
            return Ok(parent);
        }
        self.remove_left_qos(&uid);
        // Same pod object as last time and its cgroup is there: nothing to write (kubelet's
        // EnsureExists); a new or changed pod rewrites the QoS cgroups and its own.
        let same = {
            let mut pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
            let same = pods.get(&uid).is_some_and(|(p, _)| Arc::ptr_eq(p, pod));
            if !same {
                // A new or edited pod (also the first sync after an agent restart) with a
                // cgroup under another QoS class: it changed class, and is made again in its
                // new class's cgroup (its pod spec hash changed); the old one goes once its
                // containers have stopped.
                let others: Vec<String> = l
                    .pod_cgroup_candidates(&uid)
                    .into_iter()
                    .filter(|c| *c != parent && self.cgroups.exists(c))
                    .collect();
                if !others.is_empty() {
                    info!(uid, qos = ?qos, left = ?others, "pod changed QoS class; its cgroup moves");
                    self.left_qos
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(uid.clone(), others);
                }
                // The pod's share of the QoS totals, parsed once per pod object.
                let mut share = QosTotals::default();
                share.add(pod);
                pods.insert(uid, (pod.clone(), share));
            }
            same
        };
        if same && self.cgroups.exists(&parent) {
            return Ok(parent);
        }
        self.update_qos()?;
        self.timed("create", || {
            self.cgroups.create(
                &parent,
                &resources::pod_resource_config(pod, &self.cfg.policy),
            )
        })?;
        Ok(parent)
    }

    /// The pod's cgroup parent when [`Self::ensure_pod`] has nothing to do for `pod`: the same
    /// pod object as last time, its cgroup there, no cgroup of a former QoS class left (or no
    /// QoS hierarchy at all). `None` when `ensure_pod` must run. Reads the cgroup file system
    /// (an existence check), writes nothing: a pod worker calls it on its own thread, and
    /// `ensure_pod` on the blocking pool ([`crate::blocking`]).
    pub fn pod_cgroup_if_current(&self, pod: &Arc<Pod>) -> Option<String> {
        let uid = crate::pod::pod_uid(pod);
        let l = &self.cfg.layout;
        let parent = l.pod_cgroup_parent(uid, pod_qos_class(pod));
        if !l.per_qos {
            return Some(parent);
        }
        if self
            .left_qos
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(uid)
        {
            return None;
        }
        let same = self
            .pods
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .is_some_and(|(p, _)| Arc::ptr_eq(p, pod));
        (same && self.cgroups.exists(&parent)).then_some(parent)
    }

    /// Removes the pod's cgroups under QoS classes it has left; those still holding processes
    /// (its old containers, not yet stopped) stay for its next sync.
    fn remove_left_qos(&self, uid: &str) {
        let mut left = self.left_qos.lock().unwrap_or_else(|e| e.into_inner());
        let Some(cgroups) = left.get_mut(uid) else {
            return;
        };
        cgroups.retain(|cg| match self.timed("destroy", || self.cgroups.destroy(cg)) {
            Ok(()) => {
                debug!(uid, cgroup = %cg, "removed the pod's cgroup of its former QoS class");
                false
            }
            Err(e) => {
                debug!(uid, cgroup = %cg, error = %e, "the pod's cgroup of its former QoS class is still in use");
                true
            }
        });
        if cgroups.is_empty() {
            left.remove(uid);
        }
    }

    /// Forgets the pod and removes its cgroup from every hierarchy, then updates the QoS cgroups.
    pub fn remove_pod(&self, uid: &str) {
        if !self.cfg.layout.per_qos {
            self.pods
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(uid);
            return;
        }
        if let Err((cg, e)) = self.destroy_pod_cgroups(uid) {
            warn!(uid, cgroup = %cg, error = %e, "cannot remove pod cgroup; housekeeping retries it");
        }
        self.forget_pod(uid);
    }

    /// Forgets the pod and updates the QoS cgroups without it.
    fn forget_pod(&self, uid: &str) {
        self.pods
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
        self.left_qos
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
        if !self.cfg.layout.per_qos {
            return;
        }
        if let Err(e) = self.update_qos() {
            warn!(error = %e, "cannot update QoS cgroups");
        }
    }
}

/// Mount points of the cgroup hierarchies on this host (v1 controllers, named hierarchies and the
/// v2 unified mount), read from `/proc/self/mountinfo`; empty when it cannot be read.
pub fn cgroup_mounts() -> Vec<PathBuf> {
    cgroupfs::Hierarchies::current().all_mounts()
}

/// Removes a cgroup directory and its child cgroups (deepest first) in each of `mounts`.
/// Only empty cgroups can be removed; a cgroup that still has tasks is left and reported.
///
/// Errors: the first `rmdir` failure other than "does not exist".
pub fn remove_cgroup_everywhere(mounts: &[PathBuf], cgroup: &str) -> std::io::Result<()> {
    let rel = cgroup.trim_start_matches('/');
    if rel.is_empty() || rel.split('/').any(|c| c == ".." || c == ".") {
        return Ok(());
    }
    let mut first_err = None;
    for m in mounts {
        if let Err(e) = remove_tree(&m.join(rel)) {
            if e.kind() != std::io::ErrorKind::NotFound {
                first_err.get_or_insert(e);
            }
        }
    }
    first_err.map_or(Ok(()), Err)
}

fn remove_tree(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            remove_tree(&entry.path())?;
        }
    }
    match std::fs::remove_dir(dir) {
        // A real cgroup directory goes with its pseudo-files; a directory laid out like one on an
        // ordinary filesystem (a test fixture) needs its files removed first.
        Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty => {
            for entry in std::fs::read_dir(dir)?.flatten() {
                if entry.file_type()?.is_file() {
                    std::fs::remove_file(entry.path())?;
                }
            }
            std::fs::remove_dir(dir)
        }
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_manager_builds_the_qos_tree_and_pod_cgroups() {
        use cgroupfs::tests::{fixture, CPU_V1, MEMORY_V1};
        let tmp = tempfile::tempdir().unwrap();
        let mut h = cgroupfs::Hierarchies::default();
        for (c, knobs) in [("cpu", CPU_V1), ("memory", MEMORY_V1)] {
            std::fs::create_dir_all(tmp.path().join(c).join("root")).unwrap();
            for cg in [
                "kubepods",
                "kubepods/burstable",
                "kubepods/besteffort",
                "kubepods/burstable/podu1",
            ] {
                fixture(&tmp.path().join(c).join("root").join(cg), knobs);
            }
            h.v1.push((vec![c.to_string()], tmp.path().join(c)));
        }
        let layout = CgroupLayout {
            root: "/root".into(),
            per_qos: true,
            systemd: false,
        };
        let cfg = NodeConfig {
            layout,
            policy: CgroupPolicy::default(),
            capacity: NodeResources {
                cpu_milli: 2000,
                memory: 4 << 30,
                pids: 0,
            },
            system_reserved: NodeResources {
                cpu_milli: 500,
                memory: 1 << 30,
                pids: 0,
            },
            kube_reserved: NodeResources::default(),
            enforce_pods: true,
            qos_reserved_memory: None,
        };
        let cm = ContainerManager::new(Arc::new(cgroupfs::Cgroupfs::new(h)), cfg);
        cm.start().unwrap();
        let read = |p: &str| {
            std::fs::read_to_string(tmp.path().join(p))
                .unwrap()
                .trim()
                .to_string()
        };
        assert_eq!(read("cpu/root/kubepods/cpu.shares"), "1536");
        assert_eq!(
            read("memory/root/kubepods/memory.limit_in_bytes"),
            (3u64 << 30).to_string()
        );
        assert_eq!(read("cpu/root/kubepods/besteffort/cpu.shares"), "2");
        assert_eq!(read("cpu/root/kubepods/burstable/cpu.shares"), "2");
        let pod: Arc<Pod> = Arc::new(serde_yaml::from_str("apiVersion: v1\nkind: Pod\nmetadata: {name: p, uid: u1}\nspec: {containers: [{name: a, image: i, resources: {requests: {cpu: 250m}}}]}").unwrap());
        assert_eq!(
            cm.ensure_pod(&pod).unwrap(),
            "/root/kubepods/burstable/podu1"
        );
        assert_eq!(
            read("cpu/root/kubepods/burstable/cpu.shares"),
            "256",
            "QoS updated before the pod cgroup"
        );
        assert_eq!(read("cpu/root/kubepods/burstable/podu1/cpu.shares"), "256");
        // An orphan from an earlier run is removed; the desired pod is not.
        std::fs::create_dir_all(tmp.path().join("cpu/root/kubepods/besteffort/podold")).unwrap();
        let desired: std::collections::HashSet<String> = ["u1".to_string()].into();
        assert_eq!(
            cm.cleanup_orphans(&desired, &std::collections::HashSet::new()),
            vec!["old".to_string()]
        );
        assert!(tmp
            .path()
            .join("cpu/root/kubepods/burstable/podu1")
            .is_dir());
        cm.remove_pod("u1");
        assert!(!tmp
            .path()
            .join("cpu/root/kubepods/burstable/podu1")
            .exists());
        assert_eq!(read("cpu/root/kubepods/burstable/cpu.shares"), "2");
        // Reservations above capacity are a start-up error.
        let over = ContainerManager::new(
            cm.cgroups.clone(),
            NodeConfig {
                system_reserved: NodeResources {
                    cpu_milli: 0,
                    memory: 100 << 30,
                    pids: 0,
                },
                ..cm.cfg.clone()
            },
        );
        assert!(matches!(
            over.start(),
            Err(CmError::OverReserved {
                resource: "memory",
                ..
            })
        ));
        // A missing root is a start-up error.
        let missing = ContainerManager::new(
            Arc::new(cgroupfs::Cgroupfs::new(cgroupfs::Hierarchies {
                v1: vec![(vec!["cpu".into()], tmp.path().join("cpu"))],
                unified: None,
            })),
            NodeConfig {
                layout: CgroupLayout {
                    root: "/absent".into(),
                    per_qos: true,
                    systemd: false,
                },
                ..cm.cfg.clone()
            },
        );
        assert!(matches!(missing.start(), Err(CmError::RootMissing(_))));
    }

    /// A manager of a 2-core, 4 GiB node over the in-memory cgroups `mem`.
    fn in_memory(mem: &Arc<crate::testing::cgroups::MemCgroups>) -> ContainerManager {
        let cfg = crate::testing::cgroups::node_config(NodeResources {
            cpu_milli: 2000,
            memory: 4 << 30,
            pids: 0,
        });
        ContainerManager::new(mem.clone(), cfg)
    }

    /// [`in_memory`] over fresh in-memory cgroups with only the root, started.
    fn started_in_memory() -> (Arc<crate::testing::cgroups::MemCgroups>, ContainerManager) {
        let mem = Arc::new(crate::testing::cgroups::MemCgroups::default());
        mem.create("/", &ResourceConfig::default()).unwrap();
        let cm = in_memory(&mem);
        cm.start().unwrap();
        (mem, cm)
    }

    /// Pod `p` (uid `u1`) with one container whose `resources` are the given YAML flow body
    /// (`""` for BestEffort, `"requests: {memory: 64Mi}"` for Burstable).
    fn pod_u1(resources: &str) -> Arc<Pod> {
        Arc::new(serde_yaml::from_str(&format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: p, uid: u1}}\nspec: {{containers: [{{name: a, image: i, resources: {{{resources}}}}}]}}")).unwrap())
    }

    #[test]
    fn a_pod_that_changes_qos_class_leaves_no_cgroup_in_the_old_class() {
        let (mem, cm) = started_in_memory();
        let best_effort = pod_u1("");
        assert_eq!(
            cm.ensure_pod(&best_effort).unwrap(),
            "/kubepods/besteffort/podu1"
        );
        // Edited to Burstable while its container still runs in the old cgroup: the new one is
        // made, the old one stays (busy) ...
        mem.set_busy("/kubepods/besteffort/podu1", vec![42]);
        let burstable = pod_u1("requests: {memory: 64Mi}");
        assert_eq!(
            cm.ensure_pod(&burstable).unwrap(),
            "/kubepods/burstable/podu1"
        );
        assert!(mem.has("/kubepods/besteffort/podu1"));
        assert!(mem.has("/kubepods/burstable/podu1"));
        // ... and goes at the next sync once the old container has stopped.
        mem.set_busy("/kubepods/besteffort/podu1", vec![]);
        cm.ensure_pod(&burstable).unwrap();
        assert!(!mem.has("/kubepods/besteffort/podu1"));
        assert!(mem.has("/kubepods/burstable/podu1"));
        assert!(cm.left_qos.lock().unwrap().is_empty());
        // Edited while the agent was down: the restarted agent finds the old class's cgroup
        // at the pod's first sync.
        mem.create("/kubepods/besteffort/podu1", &ResourceConfig::default())
            .unwrap();
        let restarted = in_memory(&mem);
        restarted
            .ensure_pod(&pod_u1("requests: {memory: 64Mi}"))
            .unwrap();
        restarted.ensure_pod(&burstable).unwrap();
        assert!(!mem.has("/kubepods/besteffort/podu1"));
        assert!(mem.has("/kubepods/burstable/podu1"));
    }

    #[test]
    fn a_pod_cgroup_is_current_only_for_the_same_pod_object_with_its_cgroup_there() {
        let (mem, cm) = started_in_memory();
        let best_effort = pod_u1("");
        assert_eq!(
            cm.pod_cgroup_if_current(&best_effort),
            None,
            "never ensured"
        );
        cm.ensure_pod(&best_effort).unwrap();
        assert_eq!(
            cm.pod_cgroup_if_current(&best_effort).as_deref(),
            Some("/kubepods/besteffort/podu1")
        );
        // An equal pod from a new manifest read is another object: ensure_pod runs again.
        assert_eq!(cm.pod_cgroup_if_current(&pod_u1("")), None);
        // Its cgroup removed behind the agent's back: made again.
        mem.destroy("/kubepods/besteffort/podu1").unwrap();
        assert_eq!(cm.pod_cgroup_if_current(&best_effort), None);
        cm.ensure_pod(&best_effort).unwrap();
        // Moved to another QoS class with its old cgroup still busy: ensure_pod has it to
        // remove later.
        mem.set_busy("/kubepods/besteffort/podu1", vec![42]);
        let burstable = pod_u1("requests: {memory: 64Mi}");
        cm.ensure_pod(&burstable).unwrap();
        assert_eq!(cm.pod_cgroup_if_current(&burstable), None);
        mem.set_busy("/kubepods/besteffort/podu1", vec![]);
        cm.ensure_pod(&burstable).unwrap();
        assert_eq!(
            cm.pod_cgroup_if_current(&burstable).as_deref(),
            Some("/kubepods/burstable/podu1")
        );
    }

    #[test]
    fn qos_cgroups_are_written_when_their_values_change_and_all_once_a_minute() {
        let (mem, cm) = started_in_memory();
        let qos = |log: Vec<String>| -> Vec<String> {
            log.into_iter()
                .filter(|l| l.ends_with("/burstable") || l.ends_with("/besteffort"))
                .collect()
        };
        assert_eq!(
            qos(mem.log()),
            ["create /kubepods/burstable", "create /kubepods/besteffort"]
        );
        let pod = |uid: &str, cpu: &str| -> Arc<Pod> {
            Arc::new(serde_yaml::from_str(&format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: p{uid}, uid: {uid}}}\nspec: {{containers: [{{name: a, image: i, resources: {{requests: {{cpu: {cpu}}}}}}}]}}")).unwrap())
        };
        // A Burstable pod changes the burstable cgroup's cpu.shares only: one update, no mkdir.
        let before = mem.log().len();
        cm.ensure_pod(&pod("u1", "250m")).unwrap();
        assert_eq!(
            qos(mem.log()[before..].to_vec()),
            ["update /kubepods/burstable"]
        );
        // Nothing changed: nothing written.
        let before = mem.log().len();
        cm.update_qos().unwrap();
        assert!(qos(mem.log()[before..].to_vec()).is_empty());
        // The minute's pass writes both, whatever was written before.
        cm.resync_qos().unwrap();
        assert_eq!(
            qos(mem.log()[before..].to_vec()),
            ["create /kubepods/burstable", "create /kubepods/besteffort"]
        );
        assert_eq!(
            mem.value("/kubepods/burstable").unwrap().cpu_shares,
            Some(256)
        );
        // Removed behind nodelet's back: the next change makes it again.
        mem.destroy("/kubepods/burstable").unwrap();
        let before = mem.log().len();
        cm.ensure_pod(&pod("u2", "100m")).unwrap();
        assert_eq!(
            qos(mem.log()[before..].to_vec()),
            ["create /kubepods/burstable"]
        );
        assert_eq!(
            mem.value("/kubepods/burstable").unwrap().cpu_shares,
            Some(358)
        );
    }

    #[test]
    fn pod_cgroups_sit_where_kubelet_puts_them() {
        let l = CgroupLayout {
            root: "/".into(),
            per_qos: true,
            systemd: false,
        };
        assert_eq!(
            l.pod_cgroup_parent("u-1", QosClass::Guaranteed),
            "/kubepods/podu-1"
        );
        assert_eq!(
            l.pod_cgroup_parent("u-1", QosClass::Burstable),
            "/kubepods/burstable/podu-1"
        );
        assert_eq!(
            l.pod_cgroup_parent("u-1", QosClass::BestEffort),
            "/kubepods/besteffort/podu-1"
        );
        let s = CgroupLayout {
            systemd: true,
            ..l.clone()
        };
        assert_eq!(
            s.pod_cgroup_parent("u-1", QosClass::Burstable),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podu_1.slice"
        );
        assert_eq!(
            s.pod_cgroup_parent("u-1", QosClass::Guaranteed),
            "/kubepods.slice/kubepods-podu_1.slice"
        );
        let r = CgroupLayout {
            root: "/test".into(),
            ..l
        };
        assert_eq!(
            r.pod_cgroup_parent("x", QosClass::BestEffort),
            "/test/kubepods/besteffort/podx"
        );
    }

    #[test]
    fn removal_is_deepest_first_and_refuses_escapes() {
        let tmp = tempfile::tempdir().unwrap();
        let mounts = vec![tmp.path().join("cpu"), tmp.path().join("memory")];
        for m in &mounts {
            std::fs::create_dir_all(m.join("kubepods/podx/c1/nested")).unwrap();
        }
        remove_cgroup_everywhere(&mounts, "/kubepods/podx").unwrap();
        for m in &mounts {
            assert!(!m.join("kubepods/podx").exists());
            assert!(m.join("kubepods").exists());
        }
        remove_cgroup_everywhere(&mounts, "/../etc").unwrap();
        remove_cgroup_everywhere(&mounts, "/kubepods/absent").unwrap();
    }

    #[test]
    fn mounts_are_found_on_this_host() {
        // Every Linux host running these tests has at least one cgroup mount.
        assert!(!cgroup_mounts().is_empty());
    }
}
