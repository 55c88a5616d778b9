//! The operator surface: metrics, the systemd unit and sd_notify, check-config, JSON logs.
//! The metrics and log tests need `scripts/env/up.sh`.
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

mod common;

use std::os::unix::net::UnixDatagram;
use std::process::Command;
use std::time::Duration;

use common::{wait_until, Nodelet};

const LOOP: &str = "[sh, -c, \"trap 'exit 0' TERM; while true; do sleep 1 & wait; done\"]";

fn manifest(name: &str) -> String {
    format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {{name: c, image: busybox:1.36, command: {LOOP}}}\n")
}

fn sample(
    scrape: &prometheus_parse::Scrape,
    name: &str,
    label: Option<(&str, &str)>,
) -> Option<f64> {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .find(|s| label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
        .map(|s| match &s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => *v,
            prometheus_parse::Value::Histogram(h) => h.iter().map(|b| b.count).fold(0.0, f64::max),
            prometheus_parse::Value::Summary(_) => f64::NAN,
        })
}

#[test]
fn metrics_parse_and_hold_kubelets_metrics_with_two_pods() {
    let mut n = Nodelet::new("metrics");
    n.start();
    n.write_manifest("a.yaml", &manifest("a"));
    n.write_manifest("b.yaml", &manifest("b"));
    for p in ["a", "b"] {
        let uid = n.uid(p);
        n.wait_running(&uid, &["c"], Duration::from_secs(30));
    }
    wait_until(Duration::from_secs(10), "running pods = 2", || {
        n.get("/metrics")
            .is_some_and(|m| m.contains("kubelet_running_pods 2"))
    });
    let text = n.get("/metrics").unwrap();
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .expect("Prometheus text parses");
    assert_eq!(sample(&scrape, "kubelet_running_pods", None), Some(2.0));
    assert_eq!(
        sample(
            &scrape,
            "kubelet_running_containers",
            Some(("container_state", "running"))
        ),
        Some(2.0)
    );
    assert!(sample(&scrape, "kubelet_pleg_relist_duration_seconds_count", None).unwrap() > 0.0);
    assert!(sample(&scrape, "kubelet_pleg_relist_interval_seconds_count", None).unwrap() > 0.0);
    assert_eq!(
        sample(&scrape, "kubelet_pleg_discard_events_total", None),
        Some(0.0)
    );
    assert!(
        sample(
            &scrape,
            "kubelet_runtime_operations_total",
            Some(("operation_type", "run_podsandbox"))
        )
        .unwrap()
            >= 2.0
    );
    assert!(
        sample(
            &scrape,
            "kubelet_runtime_operations_total",
            Some(("operation_type", "create_container"))
        )
        .unwrap()
            >= 2.0
    );
    assert!(
        sample(
            &scrape,
            "kubelet_runtime_operations_total",
            Some(("operation_type", "list_containers"))
        )
        .unwrap()
            > 2.0
    );
    assert!(
        sample(
            &scrape,
            "kubelet_runtime_operations_duration_seconds_count",
            Some(("operation_type", "start_container"))
        )
        .unwrap()
            >= 2.0
    );
    assert!(sample(&scrape, "kubelet_started_pods_total", None).unwrap() >= 2.0);
    assert!(sample(&scrape, "kubelet_started_containers_total", None).unwrap() >= 2.0);
    assert!(sample(&scrape, "kubelet_pod_start_duration_seconds_count", None).unwrap() >= 2.0);
    assert!(
        sample(
            &scrape,
            "kubelet_pod_worker_duration_seconds_count",
            Some(("operation_type", "sync"))
        )
        .unwrap()
            >= 2.0
    );
    assert!(
        sample(
            &scrape,
            "kubelet_cgroup_manager_duration_seconds_count",
            Some(("operation_type", "create"))
        )
        .unwrap()
            >= 2.0
    );
    assert_eq!(
        sample(
            &scrape,
            "nodelet_node_condition",
            Some(("condition", "MemoryPressure"))
        ),
        Some(0.0)
    );
    assert_eq!(
        sample(
            &scrape,
            "kubelet_evictions_total",
            Some(("eviction_signal", "memory.available"))
        ),
        Some(0.0)
    );
    let rss = sample(&scrape, "process_resident_memory_bytes", None).unwrap();
    assert!(rss > 1e6 && rss < 200e6, "RSS {rss}");
    assert!(sample(&scrape, "process_open_fds", None).unwrap() > 3.0);
    assert!(sample(&scrape, "process_cpu_seconds_total", None).unwrap() > 0.0);
}

