//! The typed configuration: [`Config`], built once from the document by
//! [`KubeletConfiguration::to_config`], which checks every field on the way.
//!
//! Units: durations are [`Duration`]s; cpu is in millicores, memory and sizes in bytes, pids
//! in counts, all as `i64` (sizes that must be positive as `u64`); percentages are integers
//! 0..=100.
//!
//! Ranges: every quantity must fit in a signed 64-bit integer of its unit, so a cpu reservation
//! of `1e16` (1e19 millicores) is refused; so must each sum nodelet makes of them, so
//! `systemReserved` and `kubeReserved` of `7Ei` memory each are refused together, as is an
//! eviction threshold whose minimum reclaim takes it past that bound. Reservations above the
//! node's capacity are refused by the container manager at start-up
//! ([`crate::cm::ContainerManager::validate_reservations`]), as the capacity is only known then.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{socket_path, ConfigError, KubeletConfiguration};
use crate::cm::resources::{CgroupPolicy, NodeResources};
use crate::cm::{CgroupLayout, NodeConfig};
use crate::duration::{format_go_duration, GoDuration};
use crate::eviction::manager::Settings as EvictionSettings;
use crate::kuberuntime::backoff::BackoffPolicy;
use crate::kuberuntime::logs::LogPolicy;
use crate::quantity::{parse_amount, Scale};

/// The node API's settings (kubelet's server on `address:port`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeApiConfig {
    /// `address:port`.
    pub address: SocketAddr,
    /// `tlsCertFile`, `tlsPrivateKeyFile`, `tlsMinVersion`, `tlsCipherSuites`.
    pub tls: crate::nodeapi::tls::TlsSettings,
    /// `authentication.x509.clientCAFile`; `None`: no certificate authenticates.
    pub client_ca_file: Option<PathBuf>,
    /// `authentication.anonymous.enabled`.
    pub anonymous: bool,
    /// `authentication.webhook.cacheTTL` when `authentication.webhook.enabled`.
    pub token_webhook_ttl: Option<Duration>,
    /// `authorization`.
    pub authorization: AuthorizationMode,
    /// `enableDebuggingHandlers`.
    pub debugging: bool,
}

impl NodeApiConfig {
    /// Checks what the node API will load at start, so that `nodelet check-config` refuses what
    /// start-up would: the `clientCAFile` (readable, with a certificate), the serving pair when
    /// configured (readable, matching, with the versions and suites asked), and
    /// `authorization.mode: Webhook` on a node without an API server (`cluster` false) where a
    /// client could authenticate (nothing could authorize it).
    ///
    /// Errors: the first problem, naming the setting.
    pub fn check(&self, cluster: bool) -> Result<(), String> {
        use crate::nodeapi::{auth, tls};
        if let Some(ca) = &self.client_ca_file {
            auth::X509::from_file(ca)?;
        }
        match &self.tls.cert_and_key {
            Some((crt, key)) => {
                tls::server_config(crt, key, &self.tls)?;
            }
            None => {
                tls::provider(&self.tls.cipher_suites)?;
                tls::versions(&self.tls.min_version)?;
            }
        }
        let someone_gets_in = self.client_ca_file.is_some() || self.anonymous;
        if matches!(self.authorization, AuthorizationMode::Webhook { .. })
            && !cluster
            && someone_gets_in
        {
            return Err("authorization.mode: Webhook asks the API server, and this node has none (no --kubeconfig); set authorization.mode: AlwaysAllow on a standalone node".into());
        }
        Ok(())
    }
}

/// `authorization.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthorizationMode {
    /// Every authenticated request is allowed.
    AlwaysAllow,
    /// A `SubjectAccessReview` per request (cluster mode), answers kept `allowed_ttl` /
    /// `denied_ttl`.
    Webhook {
        /// `cacheAuthorizedTTL`.
        allowed_ttl: Duration,
        /// `cacheUnauthorizedTTL`.
        denied_ttl: Duration,
    },
}

