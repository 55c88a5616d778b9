//! Resource usage of the node, its pods and their containers (kubelet's `pkg/kubelet/stats` and
//! its resource metrics): `/stats/summary` in the `stats.k8s.io/v1alpha1` shape and
//! `/metrics/resource` with kubelet's series, what metrics-server and `kubectl top` read.
//!
//! Sources, read on demand (nothing older than the request but the writable layers):
//! - containers: the runtime's `ListContainers` (IDs, names, creation times: the container's
//!   `startTime` under CRI), cpu and memory from each container's cgroup ([`cgroup_stats`], as
//!   cAdvisor reads them for kubelet), the writable layer (`rootfs`) from the runtime's
//!   `ListContainerStats` at most 10 s old ([`super::rootfs_cache`]);
//! - pods: their pod cgroups (cpu: `cpuacct.usage`, or `usage_usec` of `cpu.stat` on v2; memory:
//!   usage − inactive_file);
//! - the node: the root cgroup's `cpuacct.usage` (else `/proc/stat` through procfs) and the memory
//!   working set the eviction manager observes.
//!
//! `usageNanoCores` is the rate between two summaries (kubelet's CRI stats provider keeps the same
//! per-container cache when the runtime leaves the field empty, as containerd 1.6 does), so the
//! first summary after a container starts has none. A container whose cpu or memory reads 0 is
//! left out of `/metrics/resource`: metrics-server drops the whole pod over one zero.
//!
//! - network: `/proc/<pid>/net/dev` of a process in the pod, the host's for the node
//!   ([`super::network_stats`]);
//! - filesystems: the node's `fs` and the runtime's `imageFs` (CRI `ImageFsInfo`), each pod's
//!   volumes, its containers' logs and its ephemeral storage ([`super::storage_stats`]).
//!
//! Not reported yet: process counts, accelerators, swap.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};

use super::rootfs_cache::RootfsCache;
use super::{cgroup_stats, network_stats, storage_stats};
use crate::cri::api as cri;
use crate::cri::{Cri, CriResult, RuntimeService};
use crate::eviction::provider::Paths;
use crate::kuberuntime::labels;
use crate::status::StatusManager;

/// One running container's usage.
#[derive(Debug, Clone, Default)]
struct ContainerSample {
    name: String,
    id: String,
    /// Creation time, nanoseconds since the epoch.
    created_ns: i64,
    /// When the runtime measured, nanoseconds since the epoch.
    time_ns: i64,
    cpu_ns: Option<u64>,
    working_set: Option<u64>,
    usage: Option<u64>,
    rss: Option<u64>,
    page_faults: Option<u64>,
    major_page_faults: Option<u64>,
    rootfs_used: Option<u64>,
}

/// The node's and its pods' usage as one request reads them.
pub struct Stats {
    pub(super) cri: Cri,
    pub(super) status: StatusManager,
    pub(super) paths: Arc<Paths>,
    node_name: String,
    /// The containers' writable layers (`rootfs`), read from the runtime at most 10 s ago.
    rootfs: RootfsCache<Cri>,
    /// Last cumulative cpu reading per container ID, pod UID or the node (`""`): (time ns,
    /// usage ns), for `usageNanoCores`.
    cpu_seen: Mutex<HashMap<String, (i64, u64)>>,
}

/// `value` of a CRI `UInt64Value`.
fn v(x: Option<&cri::UInt64Value>) -> Option<u64> {
    x.map(|x| x.value)
}

