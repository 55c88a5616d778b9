//! Probes and lifecycle hooks on the real containerd: the docs' exec liveness example, an
//! httpGet readiness probe on busybox httpd with a TCP liveness probe, a startup probe that holds
//! liveness back, preStop hooks whose time comes out of the grace period, and an HTTPS preStop
//! hook that falls back to HTTP.
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

mod common;

use std::time::{Duration, Instant};

use common::{wait_until, Nodelet};

fn status(n: &Nodelet, name: &str) -> serde_json::Value {
    n.pod(name).map(|p| p["status"].clone()).unwrap_or_default()
}

fn manifest(name: &str, spec: &str) -> String {
    format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n{spec}")
}

fn condition(st: &serde_json::Value, kind: &str) -> String {
    st["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == kind)
        .and_then(|c| c["status"].as_str())
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn the_docs_exec_liveness_example_restarts_the_container() {
    let mut n = Nodelet::with_config(
        "liveness",
        "crashLoopBackOff: {initialContainerRestartPeriod: 1s}\n",
    );
    n.start();
    // https://kubernetes.io/docs/tasks/configure-pod-container/configure-liveness-readiness-startup-probes/
    // (busybox from the local registry; the probe's own grace period keeps the kill short: the
    // shell is PID 1 and ignores SIGTERM, so it is killed at the grace period with 137).
    n.write_manifest(
        "liveness.yaml",
        &manifest(
            "liveness-exec",
            "  containers:\n  - name: liveness\n    image: busybox:1.36\n    args: [/bin/sh, -c, 'touch /tmp/healthy; sleep 30; rm -f /tmp/healthy; sleep 600']\n    livenessProbe:\n      exec: {command: [cat, /tmp/healthy]}\n      initialDelaySeconds: 5\n      periodSeconds: 5\n      terminationGracePeriodSeconds: 2\n",
        ),
    );
    let uid = n.uid("liveness-exec");
    n.wait_running(&uid, &["liveness"], Duration::from_secs(30));
    let started = Instant::now();
    wait_until(Duration::from_secs(60), "restartCount >= 1", || {
        status(&n, "liveness-exec")["containerStatuses"][0]["restartCount"]
            .as_i64()
            .is_some_and(|c| c >= 1)
    });
    let took = started.elapsed();
    let st = status(&n, "liveness-exec");
    let last = &st["containerStatuses"][0]["lastState"]["terminated"];
    assert_eq!(last["exitCode"].as_i64(), Some(137), "{st}");
    // 30 s healthy, then three failed probes 5 s apart, then the 2 s grace period.
    assert!(took >= Duration::from_secs(35), "restarted after {took:?}");
    let events = n.get("/events").unwrap();
    assert!(
        events.contains("Liveness probe failed: cat: can't open '/tmp/healthy'"),
        "{events}"
    );
    assert!(
        events.contains("Container liveness failed liveness probe, will be restarted"),
        "{events}"
    );
    let probes = n.get("/metrics/probes").unwrap();
    assert!(
        probes.contains(
            "prober_probe_total{probe_type=\"Liveness\",result=\"failed\",container=\"liveness\""
        ),
        "{probes}"
    );
}

#[test]
fn http_readiness_follows_the_served_file_and_a_startup_probe_holds_liveness_back() {
    let mut n = Nodelet::new("readiness");
    n.start();
    n.write_manifest(
        "web.yaml",
        &manifest(
            "web",
            "  terminationGracePeriodSeconds: 1\n  containers:\n  - name: httpd\n    image: busybox:1.36\n    command: [sh, -c, 'mkdir -p /www && exec httpd -f -p 8080 -h /www']\n    ports: [{name: http, containerPort: 8080}]\n    readinessProbe: {httpGet: {path: /ready, port: http}, periodSeconds: 1, failureThreshold: 1}\n    livenessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1, failureThreshold: 2}\n",
        ),
    );
    n.write_manifest(
        "slow.yaml",
        &manifest(
            "slow",
            "  terminationGracePeriodSeconds: 1\n  containers:\n  - name: app\n    image: busybox:1.36\n    command: [sleep, '3600']\n    startupProbe: {exec: {command: [test, -f, /tmp/started]}, periodSeconds: 1, failureThreshold: 600}\n    livenessProbe: {exec: {command: ['false']}, periodSeconds: 1, failureThreshold: 1}\n",
        ),
    );
    let web = n.uid("web");
    let c = n.wait_running(&web, &["httpd"], Duration::from_secs(30));
    let httpd = c["httpd"].id.clone();
    // Running, not ready: /ready is a 404.
    wait_until(Duration::from_secs(10), "web running", || {
        status(&n, "web")["phase"] == "Running"
    });
    n.wait_for_housekeeping(1);
    let st = status(&n, "web");
    assert_eq!(st["containerStatuses"][0]["ready"], false, "{st}");
    assert_eq!(condition(&st, "Ready"), "False", "{st}");
    assert_eq!(condition(&st, "ContainersReady"), "False", "{st}");
    assert!(n
        .get("/events")
        .unwrap()
        .contains("Readiness probe failed: HTTP probe failed with statuscode: 404"));
    // Served: ready.
    assert_eq!(n.runtime.exec(&httpd, &["touch", "/www/ready"]).0, 0);
    wait_until(Duration::from_secs(10), "web Ready", || {
        condition(&status(&n, "web"), "Ready") == "True"
    });
    assert_eq!(status(&n, "web")["containerStatuses"][0]["ready"], true);
    // Removed: not ready again, and the container keeps running (readiness never restarts).
    assert_eq!(n.runtime.exec(&httpd, &["rm", "/www/ready"]).0, 0);
    wait_until(Duration::from_secs(10), "web not Ready", || {
        condition(&status(&n, "web"), "Ready") == "False"
    });
    let st = status(&n, "web");
    assert_eq!(st["containerStatuses"][0]["restartCount"], 0, "{st}");
    assert!(st["containerStatuses"][0]["state"]["running"].is_object());

    // The startup probe has not succeeded: the failing liveness probe is never run.
    let slow = n.uid("slow");
    let c = n.wait_running(&slow, &["app"], Duration::from_secs(30));
    let app = c["app"].id.clone();
    n.wait_for_housekeeping(1);
    let st = status(&n, "slow");
    assert_eq!(st["containerStatuses"][0]["started"], false, "{st}");
    assert_eq!(st["containerStatuses"][0]["restartCount"], 0, "{st}");
    let probes = n.get("/metrics/probes").unwrap();
    assert!(
        !probes.contains("probe_type=\"Liveness\",result=\"failed\",container=\"app\""),
        "liveness ran before startup succeeded: {probes}"
    );
    // containerd delivers only the task events after which CRI says something new: the exec
    // probes' processes and a task's creation never wake the agent (`pleg::events::FILTERS`).
    let log = n.log();
    assert!(
        log.contains("containerd event topic=/tasks/start\n"),
        "{log}"
    );
    for topic in ["/tasks/create", "/tasks/exec-added", "/tasks/exec-started"] {
        assert!(
            !log.contains(&format!("containerd event topic={topic}\n")),
            "{topic} delivered"
        );
    }
    // Once started, liveness runs, fails, and the container is restarted.
    assert_eq!(n.runtime.exec(&app, &["touch", "/tmp/started"]).0, 0);
    wait_until(
        Duration::from_secs(20),
        "slow restarted by liveness",
        || {
            status(&n, "slow")["containerStatuses"][0]["restartCount"]
                .as_i64()
                .is_some_and(|c| c >= 1)
        },
    );
}

/// Edits the pod's env (its container is replaced) and returns how long after the edit the old
/// container finished, with its exit code, from the runtime's status of the old container
/// (nanoseconds; the API status has whole seconds).
fn replace_and_time(
    n: &Nodelet,
    file: &str,
    name: &str,
    spec: impl Fn(&str) -> String,
) -> (Duration, i64) {
    let uid = n.uid(name);
    let old = n.wait_running(&uid, &["c"], Duration::from_secs(30))["c"]
        .id
        .clone();
    let edited = std::time::SystemTime::now();
    n.write_manifest(file, &manifest(name, &spec("2")));
    let mut out = (Duration::ZERO, 0);
    wait_until(Duration::from_secs(40), "container replaced", || {
        let Some(s) = n.runtime.try_container_status(&old) else {
            return false;
        };
        if s.finished_at == 0 {
            return false;
        }
        let finished =
            std::time::UNIX_EPOCH + Duration::from_nanos(u64::try_from(s.finished_at).unwrap());
        out = (
            finished.duration_since(edited).unwrap_or_default(),
            i64::from(s.exit_code),
        );
        true
    });
    out
}

#[test]
fn a_pre_stop_hook_runs_before_sigterm_and_its_time_comes_out_of_the_grace_period() {
    let mut n = Nodelet::new("prestop");
    n.start();
    // Traps SIGTERM (exits 143); its preStop hook writes to the container's log and takes 3 s.
    let trapping = |v: &str| {
        format!("  terminationGracePeriodSeconds: 10\n  containers:\n  - name: c\n    image: busybox:1.36\n    env: [{{name: V, value: '{v}'}}]\n    command: [sh, -c, 'trap \"echo got-sigterm; exit 143\" TERM; while true; do sleep 0.2; done']\n    lifecycle:\n      preStop: {{exec: {{command: [sh, -c, 'echo prestop-ran > /proc/1/fd/1; sleep 3']}}}}\n")
    };
    // Ignores SIGTERM (a shell as PID 1): killed at the 3 s grace period with 137.
    let ignoring = |v: &str| {
        format!("  terminationGracePeriodSeconds: 3\n  containers:\n  - name: c\n    image: busybox:1.36\n    env: [{{name: V, value: '{v}'}}]\n    command: [sh, -c, 'while true; do sleep 0.2; done']\n")
    };
    n.write_manifest("trap.yaml", &manifest("trap", &trapping("1")));
    n.write_manifest("ignore.yaml", &manifest("ignore", &ignoring("1")));
    let (took, code) = replace_and_time(&n, "trap.yaml", "trap", trapping);
    assert_eq!(code, 143);
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(8),
        "the hook's 3 s, then SIGTERM: {took:?}"
    );
    // The hook's output comes before the container saw SIGTERM.
    let uid = n.uid("trap");
    let logs = std::fs::read_dir(n.logs())
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().ends_with(&uid))
        .unwrap()
        .path()
        .join("c/0.log");
    let log = std::fs::read_to_string(&logs).unwrap();
    // CRI log lines: `<RFC 3339 time> stdout F <text>`.
    let at = |text: &str| -> std::time::SystemTime {
        let line = log
            .lines()
            .find(|l| l.ends_with(text))
            .unwrap_or_else(|| panic!("{text}: {log}"));
        let t: k8s_openapi::jiff::Timestamp = line.split(' ').next().unwrap().parse().unwrap();
        t.into()
    };
    let gap = at("got-sigterm").duration_since(at("prestop-ran"));
    assert!(
        gap.as_ref()
            .is_ok_and(|g| *g >= Duration::from_millis(2900)),
        "SIGTERM came {gap:?} after the hook started: {log}"
    );

    let (took, code) = replace_and_time(&n, "ignore.yaml", "ignore", ignoring);
    assert_eq!(code, 137);
    assert!(
        took >= Duration::from_millis(2500) && took < Duration::from_secs(7),
        "killed at the grace period: {took:?}"
    );
}

