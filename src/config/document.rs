//! The configuration document as written: kubelet's `KubeletConfiguration` fields that nodelet
//! implements, with kubelet's names (camelCase in the file) and defaults (kubelet's
//! `SetDefaults_KubeletConfiguration`).
//!
//! These are the file's own values, strings included (quantities, thresholds, addresses), so
//! that `nodelet check-config` prints them in kubelet's spelling. Nothing in the agent reads
//! them: [`KubeletConfiguration::to_config`](super::KubeletConfiguration::to_config) turns them
//! into the typed [`Config`](super::Config) once, at load.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::duration::GoDuration;

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
    /// URL of static pod manifests (HTTP source): one pod or a `PodList`, fetched every
    /// `httpCheckFrequency`. Empty: no HTTP source.
    #[serde(rename = "staticPodURL")]
    pub static_pod_url: String,
    /// Headers sent with every request to `staticPodURL`: name → values.
    #[serde(rename = "staticPodURLHeader")]
    pub static_pod_url_header: BTreeMap<String, Vec<String>>,
    /// How often `staticPodURL` is fetched (default 20s).
    pub http_check_frequency: GoDuration,
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
    /// Address of the node API (`port`) and the read-only server. nodelet's default is
    /// 127.0.0.1 (kubelet's is 0.0.0.0): nothing listens on all interfaces unless the
    /// configuration asks, so a node in a cluster sets it (`0.0.0.0`, or its own IP) for the API
    /// server to reach its logs, exec and port-forward.
    pub address: String,
    /// Port of the node API (HTTPS: `/containerLogs`, `/exec`, `/attach`, `/portForward`,
    /// `/pods`, `/metrics`), on `address`; default 10250. 0: no node API (nodelet's; kubelet
    /// always serves it).
    pub port: u16,
    /// PEM certificate (chain) the node API serves; with `tlsPrivateKeyFile`. Empty: a
    /// self-signed pair made once under `--root-dir`/pki (kubelet's behaviour).
    pub tls_cert_file: String,
    /// PEM private key of `tlsCertFile`.
    pub tls_private_key_file: String,
    /// Oldest TLS version the node API speaks: `VersionTLS12` (default) or `VersionTLS13`.
    pub tls_min_version: String,
    /// Cipher suites the node API offers, by Go's names; empty: the TLS library's defaults.
    pub tls_cipher_suites: Vec<String>,
    /// Who may use the node API (kubelet's `authentication`).
    pub authentication: Authentication,
    /// What they may do (kubelet's `authorization`).
    pub authorization: Authorization,
    /// Serve logs, exec, attach and port-forward on the node API (default true).
    pub enable_debugging_handlers: bool,
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
    /// Sysctls beyond the safe set that pods may set (kubelet's `allowedUnsafeSysctls`): names,
    /// or prefixes ending in `*`, of namespaced sysctls (`net.*`, `kernel.shm*`, `kernel.msg*`,
    /// `kernel.sem`, `fs.mqueue.*`).
    pub allowed_unsafe_sysctls: Vec<String>,
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
    /// Image garbage collection frees space when the image filesystem is at least this
    /// percent used (default 85; 100 turns it off).
    #[serde(rename = "imageGCHighThresholdPercent")]
    pub image_gc_high_threshold_percent: i32,
    /// ... down to this percent used (default 80; below the high threshold).
    #[serde(rename = "imageGCLowThresholdPercent")]
    pub image_gc_low_threshold_percent: i32,
    /// An unused image is kept at least this long after it was first seen (default 2m).
    #[serde(rename = "imageMinimumGCAge")]
    pub image_minimum_gc_age: GoDuration,
    /// An image unused for longer is removed whatever the disk use (default 0: off).
    #[serde(rename = "imageMaximumGCAge")]
    pub image_maximum_gc_age: GoDuration,
    /// How often image garbage collection runs (kubelet hard-codes 5m); a nodelet field.
    #[serde(rename = "imageGCPeriod")]
    pub image_gc_period: GoDuration,
    /// How often container garbage collection runs over the whole node (kubelet hard-codes
    /// 1m); a nodelet field.
    #[serde(rename = "containerGCPeriod")]
    pub container_gc_period: GoDuration,
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
    /// How long the node's shutdown waits for its pods (graceful node shutdown, through
    /// systemd-logind's delay inhibitor lock); 0 (the default) turns it off.
    pub shutdown_grace_period: GoDuration,
    /// The part of `shutdownGracePeriod` kept for critical pods (priority ≥ 2000000000), which
    /// are stopped last; default 0.
    pub shutdown_grace_period_critical_pods: GoDuration,
    /// Grace periods by pod priority (`[{priority, shutdownGracePeriodSeconds}]`), instead of
    /// the two fields above.
    pub shutdown_grace_period_by_pod_priority: Vec<crate::nodeshutdown::PriorityGroup>,
    /// kubelet's feature gates, by name. nodelet reads `MemoryQoS` (default false); any other
    /// gate draws a warning that names it.
    pub feature_gates: BTreeMap<String, bool>,
    /// With `MemoryQoS`: how far between a container's memory request and its limit (or node
    /// allocatable) its `memory.high` goes, in (0, 1]; default 0.9.
    pub memory_throttling_factor: f64,
}

