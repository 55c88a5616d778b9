//! KubeletConfiguration: the agent's configuration file.
//!
//! The file is a `kubelet.config.k8s.io/v1beta1` `KubeletConfiguration` document (YAML or JSON)
//! with kubelet's field names and defaults (kubelet's `SetDefaults_KubeletConfiguration`).
//! Fields that nodelet does not implement are reported as warnings naming them; values that are
//! invalid are errors naming the field and the value (kubelet's `ValidateKubeletConfiguration`).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::duration::{format_go_duration, GoDuration};

/// Errors from loading or validating the configuration file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// Path of the file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a YAML/JSON mapping, or a field has the wrong type.
    #[error("config file {path}: {message}")]
    Parse {
        /// Path of the file.
        path: PathBuf,
        /// What the parser said.
        message: String,
    },
    /// A field holds a value nodelet cannot use.
    #[error("config file {path}: invalid value {value:?} for field {field}: {reason}")]
    Invalid {
        /// Path of the file.
        path: PathBuf,
        /// The field's name as written in the file (camelCase).
        field: &'static str,
        /// The offending value.
        value: String,
        /// Why it is invalid and what is accepted.
        reason: String,
    },
}

/// The subset of kubelet's `KubeletConfiguration` that nodelet implements, with kubelet's
/// defaults. Field names are kubelet's (camelCase in the file).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KubeletConfiguration {
    /// `kubelet.config.k8s.io/v1beta1`.
    pub api_version: String,
    /// `KubeletConfiguration`.
    pub kind: String,
    /// Directory of static pod manifests (file source). Empty: no file source.
    pub static_pod_path: String,
    /// How often the manifest directory is re-listed (default 20s), besides inotify.
    pub file_check_frequency: GoDuration,
    /// Maximum period between two syncs of a running pod (default 1m).
    pub sync_frequency: GoDuration,
    /// CRI runtime endpoint, `unix://` path (default `unix:///run/containerd/containerd.sock`).
    pub container_runtime_endpoint: String,
    /// CRI image endpoint; empty means the runtime endpoint.
    pub image_service_endpoint: String,
    /// Timeout of each CRI call except long-running ones (default 2m).
    pub runtime_request_timeout: GoDuration,
    /// Root of the pod cgroup hierarchy (default `/`).
    pub cgroup_root: String,
    /// `cgroupfs` (default) or `systemd`.
    pub cgroup_driver: String,
    /// Create QoS-level cgroups (`kubepods/burstable`, `kubepods/besteffort`); default true.
    #[serde(rename = "cgroupsPerQOS")]
    pub cgroups_per_qos: bool,
    /// Address of the healthz/pods/metrics listener (default `127.0.0.1`).
    pub healthz_bind_address: String,
    /// Port of that listener (default 10248); 0 disables it.
    pub healthz_port: u16,
    /// Port of the read-only server (`/pods`, `/metrics`, `/healthz`); 0 (default) disables it.
    pub read_only_port: u16,
    /// Address of the read-only server. nodelet's default is 127.0.0.1 (kubelet's is 0.0.0.0):
    /// nothing listens on all interfaces unless the configuration asks.
    pub address: String,
    /// Directory of container logs (default `/var/log/pods`).
    pub pod_logs_dir: String,
    /// Resolver configuration handed to pods with DNS policy Default (default `/etc/resolv.conf`).
    pub resolv_conf: String,
    /// IP addresses of the cluster DNS servers (kubelet's `clusterDNS`, default none). Pods with
    /// DNS policy `ClusterFirst` (not on the host network) or `ClusterFirstWithHostNet` use them;
    /// with none, those pods fall back to the host's resolver, as with kubelet.
    #[serde(rename = "clusterDNS")]
    pub cluster_dns: Vec<String>,
    /// The cluster's DNS domain (kubelet's `clusterDomain`, default none): pods using the cluster
    /// DNS search `<namespace>.svc.<domain>`, `svc.<domain>` and `<domain>`.
    pub cluster_domain: String,
    /// Maximum number of pods (default 110).
    pub max_pods: u32,
    /// Resources reserved for Kubernetes daemons (`cpu`, `memory`, `pid` quantities).
    pub kube_reserved: BTreeMap<String, String>,
    /// Resources reserved for the OS (`cpu`, `memory`, `pid` quantities).
    pub system_reserved: BTreeMap<String, String>,
    /// Where node allocatable is enforced: `pods` (default), `system-reserved`, `kube-reserved`,
    /// or `none`. nodelet enforces `pods` (the `kubepods` cgroup limits).
    pub enforce_node_allocatable: Vec<String>,
    /// Memory held back from lower QoS classes, as `memory: "<percent>%"`.
    #[serde(rename = "qosReserved")]
    pub qos_reserved: BTreeMap<String, String>,
    /// Maximum processes per pod (-1: unlimited).
    pub pod_pids_limit: i64,
    /// Enforce cpu limits with CFS quota (default true).
    #[serde(rename = "cpuCFSQuota")]
    pub cpu_cfs_quota: bool,
    /// CFS period (default 100ms; 1ms..1s).
    #[serde(rename = "cpuCFSQuotaPeriod")]
    pub cpu_cfs_quota_period: GoDuration,
    /// oom_score_adj of the agent itself (default -999; -1000..=1000).
    pub oom_score_adj: i32,
    /// Rotate a container's log when it is larger than this (a quantity, default `10Mi`).
    pub container_log_max_size: String,
    /// Most log files kept per container, the current one included (default 5, at least 2).
    pub container_log_max_files: u32,
    /// How often container logs are checked for rotation (default 10s).
    pub container_log_monitor_interval: GoDuration,
    /// Container restart back-off (CrashLoopBackOff).
    pub crash_loop_back_off: CrashLoopBackOff,
    /// Image pull back-off (ImagePullBackOff); a nodelet field, kubelet hard-codes 10s..300s.
    pub image_pull_back_off: ImagePullBackOff,
    /// Hard eviction thresholds, signal → `<` value (quantity or percentage). Absent: kubelet's
    /// defaults (`memory.available: 100Mi`, `nodefs.available: 10%`, `nodefs.inodesFree: 5%`,
    /// `imagefs.available: 15%`, `imagefs.inodesFree: 5%`); given: exactly the map given, as in
    /// kubelet (omitted signals are not defaulted).
    pub eviction_hard: BTreeMap<String, String>,
    /// Soft eviction thresholds; each needs an `evictionSoftGracePeriod`.
    pub eviction_soft: BTreeMap<String, String>,
    /// How long each soft threshold must hold before it evicts (Go durations).
    pub eviction_soft_grace_period: BTreeMap<String, String>,
    /// Longest grace period, seconds, given to a pod killed by a soft threshold (default 0: the
    /// minimum grace period).
    pub eviction_max_pod_grace_period: i32,
    /// How long a pressure condition stays after its signal recovers (default 5m).
    pub eviction_pressure_transition_period: GoDuration,
    /// Amount reclaimed beyond a threshold once it is met, signal → quantity or percentage.
    pub eviction_minimum_reclaim: BTreeMap<String, String>,
    /// Period of the eviction manager's own check (kubelet hard-codes 10s); a nodelet field.
    pub eviction_monitoring_period: GoDuration,
    /// Wake the eviction manager from kernel memory threshold notifications (cgroup v1
    /// `cgroup.event_control`) instead of waiting for the periodic check. kubelet's field, but
    /// nodelet's default is true (kubelet's is false).
    pub kernel_memcg_notification: bool,
    /// Count every static pod as critical (never evicted), as kubelet does. nodelet's field,
    /// default false: only pods with priority ≥ 2000000000 and mirror pods are critical.
    pub static_pods_are_critical: bool,
}

