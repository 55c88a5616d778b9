//! Removing a pod's directory tree without leaving it (kubelet's
//! `removeall.RemoveAllOneFilesystem`, which it uses for pod directories): a symlink is removed,
//! never followed; a tree that holds a mount point (a bind mount, a tmpfs another process made)
//! is not touched at all, so the mount's source keeps its files (found by `statx`'s mount-root
//! attribute on every entry, not by reading the mount table: see [`mounts_under`]); and the walk
//! refuses any directory on another device in case a mount was missed.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Mount points at or under `dir` (from `/proc/self/mountinfo`, read with procfs). Empty when
/// the table cannot be read (the walk's device check still stops at a mount).
///
/// The whole table is read and parsed: on a node running hundreds of containers (an overlay
/// mount each, with long options) one read costs milliseconds of CPU, so the removal asks
/// [`mount_root`] first and reads the table only on a kernel without `STATX_ATTR_MOUNT_ROOT`.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(me) = procfs::process::Process::myself() else {
        return Vec::new();
    };
    let Ok(mounts) = me.mountinfo() else {
        return Vec::new();
    };
    mounts
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(dir))
        .collect()
}

/// Whether `path` (not followed if a symlink) is the root of a mount in this process's mount
/// namespace: a bind mount from the same filesystem included, a file bind-mounted included.
/// `statx(2)`'s `STATX_ATTR_MOUNT_ROOT` (Linux 5.8), through rustix (nix has no statx).
///
/// Returns `Ok(None)` when the kernel does not report the attribute.
/// Errors: the `statx` call's (`NotFound` for a path that is gone).
pub fn mount_root(path: &Path) -> io::Result<Option<bool>> {
    probe(path).map(|(root, _)| root)
}

/// `path`'s mount-root attribute (as [`mount_root`]) and whether it is a directory, from one
/// `statx` call.
fn probe(path: &Path) -> io::Result<(Option<bool>, bool)> {
    use rustix::fs::{statx, AtFlags, FileType, StatxAttributes, StatxFlags, CWD};
    match statx(
        CWD,
        path,
        AtFlags::SYMLINK_NOFOLLOW | AtFlags::NO_AUTOMOUNT,
        StatxFlags::TYPE,
    ) {
        Ok(st) => {
            let root = st
                .stx_attributes_mask
                .contains(StatxAttributes::MOUNT_ROOT)
                .then(|| st.stx_attributes.contains(StatxAttributes::MOUNT_ROOT));
            let dir = FileType::from_raw_mode(st.stx_mode.into()) == FileType::Directory;
            Ok((root, dir))
        }
        Err(rustix::io::Errno::NOSYS) => Ok((None, false)),
        Err(e) => Err(e.into()),
    }
}

/// The first mount point at or under `dir`, found by walking the tree with one `statx` an
/// entry ([`mount_root`]; symlinks not followed); on a kernel that does not report mount roots,
/// the mount table's ([`mounts_under`]). Entries that go away during the walk are skipped.
///
/// Errors: reading a directory or `statx` failing otherwise than `NotFound`.
pub fn first_mount_under(dir: &Path) -> io::Result<Option<PathBuf>> {
    let gone = |e: &io::Error| e.kind() == io::ErrorKind::NotFound;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let is_dir = match probe(&p) {
            Ok((Some(true), _)) => return Ok(Some(p)),
            Ok((Some(false), is_dir)) => is_dir,
            Ok((None, _)) => return Ok(mounts_under(dir).into_iter().next()),
            Err(e) if gone(&e) => continue,
            Err(e) => return Err(e),
        };
        if is_dir {
            let entries = match std::fs::read_dir(&p) {
                Ok(entries) => entries,
                Err(e) if gone(&e) => continue,
                Err(e) => return Err(e),
            };
            for e in entries {
                stack.push(e?.path());
            }
        }
    }
    Ok(None)
}

/// Removes `path` and everything under it, on its own filesystem only: a symlink (or a file) at
/// `path` is unlinked; a tree holding a mount point is refused before anything in it is
/// removed.
///
/// Errors: `ResourceBusy` naming the mount point (nothing removed) or a directory on another
/// device met during the walk (what was walked before it is gone); the filesystem's otherwise.
/// A path that is already gone is no error.
pub fn remove_all_one_filesystem(path: &Path) -> io::Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.is_dir() {
        return std::fs::remove_file(path);
    }
    if let Some(m) = first_mount_under(path)? {
        return Err(busy(&format!(
            "{} holds a mount at {}",
            path.display(),
            m.display()
        )));
    }
    let dev = meta.dev();
    // Post-order, with an explicit stack: a deep tree cannot exhaust the thread's stack.
    let mut stack = vec![(path.to_path_buf(), false)];
    while let Some((p, emptied)) = stack.pop() {
        if emptied {
            ignore_gone(std::fs::remove_dir(&p))?;
            continue;
        }
        let m = match std::fs::symlink_metadata(&p) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if !m.is_dir() {
            ignore_gone(std::fs::remove_file(&p))?;
            continue;
        }
        if m.dev() != dev {
            return Err(busy(&format!(
                "{} is on another filesystem (a mount)",
                p.display()
            )));
        }
        stack.push((p.clone(), true));
        for e in std::fs::read_dir(&p)? {
            stack.push((e?.path(), false));
        }
    }
    Ok(())
}

