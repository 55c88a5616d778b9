//! Safe `subPath` mounts (kubelet's `pkg/volume/util/subpath`, `PrepareSafeSubpath`: the fix of
//! CVE-2017-1002101). A subPath is checked to stay inside its volume, but the runtime mounts it
//! later, by path: a container of the pod that can write to the volume could swap a directory of
//! the path for a symbolic link in between, and the next container would get whatever the link
//! names (the host's `/`). So the checked path is opened component by component without
//! following a link (refused if one is found), and what was opened is bind-mounted, through its
//! descriptor, at `<pod dir>/volume-subpaths/<volume>/<container>/<index of the mount>`; the
//! runtime gets that path, which no container can change. The mounts go with the pod's volumes
//! ([`unmount_all`], from [`super::tear_down_pod`]). A missing subPath is made the same way
//! ([`make_dir_beneath`], kubelet's `SafeMakeDir`), never through a link the pod put in it.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{open, openat, OFlag};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::stat::{fstat, Mode, SFlag};

/// Directory under the pod directory that holds the subPath bind mounts (kubelet's
/// `volume-subpaths`).
pub const DIR: &str = "volume-subpaths";

/// Bind-mounts `rel` (a relative path without `..` or links, inside the volume at `root`, as
/// [`super::mounts::container_mounts`] resolved it) at
/// `<pod_dir>/volume-subpaths/<volume>/<container>/<index>` and returns that path for the
/// runtime. A mount already there (an earlier instance of the container) is replaced.
///
/// Errors: a message naming the mount: a component that is now a symbolic link (the volume
/// changed since the check), or an open, directory or mount that failed.
pub fn bind(
    root: &Path,
    rel: &Path,
    pod_dir: &Path,
    volume: &str,
    container: &str,
    index: usize,
) -> Result<PathBuf, String> {
    let what = |e: String| format!("volumeMount {volume:?}: subPath {}: {e}", rel.display());
    let fd = open_beneath(root, rel).map_err(what)?;
    let is_dir = fstat(&fd)
        .map(|st| SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR)
        .map_err(|e| what(format!("cannot stat: {e}")))?;
    let target = pod_dir
        .join(DIR)
        .join(volume)
        .join(container)
        .join(index.to_string());
    // An earlier instance's mount: let it go, and bind what is there now.
    let _ = umount2(&target, MntFlags::MNT_DETACH);
    make_target(&target, is_dir)
        .map_err(|e| what(format!("cannot make {}: {e}", target.display())))?;
    let source = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    mount(
        Some(&source),
        &target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| what(format!("cannot bind it at {}: {e}", target.display())))?;
    Ok(target)
}

/// Opens `rel` under `root` one component at a time, never following a symbolic link: the
/// descriptor (`O_PATH`) names what the path named when it was checked, or the open fails.
fn open_beneath(root: &Path, rel: &Path) -> Result<OwnedFd, String> {
    let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut fd = open(root, flags | OFlag::O_DIRECTORY, Mode::empty())
        .map_err(|e| format!("cannot open the volume {}: {e}", root.display()))?;
    for c in rel.components() {
        let Component::Normal(name) = c else {
            if c == Component::CurDir {
                continue;
            }
            return Err("must be a relative path without '..'".into());
        };
        let next = openat(&fd, name, flags, Mode::empty())
            .map_err(|e| format!("cannot open {name:?}: {e}"))?;
        let st = fstat(&next).map_err(|e| format!("cannot stat {name:?}: {e}"))?;
        if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK {
            return Err(format!(
                "{name:?} is a symbolic link (the volume changed since it was checked)"
            ));
        }
        fd = next;
    }
    Ok(fd)
}

/// Makes the missing directories of the subPath `sub` in the volume at `base` (kubelet's
/// `SafeMakeDir`): the part of the path that exists must resolve inside the volume; it is opened
/// without following a link (`open_beneath`), and each missing directory is made with
/// `mkdirat` in the one opened before it and opened in turn without following a link. A link
/// the pod put in the path (to `/`, say) therefore never makes a directory outside the volume,
/// which `create_dir_all` would have.
///
/// Errors: a message: the existing part resolves outside the volume or is not a directory, a
/// link met, or a directory that cannot be made.
pub fn make_dir_beneath(base: &Path, sub: &Path) -> Result<(), String> {
    let names: Vec<&std::ffi::OsStr> = sub
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    let prefix = |n: usize| -> PathBuf { names[..n].iter().collect() };
    let mut have = names.len();
    while have > 0 && std::fs::metadata(base.join(prefix(have))).is_err() {
        have -= 1;
    }
    if have == names.len() {
        return Ok(());
    }
    let root = base
        .canonicalize()
        .map_err(|e| format!("cannot resolve the volume {}: {e}", base.display()))?;
    let existing = base
        .join(prefix(have))
        .canonicalize()
        .map_err(|e| format!("cannot resolve {}: {e}", prefix(have).display()))?;
    let Ok(rel) = existing.strip_prefix(&root) else {
        return Err("is not within the volume".into());
    };
    let mut fd = open_beneath(&root, rel)?;
    let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    for name in &names[have..] {
        match nix::sys::stat::mkdirat(&fd, *name, Mode::from_bits_truncate(0o755)) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => return Err(format!("cannot make {name:?}: {e}")),
        }
        // A link made there meanwhile is not followed: ENOTDIR/ELOOP.
        fd = openat(&fd, *name, flags, Mode::empty())
            .map_err(|e| format!("cannot open {name:?} (not a directory, or a link): {e}"))?;
    }
    Ok(())
}

/// Makes the mount point: a directory for a directory, an empty file for anything else; one
/// of the other kind left by an earlier instance is replaced.
fn make_target(target: &Path, is_dir: bool) -> std::io::Result<()> {
    if let Ok(m) = std::fs::symlink_metadata(target) {
        if m.is_dir() == is_dir && !m.file_type().is_symlink() {
            return Ok(());
        }
        if m.is_dir() {
            std::fs::remove_dir(target)?;
        } else {
            std::fs::remove_file(target)?;
        }
    }
    if is_dir {
        std::fs::create_dir_all(target)
    } else {
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(target)
            .map(drop)
    }
}

/// Unmounts every subPath bind mount under `pod_dir` (deepest first, detached), so that the pod
/// directory can be removed; what cannot be unmounted stays, and the removal, which never
/// crosses a mount, leaves it whole.
pub fn unmount_all(pod_dir: &Path) {
    let dir = pod_dir.join(DIR);
    if !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
        return;
    }
    let mut mounts = super::removal::mounts_under(&dir);
    mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for m in mounts {
        if let Err(e) = umount2(&m, MntFlags::MNT_DETACH) {
            tracing::warn!(path = %m.display(), error = %e, "cannot unmount a subPath mount");
        }
    }
}
