//! QoS cgroups, pod cgroups, container resources and oom_score_adj on this machine's cgroups
//! (v1 hierarchies), with a real containerd. Needs `scripts/env/up.sh`.
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{mem_total, pod_cgroup_dirs, wait_until, Nodelet};

const UNLIMITED: &str = "9223372036854771712";
const LOOP: &str = "[sh, -c, \"trap 'exit 0' TERM; while true; do sleep 1 & wait; done\"]";

fn manifest(name: &str, resources: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: {LOOP}\n    resources: {resources}\n"
    )
}

fn read(hierarchy: &str, cgroup: &str, file: &str) -> String {
    let p = format!("/sys/fs/cgroup/{hierarchy}{cgroup}/{file}");
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{p}: {e}"))
        .trim()
        .to_string()
}

/// The cgroup path of a process in one v1 hierarchy (from /proc/<pid>/cgroup).
fn proc_cgroup(pid: u32, controller: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    text.lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
            ctrls
                .split(',')
                .any(|c| c == controller)
                .then(|| path.to_string())
        })
        .unwrap_or_else(|| panic!("no {controller} cgroup for {pid}"))
}

#[test]
fn qos_pod_and_container_cgroups_hold_kubelets_values() {
    let mut n = Nodelet::with_config(
        "qos",
        "systemReserved: {cpu: 500m, memory: 1Gi}\nkubeReserved: {memory: 512Mi}\n",
    );
    n.start();
    n.write_manifest(
        "g.yaml",
        &manifest("guaranteed", "{limits: {cpu: 500m, memory: 128Mi}}"),
    );
    n.write_manifest(
        "b.yaml",
        &manifest("burstable", "{requests: {cpu: 250m, memory: 100Mi}}"),
    );
    n.write_manifest("e.yaml", &manifest("besteffort", "{}"));
    let mut uid = HashMap::new();
    let mut pid = HashMap::new();
    for name in ["guaranteed", "burstable", "besteffort"] {
        let u = n.uid(name);
        let c = n.wait_running(&u, &["c"], Duration::from_secs(30));
        pid.insert(name, n.runtime.container_pid(&c["c"].id).expect("pid"));
        uid.insert(name, u);
    }
    let root = n.cgroup_root.clone();
    wait_until(Duration::from_secs(10), "/pods QoS classes", || {
        ["guaranteed", "burstable", "besteffort"].iter().all(|p| {
            n.pod(p)
                .is_some_and(|x| x["status"]["qosClass"].is_string())
        })
    });
    for (name, class) in [
        ("guaranteed", "Guaranteed"),
        ("burstable", "Burstable"),
        ("besteffort", "BestEffort"),
    ] {
        assert_eq!(n.pod(name).unwrap()["status"]["qosClass"], class);
    }

    // Node allocatable on kubepods: cpus*1000 - 500m as shares; memory capacity - 1.5Gi.
    let cpus = std::thread::available_parallelism().unwrap().get() as u64;
    let kubepods = format!("{root}/kubepods");
    assert_eq!(
        read("cpu", &kubepods, "cpu.shares"),
        ((cpus * 1000 - 500) * 1024 / 1000).to_string()
    );
    let alloc_mem = mem_total() - (1 << 30) - (512 << 20);
    assert_eq!(
        read("memory", &kubepods, "memory.limit_in_bytes"),
        (alloc_mem / 4096 * 4096).to_string(),
        "kernel rounds to pages"
    );
    // QoS cgroups: burstable shares = its pods' requests (250m), besteffort 2.
    assert_eq!(
        read("cpu", &format!("{kubepods}/burstable"), "cpu.shares"),
        "256"
    );
    assert_eq!(
        read("cpu", &format!("{kubepods}/besteffort"), "cpu.shares"),
        "2"
    );

    // Pod cgroups where kubelet puts them, with kubelet's values.
    let g = format!("{kubepods}/pod{}", uid["guaranteed"]);
    assert_eq!(read("cpu", &g, "cpu.shares"), "512");
    assert_eq!(read("cpu", &g, "cpu.cfs_quota_us"), "50000");
    assert_eq!(read("cpu", &g, "cpu.cfs_period_us"), "100000");
    assert_eq!(
        read("memory", &g, "memory.limit_in_bytes"),
        (128u64 << 20).to_string()
    );
    let b = format!("{kubepods}/burstable/pod{}", uid["burstable"]);
    assert_eq!(read("cpu", &b, "cpu.shares"), "256");
    assert_eq!(
        read("cpu", &b, "cpu.cfs_quota_us"),
        "-1",
        "no cpu limit declared"
    );
    assert_eq!(
        read("memory", &b, "memory.limit_in_bytes"),
        UNLIMITED,
        "no memory limit declared"
    );
    let e = format!("{kubepods}/besteffort/pod{}", uid["besteffort"]);
    assert_eq!(read("cpu", &e, "cpu.shares"), "2");
    // The pod cgroup exists in every hierarchy, the named systemd one included.
    for h in ["cpu", "memory", "pids", "systemd", "unified"] {
        assert!(
            std::path::Path::new(&format!("/sys/fs/cgroup/{h}{g}")).is_dir(),
            "{h}"
        );
    }

    // Containers run inside their pod cgroup with their own values.
    let gc = proc_cgroup(pid["guaranteed"], "cpu");
    assert!(gc.starts_with(&format!("{g}/")), "{gc} under {g}");
    assert_eq!(read("cpu", &gc, "cpu.shares"), "512");
    assert_eq!(read("cpu", &gc, "cpu.cfs_quota_us"), "50000");
    assert_eq!(
        read(
            "memory",
            &proc_cgroup(pid["guaranteed"], "memory"),
            "memory.limit_in_bytes"
        ),
        (128u64 << 20).to_string()
    );
    let bc = proc_cgroup(pid["burstable"], "cpu");
    assert!(bc.starts_with(&format!("{b}/")), "{bc} under {b}");
    assert_eq!(read("cpu", &bc, "cpu.shares"), "256");
    // The cpuset cgroups nodelet makes have the kernel copy cpus and mems into those made below
    // (cgroup.clone_children): the pod's and runc's container cgroup hold the node's values.
    let node_cpus = read("cpuset", "", "cpuset.cpus");
    let node_mems = read("cpuset", "", "cpuset.mems");
    let gs = proc_cgroup(pid["guaranteed"], "cpuset");
    for cg in [kubepods.as_str(), g.as_str(), gs.as_str()] {
        assert_eq!(read("cpuset", cg, "cgroup.clone_children"), "1", "{cg}");
        assert_eq!(read("cpuset", cg, "cpuset.cpus"), node_cpus, "{cg}");
        assert_eq!(read("cpuset", cg, "cpuset.mems"), node_mems, "{cg}");
    }
    assert!(gs.starts_with(&format!("{g}/")), "{gs} under {g}");

    // oom_score_adj of the processes: Burstable 1000 - 1000*100Mi/capacity, BestEffort 1000.
    // (Guaranteed asks for -997; containerd's restrict_oom_score_adj clamps it to its own 0.)
    let oom = |name: &str| {
        std::fs::read_to_string(format!("/proc/{}/oom_score_adj", pid[name]))
            .unwrap()
            .trim()
            .parse::<i64>()
            .unwrap()
    };
    let want_burstable = (1000 - 1000 * (100i64 << 20) / mem_total()).clamp(3, 999);
    assert_eq!(oom("burstable"), want_burstable);
    assert_eq!(oom("besteffort"), 1000);
    assert_eq!(oom("guaranteed"), 0);

    // Removing the manifests leaves no pod<UID> in any hierarchy.
    for f in ["g.yaml", "b.yaml", "e.yaml"] {
        std::fs::remove_file(n.manifests().join(f)).unwrap();
    }
    wait_until(Duration::from_secs(30), "pods gone", || {
        uid.values().all(|u| n.runtime.sandboxes(u).is_empty())
    });
    wait_until(Duration::from_secs(5), "pod cgroups gone", || {
        uid.values().all(|u| pod_cgroup_dirs(&root, u).is_empty())
    });
    assert_eq!(
        read("cpu", &format!("{kubepods}/burstable"), "cpu.shares"),
        "2",
        "QoS cgroup follows the pods"
    );
}

