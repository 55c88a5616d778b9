//! emptyDir (kubelet's `pkg/volume/emptydir`): a directory under the pod's directory, or with
//! `medium: Memory` a tmpfs sized as kubelet sizes it ([`memory_size`]). With the pod's
//! `fsGroup`, the directory is owned by that group with the setgid bit, so files created in it
//! inherit it. A disk-backed emptyDir's `sizeLimit` is enforced by the eviction manager
//! ([`crate::eviction::local_storage`]).

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Volume;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use tracing::warn;

use super::{SetUp, SetUpError, VolumePlugin};

/// The emptyDir plugin.
pub struct EmptyDir;

/// True when `dir` is a mount point (its device differs from its parent's).
fn is_mount_point(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(a), Some(Ok(b))) = (std::fs::metadata(dir), dir.parent().map(std::fs::metadata)) else {
        return false;
    };
    a.dev() != b.dev()
}

/// The size of a memory-backed emptyDir's tmpfs, bytes (kubelet's
/// `calculateEmptyDirMemorySize`, `SizeMemoryBackedVolumes`): the smallest of the node's
/// allocatable memory (`allocatable`, bytes; the node's memory when 0), the pod's memory limit
/// (`pod_limit`: its cgroup's, which a Burstable pod has only when every app container has one)
/// and the volume's `sizeLimit`, each taken only when above zero.
pub fn memory_size(allocatable: i64, pod_limit: Option<i64>, size_limit: Option<i128>) -> i128 {
    let mut size = if allocatable > 0 {
        i128::from(allocatable)
    } else {
        i128::from(procfs_mem_total())
    };
    for candidate in [pod_limit.map(i128::from), size_limit]
        .into_iter()
        .flatten()
    {
        if candidate > 0 && candidate < size {
            size = candidate;
        }
    }
    size
}

/// Mounts a tmpfs of `size` bytes (the node's memory when `None`) on `dir` unless something is
/// mounted there already; creates `dir`.
///
/// Errors: the mkdir or mount(2) error, naming the path.
pub fn ensure_tmpfs(dir: &Path, size: Option<i128>) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
    if is_mount_point(dir) {
        return Ok(());
    }
    let size = size.unwrap_or_else(|| i128::from(procfs_mem_total()));
    // nix's mount(2): cgroups-rs and procfs do not mount filesystems.
    mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(format!("size={size},mode=0755").as_str()),
    )
    .map_err(|e| format!("mount tmpfs on {}: {e}", dir.display()))
}

/// Unmounts `dir` if something is mounted there, then removes it and what it holds, on its own
/// filesystem only ([`super::removal::remove_all_one_filesystem`]: a mount inside is left, with
/// its source's files).
pub fn remove_volume_dir(dir: &Path) {
    if is_mount_point(dir) {
        if let Err(e) = umount2(dir, MntFlags::MNT_DETACH) {
            warn!(path = %dir.display(), error = %e, "cannot unmount volume");
            return;
        }
    }
    if let Err(e) = super::removal::remove_all_one_filesystem(dir) {
        warn!(path = %dir.display(), error = %e, "cannot remove volume");
    }
}

impl VolumePlugin for EmptyDir {
    fn set_up(&self, v: &Volume, dir: &Path, s: &SetUp<'_>) -> Result<PathBuf, SetUpError> {
        let ed = v
            .empty_dir
            .as_ref()
            .ok_or_else(|| SetUpError::Spec("not an emptyDir".into()))?;
        let fs = |what: &str, e: std::io::Error| {
            SetUpError::Filesystem(format!("{what} {}: {e}", dir.display()))
        };
        std::fs::create_dir_all(dir).map_err(|e| fs("mkdir", e))?;
        if ed.medium.as_deref() == Some("Memory") {
            let size_limit = match &ed.size_limit {
                Some(q) => Some(
                    crate::quantity::parse_value(&q.0)
                        .map_err(|e| SetUpError::Spec(format!("sizeLimit {:?}: {e}", q.0)))?,
                ),
                None => None,
            };
            let pod_limit = crate::cm::resources::pod_resource_config(
                s.pod,
                &crate::cm::resources::CgroupPolicy::default(),
            )
            .memory_limit;
            let size = memory_size(s.allocatable.memory, pod_limit, size_limit);
            ensure_tmpfs(dir, Some(size)).map_err(SetUpError::Mount)?;
        }
        let mut mode = 0o777;
        if let Some(gid) = s.fs_group_id()? {
            std::os::unix::fs::chown(dir, None, Some(gid)).map_err(|e| fs("chown", e))?;
            mode |= 0o2000;
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
            .map_err(|e| fs("chmod", e))?;
        Ok(dir.to_path_buf())
    }

    fn tear_down(&self, dir: &Path) {
        remove_volume_dir(dir);
    }

    fn dir_name(&self) -> &'static str {
        "kubernetes.io~empty-dir"
    }

    fn requires_remount(&self) -> bool {
        false
    }
}

fn procfs_mem_total() -> u64 {
    use procfs::Current;
    procfs::Meminfo::current().map_or(0, |m| m.mem_total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_backed_volume_gets_the_smallest_of_allocatable_the_pods_limit_and_its_own() {
        let gi = 1i64 << 30;
        assert_eq!(memory_size(8 * gi, None, None), i128::from(8 * gi));
        assert_eq!(memory_size(8 * gi, Some(gi), None), i128::from(gi));
        assert_eq!(
            memory_size(8 * gi, Some(gi), Some(64 << 20)),
            64 << 20,
            "sizeLimit below the pod's limit"
        );
        assert_eq!(
            memory_size(8 * gi, Some(64 << 20), Some(i128::from(gi))),
            64 << 20,
            "the pod's limit below sizeLimit"
        );
        assert_eq!(
            memory_size(gi, None, Some(i128::from(4 * gi))),
            i128::from(gi),
            "never above allocatable"
        );
        assert_eq!(memory_size(gi, Some(0), None), i128::from(gi), "0: none");
    }
}