impl Default for KubeletConfiguration {
    fn default() -> Self {
        Self {
            api_version: "kubelet.config.k8s.io/v1beta1".into(),
            kind: "KubeletConfiguration".into(),
            static_pod_path: String::new(),
            file_check_frequency: GoDuration(Duration::from_secs(20)),
            sync_frequency: GoDuration(Duration::from_secs(60)),
            container_runtime_endpoint: "unix:///run/containerd/containerd.sock".into(),
            image_service_endpoint: String::new(),
            runtime_request_timeout: GoDuration(Duration::from_secs(120)),
            cgroup_root: "/".into(),
            cgroup_driver: "cgroupfs".into(),
            cgroups_per_qos: true,
            healthz_bind_address: "127.0.0.1".into(),
            healthz_port: 10248,
            read_only_port: 0,
            address: "127.0.0.1".into(),
            pod_logs_dir: "/var/log/pods".into(),
            resolv_conf: "/etc/resolv.conf".into(),
            cluster_dns: Vec::new(),
            cluster_domain: String::new(),
            max_pods: 110,
            kube_reserved: BTreeMap::new(),
            system_reserved: BTreeMap::new(),
            enforce_node_allocatable: vec!["pods".into()],
            qos_reserved: BTreeMap::new(),
            pod_pids_limit: -1,
            cpu_cfs_quota: true,
            cpu_cfs_quota_period: GoDuration(Duration::from_millis(100)),
            oom_score_adj: -999,
            container_log_max_size: "10Mi".into(),
            container_log_max_files: 5,
            container_log_monitor_interval: GoDuration(Duration::from_secs(10)),
            crash_loop_back_off: CrashLoopBackOff::default(),
            image_pull_back_off: ImagePullBackOff::default(),
            eviction_hard: crate::eviction::threshold::default_hard(),
            eviction_soft: BTreeMap::new(),
            eviction_soft_grace_period: BTreeMap::new(),
            eviction_max_pod_grace_period: 0,
            eviction_pressure_transition_period: GoDuration(Duration::from_secs(300)),
            eviction_minimum_reclaim: BTreeMap::new(),
            eviction_monitoring_period: GoDuration(Duration::from_secs(10)),
            kernel_memcg_notification: true,
            static_pods_are_critical: false,
        }
    }
}

