//! Filesystem figures of the summary (kubelet's `pkg/kubelet/stats`: the node's `fs`, the
//! runtime's `imageFs`, and per pod its `volume` list (the volume stats calculator), each
//! container's `logs` and the pod's `ephemeral-storage` (`calcEphemeralStorage`)), all
//! `FsStats`: `usedBytes`/`inodesUsed` of what is measured, `capacityBytes`/`availableBytes`/
//! `inodes`/`inodesFree` of the filesystem holding it.
//!
//! Volumes and logs are measured with [`crate::volume::metrics`] (`du` and an inode count, the
//! figures the eviction manager reads for local storage), on demand. The pod's ephemeral
//! storage is, as kubelet sums it, its containers' writable layers and logs plus its local
//! ephemeral volumes (emptyDirs on disk and configMaps; not those on tmpfs).

use std::path::Path;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Value};

use crate::cri::api as cri;
use crate::volume::metrics::{self, Metrics};

/// `FsStats` of `m` at `time` (RFC 3339).
fn fs_json(m: &Metrics, time: &str) -> Value {
    json!({
        "time": time,
        "availableBytes": m.available_bytes,
        "capacityBytes": m.capacity_bytes,
        "usedBytes": m.used_bytes,
        "inodesFree": m.inodes_free,
        "inodes": m.inodes,
        "inodesUsed": m.inodes_used,
    })
}

/// The filesystem holding `path`: its size, what is free, and what is used (size less free
/// blocks, as cAdvisor counts it); `None` when `statvfs` fails.
pub fn filesystem(path: &Path) -> Option<Metrics> {
    let st = nix::sys::statvfs::statvfs(path).ok()?;
    let n = |x: u64| i64::try_from(x).unwrap_or(i64::MAX);
    let frsize = n(st.fragment_size());
    Some(Metrics {
        used_bytes: n(st.blocks().saturating_sub(st.blocks_free())).saturating_mul(frsize),
        inodes_used: n(st.files().saturating_sub(st.files_free())),
        capacity_bytes: n(st.blocks()).saturating_mul(frsize),
        available_bytes: n(st.blocks_available()).saturating_mul(frsize),
        inodes: n(st.files()),
        inodes_free: n(st.files_free()),
    })
}

/// The node's `fs` (the filesystem of the agent's root directory) at `time`.
pub fn node_fs(nodefs: &Path, time: &str) -> Option<Value> {
    filesystem(nodefs).map(|m| fs_json(&m, time))
}

/// The runtime's `imageFs` at `time`: the first image filesystem the runtime reports, its
/// `usedBytes`/`inodesUsed` as the runtime counts its images, the rest from `statvfs` of its
/// mount point.
pub fn image_fs(usage: &[cri::FilesystemUsage], time: &str) -> Option<Value> {
    let u = usage.first()?;
    let mount = u.fs_id.as_ref()?.mountpoint.as_str();
    let mut m = filesystem(Path::new(mount))?;
    let n = |x: Option<&cri::UInt64Value>| x.map(|v| i64::try_from(v.value).unwrap_or(i64::MAX));
    if let Some(b) = n(u.used_bytes.as_ref()) {
        m.used_bytes = b;
    }
    if let Some(i) = n(u.inodes_used.as_ref()) {
        m.inodes_used = i;
    }
    Some(fs_json(&m, time))
}

/// One pod's storage figures for the summary.
#[derive(Debug, Default)]
pub struct PodStorage {
    /// `volume`: one `VolumeStats` per volume under the pod directory (`FsStats` and `name`).
    pub volumes: Vec<Value>,
    /// Each container's `logs` `FsStats`, in the order of the containers given.
    pub logs: Vec<Option<Value>>,
    /// `ephemeral-storage`.
    pub ephemeral: Option<Value>,
}

