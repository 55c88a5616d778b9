//! Hostile input: a deeply nested manifest is refused at once without delaying other manifests;
//! a directory of broken, nested and huge manifests leaves no memory behind once it is gone; a
//! pod cgroup that cannot be removed is reported once, not on every housekeeping pass. On the
//! real containerd; needs `scripts/env/up.sh`.
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

mod common;
mod hostile_dir;

use std::time::{Duration, Instant};

use common::{wait_until, Nodelet};

fn good(name: &str) -> String {
    format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: c, image: busybox:1.36, command: [sleep, '3600']}}\n")
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

#[test]
fn a_deeply_nested_manifest_is_refused_at_once_and_delays_no_other() {
    let mut n = Nodelet::new("nested");
    n.start();
    n.write_manifest("deep.yaml", &hostile_dir::nested());
    wait_until(Duration::from_secs(5), "nested file refused", || {
        n.get("/events").is_some_and(|e| e.contains("deep.yaml"))
    });
    let written = Instant::now();
    n.write_manifest("good.yaml", &good("good"));
    let uid = n.uid("good");
    wait_until(Duration::from_secs(2), "the good pod's sandbox", || {
        !n.runtime.sandboxes(&uid).is_empty()
    });
    assert!(written.elapsed() < Duration::from_secs(2));
    let events = n.get("/events").unwrap();
    assert_eq!(
        events.matches("\"reason\":\"DecodeError\"").count(),
        1,
        "{events}"
    );
    assert!(events.contains("nest more than 64 levels"), "{events}");
}

#[test]
fn a_hostile_directory_leaves_no_memory_behind_once_it_is_gone() {
    let mut n = Nodelet::new("hostile");
    n.start();
    let pid = n.child.as_ref().unwrap().id();
    // Settle the agent first: one good pod running, a few housekeeping passes.
    n.write_manifest("good.yaml", &good("good"));
    let uid = n.uid("good");
    n.wait_running(&uid, &["c"], Duration::from_secs(30));
    n.wait_for_housekeeping(2);
    let before = rss_kib(pid);
    for i in 0..160 {
        n.write_manifest(
            &format!("broken{i}.yaml"),
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: b{i}\nspec: [{}\n",
                "x".repeat(2000)
            ),
        );
    }
    n.write_manifest("deep.yaml", &hostile_dir::nested());
    n.write_manifest(
        "huge.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: huge}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: c, image: busybox:1.36, command: [sh, -c, '{}']}}\n",
            "x".repeat(3_000_000)
        ),
    );
    wait_until(Duration::from_secs(30), "hostile files seen", || {
        n.metric("nodelet_static_pod_manifest_errors_total{reason=\"DecodeError\"}") >= 161.0
            && n.pod("huge").is_some()
    });
    let peak = rss_kib(pid);
    for e in std::fs::read_dir(n.manifests()).unwrap().flatten() {
        if e.file_name() != "good.yaml" {
            std::fs::remove_file(e.path()).unwrap();
        }
    }
    wait_until(Duration::from_secs(30), "huge pod gone", || {
        n.pod("huge").is_none()
    });
    n.wait_for_housekeeping(3);
    let after = rss_kib(pid);
    assert!(
        after <= before + 4096,
        "RSS before {before} KiB, peak {peak} KiB, after {after} KiB"
    );
}

/// Removes a sandbox of another "agent" on drop, even when the test fails.
struct ForeignSandbox<'a> {
    runtime: &'a common::Runtime,
    id: String,
}

impl Drop for ForeignSandbox<'_> {
    fn drop(&mut self) {
        use nodelet::cri::RuntimeService;
        let _ = self
            .runtime
            .rt
            .block_on(self.runtime.cri.stop_pod_sandbox(&self.id));
        let _ = self
            .runtime
            .rt
            .block_on(self.runtime.cri.remove_pod_sandbox(&self.id));
    }
}