/// Container restart back-off. `maxContainerRestartPeriod` is kubelet's field (KEP-4603,
/// default 300s); `initialContainerRestartPeriod` is nodelet's (kubelet hard-codes 10s; kubernetes
/// issue #57291 asks for it).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CrashLoopBackOff {
    /// First delay before restarting a crashed container (default 10s).
    pub initial_container_restart_period: GoDuration,
    /// Longest delay (default 300s).
    pub max_container_restart_period: GoDuration,
}

impl Default for CrashLoopBackOff {
    fn default() -> Self {
        Self {
            initial_container_restart_period: GoDuration(Duration::from_secs(10)),
            max_container_restart_period: GoDuration(Duration::from_secs(300)),
        }
    }
}

/// Image pull back-off (nodelet's field; kubelet hard-codes 10s doubling to 300s).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ImagePullBackOff {
    /// First delay after a failed pull (default 10s).
    pub initial_period: GoDuration,
    /// Longest delay (default 300s).
    pub max_period: GoDuration,
}

impl Default for ImagePullBackOff {
    fn default() -> Self {
        Self {
            initial_period: GoDuration(Duration::from_secs(10)),
            max_period: GoDuration(Duration::from_secs(300)),
        }
    }
}

/// Field names nodelet reads (the keys the configuration serializes to); any other top-level
/// key draws a warning.
fn known_fields() -> std::collections::BTreeSet<String> {
    match serde_yaml::to_value(KubeletConfiguration::default()) {
        Ok(serde_yaml::Value::Mapping(m)) => m
            .into_iter()
            .filter_map(|(k, _)| k.as_str().map(str::to_owned))
            .collect(),
        _ => Default::default(),
    }
}

/// A loaded configuration and the warnings found while loading it.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    /// The effective configuration, defaults filled in.
    pub config: KubeletConfiguration,
    /// Top-level fields nodelet does not know or implement; they are ignored.
    pub unknown_fields: Vec<String>,
}

