//! The pod's directory and its managed `/etc/hosts` (kubelet's `getPodDir`, `makePodDataDirs`
//! and `ensureHostsFile` in `kubelet_pods.go`).
//!
//! Every pod gets `<root-dir>/pods/<uid>/`. Once the pod has an IP, each container gets the file
//! `<root-dir>/pods/<uid>/etc-hosts` bind-mounted on `/etc/hosts`, rewritten before each
//! container is created (in place, so running containers see the new text):
//!
//! - off the host network: kubelet's managed file: the localhost and IPv6 entries, one line
//!   `<pod IP>\t[<hostname>.<domain>\t]<hostname>` per pod IP, then the `hostAliases`;
//! - on the host network: the node's own `/etc/hosts`, then the `hostAliases`.
//!
//! Each starts with kubelet's header line, so an operator can tell a managed file from the
//! runtime's copy.

use std::io;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;

use super::sandbox::{is_host_network, pod_hostname};
use super::Settings;
use crate::cri::api;

/// Name of the managed hosts file in the pod's directory (kubelet's).
pub const ETC_HOSTS_FILE: &str = "etc-hosts";

/// Where the node's own hosts file is read for host-network pods.
pub const NODE_HOSTS_PATH: &str = "/etc/hosts";

const MANAGED_HEADER: &str = "# Kubernetes-managed hosts file.\n";
const MANAGED_HEADER_HOST_NETWORK: &str = "# Kubernetes-managed hosts file (host network).\n";

/// The pod's directory: `<root-dir>/pods/<uid>` (kubelet's `getPodDir`). The UID must have been
/// checked with [`crate::pod::is_safe_uid`] before anything is written or
/// removed there.
pub fn pod_dir(root_dir: &Path, uid: &str) -> PathBuf {
    root_dir.join("pods").join(uid)
}

/// The pod's DNS domain (kubelet's `GeneratePodHostNameAndDomain`):
/// `<subdomain>.<namespace>.svc.<clusterDomain>` when `spec.subdomain` and `clusterDomain` are
/// both set, else empty.
pub fn pod_domain(settings: &Settings, pod: &Pod) -> String {
    let sub = pod
        .spec
        .as_ref()
        .and_then(|s| s.subdomain.as_deref())
        .unwrap_or("");
    if sub.is_empty() || settings.cluster_domain.is_empty() {
        return String::new();
    }
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    format!("{sub}.{ns}.svc.{}", settings.cluster_domain)
}

fn host_aliases(pod: &Pod) -> String {
    let aliases = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_aliases.as_deref())
        .unwrap_or(&[]);
    if aliases.is_empty() {
        return String::new();
    }
    let mut out = String::from("\n# Entries added by HostAliases.\n");
    for a in aliases {
        let names = a.hostnames.as_deref().unwrap_or(&[]).join("\t");
        out.push_str(&format!("{}\t{names}\n", a.ip));
    }
    out
}

/// The text of the pod's hosts file. `pod_ips` are the pod's addresses; `node_hosts` is the
/// node's `/etc/hosts` text, used (and required) for host-network pods.
pub fn hosts_file_content(
    settings: &Settings,
    pod: &Pod,
    pod_ips: &[String],
    node_hosts: &str,
) -> String {
    HostsText::of(settings, pod, pod_ips).render(node_hosts)
}

/// The pod's hosts file text, made from the pod alone: the node's `/etc/hosts` (host-network
/// pods) is read only when the file is written.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HostsText {
    /// The text before the node's hosts file (all of it off the host network).
    head: String,
    /// Whether the node's `/etc/hosts` follows `head` (host-network pods).
    node_hosts: bool,
    /// The text after the node's hosts file (the host aliases).
    tail: String,
}

impl HostsText {
    fn of(settings: &Settings, pod: &Pod, pod_ips: &[String]) -> Self {
        if is_host_network(pod) {
            return Self {
                head: MANAGED_HEADER_HOST_NETWORK.to_owned(),
                node_hosts: true,
                tail: host_aliases(pod),
            };
        }
        let mut out = String::from(MANAGED_HEADER);
        out.push_str("127.0.0.1\tlocalhost\n");
        out.push_str("::1\tlocalhost ip6-localhost ip6-loopback\n");
        out.push_str("fe00::0\tip6-localnet\n");
        out.push_str("fe00::0\tip6-mcastprefix\n");
        out.push_str("fe00::1\tip6-allnodes\n");
        out.push_str("fe00::2\tip6-allrouters\n");
        let name = pod_hostname(settings, pod);
        let domain = pod_domain(settings, pod);
        for ip in pod_ips {
            if domain.is_empty() {
                out.push_str(&format!("{ip}\t{name}\n"));
            } else {
                out.push_str(&format!("{ip}\t{name}.{domain}\t{name}\n"));
            }
        }
        out.push_str(&host_aliases(pod));
        Self {
            head: out,
            node_hosts: false,
            tail: String::new(),
        }
    }

