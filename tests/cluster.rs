//! Cluster mode against a real kube-apiserver v1.20 and etcd (scripts/env/cluster.sh, which
//! `.ci/run` starts): the node registers with the capacity nodelet computed and kubelet's
//! labels, it is Ready, its Lease in kube-node-lease is renewed every 10 s and owned by the Node,
//! and once nodelet stops the Lease is no longer renewed. A static pod appears as a mirror pod
//! with its status; editing the manifest replaces the mirror, one deleted by hand comes back,
//! and removing the manifest deletes it. A pod created with kubectl for the node runs, its
//! status (phase, podIP, container state) reaches the API, and `kubectl delete` stops it within
//! its grace period and the object disappears; one with a volume kind nodelet does not implement
//! is never run and is Failed with the field named. Credentials of another node are refused by the
//! apiserver and reported once. Events reach the API: a pod's about the pod, a broken manifest's
//! about the Node; an evicted API pod is Failed/Evicted in the API and left there. An API pod reads its ConfigMap and Secret from the apiserver, its volume
//! follows an edit, and one whose ConfigMap is missing waits for it. With its apiserver stopped for 30 s (a second kube-apiserver on
//! the same etcd, so that the other tests keep theirs; not up yet when nodelet starts, which
//! runs its static pod and registers once it answers), nodelet restarts no container, posts the
//! status that changed meanwhile within 10 s of the return, and lists again when etcd was
//! compacted under its watch, running the pod created meanwhile.
//!
//! Skipped, with a message, where the control plane is not running.
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{running_by_name, wait_until, Nodelet};