/// The configuration the agent runs on: every field validated and converted from the file's
/// strings (see the [module docs](super)).
#[derive(Debug, Clone)]
pub struct Config {
    /// `staticPodPath`, an absolute directory; `None` when empty (no file source).
    pub static_pod_path: Option<PathBuf>,
    /// `fileCheckFrequency`: how often the manifest directory is re-listed (at least 100ms).
    pub file_check_frequency: Duration,
    /// `staticPodURL`, an `http://` or `https://` URL; `None` when empty (no HTTP source).
    pub static_pod_url: Option<String>,
    /// `staticPodURLHeader`: header name → values sent with each fetch.
    pub static_pod_url_header: Vec<(String, String)>,
    /// `httpCheckFrequency`: how often `staticPodURL` is fetched (at least 100ms).
    pub http_check_frequency: Duration,
    /// `syncFrequency`: longest period between two syncs of a running pod (at least 1s).
    pub sync_frequency: Duration,
    /// `containerRuntimeEndpoint` as written, for logs.
    pub container_runtime_endpoint: String,
    /// Path of the CRI runtime socket, from `containerRuntimeEndpoint`.
    pub runtime_socket: PathBuf,
    /// Path of the CRI image socket: `imageServiceEndpoint`'s, else the runtime socket.
    pub image_socket: PathBuf,
    /// `runtimeRequestTimeout`: timeout of each CRI call except long-running ones (at least 1s).
    pub runtime_request_timeout: Duration,
    /// `cgroupRoot`, `cgroupsPerQOS` and `cgroupDriver`: how pod cgroups are named.
    pub cgroup_layout: CgroupLayout,
    /// `cpuCFSQuota`, `cpuCFSQuotaPeriod` (microseconds, 1000..=1000000) and `podPidsLimit`
    /// (-1: unlimited).
    pub cgroup_policy: CgroupPolicy,
    /// `systemReserved`: cpu millicores, memory bytes, pids.
    pub system_reserved: NodeResources,
    /// `kubeReserved`: cpu millicores, memory bytes, pids. Its sum with `systemReserved` fits
    /// in an `i64` for each resource.
    pub kube_reserved: NodeResources,
    /// `enforceNodeAllocatable` contains `pods`: `kubepods` gets allocatable, not capacity.
    pub enforce_node_allocatable_pods: bool,
    /// `qosReserved.memory`, percent (0..=100).
    pub qos_reserved_memory_percent: Option<i64>,
    /// `healthzBindAddress:healthzPort`; `None` when the port is 0 (disabled).
    pub healthz_address: Option<SocketAddr>,
    /// `address:readOnlyPort`; `None` when the port is 0 (disabled, the default).
    pub read_only_address: Option<SocketAddr>,
    /// The node API (`address:port`, TLS, authentication, authorization); `None` when `port`
    /// is 0.
    pub node_api: Option<NodeApiConfig>,
    /// The file as loaded, defaults filled in, as JSON (the node API's `/configz`).
    pub configz: serde_json::Value,
    /// `podLogsDir`, absolute.
    pub pod_logs_dir: PathBuf,
    /// `resolvConf`: the host resolver file for pods; `None` when empty (no host DNS).
    pub resolv_conf: Option<PathBuf>,
    /// `clusterDNS`: the cluster DNS servers.
    pub cluster_dns: Vec<IpAddr>,
    /// `clusterDomain` without its trailing dot (empty: none).
    pub cluster_domain: String,
    /// `maxPods` (at least 1).
    pub max_pods: usize,
    /// `allowedUnsafeSysctls`: names or `prefix*` of namespaced sysctls.
    pub allowed_unsafe_sysctls: Vec<String>,
    /// `oomScoreAdj` of the agent itself (-1000..=1000).
    pub oom_score_adj: i32,
    /// `containerLogMaxSize` (bytes, positive) and `containerLogMaxFiles` (at least 2).
    pub container_log: LogPolicy,
    /// `containerLogMonitorInterval` (at least 100ms).
    pub container_log_monitor_interval: Duration,
    /// Image garbage collection: `imageGCHighThresholdPercent` (0..=100),
    /// `imageGCLowThresholdPercent` (0..=100, below the high one unless that is 100),
    /// `imageMinimumGCAge`, `imageMaximumGCAge` (0 or above the minimum), `imageGCPeriod` (at
    /// least 1s).
    pub image_gc: crate::gc::images::ImageGcPolicy,
    /// `containerGCPeriod` (at least 1s): the whole-node container garbage collection period.
    pub container_gc_period: Duration,
    /// `crashLoopBackOff`: container restart back-off (initial at least 100ms, at most max).
    pub crash_loop_back_off: BackoffPolicy,
    /// `imagePullBackOff`: image pull back-off (initial at least 100ms, at most max).
    pub image_pull_back_off: BackoffPolicy,
    /// The eviction manager's settings: parsed `evictionHard`/`evictionSoft` thresholds with
    /// their grace periods and minimum reclaims, `evictionPressureTransitionPeriod`,
    /// `evictionMonitoringPeriod` (at least 100ms), `evictionMaxPodGracePeriod` (seconds; any
    /// value, as kubelet takes it: see [`crate::eviction::manager::Settings::max_pod_grace_seconds`])
    /// and `staticPodsAreCritical` (which admission uses too).
    pub eviction: EvictionSettings,
    /// `kernelMemcgNotification`: wake the eviction manager from kernel notifications.
    pub kernel_memcg_notification: bool,
    /// Graceful node shutdown's groups, lowest priority first, from `shutdownGracePeriod`,
    /// `shutdownGracePeriodCriticalPods` or `shutdownGracePeriodByPodPriority`
    /// ([`crate::nodeshutdown::priority_groups`]); empty: off.
    pub shutdown_groups: Vec<crate::nodeshutdown::PriorityGroup>,
}

impl Config {
    /// The container manager's settings on a node with `capacity` (millicores, bytes, pids).
    /// Reservations above capacity are the container manager's to refuse
    /// ([`crate::cm::ContainerManager::validate_reservations`]).
    pub fn node_config(&self, capacity: NodeResources) -> NodeConfig {
        NodeConfig {
            layout: self.cgroup_layout.clone(),
            policy: self.cgroup_policy.clone(),
            capacity,
            system_reserved: self.system_reserved,
            kube_reserved: self.kube_reserved,
            enforce_pods: self.enforce_node_allocatable_pods,
            qos_reserved_memory: self.qos_reserved_memory_percent,
        }
    }
}

/// Parses `"<n>%"` with 0 ≤ n ≤ 100.
fn parse_percent(s: &str) -> Option<i64> {
    s.strip_suffix('%')?
        .parse()
        .ok()
        .filter(|p| (0..=100).contains(p))
}

/// The resources of the reservation maps that nodelet sums, with their unit in messages, in
/// the order of [`NodeResources`]' fields.
const SUMMED: [(&str, &str); 3] = [("cpu", "millicores"), ("memory", "bytes"), ("pid", "pids")];

