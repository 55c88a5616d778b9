//! Small inputs where kubelet's answer is precise, on the real containerd: pod phase with a
//! failed init container, a container that never ran, an OOM-killed init container whose shell
//! exits 0, a start error under restartPolicy Never; termination messages from the file or the
//! log tail; and manifests copied with one `cp`.

mod common;

use std::time::Duration;

use common::{wait_until, Nodelet};

fn status(n: &Nodelet, name: &str) -> serde_json::Value {
    n.pod(name).map(|p| p["status"].clone()).unwrap_or_default()
}

fn manifest(name: &str, spec: &str) -> String {
    format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n{spec}")
}

#[test]
fn phase_follows_kubelets_get_phase() {
    let mut n = Nodelet::with_config(
        "phase",
        "crashLoopBackOff: {initialContainerRestartPeriod: 1s, maxContainerRestartPeriod: 2s}\nimagePullBackOff: {initialPeriod: 1s, maxPeriod: 2s}\n",
    );
    n.start();
    // 1. restartPolicy Never, an init container exits 1: Failed; the app never starts.
    n.write_manifest(
        "initfail.yaml",
        &manifest(
            "initfail",
            "  restartPolicy: Never\n  initContainers:\n  - {name: init, image: busybox:1.36, command: [sh, -c, 'exit 1']}\n  containers:\n  - {name: app, image: busybox:1.36, command: [sleep, '3600']}\n",
        ),
    );
    // 2. One container runs, the other's image tag does not exist: Pending.
    n.write_manifest(
        "nopull.yaml",
        &manifest(
            "nopull",
            "  containers:\n  - {name: ok, image: busybox:1.36, command: [sleep, '3600']}\n  - {name: missing, image: 'busybox:no-such-tag'}\n",
        ),
    );
    // 4. restartPolicy Never, the command does not exist: terminated StartError 128, Failed.
    n.write_manifest(
        "nobin.yaml",
        &manifest(
            "nobin",
            "  restartPolicy: Never\n  containers:\n  - {name: c, image: busybox:1.36, command: [/no/such/binary]}\n",
        ),
    );

    wait_until(Duration::from_secs(30), "initfail Failed", || {
        status(&n, "initfail")["phase"] == "Failed"
    });
    let st = status(&n, "initfail");
    let init = &st["initContainerStatuses"][0]["state"]["terminated"];
    assert_eq!(
        (init["reason"].as_str(), init["exitCode"].as_i64()),
        (Some("Error"), Some(1)),
        "{st}"
    );
    let uid = n.uid("initfail");
    assert!(
        !n.runtime
            .containers(&uid)
            .iter()
            .any(|c| c.metadata.as_ref().unwrap().name == "app"),
        "the app container never started"
    );
    // It stays Failed once its sandbox is stopped (the phase comes from the statuses).
    n.wait_for_housekeeping(1);
    assert_eq!(status(&n, "initfail")["phase"], "Failed");

    let nopull = n.uid("nopull");
    n.wait_running(&nopull, &["ok"], Duration::from_secs(30));
    wait_until(Duration::from_secs(20), "missing image waits", || {
        let r = &status(&n, "nopull")["containerStatuses"][1]["state"]["waiting"]["reason"];
        r == "ErrImagePull" || r == "ImagePullBackOff"
    });
    assert_eq!(
        status(&n, "nopull")["phase"],
        "Pending",
        "{}",
        status(&n, "nopull")
    );

    wait_until(Duration::from_secs(30), "nobin Failed", || {
        status(&n, "nobin")["phase"] == "Failed"
    });
    let t = status(&n, "nobin")["containerStatuses"][0]["state"]["terminated"].clone();
    assert_eq!(
        (t["reason"].as_str(), t["exitCode"].as_i64()),
        (Some("StartError"), Some(128)),
        "{}",
        status(&n, "nobin")
    );
}

#[test]
fn an_oom_killed_init_container_fails_whatever_its_shell_exits_and_the_app_waits() {
    let mut n = Nodelet::with_config(
        "initoom",
        "crashLoopBackOff: {initialContainerRestartPeriod: 1s, maxContainerRestartPeriod: 2s}\n",
    );
    n.start();
    n.write_manifest(
        "initoom.yaml",
        &manifest(
            "initoom",
            "  initContainers:\n  - name: init\n    image: busybox:1.36\n    command: [sh, -c, 'tail /dev/zero; exit 0']\n    resources: {limits: {memory: 32Mi}}\n  containers:\n  - {name: app, image: busybox:1.36, command: [sleep, '3600']}\n",
        ),
    );
    let uid = n.uid("initoom");
    wait_until(Duration::from_secs(40), "init restarted after OOM", || {
        status(&n, "initoom")["initContainerStatuses"][0]["restartCount"]
            .as_i64()
            .is_some_and(|c| c >= 2)
    });
    let st = status(&n, "initoom");
    let init = &st["initContainerStatuses"][0];
    let reason = |s: &serde_json::Value| s["terminated"]["reason"].as_str().map(str::to_owned);
    assert!(
        reason(&init["state"]).as_deref() == Some("OOMKilled")
            || reason(&init["lastState"]).as_deref() == Some("OOMKilled"),
        "{st}"
    );
    assert_eq!(st["phase"], "Pending", "{st}");
    assert!(
        !n.runtime
            .containers(&uid)
            .iter()
            .any(|c| c.metadata.as_ref().unwrap().name == "app"),
        "the app container never starts while its init container keeps failing"
    );
}

