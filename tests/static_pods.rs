//! Static pods on a real containerd: the walking skeleton end to end.
//! Needs the environment of `scripts/env/up.sh` (run by `scripts/test.sh`).
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

mod common;

use std::time::Duration;

use common::{pod_cgroup_dirs, running_by_name, wait_until, Nodelet};
use nodelet::cri::api;
use nodelet::kuberuntime::labels;

const TWO_CONTAINERS: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: duo
  namespace: team-a
  labels: {app: duo}
spec:
  terminationGracePeriodSeconds: 3
  containers:
  - name: alpha
    image: busybox:1.36
    command: ["sh", "-c", "trap 'exit 0' TERM; echo alpha says $(MSG) in $(NS); while true; do sleep 1 & wait; done"]
    env:
    - {name: MSG, value: hello}
    - name: NS
      valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
  - name: beta
    image: busybox
    command: ["sh", "-c", "trap 'exit 0' TERM; echo beta up; while true; do sleep 1 & wait; done"]
"#;

#[test]
fn two_container_pod_runs_with_kubelet_labels_and_logs() {
    let mut n = Nodelet::new("duo");
    n.start();
    n.write_manifest("duo.yaml", TWO_CONTAINERS);
    let uid = n.uid("duo");
    let running = n.wait_running(&uid, &["alpha", "beta"], Duration::from_secs(30));

    // Labels as kubelet writes them, on the sandbox and on each container.
    let sandboxes = n.runtime.sandboxes(&uid);
    assert_eq!(sandboxes.len(), 1);
    let sb = &sandboxes[0];
    let full_name = format!("duo-{}", n.node);
    assert_eq!(sb.labels[labels::POD_NAME], full_name);
    assert_eq!(sb.labels[labels::POD_NAMESPACE], "team-a");
    assert_eq!(sb.labels[labels::POD_UID], uid);
    assert_eq!(sb.labels["app"], "duo");
    assert_eq!(sb.annotations["kubernetes.io/config.source"], "file");
    assert_eq!(sb.state, api::PodSandboxState::SandboxReady as i32);
    for (name, c) in &running {
        assert_eq!(&c.labels[labels::CONTAINER_NAME], name);
        assert_eq!(c.labels[labels::POD_NAME], full_name);
        assert_eq!(c.labels[labels::POD_NAMESPACE], "team-a");
        assert_eq!(c.labels[labels::POD_UID], uid);
        assert_eq!(c.annotations[labels::CONTAINER_RESTART_COUNT], "0");
        assert!(!c.annotations[labels::CONTAINER_HASH].is_empty());
        assert_eq!(c.pod_sandbox_id, sb.id);
        // The process is alive on the host.
        let pid = n.runtime.container_pid(&c.id).expect("task pid");
        assert!(
            std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "process of {name} alive"
        );
        // The log is where kubelet writes it.
        let st = n.runtime.container_status(&c.id);
        let want_log = n
            .logs()
            .join(format!("team-a_{full_name}_{uid}"))
            .join(name)
            .join("0.log");
        assert_eq!(st.log_path, want_log.display().to_string());
    }
    let alpha_log = n
        .logs()
        .join(format!("team-a_{full_name}_{uid}/alpha/0.log"));
    wait_until(Duration::from_secs(10), "alpha log line", || {
        std::fs::read_to_string(&alpha_log)
            .unwrap_or_default()
            .contains("alpha says hello in team-a")
    });
    let line = std::fs::read_to_string(&alpha_log).unwrap();
    assert!(
        line.contains(" stdout F alpha says hello in team-a"),
        "CRI log format: {line}"
    );

    // /pods reports the pod Running with both containers running.
    wait_until(Duration::from_secs(10), "phase Running", || {
        n.pod("duo")
            .is_some_and(|p| p["status"]["phase"] == "Running")
    });
    let p = n.pod("duo").unwrap();
    let states: Vec<bool> = p["status"]["containerStatuses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["state"]["running"].is_object())
        .collect();
    assert_eq!(states, vec![true, true]);
    assert!(p["status"]["podIP"]
        .as_str()
        .is_some_and(|ip| !ip.is_empty()));
    assert_eq!(p["status"]["qosClass"], "BestEffort");
}

#[test]
fn init_containers_run_in_order_before_app_containers() {
    let mut n = Nodelet::new("init");
    n.start();
    n.write_manifest(
        "init.yaml",
        r#"apiVersion: v1
kind: Pod
metadata: {name: init}
spec:
  terminationGracePeriodSeconds: 2
  initContainers:
  - {name: first, image: busybox:1.36, command: ["sh", "-c", "sleep 1; echo first done"]}
  - {name: second, image: busybox:1.36, command: ["sh", "-c", "echo second done"]}
  containers:
  - {name: app, image: busybox:1.36, command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1 & wait; done"]}
"#,
    );
    let uid = n.uid("init");
    n.wait_running(&uid, &["app"], Duration::from_secs(30));
    let all = n.runtime.containers(&uid);
    let status = |name: &str| {
        let c = all
            .iter()
            .find(|c| c.labels[labels::CONTAINER_NAME] == name)
            .unwrap_or_else(|| panic!("{name} exists"));
        n.runtime.container_status(&c.id)
    };
    let (first, second, app) = (status("first"), status("second"), status("app"));
    assert_eq!((first.exit_code, second.exit_code), (0, 0));
    assert_eq!(first.state, api::ContainerState::ContainerExited as i32);
    assert!(
        first.finished_at <= second.started_at,
        "second starts after first finished"
    );
    assert!(
        second.finished_at <= app.started_at,
        "app starts after the init containers finished"
    );
    assert!(
        first.finished_at - first.started_at >= 900_000_000,
        "first ran its full second"
    );
    assert_eq!(all.len(), 3, "each init container ran once");
    wait_until(Duration::from_secs(10), "Initialized", || {
        n.pod("init").is_some_and(|p| {
            p["status"]["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["type"] == "Initialized" && c["status"] == "True")
        })
    });
}

#[test]
fn editing_a_container_restarts_only_that_container() {
    let mut n = Nodelet::new("edit");
    n.start();
    n.write_manifest("duo.yaml", TWO_CONTAINERS);
    let uid = n.uid("duo");
    let before = n.wait_running(&uid, &["alpha", "beta"], Duration::from_secs(30));
    let sandbox = before["alpha"].pod_sandbox_id.clone();

    // Change beta's image and command; alpha is untouched.
    let edited = TWO_CONTAINERS
        .replace("image: busybox\n", "image: busybox:1.35\n")
        .replace("echo beta up", "echo beta v2");
    n.write_manifest("duo.yaml", &edited);
    let mut after = Default::default();
    wait_until(Duration::from_secs(30), "beta replaced", || {
        after = running_by_name(&n.runtime.containers(&uid));
        after.get("beta").is_some_and(|c| c.id != before["beta"].id)
    });
    assert_eq!(
        after["alpha"].id, before["alpha"].id,
        "alpha was not restarted"
    );
    assert_eq!(after["beta"].metadata.as_ref().unwrap().attempt, 1);
    let (old_st, new_st) = (
        n.runtime.container_status(&before["beta"].id),
        n.runtime.container_status(&after["beta"].id),
    );
    assert_ne!(
        new_st.image_ref, old_st.image_ref,
        "beta runs the new image"
    );
    assert_eq!(after["beta"].pod_sandbox_id, sandbox, "same sandbox");
    assert_eq!(
        n.pod("duo").unwrap()["metadata"]["uid"],
        uid.as_str(),
        "same pod UID"
    );
    // The old beta was stopped by SIGTERM within its grace period (exit 0 from its trap).
    let old = n.runtime.container_status(&before["beta"].id);
    assert_eq!(old.state, api::ContainerState::ContainerExited as i32);
    assert_eq!(old.exit_code, 0);
}

#[test]
fn removing_the_manifest_leaves_no_sandbox_container_or_cgroup() {
    let mut n = Nodelet::new("remove");
    n.start();
    n.write_manifest("duo.yaml", TWO_CONTAINERS);
    let uid = n.uid("duo");
    n.wait_running(&uid, &["alpha", "beta"], Duration::from_secs(30));
    assert!(
        !pod_cgroup_dirs(&n.cgroup_root, &uid).is_empty(),
        "pod cgroup exists while running"
    );

    std::fs::remove_file(n.manifests().join("duo.yaml")).unwrap();
    wait_until(
        Duration::from_secs(20),
        "sandboxes and containers gone",
        || n.runtime.sandboxes(&uid).is_empty() && n.runtime.containers(&uid).is_empty(),
    );
    // The pod's cgroups go right after its sandbox, and its status last.
    wait_until(Duration::from_secs(5), "pod gone from /pods", || {
        n.pod("duo").is_none()
    });
    assert!(
        pod_cgroup_dirs(&n.cgroup_root, &uid).is_empty(),
        "no pod<UID> cgroup left in any hierarchy"
    );
    let logs = n.logs().join(format!("team-a_duo-{}_{uid}", n.node));
    assert!(!logs.exists(), "pod log directory removed");
    assert!(n.log().contains("killing pod"), "kill was logged");
}

#[test]
fn sigkill_and_restart_restarts_no_container() {
    let mut n = Nodelet::new("adopt");
    n.start();
    n.write_manifest("duo.yaml", TWO_CONTAINERS);
    let uid = n.uid("duo");
    let before = n.wait_running(&uid, &["alpha", "beta"], Duration::from_secs(30));
    wait_until(Duration::from_secs(10), "pod Running", || {
        n.pod("duo")
            .is_some_and(|p| p["status"]["phase"] == "Running")
    });
    n.kill9();
    n.start();
    // Let several syncs and housekeeping passes happen.
    wait_until(Duration::from_secs(10), "pod listed after restart", || {
        n.pod("duo")
            .is_some_and(|p| p["status"]["phase"] == "Running")
    });
    n.wait_for_housekeeping(2);
    let after = running_by_name(&n.runtime.containers(&uid));
    assert_eq!(after.len(), 2);
    for name in ["alpha", "beta"] {
        assert_eq!(after[name].id, before[name].id, "{name} not restarted");
    }
    assert_eq!(
        n.runtime.containers(&uid).len(),
        2,
        "no new container was created"
    );
    assert_eq!(
        n.runtime.sandboxes(&uid).len(),
        1,
        "no new sandbox was created"
    );
    assert_eq!(n.pod("duo").unwrap()["metadata"]["uid"], uid.as_str());
}

#[test]
fn manifest_removed_while_agent_is_down_is_cleaned_up_on_start() {
    let mut n = Nodelet::new("orphan");
    n.start();
    n.write_manifest("duo.yaml", TWO_CONTAINERS);
    let uid = n.uid("duo");
    n.wait_running(&uid, &["alpha", "beta"], Duration::from_secs(30));
    n.kill9();
    std::fs::remove_file(n.manifests().join("duo.yaml")).unwrap();
    n.start();
    wait_until(
        Duration::from_secs(20),
        "orphaned pod removed by housekeeping",
        || n.runtime.sandboxes(&uid).is_empty(),
    );
    assert!(n.runtime.containers(&uid).is_empty());
}

#[test]
fn broken_manifests_are_reported_and_the_good_pod_runs() {
    let mut n = Nodelet::new("broken");
    n.start();
    let good = "apiVersion: v1\nkind: Pod\nmetadata: {name: good}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {name: c, image: busybox:1.36, command: [sh, -c, \"trap 'exit 0' TERM; while true; do sleep 1 & wait; done\"]}\n";
    n.write_manifest("good.yaml", good);
    n.write_manifest(
        "bad-yaml.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: x\n",
    );
    n.write_manifest(
        "no-containers.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: empty}\nspec: {containers: []}\n",
    );
    n.write_manifest(
        "escape.yaml",
        &good.replace("name: good", "name: ../../etc"),
    );
    n.write_manifest("bad-ns.json", r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"x","namespace":"a/b"},"spec":{"containers":[{"name":"c","image":"busybox"}]}}"#);
    n.write_manifest("zz-duplicate.yaml", good);
    let victim = n.dir.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("canary"), "precious").unwrap();
    n.write_manifest(
        "uid-escape.yaml",
        &good.replace("{name: good}", "{name: trav, uid: x/../../victim}"),
    );
    // Quantities that once overflowed the parser (and killed the file source).
    n.write_manifest(
        "huge-cpu.yaml",
        &good.replace("{name: good}", "{name: huge}").replace(
            "image: busybox:1.36,",
            "image: busybox:1.36, resources: {requests: {cpu: \"1e2147483647\"}},",
        ),
    );
    let uid = n.uid("good");
    n.wait_running(&uid, &["c"], Duration::from_secs(30));

    let events = n.get("/events").unwrap();
    for (file, field) in [
        ("bad-yaml.yaml", ""),
        ("no-containers.yaml", "spec.containers"),
        ("escape.yaml", "metadata.name"),
        ("bad-ns.json", "metadata.namespace"),
        ("zz-duplicate.yaml", "metadata.name"),
        ("uid-escape.yaml", "metadata.uid"),
        ("huge-cpu.yaml", "resources"),
    ] {
        let hit = events.contains(&format!("manifest {}", n.manifests().join(file).display()))
            && events.contains(field);
        assert!(hit, "event for {file} naming {field:?}: {events}");
    }
    assert!(
        events.contains("DuplicatePod") && events.contains("good.yaml"),
        "duplicate names the first file"
    );
    let metrics = n.get("/metrics").unwrap();
    let total: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("nodelet_static_pod_manifest_errors_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(total, 7, "{metrics}");
    assert_eq!(n.pods().len(), 1, "only the good pod is admitted");
    assert_eq!(n.get("/healthz").as_deref(), Some("ok"));
    // No pod named after the escaping name exists, and nothing was written outside podLogsDir.
    assert!(!n.dir.path().join("etc").exists());
    assert!(n.log().contains("static pod manifest refused"));
    // The agent keeps working: a new good manifest is picked up.
    n.write_manifest("good2.yaml", &good.replace("name: good", "name: good2"));
    let uid2 = n.uid("good2");
    n.wait_running(&uid2, &["c"], Duration::from_secs(30));
    assert_eq!(
        running_by_name(&n.runtime.containers(&uid)).len(),
        1,
        "first good pod still running"
    );
    std::fs::remove_file(n.manifests().join("uid-escape.yaml")).unwrap();
    n.wait_for_housekeeping(1);
    assert_eq!(
        std::fs::read_to_string(victim.join("canary")).unwrap(),
        "precious"
    );
}

const LOOP: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: NAME}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {name: c, image: busybox:1.36, command: [sh, -c, \"trap 'exit 0' TERM; while true; do sleep 1 & wait; done\"]}\n";

#[test]
fn a_broken_edit_keeps_the_pod_across_an_agent_restart() {
    let mut n = Nodelet::new("keep");
    n.start();
    n.write_manifest("p.yaml", &LOOP.replace("NAME", "keep"));
    let uid = n.uid("keep");
    let before = n.wait_running(&uid, &["c"], Duration::from_secs(30));
    n.write_manifest(
        "p.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: keep\n",
    );
    wait_until(Duration::from_secs(10), "decode error reported", || {
        n.get("/events").is_some_and(|e| e.contains("DecodeError"))
    });
    n.kill9();
    n.start();
    n.wait_for_housekeeping(2);
    let after = running_by_name(&n.runtime.containers(&uid));
    assert_eq!(
        after.get("c").map(|c| &c.id),
        Some(&before["c"].id),
        "the pod kept running, same container"
    );
    assert!(n.pod("keep").is_some());
    // Removing the broken manifest removes the pod.
    std::fs::remove_file(n.manifests().join("p.yaml")).unwrap();
    wait_until(Duration::from_secs(20), "pod removed", || {
        n.runtime.sandboxes(&uid).is_empty()
    });
}

/// A BestEffort pod writing its uid into a hostPath directory (`DIR` is replaced).
const WRITER: &str = r#"apiVersion: v1
kind: Pod
metadata: {name: writer}
spec:
  terminationGracePeriodSeconds: 1
  volumes: [{name: out, hostPath: {path: DIR, type: Directory}}]
  containers:
  - name: w
    image: busybox
    command: ["sh", "-c", "trap 'exit 0' TERM; id -u > /out/uid; while true; do sleep 1 & wait; done"]
    volumeMounts: [{name: out, mountPath: /out}]
"#;

#[test]
fn a_pod_level_edit_makes_the_pod_again_with_the_new_spec() {
    let mut n = Nodelet::new("podedit");
    n.start();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // The container runs as uid 1000 after the edit: it must be able to write into b.
    std::fs::set_permissions(
        b.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let before_text = WRITER.replace("DIR", &a.path().display().to_string());
    n.write_manifest("writer.yaml", &before_text);
    let uid = n.uid("writer");
    let before = n.wait_running(&uid, &["w"], Duration::from_secs(30))["w"].clone();
    wait_until(
        Duration::from_secs(10),
        "uid written to the first path",
        || std::fs::read_to_string(a.path().join("uid")).is_ok_and(|t| t.trim() == "0"),
    );
    let besteffort: Vec<_> = pod_cgroup_dirs(&n.cgroup_root, &uid);
    assert!(
        !besteffort.is_empty()
            && besteffort
                .iter()
                .all(|d| d.display().to_string().contains("besteffort")),
        "the pod's cgroups, all under besteffort: {besteffort:?}"
    );
    // Three pod-level edits at once, none of them in the container's own spec: the hostPath,
    // the pod's runAsUser, and a memory request (BestEffort → Burstable).
    let edited = before_text
        .replace(
            &a.path().display().to_string(),
            &b.path().display().to_string(),
        )
        .replace(
            "  containers:",
            "  securityContext: {runAsUser: 1000}\n  containers:",
        )
        .replace(
            "    volumeMounts:",
            "    resources: {requests: {memory: 32Mi}}\n    volumeMounts:",
        );
    n.write_manifest("writer.yaml", &edited);
    let mut after = Default::default();
    wait_until(Duration::from_secs(40), "the container made again", || {
        after = running_by_name(&n.runtime.containers(&uid));
        after.get("w").is_some_and(|c| c.id != before.id)
    });
    let after = &after["w"];
    assert_ne!(
        after.pod_sandbox_id, before.pod_sandbox_id,
        "a new sandbox for the new pod-level spec"
    );
    assert_eq!(n.pod("writer").unwrap()["metadata"]["uid"], uid.as_str());
    wait_until(
        Duration::from_secs(10),
        "uid 1000 written to the new path",
        || std::fs::read_to_string(b.path().join("uid")).is_ok_and(|t| t.trim() == "1000"),
    );
    // The container runs in the Burstable pod cgroup; nothing of the pod is left in besteffort.
    let pid = n.runtime.container_pid(&after.id).expect("container pid");
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let memory = cgroups
        .lines()
        .find(|l| {
            l.split(':')
                .nth(1)
                .is_some_and(|c| c.split(',').any(|c| c == "memory"))
        })
        .unwrap_or_else(|| panic!("no memory line in {cgroups}"));
    assert!(
        memory.contains(&format!("/kubepods/burstable/pod{uid}/")),
        "{memory}"
    );
    wait_until(Duration::from_secs(10), "no besteffort pod cgroup", || {
        let dirs = pod_cgroup_dirs(&n.cgroup_root, &uid);
        !dirs.is_empty()
            && dirs
                .iter()
                .all(|d| !d.display().to_string().contains("besteffort"))
    });
    let events = n.get("/events").unwrap();
    assert!(events.contains("SandboxChanged"), "{events}");
}

#[test]
fn an_edited_finished_pod_runs_its_new_version() {
    let mut n = Nodelet::new("rerun");
    n.start();
    let out = tempfile::tempdir().unwrap();
    let job = |word: &str| {
        format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: job}}\nspec:\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 1\n  volumes: [{{name: o, hostPath: {{path: {}, type: Directory}}}}]\n  containers:\n  - {{name: c, image: busybox:1.36, command: [sh, -c, 'echo {word} >> /o/ran'], volumeMounts: [{{name: o, mountPath: /o}}]}}\n", out.path().display())
    };
    n.write_manifest("job.yaml", &job("first"));
    let uid = n.uid("job");
    wait_until(
        Duration::from_secs(30),
        "the first version Succeeded",
        || {
            n.pod("job")
                .is_some_and(|p| p["status"]["phase"] == "Succeeded")
        },
    );
    // kubelet runs an edited static pod as a new pod: the new command runs once, even though
    // the old version finished under restartPolicy Never.
    n.write_manifest("job.yaml", &job("second"));
    wait_until(Duration::from_secs(30), "the second version ran", || {
        std::fs::read_to_string(out.path().join("ran")).is_ok_and(|t| t == "first\nsecond\n")
    });
    wait_until(Duration::from_secs(30), "Succeeded again", || {
        n.pod("job")
            .is_some_and(|p| p["status"]["phase"] == "Succeeded")
    });
    assert_eq!(n.pod("job").unwrap()["metadata"]["uid"], uid.as_str());
    // Finished again: nothing more runs.
    n.wait_for_housekeeping(2);
    assert_eq!(
        std::fs::read_to_string(out.path().join("ran")).unwrap(),
        "first\nsecond\n"
    );
}

/// A pod whose container takes about 4 s to stop after SIGTERM (its grace period is 20 s).
const SLOW_TO_STOP: &str = r#"apiVersion: v1
kind: Pod
metadata: {name: slow}
spec:
  terminationGracePeriodSeconds: 20
  containers:
  - name: c
    image: busybox
    command: ["sh", "-c", "trap 'sleep 4; exit 0' TERM; while true; do sleep 1 & wait; done"]
"#;

#[test]
fn a_renamed_manifest_starts_its_pod_only_after_the_old_one_has_terminated() {
    let mut n = Nodelet::new("rename");
    n.start();
    n.write_manifest("slow.yaml", SLOW_TO_STOP);
    let old_uid = n.uid("slow");
    let old = n.wait_running(&old_uid, &["c"], Duration::from_secs(30))["c"].clone();
    // A rename gives the pod a new UID (from the path): the old pod is killed and the new one
    // must wait until the old has terminated (kubelet's static pod start gating), not run
    // beside it for the 4 s the old container takes to stop.
    std::fs::rename(
        n.manifests().join("slow.yaml"),
        n.manifests().join("renamed.yaml"),
    )
    .unwrap();
    let new_uid = nodelet::source::manifest::static_pod_uid(
        &n.manifests().join("renamed.yaml"),
        &n.node,
        "default",
        "slow",
    );
    assert_ne!(new_uid, old_uid);
    // Until the new pod runs: whenever the old container is seen running, the new pod has no
    // sandbox; the old container's stop time is kept (the container is removed with its pod).
    let mut old_finished = 0;
    let mut seen_waiting = false;
    let mut seen_pending = false;
    let mut seen_terminating = false;
    wait_until(Duration::from_secs(40), "the new pod running", || {
        seen_terminating |= n.pods().iter().any(|p| {
            p["metadata"]["uid"] == old_uid.as_str()
                && p["metadata"]["deletionTimestamp"].is_string()
                && p["metadata"]["deletionGracePeriodSeconds"] == 20
        });
        let new_sandboxes = n.runtime.sandboxes(&new_uid);
        match n.runtime.try_container_status(&old.id) {
            Some(st) if st.state == api::ContainerState::ContainerRunning as i32 => {
                assert!(
                    new_sandboxes.is_empty(),
                    "the new pod has a sandbox while the old container runs"
                );
                seen_waiting = true;
                // Listed while it waits, Pending (kubelet lists every pod it knows).
                seen_pending |= n.pods().iter().any(|p| {
                    p["metadata"]["uid"] == new_uid.as_str() && p["status"]["phase"] == "Pending"
                });
            }
            Some(st) if st.finished_at > 0 => {
                assert_eq!(st.exit_code, 0, "the old container ran its TERM trap");
                old_finished = st.finished_at;
            }
            _ => {}
        }
        running_by_name(&n.runtime.containers(&new_uid)).contains_key("c")
    });
    assert!(seen_waiting, "the old container was seen stopping");
    assert!(seen_pending, "/pods listed the waiting pod Pending");
    assert!(
        seen_terminating,
        "/pods showed the old pod Terminating (deletionTimestamp, grace 20 s)"
    );
    assert!(old_finished > 0, "the old container's stop was seen");
    let sandbox = &n.runtime.sandboxes(&new_uid)[0];
    assert!(
        sandbox.created_at >= old_finished,
        "the new pod's sandbox was made {} ms before the old container stopped",
        (old_finished - sandbox.created_at) / 1_000_000
    );
    assert!(
        n.log()
            .contains("static pod waits for the previous pod of the same name to terminate"),
        "the wait is logged"
    );
}

#[test]
fn a_symlinked_manifest_runs_at_once_and_its_dangling_link_is_reported() {
    let mut n = Nodelet::new("symlink");
    n.start();
    let elsewhere = tempfile::tempdir().unwrap();
    let target = elsewhere.path().join("linked.yaml");
    std::fs::write(&target, LOOP.replace("NAME", "linked")).unwrap();
    // The pod is listed well before MAX_WRITE (10 s), which a symlink's creation (no write,
    // no close) used to wait out.
    let made = std::time::Instant::now();
    std::os::unix::fs::symlink(&target, n.manifests().join("linked.yaml")).unwrap();
    let uid = n.uid("linked");
    assert!(
        made.elapsed() < Duration::from_secs(6),
        "listed after {:?}",
        made.elapsed()
    );
    n.wait_running(&uid, &["c"], Duration::from_secs(30));
    // The target goes: the pod goes, and the link is named in an event.
    std::fs::remove_file(&target).unwrap();
    wait_until(Duration::from_secs(20), "pod removed", || {
        n.runtime.sandboxes(&uid).is_empty()
    });
    let events = n.get("/events").unwrap();
    assert!(events.contains("DanglingSymlink"), "{events}");
    assert!(
        events.contains(&format!("is a symlink to {}", target.display())),
        "{events}"
    );
}

#[test]
fn a_recreated_manifest_directory_is_watched_again() {
    // fileCheckFrequency 1m: only inotify can pick the new manifest up within the waits below.
    let mut n = Nodelet::with_config("rewatch", "");
    let cfg = std::fs::read_to_string(n.config_path())
        .unwrap()
        .replace("fileCheckFrequency: 2s", "fileCheckFrequency: 1m");
    std::fs::write(n.config_path(), cfg).unwrap();
    n.start();
    n.write_manifest("a.yaml", &LOOP.replace("NAME", "a"));
    n.uid("a");
    std::fs::remove_dir_all(n.manifests()).unwrap();
    wait_until(Duration::from_secs(20), "pod a removed", || {
        n.pod("a").is_none()
    });
    std::fs::create_dir(n.manifests()).unwrap();
    n.write_manifest("b.yaml", &LOOP.replace("NAME", "b"));
    wait_until(
        Duration::from_secs(15),
        "pod b listed through inotify",
        || n.pod("b").is_some(),
    );
}

/// A one-route HTTP server for `staticPodURL`: answers every request with the status and body
/// set in `reply`, and keeps each request's head in `heads`.
struct PodServer {
    url: String,
    reply: std::sync::Arc<std::sync::Mutex<(u16, String)>>,
    heads: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl PodServer {
    fn start() -> Self {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/pods", listener.local_addr().unwrap());
        let reply = std::sync::Arc::new(std::sync::Mutex::new((200, String::new())));
        let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (r, h) = (reply.clone(), heads.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).is_ok_and(|n| n == 1) {
                    head.push(byte[0]);
                }
                h.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&head).into_owned());
                let (status, body) = r.lock().unwrap().clone();
                let _ = write!(
                    conn,
                    "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        PodServer { url, reply, heads }
    }

    fn set(&self, status: u16, body: &str) {
        *self.reply.lock().unwrap() = (status, body.to_owned());
    }

    fn requests(&self) -> usize {
        self.heads.lock().unwrap().len()
    }
}

fn url_pod(name: &str) -> String {
    format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: c, image: busybox:1.36, command: [sleep, '3600']}}\n")
}

