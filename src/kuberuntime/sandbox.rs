//! The pod sandbox config handed to RunPodSandbox (kubelet's `kuberuntime_sandbox.go`,
//! `generatePodSandboxConfig`, and `network/dns` for the resolver).

use k8s_openapi::api::core::v1::Pod;

use super::actions::{pod_spec_hash, sandbox_hash};
use super::labels;
use super::Settings;
use crate::cri::api;

/// Resolver settings read from a resolv.conf file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResolvConf {
    /// `nameserver` lines (at most 3 are used, as glibc does).
    pub servers: Vec<String>,
    /// `search` domains.
    pub searches: Vec<String>,
    /// `options` entries.
    pub options: Vec<String>,
}

/// Parses resolv.conf text (`nameserver`, `search`/`domain`, `options`; comments ignored).
pub fn parse_resolv_conf(text: &str) -> ResolvConf {
    let mut r = ResolvConf::default();
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or("");
        let mut f = line.split_whitespace();
        match f.next() {
            Some("nameserver") => r.servers.extend(f.next().map(str::to_owned)),
            Some("search") | Some("domain") => r.searches = f.map(str::to_owned).collect(),
            Some("options") => r.options.extend(f.map(str::to_owned)),
            _ => {}
        }
    }
    r.servers.truncate(3);
    r
}

/// Directory of the pod's logs: `<podLogsDir>/<namespace>_<name>_<uid>` (kubelet's
/// `BuildPodLogsDirectory`).
pub fn pod_logs_dir(settings: &Settings, pod: &Pod) -> std::path::PathBuf {
    crate::pod::pod_logs_dir_under(&settings.pod_logs_dir, pod)
}

/// True for a pod in the host's network namespace (`spec.hostNetwork`).
pub fn is_host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

fn ns_mode(node: bool, alternative: api::NamespaceMode) -> i32 {
    if node {
        api::NamespaceMode::Node as i32
    } else {
        alternative as i32
    }
}

/// Namespace options for the pod's sandbox and containers (kubelet's `namespacesForPod`):
/// network NODE with hostNetwork, else POD; pid NODE with hostPID, POD with
/// shareProcessNamespace, else CONTAINER; ipc NODE with hostIPC, else POD.
pub fn namespace_options(pod: &Pod) -> api::NamespaceOption {
    let s = pod.spec.as_ref();
    let flag = |f: fn(&k8s_openapi::api::core::v1::PodSpec) -> Option<bool>| {
        s.and_then(f).unwrap_or(false)
    };
    api::NamespaceOption {
        network: ns_mode(flag(|s| s.host_network), api::NamespaceMode::Pod),
        pid: ns_mode(
            flag(|s| s.host_pid),
            if flag(|s| s.share_process_namespace) {
                api::NamespaceMode::Pod
            } else {
                api::NamespaceMode::Container
            },
        ),
        ipc: ns_mode(flag(|s| s.host_ipc), api::NamespaceMode::Pod),
        ..Default::default()
    }
}

/// The pod's hostname (kubelet's `GeneratePodHostNameAndDomain`): the node's hostname for
/// host-network pods, else `spec.hostname` or the pod name cut to 63 characters without a
/// trailing `-` or `.`. Only pods off the host network get it as their sandbox's hostname.
pub fn pod_hostname(settings: &Settings, pod: &Pod) -> String {
    let spec = pod.spec.as_ref();
    if is_host_network(pod) {
        return settings.hostname.clone();
    }
    if let Some(h) = spec.and_then(|s| s.hostname.clone()) {
        return h;
    }
    let name = pod.metadata.name.as_deref().unwrap_or("");
    let cut = &name[..name.len().min(63)];
    cut.trim_end_matches(['-', '.']).to_owned()
}