#[test]
fn the_read_only_port_serves_the_same_endpoints_on_loopback() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut n = Nodelet::with_config("roport", &format!("readOnlyPort: {port}\n"));
    n.start();
    let body = reqwest::blocking::get(format!("http://127.0.0.1:{port}/metrics"))
        .unwrap()
        .text()
        .unwrap();
    assert!(body.contains("kubelet_running_pods"));
    // Not on the other interfaces (default address 127.0.0.1).
    let listening = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let hex = format!(":{port:04X} ");
    let line = listening
        .lines()
        .find(|l| l.contains(&hex) && l.split_whitespace().nth(3) == Some("0A"))
        .unwrap();
    assert!(
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .starts_with("0100007F:"),
        "bound to 127.0.0.1: {line}"
    );
}

#[test]
fn systemd_analyze_verifies_the_unit() {
    let dir = tempfile::tempdir().unwrap();
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/systemd/nodelet.service"
    ))
    .unwrap();
    // The unit names the installed binary; check it against this build's.
    let unit = unit.replace("/usr/local/bin/nodelet", env!("CARGO_BIN_EXE_nodelet"));
    assert!(
        unit.contains("Type=notify")
            && unit.contains("KillMode=process")
            && unit.contains("WatchdogSec=")
    );
    let path = dir.path().join("nodelet.service");
    std::fs::write(&path, unit).unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .expect("systemd-analyze (Debian package systemd)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stderr.contains("nodelet.service:"),
        "no complaint about the unit: {stderr}"
    );
}

#[test]
fn sd_notify_ready_and_watchdog_are_sent() {
    let mut n = Nodelet::new("notify");
    let sock = n.dir.path().join("notify.sock");
    let listener = UnixDatagram::bind(&sock).unwrap();
    listener
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    n.extra_env = vec![
        ("NOTIFY_SOCKET".into(), sock.display().to_string()),
        ("WATCHDOG_USEC".into(), "1000000".into()),
    ];
    n.start();
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    while !(got.iter().any(|m: &String| m.contains("READY=1"))
        && got.iter().any(|m| m.contains("WATCHDOG=1")))
    {
        let len = listener.recv(&mut buf).expect("a notification within 30s");
        got.push(String::from_utf8_lossy(&buf[..len]).into_owned());
    }
}

