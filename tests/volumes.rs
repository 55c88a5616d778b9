//! Volumes and security contexts on the real containerd: emptyDir shared by two containers, a
//! Memory emptyDir as a sized tmpfs, hostPath types, runAsUser and fsGroup, dropped capabilities,
//! a read-only root filesystem, refused subPaths and unsupported volume kinds, and the pod
//! directory gone with the pod.

mod common;

use std::time::Duration;

use common::{wait_until, Nodelet};

fn status(n: &Nodelet, name: &str) -> serde_json::Value {
    n.pod(name).map(|p| p["status"].clone()).unwrap_or_default()
}

#[test]
fn empty_dirs_host_paths_and_security_contexts_reach_the_containers() {
    let mut n = Nodelet::new("volumes");
    n.start();
    let host = tempfile::tempdir().unwrap();
    let created = host.path().join("made/by/nodelet");
    n.write_manifest(
        "vol.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: vol}}\nspec:\n  terminationGracePeriodSeconds: 1\n  securityContext: {{runAsUser: 1000, fsGroup: 2000}}\n  volumes:\n  - {{name: shared, emptyDir: {{}}}}\n  - {{name: mem, emptyDir: {{medium: Memory, sizeLimit: 16Mi}}}}\n  - {{name: host, hostPath: {{path: {}, type: DirectoryOrCreate}}}}\n  containers:\n  - name: writer\n    image: busybox:1.36\n    command: [sh, -c, 'echo from-writer > /shared/x && echo host-file > /host/f && sleep 3600']\n    volumeMounts: [{{name: shared, mountPath: /shared}}, {{name: host, mountPath: /host}}, {{name: mem, mountPath: /mem}}]\n    securityContext: {{runAsUser: 0, capabilities: {{drop: [NET_RAW, CHOWN]}}, readOnlyRootFilesystem: true}}\n  - name: reader\n    image: busybox:1.36\n    command: [sleep, '3600']\n    volumeMounts: [{{name: shared, mountPath: /in, readOnly: true}}, {{name: shared, mountPath: /sub, subPath: a/b}}]\n",
            created.display()
        ),
    );
    let uid = n.uid("vol");
    let c = n.wait_running(&uid, &["writer", "reader"], Duration::from_secs(30));
    let (writer, reader) = (c["writer"].id.clone(), c["reader"].id.clone());
    wait_until(Duration::from_secs(10), "the writer's file", || {
        n.runtime.exec(&reader, &["cat", "/in/x"]).1.trim() == "from-writer"
    });
    // Read-only mount; subPath created inside the volume.
    assert_ne!(n.runtime.exec(&reader, &["touch", "/in/y"]).0, 0);
    assert_eq!(
        n.runtime.exec(&reader, &["test", "-d", "/in/a/b"]).0,
        0,
        "subPath made in the volume"
    );
    assert_eq!(n.runtime.exec(&reader, &["test", "-d", "/sub"]).0, 0);
    // hostPath DirectoryOrCreate made the directory; the container wrote into it.
    assert!(created.is_dir());
    assert_eq!(
        std::fs::read_to_string(created.join("f")).unwrap(),
        "host-file\n"
    );
    // The Memory emptyDir is a 16 MiB tmpfs.
    let (_, mounts) = n.runtime.exec(&writer, &["cat", "/proc/mounts"]);
    let mem = mounts
        .lines()
        .find(|l| l.split(' ').nth(1) == Some("/mem"))
        .unwrap_or_else(|| panic!("{mounts}"));
    assert!(
        mem.starts_with("tmpfs ") && mem.contains("size=16384k"),
        "{mem}"
    );
    // runAsUser (the container's over the pod's), fsGroup (supplementary group and the
    // emptyDir's group).
    assert_eq!(n.runtime.exec(&reader, &["id", "-u"]).1.trim(), "1000");
    assert_eq!(n.runtime.exec(&writer, &["id", "-u"]).1.trim(), "0");
    let groups = n.runtime.exec(&reader, &["id", "-G"]).1;
    assert!(groups.split_whitespace().any(|g| g == "2000"), "{groups}");
    assert_eq!(
        n.runtime
            .exec(&writer, &["stat", "-c", "%g", "/shared"])
            .1
            .trim(),
        "2000"
    );
    // Dropped capabilities are gone from the bounding set.
    let st = n
        .runtime
        .exec(&writer, &["grep", "CapBnd", "/proc/self/status"])
        .1;
    let bnd = u64::from_str_radix(st.split_whitespace().last().unwrap(), 16).unwrap();
    assert_eq!(bnd & (1 << 13), 0, "NET_RAW dropped: {st}");
    assert_eq!(bnd & 1, 0, "CHOWN dropped: {st}");
    // readOnlyRootFilesystem refuses writes.
    assert_ne!(n.runtime.exec(&writer, &["touch", "/root-fs-write"]).0, 0);

    // The pod goes: its directory (and the tmpfs under it) go too.
    let pod_dir = n.root().join("pods").join(&uid);
    assert!(pod_dir.join("volumes/kubernetes.io~empty-dir/mem").is_dir());
    std::fs::remove_file(n.manifests().join("vol.yaml")).unwrap();
    wait_until(Duration::from_secs(30), "pod directory removed", || {
        !pod_dir.exists()
    });
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        !mounts.contains(&uid),
        "a tmpfs of the pod is still mounted"
    );
    assert!(
        created.join("f").exists(),
        "a hostPath is the host's: it stays"
    );
}