impl KubeletConfiguration {
    /// Reads, parses and validates a configuration file.
    ///
    /// Errors: [`ConfigError::Read`] when the file cannot be read, [`ConfigError::Parse`] when it is
    /// not a mapping or a field has the wrong type, [`ConfigError::Invalid`] naming the field and
    /// value that fail validation.
    pub fn load(path: &Path) -> Result<LoadedConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Parses and validates configuration text; `path` only labels errors.
    pub fn parse(path: &Path, text: &str) -> Result<LoadedConfig, ConfigError> {
        let parse_err = |message: String| ConfigError::Parse {
            path: path.to_owned(),
            message,
        };
        let value: serde_yaml::Value =
            serde_yaml::from_str(text).map_err(|e| parse_err(e.to_string()))?;
        let map: BTreeMap<String, serde_yaml::Value> = match value {
            serde_yaml::Value::Mapping(_) => {
                serde_yaml::from_value(value.clone()).map_err(|e| parse_err(e.to_string()))?
            }
            serde_yaml::Value::Null => BTreeMap::new(),
            _ => {
                return Err(parse_err(
                    "the file must hold a KubeletConfiguration mapping".into(),
                ))
            }
        };
        let known = known_fields();
        let unknown_fields: Vec<String> = map
            .keys()
            .filter(|k| !known.contains(k.as_str()))
            .cloned()
            .collect();
        let config: KubeletConfiguration = if map.is_empty() {
            KubeletConfiguration::default()
        } else {
            serde_path_to_error::deserialize(serde_yaml::Deserializer::from_str(text))
                .map_err(|e| parse_err(field_error_message(&e)))?
        };
        config.validate(path)?;
        Ok(LoadedConfig {
            config,
            unknown_fields,
        })
    }

