//! Volumes and security contexts on the real containerd: emptyDir shared by two containers, a
//! Memory emptyDir as a sized tmpfs, hostPath types, runAsUser and fsGroup, dropped capabilities,
//! a read-only root filesystem, refused subPaths and unsupported volume kinds, and the pod
//! directory gone with the pod; local ConfigMaps and Secrets (volumes, env, atomic updates, a
//! missing object holding a container) and the downward API.
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

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
    // The subPath reached the runtime as a bind mount under the pod directory, not by its path
    // in the volume (CVE-2017-1002101).
    let sub = n
        .runtime
        .container_status(&reader)
        .mounts
        .into_iter()
        .find(|m| m.container_path == "/sub")
        .unwrap();
    assert!(
        sub.host_path
            .ends_with(&format!("/pods/{uid}/volume-subpaths/shared/reader/1")),
        "{}",
        sub.host_path
    );
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
            &format!("  volumes: [{{name: v, persistentVolumeClaim: {{claimName: data}}}}]\n{c}    volumeMounts: [{{name: v, mountPath: /v}}]\n"),
        ),
    );
    n.write_manifest(
        "selinux.yaml",
        &pod(
            "selinux",
            &format!("  securityContext: {{seLinuxOptions: {{level: 's0:c1'}}}}\n{c}"),
        ),
    );
    n.write_manifest(
        "rro.yaml",
        &pod(
            "rro",
            &format!("  volumes: [{{name: v, emptyDir: {{}}}}]\n{c}    volumeMounts: [{{name: v, mountPath: /v, readOnly: true, recursiveReadOnly: Enabled}}]\n"),
        ),
    );
    n.write_manifest(
        "claims.yaml",
        &pod(
            "claims",
            &format!("  resourceClaims: [{{name: gpu, resourceClaimName: gpu-0}}]\n{c}"),
        ),
    );
    // An fsGroup past 2^31-1 (it would be cut to 32 bits on its way to the volume's owner).
    n.write_manifest(
        "ids.yaml",
        &pod(
            "ids",
            &format!("  securityContext: {{fsGroup: 99999999999}}\n{c}"),
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
        ["escape", "cm", "selinux", "rro", "claims", "ids"]
            .iter()
            .all(|f| e.contains(&format!("{f}.yaml")))
    });
    let events = n.get("/events").unwrap();
    for field in [
        "spec.containers[0].volumeMounts[0].subPath",
        "spec.volumes[0].persistentVolumeClaim",
        "spec.securityContext.seLinuxOptions",
        "spec.containers[0].volumeMounts[0].recursiveReadOnly",
        "spec.resourceClaims",
        "spec.securityContext.fsGroup",
    ] {
        assert!(events.contains(field), "{field}: {events}");
    }
    for name in ["escape", "cm", "selinux", "rro", "claims", "ids"] {
        assert!(n.pod(name).is_none(), "{name} is not a pod");
    }
    // The file appears: the pod starts at a later sync.
    std::fs::write(&file, "x").unwrap();
    n.wait_running(&uid, &["c"], Duration::from_secs(60));
}

/// `n` bytes of `c`, and the md5 of it as busybox's `md5sum` prints it.
fn big(c: char, n: usize) -> (String, String) {
    let text: String = std::iter::repeat_n(c, n).collect();
    let out = std::process::Command::new("md5sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut p| {
            use std::io::Write;
            p.stdin.take().unwrap().write_all(text.as_bytes())?;
            p.wait_with_output()
        })
        .unwrap();
    let sum = String::from_utf8_lossy(&out.stdout)[..32].to_owned();
    (text, sum)
}

