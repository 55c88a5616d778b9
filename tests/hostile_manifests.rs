//! Hostile manifests: a deeply nested file is refused at once without delaying other
//! manifests, and a directory of broken, nested and huge manifests leaves no memory behind once
//! it is gone. On the real containerd; needs `scripts/env/up.sh`.

mod common;

use std::time::{Duration, Instant};

use common::{wait_until, Nodelet};

fn good(name: &str) -> String {
    format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: c, image: busybox:1.36, command: [sleep, '3600']}}\n")
}

fn nested() -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: deep, labels: {}{}}}\n",
        "[".repeat(100_000),
        "]".repeat(100_000)
    )
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
    n.write_manifest("deep.yaml", &nested());
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
    assert_eq!(events.matches("\"reason\":\"DecodeError\"").count(), 1, "{events}");
    assert!(events.contains("nest more than 64 levels"), "{events}");
}

#[test]
fn a_hostile_directory_leaves_no_memory_behind_once_it_is_gone() {
    let mut n = Nodelet::new("hostile");
    if let Ok(v) = std::env::var("EXP_ENV") {
        for kv in v.split(';').filter(|s| !s.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap();
            n.extra_env.push((k.into(), v.into()));
        }
    }
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
            &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: b{i}\nspec: [{}\n", "x".repeat(2000)),
        );
    }
    n.write_manifest("deep.yaml", &nested());
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
    eprintln!("RSS before {before} KiB, with the hostile files {peak} KiB, after {after} KiB");
    assert!(
        after <= before + 4096,
        "RSS before {before} KiB, peak {peak} KiB, after {after} KiB"
    );
}