#[test]
fn orphaned_pod_cgroups_are_removed_by_housekeeping() {
    let mut n = Nodelet::new("orphancg");
    n.start();
    let orphan = format!(
        "{}/kubepods/besteffort/pod00000000-dead-beef-0000-000000000000",
        n.cgroup_root
    );
    for h in ["cpu", "memory", "systemd"] {
        std::fs::create_dir_all(format!("/sys/fs/cgroup/{h}{orphan}")).unwrap();
    }
    wait_until(Duration::from_secs(10), "orphan removed", || {
        ["cpu", "memory", "systemd"]
            .iter()
            .all(|h| !std::path::Path::new(&format!("/sys/fs/cgroup/{h}{orphan}")).exists())
    });
}

#[test]
fn a_missing_cgroup_root_is_a_startup_error() {
    let n = Nodelet::new("noroot");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nodelet"))
        .args([
            "--config",
            n.config_path().to_str().unwrap(),
            "--hostname-override",
            &n.node,
            "--root-dir",
        ])
        .arg(n.dir.path().join("root"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("cgroupRoot") && stderr.contains(&n.cgroup_root),
        "{stderr}"
    );
}

#[test]
fn quantities_that_do_not_parse_refuse_the_pod_and_name_the_field() {
    let mut n = Nodelet::new("badqty");
    n.start();
    n.write_manifest("bad.yaml", &manifest("bad", "{limits: {memory: lots}}"));
    n.write_manifest("neg.yaml", &manifest("neg", "{requests: {cpu: '-1'}}"));
    n.write_manifest("ok.yaml", &manifest("ok", "{requests: {cpu: 10m}}"));
    let u = n.uid("ok");
    n.wait_running(&u, &["c"], Duration::from_secs(30));
    let events = n.get("/events").unwrap();
    assert!(
        events.contains("spec.containers[0].resources.limits.memory")
            && events.contains("bad.yaml"),
        "{events}"
    );
    assert!(
        events.contains("spec.containers[0].resources.requests.cpu") && events.contains("neg.yaml"),
        "{events}"
    );
    assert_eq!(n.pods().len(), 1);
}

/// A removed pod leaves no page cache charged to its memory cgroups (cgroup v1): the pages its
/// container wrote to a hostPath file are reclaimed before the pod cgroup is removed, so the
/// kernel can free the container's and the pod's cgroups instead of keeping them as dying
/// cgroups under kubepods, where their pages still count.
#[test]
fn a_removed_pods_page_cache_is_reclaimed_with_its_memory_cgroup() {
    let mut n = Nodelet::new("pagecache");
    n.start();
    let host = n.dir.path().join("host");
    n.write_manifest(
        "writer.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: writer}}\nspec:\n  terminationGracePeriodSeconds: 1\n  volumes: [{{name: host, hostPath: {{path: {}, type: DirectoryOrCreate}}}}]\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [sh, -c, 'dd if=/dev/zero of=/host/f bs=1M count=16 && sync && touch /host/done && sleep 3600']\n    volumeMounts: [{{name: host, mountPath: /host}}]\n",
            host.display()
        ),
    );
    let uid = n.uid("writer");
    n.wait_running(&uid, &["c"], Duration::from_secs(30));
    wait_until(Duration::from_secs(30), "the file written", || {
        host.join("done").exists()
    });
    let kubepods = format!("{}/kubepods", n.cgroup_root);
    let usage = || -> u64 {
        read("memory", &kubepods, "memory.usage_in_bytes")
            .parse()
            .unwrap()
    };
    assert!(usage() >= 16 << 20, "the file's pages count in kubepods");
    std::fs::remove_file(n.manifests().join("writer.yaml")).unwrap();
    wait_until(Duration::from_secs(30), "the pod cgroup removed", || {
        common::pod_cgroup_dirs(&n.cgroup_root, &uid).is_empty()
    });
    let left = usage();
    assert!(
        left < 4 << 20,
        "{left} bytes still charged under kubepods after the pod is gone"
    );
    // The file is the host's and stays.
    assert_eq!(std::fs::metadata(host.join("f")).unwrap().len(), 16 << 20);
}