    /// Checks every field nodelet uses; the first invalid one is returned.
    pub fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid = |field: &'static str, value: &str, reason: &str| ConfigError::Invalid {
            path: path.to_owned(),
            field,
            value: value.to_owned(),
            reason: reason.to_owned(),
        };
        if self.api_version != "kubelet.config.k8s.io/v1beta1" {
            return Err(invalid(
                "apiVersion",
                &self.api_version,
                "must be kubelet.config.k8s.io/v1beta1",
            ));
        }
        if self.kind != "KubeletConfiguration" {
            return Err(invalid("kind", &self.kind, "must be KubeletConfiguration"));
        }
        if !self.static_pod_path.is_empty() && !self.static_pod_path.starts_with('/') {
            return Err(invalid(
                "staticPodPath",
                &self.static_pod_path,
                "must be an absolute path",
            ));
        }
        // Lower bounds keep a typo (`1ns`) from turning a loop into a busy spin.
        for (field, d, min, min_text) in [
            (
                "fileCheckFrequency",
                self.file_check_frequency,
                Duration::from_millis(100),
                "100ms",
            ),
            (
                "syncFrequency",
                self.sync_frequency,
                Duration::from_secs(1),
                "1s",
            ),
            (
                "runtimeRequestTimeout",
                self.runtime_request_timeout,
                Duration::from_secs(1),
                "1s",
            ),
        ] {
            if d.0 < min {
                return Err(invalid(
                    field,
                    &format_go_duration(d.0),
                    &format!("must be at least {min_text}"),
                ));
            }
        }
        if socket_path(&self.container_runtime_endpoint).is_none() {
            return Err(invalid(
                "containerRuntimeEndpoint",
                &self.container_runtime_endpoint,
                "must be unix:///path/to/socket",
            ));
        }
        if !self.image_service_endpoint.is_empty()
            && socket_path(&self.image_service_endpoint).is_none()
        {
            return Err(invalid(
                "imageServiceEndpoint",
                &self.image_service_endpoint,
                "must be unix:///path/to/socket",
            ));
        }
        if !self.cgroup_root.starts_with('/') || self.cgroup_root.split('/').any(|c| c == "..") {
            return Err(invalid(
                "cgroupRoot",
                &self.cgroup_root,
                "must be an absolute cgroup path without '..'",
            ));
        }
        if !matches!(self.cgroup_driver.as_str(), "cgroupfs" | "systemd") {
            return Err(invalid(
                "cgroupDriver",
                &self.cgroup_driver,
                "must be cgroupfs or systemd",
            ));
        }
        if self.healthz_bind_address.parse::<IpAddr>().is_err() {
            return Err(invalid(
                "healthzBindAddress",
                &self.healthz_bind_address,
                "must be an IP address",
            ));
        }
        if self.address.parse::<IpAddr>().is_err() {
            return Err(invalid("address", &self.address, "must be an IP address"));
        }
        if !self.pod_logs_dir.starts_with('/') {
            return Err(invalid(
                "podLogsDir",
                &self.pod_logs_dir,
                "must be an absolute path",
            ));
        }
        for ip in &self.cluster_dns {
            if ip.parse::<IpAddr>().is_err() {
                return Err(invalid("clusterDNS", ip, "entries must be IP addresses"));
            }
        }
        let domain = self.cluster_domain.trim_end_matches('.');
        if !domain.is_empty() && !crate::pod::is_dns1123_subdomain(domain) {
            return Err(invalid(
                "clusterDomain",
                &self.cluster_domain,
                "must be a DNS-1123 subdomain such as cluster.local",
            ));
        }
        for (field, map) in [
            ("kubeReserved", &self.kube_reserved),
            ("systemReserved", &self.system_reserved),
        ] {
            for (k, v) in map {
                let ok = matches!(k.as_str(), "cpu" | "memory" | "pid" | "ephemeral-storage")
                    && crate::quantity::parse_milli(v).is_ok_and(|q| q >= 0);
                if !ok {
                    return Err(invalid(
                        field,
                        &format!("{k}={v}"),
                        "keys cpu, memory, pid, ephemeral-storage with non-negative quantities",
                    ));
                }
            }
        }
        for v in &self.enforce_node_allocatable {
            if !matches!(
                v.as_str(),
                "pods" | "system-reserved" | "kube-reserved" | "none"
            ) {
                return Err(invalid(
                    "enforceNodeAllocatable",
                    v,
                    "entries must be pods, system-reserved, kube-reserved or none",
                ));
            }
        }
        for (k, v) in &self.qos_reserved {
            if k != "memory" || parse_percent(v).is_none() {
                return Err(invalid(
                    "qosReserved",
                    &format!("{k}={v}"),
                    "only memory, as a percentage 0%..100%",
                ));
            }
        }
        if !(Duration::from_millis(1)..=Duration::from_secs(1))
            .contains(&self.cpu_cfs_quota_period.0)
        {
            return Err(invalid(
                "cpuCFSQuotaPeriod",
                &format_go_duration(self.cpu_cfs_quota_period.0),
                "must be between 1ms and 1s",
            ));
        }
        if !(-1000..=1000).contains(&self.oom_score_adj) {
            return Err(invalid(
                "oomScoreAdj",
                &self.oom_score_adj.to_string(),
                "must be between -1000 and 1000",
            ));
        }
        for (field, initial, max) in [
            (
                "crashLoopBackOff",
                self.crash_loop_back_off.initial_container_restart_period,
                self.crash_loop_back_off.max_container_restart_period,
            ),
            (
                "imagePullBackOff",
                self.image_pull_back_off.initial_period,
                self.image_pull_back_off.max_period,
            ),
        ] {
            if initial.0 < Duration::from_millis(100) || initial.0 > max.0 {
                return Err(invalid(
                    field,
                    &format!(
                        "{}..{}",
                        format_go_duration(initial.0),
                        format_go_duration(max.0)
                    ),
                    "the initial period must be at least 100ms and at most the max period",
                ));
            }
        }
        if !crate::quantity::parse_value(&self.container_log_max_size).is_ok_and(|v| v > 0) {
            return Err(invalid(
                "containerLogMaxSize",
                &self.container_log_max_size,
                "must be a positive quantity such as 10Mi",
            ));
        }
        if self.container_log_max_files < 2 {
            return Err(invalid(
                "containerLogMaxFiles",
                &self.container_log_max_files.to_string(),
                "must be at least 2",
            ));
        }
        if self.container_log_monitor_interval.0 < Duration::from_millis(100) {
            return Err(invalid(
                "containerLogMonitorInterval",
                &format_go_duration(self.container_log_monitor_interval.0),
                "must be at least 100ms",
            ));
        }
        if self.pod_pids_limit < -1 {
            return Err(invalid(
                "podPidsLimit",
                &self.pod_pids_limit.to_string(),
                "must be -1 (unlimited) or positive",
            ));
        }
        if self.max_pods == 0 {
            return Err(invalid("maxPods", "0", "must be at least 1"));
        }
        if let Err(e) = self.eviction_thresholds() {
            return Err(invalid(
                e.field,
                &format!("{}={}", e.signal, e.value),
                &e.reason,
            ));
        }
        if self.eviction_max_pod_grace_period < 0 {
            return Err(invalid(
                "evictionMaxPodGracePeriod",
                &self.eviction_max_pod_grace_period.to_string(),
                "must not be negative",
            ));
        }
        if self.eviction_monitoring_period.0 < Duration::from_millis(100) {
            return Err(invalid(
                "evictionMonitoringPeriod",
                &format_go_duration(self.eviction_monitoring_period.0),
                "must be at least 100ms",
            ));
        }
        Ok(())
    }

    /// The eviction thresholds of `evictionHard`, `evictionSoft`, `evictionSoftGracePeriod` and
    /// `evictionMinimumReclaim` (kubelet's `ParseThresholdConfig`).
    ///
    /// Errors: the first malformed entry, see [`crate::eviction::threshold::parse_thresholds`].
    pub fn eviction_thresholds(
        &self,
    ) -> Result<
        Vec<crate::eviction::threshold::Threshold>,
        crate::eviction::threshold::ThresholdError,
    > {
        crate::eviction::threshold::parse_thresholds(
            &self.eviction_hard,
            &self.eviction_soft,
            &self.eviction_soft_grace_period,
            &self.eviction_minimum_reclaim,
        )
    }

    /// Path of the CRI runtime socket.
    pub fn runtime_socket(&self) -> PathBuf {
        socket_path(&self.container_runtime_endpoint).unwrap_or_default()
    }

    /// Path of the CRI image socket (the runtime socket unless `imageServiceEndpoint` is set).
    pub fn image_socket(&self) -> PathBuf {
        socket_path(&self.image_service_endpoint).unwrap_or_else(|| self.runtime_socket())
    }
}