    fn render(&self, node_hosts: &str) -> String {
        let node_hosts = if self.node_hosts { node_hosts } else { "" };
        [self.head.as_str(), node_hosts, self.tail.as_str()].concat()
    }
}

/// The pod's hosts file as a container start writes it: planned from the pod ([`plan`]),
/// written by [`HostsFile::write`] (file-system work, on the blocking pool).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostsFile {
    /// `<root-dir>/pods/<uid>`.
    dir: PathBuf,
    text: HostsText,
}

/// The hosts file of `pod` with `pod_ips`; `None` while the pod has no IP yet (kubelet mounts
/// it only then).
pub fn plan(settings: &Settings, pod: &Pod, pod_ips: &[String]) -> Option<HostsFile> {
    if pod_ips.is_empty() {
        return None;
    }
    Some(HostsFile {
        dir: pod_dir(&settings.root_dir, crate::pod::pod_uid(pod)),
        text: HostsText::of(settings, pod, pod_ips),
    })
}

impl HostsFile {
    /// Writes `<root-dir>/pods/<uid>/etc-hosts` (mode 0644; in place, so running containers
    /// see the new text through their mount) and returns the mount that puts it on
    /// `/etc/hosts`.
    ///
    /// Errors: the I/O error of reading the node's hosts file (host-network pods) or of writing
    /// the file.
    pub fn write(&self) -> io::Result<api::Mount> {
        let node_hosts = if self.text.node_hosts {
            std::fs::read_to_string(NODE_HOSTS_PATH)?
        } else {
            String::new()
        };
        std::fs::create_dir_all(&self.dir)?;
        let path = self.dir.join(ETC_HOSTS_FILE);
        std::fs::write(&path, self.text.render(&node_hosts))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
        Ok(api::Mount {
            container_path: "/etc/hosts".into(),
            host_path: path.display().to_string(),
            readonly: false,
            selinux_relabel: true,
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: &str) -> Pod {
        serde_yaml::from_str(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: web-node1, namespace: ns, uid: u1}}\nspec: {spec}"
        ))
        .unwrap()
    }

    #[test]
    fn pod_network_hosts_file_is_kubelets_managed_file() {
        let p = pod("{hostAliases: [{ip: 10.1.2.3, hostnames: [foo.local, bar.local]}], containers: [{name: c, image: b}]}");
        let text = hosts_file_content(&Settings::example(), &p, &["10.88.0.7".into()], "");
        assert_eq!(
            text,
            "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n10.88.0.7\tweb-node1\n\n# Entries added by HostAliases.\n10.1.2.3\tfoo.local\tbar.local\n"
        );
    }

    #[test]
    fn subdomain_with_cluster_domain_gives_the_fqdn() {
        let mut s = Settings::example();
        let p = pod("{hostname: db, subdomain: data, containers: [{name: c, image: b}]}");
        assert!(hosts_file_content(&s, &p, &["10.88.0.7".into()], "").ends_with("10.88.0.7\tdb\n"));
        s.cluster_domain = "cluster.local".into();
        assert!(hosts_file_content(&s, &p, &["10.88.0.7".into()], "")
            .ends_with("10.88.0.7\tdb.data.ns.svc.cluster.local\tdb\n"));
    }

    #[test]
    fn host_network_hosts_file_is_the_nodes_plus_aliases() {
        let p = pod("{hostNetwork: true, hostAliases: [{ip: 10.1.2.3, hostnames: [foo]}], containers: [{name: c, image: b}]}");
        let text = hosts_file_content(
            &Settings::example(),
            &p,
            &["10.0.0.10".into()],
            "127.0.0.1 localhost\n127.0.0.1 vm\n",
        );
        assert_eq!(
            text,
            "# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n127.0.0.1 vm\n\n# Entries added by HostAliases.\n10.1.2.3\tfoo\n"
        );
    }

    #[test]
    fn the_file_is_written_under_the_pod_dir_and_mounted_on_etc_hosts() {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = Settings::example();
        s.root_dir = tmp.path().to_owned();
        let p = pod("{containers: [{name: c, image: b}]}");
        assert_eq!(plan(&s, &p, &[]), None, "no IP yet");
        let m = plan(&s, &p, &["10.88.0.9".into()])
            .unwrap()
            .write()
            .unwrap();
        let path = tmp.path().join("pods/u1/etc-hosts");
        assert_eq!(m.container_path, "/etc/hosts");
        assert_eq!(m.host_path, path.display().to_string());
        assert!(std::fs::read_to_string(&path)
            .unwrap()
            .contains("10.88.0.9\tweb-node1\n"));
    }
}