fn busy(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::ResourceBusy, message.to_owned())
}

fn ignore_gone(r: io::Result<()>) -> io::Result<()> {
    match r {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlinks_are_removed_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(outside.join("sub")).unwrap();
        std::fs::write(outside.join("sub/f"), "keep").unwrap();
        let tree = tmp.path().join("tree");
        std::fs::create_dir_all(tree.join("a/b")).unwrap();
        std::os::unix::fs::symlink(&outside, tree.join("a/link")).unwrap();
        std::fs::write(tree.join("a/b/file"), "x").unwrap();
        remove_all_one_filesystem(&tree).unwrap();
        assert!(!tree.exists());
        // A symlink as the path itself.
        let top = tmp.path().join("top");
        std::os::unix::fs::symlink(&outside, &top).unwrap();
        remove_all_one_filesystem(&top).unwrap();
        assert!(std::fs::symlink_metadata(&top).is_err());
        assert_eq!(
            std::fs::read_to_string(outside.join("sub/f")).unwrap(),
            "keep"
        );
        // Gone already: no error.
        remove_all_one_filesystem(&tree).unwrap();
    }

    /// Unmounts (lazily) when dropped, so a failed assertion leaves no mount behind.
    struct Mounted(PathBuf);

    impl Drop for Mounted {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }

    fn bind(from: &Path, at: &Path) -> Mounted {
        use nix::mount::{mount, MsFlags};
        mount(Some(from), at, None::<&str>, MsFlags::MS_BIND, None::<&str>)
            .unwrap_or_else(|e| panic!("mount --bind {} {}: {e}", from.display(), at.display()));
        Mounted(at.to_path_buf())
    }

    #[test]
    fn a_tree_holding_a_bind_mount_from_its_own_filesystem_is_refused_whole() {
        // The bind mount's source is on the same filesystem (same device): only the mount's
        // root attribute (or the mount table) tells it is a mount.
        let tmp = tempfile::tempdir().unwrap();
        let source = tmp.path().join("source");
        std::fs::create_dir_all(&source).unwrap();
        std::fs::write(source.join("precious"), "keep").unwrap();
        let tree = tmp.path().join("tree");
        let held = tree.join("volumes/v/held");
        std::fs::create_dir_all(&held).unwrap();
        std::fs::write(tree.join("etc-hosts"), "x").unwrap();
        let file_source = tmp.path().join("file-source");
        std::fs::write(&file_source, "keep too").unwrap();
        std::fs::write(tree.join("volumes/v/file"), "").unwrap();

        assert_eq!(mount_root(&held).unwrap(), Some(false));
        assert_eq!(first_mount_under(&tree).unwrap(), None);
        let dir_mount = bind(&source, &held);
        assert_eq!(mount_root(&held).unwrap(), Some(true), "statx MOUNT_ROOT");
        assert_eq!(mount_root(&tree).unwrap(), Some(false));
        assert_eq!(first_mount_under(&tree).unwrap(), Some(held.clone()));
        assert!(
            mounts_under(&tree).contains(&held),
            "the mount table agrees"
        );

        let err = remove_all_one_filesystem(&tree).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ResourceBusy);
        assert!(
            err.to_string().contains(&held.display().to_string()),
            "{err}"
        );
        assert!(
            tree.join("etc-hosts").exists(),
            "nothing removed before the refusal"
        );
        assert_eq!(
            std::fs::read_to_string(held.join("precious")).unwrap(),
            "keep"
        );

        // A file bind-mounted is a mount point too.
        drop(dir_mount);
        let file_mount = bind(&file_source, &tree.join("volumes/v/file"));
        assert_eq!(
            first_mount_under(&tree).unwrap(),
            Some(tree.join("volumes/v/file"))
        );
        assert!(remove_all_one_filesystem(&tree).is_err());
        assert!(tree.join("etc-hosts").exists());

        // Unmounted, the tree goes; the sources stay.
        drop(file_mount);
        remove_all_one_filesystem(&tree).unwrap();
        assert!(!tree.exists());
        assert_eq!(
            std::fs::read_to_string(source.join("precious")).unwrap(),
            "keep"
        );
        assert_eq!(std::fs::read_to_string(&file_source).unwrap(), "keep too");
    }
}