/// A decoding error as `field <path>: <problem>`, without repeating the path when the YAML
/// parser's own message already starts with it.
pub fn field_error_message(e: &serde_path_to_error::Error<serde_yaml::Error>) -> String {
    let (path, inner) = (e.path().to_string(), e.inner().to_string());
    match inner.strip_prefix(&format!("{path}: ")) {
        Some(rest) => format!("field {path}: {rest}"),
        None => format!("field {path}: {inner}"),
    }
}

/// Parses `"<n>%"` with 0 ≤ n ≤ 100.
pub fn parse_percent(s: &str) -> Option<i64> {
    s.strip_suffix('%')?
        .parse()
        .ok()
        .filter(|p| (0..=100).contains(p))
}

/// cpu (millicores), memory (bytes) and pids of a reservation map; validated quantities.
pub fn reserved_resources(map: &BTreeMap<String, String>) -> crate::cm::resources::NodeResources {
    let get = |k: &str, milli: bool| {
        map.get(k)
            .and_then(|v| {
                if milli {
                    crate::quantity::parse_milli(v)
                } else {
                    crate::quantity::parse_value(v)
                }
                .ok()
            })
            .map_or(0, |v| v as i64)
    };
    crate::cm::resources::NodeResources {
        cpu_milli: get("cpu", true),
        memory: get("memory", false),
        pids: get("pid", false),
    }
}