/// The storage of `pod` at `time`: its volumes under `pod_dir`, the logs of `containers`
/// (name, writable layer bytes) under `logs_dir` (the pod's `/var/log/pods` directory), and as
/// its ephemeral storage the layers, the logs and the local ephemeral volumes, on the
/// filesystem of `nodefs`.
pub fn pod_storage(
    pod: &Pod,
    pod_dir: &Path,
    logs_dir: &Path,
    containers: &[(&str, Option<u64>)],
    nodefs: &Path,
    time: &str,
) -> PodStorage {
    let mut used = 0i64;
    let mut inodes = 0i64;
    let mut out = PodStorage::default();
    for (name, dir, ephemeral) in crate::volume::pod_volume_dirs(pod, pod_dir) {
        let Some(m) = metrics::metrics_du(&dir) else {
            continue; // not set up (yet), or gone
        };
        if ephemeral {
            used = used.saturating_add(m.used_bytes);
            inodes = inodes.saturating_add(m.inodes_used);
        }
        let mut v = fs_json(&m, time);
        v["name"] = json!(name);
        out.volumes.push(v);
    }
    let fs = filesystem(nodefs);
    for (name, rootfs) in containers {
        used = used.saturating_add(rootfs.map_or(0, |r| i64::try_from(r).unwrap_or(i64::MAX)));
        let dir = logs_dir.join(name);
        let logs = fs.filter(|_| dir.is_dir()).map(|fs| {
            let u = metrics::du(&dir);
            used = used.saturating_add(u.bytes);
            inodes = inodes.saturating_add(u.inodes);
            fs_json(
                &Metrics {
                    used_bytes: u.bytes,
                    inodes_used: u.inodes,
                    ..fs
                },
                time,
            )
        });
        out.logs.push(logs);
    }
    out.ephemeral = fs.map(|fs| {
        fs_json(
            &Metrics {
                used_bytes: used,
                inodes_used: inodes,
                ..fs
            },
            time,
        )
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pods_ephemeral_storage_is_its_layers_logs_and_volumes() {
        let tmp = tempfile::tempdir().unwrap();
        let pod: Pod = serde_yaml::from_str(
            "spec:\n  containers: [{name: c}]\n  volumes:\n  - {name: scratch, emptyDir: {}}\n  - {name: host, hostPath: {path: /tmp}}\n  - {name: late, emptyDir: {}}\n  - {name: mem, emptyDir: {medium: Memory}}\n",
        )
        .unwrap();
        let pod_dir = tmp.path().join("pods/u");
        let scratch = pod_dir.join("volumes/kubernetes.io~empty-dir/scratch");
        std::fs::create_dir_all(&scratch).unwrap();
        std::fs::write(scratch.join("f"), vec![1u8; 64 << 10]).unwrap();
        let mem = pod_dir.join("volumes/kubernetes.io~empty-dir/mem");
        std::fs::create_dir_all(&mem).unwrap();
        std::fs::write(mem.join("f"), vec![1u8; 256 << 10]).unwrap();
        let logs = tmp.path().join("logs");
        std::fs::create_dir_all(logs.join("c")).unwrap();
        std::fs::write(logs.join("c/0.log"), vec![1u8; 8 << 10]).unwrap();
        let s = pod_storage(
            &pod,
            &pod_dir,
            &logs,
            &[("c", Some(1 << 20))],
            tmp.path(),
            "t",
        );
        assert_eq!(
            s.volumes.len(),
            2,
            "hostPath is the host's, `late` is not set up"
        );
        assert_eq!(s.volumes[0]["name"], "scratch");
        assert_eq!(s.volumes[1]["name"], "mem");
        assert!(s.volumes[1]["usedBytes"].as_i64().unwrap() >= 256 << 10);
        let vol = s.volumes[0]["usedBytes"].as_i64().unwrap();
        assert!(vol >= 64 << 10, "{vol}");
        let log = s.logs[0].as_ref().unwrap()["usedBytes"].as_i64().unwrap();
        assert!(log >= 8 << 10, "{log}");
        let eph = s.ephemeral.unwrap();
        assert_eq!(
            eph["usedBytes"].as_i64().unwrap(),
            (1 << 20) + vol + log,
            "the memory-backed emptyDir is not local storage"
        );
        assert_eq!(eph["inodesUsed"].as_i64().unwrap(), 2 + 2);
        assert!(eph["capacityBytes"].as_i64().unwrap() > 0);
    }
}