/// Kills and reaps a process on drop.
struct Held(std::process::Child);

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_busy_orphaned_pod_cgroup_is_reported_once_and_another_agents_is_left_alone() {
    use nodelet::cri::{api, RuntimeService};
    let mut n = Nodelet::new("busyorphan");
    n.start();
    let root = n.cgroup_root.trim_start_matches('/').to_string();
    // An orphan that holds a process: a sleep moved into its cgroup in the pids hierarchy.
    let uid = "busy-orphan-0001";
    let rel = format!("{root}/kubepods/besteffort/pod{uid}");
    for m in nodelet::cm::cgroup_mounts() {
        std::fs::create_dir_all(m.join(&rel)).unwrap();
    }
    let sleeper = Held(
        std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap(),
    );
    let procs = std::path::Path::new("/sys/fs/cgroup/pids")
        .join(&rel)
        .join("cgroup.procs");
    std::fs::write(&procs, sleeper.0.id().to_string()).unwrap();
    // A sandbox of another agent, whose pod cgroup sits under this agent's kubepods.
    let foreign_uid = "foreign-sandbox-0001";
    let labels: std::collections::HashMap<String, String> = [
        (
            nodelet::kuberuntime::labels::POD_UID.to_string(),
            foreign_uid.to_string(),
        ),
        (
            nodelet::kuberuntime::labels::NODE_NAME.to_string(),
            "another-node".to_string(),
        ),
    ]
    .into();
    let config = api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: "foreign".into(),
            uid: foreign_uid.into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        labels,
        linux: Some(api::LinuxPodSandboxConfig {
            cgroup_parent: format!("/{root}/kubepods/besteffort/pod{foreign_uid}"),
            ..Default::default()
        }),
        ..Default::default()
    };
    let id = n
        .runtime
        .rt
        .block_on(n.runtime.cri.run_pod_sandbox(config, ""))
        .unwrap();
    let _foreign = ForeignSandbox {
        runtime: &n.runtime,
        id,
    };

    wait_until(Duration::from_secs(10), "the busy orphan reported", || {
        n.log().contains("orphaned pod cgroup cannot be removed")
    });
    assert_eq!(n.metric("nodelet_orphaned_pod_cgroups"), 1.0);
    // Twenty seconds of housekeeping passes: nothing more at warning or info level.
    n.wait_for_housekeeping(10);
    let log = n.log();
    let loud = |needle: &str| {
        log.lines()
            .filter(|l| l.contains(needle) && (l.contains(" WARN ") || l.contains(" INFO ")))
            .count()
    };
    assert_eq!(loud(uid), 1, "{log}");
    assert_eq!(loud(foreign_uid), 0, "{log}");
    let events = n.get("/events").unwrap();
    assert_eq!(events.matches("OrphanedPodCgroup").count(), 1, "{events}");
    assert!(
        events.contains(&sleeper.0.id().to_string()),
        "the event names the process"
    );
    assert_eq!(n.metric("nodelet_orphaned_pod_cgroups"), 1.0);
    assert!(
        std::path::Path::new("/sys/fs/cgroup/pids")
            .join(format!("{root}/kubepods/besteffort/pod{foreign_uid}"))
            .exists(),
        "another agent's pod cgroup is left alone"
    );
    drop(sleeper);
}

/// Issue 14's hostile directory: 1,000 malformed or hostile entries beside 10 good manifests.
#[test]
fn a_thousand_hostile_files_beside_ten_good_ones() {
    let mut n = Nodelet::new("thousand");
    n.start();
    let pid = n.child.as_ref().unwrap().id();
    n.wait_for_housekeeping(1);
    let before = rss_kib(pid);
    let dir = n.manifests();
    let other = tempfile::tempdir().unwrap();
    let to_report = hostile_dir::write_thousand(&dir, other.path(), &good);
    for i in 0..10 {
        n.write_manifest(&format!("good{i}.yaml"), &good(&format!("good{i}")));
    }
    let uids: Vec<String> = (0..10).map(|i| n.uid(&format!("good{i}"))).collect();
    for uid in &uids {
        n.wait_running(uid, &["c"], Duration::from_secs(60));
    }
    let reported = |n: &Nodelet| -> f64 {
        n.get("/metrics")
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("nodelet_static_pod_manifest_errors_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    wait_until(Duration::from_secs(30), "every bad file reported", || {
        reported(&n) >= to_report as f64
    });
    // Listed again several times (fileCheckFrequency 2 s): each one reported once.
    let peak = rss_kib(pid);
    n.wait_for_housekeeping(4);
    assert_eq!(reported(&n), to_report as f64, "reported once each");
    assert!(n.get("/healthz").is_some_and(|b| b == "ok"));
    let bound_kib = 64 * 1024;
    let after = rss_kib(pid);
    eprintln!("{to_report} entries to report of 1,000 hostile ones: RSS before {before} KiB, peak {peak} KiB, after {after} KiB (bound: +{bound_kib} KiB)");
    assert!(
        peak.max(after) <= before + bound_kib,
        "RSS before {before} KiB, peak {peak}, after {after}"
    );
    for uid in &uids {
        assert_eq!(n.runtime.containers(uid).len(), 1, "{uid}");
    }
}
