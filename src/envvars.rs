//! Service environment variables (kubelet's `pkg/kubelet/envvars` and `getServiceEnvVarMap`):
//! the `<NAME>_SERVICE_HOST`, `<NAME>_SERVICE_PORT` and Docker-link variables a container gets
//! for the Services of the cluster it runs in.
//!
//! A pod gets them for the master service (`kubernetes` in `default`, the one in-cluster
//! clients find the API server by, `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT`)
//! always, and for every Service of its own namespace when `spec.enableServiceLinks` is true
//! (the default). A Service without a cluster IP (headless, `None`) gives none. Only a node
//! joined to a cluster knows Services ([`crate::cluster::services`] keeps them in
//! [`Services`]); a standalone node gives none, as kubelet without an API server.
//!
//! The container's own `env` and `envFrom` come first and win over a service variable of the
//! same name; `$(VAR)` in a value may name a service variable; the remaining service variables
//! follow, by name ([`crate::kuberuntime::container::make_env`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Service;

/// The namespace of the master services (kubelet's `masterServiceNamespace`, default `default`).
pub const MASTER_SERVICE_NAMESPACE: &str = "default";

/// The services whose variables every pod gets (kubelet's `masterServices`).
pub const MASTER_SERVICES: &[&str] = &["kubernetes"];

/// kubelet's message while the Services have not been listed once (an API pod's container is
/// not created then: `CreateContainerConfigError`, retried at the next sync).
pub const NOT_SYNCED: &str =
    "services have not yet been read at least once, cannot construct envvars";

/// One port of a Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    /// `name`, empty when unnamed.
    pub name: String,
    /// `port`.
    pub port: i32,
    /// `protocol` as written (`TCP` when absent).
    pub protocol: String,
}

/// What the variables of a Service are made of: its cluster IP and ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceInfo {
    /// `spec.clusterIP`.
    pub cluster_ip: String,
    /// `spec.ports`, in order.
    pub ports: Vec<ServicePort>,
}

/// `svc`'s [`ServiceInfo`], `None` when it has no cluster IP (empty or `None`, kubelet's
/// `IsServiceIPSet`) or no port.
pub fn info(svc: &Service) -> Option<ServiceInfo> {
    let spec = svc.spec.as_ref()?;
    let ip = spec.cluster_ip.as_deref().unwrap_or_default();
    if ip.is_empty() || ip == "None" {
        return None;
    }
    let ports: Vec<ServicePort> = spec
        .ports
        .iter()
        .flatten()
        .map(|p| ServicePort {
            name: p.name.clone().unwrap_or_default(),
            port: p.port,
            protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
        })
        .collect();
    (!ports.is_empty()).then(|| ServiceInfo {
        cluster_ip: ip.to_owned(),
        ports,
    })
}

/// `name` as the stem of a variable name: upper case, `-` as `_` (kubelet's
/// `makeEnvVariableName`).
fn stem(name: &str) -> String {
    name.replace('-', "_").to_uppercase()
}

/// `host:port`, the host in brackets when it is an IPv6 address (Go's `net.JoinHostPort`).
fn host_port(ip: &str, port: i32) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

/// The variables of the Service named `name` (kubelet's `FromServices` for one Service), in
/// kubelet's order: `<N>_SERVICE_HOST`, `<N>_SERVICE_PORT` (the first port), `<N>_SERVICE_PORT_<P>`
/// for each named port, then the Docker-link ones: `<N>_PORT` (the first port as
/// `tcp://ip:port`) and, for each port, `<N>_PORT_<port>_<PROTO>` with its `_PROTO`, `_PORT` and
/// `_ADDR`.
pub fn service_vars(name: &str, svc: &ServiceInfo) -> Vec<(String, String)> {
    let n = stem(name);
    let mut out = Vec::new();
    let Some(first) = svc.ports.first() else {
        return out;
    };
    out.push((format!("{n}_SERVICE_HOST"), svc.cluster_ip.clone()));
    out.push((format!("{n}_SERVICE_PORT"), first.port.to_string()));
    for p in svc.ports.iter().filter(|p| !p.name.is_empty()) {
        out.push((
            format!("{n}_SERVICE_PORT_{}", stem(&p.name)),
            p.port.to_string(),
        ));
    }
    for (i, p) in svc.ports.iter().enumerate() {
        let proto = p.protocol.to_lowercase();
        let url = format!("{proto}://{}", host_port(&svc.cluster_ip, p.port));
        if i == 0 {
            out.push((format!("{n}_PORT"), url.clone()));
        }
        let prefix = format!("{n}_PORT_{}_{}", p.port, p.protocol.to_uppercase());
        out.push((prefix.clone(), url));
        out.push((format!("{prefix}_PROTO"), proto));
        out.push((format!("{prefix}_PORT"), p.port.to_string()));
        out.push((format!("{prefix}_ADDR"), svc.cluster_ip.clone()));
    }
    out
}