const ADMIN: &str = "/var/lib/nodelet-env/cluster/admin.kubeconfig";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// kubectl as the cluster admin; its stdout, or None when it fails.
fn kubectl(args: &[&str]) -> Option<String> {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(ADMIN)
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether the control plane answers; prints why a test is skipped when it does not.
fn cluster_up() -> bool {
    if !Path::new(ADMIN).exists() || kubectl(&["get", "--raw", "/readyz"]).is_none() {
        eprintln!(
            "SKIPPED: no control plane (run `bash scripts/env/cluster.sh`; .ci/run starts it)"
        );
        return false;
    }
    true
}

/// A kubeconfig for node `name` (client certificate system:node:<name>).
fn node_kubeconfig(name: &str) -> String {
    let out = Command::new("bash")
        .arg(repo().join("scripts/env/cluster.sh"))
        .args(["node-kubeconfig", name])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn jsonpath(kind: &str, name: &str, ns: Option<&str>, path: &str) -> Option<String> {
    let mut args = vec!["get", kind, name, "-o"];
    let p = format!("jsonpath={path}");
    args.push(&p);
    if let Some(ns) = ns {
        args.extend(["-n", ns]);
    }
    kubectl(&args)
}

/// A nodelet for `test` (extra configuration `extra`), not started; `None` (the test skips)
/// without a control plane.
fn cluster_nodelet(test: &str, extra: &str) -> Option<Nodelet> {
    cluster_up().then(|| Nodelet::with_config(test, extra))
}

/// A nodelet for `test` (extra configuration `extra`) that joins the cluster as its own node,
/// any Node of that name deleted first; `None` (the test skips) without a control plane.
fn joining_nodelet(test: &str, extra: &str) -> Option<Nodelet> {
    let mut n = cluster_nodelet(test, extra)?;
    delete_node(&n.node);
    n.extra_args = vec!["--kubeconfig".into(), node_kubeconfig(&n.node)];
    Some(n)
}

/// [`joining_nodelet`], started; with its node name.
fn joined(test: &str, extra: &str) -> Option<(Nodelet, String)> {
    let mut n = joining_nodelet(test, extra)?;
    n.start();
    let node = n.node.clone();
    Some((n, node))
}

/// The cluster CA, which the nodes' API trusts for the API server's client certificate.
const CLUSTER_CA: &str = "/var/lib/nodelet-env/cluster/pki/ca.crt";

/// [`joined`] with its node API reachable by the API server (`address: 0.0.0.0`, the cluster CA
/// as `clientCAFile`) and the extra configuration `extra`.
fn joined_with_node_api(test: &str, extra: &str) -> Option<(Nodelet, String)> {
    joined(
        test,
        &format!(
            "address: 0.0.0.0\nauthentication: {{x509: {{clientCAFile: {CLUSTER_CA}}}}}\n{extra}"
        ),
    )
}

/// Waits until API pod `name` of `default` is Running.
fn wait_api_pod_running(name: &str) {
    wait_until(Duration::from_secs(30), "the API pod Running", || {
        jsonpath("pod", name, Some("default"), "{.status.phase}").is_some_and(|p| p == "Running")
    });
}

/// [`wait_until`], then prints `what` with the time since `since` (the numbers issue notes
/// quote; seen with `--nocapture`).
fn timed_wait(timeout: Duration, what: &str, since: Instant, f: impl FnMut() -> bool) {
    wait_until(timeout, what, f);
    eprintln!("{what}: {:?}", since.elapsed());
}

/// The end of a test whose agent runs API pod `name`: the pod's object removed at once
/// (`--grace-period=0 --force`; the runtime's side goes with the agent's [`Nodelet`]) and the
/// Node deleted, so that the shared control plane keeps no pod stuck Terminating on a node
/// nobody serves, nor the node.
fn leave(n: Nodelet, name: &str) {
    let _ = kubectl(&[
        "-n",
        "default",
        "delete",
        "pod",
        name,
        "--grace-period=0",
        "--force",
        "--wait=false",
    ]);
    let node = n.node.clone();
    drop(n);
    delete_node(&node);
}

/// `path` (a jsonpath) of the Events of `default` that `selector` (a field selector) picks; empty
/// when kubectl fails.
fn events(selector: &str, path: &str) -> String {
    kubectl(&[
        "-n",
        "default",
        "get",
        "events",
        "--field-selector",
        selector,
        "-o",
        &format!("jsonpath={path}"),
    ])
    .unwrap_or_default()
}

fn delete_node(name: &str) {
    let _ = kubectl(&["delete", "node", name, "--ignore-not-found"]);
    let _ = kubectl(&[
        "-n",
        "kube-node-lease",
        "delete",
        "lease",
        name,
        "--ignore-not-found",
    ]);
}

#[test]
fn the_node_registers_is_ready_and_renews_its_lease() {
    let Some(mut n) = joining_nodelet("joins", "maxPods: 42\n") else {
        return;
    };
    let name = n.node.clone();
    n.start();
    wait_until(Duration::from_secs(20), "the node Ready in the API", || {
        jsonpath(
            "node",
            &name,
            None,
            "{.status.conditions[?(@.type==\"Ready\")].status}",
        )
        .is_some_and(|s| s == "True")
    });
    // kubelet's events about the Node, as `kubectl describe node` shows them (it looks for
    // events whose UID is the node's name, kubelet's node reference).
    let describe = || kubectl(&["describe", "node", &name]).unwrap_or_default();
    let said = |text: &str, line: &[&str]| {
        text.lines()
            .any(|l| line.iter().all(|part| l.contains(part)))
    };
    let node_events: [&[&str]; 5] = [
        &["Normal", "Starting", "Starting kubelet."],
        &[
            "Normal",
            "NodeHasSufficientMemory",
            &format!("Node {name} status is now: NodeHasSufficientMemory"),
        ],
        &[
            "Normal",
            "NodeHasNoDiskPressure",
            "status is now: NodeHasNoDiskPressure",
        ],
        &[
            "Normal",
            "NodeHasSufficientPID",
            "status is now: NodeHasSufficientPID",
        ],
        &[
            "Normal",
            "NodeAllocatableEnforced",
            "Updated Node Allocatable limit across pods",
        ],
    ];
    wait_until(
        Duration::from_secs(20),
        "kubelet's node events in kubectl describe node",
        || {
            let text = describe();
            node_events.iter().all(|line| said(&text, line))
        },
    );
    // A broken manifest: its event is about the Node, naming the file.
    n.write_manifest(
        "broken.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: [\n",
    );
    let selector =
        format!("involvedObject.kind=Node,involvedObject.name={name},reason=DecodeError");
    wait_until(
        Duration::from_secs(20),
        "the manifest's event in the API",
        || events(&selector, "{.items[*].message}").contains("broken.yaml"),
    );
    // The capacity nodelet computed: this machine's memory and cpus, maxPods.
    let cap =
        |r: &str| jsonpath("node", &name, None, &format!("{{.status.capacity.{r}}}")).unwrap();
    assert_eq!(cap("memory"), format!("{}Ki", common::mem_total() / 1024));
    let cpus = std::thread::available_parallelism().unwrap().get();
    assert_eq!(cap("cpu"), cpus.to_string());
    assert_eq!(cap("pods"), "42");
    let label = jsonpath(
        "node",
        &name,
        None,
        "{.metadata.labels.kubernetes\\.io/hostname}",
    );
    assert_eq!(label.as_deref(), Some(name.as_str()));
    let runtime = jsonpath(
        "node",
        &name,
        None,
        "{.status.nodeInfo.containerRuntimeVersion}",
    );
    assert!(runtime.unwrap().starts_with("containerd://"));
    // The pressure conditions, False on this machine, with kubelet's reasons.
    let reason = jsonpath(
        "node",
        &name,
        None,
        "{.status.conditions[?(@.type==\"MemoryPressure\")].reason}",
    );
    assert_eq!(reason.as_deref(), Some("KubeletHasSufficientMemory"));

    // The Lease: held by the node, 40 s, owned by the Node, renewed.
    let lease = |path: &str| jsonpath("lease", &name, Some("kube-node-lease"), path);
    assert_eq!(
        lease("{.spec.holderIdentity}").as_deref(),
        Some(name.as_str())
    );
    assert_eq!(lease("{.spec.leaseDurationSeconds}").as_deref(), Some("40"));
    let node_uid = jsonpath("node", &name, None, "{.metadata.uid}").unwrap();
    wait_until(
        Duration::from_secs(15),
        "the Lease owned by the Node",
        || lease("{.metadata.ownerReferences[0].uid}").as_deref() == Some(node_uid.as_str()),
    );
    let first = lease("{.spec.renewTime}").unwrap();
    wait_until(Duration::from_secs(15), "the Lease renewed", || {
        lease("{.spec.renewTime}").is_some_and(|t| t != first)
    });

    // The Node deleted by hand: registered again, and the Lease follows its new UID.
    kubectl(&["delete", "node", &name, "--wait=true"]).unwrap();
    wait_until(Duration::from_secs(25), "the Node registered again", || {
        jsonpath("node", &name, None, "{.metadata.uid}").is_some_and(|u| u != node_uid)
    });
    let new_uid = jsonpath("node", &name, None, "{.metadata.uid}").unwrap();
    wait_until(
        Duration::from_secs(15),
        "the Lease owned by the new Node",
        || lease("{.metadata.ownerReferences[0].uid}").as_deref() == Some(new_uid.as_str()),
    );

    // The Node's status edited by another writer while the agent runs (the boot ID, Ready set
    // False): put right within a round or two (a 10 s status period), with kubelet's events
    // (`Rebooted`, `NodeReady`).
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let boot_id = boot_id.trim().to_owned();
    let rebooted = format!("Node {name} has been rebooted, boot id: {boot_id}");
    let count = |reason: &str| -> i64 {
        events(
            &format!("involvedObject.name={name},reason={reason}"),
            "{.items[*].count}",
        )
        .split_whitespace()
        .filter_map(|c| c.parse::<i64>().ok())
        .sum()
    };
    let patch_status = |patch: &str| {
        kubectl(&[
            "patch",
            "node",
            &name,
            "--subresource=status",
            "--type=strategic",
            "-p",
            patch,
        ])
        .unwrap();
    };
    let node_field = |path: &str| jsonpath("node", &name, None, path).unwrap_or_default();
    patch_status(r#"{"status": {"nodeInfo": {"bootID": "edited-by-hand"}}}"#);
    wait_until(
        Duration::from_secs(25),
        "the edited boot ID put right",
        || node_field("{.status.nodeInfo.bootID}") == boot_id,
    );
    wait_until(Duration::from_secs(10), "the Rebooted event", || {
        said(&describe(), &["Warning", "Rebooted", &rebooted])
    });
    let ready_before = count("NodeReady");
    patch_status(
        r#"{"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "EditedByHand"}]}}"#,
    );
    wait_until(Duration::from_secs(25), "Ready put right", || {
        node_field("{.status.conditions[?(@.type==\"Ready\")].status}") == "True"
    });
    wait_until(Duration::from_secs(10), "the NodeReady event", || {
        count("NodeReady") > ready_before
    });
    assert_eq!(count("Rebooted"), 1, "told once");

    // Stopped: no renewal for longer than the renew interval.
    n.kill9();
    let last = lease("{.spec.renewTime}").unwrap();
    let until = Instant::now() + Duration::from_secs(13);
    while Instant::now() < until {
        assert_eq!(
            lease("{.spec.renewTime}").unwrap(),
            last,
            "renewed by a stopped agent"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // The Node as another boot left it: taken over by the agent started again, which reports
    // the reboot (kubelet's Warning `Rebooted`) with this boot's ID.
    kubectl(&[
        "patch",
        "node",
        &name,
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status": {"nodeInfo": {"bootID": "an-earlier-boot"}}}"#,
    ])
    .unwrap();
    n.start();
    wait_until(Duration::from_secs(20), "the Rebooted event", || {
        count("Rebooted") == 2
    });
    n.kill9();
    delete_node(&name);
}

#[test]
fn credentials_of_another_node_are_refused_and_reported_once() {
    let Some(mut n) = cluster_nodelet("imposter", "") else {
        return;
    };
    let other = format!("{}-other", n.node);
    n.extra_args = vec!["--kubeconfig".into(), node_kubeconfig(&other)];
    n.start();
    wait_until(Duration::from_secs(20), "the refusal reported", || {
        n.log().contains("unable to register node")
    });
    // Several retries later (back-off doubling from 100 ms): still one report, and no Node.
    n.wait_for_housekeeping(5);
    let log = n.log();
    assert_eq!(log.matches("unable to register node").count(), 1, "{log}");
    assert!(log.contains("is not allowed to modify node"), "{log}");
    assert!(
        kubectl(&["get", "node", &n.node]).is_none(),
        "no Node for the imposter"
    );
}

#[test]
fn a_static_pod_has_a_mirror_pod_that_follows_its_manifest() {
    let Some(mut n) = joining_nodelet("mirror", "") else {
        return;
    };
    let node = n.node.clone();
    let manifest = |app: &str| {
        format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: web, labels: {{app: {app}}}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: c, image: busybox:1.36, command: [sleep, '3600']}}\n")
    };
    n.write_manifest("web.yaml", &manifest("v1"));
    n.start();
    let name = format!("web-{node}");
    let pod = |path: &str| jsonpath("pod", &name, Some("default"), path);
    wait_until(Duration::from_secs(30), "the mirror pod Running", || {
        pod("{.status.phase}").is_some_and(|p| p == "Running")
    });
    // The mirror carries the static pod's status and identity.
    let uid = n.uid("web");
    assert_eq!(pod("{.spec.nodeName}").as_deref(), Some(node.as_str()));
    let ip = n.pod("web").unwrap()["status"]["podIP"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(pod("{.status.podIP}"), Some(ip));
    let mirror_hash = pod("{.metadata.annotations.kubernetes\\.io/config\\.mirror}").unwrap();
    let hash = pod("{.metadata.annotations.kubernetes\\.io/config\\.hash}").unwrap();
    assert_eq!(mirror_hash, hash);
    assert_ne!(
        pod("{.metadata.uid}").as_deref(),
        Some(uid.as_str()),
        "its own UID"
    );
    assert_eq!(
        pod("{.metadata.ownerReferences[0].kind}").as_deref(),
        Some("Node")
    );

    // An edit replaces it.
    let first = pod("{.metadata.uid}").unwrap();
    n.write_manifest("web.yaml", &manifest("v2"));
    wait_until(
        Duration::from_secs(15),
        "the mirror of the edited manifest",
        || pod("{.metadata.labels.app}").is_some_and(|a| a == "v2"),
    );
    // Deleted by hand, it comes back (a new object).
    let second = pod("{.metadata.uid}").unwrap();
    assert_ne!(first, second);
    kubectl(&["-n", "default", "delete", "pod", &name, "--wait=false"]).unwrap();
    wait_until(Duration::from_secs(15), "the mirror back", || {
        pod("{.metadata.uid}").is_some_and(|u| u != second)
            && pod("{.metadata.deletionTimestamp}").is_some_and(|t| t.is_empty())
    });
    // The manifest removed: the mirror goes.
    std::fs::remove_file(n.manifests().join("web.yaml")).unwrap();
    wait_until(Duration::from_secs(20), "the mirror deleted", || {
        pod("{.metadata.name}").is_none()
    });
    n.kill9();
    delete_node(&node);
}

/// Creates pod `name` in `default` bound to `node`, without a service account token (no
/// controller manager mints one), its spec's other lines `rest`.
fn apply_api_pod(name: &str, node: &str, rest: &str) {
    kubectl_apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  nodeName: {node}\n  automountServiceAccountToken: false\n{rest}"
    ));
}

fn kubectl_apply(yaml: &str) {
    let out = kubectl_with_input(&["apply", "-f", "-"], yaml);
    assert!(out.status.success(), "kubectl apply failed");
}

/// kubectl (admin) with `args`, `input` on its standard input; its output.
fn kubectl_with_input(args: &[&str], input: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .args(["--kubeconfig", ADMIN])
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// kubectl's commands that go through the node API (the API server proxies them to the node's
/// `daemonEndpoints.kubeletEndpoint.Port` with its kubelet client certificate): `logs`, `exec`
/// over SPDY with the command's exit status passed through, and the node's `/pods` through the
/// API server's node proxy; nodelet authenticates the API server's certificate against the
/// cluster CA and asks the API server (`SubjectAccessReview`) whether it may.
#[test]
fn kubectl_logs_and_exec_reach_the_pod_through_the_node_api() {
    let Some((n, node)) = joined_with_node_api("kubectlexec", "") else {
        return;
    };
    let name = format!("talk-{node}");
    apply_api_pod(
        &name,
        &node,
        "  terminationGracePeriodSeconds: 1\n  containers:\n  - {name: c, image: busybox:1.36, command: [sh, -c, 'echo hello from nodelet; mkdir /www; echo served by the pod > /www/index.html; exec httpd -f -p 8080 -h /www']}\n  - {name: ticker, image: busybox:1.36, command: [sh, -c, 'while true; do echo tick; sleep 0.5; done']}\n",
    );
    wait_api_pod_running(&name);
    assert_eq!(
        jsonpath(
            "node",
            &node,
            None,
            "{.status.daemonEndpoints.kubeletEndpoint.Port}"
        ),
        Some(n.api_port.to_string())
    );
    wait_until(Duration::from_secs(20), "kubectl logs", || {
        kubectl(&["-n", "default", "logs", &name, "-c", "c"])
            .is_some_and(|l| l == "hello from nodelet\n")
    });
    // attach: the container's output as it comes.
    let mut attach = Command::new("kubectl")
        .args([
            "--kubeconfig",
            ADMIN,
            "-n",
            "default",
            "attach",
            &name,
            "-c",
            "ticker",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(attach.stdout.take().unwrap()),
        &mut first,
    )
    .unwrap();
    let _ = attach.kill();
    let _ = attach.wait();
    assert_eq!(first, "tick\n");
    // exec -it: the command gets a terminal (kubectl itself under a pseudo-terminal).
    let tty = Command::new("script")
        .args(["-qec"])
        .arg(format!(
            "kubectl --kubeconfig {ADMIN} -n default exec -it {name} -c c -- tty"
        ))
        .arg("/dev/null")
        .output()
        .unwrap();
    let tty_out = String::from_utf8_lossy(&tty.stdout);
    assert!(tty_out.contains("/dev/pts/"), "{tty_out:?}");
    let out = Command::new("kubectl")
        .args([
            "--kubeconfig",
            ADMIN,
            "-n",
            "default",
            "exec",
            &name,
            "-c",
            "c",
            "--",
        ])
        .args(["sh", "-c", "echo $((6 * 7)); echo oops >&2; exit 3"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "42\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("oops"));
    assert_eq!(out.status.code(), Some(3), "the command's exit status");
    // port-forward: a local port to the pod's 8080, through the node API's relay.
    let local = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut forward = Command::new("kubectl")
        .args([
            "--kubeconfig",
            ADMIN,
            "-n",
            "default",
            "port-forward",
            &name,
        ])
        .arg(format!("{local}:8080"))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut page = String::new();
    wait_until(
        Duration::from_secs(20),
        "the page through port-forward",
        || {
            page = reqwest::blocking::get(format!("http://127.0.0.1:{local}/"))
                .and_then(|r| r.text())
                .unwrap_or_default();
            page == "served by the pod\n"
        },
    );
    let _ = forward.kill();
    let _ = forward.wait();
    let pods = kubectl(&["get", "--raw", &format!("/api/v1/nodes/{node}/proxy/pods")]).unwrap();
    assert!(pods.contains(&name), "{pods}");
    // A user of the cluster CA whom RBAC gives nothing: the node asks the API server, which
    // says no, and the answer is kubelet's 403.
    let dir = tempfile::tempdir().unwrap();
    let pki = Path::new("/var/lib/nodelet-env/cluster/pki");
    let sh = format!(
        "set -e; cd {d}; openssl req -new -newkey rsa:2048 -nodes -keyout u.key -subj /CN=nobody -out u.csr 2>/dev/null; printf 'extendedKeyUsage=clientAuth\\n' > u.ext; openssl x509 -req -in u.csr -CA {p}/ca.crt -CAkey {p}/ca.key -CAserial u.srl -CAcreateserial -days 1 -extfile u.ext -out u.crt 2>/dev/null",
        d = dir.path().display(),
        p = pki.display()
    );
    assert!(Command::new("sh")
        .args(["-c", &sh])
        .status()
        .unwrap()
        .success());
    let mut pem = std::fs::read(dir.path().join("u.crt")).unwrap();
    pem.extend(std::fs::read(dir.path().join("u.key")).unwrap());
    let nobody = reqwest::blocking::Client::builder()
        .danger_accept_invalid_certs(true)
        .identity(reqwest::Identity::from_pem(&pem).unwrap())
        .build()
        .unwrap();
    let r = nobody
        .get(format!("https://127.0.0.1:{}/pods", n.api_port))
        .send()
        .unwrap();
    assert_eq!(r.status(), 403);
    assert_eq!(
        r.text().unwrap(),
        "Forbidden (user=nobody, verb=get, resource=nodes, subresource(s)=[pods proxy])\n"
    );
    // A bearer token the API server vouches for (TokenReview): authenticated as its user, then
    // refused by RBAC; a token it does not know: 401.
    let token = std::fs::read_to_string(pki.join("tokens.csv"))
        .unwrap()
        .split(',')
        .next()
        .unwrap()
        .to_owned();
    let anon = reqwest::blocking::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let with = |t: &str| {
        let r = anon
            .get(format!("https://127.0.0.1:{}/pods", n.api_port))
            .bearer_auth(t)
            .send()
            .unwrap();
        (r.status().as_u16(), r.text().unwrap())
    };
    assert_eq!(
        with(&token),
        (
            403,
            "Forbidden (user=token-user, verb=get, resource=nodes, subresource(s)=[pods proxy])\n"
                .to_string()
        )
    );
    assert_eq!(with("not-a-token"), (401, "Unauthorized".to_string()));
    leave(n, &name);
}

/// Usage through the API server's node proxy, as `kubectl top` and metrics-server read it: a
/// container holding 64 MiB in a memory-backed emptyDir shows that working set (within 5 % of its
/// pod cgroup's own figure), a busy container about a core; `kubectl logs --previous` and
/// `--tail`, and `exec -i` with stdin.
#[test]
fn usage_and_logs_through_the_api_servers_node_proxy() {
    let Some((n, node)) = joined_with_node_api("nodeproxy", "") else {
        return;
    };
    let name = format!("use-{node}");
    apply_api_pod(
        &name,
        &node,
        "  terminationGracePeriodSeconds: 1\n  volumes: [{name: mem, emptyDir: {medium: Memory, sizeLimit: 128Mi}}]\n  containers:\n  - {name: fill, image: busybox:1.36, command: [sh, -c, 'dd if=/dev/zero of=/mem/fill bs=1M count=64 2>/dev/null; sleep 3600'], volumeMounts: [{name: mem, mountPath: /mem}]}\n  - {name: busy, image: busybox:1.36, command: [sh, -c, 'while true; do :; done']}\n  - {name: bump, image: busybox:1.36, command: [sh, -c, 'echo run $(ls /mem | wc -l); touch /mem/run$RANDOM; sleep 1; exit 1'], volumeMounts: [{name: mem, mountPath: /mem}]}\n",
    );
    wait_api_pod_running(&name);
    let uid = jsonpath("pod", &name, Some("default"), "{.metadata.uid}").unwrap();
    let raw = |path: &str| kubectl(&["get", "--raw", &format!("/api/v1/nodes/{node}/proxy{path}")]);
    let summary = || -> serde_json::Value {
        serde_json::from_str(&raw("/stats/summary").unwrap_or_default()).unwrap_or_default()
    };
    let ours = |s: &serde_json::Value| {
        s["pods"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["podRef"]["uid"] == uid.as_str())
            .cloned()
            .unwrap_or_default()
    };
    let container = |p: &serde_json::Value, c: &str| {
        p["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|x| x["name"] == c)
            .cloned()
            .unwrap_or_default()
    };
    wait_until(Duration::from_secs(30), "64 MiB held", || {
        container(&ours(&summary()), "fill")["memory"]["workingSetBytes"]
            .as_u64()
            .unwrap_or(0)
            >= 64 << 20
    });
    // The pod's working set against its pod cgroup's, read right after.
    let p = ours(&summary());
    let memcg = common::pod_cgroup_dirs(&n.cgroup_root, &uid)
        .into_iter()
        .find(|d| d.join("memory.usage_in_bytes").exists() || d.join("memory.current").exists())
        .unwrap();
    let file = nodelet::eviction::signals::working_set_any(&memcg).unwrap() as f64;
    let reported = p["memory"]["workingSetBytes"].as_f64().unwrap();
    assert!(
        (reported - file).abs() <= 0.05 * file,
        "reported {reported}, the pod cgroup's {file}"
    );
    // The busy container: its cpu time grows as its own cgroup's does, about a core (less when
    // the machine's two cores are shared with other tests).
    let cpu = |p: &serde_json::Value| {
        container(p, "busy")["cpu"]["usageCoreNanoSeconds"]
            .as_f64()
            .unwrap_or(0.0)
    };
    let busy_id = n
        .runtime
        .containers(&uid)
        .into_iter()
        .find(|c| c.metadata.as_ref().is_some_and(|m| m.name == "busy"))
        .unwrap()
        .id;
    let dirs: Vec<_> = common::pod_cgroup_dirs(&n.cgroup_root, &uid)
        .into_iter()
        .map(|d| d.join(&busy_id))
        .collect();
    let cpuacct = dirs
        .iter()
        .find(|d| d.join("cpuacct.usage").exists())
        .or_else(|| dirs.iter().find(|d| d.join("cpu.stat").exists()))
        .unwrap()
        .clone();
    let own = || -> f64 {
        std::fs::read_to_string(cpuacct.join("cpuacct.usage"))
            .map(|s| s.trim().parse::<f64>().unwrap())
            .unwrap_or_else(|_| {
                let stat = std::fs::read_to_string(cpuacct.join("cpu.stat")).unwrap();
                stat.lines()
                    .find_map(|l| l.strip_prefix("usage_usec "))
                    .unwrap()
                    .trim()
                    .parse::<f64>()
                    .unwrap()
                    * 1000.0
            })
    };
    let (t0, c0, f0) = (Instant::now(), cpu(&ours(&summary())), own());
    std::thread::sleep(Duration::from_secs(3));
    let (c1, f1, dt) = (cpu(&ours(&summary())), own(), t0.elapsed().as_secs_f64());
    let (reported, cgroup) = ((c1 - c0) / 1e9 / dt, (f1 - f0) / 1e9 / dt);
    eprintln!("busy container: {reported:.2} cores reported, {cgroup:.2} by its cgroup");
    assert!(cgroup > 0.3, "{cgroup} cores: not busy");
    assert!(
        (reported - cgroup).abs() <= 0.15,
        "{reported} cores reported, {cgroup} by its cgroup"
    );
    let metrics = raw("/metrics/resource").unwrap();
    assert!(
        metrics.lines().any(|l| l.starts_with(&format!(
            "container_memory_working_set_bytes{{container=\"fill\",namespace=\"default\",pod=\"{name}\"}}"
        ))),
        "{metrics}"
    );
    // logs --previous and --tail of the container that restarts.
    wait_until(Duration::from_secs(60), "a previous instance", || {
        jsonpath(
            "pod",
            &name,
            Some("default"),
            "{.status.containerStatuses[?(@.name==\"bump\")].restartCount}",
        )
        .and_then(|c| c.parse::<u32>().ok())
        .is_some_and(|c| c >= 1)
    });
    let previous = kubectl(&["-n", "default", "logs", &name, "-c", "bump", "--previous"]).unwrap();
    assert!(previous.starts_with("run "), "{previous:?}");
    let tail = kubectl(&["-n", "default", "logs", &name, "-c", "fill", "--tail=1"]).unwrap();
    assert_eq!(tail, "", "fill writes nothing");
    // exec -i: stdin reaches the command.
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .args([
            "--kubeconfig",
            ADMIN,
            "-n",
            "default",
            "exec",
            "-i",
            &name,
            "-c",
            "fill",
            "--",
            "wc",
            "-c",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"twelve bytes")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "12");
    leave(n, &name);
}

/// `kubectl logs -f` goes on across log rotation (forced every 2 KiB, checked every 300 ms):
/// every line once, in order (kubelet's own follow stops at a rotation).
#[test]
fn kubectl_logs_follow_goes_on_across_rotation() {
    let Some((n, node)) = joined_with_node_api(
        "logsfollow",
        "containerLogMaxSize: 2Ki\ncontainerLogMonitorInterval: 300ms\n",
    ) else {
        return;
    };
    let name = format!("chatty-{node}");
    apply_api_pod(
        &name,
        &node,
        "  terminationGracePeriodSeconds: 1\n  containers:\n  - {name: c, image: busybox:1.36, command: [sh, -c, 'sleep 8; i=0; while [ $i -lt 300 ]; do echo line $i; i=$((i+1)); sleep 0.02; done; echo done; sleep 3600']}\n",
    );
    wait_api_pod_running(&name);
    let mut follow = Command::new("kubectl")
        .args(["--kubeconfig", ADMIN, "-n", "default", "logs", "-f", &name])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = follow.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            let done = line == "done";
            if tx.send(line).is_err() || done {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while lines.last().map(String::as_str) != Some("done") {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => lines.push(l),
            Err(_) => panic!(
                "the follow stopped after {} lines: {:?}",
                lines.len(),
                lines.last()
            ),
        }
    }
    let _ = follow.kill();
    let _ = follow.wait();
    let want: Vec<String> = (0..300)
        .map(|i| format!("line {i}"))
        .chain(["done".to_string()])
        .collect();
    assert_eq!(lines, want, "every line once, in order");
    // The log was rotated meanwhile (the rotated files kept are in the container's directory).
    let uid = jsonpath("pod", &name, Some("default"), "{.metadata.uid}").unwrap();
    let dir = n.logs().join(format!("default_{name}_{uid}")).join("c");
    let rotated = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("0.log."))
        .count();
    assert!(rotated >= 1, "no rotation in {}", dir.display());
    leave(n, &name);
}

#[test]
fn a_pod_from_the_api_runs_reports_its_status_and_is_deleted_within_its_grace() {
    let Some((mut n, node)) = joined("apipods", "") else {
        return;
    };
    let name = format!("api-{node}");
    // No controller manager mints service account tokens: the pod does without one.
    apply_api_pod(
        &name,
        &node,
        "  terminationGracePeriodSeconds: 3\n  containers:\n  - {name: c, image: busybox:1.36, command: [sleep, '3600']}\n",
    );
    let pod = |path: &str| jsonpath("pod", &name, Some("default"), path);
    wait_until(Duration::from_secs(30), "the API pod Running", || {
        pod("{.status.phase}").is_some_and(|p| p == "Running")
    });
    let uid = pod("{.metadata.uid}").unwrap();
    let containers = n.runtime.containers(&uid);
    assert_eq!(containers.len(), 1, "one container in the runtime");
    let ip = pod("{.status.podIP}").unwrap();
    assert!(ip.starts_with("10.88."), "podIP {ip}");
    assert!(
        pod("{.status.containerStatuses[0].state.running.startedAt}")
            .is_some_and(|t| !t.is_empty())
    );
    assert_eq!(
        pod("{.status.containerStatuses[0].ready}").as_deref(),
        Some("true")
    );
    // imageID in kubelet's form for containerd: the repository digest.
    let image_id = pod("{.status.containerStatuses[0].imageID}").unwrap();
    assert!(
        image_id.starts_with("docker.io/library/busybox@sha256:"),
        "{image_id}"
    );
    // Its events reach the API, about the pod (its UID), from the kubelet on this node.
    let by_uid = format!("involvedObject.uid={uid}");
    wait_until(
        Duration::from_secs(20),
        "the pod's Started event in the API",
        || events(&by_uid, "{.items[*].reason}").contains("Started"),
    );
    assert!(
        events(&by_uid, "{.items[*].source.host}").contains(&node),
        "source.host is the node"
    );
    // kubelet's events of the container's start, each about the container: `kubectl get
    // events` shows its field path as the SUBOBJECT.
    let started = |reason: &str| {
        events(
            &format!("{by_uid},reason={reason}"),
            "{.items[*].involvedObject.fieldPath}",
        )
    };
    for reason in ["Pulled", "Created", "Started"] {
        assert_eq!(started(reason), "spec.containers{c}", "{reason}");
    }

    // Deleted: stopped within its 3 s grace (sleep ignores SIGTERM: killed at the grace), then
    // the object is gone.
    let t0 = Instant::now();
    kubectl(&["-n", "default", "delete", "pod", &name, "--wait=false"]).unwrap();
    wait_until(Duration::from_secs(20), "the API pod deleted", || {
        pod("{.metadata.name}").is_none()
    });
    let took = t0.elapsed();
    eprintln!("kubectl delete to the object gone: {took:?}");
    assert!(
        took >= Duration::from_millis(2500) && took < Duration::from_secs(3 + 5),
        "{took:?}: not stopped with its 3 s grace"
    );
    assert!(
        n.runtime.sandboxes(&uid).is_empty(),
        "nothing of it left in the runtime"
    );

    // A volume kind nodelet does not implement: never run, Failed with the field named.
    let bad = format!("nfs-{node}");
    apply_api_pod(
        &bad,
        &node,
        "  containers:\n  - {name: c, image: busybox:1.36, command: [sleep, '3600'], volumeMounts: [{name: v, mountPath: /v}]}\n  volumes:\n  - {name: v, nfs: {server: 127.0.0.1, path: /x}}\n",
    );
    let badpod = |path: &str| jsonpath("pod", &bad, Some("default"), path);
    wait_until(Duration::from_secs(20), "the nfs pod Failed", || {
        badpod("{.status.phase}").is_some_and(|p| p == "Failed")
    });
    assert_eq!(
        badpod("{.status.reason}").as_deref(),
        Some("UnsupportedPodSpec")
    );
    let message = badpod("{.status.message}").unwrap();
    assert!(message.contains("volumes"), "{message}");
    let bad_uid = badpod("{.metadata.uid}").unwrap();
    assert!(n.runtime.sandboxes(&bad_uid).is_empty(), "never run");
    // And a Warning event of that reason about the pod, as kubelet's `rejectPod` records.
    wait_until(Duration::from_secs(20), "the refusal's event", || {
        events(
            &format!("involvedObject.uid={bad_uid},reason=UnsupportedPodSpec"),
            "{.items[*].message}",
        )
        .contains("volumes")
    });
    // Deleted: never run, so deleted from the API at once.
    kubectl(&["-n", "default", "delete", "pod", &bad, "--wait=false"]).unwrap();
    wait_until(Duration::from_secs(10), "the refused pod deleted", || {
        badpod("{.metadata.name}").is_none()
    });
    n.kill9();
    delete_node(&node);
}

#[test]
fn an_unreachable_apiserver_is_retried_with_back_off_and_static_pods_run() {
    let Some(mut n) = cluster_nodelet("unreachable", "") else {
        return;
    };
    // The admin kubeconfig pointed at a closed port.
    let text = std::fs::read_to_string(ADMIN)
        .unwrap()
        .replace("https://127.0.0.1:16443", "https://127.0.0.1:1");
    let kubeconfig = n.dir.path().join("closed.kubeconfig");
    std::fs::write(&kubeconfig, text).unwrap();
    n.extra_args = vec!["--kubeconfig".into(), kubeconfig.display().to_string()];
    n.write_manifest(
        "s.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: s}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {name: c, image: busybox:1.36, command: [sleep, '3600']}\n",
    );
    n.start();
    let uid = n.uid("s");
    n.wait_running(&uid, &["c"], Duration::from_secs(60));
    // Ten seconds of retries (housekeeping waits for the API source, so no pass marks time):
    // a handful of lines, not a flood (without back-off: thousands a second).
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        let lines = n.log().lines().count();
        assert!(
            lines < 400,
            "{lines} log lines with the apiserver unreachable"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(n.log().contains("API pod source: watch failed"));
}

/// Compacts etcd (scripts/env/cluster.sh's, on 127.0.0.1:22379) at its current revision, through
/// its v3 JSON gateway: every older resource version expires.
fn compact_etcd() {
    let post = |path: &str, body: &str| {
        let out = Command::new("curl")
            .args([
                "-sf",
                "-X",
                "POST",
                &format!("http://127.0.0.1:22379/v3/{path}"),
            ])
            .args(["-d", body])
            .output()
            .unwrap();
        assert!(out.status.success(), "etcd {path}");
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let revision = post("kv/range", r#"{"key":"AA=="}"#)["header"]["revision"]
        .as_str()
        .unwrap()
        .to_owned();
    post(
        "kv/compaction",
        &format!(r#"{{"revision":"{revision}","physical":true}}"#),
    );
}

/// One more kube-apiserver on `port` (same etcd) for a test to stop and start without
/// disturbing the other tests' apiserver; stopped when dropped.
struct OwnApiserver(u16);

impl OwnApiserver {
    fn start(port: u16) -> Self {
        Self::run("apiserver-start", port);
        OwnApiserver(port)
    }

    fn run(verb: &str, port: u16) {
        let out = Command::new("bash")
            .arg(repo().join("scripts/env/cluster.sh"))
            .args([verb, &port.to_string()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cluster.sh {verb} {port}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn stop(&self) {
        Self::run("apiserver-stop", self.0);
    }

    fn resume(&self) {
        Self::run("apiserver-start", self.0);
    }
}

impl Drop for OwnApiserver {
    fn drop(&mut self) {
        self.stop();
    }
}

#[test]
fn the_apiserver_stopped_for_30_s_restarts_nothing_and_status_catches_up_within_10_s() {
    let Some(mut n) = joining_nodelet("apiserver-down", "") else {
        return;
    };
    let node = n.node.clone();
    // nodelet talks to its own apiserver only; kubectl to the shared one (same etcd).
    let kubeconfig = n.extra_args[1].clone();
    let text = std::fs::read_to_string(&kubeconfig)
        .unwrap()
        .replace("https://127.0.0.1:16443", "https://127.0.0.1:16444");
    let own_kubeconfig = n.dir.path().join("own.kubeconfig");
    std::fs::write(&own_kubeconfig, text).unwrap();
    n.extra_args[1] = own_kubeconfig.display().to_string();
    // Its apiserver is not up yet when nodelet starts: the static pod runs anyway, and the node
    // registers once the apiserver answers.
    OwnApiserver::run("apiserver-stop", 16444);
    n.write_manifest(
        "s.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: s}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {name: c, image: busybox:1.36, command: [sleep, '3600']}\n",
    );
    n.start();
    let static_uid = n.uid("s");
    n.wait_running(&static_uid, &["c"], Duration::from_secs(60));
    let own = OwnApiserver::start(16444);
    wait_until(Duration::from_secs(20), "the node registered", || {
        jsonpath("node", &node, None, "{.metadata.name}").is_some()
    });

    let long = format!("long-{node}");
    let brief = format!("brief-{node}");
    // `brief` ends by itself 15 s after it starts: while the apiserver is down.
    for (name, policy, command) in [
        (&long, "Always", "[sleep, '3600']"),
        (&brief, "Never", "[sleep, '15']"),
    ] {
        apply_api_pod(
            name,
            &node,
            &format!("  restartPolicy: {policy}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: c, image: busybox:1.36, command: {command}}}\n"),
        );
    }
    let phase = |name: &str| jsonpath("pod", name, Some("default"), "{.status.phase}");
    wait_until(Duration::from_secs(30), "both API pods Running", || {
        phase(&long).as_deref() == Some("Running") && phase(&brief).as_deref() == Some("Running")
    });
    let uid = |name: &str| jsonpath("pod", name, Some("default"), "{.metadata.uid}").unwrap();
    let (long_uid, brief_uid) = (uid(&long), uid(&brief));
    let ids = |uid: &str| {
        let mut v: Vec<String> = n
            .runtime
            .containers(uid)
            .into_iter()
            .map(|c| c.id)
            .collect();
        v.sort();
        v
    };
    let long_before = ids(&long_uid);
    assert_eq!(long_before.len(), 1);
    let static_before = ids(&static_uid);

    own.stop();
    let stopped = Instant::now();
    // While it is down: `brief` completes on the node, its status waits.
    let on_node = |name: &str| n.pods().into_iter().find(|p| p["metadata"]["name"] == name);
    wait_until(
        Duration::from_secs(30),
        "brief Succeeded on the node",
        || on_node(&brief).is_some_and(|p| p["status"]["phase"] == "Succeeded"),
    );
    assert_eq!(phase(&brief).as_deref(), Some("Running"), "not posted yet");
    // A pod created meanwhile (through the other apiserver), then etcd compacted: nodelet's
    // watch resource version is gone when it comes back, so it must list again.
    let late = format!("late-{node}");
    apply_api_pod(
        &late,
        &node,
        "  terminationGracePeriodSeconds: 1\n  containers:\n  - {name: c, image: busybox:1.36, command: [sleep, '3600']}\n",
    );
    compact_etcd();
    while stopped.elapsed() < Duration::from_secs(30) {
        assert!(
            n.get("/healthz").is_some_and(|b| b == "ok"),
            "nodelet stays up"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    own.resume();
    let back = Instant::now();
    eprintln!("apiserver down for {:?}", back - stopped);
    timed_wait(
        Duration::from_secs(10),
        "brief Succeeded in the API (status caught up) after the apiserver was ready",
        back,
        || phase(&brief).as_deref() == Some("Succeeded"),
    );
    assert_eq!(ids(&long_uid), long_before, "no container replaced");
    assert_eq!(ids(&static_uid), static_before, "the static pod's neither");
    assert_eq!(
        jsonpath(
            "pod",
            &long,
            Some("default"),
            "{.status.containerStatuses[0].restartCount}"
        )
        .as_deref(),
        Some("0")
    );
    assert_eq!(
        ids(&brief_uid).len(),
        1,
        "brief ran once (restartPolicy Never)"
    );
    timed_wait(
        Duration::from_secs(20),
        "the pod created meanwhile Running after the apiserver was ready",
        back,
        || phase(&late).as_deref() == Some("Running"),
    );
    assert!(
        n.log().contains("re-listed"),
        "the expired watch was listed again"
    );
    assert_eq!(
        on_node(&long).unwrap()["status"]["containerStatuses"][0]["restartCount"],
        0
    );
    for name in [&long, &brief, &late] {
        let _ = kubectl(&["-n", "default", "delete", "pod", name, "--wait=false"]);
    }
    wait_until(Duration::from_secs(20), "the API pods deleted", || {
        phase(&long).is_none() && phase(&brief).is_none() && phase(&late).is_none()
    });
    // The static pod's manifest removed: its mirror goes with it.
    std::fs::remove_file(n.manifests().join("s.yaml")).unwrap();
    let mirror = format!("s-{node}");
    wait_until(Duration::from_secs(20), "the mirror pod deleted", || {
        phase(&mirror).is_none()
    });
    n.kill9();
    delete_node(&node);
}

#[test]
fn an_api_pod_reads_its_config_map_and_secret_from_the_apiserver_and_follows_edits() {
    let Some((mut n, node)) = joined("apiobjects", "") else {
        return;
    };
    let (cm, secret, pod, waiting) = (
        format!("cfg-{node}"),
        format!("sec-{node}"),
        format!("uses-{node}"),
        format!("waits-{node}"),
    );
    kubectl_apply(&format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {cm}, namespace: default}}\ndata: {{greeting: hello}}\n---\napiVersion: v1\nkind: Secret\nmetadata: {{name: {secret}, namespace: default}}\nstringData: {{password: s3cret}}\n"
    ));
    let spec = |name: &str, cm: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  nodeName: {node}\n  automountServiceAccountToken: false\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [sleep, '3600']\n    env: [{{name: PASSWORD, valueFrom: {{secretKeyRef: {{name: {secret}, key: password}}}}}}]\n    volumeMounts: [{{name: cfg, mountPath: /etc/cfg}}]\n  volumes:\n  - {{name: cfg, configMap: {{name: {cm}}}}}\n"
        )
    };
    kubectl_apply(&spec(&pod, &cm));
    let phase = |name: &str| jsonpath("pod", name, Some("default"), "{.status.phase}");
    wait_until(Duration::from_secs(30), "the pod Running", || {
        phase(&pod).as_deref() == Some("Running")
    });
    let uid = jsonpath("pod", &pod, Some("default"), "{.metadata.uid}").unwrap();
    let id = n.runtime.containers(&uid)[0].id.clone();
    let sh = |cmd: &str| n.runtime.exec(&id, &["sh", "-c", cmd]).1.trim().to_owned();
    assert_eq!(sh("cat /etc/cfg/greeting"), "hello");
    assert_eq!(sh("echo $PASSWORD"), "s3cret");
    // An edit reaches the volume through the watch.
    let t0 = Instant::now();
    kubectl(&[
        "-n",
        "default",
        "patch",
        "configmap",
        &cm,
        "--type=merge",
        "-p",
        r#"{"data":{"greeting":"bye"}}"#,
    ])
    .unwrap();
    timed_wait(
        Duration::from_secs(20),
        "the edited ConfigMap in the volume after the edit",
        t0,
        || sh("cat /etc/cfg/greeting") == "bye",
    );

    // A pod whose ConfigMap does not exist yet waits for it, then starts.
    let missing = format!("later-{node}");
    kubectl_apply(&spec(&waiting, &missing));
    wait_until(Duration::from_secs(20), "the waiting pod's reason", || {
        jsonpath(
            "pod",
            &waiting,
            Some("default"),
            "{.status.containerStatuses[0].state.waiting.reason}",
        )
        .is_some_and(|r| r == "ContainerCreating" || r == "CreateContainerConfigError")
    });
    let waiting_uid = jsonpath("pod", &waiting, Some("default"), "{.metadata.uid}").unwrap();
    assert!(n.runtime.containers(&waiting_uid).is_empty(), "held");
    kubectl_apply(&format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {missing}, namespace: default}}\ndata: {{greeting: late}}\n"
    ));
    wait_until(Duration::from_secs(30), "the waiting pod Running", || {
        phase(&waiting).as_deref() == Some("Running")
    });
    for name in [&pod, &waiting] {
        let _ = kubectl(&["-n", "default", "delete", "pod", name, "--wait=false"]);
    }
    wait_until(Duration::from_secs(20), "the pods deleted", || {
        phase(&pod).is_none() && phase(&waiting).is_none()
    });
    for (kind, name) in [
        ("configmap", &cm),
        ("configmap", &missing),
        ("secret", &secret),
    ] {
        let _ = kubectl(&["-n", "default", "delete", kind, name]);
    }
    n.kill9();
    delete_node(&node);
}

#[test]
fn an_evicted_api_pod_is_reported_failed_evicted_and_left_for_the_control_plane() {
    // As tests/eviction.rs: pods get 256 MiB, eviction below 96 MiB of it free.
    let config = format!(
        "systemReserved: {{memory: \"{}\"}}\nevictionHard: {{allocatableMemory.available: 96Mi}}\n",
        common::mem_total() - (256 << 20)
    );
    let Some((mut n, node)) = joined("apievict", &config) else {
        return;
    };
    let hog = format!("hog-{node}");
    // BestEffort, grows by 4 MiB every 100 ms.
    apply_api_pod(
        &hog,
        &node,
        "  terminationGracePeriodSeconds: 2\n  containers:\n  - name: hog\n    image: busybox:1.36\n    command: [sh, -c, \"while true; do head -c 4194304 /dev/zero; sleep 0.1; done | tail\"]\n",
    );
    let get = |path: &str| jsonpath("pod", &hog, Some("default"), path);
    wait_until(
        Duration::from_secs(90),
        "the hog Failed/Evicted in the API",
        || {
            get("{.status.phase}").as_deref() == Some("Failed")
                && get("{.status.reason}").as_deref() == Some("Evicted")
        },
    );
    let message = get("{.status.message}").unwrap();
    assert!(
        message.starts_with("The node was low on resource: memory."),
        "{message}"
    );
    // Left for the control plane: still there a while later, still Failed.
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        assert_eq!(get("{.status.phase}").as_deref(), Some("Failed"));
        std::thread::sleep(Duration::from_millis(500));
    }
    let uid = get("{.metadata.uid}").unwrap();
    assert!(
        n.runtime
            .containers(&uid)
            .iter()
            .all(|c| c.state != nodelet::cri::api::ContainerState::ContainerRunning as i32),
        "nothing of it runs"
    );
    // Deleted by hand (the control plane's garbage collection): gone.
    kubectl(&["-n", "default", "delete", "pod", &hog, "--wait=false"]).unwrap();
    wait_until(Duration::from_secs(20), "the evicted pod deleted", || {
        get("{.metadata.name}").is_none()
    });
    n.kill9();
    delete_node(&node);
}

/// Service environment variables (kubelet's `getServiceEnvVarMap` and `envvars.FromServices`):
/// an API pod's container gets the master service's (`KUBERNETES_SERVICE_HOST` and its kin, by
/// which in-cluster clients find the API server) and those of every Service of its namespace;
/// with `enableServiceLinks: false` only the master service's. Values as the API server has
/// them (cluster IPs read with kubectl).
#[test]
fn api_pods_get_the_service_variables_kubelet_gives() {
    let Some((mut n, node)) = joined("svcenv", "") else {
        return;
    };
    let svc = format!("web-{node}");
    kubectl_apply(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {svc}, namespace: default}}\nspec:\n  selector: {{app: none}}\n  ports:\n  - {{name: http-alt, port: 8080, protocol: TCP}}\n"
    ));
    let (links, no_links) = (format!("links-{node}"), format!("nolinks-{node}"));
    for (name, enable) in [(&links, true), (&no_links, false)] {
        apply_api_pod(
            name,
            &node,
            &format!("  enableServiceLinks: {enable}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [sleep, '3600']\n    env: [{{name: API, value: 'https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)'}}]\n"),
        );
    }
    wait_api_pod_running(&links);
    wait_api_pod_running(&no_links);
    let master_ip = jsonpath(
        "service",
        "kubernetes",
        Some("default"),
        "{.spec.clusterIP}",
    )
    .unwrap();
    let svc_ip = jsonpath("service", &svc, Some("default"), "{.spec.clusterIP}").unwrap();
    let env_of = |pod: &str| -> std::collections::BTreeMap<String, String> {
        let uid = jsonpath("pod", pod, Some("default"), "{.metadata.uid}").unwrap();
        let id = n.runtime.containers(&uid)[0].id.clone();
        let (code, out) = n.runtime.exec(&id, &["env"]);
        assert_eq!(code, 0, "{out}");
        out.lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    };
    let stem = svc.replace('-', "_").to_uppercase();
    let with = env_of(&links);
    let get = |env: &std::collections::BTreeMap<String, String>, k: &str| env.get(k).cloned();
    assert_eq!(
        get(&with, "KUBERNETES_SERVICE_HOST"),
        Some(master_ip.clone())
    );
    assert_eq!(
        get(&with, "KUBERNETES_SERVICE_PORT").as_deref(),
        Some("443")
    );
    assert_eq!(
        get(&with, "KUBERNETES_SERVICE_PORT_HTTPS").as_deref(),
        Some("443")
    );
    assert_eq!(
        get(&with, "KUBERNETES_PORT_443_TCP"),
        Some(format!("tcp://{master_ip}:443"))
    );
    assert_eq!(get(&with, "API"), Some(format!("https://{master_ip}:443")));
    assert_eq!(
        get(&with, &format!("{stem}_SERVICE_HOST")),
        Some(svc_ip.clone())
    );
    assert_eq!(
        get(&with, &format!("{stem}_SERVICE_PORT_HTTP_ALT")).as_deref(),
        Some("8080")
    );
    assert_eq!(
        get(&with, &format!("{stem}_PORT")),
        Some(format!("tcp://{svc_ip}:8080"))
    );
    let without = env_of(&no_links);
    assert_eq!(get(&without, "KUBERNETES_SERVICE_HOST"), Some(master_ip));
    assert_eq!(
        get(&without, &format!("{stem}_SERVICE_HOST")),
        None,
        "{without:?}"
    );
    for pod in [&links, &no_links] {
        let _ = kubectl(&["-n", "default", "delete", "pod", pod, "--wait=false"]);
    }
    let _ = kubectl(&["-n", "default", "delete", "service", &svc]);
    wait_until(Duration::from_secs(20), "the pods deleted", || {
        jsonpath("pod", &links, Some("default"), "{.status.phase}").is_none()
            && jsonpath("pod", &no_links, Some("default"), "{.status.phase}").is_none()
    });
    n.kill9();
    delete_node(&node);
}

/// Projected service account tokens (kubelet's token manager and projected volume): an API pod's
/// `serviceAccountToken` source is a token the API server issued for the pod's ServiceAccount,
/// bound to the pod (its name and UID), with the source's audience and lifetime, and the API
/// server's TokenReview accepts it; the volume's other sources are written beside it.
#[test]
fn an_api_pod_gets_a_service_account_token_bound_to_it() {
    use base64::Engine;
    let Some((n, node)) = joined("satoken", "") else {
        return;
    };
    let name = format!("tok-{node}");
    apply_api_pod(
        &name,
        &node,
        "  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [sleep, '3600']\n    volumeMounts: [{name: api, mountPath: /var/run/secrets/tokens}]\n  volumes:\n  - name: api\n    projected:\n      sources:\n      - serviceAccountToken: {path: token, audience: nodelet-test, expirationSeconds: 600}\n      - downwardAPI: {items: [{path: namespace, fieldRef: {fieldPath: metadata.namespace}}]}\n",
    );
    wait_api_pod_running(&name);
    let uid = jsonpath("pod", &name, Some("default"), "{.metadata.uid}").unwrap();
    let id = n.runtime.containers(&uid)[0].id.clone();
    let cat = |f: &str| {
        let (code, out) = n.runtime.exec(&id, &["cat", f]);
        assert_eq!(code, 0, "{f}: {out}");
        out.trim().to_owned()
    };
    assert_eq!(cat("/var/run/secrets/tokens/namespace"), "default");
    let token = cat("/var/run/secrets/tokens/token");
    let payload = token.split('.').nth(1).expect("a JWT");
    let claims: serde_json::Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .unwrap(),
    )
    .unwrap();
    assert!(
        claims["aud"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x == "nodelet-test")),
        "{claims}"
    );
    let k8s = &claims["kubernetes.io"];
    assert_eq!(k8s["pod"]["name"], name.as_str(), "{claims}");
    assert_eq!(k8s["pod"]["uid"], uid.as_str(), "{claims}");
    assert_eq!(k8s["serviceaccount"]["name"], "default", "{claims}");
    assert_eq!(
        claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(),
        600,
        "{claims}"
    );
    // The API server takes it back as the pod's ServiceAccount.
    let out = kubectl_with_input(
        &["create", "-f", "-", "-o", "json"],
        &format!(
            "{{\"apiVersion\": \"authentication.k8s.io/v1\", \"kind\": \"TokenReview\", \"spec\": {{\"token\": \"{token}\", \"audiences\": [\"nodelet-test\"]}}}}"
        ),
    );
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["status"]["authenticated"], true, "{answer}");
    assert_eq!(
        answer["status"]["user"]["username"], "system:serviceaccount:default:default",
        "{answer}"
    );
    leave(n, &name);
}