#[test]
fn bad_volumes_are_refused_or_held_with_a_clear_reason() {
    let mut n = Nodelet::new("badvol");
    n.start();
    let pod = |name: &str, spec: &str| {
        format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n{spec}")
    };
    let c = "  containers:\n  - name: c\n    image: busybox:1.36\n    command: [sleep, '3600']\n";
    let host = tempfile::tempdir().unwrap();
    let file = host.path().join("nodelet-file");
    // A File hostPath that does not exist: held in ContainerCreating, FailedMount.
    n.write_manifest(
        "nofile.yaml",
        &pod(
            "nofile",
            &format!("  volumes: [{{name: f, hostPath: {{path: {}, type: File}}}}]\n{c}    volumeMounts: [{{name: f, mountPath: /f}}]\n", file.display()),
        ),
    );
    // Refused at decode, the field named.
    n.write_manifest(
        "escape.yaml",
        &pod(
            "escape",
            &format!("  volumes: [{{name: v, emptyDir: {{}}}}]\n{c}    volumeMounts: [{{name: v, mountPath: /v, subPath: ../../etc}}]\n"),
        ),
    );
    n.write_manifest(
        "cm.yaml",
        &pod(
            "cm",
            &format!("  volumes: [{{name: v, configMap: {{name: settings}}}}]\n{c}    volumeMounts: [{{name: v, mountPath: /v}}]\n"),
        ),
    );
    n.write_manifest(
        "selinux.yaml",
        &pod(
            "selinux",
            &format!("  securityContext: {{seLinuxOptions: {{level: 's0:c1'}}}}\n{c}"),
        ),
    );
    let uid = n.uid("nofile");
    wait_until(Duration::from_secs(20), "FailedMount", || {
        n.get("/events").is_some_and(|e| {
            e.contains("FailedMount")
                && e.contains(&format!(
                    "hostPath type check failed: {} is not a file",
                    file.display()
                ))
        })
    });
    let st = status(&n, "nofile");
    assert_eq!(st["phase"], "Pending", "{st}");
    assert!(
        n.runtime.containers(&uid).is_empty(),
        "no container started"
    );
    wait_until(Duration::from_secs(20), "refusals reported", || {
        let e = n.get("/events").unwrap_or_default();
        e.contains("escape.yaml") && e.contains("cm.yaml") && e.contains("selinux.yaml")
    });
    let events = n.get("/events").unwrap();
    for field in [
        "spec.containers[0].volumeMounts[0].subPath",
        "spec.volumes[0].configMap",
        "spec.securityContext.seLinuxOptions",
    ] {
        assert!(events.contains(field), "{field}: {events}");
    }
    for name in ["escape", "cm", "selinux"] {
        assert!(n.pod(name).is_none(), "{name} is not a pod");
    }
    // The file appears: the pod starts at a later sync.
    std::fs::write(&file, "x").unwrap();
    n.wait_running(&uid, &["c"], Duration::from_secs(60));
}