#[test]
fn manifests_copied_with_one_cp_are_never_reported_as_broken() {
    let mut n = Nodelet::new("cpmany");
    n.start();
    let src = tempfile::tempdir().unwrap();
    let mut names = Vec::new();
    for round in 0..3 {
        let files: Vec<String> = (0..6)
            .map(|i| {
                let name = format!("c{round}x{i}");
                let path = src.path().join(format!("{name}.yaml"));
                std::fs::write(
                    &path,
                    manifest(
                        &name,
                        "  containers:\n  - {name: c, image: busybox:1.36, command: [sleep, '3600']}\n",
                    ),
                )
                .unwrap();
                names.push(name);
                path.display().to_string()
            })
            .collect();
        let ok = std::process::Command::new("cp")
            .args(&files)
            .arg(n.manifests())
            .status()
            .unwrap();
        assert!(ok.success());
    }
    wait_until(Duration::from_secs(20), "all copied pods listed", || {
        names.iter().all(|name| n.pod(name).is_some())
    });
    let events = n.get("/events").unwrap_or_default();
    assert!(!events.contains("EmptyManifest"), "{events}");
    assert!(!events.contains("DecodeError"), "{events}");
    assert_eq!(n.metric("nodelet_static_pod_manifest_errors_total"), 0.0);
}

#[test]
fn termination_messages_come_from_the_file_or_the_log_tail_on_error() {
    let mut n = Nodelet::new("termmsg");
    n.start();
    n.write_manifest(
        "msg.yaml",
        &manifest(
            "msg",
            "  restartPolicy: Never\n  containers:\n  - {name: file, image: busybox:1.36, command: [sh, -c, 'echo -n bye from file > /dev/termination-log']}\n  - {name: custom, image: busybox:1.36, terminationMessagePath: /tmp/why, command: [sh, -c, 'echo custom > /tmp/why; exit 2']}\n  - {name: logs, image: busybox:1.36, terminationMessagePolicy: FallbackToLogsOnError, command: [sh, -c, 'echo first >&2; echo oops >&2; exit 3']}\n  - {name: quiet, image: busybox:1.36, terminationMessagePolicy: FallbackToLogsOnError, command: [sh, -c, 'echo ok']}\n",
        ),
    );
    let message = |c: &str| {
        status(&n, "msg")["containerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["name"] == c)
            .map(|s| s["state"]["terminated"]["message"].clone())
    };
    wait_until(Duration::from_secs(30), "all four terminated", || {
        status(&n, "msg")["containerStatuses"]
            .as_array()
            .is_some_and(|a| a.len() == 4 && a.iter().all(|s| s["state"]["terminated"].is_object()))
    });
    assert_eq!(message("file").unwrap(), "bye from file");
    assert_eq!(message("custom").unwrap(), "custom\n");
    assert_eq!(message("logs").unwrap(), "first\noops\n");
    assert_eq!(
        message("quiet").unwrap(),
        serde_json::Value::Null,
        "exit 0: no fallback to the logs"
    );
}

/// A privileged container runs in a privileged sandbox (kubelet's `HasPrivilegedContainer`;
/// containerd refuses a privileged container in an unprivileged sandbox) and sees the host's
/// devices; its unprivileged sibling does not.
#[test]
fn a_privileged_container_runs_and_sees_the_hosts_devices() {
    let mut n = Nodelet::new("privileged");
    n.start();
    n.write_manifest(
        "priv.yaml",
        &manifest(
            "priv",
            "  containers:\n  - {name: p, image: busybox:1.36, command: [sleep, '3600'], securityContext: {privileged: true}}\n  - {name: u, image: busybox:1.36, command: [sleep, '3600']}\n",
        ),
    );
    let uid = n.uid("priv");
    let cs = n.wait_running(&uid, &["p", "u"], Duration::from_secs(60));
    let (_, out) = n.runtime.exec(&cs["p"].id, &["ls", "/dev"]);
    assert!(out.contains("kmsg"), "privileged sees /dev/kmsg: {out}");
    let (_, out) = n.runtime.exec(&cs["u"].id, &["ls", "/dev"]);
    assert!(!out.contains("kmsg"), "unprivileged does not: {out}");
}