/// An API pod's `imagePullSecrets`: the Secret `kubectl create secret docker-registry` makes,
/// read from the API server (the Node authorizer lets a node read the Secrets its pods name),
/// opens the environment's password-protected registry (`private.registry.test`,
/// scripts/env/up.sh), where the same pod without it is refused.
#[test]
fn an_api_pods_pull_secret_is_read_from_the_apiserver_and_pulls() {
    let Some((n, node)) = joined(
        "pullsecret",
        "imagePullBackOff: {initialPeriod: 1s, maxPeriod: 2s}\n",
    ) else {
        return;
    };
    let (secret, name, anonymous) = (
        format!("regcred-{node}"),
        format!("private-{node}"),
        format!("anonymous-{node}"),
    );
    kubectl(&[
        "-n",
        "default",
        "create",
        "secret",
        "docker-registry",
        &secret,
        "--docker-server=private.registry.test",
        "--docker-username=nodelet",
        "--docker-password=registry-pass",
    ])
    .unwrap();
    let spec = |secrets: &str| {
        format!("  terminationGracePeriodSeconds: 1\n  imagePullSecrets: [{secrets}]\n  containers:\n  - {{name: c, image: 'private.registry.test/library/busybox:1.36', imagePullPolicy: Always, command: [sleep, '3600']}}\n")
    };
    apply_api_pod(&name, &node, &spec(&format!("{{name: {secret}}}")));
    apply_api_pod(&anonymous, &node, &spec(""));
    wait_api_pod_running(&name);
    let uid = jsonpath("pod", &name, Some("default"), "{.metadata.uid}").unwrap();
    assert_eq!(n.runtime.containers(&uid).len(), 1);
    wait_until(
        Duration::from_secs(30),
        "the anonymous pull refused",
        || {
            jsonpath(
                "pod",
                &anonymous,
                Some("default"),
                "{.status.containerStatuses[0].state.waiting.message}",
            )
            .is_some_and(|m| m.contains("401 Unauthorized"))
        },
    );
    let _ = kubectl(&[
        "-n",
        "default",
        "delete",
        "pod",
        &anonymous,
        "--grace-period=0",
        "--force",
        "--wait=false",
    ]);
    let _ = kubectl(&["-n", "default", "delete", "secret", &secret]);
    leave(n, &name);
}

