//! Pods in the host's namespaces, on the real containerd: a hostNetwork pod runs with the
//! node's hostname, addresses, resolver and hosts file; its ports are ports on the host, a pod
//! that wants a port already taken is refused as kubelet refuses it, and renaming its container
//! replaces the container. A pod on the pod network gets kubelet's managed /etc/hosts.
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

mod common;

use std::io::Read;
use std::time::Duration;

use common::{wait_until, Nodelet};

/// The manifest: a hostNetwork pod declaring port 4534, no grace period of its own.
fn hostnet(container: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: hostnet}}
spec:
  hostNetwork: true
  containers:
  - name: {container}
    image: busybox:1.36
    command: [sleep, \"3600\"]
    ports: [{{name: tcp, containerPort: 4534, protocol: TCP}}]
"
    )
}

/// Starts a server on port 4534 inside the container (it answers with the container's
/// hostname) and returns what 127.0.0.1:4534 on the host answers.
fn serve_and_ask(n: &Nodelet, id: &str) -> String {
    let (code, _) = n.runtime.exec(
        id,
        &["sh", "-c", "nc -ll -p 4534 -e hostname >/dev/null 2>&1 &"],
    );
    assert_eq!(code, 0);
    let mut answer = String::new();
    wait_until(Duration::from_secs(10), "127.0.0.1:4534 answers", || {
        let Ok(mut s) = std::net::TcpStream::connect("127.0.0.1:4534") else {
            return false;
        };
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        answer.clear();
        s.read_to_string(&mut answer).is_ok() && !answer.is_empty()
    });
    answer.trim().to_string()
}

fn status(n: &Nodelet, name: &str) -> serde_json::Value {
    n.pod(name).map(|p| p["status"].clone()).unwrap_or_default()
}

