//! Small inputs where kubelet's answer is precise, on the real containerd: pod phase with a
//! failed init container, a container that never ran, an OOM-killed init container whose shell
//! exits 0, a start error under restartPolicy Never; termination messages from the file or the
//! log tail; and manifests copied with one `cp`.
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

mod common;

use std::time::Duration;

use common::{condition, wait_until, Nodelet};

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
    // 3. An image that is not a valid reference: InvalidImageName, never pulled.
    n.write_manifest(
        "badref.yaml",
        &manifest(
            "badref",
            "  containers:\n  - {name: c, image: 'Team/App:1'}\n",
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

    // kubelet's events of each container's start, about the container (`fieldPath`).
    let of = |field_path: &str| n.container_events("nopull", field_path);
    let pair = |r: &str, m: &str| (r.to_owned(), m.to_owned());
    assert_eq!(
        of("spec.containers{ok}"),
        [
            pair(
                "Pulled",
                "Container image \"busybox:1.36\" already present on machine"
            ),
            pair("Created", "Created container ok"),
            pair("Started", "Started container ok"),
        ]
    );
    let missing = of("spec.containers{missing}");
    assert_eq!(
        missing.first(),
        Some(&pair("Pulling", "Pulling image \"busybox:no-such-tag\"")),
        "{missing:?}"
    );
    assert!(
        missing.get(1).is_some_and(|(r, m)| r == "Failed"
            && m.starts_with("Failed to pull image \"busybox:no-such-tag\": ")
            && m.contains("not found")),
        "{missing:?}"
    );
    assert_eq!(
        missing.get(2),
        Some(&pair("Failed", "Error: ErrImagePull")),
        "{missing:?}"
    );

    wait_until(Duration::from_secs(20), "InvalidImageName", || {
        status(&n, "badref")["containerStatuses"][0]["state"]["waiting"]["reason"]
            == "InvalidImageName"
    });
    let events = n.get("/events").unwrap();
    assert!(
        events.contains("InspectFailed") && events.contains("repository name must be lowercase"),
        "{events}"
    );
    let log = n.log();
    assert!(
        log.contains("pulling image image=busybox:no-such-tag")
            && !log.contains("pulling image image=Team/App:1"),
        "the missing tag was pulled, the invalid name never"
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
            "  restartPolicy: Never\n  containers:\n  - {name: file, image: busybox:1.36, command: [sh, -c, 'echo -n bye from file > /dev/termination-log']}\n  - {name: custom, image: busybox:1.36, terminationMessagePath: /tmp/why, command: [sh, -c, 'i=0; while [ $i -lt 500 ]; do echo -n 0123456789; i=$((i+1)); done > /tmp/why; echo custom >> /tmp/why; exit 2']}\n  - {name: logs, image: busybox:1.36, terminationMessagePolicy: FallbackToLogsOnError, command: [sh, -c, 'echo first >&2; echo oops >&2; exit 3']}\n  - {name: quiet, image: busybox:1.36, terminationMessagePolicy: FallbackToLogsOnError, command: [sh, -c, 'echo ok']}\n",
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
    // 5,007 bytes written: the last 4096 are kept (kubelet's `tail.ReadAtMost`).
    let custom = message("custom").unwrap();
    let custom = custom.as_str().unwrap();
    assert_eq!(custom.len(), 4096, "{custom}");
    assert!(custom.ends_with("6789custom\n"), "{custom}");
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

/// A pod stopped at its active deadline keeps its container's last state, as kubelet's status
/// does (before, `containerStatuses` was null).
#[test]
fn a_pod_past_its_deadline_keeps_its_containers_last_states() {
    let mut n = Nodelet::new("deadline");
    n.start();
    n.write_manifest(
        "d.yaml",
        &manifest(
            "deadline",
            "  activeDeadlineSeconds: 3\n  containers:\n  - {name: c, image: busybox:1.36, command: [sh, -c, \"trap 'exit 143' TERM; while true; do sleep 0.2; done\"]}\n",
        ),
    );
    wait_until(Duration::from_secs(40), "deadline Failed", || {
        status(&n, "deadline")["reason"] == "DeadlineExceeded"
            && status(&n, "deadline")["containerStatuses"][0]["state"]["terminated"].is_object()
    });
    let st = status(&n, "deadline");
    assert_eq!(st["phase"], "Failed");
    let t = &st["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(
        (t["exitCode"].as_i64(), t["reason"].as_str()),
        (Some(143), Some("Error")),
        "{st}"
    );
    assert_eq!(condition(&st, "Ready")["reason"], "PodFailed", "{st}");
    assert!(condition(&st, "DisruptionTarget").is_null(), "{st}");
}

/// A disk-backed emptyDir over its sizeLimit: kubelet's local-storage eviction with its
/// message, the container's last state kept, no DisruptionTarget (kubelet adds none there).
#[test]
fn an_empty_dir_over_its_size_limit_is_evicted_with_kubelets_message() {
    let mut n = Nodelet::with_config("sizelimit", "evictionMonitoringPeriod: 500ms\n");
    n.start();
    n.write_manifest(
        "s.yaml",
        &manifest(
            "sizelimit",
            "  volumes: [{name: scratch, emptyDir: {sizeLimit: 1Mi}}]\n  containers:\n  - {name: c, image: busybox:1.36, volumeMounts: [{name: scratch, mountPath: /scratch}], command: [sh, -c, 'head -c 10485760 /dev/zero > /scratch/big; sleep 3600']}\n",
        ),
    );
    let uid = n.uid("sizelimit");
    wait_until(Duration::from_secs(40), "evicted", || {
        status(&n, "sizelimit")["reason"] == "Evicted"
    });
    wait_until(Duration::from_secs(20), "sandbox removed", || {
        n.runtime.sandboxes(&uid).is_empty()
    });
    let st = status(&n, "sizelimit");
    assert_eq!(st["phase"], "Failed");
    assert_eq!(
        st["message"],
        "Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". "
    );
    assert!(condition(&st, "DisruptionTarget").is_null(), "{st}");
    assert!(
        st["containerStatuses"][0]["state"]["terminated"].is_object(),
        "{st}"
    );
    assert_eq!(
        n.metric("kubelet_evictions_total{eviction_signal=\"emptydirfs.limit\"}"),
        1.0
    );
}

/// An init container gone from the runtime after an agent restart (clean-up, or removed by
/// hand) in a pod whose app runs: reported completed, and not run again.
#[test]
fn an_init_container_gone_after_a_restart_is_completed_and_not_run_again() {
    let mut n = Nodelet::new("initgone");
    n.start();
    n.write_manifest(
        "i.yaml",
        &manifest(
            "initgone",
            "  initContainers:\n  - {name: init, image: busybox:1.36, command: ['true']}\n  containers:\n  - {name: app, image: busybox:1.36, command: [sleep, '3600']}\n",
        ),
    );
    let uid = n.uid("initgone");
    let app = n.wait_running(&uid, &["app"], Duration::from_secs(30))["app"].clone();
    n.kill9();
    for c in n.runtime.containers(&uid) {
        if c.metadata.as_ref().unwrap().name == "init" {
            n.runtime
                .rt
                .block_on(nodelet::cri::RuntimeService::remove_container(
                    &n.runtime.cri,
                    &c.id,
                ))
                .unwrap();
        }
    }
    n.start();
    wait_until(Duration::from_secs(20), "init reported completed", || {
        status(&n, "initgone")["initContainerStatuses"][0]["state"]["terminated"]["reason"]
            == "Completed"
    });
    n.wait_for_housekeeping(2);
    let st = status(&n, "initgone");
    let t = &st["initContainerStatuses"][0]["state"]["terminated"];
    assert_eq!(t["exitCode"], 0, "{st}");
    assert_eq!(
        t["message"],
        "Unable to get init container status from container runtime and pod has been initialized, treat it as exited normally"
    );
    assert_eq!(st["phase"], "Running", "{st}");
    assert_eq!(condition(&st, "Initialized")["status"], "True", "{st}");
    let names: Vec<String> = n
        .runtime
        .containers(&uid)
        .iter()
        .map(|c| c.metadata.as_ref().unwrap().name.clone())
        .collect();
    assert_eq!(names, vec!["app"], "the init container was not run again");
    assert_eq!(
        n.runtime.container_status(&app.id).state,
        1,
        "app kept running"
    );
}

/// A sidecar waiting in back-off after a crash leaves a running pod Running and initialized;
/// its readiness counts towards the pod's.
#[test]
fn a_crashed_sidecar_in_back_off_keeps_the_pod_running_but_not_ready() {
    let mut n = Nodelet::new("sidecarbo");
    n.start();
    n.write_manifest(
        "s.yaml",
        &manifest(
            "sidecarbo",
            "  initContainers:\n  - {name: side, image: busybox:1.36, restartPolicy: Always, command: [sh, -c, 'sleep 2; exit 1']}\n  containers:\n  - {name: app, image: busybox:1.36, command: [sleep, '3600']}\n",
        ),
    );
    wait_until(Duration::from_secs(60), "the sidecar in back-off", || {
        let st = status(&n, "sidecarbo");
        let side = &st["initContainerStatuses"][0];
        side["state"]["waiting"]["reason"] == "CrashLoopBackOff"
            && st["containerStatuses"][0]["state"]["running"].is_object()
    });
    let st = status(&n, "sidecarbo");
    assert_eq!(st["phase"], "Running", "{st}");
    assert_eq!(condition(&st, "Initialized")["status"], "True", "{st}");
    let ready = condition(&st, "ContainersReady");
    assert_eq!(
        (ready["status"].as_str(), ready["message"].as_str()),
        (
            Some("False"),
            Some("containers with unready status: [side]")
        ),
        "{st}"
    );
    assert_eq!(condition(&st, "Ready")["status"], "False");
}

/// Containers start one at a time: the second only once the first has started and its
/// postStart hook has finished (kubelet's sequential start).
#[test]
fn each_container_starts_after_the_one_before_and_its_post_start_hook() {
    let mut n = Nodelet::new("order");
    n.start();
    n.write_manifest(
        "o.yaml",
        &manifest(
            "order",
            "  containers:\n  - name: proxy\n    image: busybox:1.36\n    command: [sleep, '3600']\n    lifecycle: {postStart: {exec: {command: [sh, -c, 'sleep 2']}}}\n  - {name: app, image: busybox:1.36, command: [sleep, '3600']}\n",
        ),
    );
    let uid = n.uid("order");
    let cs = n.wait_running(&uid, &["proxy", "app"], Duration::from_secs(60));
    let started = |c: &str| n.runtime.container_status(&cs[c].id).started_at;
    let gap = started("app") - started("proxy");
    assert!(
        gap >= 1_900_000_000,
        "app started {:.2} s after proxy (its postStart takes 2 s)",
        gap as f64 / 1e9
    );
}

/// A memory-backed emptyDir without sizeLimit is sized to the pod's memory limit, not the
/// node's memory (kubelet's `calculateEmptyDirMemorySize`).
#[test]
fn a_memory_backed_empty_dir_is_sized_to_the_pods_memory_limit() {
    let mut n = Nodelet::new("tmpfssize");
    n.start();
    n.write_manifest(
        "t.yaml",
        &manifest(
            "tmpfssize",
            "  volumes: [{name: cache, emptyDir: {medium: Memory}}, {name: small, emptyDir: {medium: Memory, sizeLimit: 16Mi}}]\n  containers:\n  - {name: c, image: busybox:1.36, command: [sleep, '3600'], volumeMounts: [{name: cache, mountPath: /cache}, {name: small, mountPath: /small}], resources: {limits: {cpu: 100m, memory: 64Mi}}}\n",
        ),
    );
    let uid = n.uid("tmpfssize");
    let c = n.wait_running(&uid, &["c"], Duration::from_secs(30))["c"].clone();
    let size_kib = |dir: &str| -> i64 {
        let (code, out) = n.runtime.exec(&c.id, &["df", "-k", dir]);
        assert_eq!(code, 0, "{out}");
        out.lines()
            .nth(1)
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{out}"))
    };
    assert_eq!(size_kib("/cache"), 64 * 1024);
    assert_eq!(size_kib("/small"), 16 * 1024);
}

/// A subdirectory of staticPodPath is not read into (as kubelet), reported once; a hook sleep
/// longer than the grace period (the manifests here give 1 s) is refused with the field named.
#[test]
fn subdirectories_are_reported_once_and_long_hook_sleeps_are_refused() {
    let mut n = Nodelet::new("subdir");
    n.start();
    let sub = n.manifests().join("nested");
    std::fs::create_dir(&sub).unwrap();
    std::fs::write(
        sub.join("hidden.yaml"),
        manifest(
            "hidden",
            "  containers:\n  - {name: c, image: busybox:1.36}\n",
        ),
    )
    .unwrap();
    n.write_manifest(
        "sleepy.yaml",
        &manifest(
            "sleepy",
            "  containers:\n  - {name: c, image: busybox:1.36, command: [sleep, '3600'], lifecycle: {preStop: {sleep: {seconds: 40}}}}\n",
        ),
    );
    wait_until(Duration::from_secs(20), "sleepy refused", || {
        n.get("/events").is_some_and(|e| e.contains("sleepy.yaml"))
    });
    // Several listings later the directory has been reported once.
    n.wait_for_housekeeping(3);
    let log = n.log();
    assert_eq!(
        log.matches("not recursing into manifest path").count(),
        1,
        "{log}"
    );
    assert_eq!(
        n.metric("nodelet_static_pod_manifest_errors_total{reason=\"Subdirectory\"}"),
        1.0
    );
    assert!(n.pod("hidden").is_none());
    let events = n.get("/events").unwrap();
    assert!(
        events.contains("spec.containers[0].lifecycle.preStop.sleep")
            && events
                .contains("must be non-negative and less than terminationGracePeriodSeconds (1)"),
        "{events}"
    );
    assert!(n
        .pod("sleepy")
        .is_none_or(|p| p["status"]["phase"] != "Running"));
}

/// `imagePullSecrets` (kubelet's `PullImage` with the pod's docker keyring) against the
/// environment's password-protected registry (`private.registry.test`, served by
/// docker-registry with htpasswd auth on 127.0.0.1:5001, scripts/env/up.sh): without
/// credentials the runtime's pull is refused (401); with Secrets from the manifest directory the
/// wrong password is tried first (its key is more specific), then the right one pulls and the
/// container runs; a Secret that is not there is named in kubelet's Warning event; the node's
/// `<root-dir>/config.json` serves a pod without pull secrets.
#[test]
fn a_password_protected_registry_is_pulled_with_the_pods_pull_secrets() {
    use base64::Engine as _;
    let mut n = Nodelet::with_config(
        "pullsecret",
        "imagePullBackOff: {initialPeriod: 1s, maxPeriod: 2s}\n",
    );
    n.start();
    let image = "private.registry.test/library/busybox:1.36";
    let secret = |name: &str, registry: &str, entry: &str| {
        let json = format!(r#"{{"auths": {{"{registry}": {entry}}}}}"#);
        let b64 = base64::engine::general_purpose::STANDARD.encode(json);
        format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}}}\ntype: kubernetes.io/dockerconfigjson\ndata: {{.dockerconfigjson: {b64}}}\n")
    };
    let auth = base64::engine::general_purpose::STANDARD.encode("nodelet:registry-pass");
    n.write_manifest(
        "secrets.yaml",
        &format!(
            "{}---\n{}---\n{}",
            // An entry of the wrong shape: its value (here the real credentials) is never
            // quoted in the error.
            secret("broken", "private.registry.test", &format!(r#""{auth}""#)),
            secret(
                "wrong",
                "private.registry.test/library",
                r#"{"username": "nodelet", "password": "not-the-password"}"#
            ),
            secret(
                "regcred",
                "https://private.registry.test/v2/",
                &format!(r#"{{"auth": "{auth}"}}"#)
            ),
        ),
    );
    let pod = |name: &str, secrets: &str| {
        manifest(
            name,
            &format!("  imagePullSecrets: [{secrets}]\n  containers:\n  - {{name: c, image: {image}, imagePullPolicy: Always, command: [sleep, '3600']}}\n"),
        )
    };
    n.write_manifest("anonymous.yaml", &pod("anonymous", ""));
    n.write_manifest("broken.yaml", &pod("brokencfg", "{name: broken}"));
    n.write_manifest(
        "private.yaml",
        &pod("private", "{name: wrong}, {name: missing}, {name: regcred}"),
    );
    let uid = n.uid("private");
    let running = n.wait_running(&uid, &["c"], Duration::from_secs(60));
    // The runtime runs it from the private registry's image.
    let st = n.runtime.container_status(&running["c"].id);
    assert!(st.image_ref.contains("sha256:"), "{st:?}");
    wait_until(
        Duration::from_secs(30),
        "the anonymous pull refused",
        || {
            let w = &status(&n, "anonymous")["containerStatuses"][0]["state"]["waiting"];
            (w["reason"] == "ErrImagePull" || w["reason"] == "ImagePullBackOff")
                && w["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("401 Unauthorized"))
        },
    );
    wait_until(Duration::from_secs(30), "the broken Secret named", || {
        status(&n, "brokencfg")["containerStatuses"][0]["state"]["waiting"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(r#"image pull secret "broken": the docker config has a value of the wrong type"#))
    });
    let events = n.get("/events").unwrap();
    assert!(
        events.contains("Unable to retrieve some image pull secrets (missing); attempting to pull the image may not succeed."),
        "{events}"
    );
    // Both Secrets' credentials matched the image (the wrong one's more specific key first,
    // as the unit tests show), and the pull went on past the refused one.
    assert!(n.log().contains("credentials=2"), "{}", n.log());
    // The node's own credentials (`<root-dir>/config.json`, read at each pull) open it for
    // the pod without pull secrets at its next attempt.
    std::fs::write(
        n.root().join("config.json"),
        format!(r#"{{"auths": {{"private.registry.test": {{"auth": "{auth}"}}}}}}"#),
    )
    .unwrap();
    let anonymous = n.uid("anonymous");
    n.wait_running(&anonymous, &["c"], Duration::from_secs(30));
    // No password reaches the agent's log, its events or its pods' statuses.
    assert!(!n.log().contains("registry-pass") && !n.log().contains(&auth));
    let pods = n.get("/pods").unwrap();
    assert!(!pods.contains(&auth) && !n.get("/events").unwrap().contains(&auth));
    assert!(!events.contains("registry-pass") && !events.contains("not-the-password"));
}