/// The feature gates nodelet reads.
pub const KNOWN_FEATURE_GATES: [&str; 1] = ["MemoryQoS"];

impl Default for KubeletConfiguration {
    fn default() -> Self {
        Self {
            api_version: "kubelet.config.k8s.io/v1beta1".into(),
            kind: "KubeletConfiguration".into(),
            static_pod_path: String::new(),
            file_check_frequency: GoDuration(Duration::from_secs(20)),
            static_pod_url: String::new(),
            static_pod_url_header: BTreeMap::new(),
            http_check_frequency: GoDuration(Duration::from_secs(20)),
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
            port: 10250,
            tls_cert_file: String::new(),
            tls_private_key_file: String::new(),
            tls_min_version: String::new(),
            tls_cipher_suites: Vec::new(),
            authentication: Authentication::default(),
            authorization: Authorization::default(),
            enable_debugging_handlers: true,
            pod_logs_dir: "/var/log/pods".into(),
            resolv_conf: "/etc/resolv.conf".into(),
            cluster_dns: Vec::new(),
            cluster_domain: String::new(),
            allowed_unsafe_sysctls: Vec::new(),
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
            image_gc_high_threshold_percent: 85,
            image_gc_low_threshold_percent: 80,
            image_minimum_gc_age: GoDuration(Duration::from_secs(120)),
            image_maximum_gc_age: GoDuration(Duration::ZERO),
            image_gc_period: GoDuration(Duration::from_secs(300)),
            container_gc_period: GoDuration(Duration::from_secs(60)),
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
            shutdown_grace_period: GoDuration(Duration::ZERO),
            shutdown_grace_period_critical_pods: GoDuration(Duration::ZERO),
            shutdown_grace_period_by_pod_priority: Vec::new(),
            feature_gates: BTreeMap::new(),
            memory_throttling_factor: 0.9,
        }
    }
}

/// The node API's authentication (kubelet's `KubeletAuthentication`, its config-file defaults).
/// Unknown keys are refused: a misspelt one would change who gets in.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct Authentication {
    /// Client certificates.
    pub x509: X509Authentication,
    /// Bearer tokens checked with the API server (`TokenReview`).
    pub webhook: WebhookAuthentication,
    /// Requests with no credentials.
    pub anonymous: AnonymousAuthentication,
}

/// Client certificates (kubelet's `KubeletX509Authentication`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct X509Authentication {
    /// PEM file of the CAs a client certificate must chain to (user = CN, groups = O); empty:
    /// no certificate authenticates.
    #[serde(rename = "clientCAFile")]
    pub client_ca_file: String,
}

/// Bearer tokens (kubelet's `KubeletWebhookAuthentication`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct WebhookAuthentication {
    /// Ask the API server (cluster mode); default true.
    pub enabled: bool,
    /// How long an answer is kept (default 2m).
    #[serde(rename = "cacheTTL")]
    pub cache_ttl: GoDuration,
}

impl Default for WebhookAuthentication {
    fn default() -> Self {
        Self {
            enabled: true,
            cache_ttl: GoDuration(Duration::from_secs(120)),
        }
    }
}

/// Anonymous requests (kubelet's `KubeletAnonymousAuthentication`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct AnonymousAuthentication {
    /// Let them through to authorization as `system:anonymous` (default false).
    pub enabled: bool,
}

/// The node API's authorization (kubelet's `KubeletAuthorization`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct Authorization {
    /// `Webhook` (default: a `SubjectAccessReview` per request, cluster mode) or
    /// `AlwaysAllow`.
    pub mode: String,
    /// The webhook's caches.
    pub webhook: WebhookAuthorization,
}

impl Default for Authorization {
    fn default() -> Self {
        Self {
            mode: "Webhook".into(),
            webhook: WebhookAuthorization::default(),
        }
    }
}

/// `SubjectAccessReview` answers kept (kubelet's `KubeletWebhookAuthorization`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct WebhookAuthorization {
    /// An allowed answer (default 5m).
    #[serde(rename = "cacheAuthorizedTTL")]
    pub cache_authorized_ttl: GoDuration,
    /// A denied answer (default 30s).
    #[serde(rename = "cacheUnauthorizedTTL")]
    pub cache_unauthorized_ttl: GoDuration,
}

impl Default for WebhookAuthorization {
    fn default() -> Self {
        Self {
            cache_authorized_ttl: GoDuration(Duration::from_secs(300)),
            cache_unauthorized_ttl: GoDuration(Duration::from_secs(30)),
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
pub(super) fn known_fields() -> std::collections::BTreeSet<String> {
    match serde_yaml::to_value(KubeletConfiguration::default()) {
        Ok(serde_yaml::Value::Mapping(m)) => m
            .into_iter()
            .filter_map(|(k, _)| k.as_str().map(str::to_owned))
            .collect(),
        _ => Default::default(),
    }
}
