//! The eviction manager's view of this node and its hands on it (kubelet's summary provider,
//! `activePodsFunc`, `killPodFunc` and `podCleanedUpFunc`, plus the notifier registrations):
//! signals from cgroup files (a pod's `pids.current` through cgroups-rs), `/proc` (through
//! procfs) and `statvfs`; pods from the status manager; kills through the pod workers.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cgroups_rs::fs::pid::PidController;
use k8s_openapi::api::core::v1::Pod;
use tracing::{debug, warn};

use super::local_storage::ContainerUsage;
use super::manager::{EvictionNode, Resource};
use super::notifier::MemcgNotifier;
use super::signals::{self, Observation};
use super::threshold::Threshold;
use super::REASON;
use crate::cm::cgroupfs::Hierarchies;
use crate::cm::CgroupLayout;
use crate::events::Recorder;
use crate::podworkers::{PodSyncer, PodWorkers};
use crate::status::failed::{FailPod, FailedPods, Failure};
use crate::status::StatusManager;
use crate::volume::metrics;

/// PSI trigger of the cgroup v2 notifier: 100 ms of memory stall in any 1 s window.
const PSI_STALL: std::time::Duration = std::time::Duration::from_millis(100);
const PSI_WINDOW: std::time::Duration = std::time::Duration::from_secs(1);

/// Where the signals are read.
#[derive(Debug, Clone)]
pub struct Paths {
    /// The cgroup hierarchies.
    pub hierarchies: Hierarchies,
    /// The pod cgroup layout (cgroupRoot, driver, cgroupsPerQOS).
    pub layout: CgroupLayout,
    /// Node memory capacity, bytes.
    pub memory_capacity: i64,
    /// A directory on nodefs (the agent's root directory).
    pub nodefs: PathBuf,
    /// A directory on imagefs (from CRI `ImageFsInfo`), or `None` when it is nodefs.
    pub imagefs: Option<PathBuf>,
    /// `podLogsDir`.
    pub pod_logs_dir: PathBuf,
}

impl Paths {
    /// The directory of a cgroup (cgroupfs path spelled for the driver) for `controller`: under
    /// its v1 mount, else under the v2 mount.
    fn cgroup_dir(&self, controller: &str, spelled: &str) -> Option<PathBuf> {
        let base = self
            .hierarchies
            .v1_mount(controller)
            .map(Path::to_path_buf)
            .or_else(|| self.hierarchies.unified.clone())?;
        Some(base.join(spelled.trim_start_matches('/')))
    }

    /// The root memory cgroup (v1 only: the v2 root has no usage file).
    pub fn root_memcg(&self) -> Option<PathBuf> {
        self.hierarchies.v1_mount("memory").map(Path::to_path_buf)
    }

    /// The `kubepods` memory cgroup.
    pub fn kubepods_memcg(&self) -> Option<PathBuf> {
        self.cgroup_dir("memory", &self.layout.spell(&self.layout.kubepods()))
    }

    /// The directory of `pod`'s cgroup for `controller` (`None` without `cgroupsPerQOS`).
    pub fn pod_cgroup(&self, controller: &str, pod: &Pod) -> Option<PathBuf> {
        if !self.layout.per_qos {
            return None;
        }
        let uid = crate::pod::pod_uid(pod);
        let spelled = self
            .layout
            .spell(&self.layout.pod_cgroup(uid, crate::qos::pod_qos_class(pod)));
        self.cgroup_dir(controller, &spelled)
    }

    /// `memory.available`: from the root memory cgroup on v1, from `/proc/meminfo` and the
    /// unified root's `memory.stat` on v2.
    pub fn memory_available(&self) -> Option<Observation> {
        match self.root_memcg() {
            Some(r) => signals::memory_available(&r, self.memory_capacity),
            None => self
                .hierarchies
                .unified
                .as_deref()
                .filter(|_| self.hierarchies.is_v2())
                .and_then(|u| signals::memory_available_v2(u, self.memory_capacity)),
        }
    }