/// The socket path of a `unix://` endpoint (`unix:///run/x.sock` → `/run/x.sock`); a bare
/// absolute path is accepted too, as kubelet does with a deprecation warning.
pub fn socket_path(endpoint: &str) -> Option<PathBuf> {
    let p = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    (p.starts_with('/') && p.len() > 1).then(|| PathBuf::from(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<LoadedConfig, ConfigError> {
        KubeletConfiguration::parse(Path::new("test.yaml"), text)
    }

    #[test]
    fn defaults_are_kubelets() {
        let c = parse("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n")
            .unwrap()
            .config;
        assert_eq!(c.file_check_frequency.0, Duration::from_secs(20));
        assert_eq!(c.sync_frequency.0, Duration::from_secs(60));
        assert_eq!(c.healthz_port, 10248);
        assert_eq!(c.healthz_bind_address, "127.0.0.1");
        assert_eq!(c.cgroup_driver, "cgroupfs");
        assert!(c.cgroups_per_qos);
        assert_eq!(c.pod_logs_dir, "/var/log/pods");
        assert_eq!(c.eviction_thresholds().unwrap().len(), 5);
        assert_eq!(
            c.eviction_pressure_transition_period.0,
            Duration::from_secs(300)
        );
        assert!(!c.static_pods_are_critical);
        assert_eq!(
            c.runtime_socket(),
            PathBuf::from("/run/containerd/containerd.sock")
        );
    }

    #[test]
    fn unknown_fields_are_named() {
        let l = parse("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfooBar: 1\nimageGCHighThresholdPercent: 85\n").unwrap();
        assert_eq!(
            l.unknown_fields,
            vec![
                "fooBar".to_string(),
                "imageGCHighThresholdPercent".to_string()
            ]
        );
    }

    #[test]
    fn invalid_values_name_field_and_value() {
        let cases = [
            ("cgroupDriver: docker", "cgroupDriver", "docker"),
            ("clusterDNS: [kube-dns]", "clusterDNS", "kube-dns"),
            ("clusterDomain: ../x", "clusterDomain", "../x"),
            ("fileCheckFrequency: 0s", "fileCheckFrequency", "0s"),
            ("fileCheckFrequency: 1ns", "fileCheckFrequency", "1ns"),
            ("syncFrequency: 10ms", "syncFrequency", "10ms"),
            (
                "containerRuntimeEndpoint: tcp://1.2.3.4:5",
                "containerRuntimeEndpoint",
                "tcp://1.2.3.4:5",
            ),
            (
                "healthzBindAddress: localhost",
                "healthzBindAddress",
                "localhost",
            ),
            (
                "staticPodPath: relative/dir",
                "staticPodPath",
                "relative/dir",
            ),
            ("cgroupRoot: /a/../b", "cgroupRoot", "/a/../b"),
            ("kind: Pod", "kind", "Pod"),
            (
                "kubeReserved: {memory: lots}",
                "kubeReserved",
                "memory=lots",
            ),
            ("systemReserved: {gpu: '1'}", "systemReserved", "gpu=1"),
            ("qosReserved: {memory: 150%}", "qosReserved", "memory=150%"),
            (
                "enforceNodeAllocatable: [everything]",
                "enforceNodeAllocatable",
                "everything",
            ),
            ("oomScoreAdj: -2000", "oomScoreAdj", "-2000"),
            ("cpuCFSQuotaPeriod: 5s", "cpuCFSQuotaPeriod", "5s"),
            ("podPidsLimit: -5", "podPidsLimit", "-5"),
            (
                "crashLoopBackOff: {initialContainerRestartPeriod: 10m}",
                "crashLoopBackOff",
                "10m0s..5m0s",
            ),
            (
                "evictionHard: {memory.available: '0'}",
                "evictionHard",
                "memory.available=0",
            ),
            (
                "evictionHard: {memory.free: 1Gi}",
                "evictionHard",
                "memory.free=1Gi",
            ),
            (
                "evictionSoft: {memory.available: 1Gi}",
                "evictionSoft",
                "memory.available=1Gi",
            ),
            (
                "evictionMinimumReclaim: {nodefs.available: much}",
                "evictionMinimumReclaim",
                "nodefs.available=much",
            ),
            (
                "evictionMaxPodGracePeriod: -1",
                "evictionMaxPodGracePeriod",
                "-1",
            ),
            (
                "evictionMonitoringPeriod: 1ms",
                "evictionMonitoringPeriod",
                "1ms",
            ),
        ];
        for (line, field, value) in cases {
            let text = format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{line}\n"
            );
            let text = if field == "kind" {
                format!("apiVersion: kubelet.config.k8s.io/v1beta1\n{line}\n")
            } else {
                text
            };
            match parse(&text) {
                Err(ConfigError::Invalid {
                    field: f, value: v, ..
                }) => {
                    assert_eq!((f, v.as_str()), (field, value), "{line}");
                }
                other => panic!("{line}: expected Invalid, got {other:?}"),
            }
        }
    }

    #[test]
    fn wrong_types_are_parse_errors() {
        let e = parse("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nhealthzPort: abc\n").unwrap_err();
        assert!(matches!(e, ConfigError::Parse { .. }), "{e}");
        assert!(e.to_string().contains("healthzPort"), "{e}");
        let e = parse("syncFrequency: 10x\n").unwrap_err();
        assert!(e.to_string().contains("10x"), "{e}");
    }
}
