//! A static pod in the shape of kubeadm's etcd manifest (hostNetwork, priorityClassName
//! system-node-critical, hostPath data and certificate volumes, httpGet liveness and startup
//! probes on 127.0.0.1, resource requests, seccompProfile RuntimeDefault), on the etcd image the
//! environment scripts build from Debian's etcd-server: it runs and stays Ready, and the data it
//! holds survives an edit of its manifest and its removal and return.
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{wait_until, Nodelet};

/// Ports of this test's etcd (kubeadm's are 2379/2380/2381): clear of any etcd on the machine.
const CLIENT: u16 = 12379;
const PEER: u16 = 12380;
const METRICS: u16 = 12381;

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA and one certificate for 127.0.0.1 (server and client use), as kubeadm's etcd PKI holds.
fn make_pki(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "1",
            "-subj",
            "/CN=etcd-ca",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=node",
        ],
    );
    std::fs::write(
        dir.join("ext"),
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "1",
            "-extfile",
            "ext",
        ],
    );
}

fn manifest(pki: &Path, data: &Path, snapshot_count: u32) -> String {
    let (pki, data) = (pki.display(), data.display());
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  annotations:
    kubeadm.kubernetes.io/etcd.advertise-client-urls: https://127.0.0.1:{CLIENT}
  labels: {{component: etcd, tier: control-plane}}
  name: etcd
  namespace: kube-system
spec:
  containers:
  - command:
    - etcd
    - --advertise-client-urls=https://127.0.0.1:{CLIENT}
    - --cert-file=/etc/kubernetes/pki/etcd/server.crt
    - --client-cert-auth=true
    - --data-dir=/var/lib/etcd
    - --initial-advertise-peer-urls=https://127.0.0.1:{PEER}
    - --initial-cluster=node=https://127.0.0.1:{PEER}
    - --key-file=/etc/kubernetes/pki/etcd/server.key
    - --listen-client-urls=https://127.0.0.1:{CLIENT}
    - --listen-metrics-urls=http://127.0.0.1:{METRICS}
    - --listen-peer-urls=https://127.0.0.1:{PEER}
    - --name=node
    - --peer-cert-file=/etc/kubernetes/pki/etcd/server.crt
    - --peer-client-cert-auth=true
    - --peer-key-file=/etc/kubernetes/pki/etcd/server.key
    - --peer-trusted-ca-file=/etc/kubernetes/pki/etcd/ca.crt
    - --snapshot-count={snapshot_count}
    - --trusted-ca-file=/etc/kubernetes/pki/etcd/ca.crt
    image: registry.k8s.io/etcd:3.4.23-0
    imagePullPolicy: IfNotPresent
    livenessProbe:
      failureThreshold: 8
      httpGet: {{host: 127.0.0.1, path: /health, port: {METRICS}, scheme: HTTP}}
      initialDelaySeconds: 10
      periodSeconds: 10
      timeoutSeconds: 15
    name: etcd
    resources:
      requests: {{cpu: 100m, memory: 100Mi}}
    startupProbe:
      failureThreshold: 24
      httpGet: {{host: 127.0.0.1, path: /health, port: {METRICS}, scheme: HTTP}}
      periodSeconds: 1
      timeoutSeconds: 15
    volumeMounts:
    - {{mountPath: /var/lib/etcd, name: etcd-data}}
    - {{mountPath: /etc/kubernetes/pki/etcd, name: etcd-certs}}
  hostNetwork: true
  priorityClassName: system-node-critical
  securityContext:
    seccompProfile: {{type: RuntimeDefault}}
  volumes:
  - hostPath: {{path: {pki}, type: DirectoryOrCreate}}
    name: etcd-certs
  - hostPath: {{path: {data}, type: DirectoryOrCreate}}
    name: etcd-data
"
    )
}