#[test]
fn an_https_pre_stop_hook_on_a_plain_http_server_falls_back_to_http() {
    let mut n = Nodelet::new("fallback");
    n.start();
    n.write_manifest(
        "web.yaml",
        &manifest(
            "web",
            "  terminationGracePeriodSeconds: 5\n  containers:\n  - name: httpd\n    image: busybox:1.36\n    command: [sh, -c, 'mkdir -p /www && echo hi > /www/index.html && exec httpd -f -p 8080 -h /www']\n    lifecycle:\n      preStop: {httpGet: {path: /index.html, port: 8080, scheme: HTTPS, httpHeaders: [{name: Authorization, value: secret}]}}\n",
        ),
    );
    let uid = n.uid("web");
    n.wait_running(&uid, &["httpd"], Duration::from_secs(30));
    assert_eq!(
        n.metric("kubelet_lifecycle_handler_http_fallbacks_total"),
        0.0
    );
    std::fs::remove_file(n.manifests().join("web.yaml")).unwrap();
    wait_until(Duration::from_secs(30), "web removed", || {
        n.runtime.sandboxes(&uid).is_empty()
    });
    // httpd speaks plain HTTP: the HTTPS request fails, the same request over HTTP succeeds.
    assert_eq!(
        n.metric("kubelet_lifecycle_handler_http_fallbacks_total"),
        1.0
    );
    let events = n.get("/events").unwrap();
    assert!(
        events.contains("LifecycleHTTPFallback")
            && events.contains("got HTTP response, retry with HTTP succeeded"),
        "{events}"
    );
    assert!(!events.contains("FailedPreStopHook"), "{events}");
}