#[test]
fn config_maps_secrets_and_the_downward_api_reach_the_containers() {
    let mut n = Nodelet::new("objects");
    n.start();
    const SECRET: &str = "pw-7f3a9c1e-never-logged";
    let (a, sum_a) = big('a', 65536);
    let (b, sum_b) = big('b', 65536);
    let objects = |big: &str, level: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: app}}\ndata:\n  LEVEL: '{level}'\n  big: {big}\n---\napiVersion: v1\nkind: Secret\nmetadata: {{name: db}}\nstringData: {{password: {SECRET}}}\n"
        )
    };
    n.write_manifest("objects.yaml", &objects(&a, "1"));
    let checkpoints = n.root().join("static-pods");
    wait_until(Duration::from_secs(10), "objects.yaml checkpointed", || {
        common::files_under(&checkpoints).len() == 1
    });
    let before = common::files_under(&n.root());
    // The reader checks every read of the 64 KiB file against the two versions; a partial or
    // mixed read is written to /out/bad.
    n.write_manifest(
        "app.yaml",
        &format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: app, labels: {{tier: web}}}}
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - {{name: cfg, configMap: {{name: app, items: [{{key: big, path: big}}, {{key: LEVEL, path: conf/level, mode: 0400}}]}}}}
  - {{name: sec, secret: {{secretName: db, defaultMode: 0440}}}}
  - {{name: info, downwardAPI: {{items: [{{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}, {{path: name, fieldRef: {{fieldPath: metadata.name}}}}, {{path: ns, fieldRef: {{fieldPath: metadata.namespace}}}}, {{path: mem, resourceFieldRef: {{containerName: c, resource: limits.memory, divisor: 1Mi}}}}]}}}}
  - {{name: all, projected: {{sources: [{{configMap: {{name: app, items: [{{key: LEVEL, path: level}}]}}}}, {{secret: {{name: db}}}}, {{downwardAPI: {{items: [{{path: uid, fieldRef: {{fieldPath: metadata.uid}}}}]}}}}]}}}}
  - {{name: out, emptyDir: {{}}}}
  containers:
  - name: c
    image: busybox:1.36
    resources: {{limits: {{memory: 64Mi}}}}
    command: [sh, -c, 'while true; do s=$(md5sum < /cfg/big | cut -c1-32); [ \"$s\" = {sum_a} ] || [ \"$s\" = {sum_b} ] || echo \"bad $s\" >> /out/bad; echo $s > /out/last; done']
    envFrom: [{{configMapRef: {{name: app}}, prefix: APP_}}]
    env:
    - {{name: PW, valueFrom: {{secretKeyRef: {{name: db, key: password}}}}}}
    - {{name: POD_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}
    - {{name: POD_UID, valueFrom: {{fieldRef: {{fieldPath: metadata.uid}}}}}}
    - {{name: POD_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}
    - {{name: POD_NS, valueFrom: {{fieldRef: {{fieldPath: metadata.namespace}}}}}}
    - {{name: MEM, valueFrom: {{resourceFieldRef: {{resource: limits.memory, divisor: 1Mi}}}}}}
    volumeMounts: [{{name: cfg, mountPath: /cfg}}, {{name: sec, mountPath: /sec}}, {{name: info, mountPath: /info}}, {{name: all, mountPath: /all}}, {{name: out, mountPath: /out}}]
  - name: late
    image: busybox:1.36
    command: [sleep, '3600']
    env: [{{name: X, valueFrom: {{configMapKeyRef: {{name: later, key: x}}}}}}]
"
        ),
    );
    let uid = n.uid("app");
    let c = n.wait_running(&uid, &["c"], Duration::from_secs(30));
    let id = c["c"].id.clone();
    let exec = |cmd: &[&str]| n.runtime.exec(&id, cmd).1.trim().to_owned();
    // Env: envFrom with its prefix, a Secret key, the downward API.
    assert_eq!(exec(&["sh", "-c", "echo \"$APP_LEVEL\""]), "1");
    assert_eq!(exec(&["sh", "-c", "echo \"$PW\""]), SECRET);
    assert_eq!(exec(&["sh", "-c", "echo \"$POD_UID\""]), uid);
    assert_eq!(exec(&["sh", "-c", "echo \"$MEM\""]), "64");
    let ip = exec(&["sh", "-c", "echo \"$POD_IP\""]);
    assert!(ip.parse::<std::net::IpAddr>().is_ok(), "{ip:?}");
    let pod = n.pod("app").unwrap();
    assert_eq!(pod["status"]["podIP"], ip.as_str());
    // Volumes: items with modes, the Secret on a tmpfs, downward API files, a projection.
    assert_eq!(exec(&["cat", "/cfg/conf/level"]), "1");
    assert_eq!(exec(&["stat", "-L", "-c", "%a", "/cfg/conf/level"]), "400");
    assert_eq!(exec(&["cat", "/sec/password"]), SECRET);
    assert_eq!(exec(&["stat", "-L", "-c", "%a", "/sec/password"]), "440");
    assert_eq!(exec(&["cat", "/info/labels"]), "tier=\"web\"");
    assert_eq!(exec(&["cat", "/info/name"]), format!("app-{}", n.node));
    assert_eq!(exec(&["cat", "/info/ns"]), "default");
    assert_eq!(
        exec(&["sh", "-c", "echo \"$POD_NAME\""]),
        format!("app-{}", n.node)
    );
    assert_eq!(exec(&["sh", "-c", "echo \"$POD_NS\""]), "default");
    assert_eq!(exec(&["cat", "/info/mem"]), "64");
    assert_eq!(exec(&["cat", "/all/level"]), "1");
    assert_eq!(exec(&["cat", "/all/password"]), SECRET);
    assert_eq!(exec(&["cat", "/all/uid"]), uid);
    // Read-only whatever the mount says (kubelet's): nothing in the container can touch the
    // files nodelet writes, nor point `..data` elsewhere.
    for cmd in [
        "touch /cfg/x",
        "ln -sfn /tmp /cfg/..data",
        "echo x > /sec/password",
        "mkdir /all/..data_tmp",
    ] {
        assert_ne!(n.runtime.exec(&id, &["sh", "-c", cmd]).0, 0, "{cmd}");
    }
    let vols = n.root().join("pods").join(&uid).join("volumes");
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    for tmpfs in ["kubernetes.io~secret/sec", "kubernetes.io~projected/all"] {
        let path = vols.join(tmpfs);
        assert!(
            mounts
                .lines()
                .any(|l| l.starts_with("tmpfs ")
                    && l.split(' ').nth(1) == Some(path.to_str().unwrap())),
            "{tmpfs} is a tmpfs"
        );
    }
    // The container held for a missing ConfigMap says so, and starts once it appears.
    wait_until(Duration::from_secs(20), "late held", || {
        let st = status(&n, "app");
        st["containerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| {
                c["name"] == "late"
                    && c["state"]["waiting"]["reason"] == "CreateContainerConfigError"
                    && c["state"]["waiting"]["message"] == "configmap \"later\" not found"
            })
    });
    // An edit of the ConfigMap reaches the mounted file (at once: the pods that use it are
    // synced), never half-written.
    wait_until(Duration::from_secs(10), "first reads", || {
        exec(&["cat", "/out/last"]) == sum_a
    });
    let edited = std::time::Instant::now();
    n.write_manifest(
        "objects.yaml",
        &format!(
            "{}---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: later}}\ndata: {{x: 'y'}}\n",
            objects(&b, "2")
        ),
    );
    wait_until(Duration::from_secs(10), "the new version read", || {
        exec(&["cat", "/out/last"]) == sum_b
    });
    let took = edited.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "within syncFrequency (10 s): {took:?}"
    );
    assert_eq!(exec(&["cat", "/cfg/conf/level"]), "2");
    n.wait_running(&uid, &["c", "late"], Duration::from_secs(30));
    // Keep reading through two more swaps.
    for (text, sum) in [(&a, &sum_a), (&b, &sum_b)] {
        n.write_manifest("objects.yaml", &objects(text, "3"));
        wait_until(Duration::from_secs(10), "swap read", || {
            exec(&["cat", "/out/last"]) == *sum
        });
    }
    assert_eq!(
        n.runtime.exec(&id, &["test", "-e", "/out/bad"]).0,
        1,
        "a partial read: {}",
        exec(&["cat", "/out/bad"])
    );
    eprintln!("configMap edit to the container's read: {took:?}");
    // The Secret's value is in no log, event, status or pod listing.
    let mut seen = vec![
        ("agent log", n.log()),
        ("/events", n.get("/events").unwrap_or_default()),
        ("/pods", n.get("/pods").unwrap_or_default()),
        ("/metrics", n.get("/metrics").unwrap_or_default()),
    ];
    for e in common::files_under(&n.logs()) {
        seen.push(("pod log", std::fs::read_to_string(e).unwrap_or_default()));
    }
    for (what, text) in seen {
        assert!(!text.contains(SECRET), "the Secret's value in {what}");
    }
    // The pod goes: its directory and its tmpfs mounts go; nothing else under root-dir changed.
    std::fs::remove_file(n.manifests().join("app.yaml")).unwrap();
    let pod_dir = n.root().join("pods").join(&uid);
    wait_until(Duration::from_secs(30), "pod directory removed", || {
        !pod_dir.exists()
    });
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        !mounts.contains(&uid),
        "a tmpfs of the pod is still mounted"
    );
    wait_until(
        Duration::from_secs(10),
        "root-dir as before the pod",
        || common::files_under(&n.root()) == before,
    );
    // The checkpoint of a manifest holding a Secret is readable by root alone.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&common::files_under(&checkpoints)[0])
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "checkpoint mode {mode:o}");
}