/// RFC 3339 of `ns` nanoseconds since the epoch.
fn rfc3339(ns: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_nanosecond(i128::from(ns))
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// Cores in use, in nanocores: the growth of a cumulative cpu time (ns) from `prev` (time ns,
/// usage ns) to `usage` at `time_ns`, per second; `None` without a previous reading, when no
/// time passed, or when the counter went back (a new container under the same key).
pub fn rate(prev: Option<(i64, u64)>, time_ns: i64, usage: u64) -> Option<u64> {
    let (t0, u0) = prev?;
    let dt = u64::try_from(time_ns.checked_sub(t0)?)
        .ok()
        .filter(|d| *d > 0)?;
    let du = usage.checked_sub(u0)?;
    Some(u64::try_from(u128::from(du) * 1_000_000_000 / u128::from(dt)).unwrap_or(u64::MAX))
}

impl Stats {
    /// Usage read through `cri`, of the pods in `status`, from the cgroups of `paths`, for node
    /// `node_name`.
    pub fn new(cri: Cri, status: StatusManager, paths: Arc<Paths>, node_name: String) -> Self {
        Self {
            rootfs: RootfsCache::new(cri.clone(), crate::clock::system()),
            cri,
            status,
            paths,
            node_name,
            cpu_seen: Mutex::new(HashMap::new()),
        }
    }

    /// Running containers' usage by pod UID, read at `now_ns`: IDs, names and creation times
    /// from the runtime's listing, cpu and memory from each container's cgroup
    /// ([`cgroup_stats`]); from the runtime's `ListContainerStats` instead when pods have no
    /// pod cgroup (`cgroupsPerQOS: false`) to find them under. No `rootfs` (see
    /// [`RootfsCache`]).
    async fn containers(&self, now_ns: i64) -> CriResult<HashMap<String, Vec<ContainerSample>>> {
        if !self.paths.layout.per_qos {
            return self.containers_from_runtime().await;
        }
        let listed = self.cri.list_containers(HashMap::new()).await?;
        let pods: HashMap<String, Arc<Pod>> = self
            .status
            .active_pods()
            .into_iter()
            .map(|p| (crate::pod::pod_uid(&p).to_owned(), p))
            .collect();
        let v2 = self.paths.hierarchies.is_v2();
        let mut out: HashMap<String, Vec<ContainerSample>> = HashMap::new();
        for c in listed
            .iter()
            .filter(|c| c.state == cri::ContainerState::ContainerRunning as i32)
        {
            let (Some(uid), Some(name)) = (
                c.labels.get(labels::POD_UID),
                c.labels.get(labels::CONTAINER_NAME),
            ) else {
                continue;
            };
            let Some(pod) = pods.get(uid) else { continue };
            let (mem_pod, cpu_pod) = (
                self.paths.pod_cgroup("memory", pod),
                self.paths
                    .pod_cgroup(if v2 { "cpu" } else { "cpuacct" }, pod),
            );
            // The container's cgroup is `<id>` under the cgroupfs driver, else systemd's
            // scope: read the first, and the second only when the first is not there (no
            // lookup of the directory first: two fewer calls per container).
            let read = |name: &str| {
                cgroup_stats::read(
                    cpu_pod.as_ref().map(|d| d.join(name)).as_deref(),
                    mem_pod.as_ref().map(|d| d.join(name)).as_deref(),
                    v2,
                )
            };
            let mut u = read(&c.id);
            if u.cpu_ns.is_none() && u.usage.is_none() {
                u = read(&format!("cri-containerd-{}.scope", c.id));
            }
            out.entry(uid.clone()).or_default().push(ContainerSample {
                name: name.clone(),
                id: c.id.clone(),
                created_ns: c.created_at,
                time_ns: now_ns,
                cpu_ns: u.cpu_ns,
                working_set: u.working_set,
                usage: u.usage,
                rss: u.rss,
                page_faults: u.page_faults,
                major_page_faults: u.major_page_faults,
                rootfs_used: None,
            });
        }
        Ok(out)
    }

    /// Running containers' usage by pod UID as the runtime's `ListContainerStats` gives it
    /// (with `rootfs`).
    async fn containers_from_runtime(&self) -> CriResult<HashMap<String, Vec<ContainerSample>>> {
        let (stats, listed) = tokio::try_join!(
            self.cri.list_container_stats(HashMap::new()),
            self.cri.list_containers(HashMap::new())
        )?;
        let created: HashMap<&str, i64> = listed
            .iter()
            .filter(|c| c.state == cri::ContainerState::ContainerRunning as i32)
            .map(|c| (c.id.as_str(), c.created_at))
            .collect();
        let mut out: HashMap<String, Vec<ContainerSample>> = HashMap::new();
        for s in stats {
            let Some(a) = s.attributes else { continue };
            let Some(&created_ns) = created.get(a.id.as_str()) else {
                continue; // not running
            };
            let (Some(uid), Some(name)) = (
                a.labels.get(labels::POD_UID),
                a.labels.get(labels::CONTAINER_NAME),
            ) else {
                continue;
            };
            let cpu = s.cpu.as_ref();
            let mem = s.memory.as_ref();
            let sample = ContainerSample {
                name: name.clone(),
                id: a.id.clone(),
                created_ns,
                time_ns: cpu.map(|c| c.timestamp).unwrap_or_default(),
                cpu_ns: cpu.and_then(|c| v(c.usage_core_nano_seconds.as_ref())),
                working_set: mem.and_then(|m| v(m.working_set_bytes.as_ref())),
                usage: mem.and_then(|m| v(m.usage_bytes.as_ref())),
                rss: mem.and_then(|m| v(m.rss_bytes.as_ref())),
                page_faults: mem.and_then(|m| v(m.page_faults.as_ref())),
                major_page_faults: mem.and_then(|m| v(m.major_page_faults.as_ref())),
                rootfs_used: s
                    .writable_layer
                    .as_ref()
                    .and_then(|w| v(w.used_bytes.as_ref())),
            };
            out.entry(uid.clone()).or_default().push(sample);
        }
        Ok(out)
    }

    /// The rate of `key`'s cumulative cpu `usage` (ns) read at `time_ns`, from its previous
    /// reading ([`rate`]).
    fn nano_cores(&self, key: &str, time_ns: i64, usage: u64) -> Option<u64> {
        let mut seen = self.cpu_seen.lock().unwrap_or_else(|e| e.into_inner());
        rate(
            seen.insert(key.to_owned(), (time_ns, usage)),
            time_ns,
            usage,
        )
    }

    /// The node's cumulative cpu time, nanoseconds: the root `cpuacct.usage`, else the busy time
    /// of `/proc/stat`.
    fn node_cpu_ns(&self) -> Option<u64> {
        let h = &self.paths.hierarchies;
        cgroup_stats::cpu_ns(h.v1_mount("cpuacct"), None).or_else(|| {
            use procfs::CurrentSI;
            let k = procfs::KernelStats::current().ok()?;
            let t = k.total;
            let ticks = t.user
                + t.nice
                + t.system
                + t.irq.unwrap_or(0)
                + t.softirq.unwrap_or(0)
                + t.steal.unwrap_or(0);
            let per_sec = procfs::ticks_per_second();
            Some(ticks.saturating_mul(1_000_000_000) / per_sec.max(1))
        })
    }

    /// The node's memory working set, bytes (what `memory.available` is computed from).
    fn node_working_set(&self) -> Option<u64> {
        let available = self.paths.memory_available()?;
        u64::try_from(available.capacity - available.available).ok()
    }

    /// A pod's cpu time and memory working set from its pod cgroup.
    fn pod_usage(&self, pod: &Pod) -> (Option<u64>, Option<u64>) {
        let v2 = self.paths.hierarchies.is_v2();
        let cpu = self
            .paths
            .pod_cgroup(if v2 { "cpu" } else { "cpuacct" }, pod);
        let mem = self.paths.pod_cgroup("memory", pod);
        let u = cgroup_stats::read(cpu.as_deref(), mem.as_deref(), v2);
        (u.cpu_ns, u.working_set)
    }

    /// A process of the pod (in its pod cgroup), whose network namespace is the pod's.
    pub(super) fn pod_process(&self, pod: &Pod) -> Option<i32> {
        let h = &self.paths.hierarchies;
        let dir = self.paths.pod_cgroup("memory", pod)?;
        let root = h.v1_mount("memory").or(h.unified.as_deref())?;
        network_stats::process_in(&dir, root, h.is_v2())
    }

    /// `/stats/summary` (`stats.k8s.io/v1alpha1` `Summary`), at `now_ns`; with
    /// `only_cpu_and_memory` (kubelet's `?only_cpu_and_memory=true`, what older metrics-server
    /// asks) the cpu and memory figures alone: no network, filesystems, volumes or logs.
    ///
    /// Errors: a CRI list call.
    pub async fn summary(&self, now_ns: i64, only_cpu_and_memory: bool) -> CriResult<Value> {
        let mut by_pod = self.containers(now_ns).await?;
        if !only_cpu_and_memory {
            let layers = self.rootfs.get().await;
            for c in by_pod.values_mut().flatten() {
                if c.rootfs_used.is_none() {
                    c.rootfs_used = layers.get(&c.id).map(|l| l.1);
                }
            }
        }
        let time = rfc3339(now_ns);
        let node_cpu = self.node_cpu_ns();
        let mut node = json!({
            "nodeName": self.node_name,
            "cpu": {"time": time},
            "memory": {"time": time},
        });
        if let Some(c) = node_cpu {
            node["cpu"]["usageCoreNanoSeconds"] = json!(c);
            if let Some(r) = self.nano_cores("", now_ns, c) {
                node["cpu"]["usageNanoCores"] = json!(r);
            }
        }
        if let Some(ws) = self.node_working_set() {
            node["memory"]["workingSetBytes"] = json!(ws);
            let capacity = u64::try_from(self.paths.memory_capacity).unwrap_or(0);
            node["memory"]["availableBytes"] = json!(capacity.saturating_sub(ws));
        }
        if !only_cpu_and_memory {
            self.node_network_and_filesystems(&mut node, &time).await;
        }
        let mut pods = Vec::new();
        // The rate readings still wanted: the node's, and those of what is listed now.
        let mut current: std::collections::HashSet<String> = [String::new()].into();
        for pod in self.status.active_pods() {
            let uid = crate::pod::pod_uid(&pod).to_owned();
            let containers = by_pod.remove(&uid).unwrap_or_default();
            let mut p = self.pod_summary(&pod, &uid, &containers, now_ns);
            if !only_cpu_and_memory {
                self.pod_network_and_storage(&mut p, &pod, &uid, &containers, now_ns);
            }
            pods.push(p);
            current.extend(containers.into_iter().map(|c| c.id));
            current.insert(uid);
        }
        // Gone pods and containers leave no reading behind (months of churn on one agent).
        self.cpu_seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| current.contains(k));
        Ok(json!({"node": node, "pods": pods}))
    }

    fn pod_summary(
        &self,
        pod: &Pod,
        uid: &str,
        containers: &[ContainerSample],
        now_ns: i64,
    ) -> Value {
        let time = rfc3339(now_ns);
        let cs: Vec<Value> = containers
            .iter()
            .map(|c| {
                let t = rfc3339(if c.time_ns > 0 { c.time_ns } else { now_ns });
                let mut cpu = json!({"time": t});
                if let Some(u) = c.cpu_ns {
                    cpu["usageCoreNanoSeconds"] = json!(u);
                    if let Some(r) = self.nano_cores(&c.id, c.time_ns.max(1), u) {
                        cpu["usageNanoCores"] = json!(r);
                    }
                }
                let mut memory = json!({"time": t});
                for (k, x) in [
                    ("workingSetBytes", c.working_set),
                    ("usageBytes", c.usage),
                    ("rssBytes", c.rss),
                    ("pageFaults", c.page_faults),
                    ("majorPageFaults", c.major_page_faults),
                ] {
                    if let Some(x) = x {
                        memory[k] = json!(x);
                    }
                }
                let mut out = json!({
                    "name": c.name,
                    "startTime": rfc3339(c.created_ns),
                    "cpu": cpu,
                    "memory": memory,
                });
                if let Some(u) = c.rootfs_used {
                    out["rootfs"] = json!({"time": t, "usedBytes": u});
                }
                out
            })
            .collect();
        let (cpu_ns, ws) = self.pod_usage(pod);
        let mut cpu = json!({"time": time});
        if let Some(u) = cpu_ns {
            cpu["usageCoreNanoSeconds"] = json!(u);
            if let Some(r) = self.nano_cores(uid, now_ns, u) {
                cpu["usageNanoCores"] = json!(r);
            }
        }
        let mut memory = json!({"time": time});
        if let Some(w) = ws {
            memory["workingSetBytes"] = json!(w);
        }
        let start = pod
            .status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .map(|t| t.0.to_string());
        json!({
            "podRef": {
                "name": pod.metadata.name,
                "namespace": pod.metadata.namespace.as_deref().unwrap_or("default"),
                "uid": uid,
            },
            "startTime": start,
            "containers": cs,
            "cpu": cpu,
            "memory": memory,
        })
    }

    /// The node's network, its `fs` and the runtime's `imageFs`, added to `node` at `time`.
    async fn node_network_and_filesystems(&self, node: &mut Value, time: &str) {
        if let Some(n) = network_stats::node() {
            node["network"] = network_stats::to_json(&n, time);
        }
        if let Some(fs) = storage_stats::node_fs(&self.paths.nodefs, time) {
            node["fs"] = fs;
        }
        // The image filesystem is left out, not the summary failed, when the runtime cannot say.
        if let Some(fs) = self
            .cri
            .image_fs_usage()
            .await
            .ok()
            .and_then(|u| storage_stats::image_fs(&u, time))
        {
            node["runtime"] = json!({"imageFs": fs});
        }
    }

    /// The pod's network, volumes, its containers' logs and its ephemeral storage, added to its
    /// summary `out` (whose `containers` are `containers`, in order) at `now_ns`.
    fn pod_network_and_storage(
        &self,
        out: &mut Value,
        pod: &Pod,
        uid: &str,
        containers: &[ContainerSample],
        now_ns: i64,
    ) {
        let time = rfc3339(now_ns);
        let storage = storage_stats::pod_storage(
            pod,
            &crate::kuberuntime::hosts_file::pod_dir(&self.paths.nodefs, uid),
            &crate::pod::pod_logs_dir_under(&self.paths.pod_logs_dir, pod),
            &containers
                .iter()
                .map(|c| (c.name.as_str(), c.rootfs_used))
                .collect::<Vec<_>>(),
            &self.paths.nodefs,
            &time,
        );
        if let Some(cs) = out["containers"].as_array_mut() {
            for (c, logs) in cs.iter_mut().zip(storage.logs) {
                if let Some(l) = logs {
                    c["logs"] = l;
                }
            }
        }
        if !storage.volumes.is_empty() {
            out["volume"] = Value::Array(storage.volumes);
        }
        if let Some(n) = self.pod_process(pod).and_then(network_stats::of_process) {
            out["network"] = network_stats::to_json(&n, &time);
        }
        if let Some(e) = storage.ephemeral {
            out["ephemeral-storage"] = e;
        }
    }

    /// `/metrics/resource`: kubelet's resource metrics in the Prometheus text format, each
    /// sample with the time it was measured (ms), as metrics-server reads them.
    ///
    /// Errors: a CRI list call.
    pub async fn resource_metrics(&self, now_ns: i64) -> CriResult<String> {
        let mut by_pod = self.containers(now_ns).await?;
        let now_ms = now_ns / 1_000_000;
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str, samples: &[(String, f64, i64)]| {
            out.push_str(&format!(
                "# HELP {name} [STABLE] {help}\n# TYPE {name} {kind}\n"
            ));
            for (labels, value, ms) in samples {
                out.push_str(&format!("{name}{labels} {value} {ms}\n"));
            }
        };
        let (mut c_cpu, mut c_mem, mut c_start, mut p_cpu, mut p_mem) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for pod in self.status.active_pods() {
            let uid = crate::pod::pod_uid(&pod).to_owned();
            let (name, ns) = (
                pod.metadata.name.clone().unwrap_or_default(),
                pod.metadata
                    .namespace
                    .clone()
                    .unwrap_or_else(|| "default".into()),
            );
            for c in by_pod.remove(&uid).unwrap_or_default() {
                let (Some(cpu), Some(ws)) = (c.cpu_ns, c.working_set) else {
                    continue;
                };
                if cpu == 0 || ws == 0 {
                    continue; // metrics-server would drop the whole pod
                }
                let l = format!(
                    "{{container=\"{}\",namespace=\"{ns}\",pod=\"{name}\"}}",
                    c.name
                );
                let ms = if c.time_ns > 0 {
                    c.time_ns / 1_000_000
                } else {
                    now_ms
                };
                c_cpu.push((l.clone(), cpu as f64 / 1e9, ms));
                c_mem.push((l.clone(), ws as f64, ms));
                c_start.push((l, c.created_ns as f64 / 1e9, ms));
            }
            let (cpu, ws) = self.pod_usage(&pod);
            let l = format!("{{namespace=\"{ns}\",pod=\"{name}\"}}");
            if let Some(cpu) = cpu.filter(|c| *c > 0) {
                p_cpu.push((l.clone(), cpu as f64 / 1e9, now_ms));
            }
            if let Some(ws) = ws.filter(|w| *w > 0) {
                p_mem.push((l, ws as f64, now_ms));
            }
        }
        family(
            "container_cpu_usage_seconds_total",
            "counter",
            "Cumulative cpu time consumed by the container in core-seconds",
            &c_cpu,
        );
        family(
            "container_memory_working_set_bytes",
            "gauge",
            "Current working set of the container in bytes",
            &c_mem,
        );
        family(
            "container_start_time_seconds",
            "gauge",
            "Start time of the container since unix epoch in seconds",
            &c_start,
        );
        let node_cpu: Vec<_> = self
            .node_cpu_ns()
            .map(|c| (String::new(), c as f64 / 1e9, now_ms))
            .into_iter()
            .collect();
        family(
            "node_cpu_usage_seconds_total",
            "counter",
            "Cumulative cpu time consumed by the node in core-seconds",
            &node_cpu,
        );
        let node_mem: Vec<_> = self
            .node_working_set()
            .map(|w| (String::new(), w as f64, now_ms))
            .into_iter()
            .collect();
        family(
            "node_memory_working_set_bytes",
            "gauge",
            "Current working set of the node in bytes",
            &node_mem,
        );
        family(
            "pod_cpu_usage_seconds_total",
            "counter",
            "Cumulative cpu time consumed by the pod in core-seconds",
            &p_cpu,
        );
        family(
            "pod_memory_working_set_bytes",
            "gauge",
            "Current working set of the pod in bytes",
            &p_mem,
        );
        family(
            "scrape_error",
            "gauge",
            "1 if there was an error while getting container metrics, 0 otherwise",
            &[(String::new(), 0.0, now_ms)],
        );
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nano_cores_are_the_growth_per_second_and_need_two_readings() {
        assert_eq!(rate(None, 10, 5), None);
        assert_eq!(
            rate(Some((1_000_000_000, 0)), 3_000_000_000, 1_000_000_000),
            Some(500_000_000),
            "1 s of cpu over 2 s: half a core"
        );
        assert_eq!(rate(Some((5, 100)), 5, 200), None, "no time passed");
        assert_eq!(rate(Some((5, 100)), 10, 50), None, "the counter went back");
    }
}