/// `kubectl debug --target` (as 1.20's kubectl makes it): the API server adds an ephemeral
/// container to the running pod; nodelet starts it in the target container's process namespace
/// (it sees the target's processes), reports it in `ephemeralContainerStatuses` and serves its
/// log (`kubectl logs -c`); the pod's own container is not restarted.
#[test]
fn kubectl_debug_adds_an_ephemeral_container_in_the_targets_process_namespace() {
    let Some((n, node)) = joined_with_node_api("debug", "") else {
        return;
    };
    let name = format!("debugged-{node}");
    apply_api_pod(
        &name,
        &node,
        "  terminationGracePeriodSeconds: 1\n  containers:\n  - {name: app, image: busybox:1.36, command: [sh, -c, 'exec sleep 3601']}\n",
    );
    wait_api_pod_running(&name);
    let uid = jsonpath("pod", &name, Some("default"), "{.metadata.uid}").unwrap();
    let app = n.runtime.containers(&uid)[0].id.clone();
    // What `kubectl debug --target=app` of the API server's own version (1.20) sends: the
    // pod's `ephemeralcontainers` subresource, an `EphemeralContainers` object (1.22 and later
    // take a Pod; kubectl 1.32 speaks only that, so the request is made here as 1.20's kubectl
    // makes it).
    let body = format!(
        r#"{{"apiVersion": "v1", "kind": "EphemeralContainers", "metadata": {{"name": "{name}", "namespace": "default"}}, "ephemeralContainers": [{{"name": "debugger", "image": "busybox:1.36", "targetContainerName": "app", "command": ["sh", "-c", "ps -o pid,args | tee /tmp/ps; exec sleep 3602"], "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"}}]}}"#
    );
    let out = kubectl_with_input(
        &[
            "replace",
            "--raw",
            &format!("/api/v1/namespaces/default/pods/{name}/ephemeralcontainers"),
            "-f",
            "-",
        ],
        &body,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    wait_until(
        Duration::from_secs(30),
        "the ephemeral container running",
        || {
            jsonpath(
                "pod",
                &name,
                Some("default"),
                "{.status.ephemeralContainerStatuses[0].state.running.startedAt}",
            )
            .is_some_and(|s| !s.is_empty())
        },
    );
    let containers = running_by_name(&n.runtime.containers(&uid));
    let debugger = containers["debugger"].id.clone();
    // It sees the target's process: one process namespace.
    let (_, ps) = n.runtime.exec(&debugger, &["cat", "/tmp/ps"]);
    assert!(ps.contains("sleep 3601"), "{ps}");
    assert_eq!(
        containers["app"].id, app,
        "the app container was not restarted"
    );
    // Its log, through the API server and the node API, as any container's.
    wait_until(Duration::from_secs(20), "kubectl logs -c debugger", || {
        kubectl(&["-n", "default", "logs", &name, "-c", "debugger"])
            .is_some_and(|l| l.contains("sleep 3601"))
    });
    assert_eq!(
        jsonpath(
            "pod",
            &name,
            Some("default"),
            "{.status.ephemeralContainerStatuses[0].name}"
        )
        .as_deref(),
        Some("debugger")
    );
    leave(n, &name);
}