/// Each listener needs a port of its own, else the second fails to bind at start with only
/// "address in use" to say why: the node API's `port` against `healthzPort` and `readOnlyPort`,
/// and those two against each other, where their addresses overlap (the same, or one of them
/// unspecified).
///
/// Errors: the setting that repeats another's port, naming both.
fn distinct_ports(
    invalid: &impl Fn(&'static str, &str, &str) -> ConfigError,
    healthz: Option<SocketAddr>,
    read_only: Option<SocketAddr>,
    api: Option<SocketAddr>,
) -> Result<(), ConfigError> {
    let clash = |a: SocketAddr, b: SocketAddr| {
        a.port() == b.port()
            && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
    };
    let pairs = [
        ("port", api, "healthzPort", healthz),
        ("port", api, "readOnlyPort", read_only),
        ("readOnlyPort", read_only, "healthzPort", healthz),
    ];
    for (field, a, other, b) in pairs {
        if let (Some(a), Some(b)) = (a, b) {
            if clash(a, b) {
                return Err(invalid(
                    field,
                    &a.port().to_string(),
                    &format!("is also {other}: each listener needs a port of its own"),
                ));
            }
        }
    }
    Ok(())
}

/// A duration setting of at least `min`: lower bounds keep a typo (`1ns`) from turning a loop into
/// a busy spin.
fn at_least(
    invalid: &impl Fn(&'static str, &str, &str) -> ConfigError,
    field: &'static str,
    d: GoDuration,
    min: Duration,
) -> Result<Duration, ConfigError> {
    if d.0 < min {
        return Err(invalid(
            field,
            &format_go_duration(d.0),
            &format!("must be at least {}", format_go_duration(min)),
        ));
    }
    Ok(d.0)
}

/// The pod sources' settings, checked.
struct PodSources {
    static_pod_path: Option<PathBuf>,
    file_check_frequency: Duration,
    static_pod_url: Option<String>,
    static_pod_url_header: Vec<(String, String)>,
    http_check_frequency: Duration,
}

impl KubeletConfiguration {
    /// Checks every field nodelet uses and converts it to its typed value (kubelet's
    /// `ValidateKubeletConfiguration`, plus nodelet's range checks, see the module docs).
    ///
    /// Errors: [`ConfigError::Invalid`] for the first invalid field, naming it and its value.
    pub fn to_config(&self, path: &Path) -> Result<Config, ConfigError> {
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
        let sources = self.pod_sources(&invalid)?;
        let sync_frequency = at_least(
            &invalid,
            "syncFrequency",
            self.sync_frequency,
            Duration::from_secs(1),
        )?;
        let runtime_request_timeout = at_least(
            &invalid,
            "runtimeRequestTimeout",
            self.runtime_request_timeout,
            Duration::from_secs(1),
        )?;
        let (runtime_socket, image_socket) = self.runtime_endpoints(&invalid)?;
        let cgroup_layout = self.cgroup_layout(&invalid)?;
        let (healthz_address, read_only_address) = self.addresses(&invalid)?;
        let node_api = self.node_api(&invalid)?;
        distinct_ports(
            &invalid,
            healthz_address,
            read_only_address,
            node_api.as_ref().map(|a| a.address),
        )?;
        if !self.pod_logs_dir.starts_with('/') {
            return Err(invalid(
                "podLogsDir",
                &self.pod_logs_dir,
                "must be an absolute path",
            ));
        }
        let (cluster_dns, cluster_domain) = self.dns(&invalid)?;
        crate::admission::sysctls::validate_allowed(&self.allowed_unsafe_sysctls).map_err(
            |reason| {
                invalid(
                    "allowedUnsafeSysctls",
                    &self.allowed_unsafe_sysctls.join(","),
                    &reason,
                )
            },
        )?;
        let (system_reserved, kube_reserved, qos_reserved_memory_percent) =
            self.node_allocatable(&invalid)?;
        let period = self.cpu_cfs_quota_period.0;
        let cpu_cfs_period_us = u64::try_from(period.as_micros())
            .ok()
            .filter(|_| (Duration::from_millis(1)..=Duration::from_secs(1)).contains(&period))
            .ok_or_else(|| {
                invalid(
                    "cpuCFSQuotaPeriod",
                    &format_go_duration(period),
                    "must be between 1ms and 1s",
                )
            })?;
        if !(-1000..=1000).contains(&self.oom_score_adj) {
            return Err(invalid(
                "oomScoreAdj",
                &self.oom_score_adj.to_string(),
                "must be between -1000 and 1000",
            ));
        }
        let (crash_loop_back_off, image_pull_back_off) = self.back_offs(&invalid)?;
        let (container_log, container_log_monitor_interval) = self.container_logs(&invalid)?;
        let (image_gc, container_gc_period) = self.garbage_collection(&invalid)?;
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
        let eviction = self.eviction_settings(&invalid)?;
        let shutdown_groups = self.shutdown_groups(&invalid)?;
        let memory_qos = self.memory_qos(&invalid)?;
        Ok(Config {
            static_pod_path: sources.static_pod_path,
            file_check_frequency: sources.file_check_frequency,
            static_pod_url: sources.static_pod_url,
            static_pod_url_header: sources.static_pod_url_header,
            http_check_frequency: sources.http_check_frequency,
            sync_frequency,
            container_runtime_endpoint: self.container_runtime_endpoint.clone(),
            runtime_socket,
            image_socket,
            runtime_request_timeout,
            cgroup_layout,
            cgroup_policy: CgroupPolicy {
                cpu_cfs_quota: self.cpu_cfs_quota,
                cpu_cfs_period_us,
                pod_pids_limit: self.pod_pids_limit,
                hugepage_sizes: Vec::new(),
                memory_qos_throttling_factor: memory_qos,
            },
            system_reserved,
            kube_reserved,
            enforce_node_allocatable_pods: self
                .enforce_node_allocatable
                .iter()
                .any(|e| e == "pods"),
            qos_reserved_memory_percent,
            healthz_address,
            read_only_address,
            node_api,
            configz: serde_json::to_value(self).unwrap_or_default(),
            pod_logs_dir: PathBuf::from(&self.pod_logs_dir),
            resolv_conf: (!self.resolv_conf.is_empty()).then(|| PathBuf::from(&self.resolv_conf)),
            cluster_dns,
            cluster_domain,
            // Widening: u32 always fits in usize on the 64-bit Linux targets nodelet runs on.
            max_pods: self.max_pods as usize,
            allowed_unsafe_sysctls: self.allowed_unsafe_sysctls.clone(),
            oom_score_adj: self.oom_score_adj,
            container_log,
            container_log_monitor_interval,
            image_gc,
            container_gc_period,
            crash_loop_back_off,
            image_pull_back_off,
            eviction,
            kernel_memcg_notification: self.kernel_memcg_notification,
            shutdown_groups,
        })
    }

    /// The static pod directory and URL, and how often each is read.
    fn pod_sources(
        &self,
        invalid: &impl Fn(&'static str, &str, &str) -> ConfigError,
    ) -> Result<PodSources, ConfigError> {
        let static_pod_path = match self.static_pod_path.as_str() {
            "" => None,
            p if p.starts_with('/') => Some(PathBuf::from(p)),
            p => return Err(invalid("staticPodPath", p, "must be an absolute path")),
        };
        let file_check_frequency = at_least(
            invalid,
            "fileCheckFrequency",
            self.file_check_frequency,
            Duration::from_millis(100),
        )?;
        let http_check_frequency = at_least(
            invalid,
            "httpCheckFrequency",
            self.http_check_frequency,
            Duration::from_millis(100),
        )?;
        let static_pod_url = match self.static_pod_url.as_str() {
            "" => None,
            u if u.starts_with("http://") || u.starts_with("https://") => {
                reqwest::Url::parse(u).map_err(|e| invalid("staticPodURL", u, &e.to_string()))?;
                Some(u.to_owned())
            }
            u => {
                return Err(invalid(
                    "staticPodURL",
                    u,
                    "must be an http:// or https:// URL",
                ))
            }
        };
        let mut static_pod_url_header = Vec::new();
        for (name, values) in &self.static_pod_url_header {
            if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(invalid("staticPodURLHeader", name, "not a header name"));
            }
            for v in values {
                if reqwest::header::HeaderValue::from_str(v).is_err() {
                    return Err(invalid(
                        "staticPodURLHeader",
                        name,
                        "a value of this header is not a header value",
                    ));
                }
                static_pod_url_header.push((name.clone(), v.clone()));
            }
        }
        Ok(PodSources {
            static_pod_path,
            file_check_frequency,
            static_pod_url,
            static_pod_url_header,
            http_check_frequency,
        })
    }

    /// The runtime's and the image service's sockets.
    fn runtime_endpoints(
        &self,
        invalid: &impl Fn(&'static str, &str, &str) -> ConfigError,
    ) -> Result<(PathBuf, PathBuf), ConfigError> {
        let runtime_socket = socket_path(&self.container_runtime_endpoint).ok_or_else(|| {
            invalid(
                "containerRuntimeEndpoint",
                &self.container_runtime_endpoint,
                "must be unix:///path/to/socket",
            )
        })?;
        let image_socket = if self.image_service_endpoint.is_empty() {
            runtime_socket.clone()
        } else {
            socket_path(&self.image_service_endpoint).ok_or_else(|| {
                invalid(
                    "imageServiceEndpoint",
                    &self.image_service_endpoint,
                    "must be unix:///path/to/socket",
                )
            })?
        };
        Ok((runtime_socket, image_socket))
    }

    /// `cgroupRoot`, `cgroupsPerQOS` and `cgroupDriver`.
    fn cgroup_layout(
        &self,
        invalid: &impl Fn(&'static str, &str, &str) -> ConfigError,
    ) -> Result<CgroupLayout, ConfigError> {
        // kubelet: an empty cgroupRoot is the root.
        let cgroup_root = if self.cgroup_root.is_empty() {
            "/".to_owned()
        } else {
            self.cgroup_root.clone()
        };
        if !cgroup_root.starts_with('/') || cgroup_root.split('/').any(|c| c == "..") {
            return Err(invalid(
                "cgroupRoot",
                &self.cgroup_root,
                "must be an absolute cgroup path without '..'",
            ));
        }
        let systemd = match self.cgroup_driver.as_str() {
            "cgroupfs" => false,
            "systemd" => true,
            other => {
                return Err(invalid(
                    "cgroupDriver",
                    other,
                    "must be cgroupfs or systemd",
                ))
            }
        };
        Ok(CgroupLayout {
            root: cgroup_root,
            per_qos: self.cgroups_per_qos,
            systemd,
        })
    }

    /// The healthz and read-only listeners (`None`: port 0, off).
    fn addresses(
        &self,
        invalid: &impl Fn(&'static str, &str, &str) -> ConfigError,
    ) -> Result<(Option<SocketAddr>, Option<SocketAddr>), ConfigError> {
        let healthz_ip: IpAddr = self.healthz_bind_address.parse().map_err(|_| {
            invalid(
                "healthzBindAddress",
                &self.healthz_bind_address,
                "must be an IP address",
            )
        })?;
        let address_ip: IpAddr = self
            .address
            .parse()
            .map_err(|_| invalid("address", &self.address, "must be an IP address"))?;
        Ok((
            (self.healthz_port != 0).then(|| SocketAddr::new(healthz_ip, self.healthz_port)),
            (self.read_only_port != 0).then(|| SocketAddr::new(address_ip, self.read_only_port)),
        ))
    }

    /// The node API's settings; `None` when `port` is 0.
    fn node_api(
        &self,
        invalid: &impl Fn(&'static str, &str, &str) -> ConfigError,
    ) -> Result<Option<NodeApiConfig>, ConfigError> {
        if self.port == 0 {
            return Ok(None);
        }
        let ip: IpAddr = self
            .address
            .parse()
            .map_err(|_| invalid("address", &self.address, "must be an IP address"))?;
        let cert_and_key = match (
            self.tls_cert_file.is_empty(),
            self.tls_private_key_file.is_empty(),
        ) {
            (true, true) => None,
            (false, false) => Some((
                PathBuf::from(&self.tls_cert_file),
                PathBuf::from(&self.tls_private_key_file),
            )),
            _ => {
                return Err(invalid(
                    "tlsCertFile + tlsPrivateKeyFile",
                    &format!("{:?} + {:?}", self.tls_cert_file, self.tls_private_key_file),
                    "set both (the certificate and its key) or neither (a self-signed pair)",
                ))
            }
        };
        crate::nodeapi::tls::versions(&self.tls_min_version)
            .map_err(|r| invalid("tlsMinVersion", &self.tls_min_version, &r))?;
        crate::nodeapi::tls::provider(&self.tls_cipher_suites)
            .map_err(|r| invalid("tlsCipherSuites", &self.tls_cipher_suites.join(","), &r))?;
        let authn = &self.authentication;
        let authz = &self.authorization;
        let authorization = match authz.mode.as_str() {
            "AlwaysAllow" => AuthorizationMode::AlwaysAllow,
            "Webhook" => AuthorizationMode::Webhook {
                allowed_ttl: authz.webhook.cache_authorized_ttl.0,
                denied_ttl: authz.webhook.cache_unauthorized_ttl.0,
            },
            other => {
                return Err(invalid(
                    "authorization.mode",
                    other,
                    "must be Webhook or AlwaysAllow",
                ))
            }
        };
        Ok(Some(NodeApiConfig {
            address: SocketAddr::new(ip, self.port),
            tls: crate::nodeapi::tls::TlsSettings {
                cert_and_key,
                min_version: self.tls_min_version.clone(),
                cipher_suites: self.tls_cipher_suites.clone(),
            },
            client_ca_file: (!authn.x509.client_ca_file.is_empty())
                .then(|| PathBuf::from(&authn.x509.client_ca_file)),
            anonymous: authn.anonymous.enabled,
            token_webhook_ttl: authn.webhook.enabled.then_some(authn.webhook.cache_ttl.0),
            authorization,
            debugging: self.enable_debugging_handlers,
        }))
    }

    /// `clusterDNS` and `clusterDomain` (without its trailing dot).
    fn dns(
        &self,
        invalid: &impl Fn(&'static str, &str, &str) -> ConfigError,
    ) -> Result<(Vec<IpAddr>, String), ConfigError> {
        let cluster_dns = self
            .cluster_dns
            .iter()
            .map(|ip| {
                ip.parse::<IpAddr>()
                    .map_err(|_| invalid("clusterDNS", ip, "entries must be IP addresses"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let cluster_domain = self.cluster_domain.trim_end_matches('.');
        if !cluster_domain.is_empty() && !crate::pod::is_dns1123_subdomain(cluster_domain) {
            return Err(invalid(
                "clusterDomain",
                &self.cluster_domain,
                "must be a DNS-1123 subdomain such as cluster.local",
            ));
        }
        Ok((cluster_dns, cluster_domain.to_owned()))
    }

    /// `systemReserved`, `kubeReserved` (their sums checked), `enforceNodeAllocatable` and `qosReserved`'s memory percentage.
    fn node_allocatable(
        &self,
        invalid: &impl Fn(&'static str, &str, &str) -> ConfigError,
    ) -> Result<(NodeResources, NodeResources, Option<i64>), ConfigError> {
        let given = |m: &BTreeMap<String, String>, k: &str| m.get(k).cloned().unwrap_or_default();
        let kube_reserved = reservation("kubeReserved", &self.kube_reserved, invalid)?;
        let system_reserved = reservation("systemReserved", &self.system_reserved, invalid)?;
        for (i, (key, unit)) in SUMMED.iter().enumerate() {
            let amounts = |r: NodeResources| [r.cpu_milli, r.memory, r.pids][i];
            if amounts(system_reserved)
                .checked_add(amounts(kube_reserved))
                .is_none()
            {
                return Err(invalid(
                    "systemReserved + kubeReserved",
                    &format!(
                        "{key}={} + {key}={}",
                        given(&self.system_reserved, key),
                        given(&self.kube_reserved, key)
                    ),
                    &format!(
                        "the sum is more than {} {unit}, the largest signed 64-bit integer",
                        i64::MAX
                    ),
                ));
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
            if v == "none" && self.enforce_node_allocatable.len() > 1 {
                return Err(invalid(
                    "enforceNodeAllocatable",
                    &self.enforce_node_allocatable.join(","),
                    "may not contain additional enforcements when none is specified",
                ));
            }
        }
        // kubelet's ValidateKubeletConfiguration: enforcement needs the pod cgroups.
        if !self.cgroups_per_qos && !self.enforce_node_allocatable.is_empty() {
            return Err(invalid(
                "enforceNodeAllocatable",
                &format!(
                    "[{}] with cgroupsPerQOS false",
                    self.enforce_node_allocatable.join(",")
                ),
                "enforceNodeAllocatable is not supported unless cgroupsPerQOS is true; set enforceNodeAllocatable: [] (its default is [pods])",
            ));
        }
        let mut qos_reserved_memory_percent = None;
        for (k, v) in &self.qos_reserved {
            match (k.as_str(), parse_percent(v)) {
                ("memory", Some(p)) => qos_reserved_memory_percent = Some(p),
                _ => {
                    return Err(invalid(
                        "qosReserved",
                        &format!("{k}={v}"),
                        "only memory, as a percentage 0%..100%",
                    ))
                }
            }
        }
        Ok((system_reserved, kube_reserved, qos_reserved_memory_percent))
    }

    /// `crashLoopBackOff` and `imagePullBackOff`.
    fn back_offs(
        &self,
        invalid: &impl Fn(&'static str, &str, &str) -> ConfigError,
    ) -> Result<(BackoffPolicy, BackoffPolicy), ConfigError> {
        let backoff = |field: &'static str, initial: GoDuration, max: GoDuration| {
            let reason = "the initial period must be at least 100ms and at most the max period";
            let value = format!(
                "{}..{}",
                format_go_duration(initial.0),
                format_go_duration(max.0)
            );
            if initial.0 < Duration::from_millis(100) {
                return Err(invalid(field, &value, reason));
            }
            BackoffPolicy::try_new(initial.0, max.0).map_err(|_| invalid(field, &value, reason))
        };
        // kubelet (KEP-4603): maxContainerRestartPeriod is 1s to 300s, and one below the first
        // delay lowers the first delay to it.
        let crash = &self.crash_loop_back_off;
        let max = crash.max_container_restart_period.0;
        if !(Duration::from_secs(1)..=Duration::from_secs(300)).contains(&max) {
            return Err(invalid(
                "crashLoopBackOff.maxContainerRestartPeriod",
                &format_go_duration(max),
                "must be between 1s and 300s",
            ));
        }
        let crash_loop_back_off = backoff(
            "crashLoopBackOff",
            GoDuration(crash.initial_container_restart_period.0.min(max)),
            crash.max_container_restart_period,
        )?;
        let image_pull_back_off = backoff(
            "imagePullBackOff",
            self.image_pull_back_off.initial_period,
            self.image_pull_back_off.max_period,
        )?;
        Ok((crash_loop_back_off, image_pull_back_off))
    }

    /// Container log rotation: `containerLogMaxSize`, `containerLogMaxFiles`, `containerLogMonitorInterval`.
    fn container_logs(
        &self,
        invalid: &impl Fn(&'static str, &str, &str) -> ConfigError,
    ) -> Result<(LogPolicy, Duration), ConfigError> {
        let log_max_size = parse_amount(&self.container_log_max_size, Scale::Whole)
            .ok()
            .filter(|v| *v > 0)
            .ok_or_else(|| {
                invalid(
                    "containerLogMaxSize",
                    &self.container_log_max_size,
                    "must be a positive quantity such as 10Mi",
                )
            })?;
        if self.container_log_max_files < 2 {
            return Err(invalid(
                "containerLogMaxFiles",
                &self.container_log_max_files.to_string(),
                "must be at least 2",
            ));
        }
        let container_log_monitor_interval = at_least(
            invalid,
            "containerLogMonitorInterval",
            self.container_log_monitor_interval,
            Duration::from_millis(100),
        )?;
        Ok((
            LogPolicy {
                max_size: log_max_size.unsigned_abs(),
                max_files: self.container_log_max_files as usize,
            },
            container_log_monitor_interval,
        ))
    }

    /// Image and container garbage collection (kubelet's validation of the image GC fields).
    fn garbage_collection(
        &self,
        invalid: &impl Fn(&'static str, &str, &str) -> ConfigError,
    ) -> Result<(crate::gc::images::ImageGcPolicy, Duration), ConfigError> {
        let percent = |field: &'static str, v: i32| {
            u8::try_from(v)
                .ok()
                .filter(|v| *v <= 100)
                .ok_or_else(|| invalid(field, &v.to_string(), "must be between 0 and 100"))
        };
        let high = percent(
            "imageGCHighThresholdPercent",
            self.image_gc_high_threshold_percent,
        )?;
        let low = percent(
            "imageGCLowThresholdPercent",
            self.image_gc_low_threshold_percent,
        )?;
        if high != 100 && low >= high {
            return Err(invalid(
                "imageGCLowThresholdPercent",
                &low.to_string(),
                &format!("must be less than imageGCHighThresholdPercent ({high})"),
            ));
        }
        let (min_age, max_age) = (self.image_minimum_gc_age.0, self.image_maximum_gc_age.0);
        if !max_age.is_zero() && max_age <= min_age {
            return Err(invalid(
                "imageMaximumGCAge",
                &format_go_duration(max_age),
                &format!(
                    "must be 0 (off) or greater than imageMinimumGCAge ({})",
                    format_go_duration(min_age)
                ),
            ));
        }
        let period = at_least(
            invalid,
            "imageGCPeriod",
            self.image_gc_period,
            Duration::from_secs(1),
        )?;
        let container_period = at_least(
            invalid,
            "containerGCPeriod",
            self.container_gc_period,
            Duration::from_secs(1),
        )?;
        Ok((
            crate::gc::images::ImageGcPolicy {
                high_threshold_percent: high,
                low_threshold_percent: low,
                min_age,
                max_age,
                period,
            },
            container_period,
        ))
    }

    /// The eviction manager's thresholds and periods.
    fn eviction_settings(
        &self,
        invalid: &impl Fn(&'static str, &str, &str) -> ConfigError,
    ) -> Result<EvictionSettings, ConfigError> {
        let thresholds = crate::eviction::threshold::parse_thresholds(
            &self.eviction_hard,
            &self.eviction_soft,
            &self.eviction_soft_grace_period,
            &self.eviction_minimum_reclaim,
        )
        .map_err(|e| invalid(e.field, &format!("{}={}", e.signal, e.value), &e.reason))?;
        let monitoring_period = at_least(
            invalid,
            "evictionMonitoringPeriod",
            self.eviction_monitoring_period,
            Duration::from_millis(100),
        )?;
        Ok(EvictionSettings {
            thresholds,
            transition: self.eviction_pressure_transition_period.0,
            monitoring_period,
            max_pod_grace_seconds: i64::from(self.eviction_max_pod_grace_period),
            static_pods_are_critical: self.static_pods_are_critical,
        })
    }

    /// `featureGates.MemoryQoS` with `memoryThrottlingFactor`: the factor when on.
    fn memory_qos(
        &self,
        invalid: &impl Fn(&'static str, &str, &str) -> ConfigError,
    ) -> Result<Option<f64>, ConfigError> {
        let f = self.memory_throttling_factor;
        if !(f > 0.0 && f <= 1.0) {
            return Err(invalid(
                "memoryThrottlingFactor",
                &f.to_string(),
                "must be greater than 0 and at most 1.0",
            ));
        }
        let memory_qos = self
            .feature_gates
            .get("MemoryQoS")
            .copied()
            .unwrap_or(false)
            .then_some(f);
        Ok(memory_qos)
    }

    /// Graceful node shutdown's groups, with kubelet's checks of the three fields.
    ///
    /// Errors: [`ConfigError::Invalid`] naming the field: a period between 0 and 1s, a
    /// critical share above the whole, both the list and the plain fields, or a negative
    /// period in the list.
    fn shutdown_groups(
        &self,
        invalid: &impl Fn(&'static str, &str, &str) -> ConfigError,
    ) -> Result<Vec<crate::nodeshutdown::PriorityGroup>, ConfigError> {
        let (total, critical) = (
            self.shutdown_grace_period.0,
            self.shutdown_grace_period_critical_pods.0,
        );
        let show = |d: Duration| crate::duration::format_go_duration(d);
        for (field, d) in [
            ("shutdownGracePeriod", total),
            ("shutdownGracePeriodCriticalPods", critical),
        ] {
            if !d.is_zero() && d < Duration::from_secs(1) {
                return Err(invalid(
                    field,
                    &show(d),
                    "must be either zero or otherwise >= 1 sec",
                ));
            }
        }
        if critical > total {
            return Err(invalid(
                "shutdownGracePeriodCriticalPods",
                &show(critical),
                &format!("must be <= shutdownGracePeriod {}", show(total)),
            ));
        }
        let list = &self.shutdown_grace_period_by_pod_priority;
        if !list.is_empty() && (!total.is_zero() || !critical.is_zero()) {
            return Err(invalid(
                "shutdownGracePeriodByPodPriority",
                &format!("{} groups", list.len()),
                "cannot be given with shutdownGracePeriod or shutdownGracePeriodCriticalPods (kubelet: Cannot specify both at the same time)",
            ));
        }
        let max = crate::duration::MAX_DURATION.as_secs() as i64;
        if let Some(g) = list
            .iter()
            .find(|g| g.grace_seconds < 0 || g.grace_seconds > max)
        {
            return Err(invalid(
                "shutdownGracePeriodByPodPriority",
                &format!("priority {}: {}", g.priority, g.grace_seconds),
                "shutdownGracePeriodSeconds must be between 0 and 31536000 (8760h)",
            ));
        }
        Ok(crate::nodeshutdown::priority_groups(total, critical, list))
    }
}

/// cpu (millicores), memory (bytes) and pids of a reservation map (`kubeReserved`,
/// `systemReserved`). `ephemeral-storage` is accepted and checked, but nodelet enforces no
/// ephemeral-storage allocatable.
///
/// Errors: [`ConfigError::Invalid`] for an unknown key, or a value that is not a non-negative
/// quantity fitting in an `i64` of its unit.
fn reservation(
    field: &'static str,
    map: &BTreeMap<String, String>,
    invalid: &impl Fn(&'static str, &str, &str) -> ConfigError,
) -> Result<NodeResources, ConfigError> {
    let mut r = NodeResources::default();
    for (k, v) in map {
        let scale = match k.as_str() {
            "cpu" => Scale::Milli,
            "memory" | "pid" | "ephemeral-storage" => Scale::Whole,
            _ => {
                return Err(invalid(
                    field,
                    &format!("{k}={v}"),
                    "keys cpu, memory, pid, ephemeral-storage with non-negative quantities",
                ))
            }
        };
        let amount = parse_amount(v, scale)
            .map_err(|e| invalid(field, &format!("{k}={v}"), &e.to_string()))?;
        match k.as_str() {
            "cpu" => r.cpu_milli = amount,
            "memory" => r.memory = amount,
            "pid" => r.pids = amount,
            _ => {}
        }
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eviction::threshold::ThresholdValue;

    const HEAD: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

    fn config(lines: &str) -> Result<Config, ConfigError> {
        KubeletConfiguration::parse(Path::new("test.yaml"), &format!("{HEAD}{lines}"))
            .map(|l| l.config)
    }

    #[test]
    fn defaults_become_typed_values() {
        let c = config("").unwrap();
        assert_eq!(c.image_gc, crate::gc::images::ImageGcPolicy::KUBELET);
        assert_eq!(c.container_gc_period, Duration::from_secs(60));
        assert_eq!(c.static_pod_path, None);
        assert_eq!(c.runtime_request_timeout, Duration::from_secs(120));
        assert_eq!(c.image_socket, c.runtime_socket);
        assert_eq!(
            (
                c.cgroup_layout.root.as_str(),
                c.cgroup_layout.per_qos,
                c.cgroup_layout.systemd
            ),
            ("/", true, false)
        );
        assert_eq!(c.cgroup_policy, CgroupPolicy::default());
        assert_eq!(c.system_reserved, NodeResources::default());
        assert!(c.enforce_node_allocatable_pods);
        assert_eq!(c.qos_reserved_memory_percent, None);
        assert_eq!(c.healthz_address, Some("127.0.0.1:10248".parse().unwrap()));
        assert_eq!(c.read_only_address, None);
        assert_eq!(c.resolv_conf, Some(PathBuf::from("/etc/resolv.conf")));
        assert_eq!(c.max_pods, 110);
        assert_eq!(c.oom_score_adj, -999);
        assert_eq!(
            (c.container_log.max_size, c.container_log.max_files),
            (10 << 20, 5)
        );
        assert_eq!(c.container_log_monitor_interval, Duration::from_secs(10));
        assert_eq!(c.crash_loop_back_off, BackoffPolicy::KUBELET);
        assert_eq!(c.image_pull_back_off, BackoffPolicy::KUBELET);
        assert_eq!(c.eviction.monitoring_period, Duration::from_secs(10));
        assert_eq!(c.eviction.max_pod_grace_seconds, 0);
        assert!(c.kernel_memcg_notification);
    }

    #[test]
    fn given_values_become_typed_values() {
        let c = config(
            "staticPodPath: /etc/m\n\
             imageServiceEndpoint: /run/img.sock\n\
             cgroupRoot: /n\ncgroupDriver: systemd\ncgroupsPerQOS: false\n\
             cpuCFSQuota: false\ncpuCFSQuotaPeriod: 50ms\npodPidsLimit: 512\n\
             kubeReserved: {cpu: 500m, memory: 1Gi, pid: '100', ephemeral-storage: 1Gi}\n\
             systemReserved: {cpu: '1', memory: 7Ei}\n\
             enforceNodeAllocatable: []\nqosReserved: {memory: 50%}\n\
             healthzBindAddress: '::1'\nhealthzPort: 0\naddress: 10.0.0.1\nreadOnlyPort: 10255\n\
             resolvConf: ''\nclusterDNS: [10.96.0.10]\nclusterDomain: cluster.local.\n\
             containerLogMaxSize: 1.5Ki\ncontainerLogMaxFiles: 2\n\
             crashLoopBackOff: {initialContainerRestartPeriod: 1s, maxContainerRestartPeriod: 1m}\n\
             evictionHard: {memory.available: 1Gi}\n\
             evictionMinimumReclaim: {memory.available: 7Ei}\n\
             evictionMaxPodGracePeriod: 30\n",
        )
        .unwrap();
        assert_eq!(c.static_pod_path, Some(PathBuf::from("/etc/m")));
        assert_eq!(c.image_socket, PathBuf::from("/run/img.sock"));
        assert_eq!(
            (
                c.cgroup_layout.root.as_str(),
                c.cgroup_layout.per_qos,
                c.cgroup_layout.systemd
            ),
            ("/n", false, true)
        );
        assert_eq!(
            c.cgroup_policy,
            CgroupPolicy {
                cpu_cfs_quota: false,
                cpu_cfs_period_us: 50_000,
                pod_pids_limit: 512,
                hugepage_sizes: Vec::new(),
                memory_qos_throttling_factor: None,
            }
        );
        assert_eq!(
            c.kube_reserved,
            NodeResources {
                cpu_milli: 500,
                memory: 1 << 30,
                pids: 100
            }
        );
        assert_eq!(
            c.system_reserved,
            NodeResources {
                cpu_milli: 1000,
                memory: 7 << 60,
                pids: 0
            }
        );
        assert!(!c.enforce_node_allocatable_pods);
        assert_eq!(c.qos_reserved_memory_percent, Some(50));
        assert_eq!(c.healthz_address, None);
        assert_eq!(c.read_only_address, Some("10.0.0.1:10255".parse().unwrap()));
        assert_eq!(c.resolv_conf, None);
        assert_eq!(c.cluster_dns, vec!["10.96.0.10".parse::<IpAddr>().unwrap()]);
        assert_eq!(c.cluster_domain, "cluster.local");
        assert_eq!(
            (c.container_log.max_size, c.container_log.max_files),
            (1536, 2)
        );
        assert_eq!(
            (c.crash_loop_back_off.initial(), c.crash_loop_back_off.max()),
            (Duration::from_secs(1), Duration::from_secs(60))
        );
        let t = &c.eviction.thresholds;
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].value, ThresholdValue::Quantity(1 << 30));
        assert_eq!(t[0].min_reclaim, Some(ThresholdValue::Quantity(7 << 60)));
        assert_eq!(c.eviction.max_pod_grace_seconds, 30);
        let node = c.node_config(NodeResources {
            cpu_milli: 4000,
            memory: 8 << 30,
            pids: 0,
        });
        assert_eq!(node.kube_reserved, c.kube_reserved);
        assert_eq!(node.capacity.cpu_milli, 4000);
        assert_eq!(node.qos_reserved_memory, Some(50));
    }

    /// kubelet's rules: an empty cgroupRoot is `/`; `none` enforces nothing; a
    /// maxContainerRestartPeriod below the first delay lowers the first delay.
    #[test]
    fn kubelet_spellings_of_the_root_no_enforcement_and_a_short_back_off_cap() {
        let c = config("cgroupRoot: ''\nenforceNodeAllocatable: [none]\ncrashLoopBackOff: {maxContainerRestartPeriod: 5s}\n").unwrap();
        assert_eq!(c.cgroup_layout.root, "/");
        assert!(!c.enforce_node_allocatable_pods);
        assert_eq!(
            (c.crash_loop_back_off.initial(), c.crash_loop_back_off.max()),
            (Duration::from_secs(5), Duration::from_secs(5))
        );
        let c = config("cgroupsPerQOS: false\nenforceNodeAllocatable: []\n").unwrap();
        assert!(!c.cgroup_layout.per_qos);
    }

    #[test]
    fn out_of_range_values_and_sums_are_refused_naming_the_fields() {
        for (lines, field, value, reason) in [
            (
                "kubeReserved: {cpu: '1e16'}",
                "kubeReserved",
                "cpu=1e16",
                "at most 9223372036854775807m",
            ),
            (
                "systemReserved: {cpu: 9223372036854775808m}",
                "systemReserved",
                "cpu=9223372036854775808m",
                "at most 9223372036854775807m",
            ),
            (
                "systemReserved: {memory: 8Ei}",
                "systemReserved",
                "memory=8Ei",
                "too large",
            ),
            (
                "kubeReserved: {cpu: '-1'}",
                "kubeReserved",
                "cpu=-1",
                "must not be negative",
            ),
            (
                "systemReserved: {memory: 7Ei}\nkubeReserved: {memory: 7Ei}",
                "systemReserved + kubeReserved",
                "memory=7Ei + memory=7Ei",
                "more than 9223372036854775807 bytes",
            ),
            (
                "systemReserved: {cpu: 9000000000000000}\nkubeReserved: {cpu: 500000000000000}",
                "systemReserved + kubeReserved",
                "cpu=9000000000000000 + cpu=500000000000000",
                "millicores",
            ),
            (
                "systemReserved: {pid: 9223372036854775807}\nkubeReserved: {pid: '1'}",
                "systemReserved + kubeReserved",
                "pid=9223372036854775807 + pid=1",
                "pids",
            ),
            (
                "evictionHard: {memory.available: 7Ei}\n\
                 evictionMinimumReclaim: {memory.available: 7Ei}",
                "evictionMinimumReclaim",
                "memory.available=7Ei",
                "more than 9223372036854775807",
            ),
            (
                "containerLogMaxSize: 8Ei",
                "containerLogMaxSize",
                "8Ei",
                "positive quantity",
            ),
            (
                "imagePullBackOff: {initialPeriod: 1s, maxPeriod: 500ms}",
                "imagePullBackOff",
                "1s..500ms",
                "at most the max period",
            ),
            (
                "imagePullBackOff: {initialPeriod: 10ms}",
                "imagePullBackOff",
                "10ms..5m0s",
                "at least 100ms",
            ),
            ("address: any", "address", "any", "IP address"),
            (
                "imageGCHighThresholdPercent: 101",
                "imageGCHighThresholdPercent",
                "101",
                "between 0 and 100",
            ),
            (
                "imageGCLowThresholdPercent: -1",
                "imageGCLowThresholdPercent",
                "-1",
                "between 0 and 100",
            ),
            (
                "imageGCHighThresholdPercent: 70",
                "imageGCLowThresholdPercent",
                "80",
                "less than imageGCHighThresholdPercent (70)",
            ),
            (
                "imageMaximumGCAge: 1m",
                "imageMaximumGCAge",
                "1m0s",
                "greater than imageMinimumGCAge (2m0s)",
            ),
            (
                "containerGCPeriod: 10ms",
                "containerGCPeriod",
                "10ms",
                "at least 1s",
            ),
            (
                "imageServiceEndpoint: img.sock",
                "imageServiceEndpoint",
                "img.sock",
                "unix://",
            ),
            (
                "cpuCFSQuotaPeriod: 2s",
                "cpuCFSQuotaPeriod",
                "2s",
                "1ms and 1s",
            ),
            ("maxPods: 0", "maxPods", "0", "at least 1"),
            (
                "port: 10255\nreadOnlyPort: 10255",
                "port",
                "10255",
                "also readOnlyPort",
            ),
            (
                "port: 10248\nhealthzPort: 10248",
                "port",
                "10248",
                "also healthzPort",
            ),
            (
                "readOnlyPort: 10248\nhealthzPort: 10248",
                "readOnlyPort",
                "10248",
                "also healthzPort",
            ),
        ] {
            let e = config(&format!("{lines}\n")).unwrap_err();
            let ConfigError::Invalid {
                field: f, value: v, ..
            } = &e
            else {
                panic!("{lines}: expected Invalid, got {e:?}");
            };
            assert_eq!((*f, v.as_str()), (field, value), "{lines}");
            assert!(e.to_string().contains(reason), "{lines}: {e}");
        }
    }

    #[test]
    fn reservations_summing_to_the_bound_are_accepted() {
        // 4Ei + (4Ei - 1) bytes and (2^62 - 1) + 2^62 millicores: i64::MAX each.
        let c = config(
            "systemReserved: {memory: 4Ei, cpu: 4611686018427387903m}\n\
             kubeReserved: {memory: '4611686018427387903', cpu: 4611686018427387904m}\n",
        )
        .unwrap();
        assert_eq!(
            c.system_reserved.memory.checked_add(c.kube_reserved.memory),
            Some(i64::MAX)
        );
        assert_eq!(
            c.system_reserved
                .cpu_milli
                .checked_add(c.kube_reserved.cpu_milli),
            Some(i64::MAX)
        );
    }
}