#[test]
fn pod_level_resources_set_the_qos_class_the_pod_cgroup_and_bound_containers_without_limits() {
    let mut n = Nodelet::new("podlevel");
    n.start();
    // spec.resources alone: Guaranteed (requests default to the limits); the container has no
    // limits of its own, so the pod's bound it; a second one keeps its own smaller limit.
    n.write_manifest(
        "p.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: podlevel}}\nspec:\n  terminationGracePeriodSeconds: 2\n  resources: {{limits: {{cpu: 500m, memory: 256Mi}}}}\n  containers:\n  - name: free\n    image: busybox:1.36\n    command: {LOOP}\n  - name: own\n    image: busybox:1.36\n    command: {LOOP}\n    resources: {{limits: {{memory: 64Mi}}}}\n"
        ),
    );
    let uid = n.uid("podlevel");
    let c = n.wait_running(&uid, &["free", "own"], Duration::from_secs(30));
    wait_until(Duration::from_secs(10), "qosClass", || {
        n.pod("podlevel")
            .is_some_and(|p| p["status"]["qosClass"].is_string())
    });
    assert_eq!(
        n.pod("podlevel").unwrap()["status"]["qosClass"],
        "Guaranteed"
    );
    // Guaranteed pods sit directly under kubepods, with the pod-level values.
    let pod = format!("{}/kubepods/pod{uid}", n.cgroup_root);
    assert_eq!(
        read("memory", &pod, "memory.limit_in_bytes"),
        (256 << 20).to_string()
    );
    assert_eq!(read("cpu", &pod, "cpu.cfs_quota_us"), "50000");
    assert_eq!(read("cpu", &pod, "cpu.shares"), "512");
    for (name, limit) in [("free", 256i64 << 20), ("own", 64 << 20)] {
        let pid = n.runtime.container_pid(&c[name].id).expect("pid");
        let cg = proc_cgroup(pid, "memory");
        assert_eq!(
            read("memory", &cg, "memory.limit_in_bytes"),
            limit.to_string(),
            "{name}"
        );
    }
    let free = proc_cgroup(n.runtime.container_pid(&c["free"].id).unwrap(), "cpu");
    assert_eq!(read("cpu", &free, "cpu.cfs_quota_us"), "50000");
}