#[derive(Default)]
struct State {
    /// A watch of the cluster's Services was started (the node is joined to a cluster).
    watched: bool,
    /// The watch has listed every Service once.
    synced: bool,
    /// By namespace, then name.
    by_namespace: HashMap<String, BTreeMap<String, ServiceInfo>>,
}

/// The cluster's Services with a cluster IP, as far as they matter to environment variables
/// (kubelet's service lister). Written by [`crate::cluster::services`] alone; read by the pod
/// workers as they make a container's config. Cheap to clone.
#[derive(Clone, Default)]
pub struct Services(Arc<RwLock<State>>);

impl Services {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.0.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.0.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the store as fed by a watch of the cluster's Services (cluster mode).
    pub fn set_watched(&self) {
        self.write().watched = true;
    }

    /// Whether a watch feeds the store: without one (a standalone node) no pod gets service
    /// variables.
    pub fn is_watched(&self) -> bool {
        self.read().watched
    }

    /// Whether the watch has listed every Service at least once.
    pub fn is_synced(&self) -> bool {
        self.read().synced
    }

    /// The Services as a full listing found them (`(namespace, name)` → info); marks the
    /// store synced.
    pub fn replace(&self, all: impl IntoIterator<Item = ((String, String), ServiceInfo)>) {
        let mut by_namespace: HashMap<String, BTreeMap<String, ServiceInfo>> = HashMap::new();
        for ((ns, name), svc) in all {
            by_namespace.entry(ns).or_default().insert(name, svc);
        }
        let mut s = self.write();
        s.by_namespace = by_namespace;
        s.synced = true;
    }

    /// One Service changed: its info, or `None` when it is gone or has no cluster IP now.
    pub fn set(&self, namespace: &str, name: &str, svc: Option<ServiceInfo>) {
        let mut s = self.write();
        match svc {
            Some(svc) => {
                s.by_namespace
                    .entry(namespace.to_owned())
                    .or_default()
                    .insert(name.to_owned(), svc);
            }
            None => {
                if let Some(m) = s.by_namespace.get_mut(namespace) {
                    m.remove(name);
                    if m.is_empty() {
                        s.by_namespace.remove(namespace);
                    }
                }
            }
        }
    }

    /// The service variables of a pod in `namespace` (kubelet's `getServiceEnvVarMap`): the
    /// master services always, the namespace's own Services when `enable_service_links`; a
    /// namespace Service wins over a master service of the same name. Sorted by variable name;
    /// empty when no watch feeds the store.
    pub fn env(&self, namespace: &str, enable_service_links: bool) -> Vec<(String, String)> {
        let s = self.read();
        let mut chosen: BTreeMap<&str, &ServiceInfo> = BTreeMap::new();
        if enable_service_links {
            if let Some(m) = s.by_namespace.get(namespace) {
                chosen.extend(m.iter().map(|(n, svc)| (n.as_str(), svc)));
            }
        }
        if let Some(m) = s.by_namespace.get(MASTER_SERVICE_NAMESPACE) {
            for name in MASTER_SERVICES {
                if let Some((n, svc)) = m.get_key_value(*name) {
                    chosen.entry(n.as_str()).or_insert(svc);
                }
            }
        }
        let vars: BTreeMap<String, String> = chosen
            .into_iter()
            .flat_map(|(n, svc)| service_vars(n, svc))
            .collect();
        vars.into_iter().collect()
    }
}

