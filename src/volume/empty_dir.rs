//! emptyDir (kubelet's `pkg/volume/emptydir`): a directory under the pod's directory, or with
//! `medium: Memory` a tmpfs limited to `sizeLimit` bytes (else to the node's memory, as the
//! kernel's default of half of it would differ from kubelet's). With the pod's `fsGroup`, the
//! directory is owned by that group with the setgid bit, so files created in it inherit it.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Volume;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use tracing::warn;

use super::VolumePlugin;

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

impl VolumePlugin for EmptyDir {
    fn set_up(&self, v: &Volume, dir: &Path, fs_group: Option<i64>) -> Result<PathBuf, String> {
        let ed = v.empty_dir.as_ref().ok_or("not an emptyDir")?;
        std::fs::create_dir_all(dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        if ed.medium.as_deref() == Some("Memory") && !is_mount_point(dir) {
            let size = match &ed.size_limit {
                Some(q) => crate::quantity::parse_value(&q.0)
                    .map_err(|e| format!("sizeLimit {:?}: {e}", q.0))?,
                None => i128::from(procfs_mem_total()),
            };
            // nix's mount(2): cgroups-rs and procfs do not mount filesystems.
            mount(
                Some("tmpfs"),
                dir,
                Some("tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                Some(format!("size={size},mode=0777").as_str()),
            )
            .map_err(|e| format!("mount tmpfs on {}: {e}", dir.display()))?;
        }
        let mut mode = 0o777;
        if let Some(gid) = fs_group {
            let gid = u32::try_from(gid).map_err(|_| format!("invalid fsGroup {gid}"))?;
            std::os::unix::fs::chown(dir, None, Some(gid))
                .map_err(|e| format!("chown {}: {e}", dir.display()))?;
            mode |= 0o2000;
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
            .map_err(|e| format!("chmod {}: {e}", dir.display()))?;
        Ok(dir.to_path_buf())
    }

    fn tear_down(&self, dir: &Path) {
        if is_mount_point(dir) {
            if let Err(e) = umount2(dir, MntFlags::MNT_DETACH) {
                warn!(path = %dir.display(), error = %e, "cannot unmount emptyDir");
                return;
            }
        }
        if let Err(e) = std::fs::remove_dir_all(dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                warn!(path = %dir.display(), error = %e, "cannot remove emptyDir");
            }
        }
    }

    fn dir_name(&self) -> &'static str {
        "kubernetes.io~empty-dir"
    }
}

fn procfs_mem_total() -> u64 {
    use procfs::Current;
    procfs::Meminfo::current().map_or(0, |m| m.mem_total)
}