/// A postStart hook that exits 3: the container is killed and shows `PostStartHookError`, and
/// its events are kubelet's, in kubelet's order: `Started`, `FailedPostStartHook` with the
/// command, CRI's exit error (stderr) and the output, then `Killing` `FailedPostStartHook`.
#[test]
fn a_failed_post_start_hook_kills_the_container_with_kubelets_events() {
    let mut n = Nodelet::with_config(
        "poststart",
        "crashLoopBackOff: {initialContainerRestartPeriod: 60s}\n",
    );
    n.start();
    n.write_manifest(
        "hooked.yaml",
        &manifest(
            "hooked",
            "  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [sleep, '3600']\n    lifecycle:\n      postStart: {exec: {command: [sh, -c, 'echo out; echo err >&2; exit 3']}}\n",
        ),
    );
    let uid = n.uid("hooked");
    wait_until(Duration::from_secs(30), "PostStartHookError", || {
        let c = &status(&n, "hooked")["containerStatuses"][0];
        c["state"]["waiting"]["reason"] == "PostStartHookError"
            || c["lastState"]["terminated"]["exitCode"].as_i64().is_some()
    });
    let told: Vec<(String, String)> = n
        .container_events("hooked", "spec.containers{c}")
        .into_iter()
        .skip_while(|(r, _)| r != "Started")
        .take(3)
        .collect();
    let name = format!("hooked-{}", n.node);
    let pair = |r: &str, m: &str| (r.to_owned(), m.to_owned());
    assert_eq!(
        told,
        [
            pair("Started", "Started container c"),
            pair(
                "FailedPostStartHook",
                &format!("Exec lifecycle hook ([sh -c echo out; echo err >&2; exit 3]) for Container \"c\" in Pod \"{name}_default({uid})\" failed - error: command 'sh -c echo out; echo err >&2; exit 3' exited with 3: err\n, message: \"out\\nerr\\n\"")
            ),
            pair("Killing", "FailedPostStartHook"),
        ]
    );
    // Killed: nothing of it runs (the back-off holds the restart for a minute).
    wait_until(
        Duration::from_secs(20),
        "the hooked container stopped",
        || {
            n.runtime
                .containers(&uid)
                .iter()
                .all(|c| c.state != nodelet::cri::api::ContainerState::ContainerRunning as i32)
        },
    );
}

