//! `/metrics/cadvisor`: the container series the common dashboards read from kubelet's embedded
//! cAdvisor, read from each running container's own cgroup through cgroups-rs on demand: cpu
//! (usage, CFS periods and throttling), memory (usage, working set, rss, cache, peak), the
//! container's limits (memory limit, CFS quota and period, shares), OOM kills, and the machine's
//! cores and memory. Labels as cAdvisor gives them under CRI: `container`, `id` (the cgroup
//! path), `image`, `name` (the container ID), `namespace`, `pod`.
//!
//! Network counters are the pod's (its containers share one network namespace), as cAdvisor
//! reports them on the pod's sandbox: labelled `container=""`, `id` the pod cgroup, `interface`,
//! `namespace`, `pod` ([`super::network_stats`]).
//!
//! cgroups-rs reads a file it cannot read as 0, so a container whose cgroup directory is gone
//! (it just stopped) is left out rather than reported at 0. Not reported yet: disk I/O,
//! filesystem usage.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use cgroups_rs::fs::cpu::CpuController;
use cgroups_rs::fs::cpuacct::CpuAcctController;
use cgroups_rs::fs::memory::MemController;

use super::network_stats;
use super::stats::Stats;
use crate::cri::api as cri;
use crate::cri::{CriResult, RuntimeService};
use crate::kuberuntime::labels;

/// One container's figures.
#[derive(Debug, Default, Clone, Copy)]
struct Figures {
    cpu_seconds: f64,
    periods: u64,
    throttled_periods: u64,
    throttled_seconds: f64,
    usage: u64,
    working_set: u64,
    rss: u64,
    cache: u64,
    max_usage: u64,
    limit: u64,
    quota: i64,
    period: u64,
    shares: u64,
    oom_kills: u64,
}

use super::cgroup_stats::stat_value;

/// The directory under `pod_dir` of the container with ID `id` (`<id>` with the cgroupfs
/// driver, `cri-containerd-<id>.scope` with systemd's), if it exists.
pub fn container_cgroup(pod_dir: &Path, id: &str) -> Option<PathBuf> {
    [id.to_owned(), format!("cri-containerd-{id}.scope")]
        .into_iter()
        .map(|n| pod_dir.join(n))
        .find(|d| d.is_dir())
}

impl Stats {
    /// The container's figures from its cgroups; `None` when they are gone.
    fn figures(&self, pod: &k8s_openapi::api::core::v1::Pod, id: &str) -> Option<Figures> {
        let h = &self.paths.hierarchies;
        let v2 = h.is_v2();
        let dir = |controller: &str| {
            let pod_dir = self.paths.pod_cgroup(controller, pod)?;
            container_cgroup(&pod_dir, id)
        };
        let root = |controller: &str| -> PathBuf {
            if v2 {
                h.unified.clone().unwrap_or_default()
            } else {
                h.v1_mount(controller)
                    .map(Path::to_path_buf)
                    .unwrap_or_default()
            }
        };
        let mem_dir = dir("memory")?;
        let cpu_dir = dir("cpu")?;
        let mem = MemController::new(mem_dir, root("memory"), v2);
        let m = mem.memory_stat();
        let cpu = CpuController::new(cpu_dir.clone(), root("cpu"), v2);
        let stat = cpu.cpu().stat;
        let mut f = Figures {
            periods: stat_value(&stat, "nr_periods").unwrap_or(0),
            throttled_periods: stat_value(&stat, "nr_throttled").unwrap_or(0),
            usage: m.usage_in_bytes,
            max_usage: m.max_usage_in_bytes,
            limit: u64::try_from(m.limit_in_bytes).unwrap_or(0),
            quota: cpu.cfs_quota().unwrap_or(-1),
            period: cpu.cfs_period().unwrap_or(0),
            shares: cpu.shares().unwrap_or(0),
            oom_kills: m.oom_control.oom_kill,
            ..Default::default()
        };
        let (inactive_file, rss, cache) = if v2 {
            // v2's memory.stat names them anon and file (cgroups-rs keeps every key in `raw`).
            let raw = |k: &str| m.stat.raw.get(k).copied().unwrap_or(0);
            (raw("inactive_file"), raw("anon"), raw("file"))
        } else {
            (
                m.stat.total_inactive_file,
                m.stat.total_rss,
                m.stat.total_cache,
            )
        };
        f.working_set = f.usage.saturating_sub(inactive_file);
        f.rss = rss;
        f.cache = cache;
        if v2 {
            f.cpu_seconds = stat_value(&stat, "usage_usec").unwrap_or(0) as f64 / 1e6;
            f.throttled_seconds = stat_value(&stat, "throttled_usec").unwrap_or(0) as f64 / 1e6;
        } else {
            let acct_dir = dir("cpuacct")?;
            let acct = CpuAcctController::new(acct_dir, root("cpuacct"));
            f.cpu_seconds = acct.cpuacct().usage as f64 / 1e9;
            f.throttled_seconds = stat_value(&stat, "throttled_time").unwrap_or(0) as f64 / 1e9;
        }
        Some(f)
    }