/// The service variables of `pod`'s containers: [`Services::env`] for its namespace and
/// `spec.enableServiceLinks` (absent is true, the API server's default); empty when no watch
/// feeds `services` (a standalone node).
///
/// Errors: kubelet's [`NOT_SYNCED`] for a pod from the API while the Services have not been
/// listed once (kubelet since 1.22, `makeEnvironmentVariables`: without it a pod started right
/// after the agent misses `KUBERNETES_SERVICE_HOST`); a static pod does not wait, so that a
/// node whose control plane runs in its static pods can start them.
pub fn pod_env(
    services: &Services,
    pod: &k8s_openapi::api::core::v1::Pod,
) -> Result<Vec<(String, String)>, &'static str> {
    if !services.is_watched() {
        return Ok(Vec::new());
    }
    if crate::pod::is_api_pod(pod) && !services.is_synced() {
        return Err(NOT_SYNCED);
    }
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let links = pod
        .spec
        .as_ref()
        .and_then(|s| s.enable_service_links)
        .unwrap_or(true);
    Ok(services.env(namespace, links))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(ip: &str, ports: &[(&str, i32, &str)]) -> ServiceInfo {
        ServiceInfo {
            cluster_ip: ip.into(),
            ports: ports
                .iter()
                .map(|(n, p, proto)| ServicePort {
                    name: (*n).into(),
                    port: *p,
                    protocol: (*proto).into(),
                })
                .collect(),
        }
    }

    fn get<'a>(vars: &'a [(String, String)], k: &str) -> Option<&'a str> {
        vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn a_service_gives_kubelets_variables() {
        // The kubernetes documentation's example: redis-master, TCP 6379, 10.0.0.11.
        let v = service_vars("redis-master", &svc("10.0.0.11", &[("", 6379, "TCP")]));
        let want = [
            ("REDIS_MASTER_SERVICE_HOST", "10.0.0.11"),
            ("REDIS_MASTER_SERVICE_PORT", "6379"),
            ("REDIS_MASTER_PORT", "tcp://10.0.0.11:6379"),
            ("REDIS_MASTER_PORT_6379_TCP_PROTO", "tcp"),
            ("REDIS_MASTER_PORT_6379_TCP_PORT", "6379"),
            ("REDIS_MASTER_PORT_6379_TCP_ADDR", "10.0.0.11"),
            ("REDIS_MASTER_PORT_6379_TCP", "tcp://10.0.0.11:6379"),
        ];
        assert_eq!(v.len(), want.len(), "{v:?}");
        for (k, val) in want {
            assert_eq!(get(&v, k), Some(val), "{k}");
        }
    }

    #[test]
    fn named_ports_udp_and_ipv6_follow_kubelet() {
        let v = service_vars(
            "kube-dns",
            &svc("fd00::a", &[("dns", 53, "UDP"), ("dns-tcp", 53, "TCP")]),
        );
        assert_eq!(get(&v, "KUBE_DNS_SERVICE_PORT"), Some("53"));
        assert_eq!(get(&v, "KUBE_DNS_SERVICE_PORT_DNS"), Some("53"));
        assert_eq!(get(&v, "KUBE_DNS_SERVICE_PORT_DNS_TCP"), Some("53"));
        assert_eq!(get(&v, "KUBE_DNS_PORT"), Some("udp://[fd00::a]:53"));
        assert_eq!(get(&v, "KUBE_DNS_PORT_53_UDP_PROTO"), Some("udp"));
        assert_eq!(get(&v, "KUBE_DNS_PORT_53_TCP"), Some("tcp://[fd00::a]:53"));
    }

    #[test]
    fn api_pods_wait_for_a_first_listing_static_pods_do_not() {
        let pod = |api: bool, links: &str| -> k8s_openapi::api::core::v1::Pod {
            let source = if api { "api" } else { "file" };
            serde_yaml::from_str(&format!(
                "metadata: {{name: p, namespace: app, annotations: {{kubernetes.io/config.source: {source}}}}}\nspec: {{containers: [], {links}}}\n"
            ))
            .unwrap()
        };
        let s = Services::default();
        // A standalone node: nothing, and nothing to wait for.
        assert_eq!(pod_env(&s, &pod(true, "")), Ok(Vec::new()));
        s.set_watched();
        assert_eq!(pod_env(&s, &pod(true, "")), Err(NOT_SYNCED));
        assert_eq!(pod_env(&s, &pod(false, "")), Ok(Vec::new()));
        s.replace([
            (
                ("default".into(), "kubernetes".into()),
                svc("10.96.0.1", &[("https", 443, "TCP")]),
            ),
            (
                ("app".into(), "db".into()),
                svc("10.96.0.3", &[("", 5432, "TCP")]),
            ),
        ]);
        let all = pod_env(&s, &pod(true, "")).unwrap();
        assert_eq!(get(&all, "DB_SERVICE_HOST"), Some("10.96.0.3"));
        let off = pod_env(&s, &pod(true, "enableServiceLinks: false")).unwrap();
        assert_eq!(get(&off, "DB_SERVICE_HOST"), None);
        assert_eq!(get(&off, "KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
    }

    #[test]
    fn headless_or_portless_services_give_nothing() {
        let mut s = Service::default();
        assert!(info(&s).is_none());
        s.spec = Some(k8s_openapi::api::core::v1::ServiceSpec {
            cluster_ip: Some("None".into()),
            ports: Some(vec![k8s_openapi::api::core::v1::ServicePort {
                port: 80,
                ..Default::default()
            }]),
            ..Default::default()
        });
        assert!(info(&s).is_none());
        s.spec.as_mut().unwrap().cluster_ip = Some("10.96.0.9".into());
        let i = info(&s).unwrap();
        assert_eq!(i.ports[0].protocol, "TCP");
        s.spec.as_mut().unwrap().ports = Some(Vec::new());
        assert!(info(&s).is_none());
    }

    #[test]
    fn the_master_service_always_the_namespace_only_with_links() {
        let s = Services::default();
        assert!(!s.is_synced());
        s.replace([
            (
                ("default".into(), "kubernetes".into()),
                svc("10.96.0.1", &[("https", 443, "TCP")]),
            ),
            (
                ("default".into(), "web".into()),
                svc("10.96.0.2", &[("", 80, "TCP")]),
            ),
            (
                ("app".into(), "db".into()),
                svc("10.96.0.3", &[("", 5432, "TCP")]),
            ),
        ]);
        assert!(s.is_synced());
        let app = s.env("app", true);
        assert_eq!(get(&app, "KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
        assert_eq!(get(&app, "KUBERNETES_SERVICE_PORT"), Some("443"));
        assert_eq!(get(&app, "KUBERNETES_SERVICE_PORT_HTTPS"), Some("443"));
        assert_eq!(get(&app, "DB_SERVICE_HOST"), Some("10.96.0.3"));
        assert_eq!(get(&app, "WEB_SERVICE_HOST"), None, "another namespace's");
        let names: Vec<&String> = app.iter().map(|(n, _)| n).collect();
        assert!(names.windows(2).all(|w| w[0] < w[1]), "sorted: {names:?}");
        let no_links = s.env("app", false);
        assert_eq!(get(&no_links, "DB_SERVICE_HOST"), None);
        assert_eq!(get(&no_links, "KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
        assert_eq!(
            get(&s.env("default", true), "WEB_SERVICE_HOST"),
            Some("10.96.0.2")
        );
        // A namespace's own "kubernetes" Service wins over the master one.
        s.set(
            "app",
            "kubernetes",
            Some(svc("10.96.7.7", &[("", 8443, "TCP")])),
        );
        assert_eq!(
            get(&s.env("app", true), "KUBERNETES_SERVICE_HOST"),
            Some("10.96.7.7")
        );
        assert_eq!(
            get(&s.env("app", false), "KUBERNETES_SERVICE_HOST"),
            Some("10.96.0.1")
        );
        // Gone.
        s.set("app", "db", None);
        assert_eq!(get(&s.env("app", true), "DB_SERVICE_HOST"), None);
    }
}