#[test]
fn pods_from_a_static_pod_url_run_survive_a_failing_url_and_follow_its_body() {
    let server = PodServer::start();
    let list = format!(
        "apiVersion: v1\nkind: PodList\nitems:\n- {}\n- {}\n",
        serde_json::to_string(&serde_yaml::from_str::<serde_json::Value>(&url_pod("a")).unwrap())
            .unwrap(),
        serde_json::to_string(&serde_yaml::from_str::<serde_json::Value>(&url_pod("b")).unwrap())
            .unwrap()
    );
    server.set(200, &list);
    let mut n = Nodelet::with_config(
        "url",
        &format!(
            "staticPodURL: {}\nstaticPodURLHeader: {{X-Token: [t0ken]}}\nhttpCheckFrequency: 300ms\n",
            server.url
        ),
    );
    n.start();
    let (a, b) = (n.uid("a"), n.uid("b"));
    let a_id = n.wait_running(&a, &["c"], Duration::from_secs(60))["c"]
        .id
        .clone();
    n.wait_running(&b, &["c"], Duration::from_secs(60));
    let pod = n.pod("a").unwrap();
    assert_eq!(
        pod["metadata"]["annotations"]["kubernetes.io/config.source"],
        "http"
    );
    assert!(
        server.heads.lock().unwrap()[0].contains("x-token: t0ken"),
        "staticPodURLHeader sent"
    );

    // Failing fetches change nothing and are reported once each.
    let reported = |reason: &str| {
        let list: serde_json::Value = serde_json::from_str(&n.get("/events").unwrap()).unwrap();
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| {
                e["reason"] == reason && e["involvedObject"] == format!("url:{}", server.url)
            })
            .count()
    };
    for (status, body, reason) in [(500, "", "ReadError"), (200, "kind: [", "DecodeError")] {
        server.set(status, body);
        let seen = server.requests();
        wait_until(Duration::from_secs(10), "five more fetches", || {
            server.requests() >= seen + 5
        });
        assert_eq!(reported(reason), 1, "{reason} reported once");
        assert_eq!(n.runtime.containers(&a).len(), 1, "a runs on");
        assert_eq!(n.runtime.containers(&b).len(), 1, "b runs on");
    }

    // One pod now: b goes, a stays as it was.
    server.set(200, &url_pod("a"));
    wait_until(Duration::from_secs(30), "b removed", || {
        n.runtime.sandboxes(&b).is_empty()
    });
    let still = n.wait_running(&a, &["c"], Duration::from_secs(5));
    assert_eq!(still["c"].id, a_id, "a not restarted");

    // A misspelled field: named once in a Warning, dropped, and a runs on unchanged.
    let typo = url_pod("a").replace("command:", "imagePullPolicyy: Always, command:");
    server.set(200, &typo);
    let seen = server.requests();
    wait_until(Duration::from_secs(10), "five more fetches", || {
        server.requests() >= seen + 5
    });
    assert_eq!(reported("UnknownField"), 1, "UnknownField reported once");
    let events: serde_json::Value = serde_json::from_str(&n.get("/events").unwrap()).unwrap();
    let message = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["reason"] == "UnknownField")
        .map(|e| e["message"].as_str().unwrap().to_owned())
        .unwrap();
    assert!(
        message.contains("spec.containers[0].imagePullPolicyy"),
        "{message}"
    );
    let still = n.wait_running(&a, &["c"], Duration::from_secs(5));
    assert_eq!(still["c"].id, a_id, "a not restarted by a dropped field");
    // An empty body: no pods.
    server.set(200, "");
    wait_until(Duration::from_secs(30), "a removed", || {
        n.runtime.sandboxes(&a).is_empty()
    });
}

/// A manifest with `ephemeralContainers` is refused, as kubelet refuses it (the API server's
/// `ValidatePodCreate`: they are added to a running pod, never created with it); the refusal
/// names the field and the file, and the pod beside it runs.
#[test]
fn a_manifest_with_ephemeral_containers_is_refused_naming_the_field() {
    let mut n = Nodelet::new("ephemeral");
    n.start();
    let manifest = LOOP.replace("NAME", "debugged").replace(
        "  containers:",
        "  ephemeralContainers: [{name: debug, image: busybox:1.36, command: [sleep, '3600']}]\n  containers:",
    );
    n.write_manifest("debugged.yaml", &manifest);
    n.write_manifest("plain.yaml", &LOOP.replace("NAME", "plain"));
    let uid = n.uid("plain");
    n.wait_running(&uid, &["c"], Duration::from_secs(30));
    let mut events = String::new();
    wait_until(Duration::from_secs(10), "the refusal reported", || {
        events = n.get("/events").unwrap_or_default();
        events.contains("spec.ephemeralContainers") && events.contains("cannot be set on create")
    });
    assert!(events.contains("debugged.yaml"), "{events}");
    assert!(n.pod("debugged").is_none(), "not admitted");
    assert_eq!(n.pods().len(), 1);
}