    /// Each running container's labels and figures.
    ///
    /// Errors: the CRI listing of containers.
    async fn rows(&self) -> CriResult<Vec<(String, Figures)>> {
        let listed = self.cri.list_containers(HashMap::new()).await?;
        let pods: HashMap<String, k8s_openapi::api::core::v1::Pod> = self
            .status
            .active_pods()
            .into_iter()
            .map(|p| (crate::pod::pod_uid(&p).to_owned(), (*p).clone()))
            .collect();
        let mut rows: Vec<(String, Figures)> = Vec::new();
        for c in listed
            .iter()
            .filter(|c| c.state == cri::ContainerState::ContainerRunning as i32)
        {
            let Some(pod) = c.labels.get(labels::POD_UID).and_then(|u| pods.get(u)) else {
                continue;
            };
            let Some(f) = self.figures(pod, &c.id) else {
                continue;
            };
            let label = |k: &str| c.labels.get(k).map(String::as_str).unwrap_or_default();
            let id = self
                .paths
                .pod_cgroup("memory", pod)
                .and_then(|d| container_cgroup(&d, &c.id))
                .and_then(|d| self.cgroup_id(&d))
                .unwrap_or_default();
            let image = c
                .image
                .as_ref()
                .map(|i| i.image.as_str())
                .unwrap_or_default();
            rows.push((
                format!(
                    "{{container=\"{}\",id=\"{id}\",image=\"{image}\",name=\"{}\",namespace=\"{}\",pod=\"{}\"}}",
                    label(labels::CONTAINER_NAME),
                    c.id,
                    pod.metadata.namespace.as_deref().unwrap_or("default"),
                    pod.metadata.name.as_deref().unwrap_or_default(),
                ),
                f,
            ));
        }
        Ok(rows)
    }

    /// `path` below the root of `controller`'s hierarchy, `/`-rooted: cAdvisor's `id`.
    fn cgroup_id(&self, path: &Path) -> Option<String> {
        let h = &self.paths.hierarchies;
        let root = h.v1_mount("memory").or(h.unified.as_deref())?;
        path.strip_prefix(root)
            .ok()
            .map(|p| format!("/{}", p.display()))
    }

    /// Each pod's interfaces: their labels and counters.
    fn network_rows(&self) -> Vec<(String, network_stats::Interface)> {
        let mut rows = Vec::new();
        for pod in self.status.active_pods() {
            let Some(ifaces) = self.pod_process(&pod).and_then(network_stats::of_process) else {
                continue;
            };
            let id = self
                .paths
                .pod_cgroup("memory", &pod)
                .and_then(|d| self.cgroup_id(&d))
                .unwrap_or_default();
            for i in ifaces {
                rows.push((
                    format!(
                        "{{container=\"\",id=\"{id}\",image=\"\",interface=\"{}\",name=\"\",namespace=\"{}\",pod=\"{}\"}}",
                        i.name,
                        pod.metadata.namespace.as_deref().unwrap_or("default"),
                        pod.metadata.name.as_deref().unwrap_or_default(),
                    ),
                    i,
                ));
            }
        }
        rows
    }

