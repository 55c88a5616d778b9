//! Container manager, the skeleton part: where a pod's cgroup lives and how it is removed
//! (kubelet's `pkg/kubelet/cm`, `pod_container_manager_linux.go`, `cgroup_manager_linux.go`).
//!
//! With `cgroupsPerQOS` the pod cgroup is `<cgroupRoot>/kubepods/pod<UID>` for Guaranteed pods
//! and `<cgroupRoot>/kubepods/{burstable,besteffort}/pod<UID>` otherwise; the systemd driver
//! spells the same tree as slices (`kubepods-burstable-pod<UID with _>.slice`). The path is handed
//! to RunPodSandbox as `cgroup_parent`; runc creates it in every mounted hierarchy, so removal walks
//! every hierarchy (the named `systemd` and the `unified` one included).

use std::path::{Path, PathBuf};

use crate::qos::QosClass;

/// Name of the top-level pod cgroup.
pub const KUBEPODS: &str = "kubepods";

/// How pod cgroups are named.
#[derive(Debug, Clone)]
pub struct CgroupLayout {
    /// `cgroupRoot` (absolute, `/` by default).
    pub root: String,
    /// `cgroupsPerQOS`.
    pub per_qos: bool,
    /// `cgroupDriver == "systemd"`.
    pub systemd: bool,
}

impl CgroupLayout {
    /// The pod's cgroup parent as the runtime expects it: a path for cgroupfs
    /// (`/kubepods/burstable/pod<uid>`), a slice name for systemd
    /// (`kubepods-burstable-pod<uid_>.slice`). Without `cgroupsPerQOS`: the cgroup root.
    pub fn pod_cgroup_parent(&self, uid: &str, qos: QosClass) -> String {
        if !self.per_qos {
            return self.root.clone();
        }
        let qos_part = match qos {
            QosClass::Guaranteed => None,
            QosClass::Burstable => Some("burstable"),
            QosClass::BestEffort => Some("besteffort"),
        };
        if self.systemd {
            let mut name = KUBEPODS.to_string();
            if let Some(q) = qos_part {
                name.push('-');
                name.push_str(q);
            }
            return format!("{name}-pod{}.slice", uid.replace('-', "_"));
        }
        let mut p = PathBuf::from(&self.root);
        p.push(KUBEPODS);
        if let Some(q) = qos_part {
            p.push(q);
        }
        p.push(format!("pod{uid}"));
        p.display().to_string()
    }

    /// Every cgroupfs path at which the pod's cgroup may exist, whatever its QoS class was.
    pub fn pod_cgroup_candidates(&self, uid: &str) -> Vec<String> {
        [
            QosClass::Guaranteed,
            QosClass::Burstable,
            QosClass::BestEffort,
        ]
        .into_iter()
        .map(|q| self.pod_cgroup_parent(uid, q))
        .collect()
    }
}

/// Mount points of the cgroup hierarchies on this host (v1 controllers, named hierarchies and the
/// v2 unified mount), read from `/proc/self/mountinfo`.
pub fn cgroup_mounts() -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let fstype = post.split_whitespace().next()?;
            let mount = pre.split_whitespace().nth(4)?;
            (fstype == "cgroup" || fstype == "cgroup2").then(|| PathBuf::from(mount))
        })
        .collect()
}

/// Removes a cgroup directory and its child cgroups (deepest first) in each of `mounts`.
/// Only empty cgroups can be removed; a cgroup that still has tasks is left and reported.
///
/// Errors: the first `rmdir` failure other than "does not exist".
pub fn remove_cgroup_everywhere(mounts: &[PathBuf], cgroup: &str) -> std::io::Result<()> {
    let rel = cgroup.trim_start_matches('/');
    if rel.is_empty() || rel.split('/').any(|c| c == ".." || c == ".") {
        return Ok(());
    }
    let mut first_err = None;
    for m in mounts {
        if let Err(e) = remove_tree(&m.join(rel)) {
            if e.kind() != std::io::ErrorKind::NotFound {
                first_err.get_or_insert(e);
            }
        }
    }
    first_err.map_or(Ok(()), Err)
}

fn remove_tree(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            remove_tree(&entry.path())?;
        }
    }
    std::fs::remove_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_cgroups_sit_where_kubelet_puts_them() {
        let l = CgroupLayout {
            root: "/".into(),
            per_qos: true,
            systemd: false,
        };
        assert_eq!(
            l.pod_cgroup_parent("u-1", QosClass::Guaranteed),
            "/kubepods/podu-1"
        );
        assert_eq!(
            l.pod_cgroup_parent("u-1", QosClass::Burstable),
            "/kubepods/burstable/podu-1"
        );
        assert_eq!(
            l.pod_cgroup_parent("u-1", QosClass::BestEffort),
            "/kubepods/besteffort/podu-1"
        );
        let s = CgroupLayout {
            systemd: true,
            ..l.clone()
        };
        assert_eq!(
            s.pod_cgroup_parent("u-1", QosClass::Burstable),
            "kubepods-burstable-podu_1.slice"
        );
        assert_eq!(
            s.pod_cgroup_parent("u-1", QosClass::Guaranteed),
            "kubepods-podu_1.slice"
        );
        let r = CgroupLayout {
            root: "/test".into(),
            ..l
        };
        assert_eq!(
            r.pod_cgroup_parent("x", QosClass::BestEffort),
            "/test/kubepods/besteffort/podx"
        );
    }

    #[test]
    fn removal_is_deepest_first_and_refuses_escapes() {
        let tmp = tempfile::tempdir().unwrap();
        let mounts = vec![tmp.path().join("cpu"), tmp.path().join("memory")];
        for m in &mounts {
            std::fs::create_dir_all(m.join("kubepods/podx/c1/nested")).unwrap();
        }
        remove_cgroup_everywhere(&mounts, "/kubepods/podx").unwrap();
        for m in &mounts {
            assert!(!m.join("kubepods/podx").exists());
            assert!(m.join("kubepods").exists());
        }
        remove_cgroup_everywhere(&mounts, "/../etc").unwrap();
        remove_cgroup_everywhere(&mounts, "/kubepods/absent").unwrap();
    }

    #[test]
    fn mounts_are_found_on_this_host() {
        // Every Linux host running these tests has at least one cgroup mount.
        assert!(!cgroup_mounts().is_empty());
    }
}