#[test]
fn a_probe_that_cannot_run_is_an_error_that_never_kills_and_never_readies() {
    let mut n = Nodelet::new("probeerr");
    n.start();
    // A named port that no container declares (tcpSocket liveness, httpGet readiness) and an
    // exec of a binary the image lacks (containerd answers ExecSync with an error): none can be
    // run. kubelet throws such results away: liveness never kills, readiness stays false.
    n.write_manifest(
        "probeerr.yaml",
        &manifest(
            "probeerr",
            "  terminationGracePeriodSeconds: 1\n  containers:\n  - name: app\n    image: busybox:1.36\n    command: [sleep, '3600']\n    ports: [{name: web, containerPort: 8080}]\n    livenessProbe: {tcpSocket: {port: admin}, periodSeconds: 1, failureThreshold: 1}\n    readinessProbe: {httpGet: {port: admin, path: /}, periodSeconds: 1}\n  - name: exec\n    image: busybox:1.36\n    command: [sleep, '3600']\n    livenessProbe: {exec: {command: [/no/such/binary]}, periodSeconds: 1, failureThreshold: 1}\n",
        ),
    );
    let uid = n.uid("probeerr");
    let running = n.wait_running(&uid, &["app", "exec"], Duration::from_secs(30));
    let unknown = |kind: &str, c: &str| {
        n.get("/metrics/probes")
            .unwrap_or_default()
            .lines()
            .find(|l| {
                l.starts_with(&format!(
                    "prober_probe_total{{probe_type=\"{kind}\",result=\"unknown\",container=\"{c}\""
                ))
            })
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // Five periods of errors each, against a failure threshold of one.
    wait_until(Duration::from_secs(40), "five errored probes each", || {
        unknown("Liveness", "app") >= 5.0
            && unknown("Readiness", "app") >= 5.0
            && unknown("Liveness", "exec") >= 5.0
    });
    let st = status(&n, "probeerr");
    for (i, c) in ["app", "exec"].iter().enumerate() {
        let cs = &st["containerStatuses"][i];
        assert_eq!(cs["name"], *c, "{st}");
        assert_eq!(cs["restartCount"], 0, "{st}");
        assert!(cs["state"]["running"].is_object(), "{st}");
    }
    assert_eq!(st["containerStatuses"][0]["ready"], false, "{st}");
    assert_eq!(st["containerStatuses"][1]["ready"], true, "{st}");
    assert_eq!(condition(&st, "Ready"), "False", "{st}");
    // The same instances still run in the runtime.
    let now = common::running_by_name(&n.runtime.containers(&uid));
    for c in ["app", "exec"] {
        assert_eq!(now[c].id, running[c].id, "{c} was not replaced");
    }
    let events = n.get("/events").unwrap();
    assert!(
        events.contains(
            "Liveness probe errored and resulted in unknown state: couldn't find port \\\"admin\\\" in container \\\"app\\\""
        ),
        "{events}"
    );
    assert!(
        events
            .contains("Readiness probe errored and resulted in unknown state: couldn't find port"),
        "{events}"
    );
    assert!(
        !events.contains("failed liveness probe"),
        "nothing was killed: {events}"
    );
    let probes = n.get("/metrics/probes").unwrap();
    assert!(
        !probes.contains("result=\"failed\",container=\"app\""),
        "no failure counted: {probes}"
    );
}