/// The race of CVE-2017-1002101: a container that can write to a volume swaps a directory of a
/// checked subPath for a link to `/` before the runtime mounts it. The subPath is bound through
/// a descriptor opened without following links, so the swap is refused; without it, what was
/// checked is what is mounted. The bind mounts go with the pod's volumes.
#[test]
fn a_sub_path_swapped_for_a_link_after_its_check_is_refused() {
    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};
    let tmp = tempfile::tempdir().unwrap();
    let (pod_dir, vol) = (tmp.path().join("pod"), tmp.path().join("vol"));
    std::fs::create_dir_all(vol.join("x")).unwrap();
    std::fs::write(vol.join("x/marker"), "in the volume").unwrap();
    let vols = BTreeMap::from([("v".to_owned(), vol.clone())]);
    let c: k8s_openapi::api::core::v1::Container =
        serde_yaml::from_str("{name: c, volumeMounts: [{name: v, mountPath: /m, subPath: x}]}")
            .unwrap();
    let bind = |root: &Path, rel: &Path, volume: &str, index: usize| -> Result<PathBuf, String> {
        nodelet::volume::subpath::bind(root, rel, &pod_dir, volume, "c", index)
    };
    let mounts = |bind: nodelet::volume::mounts::SubPathBinder<'_>| {
        nodelet::volume::mounts::container_mounts(
            &c,
            &vols,
            &Default::default(),
            &|s| s.into(),
            bind,
        )
    };
    let m = mounts(&bind).unwrap();
    let target = pod_dir.join("volume-subpaths/v/c/0");
    assert_eq!(m[0].host_path, target.display().to_string());
    assert_eq!(
        std::fs::read_to_string(target.join("marker")).unwrap(),
        "in the volume"
    );
    assert_eq!(
        nodelet::volume::removal::mounts_under(&pod_dir),
        std::slice::from_ref(&target)
    );
    // Swapped between the check and the bind: refused.
    let swap = |root: &Path, rel: &Path, volume: &str, index: usize| {
        std::fs::rename(vol.join("x"), vol.join("x.old")).unwrap();
        std::os::unix::fs::symlink("/", vol.join("x")).unwrap();
        bind(root, rel, volume, index)
    };
    let err = mounts(&swap).unwrap_err();
    assert!(err.contains("symbolic link"), "{err}");
    // The pod's volumes torn down: no mount left, the pod directory removable.
    nodelet::volume::tear_down_pod(&pod_dir);
    assert!(nodelet::volume::removal::mounts_under(&pod_dir).is_empty());
    nodelet::volume::removal::remove_all_one_filesystem(&pod_dir).unwrap();
    assert!(vol.join("x.old/marker").exists(), "the volume's files stay");
}