    /// `/metrics/cadvisor` in the Prometheus text format, each sample with time `now_ms`.
    ///
    /// Errors: the CRI listing of containers.
    pub async fn cadvisor_metrics(&self, now_ms: i64) -> CriResult<String> {
        let rows = self.rows().await?;
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str, value: &dyn Fn(&Figures) -> f64| {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
            for (l, f) in &rows {
                out.push_str(&format!("{name}{l} {} {now_ms}\n", value(f)));
            }
        };
        family(
            "container_cpu_usage_seconds_total",
            "counter",
            "Cumulative cpu time consumed in seconds.",
            &|f| f.cpu_seconds,
        );
        family(
            "container_cpu_cfs_periods_total",
            "counter",
            "Number of elapsed enforcement period intervals.",
            &|f| f.periods as f64,
        );
        family(
            "container_cpu_cfs_throttled_periods_total",
            "counter",
            "Number of throttled period intervals.",
            &|f| f.throttled_periods as f64,
        );
        family(
            "container_cpu_cfs_throttled_seconds_total",
            "counter",
            "Total time duration the container has been throttled.",
            &|f| f.throttled_seconds,
        );
        family("container_memory_usage_bytes", "gauge", "Current memory usage in bytes, including all memory regardless of when it was accessed", &|f| f.usage as f64);
        family(
            "container_memory_working_set_bytes",
            "gauge",
            "Current working set in bytes.",
            &|f| f.working_set as f64,
        );
        family(
            "container_memory_rss",
            "gauge",
            "Size of RSS in bytes.",
            &|f| f.rss as f64,
        );
        family(
            "container_memory_cache",
            "gauge",
            "Number of bytes of page cache memory.",
            &|f| f.cache as f64,
        );
        family(
            "container_memory_max_usage_bytes",
            "gauge",
            "Maximum memory usage recorded in bytes",
            &|f| f.max_usage as f64,
        );
        family(
            "container_spec_memory_limit_bytes",
            "gauge",
            "Memory limit for the container.",
            &|f| {
                // cAdvisor's 0 for "no limit" (the kernel's page-rounded maximum).
                if f.limit >= (1 << 62) {
                    0.0
                } else {
                    f.limit as f64
                }
            },
        );
        family(
            "container_spec_cpu_quota",
            "gauge",
            "CPU quota of the container.",
            &|f| if f.quota > 0 { f.quota as f64 } else { 0.0 },
        );
        family(
            "container_spec_cpu_period",
            "gauge",
            "CPU period of the container.",
            &|f| f.period as f64,
        );
        family(
            "container_spec_cpu_shares",
            "gauge",
            "CPU share of the container.",
            &|f| f.shares as f64,
        );
        family(
            "container_oom_events_total",
            "counter",
            "Count of out of memory events observed for the container",
            &|f| f.oom_kills as f64,
        );
        let network = self.network_rows();
        let mut net_family =
            |name: &str, help: &str, value: &dyn Fn(&network_stats::Interface) -> u64| {
                out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n"));
                for (l, i) in &network {
                    out.push_str(&format!("{name}{l} {} {now_ms}\n", value(i)));
                }
            };
        net_family(
            "container_network_receive_bytes_total",
            "Cumulative count of bytes received",
            &|i| i.rx_bytes,
        );
        net_family(
            "container_network_receive_errors_total",
            "Cumulative count of errors encountered while receiving",
            &|i| i.rx_errors,
        );
        net_family(
            "container_network_transmit_bytes_total",
            "Cumulative count of bytes transmitted",
            &|i| i.tx_bytes,
        );
        net_family(
            "container_network_transmit_errors_total",
            "Cumulative count of errors encountered while transmitting",
            &|i| i.tx_errors,
        );
        let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
        out.push_str(&format!(
            "# HELP machine_cpu_cores Number of logical CPU cores.\n# TYPE machine_cpu_cores gauge\nmachine_cpu_cores {cores} {now_ms}\n# HELP machine_memory_bytes Amount of memory installed on the machine.\n# TYPE machine_memory_bytes gauge\nmachine_memory_bytes {} {now_ms}\n",
            self.paths.memory_capacity
        ));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_stat_values_are_read_by_key() {
        let stat = "nr_periods 12\nnr_throttled 3\nthrottled_time 4500000\n";
        assert_eq!(stat_value(stat, "nr_periods"), Some(12));
        assert_eq!(stat_value(stat, "nr_throttled"), Some(3));
        assert_eq!(stat_value(stat, "throttled_time"), Some(4_500_000));
        assert_eq!(stat_value(stat, "nr"), None);
    }

    #[test]
    fn a_container_cgroup_is_found_under_either_driver() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("abc123")).unwrap();
        std::fs::create_dir(d.path().join("cri-containerd-def456.scope")).unwrap();
        assert_eq!(
            container_cgroup(d.path(), "abc123"),
            Some(d.path().join("abc123"))
        );
        assert_eq!(
            container_cgroup(d.path(), "def456"),
            Some(d.path().join("cri-containerd-def456.scope"))
        );
        assert_eq!(container_cgroup(d.path(), "zzz"), None);
    }
}