#[test]
fn check_config_prints_the_effective_config_and_refuses_broken_ones() {
    let out = Command::new(env!("CARGO_BIN_EXE_nodelet"))
        .args([
            "check-config",
            "--config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/config/nodelet.yaml"),
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_yaml::Value = serde_yaml::from_slice(&out.stdout).unwrap();
    assert_eq!(v["syncFrequency"].as_str(), Some("1m0s"));
    assert_eq!(v["healthzPort"].as_u64(), Some(10248));
    assert_eq!(
        v["cpuCFSQuotaPeriod"].as_str(),
        Some("100ms"),
        "defaults filled in"
    );
    assert_eq!(
        v["crashLoopBackOff"]["maxContainerRestartPeriod"].as_str(),
        Some("5m0s")
    );
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nhealthzPort: lots\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_nodelet"))
        .args(["check-config", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("healthzPort") && stderr.contains("lots"),
        "{stderr}"
    );
    // What start-up would refuse, check-config refuses too, naming the setting: a client CA
    // that is not there, Webhook authorization without an API server.
    let head = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
    let ca = dir.path().join("ca.crt");
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    std::fs::write(&ca, params.self_signed(&key).unwrap().pem()).unwrap();
    for (body, kubeconfig, want) in [
        (
            "authentication: {x509: {clientCAFile: /nonexistent/ca.crt}}\nauthorization: {mode: AlwaysAllow}\n".to_owned(),
            false,
            Some("authentication.x509.clientCAFile /nonexistent/ca.crt"),
        ),
        (
            format!("authentication: {{x509: {{clientCAFile: {}}}}}\nauthorization: {{mode: Webhook}}\n", ca.display()),
            false,
            Some("authorization.mode: Webhook"),
        ),
        (
            format!("authentication: {{x509: {{clientCAFile: {}}}}}\nauthorization: {{mode: Webhook}}\n", ca.display()),
            true,
            None,
        ),
        (
            "tlsMinVersion: VersionTLS13\ntlsCipherSuites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]\n".to_owned(),
            false,
            None,
        ),
    ] {
        let file = dir.path().join("api.yaml");
        std::fs::write(&file, format!("{head}{body}")).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_nodelet"));
        cmd.args(["check-config", "--config"]).arg(&file);
        if kubeconfig {
            cmd.args(["--kubeconfig", "/dev/null"]);
        }
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        match want {
            Some(w) => {
                assert_eq!(out.status.code(), Some(2), "{body}: {stderr}");
                assert!(stderr.contains(w), "{body}: {stderr}");
            }
            None => assert_eq!(out.status.code(), Some(0), "{body}: {stderr}"),
        }
    }
    let out = Command::new(env!("CARGO_BIN_EXE_nodelet"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("nodelet "));
}

#[test]
fn json_logs_carry_pod_namespace_and_uid_on_pod_start() {
    let mut n = Nodelet::new("jsonlog");
    n.extra_args = vec!["--log-format".into(), "json".into()];
    n.start();
    n.write_manifest(
        "a.yaml",
        &manifest("a").replace(
            "metadata: {name: a}",
            "metadata: {name: a, namespace: team-j}",
        ),
    );
    let uid = n.uid("a");
    n.wait_running(&uid, &["c"], Duration::from_secs(30));
    // The runtime shows the container running before StartContainer has returned to the pod
    // worker, which logs the start after it: the line is polled for.
    let started = || {
        n.log()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["message"] == "started container")
    };
    wait_until(
        Duration::from_secs(10),
        "a JSON line for the pod start",
        || started().is_some(),
    );
    let line = started().expect("the line just seen");
    let span = &line["span"];
    assert_eq!(
        span["pod"].as_str(),
        Some(format!("a-{}", n.node).as_str()),
        "{line}"
    );
    assert_eq!(span["namespace"].as_str(), Some("team-j"), "{line}");
    assert_eq!(span["uid"].as_str(), Some(uid.as_str()), "{line}");
    assert_eq!(line["container"].as_str(), Some("c"), "{line}");
}

#[test]
fn container_logs_are_rotated_by_size_and_count() {
    let mut n = Nodelet::with_config(
        "logrotate",
        "containerLogMaxSize: 2Ki\ncontainerLogMaxFiles: 3\ncontainerLogMonitorInterval: 300ms\n",
    );
    n.start();
    let chatty = "apiVersion: v1\nkind: Pod\nmetadata: {name: chatty}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {name: c, image: busybox:1.36, command: [sh, -c, \"trap 'exit 0' TERM; i=0; while true; do i=$((i+1)); echo line $i $(head -c 1500 /dev/zero | tr '\\\\0' x); sleep 0.2 & wait; done\"]}\n";
    n.write_manifest("c.yaml", chatty);
    let uid = n.uid("chatty");
    n.wait_running(&uid, &["c"], Duration::from_secs(30));
    let log = n
        .logs()
        .join(format!("default_chatty-{}_{uid}/c/0.log", n.node));
    let rotated = |l: &std::path::Path| nodelet::kuberuntime::logs::rotated_files(l);
    wait_until(Duration::from_secs(20), "two rotations", || {
        rotated(&log).len() >= 2
    });
    // Wait for a later rotation, then count.
    let first = rotated(&log);
    wait_until(Duration::from_secs(20), "a third rotation", || {
        rotated(&log).iter().any(|f| !first.contains(f))
    });
    assert!(
        rotated(&log).len() <= 2,
        "at most containerLogMaxFiles (3) files with the current one: {:?}",
        rotated(&log)
    );
    // The runtime reopened the log: the current file keeps growing with new lines.
    let before = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    wait_until(
        Duration::from_secs(5),
        "current log written after reopen",
        || {
            std::fs::read_to_string(&log).is_ok_and(|t| t.contains(" stdout F line "))
                && std::fs::metadata(&log).is_ok_and(|m| m.len() != before)
        },
    );
    let newest = rotated(&log).last().cloned().unwrap();
    assert!(std::fs::read_to_string(newest)
        .unwrap()
        .contains(" stdout F line "));
}

/// `kubelet_runtime_operations_total` by operation type.
fn runtime_operations(n: &Nodelet) -> std::collections::HashMap<String, f64> {
    let text = n.get("/metrics").unwrap_or_default();
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .expect("Prometheus text parses");
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == "kubelet_runtime_operations_total")
        .filter_map(|s| match s.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => {
                Some((s.labels.get("operation_type")?.to_string(), v))
            }
            _ => None,
        })
        .collect()
}