/// The hostname the sandbox's kernel gets (kubelet's `GetNodenameForKernel`): the pod's
/// hostname, or with `setHostnameAsFQDN` and a domain (see [`super::hosts_file::pod_domain`]),
/// `<hostname>.<domain>`.
///
/// Errors: kubelet's message when that FQDN is longer than 64 characters (the kernel's limit).
pub fn kernel_hostname(settings: &Settings, pod: &Pod) -> Result<String, String> {
    let hostname = pod_hostname(settings, pod);
    let fqdn = pod
        .spec
        .as_ref()
        .and_then(|s| s.set_hostname_as_fqdn)
        .unwrap_or(false);
    let domain = super::hosts_file::pod_domain(settings, pod);
    if !fqdn || domain.is_empty() {
        return Ok(hostname);
    }
    let full = format!("{hostname}.{domain}");
    if full.len() > 64 {
        return Err(format!(
            "failed to construct FQDN from pod hostname and cluster domain, FQDN {full} is too long (64 characters is the max, {} characters requested)",
            full.len()
        ));
    }
    Ok(full)
}

/// Where a pod's resolver comes from (kubelet's `podDNSType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodDnsType {
    /// The cluster DNS servers and search path.
    Cluster,
    /// The host's resolver (`resolvConf`).
    Host,
    /// Only `spec.dnsConfig`.
    None,
}

/// The resolver source for `pod` (kubelet's `getPodDNSType`): `None` → only `dnsConfig`;
/// `ClusterFirstWithHostNet` → cluster; `ClusterFirst` (the default) → cluster, except for
/// host-network pods, which fall back to the host's resolver; `Default` → host. The cluster type
/// itself falls back to the host when no `clusterDNS` is configured (see [`pod_dns`]).
pub fn pod_dns_type(pod: &Pod) -> PodDnsType {
    let spec = pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    match spec
        .and_then(|s| s.dns_policy.as_deref())
        .unwrap_or("ClusterFirst")
    {
        "None" => PodDnsType::None,
        "ClusterFirstWithHostNet" => PodDnsType::Cluster,
        "Default" => PodDnsType::Host,
        _ if host_network => PodDnsType::Host,
        _ => PodDnsType::Cluster,
    }
}

/// DNS for the sandbox (kubelet's `GetPodDNS`), from the pod's [`pod_dns_type`]:
///
/// - cluster, with `clusterDNS` set: those servers, the search path
///   `<namespace>.svc.<clusterDomain>`, `svc.<clusterDomain>`, `<clusterDomain>` followed by the
///   host's search domains, and `ndots:5`; without `clusterDNS`, the host's resolver (kubelet
///   logs the same fallback);
/// - host: the `resolvConf` file's servers, search domains and options;
/// - none: nothing but `spec.dnsConfig`.
///
/// `spec.dnsConfig` then adds servers and search domains (duplicates dropped) and overrides
/// options of the same name, under any policy.
pub fn pod_dns(settings: &Settings, pod: &Pod) -> api::DnsConfig {
    let spec = pod.spec.as_ref();
    let resolv = &settings.resolv_conf;
    let host = || api::DnsConfig {
        servers: resolv.servers.clone(),
        searches: resolv.searches.clone(),
        options: resolv.options.clone(),
    };
    let mut dns = match pod_dns_type(pod) {
        PodDnsType::None => api::DnsConfig::default(),
        PodDnsType::Host => host(),
        PodDnsType::Cluster if settings.cluster_dns.is_empty() => host(),
        PodDnsType::Cluster => {
            let mut searches = Vec::new();
            let domain = &settings.cluster_domain;
            if !domain.is_empty() {
                let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
                searches.push(format!("{ns}.svc.{domain}"));
                searches.push(format!("svc.{domain}"));
                searches.push(domain.clone());
            }
            searches.extend(resolv.searches.iter().cloned());
            api::DnsConfig {
                servers: settings.cluster_dns.clone(),
                searches,
                options: vec!["ndots:5".into()],
            }
        }
    };
    if let Some(cfg) = spec.and_then(|s| s.dns_config.as_ref()) {
        dns.servers
            .extend(cfg.nameservers.iter().flatten().cloned());
        dns.searches.extend(cfg.searches.iter().flatten().cloned());
        for o in cfg.options.iter().flatten() {
            let name = o.name.clone().unwrap_or_default();
            dns.options
                .retain(|x| x.split(':').next() != Some(name.as_str()));
            dns.options.push(match &o.value {
                Some(v) => format!("{name}:{v}"),
                None => name,
            });
        }
    }
    let mut seen = std::collections::HashSet::new();
    dns.servers.retain(|s| seen.insert(s.clone()));
    let mut seen = std::collections::HashSet::new();
    dns.searches.retain(|s| seen.insert(s.clone()));
    dns
}