    /// Every signal this node can observe now.
    pub fn observe(&self) -> HashMap<String, Observation> {
        let mut out = HashMap::new();
        if let Some(o) = self.memory_available() {
            out.insert("memory.available".to_string(), o);
        }
        if let Some(o) = self
            .kubepods_memcg()
            .and_then(|k| allocatable_available(&k))
        {
            out.insert("allocatableMemory.available".to_string(), o);
        }
        if let Some((bytes, inodes)) = signals::filesystem(&self.nodefs) {
            out.insert("nodefs.available".to_string(), bytes);
            out.insert("nodefs.inodesFree".to_string(), inodes);
        }
        let imagefs = self.imagefs.as_deref().unwrap_or(&self.nodefs);
        if let Some((bytes, inodes)) = signals::filesystem(imagefs) {
            out.insert("imagefs.available".to_string(), bytes);
            out.insert("imagefs.inodesFree".to_string(), inodes);
        }
        if let Some(o) = signals::pid_available_now() {
            out.insert("pid.available".to_string(), o);
        }
        out
    }
}

/// `allocatableMemory.available` from a v1 (`memory.limit_in_bytes`) or v2 (`memory.max`)
/// kubepods cgroup.
fn allocatable_available(kubepods: &Path) -> Option<Observation> {
    if let Some(o) = signals::allocatable_memory_available(kubepods) {
        return Some(o);
    }
    let max: i64 = std::fs::read_to_string(kubepods.join("memory.max"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Observation {
        available: max - signals::working_set_v2(kubepods)?,
        capacity: max,
    })
}

/// The runtime's side of local storage: containers' writable layers through CRI, read from the
/// eviction manager's thread on the agent's tokio runtime.
#[derive(Clone)]
pub struct RuntimeStats {
    /// The CRI client.
    pub cri: crate::cri::Cri,
    /// The agent's runtime, which drives the calls.
    pub handle: tokio::runtime::Handle,
}

impl RuntimeStats {
    /// The newest instance of each of the pod's containers (ListContainers) with its stats
    /// (ListContainerStats; `None` when the runtime gives none), by container name. `None` when
    /// the runtime cannot be asked.
    fn container_stats(
        &self,
        uid: &str,
    ) -> Option<Vec<(String, Option<crate::cri::api::ContainerStats>)>> {
        use crate::cri::RuntimeService;
        let sel = HashMap::from([(
            crate::kuberuntime::labels::POD_UID.to_owned(),
            uid.to_owned(),
        )]);
        let (containers, mut stats) = self
            .handle
            .block_on(async {
                tokio::try_join!(
                    self.cri
                        .list_containers_brief(sel.clone(), &crate::kuberuntime::labels::BRIEF),
                    self.cri.list_container_stats(sel)
                )
            })
            .map_err(|e| debug!(uid, error = %e, "container stats"))
            .ok()?;
        let mut newest: HashMap<String, (i64, String)> = HashMap::new();
        for c in containers {
            let name = c.metadata.map(|m| m.name).unwrap_or_default();
            let e = newest.entry(name).or_insert((i64::MIN, String::new()));
            if c.created_at >= e.0 {
                *e = (c.created_at, c.id);
            }
        }
        Some(
            newest
                .into_iter()
                .map(|(name, (_, id))| {
                    let at = stats
                        .iter()
                        .position(|s| s.attributes.as_ref().is_some_and(|a| a.id == id));
                    (name, at.map(|i| stats.swap_remove(i)))
                })
                .collect(),
        )
    }

    /// Each current container's writable layer, bytes (0 when the runtime gives none).
    fn writable_layers(&self, uid: &str) -> Option<Vec<(String, i64)>> {
        let layer = |s: &crate::cri::api::ContainerStats| {
            let u = s.writable_layer.as_ref()?.used_bytes.as_ref()?.value;
            Some(i64::try_from(u).unwrap_or(i64::MAX))
        };
        Some(
            self.container_stats(uid)?
                .into_iter()
                .map(|(name, s)| (name, s.as_ref().and_then(layer).unwrap_or(0)))
                .collect(),
        )
    }

    /// Each current container's memory working set, bytes, where the runtime gives one.
    fn working_sets(&self, uid: &str) -> Vec<(String, i64)> {
        let ws = |s: &crate::cri::api::ContainerStats| {
            let u = s.memory.as_ref()?.working_set_bytes.as_ref()?.value;
            Some(i64::try_from(u).unwrap_or(i64::MAX))
        };
        self.container_stats(uid)
            .into_iter()
            .flatten()
            .filter_map(|(name, s)| Some((name, ws(s.as_ref()?)?)))
            .collect()
    }
}

/// The agent's [`EvictionNode`], killing through the pod workers of syncer `S`.
pub struct AgentNode<S: PodSyncer> {
    /// Where signals are read.
    pub paths: Paths,
    /// Active pods come from here.
    pub status: StatusManager,
    /// Pods already failed (read only: no candidates among them).
    pub failed: FailedPods,
    /// Evictions go here, to the sync loop, which marks the pod failed and hands its worker
    /// the kill.
    pub fail: crossbeam_channel::Sender<FailPod>,
    /// Whether an evicted pod's worker is gone (its cleanup done).
    pub workers: PodWorkers<S>,
    /// The Evicted event goes here.
    pub recorder: Recorder,
    /// Kernel notifications, when `kernelMemcgNotification` is on.
    pub notifier: Option<Arc<MemcgNotifier>>,
    /// Containers' writable layers, for local storage limits; `None`: not measured.
    pub runtime_stats: Option<RuntimeStats>,
    /// Where the cgroup v2 tripwire is set ([`crate::cm::ContainerManager::set_kubepods_memory_high`]);
    /// `None`: not set.
    pub cm: Option<Arc<crate::cm::ContainerManager>>,
    /// Node-level reclaim under disk pressure; `None`: none (evict at once).
    pub reclaim: Option<Reclaim>,
}

/// What disk pressure reclaims before it evicts: the garbage collector's dead containers and
/// unused images (kubelet's `signalToNodeReclaimFuncs`).
pub struct Reclaim {
    /// The garbage collector.
    pub gc: Arc<crate::gc::GarbageCollector<crate::cri::Cri>>,
    /// The agent's runtime, which drives the calls from the eviction manager's thread.
    pub handle: tokio::runtime::Handle,
    /// The runtime's images are on a filesystem of their own (imagefs): a nodefs signal then
    /// reclaims dead containers only, an imagefs signal containers and images. Without one,
    /// both reclaim both (kubelet's `buildSignalToNodeReclaimFuncs`).
    pub separate_imagefs: bool,
}

impl Reclaim {
    /// Reclaims for `signal`; returns what was freed, `None` when nothing was.
    fn run(&self, signal: &str, recorder: &Recorder) -> Option<String> {
        let images = !self.separate_imagefs || signal.starts_with("imagefs.");
        match self.handle.block_on(self.gc.reclaim(images)) {
            Ok((0, pass)) if pass.removed == 0 => None,
            Ok((containers, pass)) => {
                let what = format!(
                    "{containers} dead containers and sandboxes, {} unused images ({} bytes)",
                    pass.removed, pass.freed
                );
                recorder.normal(
                    "node",
                    "FreedDiskSpace",
                    format!("{signal} below its threshold: removed {what} before evicting any pod"),
                );
                Some(what)
            }
            Err(e) => {
                warn!(signal, error = %e, "cannot reclaim node-level resources");
                None
            }
        }
    }
}

/// Reads an `i64` cgroup file (`None` for `max` or what does not parse).
fn read_bytes(path: &Path) -> Option<i64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

impl Paths {
    /// The `kubepods` usage (`memory.current`, bytes) at which the first hard memory threshold
    /// of `thresholds` is met, on cgroup v2: for `allocatableMemory.available` below T, the
    /// limit less T plus `inactive_file` (the working set is usage less inactive files, as in
    /// kubelet's v1 threshold `capacity − T + inactive_file`); for `memory.available` below T,
    /// today's usage plus what the node has above T. `None` without a hard memory threshold, a
    /// readable `kubepods`, or when the threshold is met already (the tripwire would be at or
    /// below today's usage).
    pub fn tripwire(&self, thresholds: &[Threshold]) -> Option<i64> {
        let kubepods = self.kubepods_memcg()?;
        let current = read_bytes(&kubepods.join("memory.current"))?;
        let inactive = signals::inactive_file(&kubepods).unwrap_or(0);
        thresholds
            .iter()
            .filter(|t| t.grace_period.is_zero())
            .filter_map(|t| match t.signal.as_str() {
                "allocatableMemory.available" => {
                    let max = read_bytes(&kubepods.join("memory.max"))?;
                    Some(max - t.value.amount(max) + inactive)
                }
                "memory.available" => {
                    let unified = self.hierarchies.unified.as_deref()?;
                    let o = signals::memory_available_v2(unified, self.memory_capacity)?;
                    Some(current + (o.available - t.value.amount(o.capacity)).max(0))
                }
                _ => None,
            })
            .min()
            // At or below today's usage the threshold is met already (the eviction is under
            // way, or nothing can be evicted): no tripwire, so the pods that stay, critical ones
            // among them, are not throttled for as long as it holds.
            .filter(|high| *high > current)
    }
}

impl<S: PodSyncer> EvictionNode for AgentNode<S> {
    fn observe(&mut self) -> HashMap<String, Observation> {
        self.paths.observe()
    }

    fn reclaim_node_level_resources(&mut self, signal: &str) -> Option<String> {
        self.reclaim.as_ref()?.run(signal, &self.recorder)
    }

    /// Pods with a non-terminal status that are not already evicted. Pods being killed for
    /// another reason stay (kubelet's `activePods` keeps terminating pods too).
    fn active_pods(&self) -> Vec<Arc<Pod>> {
        self.status
            .active_pods()
            .into_iter()
            .filter(|p| !self.failed.contains(crate::pod::pod_uid(p)))
            .collect()
    }

    fn is_terminating(&self, uid: &str) -> bool {
        self.workers.is_terminating(uid)
    }

    fn pod_usage(&self, pod: &Pod, resource: Resource) -> Option<(i64, i64)> {
        match resource {
            Resource::Memory => {
                let dir = self.paths.pod_cgroup("memory", pod)?;
                let ws = signals::working_set_any(&dir)?;
                Some((ws, crate::resources::pod_amounts(pod).memory_request))
            }
            Resource::EphemeralStorage | Resource::Inodes => {
                let dir = crate::pod::pod_logs_dir_under(&self.paths.pod_logs_dir, pod);
                let (bytes, inodes) = metrics::disk_usage(&dir);
                if resource == Resource::Inodes {
                    Some((inodes, 0))
                } else {
                    Some((
                        bytes,
                        crate::resources::pod_amounts(pod).ephemeral_storage_request,
                    ))
                }
            }
            Resource::Pids => {
                let dir = self.paths.pod_cgroup("pids", pod)?;
                // pids.current has the same name and format in v1 and v2.
                let n = PidController::new(dir.clone(), dir, false)
                    .get_pid_current()
                    .ok()?;
                Some((i64::try_from(n).ok()?, 0))
            }
        }
    }

    /// Writable layer (CRI) plus the container's log directory, for each current container.
    fn container_storage(&self, pod: &Pod) -> Option<Vec<ContainerUsage>> {
        let layers = self
            .runtime_stats
            .as_ref()?
            .writable_layers(crate::pod::pod_uid(pod))?;
        let logs = crate::pod::pod_logs_dir_under(&self.paths.pod_logs_dir, pod);
        Some(
            layers
                .into_iter()
                .map(|(name, layer)| ContainerUsage {
                    bytes: layer.saturating_add(metrics::disk_usage(&logs.join(&name)).0),
                    name,
                })
                .collect(),
        )
    }

    /// `du` of each local ephemeral volume under the pod's directory (an emptyDir on disk, a
    /// configMap: [`crate::volume::pod_volume_dirs`]).
    fn empty_dir_usage(&self, pod: &Pod) -> Vec<(String, i64)> {
        let pod_dir =
            crate::kuberuntime::hosts_file::pod_dir(&self.paths.nodefs, crate::pod::pod_uid(pod));
        crate::volume::pod_volume_dirs(pod, &pod_dir)
            .into_iter()
            .filter(|(_, _, ephemeral)| *ephemeral)
            .map(|(name, dir, _)| (name, metrics::du(&dir).bytes))
            .collect()
    }

    /// Each current container's working set (memory, from CRI ListContainerStats) or writable
    /// layer plus logs (ephemeral storage, [`EvictionNode::container_storage`]).
    fn container_usage(&self, pod: &Pod, resource: Resource) -> Vec<(String, i64)> {
        match resource {
            Resource::Memory => self
                .runtime_stats
                .as_ref()
                .map(|r| r.working_sets(crate::pod::pod_uid(pod)))
                .unwrap_or_default(),
            Resource::EphemeralStorage => self
                .container_storage(pod)
                .into_iter()
                .flatten()
                .map(|u| (u.name, u.bytes))
                .collect(),
            Resource::Inodes | Resource::Pids => Vec::new(),
        }
    }

    /// Records the event and asks the sync loop to fail the pod ([`FailPod`]): it marks the pod
    /// evicted and hands the kill (with the failure the worker writes as the pod's status) to
    /// the pod's worker. Waits while the request channel is full (this is the eviction
    /// manager's own thread).
    fn kill(&mut self, pod: Arc<Pod>, grace: i64, failure: Failure) {
        self.recorder.warning(
            crate::events::Involved::pod(&pod),
            REASON,
            failure.message.clone(),
        );
        let request = FailPod {
            pod,
            failure,
            grace: Some(grace),
            until_restart: false,
        };
        if self.fail.send(request).is_err() {
            warn!("the sync loop has stopped; eviction not carried out");
        }
    }

    fn is_cleaned_up(&self, uid: &str) -> bool {
        !self.workers.is_known(uid)
    }

    fn rearm(&mut self, thresholds: &[Threshold]) {
        let Some(n) = &self.notifier else { return };
        for (i, t) in thresholds.iter().enumerate() {
            // On cgroup v2 the root has no usage to arm: memory.available wakes on the
            // kubepods cgroup's stalls and events, where the pods' pressure shows first (a
            // system-wide PSI trigger is diluted by the other CPUs' idle time).
            let cgroup = match t.signal.as_str() {
                "memory.available" => self
                    .paths
                    .root_memcg()
                    .or_else(|| self.paths.kubepods_memcg()),
                "allocatableMemory.available" => self.paths.kubepods_memcg(),
                _ => continue,
            };
            let Some(cgroup) = cgroup else { continue };
            let key = format!("{}#{i}", t.signal);
            if cgroup.join("cgroup.event_control").exists() {
                // kubelet's threshold: capacity − eviction threshold + inactive_file.
                let capacity = if t.signal == "memory.available" {
                    Some(self.paths.memory_capacity)
                } else {
                    signals::allocatable_memory_available(&cgroup).map(|o| o.capacity)
                };
                let Some(capacity) = capacity else { continue };
                let inactive = signals::inactive_file(&cgroup).unwrap_or(0);
                let bytes = capacity
                    .saturating_sub(t.value.amount(capacity))
                    .saturating_add(inactive);
                if bytes <= 0 {
                    continue;
                }
                match n.register(&key, &cgroup, bytes as u64) {
                    Ok(()) => {
                        debug!(signal = %t.signal, threshold_bytes = bytes, "memory threshold notification armed")
                    }
                    Err(e) => {
                        warn!(error = %e, "cannot arm memory threshold notification; the periodic check remains")
                    }
                }
            } else if cgroup.join("memory.events").exists() {
                // cgroup v2: no usage threshold; wake on memory stall and on memory.events, whose
                // `high` count the tripwire below moves.
                let r = n
                    .register_psi(&key, &cgroup.join("memory.pressure"), PSI_STALL, PSI_WINDOW)
                    .and_then(|()| {
                        n.register_events(&format!("{key}/events"), &cgroup.join("memory.events"))
                    });
                if let Err(e) = r {
                    warn!(error = %e, "cannot arm cgroup v2 memory notification; the periodic check remains");
                }
            }
        }
        if let (true, Some(cm)) = (self.paths.hierarchies.is_v2(), &self.cm) {
            let high = self.paths.tripwire(thresholds);
            match cm.set_kubepods_memory_high(high) {
                Ok(()) => debug!(memory_high = ?high, "kubepods memory.high tripwire set"),
                Err(e) => {
                    warn!(error = %e, "cannot set the kubepods memory.high tripwire; PSI and the periodic check remain")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_disk_usage_and_ephemeral_requests() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("ns_p_u/c");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("0.log"), vec![b'x'; 1000]).unwrap();
        std::fs::write(d.join("1.log"), vec![b'x'; 24]).unwrap();
        assert_eq!(metrics::disk_usage(&tmp.path().join("ns_p_u")), (1024, 3));
        let pod: Pod = serde_yaml::from_str(
            "spec: {containers: [{name: a, resources: {requests: {ephemeral-storage: 1Mi}}}, {name: b}]}",
        )
        .unwrap();
        assert_eq!(
            crate::resources::pod_amounts(&pod).ephemeral_storage_request,
            1 << 20
        );
    }

    #[test]
    fn allocatable_memory_on_a_cgroup_v2_kubepods() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("memory.max"), "1000000\n").unwrap();
        std::fs::write(tmp.path().join("memory.current"), "600000\n").unwrap();
        std::fs::write(
            tmp.path().join("memory.stat"),
            "anon 1\ninactive_file 100000\n",
        )
        .unwrap();
        assert_eq!(
            allocatable_available(tmp.path()),
            Some(Observation {
                available: 500_000,
                capacity: 1_000_000
            })
        );
        std::fs::write(tmp.path().join("memory.max"), "max\n").unwrap();
        assert_eq!(
            allocatable_available(tmp.path()),
            None,
            "no limit, no signal"
        );
    }

    /// On this machine: the signals the manager sees, with the kubepods cgroup absent (no
    /// allocatable signal) and the memory, filesystem and pid signals present.
    #[test]
    fn this_node_observes_its_signals() {
        let tmp = tempfile::tempdir().unwrap();
        let p = Paths {
            hierarchies: Hierarchies::current(),
            layout: CgroupLayout {
                root: "/nodelet-no-such-root".into(),
                per_qos: true,
                systemd: false,
            },
            memory_capacity: crate::cm::detect_capacity().memory,
            nodefs: tmp.path().into(),
            imagefs: None,
            pod_logs_dir: tmp.path().into(),
        };
        let o = p.observe();
        for s in ["nodefs.available", "imagefs.inodesFree", "pid.available"] {
            assert!(o.contains_key(s), "{s}: {o:?}");
        }
        assert!(!o.contains_key("allocatableMemory.available"));
        if p.root_memcg().is_some() {
            let m = o["memory.available"];
            assert!(m.available > 0 && m.available <= m.capacity);
        }
    }

    /// The cgroup v2 tripwire: where a hard memory threshold is met, in `kubepods` usage.
    #[test]
    fn the_tripwire_is_the_usage_at_which_a_hard_memory_threshold_is_met() {
        let tmp = tempfile::tempdir().unwrap();
        let kubepods = tmp.path().join("root/kubepods");
        std::fs::create_dir_all(&kubepods).unwrap();
        std::fs::write(kubepods.join("memory.max"), "268435456\n").unwrap();
        std::fs::write(kubepods.join("memory.current"), "50000000\n").unwrap();
        std::fs::write(kubepods.join("memory.stat"), "inactive_file 1000000\n").unwrap();
        let p = Paths {
            hierarchies: Hierarchies {
                v1: Vec::new(),
                unified: Some(tmp.path().into()),
            },
            layout: CgroupLayout {
                root: "/root".into(),
                per_qos: true,
                systemd: false,
            },
            memory_capacity: 1 << 30,
            nodefs: tmp.path().into(),
            imagefs: None,
            pod_logs_dir: tmp.path().into(),
        };
        let t = |signal: &str, mib: i64, grace: u64| Threshold {
            signal: signal.into(),
            value: crate::eviction::threshold::ThresholdValue::Quantity(mib << 20),
            grace_period: std::time::Duration::from_secs(grace),
            min_reclaim: None,
        };
        // 256 MiB limit, 96 MiB threshold: the working set may reach 160 MiB, plus the
        // inactive files that usage counts.
        assert_eq!(
            p.tripwire(&[t("allocatableMemory.available", 96, 0)]),
            Some((160 << 20) + 1_000_000)
        );
        // Soft thresholds set none; the lowest hard one wins.
        assert_eq!(
            p.tripwire(&[t("allocatableMemory.available", 96, 30)]),
            None
        );
        assert_eq!(
            p.tripwire(&[
                t("allocatableMemory.available", 96, 0),
                t("allocatableMemory.available", 128, 0)
            ]),
            Some((128 << 20) + 1_000_000)
        );
        assert_eq!(p.tripwire(&[t("nodefs.available", 1, 0)]), None);
        // A threshold that is met already (above the limit): no tripwire that would throttle
        // what stays.
        assert_eq!(
            p.tripwire(&[t("allocatableMemory.available", 512, 0)]),
            None
        );
    }
}