/// Issue 14's count on the real runtime: a burst of pod starts costs six CRI calls per pod
/// besides the relists' listings (RunPodSandbox, PodSandboxStatus, ImageStatus,
/// CreateContainer, StartContainer and one ContainerStatus), however containerd's events fall
/// between the pod worker's calls. A count, so the machine's speed does not move it.
#[test]
fn a_burst_of_pod_starts_costs_six_cri_calls_per_pod_besides_the_listings() {
    const PODS: usize = 8;
    let mut n = Nodelet::new("startcost");
    n.start();
    wait_until(Duration::from_secs(20), "first relist", || {
        n.metric("kubelet_pleg_relist_duration_seconds_count") > 0.0
    });
    let before = runtime_operations(&n);
    let names: Vec<String> = (0..PODS).map(|i| format!("p{i}")).collect();
    for name in &names {
        n.write_manifest(&format!("{name}.yaml"), &manifest(name));
    }
    let mut running = Vec::new();
    for name in &names {
        let uid = n.uid(name);
        running.push((
            uid.clone(),
            n.wait_running(&uid, &["c"], Duration::from_secs(60)),
        ));
    }
    // What the pod worker records of a container it creates, and the relist uses instead of a
    // ContainerStatus while the container is Created, is what containerd's ContainerStatus
    // says: the image's first repository digest and the log under the pod's log directory.
    let image = n
        .runtime
        .rt
        .block_on(nodelet::cri::ImageService::image_status(
            &n.runtime.cri,
            "busybox:1.36",
        ))
        .unwrap()
        .expect("busybox:1.36 is present");
    for (uid, containers) in &running {
        let st = n.runtime.container_status(&containers["c"].id);
        assert_eq!(st.image_ref, image.repo_digests[0]);
        assert!(
            st.log_path.starts_with(n.logs().to_str().unwrap())
                && st.log_path.ends_with(&format!("{uid}/c/0.log")),
            "{}",
            st.log_path
        );
    }
    // The agent has read each container running once /pods shows it so.
    wait_until(Duration::from_secs(20), "all running in /pods", || {
        let running = n
            .pods()
            .iter()
            .filter(|p| p["status"]["containerStatuses"][0]["state"]["running"].is_object())
            .count();
        running == PODS
    });
    let after = runtime_operations(&n);
    let calls: std::collections::BTreeMap<String, f64> = after
        .iter()
        .map(|(op, v)| (op.clone(), v - before.get(op).copied().unwrap_or(0.0)))
        // Besides the listings, the runtime health check's periodic Version.
        .filter(|(op, v)| *v > 0.0 && !op.starts_with("list_") && op != "version")
        .collect();
    let per_pod = |op: &str| calls.get(op).copied().unwrap_or(0.0) / PODS as f64;
    for op in [
        "run_podsandbox",
        "podsandbox_status",
        "image_status",
        "create_container",
        "start_container",
        "container_status",
    ] {
        assert_eq!(per_pod(op), 1.0, "{op} per pod start; all calls: {calls:?}");
    }
    assert_eq!(
        calls.values().sum::<f64>(),
        6.0 * PODS as f64,
        "nothing else: {calls:?}"
    );
}