/// Port mappings of every container port (kubelet's `makePortMappings`).
pub fn port_mappings(pod: &Pod) -> Vec<api::PortMapping> {
    let spec = match pod.spec.as_ref() {
        Some(s) => s,
        None => return Vec::new(),
    };
    spec.containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .map(|p| api::PortMapping {
            protocol: match p.protocol.as_deref() {
                Some("UDP") => api::Protocol::Udp as i32,
                Some("SCTP") => api::Protocol::Sctp as i32,
                _ => api::Protocol::Tcp as i32,
            },
            container_port: p.container_port,
            host_port: p.host_port.unwrap_or(0),
            host_ip: p.host_ip.clone().unwrap_or_default(),
        })
        .collect()
}

/// The full PodSandboxConfig for `pod` at sandbox `attempt`, placed in `cgroup_parent`.
pub fn sandbox_config(
    settings: &Settings,
    pod: &Pod,
    attempt: u32,
    cgroup_parent: String,
) -> api::PodSandboxConfig {
    let m = &pod.metadata;
    let mut annotations = labels::sandbox_annotations(pod);
    annotations.insert(labels::SANDBOX_HASH.into(), sandbox_hash(pod));
    annotations.insert(labels::POD_SPEC_HASH.into(), pod_spec_hash(pod));
    let sysctls = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|sc| sc.sysctls.as_ref())
        .map(|l| {
            l.iter()
                .map(|s| (s.name.clone(), s.value.clone()))
                .collect()
        })
        .unwrap_or_default();
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: m.name.clone().unwrap_or_default(),
            uid: m.uid.clone().unwrap_or_default(),
            namespace: m.namespace.clone().unwrap_or_default(),
            attempt,
        }),
        // A pod on the host network shares the host's UTS namespace: it keeps the node's
        // hostname, and asking for one is refused by the runtime (kubelet sets none either).
        hostname: if is_host_network(pod) {
            String::new()
        } else {
            // An FQDN that is too long is refused before the sandbox is made (see `sync`).
            kernel_hostname(settings, pod).unwrap_or_else(|_| pod_hostname(settings, pod))
        },
        log_directory: pod_logs_dir(settings, pod).display().to_string(),
        dns_config: Some(pod_dns(settings, pod)),
        port_mappings: port_mappings(pod),
        labels: labels::sandbox_labels(pod),
        annotations,
        linux: Some(api::LinuxPodSandboxConfig {
            cgroup_parent,
            security_context: Some(api::LinuxSandboxSecurityContext {
                namespace_options: Some(namespace_options(pod)),
                // A privileged container needs a privileged sandbox (kubelet's
                // `HasPrivilegedContainer`; containerd refuses it otherwise).
                privileged: has_privileged_container(pod),
                ..Default::default()
            }),
            sysctls,
            ..Default::default()
        }),
        windows: None,
    }
}