/// POSTs `body` to etcd's v3 JSON gateway path with the client certificate; the response body.
fn etcd(pki: &Path, path: &str, body: &str) -> Option<String> {
    let out = Command::new("curl")
        .args(["-sf", "--max-time", "5", "--cacert"])
        .arg(pki.join("ca.crt"))
        .arg("--cert")
        .arg(pki.join("server.crt"))
        .arg("--key")
        .arg(pki.join("server.key"))
        .args(["-X", "POST", "-d", body])
        .arg(format!("https://127.0.0.1:{CLIENT}{path}"))
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ready(n: &Nodelet) -> bool {
    n.pod("etcd").is_some_and(|p| {
        p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

#[test]
fn a_kubeadm_shaped_etcd_pod_runs_and_keeps_its_data() {
    let mut n = Nodelet::new("etcd");
    n.start();
    let host = tempfile::tempdir().unwrap();
    let (pki, data) = (host.path().join("pki/etcd"), host.path().join("lib/etcd"));
    make_pki(&pki);
    n.write_manifest("etcd.yaml", &manifest(&pki, &data, 10000));
    let uid = n.uid("etcd");
    wait_until(Duration::from_secs(60), "etcd Ready", || ready(&n));
    let pod = n.pod("etcd").unwrap();
    assert_eq!(pod["metadata"]["namespace"], "kube-system");
    assert_eq!(pod["status"]["qosClass"], "Burstable");
    // "foo" = "bar", base64 as the gateway takes them.
    let put = etcd(&pki, "/v3/kv/put", r#"{"key":"Zm9v","value":"YmFy"}"#);
    assert!(
        put.is_some(),
        "put through the client URL with the certificates"
    );
    assert!(data.join("member").is_dir(), "etcd wrote into its hostPath");
    let first = n.runtime.containers(&uid);
    // An edit restarts the container; the data is in the hostPath.
    n.write_manifest("etcd.yaml", &manifest(&pki, &data, 10001));
    wait_until(Duration::from_secs(60), "etcd restarted and Ready", || {
        let now = n.runtime.containers(&uid);
        now.iter()
            .any(|c| first.iter().all(|f| f.id != c.id) && c.state == 1)
            && ready(&n)
    });
    // The key, read from the new container (the status may show the old one Ready for a sync).
    wait_until(
        Duration::from_secs(60),
        "the key read back after the edit",
        || etcd(&pki, "/v3/kv/range", r#"{"key":"Zm9v"}"#).is_some_and(|got| got.contains("YmFy")),
    );
    wait_until(Duration::from_secs(60), "Ready after the edit", || {
        ready(&n)
    });
    // Removed and returned: a new sandbox, the same data.
    std::fs::remove_file(n.manifests().join("etcd.yaml")).unwrap();
    wait_until(Duration::from_secs(60), "etcd gone", || {
        n.runtime.sandboxes(&uid).is_empty()
    });
    n.write_manifest("etcd.yaml", &manifest(&pki, &data, 10001));
    wait_until(Duration::from_secs(60), "etcd back and Ready", || ready(&n));
    wait_until(
        Duration::from_secs(60),
        "the key read back after the removal",
        || etcd(&pki, "/v3/kv/range", r#"{"key":"Zm9v"}"#).is_some_and(|got| got.contains("YmFy")),
    );
    // Stays up: once its liveness probe has passed, it has not restarted.
    wait_until(
        Duration::from_secs(60),
        "a successful liveness probe",
        || {
            n.get("/metrics/probes").is_some_and(|m| {
                m.lines().any(|l| {
                    l.starts_with("prober_probe_total{")
                        && l.contains("probe_type=\"Liveness\"")
                        && l.contains("result=\"successful\"")
                        && l.contains("pod=\"etcd-")
                })
            })
        },
    );
    let st = &n.pod("etcd").unwrap()["status"]["containerStatuses"][0];
    assert_eq!(st["restartCount"], 0, "{st}");
    assert!(st["state"]["running"].is_object() && ready(&n), "{st}");
}