#[test]
fn host_network_pod_runs_with_the_nodes_identity_refuses_a_port_conflict_and_survives_a_rename() {
    let mut n = Nodelet::with_config(
        "hostnet",
        "clusterDNS: [10.96.0.10]\nclusterDomain: cluster.local\n",
    );
    n.start();
    let host_name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string();

    n.write_manifest("hostnet.yaml", &hostnet("c"));
    let uid = n.uid("hostnet");
    let c = n.wait_running(&uid, &["c"], Duration::from_secs(30))["c"].clone();

    // The node's hostname, not the pod's name (the sandbox asked for none).
    assert_eq!(n.runtime.exec(&c.id, &["hostname"]).1.trim(), host_name);
    // Container ports are ports on the host.
    assert_eq!(serve_and_ask(&n, &c.id), host_name);
    // The pod's IPs are the node's.
    wait_until(Duration::from_secs(10), "Running with a pod IP", || {
        status(&n, "hostnet")["phase"] == "Running"
    });
    let st = status(&n, "hostnet");
    assert_eq!(st["podIP"], st["hostIP"], "{st}");
    assert_eq!(st["podIPs"][0]["ip"], st["hostIP"], "{st}");
    // The host's resolver (ClusterFirst falls back to it on the host network), and the node's
    // hosts file under kubelet's header.
    let resolv = n.runtime.exec(&c.id, &["cat", "/etc/resolv.conf"]).1;
    let host_resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap();
    for line in host_resolv.lines().filter(|l| l.starts_with("nameserver")) {
        assert!(resolv.contains(line), "{resolv}");
    }
    assert!(!resolv.contains("10.96.0.10"), "{resolv}");
    let hosts = n.runtime.exec(&c.id, &["cat", "/etc/hosts"]).1;
    let host_hosts = std::fs::read_to_string("/etc/hosts").unwrap();
    assert_eq!(
        hosts,
        format!("# Kubernetes-managed hosts file (host network).\n{host_hosts}")
    );

    // ClusterFirstWithHostNet uses the cluster DNS when one is configured; hostAliases are
    // added to the node's hosts file. Its port (4535) does not collide.
    n.write_manifest(
        "withhostnet.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: withhostnet}\nspec:\n  hostNetwork: true\n  dnsPolicy: ClusterFirstWithHostNet\n  hostAliases: [{ip: 10.1.2.3, hostnames: [foo.local, bar.local]}]\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {name: c, image: busybox:1.36, command: [sleep, '3600'], ports: [{containerPort: 4535}]}\n",
    );
    let w_uid = n.uid("withhostnet");
    let w = n.wait_running(&w_uid, &["c"], Duration::from_secs(30))["c"].clone();
    let resolv = n.runtime.exec(&w.id, &["cat", "/etc/resolv.conf"]).1;
    assert!(resolv.contains("nameserver 10.96.0.10"), "{resolv}");
    assert!(
        resolv.contains("search default.svc.cluster.local svc.cluster.local cluster.local"),
        "{resolv}"
    );
    let hosts = n.runtime.exec(&w.id, &["cat", "/etc/hosts"]).1;
    assert!(
        hosts.ends_with("\n# Entries added by HostAliases.\n10.1.2.3\tfoo.local\tbar.local\n"),
        "{hosts}"
    );

    // Each sandbox's status was read once, by the worker that made it: its empty answer (no
    // IPs of its own on the host network) is as final as a pod network's address, so the
    // relists that saw the containers start did not ask again (issue 14).
    n.wait_for_housekeeping(1);
    assert_eq!(
        n.metric("kubelet_runtime_operations_total{operation_type=\"podsandbox_status\"}"),
        2.0
    );

    // A second pod that wants port 4534 is refused with kubelet's reason and message; the first
    // keeps running.
    n.write_manifest(
        "second.yaml",
        &hostnet("c").replace("name: hostnet", "name: second"),
    );
    wait_until(Duration::from_secs(10), "second refused", || {
        status(&n, "second")["reason"] == "NodePorts"
    });
    let st = status(&n, "second");
    assert_eq!(st["phase"], "Failed");
    assert_eq!(
        st["message"],
        "Pod was rejected: Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports"
    );
    assert!(n.runtime.sandboxes(&n.uid("second")).is_empty());
    let events = n.get("/events").unwrap();
    assert!(events.contains("\"reason\":\"NodePorts\""), "{events}");
    let metrics = n.get("/metrics").unwrap();
    assert!(
        metrics.contains("kubelet_admission_rejections_total{reason=\"NodePorts\"} 1"),
        "{metrics}"
    );
    assert_eq!(
        n.runtime.container_status(&c.id).state,
        1,
        "the first pod's container keeps running"
    );
    assert_eq!(status(&n, "hostnet")["phase"], "Running");

    // Renaming the container: the old one is stopped first (it releases the port), the new one
    // runs and the pod is Running and Ready again with the new name.
    n.write_manifest("hostnet.yaml", &hostnet("renamed"));
    let r = n.wait_running(&uid, &["renamed"], Duration::from_secs(60))["renamed"].clone();
    assert_ne!(
        n.runtime.try_container_status(&c.id).map(|s| s.state),
        Some(1),
        "the old container is not running"
    );
    wait_until(Duration::from_secs(15), "Ready with the new name", || {
        let st = status(&n, "hostnet");
        let names: Vec<_> = st["containerStatuses"]
            .as_array()
            .map(|a| a.iter().map(|c| c["name"].clone()).collect())
            .unwrap_or_default();
        st["phase"] == "Running"
            && names == ["renamed"]
            && st["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
    });
    assert_eq!(serve_and_ask(&n, &r.id), host_name);
}

#[test]
fn pod_network_pods_get_kubelets_managed_hosts_file_and_their_own_hostname() {
    let mut n = Nodelet::new("etchosts");
    n.start();
    n.write_manifest(
        "web.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  hostAliases: [{ip: 10.1.2.3, hostnames: [foo.local]}]\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {name: c, image: busybox:1.36, command: [sleep, '3600']}\n",
    );
    let uid = n.uid("web");
    let c = n.wait_running(&uid, &["c"], Duration::from_secs(30))["c"].clone();
    let pod_name = format!("web-{}", n.node);
    assert_eq!(n.runtime.exec(&c.id, &["hostname"]).1.trim(), pod_name);
    wait_until(Duration::from_secs(10), "pod IP", || {
        status(&n, "web")["podIP"].is_string()
    });
    let ip = status(&n, "web")["podIP"].as_str().unwrap().to_string();
    let hosts = n.runtime.exec(&c.id, &["cat", "/etc/hosts"]).1;
    assert_eq!(
        hosts,
        format!(
            "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n{ip}\t{pod_name}\n\n# Entries added by HostAliases.\n10.1.2.3\tfoo.local\n"
        )
    );
    let file = n.dir.path().join("root/pods").join(&uid).join("etc-hosts");
    assert!(file.exists());
    // Removing the manifest removes the pod's directory with the pod.
    std::fs::remove_file(n.manifests().join("web.yaml")).unwrap();
    wait_until(Duration::from_secs(20), "pod directory removed", || {
        !file.parent().unwrap().exists()
    });
}