/// Whether any container of the pod, init containers included, is privileged (kubelet's
/// `HasPrivilegedContainer`).
pub fn has_privileged_container(pod: &Pod) -> bool {
    pod.spec.as_ref().is_some_and(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .any(|c| {
                c.security_context
                    .as_ref()
                    .and_then(|sc| sc.privileged)
                    .unwrap_or(false)
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_privileged_container_makes_the_sandbox_privileged() {
        let plain = pod("{containers: [{name: a, image: busybox}]}");
        let privileged = pod("{containers: [{name: a, image: busybox}], initContainers: [{name: i, image: busybox, securityContext: {privileged: true}}]}");
        let sc = |p: &Pod| {
            sandbox_config(&settings(), p, 0, String::new())
                .linux
                .unwrap()
                .security_context
                .unwrap()
                .privileged
        };
        assert!(!sc(&plain));
        assert!(sc(&privileged));
    }

    fn pod(spec: &str) -> Pod {
        serde_yaml::from_str(&format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: web-node1, namespace: ns, uid: u1}}\nspec: {spec}")).unwrap()
    }

    fn settings() -> Settings {
        Settings::example()
    }

    #[test]
    fn resolv_conf_parses_host_file() {
        let r = parse_resolv_conf("# c\nnameserver 10.0.0.1\nnameserver 10.0.0.2\nsearch a.local b.local\noptions ndots:2 edns0\n");
        assert_eq!(r.servers, vec!["10.0.0.1", "10.0.0.2"]);
        assert_eq!(r.searches, vec!["a.local", "b.local"]);
        assert_eq!(r.options, vec!["ndots:2", "edns0"]);
    }

    #[test]
    fn sandbox_config_matches_kubelet() {
        let p = pod(
            "{containers: [{name: c, image: b, ports: [{containerPort: 80, hostPort: 8080}]}]}",
        );
        let c = sandbox_config(&settings(), &p, 2, "/kubepods/besteffort/podu1".into());
        let md = c.metadata.unwrap();
        assert_eq!(
            (
                md.name.as_str(),
                md.namespace.as_str(),
                md.uid.as_str(),
                md.attempt
            ),
            ("web-node1", "ns", "u1", 2)
        );
        assert_eq!(c.hostname, "web-node1");
        assert_eq!(c.log_directory, "/var/log/pods/ns_web-node1_u1");
        assert_eq!(c.port_mappings[0].host_port, 8080);
        assert_eq!(c.labels[labels::POD_UID], "u1");
        let linux = c.linux.unwrap();
        assert_eq!(linux.cgroup_parent, "/kubepods/besteffort/podu1");
        let ns = linux.security_context.unwrap().namespace_options.unwrap();
        assert_eq!(ns.network, api::NamespaceMode::Pod as i32);
        assert_eq!(ns.pid, api::NamespaceMode::Container as i32);
        assert_eq!(c.dns_config.unwrap().servers, vec!["10.0.0.1"]);
    }

    #[test]
    fn host_namespaces_and_shared_pid() {
        let p = pod("{hostNetwork: true, hostIPC: true, shareProcessNamespace: true, containers: [{name: c, image: b}]}");
        let ns = namespace_options(&p);
        assert_eq!(
            (ns.network, ns.pid, ns.ipc),
            (
                api::NamespaceMode::Node as i32,
                api::NamespaceMode::Pod as i32,
                api::NamespaceMode::Node as i32
            )
        );
        assert_eq!(pod_hostname(&settings(), &p), "node1");
        let p = pod("{hostPID: true, containers: [{name: c, image: b}]}");
        assert_eq!(namespace_options(&p).pid, api::NamespaceMode::Node as i32);
    }

    #[test]
    fn set_hostname_as_fqdn_joins_the_domain_up_to_64_characters() {
        let mut s = settings();
        s.cluster_domain = "cluster.local".into();
        let p: Pod = serde_yaml::from_str("metadata: {name: web, namespace: ns}\nspec: {hostname: web, subdomain: db, setHostnameAsFQDN: true, containers: []}").unwrap();
        assert_eq!(
            kernel_hostname(&s, &p).unwrap(),
            "web.db.ns.svc.cluster.local"
        );
        assert_eq!(
            sandbox_config(&s, &p, 0, String::new()).hostname,
            "web.db.ns.svc.cluster.local"
        );
        let long: Pod = serde_yaml::from_str(&format!("metadata: {{name: web, namespace: ns}}\nspec: {{hostname: {}, subdomain: db, setHostnameAsFQDN: true, containers: []}}", "h".repeat(50))).unwrap();
        let e = kernel_hostname(&s, &long).unwrap_err();
        assert!(
            e.contains("is too long (64 characters is the max, 74 characters requested)"),
            "{e}"
        );
        let plain: Pod = serde_yaml::from_str("metadata: {name: web, namespace: ns}\nspec: {hostname: web, subdomain: db, containers: []}").unwrap();
        assert_eq!(kernel_hostname(&s, &plain).unwrap(), "web");
    }

    #[test]
    fn host_network_sandbox_asks_for_no_hostname() {
        let p = pod("{hostNetwork: true, containers: [{name: c, image: b}]}");
        let c = sandbox_config(&settings(), &p, 0, "/kubepods/podu1".into());
        assert_eq!(
            c.hostname, "",
            "the runtime refuses a hostname in the host's UTS namespace"
        );
        let p = pod("{hostPID: true, hostIPC: true, containers: [{name: c, image: b}]}");
        assert_eq!(
            sandbox_config(&settings(), &p, 0, String::new()).hostname,
            "web-node1"
        );
    }

    #[test]
    fn dns_policy_picks_cluster_or_host_as_kubelet() {
        let mut s = settings();
        s.resolv_conf.searches = vec!["corp.example".into()];
        // (spec fields, type, servers without cluster DNS, servers with 10.96.0.10)
        let cases = [
            ("", PodDnsType::Cluster, "10.0.0.1", "10.96.0.10"),
            (
                "hostNetwork: true, ",
                PodDnsType::Host,
                "10.0.0.1",
                "10.0.0.1",
            ),
            (
                "hostNetwork: true, dnsPolicy: ClusterFirstWithHostNet, ",
                PodDnsType::Cluster,
                "10.0.0.1",
                "10.96.0.10",
            ),
            (
                "dnsPolicy: ClusterFirstWithHostNet, ",
                PodDnsType::Cluster,
                "10.0.0.1",
                "10.96.0.10",
            ),
            (
                "dnsPolicy: Default, ",
                PodDnsType::Host,
                "10.0.0.1",
                "10.0.0.1",
            ),
            ("dnsPolicy: None, ", PodDnsType::None, "", ""),
        ];
        for (extra, ty, without, with) in cases {
            let spec = format!("{{{extra}containers: [{{name: c, image: b}}]}}");
            let p = pod(&spec);
            assert_eq!(pod_dns_type(&p), ty, "{extra}");
            s.cluster_dns.clear();
            assert_eq!(pod_dns(&s, &p).servers.join(","), without, "{extra}");
            s.cluster_dns = vec!["10.96.0.10".into()];
            s.cluster_domain = "cluster.local".into();
            let d = pod_dns(&s, &p);
            assert_eq!(d.servers.join(","), with, "{extra} with clusterDNS");
            if ty == PodDnsType::Cluster {
                assert_eq!(
                    d.searches,
                    vec![
                        "ns.svc.cluster.local",
                        "svc.cluster.local",
                        "cluster.local",
                        "corp.example"
                    ]
                );
                assert_eq!(d.options, vec!["ndots:5"]);
            }
        }
    }

    #[test]
    fn dns_policy_none_uses_only_dns_config() {
        let p = pod("{dnsPolicy: None, dnsConfig: {nameservers: [1.1.1.1], options: [{name: ndots, value: '5'}]}, containers: [{name: c, image: b}]}");
        let d = pod_dns(&settings(), &p);
        assert_eq!(d.servers, vec!["1.1.1.1"]);
        assert_eq!(d.options, vec!["ndots:5"]);
    }
}
